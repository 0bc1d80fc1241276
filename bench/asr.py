"""Word error per Whisper model on a set, with and without the persona's vocabulary; and our decoder vs CTranslate2's.

    .venv/bin/python bench/asr.py [--set own|heldout|human|FOLDER] [--models tiny.en,base] [--vocabulary both|on|off]
                                  [--band wide|phone|both]
    .venv/bin/python bench/asr.py --decoders [--rounds 5] [--files samples/*.wav]

**Word error** (the default): every utterance of the set (``SETS``; the name is printed first) is transcribed by each
model (``voice.asr.ASR_MODELS``) as the voice loop does (``WhisperTranscriber.transcribe``, our decoder), without and
with the default persona's vocabulary as Whisper's initial prompt (``voice.engines.vocabulary``). Printed per model and
vocabulary: the word error over the set (word edits over reference words, after ``norm_words``: numbers as digits,
"dot com" as written), per voice, the persona's words heard right (``PERSONA_WORDS`` in the references), and the median
transcription time (its cost on the critical path: the ASR runs between the endpoint and the first token). Sets:
``own`` is the samples the project was built on (samples/*.wav and samples/turntaking), ``heldout`` the held-apart
synthetic voices (samples/heldout/asr and samples/heldout/turntaking), ``human`` recordings of people
(samples/heldout/human). See samples/heldout/README.md. ``--band phone``: each utterance as a phone call carries it
and the server feeds it (``phone_band``: 8 kHz G.711 mu-law, widened to 16 kHz by ``voice.g711.BandWidener``);
``both`` prints the wideband figures and the phone's, model by model.

**Decoders** (``--decoders``): Whisper tiny.en, our decoder (voice/whisper_decoder.py, the decode core's kernels) vs
CTranslate2's, same encoder. Each round transcribes every file with both transcribers, alternating, as the voice loop
calls them (numpy's BLAS on one thread, as ``load_engines`` sets it). Per file the medians over rounds; then the
median over files of our time, theirs, and the ratio (theirs / ours, so > 1 is faster); the decoding alone by part on the first file
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


def phone_band(audio: np.ndarray) -> np.ndarray:
    """16 kHz float audio as a phone call's server hears it: down to 8 kHz, mu-law coded and decoded, widened back to
    16 kHz in 20 ms frames (``voice.g711.BandWidener``, the server's input path for ``audio/pcmu`` and the phone route)."""
    from voice import g711
    from voice.audio import resample

    pcm = np.clip(np.rint(audio * 32768), -32768, 32767).astype(np.int16)
    line = g711.mulaw_decode(g711.mulaw_encode(resample(pcm, 16000, 8000)))
    widen = g711.BandWidener()
    wide = np.concatenate([widen(line[i:i + 160]) for i in range(0, len(line), 160)])
    return wide.astype(np.float32) / 32768


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


# -- word error ------------------------------------------------------------------------------------------------------

SAMPLES = ROOT / "samples"
#: name -> the manifests whose items are (file, text) pairs
SETS = {
    "own": (SAMPLES / "manifest.json", SAMPLES / "turntaking" / "manifest.json"),
    "heldout": (SAMPLES / "heldout" / "asr" / "manifest.json", SAMPLES / "heldout" / "turntaking" / "manifest.json"),
    "human": (SAMPLES / "heldout" / "human" / "manifest.json",),
}
#: the persona's words whose hearing is counted on its own (they are in the vocabulary)
PERSONA_WORDS = ("sourdough", "croissant", "croissants", "harbor", "bright", "bakery", "maria", "maple")

_UNITS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
          "seventeen eighteen nineteen").split()
_TENS = {w: 10 * i for i, w in enumerate("_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()) if w != "_"}
_ORDINALS = {"first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7, "eighth": 8,
             "ninth": 9, "tenth": 10, "eleventh": 11, "twelfth": 12, "thirteenth": 13, "fourteenth": 14, "fifteenth": 15,
             "sixteenth": 16, "seventeenth": 17, "eighteenth": 18, "nineteenth": 19, "twentieth": 20, "thirtieth": 30}
_SAME = {"mr": "mister", "mrs": "missus", "dr": "doctor", "ok": "okay", "oh": "zero"}


def norm_words(text: str) -> list[str]:
    """A transcript's words as scored here: lower case, punctuation and hyphens as spaces, "x.com" as "x dot com",
    "$5" as "5 dollars", a few spellings made one ("mr" "mister"), numbers as digits and every number split into its
    digits, so "three one two", "312" and "three hundred twelve" differ only as speech differs ("forty two" and "42"
    are the same)."""
    import re

    t = text.lower()
    t = re.sub(r"(?<=[a-z0-9])\.(?=(com|org|net)\b)", " dot ", t)
    t = re.sub(r"\$(\d+)", r"\1 dollars", t)
    t = t.replace("@", " at ")
    t = re.sub(r"(\d)(st|nd|rd|th)\b", r"\1", t)
    t = re.sub(r"(?<=\d)[,:](?=\d)", "", t)
    raw = re.sub(r"[^a-z0-9' ]", " ", t).split()
    raw = [_SAME.get(w, w) for w in raw]
    out: list[str] = []
    i = 0
    while i < len(raw):
        w = raw[i]
        if w in _TENS or w in _UNITS or w in _ORDINALS or (w == "hundred" and out and out[-1].isdigit()):
            value = None
            if w in _TENS:
                value = _TENS[w]
                nxt = raw[i + 1] if i + 1 < len(raw) else ""
                if nxt in _UNITS and 0 < _UNITS.index(nxt) < 10:
                    value += _UNITS.index(nxt)
                    i += 1
                elif nxt in _ORDINALS and _ORDINALS[nxt] < 10:
                    value += _ORDINALS[nxt]
                    i += 1
            elif w in _UNITS:
                value = _UNITS.index(w)
            elif w in _ORDINALS:
                value = _ORDINALS[w]
            else:  # "one hundred" -> 100
                value = int(out.pop()) * 100
                nxt = raw[i + 1: i + 3]
                if nxt and nxt[0] == "and":
                    i += 1
            out.append(str(value))
        else:
            out.append(w)
        i += 1
    return [d for w in out for d in (list(w) if w.isdigit() else [w])]


def wer(reference: str, hypothesis: str) -> tuple[int, int]:
    """(word edits, reference words) under ``norm_words``."""
    from voice.replay import edit_distance

    ref = norm_words(reference)
    return edit_distance(ref, norm_words(hypothesis)), len(ref)


def set_items(name: str) -> list[tuple[Path, str, str]]:
    """(file, reference text, voice) of every utterance of the set ``name`` (or of a folder's manifest.json)."""
    import json

    manifests = SETS.get(name) or (Path(name) / "manifest.json",)
    out = []
    for m in manifests:
        if not m.is_file():
            raise SystemExit(f"--set {name}: {m} is missing")
        data = json.loads(m.read_text())
        items = data.get("items") or data.get("turns") or {}
        for file, meta in items.items():
            out.append((m.parent / file, meta["text"], meta.get("voice", "?")))
    return out


def word_error(args) -> int:
    import statistics

    from voice.asr import WhisperTranscriber
    from voice.engines import one_blas_thread, vocabulary
    from voice.llm import Persona

    one_blas_thread()
    items = set_items(args.set)
    where = SETS.get(args.set, (Path(args.set) / "manifest.json",))
    print(f"set: {args.set} ({len(items)} utterances from {', '.join(str(m.parent.relative_to(ROOT)) for m in where)})", flush=True)
    voc = vocabulary(Persona())
    modes = {"both": (False, True), "on": (True,), "off": (False,)}[args.vocabulary]
    print(f"vocabulary (the default persona's): {voc!r}")
    wide = [load(f) for f, _, _ in items]
    bands = {"wide": ("wide",), "phone": ("phone",), "both": ("wide", "phone")}[args.band]
    audio_by_band = {b: wide if b == "wide" else [phone_band(a) for a in wide] for b in bands}
    print(f"band: {', '.join(bands)}" + (" (8 kHz mu-law, widened as the server feeds it)" if "phone" in bands else ""))
    rows = []
    for model in args.models.split(","):
        t0 = time.perf_counter()
        asr = WhisperTranscriber(model=model, vocabulary=voc)
        load_s = time.perf_counter() - t0
        asr.warmup()
        for band, with_voc in ((b, v) for b in bands for v in modes):
            audios = audio_by_band[band]
            edits = words = hits = persona_total = 0
            by_voice: dict[str, list[int]] = {}
            ms = []
            for (f, ref, voice), audio in zip(items, audios):
                tr = asr.transcribe(audio, prompt=None if with_voc else "")
                ms.append(tr.compute_ms)
                e, n = wer(ref, tr.text)
                edits, words = edits + e, words + n
                v = by_voice.setdefault(voice, [0, 0])
                v[0], v[1] = v[0] + e, v[1] + n
                heard = set(norm_words(tr.text))
                for w in norm_words(ref):
                    if w in PERSONA_WORDS:
                        persona_total += 1
                        hits += w in heard
                if args.verbose:
                    print(f"  {model:7s} {band:5s} {'voc' if with_voc else '   '} {f.name:48s} {e}/{n}  {ref!r} -> {tr.text!r}")
            row = {"model": model, "band": band, "vocabulary": with_voc, "wer": edits / max(1, words), "edits": edits, "words": words,
                   "persona_hits": hits, "persona_words": persona_total, "ms_p50": statistics.median(ms),
                   "ms_p95": sorted(ms)[int(0.95 * (len(ms) - 1))], "load_s": load_s,
                   "by_voice": {k: v[0] / max(1, v[1]) for k, v in sorted(by_voice.items())}}
            rows.append(row)
            print(f"{model:8s} {band:5s} vocabulary {'on ' if with_voc else 'off'}: word error {row['wer']:.3f} ({edits}/{words}), "
                  f"persona words heard {hits}/{persona_total}, transcription p50 {row['ms_p50']:.0f} / p95 "
                  f"{row['ms_p95']:.0f} ms (load {load_s:.1f} s)", flush=True)
    print("\nword error by voice:")
    voices = sorted({v for r in rows for v in r["by_voice"]})
    heads = [f"{r['model']}{'' if r['band'] == 'wide' else '/ph'}{'+voc' if r['vocabulary'] else ''}" for r in rows]
    print(f"  {'voice':34s} " + " ".join(f"{h:>12s}" for h in heads))
    for v in voices:
        print(f"  {v:34s} " + " ".join(f"{r['by_voice'].get(v, float('nan')):12.3f}" for r in rows))
    print(f"set: {args.set}, band: {', '.join(bands)}")
    if args.json:
        import json

        Path(args.json).write_text(json.dumps({"set": args.set, "bands": bands, "vocabulary": voc, "rows": rows}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", default="own", help=f"word error on this set: {', '.join(SETS)} or a folder (default own)")
    ap.add_argument("--models", default="tiny.en", help="comma-separated Whisper models (default tiny.en)")
    ap.add_argument("--vocabulary", choices=("both", "on", "off"), default="both", help="with the persona's vocabulary or not")
    ap.add_argument("--band", choices=("wide", "phone", "both"), default="wide",
                    help="the audio as recorded (wide), as a phone call's server hears it (8 kHz mu-law, widened), or both")
    ap.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every transcript")
    ap.add_argument("--decoders", action="store_true", help="tiny.en: our decoder vs CTranslate2's (speed)")
    ap.add_argument("--rounds", type=int, default=5, help="--decoders: rounds over the files (default 5)")
    ap.add_argument("--files", nargs="*", type=Path, help="--decoders: WAV files (default: the 16 sample turns in samples/)")
    args = ap.parse_args(argv)
    if not args.decoders and not args.files:
        return word_error(args)
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
