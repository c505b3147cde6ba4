"""Where the reserved memory goes: Wan 2.2 (real config, random weights, bf16) at the parity shape, two samples,
cuda_graphs on, phases on/off, cudnn_benchmark on/off; memory_reserved after each decode, OOMs caught."""
import sys, time, torch
from diffusers import AutoencoderKLWan
import vaeshard
from vaeshard import fast
from vaeshard.io import NAMED_CONFIGS

torch.manual_seed(0)
vae = AutoencoderKLWan(**NAMED_CONFIGS["wan22"][1]).to("cuda", torch.bfloat16).eval()
shape = tuple(int(v) for v in sys.argv[1].split(","))
z = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
gib = 2**30
def run(label, phases, bench, graphs):
    real = fast.upsample_by_phases
    if not phases:
        fast.upsample_by_phases = lambda x: False
    vaeshard.parallelize(vae, cudnn_benchmark=bench, cuda_graphs=graphs)
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
    t = time.time()
    try:
        with torch.no_grad():
            vae.decode(z)
        torch.cuda.synchronize()
        ok = "ok"
    except torch.OutOfMemoryError as e:
        ok = "OOM"
    fast.upsample_by_phases = real
    print(f"{label:34} {ok:4} {time.time()-t:6.1f} s  reserved {torch.cuda.memory_reserved()/gib:7.2f} GiB  "
          f"max reserved {torch.cuda.max_memory_reserved()/gib:7.2f}  allocated {torch.cuda.memory_allocated()/gib:6.2f}", flush=True)
    vaeshard.unparallelize(vae)
    torch.cuda.empty_cache()
order = sys.argv[2].split(",")
for item in order:
    phases, bench, graphs = (v == "1" for v in item)
    run(f"phases={phases} bench={bench} graphs={graphs}", phases, bench, graphs)
