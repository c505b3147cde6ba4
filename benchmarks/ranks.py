#!/usr/bin/env python3
"""Several ranks' work: one rank's share timed alone, faults, kept CUDA graphs across ranks, and the
cost of the exchanges. One command each:

    python3 benchmarks/ranks.py share --preset wan21-720p --ranks 1,2 --reps 3
    python3 benchmarks/ranks.py share --config hunyuanvideo --latent 1,16,9,90,160 --ranks 1,2,4,8 --json hv.json
    python3 benchmarks/ranks.py share --small --device cpu --config flux1 --latent 1,16,8,12 --mode spatial,tile
    torchrun --standalone --nproc_per_node=2 benchmarks/ranks.py faults --oom-rank 1 --group-timeout 60
    python3 benchmarks/ranks.py kept-graphs [--models wan21,wan22]
    torchrun --standalone --nproc_per_node=2 benchmarks/ranks.py kept-graphs --mode spatial_shard_height
    torchrun --standalone --nproc_per_node=2 benchmarks/ranks.py halo [--cpu]
    torchrun --standalone --nproc_per_node=2 benchmarks/ranks.py agreement [--rounds 2000] [--backend gloo]

share: one rank's share of a sharded decode, timed on one GPU with its communication stood in. For
a machine with fewer GPUs than the decode is meant for: this process runs, on its one GPU, what one
rank of N runs in vaeshard's default tier (the fast tier where the family's plan runs it, else
diffusers' own layers), with `memory_model.StandInComm` in place of the communication. Any family:
a Wan `--preset`, or `--config NAME --latent B,C,[T,]H,W` for any named config (NAMED_CONFIGS;
image VAEs take 4-D latents). The shares (`--mode`): `spatial`, the spatial shards `auto` plans for
the VAE with its own tiling and frame-wise decoding off, along the axis it picks, as rank 0 of 2
(rank 1 where N > 2: it has two neighbours) runs them; `tile`, the tiles of the VAE's tiled decode
(its tiling switched on), as the rank whose tiles weigh most runs them with the others' gathered
(one rank: every tile); `auto` (default), the one of them `auto` runs for the VAE as configured: its
tiles where the VAE's own tiling tiles the latent (MiniMax-H3's is on), else its spatial shards, also
where `auto` runs the VAE's own frame-wise decode on one rank alone (HunyuanVideo's by default, which
has no rank share: the output says so and times the spatial shards of its untiled decode). A rank
count a share cannot use (a latent too narrow for N ranks, a family without a tiled decode, one tile)
gets a line and a row that say why, and no time. The stand-in allocates what the exchanges and the
final gather allocate (send copies, receive buffers, gathered keys and values, every rank's tiles,
the assembled output) and sends nothing (a sharded norm's statistics are this rank's alone), so the
halo rows hold whatever their buffers held: the output is not the decode's, the work is. Prints, per
rank count (and `--cuda-graphs` and `--parts` value), the median wall time of `--reps` decodes after
a warm-up one (each between device synchronisations), when the host had issued the decode (its call
returned) and how long its thread ran until then (`time.thread_time`: without the time a busy
machine kept it waiting; where the GPU is idle most of the time, a small `--latent`, the host's own
cost), the peak allocated memory over a decode (`max_memory_allocated` minus what the weights and
the latent hold: tensors that kept CUDA graphs hold between decodes count), and what stays allocated
and reserved after the decodes; last, a summary line per share. `--json FILE` writes the rows (one
per rank count and setting: median seconds, peak GiB, config, latent, axis, strategy, tier),
rewritten after each row so a run cut short keeps what it timed. `--device cpu` runs on the CPU
(no memory figures), with `--small` on the family's tiny test config: a check of the script.
`--cuda-graphs keep` (or `keep-on`) times `keep_cuda_graphs=True` with cuda_graphs "auto" (True):
the warm-up and the first timed decode capture, the later ones replay; the kept graphs are released
after each row. `--kernel-profile` adds a profiled decode: GPU kernel time by class, the kernels
whose time fell least against the first row, and when the GPU waited. What this is: a rank's own GPU
and host work, without the exchanges' transfers and without waiting for its neighbours: a lower
bound for an N-GPU decode's time, not a measurement of one, labelled a rank share wherever it is
quoted; the N-GPU decode adds the NCCL kernels and the waits (BENCHMARKS.md, Protocol, "Rank
share"). The peak is a rank's, without NCCL's own buffers.

faults: CUDA out-of-memory on one rank during a sharded decode: every rank must stop, none may hang.
Rank `--oom-rank` caps its allocator with torch.cuda.set_per_process_memory_fraction so its share of
a Wan 2.1 720p decode cannot fit; the other ranks are unconstrained. Each rank prints one JSON line:
what it raised (or that it finished), and after how many seconds. A rank stuck in a collective is
ended by NCCL's watchdog at the group timeout (TORCH_NCCL_ASYNC_ERROR_HANDLING tears the process
down), so look at torchrun's exit status and the wall time of the whole command as well. Run it under
`timeout` so a hang would show as exit 124.

kept-graphs: `FastOptions(keep_cuda_graphs=True)`, every request's output against the eager decode,
bit for bit. Under torchrun (NCCL) every rank decodes its share in `--mode` and the kept graphs hold
the halo exchanges; the reference is the same mode's eager decode. CUDA graphs replay the kernels the
eager calls launch, so a replayed decode equals the eager one (`FastOptions(cuda_graphs=False)`) bit
for bit. With kept graphs a request may replay graphs another request captured; this runs, per model
(real config, random weights, bf16), a sequence of requests that exercises every way a kept graph is
reused or refused, each compared with the eager decode of the same latent and weights:
  1. a first request (captures the steady call), 2. the same shapes again (replays it, captures the
  first two calls), 3. again (replays every call), 4. new latent values, 5. other frame sizes (the
  kept graphs are dropped), 6. the first shapes again, 7. after an in-place update of a weight,
  8. after the VAE went to the CPU and back (new weight addresses), 9. more frames per call with a
  shorter last call (12 latent frames: 1 + 3 x 3 + 2; a new parallelize call drops the kept
  graphs; the requests before take frames_per_step "auto", 2 at these frame sizes on CUDA), 10. the
  same again, 11. after `vaeshard.release` (the latent of 9).
It also prints each request's time, how many graph captures it made (vaeshard's debug log) and the
memory the kept graphs hold between requests. Exits 1 if any output differs.

halo: the cost of one halo exchange (`Comm.fill_halo`): the host's time and the wall time per
exchange. A sharded Wan decode makes about 36 exchanges per latent frame (one per spatial
convolution). Each is timed in a loop of `--iters` calls on a channels-last convolution input buffer:
"host" is the time until the loop has been issued (what the exchange costs the CPU that also
launches the decode's kernels), "wall" until the GPU has finished it too. Shapes: a Wan 2.1 720p
full-resolution convolution input on 2 ranks (96 channels, 6 frames, 720 x 642 sharded on width) and
a latent-level one (384 channels, 3 frames, 90 x 82); `--scale` divides their heights and widths.

agreement: what a request's agreement costs, through the process group's store (vaeshard's) against
one all-gather collective (its former way), timed in the same processes, interleaved. Rank 0 prints
the median and 99th percentile per agreement of each way, microseconds.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import itertools
import json
import logging
import os
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import vaeshard
from vaeshard import FastOptions, tuning
from vaeshard.api import config_of
from vaeshard.cli.bench import PRESETS
from vaeshard.cli.io import NAMED_CONFIGS
from vaeshard.families import family_for
from vaeshard.layers import tier
from vaeshard.runtime import spatial as shard
from vaeshard.runtime.comm import Comm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_parity import CaptureCounter
from memory_model import (
    collectives_stood_in,
    decode_as_rank,
    decode_inputs,
    own_tiling_off,
    sharded_rank,
    share_plan,
    steps_setting,
    tiled_rank,
    tiles_as_rank,
)

# --- share ----------------------------------------------------------------------------------

SHARE_MODES = ("auto", "spatial", "tile")


def share(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="ranks.py share", description="one rank's share of a sharded decode, timed on one GPU"
    )
    subject = ap.add_mutually_exclusive_group()
    subject.add_argument(
        "--preset", default=None, choices=sorted(PRESETS), help="a Wan subject (default wan21-720p without --config)"
    )
    subject.add_argument(
        "--config",
        default=None,
        help="any named config (vaeshard.cli.io.NAMED_CONFIGS: wan21, sdxl, hunyuanvideo, ltx2, ...), with --latent; "
        "with --small also a tiny test config's name (vaeshard.families.tiny_configs)",
    )
    ap.add_argument(
        "--latent",
        default=None,
        help="the latent's shape B,C,[T,]H,W, e.g. 1,16,21,8,16 or 1,16,128,128 (default: the preset's; "
        "needed with --config and --small); a small one with --cuda-graphs off --parts off leaves the "
        "GPU idle most of the time, so the decode's time is the host's cost of issuing it",
    )
    ap.add_argument("--ranks", default="1,2", help="rank counts whose rank share to time (default 1,2)")
    ap.add_argument(
        "--mode",
        default="auto",
        help="the shares to time, one or several, e.g. spatial,tile (default auto): spatial, the spatial shards "
        "`auto` plans with the VAE's own tiling and frame-wise decoding off; tile, the tiles of the VAE's tiled "
        "decode (its tiling switched on where it is off); auto, the one of them `auto` runs for the VAE as "
        "configured (spatial where it runs the VAE's frame-wise decode on one rank)",
    )
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cuda (default) or cpu (a smoke run)")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"), help="default bf16")
    ap.add_argument(
        "--small",
        action="store_true",
        help="the family's tiny test config (the one of --config's name, else the first of its class; the "
        "latent's C is then the tiny config's): a smoke run of the script, e.g. with --device cpu",
    )
    ap.add_argument(
        "--json",
        default=None,
        metavar="FILE",
        help="also write the rows to FILE (rewritten after each row): one per rank count and variant, with its "
        "median seconds, peak GiB, config, latent, axis and strategy",
    )
    ap.add_argument(
        "--cuda-graphs",
        default="auto",
        help="cuda_graphs values to time, e.g. auto,on (default auto); keep, keep-on: auto, on with keep_cuda_graphs",
    )
    ap.add_argument(
        "--host-profile",
        action="store_true",
        help="also: one decode of each share under cProfile, the functions with the most host time",
    )
    ap.add_argument(
        "--kernel-profile",
        action="store_true",
        help="also: one decode of each share under torch.profiler, its GPU kernel time by class and the "
        "kernels whose time fell least against the first row's (where the share does not scale)",
    )
    ap.add_argument(
        "--top",
        type=int,
        default=25,
        help="functions or kernels listed by --host-profile and --kernel-profile (default 25)",
    )
    ap.add_argument(
        "--parts-from-pixels",
        default=None,
        help="tuning.PARTS_FROM_PIXELS and SHARDED_PARTS_FROM_PIXELS, one value or several to time "
        "interleaved, e.g. 393216,131072 (default: the library's); 1 times the parts' host cost "
        "at a small --latent",
    )
    ap.add_argument(
        "--parts",
        default="on",
        help="the default parts of two frames (tuning.PART_FRAMES): on, off or on,off (default on)",
    )
    ap.add_argument(
        "--frames-per-step",
        default="auto",
        help="frames_per_step values to time, one or several interleaved, e.g. auto,1,2 (default auto)",
    )
    ap.add_argument(
        "--debug-log",
        action="store_true",
        help="also: vaeshard's debug log (e.g. each CUDA graph capture and its host time)",
    )
    args = ap.parse_args(argv)
    if args.debug_log:
        logging.basicConfig(format="    log: %(message)s")
        logging.getLogger("vaeshard").setLevel(logging.DEBUG)
    modes = args.mode.split(",")
    if any(m not in SHARE_MODES for m in modes):
        ap.error(f"--mode takes {', '.join(SHARE_MODES)}, not {args.mode}")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (--device cpu runs on the CPU, e.g. with --small)")
    if args.kernel_profile and args.device != "cuda":
        ap.error("--kernel-profile needs --device cuda")
    if args.config is None:
        args.preset = args.preset or "wan21-720p"
        name, shape, label = PRESETS[args.preset][0], PRESETS[args.preset][1], args.preset
    else:
        name, shape, label = args.config, None, args.config
    if args.latent:
        shape = tuple(int(n) for n in args.latent.split(","))
    elif args.config is not None or args.small:
        ap.error("--config and --small need --latent B,C,[T,]H,W")
    try:
        source = _share_model(name, args.small)
    except KeyError:
        ap.error(
            f"unknown config {name!r}: one of {', '.join(NAMED_CONFIGS)}" + (" or a tiny config" if args.small else "")
        )

    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    vae = source.load(dtype=dtype, device=device)  # (random weights, torch.manual_seed(0))
    family = family_for(vae)
    if args.small:  # the tiny config's channels
        shape = (shape[0], family.latent_channels(vae), *shape[2:])
    refused = vaeshard.plan(vae, shape, 1)
    if refused.strategy == "refused":
        ap.error(refused.reason)
    vaeshard.parallelize(vae)
    z = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    print(
        f"{label} latent {tuple(shape)}, {source.description}, {args.dtype} on {device.type}, one device: each rank "
        f"count's rank share, communication stood in (a lower bound for that many devices, not a measurement of it)",
        flush=True,
    )
    record = _ShareRecord(
        args.json,
        {
            "config": label,
            "class": source.class_name,
            "small": args.small,
            "latent": list(shape),
            "dtype": args.dtype,
            "device": args.device,
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "torch": torch.__version__,
            "vaeshard": vaeshard.__version__,
            "reps": args.reps,
            "command": sys.argv if argv is None else ["ranks.py", "share", *argv],
        },
    )
    default_parts, thresholds = tuning.PART_FRAMES, (tuning.PARTS_FROM_PIXELS, tuning.SHARDED_PARTS_FROM_PIXELS)
    try:
        with collectives_stood_in():
            for mode in modes:
                _time_mode(args, mode, vae, z, shape, device, default_parts, record)
    finally:
        tuning.PART_FRAMES, (tuning.PARTS_FROM_PIXELS, tuning.SHARDED_PARTS_FROM_PIXELS) = default_parts, thresholds
    for line in record.summary():
        print(line, flush=True)


def _share_model(name: str, small: bool):
    """The model of a named config (random weights) or with `small` the tiny test config of that name, else
    the one of its class with its latent channels (FLUX.1's 16: autoencoder_kl_flux), else the first of
    its class (vaeshard.families.tiny_configs); KeyError for a name neither knows."""
    from vaeshard.cli.io import ModelSource
    from vaeshard.families import shape_facts, tiny_configs

    if not small:
        class_name, config = NAMED_CONFIGS[name]
        return ModelSource(class_name=class_name, config=config, named=name)
    tiny = tiny_configs()
    if name not in tiny:
        class_name, config = NAMED_CONFIGS[name]
        channels = shape_facts(class_name, config).latent_channels
        same = [n for n, (cls, _) in tiny.items() if cls == class_name]
        name = next((n for n in same if shape_facts(*tiny[n]).latent_channels == channels), same[0])
    class_name, config = tiny[name]
    return ModelSource(class_name=class_name, config=config, named=f"tiny test {name}")


class _ShareRecord:
    """The rows timed so far, written to `path` (JSON: `head`'s fields and "rows") after each row."""

    def __init__(self, path: str | None, head: dict):
        self.path, self.head, self.rows = path, head, []

    def add(self, row: dict) -> None:
        self.rows.append(row)
        if self.path:
            with open(self.path + ".tmp", "w") as f:
                json.dump({**self.head, "rows": self.rows}, f, indent=1)
            os.replace(self.path + ".tmp", self.path)

    def summary(self) -> list[str]:
        """One line per mode: each row's median and peak (or why it has no share)."""
        lines = []
        for mode in dict.fromkeys(r["mode"] for r in self.rows):
            parts = []
            for r in (r for r in self.rows if r["mode"] == mode):
                if not r["ranks"]:
                    parts.append(f"no {r['share']} share")
                    continue
                where = f"{r['ranks']} rank{'s' if r['ranks'] > 1 else ''}"
                where += f" by {r['axis']}" if r["axis"] else ", tiles" if r["share"] == "tile" else ""
                if r["median_s"] is None:
                    parts.append(f"{where}: none")
                    continue
                peak = "" if r["peak_gib"] is None else f" {r['peak_gib']:.2f} GiB"
                parts.append(f"{where}{r['variant']}: {r['median_s']:.3f} s{peak}")
            lines.append(f"summary {self.head['config']} {tuple(self.head['latent'])} {mode}: " + "; ".join(parts))
        return lines


def _mode_setting(vae, shape, mode: str) -> tuple[str, str]:
    """(the share `mode` times, "spatial" or "tile"; what to say of it against `auto`'s plan for the VAE as
    configured, or "")."""
    family = family_for(vae)
    own = family.own_result(vae, "decode", tuple(shape))
    if mode == "auto":
        mode = "tile" if own == "tile" else "spatial"
        if own == "own":
            return mode, (
                f"auto runs this VAE's own decode, {family.own_reason(vae, 'decode')[0]}, on group rank 0 alone: "
                "no rank shares; timed: the spatial shards of its untiled decode (what auto runs with the VAE's "
                "own tiling and frame-wise decoding off)"
            )
        if own == "tile":
            return mode, "auto: this VAE's own tiled decode tiles this latent, so the ranks share its tiles"
        return mode, ""
    if mode == "spatial" and own != "untiled":
        return mode, "auto keeps to this VAE's own decode (its tiling); timed: the spatial shards of its untiled decode"
    if mode == "tile" and own != "tile":
        return mode, "auto shards this VAE's untiled decode; timed: the tiles of its tiled decode (tiling switched on)"
    return mode, ""


@contextlib.contextmanager
def _tiling_for(vae, share: str):
    """The VAE's own tiling as `share` needs it: off for the spatial shards, on for the tiles."""
    if share == "spatial":
        with own_tiling_off(vae):
            yield
        return
    was = getattr(vae, "use_tiling", None)
    if was is False and hasattr(vae, "enable_tiling"):
        vae.use_tiling = True  # (diffusers' enable_tiling with its default sizes sets only this)
    try:
        yield
    finally:
        if was is False:
            vae.use_tiling = False


def _time_mode(args, mode, vae, z, shape, device, default_parts, record) -> None:
    share_kind, note = _mode_setting(vae, shape, mode)
    family = family_for(vae)
    print(f"mode {mode}: the {'tiles' if share_kind == 'tile' else 'spatial shards'}" + (f"; {note}" if note else ""))
    if share_kind == "tile" and not family.supports("decode", "tile"):
        why = getattr(family, "no_tile_reason", None) or f"{family.name} has no tiled decode"
        print(f"  no tile share: {why}", flush=True)
        record.add(_no_share(mode, share_kind, 0, why))
        return
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    graphs_values = {"auto": "auto", "on": True, "off": False, "keep": "auto", "keep-on": True}
    inputs = decode_inputs(vae, z)
    baseline = torch.cuda.memory_allocated(device) if cuda else 0  # the weights and the latent
    first = None
    first_kernels: dict[str, float] | None = None
    first_ranks = None
    for ranks in (int(r) for r in args.ranks.split(",")):
        with _tiling_for(vae, share_kind):
            # the strategy: a tile share is planned over at least 2 ranks (one rank runs every tile)
            chosen = vaeshard.plan(vae, shape, max(ranks, 2) if share_kind == "tile" else ranks)
        if share_kind == "tile" and chosen.strategy != "tile":
            print(f"  {ranks} rank(s): no tile share: {chosen.reason}", flush=True)
            record.add(_no_share(mode, share_kind, ranks, chosen.reason))
            continue
        if (
            share_kind == "spatial"
            and ranks > 1
            and chosen.strategy not in ("spatial_shard_height", "spatial_shard_width")
        ):
            print(f"  {ranks} rank(s): no spatial share: {chosen.reason}", flush=True)
            record.add(_no_share(mode, share_kind, ranks, chosen.reason))
            continue
        axis = None
        if chosen.strategy.startswith("spatial_shard"):
            axis = shard.HEIGHT if chosen.strategy == "spatial_shard_height" else shard.WIDTH
        if share_kind == "tile":
            rank, mine, every = tiled_rank(vae, z, ranks, inputs)
        else:
            rank = sharded_rank(ranks)
        steps_values = [steps_setting(k) for k in args.frames_per_step.split(",")]
        for graphs, steps, (parts, threshold) in itertools.product(
            args.cuda_graphs.split(","), steps_values, _part_settings(args)
        ):
            tuning.PART_FRAMES = default_parts if parts == "on" else None
            if threshold is not None:
                tuning.PARTS_FROM_PIXELS = tuning.SHARDED_PARTS_FROM_PIXELS = threshold
            knobs = dict(
                cuda_graphs=graphs_values[graphs], frames_per_step=steps, keep_cuda_graphs=graphs.startswith("keep")
            )
            # the row's plan and fast-tier choices, resolved from the thresholds just set, as a request's are
            with _tiling_for(vae, share_kind):
                plan = share_plan(vae, shape, max(ranks, 2) if share_kind == "tile" else ranks, None, device, **knobs)

            def decode(plan=plan, ranks=ranks, axis=axis, rank=rank):
                sync()
                if cuda:
                    torch.cuda.reset_peak_memory_stats(device)
                held = baseline  # (kept graphs' tensors count in the peak: they are this decode's)
                start, cpu = time.perf_counter(), time.thread_time()
                with torch.no_grad(), tier.active(plan.fast), _tiling_for(vae, share_kind):
                    if share_kind == "tile":
                        out = tiles_as_rank(vae, z, ranks, inputs, rank)
                    else:
                        out = decode_as_rank(vae, z, ranks, axis, inputs)
                issued, cpu = time.perf_counter() - start, time.thread_time() - cpu
                sync()
                took = time.perf_counter() - start
                del out
                peak = (torch.cuda.max_memory_allocated(device) - held) / 2**30 if cuda else None
                return took, issued, peak, cpu

            decode()  # warm-up: cuDNN's timing, kernel compiles
            runs = [decode() for _ in range(args.reps)]
            median = statistics.median(t for t, _, _, _ in runs)
            host = statistics.median(h for _, h, _, _ in runs)
            cpu = statistics.median(c for _, _, _, c in runs)
            peak = max(p for _, _, p, _ in runs) if cuda else None
            first = first or median
            if share_kind == "tile":
                where = f", rank {rank}'s {mine} of {every} tiles"
            else:
                where = "" if ranks == 1 else f", by {axis}, rank {rank}"
            where += "" if threshold is None else f", parts from {threshold} pixels"
            where += "" if steps == "auto" else f", frames_per_step {steps}"
            where += "" if plan.fast is not None else ", exact tier"
            kept = (torch.cuda.memory_allocated(device) - baseline) / 2**30 if cuda else None
            reserved = torch.cuda.memory_reserved(device) / 2**30 if cuda else None
            memory = (
                f"peak {peak:.2f} GiB ({peak * 2**30 / 1e9:.2f} GB; the last decode's {runs[-1][2]:.2f} GiB); "
                if cuda
                else ""
            )
            print(
                f"  {ranks} rank(s){where}, cuda_graphs {graphs}, default parts {parts}: median {median:.3f} s "
                f"({', '.join(f'{t:.3f}' for t, _, _, _ in runs)}), host returned at {host:.3f} s "
                f"(its thread ran {cpu:.3f} s), {memory}first row / this {first / median:.2f}x"
                + (
                    f"; held after the decodes {kept:.2f} GiB allocated, {reserved:.2f} GiB reserved in all"
                    if cuda
                    else ""
                ),
                flush=True,
            )
            record.add(
                {
                    "mode": mode,
                    "share": share_kind,
                    "ranks": ranks,
                    "rank": rank,
                    "strategy": "direct" if share_kind == "spatial" and ranks == 1 else chosen.strategy,
                    "axis": axis if ranks > 1 else None,
                    "tiles": [mine, every] if share_kind == "tile" else None,
                    "tier": "fast" if plan.fast is not None else "exact",
                    "cuda_graphs": graphs,
                    "frames_per_step": steps,
                    "parts": parts,
                    "parts_from_pixels": threshold,
                    "variant": _variant_label(args, graphs, steps, parts, threshold),
                    "median_s": round(median, 4),
                    "seconds": [round(t, 4) for t, _, _, _ in runs],
                    "host_s": round(host, 4),
                    "thread_s": round(cpu, 4),
                    "peak_gib": None if peak is None else round(peak, 3),
                    "held_gib": None if kept is None else round(kept, 3),
                    "reserved_gib": None if reserved is None else round(reserved, 3),
                    "reason": chosen.reason if ranks > 1 else "",
                    "note": note,
                }
            )
            if args.host_profile:
                _host_profile(decode, args.top)
            if args.kernel_profile:
                first_ranks = first_ranks or ranks
                kernels = _kernel_profile(decode, first_kernels, ranks / first_ranks, args.top)
                first_kernels = first_kernels or kernels
            if vaeshard.release(vae) and cuda:  # (after the profiles: with kept graphs they replay)
                print(
                    f"    after vaeshard.release: {torch.cuda.memory_reserved(device) / 2**30:.2f} GiB reserved in all",
                    flush=True,
                )


def _no_share(mode: str, share_kind: str, ranks: int, why: str) -> dict:
    """The row of a rank count that has no share of this kind, and why."""
    return {
        "mode": mode,
        "share": share_kind,
        "ranks": ranks,
        "rank": None,
        "strategy": None,
        "axis": None,
        "median_s": None,
        "peak_gib": None,
        "variant": "",
        "reason": why,
    }


def _variant_label(args, graphs, steps, parts, threshold) -> str:
    """The row's settings where the command times several (for the summary), e.g. " graphs on"."""
    label = ""
    if "," in args.cuda_graphs:
        label += f" graphs {graphs}"
    if "," in args.frames_per_step:
        label += f" steps {steps}"
    if "," in args.parts:
        label += f" parts {parts}"
    if threshold is not None and "," in (args.parts_from_pixels or ""):
        label += f" from {threshold}"
    return label


def _part_settings(args):
    """(--parts value, --parts-from-pixels value or None) pairs in the order they are timed."""
    thresholds = [None] if args.parts_from_pixels is None else [int(v) for v in args.parts_from_pixels.split(",")]
    return [(parts, threshold) for parts in args.parts.split(",") for threshold in thresholds]


def _host_profile(decode, top: int) -> None:
    """One more decode under cProfile: the host's own time by function (a device synchronisation
    shows as time in the function that waited)."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    decode()
    profiler.disable()
    for order in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(top)
        print(f"    host time by function, by {order} (cProfile):\n" + text.getvalue().split("\n\n", 1)[-1], flush=True)


def _kernel_profile(decode, first: dict[str, float] | None, scale: float, top: int) -> dict[str, float]:
    """One more decode under torch.profiler: GPU kernel seconds by class and by kernel; against the
    first profiled row, whose share is `scale` times this one's, the kernels with the most time
    above their first-row time / `scale` (what did not scale with the rank count)."""
    from profile_decode import _busy_seconds, classify
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        took = decode()[0]
    kernels: dict[str, float] = {}
    for evt in prof.key_averages():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            kernels[evt.key] = kernels.get(evt.key, 0.0) + evt.device_time_total / 1e6
    total = sum(kernels.values())
    print(
        f"    profiled decode {took:.3f} s: GPU kernel time {total:.3f} s, busy {_busy_seconds(prof):.3f} s", flush=True
    )
    _idle_report(prof)
    classes: dict[str, list[float]] = {}
    for index, profiled in enumerate((kernels, first or {})):
        for name, t in profiled.items():
            classes.setdefault(classify(name), [0.0, 0.0])[index] += t
    for label, (t, base) in sorted(classes.items(), key=lambda kv: -kv[1][0]):
        versus = f"  (first row {base:.3f} s, {base / t:.2f}x)" if first and t else ""
        print(f"    {label:22} {t:7.3f} s{versus}", flush=True)
    if first:
        rows = sorted(set(kernels) | set(first), key=lambda k: -(kernels.get(k, 0.0) - first.get(k, 0.0) / scale))
        print(f"    kernels by their time above the first row's / {scale:g}:", flush=True)
        for name in rows[:top]:
            print(
                f"    {kernels.get(name, 0.0):7.4f} s (first row {first.get(name, 0.0):7.4f} s)  {name[:100]}",
                flush=True,
            )
    else:
        for name, t in sorted(kernels.items(), key=lambda kv: -kv[1])[:top]:
            print(f"    {t:7.4f} s  {name[:110]}", flush=True)
    return kernels


def _idle_report(prof, parts: int = 10, largest: int = 8) -> None:
    """When the GPU waited inside the profiled decode: its idle time (gaps between kernels of at least
    20 us) in each tenth of the kernels' span, and the largest gaps with their offsets from the first
    kernel (a capture, a host-paced stretch, a synchronisation)."""
    spans = sorted(
        (e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
    )
    if not spans:
        return
    origin, end, gaps = spans[0][0], spans[0][1], []
    for start, stop in spans[1:]:
        if start - end >= 20:
            gaps.append((end - origin, start - end))
        end = max(end, stop)
    width = (end - origin) / parts
    tenths = [0.0] * parts
    for at, length in gaps:
        tenths[min(int(at // width), parts - 1)] += length / 1e3
    print(
        f"    GPU idle {sum(g for _, g in gaps) / 1e6:.3f} s in {len(gaps)} gaps; ms per tenth of the "
        f"{(end - origin) / 1e6:.3f} s span: {' '.join(f'{t:.1f}' for t in tenths)}",
        flush=True,
    )
    print(
        "    largest gaps (ms at offset ms): "
        + ", ".join(f"{g / 1e3:.1f} at {at / 1e3:.0f}" for at, g in sorted(gaps, key=lambda ag: -ag[1])[:largest]),
        flush=True,
    )


# --- faults ----------------------------------------------------------------------------------


def faults(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ranks.py faults", description="CUDA out-of-memory on one rank: every rank stops")
    ap.add_argument("--oom-rank", type=int, default=1)
    ap.add_argument("--fraction", type=float, default=0.01, help="memory fraction for the OOM rank")
    ap.add_argument("--group-timeout", type=float, default=60.0)
    ap.add_argument("--shape", default="1,16,9,90,160")
    ap.add_argument("--mode", default="spatial_shard_width")
    args = ap.parse_args(argv)

    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device, timeout=timedelta(seconds=args.group_timeout))
    rank = dist.get_rank()
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    vae = AutoencoderKLWan().eval().to(device, torch.bfloat16)
    vaeshard.parallelize(vae, mode=args.mode)
    shape = tuple(int(v) for v in args.shape.split(","))
    z = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(device, torch.bfloat16)
    vae.decode(z[:, :, :1])  # warm-up with room to spare: communicators and kernels are ready
    torch.cuda.synchronize()
    dist.barrier()
    if rank == args.oom_rank:
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(args.fraction, device)
    start = time.perf_counter()
    outcome = {"rank": rank, "oom_rank": args.oom_rank, "shape": list(shape), "mode": args.mode}
    try:
        vae.decode(z)
        torch.cuda.synchronize()
        outcome.update(result="finished")
    except BaseException as exc:  # record whatever surfaced
        outcome.update(result="raised", error=type(exc).__name__, message=str(exc).splitlines()[0][:300])
    outcome["seconds"] = round(time.perf_counter() - start, 3)
    print(json.dumps(outcome), flush=True)
    try:
        dist.destroy_process_group()
    except Exception:
        pass
    return 0 if outcome["result"] == "finished" else 1


# --- kept_graphs ----------------------------------------------------------------------------------


def _check_model(name: str, mode: str, device: torch.device, world: int, captures: CaptureCounter, say) -> int:
    """The requests of the module's text for one model (real config, random weights, bf16) in `mode`;
    how many outputs differed from the eager decode."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    vae = AutoencoderKLWan(**NAMED_CONFIGS[name][1]).eval().to(device, torch.bfloat16)
    channels = vae.config.z_dim
    small, other = (30, 52), (26, 40)  # latent frames (240 x 416 and 208 x 320 decoded, x8)
    if name == "wan22":
        small, other = (15, 26), (13, 20)  # x16

    def latent(frames, hw, seed):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(1, channels, frames, *hw, generator=g).to(device, torch.bfloat16)

    # the reference: the same weights, decoded eagerly (its own object: a parallelize call on
    # `vae` would drop the kept graphs)
    reference_vae = copy.deepcopy(vae)
    vaeshard.parallelize(reference_vae, mode=mode, fast=FastOptions(cuda_graphs=False))

    def reference(z, frames_per_step):
        vaeshard.parallelize(
            reference_vae, mode=mode, fast=FastOptions(cuda_graphs=False, frames_per_step=frames_per_step)
        )
        with torch.no_grad():
            return reference_vae.decode(z).sample

    z1, z2, z3, z4 = latent(9, small, 1), latent(9, small, 2), latent(9, other, 3), latent(12, small, 4)

    def bump():
        for model in (vae, reference_vae):
            with torch.no_grad():
                model.decoder.up_blocks[0].resnets[0].conv1.weight.mul_(1.5)

    def move():
        vae.to("cpu")
        vae.to(device)

    def fewer_calls():
        vaeshard.parallelize(vae, mode=mode, fast=FastOptions(keep_cuda_graphs=True, frames_per_step=3))

    steps = [
        ("1 first request", z1, None),
        ("2 same shapes", z1, None),
        ("3 same shapes", z1, None),
        ("4 new latent values", z2, None),
        ("5 other frame sizes", z3, None),
        ("6 first shapes again", z1, None),
        ("7 a weight updated in place", z1, bump),
        ("8 to the CPU and back", z2, move),
        ("9 frames_per_step=3, a shorter last call", z4, fewer_calls),
        ("10 the same again", z4, None),
        ("11 after vaeshard.release", z4, lambda: vaeshard.release(vae)),
    ]
    vaeshard.parallelize(vae, mode=mode, fast=FastOptions(keep_cuda_graphs=True))  # cuda_graphs "auto"
    gc.collect()  # the previous model's objects (reference cycles) freed now, not during this one's requests
    baseline = torch.cuda.memory_allocated(device)
    say(
        f"{name}, {world} rank(s), mode {mode}: keep_cuda_graphs=True, each request against the eager "
        f"decode (cuda_graphs=False) of the same weights (rank 0's figures)",
        flush=True,
    )
    failures = 0
    for label, z, before in steps:
        if before is not None:
            before()
        expected = reference(z, config_of(vae).fast.frames_per_step)
        torch.cuda.synchronize()
        made, start = captures.count, time.perf_counter()
        with torch.no_grad():
            out = vae.decode(z).sample
        torch.cuda.synchronize()
        took, made = time.perf_counter() - start, captures.count - made
        held = (torch.cuda.memory_allocated(device) - baseline) / 2**30
        same = torch.equal(out, expected)
        failures += not same
        say(
            f"  {label:42} {'equal' if same else 'DIFFERENT'}  {took:.3f} s  {made} capture(s)  "
            f"held after it {held:.2f} GiB",
            flush=True,
        )
        del out, expected
    vaeshard.release(vae)
    return failures


def kept_graphs(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="ranks.py kept-graphs", description="kept CUDA graphs against the eager decode, bit for bit"
    )
    ap.add_argument("--models", default="wan21,wan22")
    ap.add_argument("--mode", default="auto", help="vaeshard mode (under torchrun: e.g. spatial_shard_height)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("nccl", device_id=device)
    main_rank = world == 1 or dist.get_rank() == 0
    say = print if main_rank else (lambda *a, **k: None)

    captures = CaptureCounter()
    logger = logging.getLogger("vaeshard")
    logger.addHandler(captures)
    logger.setLevel(logging.DEBUG)
    failures = 0
    for name in args.models.split(","):
        failures += _check_model(name, args.mode, device, world, captures, say)
        torch.cuda.empty_cache()
    if world > 1:  # every rank's outputs
        counted = torch.tensor([failures], device=device)
        dist.all_reduce(counted)
        failures = int(counted.item())
        dist.destroy_process_group()
    say("kept graphs:", "every output equal to the eager decode" if not failures else f"{failures} DIFFERENT")
    return 1 if failures else 0


# --- halo ----------------------------------------------------------------------------------


HALO_SHAPES = {"full-res": (1, 96, 6, 720, 642), "latent-level": (1, 384, 3, 90, 82)}


def halo(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="ranks.py halo", description="the cost of one halo exchange")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--cpu", action="store_true", help="gloo on CPU ranks")
    ap.add_argument("--scale", type=int, default=1, help="divide the shapes' heights and widths by this")
    args = ap.parse_args(argv)
    if args.cpu:
        dist.init_process_group("gloo")
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    comm = Comm.for_group(dist.group.WORLD)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for shape_name, shape in HALO_SHAPES.items():
        shape = (*shape[:3], shape[3] // args.scale, shape[4] // args.scale)
        buf = torch.randn(shape, device=device).to(torch.bfloat16).contiguous(memory_format=torch.channels_last_3d)
        for _ in range(5):
            comm.fill_halo(buf, 4, 1, 1, comm.world)
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            comm.fill_halo(buf, 4, 1, 1, comm.world)
        host = time.perf_counter() - t0
        sync()
        wall = time.perf_counter() - t0
        if comm.rank == 0:
            print(
                f"{shape_name:13} host {host / args.iters * 1e6:7.1f} us/exchange, "
                f"wall {wall / args.iters * 1e6:7.1f} us/exchange ({comm.world} ranks, {device.type})",
                flush=True,
            )
    dist.destroy_process_group()


# --- agreement ----------------------------------------------------------------------------------


def agreement(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="ranks.py agreement", description="a request's agreement: the store against an all-gather"
    )
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--backend", default="gloo")
    args = parser.parse_args(argv)
    dist.init_process_group(args.backend)
    comm = Comm.for_group(dist.group.WORLD)
    values = list(range(15))  # a request's description: 14 ints and a problem code
    times: dict[str, list[float]] = {"store": [], "all-gather": []}
    for i in range(args.rounds):
        for way in ("store", "all-gather") if i % 2 == 0 else ("all-gather", "store"):
            began = time.perf_counter()
            if way == "store":
                comm.agree(values, 60.0, "decode", "benchmark")
            else:
                comm.all_gather_ints(values)
            times[way].append(time.perf_counter() - began)
    if comm.rank == 0:
        for way, ts in times.items():
            ts = sorted(ts[len(ts) // 10 :])  # the first tenth warms up connections
            print(
                f"{way:>10}: median {1e6 * statistics.median(ts):7.1f} us, p99 {1e6 * ts[int(0.99 * len(ts))]:7.1f} "
                f"us over {len(ts)} agreements, {comm.world} ranks, {args.backend}"
            )
    dist.destroy_process_group()


COMMANDS = {"share": share, "faults": faults, "kept-graphs": kept_graphs, "halo": halo, "agreement": agreement}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="ranks.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("command", choices=COMMANDS, help="what to run (COMMAND --help: its options)")
    ap.add_argument("options", nargs=argparse.REMAINDER, help="the command's options")
    args = ap.parse_args(argv)
    return COMMANDS[args.command](args.options) or 0


if __name__ == "__main__":
    sys.exit(main())
