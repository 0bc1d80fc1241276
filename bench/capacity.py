"""Capacity: the most concurrent sessions one ``wafervox serve`` carries with voice-to-voice p95 on the client's clock
within the budget, found by search over 1..N sessions.

    .venv/bin/python bench/capacity.py [--max 16] [--p95-ms 500] [--spread-s 8] [--seed 1] [--wavs WAV...] [--json FILE]

Starts ``wafervox serve`` on a free loopback port (a separate process, as in production).  A step with ``n`` sessions
runs ``n`` clients at once over ``/v1/realtime``, each replaying a sample conversation (round robin over them, or the
``--wavs`` recordings) in real time from its own random start offset in ``[0, spread)`` s, as callers would arrive.  A
step passes when every turn was answered and the p95 of all its turns' voice-to-voice (first answer audio received
minus last voiced sample sent) is within ``--p95-ms``.  The search doubles the sessions (1, 2, 4, ...) until a step
fails, then bisects between the last pass and the first failure (so it assumes that more sessions never do better).
Each step prints its sessions' figures; the capacity is printed last.  On a fresh server the first step also pays for
warming up; a step is one pass of each conversation (about 30 s of audio), so the whole search takes a few minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _serve import conversations, replay_sessions, start_server, stop_server  # noqa: E402  (beside this script)


def figures(values: list[float | None], budget_ms: float) -> dict:
    from voice.latency import percentile

    got = [v for v in values if v is not None]
    r = lambda v: None if v is None else round(v, 1)
    return {"turns": len(values), "answered": len(got), "p50": r(percentile(got, 0.5)), "p95": r(percentile(got, 0.95)),
            "max": r(max(got)) if got else None, "within_budget": sum(1 for v in got if v <= budget_ms)}


def run_step(n: int, url: str, convs, args, rng: random.Random) -> dict:
    """``n`` sessions at random offsets; their turns, per-session and overall figures, and the verdict."""
    plan = [(rng.uniform(0, args.spread_s), *convs[i % len(convs)]) for i in range(n)]
    expected = sum(len(files) for _, _, files in plan)
    t0 = time.monotonic()
    turns = asyncio.run(replay_sessions(url, plan, args.budget_ms, label=f"{n} sessions", quiet=not args.verbose))
    v2v = lambda ts: [t["latency_ms"]["voice_to_voice_ms"] for t in ts]
    sessions = []
    for i, (offset, name, files) in enumerate(plan):
        mine = [t for t in turns if t["session"] == i]
        sessions.append({"session": i, "conversation": name, "offset_s": round(offset, 2), "expected_turns": len(files),
                         **figures(v2v(mine), args.budget_ms)})
    overall = figures(v2v(turns), args.budget_ms)
    # every recording answered once (a turn missing: cut off or dropped under load; an extra: a pause taken for an end)
    answered_all = overall["answered"] >= expected
    ok = answered_all and overall["p95"] is not None and overall["p95"] <= args.p95_ms
    return {"sessions": n, "wall_s": round(time.monotonic() - t0, 1), "expected_turns": expected, "overall": overall,
            "per_session": sessions, "pass": ok, "per_turn": turns}


def print_step(step: dict, budget_ms: float) -> None:
    f = lambda v: "-" if v is None else f"{v:.0f}"
    print(f"\n{step['sessions']} session(s), {step['wall_s']:.0f} s:")
    print(f"  {'session':>7s} {'conversation':12s} {'offset s':>8s} {'turns':>7s} {'p50':>6s} {'p95':>6s} {'max':>6s} "
          f"{'<=' + f(budget_ms):>6s}")
    for s in step["per_session"]:
        print(f"  {s['session']:7d} {s['conversation']:12s} {s['offset_s']:8.2f} {s['answered']:>3d}/{s['expected_turns']:<3d} "
              f"{f(s['p50']):>6s} {f(s['p95']):>6s} {f(s['max']):>6s} {s['within_budget']:>6d}")
    o = step["overall"]
    verdict = "PASS" if step["pass"] else "FAIL"
    print(f"  {'all':>7s} {'':12s} {'':8s} {o['answered']:>3d}/{step['expected_turns']:<3d} {f(o['p50']):>6s} {f(o['p95']):>6s} "
          f"{f(o['max']):>6s} {o['within_budget']:>6d}  {verdict}", flush=True)


def search(run, hi: int) -> tuple[int, list[int]]:
    """The largest ``n`` in 1..``hi`` for which ``run(n)`` passes, doubling from 1 until a failure and then bisecting
    (0 when one session fails); also the counts tried, in order."""
    tried: list[int] = []

    def ok(n: int) -> bool:
        tried.append(n)
        return run(n)

    good, bad, n = 0, hi + 1, 1
    while n <= hi:  # doubling
        if not ok(n):
            bad = n
            break
        good = n
        n = min(hi, 2 * n) if n < hi else hi + 1
    while bad - good > 1:  # bisection
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good, tried


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max", type=int, default=16, help="the most sessions tried (default 16)")
    ap.add_argument("--p95-ms", type=float, default=500.0, help="a step passes with its voice-to-voice p95 within this (default 500)")
    ap.add_argument("--budget-ms", type=float, default=500.0, help="the turn budget the sessions run with (default 500)")
    ap.add_argument("--spread-s", type=float, default=8.0, help="sessions start at random offsets in [0, this) s (default 8)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the start offsets (default 1)")
    ap.add_argument("--wavs", nargs="+", metavar="WAV", help="replay these recordings (one conversation, in this order) "
                    "instead of the sample conversations")
    ap.add_argument("--server-args", default="", help="more arguments for wafervox serve, in one string")
    ap.add_argument("--verbose", action="store_true", help="print every turn as it completes")
    ap.add_argument("--json", metavar="FILE", help="also write every step (and its turns) as JSON")
    args = ap.parse_args()
    if not 1 <= args.max <= 64:
        ap.error("--max must be 1..64")

    convs = conversations(args.wavs)
    rng = random.Random(args.seed)
    proc, port = start_server(["--max-sessions", str(args.max), *args.server_args.split()])
    url = f"ws://127.0.0.1:{port}/v1/realtime"
    print(f"server on port {port}; {url}; a step passes with every turn answered and p95 <= {args.p95_ms:.0f} ms", flush=True)
    steps: list[dict] = []

    def run(n: int) -> bool:
        step = run_step(n, url, convs, args, rng)
        steps.append(step)
        print_step(step, args.budget_ms)
        return step["pass"]

    try:
        capacity, tried = search(run, args.max)
    finally:
        stop_server(proc)
    f = lambda v: "-" if v is None else f"{v:.0f}"
    print(f"\n{'sessions':>8s} {'turns':>7s} {'p50':>6s} {'p95':>6s} {'max':>6s}  verdict")
    for s in sorted(steps, key=lambda s: s["sessions"]):
        o = s["overall"]
        print(f"{s['sessions']:8d} {o['answered']:>3d}/{s['expected_turns']:<3d} {f(o['p50']):>6s} {f(o['p95']):>6s} {f(o['max']):>6s}  "
              f"{'pass' if s['pass'] else 'FAIL'}")
    print(f"\ncapacity: {capacity} concurrent session(s) with voice-to-voice p95 <= {args.p95_ms:.0f} ms on the client's clock "
          f"(tried {', '.join(map(str, tried))})")
    if args.json:
        Path(args.json).write_text(json.dumps({"capacity": capacity, "tried": tried, "p95_ms": args.p95_ms,
                                               "spread_s": args.spread_s, "seed": args.seed, "steps": steps}, indent=1))


if __name__ == "__main__":
    main()
