#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
S="bash benchmarks/gpu_scaling.sh"
B=$PWD/.ab/base/src
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
cat $OUT/env.txt
PYTHONPATH=/tmp/site:$B timeout 60 python3 benchmarks/norm_kernel.py --no-sweep --json $OUT/kernel_base.json > $OUT/kernel_base.txt 2>&1; echo "kbase t=$(el)"
timeout 60 python3 benchmarks/norm_kernel.py --no-sweep --json $OUT/kernel_head.json > $OUT/kernel_head.txt 2>&1; echo "khead t=$(el)"
paste -d'|' <(cut -c1-60 $OUT/kernel_base.txt) <(cut -c38-60 $OUT/kernel_head.txt)
timeout 90 torchrun --standalone --nproc_per_node=2 benchmarks/profile_decode.py --preset wan21-720p --frames 21 --timeline > $OUT/timeline2.log 2>&1; echo "timeline rc=$? t=$(el)"
TAG=head1 EXTRA=--no-ref MODES=auto timeout 70 $S wan21-720p $OUT 1,2 > /dev/null; echo "720 head1 t=$(el)"
SRC=$B TAG=base1 EXTRA=--no-ref MODES=auto timeout 70 $S wan21-720p $OUT 1,2 > /dev/null; echo "720 base1 t=$(el)"
[ $(el) -lt 420 ] && { TAG=head2 EXTRA=--no-ref MODES=auto timeout 70 $S wan21-720p $OUT 1,2 > /dev/null; echo "720 head2 t=$(el)"; }
[ $(el) -lt 490 ] && { SRC=$B TAG=base2 EXTRA=--no-ref MODES=auto timeout 70 $S wan21-720p $OUT 1,2 > /dev/null; echo "720 base2 t=$(el)"; }
rm -f $OUT/*.png
for f in $OUT/scaling_*.txt; do echo "== $(basename $f)"; grep -E '^auto ' $f | cut -c1-120; done
tail -30 $OUT/timeline2.log
cd $OUT && tar czf results.tgz scaling_*.json scaling_*.txt kernel_*.json && rm -f scaling_*.json scaling_*.txt kernel_*.json
exit 0
