#!/usr/bin/env bash
# The box convolution as a persistent, warp-specialised Gluon kernel, alone, 96 channels, against the
# library's Triton kernel and cuDNN, values against an fp32 F.conv3d of the same bf16 tensors; one
# H200, Triton 3.6.0. The kernel was src/vaeshard/box_conv.py's (the same tiling, pipeline and
# producer warp) before its residual and norm epilogues, with 4 variants: 16 x 16 voxels with 4 or 3
# slots, 8 x 16 with 4, and 16 x 16 with 24 registers for the producer warp; the harness was
# ../box-conv/box_test.py with VARIANTS set to them and the residual check left out.
# env.txt: the same machine image, taken by the 1-GPU call before it. The library's kernel itself,
# alone: ../box-lib/ (python3 benchmarks/conv_kernel.py).
PYTHONUNBUFFERED=1 timeout 200 python3 ws_test.py
