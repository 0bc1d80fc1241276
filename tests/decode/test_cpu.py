"""``decode.cpu``: the compute team follows the cores other programs leave free, and the priority raise says what
it did.  The rule on made-up readings (others come and go), then on this machine with a real busy process."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numba
import pytest

from decode import cpu


class Readings:
    """A made-up machine of ``cores`` cores: each ``tick(ours, others)`` advances 0.1 s of wall time with ``ours`` and
    ``others`` cores busy."""

    def __init__(self, cores: int):
        self.cores, self.busy, self.total, self.own = cores, 0.0, 0.0, 0.0

    def tick(self, ours: float, others: float, dt: float = 0.1) -> None:
        self.busy += (ours + others) * dt
        self.total += self.cores * dt
        self.own += ours * dt

    def machine(self):
        return self.busy, self.total

    def share(self, monkeypatch) -> cpu.CpuShare:
        monkeypatch.setattr(os, "cpu_count", lambda: self.cores)
        return cpu.CpuShare(cpus=self.cores, machine=self.machine, own=lambda: self.own)


def run(share: cpu.CpuShare, r: Readings, ours: float, others: float, n: int = 10) -> list[int]:
    teams = []
    for _ in range(n):
        r.tick(ours, others)
        teams.append(share.sample())
    return teams


def test_the_team_leaves_a_busy_neighbour_its_core_and_takes_it_back(monkeypatch):
    r = Readings(2)
    share = r.share(monkeypatch)
    assert run(share, r, ours=1.8, others=0.0)[-1] == 2  # alone: both cores, however busy we are
    teams = run(share, r, ours=1.0, others=1.0)
    assert teams[-1] == 1 and share.others > 0.9  # one busy neighbour: one thread
    assert run(share, r, ours=1.0, others=0.3)[-1] == 1  # a neighbour that keeps a third of a core: still one
    assert run(share, r, ours=1.0, others=0.0)[-1] == 2  # gone: two again
    assert share.changes == 2


def test_a_neighbour_that_flickers_does_not_flip_the_team_each_sample(monkeypatch):
    r = Readings(2)
    share = r.share(monkeypatch)
    run(share, r, ours=1.0, others=1.0)
    before = share.changes
    teams = []
    for i in range(20):  # 0.1 s on, 0.1 s off: half a core on average
        teams += run(share, r, ours=1.0, others=1.0 if i % 2 else 0.0, n=1)
    assert set(teams) == {1} and share.changes == before


def test_more_cores_lose_only_what_others_take(monkeypatch):
    r = Readings(8)
    share = r.share(monkeypatch)
    assert run(share, r, ours=7.0, others=2.0)[-1] == 6
    assert run(share, r, ours=7.0, others=9.0)[-1] == 1  # never under one


def test_a_fixed_team_ignores_the_readings(monkeypatch):
    r = Readings(2)
    share = cpu.CpuShare(cpus=2, machine=r.machine, own=lambda: r.own, fixed=1)
    assert run(share, r, ours=0.0, others=0.0)[-1] == 1
    assert "WAFERVOX_THREADS" in share.describe()


def test_threads_from_env(monkeypatch):
    monkeypatch.delenv(cpu.THREADS_ENV, raising=False)
    assert cpu.threads_from_env() is None
    monkeypatch.setenv(cpu.THREADS_ENV, "1")
    assert cpu.threads_from_env() == 1
    for bad in ("0", "two", "-3"):
        monkeypatch.setenv(cpu.THREADS_ENV, bad)
        with pytest.raises(ValueError, match="WAFERVOX_THREADS"):
            cpu.threads_from_env()


def test_fit_sets_the_calling_threads_team(monkeypatch):
    monkeypatch.setattr(cpu, "_share", cpu.CpuShare(cpus=2, fixed=1))
    got = []

    def worker():
        got.append(cpu.fit())
        got.append(numba.get_num_threads())

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert got == [1, 1]


def test_usable_cpus_follows_the_affinity_mask():
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no affinity masks on this system")
    code = "from decode import cpu; print(cpu.usable_cpus())"
    r = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1"


def _sample_until(share: cpu.CpuShare, condition, timeout_s: float = 10.0) -> bool:
    """Samples every ``interval_s`` until ``condition()`` holds (True) or ``timeout_s`` passes (False)."""
    end = time.monotonic() + timeout_s
    share.sample()
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(share.interval_s)
        share.sample()
    return True


@pytest.mark.skipif(cpu.read_machine_ticks() is None or cpu.usable_cpus() < 2, reason="needs /proc/stat and two cores")
def test_a_real_busy_process_takes_a_thread_from_the_team():
    """Against what the machine already does (measured first, not assumed idle): a busy process adds about a core to
    ``others`` and takes a thread from the team if the team had it; once it is gone, both come back."""
    share = cpu.CpuShare(interval_s=0.1)
    _sample_until(share, lambda: False, timeout_s=1.0)  # a second of readings: what others do already
    base_others, base_team = share.others, share.team()
    if base_others > share.cpus - 1:
        pytest.skip(f"no core left for a busy process to take: others keep {base_others:.1f} of {share.cpus} busy")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        taken = _sample_until(share, lambda: share.others > base_others + share.down and share.team() < max(2, base_team))
        assert taken and share.team() == max(1, base_team - 1), (base_others, base_team, share.others, share.team())
    finally:
        busy.kill()
        busy.wait(timeout=10)
    assert _sample_until(share, lambda: share.team() >= base_team), (base_team, share.team(), share.others)


def test_raise_priority_says_what_it_did():
    code = "import os; from decode import cpu; print(cpu.raise_priority()); print(os.getpriority(os.PRIO_PROCESS, 0))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert r.returncode == 0, r.stderr
    line, nice = r.stdout.strip().splitlines()
    if os.geteuid() == 0:
        assert line.startswith("scheduling priority: raised to nice -10") and nice == "-10"
    else:
        assert "nice" in line and int(nice) >= -10


def test_raise_priority_refused_says_how_to_allow_it(monkeypatch):
    def refuse(*a):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "getpriority", lambda *a: 0)
    monkeypatch.setattr(os, "setpriority", refuse)
    line = cpu.raise_priority()
    assert "nice 0" in line and "CAP_SYS_NICE" in line
