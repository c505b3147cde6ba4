"""`cuda_graphs=True` (graphs.py, WanLike._graph_step) on CPU, with a stand-in for the CUDA graph that
keeps the recorded graph's contract: the step runs on a static input, with the static state (the
feature cache tensors handed over at the first replay of a request), and replaced entries are copied
back into the static ones. The real graph is compared with diffusers on the GPU by
benchmarks/gpu_parity.py --cuda-graphs."""

from __future__ import annotations

import contextlib

import pytest
import torch

from .dist_harness import run_ranks
from .models import build, latent

TOL_CPU_FP32 = 1e-5


class StandInGraph:
    """Made by graphs.step_graph in place of graphs.StepGraph (see `_stand_in`)."""

    records = replays = 0

    @classmethod
    def make(cls, base):
        class StandIn(base):
            def _record(self, run):
                self.run = run  # a CUDA graph records without running; the stand-in runs at replay
                cls.records += 1

            def _replay(self):
                ids = [id(entry) for entry in self.static_state]
                self.output = self.run()
                assert [id(entry) for entry in self.static_state] == ids
                cls.replays += 1
                return self.output

        return StandIn


@contextlib.contextmanager
def _stand_in():
    """This process only: graphs record and replay with the stand-in on CPU tensors."""
    from vaeshard import graphs

    saved = graphs.StepGraph, graphs.capturable
    graphs.StepGraph, graphs.capturable = StandInGraph.make(saved[0]), (lambda x: True)
    StandInGraph.records = StandInGraph.replays = 0
    try:
        yield StandInGraph
    finally:
        graphs.StepGraph, graphs.capturable = saved


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


def _steady_calls(frames: int, per_step: int) -> int:
    """Decoder calls of full `per_step` frames after the first two calls (frame 0 alone, then one step)."""
    calls, start = [], 1
    while start < frames:
        calls.append(min(per_step, frames - start))
        start += per_step
    return sum(1 for n in calls[1:] if n == per_step)


@pytest.mark.parametrize("model,per_step", [("wan21", 1), ("wan22", 2), ("qwenimage", 1)])
def test_replayed_steps_give_the_eager_bits(model, per_step):
    """Direct decode: the first request of a shape checks one steady step eagerly, records the next
    and replays the rest; a later request of that shape replays from its first steady step. Every
    result has the bits of the eager decode and is within the CPU tolerance of diffusers'."""
    import vaeshard
    from vaeshard import graphs

    vae = build(model)
    z = latent((1, 4, 2 + 4 * per_step, 5, 4))  # four full steps after the first frame, and a short one
    with torch.no_grad():
        plain = vae.decode(z).sample
    vaeshard.parallelize(vae, frames_per_step=per_step)
    eager = vae.decode(z).sample
    vaeshard.parallelize(vae, frames_per_step=per_step, cuda_graphs=True)
    steady = _steady_calls(z.shape[2], per_step)
    assert steady >= 3
    with _stand_in() as g:
        first = vae.decode(z).sample
        assert (g.records, g.replays) == (1, steady - 1)
        second = vae.decode(z).sample
        assert (g.records, g.replays) == (1, 2 * steady - 1)
        assert graphs.held(vae) == 1
        other = latent((1, 4, 1 + 3 * per_step, 5, 4), seed=2)  # another length, same step shape: the same graph
        with torch.no_grad():
            other_ref = build(model).decode(other).sample
        assert (vae.decode(other).sample - other_ref).abs().max() <= TOL_CPU_FP32
        assert g.records == 1 and graphs.held(vae) == 1
    assert torch.equal(first, eager) and torch.equal(second, eager)
    assert (first - plain).abs().max() <= TOL_CPU_FP32
    assert all(entry is None for entry in vae._feat_map)  # the request's cache list is released
    vaeshard.parallelize(vae, frames_per_step=per_step)  # parallelizing again drops the graphs
    assert graphs.held(vae) == 0


def test_graphs_are_dropped_by_unparallelize_and_kept_per_shape():
    import vaeshard
    from vaeshard import graphs

    vae = vaeshard.parallelize(build("wan21"), cuda_graphs=True)
    with _stand_in() as g:
        vae.decode(latent((1, 4, 6, 5, 4)))
        vae.decode(latent((1, 4, 6, 4, 6)))  # another spatial size: a graph of its own
        assert g.records == 2 and graphs.held(vae) == 2
        vae.decode(latent((1, 4, 3, 5, 4)))  # too short to record: eager
        assert g.records == 2
    vaeshard.unparallelize(vae)
    assert graphs.held(vae) == 0


def test_graphs_stay_off_by_default_and_in_the_exact_tier():
    import vaeshard
    from vaeshard import graphs

    for kwargs in ({}, {"cuda_graphs": True, "exact": True}):
        vae = vaeshard.parallelize(build("wan21"), **kwargs)
        with _stand_in() as g:
            vae.decode(latent((1, 4, 6, 5, 4)))
        assert g.records == 0 and graphs.held(vae) == 0, kwargs


@pytest.mark.parametrize("value", [1, "yes", None])
def test_cuda_graphs_is_validated(value):
    import vaeshard

    vae = build("wan21")
    with pytest.raises(TypeError, match="cuda_graphs"):
        vaeshard.parallelize(vae, cuda_graphs=value)
    assert not hasattr(vae, "_vaeshard")


def _sharded_replayed(rank, world, model, shape, mode, per_step):
    import vaeshard
    from vaeshard import graphs

    vae = build(model)
    z = latent(shape)
    vaeshard.parallelize(vae, mode=mode, frames_per_step=per_step)
    eager = vae.decode(z).sample
    vaeshard.parallelize(vae, mode=mode, frames_per_step=per_step, cuda_graphs=True)
    with _stand_in() as g:
        first = vae.decode(z).sample
        second = vae.decode(z).sample
        counts = (g.records, g.replays)
    vaeshard.unparallelize(vae)
    with torch.no_grad():
        plain = vae.decode(z).sample
    assert graphs.held(vae) == 0
    assert torch.equal(first, eager) and torch.equal(second, eager)
    return counts, (first - plain).abs().max().item()


@pytest.mark.parametrize(
    "model,shape,mode,world,per_step",
    [("wan21", (1, 4, 6, 7, 6), "spatial_shard_height", 2, 1), ("wan22", (1, 4, 9, 5, 7), "spatial_shard_width", 3, 2)],
)
def test_sharded_replayed_steps_give_the_eager_bits(model, shape, mode, world, per_step):
    results = run_ranks(_sharded_replayed, world, model, shape, mode, per_step)
    steady = _steady_calls(shape[2], per_step)
    for counts, diff in results:
        assert counts == (1, 2 * steady - 1)
        assert diff <= TOL_CPU_FP32
