"""The staged model: a built ``decode.Model`` deployed onto simulated units, with the same interface.

``stage(model, deployment)`` returns a ``StagedModel``, the way gpt-fast's ``apply_tp(model)``
turns a model into a tensor-parallel one and leaves ``generate.py`` alone: ``decode.Generator``
and the voice loop call ``new_state``, ``forward`` and ``head`` as on the plain model and never
know.  Inside, a forward pass runs the placement's layer ranges as stages, in order, on the
calling thread (the one compute thread: no extra threads), through the same event-driven
``schedule`` that ``WaferPipeline`` and ``simulate()`` use.  Each stage advances the sequence's
simulated clock by the deployment's cost model (its layers, the hop to the next unit, the head
on the last unit); a prompt chunk is timed as the chunk it is, a decode step as one token.  The
numbers the kernels compute are those of the plain model, so the tokens are identical.

When the deployment's model is another one than the model that runs here (``llama-3.1-70b`` on 4
CS-3, say), the local layers are spread over the deployment's stages in proportion, and the
clock follows the deployment's own layers: the answer is this model's, its timing the target's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from decode import cpu
from decode.batching import forward_each
from decode.model import Model, RunState

from .clock import Timeline
from .deploy import Deployment
from .pipeline import SeqRef, schedule
from .placement import Placement
from .timing import CostModel


@dataclass(slots=True)
class SimClock:
    """The simulated time one sequence has spent on the deployment, and what it was spent on."""

    deployment: str
    now_s: float = 0.0
    passes: int = 0  # forward calls
    tokens: int = 0  # tokens pushed through the layers
    last: Timeline | None = field(default=None, repr=False)  # the last forward's stages and hops


class StagedState(RunState):
    """A ``RunState`` with the sequence's simulated clock."""

    def __init__(self, cfg, n_ctx: int, deployment: str):
        super().__init__(cfg, n_ctx)
        self.sim = SimClock(deployment)


@dataclass(frozen=True, slots=True)
class _Pass:
    """One chunk of a forward call on its way through the stages (what ``schedule`` moves)."""

    seq: SeqRef
    token: int  # the chunk's index in its call
    ids: np.ndarray  # the chunk's token ids
    pos0: int
    x: np.ndarray  # its hidden states: each chunk in flight has its own
    last: bool  # the chunk whose last hidden state gives the logits


_SEQ0 = SeqRef(0)  # a staged forward pass moves one sequence through the schedule


def local_ranges(placement: Placement, n_layers: int) -> tuple[range, ...]:
    """The layers of a ``n_layers``-layer model that each of the placement's stages runs: the
    placement's own ranges when the model is the placed one, else spread in proportion."""
    total = placement.model.n_layers
    return tuple(range(round(s.first * n_layers / total), round(s.stop * n_layers / total)) for s in placement.stages)


class StagedModel:
    """``model`` run as ``placement``'s stages, timed by ``cost``; ``decode.Model``'s interface."""

    def __init__(self, model: Model, placement: Placement, cost: CostModel, name: str):
        self.inner = model
        self.placement, self.cost, self.deployment = placement, cost, name
        # what Generator and the tokenizer read from a model
        self.file, self.config, self.weights, self.n_ctx = model.file, model.config, model.weights, model.n_ctx
        self.ranges = local_ranges(placement, model.config.n_layers)
        self._n = placement.n_units
        self._step: Timeline | None = None

    def new_state(self) -> StagedState:
        """Scratch buffers, an empty KV cache and a simulated clock at 0 for one sequence."""
        return StagedState(self.config, self.n_ctx, self.deployment)

    def token_s(self) -> float:
        """The deployment's time for one decode step of one sequence."""
        return self.cost.token_time()

    # -- the plain model's parts, unchanged ------------------------------------------------------

    def embed(self, tokens: np.ndarray, x: np.ndarray) -> None:
        self.inner.embed(tokens, x)

    def layer(self, s: RunState, i: int, x: np.ndarray, pos0: int) -> None:
        self.inner.layer(s, i, x, pos0)

    def layers(self, s: RunState, lo: int, hi: int, x: np.ndarray, pos0: int) -> None:
        self.inner.layers(s, lo, hi, x, pos0)

    def head(self, s: RunState, x_last: np.ndarray) -> np.ndarray:
        return self.inner.head(s, x_last)

    # -- a forward pass through the stages ---------------------------------------------------------

    def forward(self, s: StagedState, tokens, pos0: int) -> np.ndarray:
        """``decode.Model.forward``: the same logits, with ``s.sim`` advanced by the deployment's time."""
        tokens = self.inner.check_tokens(tokens, pos0)
        cpu.fit()  # the calling thread's team: the cores other programs leave free (as Model.forward sizes it)
        m, n = self.inner, tokens.shape[0]
        if n == 1:  # a decode step: the stages' ranges in one go, timed as every single-token pass
            x = s.x[:1]
            m.embed(tokens, x)
            m.layers(s, self.ranges[0].start, self.ranges[-1].stop, x, pos0)
            logits = m.head(s, x)
            self._advance(s, self._step_timeline(), 1)
            return logits
        starts = range(0, n, s.chunk)
        passes = [_Pass(_SEQ0, c, tokens[c0:c0 + s.chunk], pos0 + c0,
                        s.x[:min(n, s.chunk)] if len(starts) == 1 else np.zeros((min(s.chunk, n - c0), m.config.d_model), np.float32),
                        c == len(starts) - 1)
                  for c, c0 in enumerate(starts)]
        out: list[np.ndarray] = []

        def on_start(k: int, p: _Pass) -> None:
            if k == 0:
                m.embed(p.ids, p.x)
            r = self.ranges[k]
            m.layers(s, r.start, r.stop, p.x, p.pos0)
            if k == self._n - 1 and p.last:
                out.append(m.head(s, p.x[-1:]))

        tl = schedule(self.cost, self._n, passes, on_start, lambda p, handle, now: [])
        self._advance(s, tl, n)
        return out[0]

    def forward_batch(self, states: list[StagedState], tokens, positions) -> list[np.ndarray]:
        """Single-token steps of several sequences in one pass over the weights here (the decode
        core's ``forward_batch``, or one after another if it has none); each sequence's clock
        advances by its own one-token step on the deployment, which serves each user's step in its
        pipeline as the schedule says, whatever this machine batches."""
        tokens = np.asarray(tokens, dtype=np.int64)
        for i, p in enumerate(positions):
            self.inner.check_tokens(tokens[i:i + 1], int(p))
        batched = getattr(self.inner, "forward_batch", None)
        out = batched(states, tokens, positions) if batched else forward_each(self.inner, states, tokens, positions)
        tl = self._step_timeline()
        for s in states:
            self._advance(s, tl, 1)
        return out

    def _step_timeline(self) -> Timeline:
        """The schedule of one decode step (what every single-token pass costs), worked out once."""
        if self._step is None:
            one = _Pass(_SEQ0, 0, np.zeros(1, np.int64), 0, np.zeros((1, 1), np.float32), True)
            self._step = schedule(self.cost, self._n, [one], lambda k, p: None, lambda p, handle, now: [])
        return self._step

    @staticmethod
    def _advance(s: StagedState, tl: Timeline, tokens: int) -> None:
        s.sim.now_s += tl.makespan
        s.sim.passes += 1
        s.sim.tokens += tokens
        s.sim.last = tl


def stage(model: Model, deployment: Deployment) -> StagedModel:
    """``model`` deployed as ``deployment`` says (raises ``PlacementError`` when it cannot fit)."""
    placement, cost = deployment.build()
    return StagedModel(model, placement, cost, deployment.label(placement, cost))
