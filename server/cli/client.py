"""``wafervox client``: stream WAV files to a server in real time and time the answers on this side."""

from __future__ import annotations

import json
import os

from .common import CLIError, fmt_ms, json_console, json_flag


def add_parser(sub) -> None:
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
    json_flag(c)
    c.set_defaults(func=run)


def run(args) -> int:
    import asyncio

    import websockets

    from ..client import ClientOptions, run_client

    if args.timeout <= 0:
        raise CLIError("--timeout must be > 0")
    token = args.token or os.environ.get("WAFERVOX_TOKEN") or None
    console = json_console(args)
    opts = ClientOptions(url=args.url, token=token, native=args.native, rate=args.rate, tail_s=args.tail_s, timeout_s=args.timeout)

    def on_turn(t):
        if args.json:
            print(json.dumps(t), flush=True)
        else:
            lat = t["latency_ms"]
            verdict = "[green]within budget[/]" if t["within_budget"] else "[red]over budget[/]"
            console.print(f"[bold]turn {t['turn']}[/]  user: {t['transcript']!r}\n        agent: {t['reply']!r}")
            console.print(f"        voice-to-voice {fmt_ms(lat['voice_to_voice_ms'])} ms on this client's clock "
                          f"(server's own {fmt_ms(t['server_voice_to_voice_ms'])} ms), {verdict}")
            sim = t.get("simulated")
            if sim:
                console.print(f"        on simulated {sim['deployment']}: voice-to-voice {fmt_ms(sim['voice_to_voice_ms'])} ms")

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
    except OSError as e:
        raise CLIError(f"cannot reach {args.url}: {e.strerror or e}") from None
    if args.json:
        print(json.dumps({"summary": summary}), flush=True)
    else:
        v = summary["voice_to_voice_ms"]
        console.print(f"{summary['turns']} turns: voice-to-voice p50 {fmt_ms(v['p50'])} ms, p95 {fmt_ms(v['p95'])} ms "
                      f"(client clock); budget hit rate {summary['budget_hit_rate']}")
    return 0 if summary["turns"] else 1
