"""The held-apart sets (samples/heldout/) stay apart: no voice, variant or text of theirs is in the own sets or the
end-of-turn head's training set; their manifests describe the files that are there; the word-error normalization of
bench/asr.py; the persona's vocabulary for Whisper."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest

from voice.asr import persona_vocabulary
from voice.turn_end_train import EVALUATION_MANIFESTS, EVALUATION_TEXT_SETS, TRAIN_VOICES, _key, labelled_set

ROOT = Path(__file__).resolve().parents[2]
HELDOUT = ROOT / "samples" / "heldout"
SETS = ("turntaking", "asr", "human")


def manifest(name: str) -> dict:
    return json.loads((HELDOUT / name / "manifest.json").read_text())["items"]


def own_voices() -> set[str]:
    """Every voice of the own sets, as their manifests name them."""
    voices = {m["voice"] for m in json.loads((ROOT / "samples" / "turntaking" / "manifest.json").read_text())["items"].values()}
    voices |= {m["voice"] for m in json.loads((ROOT / "samples" / "manifest.json").read_text())["turns"].values()}
    return voices


def variant(voice: str) -> tuple[str, str]:
    """(accent, variant) of an espeak voice label "espeak-en-gb-x-rp+f4-155"."""
    name = voice.removeprefix("espeak-").rsplit("-", 1)[0]
    accent, _, var = name.partition("+")
    return accent, var


@pytest.mark.parametrize("name", SETS)
def test_every_file_of_a_manifest_is_there_and_nothing_else(name):
    items = manifest(name)
    files = {p.name for p in (HELDOUT / name).iterdir() if p.suffix in (".flac", ".wav")}
    assert items and set(items) == files
    for meta in items.values():
        assert meta["text"].strip() and meta["voice"]


def test_no_voice_of_the_heldout_sets_is_in_the_own_sets_or_the_training_voices():
    own = own_voices()
    train = {f"espeak-{v}-{s}" for e, v, s in TRAIN_VOICES if e == "espeak"}
    own_variants = {variant(v)[1] for v in own | train if v.startswith("espeak-")}
    for name in ("turntaking", "asr"):
        for file, meta in manifest(name).items():
            assert meta["voice"] not in own | train, f"{name}/{file}: {meta['voice']} is a voice the project was built on"
            assert variant(meta["voice"])[1] not in own_variants | {""}, f"{name}/{file}: its variant is used elsewhere"
    assert all(m["voice"].startswith("human:") for m in manifest("human").values())


def test_no_heldout_text_is_in_the_training_set():
    training = {_key(t) for t, _, _ in labelled_set(with_corpus=True)}
    assert training
    for name in ("turntaking", "asr"):
        for file, meta in manifest(name).items():
            for text in [meta["text"], *meta.get("parts", [])]:
                assert _key(text) not in training, f"{name}/{file}: {text!r} is in the training set"
    assert {f"samples/heldout/{n}/manifest.json" for n in ("turntaking", "asr")} <= set(EVALUATION_MANIFESTS)


def test_no_text_of_the_held_apart_text_set_is_in_the_training_set():
    data = json.loads((ROOT / EVALUATION_TEXT_SETS[0]).read_text())
    training = {_key(t) for t, _, _ in labelled_set(with_corpus=True)}
    texts = data["complete"] + [p["text"] for p in data["paused"]]
    assert len(texts) >= 300
    assert not [t for t in texts if _key(t) in training]


def test_the_turntaking_set_has_pauses_of_500_to_800_ms_and_complete_questions():
    items = manifest("turntaking").values()
    paused = [m for m in items if m["kind"] == "paused"]
    complete = [m for m in items if m["kind"] == "complete"]
    assert len(paused) == 24 and len(complete) == 20
    for m in paused:
        assert 500 <= m["pause"]["ms"] <= 800 and len(m["parts"]) == 2
        assert m["pause"]["start_s"] < m["pause"]["end_s"] < m["speech_end_s"] < m["duration_s"]
    assert sum(m["text"].endswith("?") for m in complete) >= 15
    assert len({m["condition"] for m in items}) >= 6 and len({m["voice"] for m in items}) >= 8


def test_the_asr_set_names_the_persona_and_the_human_recordings_say_where_they_came_from():
    texts = " ".join(m["text"].lower() for m in manifest("asr").values())
    for words in ("sourdough loaf", "harbor street", "maple street", "example dot com", "bright bakery"):
        assert words in texts
    for file, meta in manifest("human").items():
        assert meta["source"] and meta["licence"], file
        assert not re.search(r"tidigits", meta["source"]), "TIDIGITS is not freely licensed"


def bench_asr():
    spec = importlib.util.spec_from_file_location("bench_asr", ROOT / "bench" / "asr.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("ref, hyp, edits", [
    ("My phone number is three one two, four four seven.", "My phone number is 312-447.", 0),
    ("go forward ten meters", "Go forward 10 meters.", 0),
    ("Send it to forty two Maple Street", "Send it to 42 Maple Street.", 0),
    ("I'm at one hundred Pine Road, unit four.", "I'm at 100, Pine Road, unit 4.", 0),
    ("My email is anna at example dot com.", "My email is anna@example.com", 0),
    ("It's for the fourteenth of May.", "It's for the 14th of May.", 0),
    ("Is delivery free over thirty dollars?", "Is delivery free over $30?", 0),
    ("and mister john dashwood", "And Mr. John Dashwood", 0),
    ("Can I get a sourdough loaf?", "Can I get a soda bottle off?", 3),
    ("forty two", "24", 2),
])
def test_word_error_reads_numbers_and_addresses_as_spoken(ref, hyp, edits):
    assert bench_asr().wer(ref, hyp) == (edits, len(bench_asr().norm_words(ref)))


def test_the_vocabulary_names_the_persona_its_products_and_places_not_its_plain_words():
    bakery = (("Opening hours", "7 am to 6 pm, Tuesday to Sunday"), ("Mondays", "closed"), ("Address", "12 Harbor Street"),
              ("Sourdough loaf", "5 dollars"), ("Croissant", "2 dollars"), ("Owner", "Maria"))
    voc = persona_vocabulary("Bright Bakery", bakery)
    assert voc.startswith("Bright Bakery. ")
    for name in ("Harbor Street", "Sourdough loaf", "Croissant", "Maria"):
        assert name in voc
    for plain in ("Opening hours", "Tuesday", "Address", "Owner", "12", "dollars"):
        assert plain not in voc
    prose = persona_vocabulary("Harbor Hotel", [("", "Check-in is at 3 PM. The Wi-Fi password is Seagull."),
                                                ("", "We are at 40 Ocean Drive, next to Pier Seven.")])
    assert "Seagull" in prose and "Ocean Drive" in prose and "Pier Seven" in prose
    assert "Check-in" not in prose and "The" not in prose.split() and "PM" not in prose
    assert persona_vocabulary("", []) == ""


def test_the_phone_band_of_the_asr_bench_is_the_servers_path_at_the_same_length_and_rate():
    t = np.arange(16000) / 16000
    tone = (0.3 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32)
    out = bench_asr().phone_band(tone)
    assert out.dtype == np.float32 and len(out) == len(tone)
    spectrum = np.abs(np.fft.rfft(out[1000:-1000]))
    freqs = np.fft.rfftfreq(len(out) - 2000, 1 / 16000)
    assert abs(freqs[np.argmax(spectrum)] - 1000) < 5  # the tone, where it was
    image = spectrum[np.abs(freqs - 7000) < 20].max()  # the widener's mirror of it, about 10 dB down
    assert 0.1 * spectrum.max() < image < 0.6 * spectrum.max()
    assert not np.any(bench_asr().phone_band(np.zeros(3200, np.float32)))
