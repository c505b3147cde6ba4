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

Kept graphs (`keep_cuda_graphs`, `KeptCalls`): the pool, the steady graph and its cache tensors stay
with the VAE after the request. The next request with the same signature replays the steady graph
and captures its first two calls into the same pool, both writing their caches into the steady
graph's (`cache_target`); the requests after it replay every call. Their order is always the first
call's graph, the second's, then the steady one's, and between requests nothing else allocates in
the pool while a graph's tensors must survive, so the graphs may share its memory. The signature
names the weights' addresses and versions, so a graph never reads weights that moved or changed.
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import tuning
from . import requests

log = logging.getLogger("vaeshard")

# Calls before the capture: the first (the first latent frame, its own shapes) and the second (the
# same shapes as the steady calls, which times cuDNN's algorithms for them in benchmark mode).
WARMUP_CALLS = 2


def replays(device: torch.device, num_calls: int) -> bool:
    """Whether a request of `num_calls` decoder calls on `device` can replay a CUDA graph: CUDA, and
    enough steady calls after the warm-up and the capture (tuning.GRAPHS_MIN_REPLAYS)."""
    return device.type == "cuda" and num_calls >= WARMUP_CALLS + 1 + tuning.GRAPHS_MIN_REPLAYS


_streams: dict[int, torch.cuda.Stream] = {}

# how each capture's debug line begins (benchmarks/gpu_parity.py and `ranks.py kept-graphs` count captures by it)
CAPTURED = "vaeshard: captured a decoder call as a CUDA graph"


def writing_caches_into(targets: list):
    """The scope of the capture of a request's first or second call with kept graphs: `targets`, the
    cache tensors the steady graph reads (KeptCalls.state), into which the call writes its new caches
    (`cache_target`); the request's `cache_targets` (runtime/requests.py)."""
    return requests.scoped(cache_targets=targets)


def cache_target(idx: int) -> torch.Tensor | None:
    """The tensor a decoder call should write its new cache entry `idx` into, where it fits, instead
    of making a new one: inside the capture of a request's first or second call with kept graphs,
    the entry the steady graph reads (the first call's one-frame caches go in its last frame, which
    the second call reads before it overwrites the entry; the second call leaves its caches where
    the steady graph reads them). No second set of caches is kept or copied. Else None."""
    request = requests.current()
    targets = None if request is None else request.cache_targets
    if targets is None or idx >= len(targets) or not isinstance(targets[idx], torch.Tensor):
        return None
    return targets[idx]


def _request_stream(device: torch.device) -> torch.cuda.Stream:
    """One stream per device for graphed requests (a graph cannot be captured on the default stream);
    reused, so cached blocks of one request serve the next."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _streams:
        _streams[index] = torch.cuda.Stream(device=index)
    return _streams[index]


class CaptureFailed(RuntimeError):
    """The call could not be captured; nothing of it ran."""


@dataclass
class _Graph:
    """One captured decoder call: a replay reads `static_in` and the cache tensors the call read
    when it was captured, and writes `static_out`."""

    graph: torch.cuda.CUDAGraph
    static_in: torch.Tensor
    static_out: torch.Tensor

    def replay(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape != self.static_in.shape:
            raise RuntimeError(
                f"vaeshard: a decoder call got shape {tuple(x.shape)}, its graph {tuple(self.static_in.shape)}"
            )
        self.static_in.copy_(x)
        self.graph.replay()
        return self.static_out


@dataclass
class KeptCalls:
    """A request's captured decoder calls, kept for the next request with the same `signature`
    (`keep_cuda_graphs`). `steady`: the steady call's graph, which reads and writes the cache
    tensors `state`. `first`, `second`: the first two calls' graphs, captured by the next request
    (the first request runs them eagerly: cuDNN times its algorithms and Triton compiles there);
    `after_first` is the cache list as the first call leaves it, which the second reads (mostly
    views of `state`'s last frames: `cache_target`); the second leaves its caches in `state`.
    `eager_first_calls`: their capture failed once, they run eagerly (their caches are then copied
    into `state` before the first replay). Every graph's memory is in `pool`; `anchors` keeps alive
    what the signature names by identity."""

    signature: tuple
    pool: object
    steady: _Graph
    state: list
    anchors: tuple = ()
    first: _Graph | None = None
    after_first: list | None = None
    second: _Graph | None = None
    eager_first_calls: bool = False

    def free(self) -> None:
        """Frees the graphs, then their tensors, then the pool. In that order the pool, freed when
        nothing uses it, gives its memory back to the driver; a pool dropped while a graph still
        holds it would keep its memory reserved until `torch.cuda.empty_cache()`."""
        for held in (self.first, self.second, self.steady):
            if held is not None:
                held.graph.reset()
        self.first = self.second = self.steady = None
        self.state = self.after_first = None
        self.anchors = ()
        self.pool = None


# the kept calls of each owner (a VAE) per device index
_kept: weakref.WeakKeyDictionary[object, dict[int, KeptCalls]] = weakref.WeakKeyDictionary()


def kept_calls(owner, device: torch.device) -> KeptCalls | None:
    """The calls kept for `owner` on `device`, if any."""
    return _kept.get(owner, {}).get(_index(device))


def release(owner) -> int:
    """Frees every graph kept for `owner` (`keep_cuda_graphs`) and the memory they hold (given back
    to the driver, `KeptCalls.free`). Returns how many sets were kept."""
    entries = _kept.pop(owner, {})
    for kept in entries.values():
        kept.free()
    return len(entries)


def _drop(owner, device: torch.device) -> None:
    entries = _kept.get(owner)
    kept = None if entries is None else entries.pop(_index(device), None)
    if kept is not None:
        kept.free()


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def tensors_signature(module: torch.nn.Module) -> tuple:
    """Where `module`'s parameters and buffers lie and their versions: a graph reads them by address,
    and vaeshard's weights made from them (kept on them, made again when they change) too, so a kept
    graph serves only while this is unchanged (a move, a reload or an in-place update changes it)."""
    return tuple(
        (t.data_ptr(), -1 if t.is_inference() else t._version) for t in (*module.parameters(), *module.buffers())
    )


class DecoderSteps:
    """Runs a request's decoder calls: eagerly, or (`graphs=True` on CUDA) the steady ones through
    one CUDA graph. Use as a context manager around the request's loop, each call inside `region()`
    (the side stream the calls run on); `call` for each call.

    `keep` = (owner, signature, anchors): the graphs stay with `owner` after the request
    (`KeptCalls`), and a later request with the same signature replays them instead of capturing;
    it captures the first two calls too, and the requests after it replay every call."""

    def __init__(self, device: torch.device, graphs: bool, num_calls: int, keep: tuple | None = None):
        self.device = device
        self.enabled = bool(graphs) and replays(device, num_calls)
        self.num_calls = num_calls
        self.keep = keep if self.enabled else None
        self.kept: KeptCalls | None = None
        self.calls = 0
        self.steady: _Graph | None = None
        self.state: list | None = None  # the cache tensors the steady graph reads and writes
        self.pool = None
        self.stream = None
        self._user_stream = None
        self.captured = False
        self.failed = False

    # -- request scope ---------------------------------------------------------------------------

    def __enter__(self) -> DecoderSteps:
        if self.enabled:
            if self.keep is not None:
                owner, signature, _ = self.keep
                self.kept = kept_calls(owner, self.device)
                if self.kept is not None and self.kept.signature != signature:
                    _drop(owner, self.device)  # before this request allocates: its memory is free again
                    self.kept = None
            release_if_cached(self.device)
            self.stream = _request_stream(self.device)
            self._user_stream = torch.cuda.current_stream(self.device)
            self.stream.wait_stream(self._user_stream)
            self.pool = self.kept.pool if self.kept is not None else torch.cuda.MemPool()
        return self

    def __exit__(self, *exc) -> None:
        if not self.enabled:
            return
        if self.keep is not None:
            owner, signature, anchors = self.keep
            if exc[0] is not None or self.failed:
                _drop(owner, self.device)  # a request that failed may have left them half-updated
            elif self.kept is None and self.steady is not None:
                _kept.setdefault(owner, {})[_index(self.device)] = KeptCalls(
                    signature=signature, pool=self.pool, steady=self.steady, state=self.state, anchors=anchors
                )
        self.kept = self.steady = self.state = None
        self._user_stream.wait_stream(self.stream)
        self.pool = None  # the pool's memory goes back once nothing allocated in it is alive

    @contextlib.contextmanager
    def region(self):
        """Run the request's GPU work inside on the request's stream; afterwards the caller's stream
        waits for it, so what was made inside may be read there (a streamed chunk between two steps).
        A region spans no yield: code between two regions runs on the caller's stream."""
        if not self.enabled:
            yield
            return
        try:
            with torch.cuda.stream(self.stream):
                yield
        finally:
            self._user_stream.wait_stream(self.stream)

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

    def _eager(self, step, x):
        with self._in_pool():
            return step(x)

    # -- calls -----------------------------------------------------------------------------------

    def call(
        self, step: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, state: list, steady: bool
    ) -> torch.Tensor:
        """`step(x)`, which reads and updates the cache list `state`. `steady`: this call has the
        steady calls' shapes (the caller knows: all but the first and a shorter last one)."""
        index = self.calls
        self.calls += 1
        if not self.enabled or self.failed:
            return self._eager(step, x)
        if self.kept is not None:
            return self._call_kept(index, step, x, state, steady)
        if not steady:
            return self._eager(step, x)
        if self.steady is not None:
            return self.steady.replay(x)
        if index < WARMUP_CALLS or self.num_calls - index - 1 < tuning.GRAPHS_MIN_REPLAYS:
            return self._eager(step, x)
        try:
            before = list(state)
            self.steady, _ = self._capture(step, x, state, copy_into=before)
        except CaptureFailed as exc:
            self.failed = True
            log.warning(
                "vaeshard: the steady decoder call could not be captured as a CUDA graph, the request "
                "runs eagerly (the same values, more host time): %s",
                exc,
            )
            return self._eager(step, x)
        self.state = before
        self.captured = True
        return self.steady.replay(x)

    def _call_kept(self, index: int, step, x, state: list, steady: bool) -> torch.Tensor:
        """A call of a request whose graphs were kept: the first two replayed (captured the first
        time), the steady ones replayed, a shorter last one eagerly."""
        kept = self.kept
        if index == 0 and not kept.eager_first_calls:
            if kept.first is None:
                if any(entry is not None for entry in state):  # not a fresh request's caches
                    return self._first_calls_eager(CaptureFailed("the caches were not empty"), step, x)
                try:
                    kept.first, kept.after_first = self._capture_kept(step, x, state, copy_into=None)
                except CaptureFailed as exc:
                    return self._first_calls_eager(exc, step, x)
            y = kept.first.replay(x)
            state[:] = kept.after_first
            return y
        if index == 1 and not kept.eager_first_calls:
            if kept.second is None:
                try:
                    kept.second, _ = self._capture_kept(step, x, state, copy_into=kept.state)
                except CaptureFailed as exc:
                    return self._first_calls_eager(exc, step, x)
            y = kept.second.replay(x)
            state[:] = kept.state
            self.steady = kept.steady
            return y
        if index < WARMUP_CALLS or not steady:  # (WARMUP_CALLS: the first two calls, above)
            return self._eager(step, x)
        if self.steady is None:  # the first two calls ran eagerly: their caches into the graph's
            try:
                _copy_back(kept.state, state)
            except CaptureFailed as exc:
                self.failed = True
                log.warning(
                    "vaeshard: the kept CUDA graph does not fit this request's caches, the request "
                    "runs eagerly and the graph is dropped: %s",
                    exc,
                )
                return self._eager(step, x)
            state[:] = kept.state
            self.steady = kept.steady
        return self.steady.replay(x)

    def _capture_kept(self, step, x, state: list, copy_into: list | None) -> tuple[_Graph, list]:
        """`_capture` of the first or second call of a request with kept graphs: the call writes its
        new caches into the tensors the steady graph reads (`cache_target`)."""
        with writing_caches_into(self.kept.state):
            return self._capture(step, x, state, copy_into)

    def _first_calls_eager(self, exc: CaptureFailed, step, x) -> torch.Tensor:
        log.info(
            "vaeshard: the first decoder calls could not be captured as CUDA graphs, they run eagerly "
            "in this request and the next ones: %s",
            exc,
        )
        kept = self.kept
        kept.eager_first_calls = True
        kept.first = kept.after_first = kept.second = None  # (this request's caches hold what they need)
        return self._eager(step, x)

    def _capture(self, step, x, state: list, copy_into: list | None) -> tuple[_Graph, list]:
        """Captures `step(x)` as a graph (not run). `copy_into`: a list of cache tensors the call's
        new cache entries are copied into inside the graph (`_copy_back`), so a replay leaves them
        there. Returns the graph and the cache list as the captured call left it; `state` is left
        as it was."""
        before = list(state)
        began = time.perf_counter()
        graph = torch.cuda.CUDAGraph()
        static_in = torch.empty_like(x)
        try:
            # the capture's allocations go to the request's pool (capture_begin routes them there)
            graph.capture_begin(pool=self.pool.id, capture_error_mode="thread_local")
            try:
                out = step(static_in)
                if copy_into is not None:
                    _copy_back(copy_into, state)
            finally:
                graph.capture_end()
        except Exception as exc:  # nothing captured ran: the caches hold what they held
            state[:] = before
            with contextlib.suppress(Exception):
                graph.reset()  # its hold on the pool
            raise CaptureFailed(f"{type(exc).__name__}: {exc}") from None
        after = list(state)
        state[:] = before
        log.debug(
            CAPTURED + " (input %s) in %.1f ms of host time, instantiation included",
            tuple(x.shape),
            1e3 * (time.perf_counter() - began),
        )
        return _Graph(graph, static_in, out), after


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
    log.debug(
        "vaeshard: gave %.2f GiB of cached memory back to the driver before a graphed request (%.2f GiB free)",
        cached / 2**30,
        free / 2**30,
    )
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
            raise CaptureFailed(
                f"cache entry {i} is not a tensor before and after the call "
                f"({type(old).__name__} -> {type(new).__name__})"
            )
        if old.shape != new.shape or old.dtype != new.dtype or old.device != new.device:
            raise CaptureFailed(
                f"cache entry {i} changed from {tuple(old.shape)} {old.dtype} to {tuple(new.shape)} {new.dtype}"
            )
        old.copy_(new)
