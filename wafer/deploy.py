"""Deployments (``MODEL@HARDWARExN``) and what a voice turn costs on one.

``Deployment.parse("llama-3.1-70b@cs3x4")`` names a model, a system and a unit count (wafers or
GPUs; omitted = as few as fit), optionally the weight precision (``...@h200x16:8bit``, or
``:native`` for the checkpoint's own format such as gpt-oss's MXFP4 experts; default 16) and,
for GPUs, the serving batch (``...,batch=64``; default 1, or ``STANDARD_BATCH`` when read as
a serving deployment: the way GPU clusters serve many users per step).

``voice_to_voice_s`` is the one formula for what a turn's listener waits, following the loop's
policy: transcription, the answer and its first audio are computed from the moment the
transcript is known (at the pause, speculatively), and the audio waits for the endpoint.  It
serves both ``simulated_turn`` (a real turn's measured stamps with the LLM's span taken from the
deployment's simulated clock: the ``simulated`` block of every turn report) and
``project_turn`` (a typical turn from this machine's median figures: ``wafervox sim``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .placement import Placement, place
from .specs import CatalogueError, Hardware, ModelShape, Precision, load_hardware, load_model, shape_from_gguf
from .timing import CostModel, GPUCost, cost_model, place_gpus

#: KV tokens a decode step reads on a GPU: a voice conversation's typical length so far (the
#: placement still reserves ``context`` tokens of KV per sequence).
CONTEXT_IN_USE = 1024

#: Sequences a GPU deployment serves per step unless told otherwise (``,batch=N``): standard serving
#: shares each step among many users, which is what sets its per-user rate (~45 tok/s for the
#: frontier-class MoE on 8 or 16 H200 at 8-bit).
STANDARD_BATCH = 64
#: The deployment a voice turn runs on when none is named: this machine's model on CS-3 wafers.
DEFAULT_HARDWARE = "wse3"

_SPEC = re.compile(r"^\s*([A-Za-z0-9._-]+)\s*@\s*([A-Za-z0-9._-]+?)(?:\s*[x×]\s*(\d+|auto))?"
                   r"(?:\s*:\s*(4|8|16|native)(?:-?bits?)?)?(?:\s*,\s*batch\s*=\s*(\d+))?\s*$")


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
    def parse(cls, text: str, serving: bool = False, **kw) -> Deployment:
        """``text`` as a deployment; ``serving``: a GPU system serves ``STANDARD_BATCH`` users per step unless the text
        says ``,batch=N`` (the voice commands' reading: a GPU cluster as it is run for many users), else one."""
        m = _SPEC.match(text)
        if not m:
            raise CatalogueError(f"'{text}' is not MODEL@HARDWARE[xN][:BITSbit][,batch=N] (e.g. llama-3.1-70b@cs3x4, "
                                 "llama-3.1-8b@h200x1, frontier-moe@h200x16:8bit, frontier-moe@h200x8:8bit,batch=1)")
        model = load_model(m.group(1))
        hw = load_hardware(m.group(2))
        units = None if m.group(3) in (None, "auto") else int(m.group(3))
        if units is not None and units < 1:
            raise CatalogueError(f"'{text}': the unit count must be at least 1")
        if m.group(4) == "native":
            if model.native is None:
                raise CatalogueError(f"'{text}': {model.name} has no native format in the catalogue (give :16bit, :8bit or :4bit)")
            kw["bytes_per_param"] = model.native
        elif m.group(4):
            kw["bytes_per_param"] = int(m.group(4)) / 8
        elif model.file_bytes is not None and "bytes_per_param" not in kw:
            kw["bytes_per_param"] = None  # the model file's own sizes
        if m.group(5):
            if hw.kind != "gpu":
                raise CatalogueError(f"'{text}': a serving batch applies to GPU systems only ({hw.name} is a {hw.kind})")
            kw["batch"] = int(m.group(5))
            if kw["batch"] < 1:
                raise CatalogueError(f"'{text}': the batch must be at least 1")
        elif hw.kind == "gpu" and serving:
            kw.setdefault("batch", STANDARD_BATCH)
        return cls(model, hw, units, **kw)

    @classmethod
    def default(cls, gguf=None) -> Deployment:
        """The model in ``gguf`` (default: the bundled SmolLM2) on as many CS-3 wafers as it needs."""
        return cls(shape_from_gguf(gguf), load_hardware(DEFAULT_HARDWARE), None, None)

    @property
    def name(self) -> str:
        n = "auto" if self.units is None else self.units
        return f"{self.model.name}@{self.hardware.name}x{n}"

    def label(self, placement: Placement, cost: CostModel) -> str:
        """The name with the unit count it was built with (``smollm2-135m@wse3x1``, ``...:8bit,batch=64``)."""
        units = placement.n_units * getattr(cost, "tp", 1)
        if isinstance(self.bytes_per_param, Precision):
            bits = ":native"
        else:
            bits = "" if self.bytes_per_param in (None, 2.0) else f":{self.bytes_per_param * 8:g}bit"
        batch = f",batch={self.batch}" if self.hardware.kind == "gpu" else ""
        return f"{self.model.name}@{self.hardware.name}x{units}{bits}{batch}"

    def build(self) -> tuple[Placement, CostModel]:
        """Placement and cost model (raises ``PlacementError`` when it cannot fit)."""
        if self.hardware.kind == "gpu":
            p, tp = place_gpus(self.model, self.hardware, self.units, context=self.context, sequences=max(self.sequences, self.batch),
                               bytes_per_param=2.0 if self.bytes_per_param is None else self.bytes_per_param)
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
    ready_ms: float  # the answer's first audio ready (before it waits for the endpoint)
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
                "voice_to_voice_without_speculation_ms": self.sequential_ms, "answer_ready_ms": self.ready_ms, "budget_ms": self.budget_ms,
                "within_budget": self.within_budget, "token_ms": self.token_ms}


def voice_to_voice_s(*, endpoint_s: float, transcript_s: float, first_phrase_s: float, tts_first_audio_s: float) -> float:
    """Seconds from the user's last voiced sample to the answer's first audio: the first phrase is
    ready ``first_phrase_s`` after the transcript, its audio ``tts_first_audio_s`` later, and it
    plays no earlier than the endpoint (all times from the last voiced sample)."""
    return max(endpoint_s, transcript_s + first_phrase_s + tts_first_audio_s)


def project_turn(cost: CostModel, name: str, fig: TurnFigures = TurnFigures(), tok_s: float | None = None) -> TurnProjection:
    """Voice-to-voice for a typical turn when the LLM runs as ``cost`` models it (``tok_s`` overrides
    the decode rate, e.g. with speculative decoding)."""
    token = 1 / tok_s if tok_s else cost.token_time()
    first = cost.ttft(fig.new_prompt_tokens)
    phrase = first + (fig.first_phrase_tokens - 1) * token
    v2v = voice_to_voice_s(endpoint_s=fig.endpoint_ms / 1e3, transcript_s=(fig.pause_ms + fig.asr_ms) / 1e3,
                           first_phrase_s=phrase, tts_first_audio_s=fig.tts_first_audio_ms / 1e3)
    sequential = voice_to_voice_s(endpoint_s=fig.endpoint_ms / 1e3, transcript_s=(fig.endpoint_ms + fig.asr_ms) / 1e3,
                                  first_phrase_s=phrase, tts_first_audio_s=fig.tts_first_audio_ms / 1e3)
    ready = voice_to_voice_s(endpoint_s=0.0, transcript_s=(fig.pause_ms + fig.asr_ms) / 1e3, first_phrase_s=phrase,
                             tts_first_audio_s=fig.tts_first_audio_ms / 1e3)
    return TurnProjection(name, first * 1e3, phrase * 1e3, v2v * 1e3, sequential * 1e3, ready * 1e3, fig.budget_ms, token * 1e3, fig)


def simulated_turn(deployment: str, token_s: float, stamps: dict, llm: dict, budget_ms: float) -> dict | None:
    """A turn's ``simulated`` block: its measured stamps (seconds on the loop's clock: ``last_voiced``,
    ``endpoint``, ``transcript``, ``first_phrase``, ``tts_first_audio``) with the LLM's span taken from the
    deployment's clock (``llm``: simulated seconds from the reply's start to ``first_token`` and to
    ``first_phrase``).  None when the turn has no spoken answer to time."""
    need = ("last_voiced", "transcript", "first_phrase", "tts_first_audio")
    if any(k not in stamps for k in need) or "first_phrase" not in llm:
        return None
    lv = stamps["last_voiced"]
    v2v = voice_to_voice_s(endpoint_s=stamps.get("endpoint", lv) - lv, transcript_s=stamps["transcript"] - lv,
                           first_phrase_s=llm["first_phrase"], tts_first_audio_s=stamps["tts_first_audio"] - stamps["first_phrase"])
    v2v_ms = v2v * 1e3
    return {
        "deployment": deployment,
        "llm_first_token_ms": round(llm.get("first_token", llm["first_phrase"]) * 1e3, 3),
        "first_phrase_ms": round(llm["first_phrase"] * 1e3, 3),
        "token_ms": round(token_s * 1e3, 4),
        "voice_to_voice_ms": round(v2v_ms, 1),
        "within_budget": v2v_ms <= budget_ms,
        "overrun_ms": round(max(0.0, v2v_ms - budget_ms), 1),
    }


def speculative(dep: Deployment, draft: str, k: int | None = None, accept: float | None = None) -> float:
    """Per-user tokens/s of ``dep`` with speculative decoding: ``draft`` names a draft model on its
    own units of the same hardware, or ``eagle`` for an EAGLE-style head; ``k`` and ``accept``
    default to the published pair's (``wafer.speculation``)."""
    from .speculation import speculate

    if draft == "eagle":
        return speculate(dep, "eagle", None, k, accept).tok_s
    return speculate(dep, "draft", draft, k, accept).tok_s
