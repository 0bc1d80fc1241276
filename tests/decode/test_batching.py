"""decode/batching.py: one compute thread for every session, their single-token steps batched."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from decode import Generator
from decode.batching import BatchingModel, ComputeThread


def _prompts(generator):
    qs = ("When do you open?", "How much is a croissant?", "Where are you?", "Who owns the bakery?")
    return [generator.encode_chat([{"role": "user", "content": q}]) for q in qs]


def test_concurrent_sequences_get_their_own_tokens_through_the_gate(model, generator):
    compute = ComputeThread("test-decode")
    try:
        batched = Generator(model=BatchingModel(model, compute))
        prompts = _prompts(generator)
        want = [generator.generate(p, max_tokens=12, stop_ids=()).token_ids for p in prompts]
        got = [None] * len(prompts)

        def run(i):
            g = batched.fork()
            got[i] = g.generate(prompts[i], max_tokens=12, stop_ids=()).token_ids

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert got == want
        assert sum(n * k for n, k in compute.batches.items()) >= 4 * 11  # every decode step went through the gate
    finally:
        compute.close()


def test_steps_waiting_together_run_as_one_batch(model, generator):
    compute = ComputeThread("test-decode")
    try:
        bm = BatchingModel(model, compute)
        states, logits_ref = [], []
        for p in _prompts(generator):
            s = model.new_state()
            model.forward(s, p, 0)
            states.append((s, len(p)))
            ref = model.new_state()
            model.forward(ref, p, 0)
            logits_ref.append(model.forward(ref, [42], len(p)).copy())
        hold = threading.Event()
        busy = threading.Thread(target=compute.call, args=(hold.wait, 5))  # the compute thread is busy meanwhile
        busy.start()
        time.sleep(0.1)
        out = [None] * len(states)

        def step(i):
            s, pos = states[i]
            out[i] = bm.forward(s, [42], pos).copy()

        threads = [threading.Thread(target=step, args=(i,)) for i in range(len(states))]
        for t in threads:
            t.start()
        time.sleep(0.3)  # all four steps are queued behind the held job
        hold.set()
        busy.join(10)
        for t in threads:
            t.join(60)
        assert compute.batches.get(4) == 1, compute.batches
        for a, b in zip(out, logits_ref):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * float(np.abs(b).max()))
            assert int(np.argmax(a)) == int(np.argmax(b))
    finally:
        compute.close()


def test_a_bad_step_fails_alone(model):
    compute = ComputeThread("test-decode")
    try:
        bm = BatchingModel(model, compute)
        good, bad = model.new_state(), model.new_state()
        model.forward(good, [1, 2, 3], 0)
        assert np.isfinite(bm.forward(good, [4], 3)).all()
        with pytest.raises(ValueError, match="out of range"):
            bm.forward(bad, [10**9], 0)
        assert compute.call(lambda x: x + 1, 1) == 2
        # a bad step inside a batch: the batch falls back to one by one, and only the bad one fails
        hold = threading.Event()
        busy = threading.Thread(target=compute.call, args=(hold.wait, 5))
        busy.start()
        time.sleep(0.1)
        results = {}

        def step(name, s, tok, pos):
            try:
                results[name] = bm.forward(s, [tok], pos).copy()
            except ValueError as e:
                results[name] = e

        threads = [threading.Thread(target=step, args=("good", good, 5, 4)),
                   threading.Thread(target=step, args=("bad", bad, 10**9, 0))]
        for t in threads:
            t.start()
        time.sleep(0.3)
        hold.set()
        busy.join(10)
        for t in threads:
            t.join(60)
        assert compute.batches.get(2) == 1, compute.batches
        assert isinstance(results["bad"], ValueError) and np.isfinite(results["good"]).all()
    finally:
        compute.close()


def test_a_closed_generator_frees_its_state_at_once(model):
    """No garbage collection needed: the compute thread keeps no finished job, and ``close`` drops the state."""
    import gc
    import weakref

    from decode.errors import ClosedError

    compute = ComputeThread("test-decode")
    gc.disable()
    try:
        g = Generator(model=BatchingModel(model, compute))
        assert g.memory_bytes() >= g.state.k_cache.nbytes + g.state.v_cache.nbytes > 0
        g.generate(g.encode_chat([{"role": "user", "content": "Hi"}]), max_tokens=3)
        kv = weakref.ref(g.state.k_cache)
        g.close()
        assert kv() is None and g.closed
        with pytest.raises(ClosedError, match="closed"):
            g.prefill([1, 2, 3])
    finally:
        gc.enable()
        compute.close()


def test_a_long_prompt_goes_in_slices_with_the_same_result_and_yields_to_other_work(model, generator):
    """Sliced prefill gives the KV cache and logits of one pass; as bulk work it waits while others keep the compute
    thread busy, and a short job submitted meanwhile runs before the remaining slices."""
    compute = ComputeThread("test-decode")
    try:
        bm = BatchingModel(model, compute, slice_tokens=16, bulk_tokens=32)
        ids = generator.encode_chat([{"role": "user", "content": "Tell me everything about the bakery, " * 6}])
        assert len(ids) > 64
        ref = model.new_state()
        want = model.forward(ref, ids, 0).copy()
        s = model.new_state()
        got = bm.forward(s, ids, 0).copy()
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(s.k_cache[:, :len(ids)], ref.k_cache[:, :len(ids)])

        order: list[str] = []
        done = threading.Event()

        def long_prefill():
            bm.forward(model.new_state(), ids, 0)
            order.append("long")
            done.set()

        t = threading.Thread(target=long_prefill)
        t.start()
        time.sleep(0.01)
        for _ in range(3):  # short interactive jobs keep arriving: each runs at once, ahead of the bulk slices
            t0 = time.monotonic()
            compute.call(lambda: None)
            order.append(f"short {time.monotonic() - t0:.3f}")
        t.join(60)
        assert done.is_set() and order[-1] == "long"
        assert all(float(o.split()[1]) < 0.5 for o in order[:-1])
    finally:
        compute.close()


def test_the_cores_go_to_the_earliest_deadline_not_the_first_arrival():
    from decode.batching import Cores, deadline

    cores = Cores()
    order: list[float] = []

    def wait(due):
        with deadline(due), cores:
            order.append(due)

    cores.acquire()
    threads = []
    for due in (3.0, 1.0, 2.0):  # arriving in this order, while the cores are held
        t = threading.Thread(target=wait, args=(due,))
        t.start()
        threads.append(t)
        time.sleep(0.05)
    cores.release()
    for t in threads:
        t.join(10)
    assert order == [1.0, 2.0, 3.0]
    assert cores.overtaken == 2 and not cores.locked()
    with pytest.raises(RuntimeError, match="without acquire"):
        cores.release()


def test_the_compute_thread_serves_waiting_work_by_deadline():
    import math

    from decode.batching import current_deadline, deadline

    compute = ComputeThread("test-deadline")
    try:
        hold = threading.Event()
        busy = threading.Thread(target=compute.call, args=(hold.wait, 5))
        busy.start()
        time.sleep(0.1)
        order: list[tuple[str, float]] = []

        def ask(name, due):
            with deadline(due):
                compute.call(lambda: order.append((name, current_deadline())))

        threads = []
        for name, due in (("later", 50.0), ("never", math.inf), ("soon", 10.0), ("now", None)):
            t = threading.Thread(target=ask, args=(name, due))
            t.start()
            threads.append(t)
            time.sleep(0.05)
        hold.set()
        for t in threads + [busy]:
            t.join(10)
        # each job runs under its caller's deadline (what it hands on waits by it); no deadline is due now
        assert order == [("now", -math.inf), ("soon", 10.0), ("later", 50.0), ("never", math.inf)]
    finally:
        compute.close()


def test_bulk_slices_last_about_slice_ms_at_the_prompt_speed_measured():
    """On a slow kernel path a 16-token slice would hold another session's turn up for ~100 ms: bulk slices are sized
    to ``slice_ms`` from what the slices before them cost (here a stand-in model spending 5 ms a token)."""

    class SlowModel:
        file = config = weights = None
        n_ctx = 4096

        def __init__(self):
            self.sizes: list[int] = []

        def new_state(self):
            return None

        def forward(self, s, tokens, pos0):
            self.sizes.append(len(tokens))
            time.sleep(0.005 * len(tokens))
            return np.zeros(4, np.float32)

    compute = ComputeThread("test-slices")
    try:
        inner = SlowModel()
        bm = BatchingModel(inner, compute, slice_tokens=16, bulk_tokens=32, slice_ms=25.0)
        assert bm.bulk_slice_tokens() == 16  # nothing measured yet
        bm.forward(None, list(range(100)), 0)
        assert sum(inner.sizes) == 100 and inner.sizes[0] == 16
        assert all(n <= 5 for n in inner.sizes[1:]), inner.sizes  # 25 ms at >= 5 ms a token
        assert bm.bulk_slice_tokens() in (4, 5)
        inner.sizes.clear()
        bm.forward(None, list(range(20)), 0)  # an ordinary prompt: 16-token slices, not bulk
        assert inner.sizes == [16, 4]
    finally:
        compute.close()
