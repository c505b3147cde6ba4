"""Every torch.distributed call vaeshard makes lives in this module.

`Comm` wraps one process group (and the subset of its ranks that does work). A request begins with
its agreement (`Comm.agree`), made through the process group's store rather than a collective, so a
rank that never arrives costs a bounded store wait and leaves nothing pending in the group. Every
collective after it is waited on with a bound (gloo: the request's timeout, else the group's own,
applied to the operation itself so that nothing stays pending when it expires; NCCL: the group's
own, enforced by NCCL's watchdog), so a rank that failed or died makes the others raise instead of
waiting forever. Buffers created here are scoped to the call that made them.

A rank that raises during a request posts why in the store; the others learn it within ABORT_POLL_S
wherever they wait, and the group is then unusable for vaeshard (docs/reliability.md says how).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from . import traffic
from .gloo import gloo_backend, own_timeout
from .layout import exchange_order, inverse, memory_format, permuted, with_extent, zeros_like_rows


class CommTimeout(RuntimeError):
    """A rank of the group did not take part in time: the request agreement timed out (a rank never
    called decode or encode, or arrived too late), or a collective of a request did not complete
    within its bound or its peer closed the connection (a peer failed or is gone). The message says
    which, and whether the group can still be used."""


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def default_group_if_any(group):
    """The group a VAE runs on: the given one, else the default group, else None (no distributed job)."""
    if group is not None:
        return group
    return dist.group.WORLD if is_initialized() else None


def group_rank(group) -> int:
    """This process's rank in `group`, or -1 when it is not a member."""
    if group is None:
        return 0
    return dist.get_rank(group)


def global_rank() -> int:
    return dist.get_rank() if is_initialized() else 0


def group_size(group) -> int:
    if group is None:
        return 1
    return dist.get_world_size(group)


@dataclass
class _GroupState:
    """What this process knows of a group across requests: the number of its next request agreement
    (every rank of the group counts the same requests, so equal numbers name the same request), and
    why the group can no longer be used, once a collective of a request failed on it."""

    next_request: int = 0
    broken: str | None = None
    current: int = -1  # the number of the request this process is in (or was last in)


_groups: dict[str, _GroupState] = {}


def _state_of(group) -> _GroupState:
    return _groups.setdefault(group.group_name, _GroupState())


_AGREE = "vaeshard/agree"
# why a request failed on this group: under _ABORT/<request number>, posted by the first rank that raised
# in that request (the request ends; the group is still usable where every rank stopped at the same
# point); under _ABORT itself, posted by `abort` (the group is no longer used)
_ABORT = "vaeshard/abort"
_BROKEN = "broken"  # a rank's entry in an agreement when the group is unusable on that rank
ABORT_POLL_S = 0.5  # a wait longer than this checks the group's abort key this often
_HANG_UP_TAG = 0x7A57  # a receive that only closes a connection (no rank ever sends with it)


def _abort_keys(group) -> list[str]:
    return [_ABORT, f"{_ABORT}/{_state_of(group).current}"]


def _abort_reason(group) -> str | None:
    """What was posted when the group was aborted, or when the current request failed on `group`
    (None: nothing, or the store is gone)."""
    try:
        store = c10d._get_process_group_store(group)
        for key in _abort_keys(group):
            if store.check([key]):
                return store.get(key).decode()
        return None
    except RuntimeError:
        return None


def post_abort(group, reason: str, request: bool = False) -> str:
    """Post `reason` where the ranks' waits look: under the group's abort key (the group is no longer
    used), or with `request`, under the current request's (that request ends); the reason that stays
    (the first one posted)."""
    key = _abort_keys(group)[1] if request else _ABORT
    try:
        return c10d._get_process_group_store(group).compare_set(key, "", reason).decode()
    except RuntimeError:  # the store is gone: the ranks' bounds end their waits
        return reason


def _abort_communicator(group) -> None:
    """NCCL: end this rank's pending collectives on `group` (ncclCommAbort), so that a host waiting on
    the GPU stream returns; the group is unusable afterwards. The group's own `abort`, not torch's
    `_abort_process_group`, which aborts every group for the default one and unregisters them."""
    with contextlib.suppress(Exception):  # already aborted, or a torch without it: the watchdog ends it
        group.abort()


def _watch(group) -> threading.Event:
    """NCCL: until the event is set (the request's end), poll the group's abort key; abort the
    communicator once it is set."""
    done = threading.Event()

    def run():
        while not done.wait(ABORT_POLL_S):
            if (reason := _abort_reason(group)) is not None:
                _state_of(group).broken = f"a request failed on this group ({reason}): destroy it and start a new one"
                return _abort_communicator(group)

    threading.Thread(target=run, name="vaeshard-abort-watch", daemon=True).start()
    return done


def _from_communication(exc: BaseException) -> bool:
    """Whether `exc` was raised inside torch.distributed (a peer that hung up), not by this rank's own
    code: only then does a peer's earlier failure explain it."""
    frames = traceback.extract_tb(exc.__traceback__)
    return any("torch/distributed" in frame.filename.replace("\\", "/") for frame in frames)


class _Waiter:
    """A thread that waits on gloo point-to-point works for a request's thread (one per such thread),
    which meanwhile polls the abort key: gloo closes a pair whose send or receive is waited on with a
    timeout shorter than the exchange takes, so those waits cannot be cut into slices as a collective's
    can. A waiter left behind by an aborted request ends after its last wait (bounded by the request's)."""

    _mine = threading.local()

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name="vaeshard-p2p-wait", daemon=True).start()

    @classmethod
    def get(cls) -> _Waiter:
        if getattr(cls._mine, "waiter", None) is None:
            cls._mine.waiter = cls()
        return cls._mine.waiter

    @classmethod
    def retire(cls) -> None:
        cls._mine.waiter.jobs.put(None)
        cls._mine.waiter = None

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            work, timeout, box, done = job
            try:
                box.append(work.wait(timeout=timeout))
            except BaseException as exc:  # handed to the request's thread
                box.append(exc)
            done.set()
            del job, work, box, done


@dataclass
class Comm:
    """The communication a single request needs, over the first `size` ranks of `group`.

    `timeout`: the bound of every wait on a gloo group (the request's timeout, or the group's own);
    None on NCCL, whose waits are bounded by the group's own timeout through NCCL's watchdog."""

    group: object
    rank: int
    world: int
    timeout: float | None = None
    device: torch.device | None = None

    @classmethod
    def for_group(cls, group, timeout: float | None = None) -> Comm:
        rank = group_rank(group)
        world = group_size(group)
        device = None
        if group is not None and dist.get_backend(group) == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        elif group is not None and timeout is None:
            timeout = own_timeout(group)
        return cls(group=group, rank=rank, world=world, timeout=timeout, device=device)

    # -- plumbing -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def bounded(self):
        """The request's scope after its agreement. On gloo its operations time out after `timeout` in
        gloo itself (the group's own timeout restored afterwards), so a collective that expires is ended,
        not left pending. On NCCL a watcher aborts the communicator when another rank posts a failure. An
        exception that leaves it is posted; where another rank's failure came first, it is CommTimeout."""
        backend = gloo_backend(self.group) if self.device is None and self.world > 1 else None
        own = None if backend is None else backend.options._timeout
        bound = None if self.timeout is None else timedelta(seconds=self.timeout)
        retime = own is not None and bound is not None and bound != own
        watch = _watch(self.group) if self.device is not None and self.world > 1 else None
        if retime:
            backend.set_timeout(bound)
        try:
            yield self
        except BaseException as exc:
            first = self._abandon(exc)
            if first is not None and not isinstance(exc, CommTimeout) and _from_communication(exc):
                self._broken(f"a request on rank {self.rank} ended: another rank failed or is gone: {first}", exc)
            raise
        finally:
            if watch is not None:
                watch.set()
            if retime:
                backend.set_timeout(own)

    def _wait(self, work, what: str, p2p: bool = False) -> None:
        """Wait for `work`, bounded by `timeout` on gloo, checking the group's abort key every
        ABORT_POLL_S once the wait outlasts that (`p2p`: a send or receive, waited on by a _Waiter)."""
        if work is None:
            return
        if self.timeout is None or self.device is not None:
            # NCCL: a plain wait only orders the current stream after the collective and keeps the
            # GPU queue full; a wait with a timeout would block the CPU on every halo exchange.
            # NCCL's own watchdog enforces the process group's timeout, and bounded()'s watcher aborts it.
            work.wait()
            return
        started = time.monotonic()
        deadline = started + self.timeout
        try:
            done = self._wait_p2p(work, deadline, what) if p2p else self._wait_sliced(work, deadline, what)
        except CommTimeout:  # another rank posted its failure (_check_abort)
            raise
        except RuntimeError as exc:  # gloo reports a timeout, and a peer that closed its connection, this way
            self._broken(
                f"{what} on rank {self.rank} failed after {time.monotonic() - started:.1f} s (limit "
                f"{self.timeout:g} s): another rank failed or is gone, see its error",
                exc,
            )
        if not done:
            self._broken(
                f"{what} on rank {self.rank} did not complete within {self.timeout:g} s: another rank failed "
                "or is gone, see its error",
                None,
            )

    def _wait_sliced(self, work, deadline: float, what: str) -> bool:
        """A collective: waited on in slices (a wait that times out leaves a gloo collective pending)."""
        while True:
            left = deadline - time.monotonic()
            try:
                return work.wait(timeout=timedelta(seconds=max(0.001, min(ABORT_POLL_S, left)))) is not False
            except RuntimeError:
                if work.is_completed():
                    raise  # the collective itself failed
            if left <= ABORT_POLL_S:
                return False
            self._check_abort(what, deadline)

    def _wait_p2p(self, work, deadline: float, what: str) -> bool:
        waiter, box, done = _Waiter.get(), [], threading.Event()
        waiter.jobs.put((work, timedelta(seconds=max(0.001, deadline - time.monotonic())), box, done))
        while not done.wait(ABORT_POLL_S):  # the waiter's wait ends at the deadline: a little more to report
            if time.monotonic() > deadline + ABORT_POLL_S:
                _Waiter.retire()
                return False
            try:
                self._check_abort(what, deadline)
            except CommTimeout:
                _Waiter.retire()
                raise
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0] is not False

    def _check_abort(self, what: str, deadline: float) -> None:
        if self.group is not None and (reason := _abort_reason(self.group)) is not None:
            waited = f"{self.timeout - (deadline - time.monotonic()):.1f} s"
            self._broken(
                f"{what} on rank {self.rank} stopped after {waited}: another rank failed or is gone: {reason}", None
            )

    def _broken(self, what: str, exc: BaseException | None):
        """Raise CommTimeout for a collective that failed mid-request, and remember that the group can
        no longer be used by vaeshard: its ranks stopped at different exchanges."""
        message = (
            f"{what}; this group can no longer be used (its ranks stopped at different exchanges): "
            "destroy it (torch.distributed.destroy_process_group) and start a new one"
        )
        if self.group is not None:
            _state_of(self.group).broken = message
            self._hang_up()
            reason = _abort_reason(self.group) if exc is not None else None  # the peer's own, if it posted one
            message += f"; {reason}" if reason is not None and reason not in what else ""
        if exc is not None:
            message += f" ({exc})"
        raise CommTimeout(message) from exc

    def _abandon(self, exc: BaseException) -> str | None:
        """This rank leaves a request with `exc`: post why under the group's abort key, so the others stop
        waiting for it, and take the group out of vaeshard's use here. Returns the reason another rank
        posted first (None: this rank's came first)."""
        if self.group is None or self.world == 1:
            return None
        text = str(exc).strip().splitlines()
        mine = f"rank {self.rank} raised {type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
        first = post_abort(self.group, mine, request=True)
        if self.device is not None:  # NCCL: what this rank queued may wait on its peers' aborted communicators
            state = _state_of(self.group)
            if state.broken is None:
                state.broken = f"a request failed on this group ({first}): destroy it and start a new one"
            _abort_communicator(self.group)
        # gloo: the group stays usable where every rank stopped at the same point; a rank that was
        # waiting for this one is cut short by the posted reason and takes the group out of use itself
        # (`_broken`), which the next request's agreement tells every rank
        return None if first == mine else first

    def _hang_up(self) -> None:
        """gloo: close this rank's connections in the group (a receive waited on for less than it takes
        closes its pair): what is pending on them, here or at a peer, fails at once, and the group can be
        destroyed with no thread inside. Not on the rank that failed first: its peers would see gloo's error."""
        for r in range(self.world) if self.device is None and self.group is not None else ():
            if r != self.rank:
                with contextlib.suppress(Exception):
                    work = dist.irecv(torch.empty(1), self._global(r), group=self.group, tag=_HANG_UP_TAG)
                    work.wait(timeout=timedelta(milliseconds=1))

    # -- agreement ------------------------------------------------------------------------------

    def agree(self, values: list[int], timeout: float, op: str, bound: str) -> list[list[int]]:
        """Every rank's `values` (lists of ints) for one request, through the process group's store:
        each rank posts its own under the request's number and waits, up to `timeout` seconds, for
        the others'. A rank that does not arrive costs that wait and nothing else: no collective is
        left pending, so the group stays usable and the process can exit. The outcome is decided
        once per request, atomically in the store (`compare_set`), so a rank that gives up and a
        rank that sees every rank arrive at that moment cannot act differently. CommTimeout on every
        rank that arrived, naming the ranks that did not; `op` and `bound` (where the timeout comes
        from) are for its message."""
        if self.world == 1:
            return [list(values)]
        state = _state_of(self.group)
        store = c10d._get_process_group_store(self.group)
        number = state.next_request
        state.next_request += 1
        state.current = number
        prefix = f"{_AGREE}/{number}"
        keys = [f"{prefix}/{r}" for r in range(self.world)]
        if state.broken is not None:
            with contextlib.suppress(RuntimeError):  # the others raise at once instead of at their bound
                store.set(keys[self.rank], _BROKEN)
            raise CommTimeout(
                f"{op} on rank {self.rank}: an earlier request failed on this process group, which "
                f"vaeshard can no longer use: {state.broken}"
            )
        started = time.monotonic()
        try:
            store.set(keys[self.rank], ",".join(str(int(v)) for v in values))
            arrived, aborted = self._arrivals(store, keys, started + timeout)
            verdict = store.compare_set(f"{prefix}/verdict", "", "go" if arrived else f"gave up:{self.rank}")
            verdict = verdict.decode()
            rows = store.multi_get(keys) if verdict == "go" else None
            missing = [] if rows is not None else [r for r in range(self.world) if not store.check([keys[r]])]
        except RuntimeError as exc:
            raise CommTimeout(
                f"{op} on rank {self.rank}: the process group's store could not be reached ({exc}): the process "
                "that hosts it (global rank 0, or torchrun's agent) has probably exited; see its error"
            ) from None
        if rows is None and aborted is not None:
            state.broken = f"a request failed on this group ({aborted})"
            raise CommTimeout(f"{op} on rank {self.rank}: another rank failed or is gone: {aborted}")
        if rows is None:
            raise CommTimeout(self._agreement_failed(op, verdict, missing, timeout, time.monotonic() - started, bound))
        broken = [r for r, row in enumerate(rows) if row == _BROKEN.encode()]
        if broken:
            state.broken = f"rank(s) {broken} could no longer use it; {_abort_reason(self.group) or ''}".rstrip("; ")
            raise CommTimeout(
                f"{op} on rank {self.rank}: an earlier request failed on rank(s) {broken} of this process group, "
                f"which vaeshard can no longer use ({state.broken}): destroy it and start a new one"
            )
        if number:  # every rank posted this request, so every rank is done with the one before it
            self._forget(store, number - 1)
        return [[int(v) for v in row.decode().split(",")] for row in rows]

    def _arrivals(self, store, keys: list[str], deadline: float) -> tuple[bool, str | None]:
        """(whether every key arrived before `deadline`, the group's abort reason if one was posted while
        waiting): the store's wait in slices of ABORT_POLL_S, checking the abort key between them."""
        while True:
            left = deadline - time.monotonic()
            try:
                store.wait(keys, timedelta(seconds=max(0.001, min(ABORT_POLL_S, left))))
                return True, None
            except dist.DistNetworkError:
                raise
            except RuntimeError:  # the slice passed (DistStoreError from a TCPStore, RuntimeError from a FileStore)
                pass
            if left <= ABORT_POLL_S:
                return False, None
            if (reason := _abort_reason(self.group)) is not None:
                return False, reason

    def _agreement_failed(self, op, verdict: str, missing: list[int], timeout: float, waited: float, bound: str) -> str:
        gave_up = int(verdict.rsplit(":", 1)[1])
        if gave_up == self.rank:
            head = (
                f"{op} on rank {self.rank} waited {waited:.1f} s (limit {timeout:g} s, {bound}) for the other "
                f"ranks of its group: rank(s) {missing} did not call {op}"
            )
        else:
            head = (
                f"{op} on rank {self.rank}: rank {gave_up} had already given up waiting for this request (it "
                f"waited its timeout before every rank arrived; still missing when it gave up: see its error)"
            )
        return (
            f"{head}. Every rank of the group must call {op} with the same request: output='rank0' still needs "
            "every rank (it only chooses who receives the result). To decode on one rank only, call a VAE that is "
            "not parallelized there (vaeshard.unparallelize(vae), or a second copy of the model). Nothing is "
            "left pending in the process group: it stays usable, and the process can exit"
        )

    def _forget(self, store, number: int) -> None:
        """Delete this rank's entries of request `number` from the store (rank 0 its verdict too)."""
        prefix = f"{_AGREE}/{number}"
        with contextlib.suppress(RuntimeError):  # a store that cannot delete keeps a few bytes per request
            store.delete_key(f"{prefix}/{self.rank}")
            if self.rank == 0:
                store.delete_key(f"{prefix}/verdict")
                store.delete_key(f"{_ABORT}/{number}")

    def _global(self, group_rank_: int) -> int:
        if self.group is None or self.group is dist.group.WORLD:
            return group_rank_
        return dist.get_global_rank(self.group, group_rank_)

    def _small_device(self) -> torch.device:
        return self.device if self.device is not None else torch.device("cpu")

    # -- small collectives ----------------------------------------------------------------------

    def all_gather_ints(self, values: list[int], what: str = "all-gather") -> list[list[int]]:
        """Every rank's list of ints (all lists the same length): one small collective (`what` names
        it in a timeout's message)."""
        mine = torch.tensor(values, dtype=torch.int64, device=self._small_device())
        if self.world == 1:
            return [values]
        out = [torch.empty_like(mine) for _ in range(self.world)]
        traffic.note("control", mine)
        self._wait(dist.all_gather(out, mine, group=self.group, async_op=True), what)
        return [t.tolist() for t in out]

    def all_reduce_max(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self._small_device())
        if self.world > 1:
            traffic.note("control", t)
            self._wait(dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group, async_op=True), "all_reduce")
        return float(t.item())

    # -- halo exchange --------------------------------------------------------------------------

    def halo_pad(
        self,
        x: torch.Tensor,
        dim: int,
        before: int,
        after: int,
        num_ranks: int,
    ) -> torch.Tensor:
        """Extend `x` along `dim` by `before` rows from the previous rank and `after` from the next.

        Ranks 0..num_ranks-1 hold consecutive slices of one tensor. At the global edges the rows are
        zeros, exactly the zero padding the unsharded convolution would apply. An interior rank
        posts two sends and two receives, batched so no pair of ranks can deadlock on ordering.
        The result is one new tensor in x's memory format; see fill_halo.
        """
        if before == 0 and after == 0:
            return x
        out = torch.empty(
            with_extent(x.shape, dim, x.shape[dim] + before + after),
            dtype=x.dtype,
            device=x.device,
            memory_format=memory_format(x),
        )
        out.narrow(dim, before, x.shape[dim]).copy_(x)
        return self.fill_halo(out, dim, before, after, num_ranks)

    def fill_halo(self, buf: torch.Tensor, dim: int, before: int, after: int, num_ranks: int) -> torch.Tensor:
        """Fill the first `before` and last `after` rows of `buf` along `dim` from the neighbours.

        `buf`'s other rows hold this rank's slice (its "core"). The previous rank sends the last
        `before` rows of its core, the next rank the first `after` of its; at the global edges the
        rows become zeros. For a caller that built the core in place (a convolution's input buffer).
        Returns `buf`.
        """
        extent = buf.shape[dim] - before - after
        from_prev, from_next = self.neighbour_rows(buf.narrow(dim, before, extent), dim, before, after, num_ranks)
        # Received rows arrive in buffers of their own; they are copied into the halo rows of
        # the buffer (a few rows), zeros at the global edges.
        for rows, at, received in ((before, 0, from_prev), (after, before + extent, from_next)):
            if rows == 0:
                continue
            target = buf.narrow(dim, at, rows)
            if received is None:
                target.zero_()
            else:
                target.copy_(received)
        return buf

    def neighbour_rows(self, x: torch.Tensor, dim: int, before: int, after: int, num_ranks: int):
        """(the previous rank's last `before` rows of its `x` along `dim`, the next rank's first
        `after`): one exchange, in which this rank sends its own to them. None for rows not asked
        for or beyond a global edge (ranks 0..num_ranks-1 hold consecutive slices). The rows come as
        views in `x`'s order of dimensions, laid out as `x` is (channels innermost for the fast
        tier's buffers), of tensors of their own."""
        extent = x.shape[dim]
        has_prev = self.rank > 0
        has_next = self.rank < num_ranks - 1
        # The rows travel in the tensor's own order of dimensions (channels innermost for the fast
        # tier's buffers), as plain contiguous tensors of the permuted shape (what every backend
        # sends): packing and unpacking them copies whole runs of channels, where the default order
        # would transpose them on the way out and back.
        order = exchange_order(x)
        ops = []
        from_prev = from_next = None
        if has_prev and before > 0:
            from_prev = x.new_empty(permuted(with_extent(x.shape, dim, before), order))
            ops.append(dist.P2POp(dist.irecv, from_prev, self._global(self.rank - 1), self.group))
        if has_next and after > 0:
            from_next = x.new_empty(permuted(with_extent(x.shape, dim, after), order))
            ops.append(dist.P2POp(dist.irecv, from_next, self._global(self.rank + 1), self.group))
        if has_prev and after > 0:
            rows = x.narrow(dim, 0, after).permute(order).contiguous()
            ops.append(dist.P2POp(dist.isend, rows, self._global(self.rank - 1), self.group))
        if has_next and before > 0:
            rows = x.narrow(dim, extent - before, before).permute(order).contiguous()
            ops.append(dist.P2POp(dist.isend, rows, self._global(self.rank + 1), self.group))
        if ops:
            for op in ops:
                if op.op is dist.isend:
                    traffic.note("halo", op.tensor)
            for work in dist.batch_isend_irecv(ops):
                self._wait(work, "halo exchange", p2p=True)
        back = inverse(order)
        return tuple(None if received is None else received.permute(back) for received in (from_prev, from_next))

    # -- gathers --------------------------------------------------------------------------------

    def share_from_rank0(self, x: torch.Tensor | None) -> torch.Tensor:
        """Group rank 0's tensor `x` on every rank (others pass None): its shape and dtype, then its
        values, in two broadcasts. Rank 0 returns `x` itself; the others a contiguous copy."""
        if self.world == 1:
            return x
        head = torch.full((9,), -1, dtype=torch.int64, device=self._small_device())
        if self.rank == 0:
            head[0] = _SHARED_DTYPES.index(x.dtype)
            head[1] = x.dim()
            head[2 : 2 + x.dim()] = torch.tensor(x.shape, dtype=torch.int64)
        if self.rank == 0:
            traffic.note("control", head)
        self._wait(dist.broadcast(head, self._global(0), group=self.group, async_op=True), "broadcast of the result")
        values = head.tolist()
        dtype, shape = _SHARED_DTYPES[values[0]], values[2 : 2 + values[1]]
        data = x.contiguous() if self.rank == 0 else torch.empty(shape, dtype=dtype, device=self._small_device())
        if self.rank == 0:
            traffic.note("broadcast", data)
        self._wait(dist.broadcast(data, self._global(0), group=self.group, async_op=True), "broadcast of the result")
        return x if self.rank == 0 else data

    def share_state_from_rank0(self, state: torch.Tensor) -> torch.Tensor:
        """Group rank 0's `state` (a CPU byte tensor: an RNG's state) on every rank, as a CPU tensor; each
        rank passes its own, of the same kind."""
        shared = self.share_from_rank0(state.to(self._small_device()) if self.rank == 0 else None)
        return state if self.rank == 0 else shared.cpu()

    def all_gather_along(self, x: torch.Tensor, dim: int, extents: list[int]) -> torch.Tensor:
        """Concatenate every rank's slice along `dim`; rank r holds `extents[r]` rows (uneven allowed).

        Ranks past len(extents) take part in the collective with an empty slice.
        """
        parts = self._gather_padded(x, dim, extents)
        return torch.cat(parts, dim=dim)

    def assemble_along(self, x: torch.Tensor, dim: int, extents: list[int], to_all: bool) -> torch.Tensor | None:
        """The whole tensor from every rank's slice along `dim` (rank r holds `extents[r]` rows).

        Built in place in one output tensor, one slice at a time: the peak is the output plus one
        slice, not the output plus a copy of every slice. `to_all`: every rank gets it (one broadcast
        per rank holding rows); otherwise group rank 0 gets it (one receive per rank) and the others
        get None. Uneven extents need no padding: every rank knows every slice's size.
        """
        extents = list(extents) + [0] * (self.world - len(extents))
        if self.world == 1:
            return x.narrow(dim, 0, extents[0])
        mine = x.narrow(dim, 0, min(x.shape[dim], extents[self.rank]))
        if not to_all and self.rank != 0:
            if extents[self.rank]:
                traffic.note("assemble", mine)
                work = dist.isend(mine.contiguous(), self._global(0), group=self.group)
                self._wait(work, "gather of results", p2p=True)
            return None
        out = torch.empty(
            with_extent(mine.shape, dim, sum(extents)), dtype=x.dtype, device=x.device, memory_format=memory_format(x)
        )
        offset = 0
        for r, extent in enumerate(extents):
            if extent == 0:
                continue
            target = out.narrow(dim, offset, extent)
            offset += extent
            if r == self.rank:
                if to_all:
                    traffic.note("assemble", mine)
                    self._wait(
                        dist.broadcast(mine.contiguous(), self._global(r), group=self.group, async_op=True),
                        "gather of results",
                    )
                target.copy_(mine)
                continue
            part = torch.empty(with_extent(mine.shape, dim, extent), dtype=x.dtype, device=x.device)
            if to_all:
                work = dist.broadcast(part, self._global(r), group=self.group, async_op=True)
            else:
                work = dist.irecv(part, self._global(r), group=self.group)
            self._wait(work, "gather of results", p2p=not to_all)
            target.copy_(part)
            del part  # the next slice may reuse its memory
        return out

    def _gather_padded(self, x: torch.Tensor, dim: int, extents: list[int]) -> list[torch.Tensor]:
        extents = list(extents) + [0] * (self.world - len(extents))
        if self.world == 1:
            return [x.narrow(dim, 0, extents[0])]
        longest = max(extents)
        mine = x.narrow(dim, 0, min(x.shape[dim], extents[self.rank])) if x.shape[dim] else x
        pad = longest - mine.shape[dim]
        if pad:
            mine = torch.cat([mine, zeros_like_rows(mine, dim, pad)], dim=dim)
        mine = mine.contiguous()
        bufs = [torch.empty_like(mine) for _ in range(self.world)]
        traffic.note("all_gather", mine)
        self._wait(dist.all_gather(bufs, mine, group=self.group, async_op=True), "all-gather")
        return [b.narrow(dim, 0, e) for b, e in zip(bufs, extents) if e > 0]

    def gather_stacks(self, stack: torch.Tensor, to_all: bool) -> list[torch.Tensor] | None:
        """Gather one equally shaped tensor per rank (all ranks, or rank 0 only)."""
        if self.world == 1:
            return [stack]
        stack = stack.contiguous()
        traffic.note("tile_gather", stack)
        if to_all:
            bufs = [torch.empty_like(stack) for _ in range(self.world)]
            self._wait(dist.all_gather(bufs, stack, group=self.group, async_op=True), "gather of tiles")
            return bufs
        bufs = [torch.empty_like(stack) for _ in range(self.world)] if self.rank == 0 else None
        self._wait(dist.gather(stack, bufs, dst=self._global(0), group=self.group, async_op=True), "gather of tiles")
        return bufs


_SHARED_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.uint8]


__all__ = ["Comm", "CommTimeout", "default_group_if_any", "group_rank", "group_size", "is_initialized", "post_abort"]


def all_reduce_sum(comm: Comm, tensor: torch.Tensor) -> torch.Tensor:
    """Sum `tensor` over every rank of `comm`'s group, in place, and return it (unchanged on one rank).

    Meant for small statistics (a few numbers per sample and group, e.g. a sharded GroupNorm's sums);
    the tensor must live where the backend works (CPU for gloo, the rank's GPU for NCCL).
    """
    if comm.world > 1:
        traffic.note("all_reduce", tensor)
        work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=comm.group, async_op=True)
        comm._wait(work, "all_reduce of statistics")
    return tensor


__all__ += ["all_reduce_sum"]
