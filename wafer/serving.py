"""Serving many callers, and the smallest deployment that keeps N voice callers inside the budget.

A GPU deployment runs ``B`` sequences per step: the step reads the weights they touch (for a
mixture of experts, the union of their experts) and their B KV caches, so each caller gets a
token every step and the deployment ``B`` per step.  A wafer pipeline of ``S`` units holds ``S``
micro-batches in flight, one per unit; ``B`` sequences make micro-batches of ``ceil(B / S)``, and a
sequence's next token comes one pipeline period later: ``max(pass(b), M * slowest stage(b))``.
Every caller's KV cache (their conversation so far) stays resident: in HBM on GPUs (it must
fit), in SRAM on wafers when it fits, else spilled off the wafer and brought back over the
system's I/O when the caller's turn starts (added to their time to first token).

Callers are not all answered at once.  Each caller starts a turn every ``turn_period_s``; a turn
holds a sequence for its time to first token and its ``answer_tokens``.  The sequences in flight
are then Poisson with mean ``a = N / turn_period_s * turn time(a)`` (solved by iteration), and
the plan judges the 95th percentile of that count: the step at that load gives the per-caller
rate, the time to first token under load and the first phrase, and ``deploy.voice_to_voice_s``
(the one formula of the voice loop) turns them into a p95 voice-to-voice with this machine's
ASR, TTS and endpoint figures (``TurnFigures``) or given ones.

``plan`` searches, per hardware system, replicas of ``u`` units (each replica serving its share of
the callers) for the fewest units in all; ``smallest`` is the search, ``brute_force`` the same
answer by trying every pair (for tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .deploy import TurnFigures, voice_to_voice_s
from .placement import PlacementError, place
from .specs import CatalogueError, Hardware, ModelShape, load_hardware, precision_label
from .timing import GPUCost, WaferCost, calibrate, place_gpus


@dataclass(frozen=True)
class Workload:
    """What one caller asks of the deployment (assumptions; every field can be given)."""

    turn_period_s: float = 10.0  # a caller's turns start this often (the caller speaks ~4 s, the answer ~6 s)
    answer_tokens: int = 60  # a spoken answer of two or three sentences
    context_tokens: int = 4096  # persona, tool schemas and the conversation so far, cached per caller
    figures: TurnFigures = field(default_factory=TurnFigures)

    def to_dict(self) -> dict:
        f = self.figures
        return {"turn_period_s": self.turn_period_s, "answer_tokens": self.answer_tokens, "context_tokens": self.context_tokens,
                "new_prompt_tokens": f.new_prompt_tokens, "first_phrase_tokens": f.first_phrase_tokens,
                "endpoint_ms": f.endpoint_ms, "pause_ms": f.pause_ms, "asr_ms": f.asr_ms, "tts_first_audio_ms": f.tts_first_audio_ms,
                "budget_ms": f.budget_ms}


def poisson_quantile(mean: float, q: float = 0.95) -> int:
    """The smallest n with P(X <= n) >= q for X ~ Poisson(mean)."""
    if mean <= 0:
        return 0
    if mean > 500:  # normal approximation, continuity-corrected
        return math.ceil(mean + 1.6449 * math.sqrt(mean) - 0.5)
    p = math.exp(-mean)
    total, n = p, 0
    while total < q:
        n += 1
        p *= mean / n
        total += p
    return n


@dataclass(frozen=True)
class Load:
    """One replica serving ``callers`` callers, at the p95 count of sequences in flight."""

    hardware: str
    kind: str
    units: int
    callers: int
    mean_active: float
    active_p95: int
    step_s: float  # time between two tokens of one caller at that load
    ttft_s: float  # a turn's first token under that load
    first_phrase_s: float
    voice_to_voice_s: float
    kv_per_caller_bytes: float
    kv_spilled: bool
    fits: bool
    why: str = ""

    @property
    def per_user_tok_s(self) -> float:
        return 1 / self.step_s if self.step_s else 0.0

    @property
    def aggregate_tok_s(self) -> float:
        return self.active_p95 * self.per_user_tok_s

    def to_dict(self) -> dict:
        return {"hardware": self.hardware, "kind": self.kind, "units": self.units, "callers": self.callers,
                "mean_active": self.mean_active, "active_p95": self.active_p95, "per_user_tok_s": self.per_user_tok_s,
                "aggregate_tok_s": self.aggregate_tok_s, "ttft_ms": self.ttft_s * 1e3, "first_phrase_ms": self.first_phrase_s * 1e3,
                "voice_to_voice_p95_ms": self.voice_to_voice_s * 1e3, "kv_per_caller_bytes": self.kv_per_caller_bytes,
                "kv_spilled": self.kv_spilled, "fits": self.fits, "why": self.why}


def _v2v(fig: TurnFigures, first_phrase_s: float) -> float:
    return voice_to_voice_s(endpoint_s=fig.endpoint_ms / 1e3, transcript_s=(fig.pause_ms + fig.asr_ms) / 1e3,
                            first_phrase_s=first_phrase_s, tts_first_audio_s=fig.tts_first_audio_ms / 1e3)


class Replica:
    """``units`` units of ``hw`` holding ``model`` once; ``load(callers)`` answers for that many callers."""

    def __init__(self, model: ModelShape, hw: Hardware, units: int, bytes_per_param, work: Workload):
        self.model, self.hw, self.units, self.bpp, self.work = model, hw, units, bytes_per_param, work
        self.kv_caller = model.kv_bytes_per_sequence(work.context_tokens)
        self._steps: dict[int, tuple[float, float]] = {}
        self._fail = ""
        try:
            if hw.kind == "gpu":
                self.placement, self.tp = place_gpus(model, hw, units, context=work.context_tokens, bytes_per_param=bytes_per_param)
            elif hw.kind == "wafer":
                self.placement = place(model, hw, units, context=work.context_tokens, bytes_per_param=bytes_per_param)
                if self.placement.n_units != units:
                    raise PlacementError(f"{units} units pack as {self.placement.n_units}")
                self.cal = calibrate(hw)
            else:
                raise CatalogueError(f"{hw.name}: plans are for wafer and GPU systems")
        except PlacementError as e:
            self.placement, self._fail = None, str(e)

    def _gpu_step(self, b: int) -> tuple[float, float]:
        """(step time with b sequences, time to first token of a turn joining it)."""
        c = GPUCost(self.placement, self.tp, b, context_used=self.work.context_tokens)
        step = c.token_time()
        fig = self.work.figures
        prefill = c.prefill_time(fig.new_prompt_tokens, self.work.context_tokens)
        return step, step + max(step, prefill)  # wait for the step under way, then the one that takes the prompt

    def _wafer_step(self, b: int, spilled: bool) -> tuple[float, float]:
        p = self.placement
        cost = WaferCost(p, self.cal)
        s = p.n_units
        micro = max(1, math.ceil(b / s))
        m = min(max(b, 1), s)
        stages = [cost.stage_time(k, micro) for k in range(s)]
        period = max(sum(stages) + (s - 1) * cost.hop_time(micro), m * max(stages))
        fig = self.work.figures
        ttft = period + cost.prefill_time(fig.new_prompt_tokens, self.work.context_tokens)
        if spilled:  # the caller's KV comes back over each wafer's I/O, every wafer its own layers' share
            ttft += self.kv_caller / (s * self.hw["hop_bw"])
        return period, ttft

    def step(self, b: int, spilled: bool = False) -> tuple[float, float]:
        key = (b, spilled)
        if key not in self._steps:
            self._steps[key] = self._gpu_step(b) if self.hw.kind == "gpu" else self._wafer_step(b, spilled)
        return self._steps[key]

    def load(self, callers: int) -> Load:
        w, fig = self.work, self.work.figures
        if self.placement is None:
            return Load(self.hw.name, self.hw.kind, self.units, callers, 0, 0, 0, 0, 0, 0, self.kv_caller, False, False,
                        self._fail)
        spilled = False
        if self.hw.kind == "gpu":
            free = self.placement.capacity * self.placement.n_units - sum(s.weight_bytes for s in self.placement.stages)
            if callers * self.kv_caller > free:
                return Load(self.hw.name, "gpu", self.units, callers, 0, 0, 0, 0, 0, 0, self.kv_caller, False, False,
                            f"{callers} callers' KV ({callers * self.kv_caller / 1e9:.0f} GB) exceeds the HBM left ({free / 1e9:.0f} GB)")
        else:
            free = sum(self.placement.capacity - s.bytes for s in self.placement.stages)
            spilled = (callers - 1) * self.kv_caller > free
        rate = callers / w.turn_period_s
        a = 1.0
        for _ in range(50):  # sequences in flight: a = rate * (ttft + answer) at that load
            step, ttft = self.step(max(1, math.ceil(a)), spilled)
            nxt = min(callers, rate * (ttft + (w.answer_tokens - 1) * step))
            if abs(nxt - a) < 1e-3:
                break
            a = nxt
        b95 = max(1, min(callers, poisson_quantile(a)))
        if self.hw.kind == "wafer" and spilled:
            in_sram = sum(self.placement.capacity - s.bytes for s in self.placement.stages) // max(self.kv_caller, 1) + 1
            if b95 > in_sram:
                return Load(self.hw.name, "wafer", self.units, callers, a, b95, 0, 0, 0, 0, self.kv_caller, True, False,
                            f"{b95} sequences in flight need their KV in SRAM; {int(in_sram)} fit")
        step, ttft = self.step(b95, spilled)
        phrase = ttft + (fig.first_phrase_tokens - 1) * step
        v2v = _v2v(fig, phrase)
        ok = v2v * 1e3 <= fig.budget_ms
        return Load(self.hw.name, self.hw.kind, self.units, callers, a, b95, step, ttft, phrase, v2v, self.kv_caller, spilled, ok,
                    "" if ok else f"p95 voice-to-voice {v2v * 1e3:.0f} ms over {fig.budget_ms:.0f} ms")


# -- the search -----------------------------------------------------------------------------------

def smallest(candidates, callers: int, fits) -> tuple[int, int] | None:
    """The (units per replica, replicas) with the fewest units in all (then the fewest replicas)
    such that ``fits(u, ceil(callers / replicas))``; for each ``u`` the replica count is found by
    bisection (more replicas never hurt: each serves fewer callers)."""
    best = None
    for u in candidates:
        if best is not None and u > best[0] * best[1]:
            break  # candidates ascend: a replica this big already costs more than the best
        if not fits(u, callers if callers else 1):
            lo, hi = 1, max(callers, 1)
            if not fits(u, 1):
                continue
            while hi - lo > 1:  # fits(u, ceil(callers / hi)) holds, fits(u, ceil(callers / lo)) does not
                mid = (lo + hi) // 2
                if fits(u, math.ceil(callers / mid)):
                    hi = mid
                else:
                    lo = mid
            r = hi
        else:
            r = 1
        key = (u * r, r)
        if best is None or key < (best[0] * best[1], best[1]):
            best = (u, r)
    return best


def brute_force(candidates, callers: int, fits) -> tuple[int, int] | None:
    """``smallest`` by trying every (units, replicas) pair."""
    found = [(u * r, r, u) for u in candidates for r in range(1, max(callers, 1) + 1) if fits(u, math.ceil(callers / r))]
    if not found:
        return None
    _, r, u = min(found)
    return u, r


@dataclass(frozen=True)
class Plan:
    hardware: str
    title: str
    kind: str
    precision: str
    units_per_replica: int
    replicas: int
    load: Load  # one replica's
    price_per_unit_hour: float
    price_source: str
    price_assumed: bool

    @property
    def units(self) -> int:
        return self.units_per_replica * self.replicas

    @property
    def cost_per_hour(self) -> float:
        return self.units * self.price_per_unit_hour

    def to_dict(self) -> dict:
        return {"hardware": self.hardware, "kind": self.kind, "precision": self.precision, "units": self.units,
                "units_per_replica": self.units_per_replica, "replicas": self.replicas,
                "cost_per_hour": self.cost_per_hour, "price_per_unit_hour": self.price_per_unit_hour,
                "price_source": self.price_source, "price_assumed": self.price_assumed, "replica": self.load.to_dict()}


def unit_candidates(model: ModelShape, hw: Hardware, bytes_per_param, context: int, limit: int = 64) -> list[int]:
    """Replica sizes to try, ascending: GPUs as 1, 2, 4, 8 then whole nodes; wafers from the fewest
    that hold the weights (and one caller's KV) up to twice that and a few more."""
    if hw.kind == "gpu":
        node = int(hw["node_gpus"])
        return [g for g in sorted({1, 2, 4, 8, node, *(node * k for k in range(2, 9))})
                if g <= max(node, 8) * 8 and (g <= node or g % node == 0)]
    u0 = place(model, hw, None, context=context, bytes_per_param=bytes_per_param).n_units
    return list(range(u0, min(limit, 2 * u0 + 8) + 1))


def plan_one(model: ModelShape, hw: Hardware, callers: int, work: Workload = Workload(), bytes_per_param=2.0,
             search=smallest) -> Plan | None:
    try:
        cands = unit_candidates(model, hw, bytes_per_param, work.context_tokens)
    except PlacementError:
        return None
    replicas: dict[int, Replica] = {}

    def rep(u: int) -> Replica:
        if u not in replicas:
            replicas[u] = Replica(model, hw, u, bytes_per_param, work)
        return replicas[u]

    def fits(u: int, n: int) -> bool:
        return rep(u).load(n).fits

    found = search(cands, callers, fits)
    if found is None:
        return None
    u, r = found
    price = hw.params.get("price_per_hour")
    return Plan(hw.name, hw.title, hw.kind, precision_label(bytes_per_param), u, r, rep(u).load(math.ceil(callers / r)),
                price.value if price else 0.0, price.source if price else "no price in the catalogue",
                bool(price.assumption) if price else True)


DEFAULT_PLAN_HARDWARE = ("wse3", "h100", "h200", "b200")


def plan(model: ModelShape, callers: int, hardware=DEFAULT_PLAN_HARDWARE, work: Workload = Workload(),
         bytes_per_param=2.0, overrides: dict | None = None) -> list[tuple[Hardware, Plan | None]]:
    """For each system, the smallest deployment keeping ``callers`` callers' p95 voice-to-voice in budget."""
    if callers < 1:
        raise ValueError("--callers must be at least 1")
    out = []
    for name in hardware:
        hw = load_hardware(name)
        if overrides:
            hw = hw.with_overrides({k: v for k, v in overrides.items() if k in hw.params})
        out.append((hw, plan_one(model, hw, callers, work, bytes_per_param)))
    return out


def callers_curve(model: ModelShape, hw: Hardware, counts, work: Workload = Workload(),
                  bytes_per_param=2.0) -> list[tuple[int, int | None]]:
    """(callers, units of the smallest deployment) for each count: the plot's line for ``hw``."""
    pts = []
    for n in counts:
        p = plan_one(model, hw, n, work, bytes_per_param)
        pts.append((n, p.units if p else None))
    return pts
