#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
S="bash benchmarks/gpu_scaling.sh"
B=$PWD/.ab/base/src
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version())"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
TAG=head1 EXTRA=--no-ref MODES=auto timeout 70 $S wan21-720p $OUT 2 > /dev/null; echo "720 head1 t=$(el)"
SRC=$B TAG=base1 EXTRA=--no-ref MODES=auto timeout 70 $S wan21-720p $OUT 2 > /dev/null; echo "720 base1 t=$(el)"
TAG=head2 EXTRA=--no-ref MODES=auto timeout 70 $S wan21-720p $OUT 2 > /dev/null; echo "720 head2 t=$(el)"
SRC=$B TAG=base2 EXTRA=--no-ref MODES=auto timeout 70 $S wan21-720p $OUT 2 > /dev/null; echo "720 base2 t=$(el)"
TAG=head EXTRA=--no-ref MODES=auto timeout 80 $S wan22-720p $OUT 2 > /dev/null; echo "wan22 head t=$(el)"
SRC=$B TAG=base EXTRA=--no-ref MODES=auto timeout 80 $S wan22-720p $OUT 2 > /dev/null; echo "wan22 base t=$(el)"
TAG=head EXTRA=--no-ref MODES=auto timeout 50 $S wan21-480p $OUT 2 > /dev/null; echo "480 head t=$(el)"
SRC=$B TAG=base EXTRA=--no-ref MODES=auto timeout 50 $S wan21-480p $OUT 2 > /dev/null; echo "480 base t=$(el)"
L=$(( 520 - $(el) ))
[ $L -gt 40 ] && { timeout $L torchrun --standalone --nproc_per_node=2 benchmarks/profile_decode.py --preset wan21-720p --frames 5 --copies > $OUT/profile2_copies.log 2>&1; echo "profile rc=$? t=$(el)"; }
rm -f $OUT/*.png
for f in $OUT/scaling_*.txt; do echo "== $(basename $f) $(grep -E '^auto ' $f | cut -c1-120)"; done
cd $OUT && tar czf scaling.tgz scaling_*.json scaling_*.txt && rm -f scaling_*.json scaling_*.txt
exit 0
