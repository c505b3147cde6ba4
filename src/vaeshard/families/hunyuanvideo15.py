"""HunyuanVideo 1.5 (diffusers `AutoencoderKLHunyuanVideo15`, also the HunyuanImage refiner's VAE).

Latents are 5-D (B, C, T, H, W), 16x spatial and 4x temporal compression in the real config. The
VAE is diffusers' own loops over whole clips (no causal frame cache), so `tile` is diffusers'
`tiled_decode` / `tiled_encode` cut into tiles spread over ranks, and a sharded request runs
diffusers' `_decode` / `_encode` on each rank's rows with leaf layers swapped:

- `HunyuanVideo15CausalConv3d` (replicate-padded causal 3x3x3): halo rows from the neighbours,
  the edge row repeated at the global edges (layers/halo.py);
- `HunyuanVideo15AttnBlock` (the mid-block attention, causal by frame): local queries against the
  keys and values of the whole frames each query frame may see, one frame's at a time, without
  diffusers' (T*H*W)^2 mask (layers/frame_causal_attention.py);
- per pixel and left as they are: the RMS norms (over channels), SiLU, 1x1x1 convolutions, and the
  up/downsamplers' pixel (un)shuffles and channel shortcuts (local: shards are whole latent rows).

The encoder is made of the same kinds of layer, so encode shards too.

Fast tier: the decode runs as a frame loop (fast/frame_loop.py, `LOOP`): the decoder's head (conv_in
with its channel-repeat shortcut, the mid block and its attention) over the whole clip at latent
resolution, then the up blocks, norm_out and conv_out one chunk of latent frames at a time, each
causal convolution caching the last two frames of its padded input (fast/causal_conv.py) and each
temporal upsampler upsampling the clip's first frame in space only in the first chunk alone
(`ChunkedUpsample`). Peak memory then follows the frames per call, not the clip's length. The
attention runs without diffusers' mask there too. The exact tier and `tile` run diffusers' decode.

Norms into convolutions (`NORM_INTO_CONV`, fast/producers.py; where the plan's `norm_into_conv` says):
each residual block's norm1 and norm2 and the decoder's and encoder's norm_out write silu(norm(x))
straight into the padded input buffer of the causal convolution after them (conv1, conv2,
conv_out), whose replicate padding and cached front frames are then filled in place; the SiLU
module between passes that output on. The norm rounds as diffusers' does (normalized in fp32, then
the dtype after each step; kernels/norm.py).
"""

from __future__ import annotations

import math

import torch

from ..fast import frame_loop
from ..fast.causal_conv import CachedReplicateCausalConv3d, loop_problem
from ..fast.producers import NormIntoConv, RMSNormSiLUIntoConv, SiLUAfterProducer
from ..fast.residual_blocks import HunyuanVideo15Resnet
from ..kernels.d2s_shortcut import d2s_add
from ..layers import tier as fast
from ..layers.frame_causal_attention import FAST_NOTE, FrameCausalAttention
from ..layers.halo import replicate_causal_problem
from .base import (
    CONTAINERS,
    FAST,
    HALO,
    LOCAL,
    WHOLE_MAP,
    Family,
    Layer,
    Mirror,
    Rule,
    ShapeFacts,
    ShardPlan,
    channel_norm_problem,
    concatenated_tile_ops,
    frames_out,
    local,
    pointwise_problem,
    with_tiling_off,
)


def latent_channels(vae) -> int:
    return vae.config.latent_channels


def _resamplers(blocks, attr: str, flag: str) -> list[bool]:
    """One entry per block that resamples (2x in height and width): whether it resamples time too."""
    return [bool(getattr(getattr(b, attr)[0], flag)) for b in blocks if getattr(b, attr, None) is not None]


def _ups(vae) -> list[bool]:
    return _resamplers(vae.decoder.up_blocks, "upsamplers", "add_temporal_upsample")


def _downs(vae) -> list[bool]:
    return _resamplers(vae.encoder.down_blocks, "downsamplers", "add_temporal_downsample")


def _decoded_frames(frames: int, ups: list[bool]) -> int:
    # a temporal upsampler turns the first frame into one and every later one into two
    return frames_out(frames, 2 ** sum(ups))


def _encoded_frames(frames: int, downs: list[bool]) -> int:
    # a temporal downsampler keeps the first frame and packs every two later ones into one
    for temporal in downs:
        frames = 1 + (frames - 1) // 2 if temporal else frames
    return frames


def _tile_ops(vae, x, tile_in: tuple[int, int], keep_out: int, blends: tuple[int, int], scale_out, run, out_shape):
    """diffusers' tile grid over `x`: tiles of `tile_in` (rows, cols) every `int(tile * (1 - overlap))`,
    blended over `blends` (rows, cols) and cut to `keep_out` (rows, cols), concatenated unclipped."""
    stride = tuple(int(t * (1 - vae.tile_overlap_factor)) for t in tile_in)
    return concatenated_tile_ops(vae, x, tile_in, stride, blends, keep_out, scale_out, run, out_shape)


def decode_tile_ops(vae, z):
    """diffusers' `tiled_decode`: latent tiles of `tile_latent_min_*` every `int(tile_latent_min_* *
    (1 - overlap))`, blended over `int(tile_sample_min_* * overlap)` sample rows, cut to the rest."""
    _, _, _, height, width = z.shape
    if not (width > vae.tile_latent_min_width or height > vae.tile_latent_min_height):
        return None  # diffusers' _decode does not tile this latent
    ups = _ups(vae)
    up = 2 ** len(ups)
    blend_h = int(vae.tile_sample_min_height * vae.tile_overlap_factor)
    blend_w = int(vae.tile_sample_min_width * vae.tile_overlap_factor)
    channels = vae.decoder.conv_out.conv.out_channels
    return _tile_ops(
        vae,
        z,
        (vae.tile_latent_min_height, vae.tile_latent_min_width),
        (vae.tile_sample_min_height - blend_h, vae.tile_sample_min_width - blend_w),
        (blend_h, blend_w),
        lambda n: n * up,
        vae.decoder,
        lambda s: (s[0], channels, _decoded_frames(s[2], ups), s[3] * up, s[4] * up),
    )


def encode_tile_ops(vae, x):
    """diffusers' `tiled_encode`: sample tiles of `tile_sample_min_*` every `int(tile_sample_min_* *
    (1 - overlap))`, blended over `int(tile_latent_min_* * overlap)` latent rows, cut to the rest."""
    _, _, _, height, width = x.shape
    if not (width > vae.tile_sample_min_width or height > vae.tile_sample_min_height):
        return None  # diffusers' _encode does not tile this sample
    downs = _downs(vae)
    stages = len(downs)
    blend_h = int(vae.tile_latent_min_height * vae.tile_overlap_factor)
    blend_w = int(vae.tile_latent_min_width * vae.tile_overlap_factor)
    channels = vae.encoder.conv_out.conv.out_channels
    return _tile_ops(
        vae,
        x,
        (vae.tile_sample_min_height, vae.tile_sample_min_width),
        (vae.tile_latent_min_height - blend_h, vae.tile_latent_min_width - blend_w),
        (blend_h, blend_w),
        lambda n: n >> stages,
        vae.encoder,
        lambda s: (s[0], channels, _encoded_frames(s[2], downs), s[3] >> stages, s[4] >> stages),
    )


def untiled_decode(vae, z):
    if fast.enabled():
        return with_tiling_off(vae, frame_loop.decode, LOOP, vae, z)
    return with_tiling_off(vae, lambda: vae._decode(z)).contiguous()


def direct_decode(vae, z):
    return frame_loop.direct_decode(vae, z, untiled_decode, _own_decode_runs)


def stream_decode(vae, z, whole: bool):
    return frame_loop.stream_decode(LOOP, vae, z, whole, _own_decode_runs)


def _own_decode_runs(vae, z) -> bool:
    """A direct request runs the VAE's own `decode`: its tiling tiles `z`, or a hook wraps `decode`."""
    _, _, _, height, width = z.shape  # diffusers' test in `_decode`
    tiles = vae.use_tiling and (width > vae.tile_latent_min_width or height > vae.tile_latent_min_height)
    return tiles or hasattr(vae, "_hf_hook")


# -- the fast tier's frame loop -----------------------------------------------------------------------


def _head(decoder, z):
    """`HunyuanVideo15Decoder3D.forward` up to the up blocks: the whole clip at latent resolution."""
    hidden_states = decoder.conv_in(z) + z.repeat_interleave(repeats=decoder.repeat, dim=1)
    return decoder.mid_block(hidden_states)


def _body(decoder, hidden_states):
    """The rest of `HunyuanVideo15Decoder3D.forward`, run on one chunk of latent frames."""
    for up_block in decoder.up_blocks:
        hidden_states = up_block(hidden_states)
    hidden_states = decoder.norm_out(hidden_states)
    hidden_states = decoder.conv_act(hidden_states)
    return decoder.conv_out(hidden_states)


# diffusers' `_decode` returns the decoder's output as it is (no clamp)
LOOP = frame_loop.FrameLoop(head=_head, body=_body, frames_out=lambda vae, t: _decoded_frames(t, _ups(vae)))


class ChunkedUpsample:
    """Mixin for `HunyuanVideo15Upsample` in the fast tier: the upsampled map and its channel-repeat
    shortcut made and added in one pass (kernels/d2s_shortcut.py, where it runs; else diffusers'
    steps). In a frame loop's later chunks, which hold no clip's first frame, every frame is
    upsampled as diffusers upsamples the frames after the first (time, then the channel-repeat
    shortcut); the first chunk (frame 0 alone) of a temporal upsampler, and the exact tier, run
    diffusers' forward."""

    def forward(self, x):
        temporal = self.add_temporal_upsample
        if not fast.enabled() or torch.is_grad_enabled() or (temporal and frame_loop.first_chunk()):
            return super().forward(x)
        factor_t = 2 if temporal else 1
        h = self.conv(x)
        out = d2s_add(h, x, factor_t, 2)
        if out is not None:
            return out
        h = self._dcae_upsample_rearrange(h, r1=factor_t, r2=2, r3=2)
        if temporal:  # diffusers' frames after the first
            shortcut = self._dcae_upsample_rearrange(x, r1=2, r2=2, r3=2).repeat_interleave(self.repeats, dim=1)
        else:
            shortcut = self._dcae_upsample_rearrange(x.repeat_interleave(self.repeats, dim=1), r1=1, r2=2, r3=2)
        return h + shortcut


def untiled_encode(vae, x):
    return with_tiling_off(vae, lambda: vae._encode(x)).contiguous()


# -- spatial shard ----------------------------------------------------------------------------------


def _causal_conv_problem(conv) -> str | None:
    if conv.conv.stride != (1, 1, 1):
        return "a strided causal convolution (its encoder downsamples by pixel unshuffle)"
    return replicate_causal_problem(conv) or loop_problem(conv)


# Which norm writes into which causal convolution's padded input in the fast tier, through which SiLU
# module (fast/producers.py): diffusers' forwards of these blocks (mirrored below) pass the norm's
# output only through that SiLU to that convolution.
NORM_INTO_CONV = (
    NormIntoConv("HunyuanVideo15ResnetBlock", "norm1", "nonlinearity", "conv1"),
    NormIntoConv("HunyuanVideo15ResnetBlock", "norm2", "nonlinearity", "conv2"),
    NormIntoConv("HunyuanVideo15Decoder3D", "norm_out", "conv_act", "conv_out"),
    NormIntoConv("HunyuanVideo15Encoder3D", "norm_out", "conv_act", "conv_out"),
)


# Encoder and decoder. HunyuanVideo15CausalConv3d -> halo rows in place of its replicate padding on the
# sharded axis (its child Conv3d is then unpadded and local), and in the fast tier's frame loop its
# cache; HunyuanVideo15Upsample -> the frame loop's first-frame rule (`ChunkedUpsample`);
# HunyuanVideo15AttnBlock -> frame-causal attention against the whole frames' keys and values, one
# frame at a time; an RMS norm over channels (in the fast tier, where declared above, into the next
# convolution's buffer), its SiLU (then a pass-through), a 1x1x1 Conv3d (shortcuts, the attention's
# projections), the up/downsamplers' rearranges and channel shortcuts, the containers -> local.
SHARD_PLAN = ShardPlan(
    roots=("encoder", "decoder"),
    rules=(
        Rule(
            "HunyuanVideo15CausalConv3d",
            HALO,
            CachedReplicateCausalConv3d,
            check=_causal_conv_problem,
            layer=Layer(padding="replicate", cache=True),
        ),
        Rule("Conv3d", LOCAL, parent="HunyuanVideo15CausalConv3d"),  # unpadded, run by its parent
        Rule("Conv3d", LOCAL, check=pointwise_problem),
        Rule("HunyuanVideo15Upsample", FAST, ChunkedUpsample),
        Rule("HunyuanVideo15AttnBlock", WHOLE_MAP, FrameCausalAttention),
        Rule(
            "HunyuanVideo15RMS_norm",
            LOCAL,
            RMSNormSiLUIntoConv,
            check=channel_norm_problem,
            layer=Layer(norm="rms_channels"),
        ),
        Rule("SiLU", LOCAL, SiLUAfterProducer),
        local("HunyuanVideo15Encoder3D", "HunyuanVideo15Decoder3D", "HunyuanVideo15DownBlock3D"),
        Rule("HunyuanVideo15ResnetBlock", FAST, HunyuanVideo15Resnet),
        local("HunyuanVideo15UpBlock3D", "HunyuanVideo15MidBlock"),
        local("HunyuanVideo15Downsample"),
        CONTAINERS,
    ),
)


_HV = "diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15:"


class _HunyuanVideo15(Family):
    name = "hunyuanvideo15"
    classes = ("AutoencoderKLHunyuanVideo15",)
    # -- facts ----------------------------------------------------------------------------------
    configs = {"hunyuanvideo15": ("AutoencoderKLHunyuanVideo15", {})}  # its defaults are the HunyuanVideo 1.5 VAE
    # every kind of layer of the real one: up/down blocks that resample space and time, space only, and
    # neither; causal replicate-padded convs, RMS norms, 1x1x1 shortcuts, the frame-causal mid-block
    # attention. 4x spatial, 2x temporal; "hunyuanvideo15_layout": the real config's layout (five
    # levels, 16x spatial, 4x temporal, 32 latent channels, two layers per block) at a sixteenth of its
    # widths, for numerical checks at 16x
    test_configs = {
        "hunyuanvideo15": (
            "AutoencoderKLHunyuanVideo15",
            {
                "latent_channels": 4,
                "block_out_channels": (8, 8, 16),
                "layers_per_block": 1,
                "spatial_compression_ratio": 4,
                "temporal_compression_ratio": 2,
            },
        ),
        "hunyuanvideo15_layout": (
            "AutoencoderKLHunyuanVideo15",
            {
                "latent_channels": 32,
                "block_out_channels": (8, 16, 32, 64, 64),
                "layers_per_block": 2,
                "spatial_compression_ratio": 16,
                "temporal_compression_ratio": 4,
            },
        ),
    }

    def shape_facts(self, class_name: str, config: dict) -> ShapeFacts:
        # diffusers puts an upsampler on up block i where i < log2 of either ratio (temporal where
        # i < log2 of the temporal one); each doubles height and width
        levels = len(config["block_out_channels"])
        space = math.ceil(math.log2(config["spatial_compression_ratio"]))
        time = math.ceil(math.log2(config["temporal_compression_ratio"]))
        return ShapeFacts(
            5, config["latent_channels"], 2 ** min(levels, max(space, time)), 2 ** min(levels, time),
            config["out_channels"],
        )  # fmt: skip

    mirrors = (
        Mirror(
            _HV + "AutoencoderKLHunyuanVideo15._decode",
            "families/hunyuanvideo15.py decode_tile_ops (when diffusers tiles a latent), direct_decode, LOOP",
            "d6a3eced27ea28fd",
        ),
        Mirror(
            _HV + "AutoencoderKLHunyuanVideo15._encode",
            "families/hunyuanvideo15.py encode_tile_ops (when diffusers tiles a sample)",
            "1732c850c2ec5136",
        ),
        Mirror(
            _HV + "AutoencoderKLHunyuanVideo15.tiled_decode",
            "families/hunyuanvideo15.py decode_tile_ops, _tile_ops",
            "3ea9dbab91554de4",
        ),
        Mirror(
            _HV + "AutoencoderKLHunyuanVideo15.tiled_encode",
            "families/hunyuanvideo15.py encode_tile_ops, _tile_ops",
            "80aa21e33700c932",
        ),
        Mirror(
            _HV + "HunyuanVideo15CausalConv3d.forward",
            "layers/halo.py HaloPadThenConv; fast/causal_conv.py padded_in_loop",
            "45611c78196e07d8",
        ),
        Mirror(
            _HV + "HunyuanVideo15Decoder3D.forward",
            "families/hunyuanvideo15.py _head, _body (the frame loop's split of the decoder)",
            "1f2d1bf4fb859046",
        ),
        Mirror(
            _HV + "HunyuanVideo15ResnetBlock.forward",
            "families/hunyuanvideo15.py NORM_INTO_CONV (norm1 -> nonlinearity -> conv1, norm2 -> conv2); "
            "fast/residual_blocks.py HunyuanVideo15Resnet",
            "f497ee2b21603ff9",
        ),
        Mirror(
            _HV + "HunyuanVideo15Encoder3D.forward",
            "families/hunyuanvideo15.py NORM_INTO_CONV (norm_out -> conv_act -> conv_out)",
            "2acf1aa09d6ccd21",
        ),
        Mirror(
            _HV + "HunyuanVideo15RMS_norm.forward",
            "fast/producers.py RMSNormSiLUIntoConv (kernels/norm.py rms_norm's steps and roundings)",
            "727763e4a6e9ebea",
        ),
        Mirror(
            _HV + "HunyuanVideo15Upsample.forward",
            "families/hunyuanvideo15.py ChunkedUpsample.forward (every frame of a space-only upsampler, the frames "
            "after the first of a temporal one); kernels/d2s_shortcut.py d2s_add",
            "bf66976547324bb3",
        ),
        Mirror(
            _HV + "HunyuanVideo15AttnBlock.forward",
            "layers/frame_causal_attention.py FrameCausalAttention.forward, frame_causal_attention",
            "50d98b5153065a21",
        ),
        Mirror(
            _HV + "HunyuanVideo15AttnBlock.prepare_causal_attention_mask",
            "layers/frame_causal_attention.py frame_causal_attention (frame i sees frames 0..i)",
            "c5cd46ad781ea999",
        ),
    )
    latent_ndim = 5
    spatial_decode = True
    spatial_encode = True
    frame_loop = True  # in the fast tier: fast/frame_loop.py, `LOOP`
    frame_loop_graphs = False
    layer_parts = False  # diffusers' layers, a whole call's frames at once
    streams_steps = True  # the frame loop's chunks, in the fast tier
    fast_tier = True
    fast_notes = (FAST_NOTE,)
    latent_channels = staticmethod(latent_channels)
    decode_tile_ops = staticmethod(decode_tile_ops)
    encode_tile_ops = staticmethod(encode_tile_ops)
    untiled_decode = staticmethod(untiled_decode)
    direct_decode = staticmethod(direct_decode)
    stream_decode = staticmethod(stream_decode)
    untiled_encode = staticmethod(untiled_encode)
    shard_plan = SHARD_PLAN
    norm_into_conv = NORM_INTO_CONV

    def spatial_ratio(self, vae) -> int:
        return 2 ** len(_ups(vae))


FAMILY = _HunyuanVideo15()
