#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
S="bash benchmarks/gpu_scaling.sh"
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version())"; lscpu | grep 'Model name') > $OUT/env.txt 2>&1
timeout 150 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_parity.py --modes auto --dtypes bf16 --cuda-graphs --out $OUT/parity.jsonl > $OUT/parity.log 2>&1; echo "parity rc=$? t=$(el)"
grep -E "^wan" $OUT/parity.log | cut -c1-130
TAG=g EXTRA="--no-ref --cuda-graphs" MODES=auto timeout 110 $S wan21-720p $OUT 1,2 > /dev/null; echo "720 g t=$(el)"
TAG=e EXTRA="--no-ref" MODES=auto timeout 110 $S wan21-720p $OUT 1,2 > /dev/null; echo "720 e t=$(el)"
TAG=g EXTRA="--no-ref --cuda-graphs" MODES=auto timeout 60 $S wan21-480p $OUT 2 > /dev/null; echo "480 g t=$(el)"
TAG=e EXTRA="--no-ref" MODES=auto timeout 60 $S wan21-480p $OUT 2 > /dev/null; echo "480 e t=$(el)"
[ $(el) -lt 460 ] && { TAG=g EXTRA="--no-ref --cuda-graphs" MODES=auto timeout 90 $S wan22-720p $OUT 2 > /dev/null; echo "wan22 g t=$(el)"; }
[ $(el) -lt 500 ] && { TAG=g2 EXTRA="--no-ref --cuda-graphs --frames-per-step 2" MODES=auto timeout 60 $S wan21-480p $OUT 2 > /dev/null; echo "480 g2 t=$(el)"; }
rm -f $OUT/*.png
python3 - "$OUT" <<'PY'
import json, glob, sys, os
for f in sorted(glob.glob(sys.argv[1] + "/scaling_*.json")):
    r = json.load(open(f))
    for row in r["rows"]:
        res = row.get("peak_reserved_bytes_per_rank") or []
        print(f"{os.path.basename(f)[8:-5]:18} {row['mode']} x{row['nproc']} {row['seconds']:.3f} s  alloc {max(row['peak_bytes_per_rank'])/2**30:.2f}  reserved {max(x or 0 for x in res)/2**30:.2f} GiB  reps {[round(x,3) for x in row['seconds_reps']]}")
PY
grep -i -E "error|Traceback" $OUT/err.log | sort | uniq -c | head -8
cd $OUT && tar czf scaling.tgz scaling_*.json scaling_*.txt && rm -f scaling_*.json scaling_*.txt
exit 0
