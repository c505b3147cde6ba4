"""A graphed decode after other work left the default pool holding most of the GPU cached: Wan 2.1 (real config,
random weights, bf16) at 480p per-rank size (graphs 'auto' take it), with and without graphs.release_cached_memory."""
import sys, torch
from diffusers import AutoencoderKLWan
import vaeshard
from vaeshard import graphs
from vaeshard.io import NAMED_CONFIGS

torch.manual_seed(0)
vae = AutoencoderKLWan(**NAMED_CONFIGS["wan21"][1]).to("cuda", torch.bfloat16).eval()
z = torch.randn(1, 16, 5, 30, 104, device="cuda", dtype=torch.bfloat16)
gib = 2**30
if sys.argv[1] == "off":
    graphs.release_cached_memory = lambda device: None
vaeshard.parallelize(vae, cuda_graphs=sys.argv[1] != "eager")
free, total = torch.cuda.mem_get_info()
big = torch.empty(int(free - 1 * gib), dtype=torch.uint8, device="cuda")  # other work's memory, then freed: cached
del big
print(f"release {sys.argv[1]}: cached before the decode {(torch.cuda.memory_reserved() - torch.cuda.memory_allocated()) / gib:.1f} GiB, "
      f"free {torch.cuda.mem_get_info()[0] / gib:.1f} GiB", flush=True)
try:
    with torch.no_grad():
        out = vae.decode(z).sample
    torch.cuda.synchronize()
    print(f"release {sys.argv[1]}: decoded {tuple(out.shape)}, reserved {torch.cuda.memory_reserved() / gib:.1f} GiB", flush=True)
except torch.OutOfMemoryError as e:
    print(f"release {sys.argv[1]}: OutOfMemoryError: {str(e)[:160]}", flush=True)
