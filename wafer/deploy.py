"""Deployments (``MODEL@HARDWARExN``) and what a voice turn costs on one.

``Deployment.parse("llama-3.1-70b@cs3x4")`` names a model, a system and a unit count (wafers or
GPUs; omitted = as few as fit), optionally the weight precision (``...@h200x16:8bit``; default
16).  ``project_turn`` puts the modelled LLM figures next to this machine's measured ASR and TTS
figures and gives voice-to-voice and the verdict against the budget, following the loop's
speculative policy: transcription and the answer start at the pause, and the answer's audio
waits for the endpoint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .placement import Placement, place
from .specs import CatalogueError, Hardware, ModelShape, load_hardware, load_model
from .timing import CostModel, GPUCost, cost_model, place_gpus, speculative_tok_s

#: KV tokens a decode step reads on a GPU: a voice conversation's typical length so far (the
#: placement still reserves ``context`` tokens of KV per sequence).
CONTEXT_IN_USE = 1024

_SPEC = re.compile(r"^\s*([A-Za-z0-9._-]+)\s*@\s*([A-Za-z0-9._-]+?)(?:\s*[x×]\s*(\d+|auto))?(?:\s*:\s*(4|8|16)-?bits?)?\s*$")


@dataclass(frozen=True)
class Deployment:
    model: ModelShape
    hardware: Hardware
    units: int | None = None  # None: as few as fit
    bytes_per_param: float | None = 2.0
    context: int = 8192
    sequences: int = 1
    batch: int = 1  # GPU serving batch (standard serving runs many sequences per step)

    @classmethod
    def parse(cls, text: str, **kw) -> Deployment:
        m = _SPEC.match(text)
        if not m:
            raise CatalogueError(f"'{text}' is not MODEL@HARDWARE[xN][:BITSbit] (e.g. llama-3.1-70b@cs3x4, "
                                 "llama-3.1-8b@h200x1, frontier-moe@h200x16:8bit)")
        model = load_model(m.group(1))
        hw = load_hardware(m.group(2))
        units = None if m.group(3) in (None, "auto") else int(m.group(3))
        if units is not None and units < 1:
            raise CatalogueError(f"'{text}': the unit count must be at least 1")
        if m.group(4):
            kw["bytes_per_param"] = int(m.group(4)) / 8
        elif model.file_bytes is not None and "bytes_per_param" not in kw:
            kw["bytes_per_param"] = None  # the model file's own sizes
        return cls(model, hw, units, **kw)

    @property
    def name(self) -> str:
        n = "auto" if self.units is None else self.units
        return f"{self.model.name}@{self.hardware.name}x{n}"

    def build(self) -> tuple[Placement, CostModel]:
        """Placement and cost model (raises ``PlacementError`` when it cannot fit)."""
        if self.hardware.kind == "gpu":
            p, tp = place_gpus(self.model, self.hardware, self.units, context=self.context, sequences=max(self.sequences, self.batch),
                               bytes_per_param=self.bytes_per_param or 2.0)
            return p, GPUCost(p, tp, self.batch, context_used=min(self.context, CONTEXT_IN_USE))
        p = place(self.model, self.hardware, self.units, context=self.context, sequences=self.sequences,
                  bytes_per_param=self.bytes_per_param)
        return p, cost_model(p)


@dataclass(frozen=True)
class TurnFigures:
    """This machine's measured voice-loop figures (BENCHMARKS.md, ``bench/turn.py``, 2026-12-02 medians)."""

    endpoint_ms: float = 400.0  # the endpointer's end-of-turn silence (LoopConfig stop)
    pause_ms: float = 120.0  # where the speculative transcription and answer start
    asr_ms: float = 75.0  # Whisper tiny.en on an 8 s window
    tts_first_audio_ms: float = 62.0  # piper's first chunk of a short first phrase
    new_prompt_tokens: int = 30  # the user's turn added to a cached conversation prefix
    first_phrase_tokens: int = 8  # a short first phrase ("Sure, we open at nine.")
    budget_ms: float = 500.0


@dataclass(frozen=True)
class TurnProjection:
    deployment: str
    llm_first_token_ms: float
    first_phrase_ms: float
    voice_to_voice_ms: float
    sequential_ms: float  # the same turn if nothing started before the endpoint
    budget_ms: float
    token_ms: float
    figures: TurnFigures = field(repr=False)

    @property
    def within_budget(self) -> bool:
        return self.voice_to_voice_ms <= self.budget_ms

    @property
    def verdict(self) -> str:
        over = self.voice_to_voice_ms - self.budget_ms
        return "within budget" if over <= 0 else f"over by {over:.0f} ms"

    def to_dict(self) -> dict:
        return {"deployment": self.deployment, "llm_first_token_ms": self.llm_first_token_ms,
                "first_phrase_ms": self.first_phrase_ms, "voice_to_voice_ms": self.voice_to_voice_ms,
                "voice_to_voice_without_speculation_ms": self.sequential_ms, "budget_ms": self.budget_ms,
                "within_budget": self.within_budget, "token_ms": self.token_ms}


def project_turn(cost: CostModel, name: str, fig: TurnFigures = TurnFigures(), tok_s: float | None = None) -> TurnProjection:
    """Voice-to-voice for a typical turn when the LLM runs as ``cost`` models it (``tok_s`` overrides
    the decode rate, e.g. with speculative decoding)."""
    token = 1 / tok_s if tok_s else cost.token_time()
    first = cost.ttft(fig.new_prompt_tokens)
    phrase = first + (fig.first_phrase_tokens - 1) * token
    ready = fig.pause_ms + fig.asr_ms + phrase * 1e3  # the answer's first phrase, from the last voiced sample
    v2v = max(fig.endpoint_ms, ready) + fig.tts_first_audio_ms
    sequential = fig.endpoint_ms + fig.asr_ms + phrase * 1e3 + fig.tts_first_audio_ms
    return TurnProjection(name, first * 1e3, phrase * 1e3, v2v, sequential, fig.budget_ms, token * 1e3, fig)


def speculative(dep: Deployment, draft: str, k: int, accept: float) -> float:
    """Per-user tokens/s of ``dep`` with a draft model on its own units of the same hardware."""
    _, target = dep.build()
    d = Deployment(load_model(draft), dep.hardware, None, dep.bytes_per_param, dep.context)
    _, dcost = d.build()
    return speculative_tok_s(target, dcost, k, accept)
