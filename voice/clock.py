"""Clocks the voice loop runs on: the monotonic clock for real time, a virtual one for replay
faster than real time.  Both count seconds from the start of a session.

Compute runs inside ``with clock.working():``.  The real clock just lets time pass; the
virtual clock adds the measured wall time of the work, so a replay at full speed sees the
same compute delays as a real-time run, while idle waits (audio still to come) cost nothing.
"""

from __future__ import annotations

import time
from contextlib import contextmanager


class RealClock:
    realtime = True

    def __init__(self):
        self._t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def advance_to(self, t: float) -> None:
        """Wait until ``t``."""
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)

    @contextmanager
    def working(self):
        yield


class VirtualClock:
    realtime = False

    def __init__(self):
        self._t = 0.0

    def now(self) -> float:
        return self._t

    def advance_to(self, t: float) -> None:
        if t > self._t:
            self._t = t

    @contextmanager
    def working(self):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._t += time.perf_counter() - t0
