#!/usr/bin/env python3
"""What a sharded decode exchanges, per rank and kind of exchange, predicted without a GPU.

    python3 benchmarks/comm_model.py --ranks 2,4,8 --json comm_model.json

A model of the communication, not a run of it: the family's VAE (its real config) decodes once,
unsharded, on PyTorch's meta device (shapes only), with hooks on the modules its shard plan treats
(`Family.shard_report`); from each call's input shape and the plan's treatment, the bytes rank r
of N hands the backend follow:

- halo (a convolution's or pad's rows on the sharded axis): the rows its padding covers above the
  slice go to the next rank, those below to the previous one (none past a global edge), each row
  C x T x W values; a causal convolution's cached frames travel with the rows.
- global_norm (GroupNorm with whole-map statistics): two all-reduces of float64 sums,
  B x groups + 1 and 2 x B x groups values (the exact tier, and the CPU's; on a GPU the fast tier's
  GroupNorm kernels make one of 3 x B x groups: 8 bytes and one operation fewer, not modelled).
- whole_map (attention): keys and values (or the normed map) all-gathered, each rank's slice
  padded to the longest slice; DC-AE's linear attention: one all-reduce of its fp32 (d + 1) x d
  score matrix per head (maps of at most d pixels: keys and values gathered); MiniMax-H3's ViT
  decoder (its tiling off): each attention gathers the keys and values of every rank's patch tokens.
- assemble: the decoded slice (`output="all"`: every rank broadcasts its own rows).
- tile: one gather of every rank's tiles, padded to the largest tile and the largest per-rank
  count (runtime/tile.py); a request of one tile is decoded by rank 0 and broadcast.

tests/test_runtime/test_comm_model.py checks these against the bytes gloo ranks count
(vaeshard.runtime.traffic) on the tiny test configs. The payload is what one rank hands the
backend; on the wire NCCL's ring algorithms move (N-1) x the payload for an all-gather and
2 (N-1) / N x it for an all-reduce, which `link_bytes` applies for the predicted time
(docs/figures/comm.py).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import vaeshard  # noqa: E402
from vaeshard.families import family_for  # noqa: E402
from vaeshard.families.base import GLOBAL_NORM, HALO, WHOLE_MAP  # noqa: E402
from vaeshard.layers.neighbourhood_attention import halo_rows as neighbourhood_halo  # noqa: E402
from vaeshard.runtime import tile as tile_mod  # noqa: E402
from vaeshard.runtime.spatial import split_extents  # noqa: E402


def _halo_rows(module) -> tuple[int, int]:
    """(rows from the previous rank, rows from the next) a halo module takes on the height axis:
    what its padding covers there."""
    for name in ("_padding", "time_causal_padding"):  # causal convolutions: (w, w, h, h, t, 0) for F.pad
        pad = getattr(module, name, None)
        if pad is not None:
            return pad[2], pad[3]
    if hasattr(module, "height_pad"):
        return module.height_pad, module.height_pad
    if isinstance(module, torch.nn.ZeroPad2d):
        return module.padding[2], module.padding[3]
    conv = module.conv if hasattr(module, "conv") and isinstance(module.conv, torch.nn.Module) else module
    pad = conv.padding
    if isinstance(pad, str):
        raise ValueError(f"{type(module).__name__}: string padding {pad!r} is not modelled")
    return pad[-2], pad[-2]  # (h, w) or (t, h, w)


# Whole-map attention layers (vaeshard's layer names) and how many maps of their input's size each
# call gathers: keys and values (two), or, for WholeImageAttention, the normed input (one);
# HunyuanVideo's mid-block gathers keys and values for each of its attentions (their GroupNorms'
# statistics are their own calls). DC-AE's linear attention (LINEAR) all-reduces its score matrix
# instead (`_linear_attention`).
MAPS_GATHERED = {"WholeFrameAttention": 2, "FrameCausalAttention": 2, "WholeImageAttention": 1}
PER_ATTENTION = {"FrameCausalMidBlock": 2}
LINEAR = "ShardedLinearAttention"
# MiniMax-H3's ViT decoder: each of its attentions gathers the keys and values of every rank's patch
# tokens (layers/token_attention.py); modelled per decoder call, whose input holds the token grid
# (the attentions' own calls see flattened tokens and count nothing themselves)
VIT, TOKENS = "ShardedViTDecoder", "ShardedTokenAttention"
# LTX-2.5's diffusion decoder: each neighbourhood attention takes halo rows of its input (B, T, H, W, C)
# from its neighbours, as many as its window reaches along the sharded axis (layers/neighbourhood_
# attention.py halo_rows); the decoder itself draws stage 5's noise whole on every rank (no exchange)
NEIGHBOURHOOD, DIFFUSION = "ShardedNeighbourhoodAttention", "ShardedDiffusionDecoder"
# LTX's residual blocks with noise injection draw each noise map whole and keep their rows (layers/
# ltx_resnet.py): no exchange of their own (their convolutions are halo layers of their own)
NOISE = "LTXResnet"
QUIET = (TOKENS, DIFFUSION, NOISE)  # whole-map layers that exchange nothing themselves


def _linear_attention(module, shape) -> tuple[bool, int, int]:
    """(whether the call takes the linear branch, heads across its scales, head_dim) of a call of
    DC-AE's `SanaMultiscaleLinearAttention` on a whole map of `shape` (B, C, H, W) (layers/
    linear_attention.py): the linear branch all-reduces an fp32 (d + 1) x d matrix per head; the
    quadratic one (at most d pixels) gathers the keys and values."""
    d = module.attention_head_dim
    heads = module.to_q.out_features * (1 + len(module.to_qkv_multiscale)) // d
    return shape[-2] * shape[-1] > d, heads, d


def _token_attentions(decoder) -> list:
    """The attentions of a ViT decoder's blocks (each with `to_k`, `heads`)."""
    return [m for m in decoder.modules() if m is not decoder and hasattr(m, "to_k") and hasattr(m, "heads")]


def _maps_gathered(mixin: str, module=None) -> int:
    if mixin in PER_ATTENTION and module is not None:
        return PER_ATTENTION[mixin] * sum(attn is not None for attn in module.attentions)
    if mixin == LINEAR:
        return 0  # (its exchange depends on the call: spatial_bytes, operations)
    if mixin == VIT and module is not None:
        return 2 * len(_token_attentions(module))
    if mixin in QUIET:
        return 0  # (counted with its decoder's call, or no exchange)
    if mixin not in MAPS_GATHERED:
        known = ", ".join((*MAPS_GATHERED, *PER_ATTENTION, LINEAR, VIT, NEIGHBOURHOOD, *QUIET))
        raise ValueError(
            f"benchmarks/comm_model.py does not model {mixin}'s exchanges (it models {known}): its bytes "
            "would be a guess; add its rule to MAPS_GATHERED and a case to tests/test_runtime/test_comm_model.py"
        )
    return MAPS_GATHERED[mixin]


def _shape_only_attention(module, hidden_states, block_mask=None):
    """A neighbourhood attention's output on the meta device, where FlexAttention does not run: its
    shape only (B, T, H, W, the output projection's features)."""
    return hidden_states.new_empty(*hidden_states.shape[:4], module.to_out[0].out_features)


def _calls(vae, z, *inputs) -> tuple[list[tuple[str, str, torch.nn.Module, tuple, int]], tuple]:
    """(treatment, vaeshard layer, module, input shape, cached frames) of every call of a treated module in the
    unsharded decode of `z` (meta device; `inputs`: the decode's further arguments, e.g. LTX's timestep), and
    the decoded shape."""
    report = family_for(vae).shard_report(vae)
    modules = dict(vae.named_modules())
    calls, handles, shapes_only = [], [], []
    for swapped in report.swapped:
        if swapped.treatment not in (HALO, GLOBAL_NORM, WHOLE_MAP):
            continue
        module = modules[swapped.path]
        if swapped.treatment == WHOLE_MAP:
            _maps_gathered(swapped.mixin, module)  # refuses a layer the model does not know before decoding

        def hook(mod, args, kwargs, treatment=swapped.treatment, mixin=swapped.mixin):
            x = args[0] if args else next(iter(kwargs.values()))
            cache = args[1] if len(args) > 1 else kwargs.get("cache_x")
            cached = cache.shape[2] if isinstance(cache, torch.Tensor) and cache.ndim == 5 else 0
            calls.append((treatment, mixin, mod, tuple(x.shape), cached))

        handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
        if swapped.mixin == NEIGHBOURHOOD and z.is_meta:
            module.forward = functools.partial(_shape_only_attention, module)
            shapes_only.append(module)
    try:
        with torch.no_grad():
            out = vae.decode(z, *inputs).sample
    finally:
        for h in handles:
            h.remove()
        for module in shapes_only:
            del module.forward
    return calls, tuple(out.shape)


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def spatial_bytes(vae, z, world: int, itemsize: int, traced=None, inputs=()) -> list[dict[str, int]]:
    """Each rank's payload bytes by kind for spatial_shard_height over `world` ranks (`traced`:
    `_calls(vae, z, *inputs)` when already taken; it does not depend on `world`)."""
    calls, out_shape = traced if traced is not None else _calls(vae, z, *inputs)
    latent_rows = z.shape[-2]
    extents = split_extents(latent_rows, world)
    ranks = [Counter() for _ in range(world)]
    for treatment, mixin, module, shape, cached in calls:
        scale = shape[-2] // latent_rows
        if treatment == HALO and mixin == NEIGHBOURHOOD:  # channels last: (B, T, H, W, C)
            before, after = neighbourhood_halo(module.kernel_size[1], shape[2])
            row = shape[0] * shape[1] * shape[3] * shape[4] * itemsize
            for r in range(world):
                rows = (after if r > 0 else 0) + (before if r < world - 1 else 0)
                ranks[r]["halo"] += rows * row
        elif treatment == HALO:
            before, after = _halo_rows(module)
            frames = (shape[2] + cached) if len(shape) == 5 else 1
            row = _prod(shape[:2]) * frames * shape[-1] * itemsize
            for r in range(world):
                rows = (after if r > 0 else 0) + (before if r < world - 1 else 0)
                ranks[r]["halo"] += rows * row
        elif treatment == GLOBAL_NORM:
            groups = shape[0] * module.num_groups
            for r in range(world):
                ranks[r]["all_reduce"] += 8 * (groups + 1) + 8 * 2 * groups
        elif treatment == WHOLE_MAP and mixin in QUIET:
            pass  # its decoder's call counts it, or it exchanges nothing itself
        elif treatment == WHOLE_MAP and mixin == VIT:
            # per attention, keys and values of the patch tokens (B, T, rows, W, inner) gathered by rows
            b, _, frames, _, width = shape
            for attn in _token_attentions(module):
                row = b * frames * width * attn.to_k.out_features * itemsize
                for r in range(world):
                    ranks[r]["all_gather"] += 2 * max(extents) * scale * row
        elif treatment == WHOLE_MAP and mixin == LINEAR:
            linear, heads, d = _linear_attention(module, shape)
            for r in range(world):
                if linear:  # the fp32 score matrix, summed over the ranks
                    ranks[r]["all_reduce"] += shape[0] * heads * (d + 1) * d * 4
                else:  # keys and values, each rank's slice padded to the longest
                    ranks[r]["all_gather"] += 2 * max(extents) * scale * shape[0] * heads * d * shape[-1] * itemsize
        elif treatment == WHOLE_MAP:
            row = _prod(shape) // shape[-2] * itemsize
            gathers = _maps_gathered(mixin, module)
            norms = getattr(module, "group_norm", None)
            for r in range(world):
                ranks[r]["all_gather"] += gathers * max(extents) * scale * row
                if isinstance(norms, torch.nn.GroupNorm):  # an attention's own GroupNorm, whole-map statistics
                    ranks[r]["all_reduce"] += 8 * (3 * shape[0] * norms.num_groups + 1)
    row = _prod(out_shape) // out_shape[-2] * itemsize
    scale = out_shape[-2] // latent_rows
    for r in range(world):
        ranks[r]["assemble"] += extents[r] * scale * row
    return [dict(c) for c in ranks]


def tile_bytes(vae, z, world: int, itemsize: int) -> list[dict[str, int]]:
    """Each rank's payload bytes by kind for tile mode over `world` ranks."""
    ops = family_for(vae).decode_tile_ops(vae, z)
    tiles = ops.all_tiles() if ops is not None else ()
    if len(tiles) <= 1:  # one tile: rank 0 decodes and broadcasts it (a header, then the values)
        with torch.no_grad():
            out = vae.decode(z).sample
        return [{"control": 72, "broadcast": out.numel() * itemsize}] + [{} for _ in range(world - 1)]
    shapes = [ops.out_shape(t.in_shape(z.shape)) for t in tiles]
    common = [max(dims) for dims in zip(*shapes)]
    count = max(len(a) for a in tile_mod.balance(tiles, world))
    return [{"tile_gather": count * _prod(common) * itemsize} for _ in range(world)]


# -- predicted time -------------------------------------------------------------------------------

# H100 SXM's NVLink 4: 18 links of 25 GB/s each way, 450 GB/s per direction per GPU; the model takes
# that as what one GPU can send (and receive) at once, and a latency per operation for NCCL's launch
# and its first bytes on the link.
LINK_BYTES_PER_S = 450e9
LATENCY_S = 10e-6


def link_bytes(kind: str, payload: int, world: int) -> float:
    """Bytes one rank sends on its links for a `kind` payload, under NCCL's ring algorithms: an
    all-gather (and the assembly's broadcasts, and tile mode's gather) passes every other rank's
    slice on, (N-1) x; an all-reduce 2 (N-1) / N x; a halo exchange or a broadcast once."""
    if world == 1:
        return 0.0
    if kind in ("all_gather", "assemble", "tile_gather"):
        return (world - 1) * payload
    if kind == "all_reduce":
        return 2 * (world - 1) / world * payload
    return float(payload)


def operations(traced, world: int) -> int:
    """Collective or point-to-point operations one rank waits on in a spatial decode (each a latency)."""
    if world == 1:
        return 0
    calls, _ = traced
    per_call = {HALO: 1, GLOBAL_NORM: 2}

    def ops(treatment, mixin, module, shape) -> int:
        if treatment in per_call:
            return per_call[treatment]
        if mixin == LINEAR:  # one all-reduce, or two gathers
            return 1 if _linear_attention(module, shape)[0] else 2
        return _maps_gathered(mixin, module)

    count = sum(ops(t, m, mod, shape) for t, m, mod, shape, _ in calls)
    return count + world - 1  # the assembly: one broadcast per rank


# Each family's common resolution, its latent (bf16) and its one-GPU decode on vaeshard's default tier
# where BENCHMARKS.md has one (seconds, and the row it comes from); None: bytes only.
_ONE = "BENCHMARKS.md, every family, one GPU:"
_H100, _H200 = f"{_ONE} H100", f"{_ONE} H200"
PRESETS = {
    "wan21-720p": ("wan21", (1, 16, 21, 90, 160), 1.460, f"Wan 2.1 720p 81 frames, {_H100}"),
    "wan22-720p": ("wan22", (1, 48, 31, 44, 80), 3.095, "Wan 2.2 720p, 1 GPU, one H200 (0.2.0)"),
    "hunyuanvideo15-720p": ("hunyuanvideo15", (1, 32, 9, 45, 80), 1.626, f"HunyuanVideo 1.5 720p 33 frames, {_H200}"),
    "hunyuanvideo-720p": ("hunyuanvideo", (1, 16, 9, 90, 160), 3.899, f"HunyuanVideo 720p 33 frames, {_H100}"),
    "cogvideox-480p": ("cogvideox", (1, 16, 13, 60, 90), 1.263, f"CogVideoX 720 x 480 49 frames, {_H100}"),
    "mochi-480p": ("mochi", (1, 12, 14, 60, 106), 1.058, f"Mochi 848 x 480 79 frames, {_H200}"),
    "ltx-704p": ("ltx", (1, 128, 16, 22, 38), 0.192, f"LTX-Video 704 x 1216 121 frames, {_H100}"),
    "ltx2-1088p": ("ltx2", (1, 128, 16, 34, 60), 0.624, f"LTX-2 1088 x 1920 121 frames, {_H100}"),
    "flux1-2048": ("flux1", (1, 16, 256, 256), 0.423, f"FLUX.1 2048^2, {_H100}"),
    "flux2-1024": ("flux2", (1, 32, 128, 128), 0.086, "FLUX.2 1024^2, one H200"),
    "sdxl-1024": ("sdxl", (1, 4, 128, 128), 0.094, f"SDXL 1024^2, {_H100}"),
    "dcae-4096": ("dc-ae-f32c32-sana-1.0", (1, 32, 128, 128), None, ""),
    "minimax_h3-720p": ("minimax_h3", (1, 24, 22, 45, 80), None, ""),
    "ltx2_diffusion_decoder-704p": ("ltx2_diffusion_decoder", (1, 128, 16, 22, 38), None, ""),
}


def _meta_vae(config_name: str):
    import diffusers

    diffusers.utils.logging.set_verbosity_error()  # its note on keeping layers in float32 is about loading
    cls, config = vaeshard.named_configs()[config_name]
    with torch.device("meta"):
        vae = getattr(diffusers, cls)(**config).to(torch.bfloat16)
    vae.use_tiling = False  # the spatial modes' decode (MiniMax-H3 tiles by default)
    return vae


def predict(preset: str, ranks) -> dict:
    """The model's figures for `preset` on each rank count: the busiest rank's payload and link bytes
    by kind, its operations, and the predicted time (communication, and with the one-GPU decode
    split N ways where BENCHMARKS.md has one)."""
    config_name, shape, one_gpu_s, source = PRESETS[preset]
    vae = _meta_vae(config_name)
    z = torch.empty(shape, device="meta", dtype=torch.bfloat16)
    traced = _calls(vae, z)
    rows = []
    for world in ranks:
        per_rank = spatial_bytes(vae, z, world, 2, traced) if world > 1 else [{}]
        busiest = max(per_rank, key=lambda kinds: sum(kinds.values()))
        link = max(sum(link_bytes(k, b, world) for k, b in kinds.items()) for kinds in per_rank)
        comm_s = link / LINK_BYTES_PER_S + operations(traced, world) * LATENCY_S
        rows.append(
            {
                "ranks": world,
                "payload_bytes": busiest,
                "payload_total": sum(busiest.values()),
                "link_bytes": link,
                "operations": operations(traced, world),
                "comm_s": comm_s,
                "time_s": None if one_gpu_s is None else one_gpu_s / world + comm_s,
            }
        )
    return {
        "preset": preset,
        "config": config_name,
        "latent": list(shape),
        "dtype": "bfloat16",
        "one_gpu_s": one_gpu_s,
        "one_gpu_source": source,
        "strategy": "spatial_shard_height",
        "rows": rows,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default=",".join(PRESETS), help="comma-separated; default: all")
    parser.add_argument("--ranks", default="1,2,3,4,5,6,7,8", help="rank counts, comma-separated")
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    ranks = [int(r) for r in args.ranks.split(",")]
    out = {
        "model": "payload bytes from the shard plan and meta-device shapes; not a measurement",
        "link_bytes_per_s": LINK_BYTES_PER_S,
        "latency_s": LATENCY_S,
        "presets": [],
    }
    for preset in args.presets.split(","):
        result = predict(preset, ranks)
        out["presets"].append(result)
        print(f"{preset} {tuple(result['latent'])} bf16, spatial_shard_height (model, not measured)")
        print(f"  {'ranks':>5} {'payload/rank':>13} {'link/rank':>10} {'ops':>5} {'comm':>9} {'time':>8}")
        for row in result["rows"]:
            time_s = "-" if row["time_s"] is None else f"{row['time_s']:.3f} s"
            print(f"  {row['ranks']:>5} {row['payload_total'] / 2**20:>9.1f} MiB {row['link_bytes'] / 2**20:>6.1f} MiB "
                  f"{row['operations']:>5} {row['comm_s'] * 1e3:>6.2f} ms {time_s:>8}")  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
