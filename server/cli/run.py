"""``wafervox run``: the main job, recorded conversations played through the whole voice pipeline."""

from __future__ import annotations

import json
from pathlib import Path

from .common import CLIError, load, loop_config, print_summary, report_printer, voice_flags


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
    r.add_argument("--json", action="store_true", help="JSON Lines: one object per turn, then {\"summary\": ...}")
    r.add_argument("--save-audio", metavar="DIR", help="write the agent's answer audio to DIR/agent.wav")
    r.add_argument("--speak", action="store_true", help="also play the answers on the default sound device")
    r.add_argument("--plot", metavar="PNG", help="draw a per-turn latency waterfall")
    voice_flags(r)
    r.set_defaults(func=run)


def run(args) -> int:
    from rich.console import Console

    from voice.audio import BufferSink, read_wav, write_wav
    from voice.latency import summarize
    from voice.replay import conversation_files, play_conversation

    console = Console(stderr=args.json)
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
    engines, deployed = load(args, console)
    console.print(f"playing {len(files)} file(s) {'in real time' if args.realtime else 'as fast as possible (virtual clock)'}, "
                  f"budget {config.budget_ms:.0f} ms" + (f", answers paced to {deployed.name}" if config.pace else "") + "\n")
    on_report = report_printer(args, console)

    sink = BufferSink(engines.tts.sample_rate)
    speaker = None
    if args.speak:
        from voice.audio import TeeSink
        from voice.devices import Speaker

        speaker = Speaker(engines.tts.sample_rate).start()
        play_to = TeeSink(sink, speaker)
    else:
        play_to = sink
    try:
        reports, _ = play_conversation(engines, files, realtime=args.realtime, config=config, on_report=on_report, sink=play_to)
    finally:
        if speaker is not None:
            speaker.close()
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
