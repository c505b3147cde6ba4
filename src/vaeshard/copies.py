"""The causal caches' copies on a second CUDA stream, beside the convolutions (fast tier, CUDA).

Every decoder call copies each causal convolution's cache (its last input frames from the call
before) into the front of that convolution's input buffer, and the buffer's last frames back into
the cache for the next call: memory-bound copies between compute-bound convolutions, which on one
stream wait for each other (Wan 2.1 720p on an H200: 0.09 s of a 1.5 s decode). Issued on a stream
of their own, they run while the convolutions do:

- `copy_(dst, src)`: the copy is issued on the device's side stream once the caller's stream has
  issued everything before it (so it sees what that work wrote, and memory the caller's stream freed
  before is no longer in use), without the caller's stream waiting for it. `dst` and `src` are
  marked as in use by the side stream, so the caching allocator does not hand their memory to
  another tensor before the copy is done.
- `join(t)`: the caller's stream waits for every copy issued aside so far on `t`'s device: called
  before the first kernel that reads what a copy wrote (the convolution, the halo exchange) and at
  the end of each decoder call, so nothing issued aside outlives the call (a CUDA graph's capture
  takes the side stream's work in that way too).

The copies and their values are those made on one stream; only their order against the other
kernels changes. On other devices (CPU) both run the plain copy on the caller's stream.
"""

from __future__ import annotations

import torch

_side: dict[int, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _side:
        _side[index] = torch.cuda.Stream(device=index)
    return _side[index]


def copy_(dst: torch.Tensor, src: torch.Tensor) -> None:
    """`dst.copy_(src)`, on CUDA issued on the side stream (see the module's docstring)."""
    if not (dst.is_cuda and src.is_cuda and dst.device == src.device):
        dst.copy_(src)
        return
    main = torch.cuda.current_stream(dst.device)
    side = _side_stream(dst.device)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        dst.copy_(src)
    dst.record_stream(side)
    src.record_stream(side)


def join(t: torch.Tensor) -> None:
    """The caller's stream waits for the copies issued aside on `t`'s device (CUDA; else nothing)."""
    if t.is_cuda:
        index = t.device.index if t.device.index is not None else torch.cuda.current_device()
        side = _side.get(index)
        if side is not None:
            torch.cuda.current_stream(t.device).wait_stream(side)
