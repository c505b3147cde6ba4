"""Wan 2.1 / 2.2 (diffusers AutoencoderKLWan), and the causal-video-VAE machinery it shares with
Qwen-Image, whose VAE is the Wan 2.1 architecture under other class names.

Declared: which leaf classes get which halo treatment (causal 3x3x3 convs, the upsamplers' 3x3
Conv2d, the single-head mid-block attention). Code, because it cannot be data: diffusers' per-tile
loop (the decoder is run frame by frame with its causal feature cache threaded through), and the
tile grid arithmetic, both kept line for line with diffusers' `tiled_decode`/`tiled_encode` so the
tile strategy stays bit-identical to them.
"""

from __future__ import annotations

import torch

from ... import tuning
from ...layers import tier as fast
from ...layers.attention import WholeFrameAttention
from ...layers.convs import HaloCausalConv3d, HaloConv2d
from ...layers.halo import HaloZeroPad2d
from ...layers.norms import FusedRMSNormSiLU, NearestUpsample, PassThroughSiLU, forget_moved_bias, move_bias_into_norm
from ...runtime.swap import is_swapped, unswap
from ...runtime.tile import TileOps
from ..base import (
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
    class_name,
    frames_out,
    local,
    padded,
    pointwise_problem,
    same_conv_problem,
    strided_decode_grid,
    strided_encode_grid,
    with_tiling_off,
)
from .blocks import FastCoderHead, FastResidualBlock, FastResidualUpBlock, FastUpsample
from .frames import decode_in_steps, stream_steps


class WanLike(Family):
    """Tile and shard behaviour of a Wan-architecture VAE; subclass attributes name the differences."""

    latent_ndim = 5
    spatial_decode = True
    spatial_encode = True
    frame_loop = True
    streams_steps = True
    fast_tier = True

    class_prefix: str  # of the family's diffusers class names ("Wan": WanCausalConv3d, ...), for `wan_plan`
    decoder_takes_first_chunk = True  # Wan's decoder trims DupUp3D's first chunk; Qwen's has no such arg
    clamp_tiled_decode = True  # Wan clamps after tiled decode; Qwen-Image's tiled decode does not

    # -- facts ----------------------------------------------------------------------------------

    def shape_facts(self, class_name: str, config: dict) -> ShapeFacts:
        # one 2x spatial upsampler per level below the top, each temporal where temperal_downsample
        # (reversed) says so; Wan 2.2 unpatchifies its output
        stages = len(config["dim_mult"]) - 1
        patch = config.get("patch_size") or 1
        ups = list(reversed(config["temperal_downsample"]))[:stages]
        channels = config["out_channels"] if "out_channels" in config else config["input_channels"]
        return ShapeFacts(5, config["z_dim"], 2**stages * patch, 2 ** sum(map(bool, ups)), channels // patch**2)

    # -- shapes ---------------------------------------------------------------------------------

    @staticmethod
    def patch(vae) -> int:
        return getattr(vae.config, "patch_size", None) or 1

    @staticmethod
    def num_spatial_stages(vae) -> int:
        return len(vae.config.dim_mult) - 1

    def temporal_factor(self, vae) -> int:
        ups = list(vae.temperal_upsample)[: self.num_spatial_stages(vae)]
        return 2 ** sum(bool(u) for u in ups)

    def latent_channels(self, vae) -> int:
        return vae.config.z_dim

    # -- decode ---------------------------------------------------------------------------------

    @staticmethod
    def _exceeds_one_tile(vae, z) -> bool:
        """diffusers' test in `_decode`: the latent is larger than one tile, so a tiled decode tiles."""
        _, _, _, height, width = z.shape
        ratio = vae.spatial_compression_ratio
        return width > vae.tile_sample_min_width // ratio or height > vae.tile_sample_min_height // ratio

    def decode_tile_ops(self, vae, z):
        _, _, _, height, width = z.shape
        ratio, patch = vae.spatial_compression_ratio, self.patch(vae)
        if not self._exceeds_one_tile(vae, z):
            return None  # one tile: diffusers decodes it directly
        grid = strided_decode_grid(vae, height, width, ratio, patch)
        up = 2 ** self.num_spatial_stages(vae)
        channels = vae.decoder.conv_out.out_channels
        tf = self.temporal_factor(vae)
        return TileOps(
            grid=grid,
            source=z,
            run=lambda tile: self._decode_tile(vae, tile),
            blend_v=vae.blend_v,
            blend_h=vae.blend_h,
            finish=lambda merged: self._finish_tiled_decode(vae, merged),
            out_shape=lambda s: (s[0], channels, frames_out(s[2], tf), s[3] * up, s[4] * up),
            out_dtype=z.dtype,
        )

    def _decode_tile(self, vae, tile):
        vae.clear_cache()
        frames = []
        for k in range(tile.shape[2]):
            vae._conv_idx = [0]
            x = vae.post_quant_conv(tile[:, :, k : k + 1])
            if self.decoder_takes_first_chunk:
                frames.append(vae.decoder(x, feat_cache=vae._feat_map, feat_idx=vae._conv_idx, first_chunk=(k == 0)))
            else:
                frames.append(vae.decoder(x, feat_cache=vae._feat_map, feat_idx=vae._conv_idx))
        vae.clear_cache()
        return torch.cat(frames, dim=2)

    def _finish_tiled_decode(self, vae, merged):
        merged = self._unpatchify(vae, merged)
        return torch.clamp(merged, min=-1.0, max=1.0) if self.clamp_tiled_decode else merged

    def _unpatchify(self, vae, x):
        """diffusers' unpatchify where the VAE patchifies (Wan 2.2), else `x` itself."""
        if self.patch(vae) == 1:
            return x
        from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

        return unpatchify(x, patch_size=self.patch(vae))

    def untiled_decode(self, vae, z):
        if fast.enabled():
            return with_tiling_off(vae, decode_in_steps, self, vae, z)
        # contiguous: a sharded request computes channels-last; callers get diffusers' layout back
        return with_tiling_off(vae, lambda: vae._decode(z, return_dict=False)[0]).contiguous()

    def direct_decode(self, vae, z):
        """One rank's whole decode: the fast tier's stepping loop where it gives what the VAE's own
        `decode` would (no tiling of this latent, no accelerate hook around `decode`), otherwise the
        VAE's own `decode`. (A sliced batch arrives here one sample at a time: vaeshard splits it.)"""
        tiles = vae.use_tiling and self._exceeds_one_tile(vae, z)
        if fast.enabled() and not (tiles or hasattr(vae, "_hf_hook")):
            return self.untiled_decode(vae, z)
        return type(vae).decode(vae, z, return_dict=False)[0]

    def stream_decode(self, vae, z, whole: bool):
        """The frame loop's steps (frames.stream_steps), or None where a direct request runs the VAE's
        own decode: its tiling applies or a hook wraps `decode`."""
        if not self.streams_steps:
            return None  # no frame loop (Qwen-Image 2.1: one frame)
        if whole and ((vae.use_tiling and self._exceeds_one_tile(vae, z)) or hasattr(vae, "_hf_hook")):
            return None
        return stream_steps(self, vae, z)

    def untiled_encode(self, vae, x):
        """diffusers' untiled `_encode`: the moments (mean and logvar stacked on channels)."""
        return with_tiling_off(vae, lambda: vae._encode(x)).contiguous()

    # -- encode ---------------------------------------------------------------------------------

    def encode_prepare(self, vae, x):
        if self.patch(vae) > 1:
            from diffusers.models.autoencoders.autoencoder_kl_wan import patchify

            return patchify(x, patch_size=self.patch(vae))
        return x

    def encode_tile_ops(self, vae, x):
        """`x` in sample coordinates (before patchify), as diffusers' `_encode` tests the tile size on."""
        _, _, _, height, width = x.shape
        if not (width > vae.tile_sample_min_width or height > vae.tile_sample_min_height):
            return None
        xp = self.encode_prepare(vae, x)
        _, _, _, rows, cols = xp.shape
        grid = strided_encode_grid(vae, rows, cols, vae.spatial_compression_ratio // self.patch(vae))
        stages = self.num_spatial_stages(vae)
        channels = vae.quant_conv.out_channels
        return TileOps(
            grid=grid,
            source=xp,
            run=lambda tile: self._encode_tile(vae, tile),
            blend_v=vae.blend_v,
            blend_h=vae.blend_h,
            finish=lambda merged: merged,
            out_shape=lambda s: (s[0], channels, 1 + (s[2] - 1) // 4, s[3] >> stages, s[4] >> stages),
            out_dtype=x.dtype,
        )

    def _encode_tile(self, vae, tile):
        vae.clear_cache()
        chunks = []
        for k in range(1 + (tile.shape[2] - 1) // 4):
            vae._enc_conv_idx = [0]
            part = tile[:, :, :1] if k == 0 else tile[:, :, 1 + 4 * (k - 1) : 1 + 4 * k]
            part = vae.encoder(part, feat_cache=vae._enc_feat_map, feat_idx=vae._enc_conv_idx)
            chunks.append(vae.quant_conv(part))
        vae.clear_cache()
        return torch.cat(chunks, dim=2)

    # -- spatial shard --------------------------------------------------------------------------

    def install_layers(self, vae):
        """The family's shard plan (`wan_plan`); then, in each residual block whose conv1 was swapped,
        conv1 leaves its bias for norm2 to add in the fast tier (`move_bias_into_norm`). That hook
        is not a rule of the plan because it relates two modules (one's bias read by the other's
        pass) rather than giving one a treatment."""
        report = super().install_layers(vae)
        for part in (vae.decoder, vae.encoder):
            for block in part.modules():
                if class_name(block) == f"{self.class_prefix}ResidualBlock" and is_swapped(block.conv1):
                    move_bias_into_norm(block.conv1, block.norm2)
        return report

    def uninstall_layers(self, vae) -> None:
        for module in vae.modules():
            unswap(module)
            forget_moved_bias(module)

    def release(self, vae) -> None:
        vae.clear_cache()

    def decode_axis(self, vae, ranks: int, device: torch.device) -> str | None:
        """`auto`'s measured refinement (Family.decode_axis): a CUDA decode over
        tuning.WAN_HEIGHT_RANKS ranks of a VAE with Wan 2.1's layers (tuning.WAN_HEIGHT_BASE_DIM
        channels at full resolution: Wan 2.1, and Qwen-Image, its architecture) by height: its
        channels-last halo rows are contiguous, and the Triton kernel's row tiles add the residual
        and compute the norm as they store (docs/tuning.md). Wan 2.2 measured alike either way; other
        rank counts and CPU decodes were not measured: the baseline."""
        base = getattr(vae.config, "decoder_base_dim", None) or getattr(vae.config, "base_dim", None)
        return (
            "height"
            if device.type == "cuda" and ranks == tuning.WAN_HEIGHT_RANKS and base == tuning.WAN_HEIGHT_BASE_DIM
            else None
        )


def wan_plan(prefix: str) -> ShardPlan:
    """The shard plan of a Wan-architecture VAE whose diffusers classes are named `prefix` + "CausalConv3d"
    and so on (Wan; Qwen-Image, its architecture), decoder and encoder.

    Halo rows (spatial shard): the causal conv's spatial zero padding (none for the temporal-only
    ones, which the fast tier still gives one input buffer); the padded 2-D convs (the upsamplers'
    3x3); the ZeroPad2d before the downsamplers' unpadded stride-2 3x3 (which is then local). The
    single-head attention sees whole-frame keys and values. Everything else is per voxel, or a local
    pixel (un)shuffle, and stays as diffusers wrote it.
    Fast tier (layers/, and blocks.py): the RMS norms that diffusers always follows with SiLU (in
    residual blocks and before conv_out) fuse it, and those SiLU modules pass through; the residual
    block's norms write straight into the convolutions' input buffers (`FastResidualBlock`; norm2
    computed by conv1's Triton kernel where it runs conv1), and so does the head's norm, into
    conv_out's (`FastCoderHead`, on the decoder and the encoder themselves); the nearest upsamplers
    skip their fp32 round trip, and an upsampling resample computes its 3x3 convolution from the
    source frames by phases, never upsampled in memory, or, where that does not apply, writes each
    upsampled frame straight into that convolution's input buffer (`FastUpsample`).
    """
    causal, residual = f"{prefix}CausalConv3d", f"{prefix}ResidualBlock"
    parts = (f"{prefix}Encoder3d", f"{prefix}Decoder3d")
    fused = Layer(norm="rms_channels", activation="silu")

    def buffered(*convs) -> bool:  # convolutions the plan gives an input buffer (HaloCausalConv3d)
        return all(class_name(c) == causal for c in convs)

    def upsamples_into_conv(resample) -> bool:  # nearest 2x, then a padded 3x3 Conv2d (FastUpsample)
        layers = list(resample.resample) if resample.mode in ("upsample2d", "upsample3d") else []
        if len(layers) != 2 or class_name(layers[0]) != f"{prefix}Upsample" or class_name(layers[1]) != "Conv2d":
            return False
        scale = layers[0].scale_factor
        return (
            layers[0].mode in ("nearest", "nearest-exact")
            and layers[0].size is None
            and tuple(scale if isinstance(scale, (tuple, list)) else (scale, scale)) == (2.0, 2.0)
            and padded(layers[1])
            and (resample.mode == "upsample2d" or buffered(resample.time_conv))
        )

    return ShardPlan(
        roots=("decoder", "encoder"),
        rules=(
            Rule(causal, HALO, HaloCausalConv3d, layer=Layer(padding="zeros", cache=True)),
            Rule("Conv2d", HALO, HaloConv2d, when=padded, check=same_conv_problem, layer=Layer(padding="zeros")),
            Rule("Conv2d", LOCAL, where="*.resample.1"),  # the downsamplers' stride-2 3x3, after the pad
            Rule("Conv2d", LOCAL, check=pointwise_problem),
            Rule("ZeroPad2d", HALO, HaloZeroPad2d, layer=Layer(padding="zeros")),
            Rule(f"{prefix}AttentionBlock", WHOLE_MAP, WholeFrameAttention),
            Rule(f"{prefix}Upsample", FAST, NearestUpsample),
            Rule(f"{prefix}RMS_norm", FAST, FusedRMSNormSiLU, parent=residual, where="*.norm[12]", layer=fused),
            Rule(f"{prefix}RMS_norm", FAST, FusedRMSNormSiLU, parent=parts, where="*.norm_out", layer=fused),
            Rule(f"{prefix}RMS_norm", LOCAL, layer=Layer(norm="rms_channels")),
            Rule("SiLU", FAST, PassThroughSiLU, parent=(residual, *parts), where="*.nonlinearity"),
            Rule("SiLU", LOCAL),
            Rule(residual, FAST, FastResidualBlock, when=lambda b: buffered(b.conv1, b.conv2)),
            Rule(parts, FAST, FastCoderHead, when=lambda part: buffered(part.conv_out)),
            Rule(f"{prefix}Resample", FAST, FastUpsample, when=upsamples_into_conv),
            Rule(f"{prefix}ResidualUpBlock", FAST, FastResidualUpBlock),
            local(residual, *parts, f"{prefix}Resample", f"{prefix}MidBlock", f"{prefix}UpBlock"),
            local(f"{prefix}ResidualDownBlock", "AvgDown3D", "DupUp3D"),
            CONTAINERS,
        ),
    )


_WAN = "diffusers.models.autoencoders.autoencoder_kl_wan:"

# Wan 2.2 (TI2V-5B) VAE: the values of its diffusers vae/config.json that differ from
# AutoencoderKLWan's defaults, including its 48-channel latent statistics.
WAN22_CONFIG = {
    "base_dim": 160,
    "decoder_base_dim": 256,
    "z_dim": 48,
    "is_residual": True,
    "in_channels": 12,
    "out_channels": 12,
    "patch_size": 2,
    "scale_factor_spatial": 16,
    "scale_factor_temporal": 4,
    "latents_mean": [
        -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557,
        -0.1382, 0.0542, 0.2813, 0.0891, 0.1570, -0.0098, 0.0375, -0.1825,
        -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
        -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230,
        -0.0313, -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748,
        0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
    ],
    "latents_std": [
        0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013,
        0.8158, 1.0344, 0.5894, 1.0901, 0.6885, 0.6165, 0.8454, 0.4978,
        0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
        0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093,
        0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887,
        0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
    ],
}  # fmt: skip

# tiny configs with every kind of layer of Wan 2.1's and Wan 2.2's (residual blocks, patchify)
_TINY = {"base_dim": 8, "z_dim": 4, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 1}
_TINY_STATS = {"latents_mean": [0.0] * 4, "latents_std": [1.0] * 4}


class _Wan(WanLike):
    name = "wan"
    classes = ("AutoencoderKLWan",)
    # -- facts (shape_facts: WanLike) -------------------------------------------------------------
    configs = {
        "wan21": ("AutoencoderKLWan", {}),  # AutoencoderKLWan's defaults are the Wan 2.1 VAE
        "wan22": ("AutoencoderKLWan", WAN22_CONFIG),
    }
    test_configs = {
        "wan21": ("AutoencoderKLWan", {**_TINY, **_TINY_STATS}),
        "wan22": (
            "AutoencoderKLWan",
            {
                **_TINY,
                "decoder_base_dim": 16,
                "temperal_downsample": [False, True, True],
                "is_residual": True,
                "in_channels": 12,
                "out_channels": 12,
                "patch_size": 2,
                "scale_factor_spatial": 16,
                **_TINY_STATS,
            },
        ),
    }
    mirrors = (
        Mirror(_WAN + "AutoencoderKLWan._decode", "families/wan/frames.py decode_in_steps", "72e9fe6159efaa0f"),
        Mirror(
            _WAN + "AutoencoderKLWan.tiled_decode",
            "families/wan/adapter.py decode_tile_ops, _decode_tile",
            "b0bb9f92b6f1c79f",
        ),
        Mirror(
            _WAN + "AutoencoderKLWan.tiled_encode",
            "families/wan/adapter.py encode_tile_ops, _encode_tile",
            "62a8b87f3994e53b",
        ),
        Mirror(_WAN + "WanResidualBlock.forward", "families/wan/blocks.py FastResidualBlock", "0f8791368b1a0690"),
        Mirror(_WAN + "WanDecoder3d.forward", "families/wan/blocks.py FastCoderHead", "390daa4a2e49a31f"),
        Mirror(_WAN + "WanEncoder3d.forward", "families/wan/blocks.py FastCoderHead", "2a806c6709573787"),
        Mirror(_WAN + "WanResample.forward", "families/wan/blocks.py FastUpsample", "c39add6f5ee5d871"),
        Mirror(_WAN + "WanResidualUpBlock.forward", "families/wan/blocks.py FastResidualUpBlock", "6dfd520faa03d7d1"),
        Mirror(_WAN + "DupUp3D.forward", "families/wan/blocks.py _dup_up_views, _dup_addend", "101589481ecf86fb"),
        Mirror(_WAN + "WanCausalConv3d.forward", "layers/convs.py HaloCausalConv3d", "8d0a00b9fa084679"),
        Mirror(_WAN + "WanAttentionBlock.forward", "layers/attention.py WholeFrameAttention", "7e88f423719e757d"),
        Mirror(
            _WAN + "WanRMS_norm.forward", "layers/norms.py FusedRMSNormSiLU, kernels/norm_math.py", "727763e4a6e9ebea"
        ),
        Mirror(_WAN + "WanUpsample.forward", "layers/norms.py NearestUpsample", "98998cf69c268fa0"),
    )
    decoder_takes_first_chunk = True
    clamp_tiled_decode = True
    class_prefix = "Wan"
    shard_plan = wan_plan("Wan")


FAMILY = _Wan()
