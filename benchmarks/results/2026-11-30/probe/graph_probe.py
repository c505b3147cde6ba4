"""Per-request and per-call timing of the Wan decode with and without CUDA graph replay (2 ranks)."""
import os, sys, time, statistics, inspect
import torch, torch.distributed as dist
import vaeshard
try:
    from vaeshard import graphs
except ImportError:
    import types; graphs = types.SimpleNamespace()
from vaeshard.bench import PRESETS
from vaeshard.io import NAMED_CONFIGS
from diffusers import AutoencoderKLWan

preset = sys.argv[1]
settings = sys.argv[2].split(",")
rank = int(os.environ.get("LOCAL_RANK", 0))
torch.cuda.set_device(rank)
dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
config, shape, _ = PRESETS[preset]
torch.manual_seed(0)
vae = AutoencoderKLWan(**NAMED_CONFIGS[config][1]).eval().to("cuda", torch.bfloat16)
z = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)

stats = {}
HAS = "cuda_graphs" in inspect.signature(vaeshard.parallelize).parameters
if not HAS:
    class _D:
        def _capture(self, *a): pass
        def __exit__(self, *a): pass
        def call(self, *a, **k): pass
    graphs.DecoderSteps = _D
orig_capture, orig_exit, orig_call = graphs.DecoderSteps._capture, graphs.DecoderSteps.__exit__, graphs.DecoderSteps.call
def cap(self, *a):
    t = time.perf_counter(); r = orig_capture(self, *a); stats.setdefault("capture_ms", []).append(1e3 * (time.perf_counter() - t)); return r
def ex(self, *a):
    t = time.perf_counter(); r = orig_exit(self, *a); stats.setdefault("exit_ms", []).append(1e3 * (time.perf_counter() - t)); return r
def call(self, *a, **k):
    e0 = torch.cuda.Event(enable_timing=True); e1 = torch.cuda.Event(enable_timing=True)
    t = time.perf_counter(); e0.record(); r = orig_call(self, *a, **k); e1.record()
    stats.setdefault("events", []).append((e0, e1)); stats.setdefault("host", []).append(1e3 * (time.perf_counter() - t)); return r
graphs.DecoderSteps._capture, graphs.DecoderSteps.__exit__, graphs.DecoderSteps.call = cap, ex, call

for s in settings:
    kw = {"cuda_graphs": s == "graphs"} if HAS else {}
    vaeshard.parallelize(vae, mode="auto", frames_per_step=2 if s == "k2" else 1, **kw)
    for rep in range(4):
        stats.clear()
        dist.barrier(); torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = vae.decode(z).sample
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        gpu = [a.elapsed_time(b) for a, b in stats.get("events", [])]
        host = stats.get("host", [])
        if rep:
            print(f"[r{rank}] {s:7} rep{rep} wall {t2-t0:.3f} host-return {t1-t0:.3f} capture {stats.get('capture_ms')} exit {[round(x,1) for x in stats.get('exit_ms',[])]} "
                  f"calls host ms {[round(x,1) for x in host[:4]]}..med {statistics.median(host[3:]) if len(host)>4 else 0:.1f} "
                  f"gpu-span ms {[round(x,1) for x in gpu[:4]]}..med {statistics.median(gpu[3:]) if len(gpu)>4 else 0:.1f} "
                  f"resv {torch.cuda.memory_reserved()/2**30:.2f}", flush=True)
        del out
dist.destroy_process_group()
