"""CogVideoX (diffusers `AutoencoderKLCogVideoX`: CogVideoX 1.0 and 1.5, ConsisID).

Latents are 5-D (B, C, T, H, W), 8x spatial and 4x temporal compression in the real config
(CogVideoX 1.5 changes only `scaling_factor` and `invert_scale_latents`, which the pipeline applies:
the same layers). diffusers' `_decode` / `_encode` run the decoder on batches of 2 latent frames
(the encoder on 8 sample frames), threading a per-layer `conv_cache` of the previous batch's last
input frames through every causal convolution; `tiled_decode` / `tiled_encode` run that same frame
loop inside each spatial tile. So `tile` is diffusers' tile grid with each tile's frame loop (its
`_decode` / `_encode` with tiling off) spread over ranks, and a sharded request runs `_decode` /
`_encode` on each rank's rows with leaf layers swapped, every rank keeping the conv caches of its own
rows:

- `CogVideoXCausalConv3d` (constant mode: time padded from the cache or the first frame, per pixel):
  left as it is; its child `CogVideoXSafeConv3d` takes halo rows in place of its spatial zero padding
  and keeps diffusers' time chunks (layers/halo.py HaloSafeConv3d). One with a one-frame time kernel
  keeps no cache (`UncachedOneFrameCausalConv3d`, in every mode and tier: bit for bit the same);
- every `nn.GroupNorm` (the encoder's resnets and `norm_out`; the decoder's `CogVideoXSpatialNorm3D`,
  whose statistics span a frame batch) -> whole-map statistics (layers/norms.py);
- `CogVideoXSpatialNorm3D`'s conditioning: nearest interpolation of the decoder's input latent to the
  feature map (first frame apart). Each rank interpolates its own latent rows to its own feature
  rows, which are the whole map's rows of that slice: the feature map is the latent times 2^k, and
  nearest interpolation by a power of two maps output row r to input row r >> k on a slice as on
  the whole (tests check it on vaeshard's splits); its 1x1x1 convolutions are per pixel;
- `CogVideoXUpsample3D`: nearest 2x (time too where it compresses time): local to whole latent rows;
  its 3x3 Conv2d takes halo rows (layers/convs.py HaloConv2d);
- `CogVideoXDownsample3D` (encoder): the time average is per pixel; its inline (0, 1, 0, 1) zero pad
  before the 3x3 stride-2 Conv2d takes the next rank's first row instead (layers/halo.py HaloInlinePadConv2d):
  exact, since shards of whole latent rows start on even rows at every level;
- SiLU, dropout, the 1x1x1 shortcuts and quant convolutions: per pixel.

The VAE has no attention. Every other layer is refused before anything is swapped.

Fast tier (`NORM_INTO_CONV`, fast/producers.py, where the plan's `norm_into_conv` says): each
SpatialNorm3D (decoder) and GroupNorm (encoder) writes silu(norm) into the next causal convolution's
padded input, which copies the cache diffusers' frame loop hands it in front
(fast/causal_conv.py `ProducedHandedCacheConv3d`) and returns the next one as diffusers keeps it.
"""

from __future__ import annotations

import math

from ..fast.causal_conv import ProducedHandedCacheConv3d
from ..fast.producers import GlobalGroupNormIntoConv, NormIntoConv, SiLUAfterProducer, SpatialNormSiLUIntoConv
from ..fast.residual_blocks import CogVideoXResnet
from ..layers.convs import HaloConv2d
from ..layers.halo import HaloInlinePadConv2d, HaloSafeConv3d
from ..runtime.tile import TileOps
from .base import (
    CONTAINERS,
    GLOBAL_NORM,
    HALO,
    LOCAL,
    Family,
    Layer,
    Mirror,
    Rule,
    ShapeFacts,
    ShardPlan,
    concatenated_tile_ops,
    local,
    padded,
    pointwise_problem,
    with_tiling_off,
)


def latent_channels(vae) -> int:
    return vae.config.latent_channels


def _upsamplers(vae) -> list:
    return [u for b in vae.decoder.up_blocks for u in (b.upsamplers or ())]


def _downsamplers(vae) -> list:
    return [d for b in vae.encoder.down_blocks for d in (b.downsamplers or ())]


def _frame_batches(frames: int, size: int) -> list[int]:
    """The frame counts of diffusers' `_decode` / `_encode` batches of `size` (the remainder goes to
    the first batch)."""
    rest = frames % size
    counts = []
    for k in range(max(frames // size, 1)):
        start = size * k + (0 if k == 0 else rest)
        counts.append(min(size * (k + 1) + rest, frames) - start)
    return counts


def _decoded_frames(vae, frames: int) -> int:
    """Output frames of a latent of `frames` frames: each batch through every upsampler that
    compresses time (one frame stays one; an odd count keeps its first frame and doubles the rest)."""
    total = 0
    for t in _frame_batches(frames, vae.num_latent_frames_batch_size):
        for up in _upsamplers(vae):
            if up.compress_time and t > 1:
                t = 1 + 2 * (t - 1) if t % 2 else 2 * t
        total += t
    return total


def _encoded_frames(vae, frames: int) -> int:
    """Latent frames of a sample of `frames` frames: each batch through every downsampler that
    compresses time (an odd count keeps its first frame and averages the rest in pairs)."""
    total = 0
    for t in _frame_batches(frames, vae.num_sample_frames_batch_size):
        for down in _downsamplers(vae):
            if down.compress_time:
                t = 1 + (t - 1) // 2 if t % 2 else t // 2
        total += t
    return total


def _encoded_extent(vae, n: int) -> int:
    # each downsampler pads one row after and runs a 3x3 stride-2 convolution
    for _ in _downsamplers(vae):
        n = (n + 1 - 3) // 2 + 1
    return n


def _tile_ops(vae, x, tile_in, stride, blend, keep, scale_out, run, out_shape) -> TileOps:
    """diffusers' grid over `x`: tiles of `tile_in` (rows, cols) every `stride`, blended over `blend`
    and cut to `keep`, concatenated unclipped."""
    for what, value in (("stride", stride), ("kept extent", keep)):
        if min(value) <= 0:
            raise ValueError(
                f"AutoencoderKLCogVideoX's tile settings give a tile {what} of {value}: diffusers' tiled loop "
                "cannot run; raise tile_sample_min_height / _width (the latent tile is that over the spatial ratio)"
            )
    return concatenated_tile_ops(vae, x, tile_in, stride, blend, keep, scale_out, run, out_shape)


def decode_tile_ops(vae, z):
    """diffusers' `tiled_decode`: latent tiles of `tile_latent_min_*` every `int(tile_latent_min_* *
    (1 - overlap_*))`, each decoded by the frame loop of `_decode`, blended over `int(tile_sample_min_*
    * overlap_*)` sample rows and cut to the rest of `tile_sample_min_*`."""
    _, _, _, height, width = z.shape
    if not (width > vae.tile_latent_min_width or height > vae.tile_latent_min_height):
        return None  # diffusers' _decode does not tile this latent
    up = 2 ** len(_upsamplers(vae))
    blend = (
        int(vae.tile_sample_min_height * vae.tile_overlap_factor_height),
        int(vae.tile_sample_min_width * vae.tile_overlap_factor_width),
    )
    channels = vae.decoder.conv_out.conv.out_channels
    return _tile_ops(
        vae,
        z,
        (vae.tile_latent_min_height, vae.tile_latent_min_width),
        (
            int(vae.tile_latent_min_height * (1 - vae.tile_overlap_factor_height)),
            int(vae.tile_latent_min_width * (1 - vae.tile_overlap_factor_width)),
        ),
        blend,
        (vae.tile_sample_min_height - blend[0], vae.tile_sample_min_width - blend[1]),
        lambda n: n * up,
        lambda tile: untiled_decode(vae, tile),
        lambda s: (s[0], channels, _decoded_frames(vae, s[2]), s[3] * up, s[4] * up),
    )


def encode_tile_ops(vae, x):
    """diffusers' `tiled_encode`: sample tiles of `tile_sample_min_*` every `int(tile_sample_min_* *
    (1 - overlap_*))`, each encoded by the frame loop of `_encode`, blended over `int(tile_latent_min_*
    * overlap_*)` latent rows and cut to the rest of `tile_latent_min_*`."""
    _, _, _, height, width = x.shape
    if not (width > vae.tile_sample_min_width or height > vae.tile_sample_min_height):
        return None  # diffusers' _encode does not tile this sample
    blend = (
        int(vae.tile_latent_min_height * vae.tile_overlap_factor_height),
        int(vae.tile_latent_min_width * vae.tile_overlap_factor_width),
    )
    last = vae.quant_conv if vae.quant_conv is not None else vae.encoder.conv_out.conv
    channels = last.out_channels
    return _tile_ops(
        vae,
        x,
        (vae.tile_sample_min_height, vae.tile_sample_min_width),
        (
            int(vae.tile_sample_min_height * (1 - vae.tile_overlap_factor_height)),
            int(vae.tile_sample_min_width * (1 - vae.tile_overlap_factor_width)),
        ),
        blend,
        (vae.tile_latent_min_height - blend[0], vae.tile_latent_min_width - blend[1]),
        lambda n: _encoded_extent(vae, n),
        lambda tile: untiled_encode(vae, tile),
        lambda s: (s[0], channels, _encoded_frames(vae, s[2]), _encoded_extent(vae, s[3]), _encoded_extent(vae, s[4])),
    )


def untiled_decode(vae, z):
    """diffusers' `_decode` (its frame loop) with tiling off: also the per-tile run of `tiled_decode`."""
    return with_tiling_off(vae, lambda: vae._decode(z, return_dict=False)[0]).contiguous()


def stream_decode(vae, z, whole: bool):
    """`_decode`'s frame batches as they are decoded (Family.stream_decode); None where a direct
    request runs the VAE's own decode: it tiles this latent or a hook wraps `decode`."""
    _, _, frames, height, width = z.shape
    tiles = vae.use_tiling and (width > vae.tile_latent_min_width or height > vae.tile_latent_min_height)
    if whole and (tiles or hasattr(vae, "_hf_hook")):
        return None
    counts = _frame_batches(frames, vae.num_latent_frames_batch_size)
    return len(counts), _decoded_batches(vae, z, counts)


def _decoded_batches(vae, z, counts: list[int]):
    """diffusers' `_decode` loop without its final `torch.cat`: each batch's frames as decoded, the
    decoder's conv cache carried to the next (dropped when the stream is closed)."""
    conv_cache, start = None, 0
    for count in counts:
        part = z[:, :, start : start + count]
        start += count
        if vae.post_quant_conv is not None:
            part = vae.post_quant_conv(part)
        part, conv_cache = vae.decoder(part, conv_cache=conv_cache)
        yield part.contiguous()
        del part


def untiled_encode(vae, x):
    """diffusers' `_encode` (its frame loop) with tiling off: also the per-tile run of `tiled_encode`."""
    return with_tiling_off(vae, lambda: vae._encode(x)).contiguous()


# -- spatial shard ----------------------------------------------------------------------------------


def _causal_conv_problem(module) -> str | None:
    conv = module.conv
    same = all(k == 2 * p + 1 for k, p in zip(conv.kernel_size[1:], conv.padding[1:]))
    if (
        module.pad_mode == "replicate"
        or conv.stride != (1, 1, 1)
        or conv.dilation != (1, 1, 1)
        or conv.padding[0]
        or conv.padding_mode != "zeros"
        or not same
    ):
        return "a causal convolution that is not stride-1, undilated, zero-padded 'same'"
    return None


def _conv3x3(stride: int, padding: int):
    def problem(conv) -> str | None:
        if (
            conv.kernel_size != (3, 3)
            or conv.stride != (stride, stride)
            or conv.padding != (padding, padding)
            or conv.dilation != (1, 1)
            or conv.padding_mode != "zeros"
        ):
            return f"not the 3x3 stride-{stride} zero-padded convolution diffusers builds there"
        return None

    return problem


class UncachedOneFrameCausalConv3d:
    """Mixin for `CogVideoXCausalConv3d` in its constant mode with a time kernel of one frame (the 1x1x1
    convolutions of CogVideoX's SpatialNorm3D). diffusers returns `inputs[:, :, -time_kernel_size + 1:]
    .clone()` as the next call's cache: for one frame that slice is the whole input, cloned, and a
    one-frame kernel never reads a cache. This returns no cache instead, in either tier: the same
    outputs bit for bit, without a copy of each such input kept alive until the next frame batch."""

    def forward(self, inputs, conv_cache=None):
        if self.time_kernel_size == 1 and self.pad_mode != "replicate":
            return self.conv(inputs), None
        return super().forward(inputs, conv_cache)


def _one_frame_in_time(module) -> bool:
    """Whether a `CogVideoXCausalConv3d` has a time kernel of one frame and pads with zeros."""
    return module.time_kernel_size == 1 and module.pad_mode != "replicate"


# Which norm writes into which causal convolution's padded input in the fast tier (fast/producers.py),
# through which SiLU module: diffusers' forwards of these blocks (mirrored below) pass the norm's output
# only through that SiLU (and an eval-mode dropout) to that convolution. The decoder's norms are
# CogVideoXSpatialNorm3D (conditioned on the latent), the encoder's nn.GroupNorm.
NORM_INTO_CONV = (
    NormIntoConv("CogVideoXResnetBlock3D", "norm1", "nonlinearity", "conv1"),
    NormIntoConv("CogVideoXResnetBlock3D", "norm2", "nonlinearity", "conv2"),
    NormIntoConv("CogVideoXDecoder3D", "norm_out", "conv_act", "conv_out"),
    NormIntoConv("CogVideoXEncoder3D", "norm_out", "conv_act", "conv_out"),
)


# Encoder, decoder and the quant convs (the module docstring says why each is exact).
# CogVideoXCausalConv3d (constant mode) -> local (time padded from its cache, per pixel), its
# CogVideoXSafeConv3d child takes halo rows; nn.GroupNorm -> whole-map statistics;
# CogVideoXUpsample3D's 3x3 Conv2d -> halo rows; CogVideoXDownsample3D's 3x3 stride-2 Conv2d -> the
# next rank's first row for the inline zero pad; other CogVideoXSafeConv3d (shortcuts, quant convs) must
# be 1x1x1; the containers and per-pixel leaves -> local.
SHARD_PLAN = ShardPlan(
    roots=("encoder", "decoder", "quant_conv", "post_quant_conv"),
    rules=(
        Rule(
            "CogVideoXCausalConv3d",
            LOCAL,
            UncachedOneFrameCausalConv3d,
            when=_one_frame_in_time,
            check=_causal_conv_problem,
            layer=Layer(padding="zeros"),
        ),
        Rule(
            "CogVideoXCausalConv3d",
            LOCAL,
            ProducedHandedCacheConv3d,
            check=_causal_conv_problem,
            layer=Layer(padding="zeros", cache=True),
        ),
        Rule("CogVideoXSafeConv3d", HALO, HaloSafeConv3d, parent="CogVideoXCausalConv3d", when=padded),
        Rule("CogVideoXSafeConv3d", LOCAL, parent="CogVideoXCausalConv3d"),  # unpadded in space: per pixel
        Rule(("CogVideoXSafeConv3d", "Conv3d"), LOCAL, check=pointwise_problem),
        Rule("Conv2d", HALO, HaloConv2d, parent="CogVideoXUpsample3D", check=_conv3x3(stride=1, padding=1)),
        Rule("Conv2d", HALO, HaloInlinePadConv2d, parent="CogVideoXDownsample3D", check=_conv3x3(stride=2, padding=0)),
        Rule("GroupNorm", GLOBAL_NORM, GlobalGroupNormIntoConv, layer=Layer(norm="group")),
        Rule("CogVideoXSpatialNorm3D", LOCAL, SpatialNormSiLUIntoConv),
        Rule("SiLU", LOCAL, SiLUAfterProducer),
        local("CogVideoXEncoder3D", "CogVideoXDecoder3D", "CogVideoXDownBlock3D", "CogVideoXMidBlock3D"),
        Rule("CogVideoXResnetBlock3D", LOCAL, CogVideoXResnet),
        local("CogVideoXUpBlock3D", "CogVideoXUpsample3D", "CogVideoXDownsample3D"),
        CONTAINERS,
    ),
)


_COG = "diffusers.models.autoencoders.autoencoder_kl_cogvideox:"


class _CogVideoX(Family):
    name = "cogvideox"
    classes = ("AutoencoderKLCogVideoX",)
    # -- facts ----------------------------------------------------------------------------------
    configs = {"cogvideox": ("AutoencoderKLCogVideoX", {})}  # its defaults are CogVideoX's (1.0 and 1.5 share it)
    # every kind of layer of the real one (three levels: 4x spatial, 2x temporal; one resnet per
    # block); "cogvideox_layout": the real config's layout (four levels: 8x spatial, 4x temporal with
    # two time-compressing resamplers each way, 16 latent channels, three layers per block) at small
    # widths, for numerical checks at 8x. diffusers' tiles are half of sample_height / sample_width.
    test_configs = {
        "cogvideox": (
            "AutoencoderKLCogVideoX",
            {
                "block_out_channels": (8, 8, 16),
                "down_block_types": ("CogVideoXDownBlock3D",) * 3,
                "up_block_types": ("CogVideoXUpBlock3D",) * 3,
                "latent_channels": 4,
                "layers_per_block": 1,
                "norm_num_groups": 4,
                "temporal_compression_ratio": 2,
                "sample_height": 64,
                "sample_width": 80,
            },
        ),
        "cogvideox_layout": (
            "AutoencoderKLCogVideoX",
            {
                "block_out_channels": (8, 16, 16, 32),
                "down_block_types": ("CogVideoXDownBlock3D",) * 4,
                "up_block_types": ("CogVideoXUpBlock3D",) * 4,
                "latent_channels": 16,
                "layers_per_block": 3,
                "norm_num_groups": 4,
                "temporal_compression_ratio": 4,
                "sample_height": 128,
                "sample_width": 160,
            },
        ),
    }

    def shape_facts(self, class_name: str, config: dict) -> ShapeFacts:
        # a 2x upsampler after every up block but the last, compressing time on the first
        # log2(temporal ratio) of them; diffusers decodes the latent frames two at a time
        levels = len(config["block_out_channels"])
        time = int(math.log2(config["temporal_compression_ratio"]))
        return ShapeFacts(
            5, config["latent_channels"], 2 ** (levels - 1), 2 ** min(levels - 1, time), config["out_channels"],
            paired_frames=True,
        )  # fmt: skip

    mirrors = (
        Mirror(
            _COG + "AutoencoderKLCogVideoX.tiled_decode",
            "families/cogvideox.py decode_tile_ops, _tile_ops (per tile: _decode's frame loop)",
            "3603f0ab5c4bfa2b",
        ),
        Mirror(
            _COG + "AutoencoderKLCogVideoX.tiled_encode",
            "families/cogvideox.py encode_tile_ops, _tile_ops (per tile: _encode's frame loop)",
            "27795081fc5294e5",
        ),
        Mirror(
            _COG + "AutoencoderKLCogVideoX._decode",
            "families/cogvideox.py decode_tile_ops (when it tiles; its loop is tiled_decode's), _frame_batches, "
            "stream_decode, _decoded_batches (the loop, streamed)",
            "66ba211bf9ef8651",
        ),
        Mirror(
            _COG + "AutoencoderKLCogVideoX._encode",
            "families/cogvideox.py encode_tile_ops (when it tiles; its loop is tiled_encode's), _frame_batches",
            "62828496752c050d",
        ),
        Mirror(
            _COG + "CogVideoXSafeConv3d.forward",
            "layers/halo.py safe_conv3d",
            "e9cfcc39cf5c6cf3",
        ),
        Mirror(
            _COG + "CogVideoXCausalConv3d.forward",
            "layers/halo.py HaloSafeConv3d (time padding and cache local; spatial padding in the child)",
            "bae9401dabb7f044",
        ),
        Mirror(
            _COG + "CogVideoXCausalConv3d.fake_context_parallel_forward",
            "layers/halo.py HaloSafeConv3d (the cache holds no spatial padding)",
            "ef6a7f17d4baf334",
        ),
        Mirror(
            _COG + "CogVideoXSpatialNorm3D.forward",
            "families/cogvideox.py (nearest interpolation of the rank's latent rows is local); "
            "fast/producers.py SpatialNormSiLUIntoConv",
            "69d22683f0e3af2d",
        ),
        Mirror(
            _COG + "CogVideoXResnetBlock3D.forward",
            "families/cogvideox.py NORM_INTO_CONV (norm1 -> nonlinearity -> conv1, norm2 -> dropout -> conv2)",
            "4eb519d8b612bfa1",
        ),
        Mirror(
            _COG + "CogVideoXResnetBlock3D.forward",
            "fast/residual_blocks.py CogVideoXResnet (the residual added in conv2's bias pass)",
            "4eb519d8b612bfa1",
        ),
        Mirror(
            _COG + "CogVideoXDecoder3D.forward",
            "families/cogvideox.py NORM_INTO_CONV (norm_out -> conv_act -> conv_out)",
            "c198546781c64b7b",
        ),
        Mirror(
            _COG + "CogVideoXEncoder3D.forward",
            "families/cogvideox.py NORM_INTO_CONV (norm_out -> conv_act -> conv_out)",
            "f3567587ed73dac3",
        ),
        Mirror(
            "diffusers.models.upsampling:CogVideoXUpsample3D.forward",
            "families/cogvideox.py _decoded_frames; nearest 2x local, conv -> HaloConv2d",
            "437e3367153e8d7e",
        ),
        Mirror(
            "diffusers.models.downsampling:CogVideoXDownsample3D.forward",
            "layers/halo.py HaloInlinePadConv2d (the inline pad); families/cogvideox.py _encoded_*",
            "cee4ce635b34b404",
        ),
    )
    latent_ndim = 5
    spatial_decode = True
    spatial_encode = True
    streams_steps = True  # diffusers' frame batches
    latent_channels = staticmethod(latent_channels)
    decode_tile_ops = staticmethod(decode_tile_ops)
    encode_tile_ops = staticmethod(encode_tile_ops)
    untiled_decode = staticmethod(untiled_decode)
    untiled_encode = staticmethod(untiled_encode)
    stream_decode = staticmethod(stream_decode)
    shard_plan = SHARD_PLAN
    # the fast tier: the norms into the next convolutions (CUDA requests: tuning.FAST_TIER_SLOWER_FAMILIES)
    fast_tier = True
    layer_parts = False
    norm_into_conv = NORM_INTO_CONV

    def spatial_ratio(self, vae) -> int:
        return 2 ** len(_upsamplers(vae))


FAMILY = _CogVideoX()
