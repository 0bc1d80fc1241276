"""How many cores this process can use right now, and numba's thread teams sized to it.

numba's parallel kernels split each call over a team of threads that meet at the call's end.  When another program
takes a core, one team thread waits for its slice of that core and the whole call waits with it: on a 2-core VM beside
one busy process, a decode step's p95 went from 10 ms on one thread to 146 ms on two, and 22 prompt tokens took 117
ms against 87 (``bench/contention.py``).  So the team follows the CPU the rest of the machine leaves free:

- ``usable_cpus()``: the cores this process may run on (its affinity mask, and a cgroup v2 CPU quota where one is set);
- ``CpuShare``: samples the machine's busy time (``/proc/stat``) and this process's own CPU time every
  ``interval_s``; what others use is the difference, smoothed.  ``team()`` is the usable cores less those others keep
  busy (with hysteresis), never under one.
- ``fit()``: called by each compute entry point (a forward pass, a Whisper step) on the thread that is about to run
  numba kernels; sets that thread's team size (``numba.set_num_threads`` is per thread) to ``team()``.
- ``team()``: the share's team, or fewer where the calling thread holds fewer cores (``holding``: the server hands its
  sessions' work one core each, ``decode.batching.Cores``); CTranslate2's encoder and Piper's front ask it too.

The share is the process's (``process_share()``), started on first use; ``WAFERVOX_THREADS=N`` fixes the team at N.
On a machine without ``/proc/stat`` (not Linux) the team is the usable cores.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable

#: Fixes the team size (tests, benchmarks, users who know their machine); unset: it follows the free CPU.
THREADS_ENV = "WAFERVOX_THREADS"


def usable_cpus() -> int:
    """The cores this process may use: its affinity mask, capped by a cgroup v2 quota (``cpu.max``) when set."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        n = os.cpu_count() or 1
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()[:2]
        if quota != "max":
            n = min(n, max(1, math.floor(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, n)


def read_machine_ticks() -> tuple[float, float] | None:
    """(busy, total) seconds of every core since boot from ``/proc/stat`` (idle and iowait are not busy; steal is)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    hz = os.sysconf("SC_CLK_TCK")
    total = sum(ticks)
    return (total - ticks[3] - ticks[4]) / hz, total / hz


class CpuShare:
    """Tracks how many cores other programs keep busy (``others``) and the team size that leaves them (``team``).

    ``sample()`` takes one reading; ``start()`` runs it every ``interval_s`` on a daemon thread.  The readers are
    injected (``machine``: busy and total CPU seconds of the machine, ``own``: this process's CPU seconds), so the
    rule is tested on made-up readings.  ``team`` drops when others use more than ``down`` of a core beyond what a
    smaller team would leave them, and rises once they use less than ``up``: a neighbour that comes and goes does not
    flip it every sample."""

    def __init__(self, cpus: int | None = None, interval_s: float = 0.1, smoothing: float = 0.5, down: float = 0.4,
                 up: float = 0.2, machine: Callable[[], tuple[float, float] | None] = read_machine_ticks,
                 own: Callable[[], float] = time.process_time, fixed: int | None = None):
        self.cpus = cpus if cpus is not None else usable_cpus()
        self.interval_s, self.smoothing, self.down, self.up = interval_s, smoothing, down, up
        self._machine, self._own = machine, own
        self.fixed = fixed
        self.others = 0.0  # cores other programs keep busy (smoothed)
        self._team = fixed or self.cpus
        self._last: tuple[float, float, float] | None = None  # busy, total, own
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.changes = 0  # how often the team size changed

    def team(self) -> int:
        """Threads for a compute call now."""
        return self._team

    def sample(self) -> int:
        """One reading: updates ``others`` and ``team``; returns the team."""
        m = self._machine()
        if m is None or self.fixed:
            return self._team
        now = (m[0], m[1], self._own())
        last, self._last = self._last, now
        if last is None or now[1] <= last[1]:
            return self._team
        total = now[1] - last[1]  # CPU seconds of every core over the interval
        wall = total / max(1, os.cpu_count() or 1)
        others = max(0.0, ((now[0] - last[0]) - (now[2] - last[2])) / wall) if wall > 0 else 0.0
        self.others += self.smoothing * (others - self.others)
        self._decide()
        return self._team

    def _decide(self) -> None:
        n = self._team
        while n > 1 and self.others > self.cpus - n + self.down:  # the team's cores are not all free
            n -= 1
        while n < self.cpus and self.others < self.cpus - (n + 1) + self.up:  # one more is free
            n += 1
        if n != self._team:
            self._team = n
            self.changes += 1

    def pin(self, n: int | None) -> None:
        """Fix the team at ``n`` threads (benchmarks comparing team sizes); None follows the free CPU again."""
        self.fixed = n
        self._team = n or self.cpus
        if n is None:
            self.start()

    def start(self) -> CpuShare:
        if self._thread is None and not self.fixed and self._machine() is not None:
            self.sample()
            self._thread = threading.Thread(target=self._run, name="cpu-share", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self.fixed:
                self.sample()

    def stop(self) -> None:
        self._stop.set()

    def describe(self) -> str:
        if self.fixed:
            return f"compute threads: {self.fixed} ({THREADS_ENV})"
        return (f"compute threads: up to {self.cpus} (the cores this process may use), fewer while other programs keep "
                f"cores busy (now {self._team})")


_share: CpuShare | None = None
_share_lock = threading.Lock()


def process_share() -> CpuShare:
    """The process's ``CpuShare``, started on first use (``WAFERVOX_THREADS`` fixes its team)."""
    global _share
    with _share_lock:
        if _share is None:
            _share = CpuShare(fixed=threads_from_env()).start()
        return _share


def threads_from_env() -> int | None:
    """``WAFERVOX_THREADS`` as a team size, None when unset; anything but a whole number >= 1 is an error."""
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{THREADS_ENV}={raw!r}: a number of threads >= 1, or unset to follow the free CPU")
    return n


_held = threading.local()


def team() -> int:
    """Threads for the calling thread's compute now: the process share's ``team()``, capped by the cores this thread
    holds (``holding``)."""
    cap = getattr(_held, "cores", None)
    n = process_share().team()
    return n if cap is None else max(1, min(n, cap))


class holding:
    """``with holding(n):`` the calling thread's compute runs on at most ``n`` threads (``team()``); None: no cap.
    Nests (the inner cap holds until its block ends)."""

    __slots__ = ("n", "_before")

    def __init__(self, n: int | None):
        self.n = n

    def __enter__(self):
        self._before = getattr(_held, "cores", None)
        _held.cores = self.n
        return self

    def __exit__(self, *exc) -> None:
        _held.cores = self._before


def fit() -> int:
    """Size the calling thread's numba team to ``team()`` (within numba's pool); returns it."""
    import numba

    n = max(1, min(team(), numba.config.NUMBA_NUM_THREADS))
    if numba.get_num_threads() != n:
        numba.set_num_threads(n)
    return n


#: The niceness ``raise_priority`` asks for: each thread then weighs ~9x a default one on a shared core (CFS weights
#: 9548 against 1024), still under real-time classes and without starving anything.
RAISED_NICE = -10


def raise_priority(nice: int = RAISED_NICE) -> str:
    """Lower the calling thread's niceness to ``nice`` where this process may (root, ``CAP_SYS_NICE``, or an
    ``RLIMIT_NICE`` that allows it); threads started afterwards (compute teams, audio, sessions) inherit it, so call
    it before loading the engines.  Returns one line for the start-up output: what was done, or why not and how to
    allow it."""
    try:
        current = os.getpriority(os.PRIO_PROCESS, 0)
    except (OSError, AttributeError):
        return "scheduling priority: unchanged (not available on this system)"
    if current <= nice:
        return f"scheduling priority: nice {current} already"
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except PermissionError:
        return (f"scheduling priority: nice {current} (not allowed to raise it: run as root, grant CAP_SYS_NICE with "
                f"`setcap cap_sys_nice+ep` on the Python binary, or allow it in /etc/security/limits.conf with "
                f"`<user> - nice {nice}`; see README)")
    except OSError as e:
        return f"scheduling priority: nice {current} ({e.strerror or e})"
    return f"scheduling priority: raised to nice {nice} (audio and compute threads win a core shared with other programs)"
