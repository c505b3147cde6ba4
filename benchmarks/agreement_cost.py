"""What a request's agreement costs: through the process group's store (vaeshard's) against one
all-gather collective (its former way), timed in the same processes, interleaved.

    torchrun --nproc_per_node=2 benchmarks/agreement_cost.py [--rounds 2000] [--backend gloo]

Rank 0 prints the median and 99th percentile per agreement of each way, microseconds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch.distributed as dist

from vaeshard.runtime.comm import Comm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--backend", default="gloo")
    args = parser.parse_args()
    dist.init_process_group(args.backend)
    comm = Comm.for_group(dist.group.WORLD)
    values = list(range(15))  # a request's description: 14 ints and a problem code
    times: dict[str, list[float]] = {"store": [], "all-gather": []}
    for i in range(args.rounds):
        for way in ("store", "all-gather") if i % 2 == 0 else ("all-gather", "store"):
            began = time.perf_counter()
            if way == "store":
                comm.agree(values, 60.0, "decode", "benchmark")
            else:
                comm.all_gather_ints(values)
            times[way].append(time.perf_counter() - began)
    if comm.rank == 0:
        for way, ts in times.items():
            ts = sorted(ts[len(ts) // 10 :])  # the first tenth warms up connections
            print(
                f"{way:>10}: median {1e6 * statistics.median(ts):7.1f} us, p99 {1e6 * ts[int(0.99 * len(ts))]:7.1f} "
                f"us over {len(ts)} agreements, {comm.world} ranks, {args.backend}"
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
