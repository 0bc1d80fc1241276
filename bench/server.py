"""Voice-to-voice over the websocket server, measured on the client's clock, for 1, 2 and 4
concurrent sessions replaying the sample conversations in real time.

    .venv/bin/python bench/server.py [--sessions 1 2 4] [--native] [--vs-file] [--wavs WAV...] [--busy N] [--json FILE]

Starts ``wafervox serve`` on a free loopback port (a separate process, as in production), then for
each session count runs that many ``wafervox client`` sessions at once (in this process), each
streaming a different sample conversation at real-time pace.  Per turn: the client's figure (first
answer audio sample received minus last voiced sample sent), the server's own pipeline figure
(``turn.latency``), and their difference, the server's overhead (serialisation, socket, event
loop).  Prints p50/p95 of each, the ratio to the budget and to the 1-session figure, and the
websocket ping round trip of one more, idle, connection meanwhile (how long the sessions' compute
holds up the event loop).

``--vs-file``: first, in the same run, the same recordings through the file path (``bench/turn.py``: the pipeline in
one process, no server), then each conversation in turn through one server session; prints every stage's p50 on
both and the ratio (the server's stage figures are its own ``turn.latency`` reports; voice-to-voice also on the
client's clock), flagging a stage that costs over 10% (and 10 ms) more over the server.
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

from _serve import conversations, replay_sessions, start_server, stop_server  # noqa: E402  (beside this script: its folder is on sys.path)


def q(values, p):
    from voice.latency import percentile

    v = percentile([x for x in values if x is not None], p)
    return None if v is None else round(v, 1)


async def run_sessions(n: int, url: str, convs, budget_ms: float, stagger_s: float) -> list[dict]:
    """``n`` clients at once, each streaming its own conversation (client ``i`` starts ``i * stagger_s``
    late, so that two clients replaying the same conversation do not talk in lockstep); every turn,
    tagged with its session."""
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
    plan = [(i * stagger_s, *convs[i % len(convs)]) for i in range(n)]
    turns = await replay_sessions(url, plan, budget_ms, label=f"{n} sessions")
    done.set()
    return turns, await prober


STAGES = ("endpoint_ms", "asr_ms", "llm_first_token_ms", "first_phrase_ms", "tts_first_audio_ms", "hold_ms", "voice_to_voice_ms")


def vs_file(url: str, convs, args) -> dict:
    """The same recordings through the file path (a ``bench/turn.py`` process) and through one server session per
    conversation, one after another; every stage's p50 on each and their ratio."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "file.json"
        cmd = [sys.executable, str(ROOT / "bench" / "turn.py"), "--budget-ms", str(args.budget_ms), "--json", str(out)]
        if args.wavs:
            cmd += ["--wavs", *args.wavs]
        print("file path: " + " ".join(Path(c).name if c.endswith(".py") else c for c in cmd[1:]), flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True)
        file_turns = json.loads(out.read_text())["turns"]["this run"]
    server_turns = []
    for name, files in convs:
        server_turns += asyncio.run(replay_sessions(url, [(0.0, name, files)], args.budget_ms, label="1 session"))
    rows = {}
    for stage in STAGES:
        f = q([t["latency_ms"][stage] for t in file_turns], 0.5)
        key = (lambda t: t["server_voice_to_voice_ms"]) if stage == "voice_to_voice_ms" else (lambda t, k=stage: t["latency_ms"][k])
        sv = q([key(t) for t in server_turns], 0.5)
        rows[stage] = {"file_p50": f, "server_p50": sv}
    rows["client_voice_to_voice_ms"] = {"file_p50": rows["voice_to_voice_ms"]["file_p50"],
                                        "server_p50": q([t["latency_ms"]["voice_to_voice_ms"] for t in server_turns], 0.5)}
    print(f"\nthe same recordings, file path vs one server session (p50, ms; {len(file_turns)} and {len(server_turns)} turns)")
    print(f"{'stage':26s} {'file':>7s} {'server':>7s} {'ratio':>6s}")
    for stage, r in rows.items():
        f, sv = r["file_p50"], r["server_p50"]
        ratio = None if not f or sv is None else sv / f
        r["ratio"] = None if ratio is None else round(ratio, 2)
        over = f is not None and sv is not None and sv > 1.1 * f and sv - f > 10
        fmt = lambda v: "-" if v is None else f"{v:.0f}"
        print(f"{stage:26s} {fmt(f):>7s} {fmt(sv):>7s} {'-' if ratio is None else f'{ratio:.2f}x':>6s}{'  over 10%' if over else ''}")
    return {"stages": rows, "file_turns": file_turns, "server_turns": server_turns}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, nargs="*", default=[1, 2, 4],
                    help="concurrent session counts (default 1 2 4; none: only --vs-file)")
    ap.add_argument("--native", action="store_true", help="use /v1/stream (binary PCM) instead of /v1/realtime")
    ap.add_argument("--budget-ms", type=float, default=500.0)
    ap.add_argument("--stagger-s", type=float, default=0.7, help="start offset between clients (default 0.7 s)")
    ap.add_argument("--wavs", nargs="+", metavar="WAV", help="replay these recordings (one conversation, in this order) "
                    "instead of the sample conversations")
    ap.add_argument("--vs-file", action="store_true", help="first the same recordings through the file path and one server "
                    "session, stage by stage (see above)")
    ap.add_argument("--busy", type=int, default=0, metavar="N",
                    help="N busy processes (a spinning loop each, default priority) beside the sessions (default 0)")
    ap.add_argument("--json", metavar="FILE", help="also write every turn and the summary as JSON")
    args = ap.parse_args()
    if not 0 <= args.busy <= 16:
        ap.error("--busy takes 0 to 16 processes")
    from turn import BusyNeighbours  # (beside this script)

    convs = conversations(args.wavs)
    proc, port = start_server(["--max-sessions", str(max(args.sessions, default=1) + 1)])  # + the ping probe
    url = f"ws://127.0.0.1:{port}/v1/{'stream' if args.native else 'realtime'}"
    print(f"server on port {port}; {url}", flush=True)
    results, versus = {}, None
    busy = BusyNeighbours(args.busy)
    try:
        busy.__enter__()  # (once the server is up: its engines load as on an idle machine)
        if args.vs_file:
            versus = vs_file(url, convs, args)
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
        busy.__exit__(None, None, None)
        stop_server(proc)

    b = args.budget_ms
    first = results.get(args.sessions[0], {}) if args.sessions else {}
    base = first.get("client_v2v_ms", {}).get("p50")
    print(f"\nvoice-to-voice on the client's clock over loopback ({'native /v1/stream' if args.native else '/v1/realtime'}), "
          f"budget {b:.0f} ms" + (f", beside {args.busy} busy process(es)" if args.busy else ""))
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
        Path(args.json).write_text(json.dumps({"budget_ms": b, "native": args.native, "results": results, "vs_file": versus,
                                           "busy": args.busy}, indent=1))


if __name__ == "__main__":
    main()
