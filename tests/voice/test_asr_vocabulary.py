"""Each server session hears with its own persona's vocabulary: the shared Whisper gets the session's prompt on every
call, a new persona (``session.update`` instructions) brings its own, and a transcriber without one is left alone."""

from __future__ import annotations

import numpy as np

from voice.engines import SharedEngines, vocabulary
from voice.llm import Persona
from voice.loop import Engines


class Recorder:
    """A transcriber that keeps the keyword arguments of each call (the real one is in test_asr_tts.py)."""

    def __init__(self, vocabulary: str = "Bright Bakery."):
        self.vocabulary = vocabulary
        self.calls: list[dict] = []

    def prompt_ids(self, vocabulary=None):  # what marks a transcriber that takes a prompt
        return []

    def transcribe(self, audio, **kw):
        self.calls.append(kw)
        return kw


class Plain:
    """A transcriber without prompts (an ASR engine of another kind)."""

    def __init__(self):
        self.calls: list[dict] = []

    def transcribe(self, audio, **kw):
        self.calls.append(kw)
        return kw


class Conversation:
    def __init__(self, persona):
        self.persona = persona
        self.generator = self

    def fork(self):
        return self

    def with_persona(self, persona):
        return Conversation(persona)


def shared(transcriber) -> SharedEngines:
    return SharedEngines(Engines(transcriber=transcriber, llm=Conversation(Persona()), tts=type("T", (), {"sample_rate": 16000})()))


def test_a_session_transcribes_with_its_personas_vocabulary():
    rec = Recorder()
    eng = shared(rec)
    hotel = Persona.from_facts("Harbor Hotel", {"Breakfast": "in the Lighthouse Room", "Wi-Fi password": "Seagull"})
    s = eng.session(hotel)
    s.transcriber.transcribe(np.zeros(160, np.float32), speculative=True)
    assert rec.calls[-1]["prompt"] == vocabulary(hotel) and "Lighthouse Room" in rec.calls[-1]["prompt"]
    assert rec.calls[-1]["speculative"] is True
    default = eng.session()
    default.transcriber.transcribe(np.zeros(160, np.float32))
    assert "Harbor Street" in rec.calls[-1]["prompt"] and "Lighthouse" not in rec.calls[-1]["prompt"]
    bakery_again = eng.with_persona(s, Persona())
    bakery_again.transcriber.transcribe(np.zeros(160, np.float32))
    assert rec.calls[-1]["prompt"] == vocabulary(Persona())


def test_no_prompt_for_a_transcriber_without_one_or_loaded_without_a_vocabulary():
    plain = Plain()
    shared(plain).session().transcriber.transcribe(np.zeros(160, np.float32))
    assert "prompt" not in plain.calls[-1]
    off = Recorder(vocabulary="")  # --no-asr-vocabulary
    eng = shared(off)
    eng.with_persona(eng.session(), Persona()).transcriber.transcribe(np.zeros(160, np.float32))
    assert "prompt" not in off.calls[-1]


def test_the_asr_flags_reach_the_engine_options():
    import argparse
    from types import SimpleNamespace

    import pytest

    from server.cli.common import engine_options, voice_flags

    ap = argparse.ArgumentParser()
    voice_flags(ap)
    default = engine_options(ap.parse_args([]), (None, None), SimpleNamespace(name="x"))
    assert (default.asr_model, default.asr_vocabulary) == ("tiny.en", True)
    base = engine_options(ap.parse_args(["--asr-model", "base", "--no-asr-vocabulary"]), (None, None), SimpleNamespace(name="x"))
    assert (base.asr_model, base.asr_vocabulary) == ("base", False)
    with pytest.raises(SystemExit):  # no package ships it: not offered
        ap.parse_args(["--asr-model", "base.en"])
