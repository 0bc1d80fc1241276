"""How much a neighbour holds up a healthy session's turn on one ``wafervox serve``: the timings the hostile-client
tests used to assert (``tests/server/test_hostile.py``, ``tests/server/test_chat_completions.py``), which check the
behaviour now (order, slices, steps) and leave the seconds to this script.

    .venv/bin/python bench/neighbours.py [--rounds 5] [--cases instructions utterance storm client-gone] [--json FILE]

Starts ``wafervox serve`` on a free loopback port (a separate process), opens one healthy session, and times its text
turn (``response.create`` to the answer's first audio, on this client's clock): alone and beside each case, in
alternating rounds (alone, beside, alone, ...), so that the ratio is taken within one run on the same warm server:

- ``instructions``: a fresh neighbour session sets instructions that make a ~1,300-token opening (a bulk prefill in slices);
- ``utterance``: a fresh neighbour commits a ~25 s utterance (its transcription runs beside the other work);
- ``storm``: another client opens and aborts connections and polls ``/metrics`` ~40 times a second (rate limited);
- ``client-gone``: not a turn: a client reads a few chunks of a 1,500-token chat completion and aborts; the time
  until ``/healthz`` shows no completion in progress (the decoding stopped).

Prints each case's median alone and beside (ms) and the ratio; the old tests' bar was 1.5x (3 s for client-gone).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import websockets

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _report import write_json  # noqa: E402  (beside this script: its folder is on sys.path)
from _serve import start_server, stop_server  # noqa: E402  (beside this script: its folder is on sys.path)

CASES = ("instructions", "utterance", "storm", "client-gone")


def _b64(pcm: np.ndarray) -> str:
    return base64.b64encode(pcm.astype("<i2").tobytes()).decode()


def _speech_24k(seconds: float) -> np.ndarray:
    """``seconds`` of the ``morning`` conversation's turns, back to back, at 24 kHz."""
    from voice.audio import read_wav, resample
    from voice.replay import SAMPLES, manifest

    files = manifest()["conversations"]["morning"][:4]
    parts = []
    for f in files:
        x, rate = read_wav(SAMPLES / f)
        parts.append(resample(x, rate, 24000))
    return np.concatenate(parts * int(np.ceil(seconds * 24000 / sum(len(p) for p in parts))))[:int(seconds * 24000)]


async def _until(ws, pred, timeout_s: float = 120.0) -> list[dict]:
    got = []
    async with asyncio.timeout(timeout_s):
        while True:
            ev = json.loads(await ws.recv())
            got.append(ev)
            if ev["type"] == "error":
                raise SystemExit(f"error event: {ev}")
            if pred(ev):
                return got


async def _text_turn_ms(ws, text: str = "What are your hours?") -> float:
    """response.create -> the answer's first audio (ms); waits for the response to finish."""
    await ws.send(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}))
    await ws.send(json.dumps({"type": "response.create"}))
    t0, first = time.monotonic(), None
    async with asyncio.timeout(180):
        while True:
            ev = json.loads(await ws.recv())
            if ev["type"] == "response.output_audio.delta" and first is None:
                first = time.monotonic()
            if ev["type"] == "response.done":
                return (first - t0) * 1000


@contextlib.asynccontextmanager
async def _neighbour(url: str, update: dict):
    async with websockets.connect(url, max_size=None) as ws:
        await _until(ws, lambda e: e["type"] == "session.created")
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", **update}}))
        await _until(ws, lambda e: e["type"] == "session.updated")
        yield ws


def _beside_instructions(url: str):
    @contextlib.asynccontextmanager
    async def beside(k: int):
        long = " ".join(f"Rule {k}.{i}: always greet the caller warmly and kindly." for i in range(30))
        async with _neighbour(url, {"instructions": long}):
            await asyncio.sleep(0.05)  # its prefill is under way
            yield
    return beside


def _beside_utterance(url: str):
    speech = _speech_24k(25.0)

    @contextlib.asynccontextmanager
    async def beside(k: int):
        async with _neighbour(url, {"audio": {"input": {"turn_detection": None}}}) as ws:
            for i in range(0, len(speech), 24000):
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": _b64(speech[i:i + 24000])}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            await _until(ws, lambda e: e["type"] == "input_audio_buffer.committed", 60)
            yield
            await _until(ws, lambda e: e["type"] == "response.done", 300)
    return beside


async def _get(port: int, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def _beside_storm(url: str, port: int):
    @contextlib.asynccontextmanager
    async def beside(k: int):
        stop = asyncio.Event()

        async def storm():
            while not stop.is_set():
                await _get(port, "/metrics")
                try:
                    ws = await websockets.connect(url, open_timeout=10)
                    ws.transport.abort()
                except websockets.InvalidStatus:
                    pass
                await asyncio.sleep(0.02)

        task = asyncio.create_task(storm())
        await asyncio.sleep(0.5)
        try:
            yield
        finally:
            stop.set()
            await task
    return beside


#: pause before every measured turn: the healthy session's own idle work after its last turn (the next turn's
#: prefill, due a second after that turn) is done by then, alone as beside
SETTLE_S = 1.5


async def _alternating(url: str, beside, rounds: int) -> tuple[list[float], list[float]]:
    async with websockets.connect(url, max_size=None) as healthy:
        await _until(healthy, lambda e: e["type"] == "session.created")
        await _text_turn_ms(healthy)  # warm
        alone, near = [], []
        for k in range(rounds):
            await asyncio.sleep(SETTLE_S)
            alone.append(await _text_turn_ms(healthy))
            await asyncio.sleep(SETTLE_S)
            async with beside(k):
                near.append(await _text_turn_ms(healthy))
        return alone, near


async def _client_gone_s(port: int) -> float:
    """A 1,500-token streamed completion, left after three text chunks: seconds until /healthz shows none running."""
    body = json.dumps({"model": "m", "max_tokens": 1500, "stream": True, "messages": [
        {"role": "user", "content": "Write a very long story about a dragon and a baker."}]}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    data = b""
    while data.count(b'"content"') < 4:
        chunk = await reader.read(4096)
        if not chunk:
            raise SystemExit(f"the completion ended early: {data[-300:]!r}")
        data += chunk
    writer.transport.abort()
    left = time.monotonic()
    while time.monotonic() - left < 120:
        status, health = await _get(port, "/healthz")
        if status == 200 and not json.loads(health).get("completions"):
            return time.monotonic() - left
        await asyncio.sleep(0.05)
    return float("inf")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds per case (default 5)")
    ap.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args()

    from decode import qint

    print(f"kernel path: {qint.select().name}; rounds {args.rounds}")
    out: dict[str, dict] = {}
    turns = [c for c in args.cases if c != "client-gone"]
    if turns:
        proc, port = start_server(["--max-connect-rate", "5"])  # the storm's rate limit, as in the test
        url = f"ws://127.0.0.1:{port}/v1/realtime"
        try:
            for case in turns:
                beside = {"instructions": lambda: _beside_instructions(url), "utterance": lambda: _beside_utterance(url),
                          "storm": lambda: _beside_storm(url, port)}[case]()
                alone, near = asyncio.run(_alternating(url, beside, args.rounds))
                a, b = statistics.median(alone), statistics.median(near)
                out[case] = {"alone_ms": alone, "beside_ms": near, "ratio": b / a}
                print(f"{case:>12}: alone p50 {a:.0f} ms, beside p50 {b:.0f} ms, ratio {b / a:.2f}x "
                      f"(alone {[round(x) for x in alone]}, beside {[round(x) for x in near]})")
        finally:
            stop_server(proc)
    if "client-gone" in args.cases:
        proc, port = start_server(["--max-connect-rate", "1000"])  # /healthz polled 20 times a second
        try:
            gone = [asyncio.run(_client_gone_s(port)) for _ in range(args.rounds)]
        finally:
            stop_server(proc)
        out["client-gone"] = {"stopped_s": gone, "median_s": statistics.median(gone)}
        print(f"{'client-gone':>12}: stopped {statistics.median(gone):.2f} s after the client left (median of {len(gone)}; "
              f"max {max(gone):.2f})")
    write_json(args.json, out)


if __name__ == "__main__":
    main()
