"""`parallelize` / `unparallelize` and the life of one request.

One request: check the input on this rank -> one small collective so every rank sees every rank's
request (shape, dtype, mode, validity) and all fail alike -> `plan()` -> run the strategy -> place
the result per `output`. Request scratch (the model's feature caches, halo and gather buffers) is
released on success and on failure.
"""

from __future__ import annotations

import logging
import types
from dataclasses import dataclass

import torch

from . import comm as comm_mod
from . import fast, shard
from .config import MODES, OUTPUTS, VaeParallelConfig
from .families import family_for
from .families.base import Family
from .policy import plan
from .tile import run_tiled

log = logging.getLogger("vaeshard")

_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
_OPS = ("decode", "encode")


@dataclass
class _State:
    family: Family
    config: VaeParallelConfig
    group: object
    original_decode: object
    original_encode: object
    spatial_installed: bool = False


def parallelize(
    vae, *, mode: str = "auto", group=None, output: str = "all", size: int | None = None, timeout=None, exact: bool = False
):
    """Make `vae.decode` / `vae.encode` run across the ranks of `group` (None: the default group).

    Returns the same object. Calling it again updates mode/group/output/size/timeout without
    installing twice. Parameters, their names and `state_dict()` are left exactly as diffusers has them.
    """
    family = family_for(vae)
    config = VaeParallelConfig(size=size, mode=mode, output=output, timeout=timeout, exact=exact)
    state: _State | None = getattr(vae, "_vaeshard", None)
    if state is not None:
        state.config, state.group = config, group
    else:
        state = _State(
            family=family,
            config=config,
            group=group,
            original_decode=vae.__dict__.get("decode"),
            original_encode=vae.__dict__.get("encode"),
        )
        object.__setattr__(vae, "_vaeshard", state)
        object.__setattr__(vae, "decode", types.MethodType(_decode, vae))
        object.__setattr__(vae, "encode", types.MethodType(_encode, vae))
    if family.spatial_decode and not state.spatial_installed:
        family.install_spatial(vae)
        state.spatial_installed = True
    return vae


def unparallelize(vae):
    """Remove everything `parallelize` added; `vae` behaves exactly as plain diffusers again."""
    state: _State | None = getattr(vae, "_vaeshard", None)
    if state is None:
        return vae
    if state.spatial_installed:
        state.family.uninstall_spatial(vae)
    for name, original in (("decode", state.original_decode), ("encode", state.original_encode)):
        if original is None:
            vae.__dict__.pop(name, None)
        else:
            object.__setattr__(vae, name, original)
    vae.__dict__.pop("_vaeshard", None)
    return vae


def config_of(vae) -> VaeParallelConfig | None:
    state = getattr(vae, "_vaeshard", None)
    return None if state is None else state.config


# --- requests --------------------------------------------------------------------------------------


def _decode(vae, z, return_dict: bool = True):
    from diffusers.models.autoencoders.vae import DecoderOutput

    sample = _run(vae, "decode", z)
    return DecoderOutput(sample=sample) if return_dict else (sample,)


def _encode(vae, x, return_dict: bool = True):
    from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution
    from diffusers.models.modeling_outputs import AutoencoderKLOutput

    moments = _run(vae, "encode", x)
    if moments.numel() == 0:  # output="rank0" on another rank: nothing to wrap
        return AutoencoderKLOutput(latent_dist=None) if return_dict else (None,)
    posterior = DiagonalGaussianDistribution(moments)
    return AutoencoderKLOutput(latent_dist=posterior) if return_dict else (posterior,)


def _describe(op: str, x, config: VaeParallelConfig) -> list[int]:
    """A fixed-length integer description of this rank's request, compared across ranks."""
    if isinstance(x, torch.Tensor):
        shape = list(x.shape)[:6]
        dtype = _DTYPES.index(x.dtype) if x.dtype in _DTYPES else 99
        ndim = x.dim()
    else:
        shape, dtype, ndim = [], -1, -1
    return [_OPS.index(op), MODES.index(config.mode), OUTPUTS.index(config.output), ndim, dtype] + shape + [-1] * (6 - len(shape))


def _explain(desc: list[int]) -> str:
    op, mode, output, ndim, dtype = desc[:5]
    if ndim < 0:
        what = "not a tensor"
    else:
        dt = str(_DTYPES[dtype]).replace("torch.", "") if 0 <= dtype < len(_DTYPES) else "unsupported dtype"
        what = f"shape {tuple(desc[5 : 5 + min(ndim, 6)])} {dt}"
    return f"{_OPS[op]} {what}, mode {MODES[mode]}, output {OUTPUTS[output]}"


def _validate(family: Family, vae, op: str, x) -> str | None:
    """Why this request cannot run (the same answer on every rank for the same request), or None."""
    if not isinstance(x, torch.Tensor):
        return f"{op} expects a torch.Tensor, got {type(x).__name__}"
    if x.dim() != family.latent_ndim:
        layout = "(B, C, T, H, W)" if family.latent_ndim == 5 else "(B, C, H, W)"
        return f"{op} expects a {family.latent_ndim}-D {layout} tensor, got {x.dim()}-D shape {tuple(x.shape)}"
    if x.dtype not in _DTYPES:
        return f"{op} expects a floating-point tensor, got {x.dtype}"
    if op == "decode":
        expected = family.latent_channels(vae)
        if x.shape[1] != expected:
            return (
                f"decode expects a latent with {expected} channels (the VAE's z_dim) in layout (B, C, T, H, W), "
                f"got shape {tuple(x.shape)}"
            )
    if any(s == 0 for s in x.shape):
        return f"{op} got an empty tensor of shape {tuple(x.shape)}"
    return None


def _run(vae, op: str, x):
    state: _State = vae._vaeshard
    config, family = state.config, state.family
    group = comm_mod.default_group_if_any(state.group)
    rank = comm_mod.group_rank(group)
    if rank < 0:
        raise ValueError(
            f"this process (global rank {torch.distributed.get_rank()}) is not a member of the group the VAE "
            "was parallelized on: call decode only on the group's ranks, or parallelize with group=None"
        )
    comm = comm_mod.Comm.for_group(group, timeout=config.timeout_seconds)
    error = _validate(family, vae, op, x)

    # One small collective: every rank learns every rank's request, so a request that is invalid or
    # different anywhere fails everywhere, before any decode work.
    if comm.world > 1:
        descs = comm.all_gather_ints(_describe(op, x, config) + [0 if error is None else 1])
        if any(d[:-1] != descs[0][:-1] for d in descs):
            lines = "; ".join(f"rank {r}: {_explain(d)}" for r, d in enumerate(descs))
            raise ValueError(
                f"ranks disagree on the {op} request ({lines}): every rank of the group must call "
                f"{op} with the same shape, dtype, mode and output"
            )
        bad = [r for r, d in enumerate(descs) if d[-1]]
        if bad and error is None:
            error = f"invalid input on rank(s) {bad}"
    if error is not None:
        raise ValueError(error)

    workers = comm.world if config.size is None else min(config.size, comm.world)
    if vae.use_slicing and x.shape[0] > 1:
        parts = [_run_one(vae, state, family, config, comm, workers, op, part) for part in x.split(1)]
        return torch.cat(parts) if parts[0].numel() else parts[0]
    return _run_one(vae, state, family, config, comm, workers, op, x)


def _run_one(vae, state, family, config, comm, workers, op, x):
    chosen = plan(vae, x.shape, comm.world, config.mode, op=op, size=workers)
    if chosen.fallback:
        log.warning("vaeshard: %s", chosen.reason)
    else:
        log.debug("vaeshard: %s -> %s (%s)", op, chosen.strategy, chosen.reason)
    to_all = config.output == "all"
    receives = to_all or comm.rank == 0
    fast_tier = not config.exact and chosen.strategy != "tile"  # tile stays bit-identical to diffusers
    try:
        with torch.no_grad(), fast.tier(fast_tier):
            if chosen.strategy == "direct":
                out = _direct(vae, state, op, x) if receives else None
            elif chosen.strategy == "tile":
                ops = family.decode_tile_ops(vae, x) if op == "decode" else family.encode_tile_ops(vae, x)
                out = run_tiled(ops, comm, workers, to_all)
            else:
                out = _spatial(vae, family, comm, op, x, chosen.strategy, to_all)
    finally:
        family.release(vae)
    if out is None:
        return x.new_empty(0)
    return out


def _direct(vae, state: _State, op: str, x):
    """The VAE's own single-process path, with its own tiling/slicing settings."""
    cls = type(vae)
    if op == "decode":
        return cls.decode(vae, x, return_dict=False)[0]
    return cls.encode(vae, x, return_dict=False)[0].parameters


def _spatial(vae, family: Family, comm, op: str, x, strategy: str, to_all: bool):
    """Each rank runs the untiled model on its slice of whole latent rows inside a shard context."""
    axis = shard.HEIGHT if strategy == "spatial_shard_height" else shard.WIDTH
    dim = x.dim() - 2 if axis == shard.HEIGHT else x.dim() - 1
    rows_per_latent_row = 1 if op == "decode" else vae.spatial_compression_ratio
    extents = shard.split_extents(x.shape[dim] // rows_per_latent_row, comm.world)
    start = sum(extents[: comm.rank]) * rows_per_latent_row
    local = x.narrow(dim, start, extents[comm.rank] * rows_per_latent_row)
    ctx = shard.ShardContext(comm=comm, axis=axis, extents=extents)
    run = family.untiled_decode if op == "decode" else family.untiled_encode
    with shard.sharding(ctx):
        out_local = run(vae, local)
    out_extents = ctx.extents_at(out_local.shape[dim])
    if to_all:
        return comm.all_gather_along(out_local, dim, out_extents)
    return comm.gather_along_to_rank0(out_local, dim, out_extents)


__all__ = ["parallelize", "unparallelize", "config_of"]
