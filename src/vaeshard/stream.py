"""`stream_decode`: a decode's frames handed over as the decoder makes them.

The request is admitted like a decode (api.admit: the check and the agreement), planned alike, then
run one decoder step at a time: each step's frames are final when its step ends (the family's
`stream_decode`: Wan's and Qwen-Image's frame loop, the fast tier's of HunyuanVideo 1.5 and Mochi 1,
CogVideoX's frame batches), are placed per
`output` (shared from rank 0, or assembled from the shards) and yielded; strategies and families
without a frame loop yield once. Between two steps nothing of the request is active on the
consumer's side: its contexts (no_grad, the fast tier's plan, the shard, the group's timeout) are
entered for each step only.

Before every step after the first the ranks agree, through the group's store, that every consumer
still wants the rest: a rank whose consumer closed the stream says so, and every rank then releases
the request (the VAE's caches, the step's buffers) and the others raise `StreamClosed`. No collective
is left half done, so the group stays usable.
"""

from __future__ import annotations

import contextlib
import logging

import torch

from .api import admit, choose, direct, recorded
from .config import STATE_ATTR, agreement_timeout
from .families.base import passing_inputs
from .layers import tier
from .runtime import spatial
from .runtime.comm import CommTimeout
from .runtime.tile import run_tiled

log = logging.getLogger("vaeshard")


class StreamClosed(RuntimeError):
    """Another rank closed its stream before the end: the request ended on every rank."""


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
    if vae.use_slicing and isinstance(z, torch.Tensor) and z.dim() and z.shape[0] > 1:
        yield vae.decode(z, **decode_kwargs).sample  # decoded one sample at a time: the whole batch, once
        return
    with recorded(vae, "decode", z) as record:
        yield from _recorded_chunks(vae, z, decode_kwargs, record)


def _recorded_chunks(vae, z, decode_kwargs: dict, record):
    state = getattr(vae, STATE_ATTR)
    family, config = state.family, state.config
    inputs, _ = family.call_arguments("decode", (), decode_kwargs)
    with passing_inputs(inputs):
        state, comm, hooked = admit(vae, "decode", z)
    z = z.contiguous()
    timeout = config.timeout_seconds
    state.streaming = True
    source = None
    try:
        chosen = choose(vae, config, comm, "decode", z, hooked)
        record.strategy = chosen.strategy
        to_all = config.output == "all"

        @contextlib.contextmanager
        def step(shard=None):
            """The request's scope for one step (no yield inside it)."""
            with contextlib.ExitStack() as scope:
                scope.enter_context(torch.no_grad())
                scope.enter_context(tier.active(chosen.fast))
                scope.enter_context(passing_inputs(inputs))
                scope.enter_context(comm.bounded())
                if shard is not None:
                    scope.enter_context(spatial.sharding(shard))
                yield

        def placed(chunk):
            return z.new_empty(0) if chunk is None else chunk

        if chosen.strategy == "tile":
            with step():
                ops = family.decode_tile_ops(vae, z)
                out = run_tiled(ops, comm, comm.world if config.size is None else min(config.size, comm.world), to_all)
            yield placed(out)
            return
        if chosen.strategy == "direct":
            with step():
                source = family.stream_decode(vae, z, whole=True)
                if source is None:
                    out = direct(vae, family, "decode", z) if comm.rank == 0 else None
                    if comm.rank != 0:
                        family.replay_draws(vae, z)
                    if to_all:
                        out = comm.share_from_rank0(out)
            if source is None:
                yield placed(out)
                return
            count, chunks = source

            def shared():
                with step():
                    chunk = next(chunks) if comm.rank == 0 else None
                    return placed(comm.share_from_rank0(chunk) if to_all else chunk)

            yield from _stepped(comm, count, shared, timeout, record)
            return
        axis = spatial.HEIGHT if chosen.strategy == "spatial_shard_height" else spatial.WIDTH
        local, shard, dim = spatial.shard_of(comm, z, axis, 1)
        with step(shard):
            source = family.stream_decode(vae, local, whole=False)
            if source is None:
                out = spatial.assemble(shard, family.untiled_decode(vae, local), dim, to_all)
        if source is None:
            yield placed(out)
            return
        count, chunks = source

        def assembled():
            with step(shard):
                return placed(spatial.assemble(shard, next(chunks), dim, to_all))

        yield from _stepped(comm, count, assembled, timeout, record)
    finally:
        if source is not None:
            source[1].close()  # the family's loop: its caches and the request's graphs end here
        with torch.no_grad():
            family.release(vae)
        state.streaming = False


def _stepped(comm, count: int, produce, timeout, record):
    """`count` steps, each `produce()` (one decoder step, its chunk placed) yielded; before every step
    after the first the ranks agree to go on (`_carry_on`), and a consumer that closes the stream says
    so to the others (`_close`)."""
    for k in range(count):
        if k:
            try:
                _carry_on(comm, k, count, timeout)
            except StreamClosed:
                record.status = "closed"
                raise
        chunk = produce()
        try:
            yield chunk
        except GeneratorExit:
            record.status = "closed"
            _close(comm, k, count, timeout)
            raise
        del chunk


def _carry_on(comm, k: int, count: int, timeout) -> None:
    """Before step `k`: every rank says whether its consumer still wants the rest (through the store:
    bounded, no collective left pending); StreamClosed on every rank if one does not."""
    rows = _agree(comm, 1, timeout)
    closed = [r for r, row in enumerate(rows) if not row[0]]
    if closed:
        raise StreamClosed(
            f"stream_decode: rank(s) {closed} closed the stream after {k} of {count} chunks; the request "
            "ended on every rank (every rank must consume the same chunks; close it on every rank alike)"
        )


def _close(comm, k: int, count: int, timeout) -> None:
    """This rank's consumer closed the stream after chunk `k`: tell the others at their next step
    (nothing to tell after the last chunk). A rank that cannot be told fails its own wait, bounded."""
    if k + 1 >= count or comm.world == 1:
        return
    try:
        _agree(comm, 0, timeout)
    except CommTimeout as exc:
        log.warning("vaeshard: stream_decode closed on rank %d; the other ranks could not be told: %s", comm.rank, exc)


def _agree(comm, wants: int, timeout) -> list[list[int]]:
    if comm.world == 1:
        return [[wants]]
    seconds, bound = agreement_timeout(timeout)
    return comm.agree([wants], seconds, "stream_decode", bound)


__all__ = ["DecodeStream", "StreamClosed", "stream_decode"]
