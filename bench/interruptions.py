"""Speech over the agent's answer: backchannels and noises must not stop it, interruptions must, and soon.

    .venv/bin/python bench/interruptions.py [--question FILE] [--after S] [--mode pause|duck|immediate] [--json FILE]

Each case of samples/overlap/ (see ``make_overlap.py`` there: backchannels and interruptions in espeak-ng voices that
no other sample or tuning uses, a made cough and a made knock) is played over the answer to one sample question
(``--question``, default samples/visit_01_address.wav), ``--after`` seconds after the answer's first audio, through the
default engines and ``LoopConfig()`` on the virtual clock (compute charged at its measured time; ``voice.replay.
play_overlap``).  The conversation is reset before each case.

Printed per case: the outcome (``resumed``: the answer went on, no turn; ``stopped``: it was cut and the speech
answered), what the overlap was heard as, how long the voice paused, and for a stopped answer the delay from the
sound's first sample to the moment the answer's audio stopped.  Then the bars of the issue "Talks like a person":
0 answers stopped by backchannels and noises; every interruption stopped within 300 ms of its speech start.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SET = ROOT / "samples" / "overlap"
#: The issue's bars: no backchannel or noise stops the answer; an interruption stops it within 300 ms of its start.
BARS = {"resume_cases_stopped_max": 0, "interruption_stop_ms_max": 300.0}


def run_case(engines, question: Path, case: dict, after_s: float, config, lead_s: float) -> dict:
    from voice.loop_events import OutputResumed
    from voice.replay import play_overlap

    engines.llm.reset()
    loop, events, at = play_overlap(engines, question, SET / case["file"], after_s=after_s, config=config)
    start = at + lead_s  # the sound's first sample (after the file's lead silence)
    first = loop.reports[0] if loop.reports else None
    resumed = [e for e in events if isinstance(e, OutputResumed)]
    out = {"case": case["name"], "kind": case["kind"], "expected": case["expected"],
           "outcome": "stopped" if loop.barge_ins else "resumed",
           "heard_as": resumed[0].text if resumed else (loop.reports[1].transcript if len(loop.reports) > 1 else None),
           "turns": len(loop.reports), "first_reply": first.reply if first else None,
           "paused_ms": first.overlaps[0]["paused_ms"] if first and first.overlaps else None,
           "stop_ms": round((loop.barge_ins[0].stopped_s - start) * 1000, 1) if loop.barge_ins else None}
    out["ok"] = (out["outcome"] == "resumed" and out["turns"] == 1) if case["expected"] == "resume" else \
        (out["outcome"] == "stopped" and out["turns"] == 2 and out["stop_ms"] <= BARS["interruption_stop_ms_max"])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--question", type=Path, default=ROOT / "samples" / "visit_01_address.wav",
                    help="the question whose answer the cases talk over (default: %(default)s)")
    ap.add_argument("--after", type=float, default=0.6, help="seconds after the answer's first audio (default 0.6)")
    ap.add_argument("--mode", choices=("pause", "duck", "immediate"), default="pause",
                    help="the interruption policy's mode (voice.overlap; default pause)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)

    from voice.engines import load_engines
    from voice.loop import LoopConfig
    from voice.overlap import InterruptionConfig

    meta = json.loads((SET / "cases.json").read_text())
    base = LoopConfig()
    config = replace(base, interruption=replace(base.interruption, mode=args.mode) if args.mode else InterruptionConfig())
    t0 = time.perf_counter()
    engines, _ = load_engines()
    print(f"set: samples/overlap ({len(meta['cases'])} cases), question {args.question.name}, sound {args.after:g} s into "
          f"the answer, mode {args.mode}; engines loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    rows = []
    for case in meta["cases"]:
        row = run_case(engines, args.question, case, args.after, config, meta["lead_silence_s"])
        rows.append(row)
        print(f"  {row['case']:<14} {row['kind']:<12} expected {row['expected']:<9} -> {row['outcome']:<8} "
              f"heard as {row['heard_as']!r:<34} paused {row['paused_ms']} ms, stop {row['stop_ms']} ms "
              f"{'ok' if row['ok'] else 'WRONG'}", flush=True)
    resume = [r for r in rows if r["expected"] == "resume"]
    inter = [r for r in rows if r["expected"] == "interrupt"]
    stopped = sum(r["outcome"] == "stopped" for r in resume)
    stops = [r["stop_ms"] for r in inter if r["stop_ms"] is not None]
    worst = max(stops, default=None)
    summary = {"resume_cases": len(resume), "resume_cases_stopped": stopped, "interruptions": len(inter),
               "interruptions_stopped": len(stops), "interruption_stop_ms_max": worst,
               "bars": {"resume_cases_stopped": stopped <= BARS["resume_cases_stopped_max"],
                        "interruptions_stopped_in_time": len(stops) == len(inter) and worst is not None
                        and worst <= BARS["interruption_stop_ms_max"]}}
    print(f"backchannels and noises that stopped the answer: {stopped} of {len(resume)} (bar 0); interruptions stopped: "
          f"{len(stops)} of {len(inter)}, at most {worst} ms after their start (bar 300 ms)")
    if args.json:
        from bench._report import write_json

        write_json(args.json, {"summary": summary, "cases": rows, "mode": args.mode, "question": args.question.name})
    return 0 if all(summary["bars"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
