#!/usr/bin/env bash
# where box_conv's warps stall: Nsight Compute warp-state sampling per SASS instruction, 96 and 192 channels
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), 'triton', triton.__version__)"; ncu --version | tail -1; date -u) > $OUT/env.txt 2>&1
timeout 150 ncu --clock-control none -k regex:_box_conv_kernel --section WarpStateStats --section SourceCounters --section InstructionStats --section SpeedOfLight -o /tmp/box python3 .ab/ncu_box2.py > $OUT/ncu_run.log 2>&1; echo "ncu rc=$? t=$(el)"
ncu -i /tmp/box.ncu-rep --page details > $OUT/details.txt 2>&1
ncu -i /tmp/box.ncu-rep --page source --print-source sass --csv > /tmp/src.csv 2>&1; gzip -c /tmp/src.csv > $OUT/source_sass.csv.gz; ls -la /tmp/src.csv
grep -E "Stall|Warp Cycles|Issued|Duration|SM Freq" $OUT/details.txt | head -40 | cut -c1-150
exit 0
