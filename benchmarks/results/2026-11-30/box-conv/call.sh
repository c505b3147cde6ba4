#!/usr/bin/env bash
# The Gluon kernel that reads each input box once for the three row taps (box_conv.py here, not part
# of the library), alone, against vaeshard's Triton kernel and cuDNN: values against an fp32
# F.conv3d of the same bf16 tensors, and median times (CUDA events, 20 calls after a warm-up).
# Two calls on one H200 (Triton 3.6.0, torch 2.11.0+cu130), each: python3 box_test.py with the
# installed library on the path. First call: VARIANTS = r16 c16 with 32 or 16 input channels per step
# and 3 or 6 steps in flight, r8 c32 (box_test_1.*); second call: the variants now in box_test.py
# (box_test_2.*). env.txt: the same machine image, taken by the later 2-GPU call of the day.
PYTHONPATH=$PWD/src python3 benchmarks/results/2026-11-30/box-conv/box_test.py
