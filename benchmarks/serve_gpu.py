"""The service's overhead on one GPU: requests through `vaeshard serve` against the same work done by
direct library calls in this process, interleaved request by request in one run.

    python benchmarks/serve_gpu.py --config wan21 --shape 1,16,21,60,104 --reps 20 --json OUT.json

Direct: `vaeshard.stream_decode` into the writer the service uses (cli/writer.py, `into` a buffer), so
both sides decode and encode the same bytes. Service: an HTTP client posting the same safetensors body
to a `vaeshard serve` subprocess on loopback (random weights with the real config on both sides; decode
cost does not depend on weight values). Prints latency p50/p99 and requests per second of each, and the
ratio; no two run at the same time. Two clients time the service: httpx (the answer held in memory, as a
Python client holds it) and curl (the answer read and dropped, as the direct side drops it), so the
service's own cost is told apart from a Python client's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
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


def _direct(config: str, shape, formats, dtype: str, device: str):
    import torch

    import vaeshard
    from vaeshard.cli import io
    from vaeshard.cli.bench import torch_dtype
    from vaeshard.cli.writer import ChunkWriter

    where = "cuda:0" if device == "cuda" else "cpu"
    vae = io.named_model(config).load(dtype=torch_dtype(dtype), device=where)
    vaeshard.parallelize(vae, "auto", output="rank0")
    z = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(where, vae.dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def once(kind: str) -> float:
        sync()
        started = time.perf_counter()
        with torch.no_grad(), ChunkWriter("direct", kind, 16, into=_Buffer()) as writer:
            for chunk in vaeshard.stream_decode(vae, z):
                writer.write(chunk)
        sync()
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
    parser.add_argument("--clients", default="httpx,curl", help="service clients, each timed on every request")
    parser.add_argument("--device", default="cuda", help="cuda (the figures) or cpu (a check of the script)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import httpx
    import torch
    from safetensors.torch import save

    from vaeshard.cli.bench import torch_dtype

    shape = tuple(int(s) for s in args.shape.split(","))
    formats = args.formats.split(",")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "vaeshard", "serve", "--config", args.config, "--device", args.device,
         "--dtype", args.dtype, "--port", str(port), "--max-queue", "64"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}"},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        once = _direct(args.config, shape, formats, args.dtype, args.device)
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
        z = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(torch_dtype(args.dtype))
        body = save({"latents": z})
        body_file = Path(tempfile.mkdtemp()) / "latents.safetensors"
        body_file.write_bytes(body)
        client = httpx.Client(timeout=600)
        query = {"zip": "png"}  # writer kind -> the service's format name, where they differ

        def with_httpx(kind: str) -> float:  # the whole answer in memory, as a Python client holds it
            started = time.perf_counter()
            r = client.post(url + "/v1/decode", content=body, params={"format": query.get(kind, kind)})
            r.raise_for_status()
            return time.perf_counter() - started

        def with_curl(kind: str) -> float:  # the answer read and dropped, as the direct side drops it
            started = time.perf_counter()
            subprocess.run(
                ["curl", "-sS", "--fail", "--data-binary", f"@{body_file}", "-o", os.devnull,
                 f"{url}/v1/decode?format={query.get(kind, kind)}"],
                check=True,
            )  # fmt: skip
            return time.perf_counter() - started

        clients = {"httpx": with_httpx, "curl": with_curl}
        chosen = [c for c in args.clients.split(",") if c != "curl" or shutil.which("curl")]
        if chosen != args.clients.split(","):
            print("curl is not installed: the service is timed with httpx only", file=sys.stderr)
        for kind in formats:
            for name in chosen:
                clients[name](kind)  # warm
        rows = []
        for kind in formats:
            times: dict[str, list[float]] = {"direct": [], **{name: [] for name in chosen}}
            for _ in range(args.reps):  # interleaved, one request at a time
                times["direct"].append(once(kind))
                for name in chosen:
                    times[name].append(clients[name](kind))
            row = {"format": kind, "seconds": times}
            for name, values in times.items():
                ordered = sorted(values)
                row[f"{name}_p50_s"] = statistics.median(ordered)
                row[f"{name}_p99_s"] = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
                row[f"{name}_rps"] = len(values) / sum(values)
            for name in chosen:
                row[f"{name}_overhead"] = row[f"{name}_p50_s"] / row["direct_p50_s"] - 1
            rows.append(row)
    finally:
        server.terminate()
        server.wait(timeout=120)
    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    env = {"torch": torch.__version__, "gpu": gpu, "command": sys.argv}
    if args.json:
        Path(args.json).write_text(
            json.dumps({"config": args.config, "shape": shape, "rows": rows, "environment": env})
        )
    print(f"{'format':12} {'route':7} {'p50 s':>7} {'p99 s':>7} {'req/s':>6} {'overhead':>8}")
    for r in rows:
        for name in r["seconds"]:
            over = f"{r[name + '_overhead']:8.1%}" if name != "direct" else ""
            p50, p99, rps = (r[f"{name}_{k}"] for k in ("p50_s", "p99_s", "rps"))
            print(f"{r['format']:12} {name:7} {p50:7.3f} {p99:7.3f} {rps:6.2f} {over}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
