"""A request: its check and agreement, and the one object that carries it.

Every rank checks its own input, then every rank learns every rank's request (`Comm.agree`), so a
request that is invalid or different anywhere fails everywhere with the same clear error, before any
work, and a rank that never arrives is named. No model knowledge: what a request must look like
comes in an `Expected`.

An admitted request is a `Request`: what it is (op, input, extra inputs), what runs it (the VAE, its
family, settings and group), its plan once made, and what is in force at the moment inside it (the
fast tier's choices, the shard, the frame loop's call, a graph capture's cache targets). While a
request runs, it is the one context variable every layer reads (`current`, through the accessors of
layers/tier.py, spatial.py, families/base.py, fast/frame_loop.py and graphs.py); a part of it is
changed for a scope by `scoped`, and outside a request there is none.

What is refused, where and with which message is listed (and measured) in docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import logging
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from ..config import MODES, OUTPUTS, agreement_timeout
from .comm import Comm, CommTimeout

if TYPE_CHECKING:
    from .spatial import ShardContext
    from .tile import TileOps

log = logging.getLogger("vaeshard")

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
OPS = ("decode", "encode", "verify_weights")

# Why a request cannot run, as a code every rank reads in the agreement (0: it can run); a rank whose
# own input is fine names the problem of the first bad rank with the same exception type.
PROBLEMS: dict[int, tuple[type[Exception], str]] = {
    1: (TypeError, "not a tensor"),
    2: (ValueError, "wrong number of dimensions"),
    3: (TypeError, "not a floating-point tensor"),
    4: (ValueError, "wrong number of latent channels"),
    5: (ValueError, "an axis of size 0"),
    6: (ValueError, "not on the VAE's device"),
    7: (ValueError, "dtype differs from the VAE's parameters"),
    8: (ValueError, "NaN or Inf values"),
    9: (ValueError, "size larger than the group"),
}


class Expected(NamedTuple):
    """What a request's input must be: the VAE's class name, the layout's dimensions and name, the
    latent channels (None: not checked, as for an encode's sample), and the devices and dtypes of the
    VAE's parameters (empty: not checked)."""

    cls: str
    ndim: int
    layout: str
    channels: int | None
    devices: frozenset
    dtypes: frozenset


@dataclasses.dataclass(frozen=True, eq=False)  # (one request is itself: compared by identity)
class Request:
    """One request of a parallelized VAE on this rank, made by its admission (api.admit) and planned
    once (policy.plan_request). A bare one (every field left out) stands for code run outside a
    request under a `scoped` setting, such as a test's fast-tier layer."""

    op: str = ""  # "decode" or "encode"
    x: Any = None  # the input tensor (this sample's, where the VAE slices a batch)
    vae: Any = None
    family: Any = None  # the VAE's family (families/base.py)
    config: Any = None  # config.ParallelConfig
    comm: Comm | None = None
    inputs: dict = dataclasses.field(default_factory=dict)  # the family's extra inputs (Family.call_inputs)
    record: Any = None  # the metrics record (vaeshard.metrics)
    hooked: tuple[str, ...] = ()  # layers whose forward a hook replaces (runtime.swap.replaced_forwards)
    own: str = "untiled"  # what the VAE's own op computes for this input (Family.own_result)
    plan: Any = None  # policy.Plan, once planned
    tile_ops: TileOps | None = None  # the family's tile ops of `x`, built once where the plan needed them
    # in force now, for a scope inside the request (`scoped`):
    fast: Any = None  # the fast tier's choices (layers/tier.py); None: diffusers' own computation
    shard: ShardContext | None = None  # the spatial shard (spatial.py); None: unsharded
    loop: Any = None  # the frame loop's running decoder call (fast/frame_loop.py)
    cache_targets: list | None = None  # a graph capture's cache tensors (graphs.py)

    @property
    def workers(self) -> int:
        """The group's ranks that do the work (`size`, at most the group)."""
        size = self.config.size
        return self.comm.world if size is None else min(size, self.comm.world)


_request: contextvars.ContextVar[Request | None] = contextvars.ContextVar("vaeshard_request", default=None)


def current() -> Request | None:
    """The request running in this context, or None outside one."""
    return _request.get()


@contextlib.contextmanager
def entered(request: Request):
    """Run `request` inside: it is `current()` (reset afterwards, also when the code inside raises)."""
    token = _request.set(request)
    try:
        yield request
    finally:
        _request.reset(token)


@contextlib.contextmanager
def scoped(**changes):
    """The current request with `changes` (a bare `Request` outside one) for the code run inside."""
    now = _request.get()
    with entered(Request(**changes) if now is None else dataclasses.replace(now, **changes)) as request:
        yield request


def check_shape(op: str, shape: tuple[int, ...], expected: Expected) -> tuple[int, str | None]:
    """`validate`'s checks of the shape alone (dimensions, latent channels, empty axes): what
    `vaeshard.plan` can answer for a shape without a tensor, with the message the request raises."""
    what = "latent" if op == "decode" else "sample"
    cls, layout = expected.cls, expected.layout
    if len(shape) != expected.ndim:
        return 2, (
            f"{op} of {cls} expects a {expected.ndim}-D {what} in layout {layout}, got {len(shape)}-D shape "
            f"{shape}: reshape it to {layout} (e.g. add a batch or frame dimension of 1)"
        )
    if expected.channels is not None and shape[1] != expected.channels:
        return 4, (
            f"decode of this {cls} expects a latent with {expected.channels} channels (its latent channels, C in "
            f"{layout}), got {shape[1]} in shape {shape}: check that the latent was made for this VAE"
        )
    if any(s == 0 for s in shape):
        return 5, (
            f"{op} got an empty {what} of shape {shape} (an axis of size 0): every axis needs at least one element"
        )
    return 0, None


def size_message(size: int, world: int) -> str:
    """Why a request whose `size` is larger than its group (of `world` ranks) is refused."""
    return (
        f"size={size} is larger than the process group ({world} rank{'s' if world != 1 else ''}): size "
        f"counts the group's ranks that do the work; pass size <= {world}, or size=None for the whole group"
    )


def validate(op: str, x, expected: Expected) -> tuple[int, str | None]:
    """(code, why) this request cannot run (the same answer on every rank for the same request),
    or (0, None). Structure first; the one pass over the values (NaN/Inf) only for a well-formed input."""
    what = "latent" if op == "decode" else "sample"
    if not isinstance(x, torch.Tensor):
        layout = expected.layout
        return 1, f"{op} expects the {what} as a torch.Tensor, got {type(x).__name__}: pass a tensor in layout {layout}"
    code, why = check_shape(op, tuple(x.shape), expected)
    if code == 2:
        return code, why
    if x.dtype not in DTYPES:
        return 3, f"{op} expects a floating-point {what}, got {x.dtype}: convert it with .to(vae.dtype)"
    if code:
        return code, why
    if expected.devices and x.device not in expected.devices:
        home = next(iter(expected.devices))
        return 6, (
            f"{op} got a {what} on {x.device}, but the VAE's parameters are on "
            f"{', '.join(map(str, expected.devices))}: move it with .to('{home}')"
        )
    if expected.dtypes and x.dtype not in expected.dtypes and not torch.is_autocast_enabled(x.device.type):
        home = next(iter(expected.dtypes))
        return 7, (
            f"{op} got a {str(x.dtype).replace('torch.', '')} {what}, but the VAE's parameters are "
            f"{', '.join(str(d).replace('torch.', '') for d in expected.dtypes)}: cast it with .to({home}) "
            "(or run under torch.autocast)"
        )
    if not bool(torch.isfinite(x).all()):
        num_nan, num_inf = int(torch.isnan(x).sum()), int(torch.isinf(x).sum())
        return 8, (
            f"{op} got a {what} with {num_nan} NaN and {num_inf} Inf values (shape {tuple(x.shape)}): "
            "it would decode to garbage, so vaeshard refuses it; check what produced it (e.g. a float16 "
            "overflow in the sampler) and pass finite values"
        )
    return 0, None


def inputs_digest(inputs: dict | None) -> int:
    """A 31-bit digest of a request's extra decoder inputs (names, and the values of tensors and
    scalars: LTX-Video's `temb`), 0 where there are none. Ranks that pass different values would
    decode different things and assemble them into one wrong result, so the agreement compares it."""
    if not inputs:
        return 0
    h = hashlib.sha256()
    for name in sorted(inputs):
        value = inputs[name]
        h.update(name.encode() + b"\0")
        if isinstance(value, torch.Tensor):
            t = value.detach().to("cpu").contiguous().reshape(-1)
            h.update(f"{t.dtype}{tuple(value.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes())
        elif isinstance(value, torch.Generator):  # a decoder's noise generator: its device and state
            h.update(str(value.device).encode() + value.get_state().numpy().tobytes())
        else:
            h.update(repr(value).encode())
    return int.from_bytes(h.digest()[:4], "big") & 0x7FFFFFFF


def describe(
    op: str, x, mode: str, output: str, size: int | None, hooked: bool, inputs: dict | None = None
) -> list[int]:
    """A fixed-length integer description of this rank's request, compared across ranks (`inputs`:
    the family's extra decoder inputs, compared by `inputs_digest`)."""
    if isinstance(x, torch.Tensor):
        shape = list(x.shape)[:6]
        dtype = DTYPES.index(x.dtype) if x.dtype in DTYPES else 99
        ndim = x.dim()
    else:
        shape, dtype, ndim = [], -1, -1
    head = [
        OPS.index(op),
        MODES.index(mode),
        OUTPUTS.index(output),
        -1 if size is None else size,
        int(hooked),
        ndim,
        dtype,
    ]
    return head + shape + [-1] * (6 - len(shape)) + [inputs_digest(inputs)]


def describe_verify(num_parameters: int) -> list[int]:
    """`describe`'s layout for a `verify_weights` call: the parameters' count where the shape goes."""
    return [OPS.index("verify_weights"), -1, -1, -1, 0, -1, -1, num_parameters] + [-1] * 5 + [0]


def explain(desc: list[int]) -> str:
    op, mode, output, size, hooked, ndim, dtype = desc[:7]
    if OPS[op] == "verify_weights":
        return f"verify_weights of {desc[7]} parameters"
    if ndim < 0:
        what = "not a tensor"
    else:
        dt = str(DTYPES[dtype]).replace("torch.", "") if 0 <= dtype < len(DTYPES) else "unsupported dtype"
        what = f"shape {tuple(desc[7 : 7 + min(ndim, 6)])} {dt}"
    extra = "" if size < 0 else f", size {size}"
    extra += ", layers hooked" if hooked else ""
    extra += f", inputs {desc[13]:08x}" if len(desc) > 13 and desc[13] else ""
    return f"{OPS[op]} {what}, mode {MODES[mode]}, output {OUTPUTS[output]}{extra}"


def agree(comm: Comm, op: str, desc: list[int], code: int, error: str | None, timeout: float | None) -> None:
    """The request's agreement: every rank's description and problem code through the group's store
    (Comm.agree, bounded by `timeout`, else the agreement's default). Raises on every rank when the
    ranks disagree or any rank's input is invalid (this rank's own `error` first); returns when the
    request can run everywhere."""
    if comm.world > 1:
        seconds, bound = agreement_timeout(timeout)
        descs = comm.agree(desc + [code], seconds, op, bound)
        if any(d[:-1] != descs[0][:-1] for d in descs):
            lines = "; ".join(f"rank {r}: {explain(d)}" for r, d in enumerate(descs))
            raise ValueError(
                f"ranks disagree on the {op} request ({lines}): every rank of the group must call "
                f"{op} with the same shape, dtype, mode, output and size and the same extra inputs (such as "
                "LTX-Video's temb, the global RNG's state where the decoder draws noise: seed every rank "
                "alike, and in mode auto the VAE's own tiling: enable_tiling on every rank or none; 'inputs' "
                "is their digest), on a VAE hooked alike (hooks that replace its layers' forwards on every "
                "rank or none)"
            )
        bad = [r for r, d in enumerate(descs) if d[-1]]
        if bad and error is None:
            code = descs[bad[0]][-1]
            error = (
                f"{op} input is invalid on rank(s) {bad} ({PROBLEMS[code][1]}; that rank's error says more): "
                "the whole group stops, as every rank must run the same request"
            )
    if error is not None:
        raise PROBLEMS[code][0](error)


class StreamClosed(RuntimeError):
    """Another rank closed its stream before the end: the request ended on every rank."""


def carry_on(comm: Comm, k: int, count: int, timeout: float | None) -> None:
    """Before step `k` of `count` of a streamed request: every rank says whether its consumer still
    wants the rest (through the store: bounded, no collective left pending); StreamClosed on every
    rank if one does not."""
    rows = _agree_step(comm, 1, timeout)
    closed = [r for r, row in enumerate(rows) if not row[0]]
    if closed:
        raise StreamClosed(
            f"stream_decode: rank(s) {closed} closed the stream after {k} of {count} chunks; the request "
            "ended on every rank (every rank must consume the same chunks; close it on every rank alike)"
        )


def tell_closed(comm: Comm, k: int, count: int, timeout: float | None) -> None:
    """This rank's consumer closed the stream after chunk `k`: tell the others at their next step
    (nothing to tell after the last chunk). A rank that cannot be told fails its own wait, bounded."""
    if k + 1 >= count or comm.world == 1:
        return
    try:
        _agree_step(comm, 0, timeout)
    except CommTimeout as exc:
        log.warning("vaeshard: stream_decode closed on rank %d; the other ranks could not be told: %s", comm.rank, exc)


def _agree_step(comm: Comm, wants: int, timeout: float | None) -> list[list[int]]:
    if comm.world == 1:
        return [[wants]]
    seconds, bound = agreement_timeout(timeout)
    return comm.agree([wants], seconds, "stream_decode", bound)


__all__ = [
    "DTYPES",
    "Expected",
    "OPS",
    "PROBLEMS",
    "Request",
    "StreamClosed",
    "agree",
    "carry_on",
    "check_shape",
    "current",
    "describe",
    "describe_verify",
    "entered",
    "explain",
    "scoped",
    "size_message",
    "tell_closed",
    "validate",
]
