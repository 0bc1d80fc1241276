"""The simulated clock: a discrete-event queue with an explicit tie-break, and the timeline it records.

Events are ordered by ``(time, priority, seq)``: at equal times a stage that finishes
(``DONE``) is handled before a token that arrives (``ARRIVE``), so a freed unit can take the
arrival at once; among equals the event pushed first goes first.  Nothing here knows about
threads or models.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from enum import IntEnum


class Kind(IntEnum):
    DONE = 0  # a stage finished a work item
    ARRIVE = 1  # a work item reaches a stage


@dataclass(frozen=True, slots=True, order=True)
class Event:
    time: float
    priority: int
    seq: int
    kind: Kind = field(compare=False)
    stage: int = field(compare=False)
    item: object = field(compare=False)


class EventQueue:
    def __init__(self):
        self._heap: list[Event] = []
        self._seq = 0
        self.now = 0.0

    def push(self, time: float, kind: Kind, stage: int, item) -> None:
        if time < self.now:
            raise ValueError(f"event at {time} is in the past (now {self.now})")
        heapq.heappush(self._heap, Event(time, int(kind), self._seq, kind, stage, item))
        self._seq += 1

    def pop(self) -> Event:
        ev = heapq.heappop(self._heap)
        self.now = ev.time
        return ev

    def __len__(self) -> int:
        return len(self._heap)


@dataclass(frozen=True, slots=True)
class Span:
    """One stretch of simulated time: a stage working on an item, or a hop between stages."""

    what: str  # "stage" | "hop"
    stage: int  # the stage that works (for a hop: the stage it leaves)
    sequence: int
    token: int  # index of the step in its sequence (prefill chunks count from -chunks)
    start: float
    end: float


@dataclass
class Timeline:
    n_stages: int
    spans: list[Span] = field(default_factory=list)

    def stage_spans(self, stage: int) -> list[Span]:
        return sorted((s for s in self.spans if s.what == "stage" and s.stage == stage), key=lambda s: s.start)

    @property
    def makespan(self) -> float:
        return max((s.end for s in self.spans), default=0.0)

    def utilisation(self) -> list[float]:
        """Busy share of each stage over the whole run."""
        total = self.makespan
        return [sum(s.end - s.start for s in self.stage_spans(k)) / total if total else 0.0 for k in range(self.n_stages)]

    def bubbles(self) -> list[float]:
        """Idle time of each stage between its first start and its last end (seconds)."""
        out = []
        for k in range(self.n_stages):
            sp = self.stage_spans(k)
            out.append(sum(max(0.0, b.start - a.end) for a, b in zip(sp, sp[1:])))
        return out
