#!/usr/bin/env bash
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), 'triton', triton.__version__)"; which ncu; date -u) > $OUT/env.txt 2>&1
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats"
M="--metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg.per_second,lts__t_bytes.sum.per_second,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed_pipe_tensor_op_gmma.sum"
for c in 96 192; do
  timeout 150 ncu --clock-control none --kernel-name regex:conv3x3x3 --launch-skip 1 --launch-count 1 $S $M python3 benchmarks/results/2026-11-30/conv-bound/conv_variants.py --cout $c --only-lib > $OUT/ncu$c.txt 2>&1; echo "ncu$c rc=$? t=$(el)"
done
timeout 120 python3 benchmarks/results/2026-11-30/conv-bound/conv_variants.py --cout 96 > $OUT/exp96.txt 2>&1; echo "exp rc=$? t=$(el)"
cat $OUT/exp96.txt
for c in 96 192; do grep -E "Throughput|Duration|SM Frequency|Registers|Achieved Occupancy|Theoretical Occupancy|Block Limit|gmma|lts__t_bytes|Stall|Eligible|Issued Warp|No Eligible|L2 Hit|Mem Busy|Max Bandwidth|Shared Memory Configuration Size|Dynamic Shared" $OUT/ncu$c.txt | head -60; done
exit 0
#!/usr/bin/env bash
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), 'triton', triton.__version__)"; date -u) > $OUT/env.txt 2>&1
timeout 100 python3 benchmarks/results/2026-11-30/conv-bound/attention_prototype.py > $OUT/attn2.txt 2>&1; echo "attn rc=$? t=$(el)"; grep -v Warn $OUT/attn2.txt
for c in 96 192; do timeout 150 python3 benchmarks/results/2026-11-30/conv-bound/conv_variants.py --cout $c > $OUT/exp$c.txt 2>&1; echo "exp$c rc=$? t=$(el)"; grep -v Warn $OUT/exp$c.txt; done
exit 0
