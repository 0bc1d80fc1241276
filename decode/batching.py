"""One compute thread for every call into the decode core, stepping the sequences that wait together.

numba's parallel kernels run an OpenMP team per calling thread, and several teams on two cores
are slow (decode measured 36-48 tok/s instead of 101-120 with two threads taking turns), so all
compute goes through one ``ComputeThread``.  Its ``call(fn, *args)`` runs any function there and
waits.  ``BatchingModel`` is a model (``decode.Model``'s interface: ``new_state``, ``forward``) whose
forward passes are such calls, with one difference: single-token decode steps of different
sequences that are waiting at the same moment are run as one ``forward_batch`` (one pass over the
weights for all of them), so concurrent sessions share the weight traffic instead of queueing for
it.  The logits each caller gets are those of its own sequence, the same as ``forward`` gives.

``Generator``, the voice loop and every session use a ``BatchingModel`` like any model, from as many
threads as they like (one sequence per thread at a time, as always).

Work is served by deadline, earliest first (``deadline(t)``): a caller says by when its work is due (a turn's
voice-to-voice budget from the user's last voiced sample; an answer already speaking, the moment its audio runs
out; the next turn's prefill, a second on), and every job it hands to a compute thread, and its wait for the cores,
carries that deadline.  A job with none is due now (it has no one to yield to).  So of several sessions the turn
whose user stopped first gets the next slice, and a session that is only playing out its answer or listening waits
behind it.
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import queue
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager

import numpy as np

from . import cpu
from .qint import MAX_BATCH  # the most sequences one batched pass takes

#: prompt tokens per job: about 25 ms of prefill on a 2-core machine (as fast per token as 32 or 256 at a time),
#: the longest another session waits for them
SLICE_TOKENS = 16
#: a prompt longer than this (instructions, a long text item) is bulk work: it yields to the other sessions' turns
BULK_TOKENS = 96
#: a bulk slice lasts about this long (ms) at the prompt speed measured so far (fewer than ``SLICE_TOKENS`` on a slow
#: kernel path: the ``plain`` kernels take ~100 ms for 16 tokens), the longest another session's turn waits for one
SLICE_MS = 25.0


_local = threading.local()


def current_deadline() -> float:
    """The calling thread's deadline (``time.monotonic()`` seconds; ``-inf``, due now, outside ``deadline()``)."""
    return getattr(_local, "deadline", -math.inf)


@contextmanager
def deadline(t: float | None):
    """The compute this thread hands out meanwhile is due at ``t`` (``time.monotonic()``; ``math.inf``: whenever the
    cores are free; None: the deadline in force is kept)."""
    if t is None:
        yield
        return
    before = current_deadline()
    _local.deadline = t
    try:
        yield
    finally:
        _local.deadline = before


#: holders of the cores at one time (``Cores``): the decode core, Whisper and the voice are what runs at once
PLACES = 2


class Cores:
    """The machine's cores as a lock of ``slots`` places, each granted by deadline: when a place frees, the waiter whose
    work is due first gets it (the calling thread's ``current_deadline()``; ties in order of arrival).  A holder's
    compute runs on its share of the free cores (``decode.cpu.holding``: numba's team, CTranslate2's encoder, Piper's
    front): on two cores, two places of one thread each, so two holders run side by side instead of one team of two
    taking turns with the next (a team of two gained ~20% on a decode step alone and lost 2x beside the server's other
    threads: its half waits for a core at every layer).  ``slots`` None: ``PLACES``, or one while other programs leave
    this process a single core (``decode.cpu``'s share, read at each grant).  Used as ``threading.Lock`` is
    (``with cores:``); not re-entrant."""

    def __init__(self, slots: int | None = None):
        if slots is not None and slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.slots = slots
        self._cv = threading.Condition(threading.Lock())
        self._holders = 0
        self._waiting: list = []  # heap of (deadline, arrival)
        self._arrival = itertools.count()
        self._caps = threading.local()  # each holder's cap on its threads before it acquired
        #: grants that went to a later arrival with an earlier deadline (work that would have waited in a queue)
        self.overtaken = 0
        #: the most holders at one time
        self.most = 0

    def _places(self) -> int:
        return self.slots if self.slots is not None else min(PLACES, cpu.process_share().team())

    def acquire(self, due: float | None = None) -> bool:
        entry = (current_deadline() if due is None else due, next(self._arrival))
        with self._cv:
            if self._waiting or self._holders >= self._places():
                heapq.heappush(self._waiting, entry)
                while self._waiting[0] is not entry or self._holders >= self._places():
                    self._cv.wait(0.05)  # (the places follow the free CPU: looked at again now and then)
                heapq.heappop(self._waiting)
                if self._waiting and min(a for _, a in self._waiting) < entry[1]:
                    self.overtaken += 1
                self._cv.notify_all()  # the next waiter may fit in a place still free
            self._holders += 1
            self.most = max(self.most, self._holders)
        self._caps.hold = cpu.holding(max(1, cpu.process_share().team() // self._places()))
        self._caps.hold.__enter__()
        return True

    def release(self) -> None:
        with self._cv:
            if self._holders <= 0:
                raise RuntimeError("Cores.release() without acquire()")
            self._holders -= 1
            if self._waiting:
                self._cv.notify_all()
        hold = getattr(self._caps, "hold", None)
        if hold is not None:
            self._caps.hold = None
            hold.__exit__(None, None, None)

    def locked(self) -> bool:
        """Some work holds a place."""
        return self._holders > 0

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class _Step:
    """A forward pass asked for by some thread."""

    __slots__ = ("model", "state", "tokens", "pos0", "future", "due")

    def __init__(self, model, state, tokens, pos0: int, due: float):
        self.model, self.state, self.tokens, self.pos0 = model, state, tokens, pos0
        self.future: Future = Future()
        self.due = due

    @property
    def single(self) -> bool:
        return len(self.tokens) == 1

    def run_alone(self) -> None:
        _settle(self.future, self.model.forward, self.state, self.tokens, self.pos0)


class _Call:
    """Any function to run on the compute thread."""

    __slots__ = ("fn", "args", "future", "exclusive", "due")

    def __init__(self, fn, args, exclusive: bool, due: float):
        self.fn, self.args, self.exclusive, self.due = fn, args, exclusive, due
        self.future: Future = Future()


class _Inbox:
    """The compute thread's queue: jobs by deadline, earliest first (in order of arrival among equals)."""

    def __init__(self):
        self._cv = threading.Condition(threading.Lock())
        self._heap: list = []
        self._arrival = itertools.count()

    def put(self, job, due: float) -> None:
        with self._cv:
            heapq.heappush(self._heap, (due, next(self._arrival), job))
            self._cv.notify()

    def get(self, timeout: float | None = None):
        """The job due first; raises ``queue.Empty`` after ``timeout`` seconds (None: waits for one)."""
        with self._cv:
            if not self._heap and not self._cv.wait_for(lambda: self._heap, timeout):
                raise queue.Empty
            return heapq.heappop(self._heap)[2]

    def get_nowait(self):
        with self._cv:
            if not self._heap:
                raise queue.Empty
            return heapq.heappop(self._heap)[2]

    def take_steps(self, model, n: int) -> list:
        """Up to ``n`` waiting single-token steps on ``model``, whatever their deadlines (earliest first): they ride
        along in one batched pass."""
        with self._cv:
            found = sorted(e for e in self._heap if isinstance(e[2], _Step) and e[2].single and e[2].model is model)[:n]
            if found:
                taken = {id(e[2]) for e in found}
                self._heap = [e for e in self._heap if id(e[2]) not in taken]
                heapq.heapify(self._heap)
            return [e[2] for e in found]


_WAKE = object()  # put in the queue when a bulk slice arrives: the thread looks again


class ComputeThread:
    """The thread that makes every numba call: ``call(fn, *args)`` runs ``fn`` there and returns its
    result (or raises its exception); ``step(model, state, tokens, pos0)`` is a forward pass that may be
    batched with other sequences' single-token steps waiting at the same time (``batches`` counts them).  Jobs run
    in the order of their callers' deadlines (``deadline()``), and take the cores (``Cores``) by the same."""

    def __init__(self, name: str = "decode", max_batch: int = MAX_BATCH, cores: Cores | None = None,
                 quiet_s: float = 0.02, nice: int = 0, idle: bool = False):
        self.max_batch = max_batch
        #: held while a job runs: engines that share one (the decode core, Whisper, the voice) never run
        #: their thread teams at the same time on the same cores
        self.cores = cores if cores is not None else Cores()
        self.batches: dict[int, int] = {}  # batch size -> passes run with it
        self.quiet_s = quiet_s
        self.nice = nice  # the thread's own scheduling niceness (Linux; threads it starts inherit it)
        #: run under SCHED_IDLE (Linux): only on CPU time nothing else wants, its thread teams too (they inherit it)
        self.idle = idle
        self._q = _Inbox()
        self._bulk: queue.SimpleQueue = queue.SimpleQueue()  # slices of long prefills, run when nothing else is
        self._last_work = 0.0  # monotonic end of the last job that was not bulk
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    # -- callers' side ----------------------------------------------------------------------------

    def call(self, fn, *args, exclusive: bool = True):
        """``exclusive`` False: run without the cores lock, beside whatever holds it (for work too long to make the
        others wait for, such as a long utterance's transcription: both then go slower, neither stops)."""
        if threading.current_thread() is self._thread:
            return fn(*args)
        job = _Call(fn, args, exclusive, current_deadline())
        self._q.put(job, job.due)
        return job.future.result()

    def submit(self, fn, *args) -> Future:
        """``call`` without waiting: ``fn`` runs there by the caller's deadline; its outcome is in the future."""
        job = _Call(fn, args, True, current_deadline())
        self._q.put(job, job.due)
        return job.future

    def step(self, model, state, tokens, pos0: int, bulk: bool = False):
        """``bulk``: a slice of a long prefill, run only when no other work waits and none ran for ``quiet_s`` (the
        sessions in a turn step every few milliseconds, so bulk work fills the gaps between turns and delays a turn's
        next piece by at most one slice)."""
        if threading.current_thread() is self._thread:
            return model.forward(state, tokens, pos0)
        job = _Step(model, state, np.asarray(tokens, dtype=np.int64), pos0, math.inf if bulk else current_deadline())
        if bulk:
            self._bulk.put(job)
            self._q.put(_WAKE, -math.inf)
        else:
            self._q.put(job, job.due)
        return job.future.result()

    def close(self) -> None:
        self._q.put(None, math.inf)

    # -- the thread ------------------------------------------------------------------------------

    def _next(self):
        """The next job: the queue's earliest due; a bulk slice only once the queue has been empty for ``quiet_s``."""
        while True:
            try:
                job = self._q.get_nowait()
            except queue.Empty:
                wait = self._last_work + self.quiet_s - time.monotonic()
                if wait <= 0:
                    try:
                        return self._bulk.get_nowait(), True
                    except queue.Empty:
                        job = self._q.get()
                else:
                    try:
                        job = self._q.get(timeout=wait)
                    except queue.Empty:
                        continue
            if job is not _WAKE:
                return job, False

    def _serve(self) -> None:
        if self.nice:
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
            except (OSError, AttributeError):  # not Linux, or not allowed: the default priority
                pass
        if self.idle:
            try:
                os.sched_setscheduler(threading.get_native_id(), os.SCHED_IDLE, os.sched_param(0))
            except (OSError, AttributeError):  # not Linux: the niceness alone
                pass
        while True:
            job, bulk = self._next()
            if job is None:
                return
            if isinstance(job, _Call) and not job.exclusive:
                self._serve_one(job)
            else:
                with deadline(job.due):  # (and whatever the job hands on, the voice's chunks, waits by it)
                    with self.cores:
                        self._serve_one(job)
            if not bulk:
                self._last_work = time.monotonic()
            job = None  # not kept while waiting for the next: a finished job holds its sequence's state (a closed
            # session's KV cache would live until another job came)

    def _serve_one(self, job) -> None:
        if isinstance(job, _Step) and job.single:  # with everything already waiting: the other sessions' steps
            self._run_batch([job, *self._q.take_steps(job.model, self.max_batch - 1)])
        elif isinstance(job, _Step):
            job.run_alone()
        else:
            _settle(job.future, job.fn, *job.args)

    def _run_batch(self, batch: list[_Step]) -> None:
        self.batches[len(batch)] = self.batches.get(len(batch), 0) + 1
        if len(batch) == 1:
            batch[0].run_alone()
            return
        model = batch[0].model
        forward_batch = getattr(model, "forward_batch", None) or (lambda states, toks, poss: forward_each(model, states, toks, poss))
        try:
            out = forward_batch([j.state for j in batch], np.concatenate([j.tokens for j in batch]),
                                      [j.pos0 for j in batch])
        except BaseException:  # find whose step failed: run them one by one, each gets its own outcome
            for j in batch:
                j.run_alone()
            return
        for j, logits in zip(batch, out):
            if j.future.set_running_or_notify_cancel():
                j.future.set_result(logits)


def forward_each(model, states, tokens, positions) -> list[np.ndarray]:
    """``forward_batch`` for a model without one: the sequences one after another."""
    return [model.forward(s, tokens[i:i + 1], int(p)) for i, (s, p) in enumerate(zip(states, positions))]


def _settle(fut: Future, fn, *args) -> None:
    if not fut.set_running_or_notify_cancel():
        return
    try:
        fut.set_result(fn(*args))
    except BaseException as e:  # handed to the caller
        fut.set_exception(e)


class _PromptTimer:
    """``model``'s forward for prompt slices, keeping the ms per token they cost (where they run: no queue wait)."""

    def __init__(self, model):
        self.model = model
        self.ms_per_token: float | None = None

    def forward(self, s, tokens, pos0: int):
        t0 = time.perf_counter()
        out = self.model.forward(s, tokens, pos0)
        per = (time.perf_counter() - t0) * 1000 / max(1, len(tokens))
        self.ms_per_token = per if self.ms_per_token is None else 0.7 * self.ms_per_token + 0.3 * per
        return out


class BatchingModel:
    """``model`` whose forward passes run on ``compute`` (single-token steps batched across sequences)."""

    def __init__(self, model, compute: ComputeThread, slice_tokens: int = SLICE_TOKENS, bulk_tokens: int = BULK_TOKENS,
                 slice_ms: float = SLICE_MS):
        self.inner, self.compute = model, compute
        self.file, self.config, self.weights, self.n_ctx = model.file, model.config, model.weights, model.n_ctx
        self.slice_tokens, self.bulk_tokens, self.slice_ms = slice_tokens, bulk_tokens, slice_ms
        self._prompts = _PromptTimer(model)

    def bulk_slice_tokens(self) -> int:
        """Tokens per bulk slice: ``slice_ms`` of prompt at the speed measured so far, 1..``slice_tokens``."""
        per = self._prompts.ms_per_token
        return self.slice_tokens if per is None else max(1, min(self.slice_tokens, int(self.slice_ms / per)))

    def new_state(self):
        return self.inner.new_state()

    def forward(self, s, tokens, pos0: int) -> np.ndarray:
        """One forward pass on the compute thread; a prompt longer than ``slice_tokens`` goes in slices (each a job of its
        own, so other sequences' work runs between them), and one longer than ``bulk_tokens`` as bulk work (see
        ``ComputeThread.step``) in slices of about ``slice_ms`` each (``bulk_slice_tokens``).  The KV cache and the last
        logits come out the same as from one pass."""
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        n = len(tokens)
        if n == 1:  # (a decode step: on the model itself, so that the steps waiting together batch)
            return self.compute.step(self.inner, s, tokens, pos0)
        if n <= self.slice_tokens:
            return self.compute.step(self._prompts, s, tokens, pos0)
        bulk = n > self.bulk_tokens
        a = 0
        while a < n:
            size = self.bulk_slice_tokens() if bulk else self.slice_tokens
            logits = self.compute.step(self._prompts, s, tokens[a:a + size], pos0 + a, bulk=bulk)
            a += size
        return logits
