"""One rank of tests/test_cli/test_serve.py's two-agent torchrun group (`python -m tests.test_cli.serve_ranks MODEL
LATENTS DIR PORT` under torchrun): decode through the library and compare with diffusers' own decode
in this process (DIR/library-RANK.json), then serve with every rank of the same group (`vaeshard serve`
under torchrun) until rank 0 is stopped."""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta


def main(model: str, latents: str, out: str, port: str) -> int:
    import torch
    import torch.distributed as dist
    from diffusers import AutoencoderKLWan
    from safetensors.torch import load_file

    import vaeshard
    from vaeshard import cli

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    vae = AutoencoderKLWan.from_pretrained(model).eval()
    z = load_file(latents)["latents"]
    with torch.no_grad():
        reference = vae.decode(z).sample
        vaeshard.parallelize(vae, "spatial_shard_width", timeout=60)
        got = vae.decode(z).sample
    row = {"rank": dist.get_rank(), "world": dist.get_world_size(), "max_diff": float((got - reference).abs().max())}
    with open(os.path.join(out, f"library-{dist.get_rank()}.json"), "w") as f:
        json.dump(row, f)
    return cli.main(["serve", "--model", model, "--device", "cpu", "--port", port, "--timeout", "60"])


if __name__ == "__main__":
    code = main(*sys.argv[1:5])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as `vaeshard` does under torchrun: no interpreter teardown beside gloo's threads
