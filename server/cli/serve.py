"""``wafervox serve``: the websocket server (OpenAI Realtime subset and native stream) + the browser page."""

from __future__ import annotations

import os

from ..memory import fixed_mmap_threshold
from .common import CLIError, load, loop_config, priority_flag, voice_flags


def add_parser(sub) -> None:
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
    sv.add_argument("--max-connect-rate", type=float, default=10.0, metavar="N",
                    help="connections (websocket or HTTP) a second from one client address, in bursts of up to 2 s "
                         "worth; more get HTTP 429 (default 10)")
    sv.add_argument("-v", "--verbose", action="store_true", help="log sessions and errors to stderr")
    voice_flags(sv)
    priority_flag(sv)
    sv.set_defaults(func=run)


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_plan(per_session: int, max_sessions: int, available: int | None) -> str:
    """The memory ``max_sessions`` sessions need, checked against what the machine has left once the engines are
    loaded; a CLIError when they would not fit."""
    need = per_session * max_sessions
    mb = 1 << 20
    line = f"memory: {max_sessions} sessions x {per_session / mb:,.0f} MB (KV cache, scratch, wire buffers) = {need / mb:,.0f} MB"
    if available is None:
        return line + " (available memory unknown)"
    if need > available:
        fits = max(0, available // per_session)
        raise CLIError(f"--max-sessions {max_sessions} needs about {need / mb:,.0f} MB ({per_session / mb:,.0f} MB a session) "
                       f"and this machine has {available / mb:,.0f} MB available; use --max-sessions {fits} or less")
    return line + f" of {available / mb:,.0f} MB available"


def run(args) -> int:
    import asyncio
    import logging
    import signal

    from rich.console import Console

    from ..app import ServerOptions, VoiceServer
    from ..session import Limits

    console = Console(stderr=True)
    fixed_mmap_threshold()  # before the engines allocate anything
    for name, v in (("--max-sessions", args.max_sessions), ("--max-message-bytes", args.max_message_bytes),
                    ("--max-input-s", args.max_input_s), ("--max-output-bytes", args.max_output_bytes),
                    ("--idle-timeout", args.idle_timeout), ("--max-connect-rate", args.max_connect_rate)):
        if not v > 0 or v == float("inf"):
            raise CLIError(f"{name} must be a number > 0")
    if not 0 <= args.port <= 65535:
        raise CLIError("--port must be in 0..65535")
    token = args.token or os.environ.get("WAFERVOX_TOKEN") or None
    if args.host not in ("127.0.0.1", "::1", "localhost") and not token:
        console.print(f"[yellow]warning: listening on {args.host} without --token: anyone who can reach it can talk to it[/]")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    limits = Limits(max_sessions=args.max_sessions, max_message_bytes=args.max_message_bytes, max_input_s=args.max_input_s,
                    max_output_bytes=args.max_output_bytes, idle_timeout_s=args.idle_timeout)
    opts = ServerOptions(host=args.host, port=args.port, token=token, origins=tuple(args.allow_origin), limits=limits,
                         loop_config=loop_config(args), connect_rate=args.max_connect_rate)
    shared, deployed = load(args, console, shared=True)
    per_session = shared.session_bytes() + limits.session_buffer_bytes()
    console.print(f"[dim]{memory_plan(per_session, args.max_sessions, available_memory())}[/]")

    async def main() -> None:
        server = VoiceServer(shared, opts)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await server.start()
        except OSError as e:
            raise CLIError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
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
