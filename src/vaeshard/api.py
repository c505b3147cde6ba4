"""The public verbs, and the life of one request.

`parallelize` swaps in the family's request-aware layers and wraps `decode` / `encode`. One request:
check the input on this rank -> the agreement (runtime/requests.py: every rank sees every rank's
request through the group's store, and all fail alike) -> `policy.plan_for` resolves the strategy
and the fast tier's choices once -> the strategy runs (direct, the tile executor or the spatial
executor, runtime/) with those choices active (layers/tier.py) -> the result placed per `output`.
Request scratch (the model's feature caches, halo and gather buffers) is released on success and on
failure.
"""

from __future__ import annotations

import logging
import types
from dataclasses import dataclass

import torch

from . import kernels, metrics
from .config import SPATIAL_MODES, STATE_ATTR, FastOptions, ParallelConfig
from .families import family_for
from .families.base import Family, inputs_of_sample, passing_inputs, request_inputs
from .layers import tier
from .policy import expected_of, hooks_reason, plan_for
from .runtime import comm as comm_mod
from .runtime import graphs
from .runtime.requests import DTYPES, PROBLEMS, agree, describe, describe_verify, size_message, validate
from .runtime.spatial import HEIGHT, WIDTH, run_spatial
from .runtime.swap import replaced_forwards
from .runtime.tile import run_tiled

log = logging.getLogger("vaeshard")


@dataclass
class _State:
    family: Family
    config: ParallelConfig
    group: object
    original_decode: object
    original_encode: object
    layers_installed: bool = False
    hooks_noted: bool = False  # the warning that hooked layers keep this VAE on diffusers' own layers was given
    own_noted: bool = False  # the warning that this VAE's frame-wise decode keeps auto on one rank was given
    streaming: bool = False  # a stream_decode of this VAE is open on this rank


def parallelize(
    vae,
    mode: str = "auto",
    *,
    group=None,
    output: str = "all",
    size: int | None = None,
    timeout=None,
    exact: bool = False,
    fast: FastOptions | None = None,
):
    """Make `vae.decode` / `vae.encode` run across the ranks of `group` (None: the default group).

    mode:    "auto" (per request: see `vaeshard.plan`), "tile", "spatial_shard_height" or
             "spatial_shard_width".
    output:  "all" gives every rank the full result; "rank0" gives it to group rank 0 only and an
             empty tensor to the others (every rank must still call decode).
    size:    how many of the group's ranks do the work (None: all); fewer is a partial group (`tile`).
    timeout: seconds a request waits for every rank to arrive (the agreement) and, on gloo, for each
             of its collectives; None: 120 s for the agreement (VAESHARD_AGREEMENT_TIMEOUT) and the
             group's own timeout for collectives. NCCL's collectives keep the group's own timeout.
    exact:   True runs every layer exactly as diffusers does (a direct decode is then bit-identical
             to diffusers'); False runs the fast tier, tuned by `fast` (a vaeshard.FastOptions).

    Returns the same object. Calling it again updates the settings without installing twice (kept
    CUDA graphs are released). Parameters, their names and `state_dict()` stay exactly diffusers'.
    Everything is checked before anything changes: an invalid setting, a `size` larger than an
    already known group, a forced spatial mode on a family without spatial support, or a VAE whose
    layers cannot be sharded raise and leave `vae` exactly as it was. `parallelize` never
    communicates: it may run before the process group is used.
    """
    family = family_for(vae)
    config = ParallelConfig(
        size=size, mode=mode, output=output, timeout=timeout, exact=exact, fast=FastOptions() if fast is None else fast
    )
    if config.mode in SPATIAL_MODES and not (family.spatial_decode or family.spatial_encode):
        raise ValueError(
            f"mode {config.mode!r} needs spatial sharding, which {type(vae).__name__} ({family.name} family) "
            "does not support: use mode='tile' or mode='auto'"
        )
    _check_size(config, group)
    state: _State | None = getattr(vae, STATE_ATTR, None)
    if state is not None:
        graphs.release(vae)  # captured under the old settings (and perhaps group)
        state.config, state.group = config, group
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
    )
    object.__setattr__(vae, STATE_ATTR, state)
    object.__setattr__(vae, "decode", types.MethodType(_decode, vae))
    object.__setattr__(vae, "encode", types.MethodType(_encode, vae))
    return vae


def _check_size(config: ParallelConfig, group) -> None:
    """`size` larger than the group: refused here when the group is known (given, or the default group
    exists) and this process is a member; otherwise at the first request, on every rank alike."""
    if config.size is None:
        return
    known = comm_mod.default_group_if_any(group)
    if known is None:
        return
    world = comm_mod.group_size(known)
    if world > 0 and config.size > world:
        raise ValueError(size_message(config.size, world))


def unparallelize(vae):
    """Remove everything `parallelize` added; `vae` behaves exactly as plain diffusers again."""
    state: _State | None = getattr(vae, STATE_ATTR, None)
    if state is None:
        return vae
    if state.layers_installed:
        state.family.uninstall_layers(vae)
    release(vae)
    for name, original in (("decode", state.original_decode), ("encode", state.original_encode)):
        if original is None:
            vae.__dict__.pop(name, None)
        else:
            object.__setattr__(vae, name, original)
    vae.__dict__.pop(STATE_ATTR, None)
    return vae


def release(vae) -> int:
    """Free what vaeshard keeps on `vae` between requests on this process: the CUDA graphs that
    `FastOptions(keep_cuda_graphs=True)` kept (and their memory) and the kernels' weights in their own
    layouts (made again when needed). Returns how many sets of kept graphs were freed (0 for a VAE
    that kept none or is not parallelized). Call it on every rank: a rank's kept state is its own, and
    the ranks need not agree (a request makes the same communication either way)."""
    freed = graphs.release(vae)
    kernels.forget_weights(vae)
    return freed


def abort(vae, reason: str) -> None:
    """End the request the VAE's group is running, or its next one, on every rank: from any thread of
    any rank (a watchdog that found a peer gone), `reason` is posted where the ranks' waits look
    (within about a second, as for a rank that raised; docs/reliability.md). Every waiting rank then
    raises CommTimeout naming `reason`, and the group is no longer used by vaeshard: make a new one."""
    state: _State | None = getattr(vae, STATE_ATTR, None)
    if state is None:
        raise TypeError(
            f"abort needs a VAE made parallel with vaeshard.parallelize(vae); got a plain {type(vae).__name__}"
        )
    group = comm_mod.default_group_if_any(state.group)
    if group is not None:
        comm_mod.post_abort(group, reason)


def verify_weights(vae) -> None:
    """Check, now, that every rank of the VAE's group holds the same weights: one integer per parameter
    from its raw bits (exact integer arithmetic, independent of summation order), compared across the
    ranks after an agreement. Every rank must call it; ValueError on every rank names the first
    parameter that differs. A plain (not parallelized) VAE checks against the default group."""
    state: _State | None = getattr(vae, STATE_ATTR, None)
    group = comm_mod.default_group_if_any(None if state is None else state.group)
    if comm_mod.group_rank(group) < 0:
        raise ValueError(f"this process (global rank {comm_mod.global_rank()}) is not a member of the VAE's group")
    timeout = None if state is None else state.config.timeout_seconds
    comm = comm_mod.Comm.for_group(group, timeout=timeout)
    if comm.world == 1:
        return
    names, sums = _checksums(vae)
    agree(comm, "verify_weights", describe_verify(len(names)), 0, None, timeout)
    with comm.bounded():
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


INPUT_DTYPES = tuple(DTYPES)  # the dtypes a request's input may have (as the VAE's own, or under autocast)


def check(vae, x, op: str = "decode") -> None:
    """The check a request of `x` meets on this rank before its agreement (what the tensor is, its
    shape, channels, device, dtype, NaN/Inf), here alone and without any communication: raises the
    TypeError or ValueError the request would raise on every rank; returns when it could run. For a
    process that hands inputs to the ranks (a service): check before sending them."""
    state: _State | None = getattr(vae, STATE_ATTR, None)
    if state is None:
        raise TypeError(
            f"check needs a VAE made parallel with vaeshard.parallelize(vae); got a plain {type(vae).__name__}"
        )
    if op not in ("decode", "encode"):
        raise ValueError(f"op={op!r}: choose 'decode' or 'encode'")
    code, error = validate(op, x, expected_of(state.family, vae, op))
    if code:
        raise PROBLEMS[code][0](error)


def config_of(vae) -> ParallelConfig | None:
    state = getattr(vae, STATE_ATTR, None)
    return None if state is None else state.config


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


# --- requests --------------------------------------------------------------------------------------


def _decode(vae, z, *args, **kwargs):
    from diffusers.models.autoencoders.vae import DecoderOutput

    inputs, return_dict = getattr(vae, STATE_ATTR).family.call_arguments("decode", args, kwargs)
    with passing_inputs(inputs):  # e.g. LTX-Video's decoder timestep
        sample = _run(vae, "decode", z)
    return DecoderOutput(sample=sample) if return_dict else (sample,)


def _encode(vae, x, *args, **kwargs):
    family = getattr(vae, STATE_ATTR).family
    inputs, return_dict = family.call_arguments("encode", args, kwargs)
    with passing_inputs(inputs):
        moments = _run(vae, "encode", x)
    # output="rank0" on another rank: nothing to wrap
    return family.encode_output(moments if moments.numel() else None, return_dict)


def _run(vae, op: str, x):
    with recorded(vae, op, x) as record:
        state, comm, hooked = admit(vae, op, x)
        config, family = state.config, state.family
        x = x.contiguous()  # channels-last or strided views: one copy of the input, same result as contiguous
        with comm.bounded():
            if vae.use_slicing and x.shape[0] > 1:
                whole = request_inputs()
                parts = []
                for k, part in enumerate(x.split(1)):
                    with passing_inputs(inputs_of_sample(whole, k, x.shape[0])):
                        parts.append(_run_one(vae, family, config, comm, op, part, hooked, record))
                return torch.cat(parts) if parts[0].numel() else parts[0]
            return _run_one(vae, family, config, comm, op, x, hooked, record)


def recorded(vae, op: str, x):
    """The request's metrics record (vaeshard.metrics: nothing without prometheus_client)."""
    state: _State = getattr(vae, STATE_ATTR)
    group = comm_mod.default_group_if_any(state.group)
    rank = comm_mod.group_rank(group)
    device = x.device if isinstance(x, torch.Tensor) else None
    return metrics.request(op, state.family.name, comm_mod.group_size(group) if rank >= 0 else 0, rank, device)


def admit(vae, op: str, x):
    """A request's admission on this rank: membership, this rank's check of its input, the
    agreement with every rank (all raise alike) and the once-per-VAE note on hooked layers. Returns
    (state, comm, hooked layers)."""
    state: _State = getattr(vae, STATE_ATTR)
    if state.streaming:
        raise RuntimeError(
            f"a vaeshard.stream_decode of this VAE is still open on this rank: iterate it to the end or "
            f"close it (use it in a `with` block) before the next {op}; its request holds the VAE's caches"
        )
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
        code, error = 9, size_message(config.size, comm.world)
    else:
        code, error = validate(op, x, expected_of(family, vae, op))
    hooked = replaced_forwards(vae)
    agree(
        comm,
        op,
        describe(
            op, x, config.mode, config.output, config.size, bool(hooked), _compared_inputs(vae, state, op, x, code == 0)
        ),
        code,
        error,
        config.timeout_seconds,
    )
    if hooked and not state.hooks_noted and not config.exact and config.mode != "tile":
        log.warning(
            "vaeshard: %s: this VAE decodes and encodes with diffusers' own layers (the exact tier), "
            "without spatial sharding; remove those hooks for the fast tier and sharding",
            hooks_reason(hooked),
        )
        state.hooks_noted = True
    return state, comm, hooked


def _compared_inputs(vae, state: _State, op: str, x, valid: bool) -> dict:
    """What every rank must pass alike beyond the tensor: the family's extra inputs; where the
    decode draws noise from the global RNG, that generator's state on the latent's device; and for
    `auto`, whose strategy follows the VAE's own tiling, what that tiling makes of a valid request."""
    inputs, family = request_inputs(), state.family
    if valid and state.config.mode == "auto":
        own = family.own_result(vae, op, tuple(x.shape))
        if own != "untiled":  # absent in the common case, so a request's digest stays its inputs'
            inputs["the VAE's own tiling"] = own
    if op == "decode" and family.draws_noise(vae):
        on_cuda = isinstance(x, torch.Tensor) and x.is_cuda
        inputs["global RNG state"] = torch.cuda.get_rng_state(x.device) if on_cuda else torch.get_rng_state()
    return inputs


def _run_one(vae, family: Family, config: ParallelConfig, comm, op: str, x, hooked: list[str], record):
    """One sample (or batch) of an agreed request; `hooked`: the VAE's hooked layers, which keep it
    unsharded and, as the fast tier's blocks call their layers' computations rather than their hooks,
    in the exact tier."""
    workers = comm.world if config.size is None else min(config.size, comm.world)
    chosen = choose(vae, config, comm, op, x, hooked)
    record.strategy = chosen.strategy
    to_all = config.output == "all"
    try:
        with torch.no_grad(), tier.active(chosen.fast):
            if chosen.strategy == "direct":
                out = direct(vae, family, op, x) if comm.rank == 0 else None
                if comm.rank != 0 and op == "decode":
                    family.replay_draws(vae, x)  # the RNG draws rank 0's decode made (LTX's noise)
                if to_all:
                    out = comm.share_from_rank0(out)
            elif chosen.strategy == "tile":
                ops = family.decode_tile_ops(vae, x) if op == "decode" else family.encode_tile_ops(vae, x)
                out = run_tiled(ops, comm, workers, to_all)
            else:
                run = family.untiled_decode if op == "decode" else family.untiled_encode
                axis = HEIGHT if chosen.strategy == "spatial_shard_height" else WIDTH
                rows = 1 if op == "decode" else family.spatial_ratio(vae)
                out = run_spatial(comm, x, axis, rows, lambda local: run(vae, local), to_all)
    finally:
        family.release(vae)
    if out is None:
        return x.new_empty(0)
    return out


def choose(vae, config: ParallelConfig, comm, op: str, x, hooked: list[str]):
    """The request's plan (`vaeshard.plan`), a fallback's reason logged as a warning (with what its
    result is where that is not what the VAE computes as configured)."""
    chosen = plan_for(vae, x.shape, comm.world, config, op=op, hooked=hooked)
    if chosen.fallback:
        log.warning("vaeshard: %s%s", chosen.reason, f"; result: {chosen.result}" if chosen.changes_result else "")
    elif log.isEnabledFor(logging.DEBUG):
        log.debug("vaeshard: %s -> %s", op, chosen.explain())
    state: _State = getattr(vae, STATE_ATTR)
    if chosen.strategy == "direct" and config.mode == "auto" and comm.world > 1 and not state.own_noted:
        if state.family.own_result(vae, op, tuple(x.shape)) == "own":  # neither tiles nor shards give its result
            log.warning(
                "vaeshard: %s. Set vae.use_framewise_decoding = vae.use_framewise_encoding = False for spatial "
                "shards (diffusers' untiled result), or vae.enable_tiling() for tiles (diffusers' tiled result)",
                chosen.reason,
            )
            state.own_noted = True
    return chosen


def direct(vae, family: Family, op: str, x):
    """The VAE's own single-process path, with its own tiling/slicing settings (a family may run its
    own untiled decode loop where that gives the VAE's result, see Family.direct_decode)."""
    if op == "decode":
        return family.direct_decode(vae, x)
    return family.direct_encode(vae, x)


__all__ = ["INPUT_DTYPES", "check", "config_of", "parallelize", "release", "unparallelize", "verify_weights"]
