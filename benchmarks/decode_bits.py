"""The bits of every mode's decode on one GPU, for an A/B of two versions of vaeshard.

    python3 benchmarks/decode_bits.py --config wan21 --shape 1,16,21,90,160 --json bits.json

Random weights (torch.manual_seed(0)) with a named real config, a seeded latent, bf16: for each mode
the decode of the default fast tier with cuDNN's benchmark mode off (cuDNN then picks its algorithms
by heuristic, the same in every process, so equal code gives equal bits), the exact tier, and `tile`.
Prints one JSON line per decode with the SHA-256 of the output's bytes; two versions decoded the same
way agree bit for bit where the hashes do. Runs on the version of vaeshard on the path (0.1 or 0.2).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time

import torch

import vaeshard


def _parallelize(vae, mode: str, exact: bool):
    """parallelize with cuDNN's benchmark mode off, through 0.2's FastOptions or 0.1's keyword."""
    if hasattr(vaeshard, "FastOptions"):
        return vaeshard.parallelize(vae, mode, exact=exact, fast=vaeshard.FastOptions(cudnn_benchmark=False))
    return vaeshard.parallelize(vae, mode=mode, exact=exact, cudnn_benchmark=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="wan21", help="a named config of the command line (wan21, wan22, ...)")
    parser.add_argument("--shape", default="1,16,21,90,160", help="latent shape B,C,T,H,W")
    parser.add_argument("--modes", default="auto,tile", help="modes to decode (on one GPU spatial modes run directly)")
    parser.add_argument("--json", default=None, help="append the JSON lines to this file")
    args = parser.parse_args()
    try:  # 0.2
        from vaeshard.cli.io import named_model
    except ImportError:  # 0.1
        from vaeshard.io import named_model
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    vae = named_model(args.config).load(dtype=torch.bfloat16, device="cuda")
    shape = tuple(int(s) for s in args.shape.split(","))
    z = torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to("cuda", torch.bfloat16)
    rows = []
    for mode in args.modes.split(","):
        for exact in (False, True):
            if mode == "tile" and exact:
                continue  # tile is always the exact tier
            _parallelize(vae, mode, exact)
            with torch.no_grad():
                vae.decode(z[:, :, :2])  # warm-up: compiles, first-call costs
                torch.cuda.synchronize()
                began = time.perf_counter()
                out = vae.decode(z).sample
                torch.cuda.synchronize()
            digest = hashlib.sha256(out.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()
            row = {
                "version": vaeshard.__version__,
                "config": args.config,
                "shape": list(shape),
                "mode": mode,
                "exact": exact,
                "sha256": digest,
                "seconds": round(time.perf_counter() - began, 3),
                "mean": float(out.float().mean()),
                "std": float(out.float().std()),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
            del out
            vaeshard.unparallelize(vae)
    if args.json:
        with open(args.json, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
