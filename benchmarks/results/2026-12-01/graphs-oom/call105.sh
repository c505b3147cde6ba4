#!/usr/bin/env bash
# Diagnosis: an out-of-memory with CUDA graphs in a two-sample Wan 2.2 parity decode (call104): reserved memory per variant, fresh processes
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; date -u) > $OUT/env.txt 2>&1
timeout 70 python3 .ab/oom_probe.py 2,48,5,22,40 111,111 > $OUT/probe_a.log 2>&1; echo "a rc=$? t=$(el)"
timeout 70 python3 .ab/oom_probe.py 2,48,5,22,40 011,011 > $OUT/probe_b.log 2>&1; echo "b rc=$? t=$(el)"
timeout 70 python3 .ab/oom_probe.py 2,48,5,22,40 101,110 > $OUT/probe_c.log 2>&1; echo "c rc=$? t=$(el)"
timeout 60 python3 .ab/oom_probe.py 1,48,5,22,40 111 > $OUT/probe_d.log 2>&1; echo "d rc=$? t=$(el)"
for f in $OUT/probe_*.log; do echo "== $f"; grep -E "phases=|Error|error" $f | grep -v Warn | cut -c1-200 | tail -5; done
exit 0
