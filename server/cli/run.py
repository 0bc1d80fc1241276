"""``wafervox run``: the main job, recorded conversations played through the whole voice pipeline."""

from __future__ import annotations

import json
from pathlib import Path

from .common import (
    CLIError,
    json_console,
    json_flag,
    llm_info,
    load,
    loop_config,
    otel_flags,
    otel_tracing,
    print_summary,
    report_printer,
    voice_flags,
)


def add_parser(sub) -> None:
    r = sub.add_parser("run", help="the main job: play recorded conversations through the voice pipeline",
                       description="Play WAV files (or the bundled default conversation) through the full pipeline: "
                                   "endpointing, Whisper, the numba LLM on a simulated wafer deployment, piper; print "
                                   "each turn with its latency breakdown, its budget verdict and what it would have taken "
                                   "on the deployment, then a summary.")
    r.add_argument("wav", nargs="*", help="WAV files, played as one conversation (default: samples' default conversation)")
    r.add_argument("--conversation", default="default", help="conversation name from the samples' manifest")
    pace = r.add_mutually_exclusive_group()
    pace.add_argument("--realtime", dest="realtime", action="store_true", default=True,
                      help="feed audio at real-time pace (default)")
    pace.add_argument("--fast", dest="realtime", action="store_false",
                      help="feed audio as fast as possible; time runs on a virtual clock that adds measured compute")
    json_flag(r)
    r.add_argument("--save-audio", metavar="DIR", help="write the agent's answer audio to DIR/agent.wav")
    r.add_argument("--speak", action="store_true", help="also play the answers on the default sound device")
    r.add_argument("--plot", metavar="PNG", help="draw a per-turn latency waterfall")
    voice_flags(r)
    otel_flags(r)
    r.set_defaults(func=run)


def run(args) -> int:
    from voice.audio import read_wav
    from voice.replay import conversation_files

    console = json_console(args)
    config = loop_config(args)
    if args.wav:
        files = [Path(f) for f in args.wav]
    else:
        try:
            files = conversation_files(args.conversation)
        except (KeyError, FileNotFoundError) as exc:
            raise CLIError(str(exc).strip("'\"")) from None
    for f in files:
        read_wav(f)  # a bad file is reported before the engines load
    if args.speak and not args.realtime:
        raise CLIError("--speak needs real-time pacing (drop --fast)")
    tracing = otel_tracing(args)  # (a bad --otel is reported before the engines load)
    try:
        return _run(args, console, config, files, tracing)
    finally:
        if tracing is not None:
            tracing.shutdown()  # exports what is queued


def _run(args, console, config, files, tracing) -> int:
    from voice.audio import BufferSink, write_wav
    from voice.latency import summarize
    from voice.replay import play_conversation

    engines, deployed = load(args, console)
    console.print(f"playing {len(files)} file(s) {'in real time' if args.realtime else 'as fast as possible (virtual clock)'}, "
                  f"budget {config.budget_ms:.0f} ms" + (f", answers paced to {deployed.name}" if config.pace else "") + "\n")
    printer = report_printer(args, console)
    session = None  # the conversation's trace (--otel)

    def on_report(r) -> None:
        printer(r)
        if session is not None:
            session.turn(r, usage=engines.llm.last_usage)

    sink = BufferSink(engines.tts.sample_rate)
    speaker = None
    if args.speak:
        from voice.audio import TeeSink
        from voice.devices import Speaker

        speaker = Speaker(engines.tts.sample_rate).start()
        play_to = TeeSink(sink, speaker)
    else:
        play_to = sink
    if tracing is not None:  # (just before the loop and its clock are made: the clock's zero is the session's start)
        session = tracing.session(llm_info(args, engines.llm), attributes={
            "wafervox.session.source": "run", "wafervox.session.files": len(files), "wafervox.session.budget_ms": config.budget_ms,
            "wafervox.session.clock": "real" if args.realtime else "virtual", "wafervox.deployment": deployed.name})
    try:
        reports, loop = play_conversation(engines, files, realtime=args.realtime, config=config, on_report=on_report, sink=play_to)
    except BaseException as e:
        if session is not None:
            session.close("interrupted" if isinstance(e, KeyboardInterrupt) else "error", error=e)
        raise
    finally:
        if speaker is not None:
            speaker.close()
    if session is not None:
        session.close("finished", at_s=loop.clock.now())
    summary = summarize(reports)
    if args.json:
        print(json.dumps({"summary": summary}))
    else:
        print_summary(console, summary)
    if args.save_audio:
        out = Path(args.save_audio)
        try:
            write_wav(out / "agent.wav", sink.render(), sink.rate)
        except OSError as e:
            raise CLIError(f"--save-audio: cannot write {out / 'agent.wav'}: {e.strerror or e}") from None
        console.print(f"agent audio written to {out / 'agent.wav'}")
    if args.plot:
        from voice.plot import waterfall

        try:
            waterfall(reports, args.plot)
        except OSError as e:
            raise CLIError(f"--plot: cannot write {args.plot}: {e.strerror or e}") from None
        console.print(f"latency waterfall written to {args.plot}")
    return 0
