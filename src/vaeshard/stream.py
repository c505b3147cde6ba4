"""`stream_decode`: a decode's frames handed over as the decoder makes them.

The request is admitted like a decode (api.admit: the check and the agreement) and run by the same
executor (api.execute), one decoder step at a time: each step's frames are final when its step ends
(the family's `stream_decode`: Wan's and Qwen-Image's frame loop, the fast tier's of HunyuanVideo 1.5
and Mochi 1, CogVideoX's frame batches), are placed per `output` (shared from rank 0, or assembled
from the shards) and yielded; strategies and families without a frame loop yield once, as `decode`
does. Between two steps nothing of the request is active on the consumer's side: the request and its
contexts (no_grad, the fast tier's plan, the shard, the group's timeout) are entered for each step
only.

Before every step after the first the ranks agree, through the group's store, that every consumer
still wants the rest: a rank whose consumer closed the stream says so, and every rank then releases
the request (the VAE's caches, the step's buffers) and the others raise `StreamClosed`. No collective
is left half done, so the group stays usable.
"""

from __future__ import annotations

import torch

from .api import admit, execute, recorded
from .config import STATE_ATTR
from .runtime.requests import StreamClosed


class DecodeStream:
    """The iterator `stream_decode` returns: pixel chunks (B, C, t, H, W) in frame order. Use it in a
    `with` block (or call `close()`) when the loop may stop early: that ends the request on every
    rank at once. A `for` loop that runs to the end needs neither."""

    def __init__(self, vae, latents, decode_kwargs: dict):
        self._chunks = _chunks(vae, latents, decode_kwargs)

    def __iter__(self) -> DecodeStream:
        return self

    def __next__(self) -> torch.Tensor:
        return next(self._chunks)

    def close(self) -> None:
        """End the request here (the other ranks learn it before their next step); idempotent."""
        self._chunks.close()

    def __enter__(self) -> DecodeStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def stream_decode(vae, latents, **decode_kwargs) -> DecodeStream:
    """Decode `latents` with a parallelized `vae`, chunk by chunk: an iterator of pixel chunks
    (B, C, t, H, W) in frame order, each yielded as soon as it is final, on the ranks that the VAE's
    `output` names (an empty tensor on the others, so every rank iterates alike). The chunks'
    concatenation along frames is `vae.decode(latents, **decode_kwargs).sample` bit for bit.

    Every rank of the group must iterate it (it is lazy: nothing runs before the first `next`).
    Causal video VAEs with a frame loop (Wan, Qwen-Image, CogVideoX) yield once per decoder step;
    the `tile` strategy, a sliced batch and the other families yield the whole decode once. Closing it
    early (`close()`, or leaving its `with` block) ends the request on every rank: the others raise
    StreamClosed at their next step. While it is open the VAE takes no other request on this rank.
    """
    if getattr(vae, STATE_ATTR, None) is None:
        raise TypeError(
            f"stream_decode needs a VAE made parallel with vaeshard.parallelize(vae); got a plain {type(vae).__name__}"
        )
    if decode_kwargs.pop("return_dict", True) is not True:
        raise TypeError("stream_decode yields tensors: return_dict does not apply")
    return DecodeStream(vae, latents, decode_kwargs)


def _chunks(vae, z, decode_kwargs: dict):
    if getattr(vae, "use_slicing", False) and isinstance(z, torch.Tensor) and z.dim() and z.shape[0] > 1:
        yield vae.decode(z, **decode_kwargs).sample  # decoded one sample at a time: the whole batch, once
        return
    state = getattr(vae, STATE_ATTR)
    with recorded(vae, "decode", z) as record:
        inputs, _ = state.family.call_arguments("decode", (), decode_kwargs)
        request = admit(vae, "decode", z, inputs, record)
        state.streaming = True
        try:
            yield from execute(request, stream=True)
        finally:
            state.streaming = False


__all__ = ["DecodeStream", "StreamClosed", "stream_decode"]
