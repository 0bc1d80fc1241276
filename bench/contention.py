"""The decode core beside other programs: a turn's prompt and decode steps with numba's team fixed at every core,
fixed at one thread, and following the free CPU (``decode.cpu``, what the product does), beside 0, 1 and 2 busy
processes, in one run.

    .venv/bin/python bench/contention.py [--busy 0 1 2] [--steps 40] [--rounds 3]

Per case: 22 prompt tokens at position 470 (the rest of a turn's prompt after the persona; median of ``--rounds``)
and ``--steps`` decode steps (p50 and p95), and the ratio of each team to the following one.  The busy processes are
``python -c "while True: pass"`` at the default priority, started for each case and stopped after it.  Prints the
kernel path first (``WAFERVOX_KERNELS`` picks another).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def measure(model, state, steps: int, rounds: int, team) -> dict:
    """``team()`` is called before each forward pass (``cpu.fit``, as ``forward`` does itself)."""
    ids = list(range(100, 592))
    pre = []
    for _ in range(rounds):
        team()
        t = time.perf_counter()
        model.forward(state, ids[:22], 470)
        pre.append(time.perf_counter() - t)
    ts = []
    for i in range(steps):
        team()
        t = time.perf_counter()
        model.forward(state, [198], 492 + i)
        ts.append(time.perf_counter() - t)
    ts.sort()
    return {"prefill_ms": statistics.median(pre) * 1e3, "step_p50_ms": ts[len(ts) // 2] * 1e3,
            "step_p95_ms": ts[min(len(ts) - 1, int(0.95 * len(ts)))] * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--busy", type=int, nargs="+", default=[0, 1, 2], help="busy process counts (default 0 1 2)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    import numba

    from decode import Model, cpu, qint

    model = Model()
    share = cpu.process_share()
    print(f"kernel path: {qint.select().name} (this CPU runs {', '.join(qint.available())}); numba layer "
          f"{numba.threading_layer()}, {cpu.usable_cpus()} usable cores", flush=True)
    state = model.new_state()
    model.forward(state, list(range(100, 570)), 0)
    full = min(cpu.usable_cpus(), numba.config.NUMBA_NUM_THREADS)
    teams = {f"{full} threads": full, "1 thread": 1, "following": None}
    print(f"{'busy':>4s} {'team':>12s} {'prefill22 ms':>13s} {'step p50':>9s} {'step p95':>9s}   vs following (prefill, p95)")
    for n in args.busy:
        procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
        try:
            time.sleep(1.0)  # the share sees them
            rows = {}
            for name, size in teams.items():
                share.pin(size)  # forward() fits its team to the share: pinned, or following
                if size is None:
                    time.sleep(0.5)
                    used = share.team()
                rows[name] = measure(model, state, args.steps, args.rounds, cpu.fit)
        finally:
            for p in procs:
                p.kill()
                p.wait(timeout=10)
        f = rows["following"]
        for name, r in rows.items():
            label = f"following ({used})" if name == "following" else name
            print(f"{n:4d} {label:>12s} {r['prefill_ms']:13.1f} {r['step_p50_ms']:9.1f} {r['step_p95_ms']:9.1f}   "
                  f"{r['prefill_ms'] / f['prefill_ms']:.2f}x, {r['step_p95_ms'] / f['step_p95_ms']:.2f}x", flush=True)
        time.sleep(1.0)  # the share sees them gone


if __name__ == "__main__":
    main()
