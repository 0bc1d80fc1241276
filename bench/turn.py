"""Voice-to-voice latency of the whole pipeline, replaying every sample conversation in real time.

    .venv/bin/python bench/turn.py [--fast] [--budget-ms 500] [--json FILE]

Each conversation of samples/manifest.json (the default one is a copy and is skipped)
plays at real-time pace through the default engines (webrtcvad, Whisper tiny.en, the
numba LLM, piper), exactly as ``wafervox run`` does, with the semantic end of turn
(``--turn-end silence`` for plain silence).  Prints p50/p95 of every stage and of
voice_to_voice_ms, the budget hit rate, and p50/p95 as ratios of the budget (the limit
this project holds itself to); then the critical path's own work (ASR, end-of-turn score,
ASR start to the answer's first audio) against its bars, and the end-of-turn rules fired.

Bars (issue "turn-taking and the critical path"): voice-to-voice p50 <= 350 ms, p95 <= 450
ms, >= 11 of 12 within 500 ms; critical path p50 <= 200 ms, ASR <= 80, first phrase <= 60
after the transcript, TTS first audio <= 40.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fast", action="store_true", help="virtual clock instead of real-time pacing")
    ap.add_argument("--budget-ms", type=float, default=500.0)
    ap.add_argument("--json", metavar="FILE", help="also write the reports and the summary as JSON")
    ap.add_argument("--turn-end", choices=("semantic", "silence"), default="semantic",
                    help="semantic end of turn (default) or plain 400 ms silence")
    args = ap.parse_args()

    from voice.engines import load_engines
    from voice.latency import STAGES, summarize
    from voice.loop import LoopConfig
    from voice.replay import SAMPLES, manifest, play_conversation

    config = LoopConfig(budget_ms=args.budget_ms)
    if args.turn_end == "silence":
        config = LoopConfig(budget_ms=args.budget_ms, end_of_turn=None)

    engines, load_ms = load_engines(progress=lambda m: print(m, flush=True))
    m = manifest()
    reports = []
    for name, files in m["conversations"].items():
        if name == "default":
            continue
        engines.llm.reset()
        reps, _ = play_conversation(engines, [SAMPLES / f for f in files], realtime=not args.fast,
                                    config=config)
        for r in reps:
            lat = r.latency_ms
            print(f"  {name:8s} turn {r.turn}: v2v {lat['voice_to_voice_ms'] or float('nan'):6.0f} ms  "
                  f"(endpoint {lat['endpoint_ms'] or 0:.0f}, asr {lat['asr_ms'] or 0:.0f}, "
                  f"1st phrase {lat['first_phrase_ms'] or 0:.0f}, tts {lat['tts_first_audio_ms'] or 0:.0f}; "
                  f"{(r.end_of_turn or {}).get('rule', '-')}, critical path {r.work_ms['critical_path_ms'] or float('nan'):.0f}) "
                  f"{r.mitigation:12s} {r.transcript!r} -> {r.reply!r}", flush=True)
        reports += reps
    s = summarize(reports)
    print(f"\n{len(reports)} turns, {'virtual clock' if args.fast else 'real time'}, budget {args.budget_ms:.0f} ms")
    print(f"{'stage':22s} {'p50 ms':>8s} {'p95 ms':>8s}")
    for stage in STAGES:
        p50, p95 = s[stage]["p50"], s[stage]["p95"]
        print(f"{stage:22s} {p50 if p50 is not None else float('nan'):8.0f} {p95 if p95 is not None else float('nan'):8.0f}")
    v = s["voice_to_voice_ms"]
    print(f"voice_to_voice p50 = {v['p50'] / args.budget_ms:.2f}x budget, p95 = {v['p95'] / args.budget_ms:.2f}x budget; "
          f"hit rate {s['budget_hit_rate']:.2f} ({s['within_budget']}/{s['turns']})")
    print(f"\n{'work':22s} {'p50 ms':>8s} {'p95 ms':>8s} {'bar p50':>8s}")
    for name, bar in (("asr_run_ms", 80), ("first_phrase_ms", 60), ("tts_first_audio_ms", 40), ("turn_end_score_ms", None),
                      ("critical_path_ms", 200)):
        p50, p95 = s[name]["p50"], s[name]["p95"]
        print(f"{name:22s} {p50 if p50 is not None else float('nan'):8.0f} {p95 if p95 is not None else float('nan'):8.0f} "
              f"{bar if bar else '-':>8}" + ("" if bar is None or p50 is None else f"   {p50 / bar:.2f}x bar"))
    print("end-of-turn rules: " + ", ".join(f"{k} {n}" for k, n in s["end_of_turn_rules"].items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": s, "turns": [r.to_dict() for r in reports],
                                               "load_ms": load_ms}, indent=1))


if __name__ == "__main__":
    main()
