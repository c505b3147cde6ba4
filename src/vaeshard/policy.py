"""What a request does, decided once before any work: `plan()` returns its strategy and, for the fast
tier, its resolved choices (frames per decoder call, CUDA graphs, layers in parts, the largest rank's
frame), each with its reason. Everything comes from numbers every rank shares (shapes, the group's
size, the VAE's device, the settings, tuning.py's thresholds), so every rank decides alike, and
nothing here communicates or allocates real tensors.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import NamedTuple

import torch

from . import tuning
from .config import MODES, SPATIAL_MODES, STATE_ATTR, FastOptions, ParallelConfig
from .layers.tier import FastPlan, kernels_unavailable
from .runtime import comm as comm_mod
from .runtime import graphs
from .runtime.requests import Expected, Request, check_shape, size_message
from .runtime.spatial import split_extents
from .runtime.swap import Inventory, inventory, replaced_forwards

log = logging.getLogger("vaeshard")

STRATEGIES = ("direct", "tile", "spatial_shard_height", "spatial_shard_width")
REFUSED = "refused"  # the plan of a request that `decode` / `encode` refuses; its reason is their message


class Plan(NamedTuple):
    strategy: str  # one of STRATEGIES, or REFUSED
    reason: str  # one line, shown by the debug log and `vaeshard bench`
    fallback: bool = False  # a forced mode could not run and `tile` (or `direct`) runs instead
    fast: FastPlan | None = None  # the fast tier's choices; None: the exact tier (diffusers' own layers)
    tier_reason: str = ""  # why a request that asked for the fast tier runs diffusers' own layers
    result: str = ""  # what the result equals, one line
    changes_result: bool = False  # the result is not what the VAE's own decode / encode, as configured, gives
    memory: str = ""  # what a rank holds beyond its share of the feature maps (Family.memory_note), one line
    # the exact tier of a request that asked for the fast tier: PyTorch's GroupNorm by vaeshard's kernels,
    # the same arithmetic (kernels/group_norm_same.py), where they agree with PyTorch on the device
    same_kernels: bool = False

    def explain(self) -> str:
        """The strategy and every choice with its reason, one per line; for a request that would be
        refused, "refused: " and the message `decode` / `encode` raises."""
        if self.strategy == REFUSED:
            return f"{REFUSED}: {self.reason}"
        tier = "the fast tier" if self.fast is not None else "the exact tier (diffusers' own layers)"
        tier += f": {self.tier_reason}" if self.tier_reason else ""
        if self.same_kernels:
            tier += (
                "; its GroupNorms by vaeshard's kernels in PyTorch's arithmetic, bit for bit "
                "(kernels/group_norm_same.py; where they disagree with PyTorch on the device, PyTorch's)"
            )
        lines = [f"strategy: {self.strategy} ({self.reason})", f"result: {self.result}", f"tier: {tier}"]
        if self.fast is not None:
            lines += [f"  {name}: {why}" for name, why in self.fast.reasons]
        if self.memory:
            lines.append(f"memory: {self.memory}")
        return "\n".join(lines)


def plan(
    vae,
    latent_shape,
    world_size: int | None = None,
    mode: str | None = None,
    *,
    op: str = "decode",
    size: int | None = None,
    fast: FastOptions | None = None,
    exact: bool | None = None,
) -> Plan:
    """The plan of a `decode` (or `encode`) of `latent_shape` over `world_size` ranks.

    Every argument left out is the VAE's own: a parallelized VAE's mode, size, fast options and
    exactness, and its group's size (the default group's, or 1 without a distributed job); a plain
    VAE gets `parallelize`'s defaults. Deterministic and free of side effects: no collectives, no
    allocation of real tensors. `size` is the number of ranks doing work (fewer than world_size is a
    partial group, which never shards spatially). A request that `decode` / `encode` would refuse
    (its shape does not fit the VAE, or `size` is larger than the group) gets strategy "refused" with
    the same message."""
    from .families import family_for

    family = family_for(vae)  # (the one lookup: a request's plan takes its family from the request)
    state = getattr(vae, STATE_ATTR, None)
    config = state.config if state is not None else ParallelConfig()
    if world_size is None:
        group = comm_mod.default_group_if_any(state.group if state is not None else None)
        world_size = comm_mod.group_size(group)
    config = ParallelConfig(
        size=config.size if size is None else size,
        mode=config.mode if mode is None else mode,
        output=config.output,
        timeout=config.timeout,
        exact=config.exact if exact is None else exact,
        fast=config.fast if fast is None else fast,
    )
    shape = tuple(int(s) for s in latent_shape)
    held = inventory(vae)
    code, why = check_shape(op, shape, expected_of(family, vae, op, held))
    if code == 0 and config.size is not None and config.size > world_size:
        why = size_message(config.size, world_size)
    if why is not None:
        return Plan(REFUSED, why)
    # a request of that shape, its input a meta tensor: its tile ops are built without tensors
    request = Request(
        op=op,
        x=torch.empty(shape, device="meta"),
        vae=vae,
        family=family,
        config=config,
        hooked=tuple(replaced_forwards(vae, held.hooked)),
        own=family.own_result(vae, op, shape),
    )
    return plan_request(request, world_size).plan


def plan_request(request: Request, world_size: int) -> Request:
    """`request` (admitted: its family, settings, hooked layers and own result known) planned over
    `world_size` ranks: its `plan` and, where planning needed them, its `tile_ops`, built once from
    its input, which the tile executor then runs. Called inside the request (requests.entered), as a
    family's tile ops take its extra inputs (`request_inputs`)."""
    built: list = []

    def tile_ops():
        if not built:
            family, vae, x = request.family, request.vae, request.x
            built.append(family.decode_tile_ops(vae, x) if request.op == "decode" else family.encode_tile_ops(vae, x))
        return built[0]

    chosen = _with_result(_strategy(request, world_size, tile_ops), request.op, request.own, request.config.mode)
    config, family = request.config, request.family
    note = family.memory_note(request.vae, tuple(request.x.shape), world_size, chosen.strategy, request.op)
    chosen = chosen._replace(memory=note or "")
    # mode tile promises diffusers' tiled decode bit for bit, also when the request is one tile
    if not (request.hooked or config.exact or config.mode == "tile"):
        if chosen.strategy == "tile":
            chosen = _fast_tiles(chosen, family, config.fast, request.op)
        elif not family.fast_tier:
            why = f"{type(request.vae).__name__} has no fast-tier layers (docs/families.md)"
            chosen = chosen._replace(tier_reason=why)
        elif family.name in tuning.NORM_INTO_CONV_ONLY_FAMILIES and config.fast.norm_into_conv is not True:
            why = (
                f"{family.name}'s fast tier runs only with FastOptions(norm_into_conv=True): its bf16 output is "
                "not within the bf16 rule of diffusers' (tuning.NORM_INTO_CONV_ONLY_FAMILIES, docs/tuning.md)"
            )
            chosen = chosen._replace(tier_reason=why)
        elif (
            family.name in tuning.FAST_TIER_SLOWER_FAMILIES
            and _device_of(request.vae).type == "cuda"
            and not (family.norm_into_conv and config.fast.norm_into_conv is True)
        ):
            why = (
                f"{family.name}'s fast tier is off on a GPU by default (measured slower than diffusers' decode, "
                "its bf16 output not within the bf16 rule, or not yet measured there) "
                "(tuning.FAST_TIER_SLOWER_FAMILIES, docs/tuning.md; norm_into_conv=True runs it with its "
                "norms into the next convolutions)"
            )
            chosen = chosen._replace(tier_reason=why)
        else:
            fast = resolve_fast(
                request.vae, request.x.shape, world_size, chosen.strategy, config.fast, op=request.op, family=family
            )
            chosen = chosen._replace(fast=fast)
        if chosen.fast is None and tuning.GROUP_NORM_SAME_KERNELS:
            chosen = chosen._replace(same_kernels=True)
    return dataclasses.replace(request, plan=chosen, tile_ops=built[0] if built else None)


def _fast_tiles(chosen: Plan, family, options: FastOptions, op: str) -> Plan:
    """`auto`'s tiles in the fast tier: where the family batches a rank's tiles of one shape
    (Family.fast_tiles, decode), in batches per shape, within the fast tier's tolerance of diffusers'
    tiled decode; elsewhere (and with `exact=True` or mode `tile`) one tile at a time, bit for bit."""
    if not (family.fast_tiles and op == "decode"):
        return chosen
    why = (
        "each rank decodes its tiles of one shape in batches (Family.fast_tiles; MiniMax-H3: at most "
        "tuning.MINIMAX_BATCH_TOKENS tokens a batch; exact=True: one at a time)"
    )
    fast = FastPlan(
        cudnn_benchmark=options.cudnn_benchmark, triton_convs=options.triton_convs, reasons=(("tiles", why),)
    )
    return chosen._replace(
        fast=fast,
        result=f"diffusers' tiled {op} within the fast tier's tolerances: what this VAE computes as configured "
        "(bit for bit with exact=True or mode tile)",
    )


def expected_of(family, vae, op: str, held: Inventory | None = None) -> Expected:
    """What a request's input must be for this VAE (runtime.requests.validate); `held`: the
    request's `inventory(vae)`, where it has taken one."""
    held = inventory(vae) if held is None else held
    return Expected(
        cls=type(vae).__name__,
        ndim=family.latent_ndim,
        layout=family.layout,
        channels=family.latent_channels(vae) if op == "decode" else None,
        devices=held.devices,
        dtypes=held.dtypes,
    )


def _axis_extents(shape, op: str, ratio: int) -> tuple[int, int]:
    """The (height, width) extents that decide sharding, in latent rows: the latent's own for decode;
    for encode the sample extent over the compression ratio, or 0 when the sample extent is not a
    multiple of it (shards are whole latent rows, so every downsampling stays on the global lattice)."""
    h, w = shape[-2], shape[-1]
    if op == "encode":
        return (h // ratio if h % ratio == 0 else 0), (w // ratio if w % ratio == 0 else 0)
    return h, w


def hooks_reason(hooked: list[str]) -> str:
    """Why a VAE with hooked layers (runtime.swap.replaced_forwards) is not sharded, in one line."""
    return (
        f"{len(hooked)} of its layers have their forward replaced by a hook (the first: {hooked[0]}; "
        "diffusers' layerwise casting or group offloading, accelerate's offloading), which the "
        "sharded layers would bypass"
    )


def _device_of(vae):
    """The device the VAE's weights are on (where its decode runs); CPU for a VAE without any."""
    first = next(vae.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def _with_result(chosen: Plan, op: str, own: str, mode: str) -> Plan:
    """`chosen` with what its result equals, and whether that differs from what the VAE computes as
    configured (`own`, Family.own_result)."""
    yours = {
        "untiled": f"its untiled {op} (its tiling is off, or the input fits one tile)",
        "tile": f"its tiled {op} (its own tiling tiles this input: enable_tiling, or chunks in time)",
        "own": f"its own {op} (frame-wise: chunks in time of whole frames)",
    }[own]
    if chosen.strategy == "direct":
        return chosen._replace(result=f"this VAE's own {op} as configured ({yours}), run by one rank")
    if chosen.strategy == "tile":
        result, same = f"diffusers' tiled {op}, bit for bit", own == "tile"
    else:
        result, same = f"diffusers' untiled {op}, within the spatial tolerances (docs/strategies.md)", own == "untiled"
    if same:
        return chosen._replace(result=f"{result}: what this VAE computes as configured, {yours}")
    cause = f"{mode} could not run, so the result is the tiled one" if chosen.fallback else f"mode {mode} asked for it"
    return chosen._replace(
        result=f"{result}, NOT what this VAE computes as configured, {yours} ({cause})", changes_result=True
    )


def _strategy(request: Request, world_size: int, tile_ops) -> Plan:
    """The strategy of a request and its reason (docs/strategies.md, "`auto`" and "Fallbacks": `auto`
    keeps to what the VAE's own decode computes as configured, `request.own`: its tiled result where
    diffusers' tiling is on and tiles this request, else an untiled-equivalent strategy, sharding the
    longer axis that covers the group, width on ties, unless the family measured another axis faster
    there; a forced mode that cannot run falls back to `tile` with a warning). `tile_ops()`: the
    request's tile ops (None: it is one tile), asked only where the choice depends on them."""
    family, vae, op, hooked, own = request.family, request.vae, request.op, request.hooked, request.own
    mode, size = request.config.mode, request.config.size
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}: valid modes are {', '.join(MODES)}")
    shape = tuple(int(s) for s in request.x.shape)
    workers = world_size if size is None else min(size, world_size)
    has_tile = family.supports(op, "tile")

    # the fast tier's batched tiles (Family.fast_tiles): worth running as tiles on one rank too
    batches = family.fast_tiles and op == "decode" and not (request.config.exact or hooked)

    def not_spatial(why: str, forced: bool) -> Plan:
        if workers == 1 and mode != "tile" and not (batches and own == "tile" and tile_ops() is not None):
            return Plan("direct", f"{why}; one rank decodes directly", forced)
        # (a latent of another layout has no tile grid to cut)
        one_tile = len(shape) != family.latent_ndim or tile_ops() is None
        if one_tile or not has_tile:
            what = "the request is a single tile" if one_tile else f"{family.name} has no tiled {op}"
            return Plan("direct", f"{why}; {what}, so group rank 0 runs it directly and shares the result", forced)
        if workers == 1:
            return Plan("tile", f"{why}; one rank decodes the tiles", forced)
        return Plan("tile", f"{why}; tiles are spread over {workers} ranks", forced)

    if mode == "tile":
        if not has_tile:  # mode tile promises diffusers' tiled result, and there is none to give
            why = getattr(family, "no_tile_reason", None) or (
                f"{type(vae).__name__} has no tiled {op} in diffusers, so there is no tiled result to reproduce"
            )
            raise ValueError(f"mode 'tile': {why}; use mode 'auto' or a spatial_shard mode (diffusers' untiled result)")
        return not_spatial("mode tile", False)

    spatial_ok = family.supports(op, "spatial_shard_height")
    reasons = []
    if world_size == 1:
        reasons.append("world size 1")
    if workers < world_size:
        reasons.append(f"partial group ({workers} of {world_size} ranks)")
    if len(shape) != family.latent_ndim:
        reasons.append(
            f"a {len(shape)}-D latent is not the {family.latent_ndim}-D {family.layout} layout of {family.name}"
        )
    if not spatial_ok:
        reasons.append(f"{family.name} has no spatial-shard {op}")
    if hooked:
        reasons.append(hooks_reason(hooked))

    if mode in SPATIAL_MODES:
        axis = "height" if mode == "spatial_shard_height" else "width"
        if not reasons:
            extent = _axis_extents(shape, op, family.spatial_ratio(vae))[0 if axis == "height" else 1]
            if extent < world_size * (rows := family.min_shard_rows(vae)):
                reasons.append(
                    f"latent {axis} {extent} is shorter than the group ({world_size} ranks{_of_rows(rows)})"
                    if extent or op == "decode"
                    else f"sample {axis} is not a multiple of {family.spatial_ratio(vae)}"
                )
        if reasons:
            return not_spatial(f"{mode} cannot run: " + ", ".join(reasons), True)
        return Plan(mode, f"forced {mode} over {world_size} ranks")

    # auto: what the VAE computes as configured; tiles only where its own decode tiles this request
    if own == "tile":
        return not_spatial(f"auto: this VAE's own {op} tiles this input (enable_tiling, or chunks in time)", False)

    def shared_direct(why: str, but: str = "tiles would change its result") -> Plan:
        if workers == 1:
            return Plan("direct", f"{why}; one rank runs it directly")
        return Plan("direct", f"{why}; group rank 0 runs it directly and shares the result, as {but}")

    if own == "own":
        why = f"auto: this VAE's own {op} as configured is {family.own_reason(vae, op)[0]}"
        return shared_direct(why, "neither tiles nor shards give it")
    if reasons:
        return shared_direct(", ".join(reasons))
    h, w = _axis_extents(shape, op, family.spatial_ratio(vae))
    rows = family.min_shard_rows(vae)
    candidates = [(extent, name) for extent, name in ((h, "height"), (w, "width")) if extent >= world_size * rows]
    if not candidates:
        return shared_direct(f"neither latent height {h} nor width {w} covers {world_size} ranks{_of_rows(rows)}")
    device = _device_of(vae)
    measured = family.decode_axis(vae, world_size, device) if op == "decode" else None
    for extent, axis in candidates:
        if axis == measured:  # the family's measured refinement (only where docs/tuning.md shows it)
            return Plan(
                f"spatial_shard_{axis}",
                f"auto: {axis} {extent} covers {world_size} ranks, and {family.name} "
                f"decodes over {world_size} ranks on {device.type} measured faster by {axis} (docs/tuning.md)",
            )
    # the longer axis; width wins ties (rows of a wide frame stay contiguous and halos stay short)
    extent, axis = max(candidates, key=lambda c: (c[0], c[1] == "width"))
    return Plan(f"spatial_shard_{axis}", f"auto: {axis} {extent} is the longer axis covering {world_size} ranks")


def _of_rows(rows: int) -> str:
    """How many latent rows each rank needs, where a family needs more than one (Family.min_shard_rows)."""
    return f" of {rows} latent rows each" if rows > 1 else ""


def resolve_fast(
    vae,
    latent_shape,
    world_size: int,
    strategy: str,
    options: FastOptions,
    *,
    op: str = "decode",
    device: torch.device | None = None,
    family=None,
) -> FastPlan:
    """The fast tier's choices for a request of `latent_shape` run by `strategy` over `world_size`
    ranks with `options`: the largest rank's frame, frames per decoder call, CUDA graphs and layers in
    parts, each with its reason (FastPlan.reasons), by tuning.py's thresholds. `family`: the VAE's
    (looked up where not given)."""
    if family is None:
        from .families import family_for

        family = family_for(vae)
    device = _device_of(vae) if device is None else device
    shape = tuple(int(s) for s in latent_shape)
    ratio = family.spatial_ratio(vae)
    sharded = strategy in SPATIAL_MODES
    h, w = shape[-2], shape[-1]
    if sharded:  # the largest rank's rows (whole latent rows; an encode's sample has `ratio` per row)
        scale = 1 if op == "decode" else ratio
        if strategy == "spatial_shard_height":
            h = max(split_extents(h // scale, world_size)) * scale
        else:
            w = max(split_extents(w // scale, world_size)) * scale
    pixels = h * w * (ratio**2 if op == "decode" else 1)
    where = "the largest rank's" if sharded else "the"
    reasons = [("frame", f"{where} {'output' if op == 'decode' else 'input'} frame holds {pixels:,} pixels")]

    steps, graphed = 1, False
    if op == "decode" and family.frame_loop:
        if options.frames_per_step != "auto":
            steps, why = options.frames_per_step, "set"
        elif options.max_layer_frames is not None:
            why = "auto: 1 with max_layer_frames set (a setting for a low peak)"
        elif device.type not in tuning.AUTO_STEP_DEVICES:
            why = f"auto: 1 on {device.type} (tuning.AUTO_STEP_DEVICES)"
        elif family.name in tuning.AUTO_STEP_ANY_FRAME_FAMILIES:
            steps = tuning.AUTO_STEP_FRAMES
            why = f"auto: {steps} at any frame size for {family.name} (tuning.AUTO_STEP_ANY_FRAME_FAMILIES)"
        elif pixels > tuning.AUTO_STEP_MAX_PIXELS:
            why = f"auto: 1, the frame exceeds tuning.AUTO_STEP_MAX_PIXELS ({tuning.AUTO_STEP_MAX_PIXELS:,})"
        else:
            steps = tuning.AUTO_STEP_FRAMES
            why = f"auto: {steps}, the frame is at most tuning.AUTO_STEP_MAX_PIXELS ({tuning.AUTO_STEP_MAX_PIXELS:,})"
        reasons.append(("frames_per_step", f"{steps} ({why})"))
        reasons.append(
            (
                "frame loop",
                "the decoder runs latent frame 0 alone, then frames_per_step latent frames per call, each causal "
                "convolution taking the frames before a call from its cache",
            )
        )
        num_frames = shape[2] if len(shape) == 5 else 1
        num_calls = 1 + -(-(num_frames - 1) // steps)
        if options.cuda_graphs == "auto":
            wanted = pixels <= tuning.GRAPHS_MAX_PIXELS
            why = (
                f"auto: the frame is {'at most' if wanted else 'above'} tuning.GRAPHS_MAX_PIXELS "
                f"({tuning.GRAPHS_MAX_PIXELS:,})"
            )
        else:
            wanted, why = bool(options.cuda_graphs), "set"
        replays = graphs.replays(device, num_calls)
        graphed = wanted and replays and family.frame_loop_graphs
        if wanted and not replays:
            why += f", but {num_calls} decoder call(s) on {device.type} replay none"
        elif wanted and not family.frame_loop_graphs:
            why += f", but {family.name}'s frame loop runs its calls eagerly"
        reasons.append(("cuda_graphs", f"{'on' if graphed else 'off'} ({why})"))
    else:
        reasons.append(("frames_per_step", "1 (no frame loop)"))

    part_frames, least = None, 0
    if not family.layer_parts:
        why = f"whole decoder calls ({family.name}'s layers take no parts"
        why += "; max_layer_frames is not applied)" if options.max_layer_frames is not None else ")"
        reasons.append(("layer frames", why))
    elif options.max_layer_frames is not None:
        reasons.append(("layer frames", f"at most {options.max_layer_frames} (max_layer_frames)"))
    elif tuning.PART_FRAMES is not None:
        part_frames = tuning.PART_FRAMES
        least = max(tuning.PARTS_FROM_PIXELS, tuning.SHARDED_PARTS_FROM_PIXELS) if sharded else tuning.PARTS_FROM_PIXELS
        reasons.append(
            (
                "layer frames",
                f"parts of {part_frames} in the layers whose frames hold at least {least:,} "
                f"pixels, where they suit (tuning.{'SHARDED_' if sharded else ''}PARTS_FROM_PIXELS)",
            )
        )
    missing = kernels_unavailable(device)
    if missing is not None:
        reasons.append(("kernels", f"PyTorch's layers throughout ({missing})"))
    into_conv, why = _norm_into_conv(family, options)
    reasons.append(("norm into conv", f"{'on' if into_conv else 'off'} ({why})"))
    reasons.extend(family.fast_notes)
    return FastPlan(
        frames_per_step=steps,
        cuda_graphs=graphed,
        keep_cuda_graphs=options.keep_cuda_graphs,
        max_layer_frames=options.max_layer_frames,
        part_frames=part_frames,
        parts_from_pixels=least,
        frame_pixels=pixels,
        cudnn_benchmark=options.cudnn_benchmark,
        triton_convs=options.triton_convs,
        norm_into_conv=into_conv,
        reasons=tuple(reasons),
    )


def _norm_into_conv(family, options: FastOptions) -> tuple[bool, str]:
    """Whether a request's declared norms write into the next convolution's padded input
    (fast/producers.py), and why."""
    if not family.norm_into_conv:
        return False, f"{family.name} declares no norm feeding a padding convolution"
    if options.norm_into_conv != "auto":
        pairs = f"{len(family.norm_into_conv)} declared norm -> convolution pairs"
        return bool(options.norm_into_conv), f"set: {pairs}" + ("" if options.norm_into_conv else " run apart")
    if family.name in tuning.NORM_INTO_CONV_BUFFER_FAMILIES:
        return True, f"auto: {family.name} is in tuning.NORM_INTO_CONV_BUFFER_FAMILIES"
    return False, (
        f"auto: {family.name} is not in tuning.NORM_INTO_CONV_BUFFER_FAMILIES (not yet measured faster on a GPU); "
        "norm_into_conv=True forces it"
    )
