#!/usr/bin/env python3
"""A decode's peak allocated memory per rank, predicted without a GPU.

    python3 benchmarks/memory_model.py --preset wan21-720p --ranks 1,2

vaeshard's fast-tier decode (real config, bf16) runs on PyTorch's meta device: shapes only, no
arithmetic. A dispatch mode counts the bytes of every tensor an operation creates until the last
tensor using that storage is gone, as the CUDA caching allocator's `memory_allocated` would (block
rounding and fragmentation aside). Convolutions return channels-last outputs for channels-last
inputs, as cuDNN does, and the Triton kernels allocate only their outputs, as on CUDA. The fast
tier's choices are resolved as for a CUDA request (`fast_plan`). A sharded request is modelled on
one rank (rank 0 of N, or rank 1 when N > 2, which has two neighbours) with a stand-in for the
communication that allocates what `Comm` allocates (send copies, receive buffers, gathered keys and
values, the assembled output) without sending. `decode_as_rank`, `tiles_as_rank` and `share_plan` serve
any family (benchmarks/ranks.py `share` times a rank's share with them on one GPU).

The figure is a prediction, for comparing designs between GPU runs; BENCHMARKS.md records what the
GPU measured. It counts what the decode allocates beyond the weights and the latent, which is what
`vaeshard bench` reports as the per-rank peak.

    python3 benchmarks/memory_model.py --preset wan21-720p --ranks 1 --copies

`--copies` also runs the decode once more and counts the bytes that data-movement operations
(copies, clones, concatenations, zero fills) write, by source line: what the GPU profile's
"cat / pad / copies" kernels move, and which part of the code moves it.

    python3 benchmarks/memory_model.py --config hunyuanvideo --shape 1,16,9,90,160

`--config NAME --shape B,C,T,H,W` (any named config): diffusers' own decode as the VAE is configured
(tiling off) and one process's decode through vaeshard (its layers swapped in, the fast tier where
the family has one), the same count for each; attention stands in as its output alone (as fused
kernels allocate), and the Triton kernels are not modelled (their eager stand-ins run).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import traceback
import weakref
from dataclasses import dataclass
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import vaeshard.families.wan  # noqa: F401 - (the layers that import the kernels' functions by name, loaded)
from vaeshard import policy
from vaeshard.cli.bench import PRESETS
from vaeshard.cli.io import NAMED_CONFIGS
from vaeshard.config import FastOptions
from vaeshard.families import family_for
from vaeshard.families.base import passing_inputs
from vaeshard.kernels import attention, box_conv
from vaeshard.kernels import conv3d as conv_kernel
from vaeshard.kernels import norm as norm_kernels
from vaeshard.kernels import phases as upsample
from vaeshard.layers import tier
from vaeshard.layers.tier import FastPlan
from vaeshard.runtime import comm as comm_mod
from vaeshard.runtime import layout
from vaeshard.runtime import spatial as shard
from vaeshard.runtime import tile as tiles

_CONVOLUTIONS = {torch.ops.aten.convolution.default}


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages created under this mode that some tensor still uses; and their peak."""

    def __init__(self, external: list[torch.Tensor]):
        super().__init__()
        self.external = {t.untyped_storage()._cdata for t in external}
        self.sizes: dict[int, int] = {}
        self.users: dict[int, int] = {}
        self.sites: dict[int, str] = {}
        self.current = self.peak = 0
        self.at_peak: dict[str, int] = {}

    def _track(self, t: torch.Tensor) -> None:
        key = t.untyped_storage()._cdata
        if key in self.external:
            return
        if key not in self.sizes:
            self.sizes[key] = t.untyped_storage().nbytes()
            self.users[key] = 0
            self.sites[key] = _site()
            self.current += self.sizes[key]
            if self.current > self.peak:
                self.peak = self.current
                self.at_peak = {}
                for k, size in self.sizes.items():
                    self.at_peak[self.sites[k]] = self.at_peak.get(self.sites[k], 0) + size
        self.users[key] += 1
        weakref.finalize(t, self._release, key)

    def _release(self, key: int) -> None:
        self.users[key] -= 1
        if self.users[key] == 0:
            self.current -= self.sizes.pop(key)
            del self.users[key], self.sites[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = _as_cudnn_lays_out(func, args, func(*args, **(kwargs or {})))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out


def _as_cudnn_lays_out(func, args, out):
    """A convolution's output channels-last where its input is, as cuDNN gives it (meta tensors'
    convolutions do not), so that the layers after it take the paths they take on CUDA."""
    if func in _CONVOLUTIONS and args[0].is_contiguous(memory_format=tier.channels_last_format(args[0].ndim)):
        return torch.empty(
            out.shape, dtype=out.dtype, device=out.device, memory_format=tier.channels_last_format(out.ndim)
        )
    return out


def _site() -> str:
    """The innermost vaeshard or diffusers source line of the current Python stack."""
    for frame in reversed(traceback.extract_stack()):
        if ("vaeshard" in frame.filename or "diffusers" in frame.filename) and "memory_model" not in frame.filename:
            short = frame.filename.split("site-packages/")[-1].split("src/")[-1]
            return f"{short}:{frame.lineno} {frame.name}"
    return "(elsewhere)"


@dataclass
class StandInComm(comm_mod.Comm):
    """`Comm`'s allocations for one rank of a sharded request, without communication."""

    def neighbour_rows(self, x, dim, before, after, num_ranks):
        order, extent = layout.exchange_order(x), x.shape[dim]
        sends, received = [], []
        for rows, neighbour, sent, at in (
            (before, self.rank > 0, after, 0),
            (after, self.rank < num_ranks - 1, before, extent - before),
        ):
            if neighbour and sent:  # the send copy of this rank's rows
                sends.append(x.narrow(dim, at, sent).permute(order).contiguous())
            shape = layout.permuted(layout.with_extent(x.shape, dim, rows), order)
            received.append(x.new_empty(shape).permute(layout.inverse(order)) if neighbour and rows else None)
        return tuple(received)

    def all_gather_along(self, x, dim, extents):
        parts = [x.new_empty(layout.with_extent(x.shape, dim, max(extents))) for _ in extents]
        return torch.cat([p.narrow(dim, 0, e) for p, e in zip(parts, extents)], dim=dim)

    def assemble_along(self, x, dim, extents, to_all):
        out = torch.empty(layout.with_extent(x.shape, dim, sum(extents)), dtype=x.dtype, device=x.device)
        part = torch.empty(layout.with_extent(x.shape, dim, max(extents)), dtype=x.dtype, device=x.device)
        out.narrow(dim, 0, part.shape[dim]).copy_(part)
        return out

    def gather_stacks(self, stack, to_all):
        """A tiled request's gather: every rank's stack of finished tiles (this rank's own among them)."""
        if self.world == 1:
            return [stack]
        return [torch.empty_like(stack) for _ in range(self.world)] if to_all or self.rank == 0 else None

    def all_reduce_max(self, value):
        return value

    def all_gather_ints(self, values, what="all-gather"):
        return [list(values) for _ in range(self.world)]

    def share_from_rank0(self, x):
        return x


def _all_reduce_sum(comm, tensor):
    """`comm.all_reduce_sum` (statistics of a sharded GroupNorm, a linear attention's sums): nothing to
    add up for a `StandInComm`; the real one for any other."""
    return tensor if isinstance(comm, StandInComm) else _ALL_REDUCE_SUM(comm, tensor)


_ALL_REDUCE_SUM = comm_mod.all_reduce_sum
_STOOD_IN: list = []  # the collectives stood in (`collectives_stood_in`), while they are


@contextlib.contextmanager
def collectives_stood_in():
    """The module-level collectives the layers call with a request's `Comm` (`all_reduce_sum`, which
    the layers import by name) skip a `StandInComm`'s, inside; entered once around many decodes (it
    looks through the loaded modules), and nested entries do nothing."""
    if _STOOD_IN:
        yield
        return
    saved: list = []
    _STOOD_IN.append(saved)
    try:
        _stand_in(saved, comm_mod, "all_reduce_sum", _all_reduce_sum, everywhere=True)
        yield
    finally:
        for holder, name, original in reversed(saved):
            setattr(holder, name, original)
        _STOOD_IN.clear()


def _stand_in(saved: list, module, name: str, value, everywhere: bool = False) -> None:
    """`module.name` set to `value`, and with `everywhere` each vaeshard module's binding of the same
    object too (the layers import the kernels' functions by name); `saved` gets what to set back.
    A name `module` lacks (an older tree) is left alone."""
    if not hasattr(module, name):
        return
    original = getattr(module, name)
    holders = [module]
    if everywhere:
        holders += [
            m
            for key, m in list(sys.modules.items())
            if m is not None
            and m is not module
            and (key == "vaeshard" or key.startswith("vaeshard."))
            and getattr(m, name, None) is original
        ]
    for holder in holders:
        saved.append((holder, name, original))
        setattr(holder, name, value)


@contextlib.contextmanager
def cuda_kernels(box: bool = True):
    """The fast tier's CUDA path (`box`: on a Hopper GPU with a Triton whose Gluon compiles box_conv,
    which then takes the 96-channel convolutions, leaving their norm to the norm kernel): the fused
    norm, the bias + residual pass and the bias pass as one kernel each (kernels/norm.py), which
    allocate nothing beyond their output (the eager CPU path makes fp32 temporaries); the Triton
    convolution where `conv3d.plan` takes a convolution on CUDA, allocating only its output, or
    nothing where it writes into `add_to` or `out` (its epilogues), and the fast tier's attention
    (its scores buffer and output); its GEMM weights are made at a process's first request and kept,
    so not counted (nor are the upsamplers' phase weights, made before the modelled decode:
    `_decode`). The upsamplers' interleaving pass (kernels/phases.py) allocates nothing on CUDA or
    elsewhere."""

    def rms_norm(x, gamma, bias, scale, silu, eps=1e-12, pre_bias=None, out=None):
        return out if out is not None else torch.empty_like(x)

    def add_bias_and_residual_(x, bias, residual, into_residual=False):
        return residual if into_residual else x

    def conv3d(x, weight, bias, padding, how, kernel_weight=None, add_to=None, norm=None, out=None, front=None):
        if add_to is not None or out is not None:
            return add_to if add_to is not None else out
        shape = conv_kernel.out_shape(x, weight, padding, front)
        return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last_3d)

    def sdpa(q, k, v, *args, **kwargs):  # CUDA's fused attention kernels allocate only the output
        return q.new_empty((*q.shape[:-1], v.shape[-1]))

    saved: list = []
    try:
        for name, value in (
            ("rms_norm", rms_norm),
            ("add_bias_and_residual_", add_bias_and_residual_),
            ("add_bias_", lambda x, bias: x),
            ("fused_bias_add_available", lambda x: True),
        ):
            _stand_in(saved, norm_kernels, name, value, everywhere=True)
        _stand_in(saved, tier, "attention_kernel_available", lambda q, k, v: tier.enabled())
        for name, value in (
            ("runs_on", lambda x: True),
            ("conv3d", conv3d),
            ("cached_gemm_weight", lambda w: w),
            ("cached_box_weight", lambda w: w),
        ):
            _stand_in(saved, conv_kernel, name, value)
        _stand_in(saved, box_conv, "_on_hopper", lambda x: box)
        _stand_in(saved, box_conv, "available", lambda: box)
        _stand_in(saved, box_conv, "ROUTED", box)
        # the fast tier's attention: its scores buffer and output as on CUDA (the product and the softmax
        # kernel allocate nothing; the CPU's fp32 upcasts of the operands are not made)
        _stand_in(saved, attention, "_scores", lambda q, kt, out: None)
        _stand_in(saved, attention, "softmax_", lambda s, scale, dtype: s.view(dtype)[:, : s.shape[1]])
        _stand_in(saved, torch.nn.functional, "scaled_dot_product_attention", sdpa)
        yield
    finally:
        for holder, name, original in reversed(saved):
            setattr(holder, name, original)


class CopiedBytes(TorchDispatchMode):
    """Bytes written by data-movement operations under this mode, and their count, by source line."""

    OPS = frozenset({"copy_", "clone", "cat", "constant_pad_nd", "_to_copy", "zero_", "fill_"})

    def __init__(self):
        super().__init__()
        self.bytes: dict[str, int] = {}
        self.calls: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = _as_cudnn_lays_out(func, args, func(*args, **(kwargs or {})))
        if func.overloadpacket.__name__ in self.OPS:
            written = out if isinstance(out, torch.Tensor) else args[0]
            key = f"{func.overloadpacket.__name__:8} {_site()}"
            self.bytes[key] = self.bytes.get(key, 0) + written.numel() * written.element_size()
            self.calls[key] = self.calls.get(key, 0) + 1
        return out


def _keep_phase_weights(vae) -> None:
    """The upsamplers' phase weights (kernels/phases.py), made as a process's first request makes and keeps
    them, before the modelled decode: not counted in it."""
    for m in vae.modules():
        if isinstance(m, torch.nn.Conv2d) and upsample.takes(m):
            upsample.cached_phase_weight(m.weight)


def copied_bytes(
    vae,
    z,
    ranks: int,
    axis: str = shard.WIDTH,
    frames_per_step: int | str = "auto",
    box: bool = True,
    max_layer_frames: int | None = None,
) -> list[tuple[str, int, int]]:
    """(operation and source line, bytes written, calls) of one fast-tier decode on one rank, most bytes first."""
    _keep_phase_weights(vae)
    with CopiedBytes() as copies:
        _decode(vae, z, ranks, axis, frames_per_step, max_layer_frames, box)
    return sorted(((k, b, copies.calls[k]) for k, b in copies.bytes.items()), key=lambda r: -r[1])


def predicted_peak(
    vae,
    z,
    ranks: int,
    axis: str = shard.WIDTH,
    frames_per_step: int | str = "auto",
    box: bool = True,
    max_layer_frames: int | None = None,
) -> tuple[int, list[tuple[str, int]]]:
    """Bytes above the weights and the latent at the peak of one fast-tier decode on one rank, and
    what is alive then, by the source line that allocated it."""
    external = [*vae.parameters(), *vae.buffers(), z]
    _keep_phase_weights(vae)
    with LiveBytes(external) as live:
        _decode(vae, z, ranks, axis, frames_per_step, max_layer_frames, box)
    return live.peak, sorted(live.at_peak.items(), key=lambda kv: -kv[1])


def _decode(
    vae, z, ranks: int, axis: str, frames_per_step: int | str, max_layer_frames: int | None, box: bool = True
) -> None:
    """One fast-tier decode of `z` on the CUDA code path, as one rank of `ranks` would run it."""
    plan = fast_plan(vae, z.shape, ranks, axis, frames_per_step=frames_per_step, max_layer_frames=max_layer_frames)
    with torch.no_grad(), tier.active(plan), cuda_kernels(box):
        out = decode_as_rank(vae, z, ranks, axis)
        del out


def share_plan(vae, shape, ranks: int, axis: str | None = None, device: torch.device | str = "cuda", **knobs):
    """vaeshard's plan (`vaeshard.plan`, by vaeshard.tuning's thresholds as they are now) of a decode of
    `shape` over `ranks` ranks with the FastOptions `knobs`, decided as for a VAE on `device` ("cuda"
    for a VAE on the meta device: the CUDA graphs it may choose replay only on CUDA tensors): `auto`'s
    where `axis` is None, else sharded along `axis` (a forced spatial mode; one rank: direct). Its
    `fast` is the fast tier's choices, None where the request runs diffusers' own layers (a family
    without a fast tier, or one measured slower on the GPU)."""
    mode = "auto" if axis is None or ranks == 1 else f"spatial_shard_{axis}"
    with mock.patch.object(policy, "_device_of", lambda vae: torch.device(device)):
        return policy.plan(vae, tuple(shape), ranks, mode, fast=FastOptions(**knobs))


def fast_plan(vae, shape, ranks: int, axis: str, device: torch.device | str = "cuda", **knobs) -> FastPlan | None:
    """The fast tier's choices for a decode of `shape` on `device`, directly (`ranks` 1) or as one rank
    of `ranks` sharded along `axis` (`share_plan`'s); None: the request runs diffusers' own layers."""
    return share_plan(vae, shape, ranks, axis, device, **knobs).fast


def steps_setting(text: str) -> int | str:
    """A frames_per_step value given on a command line: auto or a number."""
    return "auto" if text == "auto" else int(text)


@contextlib.contextmanager
def own_tiling_off(vae):
    """The VAE's own tiling and frame-wise (tiled in time) decoding switched off inside, as far as it has
    them (restored afterwards): `auto` then plans the spatial shards of its untiled decode."""
    names = [n for n in ("use_tiling", "use_framewise_decoding") if getattr(vae, n, False)]
    for name in names:
        setattr(vae, name, False)
    try:
        yield vae
    finally:
        for name in names:
            setattr(vae, name, True)


def decode_inputs(vae, z) -> dict:
    """The extra inputs (Family.call_inputs) a decode of `z` needs: a timestep where the decoder is
    timestep-conditioned (LTX-Video's, LTX-2's: 0.05 per sample, as a pipeline's last step passes)."""
    if "temb" in family_for(vae).call_inputs.get("decode", ()) and getattr(vae.config, "timestep_conditioning", False):
        return {"temb": torch.full((z.shape[0],), 0.05, device=z.device, dtype=z.dtype)}
    return {}


def sharded_rank(ranks: int) -> int:
    """The rank whose share `decode_as_rank` runs: rank 0 of 2, else rank 1 (two neighbours)."""
    return 0 if ranks <= 2 else 1


def decode_as_rank(vae, z, ranks: int, axis: str, inputs: dict | None = None) -> torch.Tensor:
    """In the caller's tier: the untiled decode of `z` (one rank), or what one rank of `ranks` sharded
    along `axis` runs (`sharded_rank`) with `StandInComm` in place of the communication; the assembled
    output (whose other ranks' parts are uninitialised). Any family, 4-D (B, C, H, W) or 5-D
    (B, C, T, H, W) latent: H and W are its last two axes. `inputs`: the decode's extra inputs
    (`decode_inputs`)."""
    family = family_for(vae)
    with collectives_stood_in(), passing_inputs(inputs or {}):
        if ranks == 1:
            return family.untiled_decode(vae, z)
        dim = z.ndim - 1 if axis == shard.WIDTH else z.ndim - 2
        extents = shard.split_extents(z.shape[dim], ranks)
        rank = sharded_rank(ranks)
        local = z.narrow(dim, sum(extents[:rank]), extents[rank])
        ctx = shard.ShardContext(comm=StandInComm(group=None, rank=rank, world=ranks), axis=axis, extents=extents)
        with shard.sharding(ctx):
            out_local = family.untiled_decode(vae, local)
        return ctx.comm.assemble_along(out_local, dim, ctx.extents_at(out_local.shape[dim]), True)


def tiled_rank(vae, z, ranks: int, inputs: dict | None = None) -> tuple[int, int, int]:
    """(the rank of `ranks` whose tiles of `z` weigh most, its tiles, all tiles) of the VAE's tile grid
    (diffusers' tiled decode), as the tile executor spreads them (runtime/tile.py `balance`)."""
    with passing_inputs(inputs or {}):
        ops = family_for(vae).decode_tile_ops(vae, z)
    if ops is None:
        return 0, 1, 1
    every = ops.all_tiles()
    assignment = tiles.balance(every, ranks)
    loads = [sum(t.workload for t in mine) for mine in assignment]
    rank = loads.index(max(loads))
    return rank, len(assignment[rank]), len(every)


def tiles_as_rank(vae, z, ranks: int, inputs: dict | None = None, rank: int | None = None) -> torch.Tensor:
    """In the caller's tier: what one rank of a tiled decode over `ranks` ranks runs (`rank`, by default
    `tiled_rank`'s: its tiles, the others' RNG draws where the family replays them, the gather of every
    rank's finished tiles and the merge) with `StandInComm` in place of the communication; the merged
    output (built from uninitialised tiles but its own). One rank: every tile."""
    family = family_for(vae)
    rank = tiled_rank(vae, z, ranks, inputs)[0] if rank is None else rank
    with collectives_stood_in(), passing_inputs(inputs or {}):
        ops = family.decode_tile_ops(vae, z)
        if ops is None:
            return family.untiled_decode(vae, z)
        return tiles.run_tiled(ops, StandInComm(group=None, rank=rank, world=ranks), ranks, True)


def family_peaks(name: str, shape: tuple, top: int) -> None:
    """`--config`: the peak of diffusers' decode and of vaeshard's (one process, direct), each printed
    with its largest allocation sites at the peak."""
    import diffusers

    import vaeshard
    from vaeshard.families import family_for
    from vaeshard.layers import tier

    class_name, config = NAMED_CONFIGS[name]
    attention = torch.nn.functional.scaled_dot_product_attention

    # what a fused attention kernel allocates: its output (by keyword too, as diffusers' dispatch calls it)
    def output_only(query, key, value, *args, **kwargs):
        return query.new_empty((*query.shape[:-1], value.shape[-1]))

    torch.nn.functional.scaled_dot_product_attention = output_only
    try:
        for who in ("diffusers", "vaeshard"):
            with torch.device("meta"):
                vae = getattr(diffusers, class_name)(**config).to(torch.bfloat16).eval()
            vae.use_tiling = False
            z = torch.empty(shape, device="meta", dtype=torch.bfloat16)
            conditioned = getattr(vae.config, "timestep_conditioning", False)
            extra = {"temb": torch.full((1,), 0.05, device="meta")} if conditioned else {}
            scope = contextlib.nullcontext()
            if who == "vaeshard":  # its layers swapped in; diffusers' decode is then the direct path
                vaeshard.parallelize(vae)
                scope = tier.active(tier.FastPlan()) if family_for(vae).fast_tier else scope
            with torch.no_grad(), scope, LiveBytes([*vae.parameters(), *vae.buffers(), z]) as live:
                out = type(vae).decode(vae, z, **extra).sample
                out_shape = tuple(out.shape)
                del out
            print(f"{name} latent {shape} -> {out_shape}, {who}: peak {live.peak / 2**30:.2f} GiB", flush=True)
            for site, size in sorted(live.at_peak.items(), key=lambda kv: -kv[1])[:top]:
                print(f"    {size / 2**30:6.2f} GiB  {site}")
    finally:
        torch.nn.functional.scaled_dot_product_attention = attention


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="wan21-720p", choices=sorted(PRESETS))
    ap.add_argument("--config", default=None, choices=sorted(NAMED_CONFIGS), help="any named config (with --shape)")
    ap.add_argument("--shape", default=None, help="with --config: the latent shape B,C,T,H,W")
    ap.add_argument("--ranks", default="1,2", help="rank counts to model (default 1,2)")
    ap.add_argument("--frames", type=int, default=None, help="latent frames (default: the preset's)")
    ap.add_argument("--top", type=int, default=8, help="allocation sites listed at the peak (default 8)")
    ap.add_argument(
        "--frames-per-step",
        type=steps_setting,
        default="auto",
        help="vaeshard's frames_per_step: auto (default, decided as on CUDA) or a number",
    )
    ap.add_argument("--max-layer-frames", type=int, default=None, help="vaeshard's max_layer_frames (default None)")
    ap.add_argument("--copies", action="store_true", help="also: bytes written by copies, by source line")
    ap.add_argument(
        "--no-box",
        action="store_true",
        help="model the Triton kernel's plans (a GPU other than Hopper, or a Triton without box_conv)",
    )
    ap.add_argument(
        "--axis",
        default="auto",
        choices=("auto", shard.HEIGHT, shard.WIDTH),
        help="the sharded axis (default: the one `auto` picks on CUDA)",
    )
    args = ap.parse_args()
    if args.config is not None:
        if args.shape is None:
            ap.error("--config needs --shape")
        return family_peaks(args.config, tuple(int(s) for s in args.shape.split(",")), args.top)
    from diffusers import AutoencoderKLWan

    import vaeshard

    config, shape, _ = PRESETS[args.preset]
    if args.frames:
        shape = (*shape[:2], args.frames, *shape[3:])
    with torch.device("meta"):
        vae = AutoencoderKLWan(**NAMED_CONFIGS[config][1]).to(torch.bfloat16).eval()
    vaeshard.parallelize(vae)
    z = torch.empty(shape, device="meta", dtype=torch.bfloat16)
    for ranks in (int(r) for r in args.ranks.split(",")):
        axis = args.axis
        if axis == "auto":  # the axis `auto` would shard along on CUDA (the model's VAE is on meta)
            with mock.patch.object(policy, "_device_of", lambda vae: torch.device("cuda")):
                strategy = vaeshard.plan(vae, shape, ranks).strategy
            axis = shard.HEIGHT if strategy == "spatial_shard_height" else shard.WIDTH
        peak, sites = predicted_peak(
            vae,
            z,
            ranks,
            axis,
            frames_per_step=args.frames_per_step,
            box=box_conv.ROUTED and not args.no_box,
            max_layer_frames=args.max_layer_frames,
        )
        print(
            f"{args.preset} latent {tuple(shape)}, {ranks} rank(s)"
            + (f" by {axis}" if ranks > 1 else "")
            + f", frames_per_step {args.frames_per_step}, max_layer_frames {args.max_layer_frames}: predicted "
            f"peak {peak / 2**30:.2f} GiB per rank above weights and latent",
            flush=True,
        )
        for site, size in sites[: args.top]:
            print(f"    {size / 2**30:6.2f} GiB  {site}")
        if args.copies:
            rows = copied_bytes(
                vae,
                z,
                ranks,
                axis,
                frames_per_step=args.frames_per_step,
                box=box_conv.ROUTED and not args.no_box,
                max_layer_frames=args.max_layer_frames,
            )
            written = sum(b for _, b, _ in rows) / 1e9
            print(
                f"  written by copies, clones, concatenations and zero fills: {written:.1f} GB; "
                f"by operation and source line:"
            )
            for key, nbytes, calls in rows[: args.top]:
                print(f"    {nbytes / 1e9:7.2f} GB x{calls:<4} {key}")


if __name__ == "__main__":
    main()
