"""``--pace`` over the server, on the client's clock: does the audible answer follow the simulated
deployment in the direction the simulation says?

    .venv/bin/python bench/pace.py [--slow llama-3.1-405b@h100x16] [--fast DEFAULT] [--conversation morning]

One run, three servers in turn (a separate ``wafervox serve`` process each, as in production), the
same conversation streamed to each at real-time pace by the client in this process:
  plain    the default deployment, not paced (the decode core as fast as this machine runs it)
  slow     ``--slow`` (default: Llama 3.1 405B on 16 H100 serving 64 users per step, ~21 tok/s per
           user), paced
  fast     ``--fast`` (default: this model on simulated CS-3 wafers), paced
Per configuration: the client-clock voice-to-voice (p50), the server's own figure, and what the
simulation says for the same turns (``simulated.voice_to_voice_ms``, p50).  Then the direction:
slow paced vs plain should rise as the simulation says; fast paced cannot be faster than this
machine computes in real time (the simulation's figure shows what the target would give).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _report import write_json  # noqa: E402  (beside this script: its folder is on sys.path)
from _serve import start_server, stop_server  # noqa: E402  (beside this script: its folder is on sys.path)


def p50(values):
    from voice.latency import percentile

    v = percentile([x for x in values if x is not None], 0.5)
    return None if v is None else round(v, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slow", default="llama-3.1-405b@h100x16", help="a deployment slower than this machine")
    ap.add_argument("--fast", default=None, help="a deployment faster than this machine (default: this model on CS-3)")
    ap.add_argument("--conversation", default="morning", help="sample conversation streamed (default morning)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args()

    from server.client import ClientOptions, run_client
    from voice.replay import conversation_files

    files = conversation_files(args.conversation)
    configs = [("plain", []), ("slow", ["--deployment", args.slow, "--pace"]),
               ("fast", (["--deployment", args.fast] if args.fast else []) + ["--pace"])]
    results = {}
    for name, extra in configs:
        proc, port = start_server(extra)
        try:
            turns = []
            asyncio.run(run_client(files, ClientOptions(url=f"ws://127.0.0.1:{port}/v1/realtime", tail_s=2.0),
                                   on_turn=turns.append))
        finally:
            stop_server(proc)
        sim = [t["simulated"] for t in turns if t.get("simulated")]
        results[name] = {
            "flags": extra, "turns": len(turns), "deployment": sim[0]["deployment"] if sim else None,
            "client_v2v_p50_ms": p50([t["latency_ms"]["voice_to_voice_ms"] for t in turns]),
            "server_v2v_p50_ms": p50([t["server_voice_to_voice_ms"] for t in turns]),
            "server_first_phrase_p50_ms": p50([t["latency_ms"].get("first_phrase_ms") for t in turns]),
            "simulated_v2v_p50_ms": p50([s["voice_to_voice_ms"] for s in sim]),
            "simulated_first_phrase_p50_ms": p50([s["first_phrase_ms"] for s in sim]),
        }
        r = results[name]
        print(f"{name:5s} {r['deployment']}: {r['turns']} turns, client voice-to-voice p50 {r['client_v2v_p50_ms']} ms "
              f"(server {r['server_v2v_p50_ms']}), first phrase {r['server_first_phrase_p50_ms']} ms; simulated "
              f"voice-to-voice {r['simulated_v2v_p50_ms']} ms, first phrase {r['simulated_first_phrase_p50_ms']} ms", flush=True)

    plain, slow, fast = (results[k] for k in ("plain", "slow", "fast"))

    def d(a, b):
        return None if a["client_v2v_p50_ms"] is None or b["client_v2v_p50_ms"] is None else round(
            a["client_v2v_p50_ms"] - b["client_v2v_p50_ms"], 1)

    sim_says_slow = slow["simulated_first_phrase_p50_ms"] > plain["server_first_phrase_p50_ms"]
    print(f"\nslow paced - plain: {d(slow, plain):+} ms on the client's clock (the simulation says its first phrase takes "
          f"{slow['simulated_first_phrase_p50_ms']} vs {plain['server_first_phrase_p50_ms']} ms here: "
          f"{'slower' if sim_says_slow else 'not slower'}); "
          f"slow/plain {slow['client_v2v_p50_ms'] / plain['client_v2v_p50_ms']:.2f}x")
    print(f"fast paced - plain: {d(fast, plain):+} ms (the simulation says {fast['simulated_v2v_p50_ms']} ms; in real time "
          "an answer cannot play before this machine has computed it)")
    print(f"slow paced / fast paced: {slow['client_v2v_p50_ms'] / fast['client_v2v_p50_ms']:.2f}x on the client's clock, "
          f"{slow['simulated_v2v_p50_ms'] / fast['simulated_v2v_p50_ms']:.2f}x simulated")
    write_json(args.json, results)


if __name__ == "__main__":
    main()
