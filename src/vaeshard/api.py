"""The public verbs, and the life of one request.

`parallelize` swaps in the family's request-aware layers and wraps `decode` / `encode`. One request:
`admit` checks the input on this rank and holds the agreement (runtime/requests.py: every rank sees
every rank's request through the group's store, and all fail alike), and returns the `Request` ->
`execute`, the one executor of `decode`, `encode` and `stream_decode`: `policy.plan_request`
resolves the strategy and the fast tier's choices once (and builds a tile request's tile ops once)
-> the strategy runs (direct, the tile executor of runtime/tile.py, or the spatial shards of
runtime/spatial.py) with the request current (its inputs, plan and shard, runtime/requests.py) ->
the result placed per `output`, whole or chunk by chunk. Request scratch (the model's feature
caches, halo and gather buffers) is released on success and on failure.
"""

from __future__ import annotations

import contextlib
import logging
import types
from dataclasses import dataclass, replace

import torch

from . import kernels, metrics
from .config import SPATIAL_MODES, STATE_ATTR, FastOptions, ParallelConfig
from .families import family_for
from .families.base import Family, inputs_of_sample
from .layers import tier
from .policy import expected_of, hooks_reason, plan_request
from .runtime import comm as comm_mod
from .runtime import graphs, requests, spatial
from .runtime.requests import DTYPES, PROBLEMS, Request, agree, describe, describe_verify, size_message, validate
from .runtime.swap import inventory, replaced_forwards
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


# --- requests ---------------------------------------------------------------------------------------


def _decode(vae, z, *args, **kwargs):
    from diffusers.models.autoencoders.vae import DecoderOutput

    inputs, return_dict = getattr(vae, STATE_ATTR).family.call_arguments("decode", args, kwargs)
    sample = _run(vae, "decode", z, inputs)  # inputs: e.g. LTX-Video's decoder timestep
    return DecoderOutput(sample=sample) if return_dict else (sample,)


def _encode(vae, x, *args, **kwargs):
    family = getattr(vae, STATE_ATTR).family
    inputs, return_dict = family.call_arguments("encode", args, kwargs)
    moments = _run(vae, "encode", x, inputs)
    # output="rank0" on another rank: nothing to wrap
    return family.encode_output(moments if moments.numel() else None, return_dict)


def _run(vae, op: str, x, inputs: dict):
    """A decode or encode: admitted, then run by the executor in one step (a batch the VAE slices:
    one request per sample, their results concatenated)."""
    with recorded(vae, op, x) as record:
        request = admit(vae, op, x, inputs, record)
        x = request.x
        if getattr(vae, "use_slicing", False) and x.shape[0] > 1:  # (a VAE without slicing: never)
            parts = [
                _whole(replace(request, x=part, inputs=inputs_of_sample(request.inputs, k, x.shape[0])))
                for k, part in enumerate(x.split(1))
            ]
            return torch.cat(parts) if parts[0].numel() else parts[0]
        return _whole(request)


def _whole(request: Request) -> torch.Tensor:
    (result,) = execute(request, stream=False)
    return result


def recorded(vae, op: str, x):
    """The request's metrics record (vaeshard.metrics: nothing without prometheus_client)."""
    state: _State = getattr(vae, STATE_ATTR)
    group = comm_mod.default_group_if_any(state.group)
    rank = comm_mod.group_rank(group)
    device = x.device if isinstance(x, torch.Tensor) else None
    return metrics.request(op, state.family.name, comm_mod.group_size(group) if rank >= 0 else 0, rank, device)


def admit(vae, op: str, x, inputs: dict, record) -> Request:
    """A request's admission on this rank: membership, this rank's check of its input, the
    agreement with every rank (all raise alike) and the once-per-VAE note on hooked layers. Returns
    the request (`inputs`: the family's extra inputs; `record`: its metrics record), not yet planned."""
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
    held = inventory(vae)
    if config.size is not None and config.size > comm.world:
        code, error = 9, size_message(config.size, comm.world)
    else:
        code, error = validate(op, x, expected_of(family, vae, op, held))
    hooked = tuple(replaced_forwards(vae, held.hooked))
    request = Request(
        op=op, x=x, vae=vae, family=family, config=config, comm=comm, inputs=dict(inputs), record=record, hooked=hooked
    )
    if code == 0:  # what the VAE's own op computes for this input, asked once (policy, the agreement)
        request = replace(request, own=family.own_result(vae, op, tuple(x.shape)))
    desc = describe(op, x, config.mode, config.output, config.size, bool(hooked), _compared_inputs(request, code == 0))
    agree(comm, op, desc, code, error, config.timeout_seconds)
    if hooked and not state.hooks_noted and not config.exact and config.mode != "tile":
        log.warning(
            "vaeshard: %s: this VAE decodes and encodes with diffusers' own layers (the exact tier), "
            "without spatial sharding; remove those hooks for the fast tier and sharding",
            hooks_reason(hooked),
        )
        state.hooks_noted = True
    # channels-last or strided views: one copy of the input, the same result as contiguous
    return replace(request, x=x.contiguous())


def _compared_inputs(request: Request, valid: bool) -> dict:
    """What every rank must pass alike beyond the tensor: the family's extra inputs; where the
    decode draws noise from the global RNG, that generator's state on the latent's device; and for
    `auto`, whose strategy follows the VAE's own tiling, what that tiling makes of a valid request."""
    inputs, x = dict(request.inputs), request.x
    if valid and request.config.mode == "auto" and request.own != "untiled":
        inputs["the VAE's own tiling"] = request.own  # absent in the common case: the digest stays the inputs'
    if request.op == "decode" and request.family.draws_noise(request.vae):
        on_cuda = isinstance(x, torch.Tensor) and x.is_cuda
        inputs["global RNG state"] = torch.cuda.get_rng_state(x.device) if on_cuda else torch.get_rng_state()
    return inputs


def execute(request: Request, stream: bool):
    """The executor of an admitted request: plans it (`policy.plan_request`), then runs its strategy
    (direct, the tile executor, or the spatial shards) and yields its result placed per `output` (an
    empty tensor on a rank that gets none). Yields once, or with `stream` (a decode) once per decoder
    step where the family's frame loop cuts it (Family.stream_decode): the chunks in frame order,
    their concatenation the same result bit for bit. Nothing of the request is in force between two
    chunks (`_step`); before every chunk after the first the ranks agree that every consumer still
    wants the rest. The request's scratch (the VAE's caches) is released at the end, on failure and
    when the consumer closes the generator early."""
    vae, family, comm = request.vae, request.family, request.comm
    timeout = request.config.timeout_seconds
    source = None
    try:
        with requests.entered(request), torch.no_grad(), comm.bounded():
            request = _planned(request)
        strategy = request.plan.strategy
        local, dim = request.x, None
        if strategy in SPATIAL_MODES:
            axis = spatial.HEIGHT if strategy == "spatial_shard_height" else spatial.WIDTH
            rows = 1 if request.op == "decode" else family.spatial_ratio(vae)
            local, shard, dim = spatial.shard_of(comm, request.x, axis, rows)
            request = replace(request, shard=shard)
        with _step(request):
            if stream and strategy != "tile":
                source = family.stream_decode(vae, local, whole=request.shard is None)
            if source is None:
                result = _result(request, local, dim)
        if source is None:
            yield _placed(request, result)
            return
        count, chunks = source
        for k in range(count):
            if k:
                try:
                    requests.carry_on(comm, k, count, timeout)
                except requests.StreamClosed:
                    request.record.status = "closed"
                    raise
            with _step(request):
                made = next(chunks) if request.shard is not None or comm.rank == 0 else None
                chunk = _placed(request, _place(request, made, dim))
            try:
                yield chunk
            except GeneratorExit:
                request.record.status = "closed"
                requests.tell_closed(comm, k, count, timeout)
                raise
            del chunk
    finally:
        if source is not None:
            source[1].close()  # the family's loop: its caches and the request's graphs end here
        with torch.no_grad():
            family.release(vae)


@contextlib.contextmanager
def _step(request: Request):
    """The request in force for one step (no yield inside): it is the current request (its extra
    inputs, its shard), with its fast-tier plan, without autograd and bounded by its group's timeout."""
    with requests.entered(request), tier.active(request.plan.fast), torch.no_grad(), request.comm.bounded():
        yield


def _result(request: Request, local, dim: int | None):
    """The whole result of the request's strategy on this rank, placed (None where it gets none);
    `local`: this rank's slice of the input where the request is sharded along `dim`."""
    vae, family, comm, op = request.vae, request.family, request.comm, request.op
    if request.plan.strategy == "tile":
        return run_tiled(request.tile_ops, comm, request.workers, request.config.output == "all")
    if request.shard is not None:
        run = family.untiled_decode if op == "decode" else family.untiled_encode
        return _place(request, run(vae, local), dim)
    out = direct(vae, family, op, request.x) if comm.rank == 0 else None
    if op == "decode" and comm.world > 1 and family.draws_noise(vae):
        _follow_rank0_rng(request)
    return _place(request, out, dim)


def _follow_rank0_rng(request: Request) -> None:
    """After rank 0 alone ran a decode that draws noise: every rank's RNGs as rank 0's decode left them
    (the request's generators, in the order of their names, then the global RNG of the latent's
    device), so the ranks stay in step for the next request, whatever draws the decode made (diffusers'
    own tiled path included). The request agreement checked they were alike before."""
    comm, x = request.comm, request.x
    for _, generator in sorted((k, v) for k, v in request.inputs.items() if isinstance(v, torch.Generator)):
        generator.set_state(comm.share_state_from_rank0(generator.get_state()))
    if x.is_cuda:
        torch.cuda.set_rng_state(comm.share_state_from_rank0(torch.cuda.get_rng_state(x.device)), x.device)
    else:
        torch.set_rng_state(comm.share_state_from_rank0(torch.get_rng_state()))


def _place(request: Request, out, dim: int | None):
    """What this rank made of a direct or sharded request (its result, or a chunk of it) placed per
    `output`: a direct request's from rank 0 (`out` None elsewhere), a sharded one's assembled
    from every rank's part along `dim`; None on a rank that gets none."""
    to_all = request.config.output == "all"
    if request.shard is not None:
        return spatial.assemble(request.shard, out, dim, to_all)
    return request.comm.share_from_rank0(out) if to_all else out


def _placed(request: Request, out):
    return request.x.new_empty(0) if out is None else out


def _planned(request: Request) -> Request:
    """The request with its plan (`vaeshard.plan`), a fallback's reason logged as a warning (with what
    its result is where that is not what the VAE computes as configured)."""
    request = plan_request(request, request.comm.world)
    chosen, config = request.plan, request.config
    request.record.strategy = chosen.strategy
    if chosen.fallback:
        log.warning("vaeshard: %s%s", chosen.reason, f"; result: {chosen.result}" if chosen.changes_result else "")
    elif log.isEnabledFor(logging.DEBUG):
        log.debug("vaeshard: %s -> %s", request.op, chosen.explain())
    state: _State = getattr(request.vae, STATE_ATTR)
    if chosen.strategy == "direct" and config.mode == "auto" and request.comm.world > 1 and not state.own_noted:
        if request.own == "own":  # neither tiles nor shards give its result
            log.warning("vaeshard: %s. %s", chosen.reason, request.family.own_reason(request.vae, request.op)[1])
            state.own_noted = True
    return request


def direct(vae, family: Family, op: str, x):
    """The VAE's own single-process path, with its own tiling/slicing settings (a family may run its
    own untiled decode loop where that gives the VAE's result, see Family.direct_decode)."""
    if op == "decode":
        return family.direct_decode(vae, x)
    return family.direct_encode(vae, x)


__all__ = ["INPUT_DTYPES", "check", "config_of", "parallelize", "release", "unparallelize", "verify_weights"]
