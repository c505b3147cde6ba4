"""One rank of an arrival scenario (tests/test_runtime/test_agreement.py): run as
`python -m tests.arrival_ranks SCENARIO`
with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), one process per rank.

The rank prints one line `EVENTS {json}` of what it saw (epoch times, exception types and messages),
then leaves the way a user's script does: it returns from its main function and the interpreter exits,
with the process group still initialised unless the scenario destroys it. The test measures when the
process really ended.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta

GROUP_TIMEOUT_S = 30  # the group's own timeout: longer than any scenario, so only vaeshard's bounds act
SHAPE = (1, 4, 2, 8, 8)


def _decode(vae, z, events: list, label: str):
    """vae.decode(z), recording when it was called and how it ended; returns the sample or None."""
    events.append({"event": f"{label} called", "at": time.time()})
    try:
        out = vae.decode(z).sample
    except Exception as exc:  # noqa: BLE001 - the outcome is what the test looks at
        events.append({"event": f"{label} raised", "at": time.time(), "type": type(exc).__name__, "message": str(exc)})
        return None
    events.append({"event": f"{label} returned", "at": time.time()})
    return out


def _matches_diffusers(vae, z, out) -> float:
    """max |diff| of a decode with the same model in this process, diffusers' own untiled decode."""
    import torch

    import vaeshard

    vaeshard.unparallelize(vae)
    with torch.no_grad():
        ref = vae.decode(z).sample
    return float((out - ref).abs().max())


def main(scenario: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    rank = dist.get_rank()
    import vaeshard
    from tests.models import build, latent

    timeout = os.environ.get("ARRIVAL_TIMEOUT")
    vae = vaeshard.parallelize(
        build("wan21"), mode="spatial_shard_width", timeout=None if timeout is None else float(timeout)
    )
    z = latent(SHAPE)
    events: list[dict] = [{"event": "ready", "at": time.time()}]
    if scenario == "lonely":  # rank 0 decodes alone; rank 1 waits in a barrier of its own
        if rank == 0:
            _decode(vae, z, events, "decode")
        else:
            try:
                dist.barrier()
                events.append({"event": "barrier returned", "at": time.time()})
            except Exception as exc:  # noqa: BLE001
                events.append(
                    {
                        "event": "barrier raised",
                        "at": time.time(),
                        "type": type(exc).__name__,
                        "message": str(exc)[:200],
                    }
                )
    elif scenario == "rank-exits":  # rank 1 leaves before the request
        if rank == 0:
            time.sleep(1.0)  # rank 1 is gone by then
            _decode(vae, z, events, "decode")
        else:
            events.append({"event": "exit without decoding", "at": time.time()})
    elif scenario in ("late", "too-late"):  # rank 1 arrives ARRIVAL_DELAY s after rank 0
        if rank == 1:
            time.sleep(float(os.environ["ARRIVAL_DELAY"]))
        out = _decode(vae, z, events, "decode")
        if out is not None:
            events.append({"event": "max diff", "value": _matches_diffusers(vae, z, out)})
            vaeshard.parallelize(vae, mode="spatial_shard_width")
        if scenario == "too-late":  # both gave up on that request: the next one must work
            dist.barrier()
            out = _decode(vae, z, events, "second decode")
            if out is not None:
                events.append({"event": "max diff", "value": _matches_diffusers(vae, z, out)})
    elif scenario == "different":  # different requests, then the same one
        _decode(vae, latent((1, 4, 2, 8, 8 + rank)), events, "decode")
        out = _decode(vae, z, events, "second decode")
        if out is not None:
            events.append({"event": "max diff", "value": _matches_diffusers(vae, z, out)})
    elif scenario == "stall":  # rank 1 stops mid-decode for STALL_S; rank 0's exchange times out
        stall = float(os.environ["STALL_S"])
        calls = {"n": 0}

        # at the decoder's first call, right after the request's agreement: a later call would leave a
        # loaded machine time to deschedule rank 1 for longer than the bound before it stalls, and rank 0
        # would raise before the stall the test is about
        def hook(module, args):
            calls["n"] += 1
            if rank == 1 and calls["n"] == 1:
                events.append({"event": "stalled", "at": time.time()})
                time.sleep(stall)

        vae.decoder.register_forward_pre_hook(hook)
        _decode(vae, z, events, "decode")
        if rank == 0:
            _decode(vae, z, events, "second decode")  # the group is reported broken, at once
            dist.destroy_process_group()
            events.append({"event": "destroyed the group", "at": time.time()})
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    events.append({"event": "end of script", "at": time.time()})
    print("EVENTS " + json.dumps({"rank": rank, "events": events}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
