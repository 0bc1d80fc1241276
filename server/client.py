"""``wafervox client``: stream WAV audio to a server in real time and time each answer on this side.

Voice-to-voice on the client's clock = when the first answer audio sample arrived minus when the
user's last voiced sample was sent.  The client finds the voiced samples itself, with the same
endpointer the server runs, over the audio it is about to send; it "plays" the answer as it arrives
and says so with ``output_audio.played`` (with ``input_sample``), so the server can report the same
figure on the client's audio clock.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import websockets

from voice.audio import read_wav, resample
from voice.latency import percentile
from voice.protocols import ASR_RATE
from voice.vad import Endpointer, SpeechStopped

CHUNK_MS = 20


@dataclass(frozen=True, slots=True)
class ClientOptions:
    url: str = "ws://127.0.0.1:8765/v1/realtime"
    token: str | None = None
    native: bool = False
    rate: int = 24000
    tail_s: float = 3.0
    timeout_s: float = 300.0
    budget_ms: float = 500.0


def load_audio(paths, rate: int) -> list[np.ndarray]:
    """The WAV files, mono int16 at ``rate``."""
    out = []
    for p in paths:
        x, src = read_wav(p)
        out.append(resample(x, src, rate))
    return out


def voiced_ends(pcm: np.ndarray, rate: int, tail_s: float) -> list[int]:
    """Input samples (at ``rate``) where each utterance's voice ends, by the server's own endpointer."""
    x = resample(pcm, rate, ASR_RATE)
    ep = Endpointer()
    ep.feed(np.concatenate([x, np.zeros(int(tail_s * ASR_RATE), np.int16)]))
    return [ev.last_voiced_sample * rate // ASR_RATE for ev in ep.events() if isinstance(ev, SpeechStopped)]


def _stream_url(url: str, native: bool) -> str:
    """The URL to connect to: ``/v1/stream`` when ``native``, else ``url`` asking for our extension events
    (``turn.latency``: this client reports every turn from them)."""
    u = urlsplit(url)
    if native:
        return urlunsplit((u.scheme, u.netloc, "/v1/stream", u.query, ""))
    if "extensions=" in u.query:
        return url
    query = f"{u.query}&extensions=1" if u.query else "extensions=1"
    return urlunsplit((u.scheme, u.netloc, u.path, query, u.fragment))


async def run_client(wavs, opts: ClientOptions, on_turn=None, progress=None) -> dict:
    """Stream ``wavs``; returns the summary; ``on_turn(dict)`` gets each turn as it completes."""
    say = progress or (lambda *a, **k: None)
    files = load_audio(wavs, opts.rate)
    ends: list[int] = []  # filled as each file starts: its voiced ends, in input samples since the start
    native = opts.native or urlsplit(opts.url).path == "/v1/stream"
    url = _stream_url(opts.url, native)
    headers = {"Authorization": f"Bearer {opts.token}"} if opts.token else None
    turns: list[dict] = []
    state = {"sent": 0, "out_samples": 0, "answer": None, "active": 0, "created": 0}
    answers: dict[str, dict] = {}  # by response id
    seen_turns: set = set()
    send_times: list[tuple[int, float]] = []  # (input samples sent, monotonic time just after)

    def sent_at(sample: int) -> float | None:
        for n, t in send_times:
            if n > sample:
                return t
        return None

    async with websockets.connect(url, additional_headers=headers, max_size=1 << 24, open_timeout=30) as ws:
        first = json.loads(await asyncio.wait_for(ws.recv(), 60))
        if first.get("type") != "session.created":
            raise RuntimeError(f"expected session.created, got {first.get('type')}: {first}")
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": opts.rate}},
            "output": {"format": {"type": "audio/pcm", "rate": 24000}}}}}))
        total = sum(len(x) for x in files) / opts.rate
        say(f"[dim]connected to {url}; streaming {len(files)} file(s), {total:.1f} s of audio, in real time[/]")
        n = opts.rate * CHUNK_MS // 1000
        t0 = time.monotonic()

        async def send_block(block: np.ndarray):
            due = t0 + state["sent"] / opts.rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            data = block.astype("<i2").tobytes()
            if native:
                await ws.send(data)
            else:
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(data).decode()}))
            state["sent"] += len(block)
            send_times.append((state["sent"], time.monotonic()))

        async def sender():
            silence = np.zeros(n, np.int16)
            for pcm in files:  # each file's answer plays out before the next starts, as in `wafervox run`
                ends.extend(state["sent"] + e for e in voiced_ends(pcm, opts.rate, opts.tail_s))
                created = state["created"]
                for i in range(0, len(pcm), n):
                    await send_block(pcm[i:i + n])
                quiet = 0.0
                while quiet < opts.tail_s + 30:
                    await send_block(silence)
                    quiet += CHUNK_MS / 1000
                    answered = state["created"] > created and state["active"] <= 0 and not answers
                    if quiet >= 1.0 and (answered or quiet >= opts.tail_s and state["created"] == created):
                        break

        def on_audio(nsamples: int, response_id: str | None, item_id: str | None):
            a = answers.get(response_id) if response_id else state["answer"]
            now = time.monotonic()
            if a is not None and a["first_at"] is None:
                a["first_at"] = now
                a["first_sample"] = state["out_samples"]
                past = [e for e in ends if e < state["sent"]]
                a["last_voiced"] = past[-1] if past else None
                played = {"type": "output_audio.played", "sample": state["out_samples"], "input_sample": state["sent"]}
                if response_id:
                    played.update(response_id=response_id, item_id=item_id)
                asyncio.ensure_future(ws.send(json.dumps(played)))
            state["out_samples"] += nsamples

        async def receiver():
            transcript = None
            async for msg in ws:
                if isinstance(msg, bytes):
                    on_audio(len(msg) // 2, None, None)
                    continue
                ev = json.loads(msg)
                kind = ev.get("type")
                if kind == "conversation.item.input_audio_transcription.completed":
                    transcript = ev["transcript"]
                elif kind == "response.created":
                    a = {"id": ev["response"]["id"], "first_at": None, "transcript": transcript, "reply": ""}
                    state["answer"] = answers[a["id"]] = a
                    state["active"] += 1
                    state["created"] += 1
                elif kind == "response.output_audio.delta":
                    on_audio(len(base64.b64decode(ev["delta"])) // 2, ev.get("response_id"), ev.get("item_id"))
                elif kind == "response.output_audio_transcript.done" and ev.get("response_id") in answers:
                    answers[ev["response_id"]]["reply"] = ev["transcript"]
                elif kind == "response.done":
                    state["active"] -= 1
                elif kind == "turn.latency":
                    _finish_turn(ev["report"])
                elif kind == "error":
                    say(f"[red]server error: {ev['error'].get('code')}: {ev['error'].get('message')}[/]")

        def _finish_turn(report: dict):
            if report.get("turn") in seen_turns:  # a repeat carrying the server's client-clock figure
                return
            seen_turns.add(report.get("turn"))
            a = answers.pop(report["response_id"], None) if report.get("response_id") else None
            if a is not None and state["answer"] is a:
                state["answer"] = None
            v2v = None
            if a is not None and a["first_at"] is not None and a["last_voiced"] is not None:
                t_last = sent_at(a["last_voiced"])
                if t_last is not None:
                    v2v = (a["first_at"] - t_last) * 1000
            lat = dict(report.get("latency_ms", {}))
            server_v2v = lat.get("voice_to_voice_ms")
            lat["voice_to_voice_ms"] = None if v2v is None else round(v2v, 1)
            t = {"turn": report.get("turn"), "transcript": report.get("transcript", ""), "reply": report.get("reply", ""),
                 "latency_ms": lat, "server_voice_to_voice_ms": server_v2v,
                 "overhead_ms": None if v2v is None or server_v2v is None else round(v2v - server_v2v, 1),
                 # the server's reckoning of our figure, from output_audio.played (input samples sent at first play)
                 "reported_client_voice_to_voice_ms": (report.get("client") or {}).get("voice_to_voice_ms"),
                 "budget_ms": report.get("budget_ms", opts.budget_ms),
                 "within_budget": v2v is not None and v2v <= report.get("budget_ms", opts.budget_ms),
                 "mitigation": report.get("mitigation"), "barge_in": report.get("barge_in", False),
                 "simulated": report.get("simulated")}
            turns.append(t)
            if on_turn:
                on_turn(t)

        recv_task = asyncio.create_task(receiver())
        send_task = asyncio.create_task(sender())
        deadline = time.monotonic() + opts.timeout_s
        try:
            while time.monotonic() < deadline:
                if recv_task.done():
                    recv_task.result()
                    break
                if send_task.done():
                    send_task.result()
                    if state["active"] <= 0 and not answers:
                        break
                await asyncio.sleep(0.05)
            else:
                say("[yellow]timed out[/]")
        finally:
            send_task.cancel()
            recv_task.cancel()
    return summarize_client(turns, opts.budget_ms)


def summarize_client(turns: list[dict], budget_ms: float) -> dict:
    v = [t["latency_ms"]["voice_to_voice_ms"] for t in turns]
    s = [t["server_voice_to_voice_ms"] for t in turns]
    o = [t["overhead_ms"] for t in turns]
    q = lambda xs, p: None if percentile(xs, p) is None else round(percentile(xs, p), 1)
    ok = sum(t["within_budget"] for t in turns)
    return {"turns": len(turns), "voice_to_voice_ms": {"p50": q(v, 0.5), "p95": q(v, 0.95)},
            "server_voice_to_voice_ms": {"p50": q(s, 0.5), "p95": q(s, 0.95)}, "overhead_ms": {"p50": q(o, 0.5), "p95": q(o, 0.95)},
            "within_budget": ok, "budget_hit_rate": round(ok / len(turns), 3) if turns else None, "budget_ms": budget_ms}
