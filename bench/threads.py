"""How the threads share the cores during voice turns, measured from the kernel's own accounting.

    .venv/bin/python bench/threads.py [--conversation NAME] [--interval-ms 10] [--json FILE]

Loads the default engines as ``wafervox run`` does and plays one sample conversation in real
time.  Every thread of the process is put in the group of the engine whose loading created it
(Whisper's CTranslate2 pool, the decode core's numba pool, piper's onnxruntime pool); before
them there are the main thread, which runs the voice loop and takes part in each engine's work,
and numpy's OpenBLAS pool.  A sampler reads ``/proc/self/task/*/schedstat`` every interval: the
nanoseconds each thread ran and the nanoseconds it waited, runnable, for a core.  Printed per
group: CPU time during the replay, run-queue wait, and in how many intervals each number of
groups was busy at once.  Waiting while runnable is what oversubscribing the cores costs, so its
share of the CPU time is the figure that says whether the thread teams collide.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TASKS = Path("/proc/self/task")
#: A group counts as busy in an interval where its threads ran at least this share of it.
BUSY_SHARE = 0.2


def tids() -> set[int]:
    return {int(t.name) for t in TASKS.iterdir()}


def schedstat() -> dict[int, tuple[int, int]]:
    """``{tid: (ns on a core, ns waiting for one)}`` of every live thread of this process."""
    out = {}
    for t in TASKS.iterdir():
        try:
            run, wait, _ = (t / "schedstat").read_text().split()
        except (OSError, ValueError):  # the thread ended between listing and reading
            continue
        out[int(t.name)] = (int(run), int(wait))
    return out


class Sampler(threading.Thread):
    """Per-interval (run, wait) nanoseconds of each group, until ``stop``."""

    def __init__(self, group_of, interval_s: float):
        super().__init__(daemon=True, name="schedstat-sampler")
        self.group_of, self.interval_s = group_of, interval_s
        self.samples: list[dict[str, tuple[int, int]]] = []
        self.stop_flag = threading.Event()

    def run(self) -> None:
        me = threading.get_native_id()
        last = schedstat()
        while not self.stop_flag.wait(self.interval_s):
            now = schedstat()
            per = defaultdict(lambda: [0, 0])
            for tid, (r, w) in now.items():
                if tid == me:
                    continue
                r0, w0 = last.get(tid, (0, 0))
                g = per[self.group_of(tid)]
                g[0] += r - r0
                g[1] += w - w0
            self.samples.append({k: (v[0], v[1]) for k, v in per.items()})
            last = now

    def stop(self) -> None:
        self.stop_flag.set()
        self.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversation", default="morning", help="sample conversation to replay (samples/manifest.json)")
    ap.add_argument("--interval-ms", type=float, default=10.0)
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args()
    if not TASKS.is_dir():
        raise SystemExit("needs Linux /proc/self/task/*/schedstat")

    from voice.engines import load_engines
    from voice.replay import SAMPLES, manifest, play_conversation

    m = manifest()
    if args.conversation not in m["conversations"]:
        raise SystemExit(f"no conversation {args.conversation!r}; there are: {', '.join(m['conversations'])}")
    import numpy  # noqa: F401  (its OpenBLAS pool starts at import)

    me = threading.main_thread().native_id
    groups: dict[int, str] = {t: "main" if t == me else "numpy (OpenBLAS)" for t in tids()}
    phase = ["main"]
    names = {"loading Whisper": "asr (CTranslate2)", "loading the LLM": "decode (numba)", "loading the": "tts (onnxruntime)",
             "warming up": "warm-up"}

    def progress(msg: str) -> None:
        for t in tids() - groups.keys():  # threads the phase that just ended started
            groups[t] = phase[0]
        phase[0] = next((g for k, g in names.items() if msg.startswith(k)), msg)
        print(msg, flush=True)

    engines, _ = load_engines(progress=progress)
    progress("loaded")
    sampler = Sampler(lambda tid: groups.get(tid, "later"), args.interval_ms / 1000)
    sampler.start()
    t0 = time.perf_counter()
    reports, _ = play_conversation(engines, [SAMPLES / f for f in m["conversations"][args.conversation]], realtime=True)
    wall = time.perf_counter() - t0
    sampler.stop()

    cores = os.cpu_count() or 1
    interval_ns = args.interval_ms * 1e6
    run, wait = Counter(), Counter()
    busy_at_once = Counter()
    for s in sampler.samples:
        for g, (r, w) in s.items():
            run[g] += r
            wait[g] += w
        busy_at_once[sum(1 for r, _ in s.values() if r >= BUSY_SHARE * interval_ns)] += 1
    count = Counter(groups.values())
    print(f"\n{args.conversation}: {len(reports)} turns in {wall:.1f} s real time, {cores} cores, "
          f"{len(sampler.samples)} intervals of {args.interval_ms:.0f} ms")
    print(f"{'group':20s} {'threads':>7s} {'CPU ms':>9s} {'wait ms':>9s} {'wait/CPU':>9s}")
    for g in sorted(run, key=lambda g: -run[g]):
        share = wait[g] / run[g] if run[g] else 0.0
        print(f"{g:20s} {count.get(g, 0):7d} {run[g] / 1e6:9.0f} {wait[g] / 1e6:9.0f} {share:9.1%}")
    total_run, total_wait = sum(run.values()), sum(wait.values())
    print(f"{'all':20s} {len(groups):7d} {total_run / 1e6:9.0f} {total_wait / 1e6:9.0f} "
          f"{total_wait / total_run if total_run else 0:9.1%}")
    n = len(sampler.samples) or 1
    print(f"groups busy at once (>= {BUSY_SHARE:.0%} of an interval): "
          + ", ".join(f"{k}: {v / n:.1%}" for k, v in sorted(busy_at_once.items())))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "conversation": args.conversation, "turns": len(reports), "wall_s": wall, "cores": cores,
            "interval_ms": args.interval_ms, "threads": dict(count),
            "cpu_ms": {g: v / 1e6 for g, v in run.items()}, "wait_ms": {g: v / 1e6 for g, v in wait.items()},
            "groups_busy_at_once": {str(k): v / n for k, v in busy_at_once.items()},
            "samples": [{g: [r / 1e6, w / 1e6] for g, (r, w) in smp.items() if r or w} for smp in sampler.samples]},
            indent=1))


if __name__ == "__main__":
    main()
