# One H200 (NVIDIA H200, 143771 MiB, driver 580.159.04; torch 2.11.0+cu130, cuDNN 91900, Triton 3.6.0,
# diffusers 0.42.1 from its wheel), 2026-12-02 00:58-01:25 UTC, four calls, each a fresh machine, the
# code of commit 78a4f11 except where a call says otherwise. Random weights, real configs
# (vaeshard.cli.io NAMED_CONFIGS: each class's diffusers defaults), torch.manual_seed(0); bf16 speed is
# the median of 3 (5) timed decodes after a warm-up, diffusers' untiled decode in the same process.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src
# call 1 (before Family.fast_tier: the fast tier still ran AutoencoderKL's layers)
bash benchmarks/families_gpu.sh $OUT/flux2 "flux2=1,32,64,64" "flux2=1,32,128,128;flux2=1,32,256,256"
#   -> parity-flux2.jsonl, bench-flux2-1024-fast.json, bench-flux2-2048-fast.json
# call 2 (the same code): which setting costs FLUX.2 its speed; HunyuanVideo 1.5 480p 61 frames
for f in "" --no-cudnn-benchmark --exact; do python3 -m vaeshard bench --config flux2 --shape 1,32,128,128 \
  --nproc 1 --modes auto --dtype bf16 --reps 5 $f --json bench-flux2-1024-...json; done
#   -> bench-flux2-1024-fast-nocudnnbench.json, bench-flux2-1024-exact.json ("" repeated call 1's 0.66x)
bash benchmarks/families_gpu.sh $OUT/hv15 "" "hunyuanvideo15=1,32,16,30,53"   # -> bench-hunyuanvideo15-480p61.json
# call 3 (Family.fast_tier in place, Qwen-Image 2.1 still on the fast tier)
for f in "" --exact; do python3 -m vaeshard bench --config qwenimage21 --shape 1,64,1,83,83 --nproc 1 \
  --modes auto --dtype bf16 --reps 5 $f --json bench-qwenimage21-1328-{fast,exact}.json; done
python3 -m vaeshard bench --config flux2 --shape 1,32,128,128 --nproc 1 --modes auto --dtype bf16 --reps 5 \
  --json bench-flux2-1024-default.json
bash benchmarks/families_gpu.sh $OUT/fam "qwenimage21=1,64,1,32,32;hunyuanvideo15=1,32,3,16,24" ""
#   -> parity-qwenimage21.jsonl (the hunyuanvideo15 rows failed in the script: its tiled_decode returns a tensor)
# call 4 (commit 78a4f11's code; gpu_parity.py takes a tensor from tiled_decode)
bash benchmarks/families_gpu.sh $OUT/fam "hunyuanvideo15=1,32,3,16,24;ltx=1,128,2,8,12;ltx2=1,128,2,8,12" \
  "ltx=1,128,16,22,38"
#   -> parity-hunyuanvideo15.jsonl, bench-ltx-704x1216-121f.json; the ltx and ltx2 parity runs failed in the
#      script (LTX-Video's tiled_decode needs `temb`, fixed since; LTX-2's tiled
#      decode with 128-pixel tiles leaves a one-column edge tile its reflect padding cannot take)
# call 5 (commit a5db3ca's code; LTX-2's parity subject with 128-pixel tiles hit the one-column edge tile again:
#   LTX-2's tiled decode divides by spatial_compression_ratio, 64 in diffusers' default config)
bash benchmarks/families_gpu.sh $OUT/fam "ltx=1,128,2,8,12;ltx2=1,128,2,8,11" ""   # -> parity-ltx.jsonl
# call 6 (a5db3ca's code and gpu_parity.py's TILES_FOR: LTX-2 tiles of 256 pixels every 192)
bash benchmarks/families_gpu.sh $OUT/fam "ltx2=1,128,2,8,11" ""                    # -> parity-ltx2.jsonl
