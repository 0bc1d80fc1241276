"""Voice-to-voice over the websocket server, measured on the client's clock, for 1, 2 and 4
concurrent sessions replaying the sample conversations in real time.

    .venv/bin/python bench/server.py [--sessions 1 2 4] [--native] [--json FILE]

Starts ``wafervox serve`` on a free loopback port (a separate process, as in production), then for
each session count runs that many ``wafervox client`` sessions at once (in this process), each
streaming a different sample conversation at real-time pace.  Per turn: the client's figure (first
answer audio sample received minus last voiced sample sent), the server's own pipeline figure
(``turn.latency``), and their difference, the server's overhead (serialisation, socket, event
loop).  Prints p50/p95 of each, the ratio to the budget and to the 1-session figure, and the
websocket ping round trip of one more, idle, connection meanwhile (how long the sessions' compute
holds up the event loop).
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


def q(values, p):
    from voice.latency import percentile

    v = percentile([x for x in values if x is not None], p)
    return None if v is None else round(v, 1)


async def run_sessions(n: int, url: str, convs, budget_ms: float, stagger_s: float) -> list[dict]:
    """``n`` clients at once, each streaming its own conversation (client ``i`` starts ``i * stagger_s``
    late, so that two clients replaying the same conversation do not talk in lockstep); every turn,
    tagged with its session."""
    from server.client import ClientOptions, run_client

    turns: list[dict] = []

    async def one(i: int, name: str, files) -> None:
        await asyncio.sleep(i * stagger_s)
        def on_turn(t: dict) -> None:
            t["session"], t["conversation"] = i, name
            turns.append(t)
            lat = t["latency_ms"]
            print(f"  [{n} sessions] {name:8s} turn {t['turn']}: client {lat['voice_to_voice_ms'] or float('nan'):6.0f} ms, "
                  f"server {t['server_voice_to_voice_ms'] or float('nan'):6.0f} ms  {t['transcript']!r} -> {t['reply']!r}", flush=True)

        await run_client(files, ClientOptions(url=url, tail_s=2.0, budget_ms=budget_ms), on_turn=on_turn)

    async def probe() -> list[float]:
        """An idle connection's websocket ping round trips while the others talk: how long the event loop
        (heartbeats, audio in) is held up by the sessions' compute."""
        rtts = []
        async with websockets.connect(url) as ws:
            await ws.recv()  # session.created
            while not done.is_set():
                t = time.perf_counter()
                pong = await ws.ping()
                await pong
                rtts.append((time.perf_counter() - t) * 1000)
                await asyncio.sleep(0.1)
        return rtts

    done = asyncio.Event()
    prober = asyncio.create_task(probe())
    await asyncio.gather(*(one(i, *convs[i % len(convs)]) for i in range(n)))
    done.set()
    return turns, await prober


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 2, 4], help="concurrent session counts (default 1 2 4)")
    ap.add_argument("--native", action="store_true", help="use /v1/stream (binary PCM) instead of /v1/realtime")
    ap.add_argument("--budget-ms", type=float, default=500.0)
    ap.add_argument("--stagger-s", type=float, default=0.7, help="start offset between clients (default 0.7 s)")
    ap.add_argument("--json", metavar="FILE", help="also write every turn and the summary as JSON")
    args = ap.parse_args()

    from voice.replay import SAMPLES, manifest

    m = manifest()
    convs = [(name, [SAMPLES / f for f in files]) for name, files in m["conversations"].items() if name != "default"]
    proc, port = start_server(["--max-sessions", str(max(args.sessions) + 1)])  # + the ping probe
    url = f"ws://127.0.0.1:{port}/v1/{'stream' if args.native else 'realtime'}"
    print(f"server on port {port}; {url}", flush=True)
    results = {}
    try:
        for n in args.sessions:
            t0 = time.monotonic()
            turns, rtts = asyncio.run(run_sessions(n, url, convs, args.budget_ms, args.stagger_s))
            client = [t["latency_ms"]["voice_to_voice_ms"] for t in turns]
            server = [t["server_voice_to_voice_ms"] for t in turns]
            over = [t["overhead_ms"] for t in turns]
            results[n] = {"turns": len(turns), "wall_s": round(time.monotonic() - t0, 1),
                          "client_v2v_ms": {"p50": q(client, 0.5), "p95": q(client, 0.95)},
                          "server_v2v_ms": {"p50": q(server, 0.5), "p95": q(server, 0.95)},
                          "overhead_ms": {"p50": q(over, 0.5), "p95": q(over, 0.95)},
                          "ping_rtt_ms": {"p50": q(rtts, 0.5), "p95": q(rtts, 0.95), "max": round(max(rtts), 1) if rtts else None},
                          "within_budget": sum(1 for v in client if v is not None and v <= args.budget_ms), "per_turn": turns}
    finally:
        stop_server(proc)

    b = args.budget_ms
    base = results.get(args.sessions[0], {}).get("client_v2v_ms", {}).get("p50")
    print(f"\nvoice-to-voice on the client's clock over loopback ({'native /v1/stream' if args.native else '/v1/realtime'}), "
          f"budget {b:.0f} ms")
    print(f"{'sessions':>8s} {'turns':>5s} {'client p50':>10s} {'p95':>6s} {'server p50':>10s} {'p95':>6s} "
          f"{'overhead p50':>12s} {'p95':>5s} {'p50/budget':>10s} {'p50 vs 1st':>10s} {'hit rate':>8s} {'ping p95/max':>12s}")
    for n, r in results.items():
        c, s, o = r["client_v2v_ms"], r["server_v2v_ms"], r["overhead_ms"]
        f = lambda v: "-" if v is None else f"{v:.0f}"
        rel = "-" if not base or c["p50"] is None else f"{c['p50'] / base:.2f}x"
        hit = f"{r['within_budget']}/{r['turns']}"
        of_budget = "-" if c["p50"] is None else f"{c['p50'] / b:.2f}x"
        print(f"{n:8d} {r['turns']:5d} {f(c['p50']):>10s} {f(c['p95']):>6s} {f(s['p50']):>10s} {f(s['p95']):>6s} "
              f"{f(o['p50']):>12s} {f(o['p95']):>5s} {of_budget:>10s} {rel:>10s} {hit:>8s} "
              f"{f(r['ping_rtt_ms']['p95']) + '/' + f(r['ping_rtt_ms']['max']):>12s}")
    if args.json:
        Path(args.json).write_text(json.dumps({"budget_ms": b, "native": args.native, "results": results}, indent=1))


if __name__ == "__main__":
    main()
