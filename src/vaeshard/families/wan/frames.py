"""Wan's frame loop: diffusers' untiled decode of a causal video VAE, stepped by the request's plan.

Mirrors `AutoencoderKLWan._decode` (and Qwen-Image's): the same decoder calls with the causal
feature cache threaded through, more latent frames per call where the plan says so, each call's
output clamped into one preallocated output, the steady calls replayed as one CUDA graph where the
plan says so (runtime/graphs.py).
"""

from __future__ import annotations

import torch

from ...layers import tier as fast
from ...runtime import graphs
from ...runtime import spatial as shard
from ..base import frames_out


def decode_in_steps(family, vae, z):
    """diffusers' untiled `_decode` with two changes, fast tier: after the first latent frame
    (always decoded alone, as `first_chunk`), the decoder takes the plan's `frames_per_step` frames per
    call instead of one, and each call's output is clamped straight into one preallocated output instead of
    growing a `torch.cat` (which copies everything decoded so far at every frame).

    Code, not a hook, because diffusers' loop slices one frame per call and concatenates as it
    goes. Every split of the frames gives the same values: each causal convolution sees the
    same input frames, its cached ones in front (diffusers' feature-cache bookkeeping keeps the
    last two input frames whatever the call's length). With one frame per call the decoder calls are
    diffusers' own, and so are the bits. On CUDA the steady calls may be replayed as one CUDA
    graph (runtime/graphs.py, `cuda_graphs`): the same kernels, the same bits.
    """
    (whole,) = _steps(family, vae, z, whole=True)
    return whole


def num_steps(z, per_step: int) -> int:
    """The decoder calls of `z`: the first latent frame alone, then `per_step` frames per call."""
    return 1 + -(-(z.shape[2] - 1) // per_step)


def stream_steps(family, vae, z):
    """`decode_in_steps` as (number of chunks, an iterator of them): each decoder call's frames,
    final (clamped, unpatchified), as soon as the call is done; their concatenation is
    `decode_in_steps(z)` bit for bit. In the exact tier one latent frame per call, as diffusers'."""
    per_step = (fast.current() or fast.FastPlan()).frames_per_step
    return num_steps(z, per_step), _steps(family, vae, z, whole=False)


def _steps(family, vae, z, whole: bool):
    """The frame loop, a generator: yields each call's final frames (`whole=False`), or once the whole
    output clamped into one buffer (`whole=True`). Between two yields nothing of the request is
    active (its GPU work runs in `steps.region()`), so a consumer runs on its own stream and state.
    Closing it early clears the feature cache and ends the request's graphs alike."""
    _, _, num_frames, _, _ = z.shape
    total = frames_out(num_frames, family.temporal_factor(vae))
    plan = fast.current() or fast.FastPlan()  # the request's choices, made alike on every rank (vaeshard.plan)
    per_step = plan.frames_per_step

    def step(chunk, first: bool):
        vae._conv_idx = [0]
        if first and family.decoder_takes_first_chunk:
            return vae.decoder(chunk, feat_cache=vae._feat_map, feat_idx=vae._conv_idx, first_chunk=True)
        return vae.decoder(chunk, feat_cache=vae._feat_map, feat_idx=vae._conv_idx)

    # the calls after the first that take `per_step` frames have one shape: CUDA graphs replay them
    keep = _keep_graphs(vae, z, per_step) if plan.keep_cuda_graphs else None
    with graphs.DecoderSteps(z.device, plan.cuda_graphs, num_steps(z, per_step), keep) as steps:
        vae.clear_cache()
        try:
            with steps.region():
                x = vae.post_quant_conv(z)
            out, filled, start = None, 0, 0
            while start < num_frames:
                stop = 1 if start == 0 else min(start + per_step, num_frames)
                with steps.region():
                    y = steps.call(
                        lambda c, first=(start == 0): step(c, first),
                        x[:, :, start:stop],
                        vae._feat_map,
                        steady=start > 0 and stop - start == per_step,
                    )
                    if filled + y.shape[2] > total:
                        raise RuntimeError(f"vaeshard: the decoder gave more frames than the {total} expected")
                    if whole:
                        if out is None:  # contiguous, as diffusers'
                            out = steps.hand_over(y.new_empty((*y.shape[:2], total, *y.shape[3:])))
                        torch.clamp(y, min=-1.0, max=1.0, out=out[:, :, filled : filled + y.shape[2]])
                    else:
                        chunk = steps.hand_over(torch.clamp(y, min=-1.0, max=1.0))
                    filled += y.shape[2]
                    del y
                start = stop
                if not whole:
                    # a permutation: clamping before it gives diffusers' values
                    yield family._unpatchify(vae, chunk)
                    del chunk
            del x
        finally:
            vae.clear_cache()
    if filled != total:
        raise RuntimeError(f"vaeshard: the decoder gave {filled} frames, {total} expected")
    if whole:
        yield family._unpatchify(vae, out)


def _keep_graphs(vae, z: torch.Tensor, per_step: int) -> tuple:
    """(owner, signature, anchors) for graphs.DecoderSteps' `keep`: a kept graph serves a later
    request only with the same signature: the decoder calls' input shapes, dtype and device, the
    frames per call, the tier's settings, the shard (axis, extents, this rank, the process group)
    and where the decoder's weights lie and their versions. The group is held in `anchors`, so its
    identity stays its own while the graphs are kept."""
    ctx = shard.current()
    group = None if ctx is None else ctx.comm.group
    where = None if ctx is None else (ctx.axis, tuple(ctx.extents), ctx.comm.rank, ctx.comm.world, id(group))
    signature = (
        (*z.shape[:2], *z.shape[3:]),
        z.dtype,
        z.device,
        per_step,
        torch.is_grad_enabled(),
        where,
        fast.signature(),
        graphs.tensors_signature(vae.decoder),
    )
    return vae, signature, (group,)
