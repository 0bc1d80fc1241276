"""End-of-turn signals side by side on the same turn-taking sets: our text head (``voice.turn_end``) and Smart Turn v3.

    .venv/bin/python bench/turn_end.py [--set own|heldout|FOLDER ...] [--head FILE ...] [--no-smart-turn] [--json FILE]

Smart Turn v3 is read from pipecat-ai's wheel (``bench/smart_turn.py``: this environment's, bench/.venv-pipecat's from
``make bench-peers-env``, or ``WAFERVOX_SMART_TURN_MODEL=FILE``).

Not the loop (``bench/turntaking.py`` plays the turns through it): the signals alone, on the moments the loop asks
them. For every item of each set (``bench/turntaking.py``'s ``SETS``; each set's name is printed):

- a paused turn at its pause: the audio up to the pause's start and 0.3 s into it (the loop's padding), transcribed by
  Whisper tiny.en as the loop does; a signal that calls it complete there would close the turn after the short
  silence and cut the user off;
- a complete turn at its end: the audio up to 0.3 s after its last voiced sample; a signal that calls it complete
  closes it after the short silence (about 200 ms), else it waits 800 ms or more.

Each head (``--head``, default the committed one) scores the transcript after the default persona's context on the
real decode core (its ``confident`` threshold, 0.6, decides "complete"); Smart Turn v3 scores the audio (0.5, as
pipecat decides). Printed per set and signal: paused turns called complete at the pause (the cut-off risk), complete
turns called complete at the end (the quick endpoints), and the median cost of one call. "both" closes early only
when our head and Smart Turn agree.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from turntaking import resolve_set  # noqa: E402

PAD_S = 0.3
#: the policy's threshold for "complete" (``TurnEndPolicy.confident``)
CONFIDENT = 0.6


def moments(set_dir: Path) -> list[dict]:
    """(file, kind, text, audio at the moment judged) of every item."""
    from voice.audio import read_wav, resample, to_float

    manifest = json.loads((set_dir / "manifest.json").read_text())["items"]
    out = []
    for name, meta in manifest.items():
        pcm, rate = read_wav(set_dir / name)
        audio = to_float(resample(pcm, rate, 16000))
        at = meta["pause"]["start_s"] if meta["kind"] == "paused" else meta["speech_end_s"]
        out.append({"file": name, "kind": meta["kind"], "text": meta["text"], "voice": meta.get("voice"),
                    "audio": audio[: int((at + PAD_S) * 16000)]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", action="append", help="a set (repeatable; default: own and heldout)")
    ap.add_argument("--head", action="append", type=Path, help="a head file (repeatable; default the committed one)")
    ap.add_argument("--no-smart-turn", action="store_true", help="our head(s) alone")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()

    from decode import Generator, Model
    from voice.asr import WhisperTranscriber
    from voice.engines import one_blas_thread
    from voice.llm import Persona
    from voice.turn_end import HEAD_PATH, TurnEndHead, TurnEndScorer, normalize

    one_blas_thread()
    heads = args.head or [HEAD_PATH]
    gen = Generator(model=Model())
    scorer = TurnEndScorer(gen)
    loaded = {str(h): TurnEndHead.load(h) for h in heads}
    context = Persona().opening()
    asr = WhisperTranscriber()
    smart = None
    if not args.no_smart_turn:
        from smart_turn import SmartTurn

        smart = SmartTurn()
        smart.warmup()
    results = {}
    for set_name in args.set or ["own", "heldout"]:
        name, folder = resolve_set(set_name)
        print(f"set: {name} ({folder})", flush=True)
        rows = []
        for m in moments(folder):
            heard = asr.transcribe(m["audio"], speculative=True).text
            row = {"file": m["file"], "kind": m["kind"], "text": m["text"], "heard": heard, "voice": m["voice"]}
            t0 = time.perf_counter()
            feats, p_token = scorer.features(context, heard or "...")
            row["score_ms"] = (time.perf_counter() - t0) * 1000
            for h, head in loaded.items():
                row[h] = head.p_end(feats)
            if smart is not None:
                row["smart_turn"] = smart.p_end(m["audio"])
                row["smart_turn_ms"] = smart.last_ms
            rows.append(row)
            cols = " ".join(f"{row[h]:.2f}" for h in loaded) + (f" st {row['smart_turn']:.2f}" if smart else "")
            print(f"  {m['file'][:44]:44s} {m['kind']:8s} {cols}  {normalize(heard)!r}", flush=True)
        summary = {}
        signals = [(Path(h).name, lambda r, h=h: r[h] >= CONFIDENT) for h in loaded]
        if smart is not None:
            signals.append(("smart-turn-v3", lambda r: r["smart_turn"] >= 0.5))
            signals += [(f"both ({Path(h).name} and smart-turn)", lambda r, h=h: r[h] >= CONFIDENT and r["smart_turn"] >= 0.5)
                        for h in loaded]
        paused = [r for r in rows if r["kind"] == "paused"]
        complete = [r for r in rows if r["kind"] == "complete"]
        for label, says_done in signals:
            cut = sum(says_done(r) for r in paused)
            quick = sum(says_done(r) for r in complete)
            summary[label] = {"paused_called_complete": cut, "paused": len(paused), "complete_called_complete": quick,
                              "complete": len(complete)}
            print(f"  {label:44s} paused called complete at the pause {cut:2d}/{len(paused)}, "
                  f"complete called complete at the end {quick:2d}/{len(complete)}")
        summary["score_ms_p50"] = statistics.median(r["score_ms"] for r in rows)
        print(f"  cost of one call, p50: our score {summary['score_ms_p50']:.0f} ms (the decode core, prefix cached)"
              + (f", Smart Turn v3 {statistics.median(r['smart_turn_ms'] for r in rows):.0f} ms" if smart else ""))
        if smart:
            summary["smart_turn_ms_p50"] = statistics.median(r["smart_turn_ms"] for r in rows)
        results[name] = {"summary": summary, "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=float))


if __name__ == "__main__":
    main()
