"""CUDA graphs for the steady calls of a causal video decoder (fast tier, CUDA).

A causal video decoder is called once per latent frame (or per `frames_per_step` frames). From its
third call on, every call of a request has the same shapes and takes the same path through the
Python code; only the values of its input and of the causal feature caches change. `DecoderSteps`
captures one such call as a CUDA graph and replays it for the calls after it: the GPU runs the same
kernels, with the same arguments, in the same order (the same bits), and the host launches one graph
instead of a few hundred kernels and halo exchanges. Where the host issues kernels more slowly than
the GPU runs them (small shards: many GPUs, or a small video on a few), the decode then goes at the
GPU's pace.

What makes a replay compute what the eager call would:
- the input is copied into a fixed tensor before each replay; the output is a fixed tensor, which
  the caller copies out before the next replay;
- the causal caches (a list of tensors that each call reads and updates) keep fixed storage: entries
  the call updates in place stay as they are; an entry the call replaces with a new tensor is copied
  back into the old tensor inside the graph, so the next replay reads it there;
- the request runs on one stream, and every allocation of its decoder calls, eager and captured, is
  made in one memory pool of its own, which the capture shares: the graph reuses the memory that the
  eager calls freed instead of adding a second working set, and the pool is given back when the
  request ends. Where more memory is held cached than is free, the cache goes back to the driver
  first (`release_if_cached`: the pool could not reach it otherwise).
A capture that fails (a path that cannot be captured) runs nothing: the caches are left as they
were, the call runs eagerly, and so does the rest of the request. Every rank makes the same calls in
the same order either way (NCCL matches a replayed exchange with an eager one), so a rank that falls
back does not desynchronise the others.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Callable

import torch

log = logging.getLogger("vaeshard")

# Calls before the capture: the first (the first latent frame, its own shapes) and the second (the
# same shapes as the steady calls, which times cuDNN's algorithms for them in benchmark mode).
WARMUP_CALLS = 2
# Captured only when at least this many steady calls follow the capture: a capture costs about one
# eager call's host time plus the graph's instantiation.
MIN_REPLAYS = 2

# cuda_graphs="auto" replays where a rank's output frame has at most this many pixels. Measured on
# 2 H200s, interleaved in the same processes (BENCHMARKS.md): Wan 2.1 480p on 2 GPUs (832 x 240
# pixels per rank) 0.478 s replayed against 0.572 s eager, the host pacing the eager decode; 720p on
# 2 GPUs (1280 x 360) 0.887 against 0.841 s and on 1 GPU (1280 x 720) 1.539 against 1.527 s, the GPU
# pacing it. Between those sizes the crossover depends on the host's speed and was not measured.
AUTO_MAX_PIXELS = 1 << 18


def wanted(setting, pixels_per_rank: int) -> bool:
    """Whether a request replays its steady decoder calls: `setting` True or False as given; "auto"
    when a rank's output frame (`pixels_per_rank`; the largest rank's, so that every rank of a
    sharded request decides alike) is at most AUTO_MAX_PIXELS."""
    if setting == "auto":
        return pixels_per_rank <= AUTO_MAX_PIXELS
    return bool(setting)


_streams: dict[int, torch.cuda.Stream] = {}


def _request_stream(device: torch.device) -> torch.cuda.Stream:
    """One stream per device for graphed requests (a graph cannot be captured on the default stream);
    reused, so cached blocks of one request serve the next."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _streams:
        _streams[index] = torch.cuda.Stream(device=index)
    return _streams[index]


class CaptureFailed(RuntimeError):
    """The call could not be captured; nothing of it ran."""


class DecoderSteps:
    """Runs a request's decoder calls: eagerly, or (`graphs=True` on CUDA) the steady ones through
    one CUDA graph. Use as a context manager around the request's loop; `call` for each call."""

    def __init__(self, device: torch.device, graphs: bool, num_calls: int):
        self.device = device
        self.enabled = bool(graphs) and device.type == "cuda" and num_calls >= WARMUP_CALLS + 1 + MIN_REPLAYS
        self.num_calls = num_calls
        self.calls = 0
        self.graph = None
        self.static_in = self.static_out = None
        self.state: list | None = None  # the cache list, and the tensors the graph reads and writes
        self.state_tensors: list = []
        self.pool = None
        self.stream = None
        self._user_stream = None
        self.captured = False
        self.failed = False

    # -- request scope ---------------------------------------------------------------------------

    def __enter__(self) -> "DecoderSteps":
        if self.enabled:
            release_if_cached(self.device)
            self.stream = _request_stream(self.device)
            self._user_stream = torch.cuda.current_stream(self.device)
            self.stream.wait_stream(self._user_stream)
            self.pool = torch.cuda.MemPool()
            self._stream_ctx = torch.cuda.stream(self.stream)
            self._stream_ctx.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if not self.enabled:
            return
        self.graph = None
        self.static_in = self.static_out = None
        self.state = None
        self.state_tensors = []
        self._stream_ctx.__exit__(*exc)
        self._user_stream.wait_stream(self.stream)
        self.pool = None  # the pool's memory goes back once nothing allocated in it is alive

    def hand_over(self, t: torch.Tensor) -> torch.Tensor:
        """A tensor made on the request's stream that outlives the request (the output): freeing it
        later waits for the caller's stream too."""
        if self.enabled and t.is_cuda:
            t.record_stream(self._user_stream)
        return t

    @contextlib.contextmanager
    def _in_pool(self):
        if self.pool is None:
            yield
            return
        with torch.cuda.use_mem_pool(self.pool, self.device):
            yield

    # -- calls -----------------------------------------------------------------------------------

    def call(self, step: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, state: list,
             steady: bool) -> torch.Tensor:
        """`step(x)`, which reads and updates the cache list `state`. `steady`: this call has the
        steady calls' shapes (the caller knows: all but the first and a shorter last one)."""
        index = self.calls
        self.calls += 1
        if not self.enabled or self.failed or not steady:
            with self._in_pool():
                return step(x)
        if self.graph is not None:
            return self._replay(x)
        if index < WARMUP_CALLS or self.num_calls - index - 1 < MIN_REPLAYS:
            with self._in_pool():
                return step(x)
        try:
            self._capture(step, x, state)
        except CaptureFailed as exc:
            self.failed = True
            log.warning("vaeshard: the steady decoder call could not be captured as a CUDA graph, the request "
                        "runs eagerly (the same values, more host time): %s", exc)
            with self._in_pool():
                return step(x)
        return self._replay(x)

    def _capture(self, step, x, state: list) -> None:
        before = list(state)
        began = time.perf_counter()
        graph = torch.cuda.CUDAGraph()
        static_in = torch.empty_like(x)
        try:
            # the capture's allocations go to the request's pool (capture_begin routes them there)
            graph.capture_begin(pool=self.pool.id, capture_error_mode="thread_local")
            try:
                out = step(static_in)
                _copy_back(before, state)
            finally:
                graph.capture_end()
        except Exception as exc:  # nothing captured ran: the caches hold what they held
            state[:] = before
            with contextlib.suppress(Exception):
                graph.reset()  # its hold on the pool
            raise CaptureFailed(f"{type(exc).__name__}: {exc}") from None
        state[:] = before
        self.graph, self.static_in, self.static_out = graph, static_in, out
        self.state = state
        self.state_tensors = [t for t in before if isinstance(t, torch.Tensor)]  # read by every replay
        self.captured = True
        log.debug("vaeshard: captured a steady decoder call as a CUDA graph (input %s) in %.1f ms of host time, "
                  "instantiation included", tuple(x.shape), 1e3 * (time.perf_counter() - began))

    def _replay(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape != self.static_in.shape:
            raise RuntimeError(f"vaeshard: a steady decoder call got shape {tuple(x.shape)}, the graph "
                               f"{tuple(self.static_in.shape)}")
        self.static_in.copy_(x)
        self.graph.replay()
        return self.static_out


def release_if_cached(device: torch.device) -> bool:
    """Before a request's memory pool takes its first allocation: where PyTorch's caching allocator
    holds more memory cached (reserved, unused) on `device` than the driver has free, give the cached
    blocks back to the driver (`torch.cuda.empty_cache`); returns whether it did. While allocations go
    to a user memory pool the allocator does not do so itself when it runs out (PyTorch issue #175015),
    so memory other work left cached (a pipeline's transformer, other decodes) would stay out of the
    request's reach where an eager decode gets it back. Results do not change; the next allocations
    outside the pool may have to ask the driver again."""
    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if cached <= free:
        return False
    with torch.cuda.device(device):
        torch.cuda.empty_cache()
    log.debug("vaeshard: gave %.2f GiB of cached memory back to the driver before a graphed request (%.2f GiB "
              "free)", cached / 2**30, free / 2**30)
    return True


def _copy_back(before: list, after: list) -> None:
    """Inside the capture: each cache entry the call replaced with a new tensor is copied into the
    entry it replaced, so the next replay reads it where this one read the old one."""
    if len(before) != len(after):
        raise CaptureFailed(f"the call changed the number of cache entries ({len(before)} -> {len(after)})")
    for i, (old, new) in enumerate(zip(before, after)):
        if new is old:
            continue
        if not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)):
            raise CaptureFailed(f"cache entry {i} is not a tensor before and after the call "
                                f"({type(old).__name__} -> {type(new).__name__})")
        if old.shape != new.shape or old.dtype != new.dtype or old.device != new.device:
            raise CaptureFailed(f"cache entry {i} changed from {tuple(old.shape)} {old.dtype} to "
                                f"{tuple(new.shape)} {new.dtype}")
        old.copy_(new)
