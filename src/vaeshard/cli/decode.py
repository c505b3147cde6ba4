"""`vaeshard decode`'s work on each rank: load the VAE and the latent, parallelize, and decode through
`vaeshard.stream_decode` into the streamed writer on rank 0 (cli/writer.py), with a progress bar.
cli/commands.py checks the request and runs a `DecodeJob` (`run`: here, or on ranks of cli/launch.py).

A failed decode leaves no output, however it fails, and the output appears only when the decode
succeeded. Rank 0's writer completes the output in a temporary file (`ChunkWriter.finish`) and hands
it to the process that started the ranks, which renames it into place once every rank has succeeded.
A rank can be killed at any instruction (by the launcher, after another rank failed or the command got
a signal; or by the system), so that process, which outlives its ranks, also removes the temporary
output after a failure, found by the job's tag in its name: one owner of the output's fate, rather
than cleanup in a rank that may not get to run it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
import time
from dataclasses import dataclass, field

import vaeshard


@dataclass(frozen=True)
class DecodeJob:
    latents: str
    key: str
    model: object  # cli/io.py's ModelSource
    dtype: str
    mode: str
    tile: tuple[int | None, int | None]
    denormalize: bool
    timestep: float | None
    seed: int
    out: str
    out_kind: str
    fps: int
    preset: str
    progress: bool
    timeout: float
    options: dict = field(default_factory=dict)  # vaeshard.parallelize's exact and fast (see _tier_options)
    tag: str = field(default_factory=lambda: secrets.token_hex(4))  # in the temporary output's name


def run(job: DecodeJob, nproc: int, device: str, group_timeout: float) -> dict:
    """Decode `job` in this process (one rank) or on `nproc` ranks; rank 0's summary. On any failure,
    every rank has ended and the temporary output is gone before the error is raised."""
    from . import launch
    from .writer import remove_temporary

    def cleanup() -> None:
        remove_temporary(job.out, job.tag)

    # a SIGTERM to a process that writes unwinds it as Ctrl-C does, so that its writer aborts; the launcher
    # of started ranks stops them on either and calls `cleanup`
    with launch.interruptible() as stop:
        try:
            if nproc > 1 or launch.torchrun_env():
                summary = launch.run(
                    decode_worker, nproc, job, device=device, group_timeout=group_timeout, on_failure=cleanup
                )[0]
            else:
                summary = decode_worker(launch.inline_context(f"{device}:0" if device == "cuda" else "cpu"), job)
            finished = summary.pop("output", None)
            # rank 0's process commits (under torchrun every rank gets rank 0's summary). The rename decides:
            # a signal before it fails the decode; one during it comes too late, the output is in place.
            if finished is not None and os.environ.get("RANK", "0") == "0":
                with stop.held(raise_after=False):
                    finished.commit()
        except BaseException:
            cleanup()
            raise
    return summary


def set_tiles(vae, size: int, stride: int, ratio: int) -> None:
    """diffusers' tile size and stride in sample pixels: a video VAE's own attributes, an image VAE's
    square tile and overlap."""
    if hasattr(vae, "tile_sample_min_height"):
        vae.tile_sample_min_height = vae.tile_sample_min_width = size
        vae.tile_sample_stride_height = vae.tile_sample_stride_width = stride
        return
    vae.tile_sample_min_size, vae.tile_latent_min_size = size, size // ratio
    vae.tile_overlap_factor = 1 - stride / size


def decode_worker(ctx, job: DecodeJob) -> dict:
    import logging
    import warnings

    import torch

    from . import io
    from .bench import torch_dtype
    from .writer import ChunkWriter, write_stream

    if not ctx.is_main:
        logging.getLogger("vaeshard").setLevel(logging.ERROR)
        warnings.filterwarnings("ignore")
    dtype = torch_dtype(job.dtype)
    vae = job.model.load(dtype=dtype, device=ctx.device)
    size, stride = job.tile
    if size is not None:
        set_tiles(vae, size, stride, job.model.spatial_ratio())
    z = io.load_latents(job.latents, job.key).to(ctx.device)
    z = io.denormalize(z, dict(vae.config), vae.dtype) if job.denormalize else z.to(vae.dtype)
    vaeshard.parallelize(vae, job.mode, output="rank0", timeout=job.timeout, **job.options)
    chosen = vaeshard.plan(vae, z.shape)
    bar = _progress(vae, z, chosen.strategy, ctx) if (job.progress and ctx.is_main) else None
    # rank 0 writes each chunk as the decode makes it: quantised on the GPU, copied to pinned memory on
    # a side stream and encoded in a worker thread (cli/writer.py) while the decode goes on
    stamps = {"loaded": time.time()}
    try:
        t0 = time.perf_counter()
        with torch.no_grad():
            # a timestep-conditioned decoder's timestep, one per sample (diffusers' `temb`)
            temb = {} if job.timestep is None else {"temb": torch.full((z.shape[0],), job.timestep, device=z.device)}
            torch.manual_seed(job.seed)  # every rank alike: a decoder's noise is drawn from it
            writer = None
            if ctx.is_main:
                writer = ChunkWriter(
                    job.out, job.out_kind, job.fps, preset=job.preset, tag=job.tag, pixels=job.model.pixels()
                )
            with writer or contextlib.nullcontext():
                frames, shape = write_stream(vae, z, writer, **temb)
                ctx.synchronize()
                seconds = time.perf_counter() - t0
                stamps["decoded"] = time.time()
                # complete, but not yet in place: `run` commits it once every rank has succeeded
                output = writer.finish() if writer is not None else None
        stamps["written"] = time.time()
    finally:
        if bar is not None:
            bar.finish()
    if not ctx.is_main:
        return {}
    b, _, h, w = shape
    return {
        "strategy": chosen.strategy,
        "reason": chosen.reason,
        "seconds": seconds,
        "total_seconds": stamps["written"] - stamps["loaded"],
        "stamps": stamps,
        "frames": frames,
        "batch": b,
        "height": h,
        "width": w,
        "output": output,
    }


class _Progress:
    """A tqdm bar over latent frames, advanced by a forward hook on the decoder (called with one or
    more latent frames, once per tile in tile mode)."""

    def __init__(self, vae, bar, calls_per_frame: int):
        self.bar, self.calls_per_frame, self.calls = bar, calls_per_frame, 0
        self.handle = vae.decoder.register_forward_hook(self._hook)

    def _hook(self, module, inputs, output) -> None:
        self.calls += inputs[0].shape[2] if inputs and getattr(inputs[0], "ndim", 0) == 5 else 1
        done = min(self.bar.total, self.calls // self.calls_per_frame)
        if done > self.bar.n:
            self.bar.update(done - self.bar.n)

    def finish(self) -> None:
        self.handle.remove()
        self.bar.update(self.bar.total - self.bar.n)
        self.bar.close()


def _progress(vae, z, strategy: str, ctx):
    """A progress bar over a video's latent frames (none for an image: it is one decoder call)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    if z.dim() != 5:
        return None
    calls_per_frame = 1
    if strategy == "tile":
        # tiles this rank decodes, about evenly spread (the bar's pace only; it completes at the end)
        ratio = vae.spatial_compression_ratio
        rows = len(range(0, z.shape[3], max(1, vae.tile_sample_stride_height // ratio)))
        cols = len(range(0, z.shape[4], max(1, vae.tile_sample_stride_width // ratio)))
        calls_per_frame = max(1, -(-rows * cols // ctx.world))
    batch = z.shape[0] if getattr(vae, "use_slicing", False) else 1
    # counted in latent frames (each decodes to the temporal factor's output frames, the first to one)
    bar = tqdm(total=z.shape[2] * batch, desc="decode", unit="latent frame", file=sys.stderr, leave=False)
    return _Progress(vae, bar, calls_per_frame)
