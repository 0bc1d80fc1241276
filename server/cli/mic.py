"""``wafervox mic``: the local microphone demo (sounddevice in, speaker out)."""

from __future__ import annotations

import json

from .common import json_console, json_flag, load, loop_config, print_summary, priority_flag, report_printer, voice_flags


def add_parser(sub) -> None:
    m = sub.add_parser("mic", help="local microphone demo (speaker out)",
                       description="Run the same pipeline on the default microphone and speaker.")
    m.add_argument("--seconds", type=float, default=0, help="stop after this many seconds (default: until Ctrl-C)")
    json_flag(m)
    voice_flags(m)
    priority_flag(m)
    m.set_defaults(func=run)


def run(args) -> int:
    from voice.clock import RealClock
    from voice.devices import Microphone, Speaker
    from voice.latency import summarize
    from voice.loop import VoiceLoop, run_until

    console = json_console(args)
    config = loop_config(args)
    engines, deployed = load(args, console)
    mic = Microphone(rate=16000)
    speaker = Speaker(engines.tts.sample_rate)
    on_report = report_printer(args, console)

    loop = VoiceLoop(engines, speaker, RealClock(), config, on_report=on_report)

    def poll(timeout_s: float) -> None:
        """Feed what the microphone delivers within ``timeout_s``; return as soon as some came."""
        chunk = mic.get(timeout=timeout_s)
        while chunk is not None:
            loop.feed(chunk)
            chunk = mic.get(timeout=0)

    console.print("[bold]listening[/] (Ctrl-C to stop)" + (f" for {args.seconds:.0f} s" if args.seconds else ""))
    speaker.start()
    mic.start()
    try:
        while not args.seconds or loop.clock.now() < args.seconds:
            run_until(loop, loop.clock.now() + 0.05, poll=poll)
    except KeyboardInterrupt:
        pass
    finally:
        mic.close()
        speaker.close()
    if args.json:
        print(json.dumps({"summary": summarize(loop.reports)}), flush=True)
    elif loop.reports:
        print_summary(console, summarize(loop.reports))
    console.print(f"[dim]{mic.dropped} input samples dropped, {mic.overflows} overflows[/]")
    return 0
