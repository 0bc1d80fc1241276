"""Soak: N sessions for M minutes against ``wafervox serve``, then a connect/abort storm; memory, errors, turns.

    .venv/bin/python bench/soak.py [--sessions 4] [--minutes 10] [--cycles 200] [--json FILE]

Starts ``wafervox serve`` on a free loopback port (a separate process, so its RSS is its own), opens one warm-up
session and closes it, and takes the server's RSS then as *idle*.  Then ``--sessions`` clients each replay the
sample conversations (a different one each, over and over, one connection per session) at real-time pace for
``--minutes``; every 30 s it prints the server's RSS, turns answered, errors, and voice-to-voice p50/p95 so far
(the client's clock).  When they stop: RSS a few seconds after the sessions closed, then ``--cycles`` connections
opened and aborted (TCP reset) as fast as the server takes them, and RSS again.

Bars (issue "hostile clients and long runs"): RSS growth <= 5% after the first minute, RSS back within 10% of idle
after the sessions close and after the storm, 0 errors, 0 unanswered turns.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import websockets

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _serve import start_server, stop_server  # noqa: E402  (beside this script: its folder is on sys.path)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def q(values, p):
    from voice.latency import percentile

    v = percentile([x for x in values if x is not None], p)
    return None if v is None else round(v, 1)


async def settle(url: str, pid: int, seconds: float = 5.0) -> float:
    """RSS once the server has had ``seconds`` with no session (a health probe keeps it awake)."""
    await asyncio.sleep(seconds)
    return rss_mb(pid)


async def warm_up(url: str) -> None:
    from server.client import ClientOptions, run_client

    await run_client([ROOT / "samples" / "morning_02_located.wav"], ClientOptions(url=url, tail_s=1.5))


async def soak(url: str, pid: int, sessions: int, minutes: float, convs: dict) -> dict:
    from server.client import ClientOptions, run_client

    turns: list[dict] = []
    errors: list[str] = []
    end = time.monotonic() + minutes * 60
    names = sorted(convs)

    async def one(i: int) -> None:
        name = names[i % len(names)]
        files = convs[name]
        await asyncio.sleep(i * 1.3)  # staggered, so that sessions do not talk in lockstep
        reps = max(1, int(minutes * 60 / (5.0 * len(files))) + 1)  # more than fits: the clock stops it
        budget = max(10.0, end - time.monotonic())

        def on_turn(t: dict) -> None:
            t["session"] = i
            turns.append(t)

        def progress(msg: str, *a, **k) -> None:
            if "server error" in msg:
                errors.append(f"session {i}: {msg}")
                print(f"  session {i}: {msg}", flush=True)

        try:
            await run_client(files * reps, ClientOptions(url=url, tail_s=1.5, timeout_s=budget), on_turn=on_turn,
                             progress=progress)
        except (OSError, websockets.WebSocketException) as e:
            errors.append(f"session {i}: {type(e).__name__}: {e}")

    samples: list[tuple[float, float]] = []

    async def monitor() -> None:
        t0 = time.monotonic()
        while time.monotonic() < end + 60:
            await asyncio.sleep(30)
            t = time.monotonic() - t0
            rss = rss_mb(pid)
            samples.append((t, rss))
            v = [x["latency_ms"]["voice_to_voice_ms"] for x in turns]
            print(f"  {t / 60:5.1f} min: RSS {rss:7.1f} MB, {len(turns)} turns, {len(errors)} errors, "
                  f"voice-to-voice p50 {q(v, 0.5)} / p95 {q(v, 0.95)} ms", flush=True)

    mon = asyncio.create_task(monitor())
    await asyncio.gather(*(one(i) for i in range(sessions)))
    mon.cancel()
    return {"turns": turns, "errors": errors, "rss": samples}


async def storm(url: str, cycles: int) -> tuple[int, float]:
    """``cycles`` connections opened (past the handshake, to session.created) and aborted with a TCP reset."""
    refused = 0
    t0 = time.monotonic()
    for _ in range(cycles):
        try:
            ws = await websockets.connect(url, open_timeout=30)
            await asyncio.wait_for(ws.recv(), 30)
            ws.transport.abort()
        except (TimeoutError, OSError, websockets.WebSocketException):
            refused += 1
            await asyncio.sleep(0.05)
    return refused, time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=4, help="concurrent sessions (default 4)")
    ap.add_argument("--minutes", type=float, default=10.0, help="length of the soak (default 10)")
    ap.add_argument("--cycles", type=int, default=200, help="connect/abort cycles after the soak (default 200)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args()
    if args.sessions < 1 or args.minutes <= 0 or args.cycles < 0:
        raise SystemExit("--sessions >= 1, --minutes > 0, --cycles >= 0")

    from voice.replay import manifest

    m = manifest()
    convs = {name: [ROOT / "samples" / f for f in files] for name, files in m["conversations"].items() if name != "default"}
    proc, port = start_server(["--max-sessions", str(max(4, args.sessions)), "--max-connect-rate", "1000"])
    url = f"ws://127.0.0.1:{port}/v1/realtime"
    out: dict = {"sessions": args.sessions, "minutes": args.minutes, "cycles": args.cycles}
    try:
        print(f"server pid {proc.pid} on port {port}; RSS after load {rss_mb(proc.pid):.1f} MB", flush=True)
        asyncio.run(warm_up(url))
        idle = asyncio.run(settle(url, proc.pid))
        print(f"idle (after one warm-up session): RSS {idle:.1f} MB", flush=True)
        print(f"{args.sessions} sessions for {args.minutes:g} min, replaying {', '.join(sorted(convs))} in real time", flush=True)
        res = asyncio.run(soak(url, proc.pid, args.sessions, args.minutes, convs))
        after = asyncio.run(settle(url, proc.pid))
        refused, storm_s = asyncio.run(storm(url, args.cycles)) if args.cycles else (0, 0.0)
        after_storm = asyncio.run(settle(url, proc.pid))
    finally:
        stop_server(proc)

    turns, errors, rss = res["turns"], res["errors"], res["rss"]
    v = [t["latency_ms"]["voice_to_voice_ms"] for t in turns]
    unanswered = sum(1 for t in turns if t["latency_ms"]["voice_to_voice_ms"] is None and not t["barge_in"])
    after_first = [r for t, r in rss if t >= 60]
    growth = (after_first[-1] / after_first[0] - 1) if len(after_first) >= 2 else None
    ok = sum(t["within_budget"] for t in turns)
    print()
    print(f"turns {len(turns)} ({unanswered} without an answer heard), errors {len(errors)}, "
          f"within budget {ok}/{len(turns)}; voice-to-voice p50 {q(v, 0.5)} / p95 {q(v, 0.95)} ms (client clock)")
    if growth is not None:
        print(f"RSS after the first minute: {after_first[0]:.1f} -> {after_first[-1]:.1f} MB = {growth * 100:+.1f}% "
              f"(bar <= +5%)")
    print(f"RSS idle {idle:.1f} MB; after the sessions closed {after:.1f} MB = {(after / idle - 1) * 100:+.1f}% (bar within 10%)")
    if args.cycles:
        print(f"{args.cycles} connect/abort cycles in {storm_s:.1f} s ({refused} refused): RSS {after_storm:.1f} MB = "
              f"{(after_storm / idle - 1) * 100:+.1f}% of idle (bar within 10%)")
    out.update(turns=len(turns), unanswered=unanswered, errors=errors, within_budget=ok,
               voice_to_voice_ms={"p50": q(v, 0.5), "p95": q(v, 0.95)}, rss_samples=rss, rss_idle_mb=idle,
               rss_after_sessions_mb=after, rss_after_storm_mb=after_storm, rss_growth_after_first_minute=growth,
               storm_s=storm_s, storm_refused=refused)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
