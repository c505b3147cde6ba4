#!/usr/bin/env python3
"""GPU parity: every mode and tier against diffusers' single-process decode, fp32 (TF32 off) and bf16.

Run on a GPU machine, one process per GPU (not part of CI):

    torchrun --standalone --nproc_per_node=2 benchmarks/gpu_parity.py --out parity.jsonl
    python3 benchmarks/gpu_parity.py                                # one GPU, no torchrun needed
    python3 benchmarks/gpu_parity.py --device cpu --small           # a smoke run of the script on CPU

By default Wan 2.1 and Wan 2.2, fp32 and bf16, every mode in the fast and the exact tier. Every rank
builds the same random-weight VAE (real configs, torch.manual_seed(0); `--small`: tiny configs of the
same classes) and the same latent. Rank 0 computes diffusers' decodes with an unparallelized copy of
the model: in the row's dtype and, as the reference, in fp32 with TF32 off, of the same weights (the
fp32 ones the bf16 model was cast from) and the same latent (in a bf16 run, its bf16 values). Which
decode a row is compared with follows from its strategy and the VAE's own tiling: `tile` with
diffusers' tiled decode; a direct decode with the VAE's decode as configured (its tiled one where its
tiling is on and tiles the latent); a spatial shard with the untiled decode. A class whose tiling is
on by default (MiniMax-H3: its released output is the tiled decode) is checked twice: with its tiling
on (`tile` and `auto`, labelled "[tiling on]") and off (the other modes, "[tiling off]"). A decoder
that draws noise (LTX-2.5's diffusion decoder) gets the same noise on both sides: a fresh generator of
one seed where its decode takes one, the global RNG seeded alike before every decode. Each mode's
result is judged on rank 0 by the exactness contract (BENCHMARKS.md, "Exactness on the GPU"), `judge`
below:

  bit-identical  `tile` (against diffusers' tiled decode) and an exact-tier direct decode (against
                 diffusers' decode), in either dtype
  fp32           max |diff| to diffusers' fp32 decode (TF32 off) at most 1e-4
  bf16           from the fp32 reference, vaeshard's mean |diff| at most 1.10x and its max |diff| at
                 most 1.25x those of diffusers' own bf16 decode, and max |diff| to diffusers' bf16
                 output at most 5e-2

A row whose plan (strategy, tier, fast-tier choices) equals an earlier row's of the same model and
dtype runs the same code on the same inputs: it is reported with that row's figures, not decoded
again (on one rank, for instance, the forced spatial modes fall back to auto's direct decode);
`--repeat-same-plans` decodes it anyway. `tile` is left out for a class vaeshard has no tiled decode
for (LTX-2.5's diffusion decoder). `--compile-flex`: FlexAttention compiled for diffusers' decodes (LTX-2.5's
diffusion decoder: diffusers' eager FlexAttention holds every query's scores against every key, more
than a GPU holds at any real-config grid; vaeshard's sharded windows do not use it). Exits 1 if any row fails.

    python3 benchmarks/gpu_parity.py stream --out stream.jsonl [--config wan21] [--shape 1,16,9,60,104]

`stream`: `vaeshard.stream_decode`'s chunks, concatenated, against `vae.decode` bit for bit (the
default fast tier, with CUDA graphs on a GPU, and the exact tier), and the CLI writer's path for the
decode's device (on CUDA: GPU quantise, pinned side-stream copy) against the CPU quantisation of the
same chunks. One JSON line per check; exits 1 if any fails.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import inspect
import json
import logging
import math
import os
import sys

import torch
import torch.distributed as dist

import vaeshard
from vaeshard.cli.io import NAMED_CONFIGS
from vaeshard.families import tiny_configs
from vaeshard.runtime.graphs import CAPTURED

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memory_model import steps_setting


class CaptureCounter(logging.Handler):
    """Counts the CUDA graph captures vaeshard logs (graphs.CAPTURED), so a row says whether it replayed."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record):
        self.count += record.getMessage().startswith(CAPTURED)


# 9 latent frames: the fast tier's default at these frame sizes on CUDA takes 2 per decoder call
# (frames_per_step "auto"), 5 calls, of which the last two replay a CUDA graph (cuda_graphs "auto")
SHAPES = {
    "wan21": (1, 16, 9, 30, 52),
    "wan22": (1, 48, 9, 22, 40),
    "qwenimage": (1, 16, 3, 30, 52),
    "flux2": (1, 32, 64, 64),  # 512 x 512
    "hunyuanvideo15": (1, 32, 3, 16, 24),  # 9 frames of 256 x 384
    "qwenimage21": (1, 64, 1, 32, 32),  # 512 x 512
    "ltx": (1, 128, 2, 8, 12),  # 9 frames of 256 x 384
    "ltx2": (1, 128, 2, 8, 11),  # edge tiles of 2 latent columns: LTX-2's reflect padding needs them
    "hunyuanvideo": (1, 16, 3, 32, 48),  # 9 frames of 256 x 384 (too few for diffusers' temporal tiles)
    "cogvideox": (1, 16, 3, 32, 48),  # 9 frames of 256 x 384, two latent-frame batches
    "mochi": (1, 12, 3, 32, 48),  # 13 frames of 256 x 384
    # 26 frames of 288 x 384: two clips (the second padded by repeated latent frames), each 2 x 2 tiles
    # of diffusers' default 256 pixels (tiling on) or one token sequence of 3024 tokens (tiling off)
    "minimax_h3": (1, 24, 8, 18, 24),
    "dc-ae-f32c32-sana-1.0": (1, 32, 16, 24),  # 512 x 768: 3 x 4 tiles of 256 pixels every 192
    # 17 frames of 256 x 256: the fewest frames its stage-5 window (11) takes; either axis shards over 2
    # ranks (4 latent rows each, stage 1's 7-wide window). Needs --compile-flex on a GPU: diffusers' eager
    # FlexAttention would hold 4 x 69632^2 fp32 stage-5 scores (78 GB)
    "ltx2_diffusion_decoder": (1, 128, 3, 8, 8),
    "flux1": (1, 16, 64, 64),  # 512 x 512
    "sdxl": (1, 4, 64, 64),  # 512 x 512
}
TILES = (128, 96)  # diffusers' tile size and stride in sample pixels for the tiled decodes
# where a model needs others: LTX-2's tiled decode divides sample sizes by its spatial_compression_ratio,
# 64 in diffusers' default config (whose decoder is 32x), so 128-pixel tiles would be 2 latent columns
# every 1, and the last tile's single column is more than its reflect padding can take
# MiniMax-H3: its own default (256-pixel tiles, at least 64 pixels of overlap: its released output);
# DC-AE: 8 latent rows every 6 of its 32x latent (128-pixel tiles would be 4 latent rows every 3)
TILES_FOR = {"ltx2": (256, 192), "minimax_h3": (256, 192), "dc-ae-f32c32-sana-1.0": (256, 192)}
# seconds a request waits for every rank (its agreement): rank 0 makes diffusers' decodes (the tiled
# ones when the first tile row needs them) while the other ranks wait for it in their next request
AGREEMENT_TIMEOUT_S = 900.0

# --small: tiny configs of the same classes (a CPU smoke run of the script), tiles small enough to tile:
# the families' own test configs, and FLUX.2's layout at the class's default sample size
SMALL_CONFIGS = {
    **{
        name: tiny_configs()[name]
        for name in ("wan21", "wan22", "qwenimage", "hunyuanvideo15", "minimax_h3", "ltx2_diffusion_decoder")
    },
    "dc-ae-f32c32-sana-1.0": tiny_configs()["dcae"],  # the f32c32 layout: conv down, nearest-interpolate up
    "flux1": tiny_configs()["autoencoder_kl_flux"],
    "sdxl": tiny_configs()["autoencoder_kl"],
    "flux2": (
        "AutoencoderKLFlux2",
        {
            "block_out_channels": (8, 16),
            "down_block_types": ("DownEncoderBlock2D",) * 2,
            "up_block_types": ("UpDecoderBlock2D",) * 2,
            "layers_per_block": 1,
            "norm_num_groups": 4,
            "latent_channels": 8,
        },
    ),
}
SMALL_SHAPES = {
    "wan21": (1, 4, 2, 4, 6),
    "wan22": (1, 4, 2, 2, 3),
    "qwenimage": (1, 4, 2, 4, 6),
    "flux2": (1, 8, 20, 24),
    "hunyuanvideo15": (1, 4, 3, 8, 12),
    "minimax_h3": (1, 4, 4, 6, 8),  # two clips (the second padded), 2 x 3 tiles of 32 pixels
    "dc-ae-f32c32-sana-1.0": (1, 4, 12, 16),
    "ltx2_diffusion_decoder": (1, 4, 2, 4, 6),
    "flux1": (1, 16, 12, 16),
    "sdxl": (1, 4, 20, 24),
}
SMALL_TILES = (32, 16)
# parameters diffusers starts at zero where that hides a computation from the check, seeded here as the
# tests seed them (tests/models.py): MiniMax-H3's residual scales (at zero every transformer block is an
# identity, its attention unchecked) and register tokens
SEEDED_ZEROS = {"AutoencoderKLMiniMaxH3": ("scale1", "scale2", "register_tokens")}
NOISE_SEED = 2  # the seed of a noise-drawing decoder's generator (and the global RNG) before each decode

# --- the exactness contract (BENCHMARKS.md, "Exactness on the GPU") -----------------------------------
FP32_MAX = 1e-4  # fp32, TF32 off: max |diff| to diffusers' fp32 decode
BF16_MEAN_RATIO = 1.10  # bf16: mean |diff| from the fp32 reference, as a multiple of diffusers' bf16 decode's
BF16_MAX_RATIO = 1.25  # bf16: max |diff| from the fp32 reference, likewise
BF16_MAX_TO_DIFFUSERS = 5e-2  # bf16: max |diff| to diffusers' bf16 output
RULES = ("bit-identical", "fp32", "bf16")


def rule_for(strategy: str, exact: bool, dtype: str, batched: bool = False) -> str:
    """The part of the contract a row is judged by: `tile` and an exact-tier direct decode are
    bit-identical to diffusers' (tiled / untiled) decode in any dtype, except `auto`'s tiles in the
    fast tier decoded as batches (`batched`: the plan's tile strategy has a fast plan, MiniMax-H3's),
    which are within the fast tier's tolerance; everything else by its dtype."""
    if (strategy == "tile" and not batched) or (strategy == "direct" and exact):
        return "bit-identical"
    return "fp32" if dtype == "fp32" else "bf16"


def ratio(a: float, b: float) -> float:
    """How many times as far `a` is as `b` (1.0 where both are 0, inf where only `b` is)."""
    if b > 0:
        return a / b
    return 1.0 if a == 0 else math.inf


def judge(rule: str, row: dict) -> tuple[bool, list[str]]:
    """(pass, the limits that failed) of one row's figures by `rule` (RULES).

    `row`: bit_identical (vaeshard's output equals diffusers' in the same dtype), max_diff (max |diff|
    to it), fp32_max / fp32_mean (vaeshard from the fp32 reference), diffusers_fp32_max /
    diffusers_fp32_mean (diffusers' same-dtype decode from it: the bf16 rule's yardstick), and
    optionally graphs ('!': a CUDA graph replay differed from the eager decode, which always fails).
    A NaN anywhere fails the limit it is in."""
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}: one of {', '.join(RULES)}")
    failed = []
    if rule == "bit-identical":
        if not row["bit_identical"]:
            failed.append(f"not bit-identical (max |diff| {row['max_diff']:.3e})")
    elif rule == "fp32":
        if not row["max_diff"] <= FP32_MAX:
            failed.append(f"max |diff| {row['max_diff']:.3e} > {FP32_MAX:g}")
    else:
        mean_ratio = ratio(row["fp32_mean"], row["diffusers_fp32_mean"])
        max_ratio = ratio(row["fp32_max"], row["diffusers_fp32_max"])
        if not mean_ratio <= BF16_MEAN_RATIO:
            failed.append(f"mean |diff| from fp32 {mean_ratio:.3f}x diffusers' bf16 > {BF16_MEAN_RATIO:.2f}x")
        if not max_ratio <= BF16_MAX_RATIO:
            failed.append(f"max |diff| from fp32 {max_ratio:.3f}x diffusers' bf16 > {BF16_MAX_RATIO:.2f}x")
        if not row["max_diff"] <= BF16_MAX_TO_DIFFUSERS:
            failed.append(f"max |diff| to diffusers' bf16 {row['max_diff']:.3e} > {BF16_MAX_TO_DIFFUSERS:g}")
    if row.get("graphs") == "!":
        failed.append("the CUDA graph replay differs from the eager decode")
    return not failed, failed


def distances(
    out: torch.Tensor,
    diffusers_out: torch.Tensor,
    reference: torch.Tensor,
    diffusers_from_reference: tuple[float, float] | None = None,
) -> dict:
    """A row's figures (`judge`'s `row`, with the ratios) of vaeshard's output `out` against diffusers'
    output in the same dtype and the fp32 `reference`; `diffusers_from_reference`: (max, mean) of
    diffusers' output from the reference, if already known."""
    o = out.float()
    to = (o - diffusers_out.float()).abs()
    fr = (o - reference).abs()
    if diffusers_from_reference is None:
        d = (diffusers_out.float() - reference).abs()
        diffusers_from_reference = (d.max().item(), d.mean().item())
    row = {
        "max_diff": to.max().item(),
        "mean_diff": to.mean().item(),
        "bit_identical": out.dtype == diffusers_out.dtype and bool(torch.equal(out, diffusers_out)),
        "fp32_max": fr.max().item(),
        "fp32_mean": fr.mean().item(),
        "diffusers_fp32_max": diffusers_from_reference[0],
        "diffusers_fp32_mean": diffusers_from_reference[1],
    }
    row["ratio_max"] = ratio(row["fp32_max"], row["diffusers_fp32_max"])
    row["ratio_mean"] = ratio(row["fp32_mean"], row["diffusers_fp32_mean"])
    return row


def _plan_key(plan: vaeshard.Plan) -> tuple:
    """What decides a request's computation: its strategy, tier and fast-tier choices (not their reasons)."""
    fast = plan.fast
    if fast is None:
        return plan.strategy, None
    return plan.strategy, tuple(
        (f.name, getattr(fast, f.name)) for f in dataclasses.fields(fast) if f.name != "reasons"
    )


def _shown(x) -> str:
    return f"{x:9.2e}" if isinstance(x, float) else f"{'-':>9}"


def _times(x) -> str:
    return f"{x:5.2f}x" if isinstance(x, float) and math.isfinite(x) else f"{'-' if x is None else 'inf':>6}"


HEADER = (
    f"{'model':6} {'dtype':5} {'mode':30} {'strategy':20} {'max|d|':>9} {'mean|d|':>9} {'exact':>5} "
    f"{'fp32 max':>9} {'fp32 mean':>9} {'dif. max':>9} {'dif. mean':>9} {'r max':>6} {'r mean':>6} graphs ok"
)


def format_row(r: dict) -> str:
    line = (
        f"{r['model']:6} {r['dtype']:5} {r['mode']:30} {r['strategy']:20} {_shown(r['max_diff'])} "
        f"{_shown(r['mean_diff'])} {r['bit_identical']!s:>5} {_shown(r['fp32_max'])} {_shown(r['fp32_mean'])} "
        f"{_shown(r['diffusers_fp32_max'])} {_shown(r['diffusers_fp32_mean'])} {_times(r.get('ratio_max'))} "
        f"{_times(r.get('ratio_mean'))} {r.get('graphs', '-'):>6} {r['ok']}"
    )
    if r.get("same_plan_as"):
        line += f" (same plan as {r['same_plan_as']})"
    if r.get("failed"):
        line += "  " + "; ".join(r["failed"])
    return line


def _parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="gpu_parity.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--models",
        default="wan21,wan22",
        help="named configs (vaeshard.cli.io) with a shape in SHAPES (default wan21,wan22)",
    )
    ap.add_argument("--dtypes", default="fp32,bf16", help="fp32, bf16 or both (default fp32,bf16)")
    ap.add_argument("--modes", default=",".join(vaeshard.MODES))
    ap.add_argument("--out", default=None, help="write each row as a JSON line here")
    ap.add_argument(
        "--frames-per-step",
        default="auto",
        help="fast-tier frames_per_step values to check, e.g. auto,1,2 (default auto, the library's)",
    )
    ap.add_argument("--max-layer-frames", default="", help="fast-tier max_layer_frames values to check as well, e.g. 2")
    ap.add_argument(
        "--norm-into-conv",
        choices=("auto", "on", "off"),
        default="auto",
        help="fast-tier norm_into_conv of every fast row (default auto, the library's)",
    )
    ap.add_argument("--shapes", default=None, help="override, e.g. wan21=1,16,2,6,8;wan22=1,48,2,4,6")
    ap.add_argument(
        "--device",
        choices=("auto", "cuda", "cpu"),
        default="auto",
        help="default: cuda where available (NCCL under torchrun), else cpu (gloo)",
    )
    ap.add_argument(
        "--small",
        action="store_true",
        help="tiny configs of the same classes and small latents (a smoke run of the script, e.g. on CPU)",
    )
    ap.add_argument(
        "--compile-flex",
        action="store_true",
        help="FlexAttention through torch.compile for diffusers' decodes (LTX-2.5's diffusion decoder: eager "
        "FlexAttention holds every query's scores against every key; vaeshard's sharded windows do not use it)",
    )
    ap.add_argument(
        "--repeat-same-plans",
        action="store_true",
        help="decode a row whose plan equals an earlier row's again, instead of reporting that row's figures",
    )
    args = ap.parse_args(argv)
    for d in args.dtypes.split(","):
        if d not in ("fp32", "bf16"):
            ap.error(f"--dtypes: fp32 or bf16, not {d!r}")
    for m in args.modes.split(","):
        if m not in vaeshard.MODES:
            ap.error(f"--modes: one of {', '.join(vaeshard.MODES)}, not {m!r}")
    configs = SMALL_CONFIGS if args.small else NAMED_CONFIGS
    for m in args.models.split(","):
        if m not in configs or m not in SHAPES:
            ap.error(f"--models: one of {', '.join(k for k in configs if k in SHAPES)}, not {m!r}")
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["stream"]:
        return stream(argv[1:])
    args = _parse_args(argv)
    torchrun = "WORLD_SIZE" in os.environ
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        if torchrun:
            dist.init_process_group("nccl", device_id=device)
    else:  # a CPU run of the script itself (gloo under torchrun); --small keeps it quick
        device = torch.device("cpu")
        if torchrun:
            dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if torchrun else (0, 1)
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if args.compile_flex:
        compile_flex()
    captures = CaptureCounter()
    logger = logging.getLogger("vaeshard")
    level = logger.level
    logger.addHandler(captures)
    logger.setLevel(logging.DEBUG)
    try:
        ok_all = _run(args, device, rank, world, captures)
    finally:
        logger.removeHandler(captures)
        logger.setLevel(level)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
        if torchrun:
            dist.destroy_process_group()
    return 0 if ok_all else 1


def _run(args, device: torch.device, rank: int, world: int, captures: CaptureCounter) -> bool:
    import diffusers

    configs = SMALL_CONFIGS if args.small else NAMED_CONFIGS
    shapes = dict(SMALL_SHAPES if args.small else SHAPES)
    for item in filter(None, (args.shapes or "").split(";")):
        name, dims = item.split("=")
        shapes[name] = tuple(int(v) for v in dims.split(","))
    tile, stride = SMALL_TILES if args.small else TILES
    rows, ok_all = [], True
    if rank == 0:
        print(
            f"torch {torch.__version__}, GPU {torch.cuda.get_device_name() if device.type == 'cuda' else 'none'}, "
            f"world {world}" + (", small configs" if args.small else "")
        )
        print("max|d|, mean|d|: vaeshard vs diffusers' decode in the same dtype (tiled for tile and for a direct")
        print("decode where the VAE's own tiling is on and tiles the latent, else untiled: the row's 'reference');")
        print("fp32 max/mean: vaeshard from the fp32 reference, diffusers' fp32 decode (TF32 off) of the same weights")
        print("and latent (the same kind); dif. max/mean: diffusers' same-dtype decode from it; r max/mean: their")
        print(
            f"ratios. ok: tile and exact direct bit-identical; fp32 max|d| <= {FP32_MAX:g}; bf16 r mean <= "
            f"{BF16_MEAN_RATIO:.2f}x, r max <= {BF16_MAX_RATIO:.2f}x, max|d| <= {BF16_MAX_TO_DIFFUSERS:g}"
        )
        print("graphs: the fast tier's CUDA graph replay (runtime/graphs.py) was used, and its result equals the same")
        print("request with cuda_graphs=False bit for bit ('=' yes, '!' no, '-' not replayed)")
        print(HEADER, flush=True)
        if args.out:
            open(args.out, "w").close()

    def emit(r):  # each row as soon as it is measured: a run cut short still leaves what it measured
        rows.append(r)
        print(format_row(r), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(r) + "\n")

    variants = [(steps_setting(k), None) for k in args.frames_per_step.split(",")]
    variants += [(1, int(m)) for m in filter(None, args.max_layer_frames.split(","))]
    runs = [
        (m, e, v)
        for m in args.modes.split(",")
        for e in (False, True)
        for v in (variants if not e else [(1, None)])
        if m != "tile" or e
    ]
    for model in args.models.split(","):
        torch.manual_seed(0)
        class_name, config = configs[model]
        base = seed_zeros(getattr(diffusers, class_name)(**config).eval())
        set_tiles(base, *((tile, stride) if args.small else TILES_FOR.get(model, (tile, stride))))
        model_runs = runs
        if not vaeshard.supported_classes()[class_name].tile_decode:  # mode tile is refused: nothing to judge
            model_runs = [r for r in runs if r[0] != "tile"]
            if rank == 0 and len(model_runs) < len(runs):
                print(f"{model}: no tile rows (vaeshard has no tiled decode of {class_name})", flush=True)
        for dname in args.dtypes.split(","):
            ok_all &= _check(args, base, model, dname, shapes[model], model_runs, device, rank, world, captures, emit)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return ok_all


def seed_zeros(vae):
    """`vae` with the parameters of SEEDED_ZEROS (by name ending) drawn from 0.3 * N(0, 1), seed 4."""
    ends = SEEDED_ZEROS.get(type(vae).__name__)
    if ends:
        g = torch.Generator().manual_seed(4)
        with torch.no_grad():
            for name, p in vae.named_parameters():
                if name.endswith(ends):
                    p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return vae


def tiling_states(vae) -> list[bool]:
    """The tiling states a model's rows run in: off, or where the class's tiling is on by default
    (MiniMax-H3, whose released output is its tiled decode) on, then off."""
    return [True, False] if getattr(vae, "use_tiling", False) else [False]


def runs_in(state: bool, states: list[bool], runs: list) -> list:
    """The runs of one tiling state: all of them for a model with one state; with tiling on, `tile`
    and `auto` (the modes whose result it decides); with it off, the others and `auto`."""
    if len(states) == 1:
        return runs
    return [r for r in runs if (r[0] in ("tile", "auto")) == state or r[0] == "auto"]


def compile_flex() -> None:
    """FlexAttention through torch.compile, for diffusers' decodes: its eager path (the one diffusers'
    processor takes) holds every query's scores against every key."""
    import torch._dynamo
    import torch.nn.attention.flex_attention as flex

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    flex.flex_attention = torch.compile(flex.flex_attention, dynamic=False)


def set_tiles(vae, tile: int, stride: int) -> None:
    """diffusers' tile size and stride in sample pixels for the tiled decodes, under the names the
    class uses. Tiling itself stays as the class leaves it (on only for MiniMax-H3, whose `_check`
    rows then run with it on and off)."""
    if hasattr(vae, "tile_sample_min_overlap_height"):  # MiniMax-H3: size and least overlap, per clip
        vae.tile_sample_min_height = vae.tile_sample_min_width = tile
        vae.tile_sample_min_overlap_height = vae.tile_sample_min_overlap_width = tile - stride
    elif hasattr(vae, "tile_sample_stride_height"):  # Wan, Qwen-Image, LTX, HunyuanVideo, Mochi, DC-AE: size, stride
        vae.tile_sample_min_height = vae.tile_sample_min_width = tile
        vae.tile_sample_stride_height = vae.tile_sample_stride_width = stride
        if hasattr(vae, "tile_latent_min_height"):  # DC-AE: whether it tiles, in latent rows (as enable_tiling sets)
            vae.tile_latent_min_height = vae.tile_latent_min_width = tile // vae.spatial_compression_ratio
    elif hasattr(vae, "tile_overlap_factor_height"):  # CogVideoX: sample and latent sizes, overlaps per axis
        ratio = 2 ** (len(vae.config.block_out_channels) - 1)
        vae.tile_sample_min_height = vae.tile_sample_min_width = tile
        vae.tile_latent_min_height = vae.tile_latent_min_width = tile // ratio
        vae.tile_overlap_factor_height = vae.tile_overlap_factor_width = 1 - stride / tile
    elif hasattr(vae, "tile_latent_min_height"):  # HunyuanVideo 1.5: sample and latent sizes, an overlap
        vae.tile_sample_min_height = vae.tile_sample_min_width = tile
        vae.tile_latent_min_height = vae.tile_latent_min_width = tile // vae.spatial_compression_ratio
        vae.tile_overlap_factor = 1 - stride / tile
    else:  # the AutoencoderKL layout: square tiles, their overlap as a fraction of the tile
        ratio = 2 ** (len(vae.config.block_out_channels) - 1)
        vae.tile_sample_min_size, vae.tile_latent_min_size = tile, tile // ratio
        vae.tile_overlap_factor = 1 - stride / tile


def diffusers_decode(vae, z, tiled: bool, noise: dict | None = None) -> torch.Tensor:
    """diffusers' own decode of `z`: its tiled decode (`tiled_decode`, or for a class without one,
    MiniMax-H3, its `decode` with tiling on, which tiles every clip), or its decode with tiling off.
    `noise`: the decoder's noise settings (`noise_inputs`), for a decoder that draws noise."""
    inputs = noise_inputs(vae, **noise) if noise else {}
    saved = getattr(vae, "use_tiling", None)
    try:
        if tiled and hasattr(vae, "tiled_decode"):
            # (LTX-Video's tiled_decode requires its `temb`, None without timestep conditioning)
            extra = {"temb": None} if "temb" in inspect.signature(vae.tiled_decode).parameters else {}
            out = vae.tiled_decode(z, **extra, **inputs)
        else:
            if saved is not None:
                vae.use_tiling = tiled
            out = vae.decode(z, **inputs)
    finally:
        if saved is not None:
            vae.use_tiling = saved
    return out.sample if hasattr(out, "sample") else out  # (some classes' tiled_decode: a tensor)


def noise_inputs(vae, draws: bool, generator: bool, device) -> dict:
    """Before a decode of a VAE whose decoder draws noise (`draws`): the global RNG seeded with
    NOISE_SEED and, where its decode takes a generator (`generator`), a fresh one of that seed, so
    every decode of the same latent (diffusers' and vaeshard's, on every rank) draws the same noise."""
    if not draws:
        return {}
    torch.manual_seed(NOISE_SEED)
    return {"generator": torch.Generator(device).manual_seed(NOISE_SEED)} if generator else {}


def _check(
    args, base, model: str, dname: str, shape, runs, device, rank: int, world: int, captures: CaptureCounter, emit
) -> bool:
    """Every run of `runs` for one model and dtype, in each of its tiling states (`tiling_states`):
    rows emitted on rank 0; whether all passed."""
    from vaeshard.families import family_for

    dtype = torch.float32 if dname == "fp32" else torch.bfloat16
    family = family_for(base)
    noise = {
        "draws": family.draws_noise(base),
        "generator": "generator" in family.call_inputs.get("decode", ()),
        "device": device,
    }
    # in `dtype` as diffusers' from_pretrained(torch_dtype=dtype) loads it (cast_as_loaded)
    plain = (
        vaeshard.cast_as_loaded(copy.deepcopy(base), dtype).to(device) if rank == 0 else None
    )  # diffusers': the references
    fp32: list = []  # rank 0, a bf16 run: the fp32 model the references are decoded by, made once
    z = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    vae = vaeshard.cast_as_loaded(copy.deepcopy(base), dtype).to(device)
    vae = vaeshard.parallelize(vae, mode="auto", timeout=AGREEMENT_TIMEOUT_S)
    states = tiling_states(base)
    ok_all = True
    for state in states:
        state_runs = runs_in(state, states, runs)
        if not state_runs:  # (no mode of this state was asked for)
            continue
        if hasattr(base, "use_tiling"):
            vae.use_tiling = state
            if plain is not None:
                plain.use_tiling = state
        suffix = (" [tiling on]" if state else " [tiling off]") if len(states) > 1 else ""
        ok_all &= _check_state(
            args, base, plain, vae, fp32, z, model, dname, suffix, state_runs, noise, world, rank, captures, emit
        )
    return ok_all


def _check_state(
    args, base, plain, vae, fp32: list, z, model, dname, suffix, runs, noise, world, rank, captures, emit
) -> bool:
    """`_check`'s runs in one tiling state (the one `vae` and `plain` are in)."""
    from vaeshard.families import family_for

    device, dtype = z.device, z.dtype
    refs: dict[str, tuple] = {}

    def reference(kind: str) -> tuple:
        """(diffusers' decode in this dtype, the fp32 reference, (max, mean) |diff| of the first from the
        second); `kind` "untiled" or "tiled". Rank 0, made when first needed."""
        if kind not in refs:
            with torch.no_grad():
                same = diffusers_decode(plain, z, kind == "tiled", noise)
                if dtype == torch.float32:  # diffusers' own decode is the reference
                    truth = same
                else:  # the fp32 weights the model was cast from, the latent's bf16 values
                    if not fp32:
                        fp32.append(copy.deepcopy(base).to(device, torch.float32))
                    truth = diffusers_decode(fp32[0], z.float(), kind == "tiled", noise)
            d = (same.float() - truth).abs()
            refs[kind] = same, truth, (d.max().item(), d.mean().item())
        return refs[kind]

    def kind_of(strategy: str) -> str:
        """The decode a row of `strategy` is compared with: `tile`'s the tiled one; a direct decode's the
        VAE's own as configured (tiled where its tiling is on and tiles this latent); a shard's the untiled."""
        if strategy == "direct":
            return "tiled" if family_for(plain).own_result(plain, "decode", tuple(z.shape)) == "tile" else "untiled"
        return "tiled" if strategy == "tile" else "untiled"

    if rank == 0:
        kind = kind_of("direct")
        same, truth, floor = reference(kind)
        if dtype != torch.float32:
            emit(
                {
                    "model": model,
                    "dtype": dname,
                    "mode": f"diffusers-{kind}{suffix}",
                    "strategy": "(reference)",
                    "world": 1,
                    "shape": list(z.shape),
                    "rule": "-",
                    "exact": True,
                    **distances(same, same, truth, floor),
                    "ref_std": same.float().std().item(),
                    "ok": True,
                }
            )
    ok_all = True
    seen: dict[tuple, dict | None] = {}  # plan -> its row (rank 0; None on the other ranks)
    for mode, exact_tier, (per_step, layer_frames) in runs:
        into_conv = {"auto": "auto", "on": True, "off": False}[args.norm_into_conv]
        fast = vaeshard.FastOptions(frames_per_step=per_step, max_layer_frames=layer_frames, norm_into_conv=into_conv)
        vaeshard.parallelize(vae, mode=mode, exact=exact_tier, fast=fast, timeout=AGREEMENT_TIMEOUT_S)
        plan = vaeshard.plan(vae, z.shape, world, mode)
        label = mode + (" exact" if exact_tier else " fast")
        label += f" k={per_step}" if per_step not in (1, "auto") else ""
        label += f" m={layer_frames}" if layer_frames else ""
        label += " into-conv" if plan.fast is not None and plan.fast.norm_into_conv else ""
        label += suffix
        key = _plan_key(plan)
        if key in seen and not args.repeat_same_plans:  # (every rank alike: the plan is shared)
            if rank == 0:
                emit(
                    {
                        **seen[key],
                        "mode": label,
                        "exact": exact_tier,
                        "fallback": plan.fallback,
                        "same_plan_as": seen[key]["mode"],
                    }
                )
            continue
        seen[key] = None
        captured = captures.count
        with torch.no_grad():
            out = vae.decode(z, **noise_inputs(vae, **noise)).sample
        graphs = "-"
        if plan.fast is not None and plan.fast.cuda_graphs:  # (every rank alike: the plan is shared)
            # the same request without graphs: the same bits?
            vaeshard.parallelize(
                vae,
                mode=mode,
                exact=exact_tier,
                fast=dataclasses.replace(fast, cuda_graphs=False),
                timeout=AGREEMENT_TIMEOUT_S,
            )
            with torch.no_grad():
                eager = vae.decode(z, **noise_inputs(vae, **noise)).sample
            if captures.count > captured:
                graphs = "=" if torch.equal(out, eager) else "!"
            del eager
        if rank != 0:
            continue
        kind = kind_of(plan.strategy)
        same, truth, floor = reference(kind)
        batched = plan.strategy == "tile" and plan.fast is not None
        rule = rule_for(plan.strategy, exact_tier, dname, batched)
        r = {
            "model": model,
            "dtype": dname,
            "mode": label,
            "strategy": plan.strategy,
            "world": world,
            "shape": list(z.shape),
            "rule": rule,
            "exact": exact_tier,
            "batched": batched,
            "fallback": plan.fallback,
            "reference": kind,
            **distances(out, same, truth, floor),
            "ref_std": same.float().std().item(),
            "graphs": graphs,
        }
        if dname == "fp32":  # (the reference is diffusers' own decode: no ratio)
            r["ratio_max"] = r["ratio_mean"] = None
        r["ok"], r["failed"] = judge(rule, r)
        ok_all &= r["ok"]
        seen[key] = r
        emit(r)
        del out
    return ok_all


def small_model(name: str):
    """The tiny config of `name`'s class (SMALL_CONFIGS), random weights (torch.manual_seed(0))."""
    import diffusers

    cls, config = SMALL_CONFIGS[name]
    torch.manual_seed(0)
    return getattr(diffusers, cls)(**config).eval()


def stream(argv: list[str]) -> int:
    """stream_decode's chunks against vae.decode, and the writer against the CPU quantisation."""
    import tempfile

    import numpy as np
    from PIL import Image

    from vaeshard.cli import io
    from vaeshard.cli.writer import ChunkWriter

    ap = argparse.ArgumentParser(prog="gpu_parity.py stream", description="stream_decode against vae.decode")
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", default="wan21")
    ap.add_argument("--shape", default="1,16,9,60,104")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--small", action="store_true", help="the tiny config of the same class (a CPU check)")
    args = ap.parse_args(argv)
    shape = tuple(int(s) for s in args.shape.split(","))
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    vae = small_model(args.config) if args.small else io.named_model(args.config).load(dtype=dtype)
    vae = vae.to(args.device, dtype)
    z = torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(args.device, dtype)
    rows = []
    for exact in (False, True):
        vaeshard.parallelize(vae, exact=exact)
        plan = vaeshard.plan(vae, z.shape)
        whole = vae.decode(z).sample
        chunks = [c.clone() for c in vaeshard.stream_decode(vae, z)]
        got = torch.cat(chunks, dim=2)
        rows.append(
            {
                "check": "stream == decode",
                "config": args.config,
                "shape": shape,
                "exact": exact,
                "cuda_graphs": bool(plan.fast and plan.fast.cuda_graphs),
                "frames_per_step": plan.fast.frames_per_step if plan.fast else 1,
                "chunks": [c.shape[2] for c in chunks],
                "ok": bool(torch.equal(got, whole)),
            }
        )
        if not exact:
            with tempfile.TemporaryDirectory() as folder:
                with ChunkWriter(os.path.join(folder, "frames"), "frames") as writer:
                    for chunk in chunks:
                        writer.write(chunk)
                expected = io.to_uint8_frames(got.cpu())
                same = all(
                    np.array_equal(
                        np.asarray(Image.open(os.path.join(folder, "frames", f"{t:05d}.png")).convert("RGB")),
                        expected[0, t],
                    )
                    for t in range(expected.shape[1])
                )
            rows.append({"check": f"{args.device} writer == CPU quantisation", "frames": expected.shape[1], "ok": same})
        del whole, chunks, got
    with open(args.out, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
            print(json.dumps(row))
    return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
