"""The parity checks every family's tests share, as mixins a family's test class combines with its own
configs and cases (tests/test_families/test_*.py):

- `TileParity`: `tile` bit-identical to diffusers' own tiled decode / encode (`TILE_CASES`);
- `SpatialParity`: the spatial shards, uneven ones among them, within the family's tolerance of
  diffusers' untiled decode / encode (`SPATIAL_CASES`);
- `FrameLoopParity`: the fast tier's frame loop (direct and streamed) against diffusers' one-shot
  decode, the exact tier bit for bit, and the largest activation bounded by the frames per call;
- `RealConfigsOnMeta`: each real config (the family's `configs`) built on the meta device: its shape
  facts, every layer one vaeshard knows, and a plan;
- `Refusals`: a layer vaeshard cannot shard is refused, naming it, before anything is swapped.

Every reference is diffusers' own result for the same weights and input (rank 0's, sent to all).
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import vaeshard
from vaeshard import families

from .dist_harness import run_ranks
from .models import build, latent
from .parity import CPU_FP32, assert_close, assert_identical, reference_from_rank0


def sample(shape, seed: int = 3) -> torch.Tensor:
    """A sample in the VAE's [-1, 1] range."""
    return latent(shape, seed=seed).clamp(-1, 1)


def fast(vae, mode: str = "auto", frames_per_step: int = 1):
    return vaeshard.parallelize(vae, mode, fast=vaeshard.FastOptions(frames_per_step=frames_per_step))


def streamed(vae, z) -> list[torch.Tensor]:
    with vaeshard.stream_decode(vae, z) as chunks:
        return list(chunks)


def setting(path: str, value):
    """A `Refusals` case's break: sets the attribute at `path` of the VAE (a callable value: its result)."""

    def breaks(vae):
        owner, _, attr = path.rpartition(".")
        setattr(vae.get_submodule(owner), attr, value() if callable(value) else value)

    return breaks


class _Cases:
    """Parametrizes each mixin's test by the family class's own list of cases."""

    def pytest_generate_tests(self, metafunc):
        for arg, attr in (("tile_case", "TILE_CASES"), ("spatial_case", "SPATIAL_CASES"), ("refusal", "REFUSALS")):
            if arg in metafunc.fixturenames:
                cases = getattr(metafunc.cls, attr)
                assert cases, f"{metafunc.cls.__name__} takes {attr} and declares none"
                metafunc.parametrize(arg, cases, ids=[c[0] for c in cases])
        if "config_name" in metafunc.fixturenames:
            metafunc.parametrize("config_name", metafunc.cls.CONFIGS)

    # what a family's class may change

    MIN_STD: float | None = None  # a reference std the family's cases must exceed (besides assert_real's)

    @staticmethod
    def set_tiles(vae, tiles) -> None:
        """Set diffusers' tile settings from a case's `tiles`."""
        raise NotImplementedError

    @staticmethod
    def run(vae, x, op: str) -> torch.Tensor:
        """The VAE's own decode / encode (diffusers' as configured; vaeshard's once parallelized)."""
        with torch.no_grad():
            return vae.decode(x).sample if op == "decode" else vae.encode(x).latent_dist.parameters

    @classmethod
    def diffusers_untiled(cls, vae, x, op: str) -> torch.Tensor:
        return cls.run(vae, x, op)

    @staticmethod
    def diffusers_tiled(vae, x, op: str) -> torch.Tensor:
        with torch.no_grad():
            out = vae.tiled_decode(x) if op == "decode" else vae.tiled_encode(x)
        return getattr(out, "sample", out)

    @staticmethod
    def sharded() -> contextlib.AbstractContextManager:
        """Held while a sharded request runs (e.g. to make a whole-tensor path fail)."""
        return contextlib.nullcontext()


def _input(shape, op: str) -> torch.Tensor:
    return latent(shape) if op == "decode" else sample(shape)


def _tile_rank(rank, world, cls, model, tiles, shape, op):
    vae = build(model)
    cls.set_tiles(vae, tiles)
    x = _input(shape, op)
    reference = reference_from_rank0(rank, lambda: cls.diffusers_tiled(vae, x, op))
    assert vaeshard.plan(vae, x.shape, world, "tile", op=op).strategy == "tile"
    vaeshard.parallelize(vae, mode="tile")
    out = cls.run(vae, x, op)
    if cls.MIN_STD is not None:
        assert reference.std() > cls.MIN_STD
    assert_identical(out, reference, f"tile {op}")
    return tuple(out.shape)


def _spatial_rank(rank, world, cls, model, shape, mode, op, exact):
    vae = build(model)
    x = _input(shape, op)
    reference = reference_from_rank0(rank, lambda: cls.diffusers_untiled(vae, x, op))
    vaeshard.parallelize(vae, mode=mode, exact=exact)
    strategy = vaeshard.plan(vae, x.shape, world, mode, op=op).strategy
    assert strategy.startswith("spatial_shard"), strategy
    with cls.sharded():
        out = cls.run(vae, x, op)
    if cls.MIN_STD is not None:
        assert reference.std() > cls.MIN_STD
    assert_close(out, reference, cls.SPATIAL_TOL, f"{mode} {op}")
    return strategy


class TileParity(_Cases):
    # (id, model, tiles (as set_tiles takes them), input shape, world, op)
    TILE_CASES: list = []

    def test_tile_bit_identical(self, tile_case):
        _, model, tiles, shape, world, op = tile_case
        assert len(set(run_ranks(_tile_rank, world, type(self), model, tiles, shape, op))) == 1


class SpatialParity(_Cases):
    # (id, model, input shape, world, mode, op[, exact: the exact tier]); `auto` must pick AUTO_STRATEGY
    SPATIAL_CASES: list = []
    SPATIAL_TOL = CPU_FP32
    AUTO_STRATEGY = "spatial_shard_width"

    def test_spatial_matches_untiled(self, spatial_case):
        _, model, shape, world, mode, op, *exact = spatial_case
        strategies = run_ranks(_spatial_rank, world, type(self), model, shape, mode, op, bool(exact and exact[0]))
        if mode == "auto":
            assert strategies[0] == self.AUTO_STRATEGY


class FrameLoopParity(_Cases):
    """The fast tier's frame loop of a whole-clip causal decoder (families/*: `frame_loop`)."""

    LOOP_MODEL: str
    LOOP_LATENT: tuple[int, int, int]  # (channels, rows, columns) of the loop's latents
    LOOP_FRAMES: tuple[int, ...]  # latent frame counts decoded; the exact tier decodes the third
    LOOP_EXPLAIN: tuple[str, ...] = ("frame loop:",)  # what the plan says
    LOOP_ENCODE: tuple | None = None  # a sample the fast tier also encodes (within CPU_FP32)
    # the largest activation: the decoder's modules after the loop's head, the values of its widest
    # full-resolution layer per output frame, and its largest output (in frames of those) for each clip
    # length as diffusers decodes it at once and as the loop does (frames, per step)
    BOUND_FRAME_VALUES: int
    BOUND_DIFFUSERS: dict[int, int]
    BOUND_LOOP: dict[tuple[int, int], int]

    @staticmethod
    def looped_modules(decoder) -> list:
        raise NotImplementedError

    def _latent(self, frames: int) -> torch.Tensor:
        channels, rows, cols = self.LOOP_LATENT
        return latent((1, channels, frames, rows, cols), seed=frames)

    def test_frame_loop_direct_and_streamed_match_diffusers(self):
        from vaeshard.fast.frame_loop import num_steps

        vae = build(self.LOOP_MODEL)
        latents = {frames: self._latent(frames) for frames in self.LOOP_FRAMES}
        references = {frames: self.run(vae, z, "decode") for frames, z in latents.items()}
        x = None if self.LOOP_ENCODE is None else sample(self.LOOP_ENCODE)
        moments = None if x is None else self.run(vae, x, "encode")
        for frames, z in latents.items():
            for per_step in (1, 2):
                what = f"{frames} latent frames, {per_step} per step"
                fast(vae, frames_per_step=per_step)
                plan = vaeshard.plan(vae, z.shape)
                assert plan.strategy == "direct" and plan.fast.frames_per_step == per_step, what
                text = plan.explain()
                assert all(part in text for part in self.LOOP_EXPLAIN), text
                out = self.run(vae, z, "decode")
                assert_close(out, references[frames], CPU_FP32, what)
                chunks = streamed(vae, z)
                # the first call gives the first latent frame's one output frame
                assert len(chunks) == num_steps(frames, per_step) and chunks[0].shape[2] == 1, what
                assert torch.equal(torch.cat(chunks, dim=2), out), what
        if x is not None:
            assert_close(self.run(vae, x, "encode"), moments, CPU_FP32, "fast-tier encode")
        third = self.LOOP_FRAMES[2]
        vaeshard.parallelize(vae, exact=True)  # the exact tier: diffusers' one-shot decode, bit for bit, once
        assert vaeshard.plan(vae, latents[third].shape).fast is None
        assert_identical(self.run(vae, latents[third], "decode"), references[third], "exact")
        if x is not None:
            assert_identical(self.run(vae, x, "encode"), moments, "exact encode")
        chunks = streamed(vae, latents[third])
        assert len(chunks) == 1 and torch.equal(chunks[0], references[third])

    def test_frame_loop_bounds_the_largest_activation(self):
        """The largest output of a layer after the loop's head follows the frames per call, not the
        clip, where diffusers' grows with the clip."""
        vae = build(self.LOOP_MODEL)
        largest = [0]

        def record(module, inputs, output):
            output = output[0] if isinstance(output, tuple) else output
            largest[0] = max(largest[0], output.numel())

        hooks = [m.register_forward_hook(record) for part in self.looped_modules(vae.decoder) for m in part.modules()]

        def largest_of(frames: int, per_step: int | None) -> int:
            if per_step is not None:
                fast(vae, frames_per_step=per_step)
            largest[0] = 0
            self.run(vae, self._latent(frames), "decode")
            if per_step is not None:
                vaeshard.unparallelize(vae)
            return largest[0]

        try:
            diffusers = {frames: largest_of(frames, None) for frames in self.BOUND_DIFFUSERS}
            loop = {key: largest_of(*key) for key in self.BOUND_LOOP}
        finally:
            for hook in hooks:
                hook.remove()
        frame = self.BOUND_FRAME_VALUES
        assert diffusers == {k: n * frame for k, n in self.BOUND_DIFFUSERS.items()}, diffusers
        assert loop == {k: n * frame for k, n in self.BOUND_LOOP.items()}, loop


class Refusals(_Cases):
    # (id, model, break(vae): makes one layer one vaeshard cannot shard, the error's pattern)
    REFUSALS: list = []

    def test_install_refuses_before_swapping(self, refusal):
        _, model, breaks, match = refusal
        vae = build(model)
        breaks(vae)
        with pytest.raises(ValueError, match=match):
            families.family_for(vae).install_layers(vae)
        assert not any(vaeshard.runtime.swap.is_swapped(m) for m in vae.modules())


def _meta_attention(vae) -> tuple[int, contextlib.AbstractContextManager]:
    """(latent rows and columns, a context) for a decode on the meta device. FlexAttention refuses
    meta tensors: LTX-2.5's diffusion decoder's neighbourhood attention returns its queries there (the
    same shape; its values are the tiny config's tests'), on a latent as wide as its widest kernel."""
    import importlib
    from unittest import mock

    module = importlib.import_module(type(vae).__module__)
    if not hasattr(module, "_neighborhood_block_mask"):
        return 2, contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.object(module, "_neighborhood_block_mask", lambda *args: None))
    stack.enter_context(mock.patch.object(module, "dispatch_attention_fn", lambda query, *args, **kwargs: query))
    side = max(k for kernel in vae.config.decoder_stage_kernels for k in kernel[1:])
    return side, stack


class RealConfigsOnMeta(_Cases):
    """Each real config (`CONFIGS`, names of `vaeshard.named_configs()`) built on the meta device,
    shapes only: its shape facts are its decoder's, every layer is one vaeshard knows, and a latent
    of two tiles each way plans."""

    CONFIGS: list[str] = []

    def test_real_config_on_the_meta_device(self, config_name):
        import diffusers

        cls_name, config = vaeshard.named_configs()[config_name]
        facts = vaeshard.shape_facts(cls_name, config)
        with torch.device("meta"):
            vae = getattr(diffusers, cls_name)(**config).eval()
        family = families.family_for(vae)
        assert (facts.latent_ndim, facts.latent_channels) == (family.latent_ndim, family.latent_channels(vae))
        assert facts.spatial_factor == family.spatial_ratio(vae)
        if family.spatial_decode:
            family.install_layers(vae)  # refuses any layer it does not know
            assert any(vaeshard.runtime.swap.is_swapped(m) for m in vae.modules())
            family.uninstall_layers(vae)
        frames = () if facts.latent_ndim == 4 else (1 if facts.temporal_factor == 1 else 2,)
        shape = (1, facts.latent_channels, *frames, 64, 96)
        plan = vaeshard.plan(vae, shape, 4)
        assert plan.strategy.startswith("spatial_shard") == family.spatial_decode, plan.explain()
        if facts.latent_ndim == 4 or facts.temporal_factor == 1:
            return  # (the tiny configs' decode checks these layouts: tests/test_families/test_families.py)
        # 5 frames: MiniMax-H3's clip less token_drop (3) and more; LTX-2 reflects: 2 rows at least
        side, attention = _meta_attention(vae)
        z = torch.empty((1, facts.latent_channels, 5, side, side), device="meta")
        with torch.no_grad(), attention:
            out = vae.decode(z).sample
        size = side * facts.spatial_factor
        expected = (1, facts.sample_channels, facts.frames_out(5), size, size)
        assert tuple(out.shape) == expected, config_name
