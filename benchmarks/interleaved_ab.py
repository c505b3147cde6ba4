#!/usr/bin/env python3
"""A/B runs: one fast-tier setting at two values, interleaved in the same processes (A, B, A, B, ...),
and (`bits`) the bits of every mode's decode, to compare two versions of vaeshard.

    torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-480p \\
        --setting triton_convs --values true,false --rounds 5
    torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-720p \\
        --setting mode --values spatial_shard_height,spatial_shard_width --rounds 3
    python3 benchmarks/interleaved_ab.py --preset wan21-720p --setting patch --values off,on \\
        --patch "vaeshard.layers.tier:upsample_by_phases=lambda x: False"
    python3 benchmarks/interleaved_ab.py --preset wan21-720p --setting patch --values off,on \\
        --patch "vaeshard.tuning:PART_FRAMES=None"
    python3 benchmarks/interleaved_ab.py bits --config wan21 --shape 1,16,21,90,160 --json bits.json

Separate `vaeshard bench` runs of the two values land in different processes, whose own pace can
differ by more than the setting does. Here both values share the processes, the model and the
latent: `vaeshard.parallelize` switches the setting (a `vaeshard.FastOptions` field, or the mode)
between decodes, each value gets one warm-up decode, then `--rounds` rounds time one decode of each
value (wall clock on every rank after a device synchronisation and a barrier; the slowest rank's
time). Prints each value's times and median, its peak allocated memory over the decode (rank 0),
and how far the two values' outputs lie apart.

`--setting patch` compares the library with a change to it, undone between decodes: `--patch
MODULE:ATTR=EXPR` sets that attribute to the Python expression's value for the value `on` and back
to the library's for `off` (a function that declines a path, say, to time the library without it, or
a threshold of vaeshard.tuning, which each request reads when it is planned).

`bits`: random weights (torch.manual_seed(0)) with a named real config, a seeded latent, bf16: for
each mode the decode of the default fast tier with cuDNN's benchmark mode off (cuDNN then picks its
algorithms by heuristic, the same in every process, so equal code gives equal bits), the exact tier,
and `tile`. Prints one JSON line per decode with the SHA-256 of the output's bytes; two versions
decoded the same way agree bit for bit where the hashes do. Runs on the version of vaeshard on the
path (0.2 and later); `--device cpu` for a run without a GPU.

`bits --concurrent N [--repeat M]`: the same decodes by one process alone, then by N processes at
once on the same device (each M times): every decode's hash against the one made alone, and its count
of non-finite values. Equal code decodes alike whether the device is shared or not, so a hash that
differs under contention is a race (a kernel or a stream order that holds only on an idle device).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import vaeshard
from vaeshard.cli.bench import PRESETS
from vaeshard.cli.io import NAMED_CONFIGS, named_model

# --- ab ----------------------------------------------------------------------------------


FAST_TIER_SETTINGS = tuple(f.name for f in dataclasses.fields(vaeshard.FastOptions))


def _value(text: str):
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    return int(low) if low.lstrip("-").isdigit() else low  # e.g. cuda_graphs=auto


class Patch:
    """MODULE:ATTR=EXPR: an attribute of a module set to an expression's value, and set back."""

    def __init__(self, module, attr: str, value):
        self.module, self.attr, self.value = module, attr, value
        self.original = getattr(module, attr)

    @classmethod
    def parse(cls, text: str) -> Patch:
        target, sep, expr = text.partition("=")
        name, colon, attr = target.strip().partition(":")
        if not (sep and colon and name and attr.strip() and expr.strip()):
            raise ValueError(f"--patch wants MODULE:ATTR=EXPR, got {text!r}")
        module = importlib.import_module(name)
        value = eval(expr, {"torch": torch, "vaeshard": vaeshard})  # (the tool's own argument)
        return cls(module, attr.strip(), value)

    def apply(self, on: bool) -> None:
        setattr(self.module, self.attr, self.value if on else self.original)


def ab(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="interleaved_ab.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--preset", choices=sorted(PRESETS), default="wan21-480p")
    ap.add_argument(
        "--setting",
        choices=(*FAST_TIER_SETTINGS, "mode", "patch"),
        required=True,
        help="a fast-tier setting, mode (then --values are two modes) or patch (--values off,on)",
    )
    ap.add_argument("--values", required=True, help="two values, e.g. true,false or 1,2")
    ap.add_argument("--patch", help="with --setting patch: MODULE:ATTR=EXPR, set for the value 'on'")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mode", default="auto")
    args = ap.parse_args(argv)
    values = [_value(v) for v in args.values.split(",")]
    patch = None
    if args.setting == "patch":
        if not args.patch or set(values) != {"on", "off"}:
            ap.error("--setting patch needs --patch MODULE:ATTR=EXPR and --values off,on")
        patch = Patch.parse(args.patch)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl", device_id=device)
    from diffusers import AutoencoderKLWan

    config, shape, _ = PRESETS[args.preset]
    torch.manual_seed(0)
    vae = AutoencoderKLWan(**NAMED_CONFIGS[config][1]).eval().to(device, torch.bfloat16)
    z = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(device, torch.bfloat16)

    peaks: dict[str, float] = {}

    def decode(value, keep: bool = False):
        if patch is not None:
            patch.apply(value == "on")
            vaeshard.parallelize(vae, mode=args.mode)
        elif args.setting == "mode":  # the value is the mode
            vaeshard.parallelize(vae, mode=value)
        else:
            vaeshard.parallelize(vae, mode=args.mode, fast=vaeshard.FastOptions(**{args.setting: value}))
        if world > 1:
            dist.barrier()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        held = torch.cuda.memory_allocated(device)
        start = time.perf_counter()
        with torch.no_grad():
            out = vae.decode(z).sample
        torch.cuda.synchronize()
        took = torch.tensor([time.perf_counter() - start], device=device)
        peaks[str(value)] = (torch.cuda.max_memory_allocated(device) - held) / 2**30
        if world > 1:
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
        return took.item(), (out if keep else None)

    # warm-up: cuDNN's timing, kernel compiles, the allocator's growth; the outputs compared
    outs = [decode(value, keep=True)[1] for value in values]
    diff = (outs[0].float() - outs[1].float()).abs()
    apart = f"max {diff.max().item():.3e}, mean {diff.mean().item():.3e}, equal {(diff == 0).float().mean().item():.5f}"
    del outs, diff
    times = {str(v): [] for v in values}
    for _ in range(args.rounds):
        for value in values:
            times[str(value)].append(decode(value)[0])
    if patch is not None:
        patch.apply(False)
    if rank == 0:
        what = f"patch {args.patch}" if patch is not None else args.setting
        print(f"{args.preset}, {world} GPU(s), mode {args.mode}: {what} interleaved, {args.rounds} rounds")
        print(f"  outputs of the two values apart: {apart}")
        for value, ts in times.items():
            each = ", ".join(f"{t:.3f}" for t in ts)
            print(
                f"  {args.setting}={value:6} median {statistics.median(ts):.3f} s  ({each})"
                f"  peak {peaks[value]:.2f} GiB (rank 0)"
            )
    if world > 1:
        dist.destroy_process_group()


# --- bits ----------------------------------------------------------------------------------


def bits(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="interleaved_ab.py bits", description="SHA-256 of every mode's decode")
    parser.add_argument("--config", default="wan21", help="a named config of the command line (wan21, wan22, ...)")
    parser.add_argument("--shape", default="1,16,21,90,160", help="latent shape B,C,T,H,W")
    parser.add_argument("--modes", default="auto,tile", help="modes to decode (on one GPU spatial modes run directly)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--json", default=None, help="append the JSON lines to this file")
    parser.add_argument("--small", action="store_true", help="gpu_parity.py's tiny config of the class (a CPU check)")
    parser.add_argument("--repeat", type=int, default=1, help="decodes of each mode per process")
    parser.add_argument(
        "--concurrent", type=int, default=1, help="N: one process alone, then N at once on the device (a race check)"
    )
    parser.add_argument("--child-timeout", type=float, default=600.0, help="seconds the --concurrent children may run")
    args = parser.parse_args(argv)
    if args.concurrent > 1:
        return _concurrent(args, argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if args.small:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from gpu_parity import small_model

        vae = small_model(args.config).to(args.device, torch.bfloat16)
    else:
        vae = named_model(args.config).load(dtype=torch.bfloat16, device=args.device)
    shape = tuple(int(s) for s in args.shape.split(","))
    z = torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(args.device, torch.bfloat16)
    rows = []
    for mode in args.modes.split(","):
        for exact in (False, True):
            if mode == "tile" and exact:
                continue  # tile is always the exact tier
            vaeshard.parallelize(vae, mode, exact=exact, fast=vaeshard.FastOptions(cudnn_benchmark=False))
            with torch.no_grad():
                vae.decode(z[:, :, :2])  # warm-up: compiles, first-call costs
            for _ in range(args.repeat):
                with torch.no_grad():
                    _sync(args.device)
                    began = time.perf_counter()
                    out = vae.decode(z).sample
                    _sync(args.device)
                digest = hashlib.sha256(out.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()
                row = {
                    "version": vaeshard.__version__,
                    "config": args.config,
                    "shape": list(shape),
                    "mode": mode,
                    "exact": exact,
                    "sha256": digest,
                    "seconds": round(time.perf_counter() - began, 3),
                    "nonfinite": int((~torch.isfinite(out)).sum()),
                    "mean": float(out.float().mean()),
                    "std": float(out.float().std()),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
                del out
            vaeshard.unparallelize(vae)
    if args.json:
        with open(args.json, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


def _concurrent(args, argv: list[str]) -> None:
    """`bits --concurrent N`: one child alone (the reference hashes), then N children at once; prints a
    line per decode that differs from the reference or has non-finite values, then a summary line."""
    import subprocess
    import tempfile

    child = [sys.executable, os.path.abspath(__file__), "bits"]
    skip = {"--concurrent", "--json"}
    it = iter(argv)
    for a in it:
        if a in skip:
            next(it, None)
        elif not any(a.startswith(f"{s}=") for s in skip):
            child.append(a)
    with tempfile.TemporaryDirectory() as tmp:

        def run(n: int, tag: str) -> list[dict]:
            paths = [os.path.join(tmp, f"{tag}-{i}.jsonl") for i in range(n)]
            procs = [subprocess.Popen([*child, "--json", p], stdout=subprocess.DEVNULL) for p in paths]
            deadline = time.monotonic() + args.child_timeout
            try:
                codes = [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
            except subprocess.TimeoutExpired:
                for p in procs:
                    p.kill()
                why = f"bits --concurrent: a child ran past --child-timeout ({args.child_timeout} s)"
                raise SystemExit(why) from None
            if any(codes):
                raise SystemExit(f"bits --concurrent: a child process failed ({codes})")
            return [json.loads(line) for p in paths for line in open(p)]

        alone = run(1, "alone")
        shared = run(args.concurrent, "shared")
    reference = {(r["mode"], r["exact"]): r["sha256"] for r in alone}
    bad = [r for r in shared if r["sha256"] != reference[(r["mode"], r["exact"])] or r["nonfinite"]]
    for r in bad:
        print(json.dumps({"differs": True, **r}), flush=True)
    summary = {
        "concurrent": args.concurrent,
        "decodes": len(shared),
        "differ_from_alone": len(bad),
        "nonfinite_decodes": sum(1 for r in shared if r["nonfinite"]),
        "alone_nonfinite": sum(1 for r in alone if r["nonfinite"]),
    }
    print(json.dumps(summary), flush=True)
    if args.json:
        with open(args.json, "a") as f:
            for r in [*alone, *shared]:
                f.write(json.dumps(r) + "\n")
            f.write(json.dumps(summary) + "\n")


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    return bits(argv[1:]) if argv[:1] == ["bits"] else ab(argv)


if __name__ == "__main__":
    main()
