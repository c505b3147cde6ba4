"""`vaeshard demo`: an offline self-check. A Wan 2.1 VAE with random weights decodes one small latent
in every mode over a few ranks, each result checked against diffusers' own decode of the same
weights in one process."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import vaeshard
from vaeshard import MODES

from .bench import MIB, TOLERANCES, PeakMemory, make_latent, quiet_other_ranks, timed_decode, torch_dtype
from .io import named_model
from .report import format_table

# Small enough for a 2-core CPU, big enough that the tile grid (32 px tiles, 24 px stride = 4 / 3
# latent rows) has 2 x 3 tiles and both axes split over the ranks; two latent frames exercise the
# causal frame cache. Decodes to 5 frames of 48 x 64.
DEMO_SHAPE = (1, 16, 2, 6, 8)


DEMO_TILE = (32, 24)  # tile size and stride in sample pixels


@dataclass(frozen=True)
class DemoSpec:
    shape: tuple[int, ...]
    dtype: str
    tile: tuple[int, int]
    group_timeout: float


def _set_tiles(vae, tile) -> None:
    size, stride = tile
    vae.tile_sample_min_height = vae.tile_sample_min_width = size
    vae.tile_sample_stride_height = vae.tile_sample_stride_width = stride


def _demo_worker(ctx, spec: DemoSpec) -> dict:
    import torch

    quiet_other_ranks(ctx)
    vae = named_model("wan21").load(dtype=torch_dtype(spec.dtype), device=ctx.device)
    default_tiles = (vae.tile_sample_min_height, vae.tile_sample_stride_height)
    z = make_latent(spec.shape, seed=1).to(ctx.device, torch_dtype(spec.dtype))
    memory = PeakMemory(ctx)
    rows = []
    with torch.no_grad():
        vae.decode(z[:, :, :1, :2, :2])  # first-call overheads out of the first timed mode
        for mode in MODES:
            _set_tiles(vae, spec.tile if mode == "tile" else default_tiles)
            chosen = vaeshard.plan(vae, z.shape, ctx.world, mode)
            vaeshard.parallelize(vae, mode, timeout=spec.group_timeout)
            memory.reset()
            out, seconds = timed_decode(ctx, vae, z)
            rows.append(
                {
                    "mode": mode,
                    "strategy": chosen.strategy,
                    "reason": chosen.reason,
                    "seconds": seconds,
                    "peak_bytes": memory.peak_bytes(),
                    "out": out.cpu() if ctx.is_main else None,
                }
            )
        vaeshard.unparallelize(vae)
    return {"rows": rows, "peak_resettable": memory.resettable}


def _demo_references(vae, z, memory):
    import torch

    with torch.no_grad():
        memory.reset()
        t0 = time.perf_counter()
        untiled = vae.decode(z).sample.cpu()
        untiled_s, untiled_mem = time.perf_counter() - t0, memory.peak_bytes()
        _set_tiles(vae, DEMO_TILE)
        memory.reset()
        t0 = time.perf_counter()
        tiled = vae.tiled_decode(z).sample.cpu()
        tiled_s, tiled_mem = time.perf_counter() - t0, memory.peak_bytes()
    return untiled, untiled_s, untiled_mem, tiled, tiled_s, tiled_mem


def run_demo(
    nproc: int = 2, device: str = "cpu", group_timeout: float = 300.0, timeout: float | None = 600.0, out=print
) -> bool:
    """Decode one latent with every mode over `nproc` ranks and check each against diffusers; True if all hold."""
    import torch

    from . import launch

    dtype = "bf16" if device == "cuda" else "fp32"
    spec = DemoSpec(DEMO_SHAPE, dtype, DEMO_TILE, group_timeout)
    world = launch.torchrun_world() or nproc
    backend = "nccl" if device == "cuda" else "gloo"
    out(
        "vaeshard demo: Wan 2.1 VAE architecture (diffusers' Wan VAE class, its default config) with RANDOM weights "
        "(torch.manual_seed(0)), so the video is noise; the point is that every mode matches diffusers."
    )
    out(f"latent {DEMO_SHAPE} (seeded torch.randn), {dtype} on {device}, {world} ranks ({backend})")
    t_start = time.perf_counter()
    source = named_model("wan21")  # (imports diffusers here while the ranks' forkserver imports it too)
    values = launch.run(_demo_worker, world, spec, device=device, timeout=timeout, group_timeout=group_timeout)
    if launch.torchrun_env() and int(os.environ["RANK"]) != 0:
        return True
    # The references: plain diffusers, one process (this one), same weights, latent, device and dtype,
    # and on CPU the ranks' thread count: a convolution's result depends on how its work is split.
    ref_device = "cuda:0" if device == "cuda" else "cpu"
    ctx = launch.inline_context(ref_device)
    memory = PeakMemory(ctx)
    vae = source.load(dtype=torch_dtype(dtype), device=ref_device)
    z = make_latent(DEMO_SHAPE, seed=1).to(ref_device, torch_dtype(dtype))
    threads = torch.get_num_threads()
    if device == "cpu" and not launch.torchrun_env():
        torch.set_num_threads(launch.cpu_threads_per_rank(world))
    try:
        references = _demo_references(vae, z, memory)
    finally:
        torch.set_num_threads(threads)
    untiled, untiled_s, untiled_mem, tiled, tiled_s, tiled_mem = references

    max_tol = TOLERANCES.get((device, dtype), 1e-5)
    table = [
        ["diffusers decode", "(reference)", "1", f"{untiled_s:.2f}", f"{untiled_mem / MIB:.0f}", "-", "-", ""],
        ["diffusers tiled_decode", "(reference)", "1", f"{tiled_s:.2f}", f"{tiled_mem / MIB:.0f}", "-", "-", ""],
    ]
    ok = untiled.float().std() > 0.01  # real values, never a comparison of zeros
    for i, row in enumerate(values[0]["rows"]):
        peaks = "/".join(f"{v['rows'][i]['peak_bytes'] / MIB:.0f}" for v in values)
        got = row["out"]
        if row["strategy"] == "tile":
            ref, against = tiled, "tiled_decode"
            passed = got.shape == ref.shape and torch.equal(got, ref)
            rule = "torch.equal"
        else:
            ref, against = untiled, "decode"
            diff = (got.float() - ref.float()).abs() if got.shape == ref.shape else None
            passed = diff is not None and diff.max() <= max_tol
            rule = f"<= {max_tol:g}"
        max_diff = (got.float() - ref.float()).abs().max().item() if got.shape == ref.shape else float("nan")
        ok = ok and bool(passed)
        table.append(
            [
                row["mode"],
                row["strategy"],
                str(world),
                f"{max(v['rows'][i]['seconds'] for v in values):.2f}",
                peaks,
                f"{max_diff:.2e}",
                f"{against} ({rule})",
                "PASS" if passed else "FAIL",
            ]
        )
    mem = "peak CUDA MiB/rank" if device == "cuda" else "peak RSS MiB/rank"
    headers = ["mode", "strategy (vaeshard.plan)", "ranks", "seconds", mem, "max|diff|", "compared with", "check"]
    out("")
    out(format_table(headers, table))
    out("")
    for row in values[0]["rows"]:
        out(f"  {row['mode']}: {row['reason']}")
    if not values[0]["peak_resettable"]:
        out("  (peak RSS is over each process's life: this system does not allow resetting it)")
    out("")
    total = time.perf_counter() - t_start
    out(f"{'all checks passed' if ok else 'SOME CHECKS FAILED'} ({total:.1f} s)")
    return ok
