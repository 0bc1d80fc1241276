"""Pipecat and wafervox on the same recordings, in the same run: voice-to-voice of each, and their ratio.

    make bench-peers-env                     # once: Pipecat in its own venv, bench/.venv-pipecat
    .venv/bin/python bench/peers.py [--wavs FILE ...] [--budget-ms 500] [--json FILE] [--first pipecat|wafervox]

The recordings (the sample conversations of samples/manifest.json but the default one, a copy; or ``--wavs FILE...``,
any WAV or soundfile format at any rate, as one conversation) are read once, made 16 kHz mono 16-bit, and written to a
temporary folder; both peers hear exactly those samples, one after the other (never at the same time):

- **Pipecat** (``pipecat-ai`` 1.14, in bench/.venv-pipecat), its documented local pipeline: Silero VAD (stop_secs 0.2,
  Pipecat's default and what its Smart Turn guide asks for) in the user aggregator, Smart Turn v3 (local ONNX) as the
  turn stop strategy, faster-whisper tiny.en int8 on the CPU (``WhisperSTTService``), the OpenAI-compatible LLM
  service streaming from llama.cpp's server (``llama_cpp.server`` from the project's venv, 127.0.0.1, a free port) on
  our GGUF, and the Piper service with the joe voice.  Every model is a local file: Silero and Smart Turn ship inside
  pipecat-ai, Whisper, the GGUF and the voice are the project's packages (``HF_HUB_OFFLINE=1``).  No sound card: a
  transport of ours pushes ``InputAudioRawFrame``s of 20 ms at real-time pace and plays the answer out at real-time
  pace, as a sound card's blocking write would.  Its engines are warmed up with one unmeasured turn first.
- **wafervox**: ``wafervox serve`` (its defaults, a separate process on a free loopback port), one ``wafervox client``
  session per conversation (``server.client.run_client``), in real time.

Voice-to-voice, the same rule on both sides (``server/client.py``): the time the first audio of an answer reaches
the output (Pipecat: our transport's write; wafervox: the client receives it) minus the time the user's last voiced
sample was pushed, the voiced ends found by wafervox's endpointer over the audio (``voiced_ends``).  Each file's answer
plays out before the next file starts.  Prints every turn of both, then p50/p95/max and the turns within the budget for
each, and pipecat/wafervox of p50 and p95, with the settings of both.  Everything stops by itself: each peer has a
wall-clock limit (``--timeout-s``), the servers are stopped at the end.

Without bench/.venv-pipecat it stops with "run make bench-peers-env".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PIPECAT_VENV = ROOT / "bench" / ".venv-pipecat"
RATE = 16000  # the rate both peers are fed
CHUNK_MS = 20
TAIL_S = 2.0  # the silence the endpointer gets after a file to close its last utterance (as bench/server.py)


# ---------------------------------------------------------------------------------------------------------------------
# Pipecat's side: runs in bench/.venv-pipecat (``peers.py --pipecat-worker SPEC.json``); imports pipecat only here.
# ---------------------------------------------------------------------------------------------------------------------

def pipecat_settings(spec: dict) -> dict:
    """What the Pipecat pipeline is configured with (printed, and kept in the JSON)."""
    return {
        "pipecat": spec.get("pipecat_version"),
        "vad": "SileroVADAnalyzer(VADParams(confidence=0.7, start_secs=0.2, stop_secs=0.2, min_volume=0.6)) in "
               "LLMUserAggregatorParams.vad_analyzer",
        "turn_stop": "TurnAnalyzerUserTurnStopStrategy(LocalSmartTurnAnalyzerV3(cpu_count=1), bundled smart-turn-v3.2-cpu)",
        "stt": "WhisperSTTService(model=<tiny.en CTranslate2 dir>, device=cpu, compute_type=int8), segmented on VAD; "
               "ttfs_p99_latency left at Pipecat's default (1.0 s)",
        "llm": f"OpenAILLMService(base_url=llama.cpp server, streamed, system_instruction=the persona, "
               f"temperature={spec['temperature']}, "
               f"max_tokens={spec['max_tokens']}) on {Path(spec['gguf']).name}; server n_ctx 2048, 2 threads",
        "tts": "PiperTTSService(voice=en_US-joe-medium, local file), sentence aggregation (default)",
        "transport": f"our own: input {RATE} Hz mono in {CHUNK_MS} ms frames at real-time pace; output at "
                     "real-time pace (40 ms chunks, Pipecat's default), first audio timed at its write",
        "pipeline": "input, stt, user aggregator, llm, tts, output, assistant aggregator; PipelineParams defaults "
                    "(audio in 16 kHz, out 24 kHz)",
    }


def pipecat_worker(spec_path: str) -> None:
    """Play the spec's files through a Pipecat pipeline; write the turns to the spec's ``out``."""
    spec = json.loads(Path(spec_path).read_text())
    os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may come from a model hub: every model is a local file
    from loguru import logger

    logger.remove()
    logger.add(spec["log"], level="DEBUG")
    logger.add(sys.stderr, level="ERROR")
    try:
        result = asyncio.run(asyncio.wait_for(_pipecat_run(spec), spec["timeout_s"]))
    except TimeoutError:
        result = {"error": f"Pipecat's pass did not finish within {spec['timeout_s']:.0f} s"}
    Path(spec["out"]).write_text(json.dumps(result))


async def _pipecat_run(spec: dict) -> dict:  # noqa: C901  (one pipeline, its transport and its driver together)
    import numpy as np
    import soundfile as sf
    from pipecat.audio.turn.smart_turn.local_smart_turn_v3 import LocalSmartTurnAnalyzerV3
    from pipecat.audio.vad.silero import SileroVADAnalyzer
    from pipecat.audio.vad.vad_analyzer import VADParams
    from pipecat.frames.frames import (
        BotStartedSpeakingFrame,
        BotStoppedSpeakingFrame,
        EndFrame,
        InputAudioRawFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        StartFrame,
        TranscriptionFrame,
        TTSAudioRawFrame,
        UserStartedSpeakingFrame,
        UserStoppedSpeakingFrame,
        VADUserStartedSpeakingFrame,
        VADUserStoppedSpeakingFrame,
    )
    from pipecat.observers.base_observer import BaseObserver
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair, LLMUserAggregatorParams
    from pipecat.processors.frame_processor import FrameDirection
    from pipecat.services.openai.llm import OpenAILLMService
    from pipecat.services.piper.tts import PiperTTSService
    from pipecat.services.whisper.stt import WhisperSTTService
    from pipecat.transports.base_input import BaseInputTransport
    from pipecat.transports.base_output import BaseOutputTransport
    from pipecat.transports.base_transport import BaseTransport, TransportParams
    from pipecat.turns.user_stop import TurnAnalyzerUserTurnStopStrategy
    from pipecat.turns.user_turn_strategies import UserTurnStrategies
    from pipecat.workers.runner import WorkerRunner

    now = time.monotonic
    st = {"sent": 0, "bot_speaking": False, "answer_done": 0, "transcripts": [], "reply": "", "marks": {}, "current": None,
          # what is under way (the driver waits for none of it before the next file) and when any of it last changed
          "vad_speaking": False, "user_turn": False, "llm_active": False, "last_event": 0.0}
    send_times: list[tuple[int, float]] = []  # (input samples pushed, time just after)
    ends: list[int] = []  # voiced ends, in input samples since the start
    answers: list[dict] = []
    ready = asyncio.Event()

    def sent_at(sample: int) -> float | None:
        for n, t in send_times:
            if n > sample:
                return t
        return None

    class FileInput(BaseInputTransport):
        """The microphone: frames pushed by the driver below."""

        async def start(self, frame: StartFrame):
            await super().start(frame)
            await self.set_transport_ready(frame)
            ready.set()

    class Speaker(BaseOutputTransport):
        """A sound card: a write blocks while more than one chunk waits to play; the first write of an answer is
        when its audio reaches the output."""

        def __init__(self, params):
            super().__init__(params)
            self._played_until = 0.0

        async def start(self, frame: StartFrame):
            await super().start(frame)
            await self.set_transport_ready(frame)

        async def write_audio_frame(self, frame) -> bool:
            t = now()
            a = st["current"]
            if st["bot_speaking"] and a is not None and a["first_at"] is None:
                a["first_at"] = t
                past = [e for e in ends if e < st["sent"]]
                a["last_voiced"] = past[-1] if past else None
            self._played_until = max(self._played_until, t) + len(frame.audio) / 2 / frame.sample_rate
            wait = self._played_until - len(frame.audio) / 2 / frame.sample_rate - now()
            if wait > 0:
                await asyncio.sleep(wait)
            return True

        async def push_frame(self, frame, direction=FrameDirection.DOWNSTREAM):
            if direction == FrameDirection.DOWNSTREAM:
                if isinstance(frame, BotStartedSpeakingFrame):
                    st["bot_speaking"] = True
                    st["current"] = a = {"first_at": None, "last_voiced": None, "file": st.get("file"),
                                         "transcript": " ".join(st["transcripts"]).strip(), "marks": dict(st["marks"])}
                    answers.append(a)
                elif isinstance(frame, BotStoppedSpeakingFrame) and st["bot_speaking"]:
                    st["bot_speaking"] = False
                    if st["current"] is not None:
                        st["current"]["reply"] = st["reply"].strip()
                    st["answer_done"] += 1
                    st["last_event"] = now()
            await super().push_frame(frame, direction)

    class Transport(BaseTransport):
        def __init__(self, params):
            super().__init__()
            self._in, self._out = FileInput(params), Speaker(params)

        def input(self):
            return self._in

        def output(self):
            return self._out

    # what is under way: the frame that starts it, the frame that ends it, its flag in ``st``, the mark its end leaves
    under_way = ((VADUserStartedSpeakingFrame, VADUserStoppedSpeakingFrame, "vad_speaking", "vad_stop"),
                 (UserStartedSpeakingFrame, UserStoppedSpeakingFrame, "user_turn", "turn_end"),
                 (LLMFullResponseStartFrame, LLMFullResponseEndFrame, "llm_active", None))

    class Marks(BaseObserver):
        """When each step of a turn happened (the first push of each frame), for the per-turn breakdown."""

        async def on_push_frame(self, data):
            if not getattr(data, "first_push", True):
                return
            f, t = data.frame, now()
            for started, ended, flag, end_mark in under_way:
                if isinstance(f, (started, ended)):
                    st[flag], st["last_event"] = isinstance(f, started), t
                    if end_mark and isinstance(f, ended):
                        st["marks"][end_mark] = t
            if isinstance(f, TranscriptionFrame):
                st["last_event"] = t
                st["marks"]["transcript"] = t
                st["transcripts"].append(f.text)
            elif isinstance(f, LLMFullResponseStartFrame):
                st["reply"] = ""
                st["marks"]["llm_start"] = t
                st["marks"].pop("llm_first_text", None)
                st["marks"].pop("tts_first_audio", None)
            elif isinstance(f, LLMTextFrame):
                st["marks"].setdefault("llm_first_text", t)
                st["reply"] += f.text
            elif isinstance(f, TTSAudioRawFrame):
                st["marks"].setdefault("tts_first_audio", t)
                if st["current"] is not None and st["current"]["first_at"] is None:
                    st["current"]["marks"] = dict(st["marks"])

    params = TransportParams(audio_in_enabled=True, audio_in_sample_rate=RATE, audio_out_enabled=True)
    transport = Transport(params)
    stt = WhisperSTTService(device="cpu", compute_type="int8",
                            settings=WhisperSTTService.Settings(model=spec["whisper_dir"]))
    llm = OpenAILLMService(base_url=spec["llm_url"], api_key="local",
                           settings=OpenAILLMService.Settings(model="smollm2", system_instruction=spec["system"],
                                                              temperature=spec["temperature"], max_tokens=spec["max_tokens"]))
    tts = PiperTTSService(download_dir=Path(spec["voice_dir"]), settings=PiperTTSService.Settings(voice=spec["voice"]))
    context = LLMContext(messages=[dict(m) for m in spec["messages"]])
    user_agg, assistant_agg = LLMContextAggregatorPair(context, user_params=LLMUserAggregatorParams(
        vad_analyzer=SileroVADAnalyzer(params=VADParams(stop_secs=0.2)),
        user_turn_strategies=UserTurnStrategies(
            stop=[TurnAnalyzerUserTurnStopStrategy(turn_analyzer=LocalSmartTurnAnalyzerV3())])))
    pipeline = Pipeline([transport.input(), stt, user_agg, llm, tts, transport.output(), assistant_agg])
    worker = PipelineWorker(pipeline, params=PipelineParams(audio_in_sample_rate=RATE), observers=[Marks()],
                            idle_timeout_secs=None)
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run_task = asyncio.create_task(runner.run())

    n = RATE * CHUNK_MS // 1000
    silence = np.zeros(n, np.int16)
    clock = {"t0": None}

    async def push(block: np.ndarray) -> None:
        due = clock["t0"] + st["sent"] / RATE
        delay = due - now()
        if delay > 0:
            await asyncio.sleep(delay)
        await transport.input().push_audio_frame(InputAudioRawFrame(audio=block.astype("<i2").tobytes(),
                                                                    sample_rate=RATE, num_channels=1))
        st["sent"] += len(block)
        send_times.append((st["sent"], now()))

    async def play(item: dict, tag) -> None:
        """One file, then silence until its answer has played out (or nothing came), as ``wafervox client`` does:
        until nothing is under way (the user's turn, a response, the bot speaking) for 2 s, at least 1 s after the
        file and after an answer to it, or ``tail_s`` after the file when no answer came."""
        pcm, rate = sf.read(item["path"], dtype="int16")
        assert rate == RATE, rate
        st["file"], st["marks"] = tag, {}
        ends.extend(st["sent"] + e for e in item["voiced_ends"])
        done = st["answer_done"]
        for i in range(0, len(pcm), n):
            block = pcm[i:i + n]
            await push(block if len(block) == n else np.concatenate([block, silence[:n - len(block)]]))
        quiet = 0.0
        while quiet < spec["tail_s"] + 30:
            await push(silence)
            quiet += CHUNK_MS / 1000
            idle = not (st["vad_speaking"] or st["user_turn"] or st["llm_active"] or st["bot_speaking"]) \
                and now() - st["last_event"] >= 2.0
            if quiet >= 1.0 and idle and (st["answer_done"] > done or quiet >= spec["tail_s"]):
                break

    def say(msg: str) -> None:
        print(msg, flush=True)

    try:
        await asyncio.wait_for(ready.wait(), 120)
        clock["t0"] = now()
        if spec["warmup"] and spec["files"]:
            say("  [pipecat] warm-up turn (not measured)")
            await play(spec["files"][0], None)
            answers.clear()
        for conv, items in spec["conversations"]:
            context.set_messages([dict(m) for m in spec["messages"]])  # a new conversation
            st["transcripts"] = []
            for k, idx in enumerate(items):
                before = len(answers)
                st["transcripts"] = []
                await play(spec["files"][idx], (conv, k + 1))
                for a in answers[before:]:
                    t_last = sent_at(a["last_voiced"]) if a["last_voiced"] is not None else None
                    a["v2v_ms"] = None if a["first_at"] is None or t_last is None else round((a["first_at"] - t_last) * 1000, 1)
                    a["stages_ms"] = {k2: round((t - t_last) * 1000, 1) for k2, t in a.pop("marks").items()
                                      if t_last is not None and t >= t_last - 5}
                    a["conversation"], a["turn"] = conv, k + 1
                    v = a["v2v_ms"]
                    say(f"  [pipecat]  {conv:8s} turn {k + 1}: v2v {v if v is not None else float('nan'):6.0f} ms  "
                        f"{a['transcript']!r} -> {a.get('reply', '')!r}")
                if len(answers) == before:
                    say(f"  [pipecat]  {conv:8s} turn {k + 1}: no answer")
    finally:
        await worker.queue_frame(EndFrame())
        try:
            await asyncio.wait_for(asyncio.shield(run_task), 20)
        except (TimeoutError, asyncio.CancelledError):
            await worker.cancel()
            run_task.cancel()
    for a in answers:
        a.pop("first_at", None)
        a.pop("file", None)
    return {"turns": answers, "files": len(spec["files"]), "settings": pipecat_settings(spec)}


# ---------------------------------------------------------------------------------------------------------------------
# The run: the project's venv.
# ---------------------------------------------------------------------------------------------------------------------

def recordings(wavs: list[str] | None) -> list[tuple[str, list[Path]]]:
    """The sample conversations (or ``wavs`` as one), as bench/server.py and bench/capacity.py replay them."""
    from _serve import conversations

    return conversations(wavs)


def prepare(convs, folder: Path) -> tuple[list[dict], list[tuple[str, list[int]]]]:
    """Every file as 16 kHz mono int16 in ``folder``, with its voiced ends (wafervox's endpointer); the conversations
    as lists of indices into the files."""
    from server.client import voiced_ends
    from voice.audio import read_wav, resample, write_wav

    files, plan = [], []
    for name, paths in convs:
        idx = []
        for p in paths:
            pcm, rate = read_wav(p)
            pcm = resample(pcm, rate, RATE)
            out = folder / f"{len(files):02d}_{Path(p).stem}.wav"
            write_wav(out, pcm, RATE)
            idx.append(len(files))
            files.append({"path": str(out), "source": str(p), "voiced_ends": [int(e) for e in voiced_ends(pcm, RATE, TAIL_S)]})
        plan.append((name, idx))
    return files, plan


def pipecat_prompt() -> tuple[str, list[dict]]:
    """Pipecat's system instruction and first context messages: the same persona as wafervox's (its system text,
    with the facts, and its example exchanges as plain user/assistant turns: the per-turn "Fact:" grounding is
    wafervox's own)."""
    from voice.llm import Persona

    opening = Persona().opening()
    return opening[0]["content"], [m for m in opening[1:] if m["role"] != "system"]


def run_pipecat(args, files, plan, folder: Path) -> dict:
    sys.path.append(str(ROOT / "tests"))
    import llama_server

    from decode.gguf_file import default_model_path
    from voice.asr import whisper_model_dir
    from voice.engines import EngineOptions
    from voice.tts import joe_voice_path

    python = PIPECAT_VENV / "bin" / "python"
    version = subprocess.run([str(python), "-c", "from importlib.metadata import version; print(version('pipecat-ai'))"],
                             capture_output=True, text=True, timeout=60).stdout.strip()
    voice = joe_voice_path()
    gguf = default_model_path()
    system, messages = pipecat_prompt()
    spec = {"files": files, "conversations": plan, "whisper_dir": str(whisper_model_dir()), "voice_dir": str(voice.parent),
            "voice": voice.name.removesuffix(".onnx"), "gguf": str(gguf), "system": system, "messages": messages,
            "max_tokens": EngineOptions().max_tokens, "temperature": 0.0, "tail_s": args.pipecat_tail_s,
            "warmup": not args.no_warmup, "timeout_s": args.timeout_s, "pipecat_version": version,
            "out": str(folder / "pipecat.json"), "log": str(folder / "pipecat.log")}
    print(f"\nPipecat {version}: starting llama.cpp's server on {gguf.name}", flush=True)
    server = llama_server.start(gguf, log_dir=folder, n_ctx=2048, n_threads=2)
    spec["llm_url"] = server.base_url
    (folder / "spec.json").write_text(json.dumps(spec))
    try:
        proc = subprocess.run([str(python), str(Path(__file__).resolve()), "--pipecat-worker", str(folder / "spec.json")],
                              cwd=ROOT, timeout=args.timeout_s + 120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    except subprocess.TimeoutExpired:
        return {"error": f"the Pipecat worker did not exit within {args.timeout_s + 120:.0f} s", "turns": []}
    finally:
        server.stop()
    out = folder / "pipecat.json"
    if not out.exists():
        return {"error": f"the Pipecat worker exited with status {proc.returncode} and no result (log: {folder / 'pipecat.log'})",
                "turns": []}
    result = json.loads(out.read_text())
    result.setdefault("turns", [])
    return result


def wafervox_settings() -> dict:
    from voice.engines import EngineOptions
    from voice.loop_config import LoopConfig

    c, e = LoopConfig(), EngineOptions()
    return {"server": "wafervox serve (defaults), /v1/realtime, client at 16 kHz",
            "endpointer": f"webrtcvad, pause_ms {c.endpointer.pause_ms}, early_pause_ms {c.endpointer.early_pause_ms}, "
                          f"stop_ms {c.endpointer.stop_ms}",
            "turn_end": f"semantic end of turn ({c.end_of_turn})", "speculative": c.speculative,
            "asr": f"Whisper tiny.en int8 (CTranslate2), {e.asr_threads} thread", "llm": f"numba decode core, max_tokens {e.max_tokens}",
            "tts": f"{e.tts} (joe), streamed in vocoder chunks", "max_sentences": c.max_sentences}


def run_wafervox(args, files, plan) -> dict:
    from _serve import start_server, stop_server

    from server.client import ClientOptions, run_client

    print("\nwafervox: starting wafervox serve", flush=True)
    proc, port = start_server([])
    url = f"ws://127.0.0.1:{port}/v1/realtime"
    turns: list[dict] = []
    try:
        for conv, idx in plan:
            def on_turn(t: dict, conv=conv) -> None:
                t["conversation"] = conv
                turns.append(t)
                v = t["latency_ms"]["voice_to_voice_ms"]
                print(f"  [wafervox] {conv:8s} turn {t['turn']}: v2v {v if v is not None else float('nan'):6.0f} ms  "
                      f"{t['transcript']!r} -> {t['reply']!r}", flush=True)

            opts = ClientOptions(url=url, rate=RATE, tail_s=TAIL_S, budget_ms=args.budget_ms, timeout_s=args.timeout_s)
            asyncio.run(run_client([files[i]["path"] for i in idx], opts, on_turn=on_turn))
    finally:
        stop_server(proc)
    return {"turns": [{"conversation": t["conversation"], "turn": t["turn"], "transcript": t["transcript"], "reply": t["reply"],
                       "v2v_ms": t["latency_ms"]["voice_to_voice_ms"], "server_v2v_ms": t["server_voice_to_voice_ms"],
                       "stages_ms": {k: v for k, v in t["latency_ms"].items() if k != "voice_to_voice_ms"}} for t in turns],
            "files": len(files), "settings": wafervox_settings()}


def summary(result: dict, budget_ms: float) -> dict:
    from voice.latency import percentile

    v = [t["v2v_ms"] for t in result.get("turns", []) if t.get("v2v_ms") is not None]
    q = lambda p: None if not v else round(percentile(v, p), 1)  # noqa: E731
    return {"turns": len(v), "files": result.get("files"), "p50_ms": q(0.5), "p95_ms": q(0.95),
            "max_ms": round(max(v), 1) if v else None, "within_budget": sum(1 for x in v if x <= budget_ms)}


def report(results: dict, budget_ms: float) -> dict:
    s = {name: summary(r, budget_ms) for name, r in results.items()}
    ratio = {}
    if "pipecat" in s and "wafervox" in s:
        for k in ("p50_ms", "p95_ms"):
            a, b = s["pipecat"][k], s["wafervox"][k]
            ratio[k.removesuffix("_ms")] = round(a / b, 2) if a is not None and b else None
    print("\nsettings:")
    for name, r in results.items():
        for k, v in (r.get("settings") or {}).items():
            print(f"  {name:9s} {k:12s} {v}")
    print(f"\nvoice-to-voice, the same {next(iter(s.values()))['files']} recordings, budget {budget_ms:.0f} ms")
    print(f"{'peer':10s} {'turns':>5s} {'p50 ms':>8s} {'p95 ms':>8s} {'max ms':>8s} {'within':>8s}")
    f = lambda x: "-" if x is None else f"{x:,.0f}"  # noqa: E731
    for name, x in s.items():
        print(f"{name:10s} {x['turns']:5d} {f(x['p50_ms']):>8s} {f(x['p95_ms']):>8s} {f(x['max_ms']):>8s} "
              f"{x['within_budget']:>3d} / {x['files']:<3d}")
        if results[name].get("error"):
            print(f"  {name}: {results[name]['error']}")
    stages = [t.get("stages_ms") or {} for t in results.get("pipecat", {}).get("turns", [])]
    if any(stages):
        from voice.latency import percentile

        names = ("vad_stop", "transcript", "turn_end", "llm_first_text", "tts_first_audio")
        p50 = {k: percentile([x[k] for x in stages if k in x], 0.5) for k in names}
        print("pipecat, p50 ms after the last voiced sample: " + ", ".join(
            f"{k} {'-' if v is None else f'{v:,.0f}'}" for k, v in p50.items()))
    if ratio:
        r50, r95 = ratio.get("p50"), ratio.get("p95")
        print(f"pipecat / wafervox: p50 {'-' if r50 is None else f'{r50:.2f}x'}, p95 {'-' if r95 is None else f'{r95:.2f}x'}")
    return {"summary": s, "ratio_pipecat_over_wafervox": ratio}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wavs", nargs="+", metavar="FILE", help="play these recordings (one conversation) instead of the samples")
    ap.add_argument("--budget-ms", type=float, default=500.0, help="the voice-to-voice budget counted against (default 500)")
    ap.add_argument("--first", choices=("pipecat", "wafervox"), default="pipecat", help="which peer plays first (default pipecat)")
    ap.add_argument("--only", choices=("pipecat", "wafervox"), help="run one peer only (no ratio)")
    ap.add_argument("--no-warmup", action="store_true", help="no unmeasured warm-up turn through Pipecat first")
    ap.add_argument("--pipecat-tail-s", type=float, default=6.0,
                    help="after a file, how long Pipecat may stay silent before the next file (default 6: Smart Turn "
                         "waits up to 3 s of silence when it judges a turn unfinished)")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="wall-clock limit of each peer's pass (default 900)")
    ap.add_argument("--json", metavar="FILE", help="also write every turn, the settings and the summary as JSON")
    ap.add_argument("--keep-log", action="store_true", help="keep the temporary folder (Pipecat's log, the 16 kHz files)")
    ap.add_argument("--pipecat-worker", metavar="SPEC", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.pipecat_worker:
        pipecat_worker(args.pipecat_worker)
        return
    if args.only != "wafervox" and not (PIPECAT_VENV / "bin" / "python").exists():
        raise SystemExit(f"bench/peers.py: no Pipecat environment at {PIPECAT_VENV.relative_to(ROOT)}: run make bench-peers-env")
    sys.path.insert(0, str(ROOT))

    convs = recordings(args.wavs)
    folder = Path(tempfile.mkdtemp(prefix="wafervox-peers-"))
    try:
        files, plan = prepare(convs, folder)
        print(f"{len(files)} recordings in {len(plan)} conversation(s), 16 kHz mono; played in real time through each peer",
              flush=True)
        order = [args.only] if args.only else ([args.first] + [p for p in ("pipecat", "wafervox") if p != args.first])
        results = {}
        for peer in order:
            load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
            print(f"\n[{peer}] load average before it: {load} (other busy programs on the cores skew a peer's figures)",
                  flush=True)
            t = time.monotonic()
            results[peer] = run_pipecat(args, files, plan, folder) if peer == "pipecat" else run_wafervox(args, files, plan)
            results[peer]["wall_s"] = round(time.monotonic() - t, 1)
            results[peer]["load_average_before"] = load
        results = {p: results[p] for p in ("pipecat", "wafervox") if p in results}
        out = report(results, args.budget_ms)
        if args.json:
            Path(args.json).write_text(json.dumps({"budget_ms": args.budget_ms, "recordings": [f["source"] for f in files],
                                                   "conversations": plan, **out, "peers": results}, indent=1))
    finally:
        if args.keep_log:
            print(f"kept {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
