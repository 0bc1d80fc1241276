"""decode/batching.py: one compute thread for every session, their single-token steps batched."""

from __future__ import annotations

import functools
import threading
import time

import numpy as np
import pytest

from decode import Generator
from decode.batching import BatchingModel, ComputeThread


def _until(condition, what: str, timeout_s: float = 30.0) -> None:
    """Waits for ``condition()``: a state the test sets up, not a time it guesses (a busy machine only takes longer)."""
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, f"never: {what}"
        time.sleep(0.005)


def _queued(compute: ComputeThread) -> int:
    """Jobs waiting in the compute thread's queue (its inbox: there is no public count)."""
    with compute._q._cv:
        return len(compute._q._heap)


def _hold(compute: ComputeThread) -> tuple[threading.Event, threading.Thread]:
    """Keeps the compute thread busy with one job until the event returned is set; returns once that job runs."""
    running, hold = threading.Event(), threading.Event()
    busy = threading.Thread(target=compute.call, args=(lambda: (running.set(), hold.wait(60)),))
    busy.start()
    assert running.wait(30), "the holding job never ran"
    return hold, busy


def _queued_together(compute: ComputeThread, jobs) -> None:
    """Runs each of ``jobs`` on a thread of its own while the compute thread is held, lets it go once all of them
    wait in its queue (so that it takes them together), and waits for them to finish."""
    hold, busy = _hold(compute)
    threads = [threading.Thread(target=job) for job in jobs]
    for t in threads:
        t.start()
    _until(lambda: _queued(compute) == len(jobs), f"all {len(jobs)} steps queued behind the held job")
    hold.set()
    busy.join(10)
    for t in threads:
        t.join(60)


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
        out = [None] * len(states)

        def step(i):
            s, pos = states[i]
            out[i] = bm.forward(s, [42], pos).copy()

        _queued_together(compute, [functools.partial(step, i) for i in range(len(states))])
        assert len(states) == 4 and compute.batches.get(4) == 1, compute.batches
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
        results = {}

        def step(name, s, tok, pos):
            try:
                results[name] = bm.forward(s, [tok], pos).copy()
            except ValueError as e:
                results[name] = e

        _queued_together(compute, [functools.partial(step, "good", good, 5, 4), functools.partial(step, "bad", bad, 10**9, 0)])
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


class _Recording:
    """``model`` with its forward passes written to ``log`` (the number of tokens each), for counting slices."""

    def __init__(self, model, log: list):
        self.model, self.log = model, log
        self.file, self.config, self.weights, self.n_ctx = model.file, model.config, model.weights, model.n_ctx
        self.sliced = threading.Event()  # set once a pass ran

    def new_state(self):
        return self.model.new_state()

    def forward(self, s, tokens, pos0):
        out = self.model.forward(s, tokens, pos0)
        self.log.append(("slice", len(tokens)))
        self.sliced.set()
        return out


def test_a_long_prompt_goes_in_slices_with_the_same_result_and_yields_to_other_work(model, generator):
    """Sliced prefill gives the KV cache and logits of one pass; as bulk work it yields: short jobs submitted while it
    runs each go ahead of the remaining slices, waiting for at most the one slice under way (counted, not timed)."""
    compute = ComputeThread("test-decode")
    try:
        ids = generator.encode_chat([{"role": "user", "content": "Tell me everything about the bakery, " * 6}])
        assert len(ids) > 64
        log: list[tuple[str, int]] = []
        bm = BatchingModel(_Recording(model, log), compute, slice_tokens=16, bulk_tokens=32)
        ref = model.new_state()
        want = model.forward(ref, ids, 0).copy()
        s = model.new_state()
        got = bm.forward(s, ids, 0).copy()
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(s.k_cache[:, :len(ids)], ref.k_cache[:, :len(ids)])

        log.clear()
        recorder = bm.inner
        recorder.sliced.clear()
        t = threading.Thread(target=lambda: (bm.forward(model.new_state(), ids, 0), log.append(("long done", 0))))
        t.start()
        assert recorder.sliced.wait(30), "the long prefill never started"
        waits = []  # slices that ran between a short job's submission and its start
        for _ in range(3):  # short interactive jobs keep arriving while the prefill is under way
            before = sum(1 for what, _ in log if what == "slice")
            compute.call(lambda before=before: (waits.append(sum(1 for what, _ in log if what == "slice") - before),
                                                log.append(("short", 0))))
        t.join(60)
        kinds = [what for what, _ in log]
        assert kinds[-1] == "long done" and kinds.count("short") == 3
        assert kinds.index("short") < kinds.index("slice", kinds.index("short")) < kinds.index("long done")  # the prefill
        # was still under way when the short jobs ran: slices came after them
        assert all(n <= 1 for n in waits), waits  # each waited for the slice under way at most
        assert sum(n for what, n in log if what == "slice") == len(ids)
    finally:
        compute.close()


def test_the_cores_go_to_the_earliest_deadline_not_the_first_arrival():
    from decode.batching import Cores, deadline

    cores = Cores(slots=1)
    order: list[float] = []

    def wait(due):
        with deadline(due), cores:
            order.append(due)

    cores.acquire()
    threads = []
    for i, due in enumerate((3.0, 1.0, 2.0)):  # arriving in this order, while the cores are held
        t = threading.Thread(target=wait, args=(due,))
        t.start()
        threads.append(t)
        _until(lambda i=i: len(cores._waiting) == i + 1, f"waiter {i + 1} queued for the cores")  # (no public count)
    cores.release()
    for t in threads:
        t.join(10)
    assert order == [1.0, 2.0, 3.0]
    assert cores.overtaken == 2 and not cores.locked()
    with pytest.raises(RuntimeError, match="without acquire"):
        cores.release()


def test_two_places_run_two_holders_at_once_each_on_its_share_and_the_third_waits_by_deadline():
    from decode import cpu
    from decode.batching import Cores, deadline

    cores = Cores(slots=2)
    inside = threading.Barrier(2, timeout=10)  # two holders meet while both hold a place
    teams: list[int] = []
    order: list[str] = []

    def hold(name, due):
        with deadline(due), cores:
            share = cpu.process_share().team()  # (read beside the team: it follows the free CPU)
            teams.append((cpu.team(), max(1, share // 2)))  # each place's share of the free cores: one thread on two
            order.append(name)
            if name in ("a", "b"):
                inside.wait()

    a, b = (threading.Thread(target=hold, args=(n, 1.0)) for n in ("a", "b"))
    cores.acquire()  # a third holder: "a" takes the second place, "b" waits
    a.start()
    _until(lambda: order == ["a"], "the first holder got the free place")
    late, soon = (threading.Thread(target=hold, args=(n, d)) for n, d in (("late", 9.0), ("b", 1.0)))
    late.start()
    _until(lambda: len(cores._waiting) == 1, "the late one queued")  # (no public count)
    soon.start()
    _until(lambda: len(cores._waiting) == 2, "b queued")
    cores.release()  # b, due first, takes the place and meets a inside: two holders at once
    for t in (a, soon, late):
        t.join(10)
    assert order == ["a", "b", "late"], order
    assert cores.most == 2 and len(teams) == 3 and all(got == share for got, share in teams) and not cores.locked()
    assert cpu.team() == cpu.process_share().team()  # the cap went with the hold


def test_a_compute_job_runs_on_its_places_share_while_it_holds_it_and_unheld_work_on_the_free_cores():
    from decode import cpu
    from decode.batching import Cores

    compute = ComputeThread("test-places", cores=Cores(slots=2))
    try:
        def teams():  # (the share read beside the team: it follows the free CPU)
            return cpu.team(), cpu.process_share().team()

        held, share = compute.call(teams)
        assert held == max(1, share // 2)  # one thread on two cores: numba's team, CTranslate2's encoder, Piper's front
        unheld, share = compute.call(teams, exclusive=False)  # (a long transcription's)
        assert unheld == share
    finally:
        compute.close()


def test_the_compute_thread_serves_waiting_work_by_deadline():
    import math

    from decode.batching import current_deadline, deadline

    compute = ComputeThread("test-deadline")
    try:
        hold, busy = _hold(compute)
        order: list[tuple[str, float]] = []

        def ask(name, due):
            with deadline(due):
                compute.call(lambda: order.append((name, current_deadline())))

        threads = []
        for i, (name, due) in enumerate((("later", 50.0), ("never", math.inf), ("soon", 10.0), ("now", None))):
            t = threading.Thread(target=ask, args=(name, due))
            t.start()
            threads.append(t)
            _until(lambda i=i: _queued(compute) == i + 1, f"{name} queued behind the held job")
        hold.set()
        for t in threads + [busy]:
            t.join(10)
        # each job runs under its caller's deadline (what it hands on waits by it); no deadline is due now
        assert order == [("now", -math.inf), ("soon", 10.0), ("later", 50.0), ("never", math.inf)]
    finally:
        compute.close()


def test_bulk_slices_last_about_slice_ms_at_the_prompt_speed_measured(monkeypatch):
    """On a slow kernel path a 16-token slice would hold another session's turn up for ~100 ms: bulk slices are sized
    to ``slice_ms`` from what the slices before them cost (here a stand-in model costing 5 ms a token on a stand-in
    clock: what the slices cost is given, not measured, so a busy machine sees the same sizes)."""
    from decode import batching

    class Clock:  # ``time`` for decode.batching, with perf_counter advanced by the stand-in model alone
        now = 0.0

        def __getattr__(self, name):
            return getattr(time, name)

        def perf_counter(self):
            return self.now

    clock = Clock()
    monkeypatch.setattr(batching, "time", clock)

    class SlowModel:
        file = config = weights = None
        n_ctx = 4096

        def __init__(self):
            self.sizes: list[int] = []

        def new_state(self):
            return None

        def forward(self, s, tokens, pos0):
            self.sizes.append(len(tokens))
            clock.now += 0.005 * len(tokens)
            return np.zeros(4, np.float32)

    compute = ComputeThread("test-slices")
    try:
        inner = SlowModel()
        bm = BatchingModel(inner, compute, slice_tokens=16, bulk_tokens=32, slice_ms=25.0)
        assert bm.bulk_slice_tokens() == 16  # nothing measured yet
        bm.forward(None, list(range(100)), 0)
        assert sum(inner.sizes) == 100 and inner.sizes[0] == 16
        assert all(n in (4, 5) for n in inner.sizes[1:]), inner.sizes  # 25 ms at 5 ms a token
        assert bm.bulk_slice_tokens() in (4, 5)
        inner.sizes.clear()
        bm.forward(None, list(range(20)), 0)  # an ordinary prompt: 16-token slices, not bulk
        assert inner.sizes == [16, 4]
    finally:
        compute.close()
