#!/usr/bin/env python3
"""GPU parity: every mode vs diffusers' single-process decode, fp32 (TF32 off) and bf16.

Run on a GPU machine, one process per GPU (not part of CI):

    torchrun --standalone --nproc_per_node=2 benchmarks/gpu_parity.py --out parity.jsonl

Every rank builds the same random-weight VAE (real configs, torch.manual_seed(0)); rank 0 computes
the references (untiled decode for spatial modes and auto, diffusers' tiled decode for tile) with an
unparallelized copy; each mode's result is compared on rank 0. Tolerances are DESIGN.md's.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import sys

import torch
import torch.distributed as dist

import vaeshard
from vaeshard.graphs import CAPTURED
from vaeshard.io import NAMED_CONFIGS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memory_model import steps_setting  # noqa: E402


class CaptureCounter(logging.Handler):
    """Counts the CUDA graph captures vaeshard logs (graphs.CAPTURED), so a row says whether it replayed."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record):
        self.count += record.getMessage().startswith(CAPTURED)


# 9 latent frames: the fast tier's default at these frame sizes on CUDA takes 2 per decoder call
# (frames_per_step "auto"), 5 calls, of which the last two replay a CUDA graph (cuda_graphs "auto")
SHAPES = {"wan21": (1, 16, 9, 30, 52), "wan22": (1, 48, 9, 22, 40), "qwenimage": (1, 16, 3, 30, 52)}
TOL = {"fp32": dict(max=1e-4, mean=None), "bf16": dict(max=5e-2, mean=2e-3)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="wan21,wan22", help="named configs (vaeshard.io): wan21, wan22, qwenimage")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--modes", default=",".join(vaeshard.MODES))
    ap.add_argument("--out", default=None)
    ap.add_argument("--frames-per-step", default="auto",
                    help="fast-tier frames_per_step values to check, e.g. auto,1,2 (default auto, the library's)")
    ap.add_argument("--max-layer-frames", default="", help="fast-tier max_layer_frames values to check as well, e.g. 2")
    ap.add_argument("--shapes", default=None, help="override, e.g. wan21=1,16,2,6,8;wan22=1,48,2,4,6")
    args = ap.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:  # a CPU smoke run of the script itself (gloo); use --shapes to keep it small
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    import diffusers

    shapes = dict(SHAPES)
    for item in filter(None, (args.shapes or "").split(";")):
        name, dims = item.split("=")
        shapes[name] = tuple(int(v) for v in dims.split(","))
    rows, ok_all = [], True
    captures = CaptureCounter()
    logging.getLogger("vaeshard").addHandler(captures)
    logging.getLogger("vaeshard").setLevel(logging.DEBUG)
    if rank == 0:
        print(f"torch {torch.__version__}, GPU {torch.cuda.get_device_name() if device.type == 'cuda' else 'none'}, "
              f"world {world}")
        print("max|d|, mean|d|: vs the diffusers reference in the same dtype (tiled for tile, untiled otherwise);")
        print("vs fp32: the same result against diffusers' fp32 untiled decode (the bf16 noise floor)")
        print("graphs: the fast tier's CUDA graph replay (graphs.py) was used, and its result equals the same")
        print("request with cuda_graphs=False bit for bit ('=' yes, '!' no, '-' not replayed)")
        print(f"{'model':6} {'dtype':5} {'mode':30} {'strategy':22} {'max|d|':>9} {'mean|d|':>9} {'exact':>5} "
              f"{'fp32 max':>9} {'fp32 mean':>9} graphs ok", flush=True)
        if args.out:
            open(args.out, "w").close()

    def emit(r):  # each row as soon as it is measured: a run cut short still leaves what it measured
        rows.append(r)
        print(f"{r['model']:6} {r['dtype']:5} {r['mode']:30} {r['strategy']:22} {r['max_diff']:9.2e} "
              f"{r['mean_diff']:9.2e} {str(r['bit_identical']):>5} {r['fp32_max']:9.2e} {r['fp32_mean']:9.2e} "
              f"{r.get('graphs', '-'):>6} {r['ok']}", flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(r) + "\n")

    for model in args.models.split(","):
        torch.manual_seed(0)
        class_name, config = NAMED_CONFIGS[model]
        base = getattr(diffusers, class_name)(**config).eval()
        base.enable_tiling(tile_sample_min_height=128, tile_sample_min_width=128,
                           tile_sample_stride_height=96, tile_sample_stride_width=96)
        base.use_tiling = False
        for dname in args.dtypes.split(","):
            dtype = torch.float32 if dname == "fp32" else torch.bfloat16
            plain = copy.deepcopy(base).to(device, dtype)
            g = torch.Generator().manual_seed(1)
            z = torch.randn(*shapes[model], generator=g).to(device, dtype)
            refs = {}
            if rank == 0:
                with torch.no_grad():
                    refs["untiled"] = plain.decode(z).sample.float()
                    refs["tiled"] = plain.tiled_decode(z).sample.float()
                    # the fp32 decode of the same latent: how far each bf16 result is from exact math
                    truth_vae = copy.deepcopy(base).to(device, torch.float32)
                    refs["fp32"] = truth_vae.decode(z.float()).sample
                    del truth_vae
                if dtype != torch.float32:
                    d = (refs["untiled"] - refs["fp32"]).abs()
                    emit(dict(model=model, dtype=dname, mode="diffusers-untiled", strategy="(reference)",
                                     world=1, shape=list(z.shape), max_diff=0.0, mean_diff=0.0, bit_identical=True,
                                     ref_std=refs["untiled"].std().item(), ok=True,
                                     fp32_max=d.max().item(), fp32_mean=d.mean().item()))
            vae = vaeshard.parallelize(plain, mode="auto")
            variants = [(steps_setting(k), None) for k in args.frames_per_step.split(",")]
            variants += [(1, int(m)) for m in filter(None, args.max_layer_frames.split(","))]
            runs = [(m, e, v) for m in args.modes.split(",") for e in (False, True) for v in (variants if not e else [(1, None)])
                    if m != "tile" or e]
            for mode, exact_tier, (per_step, layer_frames) in runs:
                vaeshard.parallelize(vae, mode=mode, exact=exact_tier, frames_per_step=per_step,
                                     max_layer_frames=layer_frames)
                strategy = vaeshard.plan(vae, z.shape, world, mode).strategy
                captured = captures.count
                out = vae.decode(z).sample
                graphs = "-"
                if captures.count > captured:  # the same request without graphs: the same bits?
                    vaeshard.parallelize(vae, mode=mode, exact=exact_tier, frames_per_step=per_step,
                                         max_layer_frames=layer_frames, cuda_graphs=False)
                    eager = vae.decode(z).sample
                    graphs = "=" if torch.equal(out, eager) else "!"
                    del eager
                if rank != 0:
                    continue
                ref = refs["tiled"] if strategy == "tile" else refs["untiled"]
                d = (out.float() - ref).abs()
                tol = TOL[dname]
                exact = bool(torch.equal(out.float(), ref))
                if strategy == "tile":
                    ok = d.max().item() <= tol["max"]
                else:
                    ok = d.max().item() <= tol["max"] and (tol["mean"] is None or d.mean().item() <= tol["mean"])
                ok = ok and graphs != "!"
                ok_all &= ok
                t = (out.float() - refs["fp32"]).abs()
                label = mode + (" exact" if exact_tier else " fast") + (f" k={per_step}" if per_step not in (1, "auto") else "")
                label += f" m={layer_frames}" if layer_frames else ""
                emit(dict(model=model, dtype=dname, mode=label,
                                 strategy=strategy, world=world,
                                 shape=list(z.shape), max_diff=d.max().item(), mean_diff=d.mean().item(),
                                 bit_identical=exact, ref_std=ref.std().item(), ok=ok, graphs=graphs,
                                 fp32_max=t.max().item(), fp32_mean=t.mean().item()))
            del vae, plain, refs
            torch.cuda.empty_cache()
    dist.destroy_process_group()
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
