#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
S="bash benchmarks/gpu_scaling.sh"
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
timeout 170 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_parity.py --models wan21,wan22 --dtypes fp32,bf16 --modes auto,spatial_shard_height --out $OUT/parity.jsonl > $OUT/parity.log 2>&1; echo "parity rc=$? t=$(el)"
grep -E "^wan|Error|error" $OUT/parity.log | head -30
timeout 60 python3 benchmarks/norm_kernel.py --no-sweep > $OUT/norm_kernel.log 2>&1; echo "norm rc=$? t=$(el)"
for sub in wan21-480p wan21-720p; do
  for v in cur nog base; do
    [ $(el) -gt 540 ] && continue
    case $v in cur) X="--no-ref"; SRCV=$PWD/src;; nog) X="--no-ref --no-cuda-graphs"; SRCV=$PWD/src;; base) X="--no-ref"; SRCV=$PWD/.ab/base/src;; esac
    SRC=$SRCV TAG=$v EXTRA="$X" MODES=auto timeout 120 $S $sub $OUT 1,2 > /dev/null; echo "$sub $v rc=$? t=$(el)"
  done
done
rm -f $OUT/*.png
python3 - $OUT <<'PY'
import json, glob, sys, os
for f in sorted(glob.glob(sys.argv[1] + "/scaling_*.json")):
    d = json.load(open(f))
    for r in d.get("rows", []):
        g = lambda xs: max(x or 0 for x in xs) / 2**30
        print(f"{os.path.basename(f)[8:-5]:22} n={r['nproc']} med={r['seconds']:.3f} reps={[round(t,3) for t in r['seconds_reps']]} alloc={g(r['peak_bytes_per_rank']):.2f} resv={g(r['peak_reserved_bytes_per_rank']):.2f}")
PY
grep -E "bias|full" $OUT/norm_kernel.log | head -8
tail -3 $OUT/err.log
cd $OUT && tar czf results.tgz scaling_*.json scaling_*.txt && rm -f scaling_*.json scaling_*.txt
exit 0
