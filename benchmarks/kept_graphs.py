#!/usr/bin/env python3
"""`FastOptions(keep_cuda_graphs=True)` on one GPU: every request's output against the eager decode, bit for bit.

    python3 benchmarks/kept_graphs.py [--models wan21,wan22]
    torchrun --standalone --nproc_per_node=2 benchmarks/kept_graphs.py --mode spatial_shard_height

Under torchrun (NCCL) every rank decodes its share in `--mode` and the kept graphs hold the halo
exchanges; the reference is the same mode's eager decode.

CUDA graphs replay the kernels the eager calls launch, so a replayed decode equals the eager one
(`FastOptions(cuda_graphs=False)`) bit for bit. With kept graphs a request may replay graphs another request
captured; this runs, per model (real config, random weights, bf16), a sequence of requests that
exercises every way a kept graph is reused or refused, each compared with the eager decode of the
same latent and weights:

  1. a first request (captures the steady call), 2. the same shapes again (replays it, captures the
  first two calls), 3. again (replays every call), 4. new latent values, 5. other frame sizes (the
  kept graphs are dropped), 6. the first shapes again, 7. after an in-place update of a weight,
  8. after the VAE went to the CPU and back (new weight addresses), 9. more frames per call with a
  shorter last call (12 latent frames: 1 + 3 x 3 + 2; a new parallelize call drops the kept
  graphs; the requests before take frames_per_step "auto", 2 at these frame sizes on CUDA), 10. the
  same again,
  11. after `vaeshard.release` (the latent of 9).

It also prints each request's time, how many graph captures it made (vaeshard's debug log) and the
memory the kept graphs hold between requests. Exits 1 if any output differs.
"""

from __future__ import annotations

import argparse
import copy
import gc
import logging
import os
import sys
import time

import torch

import vaeshard
from vaeshard import FastOptions
from vaeshard.api import config_of
from vaeshard.cli.io import NAMED_CONFIGS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_parity import CaptureCounter


def _check_model(name: str, mode: str, device: torch.device, world: int, captures: CaptureCounter, say) -> int:
    """The requests of the module's text for one model (real config, random weights, bf16) in `mode`;
    how many outputs differed from the eager decode."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    vae = AutoencoderKLWan(**NAMED_CONFIGS[name][1]).eval().to(device, torch.bfloat16)
    channels = vae.config.z_dim
    small, other = (30, 52), (26, 40)  # latent frames (240 x 416 and 208 x 320 decoded, x8)
    if name == "wan22":
        small, other = (15, 26), (13, 20)  # x16

    def latent(frames, hw, seed):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(1, channels, frames, *hw, generator=g).to(device, torch.bfloat16)

    # the reference: the same weights, decoded eagerly (its own object: a parallelize call on
    # `vae` would drop the kept graphs)
    reference_vae = copy.deepcopy(vae)
    vaeshard.parallelize(reference_vae, mode=mode, fast=FastOptions(cuda_graphs=False))

    def reference(z, frames_per_step):
        vaeshard.parallelize(
            reference_vae, mode=mode, fast=FastOptions(cuda_graphs=False, frames_per_step=frames_per_step)
        )
        with torch.no_grad():
            return reference_vae.decode(z).sample

    z1, z2, z3, z4 = latent(9, small, 1), latent(9, small, 2), latent(9, other, 3), latent(12, small, 4)

    def bump():
        for model in (vae, reference_vae):
            with torch.no_grad():
                model.decoder.up_blocks[0].resnets[0].conv1.weight.mul_(1.5)

    def move():
        vae.to("cpu")
        vae.to(device)

    def fewer_calls():
        vaeshard.parallelize(vae, mode=mode, fast=FastOptions(keep_cuda_graphs=True, frames_per_step=3))

    steps = [
        ("1 first request", z1, None),
        ("2 same shapes", z1, None),
        ("3 same shapes", z1, None),
        ("4 new latent values", z2, None),
        ("5 other frame sizes", z3, None),
        ("6 first shapes again", z1, None),
        ("7 a weight updated in place", z1, bump),
        ("8 to the CPU and back", z2, move),
        ("9 frames_per_step=3, a shorter last call", z4, fewer_calls),
        ("10 the same again", z4, None),
        ("11 after vaeshard.release", z4, lambda: vaeshard.release(vae)),
    ]
    vaeshard.parallelize(vae, mode=mode, fast=FastOptions(keep_cuda_graphs=True))  # cuda_graphs "auto"
    gc.collect()  # the previous model's objects (reference cycles) freed now, not during this one's requests
    baseline = torch.cuda.memory_allocated(device)
    say(
        f"{name}, {world} rank(s), mode {mode}: keep_cuda_graphs=True, each request against the eager "
        f"decode (cuda_graphs=False) of the same weights (rank 0's figures)",
        flush=True,
    )
    failures = 0
    for label, z, before in steps:
        if before is not None:
            before()
        expected = reference(z, config_of(vae).fast.frames_per_step)
        torch.cuda.synchronize()
        made, start = captures.count, time.perf_counter()
        with torch.no_grad():
            out = vae.decode(z).sample
        torch.cuda.synchronize()
        took, made = time.perf_counter() - start, captures.count - made
        held = (torch.cuda.memory_allocated(device) - baseline) / 2**30
        same = torch.equal(out, expected)
        failures += not same
        say(
            f"  {label:42} {'equal' if same else 'DIFFERENT'}  {took:.3f} s  {made} capture(s)  "
            f"held after it {held:.2f} GiB",
            flush=True,
        )
        del out, expected
    vaeshard.release(vae)
    return failures


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="wan21,wan22")
    ap.add_argument("--mode", default="auto", help="vaeshard mode (under torchrun: e.g. spatial_shard_height)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("nccl", device_id=device)
    main_rank = world == 1 or dist.get_rank() == 0
    say = print if main_rank else (lambda *a, **k: None)

    captures = CaptureCounter()
    logger = logging.getLogger("vaeshard")
    logger.addHandler(captures)
    logger.setLevel(logging.DEBUG)
    failures = 0
    for name in args.models.split(","):
        failures += _check_model(name, args.mode, device, world, captures, say)
        torch.cuda.empty_cache()
    if world > 1:  # every rank's outputs
        counted = torch.tensor([failures], device=device)
        dist.all_reduce(counted)
        failures = int(counted.item())
        dist.destroy_process_group()
    say("kept graphs:", "every output equal to the eager decode" if not failures else f"{failures} DIFFERENT")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
