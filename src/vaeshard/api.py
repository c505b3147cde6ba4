"""`parallelize` / `unparallelize` and the life of one request.

One request: check the input on this rank -> one small collective so every rank sees every rank's
request (shape, dtype, mode, validity) and all fail alike -> `plan()` -> run the strategy -> place
the result per `output`. Request scratch (the model's feature caches, halo and gather buffers) is
released on success and on failure.

What is refused, where and with which message is listed (and measured) in docs/reliability.md.
"""

from __future__ import annotations

import logging
import types
from dataclasses import dataclass

import torch

from .kernels import conv3d as conv_kernel
from .kernels import phases as upsample
from .layers import tier as fast
from .runtime import comm as comm_mod
from .runtime import graphs
from .runtime import spatial as shard
from .runtime.swap import replaced_forwards
from .config import FAST_TIER_SETTINGS, MODES, OUTPUTS, SPATIAL_MODES, VaeParallelConfig, agreement_timeout
from .families import family_for
from .families.base import Family
from .policy import hooks_reason, plan_for
from .runtime.tile import run_tiled

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
    layers_installed: bool = False
    verify_pending: bool = False  # compare parameter checksums across ranks at the next request
    hooks_noted: bool = False  # the warning that hooked layers keep this VAE on diffusers' own layers was given


def parallelize(
    vae,
    *,
    mode: str = "auto",
    group=None,
    output: str = "all",
    size: int | None = None,
    timeout=None,
    exact: bool = False,
    cudnn_benchmark: bool = True,
    frames_per_step: int | str = "auto",
    max_layer_frames: int | None = None,
    triton_convs: bool = True,
    cuda_graphs: bool | str = "auto",
    keep_cuda_graphs: bool = False,
    verify: bool = False,
):
    """Make `vae.decode` / `vae.encode` run across the ranks of `group` (None: the default group).

    Returns the same object. Calling it again updates mode/group/output/size/timeout without
    installing twice. Parameters, their names and `state_dict()` are left exactly as diffusers has them.

    `verify=True` compares a checksum of every parameter across the ranks once, at the next request
    (parallelize itself never communicates: it may run before the process group is used), and
    raises ValueError on every rank naming the first parameter that differs.

    Everything is checked before anything changes: an invalid setting, a `size` larger than an
    already known group, a forced spatial mode on a family without spatial support, or a VAE whose
    layers cannot be sharded raise and leave `vae` exactly as it was.
    """
    family = family_for(vae)
    config = VaeParallelConfig(size=size, mode=mode, output=output, timeout=timeout, exact=exact,
                               cudnn_benchmark=cudnn_benchmark, frames_per_step=frames_per_step,
                               max_layer_frames=max_layer_frames, triton_convs=triton_convs,
                               cuda_graphs=cuda_graphs, keep_cuda_graphs=keep_cuda_graphs)
    if not isinstance(verify, bool):
        raise TypeError(f"verify must be True or False, got {verify!r}")
    if config.mode in SPATIAL_MODES and not (family.spatial_decode or family.spatial_encode):
        raise ValueError(
            f"mode {config.mode!r} needs spatial sharding, which {type(vae).__name__} ({family.name} family) "
            "does not support: use mode='tile' or mode='auto'"
        )
    _check_size(config, group)
    state: _State | None = getattr(vae, "_vaeshard", None)
    if state is not None:
        graphs.release(vae)  # captured under the old settings (and perhaps group)
        state.config, state.group = config, group
        state.verify_pending = state.verify_pending or verify
        return vae
    layers_installed = False
    if family.spatial_decode:
        try:
            family.install_layers(vae)
        except BaseException:
            family.uninstall_layers(vae)  # a family may have swapped some layers before refusing
            raise
        layers_installed = True
    state = _State(
        family=family,
        config=config,
        group=group,
        original_decode=vae.__dict__.get("decode"),
        original_encode=vae.__dict__.get("encode"),
        layers_installed=layers_installed,
        verify_pending=verify,
    )
    object.__setattr__(vae, "_vaeshard", state)
    object.__setattr__(vae, "decode", types.MethodType(_decode, vae))
    object.__setattr__(vae, "encode", types.MethodType(_encode, vae))
    return vae


def _check_size(config: VaeParallelConfig, group) -> None:
    """`size` larger than the group: refused here when the group is known (given, or the default group
    exists) and this process is a member; otherwise at the first request, on every rank alike."""
    if config.size is None:
        return
    known = comm_mod.default_group_if_any(group)
    if known is None:
        return
    world = comm_mod.group_size(known)
    if world > 0 and config.size > world:
        raise ValueError(_size_message(config.size, world))


def _size_message(size: int, world: int) -> str:
    return (
        f"size={size} is larger than the process group ({world} rank{'s' if world != 1 else ''}): size "
        f"counts the group's ranks that do the work; pass size <= {world}, or size=None for the whole group"
    )


def unparallelize(vae):
    """Remove everything `parallelize` added; `vae` behaves exactly as plain diffusers again."""
    state: _State | None = getattr(vae, "_vaeshard", None)
    if state is None:
        return vae
    if state.layers_installed:
        state.family.uninstall_layers(vae)
    graphs.release(vae)
    conv_kernel.forget_gemm_weights(vae)
    upsample.forget_phase_weights(vae)
    for name, original in (("decode", state.original_decode), ("encode", state.original_encode)):
        if original is None:
            vae.__dict__.pop(name, None)
        else:
            object.__setattr__(vae, name, original)
    vae.__dict__.pop("_vaeshard", None)
    return vae


def release_cuda_graphs(vae) -> int:
    """Free the CUDA graphs `keep_cuda_graphs=True` kept on `vae` (on this process's devices) and
    the memory they hold; the next request captures again. Returns how many sets were kept (0 for a
    VAE that kept none or is not parallelized). Call it on every rank: a rank's graphs are its own,
    and the ranks need not agree (a request makes the same communication either way)."""
    return graphs.release(vae)


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


# Why a request cannot run, as a code every rank reads in the agreement (0: it can run); a rank whose
# own input is fine names the problem of the first bad rank with the same exception type.
_PROBLEMS: dict[int, tuple[type[Exception], str]] = {
    1: (TypeError, "not a tensor"),
    2: (ValueError, "wrong number of dimensions"),
    3: (TypeError, "not a floating-point tensor"),
    4: (ValueError, "wrong number of latent channels"),
    5: (ValueError, "an axis of size 0"),
    6: (ValueError, "not on the VAE's device"),
    7: (ValueError, "dtype differs from the VAE's parameters"),
    8: (ValueError, "NaN or Inf values"),
    9: (ValueError, "size larger than the group"),
}


def _layout(family: Family) -> str:
    return "(B, C, T, H, W)" if family.latent_ndim == 5 else "(B, C, H, W)"


def _describe(op: str, x, config: VaeParallelConfig, verify_count: int, hooked: bool) -> list[int]:
    """A fixed-length integer description of this rank's request, compared across ranks."""
    if isinstance(x, torch.Tensor):
        shape = list(x.shape)[:6]
        dtype = _DTYPES.index(x.dtype) if x.dtype in _DTYPES else 99
        ndim = x.dim()
    else:
        shape, dtype, ndim = [], -1, -1
    size = -1 if config.size is None else config.size
    head = [_OPS.index(op), MODES.index(config.mode), OUTPUTS.index(config.output), size, verify_count, int(hooked),
            ndim, dtype]
    return head + shape + [-1] * (6 - len(shape))


def _explain(desc: list[int]) -> str:
    op, mode, output, size, verify_count, hooked, ndim, dtype = desc[:8]
    if ndim < 0:
        what = "not a tensor"
    else:
        dt = str(_DTYPES[dtype]).replace("torch.", "") if 0 <= dtype < len(_DTYPES) else "unsupported dtype"
        what = f"shape {tuple(desc[8 : 8 + min(ndim, 6)])} {dt}"
    extra = "" if size < 0 else f", size {size}"
    extra += f", verify {verify_count} parameters" if verify_count else ""
    extra += ", layers hooked" if hooked else ""
    return f"{_OPS[op]} {what}, mode {MODES[mode]}, output {OUTPUTS[output]}{extra}"


def _validate(family: Family, vae, op: str, x) -> tuple[int, str | None]:
    """(code, why) this request cannot run (the same answer on every rank for the same request),
    or (0, None). Structure first; the one pass over the values (NaN/Inf) only for a well-formed input."""
    what = "latent" if op == "decode" else "sample"
    cls = type(vae).__name__
    layout = _layout(family)
    if not isinstance(x, torch.Tensor):
        return 1, f"{op} expects the {what} as a torch.Tensor, got {type(x).__name__}: pass a tensor in layout {layout}"
    if x.dim() != family.latent_ndim:
        return 2, (
            f"{op} of {cls} expects a {family.latent_ndim}-D {what} in layout {layout}, got {x.dim()}-D shape "
            f"{tuple(x.shape)}: reshape it to {layout} (e.g. add a batch or frame dimension of 1)"
        )
    if x.dtype not in _DTYPES:
        return 3, f"{op} expects a floating-point {what}, got {x.dtype}: convert it with .to(vae.dtype)"
    if op == "decode":
        expected = family.latent_channels(vae)
        if x.shape[1] != expected:
            return 4, (
                f"decode of this {cls} expects a latent with {expected} channels (its latent channels, C in "
                f"{layout}), got {x.shape[1]} in shape {tuple(x.shape)}: check that the latent was made for this VAE"
            )
    if any(s == 0 for s in x.shape):
        return 5, (
            f"{op} got an empty {what} of shape {tuple(x.shape)} (an axis of size 0): every axis needs at "
            "least one element"
        )
    params = list(vae.parameters())
    devices = {p.device for p in params}
    if params and x.device not in devices:
        home = next(iter(devices))
        return 6, (
            f"{op} got a {what} on {x.device}, but the VAE's parameters are on {', '.join(map(str, devices))}: "
            f"move it with .to('{home}')"
        )
    dtypes = {p.dtype for p in params}
    if params and x.dtype not in dtypes and not torch.is_autocast_enabled(x.device.type):
        home = next(iter(dtypes))
        return 7, (
            f"{op} got a {str(x.dtype).replace('torch.', '')} {what}, but the VAE's parameters are "
            f"{', '.join(str(d).replace('torch.', '') for d in dtypes)}: cast it with .to({home}) "
            "(or run under torch.autocast)"
        )
    if not bool(torch.isfinite(x).all()):
        num_nan, num_inf = int(torch.isnan(x).sum()), int(torch.isinf(x).sum())
        return 8, (
            f"{op} got a {what} with {num_nan} NaN and {num_inf} Inf values (shape {tuple(x.shape)}): "
            "it would decode to garbage, so vaeshard refuses it; check what produced it (e.g. a float16 "
            "overflow in the sampler) and pass finite values"
        )
    return 0, None


def _run(vae, op: str, x):
    state: _State = vae._vaeshard
    config, family = state.config, state.family
    group = comm_mod.default_group_if_any(state.group)
    rank = comm_mod.group_rank(group)
    if rank < 0:
        raise ValueError(
            f"this process (global rank {comm_mod.global_rank()}) is not a member of the group the VAE "
            f"was parallelized on: call {op} only on the group's ranks, or parallelize with group=None"
        )
    comm = comm_mod.Comm.for_group(group, timeout=config.timeout_seconds)
    if config.size is not None and config.size > comm.world:
        code, error = 9, _size_message(config.size, comm.world)
    else:
        code, error = _validate(family, vae, op, x)
    verify_count = len(list(vae.parameters())) if state.verify_pending else 0
    hooked = replaced_forwards(vae)

    # The agreement, through the group's store: every rank learns every rank's request, so a request
    # that is invalid or different anywhere fails everywhere, before any decode work, and a rank that
    # never arrives makes the others raise within the agreement's timeout, leaving nothing pending.
    if comm.world > 1:
        seconds, bound = agreement_timeout(config.timeout_seconds)
        descs = comm.agree(_describe(op, x, config, verify_count, bool(hooked)) + [code], seconds, op, bound)
        if any(d[:-1] != descs[0][:-1] for d in descs):
            lines = "; ".join(f"rank {r}: {_explain(d)}" for r, d in enumerate(descs))
            raise ValueError(
                f"ranks disagree on the {op} request ({lines}): every rank of the group must call "
                f"{op} with the same shape, dtype, mode, output, size and verify setting, on a VAE hooked alike "
                "(hooks that replace its layers' forwards on every rank or none)"
            )
        bad = [r for r, d in enumerate(descs) if d[-1]]
        if bad and error is None:
            code = descs[bad[0]][-1]
            error = (
                f"{op} input is invalid on rank(s) {bad} ({_PROBLEMS[code][1]}; that rank's error says more): "
                "the whole group stops, as every rank must run the same request"
            )
    if error is not None:
        raise _PROBLEMS[code][0](error)
    with comm.bounded():
        return _run_agreed(vae, state, config, family, comm, op, x, hooked)


def _run_agreed(vae, state, config, family, comm, op: str, x, hooked: list[str]):
    """A request every rank has agreed on, inside its communication bound (`Comm.bounded`)."""
    if state.verify_pending:
        if comm.world > 1:
            _verify_weights(vae, comm)
        state.verify_pending = False

    if hooked and not state.hooks_noted and not config.exact and config.mode != "tile":
        log.warning("vaeshard: %s: this VAE decodes and encodes with diffusers' own layers (the exact tier), "
                    "without spatial sharding; remove those hooks for the fast tier and sharding",
                    hooks_reason(hooked))
        state.hooks_noted = True
    x = x.contiguous()  # channels-last or strided views: one copy of the input, same result as contiguous
    workers = comm.world if config.size is None else min(config.size, comm.world)
    if vae.use_slicing and x.shape[0] > 1:
        parts = [_run_one(vae, state, family, config, comm, workers, op, part, hooked) for part in x.split(1)]
        return torch.cat(parts) if parts[0].numel() else parts[0]
    return _run_one(vae, state, family, config, comm, workers, op, x, hooked)


_CHECKSUM_MODULUS = 2**31 - 1  # a prime: every product and sum below stays exact in int64
_CHECKSUM_CHUNK = 1 << 22


def _checksums(vae) -> tuple[list[str], list[int]]:
    """One integer per parameter from its raw bits, weighted by position.

    Integer arithmetic modulo a prime is exact and independent of summation order, so equal weights
    give equal checksums on every rank and device, and a swapped or changed element changes it.
    Chunked, so the temporaries stay small next to the largest parameter.
    """
    names, sums = [], []
    for name, p in vae.named_parameters():
        flat = p.detach().reshape(-1)
        bits_dtype = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()]
        bits = flat.view(bits_dtype)
        total = torch.zeros((), dtype=torch.int64, device=flat.device)
        for start in range(0, bits.numel(), _CHECKSUM_CHUNK):
            chunk = bits[start : start + _CHECKSUM_CHUNK].to(torch.int64).remainder_(_CHECKSUM_MODULUS)
            position = torch.arange(start, start + chunk.numel(), dtype=torch.int64, device=flat.device)
            weight = position.remainder_(1_000_003).add_(1)
            total += chunk.mul_(weight).remainder_(_CHECKSUM_MODULUS).sum()
        names.append(name)
        sums.append(total)
    return names, torch.stack(sums).tolist() if sums else []


def _verify_weights(vae, comm) -> None:
    """ValueError on every rank, naming the first parameter whose checksum is not the same everywhere."""
    names, sums = _checksums(vae)
    table = comm.all_gather_ints(sums, "all-gather of the weights' checksums")
    differing = [i for i in range(len(names)) if len({row[i] for row in table}) > 1]
    if differing:
        first = differing[0]
        ranks = [r for r, row in enumerate(table) if row[first] != table[0][first]]
        raise ValueError(
            f"verify: parameter {names[first]!r} differs between ranks (rank(s) {ranks} differ from rank 0; "
            f"{len(differing)} of {len(names)} parameters differ): every rank must hold the same weights; "
            "load the same checkpoint on every rank (or seed identically before building the VAE)"
        )


def _run_one(vae, state, family, config, comm, workers, op, x, hooked: list[str]):
    """One sample (or batch) of a request; `hooked`: the VAE's hooked layers (shard.replaced_forwards),
    which keep it unsharded and, as the fast tier's blocks call their layers' computations rather
    than their hooks, in the exact tier."""
    chosen = plan_for(vae, x.shape, comm.world, config.mode, op=op, size=workers, hooked=hooked)
    if chosen.fallback:
        log.warning("vaeshard: %s", chosen.reason)
    else:
        log.debug("vaeshard: %s -> %s (%s)", op, chosen.strategy, chosen.reason)
    to_all = config.output == "all"
    receives = to_all or comm.rank == 0
    # mode tile promises diffusers' tiled decode bit for bit, also when the request is one tile
    fast_tier = not hooked and not config.exact and config.mode != "tile" and chosen.strategy != "tile"
    try:
        settings = {name: getattr(config, name) for name in FAST_TIER_SETTINGS}
        with torch.no_grad(), fast.tier(fast_tier, **settings):
            if chosen.strategy == "direct":
                out = _direct(vae, family, op, x) if receives else None
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


def _direct(vae, family: Family, op: str, x):
    """The VAE's own single-process path, with its own tiling/slicing settings (a family may run its
    own untiled decode loop where that gives the VAE's result, see Family.direct_decode)."""
    cls = type(vae)
    if op == "decode":
        if family.direct_decode is not None:
            return family.direct_decode(vae, x)
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
    return comm.assemble_along(out_local, dim, out_extents, to_all)


__all__ = ["parallelize", "unparallelize", "release_cuda_graphs", "config_of"]
