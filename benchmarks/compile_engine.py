#!/usr/bin/env python3
"""PyTorch's compiler against diffusers' eager decode: the fast tier's engine decision, measured.

    python3 benchmarks/compile_engine.py --subject hunyuanvideo15=1,32,16,30,53 \
        [--subject cogvideox=1,16,13,60,90 ...] [--variants eager,blocks,decoder] [--reps 3] \
        [--small 1,C,2,8,12] [--json OUT.jsonl] [--timeout 400]

Each (subject, variant) runs in a fresh process, twice: once with empty inductor and Triton caches
(cold: what a new machine's first request pays) and once with the caches the first run left (warm:
what a restarted service or a second CLI call pays). A subject is a named real config
(`vaeshard.cli.io.NAMED_CONFIGS`) with random weights, bf16, and a latent shape.

Variants:
- `eager`: diffusers' untiled decode as it is (the baseline);
- `blocks`: regional compilation: `torch.compile` of each block of the decoder (mid block, each up
  block), diffusers' own decoder loop between them;
- `decoder`: `torch.compile` of the whole decoder module.

Each process reports the first decode's time (compiles included), the median of `--reps` steady
decodes, the peak memory of the steady decodes above what was allocated before them, the number of
graphs compiled, then a decode of a second, small shape (`--small`: whether and how long the compiler
recompiles for a new request shape) compared with an fp32 eager decode of the same small latent with
TF32 off (the README's bf16 rule: mean and max |diff| against that reference, beside eager bf16's). The
last lines are a table.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

VARIANTS = ("eager", "blocks", "decoder")


def _build(name: str, device):
    import diffusers
    import torch

    from vaeshard.cli.io import NAMED_CONFIGS

    class_name, config = NAMED_CONFIGS[name]
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: seconds, not minutes, for a large VAE
        return getattr(diffusers, class_name)(**config).eval()


def _regions(vae) -> list:
    """The decoder's repeated blocks: what regional compilation compiles one by one."""
    dec = vae.decoder
    regions = []
    for name in ("mid_block", "mid"):
        if getattr(dec, name, None) is not None:
            regions.append(getattr(dec, name))
    for name in ("up_blocks", "up"):
        for block in getattr(dec, name, None) or []:
            regions.append(block)
    if not regions:
        raise SystemExit(f"{type(vae).__name__}: no mid/up blocks found for regional compilation")
    return regions


def _decode(vae, z):
    import torch

    with torch.no_grad():
        return vae.decode(z, return_dict=False)[0]


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(vae, z) -> float:
    _sync()
    t0 = time.perf_counter()
    _decode(vae, z)
    _sync()
    return time.perf_counter() - t0


def child(args) -> dict:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    name, shape = args.subject.split("=")
    shape = tuple(int(s) for s in shape.split(","))
    small = tuple(int(s) for s in args.small.split(",")) if args.small else None
    ref32 = _build(name, dev)
    vae = copy.deepcopy(ref32).to(torch.bfloat16)
    if small is not None:
        small = (small[0], vae.config.latent_channels, *small[2:]) if len(small) == 5 else small
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(shape, generator=gen).to(dev, torch.bfloat16)
    z_small = torch.randn(small, generator=gen).to(dev) if small is not None else None
    out_small_eager = None
    if z_small is not None:  # references first, before anything is compiled
        with torch.no_grad():
            ref = ref32.decode(z_small, return_dict=False)[0].float()
        out_small_eager = _decode(vae, z_small.to(torch.bfloat16)).float()
    del ref32
    if cuda:
        torch.cuda.empty_cache()

    if args.variant == "blocks":
        for block in _regions(vae):
            block.compile()
    elif args.variant == "decoder":
        vae.decoder.compile()
    from torch._dynamo.utils import counters

    row = {
        "subject": name,
        "shape": list(shape),
        "variant": args.variant,
        "cache": args.cache,
        "gpu": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
    }
    t0 = time.perf_counter()
    first = _timed(vae, z)
    row["first_s"] = round(first, 3)
    row["graphs_first"] = int(counters["stats"]["unique_graphs"])
    times = []
    base = torch.cuda.memory_allocated() if cuda else 0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for _ in range(args.reps):
        times.append(_timed(vae, z))
    row["peak_gib"] = round((torch.cuda.max_memory_allocated() - base) / 2**30, 3) if cuda else 0.0
    row["median_s"] = round(statistics.median(times), 4)
    row["times"] = [round(t, 4) for t in times]
    if z_small is not None:
        before = int(counters["stats"]["unique_graphs"])
        row["small_first_s"] = round(_timed(vae, z_small.to(torch.bfloat16)), 3)
        row["small_new_graphs"] = int(counters["stats"]["unique_graphs"]) - before
        out = _decode(vae, z_small.to(torch.bfloat16)).float()
        row["small_mean_vs_fp32"] = float((out - ref).abs().mean())
        row["small_max_vs_fp32"] = float((out - ref).abs().max())
        row["eager_bf16_mean_vs_fp32"] = float((out_small_eager - ref).abs().mean())
        row["eager_bf16_max_vs_fp32"] = float((out_small_eager - ref).abs().max())
        row["small_max_vs_eager_bf16"] = float((out - out_small_eager).abs().max())
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    return row


def _table(rows: list[dict]) -> str:
    lines = [
        "subject | variant | cache | first s | median s | x eager | peak GiB | x eager | small recompile s "
        "| mean/eager mean vs fp32 | max/eager max"
    ]
    eager = {(r["subject"], r["cache"]): r for r in rows if r.get("variant") == "eager" and "median_s" in r}
    for r in rows:
        if "median_s" not in r:
            err = r.get("error", "")[-80:]
            lines.append(f"{r.get('subject')} | {r.get('variant')} | {r.get('cache')} | FAILED {err}")
            continue
        e = eager.get((r["subject"], "cold")) or eager.get((r["subject"], r["cache"]))
        sp = e["median_s"] / r["median_s"] if e else float("nan")
        mem = r["peak_gib"] / e["peak_gib"] if e and e["peak_gib"] else float("nan")
        q = (
            r.get("small_mean_vs_fp32", float("nan")) / r["eager_bf16_mean_vs_fp32"]
            if r.get("eager_bf16_mean_vs_fp32")
            else float("nan")
        )
        qm = (
            r.get("small_max_vs_fp32", float("nan")) / r["eager_bf16_max_vs_fp32"]
            if r.get("eager_bf16_max_vs_fp32")
            else float("nan")
        )
        lines.append(
            f"{r['subject']} | {r['variant']} | {r['cache']} | {r['first_s']:.2f} | {r['median_s']:.3f} | "
            f"{sp:.2f}x | {r['peak_gib']:.2f} | {mem:.2f} | {r.get('small_first_s', float('nan')):.2f} | "
            f"{q:.3f} | {qm:.3f}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--subject", action="append", required=True, help="NAME=B,C,T,H,W (a named config)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--small", default="1,0,2,8,12", help="the second request shape (C is the model's)")
    p.add_argument("--json", help="append each row to this JSON-lines file")
    p.add_argument("--device", default="cuda", help="cuda, or cpu to check the script")
    p.add_argument("--timeout", type=float, default=400.0, help="seconds each process may take")
    p.add_argument(
        "--warm",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run each compiled variant again on the caches its cold run left",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--cache", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        args.subject = args.subject[0]
        print("ROW " + json.dumps(child(args)), flush=True)
        return 0
    rows = []
    for subject in args.subject:
        for variant in args.variants.split(","):
            with tempfile.TemporaryDirectory() as cache:
                runs = ["cold", "warm"] if (variant != "eager" and args.warm) else ["cold"]
                for state in runs:
                    env = dict(
                        os.environ,
                        TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"),
                        TRITON_CACHE_DIR=os.path.join(cache, "triton"),
                    )
                    cmd = [
                        sys.executable,
                        __file__,
                        "--child",
                        "--subject",
                        subject,
                        "--variant",
                        variant,
                        "--cache",
                        state,
                        "--reps",
                        str(args.reps),
                        "--small",
                        args.small,
                        "--device",
                        args.device,
                    ]
                    t0 = time.perf_counter()
                    try:
                        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
                        found = [ln[4:] for ln in done.stdout.splitlines() if ln.startswith("ROW ")]
                        row = (
                            json.loads(found[-1])
                            if found
                            else {
                                "subject": subject.split("=")[0],
                                "variant": variant,
                                "cache": state,
                                "error": (done.stderr or done.stdout)[-2000:],
                            }
                        )
                    except subprocess.TimeoutExpired:
                        row = {
                            "subject": subject.split("=")[0],
                            "variant": variant,
                            "cache": state,
                            "error": f"timed out after {args.timeout} s",
                        }
                    row["process_s"] = round(time.perf_counter() - t0, 1)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    if args.json:
                        with open(args.json, "a") as f:
                            f.write(json.dumps(row) + "\n")
    print(_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
