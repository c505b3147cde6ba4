# One H200 (nvidia-smi: NVIDIA H200, 143771 MiB, driver 580.159.04), 2026-12-01, in four commands on the
# same machine. A = vaeshard 0.1.0 at commit d059285 (before the 0.2 restructure), B = vaeshard 0.2.0 at commit
# 152825a (after it), each installed from its wheel into a folder of its own; diffusers 0.42.1 from its wheel.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/A .whl/before/*.whl
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/B .whl/after/*.whl
export PYTHONPATH=/tmp/site
# bits of every mode's decode, A then B (bits.jsonl, bits_table.txt)
bash benchmarks/versions_ab.sh /tmp/work /tmp/A /tmp/B bits
# Wan 2.1 720p, A B A B, 5 timed decodes each, diffusers in the same process group run (bench.jsonl)
for round in 1 2; do for v in A B; do PYTHONPATH=/tmp/$v:/tmp/site python3 -m vaeshard bench --preset wan21-720p \
  --nproc 1 --modes auto --reps 5 --json /tmp/work/bench-wan21-720p-$v$round.json; done; done
# Wan 2.2 720p, A B A B, 3 timed decodes each
for round in 1 2; do for v in A B; do PYTHONPATH=/tmp/$v:/tmp/site python3 -m vaeshard bench --preset wan22-720p \
  --nproc 1 --modes auto --reps 3 --json /tmp/work/bench-wan22-720p-$v$round.json; done; done
# GPU parity under the revised bf16 rule (B's script; cut at 280 s: Wan 2.1 whole, Wan 2.2 fp32 only)
timeout 280 env PYTHONPATH=/tmp/B:/tmp/site python3 benchmarks/gpu_parity.py --out parity-B.jsonl
# A's own parity script (the old rule) did not run: it imports its benchmarks/memory_model.py, which was
# not carried beside it (parity-A.log); A and B are compared by the bits above instead
timeout 150 env PYTHONPATH=/tmp/A:/tmp/site python3 .ab/gpu_parity_before.py --models wan21 --out parity-A.jsonl
