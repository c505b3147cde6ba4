#!/usr/bin/env bash
# box_conv reading the causal caches where they lie (conv_kernel.Front): the kernel alone against copying the cache in front (values and time), GPU parity on 1 GPU (one and two samples), the decode interleaved with and without
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
timeout 150 python3 benchmarks/conv_kernel.py --front > $OUT/front.log 2>&1; echo "front rc=$? t=$(el)"
timeout 80 python3 benchmarks/conv_kernel.py --front --residual --only 720p > $OUT/front_residual.log 2>&1; echo "front residual rc=$? t=$(el)"
timeout 100 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models wan21 --dtypes bf16 --modes auto --out /tmp/p1.jsonl > $OUT/parity_1gpu.log 2>&1; echo "parity1 rc=$? t=$(el)"
timeout 100 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models wan21 --dtypes bf16 --modes auto --shapes "wan21=2,16,5,30,64" --out /tmp/p2.jsonl > $OUT/parity_batch2_1gpu.log 2>&1; echo "parity batch2 rc=$? t=$(el)"
P='vaeshard.fast:causal_front=lambda *a, **k: None'
[ $(el) -lt 400 ] && { timeout 150 python3 benchmarks/interleaved_ab.py --preset wan21-720p --setting patch --values off,on --patch "$P" --rounds 4 > $OUT/ab_front_720p_1gpu.log 2>&1; echo "ab rc=$? t=$(el)"; }
cat $OUT/front.log $OUT/front_residual.log | grep -v Warn | cut -c1-160
grep -v Warn $OUT/ab_*.log | grep -E "(wan|  )" | cut -c1-180
grep -hE "^wan21" $OUT/parity_*.log | cut -c1-160
tail -3 $OUT/parity_1gpu.log
exit 0
