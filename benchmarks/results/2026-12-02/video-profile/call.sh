# One H200 (env.txt), 2026-12-02 03:31-03:36 UTC, the code of commit a5db3ca plus benchmarks/video_profile.py.
# Random weights, each class's diffusers defaults, bf16, cudnn.benchmark on; per subject diffusers' untiled
# decode channels-first and channels-last interleaved A B A B after a warm-up each, medians of 2, then one
# profiled decode of each (GPU time by kernel class, benchmarks/profile_decode.py's classes).
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src
python3 benchmarks/video_profile.py --reps 2 --json profile.json \
  --subject AutoencoderKLLTXVideo=1,128,4,22,38 \
  --subject AutoencoderKLHunyuanVideo15=1,32,5,45,80 \
  --subject AutoencoderKLLTX2Video=1,128,4,34,60 \
  --subject AutoencoderKLCogVideoX=1,16,5,60,90 \
  --subject AutoencoderKLHunyuanVideo=1,16,5,45,80 \
  --subject AutoencoderKLMochi=1,12,4,60,106 > profile.log 2>&1
# An earlier call with longer clips (HunyuanVideo 1.5 720p 61 frames first) ran past its 330 s bound before its
# first subject finished and recorded nothing.
