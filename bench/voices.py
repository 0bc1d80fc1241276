"""The voices ``--voice`` can pick, timed: for every installed Piper voice (``voice.tts.installed_voices``) and
espeak-ng, the load time, the first audio of a short first phrase (what a turn's ``tts_first_audio_ms`` is made of:
p50/p95 over the phrases below, after a warm-up) and the real-time factor of whole sentences.

    .venv/bin/python bench/voices.py [--voice NAME ...] [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _report import write_json  # noqa: E402

from voice.tts import EspeakSynthesizer, PiperSynthesizer, installed_voices  # noqa: E402

PHRASES = ("Sure,", "We open at 7 am.", "It costs 2 dollars.", "Maria owns the bakery.", "We're at 12 Harbor Street.",
           "Yes,", "Delivery is free over 30 dollars.", "Good morning!")


def time_voice(make) -> dict:
    t0 = time.perf_counter()
    tts = make()
    tts.warmup() if hasattr(tts, "warmup") else None
    load_ms = (time.perf_counter() - t0) * 1000
    first, rtf = [], []
    for _ in range(2):
        for text in PHRASES:
            t = time.perf_counter()
            chunks = tts.synthesize(text)
            next(chunks)
            first.append((time.perf_counter() - t) * 1000)
            n = sum(len(c) for c in chunks)
            rtf.append((time.perf_counter() - t) / max(1e-9, n / tts.sample_rate))
    first.sort()
    return {"load_ms": round(load_ms), "first_audio_p50_ms": round(statistics.median(first), 1),
            "first_audio_p95_ms": round(first[int(0.95 * (len(first) - 1))], 1), "rtf": round(statistics.median(rtf), 3),
            "rate": tts.sample_rate}


def _maker(name: str, voices: dict):
    if name.startswith("espeak:"):
        return lambda: EspeakSynthesizer(name.split(":", 1)[1])
    return lambda: PiperSynthesizer(voice_path=voices[name])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--voice", action="append", help="a voice to time (default: every installed one, and espeak-ng)")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    voices = installed_voices()
    names = args.voice or [*sorted(voices), "espeak:en-us"]
    figures = {}
    print(f"{'voice':<24} {'load':>7} {'first audio p50':>16} {'p95':>7} {'RTF':>6} {'rate':>6}")
    for name in names:
        f = time_voice(_maker(name, voices))
        figures[name] = f
        print(f"{name:<24} {f['load_ms']:>5}ms {f['first_audio_p50_ms']:>14.1f}ms {f['first_audio_p95_ms']:>5.1f}ms "
              f"{f['rtf']:>6.3f} {f['rate']:>6}", flush=True)
    write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
