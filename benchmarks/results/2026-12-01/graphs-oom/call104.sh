#!/usr/bin/env bash
# GPU parity of the new paths with their variants: the upsamplers by phases and Wan 2.2's shortcut in the interleaving pass with two samples, with frames_per_step 2 and with max_layer_frames 2 (the parts' frame offsets), bf16, 1 GPU
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
timeout 200 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models wan22,wan21 --dtypes bf16 --modes auto --frames-per-step 1,2 --max-layer-frames 2 --shapes "wan22=2,48,5,22,40;wan21=2,16,5,30,64" --out /tmp/p.jsonl > $OUT/parity_variants_1gpu.log 2>&1; echo "parity rc=$? t=$(el)"
grep -hE "^wan2|^model|^  " $OUT/parity_variants_1gpu.log | cut -c1-170 | head -40
exit 0
