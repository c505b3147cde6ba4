"""The fast tier's frame loop for causal video decoders that diffusers runs over the whole clip at once
(HunyuanVideo 1.5): peak memory then follows the frames of one decoder call, not the clip's.

A family declares its loop as a `FrameLoop`: the decoder's `head`, run over the whole clip at latent
resolution (where it is cheap, and where layers that see every earlier frame, such as a causal
attention, run as they are), and its `body`, run on one chunk of the head's frames at a time: latent
frame 0 alone first, then the plan's `frames_per_step` frames per call. Each chunk's output goes
straight into one preallocated output (clamped where the VAE's decode clamps), or is handed over as
it is made (`stream_decode`).

Inside a body call the loop is active: a causal convolution takes the frames before the chunk from
its cache, which holds the last frames of its previous input (`cached_front`, used by
causal_conv.py's mixins), and a layer with a rule for the clip's first frame (an upsampler that
upsamples it in space only) applies it only where `first_chunk()` is True. Every output frame is
then made from the same input values as in the whole-clip decode: on CPU the same bits, elsewhere
within the fast tier's tolerances (the convolutions may pick other algorithms for other lengths).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..layers import tier
from ..runtime import requests


@dataclass(frozen=True)
class FrameLoop:
    """A family's frame loop, as data.

    head:  (decoder, z) -> the body's input for the whole clip, one frame per latent frame.
    body:  (decoder, chunk of the head's frames) -> the chunk's output frames.
    frames_out: (vae, latent frames) -> the decode's output frames (after any dropped).
    drop_front: (vae, latent frames) -> the frames the decode drops from the start of the decoder's
        output (Mochi's `_decode`); None: none.
    decoder: the VAE's attribute holding the decoder.
    clamp: the VAE's decode clamps its output to [-1, 1].
    """

    head: Callable
    body: Callable
    frames_out: Callable
    drop_front: Callable | None = None
    decoder: str = "decoder"
    clamp: bool = False


class _Chunk:
    """The loop's state while a body call runs: whether its chunk starts the clip, and each causal
    convolution's cache (by module), carried from call to call."""

    __slots__ = ("first", "caches")

    def __init__(self, first: bool, caches: dict):
        self.first = first
        self.caches = caches


def _running() -> _Chunk | None:
    """The running body call's state (the request's `loop`, runtime/requests.py), or None."""
    request = requests.current()
    return None if request is None else request.loop


def active() -> bool:
    """Whether a frame loop's body call is running (its causal convolutions cache their input)."""
    return _running() is not None


def first_chunk() -> bool:
    """Whether the running body call's chunk starts the clip (True outside a frame loop: the call
    then gets the whole clip)."""
    state = _running()
    return state is None or state.first


def cached_front(module, padded: torch.Tensor, front: int) -> torch.Tensor:
    """`padded`, a causal convolution's input with `front` frames in front of its new frames (the
    first frame repeated, as replicate padding gives), as the whole clip's would be: in a later chunk
    its front frames are the last `front` frames of the previous call's `padded` (the module's cache);
    in the first chunk they stay the clip's first frame. Keeps its own last `front` frames as the next
    call's cache. Outside a frame loop, `padded` as it is."""
    state = _running()
    if state is None or front == 0:
        return padded
    if not state.first:
        padded[:, :, :front].copy_(state.caches[id(module)])
    # a copy: a view would keep the whole input alive between calls
    state.caches[id(module)] = padded[:, :, padded.shape[2] - front :].clone()
    return padded


def num_steps(frames: int, per_step: int) -> int:
    """The body calls of `frames` latent frames: the first frame alone, then `per_step` per call."""
    return 1 + -(-(frames - 1) // per_step) if frames > 0 else 0


def run(loop: FrameLoop, vae, z: torch.Tensor, per_step: int, whole: bool):
    """The frame loop, a generator: each body call's final frames (`whole=False`), or once the whole
    output (`whole=True`). Between two yields no loop state is active, so a consumer runs with its
    own; closing it early drops the caches and the head's frames."""
    decoder = getattr(vae, loop.decoder)
    num_frames = z.shape[2]
    total = loop.frames_out(vae, num_frames)
    drop = 0 if loop.drop_front is None else loop.drop_front(vae, num_frames)
    head = loop.head(decoder, z)
    caches: dict = {}
    out, filled, start = None, 0, 0
    while start < num_frames:
        stop = 1 if start == 0 else min(start + per_step, num_frames)
        with requests.scoped(loop=_Chunk(start == 0, caches)):
            y = loop.body(decoder, head[:, :, start:stop])
        if drop:  # (a view: the frames kept are copied into the output or the chunk below)
            cut = min(drop, y.shape[2])
            y, drop = y[:, :, cut:], drop - cut
        if filled + y.shape[2] > total:
            raise RuntimeError(f"vaeshard: the decoder gave more frames than the {total} expected")
        if whole:
            if out is None:  # one contiguous output: no torch.cat copying what was decoded so far
                out = y.new_empty((*y.shape[:2], total, *y.shape[3:]))
            into = out[:, :, filled : filled + y.shape[2]]
            if loop.clamp:
                torch.clamp(y, min=-1.0, max=1.0, out=into)
            else:
                into.copy_(y)
        filled += y.shape[2]
        start = stop
        if not whole:
            chunk = torch.clamp(y, min=-1.0, max=1.0) if loop.clamp else y.contiguous()
            del y
            yield chunk
            del chunk
        else:
            del y
    del head
    caches.clear()
    if filled != total:
        raise RuntimeError(f"vaeshard: the decoder gave {filled} frames, {total} expected")
    if whole:
        yield out


def per_step() -> int:
    """The request's latent frames per body call after the first (1 outside the fast tier)."""
    return (tier.current() or tier.FastPlan()).frames_per_step


def decode(loop: FrameLoop, vae, z: torch.Tensor) -> torch.Tensor:
    """The whole decode of `z` by the frame loop, at the request's frames per call."""
    return next(run(loop, vae, z, per_step(), whole=True))


def stream(loop: FrameLoop, vae, z: torch.Tensor):
    """(number of chunks, an iterator of them): Family.stream_decode's answer for the frame loop."""
    steps = per_step()
    return num_steps(z.shape[2], steps), run(loop, vae, z, steps, whole=False)


def direct_decode(vae, z: torch.Tensor, untiled_decode: Callable, own_decode_runs: Callable) -> torch.Tensor:
    """One rank's whole decode (Family.direct_decode) for a family with a frame loop: the loop
    (`untiled_decode`) where it gives what the VAE's own `decode` would (`own_decode_runs(vae, z)` is
    False: its tiling does not tile this latent, no accelerate hook wraps `decode`), else that `decode`.
    (A sliced batch arrives one sample at a time: vaeshard splits it.)"""
    if tier.enabled() and not own_decode_runs(vae, z):
        return untiled_decode(vae, z)
    return type(vae).decode(vae, z, return_dict=False)[0]


def stream_decode(loop: FrameLoop, vae, z: torch.Tensor, whole: bool, own_decode_runs: Callable, check=None):
    """The loop's chunks (Family.stream_decode); None in the exact tier (diffusers decodes the clip at
    once) or where a direct request runs the VAE's own decode (its tiling, a hook). `check(vae)` runs
    first where the loop streams."""
    if not tier.enabled() or (whole and own_decode_runs(vae, z)):
        return None
    if check is not None:
        check(vae)
    return stream(loop, vae, z)
