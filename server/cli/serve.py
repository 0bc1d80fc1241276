"""``wafervox serve``: the websocket server (OpenAI Realtime subset and native stream) + the browser page."""

from __future__ import annotations

import os

from ..memory import fixed_mmap_threshold
from .common import CLIError, llm_info, load, loop_config, otel_choice, otel_flags, otel_tracing, priority_flag, voice_flags
from .mic import check_record_dir, record_flag

#: the numeric limits: flag, type, default, help (each must be > 0)
LIMIT_FLAGS = (
    ("--max-sessions", int, 4, "concurrent sessions; more are refused with close code 1013 (default 4)"),
    ("--max-message-bytes", int, 1 << 20, "largest client message (default 1 MiB)"),
    ("--max-input-s", float, 30.0, "longest utterance and input backlog, in seconds (default 30)"),
    ("--max-output-bytes", int, 8 << 20, "output queued for a client that does not read before audio is dropped (default 8 MiB)"),
    ("--idle-timeout", float, 300.0, "close a session silent for this many seconds (default 300)"),
    ("--max-connect-rate", float, 10.0, "connections (websocket or HTTP) a second from one client address, in bursts of up "
                                        "to 2 s worth; more get HTTP 429 (default 10)"),
)


def add_parser(sub) -> None:
    description = ("Serve the voice loop to websocket clients: /v1/realtime speaks a subset of the OpenAI Realtime API (the openai "
                   "SDK connects with websocket_base_url=ws://HOST:PORT/v1), /v1/stream takes and sends raw PCM16 binary frames; "
                   "every turn ends with a turn.latency event. GET / is a browser demo, /healthz and /metrics (Prometheus) are "
                   "for operators, POST /v1/chat/completions answers OpenAI's Chat Completions API. An ASGI app on uvicorn.")
    sv = sub.add_parser("serve", help="websocket server (OpenAI Realtime subset) + browser demo page", description=description)
    for flag, help_text in (("--host", "address to bind (default 127.0.0.1: this machine only)"),
                            ("--token", "require this bearer token (default: $WAFERVOX_TOKEN, else none)")):
        sv.add_argument(flag, default="127.0.0.1" if flag == "--host" else None, help=help_text)
    sv.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 = any free port, printed when ready)")
    sv.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                    help="browser Origin allowed besides the server's own pages (repeatable; '*' allows any)")
    for flag, kind, default, help_text in LIMIT_FLAGS:
        sv.add_argument(flag, type=kind, default=default, metavar="N", help=help_text)
    sv.add_argument("--workers", type=int, default=1, metavar="N",
                    help="serve from N processes sharing the port; the kernel hands each new connection to one of them. Each "
                         "process loads its own engines (N times the memory, N times the compute threads: one process per "
                         "machine or per 2 cores is the rule, see README) and has its own --max-sessions, memory check and "
                         "rate limit (default 1)")
    sv.add_argument("--trust-proxy", action="append", default=[], metavar="ADDR",
                    help="a load balancer's address whose X-Forwarded-For is believed, so that the per-address limits see the "
                         "client's address (repeatable; '*' trusts any)")
    sv.add_argument("--public-url", metavar="URL", default=None, type=_public_url,
                    help="the server's address as a phone provider reaches it (https://NAME: an ngrok tunnel or a reverse "
                         "proxy); the TwiML of POST /v1/twilio/voice points the call's stream at URL/v1/twilio/stream "
                         "(default: the request's Host, as wss://)")
    sv.add_argument("--twilio-auth-token", metavar="TOKEN", default=os.environ.get("TWILIO_AUTH_TOKEN") or None,
                    help="the Twilio account's auth token: POST /v1/twilio/voice then answers only requests that carry "
                         "Twilio's X-Twilio-Signature, made over the webhook's URL (--public-url when the server is behind a "
                         "proxy or a tunnel); default: $TWILIO_AUTH_TOKEN (an environment variable keeps it out of ps)")
    sv.add_argument("-v", "--verbose", action="store_true", help="log sessions and errors to stderr")
    record_flag(sv)
    voice_flags(sv)
    otel_flags(sv)
    priority_flag(sv)
    sv.set_defaults(func=run)


def _public_url(value: str) -> str:
    import argparse

    from ..twilio import check_public_url

    try:
        return check_public_url(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


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
    import logging

    from rich.console import Console

    from ..asgi import bind

    console = Console(stderr=True)
    fixed_mmap_threshold()  # before the engines allocate anything
    for flag, *_ in LIMIT_FLAGS:
        v = getattr(args, flag[2:].replace("-", "_"))
        if not v > 0 or v == float("inf"):
            raise CLIError(f"{flag} must be a number > 0")
    if not 0 <= args.port <= 65535:
        raise CLIError("--port must be in 0..65535")
    if args.workers < 1:
        raise CLIError("--workers must be 1 or more")
    otel_choice(args)  # (checked here; each serving process starts its own exporter)
    check_record_dir(args.record)
    args.token = args.token or os.environ.get("WAFERVOX_TOKEN") or None
    if args.host not in ("127.0.0.1", "::1", "localhost") and not args.token:
        console.print(f"[yellow]warning: listening on {args.host} without --token: anyone who can reach it can talk to it[/]")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        raise CLIError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    host = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{host}:{sock.getsockname()[1]}"
    if args.workers > 1:
        return _workers(args, sock, url, console)

    def ready() -> None:
        print(f"listening on {url}", flush=True)
        console.print(f"[dim]demo page {url}/ · realtime ws://{url[7:]}/v1/realtime · native ws://{url[7:]}/v1/stream · "
                      "/healthz · /metrics · Ctrl-C stops[/]")

    _serve(args, sock, console, ready)
    return 0


def _serve(args, sock, console, ready) -> None:
    """One process: the engines loaded, the server on ``sock`` until SIGINT or SIGTERM; ``ready()`` once it listens."""
    import asyncio
    import signal

    from ..app import ServerOptions, VoiceServer
    from ..session import Limits

    limits = Limits(max_sessions=args.max_sessions, max_message_bytes=args.max_message_bytes, max_input_s=args.max_input_s,
                    max_output_bytes=args.max_output_bytes, idle_timeout_s=args.idle_timeout)
    opts = ServerOptions(host=args.host, port=args.port, token=args.token, origins=tuple(args.allow_origin), limits=limits,
                         loop_config=loop_config(args), connect_rate=args.max_connect_rate, trusted_proxies=tuple(args.trust_proxy),
                         public_url=args.public_url, twilio_auth_token=args.twilio_auth_token, record=args.record)
    shared, deployed = load(args, console, shared=True)
    per_session = shared.session_bytes() + limits.session_buffer_bytes()
    console.print(f"[dim]{memory_plan(per_session, args.max_sessions, available_memory())}[/]")
    tracing = otel_tracing(args)  # every session traced (server.tracing), in this process
    if tracing is not None:
        from ..tracing import install

        install(tracing, llm_info(args, shared.base.llm), {"wafervox.deployment": deployed.name,
                                                           "wafervox.session.budget_ms": opts.loop_config.budget_ms})

    async def main() -> None:
        server = VoiceServer(shared, opts)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await server.start(sock)
        ready()
        try:
            await stop.wait()
        finally:
            await server.stop()

    try:
        asyncio.run(main())
    finally:
        if tracing is not None:
            install(None)
            tracing.shutdown()  # exports what is queued


def _workers(args, sock, url: str, console) -> int:
    """``--workers N``: N forked processes serve the one listening socket (each loads its own engines); this one waits
    for all to listen, says so, passes SIGINT/SIGTERM on and waits for them."""
    import signal
    import sys

    from . import _our_errors

    sock.listen(2048)
    reads, writes = os.pipe()
    pids = []
    for _ in range(args.workers):
        pid = os.fork()
        if pid == 0:  # a worker
            os.close(reads)
            code = 0
            try:
                _serve(args, sock, console, lambda: os.write(writes, b"1"))
            except _our_errors() as exc:
                print(f"wafervox: error: {exc}", file=sys.stderr)
                code = 2
            except KeyboardInterrupt:
                code = 130
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
        pids.append(pid)
    os.close(writes)
    sock.close()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: _signal_all(pids, signal.SIGTERM))
    ready = 0
    while ready < args.workers and (got := os.read(reads, args.workers - ready)):
        ready += len(got)
    if ready == args.workers:
        print(f"listening on {url}", flush=True)
        console.print(f"[dim]{args.workers} processes serve {url} (each with --max-sessions {args.max_sessions}) · Ctrl-C stops[/]")
    else:  # a worker ended before it listened: the others go too
        _signal_all(pids, signal.SIGTERM)
    codes = []
    for pid in pids:
        while True:
            try:
                codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
                break
            except InterruptedError:
                continue
        if codes[-1] != 0:
            _signal_all(pids, signal.SIGTERM)
    return next((c for c in codes if c > 0), 0)


def _signal_all(pids: list[int], sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
