"""Server sessions traced (``wafervox serve --otel``), over a real websocket on loopback with the real engines: the
barge-in recording in real time, the client leaving while the next answer is on its way.  The session's span ends at
the disconnect, the cut turn's spans end at the cut, and no span is left open."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time

import numpy as np
import pytest
import websockets
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from spans import OpenSpans

from server import tracing as T
from server.app import ServerOptions, VoiceServer
from voice.audio import read_wav, resample
from voice.replay import SAMPLES, manifest


@pytest.fixture
def traced_server(shared):
    exporter, opened = InMemorySpanExporter(), OpenSpans()
    tracing = T.Tracing.with_exporter(exporter)
    tracing.provider.add_span_processor(opened)
    T.install(tracing, T.LLMInfo(model="SmolLM2", max_tokens=48), {"wafervox.deployment": "test"})
    loop = asyncio.new_event_loop()
    server = VoiceServer(shared, ServerOptions(port=0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)
    try:
        yield f"ws://127.0.0.1:{server.port}/v1/realtime?extensions=1", exporter, opened
    finally:
        T.install(None)
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


async def _until(ws, pred, timeout=60):
    got = []
    async with asyncio.timeout(timeout):
        while True:
            ev = json.loads(await ws.recv())
            got.append(ev)
            if pred(ev):
                return got


def test_a_session_with_a_barge_in_and_a_disconnect_leaves_no_span_open(traced_server):
    url, exporter, opened = traced_server
    x, rate = read_wav(SAMPLES / manifest()["barge_in"]["file"])
    audio = np.concatenate([resample(x, rate, 24000), np.zeros(24000 * 3, np.int16)])

    async def go():
        async with websockets.connect(url) as ws:
            await _until(ws, lambda e: e["type"] == "session.created")

            async def feed():
                for i in range(0, len(audio), 480):  # real time, 20 ms
                    await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                              "audio": base64.b64encode(audio[i:i + 480].astype("<i2").tobytes()).decode()}))
                    await asyncio.sleep(0.02)

            feeder = asyncio.create_task(feed())
            try:
                await _until(ws, lambda e: e["type"] == "response.done" and e["response"]["status"] == "cancelled", 90)
                first = (await _until(ws, lambda e: e["type"] == "turn.latency", 30))[-1]["report"]
                await _until(ws, lambda e: e["type"] == "response.created", 60)  # the answer to the owner's question
            finally:
                feeder.cancel()
            return first  # and the client leaves, mid-answer

    first = asyncio.run(asyncio.wait_for(go(), 150))
    assert first["barge_in"] is True
    deadline = time.monotonic() + 30
    while not any(s.name == "voice.session" for s in exporter.get_finished_spans()) and time.monotonic() < deadline:
        time.sleep(0.05)
    spans = exporter.get_finished_spans()
    assert not opened.open, opened.open
    (session,) = [s for s in spans if s.name == "voice.session"]
    a = session.attributes
    assert session.kind is SpanKind.SERVER and a["wafervox.session.end_reason"] == "closed"
    assert a["wafervox.session.transport"] == "realtime" and a["wafervox.deployment"] == "test"
    assert a["wafervox.session.source"] == "serve"
    assert a["wafervox.session.cut_turn"] is True  # the client left while the second answer was on its way
    turns = [s for s in spans if s.name == "voice.turn"]
    assert len(turns) == a["wafervox.session.turns"] >= 1  # the answer cut by the disconnect has no report: no spans
    cut = next(t for t in turns if t.attributes["wafervox.turn.number"] == first["turn"])
    assert cut.attributes["wafervox.turn.barge_in"] is True and [e.name for e in cut.events] == ["barge_in"]
    assert cut.attributes["wafervox.latency.voice_to_voice_ms"] == pytest.approx(first["latency_ms"]["voice_to_voice_ms"], abs=0.06)
    stages = {s.attributes["wafervox.stage"]: s for s in spans if s.parent and s.parent.span_id == cut.context.span_id}
    assert {"user_speech", "endpoint", "asr", "llm"} <= set(stages)
    chat = stages["llm"]
    assert chat.name == "chat SmolLM2" and chat.attributes["gen_ai.usage.output_tokens"] > 0
    for s in spans:
        if s is not session:
            assert session.start_time <= s.start_time <= s.end_time <= session.end_time, s.name
