"""Choosing the next token from logits: greedy, temperature, top-k, top-p, repetition penalty.

The order follows llama.cpp's default chain: repetition penalty on the raw logits,
then top-k, top-p, temperature, and a draw from the remaining distribution with a
seedable generator.  ``temperature == 0`` (or ``greedy``) takes the argmax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.95
    repetition_penalty: float = 1.1
    repeat_last_n: int = 64
    seed: int | None = None

    def __post_init__(self):
        for name in ("temperature", "top_p", "repetition_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0 = off)")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be > 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = SamplingParams(temperature=0.0, repetition_penalty=1.0)


class Sampler:
    """Stateful sampler: owns the random generator so that a seed gives one sequence."""

    def __init__(self, params: SamplingParams = GREEDY):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray, history=()) -> int:
        p = self.params
        if p.repetition_penalty != 1.0 and len(history):
            logits = apply_repetition_penalty(logits, history[-p.repeat_last_n:], p.repetition_penalty)
        if p.greedy:
            return int(np.argmax(logits))
        ids, vals = top_k_candidates(logits, p.top_k)
        probs = softmax(vals / p.temperature)
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
            ids, probs = ids[:keep], probs[:keep] / probs[:keep].sum()
        return int(ids[self.rng.choice(len(ids), p=probs)])


def apply_repetition_penalty(logits: np.ndarray, recent, penalty: float) -> np.ndarray:
    """llama.cpp/CTRL penalty on tokens seen recently: positive logits divided, negative multiplied."""
    out = logits.copy()
    seen = np.unique(np.asarray(recent, dtype=np.int64))
    v = out[seen]
    out[seen] = np.where(v > 0, v / penalty, v * penalty)
    return out


def top_k_candidates(logits: np.ndarray, k: int):
    """The ``k`` largest logits (all when ``k`` is 0), sorted high to low, with their ids."""
    if k <= 0 or k >= logits.shape[0]:
        ids = np.argsort(-logits, kind="stable")
    else:
        part = np.argpartition(-logits, k - 1)[:k]
        ids = part[np.argsort(-logits[part], kind="stable")]
    return ids, logits[ids].astype(np.float64)


def softmax(v: np.ndarray) -> np.ndarray:
    e = np.exp(v - v.max())
    return e / e.sum()
