# One H200 (env.txt), 2026-12-02 03:57-04:07 UTC, one call, the code of commit 62f4328. Random weights,
# each class's diffusers defaults (vaeshard.cli.io NAMED_CONFIGS), torch.manual_seed(0); bf16 speed is the
# median of 3 timed decodes after a warm-up, diffusers' own decode (tiling off) in the same process.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src
timeout 575 bash benchmarks/families_gpu.sh $OUT/fam \
  "hunyuanvideo=1,16,3,32,48;cogvideox=1,16,3,32,48;mochi=1,12,3,32,48" \
  "cogvideox=1,16,13,60,90;mochi=1,12,14,60,106;hunyuanvideo=1,16,9,90,160;ltx2=1,128,16,34,60;hunyuanvideo15=1,32,16,45,80;cogvideox=1,16,21,96,170"
# -> parity-{hunyuanvideo,cogvideox,mochi}.jsonl (every row ok), bench-cogvideox-1 (720x480, 49 frames),
#    bench-mochi-2 (480x848, 79 frames), bench-hunyuanvideo-3 (720p, 33 frames: diffusers' default decode,
#    which tiles in time above 4 latent frames), bench-ltx2-4 (1088x1920, 121 frames).
# The 575 s bound ended the call during bench-hunyuanvideo15-5 (720p, 61 frames): its JSON holds diffusers'
# decode only (5.862 s, 94.8 GiB), not vaeshard's; the CogVideoX 1.5 subject (1360x768, 81 frames) never ran.
