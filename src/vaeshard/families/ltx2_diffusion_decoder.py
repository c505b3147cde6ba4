"""LTX-2.5's diffusion decoder (diffusers `LTX2VideoDiffusionDecoderModel`, "DiffVAE"): a decoder
only (no encoder; LTX-2's `AutoencoderKLLTX2Video` encodes into the latent space it reads). Latents
are 5-D (B, C, T, H, W), 32x spatial and 8x temporal compression in the real config.

`decode` is diffusers' `decode(z, generator=None, num_inference_steps=None)`: stages 1-4 upsample
the latent deterministically through 3-D neighbourhood-attention blocks and pixel shuffles into a
context volume; stage 5 denoises patchified pixel noise (drawn from `generator`, else the global
RNG) conditioned on it through AdaLN-Zero, over `num_inference_steps` steps (the config's default:
one x0 step). A request passes `generator` and `num_inference_steps` on to every rank; the ranks
must hold generators (and global RNG states) alike, which the request agreement checks.

Spatially sharded (`spatial_shard_height` / `width`, and `auto` on several ranks), every rank runs
the decoder on its latent rows; the plan below says what each layer needs:

- each `LTX2VideoVaeNeighborhoodAttention` takes halo rows of `k // 2` before and `k - 1 - k // 2`
  after (`k`: its kernel along the sharded axis; 3 and 2 rows of the real config's 7-wide stage-1
  and -2 kernels, 2 of the 5-wide, 5 of stage 5's 11-wide) and computes each query's window and
  rotary positions in global coordinates (layers/neighbourhood_attention.py), so the border shift
  happens only at the true grid border;
- the decoder (`LTX2VideoDiffusionDecoder3d`) draws stage 5's pixel noise for the whole canvas,
  alike on every rank, and keeps its rows;
- the linear projections, RMS norms, SwiGLU, pixel shuffles (whole latent rows to whole feature
  rows), the trailing ghost frames in time, the timestep embedding and AdaLN modulation (per
  sample), the (un)patchify of stage 5 (whole patch rows): local.

diffusers' tiled decode (`enable_tiling`) runs stages 1-3 whole and tiles stage 4 and 5 on their own
grid with a shared noise canvas and temporal tiles; vaeshard does not reproduce it, so `tile` is
refused, and a tiling-enabled model decoding a latent diffusers would tile keeps its own result
(`auto` runs it directly on one rank). There is no encode.
"""

from __future__ import annotations

import math

from ..layers.neighbourhood_attention import FAST_NOTE, ShardedDiffusionDecoder, ShardedNeighbourhoodAttention, min_rows
from .base import (
    CONTAINERS,
    HALO,
    LOCAL,
    WHOLE_MAP,
    Family,
    Mirror,
    Rule,
    ShapeFacts,
    ShardPlan,
    local,
    request_inputs,
    with_tiling_off,
)


def _flex_processor(attention) -> str | None:
    processor = type(attention.processor).__name__
    if processor != "LTX2VideoVaeNeighborhoodAttnProcessor" or attention.processor._parallel_config is not None:
        return f"an attention whose processor is {processor} (or context-parallel), not diffusers' FlexAttention one"
    return None


SHARD_PLAN = ShardPlan(
    roots=("decoder",),
    rules=(
        Rule("LTX2VideoDiffusionDecoder3d", WHOLE_MAP, ShardedDiffusionDecoder, where="decoder"),
        Rule("LTX2VideoVaeNeighborhoodAttention", HALO, ShardedNeighbourhoodAttention, check=_flex_processor),
        Rule((), LOCAL, where="decoder.t_embedder", subtree=True),  # per sample: no feature map
        local("LTX2VideoVaeNABlock", "LTX2VideoVaeDiffusionNABlock", "LTX2VideoVaeSwiGLU", "LTX2VideoVaeAdaLNZero"),
        local("LTX2VideoVaePixelShuffleUpsampler", "LTX2VideoVaeRotaryPosEmbed3D", "Linear", "RMSNorm"),
        CONTAINERS,
    ),
)

_MODULE = "diffusers.models.autoencoders.ltx2_diffusion_decoder:"
CLASS = "LTX2VideoDiffusionDecoderModel"


def _tiles_in_diffusers(vae, shape) -> bool:
    """Whether diffusers' `decode` takes its tiled path for a latent of `shape`."""
    return bool(vae.use_tiling) and (
        shape[2] > vae.tile_sample_min_num_frames // vae.temporal_compression_ratio
        or shape[3] > vae.tile_sample_min_height // vae.spatial_compression_ratio
        or shape[4] > vae.tile_sample_min_width // vae.spatial_compression_ratio
    )


class _LTX2DiffusionDecoder(Family):
    name = "ltx2_diffusion_decoder"
    classes = (CLASS,)
    # -- facts ----------------------------------------------------------------------------------
    configs = {"ltx2_diffusion_decoder": (CLASS, {})}  # diffusers' defaults are LTX-2.5's decoder
    # every kind of layer of the real one: four upsampling stages of neighbourhood-attention blocks
    # (stage 1's kernel 1 wide in space so a 2x3 latent decodes; the others 3 wide), pixel shuffles
    # in space and in time (dropping the duplicate frame), and stage 5's patchified AdaLN blocks
    test_configs = {
        "ltx2_diffusion_decoder": (
            CLASS,
            {
                "latent_channels": 4,
                "patch_size": 2,
                "decoder_head_dim": 8,
                "decoder_stage_channels": (32, 16, 16, 16, 8),
                "decoder_stage_depths": (1, 1, 1, 1, 1),
                "decoder_stage_kernels": ((3, 1, 1), (3, 3, 3), (3, 3, 3), (3, 3, 3)),
                "decoder_upsample_strides": ((1, 2, 2), (2, 1, 1), (1, 1, 1), (1, 2, 2)),
                "decoder_upsample_channel_reductions": (2, 1, 1, 2),
                "decoder_stage5_kernel": (3, 5, 5),
                "decoder_t_emb_dim": 16,
                "temporal_compression_ratio": 2,
                "spatial_compression_ratio": 8,
            },
        )
    }
    mirrors = (
        Mirror(
            _MODULE + "LTX2VideoDiffusionDecoder3d.forward",
            "layers/neighbourhood_attention.py ShardedDiffusionDecoder.forward",
            "4f2c978eb9715ee3",
        ),
        Mirror(
            _MODULE + "LTX2VideoVaeNeighborhoodAttention.project_qkv",
            "layers/neighbourhood_attention.py ShardedNeighbourhoodAttention.forward (q, k, v)",
            "897126aeb2c454ba",
        ),
        Mirror(
            _MODULE + "LTX2VideoVaeNeighborhoodAttnProcessor.__call__",
            "layers/neighbourhood_attention.py ShardedNeighbourhoodAttention.forward (windowed_attention, scale 1)",
            "767fe9a3c7f614cd",
        ),
        Mirror(
            _MODULE + "_neighborhood_block_mask",
            "layers/neighbourhood_attention.py _window_start, _axis_blocks (the window of windowed_attention)",
            "7371747effc41879",
        ),
        Mirror(
            _MODULE + "LTX2VideoVaeRotaryPosEmbed3D.forward",
            "layers/neighbourhood_attention.py _rotate",
            "5533639de72857a7",
        ),
    )
    call_inputs = {"decode": ("generator", "num_inference_steps")}
    latent_ndim = 5
    tile_decode = tile_encode = False
    no_tile_reason = (
        "vaeshard does not reproduce diffusers' tiled decode of LTX2VideoDiffusionDecoderModel (stages 1-3 whole, "
        "stages 4-5 on overlapping tiles of their own grid with a shared noise canvas), so there is no tiled "
        "result it can give bit for bit"
    )
    spatial_decode = True
    spatial_encode = False
    shard_plan = SHARD_PLAN
    fast_tier = True  # its attention's windows in blocks, unsharded too
    fast_notes = (FAST_NOTE,)

    def shape_facts(self, class_name: str, config: dict) -> ShapeFacts:
        return ShapeFacts(
            5,
            config["latent_channels"],
            config["spatial_compression_ratio"],
            config["temporal_compression_ratio"],
            config["out_channels"],
        )

    def latent_channels(self, vae) -> int:
        return vae.config.latent_channels

    def decode_tile_ops(self, vae, z):
        return None

    def encode_tile_ops(self, vae, x):
        return None

    def own_reason(self, vae, op: str) -> tuple[str, str]:
        return (
            "diffusers' tiled decode (enable_tiling), which vaeshard does not reproduce",
            "Call vae.disable_tiling() for spatial shards (diffusers' untiled result)",
        )

    def own_result(self, vae, op: str, shape) -> str:
        return "own" if _tiles_in_diffusers(vae, shape) else "untiled"

    def untiled_decode(self, vae, z):
        inputs = request_inputs()
        return with_tiling_off(vae, lambda: vae.decoder(z, **inputs))

    def untiled_encode(self, vae, x):
        raise ValueError(f"{CLASS} is a decoder only: encode with LTX-2's AutoencoderKLLTX2Video")

    direct_encode = untiled_encode

    def draws_noise(self, vae) -> bool:
        return True  # stage 5's pixel noise (from the global RNG where no generator is given)

    def min_shard_rows(self, vae) -> int:
        """Latent rows per rank so every neighbourhood attention's rank holds `min_rows` rows of its
        level (the kernel along either axis, the stricter one)."""
        config = vae.config
        kernels = [*config.decoder_stage_kernels, config.decoder_stage5_kernel]
        scale, need = 1, 1
        for stage, kernel in enumerate(kernels):
            rows = max(min_rows(k, 10**9) for k in kernel[1:])
            need = max(need, math.ceil(rows / scale))
            if stage < len(config.decoder_upsample_strides):
                scale *= max(config.decoder_upsample_strides[stage][1:])
        return need

    def spatial_ratio(self, vae) -> int:
        return vae.config.spatial_compression_ratio


FAMILY = _LTX2DiffusionDecoder()
