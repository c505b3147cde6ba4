"""The service's overhead on one GPU: requests through `vaeshard serve` against the same work done by
direct library calls in this process, interleaved request by request in one run.

    python benchmarks/serve_gpu.py --config wan21 --shape 1,16,21,60,104 --reps 20 --json OUT.json

Direct: `vaeshard.stream_decode` into the writer the service uses (cli/writer.py, `into` a buffer), so
both sides decode and encode the same bytes. Service: an HTTP client posting the same safetensors body
to a `vaeshard serve` subprocess on loopback (random weights with the real config on both sides; decode
cost does not depend on weight values). Prints latency p50/p99 and requests per second of each, and the
ratio; the two never run at the same time.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class _Buffer:
    def __init__(self) -> None:
        self.size = 0

    def write(self, data) -> int:
        self.size += len(data)
        return len(data)

    def flush(self) -> None:
        pass


def _direct(config: str, shape, formats, dtype: str):
    import torch

    import vaeshard
    from vaeshard.cli import io
    from vaeshard.cli.bench import torch_dtype
    from vaeshard.cli.writer import ChunkWriter

    vae = io.named_model(config).load(dtype=torch_dtype(dtype), device="cuda:0")
    vaeshard.parallelize(vae, "auto", output="rank0")
    z = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to("cuda:0", vae.dtype)

    def once(kind: str) -> float:
        torch.cuda.synchronize()
        started = time.perf_counter()
        with torch.no_grad(), ChunkWriter("direct", kind, 16, into=_Buffer()) as writer:
            for chunk in vaeshard.stream_decode(vae, z):
                writer.write(chunk)
        torch.cuda.synchronize()
        return time.perf_counter() - started

    for kind in formats:
        once(kind)  # warm
    return once


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="wan21")
    parser.add_argument("--shape", default="1,16,21,60,104")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--formats", default="safetensors,mp4")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import httpx
    import torch
    from safetensors.torch import save

    shape = tuple(int(s) for s in args.shape.split(","))
    formats = args.formats.split(",")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "vaeshard", "serve", "--config", args.config, "--device", "cuda", "--dtype", args.dtype,
         "--port", str(port), "--max-queue", "64"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}"},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        once = _direct(args.config, shape, formats, args.dtype)
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the service did not start")
            time.sleep(0.5)
        z = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
        body = save({"latents": z})
        client = httpx.Client(timeout=600)

        def post(kind: str) -> float:
            started = time.perf_counter()
            r = client.post(url + "/v1/decode", content=body, params={"format": "png" if kind == "zip" else kind})
            r.raise_for_status()
            return time.perf_counter() - started

        for kind in formats:
            post(kind)  # warm
        rows = []
        for kind in formats:
            direct, served = [], []
            for _ in range(args.reps):  # interleaved, one request at a time
                direct.append(once(kind))
                served.append(post(kind))
            row = {"format": kind, "direct_s": direct, "service_s": served}
            for name, values in (("direct", direct), ("service", served)):
                ordered = sorted(values)
                row[f"{name}_p50_s"] = statistics.median(ordered)
                row[f"{name}_p99_s"] = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
                row[f"{name}_rps"] = len(values) / sum(values)
            row["overhead"] = row["service_p50_s"] / row["direct_p50_s"] - 1
            rows.append(row)
    finally:
        server.terminate()
        server.wait(timeout=120)
    env = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "command": sys.argv}
    if args.json:
        Path(args.json).write_text(
            json.dumps({"config": args.config, "shape": shape, "rows": rows, "environment": env})
        )
    print(f"{'format':12} {'direct p50':>10} {'p99':>7} {'service p50':>11} {'p99':>7} {'rps d/s':>12} {'overhead':>8}")
    for r in rows:
        print(
            f"{r['format']:12} {r['direct_p50_s']:10.3f} {r['direct_p99_s']:7.3f} {r['service_p50_s']:11.3f} "
            f"{r['service_p99_s']:7.3f} {r['direct_rps']:5.2f}/{r['service_rps']:5.2f} {r['overhead']:8.1%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
