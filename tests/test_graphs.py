"""The replayed decode loop (graphs.py, WanLike.decode_frames) on CPU, with a stand-in for the CUDA
graph that runs the step as the captured graph does: a static input and output, and the feature
cache copied back into the tensors the graph would read next time. The real graph is compared with
diffusers on the GPU by benchmarks/gpu_parity.py."""

from __future__ import annotations

import pytest
import torch

from .dist_harness import run_ranks
from .models import build, latent

TOL_CPU_FP32 = 1e-5


class StandInGraph:
    """graphs.ReplayedStep's contract on CPU: the step runs on a static input, its output lands in a
    static output (overwritten by the next call), and the state entries it replaced are copied back
    into the old tensors, which must stay the same objects from call to call."""

    calls = 0
    replaced = 0  # most entries one step replaced (the rest it updated in place)

    def __init__(self, step, state):
        self.step, self.state = step, state
        self.input = self.output = self.kept = None

    def __call__(self, x):
        from vaeshard import graphs

        if self.input is None:
            self.input = x.clone()
        else:
            self.input.copy_(x)
        before = list(self.state)
        y = self.step(self.input)
        type(self).replaced = max(type(self).replaced, sum(new is not old for new, old in zip(self.state, before)))
        graphs.restore_replaced(self.state, before)
        ids = [id(entry) for entry in self.state]
        assert self.kept is None or ids == self.kept, "a state entry changed between replays"
        self.kept = ids
        if self.output is None:
            self.output = y.clone()
        else:
            self.output.copy_(y)
        type(self).calls += 1
        return self.output


def test_restore_replaced_copies_new_entries_into_the_old_tensors():
    from vaeshard import graphs

    old, kept, new = torch.zeros(2, 3), torch.ones(2), torch.full((2, 3), 7.0)
    state = [old, kept]
    before = list(state)
    state[0] = new
    graphs.restore_replaced(state, before)
    assert state[0] is old and state[1] is kept and torch.equal(old, new)
    for changed in (torch.zeros(3, 3), torch.zeros(2, 3, dtype=torch.float64), torch.zeros(3, 2).t(), "Rep"):
        state = [old, kept]
        before = list(state)
        state[0] = changed
        with pytest.raises(graphs.StateChanged, match="state entry 0"):
            graphs.restore_replaced(state, before)
    with pytest.raises(graphs.StateChanged, match="entries"):
        graphs.check_steady([old, kept, None], [old, kept])


@pytest.mark.parametrize("model", ["wan21", "wan22", "qwenimage"])
def test_replayed_decode_loop_gives_the_eager_bits(model):
    import vaeshard
    from vaeshard import fast
    from vaeshard.families import qwenimage, wan
    from vaeshard.families.base import with_tiling_off

    vae = vaeshard.parallelize(build(model))
    family = qwenimage._QwenImage() if model == "qwenimage" else wan._Wan()
    z = latent((1, 4, 6, 5, 4))
    with torch.no_grad():
        plain = build(model).decode(z).sample
    with fast.tier(True):
        eager = with_tiling_off(vae, lambda: vae._decode(z, return_dict=False)[0])
        StandInGraph.calls = StandInGraph.replaced = 0
        replayed = with_tiling_off(vae, family.decode_frames, vae, z, StandInGraph)
    assert StandInGraph.calls == z.shape[2] - 3  # frames after the three eager ones
    # the blocks update their caches in place; only diffusers' own decoder head and tail (conv_in,
    # conv_out) make new ones, which the graph copies back (an extra copy of those two caches)
    assert StandInGraph.replaced == 2
    assert replayed.is_contiguous() and torch.equal(replayed, eager)
    assert (replayed - plain).abs().max() <= TOL_CPU_FP32
    assert all(entry is None for entry in vae._feat_map)  # the cache is released


def _sharded_replayed(rank, world, model, shape, mode):
    import vaeshard
    from vaeshard import graphs

    vae = vaeshard.parallelize(build(model), mode=mode)
    z = latent(shape)
    eager = vae.decode(z).sample
    graphs.capturable = lambda x: True  # this process only: the stand-in replaces the CUDA graph
    graphs.ReplayedStep = StandInGraph
    StandInGraph.calls = 0
    replayed = vae.decode(z).sample
    assert StandInGraph.calls == shape[2] - 3
    vaeshard.parallelize(vae, mode=mode, cuda_graphs=False)
    StandInGraph.calls = 0
    assert torch.equal(vae.decode(z).sample, eager) and StandInGraph.calls == 0
    with torch.no_grad():
        plain = build(model).decode(z).sample
    assert torch.equal(replayed, eager)
    return (replayed - plain).abs().max().item()


@pytest.mark.parametrize(
    "model,shape,mode,world",
    [("wan21", (1, 4, 5, 7, 6), "spatial_shard_height", 2), ("wan22", (1, 4, 6, 5, 7), "spatial_shard_width", 3)],
)
def test_sharded_replayed_decode_gives_the_eager_bits(model, shape, mode, world):
    diffs = run_ranks(_sharded_replayed, world, model, shape, mode)
    assert max(diffs) <= TOL_CPU_FP32
