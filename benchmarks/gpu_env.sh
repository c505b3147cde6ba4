#!/usr/bin/env bash
# Sourced by the GPU scripts: `write_env FILE [MODULE...]` writes the GPU, driver, versions (torch,
# CUDA, cuDNN, Triton, diffusers and each MODULE's __version__), CPU count and date to FILE.
write_env() {
  local file=$1; shift
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$file" 2>&1
  python3 - "$@" >>"$file" 2>&1 <<'PY'
import importlib, sys
import torch, triton, diffusers
parts = ["torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(),
         "triton", triton.__version__, "diffusers", diffusers.__version__]
for name in sys.argv[1:]:
    parts += [name, importlib.import_module(name).__version__]
print(*parts)
PY
  nproc >>"$file"
  date -u >>"$file"
}
