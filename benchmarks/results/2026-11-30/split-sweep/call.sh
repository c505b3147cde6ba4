#!/usr/bin/env bash
# (run on nvidia-h200, one GPU, from the repository root; the command as given to the machine)
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), 'triton', triton.__version__)"; date -u) > $OUT/env.txt 2>&1; PYTHONPATH=$PWD/src timeout 400 python3 benchmarks/conv_kernel.py --sweep --json $OUT/conv_kernel.json > $OUT/conv_kernel.log 2>&1; echo rc=$?; cut -c1-100 $OUT/conv_kernel.log
