#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
S="bash benchmarks/gpu_scaling.sh"
(nvidia-smi --query-gpu=name,driver_version --format=csv; nvidia-smi topo -m; python3 -c "import torch, triton, os;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'cpus', len(os.sched_getaffinity(0)))"; lscpu | grep -E 'Model name|NUMA|Thread|Core|Socket'; date -u) > $OUT/env.txt 2>&1
cat $OUT/env.txt | tail -14
for i in 1 2 3; do
  TAG=plain$i EXTRA=--no-ref MODES=auto timeout 60 $S wan21-480p $OUT 2 > /dev/null; echo "480 plain$i t=$(el)"
  VAESHARD_PIN=1 TAG=pin$i EXTRA=--no-ref MODES=auto timeout 60 $S wan21-480p $OUT 2 > /dev/null; echo "480 pin$i t=$(el)"
done
for i in 1 2; do
  [ $(el) -lt 420 ] && { TAG=plain$i EXTRA=--no-ref MODES=auto timeout 60 $S wan21-720p $OUT 2 > /dev/null; echo "720 plain$i t=$(el)"; }
  [ $(el) -lt 480 ] && { VAESHARD_PIN=1 TAG=pin$i EXTRA=--no-ref MODES=auto timeout 60 $S wan21-720p $OUT 2 > /dev/null; echo "720 pin$i t=$(el)"; }
done
rm -f $OUT/*.png
for f in $OUT/scaling_*.txt; do echo "== $(basename $f) $(grep -E '^auto ' $f | cut -c1-100)"; done
python3 - $OUT <<'PY'
import json, glob, sys, os
for f in sorted(glob.glob(sys.argv[1] + "/scaling_*.json")):
    d = json.load(open(f))
    rows = d["rows"] if isinstance(d, dict) and "rows" in d else d
    for r in rows if isinstance(rows, list) else []:
        if isinstance(r, dict) and r.get("mode") == "auto":
            print(os.path.basename(f), r.get("nproc"), r.get("seconds_reps") or r.get("times"))
PY
cd $OUT && tar czf results.tgz scaling_*.json scaling_*.txt && rm -f scaling_*.json scaling_*.txt
exit 0
