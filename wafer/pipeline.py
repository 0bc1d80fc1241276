"""``WaferPipeline``: the decode core's real layers run as pipeline stages on a simulated clock.

Each simulated unit (a wafer) is a stage that owns a contiguous range of ``decode`` layers:
it holds their weights (views into the loaded model, "resident") and, for every sequence,
the KV cache of those layers.  A token's hidden state is handed from stage to stage as a
message; several sequences can be in flight, so stages work at once, each on its own thread
calling the numba ``nogil`` kernels.

The order of work is decided by a discrete-event simulation (``clock.EventQueue``): a stage
takes the item that reached it first in simulated time, runs for the time the injected cost
model gives, and the hop to the next stage takes the modelled hop time.  The real computation
follows that order on the stage threads; the simulation waits for real results only where it
needs them (the sampled token that decides whether a sequence goes on).  The tokens are those
of ``decode.Generator`` on the same prompt, whatever the stage count.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from queue import SimpleQueue

import numpy as np

from decode.generate import end_reason
from decode.model import KV_DTYPE, PREFILL_CHUNK, Model, RunState
from decode.sampling import GREEDY, Sampler, SamplingParams

from .clock import EventQueue, Kind, Span, Timeline
from .placement import Placement
from .timing import CostModel, cost_model


@dataclass
class _Seq:
    index: int
    prompt: list[int]
    max_tokens: int
    sampler: Sampler
    k_cache: np.ndarray
    v_cache: np.ndarray
    out: list[int] = field(default_factory=list)
    finish: str = ""
    steps: int = 0  # decode steps started (the first token comes from the prompt's pass)
    first_token_s: float = 0.0  # simulated time of its first token


@dataclass(frozen=True)
class _Item:
    seq: _Seq
    token: int  # step index; prefill chunks are negative (-chunks .. -1)
    pos0: int
    ids: np.ndarray  # the tokens this pass embeds (stage 0)
    last_chunk: bool  # the pass whose logits give the next token


class _Stage:
    """One simulated unit: its layer range, its own scratch buffers and a worker thread."""

    def __init__(self, model: Model, index: int, first: int, stop: int, has_head: bool):
        self.model, self.index, self.first, self.stop, self.has_head = model, index, first, stop, has_head
        self.layers = model.weights.layers[first:stop]  # resident weights (views, not copies)
        self.scratch = RunState(model.config, 1)  # activations; KV caches are set per item
        self.jobs: SimpleQueue = SimpleQueue()
        self.busy_s = 0.0
        self.thread = threading.Thread(target=self._run, name=f"wafer-stage-{index}", daemon=True)
        self.thread.start()

    def submit(self, fn) -> Future:
        fut: Future = Future()
        self.jobs.put((fn, fut))
        return fut

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join(10)

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            fn, fut = job
            t0 = time.perf_counter()
            try:
                fut.set_result(fn())
            except BaseException as e:  # handed to the simulation, which raises it
                fut.set_exception(e)
            self.busy_s += time.perf_counter() - t0

    def forward(self, item: _Item, x_in: Future | None) -> np.ndarray | int:
        """This stage's part of one pass: embed (first stage), its layers, head and sampling (last)."""
        m, s = self.model, self.scratch
        if x_in is None:
            x = np.zeros((len(item.ids), m.config.d_model), np.float32)
            m.embed(item.ids, x)
        else:
            x = x_in.result().copy()  # the message that crossed the hop
        s.k_cache, s.v_cache = item.seq.k_cache, item.seq.v_cache
        m.layers(s, self.first, self.stop, x, item.pos0)
        if not self.has_head:
            return x
        if not item.last_chunk:
            return -1
        logits = m.head(s, x[-1:])
        return item.seq.sampler(logits, item.seq.prompt + item.seq.out)  # the history Generator samples with


@dataclass
class PipelineRun:
    """What a run produced and what it cost, on this machine and on the simulated target."""

    tokens: list[list[int]]
    finish: list[str]
    timeline: Timeline
    wall_s: float
    stage_busy_s: list[float]
    first_token_s: list[float]
    target: str

    @property
    def sim_s(self) -> float:
        return self.timeline.makespan

    @property
    def sim_tok_s(self) -> float:
        """Generated tokens per simulated second, all sequences together."""
        n = sum(len(t) for t in self.tokens)
        return n / self.sim_s if self.sim_s else 0.0

    @property
    def wall_tok_s(self) -> float:
        n = sum(len(t) for t in self.tokens)
        return n / self.wall_s if self.wall_s else 0.0

    def to_dict(self) -> dict:
        return {"target": self.target, "tokens": self.tokens, "finish": self.finish, "wall_s": self.wall_s,
                "sim_s": self.sim_s, "sim_tok_s": self.sim_tok_s, "wall_tok_s": self.wall_tok_s,
                "utilisation": self.timeline.utilisation(), "bubbles_s": self.timeline.bubbles(),
                "stage_busy_wall_s": self.stage_busy_s, "first_token_sim_s": self.first_token_s}


def schedule(cost: CostModel, n: int, entries: list, on_start, on_done) -> Timeline:
    """Run the discrete-event simulation of ``n`` stages.  ``entries`` arrive at stage 0 at time 0;
    each item needs ``.seq.index``, ``.token`` and ``.ids`` (its token count).  A stage takes
    the item that reached it first, ``on_start(stage, item)`` returns a handle for its work,
    the stage is busy for ``cost.stage_time``, then the item hops to the next stage; after the
    last stage ``on_done(item, handle, now)`` returns the items that enter stage 0 next."""
    q = EventQueue()
    tl = Timeline(n)
    waiting = [deque() for _ in range(n)]  # items that reached a stage, in arrival order
    running: list[tuple | None] = [None] * n

    def start(k: int, now: float) -> None:
        item = waiting[k].popleft()
        running[k] = (item, on_start(k, item), now)
        q.push(now + cost.stage_time(k, len(item.ids)), Kind.DONE, k, item)

    for item in entries:
        q.push(0.0, Kind.ARRIVE, 0, item)
    while len(q):
        ev = q.pop()
        k, item = ev.stage, ev.item
        if ev.kind is Kind.ARRIVE:
            waiting[k].append(item)
            if running[k] is None:
                start(k, ev.time)
            continue
        _, handle, t0 = running[k]
        running[k] = None
        tl.spans.append(Span("stage", k, item.seq.index, item.token, t0, ev.time))
        if k + 1 < n:
            hop = cost.hop_time(len(item.ids))
            tl.spans.append(Span("hop", k, item.seq.index, item.token, ev.time, ev.time + hop))
            q.push(ev.time + hop, Kind.ARRIVE, k + 1, item)
        else:
            for nxt in on_done(item, handle, ev.time):
                q.push(ev.time, Kind.ARRIVE, 0, nxt)
        if waiting[k]:
            start(k, ev.time)
    return tl


@dataclass(frozen=True)
class SeqRef:
    index: int


@dataclass(frozen=True)
class _SimItem:
    seq: SeqRef
    token: int
    ids: range


def simulate(cost: CostModel, sequences: int, tokens: int) -> Timeline:
    """The schedule alone, no model: ``sequences`` sequences each decoding ``tokens`` tokens
    (for models too large to run here: timelines, plots, throughput against sequences)."""
    one = range(1)

    def on_done(item, _handle, _now):
        return [_SimItem(item.seq, item.token + 1, one)] if item.token + 1 < tokens else []

    return schedule(cost, cost.placement.n_units, [_SimItem(SeqRef(j), 0, one) for j in range(sequences)],
                    lambda k, item: None, on_done)


def decode_rate(tl: Timeline, tokens: int) -> tuple[float, float]:
    """(per-sequence, aggregate) tokens per simulated second of a ``simulate`` timeline."""
    seqs = {s.sequence for s in tl.spans}
    total = tl.makespan
    return tokens / total, len(seqs) * tokens / total



class WaferPipeline:
    """The loaded ``model`` split as ``placement`` says, timed by ``cost`` (by default the
    placement's own cost model).  Use as a context manager, or call ``close()``."""

    def __init__(self, model: Model, placement: Placement, cost: CostModel | None = None, stop_ids=None):
        if placement.model.n_layers != model.config.n_layers:
            raise ValueError(f"the placement is for {placement.model.n_layers} layers; the model has {model.config.n_layers}")
        self.model, self.placement = model, placement
        self.cost = cost if cost is not None else cost_model(placement)
        self.stop_ids = frozenset(stop_ids or ())
        self.stages = [_Stage(model, s.index, s.first, s.stop, s.has_head) for s in placement.stages]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        for st in self.stages:
            st.close()

    def run(self, prompts: list[list[int]], max_tokens: int = 32, sampling: SamplingParams = GREEDY) -> PipelineRun:
        """Generate for every prompt at once (one sequence each, all in flight together)."""
        m = self.model
        chunk = PREFILL_CHUNK
        seqs = []
        for j, p in enumerate(prompts):
            p = [int(t) for t in p]
            if not p:
                raise ValueError("empty prompt")
            n_ctx = len(p) + max_tokens
            if n_ctx > m.n_ctx:
                raise ValueError(f"prompt {j}: {len(p)} + {max_tokens} tokens exceed the context of {m.n_ctx}")
            kv = (m.config.n_layers, n_ctx, m.config.kv_dim)
            seqs.append(_Seq(j, p, max_tokens, Sampler(sampling), np.zeros(kv, KV_DTYPE), np.zeros(kv, KV_DTYPE)))

        def entries():
            for sq in seqs:  # each prompt enters in chunks, as decode.Model.forward splits it
                p = sq.prompt
                starts = list(range(0, len(p), chunk))
                for c, c0 in enumerate(starts):
                    yield _Item(sq, c - len(starts), c0, np.asarray(p[c0:c0 + chunk], np.int64), c == len(starts) - 1)

        x_of: dict[tuple[int, int], Future] = {}  # (sequence, step) -> result of the stage it has just left

        def on_start(k: int, item: _Item) -> Future:
            key = (item.seq.index, item.token)
            stage, x_in = self.stages[k], (x_of[key] if k else None)
            fut = x_of[key] = stage.submit(lambda: stage.forward(item, x_in))
            return fut

        def on_done(item: _Item, fut: Future, now: float) -> list[_Item]:
            x_of.pop((item.seq.index, item.token))
            tok = fut.result()  # raises here if any stage of this pass failed
            return self._next_token(item.seq, tok, now) if item.last_chunk else []

        wall0 = time.perf_counter()
        try:
            tl = schedule(self.cost, len(self.stages), list(entries()), on_start, on_done)
        finally:
            wall = time.perf_counter() - wall0
        return PipelineRun([s.out for s in seqs], [s.finish for s in seqs], tl, wall,
                           [st.busy_s for st in self.stages], [s.first_token_s for s in seqs],
                           f"{self.placement.model.name} on {len(self.stages)} x {self.placement.hardware.name}")

    def _next_token(self, sq: _Seq, tok: int, now: float) -> list[_Item]:
        """The sequence's next step, as ``decode.Generator.stream`` takes it."""
        if sq.steps == 0:
            sq.first_token_s = now
        if tok in self.stop_ids:
            sq.finish = "stop"
            return []
        sq.out.append(tok)
        pos = len(sq.prompt) + len(sq.out) - 1  # where the new token goes
        end = end_reason(len(sq.out), sq.max_tokens, pos, sq.k_cache.shape[1])
        if end is not None:
            sq.finish = end
            return []
        sq.steps += 1
        return [_Item(sq, sq.steps - 1, pos, np.asarray([tok], np.int64), True)]
