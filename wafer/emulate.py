"""Latency emulation for the voice loop: the LLM stage as a catalogued deployment would run it.

``EmulatedLLM`` wraps the loop's conversation (same text, same KV cache): it counts the new
prompt tokens and the pieces of each answer and, where the target is slower than this machine,
holds each piece back until the target could have produced it (the first at its time to first
token, each next one a modelled step after the one before), so the user hears the deployment's
pace.
``project(report)`` then puts the projected turn next to the measured one: the measured
endpoint, ASR and TTS, with the LLM span replaced by the target's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from decode.generate import common_prefix
from voice.phrases import PhraseChunker

from .deploy import Deployment
from .timing import CostModel


@dataclass
class _Call:
    new_tokens: int
    pieces: list[str]
    held_s: float = 0.0  # time the pacing held pieces back


class EmulatedLLM:
    """The conversation behind ``reply``/``commit``, paced to ``cost`` when ``pace`` is set."""

    def __init__(self, inner, deployment: Deployment, cost: CostModel, pace: bool = True):
        self.inner, self.deployment, self.cost, self.pace = inner, deployment, cost, pace
        self.token_s = cost.token_time()
        self.calls: list[_Call] = []

    def __getattr__(self, name):  # warmup, prepare, commit, amend_last, reset, history, generator ...
        return getattr(self.inner, name)

    def reply(self, user_text: str):
        gen = self.inner.generator
        ids = self.inner.prompt_ids(user_text)
        call = _Call(len(ids) - min(common_prefix(gen.cached, ids), len(ids) - 1), [])
        self.calls.append(call)
        allowed = time.perf_counter() + self.cost.ttft(call.new_tokens)  # earliest the target has the next token
        stream = self.inner.reply(user_text)
        try:
            for piece in stream:
                call.pieces.append(piece)
                now = time.perf_counter()
                if self.pace and allowed > now:
                    call.held_s += allowed - now
                    time.sleep(allowed - now)
                allowed = max(now, allowed) + self.token_s
                yield piece
        finally:
            stream.close()

    def project(self, report) -> dict | None:
        """The projected figures for ``report``'s turn (None for a turn without an answer)."""
        s = report.stamps
        need = ("last_voiced", "transcript", "first_phrase", "tts_first_audio", "answer_audio")
        if not self.calls or any(k not in s for k in need):
            return None
        call = self.calls[-1]
        chunker, k = PhraseChunker(), len(call.pieces)
        for i, piece in enumerate(call.pieces):
            chunker.feed(piece)
            if chunker.drain():
                k = i + 1
                break
        ttft = self.cost.ttft(call.new_tokens)
        phrase = ttft + (max(k, 1) - 1) * self.token_s
        tts = s["tts_first_audio"] - s["first_phrase"]
        hold = s.get("endpoint", s["last_voiced"])  # the answer waits for the endpoint
        answer = max(s["transcript"] + phrase + tts, hold)
        v2v = (answer - s["last_voiced"]) * 1000
        return {
            "deployment": self.deployment.name,
            "new_prompt_tokens": call.new_tokens, "first_phrase_tokens": k,
            "llm_first_token_ms": round(ttft * 1000, 2), "first_phrase_ms": round(phrase * 1000, 2),
            "token_ms": round(self.token_s * 1000, 3), "voice_to_voice_ms": round(v2v, 1),
            "within_budget": v2v <= report.budget_ms, "overrun_ms": round(max(0.0, v2v - report.budget_ms), 1),
            "paced_ms": round(call.held_s * 1000, 1),
        }


def emulate(engines, deployment: Deployment, cost: CostModel, pace: bool = True):
    """``engines`` with the LLM stage emulating ``deployment`` (built as ``cost``)."""
    from dataclasses import replace

    return replace(engines, llm=EmulatedLLM(engines.llm, deployment, cost, pace))
