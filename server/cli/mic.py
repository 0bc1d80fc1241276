"""``wafervox mic``: the local microphone demo (sounddevice in, speaker out), its own voice taken out of the microphone
(``voice.aec``) unless ``--no-aec``."""

from __future__ import annotations

import json

from .common import CLIError, json_console, json_flag, load, loop_config, print_summary, priority_flag, report_printer, voice_flags


def add_parser(sub) -> None:
    m = sub.add_parser("mic", help="local microphone demo (speaker out)",
                       description="Run the same pipeline on a microphone and a speaker (the default ones unless --device). "
                                   "What the agent plays is cancelled out of what the microphone hears (echo cancellation), "
                                   "so it can run on a laptop's speakers.")
    m.add_argument("--seconds", type=float, default=0, help="stop after this many seconds (default: until Ctrl-C)")
    m.add_argument("--list-devices", action="store_true", help="list the sound devices (> default input, < default output) and exit")
    m.add_argument("--device", metavar="NAME|INDEX", default=None,
                   help="the sound device for both input and output: its index or a part of its name (see --list-devices)")
    m.add_argument("--input-device", metavar="NAME|INDEX", default=None, help="the microphone (overrides --device for input)")
    m.add_argument("--output-device", metavar="NAME|INDEX", default=None, help="the speaker (overrides --device for output)")
    m.add_argument("--no-aec", action="store_true",
                   help="do not cancel the agent's own voice out of the microphone (on headphones; by default it is, so the "
                        "agent does not hear itself through the speakers as the user)")
    record_flag(m)
    json_flag(m)
    voice_flags(m)
    priority_flag(m)
    m.set_defaults(func=run)


def record_flag(sp) -> None:
    """``--record DIR`` (``mic``, ``serve``): each session as a stereo WAV and its turns' JSON."""
    sp.add_argument("--record", metavar="DIR", default=None,
                    help="record each session into DIR: a stereo WAV (the user on the left as the loop heard it, the agent on "
                         "the right as it was played, on one clock) and a JSON of its turns' reports, named by time and session")


def check_record_dir(path) -> None:
    """``--record DIR`` made (or there) and writable, before anything slow loads."""
    import os
    from pathlib import Path

    if path is None:
        return
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CLIError(f"--record {path}: {e.strerror or e}") from None
    if not os.access(p, os.W_OK):
        raise CLIError(f"--record {path}: not writable")


def _devices(args) -> tuple[int, int]:
    """The input and output devices asked for, checked before the engines load (one line when there is none)."""
    from voice.devices import devices, resolve_device

    found = devices()
    return (resolve_device(args.input_device or args.device, "input", found),
            resolve_device(args.output_device or args.device, "output", found))


def run(args) -> int:
    from voice.devices import describe_devices

    if args.list_devices:
        print(describe_devices())
        return 0
    check_record_dir(args.record)
    in_dev, out_dev = _devices(args)
    console = json_console(args)
    config = loop_config(args)
    engines, deployed = load(args, console)
    return _listen(args, console, config, engines, in_dev, out_dev)


def _listen(args, console, config, engines, in_dev: int, out_dev: int) -> int:
    from voice.aec import echo_canceller
    from voice.clock import RealClock
    from voice.devices import Microphone, Speaker
    from voice.latency import summarize
    from voice.loop import VoiceLoop, run_until

    mic = Microphone(rate=16000, device=in_dev)
    speaker = Speaker(engines.tts.sample_rate, device=out_dev)
    on_report = report_printer(args, console)
    clock = RealClock()
    sink, clean = speaker, None
    if not args.no_aec:  # the delay between play and capture starts at what the devices report, then is estimated
        sink, clean = echo_canceller(speaker, clock, delay_s=mic.latency + speaker.latency)
    loop = VoiceLoop(engines, sink, clock, config, on_report=on_report)
    recording = None
    if args.record:
        from voice.recording import SessionRecording

        recording = SessionRecording.start(args.record, "mic", engines.tts.sample_rate)
        recording.attach(loop)

    def poll(timeout_s: float) -> None:
        """Feed what the microphone delivers within ``timeout_s``; return as soon as some came."""
        chunk = mic.get(timeout=timeout_s)
        while chunk is not None:
            loop.feed(chunk if clean is None else clean(chunk))
            chunk = mic.get(timeout=0)

    console.print("[bold]listening[/] (Ctrl-C to stop)" + (f" for {args.seconds:.0f} s" if args.seconds else "")
                  + ("" if args.no_aec else "; echo cancellation on"))
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
        if recording is not None:
            wav, meta = recording.close()
            console.print(f"[dim]recorded {wav} and {meta.name}[/]")
    if args.json:
        print(json.dumps({"summary": summarize(loop.reports)}), flush=True)
    elif loop.reports:
        print_summary(console, summarize(loop.reports))
    if clean is not None:
        c = clean.canceller
        console.print(f"[dim]echo canceller: delay {c.delay / 16:.0f} ms ({'estimated' if c.delays else 'as the devices report'})[/]")
    console.print(f"[dim]{mic.dropped} input samples dropped, {mic.overflows} overflows[/]")
    return 0
