"""Every measured threshold of vaeshard, in one table.

A threshold here decides something per request (how many latent frames a decoder call takes,
whether a request replays CUDA graphs, which layers run in parts); `policy.plan` reads them when it
resolves a request, so a request's choices are made once, from numbers every rank shares. The
kernels' own measured configurations (tilings, the channel counts each kernel takes) live with their
kernels, which import nothing of vaeshard; their entries below say where.

`TABLE` holds, for each entry, what it decides and the measurement behind it; docs/tuning.md is
generated from it (`python -m vaeshard.tuning > docs/tuning.md`, checked by the tests), so no timing
figure needs to live in a docstring or comment. All figures are one NVIDIA H200 (two for the 2-GPU
ones), bf16, Wan's real configs with random weights, interleaved A/B in one process unless said.
"""

from __future__ import annotations

from typing import NamedTuple

# --- frames per decoder call (frames_per_step="auto") -------------------------------------------------
AUTO_STEP_FRAMES = 2
AUTO_STEP_MAX_PIXELS = 1 << 18
AUTO_STEP_DEVICES: tuple[str, ...] = ("cuda",)
AUTO_STEP_ANY_FRAME_FAMILIES: tuple[str, ...] = ("mochi",)  # AUTO_STEP_FRAMES whatever the frame's size

# --- layers in parts of frames (max_layer_frames=None) -----------------------------------------------
PART_FRAMES: int | None = 2
PARTS_FROM_PIXELS = 1 << 18
SHARDED_PARTS_FROM_PIXELS = 3 << 17

# --- CUDA graphs (cuda_graphs="auto") ----------------------------------------------------------------
GRAPHS_MAX_PIXELS = 1 << 18
GRAPHS_MIN_REPLAYS = 2

# --- the first request ------------------------------------------------------------------------------
CUDNN_BENCHMARK = False  # FastOptions.cudnn_benchmark's default

# --- copies -------------------------------------------------------------------------------------------
COPY_FRAMES_MAX = 32

# --- auto's axis -------------------------------------------------------------------------------------
# Wan's decode_axis: a CUDA decode over this many ranks of a VAE whose full-resolution layers have
# this many channels is sharded by height.
WAN_HEIGHT_RANKS = 2
WAN_HEIGHT_BASE_DIM = 96

# --- norms writing into the next convolution's input (norm_into_conv="auto") ---------------------------
NORM_INTO_CONV_BUFFER_FAMILIES: tuple[str, ...] = ("hunyuanvideo15", "ltx", "ltx2", "mochi", "qwenimage21")
# families whose fast tier runs only where a request sets norm_into_conv=True, on every device
NORM_INTO_CONV_ONLY_FAMILIES: tuple[str, ...] = ("autoencoder_kl",)

# --- never slower than diffusers ----------------------------------------------------------------------
# families whose fast tier measured slower than diffusers' decode on one GPU, whose bf16 output there is
# not within the bf16 rule, or which is not yet measured there: their CUDA requests run diffusers' layers
# (the exact tier), and explain() says so
FAST_TIER_SLOWER_FAMILIES: tuple[str, ...] = ("cogvideox", "hunyuanvideo")

# --- GroupNorm in PyTorch's arithmetic (kernels/group_norm_same.py) -------------------------------------
# whether requests that may (layers/tier.py `same_kernels`) run their unsharded GroupNorms through the kernels
# that give PyTorch's bits
GROUP_NORM_SAME_KERNELS = True
# the fewest elements of a map those kernels normalise (smaller ones: PyTorch's kernel, the same bits)
GROUP_NORM_SAME_MIN_ELEMENTS = 1 << 23

# --- batched tiles (Family.fast_tiles) ------------------------------------------------------------------
# the most tokens MiniMax-H3's fast tier decodes in one batch of tiles (whole tiles, at least one)
MINIMAX_BATCH_TOKENS = 1 << 14


class Entry(NamedTuple):
    name: str  # the constant here, or "module.NAME" for a value defined with a kernel
    decides: str
    measured: str


TABLE: tuple[Entry, ...] = (
    Entry(
        "CUDNN_BENCHMARK",
        "whether the fast tier turns cuDNN's benchmark mode on (FastOptions.cudnn_benchmark's default): on, "
        "a process's first request of each convolution shape times cuDNN's algorithms",
        "Wan 2.1 720p 81 frames, a fresh process each: the first decode 3.42 s with benchmark mode, 2.31 s "
        "without; the later ones 1.27 / 1.20 s with it, 1.27 / 1.25 s without "
        "(benchmarks/results/2026-12-02/first-request/). The steady decode (`vaeshard bench`, 3 after a warm-up, "
        "on / off): Wan 2.1 480p 0.528 / 0.544 s and 0.526 / 0.555 s in two calls, so a long-lived process of "
        "many 480p requests gains 3-5% with --cudnn-benchmark; Wan 2.2 720p 3.005 / 3.013 s "
        "(benchmarks/results/2026-12-02/stream-wan22/)",
    ),
    Entry(
        "AUTO_STEP_FRAMES",
        "latent frames per decoder call after the first, for frames_per_step='auto' where the "
        "rule below holds (else 1)",
        "Wan 2.1 480p, rank 0 of 2 (832 x 240 pixels a frame), a rank's share timed alone: 0.291 / 0.319 s with 2 "
        "frames against 0.309 / 0.332 s with 1 (peak 1.91 against 1.48 GiB); 720p rank 1 of 4: 0.348 / 0.324 against "
        "0.402 / 0.381 s; rank 1 of 8: 0.206 / 0.194 against 0.232 / 0.237 s "
        "(benchmarks/results/2026-12-01/steps-auto/)",
    ),
    Entry(
        "AUTO_STEP_MAX_PIXELS",
        "the largest rank's output frame, in pixels, up to which frames_per_step='auto' takes "
        "AUTO_STEP_FRAMES (every rank decides alike)",
        "above it the memory runs out first: Wan 2.1 720p on 2 GPUs (460,800 pixels a rank) took 3.62 -> 5.97 GiB "
        "per rank for 6% of time with 2 frames",
    ),
    Entry(
        "AUTO_STEP_DEVICES",
        "the devices on which frames_per_step='auto' may take more than one frame",
        "on the CPU a call's work dwarfs its fixed costs (host launches, halo exchanges)",
    ),
    Entry(
        "PART_FRAMES",
        "frames per part where a layer runs in parts by default (None: never)",
        "two frames are still hundreds of the kernels' tiles; a residual block's part buffer of two frames becomes "
        "its convolution's next cache, so the parts copy no cache",
    ),
    Entry(
        "PARTS_FROM_PIXELS",
        "the frame size, in pixels, from which the upsamplers and the residual blocks whose "
        "convolutions read their caches where they lie run in parts of PART_FRAMES",
        "Wan 2.1 720p on one H200: 1.183 against 1.198 s and 5.81 against 6.47 GiB peak",
    ),
    Entry(
        "SHARDED_PARTS_FROM_PIXELS",
        "the same, for a sharded request (the largest rank's frames)",
        "Wan 2.1 720p, rank shares timed alone: rank 0 of 2 (460,800 pixels) 0.605-0.607 s with parts against "
        "0.612-0.613 s without; rank 1 of 3 (311,040 pixels, host-paced) 0.440 / 0.615 s against 0.438 / 0.575 s; "
        "the threshold lies between",
    ),
    Entry(
        "GRAPHS_MAX_PIXELS",
        "the largest rank's output frame, in pixels, up to which cuda_graphs='auto' replays a "
        "request's steady decoder calls",
        "2 H200s: Wan 2.1 480p on 2 GPUs (832 x 240 a rank) 0.478 s replayed against 0.572 s eager; 720p on 2 GPUs "
        "0.887 against 0.841 s, on 1 GPU 1.539 against 1.527 s (the GPU paces those)",
    ),
    Entry(
        "GRAPHS_MIN_REPLAYS",
        "steady calls that must follow a capture for it to be made",
        "a capture costs about one eager call's host time plus the graph's instantiation",
    ),
    Entry(
        "COPY_FRAMES_MAX",
        "frames copied one at a time (each a plain memory copy) rather than by one strided copy",
        "Wan 2.1 720p on 2 H200s, sharded by height: 0.798 against 0.809 s",
    ),
    Entry(
        "WAN_HEIGHT_RANKS",
        "Wan family: auto shards a CUDA decode over this many ranks by height, where WAN_HEIGHT_BASE_DIM holds",
        "see WAN_HEIGHT_BASE_DIM",
    ),
    Entry(
        "WAN_HEIGHT_BASE_DIM",
        "Wan family: the full-resolution channel count (Wan 2.1, Qwen-Image) for which height was measured faster",
        "2 H200s: Wan 2.1 720p 0.843 s by height against 0.888 s by width, 480p 0.580 against 0.602 s; Wan 2.2 "
        "(256 channels) within 1% either way, so it keeps the baseline rule",
    ),
    Entry(
        "AUTO_STEP_ANY_FRAME_FAMILIES",
        "the families whose frame loop takes AUTO_STEP_FRAMES latent frames per call on CUDA whatever the frame's "
        "size (frames_per_step='auto'; the others: only up to AUTO_STEP_MAX_PIXELS)",
        "Mochi 848 x 480 79 frames (1, 12, 14, 60, 106), one H100, against diffusers' untiled decode in the same "
        "call: 1 frame per call 2.308 s (0.98x diffusers' 2.253 s), peak 7.17 GiB; 2 frames per call: "
        "1.287 s (1.74x), 7.78 GiB (2026-12-06/families-h100/, call 3; BENCHMARKS.md's Mochi row: later code)",
    ),
    Entry(
        "FAST_TIER_SLOWER_FAMILIES",
        "the families whose CUDA requests run diffusers' layers although the fast tier was asked for, because "
        "their fast tier measured slower than diffusers' decode on one GPU, its bf16 output is not within "
        "the bf16 rule there, or it is not yet measured there (norm_into_conv=True runs it)",
        "CogVideoX with its norms into the next convolutions, one H100: faster, but at gpu_parity.py's shape "
        "its bf16 output is further than 5e-2 from diffusers', though as close to the fp32 decode as "
        "diffusers' own (2.61x at 720 x 480 49 frames, 2026-12-06/families-h100/, call 3; BENCHMARKS.md's "
        "CogVideoX rows and the paragraph after them). HunyuanVideo, one H100, 480 x 832 33 frames: its fast "
        "tier 1.11x diffusers, 8.2e-2 from diffusers' bf16 output (2026-12-06/shares/, call V); diffusers' "
        "layers with GroupNorm in PyTorch's arithmetic (GROUP_NORM_SAME_KERNELS) faster, bit for bit "
        "(BENCHMARKS.md's HunyuanVideo row)",
    ),
    Entry(
        "GROUP_NORM_SAME_KERNELS",
        "whether requests that may (the fast tier, and the exact tier of a request that asked for the fast "
        "tier) run their unsharded GroupNorms, with a declared SiLU after them, through "
        "kernels/group_norm_same.py: PyTorch's CUDA GroupNorm in its own order of operations, checked against "
        "it bit for bit on the device before use",
        "one H100, bf16, PyTorch 2.11: bit for bit with PyTorch (fp16 and fp32 not: PyTorch's kernel runs "
        "there); GroupNorm + SiLU of a (1, 128, 9, 368, 640) map 1.41 ms against PyTorch's 7.97 ms (call X); "
        "whole decodes bit for bit with diffusers' and faster: BENCHMARKS.md's image, HunyuanVideo and "
        "CogVideoX rows (2026-12-06/shares/, call Y)",
    ),
    Entry(
        "GROUP_NORM_SAME_MIN_ELEMENTS",
        "the fewest elements of a map whose GroupNorm kernels/group_norm_same.py computes; a smaller map's "
        "runs PyTorch's kernel (the same bits): the three launches cost more than they save there",
        "one H100, bf16, GroupNorm + SiLU against PyTorch's: 2^20 to 2^22 elements 0.20-0.21 ms against "
        "0.06-0.10 ms, 6.3 M 0.22 against 0.21 ms, 2^23 0.19 against 0.29 ms (2026-12-06/shares/, call X)",
    ),
    Entry(
        "kernels/group_norm_same.py WIDTH",
        "how many of its elements a lane of the GroupNorm statistics kernel folds per step, as many more "
        "loaded ahead (8, 16 or 32)",
        "one H100, bf16, statistics of a (1, 128, 9, 368, 640) map: 8 1.144 ms, 16 0.851, 32 0.889; of "
        "(1, 256, 512, 512): 0.776, 0.385, 0.353; SDXL 1024^2 decodes 1.81x diffusers with 16 and 32, "
        "1.73x with 8 (2026-12-06/shares/, call X)",
    ),
    Entry(
        "MINIMAX_BATCH_TOKENS",
        "the most tokens MiniMax-H3's fast tier decodes in one batch of a rank's tiles of one shape (whole "
        "tiles, at least one): a bound on the batch's activations",
        "MiniMax-H3 720p 81 frames with the fused blocks (fast/token_blocks.py), one H100, one process "
        "(benchmarks/minimax_ab.py), A B A B: 2**14 tokens against 2**16, BENCHMARKS.md's MiniMax-H3 rows and "
        "the paragraph after them (2026-12-06/families-h100/, call 5a): 2**16 tokens gain a few percent for "
        "about 2.5 times the peak, so the default keeps 2**14 (ten tiles of 256 pixels and six latent frames)",
    ),
    Entry(
        "NORM_INTO_CONV_BUFFER_FAMILIES",
        "the families whose declared norm + SiLU write into the next convolution's padded input buffer "
        "(fast/producers.py) with norm_into_conv='auto'",
        "HunyuanVideo 1.5 480p 61 frames (1, 32, 16, 30, 53), one H100, against diffusers' untiled decode in the "
        "same call: `--norm-into-conv off` 2.582 s (1.05x), 5.93 GiB; `on` 1.537 s (1.64x), 4.59 GiB "
        "(2026-12-06/families-h100/, call 1). LTX-Video 704 x 1216 121 frames and Mochi 848 x 480 79 frames, "
        "`on`, against diffusers' decode in one process (`profile_decode.py video`): 1.89x and 1.74x, both "
        "within the bf16 rule at gpu_parity.py's shapes (call 3); LTX-2 1088 x 1920 121 frames the same way, "
        "1.86x and within the rule (call 4; without its norms into convolutions it ran 0.96x, call 1). "
        "Qwen-Image 2.1 1328^2, `on`, one H100: faster than diffusers' decode in one process and within the "
        "bf16 rule at gpu_parity.py's shape (BENCHMARKS.md's row; 2026-12-06/shares/, call A2). "
        "BENCHMARKS.md's rows: the current code. A family joins after such an A/B",
    ),
    Entry(
        "NORM_INTO_CONV_ONLY_FAMILIES",
        "the families whose fast tier (channels-last convolutions, the GroupNorms + SiLU written into them) runs "
        "only where a request sets norm_into_conv=True, on every device; elsewhere diffusers' layers",
        "autoencoder_kl, one H100: FLUX.1 1024^2 and 2048^2 and SDXL 1024^2 faster, but at gpu_parity.py's "
        "shapes its bf16 output is further than 5e-2 from diffusers', though as close to the fp32 decode as "
        "diffusers' own (BENCHMARKS.md's FLUX.1 and SDXL rows and the paragraph after them; "
        "2026-12-06/families-h100/, call 3). Without the GroupNorm kernels its channels-last "
        "convolutions had run 0.66x diffusers (FLUX.2 1024^2, 2026-12-02/families/)",
    ),
    Entry(
        "kernels/conv3d.py TILES",
        "the Triton convolution's tiles by output channels (96 = 64 + 32 on 256 voxels; "
        "192 = 128 + 64 on 128 voxels), and which counts it takes (96, 192, powers of two up to 128)",
        "benchmarks/conv_kernel.py --sweep: about 400 TFLOP/s for cuDNN at 96 channels (two 64-channel tiles, the "
        "second half idle; its 192- and 384-channel kernels 520-740), 600-670 for the kernel at 192 where cuDNN ran "
        "560-600; Wan 2.2's 256 channels ran 1.09x cuDNN alone and its decode no faster",
    ),
    Entry(
        "kernels/conv3d.py adds_in_epilogue",
        "whether the Triton convolution adds a residual as it stores",
        "benchmarks/conv_kernel.py --residual, against cuDNN plus the add pass: row tiles 1.37-1.43x at 96 channels "
        "and 1.05-1.19x at 192; wrapping tiles 1.11-1.16x on 128 voxels (192 channels) but 0.83-0.91x on 256 (96 "
        "channels: twice the registers per thread in the epilogue), where the kernel without the residual ran "
        "1.06-1.24x before the pass, so those leave the add to a pass",
    ),
    Entry(
        "kernels/conv3d.py norms_in_epilogue",
        "whether a convolution computes the next RMS norm as it stores",
        "benchmarks/conv_kernel.py --norm, against the kernel then the norm kernel: Triton kernel at 96 channels, "
        "row tiles 4-5% faster, wrapping tiles 7-8%; at 192 row tiles the same on one GPU and 6% faster by height, "
        "wrapping tiles within 1% (1.561 against 1.552 ms). box_conv, 720p on 1 GPU: 3.42 against 3.78 ms alone and "
        "the decode 1.1% faster, but two convolution inputs alive at once (peak 7.13 against 6.80 GiB on 1 GPU, 3.61 "
        "against 3.44 on 2); with its buffers holding only the new frames no memory more, but the decode slower "
        "(1.268 against 1.253 s), so box_conv leaves the norm to its kernel",
    ),
    Entry(
        "kernels/conv3d.py wants_zero_columns",
        "whether a buffer holds the width padding as zero columns, for the "
        "Triton kernel's wrapping tiles, where row tiles do not fit the width",
        "Wan 2.1 480p (832 columns): the wrapping tiles 1.20-1.25x cuDNN at 96 channels and 0.96-1.03x at 192, the "
        "decode 2.5-4.5% faster",
    ),
    Entry(
        "kernels/conv3d.py reads_front",
        "whether a causal convolution reads its time padding from the cache "
        "where it lies (box_conv's kernel) instead of from a copy of the cache in front of its new frames",
        "Wan 2.1 720p on one H200: 1.271 s and 6.47 GiB peak against 1.284 s and 6.80 GiB with the copy, the same "
        "bits; the kernel alone up to 10% slower at the 96-channel full-resolution shapes (reading through a second "
        "set of descriptors; benchmarks/conv_kernel.py --front)",
    ),
    Entry(
        "fast/norm_parts.py PART_BYTES",
        "the float32 temporaries of one part of an LTX-Video or LTX-2 RMS norm in the fast tier (parts of whole "
        "frames; a norm of fewer frames runs whole)",
        "not measured: a bound on the norm's memory (diffusers' whole-map norms hold 6.2 GiB of temporaries "
        "at LTX-Video 704 x 1216 121 frames, by a meta-device count of its decode)",
    ),
    Entry(
        "kernels/box_conv.py ROUTED",
        "whether the fast tier's route hands Wan's 96- and 192-channel 3x3x3 convolutions and its head to the "
        "Gluon kernel (off: the Triton kernel and cuDNN run them)",
        "one H100, Triton 3.6, Wan 2.1 480p, four processes decoding at once: 11 of 12 decodes through it had "
        "non-finite values in a stretch of frames, 0 of 12 with it left out, 0 of 16 with the route off; one "
        "process alone: none either way (benchmarks/results/2026-12-06/gpu-checks/). Routed, it had taken the "
        "Wan 2.1 720p decode from 1.376 to 1.324 s on one H200 (entry PLANS)",
    ),
    Entry(
        "kernels/box_conv.py PLANS",
        "the Gluon convolution's tilings by output channels (96: 16 x 16 voxels, 3 "
        "slots, TMA stores; 192: 8 x 16 with all 192 channels, registers; 3: the head)",
        "benchmarks/conv_kernel.py --box-sweep, 720p, 1 GPU: 96 channels 2.86-2.88 ms against 3.13-3.36 with 4 slots "
        "and stores from registers, 3.05-3.07 before the TMA stores, 2 slots 0.84-0.90x cuDNN, the rows in registers "
        "2.98-3.05 ms (stored from registers, the patches kept both warp groups from multiplying 10-16% of the time, "
        "by warp-state samples); 192 channels: 8 x 16 voxels with all 192 channels 2.60 ms against 2.86 for two "
        "channel tiles of 96 on 16 x 16 and 2.87 for the Triton kernel, with TMA stores and the rows in registers "
        "2.42 against 2.61-2.89 ms (by height 1.27 against 1.34-1.41). At 96 channels the kernel ran 1.04-1.20x the "
        "Triton kernel before the TMA stores and 1.02-1.15x its former self with them; in the Wan 2.1 720p decode "
        "the TMA stores took 1.368 to 1.324 s on 1 GPU at 96 channels and 1.300 to 1.280 s at 192 (0.764 to 0.745 "
        "and 0.720 to 0.711 s on 2). 384 channels (0.71-0.91x cuDNN) and 256 (0.70-1.04x) are left to cuDNN",
    ),
    Entry(
        "kernels/norm.py TILE",
        "the norm and bias kernels' tile (elements, voxels, warps per program)",
        "the fastest summed over the Wan 2.1 720p shapes, by 3% over 8192 / 128 / 4 (benchmarks/kernel_costs.py norm)",
    ),
    Entry(
        "kernels/attention.py SCORES_BYTES",
        "the most bytes of fp32 scores one block of query rows holds",
        "Wan's 384-channel single-head attention: 2.3-2.6x PyTorch's memory-efficient kernel at 720p (2.3x at Wan "
        "2.1 720p's 14,400 tokens), which runs at about 120-140 TFLOP/s there: PyTorch's flash and cuDNN kernels "
        "take heads of at most 256 channels",
    ),
    Entry(
        "kernels/phases.py takes_addend",
        "whether the upsampler's interleaving pass adds Wan 2.2's duplicating "
        "shortcut as it stores (else kernels/norm.py add_duplicated_, one Triton pass after it; without Triton, "
        "PyTorch's add of broadcasting views)",
        "Wan 2.2 720p on one H200: 3.052 s with the add in the interleaving pass against 3.072 s with the pass after "
        "it; that pass 3.371 s against 3.417 s with PyTorch's add of the views",
    ),
    Entry(
        "kernels/triton_support.py launch",
        "whether a Triton launch goes straight to the compiled kernel kept for "
        "its arguments' key, rather than through the JIT function, which binds and classifies every argument again",
        "on an H200's host the JIT's binding took about 60 of the 245 us the host spent per box_conv launch and 16 "
        "of 73 per norm launch (benchmarks/kernel_costs.py launch)",
    ),
)


def _value(name: str):
    """An entry's value: a constant of this module, or of the kernel module it names."""
    if " " not in name:
        return globals()[name]
    import importlib

    path, attr = name.split(" ", 1)
    module = importlib.import_module("vaeshard." + path[: -len(".py")].replace("/", "."))
    value = getattr(module, attr)
    return "(a rule in code)" if callable(value) else value


def _shown(value) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 4096:
        exp = value.bit_length() - 1
        if value == 1 << exp:
            return f"2^{exp} ({value:,})"
        if value % (1 << (exp - 1)) == 0:
            return f"{value >> (exp - 1)} x 2^{exp - 1} ({value:,})"
        return f"{value:,}"
    return repr(value)


def markdown() -> str:
    """docs/tuning.md."""
    lines = [
        "# Tuning: every measured threshold",
        "",
        "Generated from `src/vaeshard/tuning.py` by `python -m vaeshard.tuning`; do not edit. Each entry is a",
        "value vaeshard chooses by, what it decides and the measurement behind it (one H200, two for 2-GPU",
        "figures, bf16, the real Wan configs with random weights). `vaeshard.plan(vae, shape)` shows which of",
        "these a request's choices came from. The current end-to-end figures are in [BENCHMARKS.md](../BENCHMARKS.md).",
        "",
        "| name | value | decides | measured |",
        "|---|---|---|---|",
    ]
    for entry in TABLE:
        value = _shown(_value(entry.name)).replace("|", "\\|")
        lines.append(f"| `{entry.name}` | {value} | {entry.decides} | {entry.measured} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
