#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
P=".ab/probe/graph_probe.py"
run() { local src=$1 n=$2 tag=$3; shift 3; echo "== $tag t=$(el)" | tee -a $OUT/probe.log; PYTHONPATH=/tmp/site:$src timeout 120 "$@" torchrun --standalone --nproc_per_node=$n $P ${ARGS} >> $OUT/probe.log 2>> $OUT/err.log; echo "rc=$?" >> $OUT/probe.log; }
ARGS="wan21-480p nog,graphs,k2" run $PWD/src 2 "480p 2 cur"
ARGS="wan21-480p graphs" run $PWD/src 2 "480p 2 cur NCCL_GRAPH_REGISTER=0" env NCCL_GRAPH_REGISTER=0
ARGS="wan21-480p graphs,nog" run $PWD/.ab/var/src 2 "480p 2 persistent-pool"
ARGS="wan21-480p nog" run $PWD/.ab/base/src 2 "480p 2 base"
for i in 1 2; do
  ARGS="wan21-720p nog" run $PWD/.ab/base/src 2 "720p 2 base $i"
  ARGS="wan21-720p nog,graphs" run $PWD/src 2 "720p 2 cur $i"
done
[ $(el) -lt 420 ] && ARGS="wan21-720p nog" run $PWD/.ab/base/src 1 "720p 1 base"
[ $(el) -lt 470 ] && ARGS="wan21-720p nog" run $PWD/src 1 "720p 1 cur"
[ $(el) -lt 520 ] && ARGS="wan21-480p nog" run $PWD/.ab/base/src 1 "480p 1 base"
[ $(el) -lt 550 ] && ARGS="wan21-480p nog" run $PWD/src 1 "480p 1 cur"
grep -E "^==|r0\] .*rep|rc=" $OUT/probe.log | sed -E 's/calls host ms/h/; s/gpu-span ms/g/' | cut -c1-230
tail -5 $OUT/err.log
exit 0
