"""Build the held-apart evaluation sets in samples/heldout/: data that no tuning, training or threshold touches.

Run from the repository root:

    .venv/bin/python samples/heldout/make_heldout.py [--check] [--human-from DIR ...]

Two synthetic sets are rewritten (their FLAC files and manifest.json; files no longer made are deleted):

- ``turntaking/``: one user turn per file, as samples/turntaking/ but with other texts, other voices, other noise:
  ``paused`` turns said in two parts with a 500-800 ms silence inside (lists, addresses, numbers, "let me think",
  spelled names) and ``complete`` turns (questions, and a few short statements);
- ``asr/``: utterances with their transcripts, many with the persona's proper nouns and products ("sourdough loaf",
  "Harbor Street", "Maple Street", "example dot com").

The voices are espeak-ng voices and variants that neither ``samples/make_samples.py`` nor
``samples/make_turntaking.py`` use (those use piper's joe voice and espeak-ng ``en-us`` 150 wpm, ``en-gb``,
``en-us+f3``, ``en-us+m3`` at 130 wpm), at other speeds, speech levels and noise kinds (brown, babble, mains hum,
a reverberant room, a telephone band at 8 kHz, white noise louder than the own set's). ``voice/turn_end_train.py``
reads the texts of every set here and leaves them out of its training set.

``human/`` holds real recordings of people, copied from the public test data of packages (see README.md); it is
rewritten only with ``--human-from DIR``, DIR being an unpacked pocketsphinx source distribution or an unpacked
useful-moonshine-onnx wheel (several may be given). The output is deterministic: espeak-ng is, and every noise has
its own numpy seed. ``--check`` prints Whisper tiny.en's transcript of every file beside its text (changes nothing).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
from scipy.signal import butter, fftconvolve, sosfilt

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from samples.make_samples import pink_noise, resample, rms, synth_espeak, trim  # noqa: E402
from samples.make_turntaking import pause_lengths, slug  # noqa: E402

RATE = 16000

#: (espeak-ng voice with its variant, words per minute): none of them in the own sets or the training set.
VOICES = (
    ("en-gb-scotland+m1", 145),
    ("en-us+f2", 165),
    ("en-029+m4", 140),
    ("en-gb-x-rp+f4", 155),
    ("en-us-nyc+m7", 175),
    ("en-gb-x-gbclan+m2", 135),
    ("en-us+f5", 120),
    ("en-gb-x-gbcwmd+m6", 160),
)

#: Recording conditions, cycled over the items (6 against 8 voices: each voice meets several). Levels are absolute
#: (the noise's RMS in dBFS, full scale 1.0), as in samples/turntaking; the speech's active RMS is about -20 dBFS.
CONDITIONS = (
    ("clean", None),
    ("white", -38.0),  # louder than any of the own set's (-40 and -50)
    ("brown", -40.0),  # 1/f^2: rumble, traffic
    ("babble", -46.0),  # far-away voices: other utterances, reversed, overlapped
    ("hum", -42.0),  # mains hum, 50 Hz and its harmonics
    ("room", None),  # a reverberant room (RT60 about 0.45 s)
    ("phone", None),  # a telephone band, 300-3400 Hz, stored at 8 kHz
)

PEAKS = (0.35, 0.6, 0.8, 0.45, 0.7, 0.55)  # the speech's peak level, cycled (a quieter talker than the own set's)

# One user turn said in two parts (none of these texts is in samples/turntaking or voice/turn_end_train.py).
PAUSED: tuple[tuple[str, str], ...] = (
    ("I need bread, milk,", "and some eggs."),
    ("The address is twelve,", "Harbor Street."),
    ("I want to book a table for", "four people."),
    ("My phone number is three one two,", "four four seven, nine nine zero one."),
    ("Let me think,", "I'll take the rye bread."),
    ("My last name is spelled K,", "O, W, A, L, S, K, I."),
    ("The zip code is six zero,", "six one four."),
    ("Send it to forty two", "Maple Street, apartment B."),
    ("I'd like a sourdough loaf,", "a dozen bagels, and a pie."),
    ("My email is jane", "at example dot com."),
    ("Hmm, let me think about it,", "maybe the lemon tart."),
    ("We'll be there around", "half past six."),
    ("The reservation is under Garcia,", "G, A, R, C, I, A."),
    ("Can you deliver to", "eighteen Oak Lane on Friday?"),
    ("I'll need three baguettes,", "two muffins, and a coffee."),
    ("My account number is seven seven,", "three eight, one two."),
    ("Okay so, um,", "how late are you open tonight?"),
    ("It's for my son's party on", "the fourteenth of May."),
    ("The card number ends in", "five five eight one."),
    ("Put that under the name", "Olivia Brown."),
    ("Let me see,", "do you have any rye bread left?"),
    ("I'm at one hundred", "Pine Road, unit four."),
    ("Could I get the apple pie,", "and the carrot cake as well?"),
    ("Give me a second, I'm looking for", "my order number."),
)

# Complete turns: questions first, then a few short statements.
COMPLETE: tuple[str, ...] = (
    "Do you sell sourdough loaves?",
    "What's your phone number?",
    "Is there a bakery on Maple Street?",
    "Can I pay by card?",
    "How much is a dozen bagels?",
    "Are you open this Sunday?",
    "Do you have anything sugar free?",
    "What time do you close tonight?",
    "Where can I park?",
    "Can I get a coffee to go?",
    "Do you bake wedding cakes?",
    "Is the rye bread fresh today?",
    "Who bakes the bread?",
    "How long is the wait?",
    "Do you take orders by email?",
    "What's in the lemon tart?",
    "Thanks, that's everything.",
    "No, that's fine.",
    "Sounds great, thank you.",
    "Can you spell that for me?",
)

# The ASR set: the persona's proper nouns and products (Bright Bakery, Harbor Street, sourdough loaf, croissant,
# Maria), and names and addresses a caller gives.
ASR_TEXTS: tuple[str, ...] = (
    "Can I get a sourdough loaf and two croissants?",
    "Is Bright Bakery on Harbor Street?",
    "Who owns the bakery?",
    "Is Maria there today?",
    "My email is anna at example dot com.",
    "I live at fourteen Maple Street.",
    "How much is the sourdough loaf?",
    "Do you deliver to Maple Street?",
    "Is the bakery open on Mondays?",
    "I'd like to order a dozen croissants for Saturday.",
    "Please send the receipt to tom at example dot com.",
    "What is the address of Bright Bakery?",
    "Can Maria call me back?",
    "Two sourdough loaves, please.",
    "Is delivery free over thirty dollars?",
    "I'm on Harbor Street near the ferry.",
    "Do you have a croissant with almonds?",
    "What time does Bright Bakery close?",
    "My name is Priya Natarajan.",
    "Is it twelve Harbor Street or twenty?",
    "I'll pick up the sourdough at noon.",
    "Could you spell Maple Street for me?",
    "Do you open at seven on Sunday?",
    "Send a croissant and a sourdough loaf to Maple Street.",
)

# Babble: these sentences, reversed and overlapped, are the far-away voices.
BABBLE_TEXTS = ("The weather is nice today and the park is full.", "We should meet again next week for lunch.",
                "Did you see the game last night on television?", "She bought a new car and drove it to the coast.")


@dataclass(frozen=True)
class Item:
    file: str
    kind: str  # "paused", "complete" or "asr"
    parts: tuple[str, ...]
    pause_ms: int | None
    espeak_voice: str
    wpm: int
    condition: str
    level_dbfs: float | None
    peak: float
    seed: int
    lead_s: float = 0.4
    trail_s: float = 0.9

    @property
    def text(self) -> str:
        return " ".join(self.parts)

    @property
    def voice(self) -> str:
        return f"espeak-{self.espeak_voice}-{self.wpm}"


def turntaking_items() -> list[Item]:
    out = []
    pauses = pause_lengths(len(PAUSED), 500, 800, seed=28)
    for i, (a, b) in enumerate(PAUSED):
        voice, wpm = VOICES[i % len(VOICES)]
        cond, level = CONDITIONS[i % len(CONDITIONS)]
        out.append(Item(f"paused_{i + 1:02d}_{slug(a + ' ' + b)}.flac", "paused", (a, b), pauses[i], voice, wpm, cond, level,
                        PEAKS[i % len(PEAKS)], seed=5000 + i))
    for i, text in enumerate(COMPLETE):
        voice, wpm = VOICES[(i + 3) % len(VOICES)]
        cond, level = CONDITIONS[(i + 2) % len(CONDITIONS)]
        out.append(Item(f"complete_{i + 1:02d}_{slug(text)}.flac", "complete", (text,), None, voice, wpm, cond, level,
                        PEAKS[(i + 1) % len(PEAKS)], seed=6000 + i))
    return out


def asr_items() -> list[Item]:
    out = []
    for i, text in enumerate(ASR_TEXTS):
        voice, wpm = VOICES[(i + 5) % len(VOICES)]
        cond, level = CONDITIONS[(i + 4) % len(CONDITIONS)]
        out.append(Item(f"asr_{i + 1:02d}_{slug(text)}.flac", "asr", (text,), None, voice, wpm, cond, level,
                        PEAKS[(i + 3) % len(PEAKS)], seed=7000 + i, lead_s=0.3, trail_s=0.5))
    return out


# --------------------------------------------------------------------------- building


def speak(text: str, voice: str, wpm: int, peak: float) -> np.ndarray:
    raw, src = synth_espeak(text, voice, wpm)
    speech = trim(raw)
    return trim(resample(speech / np.abs(speech).max() * peak, src, RATE))


def brown_noise(n: int, rng: np.random.Generator) -> np.ndarray:
    """1/f^2 noise from 30 Hz up."""
    spec = np.fft.rfft(rng.standard_normal(n))
    f = np.fft.rfftfreq(n, 1 / RATE)
    x = np.fft.irfft(spec / np.maximum(f, 30.0) * (f >= 30.0), n)
    return x / rms(x)


def hum(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n) / RATE
    phases = rng.uniform(0, 2 * np.pi, 6)
    x = sum(np.sin(2 * np.pi * 50 * k * t + phases[k - 1]) / k for k in range(1, 7))
    return x / rms(x)


def babble(n: int, rng: np.random.Generator) -> np.ndarray:
    """Far-away talk: the babble sentences by four voices, reversed (no words to transcribe), looped at random offsets."""
    x = np.zeros(n)
    for k, text in enumerate(BABBLE_TEXTS):
        voice, wpm = VOICES[(2 * k + 1) % len(VOICES)]
        s = speak(text, voice, wpm, 0.5)[::-1]
        loop = np.resize(np.concatenate([s, np.zeros(int(0.3 * RATE))]), n + len(s))
        start = int(rng.integers(0, len(s)))
        x += loop[start : start + n]
    return x / rms(x)


def room(x: np.ndarray, rng: np.random.Generator, rt60: float = 0.45) -> np.ndarray:
    """``x`` in a reverberant room: convolved with exponentially decaying noise (the direct sound at 1), then scaled
    back to the dry peak."""
    n = int(rt60 * RATE)
    t = np.arange(n) / RATE
    ir = rng.standard_normal(n) * np.exp(-6.9 * t / rt60) * 0.12
    ir[: int(0.002 * RATE)] = 0.0  # the first reflections arrive after the direct sound
    ir[0] = 1.0
    wet = fftconvolve(x, ir)[: len(x)]
    return wet / np.abs(wet).max() * np.abs(x).max()


def phone(x: np.ndarray) -> tuple[np.ndarray, int]:
    """A telephone band (300-3400 Hz), at 8 kHz."""
    sos = butter(6, (300, 3400), btype="bandpass", fs=RATE, output="sos")
    return resample(sosfilt(sos, x), RATE, 8000), 8000


def noise_signal(kind: str, dbfs: float, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    make = {"white": lambda: rng.standard_normal(n), "pink": lambda: pink_noise(n, RATE, rng),
            "brown": lambda: brown_noise(n, rng), "hum": lambda: hum(n, rng), "babble": lambda: babble(n, rng)}[kind]
    x = make()
    return x / rms(x) * 10 ** (dbfs / 20)


def sec(sample: int, rate: int = RATE) -> float:
    return round(sample / rate, 7)


def build(item: Item) -> tuple[np.ndarray, int, dict]:
    parts = [speak(t, item.espeak_voice, item.wpm, item.peak) for t in item.parts]
    lead, trail = int(round(item.lead_s * RATE)), int(round(item.trail_s * RATE))
    pieces = [np.zeros(lead), parts[0]]
    spans = [(lead, lead + len(parts[0]))]
    pause = None
    if len(parts) == 2:
        gap = int(round(item.pause_ms * RATE / 1000))
        start = spans[0][1] + gap
        spans.append((start, start + len(parts[1])))
        pause = {"start_s": sec(spans[0][1]), "end_s": sec(start), "ms": round(gap * 1000 / RATE, 3)}
        pieces += [np.zeros(gap), parts[1]]
    pieces.append(np.zeros(trail))
    out = np.concatenate(pieces)
    rng = np.random.default_rng(item.seed)
    rate = RATE
    if item.condition == "room":
        out = room(out, rng)
    elif item.condition == "phone":
        out, rate = phone(out)
    elif item.condition != "clean":
        out = out + noise_signal(item.condition, item.level_dbfs, len(out), item.seed)
    out = np.clip(out, -1.0, 1.0)
    meta = {
        "kind": item.kind,
        "text": item.text,
        "parts": list(item.parts),
        "pause": pause,
        "part_spans_s": [[sec(a), sec(b)] for a, b in spans],
        "speech_start_s": sec(lead),
        "speech_end_s": sec(spans[-1][1]),
        "duration_s": sec(len(out), rate),
        "rate": rate,
        "channels": 1,
        "voice": item.voice,
        "engine": "espeak",
        "speed": item.wpm,
        "peak": item.peak,
        "condition": item.condition,
        # bench/turntaking.py's fields: the noise's kind and level (null for room, phone and clean)
        "noise": "none" if item.level_dbfs is None else item.condition,
        "noise_dbfs": item.level_dbfs,
        "seed": item.seed,
    }
    return out, rate, meta


def write_set(folder: Path, items: list[Item], description: str) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    metas: dict[str, dict] = {}
    for item in items:
        audio, rate, meta = build(item)
        sf.write(folder / item.file, audio, rate, subtype="PCM_16", format="FLAC")
        metas[item.file] = meta
        print(f"{folder.name}/{item.file:56s} {meta['duration_s']:5.2f} s {meta['voice']:28s} {item.condition}", flush=True)
    for stale in sorted(folder.glob("*.flac")):
        if stale.name not in metas:
            stale.unlink()
    manifest = {"description": description, "rate": RATE, "items": metas}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


# --------------------------------------------------------------------------- human recordings

#: Recordings of people in packages' public test data: (package, path inside it, transcript, licence).  The paths are
#: those of the pocketsphinx 5.1.1 source distribution and the useful-moonshine-onnx 20251121 wheel.
HUMAN = (
    ("pocketsphinx", "test/data/librivox/sense_and_sensibility_01_austen_64kb-0870.wav",
     "and mister john dashwood had then leisure to consider how much there might be prudently in his power to do for them",
     "LibriVox recording (public domain), in pocketsphinx's test data (BSD-2-Clause)"),
    ("pocketsphinx", "test/data/librivox/sense_and_sensibility_01_austen_64kb-0880.wav", "he was not an ill disposed young man",
     "LibriVox recording (public domain), in pocketsphinx's test data (BSD-2-Clause)"),
    ("pocketsphinx", "test/data/librivox/sense_and_sensibility_01_austen_64kb-0890.wav",
     "unless to be rather cold hearted and rather selfish is to be ill disposed",
     "LibriVox recording (public domain), in pocketsphinx's test data (BSD-2-Clause)"),
    ("pocketsphinx", "test/data/librivox/sense_and_sensibility_01_austen_64kb-0920.wav",
     "had he married a more a amiable woman he might have been made still more respectable than he was",
     "LibriVox recording (public domain), in pocketsphinx's test data (BSD-2-Clause)"),
    ("pocketsphinx", "test/data/librivox/sense_and_sensibility_01_austen_64kb-0930.wav", "he might even have been made amiable himself",
     "LibriVox recording (public domain), in pocketsphinx's test data (BSD-2-Clause)"),
    ("pocketsphinx", "test/data/goforward.raw", "go forward ten meters", "CMU Sphinx test data (BSD-2-Clause)"),
    ("pocketsphinx", "test/data/cards/001.wav", "ten of clubs", "CMU Sphinx test data (BSD-2-Clause)"),
    ("pocketsphinx", "test/data/cards/002.wav", "four queen of clubs", "CMU Sphinx test data (BSD-2-Clause)"),
    ("pocketsphinx", "test/data/cards/003.wav", "seven of clubs", "CMU Sphinx test data (BSD-2-Clause)"),
    ("pocketsphinx", "test/data/cards/004.wav", "five five", "CMU Sphinx test data (BSD-2-Clause)"),
    ("pocketsphinx", "test/data/cards/005.wav", "eight of spades four of clubs seven of hearts", "CMU Sphinx test data (BSD-2-Clause)"),
    ("useful-moonshine-onnx", "moonshine_onnx/assets/beckett.wav",
     "ever tried ever failed no matter try again fail again fail better", "useful-moonshine-onnx test asset (MIT)"),
)


def human(sources: list[Path]) -> None:
    """Copy the recordings of ``HUMAN`` found under ``sources`` to human/ as 16 kHz FLAC, with their manifest."""
    folder = HERE / "human"
    folder.mkdir(exist_ok=True)
    metas = {}
    for package, rel, text, licence in HUMAN:
        found = next((s / rel for s in sources if (s / rel).is_file()), None)
        if found is None:
            print(f"human: {package}:{rel} not found under {', '.join(map(str, sources))}; skipped")
            continue
        if found.suffix == ".raw":  # 16 kHz little-endian PCM16, headerless
            audio, rate = np.fromfile(found, "<i2").astype(np.float64) / 32768.0, 16000
        else:
            audio, rate = sf.read(found, dtype="float64", always_2d=True)
            audio = audio.mean(axis=1)
        if rate != RATE:
            audio, rate = resample(audio, rate, RATE), RATE
        name = f"{package.split('-')[-1]}_{Path(rel).parent.name}_{Path(rel).stem}.flac".replace("-", "_")
        sf.write(folder / name, np.clip(audio, -1, 1), rate, subtype="PCM_16", format="FLAC")
        metas[name] = {"kind": "asr", "text": text, "voice": f"human:{package}", "condition": "recorded", "rate": rate,
                       "duration_s": sec(len(audio), rate), "source": f"{package}: {rel}", "licence": licence}
        print(f"human/{name:60s} {len(audio) / rate:5.2f} s  {text!r}")
    manifest = {"description": "recordings of people from packages' public test data, with their transcripts "
                               "(lowercase, as the packages give them; see README.md)", "rate": RATE, "items": metas}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def check(folder: Path) -> None:
    from voice.asr import WhisperTranscriber
    from voice.audio import read_wav, to_float
    from voice.audio import resample as resample_pcm

    asr = WhisperTranscriber()
    manifest = json.loads((folder / "manifest.json").read_text())
    for name, meta in manifest["items"].items():
        pcm, rate = read_wav(folder / name)
        heard = asr.transcribe(to_float(resample_pcm(pcm, rate, 16000))).text.strip()
        print(f"{name:56s} {meta['text']!r:60s} -> {heard!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="also print Whisper tiny.en's transcript of every file")
    ap.add_argument("--human-from", type=Path, nargs="+", metavar="DIR",
                    help="rewrite human/ from these unpacked packages (pocketsphinx sdist, useful-moonshine-onnx wheel)")
    ap.add_argument("--only", choices=("turntaking", "asr", "human"), help="build one set only")
    args = ap.parse_args()
    if args.only in (None, "turntaking"):
        write_set(HERE / "turntaking", turntaking_items(),
                  "held-apart turn-taking set: one user turn per file; 'paused' turns have a 500-800 ms silence inside, "
                  "'complete' turns are over at speech_end_s (see ../README.md)")
    if args.only in (None, "asr"):
        write_set(HERE / "asr", asr_items(), "held-apart ASR set: one utterance per file with its transcript (see ../README.md)")
    if args.human_from and args.only in (None, "human"):
        human(args.human_from)
    total = sum(p.stat().st_size for p in HERE.rglob("*") if p.is_file())
    print(f"samples/heldout/ total {total / 1e6:.2f} MB")
    if args.check:
        for name in ("turntaking", "asr", "human"):
            if (HERE / name / "manifest.json").is_file():
                check(HERE / name)


if __name__ == "__main__":
    main()
