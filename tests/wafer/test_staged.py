"""The staged model (wafer/staged.py): decode.Model's interface on a deployment, identical tokens,
a simulated clock that advances per stage, hop and head, and one schedule with the simulation."""

from __future__ import annotations

import numpy as np
import pytest

from decode import Generator
from wafer.deploy import Deployment
from wafer.pipeline import simulate
from wafer.staged import StagedModel, local_ranges, stage

DEPLOYMENTS = (None, "llama-3.1-70b@cs3x4", "frontier-moe@h200x16:8bit", "smollm2-135m@h100x1")


def _staged(model, spec) -> StagedModel:
    return stage(model, Deployment.default() if spec is None else Deployment.parse(spec))


@pytest.fixture(scope="module")
def reference(oracle, generator):
    """The plain decode core's greedy tokens on every agreement prompt."""
    return [generator.generate(rec["prompt_ids"], max_tokens=TOKENS, stop_ids=()).token_ids for rec in oracle["records"]]


TOKENS = 20


@pytest.mark.parametrize("spec", DEPLOYMENTS)
def test_tokens_identical_to_the_plain_model_on_the_agreement_prompts(oracle, model, reference, spec):
    staged = Generator(model=_staged(model, spec))
    records = oracle["records"] if spec in DEPLOYMENTS[:2] else oracle["records"][::3]  # all on two, a third on the rest
    for rec in records:
        want = reference[oracle["records"].index(rec)]
        assert staged.generate(rec["prompt_ids"], max_tokens=TOKENS, stop_ids=()).token_ids == want, (spec, rec["name"])


def test_logits_identical_across_prompt_chunks(model):
    """A prompt longer than one chunk: chunks are in flight through the stages together."""
    staged = _staged(model, "llama-3.1-70b@cs3x4")
    ids = np.random.default_rng(1).integers(0, model.config.vocab_size, 600)
    a, b = model.new_state(), staged.new_state()
    assert np.array_equal(model.forward(a, ids, 0), staged.forward(b, ids, 0))
    assert np.array_equal(model.forward(a, [7], 600), staged.forward(b, [7], 600))
    assert np.array_equal(a.k_cache, b.k_cache)


def test_clock_advances_by_stage_hop_and_head(model):
    staged = _staged(model, "llama-3.1-70b@cs3x4")
    cost, n = staged.cost, staged.placement.n_units
    s = staged.new_state()
    staged.forward(s, [1, 2, 3, 4, 5], 0)
    prompt = sum(cost.stage_time(k, 5) for k in range(n)) + (n - 1) * cost.hop_time(5)
    assert s.sim.now_s == pytest.approx(prompt, rel=1e-12)
    assert cost.stage_time(n - 1) > cost.stage_time(0)  # the last unit also runs the head
    staged.forward(s, [6], 5)
    assert s.sim.now_s - prompt == pytest.approx(cost.token_time(), rel=1e-12)
    # one schedule: a decode step here takes what simulate() says a token takes
    assert cost.token_time() == pytest.approx(simulate(cost, sequences=1, tokens=1).makespan, rel=1e-12)
    spans = s.sim.last.spans
    assert [sp.what for sp in spans] == ["stage", "hop"] * (n - 1) + ["stage"]
    assert (s.sim.passes, s.sim.tokens) == (2, 6)


def test_prompt_chunks_pipeline_across_stages(model):
    staged = _staged(model, "llama-3.1-70b@cs3x4")
    s = staged.new_state()
    staged.forward(s, list(range(1, 513)), 0)  # two chunks of 256
    cost, n = staged.cost, staged.placement.n_units
    serial = 2 * (sum(cost.stage_time(k, 256) for k in range(n)) + (n - 1) * cost.hop_time(256))
    assert s.sim.now_s < serial  # the second chunk enters unit 0 while the first is on unit 1
    assert {sp.token for sp in s.sim.last.spans} == {0, 1}


def test_each_sequence_has_its_own_clock(model):
    g = Generator(model=_staged(model, None))
    g.generate(g.encode_chat([{"role": "user", "content": "Hi"}]), max_tokens=4)
    f = g.fork()
    assert f.state.sim.now_s == 0.0 and g.state.sim.now_s > 0
    assert g.state.sim.deployment == "smollm2-135m@wse3x1"


def test_local_layers_spread_over_the_target_stages(model):
    for spec in DEPLOYMENTS[1:] + ("llama-3.1-405b@cs3",):
        staged = _staged(model, spec)
        ranges = local_ranges(staged.placement, model.config.n_layers)
        assert ranges[0].start == 0 and ranges[-1].stop == model.config.n_layers
        assert all(a.stop == b.start for a, b in zip(ranges, ranges[1:]))
    same = _staged(model, "smollm2-135m@h100x1")
    assert same.ranges == tuple(range(s.first, s.stop) for s in same.placement.stages)


def test_gpu_deployments_serve_a_standard_batch_unless_told():
    std = Deployment.parse("frontier-moe@h200x16:8bit", serving=True)
    one = Deployment.parse("frontier-moe@h200x16:8bit,batch=1", serving=True)
    assert (std.batch, one.batch, Deployment.parse("frontier-moe@h200x16:8bit").batch) == (64, 1, 1)
    assert 30 < 1 / std.build()[1].token_time() < 60  # ~45 tok/s per user, as standard GPU serving
    assert 1 / one.build()[1].token_time() > 5 / std.build()[1].token_time()
    assert Deployment.parse("llama-3.1-70b@cs3x4", serving=True).batch == 1
    from wafer.specs import CatalogueError

    with pytest.raises(CatalogueError, match="GPU systems only"):
        Deployment.parse("llama-3.1-70b@cs3x4,batch=8")


def test_batched_steps_advance_each_sequence_by_its_own_step(model):
    staged = _staged(model, "llama-3.1-70b@cs3x4")
    states, refs = [], []
    for i, n in enumerate((3, 5, 8)):
        s, r = staged.new_state(), model.new_state()
        ids = list(range(10 + i, 10 + i + n))
        staged.forward(s, ids, 0)
        model.forward(r, ids, 0)
        states.append((s, n))
        refs.append(model.forward(r, [99], n).copy())
    before = [s.sim.now_s for s, _ in states]
    out = staged.forward_batch([s for s, _ in states], [99, 99, 99], [n for _, n in states])
    for (s, _), b, o, ref in zip(states, before, out, refs):
        assert s.sim.now_s - b == pytest.approx(staged.cost.token_time(), rel=1e-12)
        assert int(np.argmax(o)) == int(np.argmax(ref))
        np.testing.assert_allclose(o, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


def test_a_staged_pass_sizes_the_calling_threads_team_to_the_free_cpu(model):
    """``StagedModel.forward`` (what ``run`` and ``serve`` decode through) sizes the calling thread's numba team to the
    process's CPU share before it computes, as ``Model.forward`` does: with a neighbour taking a core (the share pinned
    at one thread here) a prompt and a decode step run on one thread, not on a team left at two."""
    import threading

    import numba

    from decode import cpu

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one core: every team is one thread")
    staged = _staged(model, None)
    share = cpu.process_share()
    before, seen = share.fixed, []

    def run():
        numba.set_num_threads(2)  # a team of two, as an earlier pass on this thread may have left it
        s = staged.new_state()
        staged.forward(s, [1, 2, 3], 0)
        seen.append(numba.get_num_threads())
        numba.set_num_threads(2)
        staged.forward(s, [4], 3)
        seen.append(numba.get_num_threads())

    try:
        share.pin(1)
        t = threading.Thread(target=run)
        t.start()
        t.join(120)
    finally:
        share.pin(before)
    assert seen == [1, 1]
