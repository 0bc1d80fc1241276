"""Build the turn-taking set in samples/turntaking/: user turns with a pause inside, and complete turns.

Run from the repository root:

    .venv/bin/python samples/make_turntaking.py [--check]

Every WAV in samples/turntaking/ and its manifest.json are rewritten (WAVs no longer made are
deleted). The output is deterministic: the synthesis helpers are the ones samples/make_samples.py
uses (piper seeded before each fresh voice load, espeak-ng deterministic), and each item's noise
has its own numpy seed. ``--check`` also transcribes every file with Whisper tiny.en (the
project's ASR) and prints the transcripts next to the texts; it changes nothing.

Two kinds of item, one user turn each, 16 kHz mono PCM16:

- ``paused``: a turn said in two parts with a 400-800 ms silence inside it, the way people pause
  (a number read in groups, "um" and thinking, a list, "I'd like to order ... two croissants").
  The parts are synthesized separately, trimmed to their voiced span, and joined with exactly
  ``pause_ms`` of silence: the pause's bounds in the manifest are exact from construction.
- ``complete``: a complete question or statement, short ones included ("Thank you.").

The label is what the user means: a paused item is one turn (an agent that answers at its pause
cut the user off); a complete item's turn is over at its last voiced sample.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

HERE = Path(__file__).resolve().parent
OUT = HERE / "turntaking"
sys.path.insert(0, str(HERE.parent))

from samples.make_samples import pink_noise, resample, rms, synth_espeak, synth_piper, synth_text, trim  # noqa: E402

RATE = 16000

#: Voices, cycled over the items: (engine, speed, espeak voice). Piper's speed is its length_scale
#: (larger = slower), espeak-ng's is words per minute.
VOICES = (
    ("piper", 1.0, ""),
    ("espeak", 150, "en-us"),
    ("piper", 0.9, ""),
    ("espeak", 130, "en-gb"),
    ("piper", 1.15, ""),
    ("espeak", 130, "en-us+f3"),
    ("piper", 1.3, ""),
    ("espeak", 130, "en-us+m3"),
)

#: Noise conditions, cycled over the items (a cycle of 6 against 8 voices: each voice meets several
#: noise conditions). Levels are absolute: the RMS of the noise in dBFS, full scale = 1.0 (a full-scale sine
#: is -3 dBFS by this measure). The speech peaks at 0.5-0.8, its active RMS is about -20 dBFS.
NOISES = (
    ("none", None),
    ("white", -50.0),
    ("pink", -50.0),
    ("none", None),
    ("white", -40.0),
    ("pink", -40.0),
)

PEAKS = (0.7, 0.55, 0.8, 0.6, 0.5, 0.75)  # speech peak level, cycled

# One user turn said in two parts, with a pause between them.
PAUSED: tuple[tuple[str, str], ...] = (
    ("My number is five five five,", "one two three four."),
    ("So, um,", "I'd like to order a cake."),
    ("I'd like to order", "two croissants."),
    ("Can I get a sourdough loaf,", "and two croissants?"),
    ("I need two baguettes,", "a rye loaf, and six rolls."),
    ("The order is for", "Saturday at noon."),
    ("My name is", "Anna Miller."),
    ("Um, let me think,", "what time do you close today?"),
    ("Could you tell me", "if you deliver to Elm Street?"),
    ("I want a birthday cake for", "twelve people."),
    ("The address is twenty four,", "Maple Avenue."),
    ("Hmm,", "do you have gluten free bread?"),
    ("I'd like to pick it up", "tomorrow morning."),
    ("My card number ends in four two,", "seven nine."),
    ("Can you put it under", "the name Johnson?"),
    ("We need, uh,", "three dozen bagels for the office."),
    ("Is the bakery open on", "Monday mornings?"),
    ("And also,", "a box of cinnamon rolls."),
    ("So what I'm looking for is", "a chocolate cake with no nuts."),
    ("The phone number is two zero two,", "five five five, zero one nine eight."),
    ("I'd like", "a dozen chocolate chip cookies."),
    ("I was wondering,", "how much is a sourdough loaf?"),
    ("Um,", "where are you located?"),
    ("Let me see, I'll take", "four croissants and a coffee."),
)

# Complete turns: the bakery's callers first, a few general requests last.
COMPLETE: tuple[str, ...] = (
    "Thank you.",
    "Yes, please.",
    "That's all.",
    "I need two loaves of sourdough.",
    "What time do you close on Sunday?",
    "Do you deliver?",
    "Are you open on Mondays?",
    "How much is a croissant?",
    "Where are you located?",
    "Can I order a birthday cake?",
    "No, that's everything.",
    "Who is the owner?",
    "Do you have any gluten free bread?",
    "I'd like to pick up my order.",
    "Great, see you then.",
    "Okay.",
    "Perfect, thanks.",
    "Is delivery free?",
    "What is the capital of France?",
    "Set a timer for ten minutes.",
    "Tell me a joke.",
    "How far away is the moon?",
)


@dataclass(frozen=True)
class Item:
    file: str
    kind: str  # "paused" or "complete"
    parts: tuple[str, ...]
    pause_ms: int | None  # the silence between the two parts (paused items)
    engine: str
    speed: float
    espeak_voice: str
    noise: str
    noise_dbfs: float | None
    peak: float
    seed: int
    lead_s: float = 0.4
    trail_s: float = 0.9

    @property
    def text(self) -> str:
        return " ".join(self.parts)

    @property
    def voice(self) -> str:
        if self.engine == "piper":
            return f"piper-joe-{float(self.speed)}"
        return f"espeak-{self.espeak_voice}-{int(self.speed)}"


def slug(text: str, words: int = 4) -> str:
    clean = "".join(c if c.isalnum() else " " for c in text.lower()).split()
    return "_".join(clean[:words])


def pause_lengths(n: int, lo_ms: int = 400, hi_ms: int = 800, seed: int = 7) -> list[int]:
    """n pause lengths spread evenly over ``lo_ms``-``hi_ms`` (both ends included, in 10 ms), in a seeded order."""
    lengths = np.round(np.linspace(lo_ms, hi_ms, n) / 10).astype(int) * 10
    return [int(x) for x in np.random.default_rng(seed).permutation(lengths)]


def items() -> list[Item]:
    out = []
    pauses = pause_lengths(len(PAUSED))
    for i, (a, b) in enumerate(PAUSED):
        engine, speed, ev = VOICES[i % len(VOICES)]
        noise, dbfs = NOISES[i % len(NOISES)]
        out.append(Item(f"paused_{i + 1:02d}_{slug(a + ' ' + b)}.wav", "paused", (a, b), pauses[i], engine, speed, ev,
                        noise, dbfs, PEAKS[i % len(PEAKS)], seed=1000 + i))
    for i, text in enumerate(COMPLETE):
        # Offset by 3 so that the complete half does not pair the same texts' positions with the same voices.
        engine, speed, ev = VOICES[(i + 3) % len(VOICES)]
        noise, dbfs = NOISES[i % len(NOISES)]
        out.append(Item(f"complete_{i + 1:02d}_{slug(text)}.wav", "complete", (text,), None, engine, speed, ev,
                        noise, dbfs, PEAKS[(i + 2) % len(PEAKS)], seed=2000 + i))
    return out


# --------------------------------------------------------------------------- building


def synth_part(text: str, item: Item) -> np.ndarray:
    """One part: synthesized, trimmed, scaled to the item's peak, resampled to RATE, trimmed again."""
    say = synth_text(text)
    if item.engine == "piper":
        raw, src = synth_piper(say, item.speed)
    else:
        raw, src = synth_espeak(say, item.espeak_voice, int(item.speed))
    speech = trim(raw)
    return trim(resample(speech / np.abs(speech).max() * item.peak, src, RATE))


def noise_signal(kind: str, dbfs: float, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) if kind == "white" else pink_noise(n, RATE, rng)
    return x / rms(x) * 10 ** (dbfs / 20)


def sec(sample: int) -> float:
    """A sample position in seconds (exact: 1/16000 s has 7 decimals)."""
    return round(sample / RATE, 7)


def build(item: Item) -> tuple[np.ndarray, dict]:
    parts = [synth_part(t, item) for t in item.parts]
    lead = int(round(item.lead_s * RATE))
    trail = int(round(item.trail_s * RATE))
    pieces = [np.zeros(lead), parts[0]]
    spans = [(lead, lead + len(parts[0]))]  # [first voiced sample, one past the last) of each part
    pause = None
    if len(parts) == 2:
        gap = int(round(item.pause_ms * RATE / 1000))
        start = spans[0][1] + gap
        spans.append((start, start + len(parts[1])))
        pause = {"start_s": sec(spans[0][1]), "end_s": sec(start), "ms": round(gap * 1000 / RATE, 3)}
        pieces += [np.zeros(gap), parts[1]]
    pos = spans[-1][1]
    pieces.append(np.zeros(trail))
    out = np.concatenate(pieces)
    if item.noise != "none":
        out = out + noise_signal(item.noise, item.noise_dbfs, len(out), item.seed)
    out = np.clip(out, -1.0, 1.0)
    meta = {
        "kind": item.kind,
        "text": item.text,
        "parts": list(item.parts),
        "synth_parts": [synth_text(t) for t in item.parts],
        "pause": pause,
        "part_spans_s": [[sec(a), sec(b)] for a, b in spans],
        "speech_start_s": sec(lead),
        "speech_end_s": sec(pos),
        "duration_s": sec(len(out)),
        "rate": RATE,
        "channels": 1,
        "voice": item.voice,
        "engine": item.engine,
        "speed": item.speed,
        "peak": item.peak,
        "noise": item.noise,
        "noise_dbfs": item.noise_dbfs,
        "noise_seed": item.seed if item.noise != "none" else None,
    }
    return out, meta


def check(manifest: dict) -> None:
    """Print Whisper tiny.en's transcript of every file beside its text (not part of any test)."""
    from voice.asr import WhisperTranscriber
    from voice.audio import read_wav, to_float

    asr = WhisperTranscriber()
    for name, meta in manifest["items"].items():
        pcm, _ = read_wav(OUT / name)
        heard = asr.transcribe(to_float(pcm)).text.strip()
        print(f"{name:52s} {meta['text']!r:50s} -> {heard!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="also transcribe every file with Whisper tiny.en")
    args = ap.parse_args()

    OUT.mkdir(exist_ok=True)
    metas: dict[str, dict] = {}
    for item in items():
        audio, meta = build(item)
        sf.write(OUT / item.file, audio, RATE, subtype="PCM_16", format="WAV")
        metas[item.file] = meta
        p = meta["pause"]
        where = f"pause {p['start_s']:.3f}-{p['end_s']:.3f} ({p['ms']:.0f} ms)" if p else ""
        print(f"{item.file:52s} {meta['duration_s']:5.2f} s speech {meta['speech_start_s']:.3f}-{meta['speech_end_s']:.3f} "
              f"{where:32s} {meta['voice']:22s} {item.noise} {item.noise_dbfs or ''}", flush=True)
    for stale in sorted(OUT.glob("*.wav")):
        if stale.name not in metas:
            stale.unlink()
    manifest = {
        "description": "turn-taking set: one user turn per file; 'paused' turns have a 400-800 ms silence inside, "
                       "'complete' turns are over at speech_end_s (see README.md)",
        "rate": RATE,
        "items": metas,
    }
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    total = sum(p.stat().st_size for p in OUT.iterdir() if p.is_file())
    counts = {k: sum(m["kind"] == k for m in metas.values()) for k in ("paused", "complete")}
    print(f"wrote {len(metas)} files ({counts['paused']} paused, {counts['complete']} complete) and manifest.json; "
          f"samples/turntaking/ total {total / 1e6:.2f} MB")
    if args.check:
        check(manifest)


if __name__ == "__main__":
    main()
