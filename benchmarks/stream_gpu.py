"""On the GPU: `vaeshard.stream_decode`'s chunks, concatenated, against `vae.decode` bit for bit (the
default fast tier with CUDA graphs, and the exact tier), and the CLI writer's CUDA path (GPU quantise,
pinned side-stream copy) against the CPU quantisation of the same chunks. One JSON line per check.

    python3 benchmarks/stream_gpu.py --out parity.jsonl [--config wan21] [--shape 1,16,9,60,104]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import numpy as np
import torch

import vaeshard
from vaeshard.cli import io
from vaeshard.cli.writer import ChunkWriter


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--config", default="wan21")
    parser.add_argument("--shape", default="1,16,9,60,104")
    args = parser.parse_args()
    shape = tuple(int(s) for s in args.shape.split(","))
    vae = io.named_model(args.config).load(dtype=torch.bfloat16, device="cuda")
    z = torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to("cuda", torch.bfloat16)
    rows = []
    for exact in (False, True):
        vaeshard.parallelize(vae, exact=exact)
        plan = vaeshard.plan(vae, z.shape)
        whole = vae.decode(z).sample
        chunks = [c.clone() for c in vaeshard.stream_decode(vae, z)]
        got = torch.cat(chunks, dim=2)
        rows.append(
            {
                "check": "stream == decode",
                "config": args.config,
                "shape": shape,
                "exact": exact,
                "cuda_graphs": bool(plan.fast and plan.fast.cuda_graphs),
                "frames_per_step": plan.fast.frames_per_step if plan.fast else 1,
                "chunks": [c.shape[2] for c in chunks],
                "ok": bool(torch.equal(got, whole)),
            }
        )
        if not exact:
            with tempfile.TemporaryDirectory() as folder:
                with ChunkWriter(os.path.join(folder, "gpu"), "frames") as writer:
                    for chunk in chunks:
                        writer.write(chunk)
                expected = io.to_uint8_frames(got.cpu())
                from PIL import Image

                same = all(
                    np.array_equal(
                        np.asarray(Image.open(os.path.join(folder, "gpu", f"{t:05d}.png")).convert("RGB")),
                        expected[0, t],
                    )
                    for t in range(expected.shape[1])
                )
            rows.append({"check": "CUDA writer == CPU quantisation", "frames": expected.shape[1], "ok": same})
        del whole, chunks, got
    with open(args.out, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
            print(json.dumps(row))


if __name__ == "__main__":
    main()
