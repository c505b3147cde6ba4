"""The contract between vaeshard and a family of diffusers VAE classes, and helpers families share.

A family is a subclass of `Family`: class attributes declare what it supports (the support table in
docs/families.md is generated from them), and methods supply what cannot be data: the tile grid and
per-tile run (kept line for line with diffusers' tiled decode, so `tile` stays bit-identical), the
untiled decode and encode a sharded request runs on each rank's slice. The layers to swap for
sharding are data too: a family's `shard_plan` (a `ShardPlan` of `Rule`s naming diffusers' module
classes as strings), which one walker (`apply_plan`) checks whole and then applies (runtime/swap.py).
docs/adding-a-family.md walks through writing one.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import importlib
import inspect
import textwrap
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..fast import producers
from ..runtime import requests
from ..runtime.swap import is_swapped, swap, unswap
from ..runtime.tile import TileGrid, TileOps

# diffusers' switch of tiling in time, per op (HunyuanVideo's is on by default; LTX's and Mochi's off)
FRAMEWISE = {"decode": "use_framewise_decoding", "encode": "use_framewise_encoding"}


class Mirror(NamedTuple):
    """A diffusers function whose computation vaeshard re-implements (for speed, or to shard it
    exactly) instead of calling it: `theirs` ("module:Qualified.name"), the vaeshard code that
    mirrors it (`ours`), and `sha`, the `source_hash` of the diffusers source it was written from.
    tests/test_families/test_drift.py fails by name when the installed diffusers' source differs."""

    theirs: str
    ours: str
    sha: str


class ShapeFacts(NamedTuple):
    """A config's latent and sample shapes, read from the config alone (no model is built):
    `vaeshard.shape_facts`. tests/test_families checks each against the built model's decode."""

    latent_ndim: int  # 5: (B, C, T, H, W); 4: (B, C, H, W)
    latent_channels: int
    spatial_factor: int  # sample pixels per latent pixel along each spatial axis
    temporal_factor: int  # sample frames per latent frame after the first; 1 for an image VAE
    sample_channels: int  # channels of a decoded sample (after any unpatchify): 3 for RGB
    # diffusers decodes the latent frames in batches of two (CogVideoX): an even count then decodes
    # every frame, the first too, to `temporal_factor` frames
    paired_frames: bool = False
    # latent frames -> sample frames where no factor says it (MiniMax-H3's overlapping clips)
    frames: Callable[[int], int] | None = None
    # a decoded sample's pixel convention: `sample * pixel_scale + pixel_offset` (per channel, or one
    # value for all) is the pixel in [0, 1]; the default is diffusers' usual [-1, 1]
    pixel_scale: tuple[float, ...] = (0.5,)
    pixel_offset: tuple[float, ...] = (0.5,)

    def frames_out(self, latent_frames: int) -> int:
        """Frames a latent of `latent_frames` frames decodes to (1 for an image VAE's latent)."""
        if self.latent_ndim == 4:
            return 1
        if self.frames is not None:
            return self.frames(latent_frames)
        if self.paired_frames and latent_frames % 2 == 0:
            return latent_frames * self.temporal_factor
        return frames_out(latent_frames, self.temporal_factor)


def source_hash(qualified: str) -> str:
    """The first 16 hex digits of the SHA-256 of a function's source ("module:Qualified.name"),
    dedented, trailing spaces stripped: the same text hashes alike whatever its indentation."""
    module, name = qualified.split(":")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    text = "\n".join(line.rstrip() for line in textwrap.dedent(inspect.getsource(obj)).splitlines()).strip()
    return hashlib.sha256((text + "\n").encode()).hexdigest()[:16]


# -- shard plans: which treatment each module of a VAE gets when its feature maps are sharded ---------

HALO = "halo"  # takes its neighbours' rows in place of its padding on the sharded axis (layers/halo.py)
GLOBAL_NORM = "global_norm"  # statistics combined over the ranks (layers/norms.py)
WHOLE_MAP = "whole_map"  # attention over the whole map's keys and values, or whole-map noise, sliced
LOCAL = "local"  # per pixel, or a container whose coupling lies in children treated by their own rule
FAST = "fast"  # only the fast tier's layers change (fused norms, blocks that write into conv buffers)
REFUSED = "refused"  # vaeshard cannot shard it exactly: the plan names why
TREATMENTS = (HALO, GLOBAL_NORM, WHOLE_MAP, LOCAL, FAST, REFUSED)


class Layer(NamedTuple):
    """What a family knows of a declared module's kind, for tiers that read more than the treatment:
    `norm` ("group", "rms_channels", "layer", ...), the `activation` after it, the `padding` mode of
    a convolution's (or its next convolution's) padding, and whether it keeps a causal `cache` of
    its last input frames."""

    norm: str | None = None
    activation: str | None = None
    padding: str | None = None
    cache: bool = False


@dataclass(frozen=True)
class Rule:
    """One declaration of a shard plan: modules of the diffusers classes `classes` (names, so a class
    an older diffusers lacks is no import error; () with `where`: any class) get `treatment`, with
    `mixin` swapped onto them where there is one.

    Selection, where the class alone is not enough: `parent`, the class names of the module's
    direct parent; `where`, an fnmatch pattern of its path in the VAE ("decoder.*"); `when`, a
    predicate of the module. The first rule of a plan that selects a module decides it. `check`:
    what keeps the module from being sharded exactly (a phrase), or None; `reason`, for a `REFUSED`
    rule, the phrase. `subtree`: the treatment covers every module below it, which the walker does
    not visit. `layer`: the module's kind (`Layer`)."""

    classes: tuple[str, ...]
    treatment: str
    mixin: type | None = None
    parent: tuple[str, ...] = ()
    where: str | None = None
    when: Callable[[torch.nn.Module], bool] | None = None
    check: Callable[[torch.nn.Module], str | None] | None = None
    reason: str = ""
    subtree: bool = False
    layer: Layer = Layer()

    def __post_init__(self):
        for name in ("classes", "parent"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, (value,))
        if self.treatment not in TREATMENTS:
            raise ValueError(f"unknown treatment {self.treatment!r}: one of {TREATMENTS}")

    def selects(self, module, path: str, parent) -> bool:
        return (
            (not self.classes or class_name(module) in self.classes)
            and (not self.parent or class_name(parent) in self.parent)
            and (self.where is None or fnmatch.fnmatchcase(path, self.where))
            and (self.when is None or bool(self.when(module)))
        )


@dataclass(frozen=True)
class ShardPlan:
    """A family's shard plan: its `rules`, in order, over the VAE's children named in `roots` (None:
    all of them; a root the VAE lacks is skipped). `check_model`: a check of the whole VAE that
    raises ValueError, run first (a switch of the VAE no single module shows)."""

    rules: tuple[Rule, ...]
    roots: tuple[str, ...] | None = None
    check_model: Callable[[torch.nn.Module], None] | None = None


class Swapped(NamedTuple):
    """A module `apply_plan` swapped: its path in the VAE, diffusers class, mixin and treatment."""

    path: str
    cls: str
    mixin: str
    treatment: str


class ShardReport(NamedTuple):
    """What `apply_plan` did: every module it swapped, and how many modules got each treatment."""

    swapped: tuple[Swapped, ...]
    counts: dict[str, int]

    def summary(self) -> str:
        """One line: modules per treatment, and how many were swapped."""
        counts = ", ".join(f"{self.counts[t]} {t}" for t in TREATMENTS if self.counts.get(t))
        return f"{counts}; {len(self.swapped)} swapped"


def class_name(module) -> str:
    """The name of `module`'s diffusers class (its own where vaeshard swapped a mixin onto it)."""
    return getattr(type(module), "_vaeshard_base", type(module)).__name__


def apply_plan(plan: ShardPlan, vae, install: bool = True) -> ShardReport:
    """Walk `vae` by `plan`: every module of its roots is checked first, and one ValueError names
    every module vaeshard cannot shard exactly (path and class: a wrong decode would be worse than a
    refusal), before anything is swapped; then the mixins are swapped on (`install`; idempotent:
    a module swapped already is left as it is). Returns the report."""
    if plan.check_model is not None:
        plan.check_model(vae)
    chosen, problems = [], []
    children = dict(vae.named_children())
    for root_name in children if plan.roots is None else plan.roots:
        root = children.get(root_name)
        if root is None:
            continue
        modules = {"": root}
        covered: list[str] = []
        for name, module in root.named_modules():
            modules[name] = module
            path = f"{root_name}.{name}" if name else root_name
            if any(path.startswith(prefix) for prefix in covered):
                continue
            parent = modules[name.rpartition(".")[0]] if name else vae
            rule = next((r for r in plan.rules if r.selects(module, path, parent)), None)
            problem = _problem(rule, module)
            if problem:
                problems.append(f"{path} ({class_name(module)}) is {problem}")
                continue
            chosen.append((path, module, rule))
            if rule.subtree:
                covered.append(path + ".")
    if problems:
        raise ValueError(
            f"vaeshard cannot shard this {type(vae).__name__}: {len(problems)} of its layers cannot be sharded "
            f"exactly: {'; '.join(problems)}. A wrong decode would be worse than a refusal: this VAE is not the "
            "layout vaeshard supports; use mode='tile' or decode it without vaeshard"
        )
    swapped = []
    for path, module, rule in chosen:
        if rule.mixin is None:
            continue
        if install and not is_swapped(module):
            swap(module, rule.mixin)
        swapped.append(Swapped(path, class_name(module), rule.mixin.__name__, rule.treatment))
    return ShardReport(tuple(swapped), dict(Counter(rule.treatment for _, _, rule in chosen)))


def _problem(rule: Rule | None, module) -> str | None:
    """Why the module `rule` selected cannot be sharded exactly (None: it can)."""
    if rule is None:
        return "a layer vaeshard does not know"
    if rule.treatment == REFUSED:
        return rule.reason
    return None if rule.check is None else rule.check(module)


# Rules most families share: modules that are per pixel, or containers whose coupling lies in children.
def local(*classes: str, **selection) -> Rule:
    return Rule(classes, LOCAL, **selection)


CONTAINERS = local("ModuleList", "Sequential", "Identity", "Dropout")


def same_conv_problem(conv) -> str | None:
    """Why a convolution's own padding cannot become halo rows (None: it can): it must be 'same'
    (odd kernel, padding (k - 1) / 2) and undilated over the spatial axes, stride 1, zero-padded."""
    spatial = slice(-2, None)
    same = all(k == 2 * p + 1 for k, p in zip(conv.kernel_size[spatial], _spatial_padding(conv)))
    if conv.stride[spatial] != (1, 1) or conv.dilation[spatial] != (1, 1) or conv.padding_mode != "zeros" or not same:
        return "a convolution that is not stride-1, undilated, zero-padded 'same'"
    return None


def _spatial_padding(conv) -> tuple[int, int]:
    """(height, width) padding of a convolution: its `padding`, or for a layer that pads itself by an
    F.pad tuple `_padding` (w_left, w_right, h_top, h_bottom, ...) the top and left entries."""
    own = getattr(conv, "_padding", None)
    if own is not None and not any(conv.padding):
        return own[2], own[0]
    return tuple(conv.padding[-2:])


def pointwise_problem(conv) -> str | None:
    """None for a 1x1(x1) convolution of stride 1 without padding (per pixel), else why not."""
    if any(k != 1 for k in conv.kernel_size) or any(s != 1 for s in conv.stride) or any(conv.padding):
        return "a convolution other than 1x1x1" if len(conv.kernel_size) == 3 else "a convolution other than 1x1"
    return None


def padded(conv) -> bool:
    """Whether a convolution pads the spatial axes itself (its `padding`)."""
    return any(conv.padding[-2:])


def channel_norm_problem(norm) -> str | None:
    """None for a Wan-style RMS norm over the channels (`channel_first`), else why not."""
    return None if norm.channel_first else "an RMS norm over the last axis rather than the channels"


class Family(ABC):
    """A family of diffusers VAE classes (e.g. Wan's, for Wan 2.1 and 2.2).

    Declared (class attributes): `name`, the diffusers `classes`, `latent_ndim` (5 for
    (B, C, T, H, W), 4 for (B, C, H, W)), which strategies each op supports, and `frame_loop`: the
    decoder runs frame by frame with a causal cache (frames_per_step and CUDA graphs apply);
    `streams_steps`: `stream_decode` yields once per decoder step;
    `fast_tier`: the fast tier serves the family's layers (else requests run diffusers' layers);
    `frame_loop_graphs`: its frame loop may replay CUDA graphs (runtime/graphs.py); `layer_parts`:
    its fast layers take a call's frames in parts. `norm_into_conv`: which norm + SiLU writes into
    which padding convolution's input buffer in the fast tier (fast/producers.py `NormIntoConv`).
    `mirrors`: the diffusers functions the family's code (and the layers it installs) re-implements.
    `shard_plan`: each module's treatment when the feature maps are sharded (`ShardPlan`).
    """

    shard_plan: ShardPlan | None = None
    # -- facts: every fact about the family's classes and configs lives here, in the family --------
    # name -> (diffusers class name, constructor arguments): the real configs (the command line's
    # `--config` names, built with random weights)
    configs: dict[str, tuple[str, dict]] = {}
    # name -> (diffusers class name, constructor arguments): tiny configs with every kind of layer of
    # the real ones, which the tests build (tests/models.py)
    test_configs: dict[str, tuple[str, dict]] = {}

    @abstractmethod
    def shape_facts(self, class_name: str, config: dict) -> ShapeFacts:
        """The latent and sample shapes of `class_name` built with `config` (every constructor argument:
        `vaeshard.shape_facts` fills in the class's defaults), read from the config alone."""

    mirrors: tuple[Mirror, ...] = ()
    # the arguments diffusers' decode / encode take between the tensor and `return_dict`, in order
    # (LTX-Video: the decoder's timestep `temb`): a request passes them on (`request_inputs`)
    call_inputs: dict[str, tuple[str, ...]] = {}
    name: str
    classes: tuple[str, ...]
    latent_ndim: int
    tile_decode: bool = True
    # why `tile` is refused where diffusers has a tiled path vaeshard does not reproduce (None: it has none)
    no_tile_reason: str | None = None
    tile_encode: bool = True
    spatial_decode: bool = False
    spatial_encode: bool = False
    frame_loop: bool = False
    # the frame loop replays its steady calls as CUDA graphs where the plan says so (Wan's); else eager
    frame_loop_graphs: bool = True
    # the fast tier's layers take a call's frames in parts (max_layer_frames, tuning.PART_FRAMES: Wan's)
    layer_parts: bool = True
    # `stream_decode` yields once per decoder step (the decoder has a frame loop it can be cut at)
    streams_steps: bool = False
    # the fast tier (kernels, channels-last, fused norms) serves this family's layers, measured faster
    # than diffusers' own on the GPU (BENCHMARKS.md); otherwise every request runs diffusers' layers
    # (tuning.NORM_INTO_CONV_ONLY_FAMILIES: only requests that set FastOptions(norm_into_conv=True))
    fast_tier: bool = False
    # `auto`'s tiled decode in the fast tier runs a rank's tiles of one shape in batches
    # (TileOps.run_many: MiniMax-H3's ViT); `tile` and `exact=True` run them one at a time, bit for bit
    fast_tiles: bool = False
    # what the fast tier runs in place of a diffusers layer beyond the plan's own choices, (layer, what)
    # pairs that `plan().explain()` lists under the tier
    fast_notes: tuple[tuple[str, str], ...] = ()
    # norms that write silu(norm(x)) into the next convolution's padded input (fast/producers.py), linked
    # at install; a request runs them where its plan says (FastPlan.norm_into_conv)
    norm_into_conv: tuple[producers.NormIntoConv, ...] = ()

    @abstractmethod
    def latent_channels(self, vae) -> int:
        """Channels of a latent this VAE decodes (C)."""

    @abstractmethod
    def decode_tile_ops(self, vae, z) -> TileOps | None:
        """diffusers' tile grid of `z` and the per-tile decode, or None where the latent is one tile
        (diffusers then decodes it directly)."""

    @abstractmethod
    def encode_tile_ops(self, vae, x) -> TileOps | None:
        """The same for encoding the sample `x` (in sample coordinates)."""

    @abstractmethod
    def untiled_decode(self, vae, z) -> torch.Tensor:
        """diffusers' untiled decode of `z` (a sharded request runs it on each rank's slice)."""

    @abstractmethod
    def untiled_encode(self, vae, x) -> torch.Tensor:
        """diffusers' untiled encode of `x`: the moments (mean and logvar stacked on channels)."""

    def encode_prepare(self, vae, x) -> torch.Tensor:
        """`x` in encoder coordinates (e.g. patchified); most families take it as it is."""
        return x

    def own_reason(self, vae, op: str) -> tuple[str, str]:
        """Where `own_result` is "own": what the VAE's own `op` is, and what to set for a result vaeshard
        spreads over ranks (`auto`'s plan and its warning say both)."""
        return (
            "frame-wise (tiled in time)",
            "Set vae.use_framewise_decoding = vae.use_framewise_encoding = False for spatial shards (diffusers' "
            "untiled result), or vae.enable_tiling() for tiles (diffusers' tiled result)",
        )

    def own_result(self, vae, op: str, shape) -> str:
        """What the VAE's own `op` (its `decode` / `encode` as configured) computes for an input of
        `shape` (the family's layout): "untiled" (its untiled result, which the spatial modes give),
        "tile" (its tiled one, which vaeshard's `tile` gives bit for bit) or "own" (neither: only its
        own call gives it, such as diffusers' frame-wise tiling in time where the family's tile grid
        does not follow it). `auto` keeps to it (docs/strategies.md)."""
        if getattr(vae, FRAMEWISE[op], False):
            return "own"
        if not getattr(vae, "use_tiling", False):
            return "untiled"
        probe = torch.empty(shape, device="meta")
        ops = self.decode_tile_ops(vae, probe) if op == "decode" else self.encode_tile_ops(vae, probe)
        return "untiled" if ops is None else "tile"  # diffusers decodes a single tile directly

    def memory_note(self, vae, shape, world: int, strategy: str, op: str) -> str | None:
        """What memory a rank needs beyond its share of the feature maps for this plan, where the family
        knows of more (a gather of keys and values across ranks), as one line for `explain()`; None:
        nothing beyond it."""
        return None

    def direct_decode(self, vae, z) -> torch.Tensor:
        """One rank's whole decode: the VAE's own `decode` unless the family runs its own loop."""
        return type(vae).decode(vae, z, return_dict=False, **request_inputs())[0]

    def direct_encode(self, vae, x) -> torch.Tensor:
        """One rank's whole encode with the VAE's own settings, as `untiled_encode` returns it (the
        moments of diffusers' latent distribution)."""
        return type(vae).encode(vae, x, return_dict=False, **request_inputs())[0].parameters

    def encode_output(self, result: torch.Tensor | None, return_dict: bool):
        """What `vae.encode` returns for an encode's `result` (None on a rank that receives nothing):
        diffusers' AutoencoderKLOutput of the latent distribution of the moments."""
        from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution
        from diffusers.models.modeling_outputs import AutoencoderKLOutput

        posterior = None if result is None else DiagonalGaussianDistribution(result)
        return AutoencoderKLOutput(latent_dist=posterior) if return_dict else (posterior,)

    def stream_decode(self, vae, z, whole: bool):
        """The decode of `z` as (number of chunks, an iterator of the chunks): each final (what the
        decode returns for those frames) as soon as the decoder has made it, in frame order, their
        concatenation the decode bit for bit. `whole`: `z` is a direct request's whole latent (the
        family's `direct_decode`, with the VAE's own tiling and hooks); else a rank's slice of a
        sharded one (`untiled_decode`). The count is the same on every rank of a request (ranks that
        do not decode read it without iterating). None: no frame loop there; the stream yields once."""
        return None

    def call_arguments(self, op: str, args: tuple, kwargs: dict) -> tuple[dict, bool]:
        """(the inputs of `call_inputs[op]` given, return_dict) of a call `vae.<op>(x, *args, **kwargs)`
        with diffusers' signature; TypeError for an argument diffusers' method does not take."""
        names = (*self.call_inputs.get(op, ()), "return_dict")
        if len(args) > len(names):
            raise TypeError(f"{op}() takes at most {len(names) + 1} positional arguments ({len(args) + 1} given)")
        given = dict(zip(names, args))
        for key, value in kwargs.items():
            if key not in names or key in given:
                raise TypeError(f"{op}() got an unexpected or repeated argument {key!r}")
            given[key] = value
        return_dict = bool(given.pop("return_dict", True))
        return {k: v for k, v in given.items() if v is not None}, return_dict

    def draws_noise(self, vae) -> bool:
        """Whether this VAE's decode draws from the global RNG or a generator (LTX's decoder noise):
        every rank must then hold the same RNG state, which the request agreement checks; after a
        decode only rank 0 ran, every rank takes rank 0's RNG states (api.py)."""
        return False

    def install_layers(self, vae) -> ShardReport | None:
        """Swap in request-aware layers (halo, fast tier) by the family's `shard_plan`; idempotent.
        Raises ValueError, before swapping anything, for a VAE with layers it cannot shard. Returns
        what it swapped (None: the family declares no plan and swaps nothing)."""
        if self.shard_plan is None:
            return None
        report = apply_plan(self.shard_plan, vae)
        if self.norm_into_conv:
            producers.link(vae, self.norm_into_conv)
        return report

    def shard_report(self, vae) -> ShardReport | None:
        """What `install_layers` would swap and each module's treatment, swapping nothing; raises as
        it would."""
        return None if self.shard_plan is None else apply_plan(self.shard_plan, vae, install=False)

    def uninstall_layers(self, vae) -> None:
        """Undo `install_layers`: by default every swapped module of the VAE gets its class back."""
        for module in vae.modules():
            unswap(module)
            producers.unlink(module)

    def release(self, vae) -> None:
        """Drop request scratch the model keeps between calls (e.g. feature caches)."""

    def decode_axis(self, vae, ranks: int, device: torch.device) -> str | None:
        """`auto`'s measured refinement: "height" or "width" for a spatially sharded decode over
        `ranks` ranks on `device`, where it measured faster than the baseline rule's pick (the longer
        axis; docs/tuning.md); None: the baseline rule."""
        return None

    def min_shard_rows(self, vae) -> int:
        """The fewest latent rows (or columns) a rank of a spatially sharded request may hold: a halo
        comes from the neighbouring rank only, so a convolution at the latent's resolution that needs
        more halo rows than a slice has (DC-AE's 5x5) needs wider slices. 1 for most families."""
        return 1

    def spatial_ratio(self, vae) -> int:
        """Sample pixels per latent pixel along each spatial axis."""
        return vae.spatial_compression_ratio

    def supports(self, op: str, strategy: str) -> bool:
        if strategy == "direct":
            return True
        if strategy == "tile":
            return self.tile_decode if op == "decode" else self.tile_encode
        return self.spatial_decode if op == "decode" else self.spatial_encode

    @property
    def layout(self) -> str:
        return "(B, C, T, H, W)" if self.latent_ndim == 5 else "(B, C, H, W)"


def request_inputs() -> dict:
    """The current request's extra inputs (Family.call_inputs) by name; empty outside one."""
    request = requests.current()
    return {} if request is None else dict(request.inputs)


@contextlib.contextmanager
def passing_inputs(values: dict):
    """Make `values` the extra inputs of the request run inside (reset afterwards)."""
    with requests.scoped(inputs=dict(values)):
        yield


def inputs_of_sample(values: dict, index: int, batch: int) -> dict:
    """The inputs of sample `index` of a batch of `batch` decoded one at a time (the VAE's slicing):
    a tensor with one entry per sample is cut to that sample's; anything else is shared."""
    return {
        k: v[index : index + 1] if isinstance(v, torch.Tensor) and v.ndim and v.shape[0] == batch > 1 else v
        for k, v in values.items()
    }


def concat_extent(tiles_along, keep: int, scale_out) -> int:
    """The extent of diffusers' concatenation of tiles (start, end) each cut to `keep` output rows,
    `scale_out` mapping an input extent to the output's; diffusers never crops the result."""
    return sum(min(keep, scale_out(t1 - t0)) for t0, t1 in tiles_along)


def concatenated_tile_ops(vae, x, tile, stride, blend, keep, scale_out, run, out_shape) -> TileOps:
    """diffusers' tiled loop of the VAEs that concatenate their blended tiles without a final crop
    (the SD and FLUX image VAE, HunyuanVideo 1.5, CogVideoX): tiles of `tile` every `stride` over `x`'s last two
    axes, blended with the VAE's `blend_v` / `blend_h` over `blend` and cut to `keep` (each a (rows,
    cols) pair); `scale_out` maps an input extent to a finished tile's, `run` decodes (encodes) one."""
    height, width = x.shape[-2:]
    rows = [(h, min(h + tile[0], height)) for h in range(0, height, stride[0])]
    cols = [(w, min(w + tile[1], width)) for w in range(0, width, stride[1])]
    grid = TileGrid.regular(
        height,
        width,
        tile[0],
        tile[1],
        stride[0],
        stride[1],
        blend_rows=blend[0],
        blend_cols=blend[1],
        keep_rows=keep[0],
        keep_cols=keep[1],
        out_rows=concat_extent(rows, keep[0], scale_out),
        out_cols=concat_extent(cols, keep[1], scale_out),
    )
    return TileOps(
        grid=grid,
        source=x,
        run=run,
        blend_v=vae.blend_v,
        blend_h=vae.blend_h,
        finish=lambda merged: merged,
        out_shape=out_shape,
        out_dtype=x.dtype,
    )


def strided_decode_grid(vae, rows: int, cols: int, ratio: int, patch: int = 1) -> TileGrid:
    """The decode grid of diffusers' video VAEs that tile by sample size and stride (Wan, Qwen-Image,
    LTX; their `tiled_decode`): latent tiles of `tile_sample_min_* // ratio` every
    `tile_sample_stride_* // ratio` over `rows` x `cols`, blended over the sample tile less its stride
    and cut to the stride, both in units of `patch` (Wan 2.2's patchified output)."""
    keep_h, keep_w = vae.tile_sample_stride_height // patch, vae.tile_sample_stride_width // patch
    return TileGrid.regular(
        rows,
        cols,
        vae.tile_sample_min_height // ratio,
        vae.tile_sample_min_width // ratio,
        vae.tile_sample_stride_height // ratio,
        vae.tile_sample_stride_width // ratio,
        blend_rows=vae.tile_sample_min_height // patch - keep_h,
        blend_cols=vae.tile_sample_min_width // patch - keep_w,
        keep_rows=keep_h,
        keep_cols=keep_w,
        out_rows=rows * ratio // patch,
        out_cols=cols * ratio // patch,
    )


def strided_encode_grid(vae, rows: int, cols: int, ratio: int) -> TileGrid:
    """The encode grid of diffusers' video VAEs that tile by sample size and stride (Wan, Qwen-Image,
    LTX; their `tiled_encode`): sample tiles of `tile_sample_min_*` every `tile_sample_stride_*` over
    `rows` x `cols`, blended over the latent tile less its stride and cut to the stride, `ratio`
    sample pixels per latent pixel; the latent is `rows // ratio` x `cols // ratio`."""
    tile_lh, tile_lw = vae.tile_sample_min_height // ratio, vae.tile_sample_min_width // ratio
    keep_h, keep_w = vae.tile_sample_stride_height // ratio, vae.tile_sample_stride_width // ratio
    return TileGrid.regular(
        rows,
        cols,
        vae.tile_sample_min_height,
        vae.tile_sample_min_width,
        vae.tile_sample_stride_height,
        vae.tile_sample_stride_width,
        blend_rows=tile_lh - keep_h,
        blend_cols=tile_lw - keep_w,
        keep_rows=keep_h,
        keep_cols=keep_w,
        out_rows=rows // ratio,
        out_cols=cols // ratio,
    )


def frames_out(num_frames: int, temporal_factor: int) -> int:
    """Causal video VAEs decode the first latent frame to one frame and each later one to `factor`."""
    return 1 + (num_frames - 1) * temporal_factor if num_frames > 0 else 0


def with_tiling_off(vae, fn, *args):
    """Run `fn` with the VAE's own tiling and slicing switched off (restored afterwards)."""
    tiling, slicing = getattr(vae, "use_tiling", False), getattr(vae, "use_slicing", False)
    vae.use_tiling, vae.use_slicing = False, False
    try:
        with torch.no_grad():
            return fn(*args)
    finally:
        vae.use_tiling, vae.use_slicing = tiling, slicing


__all__ = [
    "CONTAINERS",
    "FAST",
    "GLOBAL_NORM",
    "HALO",
    "LOCAL",
    "REFUSED",
    "WHOLE_MAP",
    "Family",
    "Layer",
    "Rule",
    "ShardPlan",
    "ShardReport",
    "apply_plan",
    "class_name",
    "local",
    "padded",
    "pointwise_problem",
    "same_conv_problem",
    "Mirror",
    "ShapeFacts",
    "TileOps",
    "concat_extent",
    "concatenated_tile_ops",
    "frames_out",
    "inputs_of_sample",
    "passing_inputs",
    "request_inputs",
    "source_hash",
    "strided_decode_grid",
    "strided_encode_grid",
    "with_tiling_off",
]
