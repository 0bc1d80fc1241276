"""The file of a small logistic head over standardized features (``voice.turn_end.TurnEndHead``,
``voice.retrieval.TopicHead``): its weights and bias, the features' mean and scale, what it is tied to (the model whose
features it reads) and how it was trained, in one ``.npz`` (no pickles)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import numpy as np


class HeadFile:
    """What a head dataclass (fields ``weights``, ``bias``, ``mean``, ``scale``, ``info`` and its ``TIE``) gets from
    this file format: ``probability``, ``save`` and ``load``."""

    __slots__ = ()
    #: the field naming what the head is tied to, and what the head is called in errors
    TIE: ClassVar[str]
    WHAT: ClassVar[str]

    def probability(self, features: np.ndarray) -> float:
        return probability(self, features)

    def save(self, path: Path) -> None:
        save(self, path, self.TIE)

    @classmethod
    def load(cls, path: Path):
        """A head file; raises ``ValueError`` naming the file when it cannot be used."""
        return load(cls, path, cls.TIE, cls.WHAT)


def probability(head, features: np.ndarray) -> float:
    """The head's P(positive) for one feature vector."""
    z = float(((features - head.mean) / head.scale) @ head.weights + head.bias)
    return float(1.0 / (1.0 + np.exp(-np.clip(z, -40.0, 40.0))))


def save(head, path: Path, tie: str) -> None:
    """``head`` (a dataclass with weights, bias, mean, scale, info and the field ``tie``) into ``path``."""
    np.savez(path, weights=head.weights, bias=np.float64(head.bias), mean=head.mean, scale=head.scale,
             info=np.array(json.dumps(head.info)), **{tie: np.array(getattr(head, tie))})


def load(cls, path: Path, tie: str, what: str):
    """A ``cls`` read from ``path``; raises ``ValueError`` naming ``what`` and the file when it cannot be used."""
    try:
        with np.load(path, allow_pickle=False) as z:
            head = cls(weights=z["weights"].astype(np.float64), bias=float(z["bias"]), mean=z["mean"].astype(np.float64),
                       scale=z["scale"].astype(np.float64), info=json.loads(str(z["info"])), **{tie: str(z[tie])})
    except (OSError, KeyError, ValueError, EOFError) as exc:
        raise ValueError(f"bad {what} {path}: {exc}") from None
    n = head.weights.shape[0]
    if head.weights.ndim != 1 or head.mean.shape != (n,) or head.scale.shape != (n,) or not np.all(head.scale > 0):
        raise ValueError(f"bad {what} {path}: inconsistent shapes")
    return head
