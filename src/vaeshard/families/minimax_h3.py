"""MiniMax-H3 (diffusers `AutoencoderKLMiniMaxH3`).

Latents are 5-D (B, C, T, H, W), 16x spatial and 4x temporal compression in the real config. The
decoder is a non-causal ViT (36 layers in the real config): every latent voxel of a temporal clip is
one token, with rotary positions over (t, h, w), learned register tokens and one zero token appended,
and each token becomes a 4x16x16 block of pixels. The encoder is a causal 3-D convolution net with
GroupNorms. Both run per temporal clip: the encoder on `clip_length` (17) sample frames at a time, the
last clip padded by repeating the last frame and the last `token_drop` (3) latent frames dropped; the
decoder on overlapping clips of `tokens_chunk_size + token_overlap` latent frames cross-faded in time,
the latent padded by repeating its last frame and the extra frames cut again.

Tiling is on by default (diffusers' `use_tiling = True`): the released output is diffusers' tiled
decode and encode, 256-pixel tiles with at least 64 pixels of overlap, laid out in sample pixels per
clip and stitched with overlaps that differ from boundary to boundary (`_split_tiles`). `tile` (and
`auto` while tiling is on) cuts every clip into that grid, spreads the tiles of all clips over the
ranks together, largest first, gathers them once, and stitches each clip with diffusers' own
`_stitch_tiles`; the clips are then merged in time by this module's mirror of `_decode` / `_encode`,
so the result is diffusers' bit for bit. Geometry set with `enable_tiling(...)` is read per request.

The fast tier (the default unless `exact=True` or mode `tile`; one rank too) decodes each rank's
tiles of one shape in batches of at most `tuning.MINIMAX_BATCH_TOKENS` tokens through the ViT, its
blocks' elementwise passes fused (fast/token_blocks.py: Q/K norms with the rotary embedding, each
residual update with the next norm, the SwiGLU product) and attention by PyTorch's
scaled-dot-product attention (flash or cuDNN kernels on the GPU), within the fast tier's tolerances
of the tiles decoded one at a time.

With tiling off (`disable_tiling()`), a spatially sharded decode runs diffusers' untiled `_decode` on
each rank's latent rows (or columns): every clip is one token sequence spread over the ranks, each
rank holding the tokens of its rows with their global rotary positions and the register tokens as
diffusers appends them; each attention gathers the keys and values of every rank's tokens (one
all-gather per layer), so every query attends over the whole clip (layers/token_attention.py; the
swaps are its `SHARD_PLAN`). The encoder is not sharded: an untiled encode runs on one rank.
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import torch

from .. import tuning
from ..fast.token_blocks import run_blocks
from ..layers.token_attention import ShardedTokenAttention, ShardedViTDecoder, vit_forward
from ..runtime.tile import Tile, TileGrid, TileOps, TimeChunks
from .base import (
    CONTAINERS,
    LOCAL,
    WHOLE_MAP,
    Family,
    Layer,
    Mirror,
    Rule,
    ShapeFacts,
    ShardPlan,
    local,
    with_tiling_off,
)

# the released checkpoint's constructor arguments: diffusers' defaults are MiniMax-H3's VAE


# its pixel convention (diffusers' class text): `decode` returns ImageNet-normalised RGB over a [0, 1]
# base, so the pixel is `sample * IMAGENET_STD + IMAGENET_MEAN` (ShapeFacts.pixel_scale / pixel_offset)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def latent_channels(vae) -> int:
    return vae.config.latent_channels


def _grid(vae, rows: int, cols: int, ratio: int) -> tuple[TileGrid, list[int], list[int]]:
    """diffusers' tiles of a clip whose sample frame is `rows * ratio` x `cols * ratio` pixels, in
    units of `ratio` sample pixels (1: sample pixels; the compression ratio: latent pixels), and the
    pixel overlaps of its rows and columns (`_split_tiles`, called as diffusers calls it)."""
    rs, rl, ro = vae._split_tiles(rows * ratio, vae.tile_sample_min_height, vae.tile_sample_min_overlap_height)
    cs, cl, co = vae._split_tiles(cols * ratio, vae.tile_sample_min_width, vae.tile_sample_min_overlap_width)
    tiles = tuple(
        Tile(i, j, h // ratio, min(h // ratio + hl // ratio, rows), w // ratio, min(w // ratio + wl // ratio, cols))
        for i, (h, hl) in enumerate(zip(rs, rl))
        for j, (w, wl) in enumerate(zip(cs, cl))
    )
    # blend, keep and crop are diffusers' `_stitch_tiles` (TileOps.stitch), per boundary
    grid = TileGrid(tiles, len(rs), len(cs), 0, 0, 0, 0, 0, 0)
    return grid, ro, co


def _decode_clips(vae, frames: int) -> tuple[int, tuple[tuple[int, int], ...]]:
    """`_decode`'s temporal chunking of a latent of `frames` frames: the frames repeated at the end,
    and the latent frames [t0, t1) of each clip (of the padded latent); no clip for a latent too short."""
    size, drop = vae.tokens_chunk_size, vae.config.token_drop
    num_tokens = frames + drop
    pad = (-num_tokens) % size
    num_chunks = (num_tokens + pad) // size - int(drop > 0)
    total = frames + pad
    return pad, tuple((i * size, min(i * size + size + vae.token_overlap, total)) for i in range(num_chunks))


def gathered_bytes(vae, shape) -> int:
    """Bytes of the keys and values one attention of the sharded ViT decoder gathers from every rank
    (layers/token_attention.py): the whole clip's patch tokens (B x clip frames x H x W), the
    attention's width each, in the model's dtype; the largest clip of a latent of `shape`."""
    spans = _decode_clips(vae, shape[2])[1]
    frames = max((t1 - t0 for t0, t1 in spans), default=0)
    attn = next(m for m in vae.decoder.modules() if hasattr(m, "to_k") and hasattr(m, "heads"))
    itemsize = attn.to_k.weight.element_size()
    return 2 * shape[0] * frames * shape[3] * shape[4] * attn.to_k.out_features * itemsize


def _frames_of_config(config: dict, frames: int) -> int:
    """Sample frames of a latent of `frames` frames, from the config alone: `_decode_clips` and
    `_merge_decoded` run on shapes (meta tensors) with the clip geometry diffusers' constructor derives."""
    ratio, clip, drop = math.prod(config["temporal_downsample_factors"]), config["clip_length"], config["token_drop"]
    pre, size = (-clip) % ratio, math.ceil(clip / ratio)
    overlap = (-drop) % size
    geometry = SimpleNamespace(
        tokens_chunk_size=size,
        token_overlap=overlap,
        frame_pre_padding=pre,
        frame_overlap=max(overlap * ratio - pre, 0),
        temporal_compression_ratio=ratio,
        config=SimpleNamespace(token_drop=drop, clip_length=clip),
        _blend=lambda a, b, n, dim: b,  # a cross-fade keeps the shape
    )
    pad, spans = _decode_clips(geometry, frames)
    if not spans:
        return 0
    clips = [torch.empty(1, 1, (t1 - t0) * ratio, 1, 1, device="meta") for t0, t1 in spans]
    return _merge_decoded(geometry, clips, pad, frames + pad).shape[2]


def _check_frames(vae, frames: int) -> None:
    """diffusers' `_decode` of a latent shorter than one clip less `token_drop` has no clip to decode
    (it fails on an empty concatenation): say so instead."""
    size, drop = vae.tokens_chunk_size, vae.config.token_drop
    if not _decode_clips(vae, frames)[1]:
        raise ValueError(
            f"AutoencoderKLMiniMaxH3 decodes latents of at least {size - drop + 1} frames (its clips of {size} "
            f"latent frames less token_drop {drop}), got {frames}; diffusers' own decode fails on it too"
        )


def _merge_decoded(vae, clips: list[torch.Tensor], pad_tokens: int, padded_frames: int) -> torch.Tensor:
    """`_decode`'s loop over the decoded clips: each cut into chunks of `tokens_chunk_size * ratio`
    frames less the leading pad, the overlap cross-faded with diffusers' `_blend`, and the frames of
    the repeated latent frames cut off at the end (`padded_frames`: the padded latent's length)."""
    token_drop = vae.config.token_drop
    temporal_ratio = vae.temporal_compression_ratio
    chunk_num_frames = vae.tokens_chunk_size * temporal_ratio
    decoded_chunks = []
    overlap = None
    for clip in clips:
        for j in range(int(token_drop > 0) + 1):
            frame_start = j * chunk_num_frames
            chunk = clip[:, :, frame_start : frame_start + chunk_num_frames]
            chunk = chunk[:, :, vae.frame_pre_padding :]
            if j == 0:
                if overlap is not None:
                    chunk = vae._blend(overlap, chunk, vae.frame_overlap, dim=-3)
                decoded_chunks.append(chunk)
            else:
                overlap = chunk
    if overlap is not None:
        decoded_chunks.append(overlap)
    dec = torch.cat(decoded_chunks, dim=2)
    if pad_tokens > 0:
        intra_tail = vae.config.clip_length % temporal_ratio
        num_tokens_before_pad = padded_frames - pad_tokens
        pad_frames = sum(
            intra_tail if intra_tail and (num_tokens_before_pad + k) % vae.tokens_chunk_size == 0 else temporal_ratio
            for k in range(pad_tokens)
        )
        dec = dec[:, :, :-pad_frames]
    return dec


def _weights_dtype(module) -> torch.dtype:
    return next(module.parameters()).dtype


def decode_tile_ops(vae, z):
    """diffusers' `_decode` with tiling on: the latent padded to whole clips, each clip cut into
    `_decode_clip`'s grid (pixel tiles mapped onto latent rows), stitched by `_stitch_tiles`, the
    clips merged by `_decode`'s loop. None where it is one clip of one tile (diffusers' decode)."""
    z = z.to(_weights_dtype(vae.post_quant_conv))  # diffusers' `decode` aligns the latent so
    _, _, frames, rows, cols = z.shape
    ratio = vae.spatial_compression_ratio
    pad, spans = _decode_clips(vae, frames)
    grid, row_overlaps, col_overlaps = _grid(vae, rows, cols, ratio)
    if not spans or (len(spans) == 1 and len(grid.tiles) == 1):
        return None  # diffusers decodes it directly (a latent without a clip: the decode refuses it)
    if pad > 0:
        z = torch.cat([z, z[:, :, -1:].repeat(1, 1, pad, 1, 1)], dim=2)
    padded = z.shape[2]
    decoder = vae.decoder
    p, pt = decoder.patch_size, decoder.patch_size_t

    def run(tile):
        return decoder(vae.post_quant_conv(tile))

    def run_many(tiles):  # the fast tier: batches of tiles, the blocks' passes fused (fast/token_blocks.py)
        # tiles[0][:, 0]: the tokens of one tile (of its whole batch)
        per_call = max(1, tuning.MINIMAX_BATCH_TOKENS // tiles[0][:, 0].numel())
        outs = []
        for k in range(0, len(tiles), per_call):
            batch = vae.post_quant_conv(torch.cat(tiles[k : k + per_call]))
            outs += vit_forward(decoder, batch, run_blocks=run_blocks).split(tiles[0].shape[0])
        return outs

    return TileOps(
        grid=grid,
        source=z,
        run=run,
        blend_v=lambda a, b, n: vae._blend(a, b, n, dim=-2),
        blend_h=lambda a, b, n: vae._blend(a, b, n, dim=-1),
        finish=lambda merged: merged,
        out_shape=lambda s: (s[0], decoder.out_channels, s[2] * pt, s[3] * p, s[4] * p),
        out_dtype=_weights_dtype(decoder.proj_out),
        time=TimeChunks(spans, lambda clips: _merge_decoded(vae, clips, pad, padded)),
        stitch=lambda tiles: vae._stitch_tiles(tiles, row_overlaps, col_overlaps),
        run_many=run_many,
    )


def _encoded(vae, shape) -> tuple[int, ...]:
    """The encoder's output shape (the moments) for a sample of `shape`: each downsampler's causal
    3x3x3 convolution (two frames padded in front) keeps `(t - 1) // stride + 1` of t frames; in
    space, a stride-2 one after its (0, 1) pad keeps `ceil(n / 2)`, an unpadded one `(n - 3) // s + 1`."""
    frames, rows, cols = shape[2], shape[3], shape[4]
    for block in vae.encoder.down_blocks:
        for down in block.downsamplers or ():
            st, s, _ = down.conv.stride
            frames = (frames - 1) // st + 1
            extra = 1 if down.spatial_stride == 2 else 0
            rows, cols = (rows + extra - 3) // s + 1, (cols + extra - 3) // s + 1
    return (shape[0], vae.quant_conv.out_channels, frames, rows, cols)


def encode_tile_ops(vae, x):
    """diffusers' `_encode` with tiling on: the sample padded to whole `clip_length` clips by
    repeating its last frame (a one-frame sample is one clip as it is), each clip cut into
    `_encode_clip`'s grid of sample tiles and stitched over the latent overlaps, the clips
    concatenated and `token_drop` latent frames dropped. None where it is one clip of one tile."""
    x = x.to(_weights_dtype(vae.encoder))  # diffusers' `encode` aligns the sample so
    _, _, frames, height, width = x.shape
    clip_length, drop = vae.config.clip_length, vae.config.token_drop
    grid, row_overlaps, col_overlaps = _grid(vae, height, width, 1)
    ratio = vae.spatial_compression_ratio
    latent_rows = [o // ratio for o in row_overlaps]
    latent_cols = [o // ratio for o in col_overlaps]
    if frames <= clip_length and len(grid.tiles) == 1:
        return None  # diffusers encodes one clip of one tile directly
    if frames == 1:
        spans, merge_clips = ((0, 1),), lambda clips: clips[0]
    else:
        if frames % clip_length:
            x = torch.cat([x, x[:, :, -1:].repeat(1, 1, (-frames) % clip_length, 1, 1)], dim=2)
        spans = tuple((i, i + clip_length) for i in range(0, x.shape[2], clip_length))

        def merge_clips(clips):
            moments = torch.cat(clips, dim=2)
            return moments[:, :, :-drop] if drop > 0 else moments

    return TileOps(
        grid=grid,
        source=x,
        run=lambda tile: vae.quant_conv(vae.encoder(tile)),
        blend_v=lambda a, b, n: vae._blend(a, b, n, dim=-2),
        blend_h=lambda a, b, n: vae._blend(a, b, n, dim=-1),
        finish=lambda merged: merged,
        out_shape=lambda s: _encoded(vae, s),
        out_dtype=_weights_dtype(vae.quant_conv),
        time=TimeChunks(spans, merge_clips),
        stitch=lambda tiles: vae._stitch_tiles(tiles, latent_rows, latent_cols),
    )


# -- spatial shard (tiling off): the decoder's shard plan ----------------------------------------------


def _plain_processor(attention) -> str | None:
    processor = attention.processor
    if type(processor).__name__ != "MiniMaxH3VideoAttnProcessor" or processor._parallel_config is not None:
        return f"an attention whose processor is {type(processor).__name__} (or context-parallel)"
    return None


# The decoder (`MiniMaxH3VideoViTDecoder3d`) -> its rows' tokens with their global rotary positions
# (layers/token_attention.py ShardedViTDecoder); each `MiniMaxH3VideoAttention` -> keys and values of
# every rank's tokens (ShardedTokenAttention). Everything else in the decoder acts per token
# (projections, RMS and layer norms, the feed-forward, the unpatchify of each token's pixels), and
# `post_quant_conv` per pixel: local. Another decoder class matches no rule and is refused. The encoder
# is not sharded (encode: `tile`, or one rank).
SHARD_PLAN = ShardPlan(
    roots=("decoder",),
    rules=(
        Rule("MiniMaxH3VideoViTDecoder3d", WHOLE_MAP, ShardedViTDecoder, where="decoder"),
        Rule("MiniMaxH3VideoAttention", WHOLE_MAP, ShardedTokenAttention, check=_plain_processor),
        Rule(("RMSNorm", "LayerNorm"), LOCAL, layer=Layer(norm="tokens")),
        local("MiniMaxH3VideoTransformerBlock", "MiniMaxH3VideoRotaryPosEmbed", "FeedForward", "SwiGLU"),
        local("Linear", "SiLU", "GELU"),
        CONTAINERS,
    ),
)


def untiled_decode(vae, z):
    _check_frames(vae, z.shape[2])
    z = z.to(_weights_dtype(vae.post_quant_conv))  # as diffusers' `decode` aligns it before `_decode`
    return with_tiling_off(vae, lambda: vae._decode(z)).contiguous()


def direct_decode(vae, z):
    _check_frames(vae, z.shape[2])
    return type(vae).decode(vae, z, return_dict=False)[0]


def untiled_encode(vae, x):
    x = x.to(_weights_dtype(vae.encoder))  # as diffusers' `encode` aligns it before `_encode`
    return with_tiling_off(vae, lambda: vae._encode(x)).contiguous()


_MODULE = "diffusers.models.autoencoders.autoencoder_kl_minimax_h3:"
_H3 = _MODULE + "AutoencoderKLMiniMaxH3."


class _MiniMaxH3(Family):
    name = "minimax_h3"
    classes = ("AutoencoderKLMiniMaxH3",)
    # -- facts ----------------------------------------------------------------------------------
    configs = {"minimax_h3": ("AutoencoderKLMiniMaxH3", {})}  # diffusers' defaults are the released VAE
    # every kind of layer of the real one (tests/models.py seeds what diffusers starts at a constant):
    # four encoder levels resampling space, space and time (twice) and nothing; a two-block ViT decoder
    # with registers; clips of 7 sample frames (2 latent frames, 1 dropped)
    test_configs = {
        "minimax_h3": (
            "AutoencoderKLMiniMaxH3",
            {
                "latent_channels": 4,
                "block_out_channels": (4, 8, 8, 8),
                "layers_per_block": 1,
                "spatial_downsample_factors": (2, 2, 2, 1),
                "temporal_downsample_factors": (1, 2, 2, 1),
                "norm_num_groups": 2,
                "decoder_num_layers": 2,
                "decoder_num_attention_heads": 2,
                "decoder_attention_head_dim": 8,
                "decoder_num_register_tokens": 2,
                "decoder_ffn_mult": 2,
                "clip_length": 7,
                "token_drop": 1,
                "latents_mean": (0.0,) * 4,
                "latents_std": (1.0,) * 4,
            },
        )
    }

    def shape_facts(self, class_name: str, config: dict) -> ShapeFacts:
        space, time = math.prod(config["spatial_downsample_factors"]), math.prod(config["temporal_downsample_factors"])
        frames = functools.partial(_frames_of_config, config)
        return ShapeFacts(
            5,
            config["latent_channels"],
            space,
            time,
            config["out_channels"],
            frames=frames,
            pixel_scale=IMAGENET_STD,
            pixel_offset=IMAGENET_MEAN,
        )

    mirrors = (
        Mirror(_H3 + "_decode", "families/minimax_h3.py _decode_clips, _merge_decoded", "8a9a2fb7dd63d332"),
        Mirror(
            _H3 + "_encode", "families/minimax_h3.py encode_tile_ops (clips, padding, token_drop)", "94c085e771cb6a1b"
        ),
        Mirror(_H3 + "_decode_clip", "families/minimax_h3.py _grid, decode_tile_ops (run)", "101dd386cf7c2823"),
        Mirror(
            _H3 + "_encode_clip",
            "families/minimax_h3.py _grid, encode_tile_ops (run, latent overlaps)",
            "e344bea7e56ede15",
        ),
        Mirror(_H3 + "decode", "families/minimax_h3.py decode_tile_ops (the latent's dtype)", "2a06df98fba43d2f"),
        Mirror(_H3 + "encode", "families/minimax_h3.py encode_tile_ops (the sample's dtype)", "f25433a70fa1b136"),
        Mirror(
            _MODULE + "MiniMaxH3VideoViTDecoder3d.forward",
            "layers/token_attention.py vit_forward, global_positions",
            "27ef2cf940602f3a",
        ),
        Mirror(
            _MODULE + "MiniMaxH3VideoAttnProcessor.__call__",
            "layers/token_attention.py ShardedTokenAttention.forward",
            "f890add650941d22",
        ),
        Mirror(
            _MODULE + "MiniMaxH3VideoTransformerBlock.forward",
            "fast/token_blocks.py run_blocks (the fast tier's batched tiles)",
            "00d50c6da1593deb",
        ),
        Mirror(
            _MODULE + "MiniMaxH3VideoAttnProcessor.__call__",
            "fast/token_blocks.py run_blocks, kernels/token_block.py qk_norm_rope",
            "f890add650941d22",
        ),
        Mirror(
            "diffusers.models.attention:FeedForward.forward",
            "fast/token_blocks.py _feed_forward",
            "2534be46672c7017",
        ),
        Mirror(
            "diffusers.models.activations:SwiGLU.forward",
            "fast/token_blocks.py _feed_forward, kernels/token_block.py swiglu",
            "9ed4817084958745",
        ),
        Mirror(
            _MODULE + "MiniMaxH3VideoAttention.forward",
            "layers/token_attention.py ShardedTokenAttention.forward (the processor's call)",
            "8d871f737867c88e",
        ),
    )
    latent_ndim = 5
    spatial_decode = True

    def memory_note(self, vae, shape, world: int, strategy: str, op: str) -> str | None:
        if op != "decode" or world < 2 or strategy not in ("spatial_shard_height", "spatial_shard_width"):
            return None
        size = gathered_bytes(vae, shape)
        shown = f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"
        return (
            f"each attention of the ViT decoder gathers its clip's keys and values from every rank: {shown} "
            "on each rank while it runs, beside the rank's share of the tokens (the tiles of `tile` need none)"
        )

    fast_tiles = True  # the fast tier batches a rank's tiles of one shape (TileOps.run_many)
    latent_channels = staticmethod(latent_channels)
    decode_tile_ops = staticmethod(decode_tile_ops)
    encode_tile_ops = staticmethod(encode_tile_ops)
    untiled_decode = staticmethod(untiled_decode)
    direct_decode = staticmethod(direct_decode)
    untiled_encode = staticmethod(untiled_encode)
    shard_plan = SHARD_PLAN


FAMILY = _MiniMaxH3()
