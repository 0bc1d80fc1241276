"""Speculative decoding as a model: a draft proposes ``k`` tokens, the target verifies them in one
pass over ``k + 1`` tokens, and each cycle yields ``tau(k)`` tokens.

    tok/s = tau(k) / (k * t_draft + t_verify(k + 1)),   tau(k) = (1 - a^(k+1)) / (1 - a)

``a``, the chance a drafted token is kept (until the first miss), comes from a published
acceptance length ``tau`` at some ``k`` for the pair (``wafer/data/speculation.toml``, cited), or is
given.  The draft runs on the same hardware: a draft model on its own units (as few as hold it,
timed by the same cost model), or an EAGLE-style head (one decoder layer at the target's width
plus the target's output head) on the target's last unit.  The verification pass is the target's
own ``pass_time(k + 1)``: on a GPU about one decode step (the weights are read once for all
``k + 1`` tokens; a mixture of experts reads the union of their experts), on a wafer a step plus
the extra tokens' compute.  The draft runs at the target's serving batch.  Tree drafts (several
candidates per position) are not modelled: ``k`` is the chain's depth.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass

from .specs import CatalogueError, ModelShape, data_file, load_model
from .timing import CostModel, WaferCost, expected_tokens

METHODS = ("eagle", "draft")


@dataclass(frozen=True, slots=True)
class Acceptance:
    method: str
    target: str
    k: int  # drafted tokens per cycle in the published measurement
    tau: float  # published mean tokens per cycle at that k
    source: str

    @property
    def accept(self) -> float:
        """Per-token acceptance solving ``expected_tokens(k, a) = tau`` (bisection; tau is increasing in a)."""
        return accept_for(self.k, self.tau)

    def tokens(self, k: int | None = None) -> float:
        return expected_tokens(self.k if k is None else k, self.accept)


def accept_for(k: int, tau: float) -> float:
    if not 1 <= tau <= k + 1:
        raise ValueError(f"an acceptance length of {tau} is impossible with k = {k} (it lies in [1, k + 1])")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(k, mid) < tau else (lo, mid)
    return (lo + hi) / 2


@functools.cache
def _pairs() -> tuple[Acceptance, ...]:
    d = tomllib.loads(data_file("speculation.toml").read_text())
    return tuple(Acceptance(str(p["method"]), str(p["target"]), int(p["k"]), float(p["tau"]), str(p["source"]))
                 for p in d["pair"])


def acceptance(method: str, target: str) -> Acceptance:
    """The published figure for (method, target), else the method's default."""
    if method not in METHODS:
        raise CatalogueError(f"unknown speculation method '{method}' (known: {', '.join(METHODS)})")
    pairs = [p for p in _pairs() if p.method == method]
    for p in pairs:
        if p.target == target:
            return p
    return next(p for p in pairs if p.target == "*")


def eagle_head(target: ModelShape) -> ModelShape:
    """An EAGLE-style draft: one dense decoder layer at the target's width (its MLP as wide as the
    target's dense MLP, or its active experts' together) and the target's output head."""
    d_ff = target.d_ff if not target.is_moe or target.n_dense_layers or target.moe_every > 1 else \
        target.expert_d_ff * (target.experts_per_token + target.n_shared_experts)
    return ModelShape(name=f"{target.name}-eagle-head", title=f"EAGLE-style head for {target.title}", n_layers=1,
                      d_model=target.d_model, n_heads=target.n_heads, n_kv_heads=target.n_kv_heads,
                      head_dim=target.head_dim, d_ff=d_ff, vocab=target.vocab, tied_embeddings=False,
                      source="one decoder layer plus the output head (EAGLE, arXiv 2401.15077)")


@dataclass(frozen=True, slots=True)
class Speculation:
    method: str
    draft: str
    k: int
    accept: float
    tokens_per_cycle: float
    draft_s: float  # one drafted token
    verify_s: float  # the target's pass over k + 1 tokens
    target_tok_s: float  # without speculation
    source: str

    @property
    def cycle_s(self) -> float:
        return self.k * self.draft_s + self.verify_s

    @property
    def tok_s(self) -> float:
        return self.tokens_per_cycle / self.cycle_s

    @property
    def speedup(self) -> float:
        return self.tok_s / self.target_tok_s

    def to_dict(self) -> dict:
        return {"method": self.method, "draft": self.draft, "k": self.k, "accept": self.accept,
                "tokens_per_cycle": self.tokens_per_cycle, "draft_ms": self.draft_s * 1e3, "verify_ms": self.verify_s * 1e3,
                "tok_s": self.tok_s, "speedup": self.speedup, "source": self.source}


def _draft_cost(dep, target_cost: CostModel, method: str, draft: str | None) -> tuple[str, CostModel]:
    """The draft's cost model on ``dep``'s hardware, at its precision (16-bit where the target's sizes come
    from its model file) and its serving batch (a GPU step drafts for every sequence of the batch)."""
    from .deploy import Deployment

    hw = dep.hardware
    bpp = dep.bytes_per_param if dep.bytes_per_param is not None else 2.0
    if method == "eagle":
        shape = eagle_head(dep.model)
        d = Deployment(shape, hw, 1 if hw.kind != "gpu" else getattr(target_cost, "tp", 1), bpp, dep.context, batch=dep.batch)
        p, c = d.build()
        if isinstance(c, WaferCost) and isinstance(target_cost, WaferCost):
            c = WaferCost(p, target_cost.cal)
        return "EAGLE-style head", c
    if not draft:
        raise CatalogueError("a draft-model speculation needs the draft model's name (e.g. llama-3.1-8b)")
    d = Deployment(load_model(draft), hw, None, bpp, dep.context, batch=dep.batch)
    return draft, d.build()[1]


def speculate(dep, method: str = "eagle", draft: str | None = None, k: int | None = None,
              accept: float | None = None) -> Speculation:
    """Per-user decode rate of ``dep`` (a ``Deployment``) with speculation: ``method`` eagle (a head
    on the target's units) or draft (``draft`` on its own units); ``k`` and ``accept`` default to
    the published pair's (the acceptance at another ``k`` follows from the same per-token rate)."""
    _, target = dep.build()
    a = acceptance(method, dep.model.name)
    k = a.k if k is None else k
    if k < 1:
        raise ValueError("k must be at least 1")
    acc = a.accept if accept is None else accept
    if not 0 <= acc < 1:
        raise ValueError("acceptance rate must be in [0, 1)")
    name, dcost = _draft_cost(dep, target, method, draft)
    source = a.source if accept is None else "acceptance given"
    return Speculation(method, name, k, acc, expected_tokens(k, acc), dcost.token_time(), target.pass_time(k + 1),
                       1 / target.token_time(), source)
