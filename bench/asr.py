"""Whisper tiny.en: our decoder (voice/whisper_decoder.py, the decode core's kernels) vs CTranslate2's, same encoder.

    .venv/bin/python bench/asr.py [--rounds 5] [--files samples/*.wav]

Each round transcribes every file with both transcribers, alternating, as the voice loop calls them (numpy's BLAS
on one thread, as ``load_engines`` sets it). Per file the medians over rounds; then the median over files of our
time, theirs, and the ratio (theirs / ours, so > 1 is faster); the decoding alone by part on the first file
(encoder, cross keys and values, the greedy steps); and how many transcripts are the same.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def load(path: Path) -> np.ndarray:
    import soundfile as sf
    from scipy.signal import resample_poly

    audio, rate = sf.read(path, dtype="float32", always_2d=True)
    audio = audio[:, 0]
    return audio if rate == 16000 else resample_poly(audio, 16000, rate).astype(np.float32)


def by_part(ours, audio: np.ndarray, rounds: int) -> dict[str, float]:
    """Median ms of the encoder, the cross keys/values and the greedy steps of our decoder on ``audio``."""
    import ctranslate2

    from voice.asr import window_for
    from voice.whisper_decoder import greedy

    lead = np.zeros(round(ours.lead_pad_s * 16000), np.float32)
    samples = np.concatenate([lead, audio])
    feats = ours.model.feature_extractor(samples)
    window = window_for(len(samples) / 16000, min_window_s=ours.min_window_s, pad_s=ours.pad_s, step_s=ours.step_s)
    frames = round(window * 100)
    win = np.ascontiguousarray(np.pad(feats[:, :frames], ((0, 0), (0, max(0, frames - feats.shape[1]))))[None])
    tk = ours.tokenizer
    parts: dict[str, list[float]] = {"encoder": [], "cross_kv": [], "greedy": []}
    steps = 0
    for _ in range(rounds):
        t0 = time.perf_counter()
        enc = np.asarray(ours.model.model.encode(ctranslate2.StorageView.from_array(win)))
        t1 = time.perf_counter()
        ours.decoder.start(enc)
        t2 = time.perf_counter()
        g = greedy(ours.decoder, list(tk.sot_sequence), 100, eot=tk.eot, ts_begin=tk.timestamp_begin,
                   no_timestamps=tk.no_timestamps, no_speech=tk.no_speech, blank=ours._blank, suppress=ours._suppress,
                   logprob_below=ours.no_speech_threshold)
        t3 = time.perf_counter()
        steps = len(g.tokens) + 1
        for k, (a, b) in zip(parts, ((t0, t1), (t1, t2), (t2, t3)), strict=True):
            parts[k].append((b - a) * 1000)
    out = {k: statistics.median(v) for k, v in parts.items()}
    out["steps"] = steps
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="rounds over the files (default 5)")
    ap.add_argument("--files", nargs="*", type=Path, help="WAV files (default: the 16 sample turns in samples/)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    files = args.files or sorted((ROOT / "samples").glob("*.wav"))
    if not files:
        ap.error("no WAV files")

    from voice.asr import WhisperTranscriber
    from voice.engines import one_blas_thread

    one_blas_thread()
    print("loading both transcribers", flush=True)
    ours = WhisperTranscriber()
    theirs = WhisperTranscriber(decoder="ctranslate2")
    audios = [load(f) for f in files]
    for a in audios[:2]:
        ours.transcribe(a), theirs.transcribe(a)
    t_ours: list[list[float]] = [[] for _ in files]
    t_theirs: list[list[float]] = [[] for _ in files]
    same = 0
    for r in range(args.rounds):
        for i, a in enumerate(audios):
            x, y = ours.transcribe(a), theirs.transcribe(a)
            t_ours[i].append(x.compute_ms)
            t_theirs[i].append(y.compute_ms)
            if r == 0:
                same += x.text == y.text
        print(f"round {r + 1}/{args.rounds}", flush=True)
    mo = [statistics.median(v) for v in t_ours]
    mt = [statistics.median(v) for v in t_theirs]
    ratio = statistics.median(b / a for a, b in zip(mo, mt, strict=True))
    print(f"\n{len(files)} files, {args.rounds} rounds; window {ours.min_window_s:g} s min + {ours.pad_s:g} s pad")
    print(f"transcript ms, median over files: ours {statistics.median(mo):.1f}  CTranslate2 {statistics.median(mt):.1f}"
          f"  ratio {ratio:.2f}x")
    print(f"same transcript: {same} of {len(files)}")
    p = by_part(ours, audios[0], max(5, args.rounds))
    print(f"by part ({files[0].name}): encoder {p['encoder']:.1f} ms, cross keys/values {p['cross_kv']:.1f} ms, "
          f"{p['steps']} decoder steps {p['greedy']:.1f} ms ({p['greedy'] / p['steps']:.2f} ms a step)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
