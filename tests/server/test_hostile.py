"""Hostile clients against ``wafervox serve`` with the real engines, over loopback: memory freed when sessions close
(with the garbage collector off), input too large for the context, instructions changed under a speculative
answer, lone surrogates, oversize frames and audio sent faster than real time.  Each gets its error event and the
session (and the server) goes on."""

from __future__ import annotations

import asyncio
import gc
import json
import time
import weakref

import numpy as np
import websockets
from test_server import _events_until, _Running, b64, pcm_at, run, turn_file

from server.app import ServerOptions
from voice.protocols import ASR_RATE


def text_turn(text: str) -> list[str]:
    return [json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                                      "content": [{"type": "input_text", "text": text}]}}),
            json.dumps({"type": "response.create"})]


async def wait_for(pred, timeout=15.0):
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.02)


def errors(events):
    return [e["error"] for e in events if e["type"] == "error"]


def test_closed_sessions_free_their_memory_without_the_garbage_collector(shared):
    """Sessions closed cleanly or aborted mid-answer: each one's KV cache is gone as soon as the server let go
    of the session, with the collector off (it used to wait for a collection: a reference cycle)."""
    s = _Running(shared, ServerOptions(port=0))
    gc.collect()
    gc.disable()
    try:
        caches = []

        async def one(i: int):
            ws = await websockets.connect(s.url())
            await _events_until(ws, lambda e: e["type"] == "session.created")
            await wait_for(lambda: all(x.loop is not None for x in s.server._conns.values()))
            caches.append(weakref.ref(next(iter(s.server._conns.values())).loop.e.llm.generator.state.k_cache))
            if i < 3:  # a turn, then gone: answered and closed, or aborted while answering
                for m in text_turn("What are your hours?"):
                    await ws.send(m)
                await _events_until(ws, lambda e: e["type"] == ("response.done" if i != 1 else "response.created"))
            if i % 2:
                ws.transport.abort()
            else:
                await ws.close()
            await wait_for(lambda: not s.server._conns)

        for i in range(6):
            run(one(i))
        run(wait_for(lambda: all(c() is None for c in caches), 10))
    finally:
        gc.enable()
        s.close()


def test_input_too_large_for_the_context_gets_an_error_and_the_session_goes_on(shared):
    s = _Running(shared, ServerOptions(port=0))
    try:
        async def go():
            async with websockets.connect(s.url()) as ws:
                await _events_until(ws, lambda e: e["type"] == "session.created")
                for m in text_turn("please tell me about the bakery " * 300):  # ~9 KB, ~1,800 tokens
                    await ws.send(m)
                big_text = await _events_until(ws, lambda e: e["type"] == "error")
                await ws.send(json.dumps({"type": "session.update", "event_id": "upd1",
                                          "session": {"type": "realtime", "instructions": "Always be kind. " * 700}}))
                big_instr = await _events_until(ws, lambda e: e["type"] in ("error", "session.updated"))
                await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}}))
                ok = await _events_until(ws, lambda e: e["type"] == "session.updated")
                for m in text_turn("What are your hours?"):
                    await ws.send(m)
                answered = await _events_until(ws, lambda e: e["type"] == "response.done", 60)
                return big_text, big_instr, ok, answered

        big_text, big_instr, ok, answered = run(go(), 120)
        assert errors(big_text)[-1]["code"] == "context_length_exceeded"
        assert big_instr[-1]["type"] == "error"
        err = big_instr[-1]["error"]
        assert err["code"] == "context_length_exceeded" and err["param"] == "session.instructions" and err["event_id"] == "upd1"
        assert ok[-1]["session"]["instructions"] == "Be brief."  # the refused update left nothing behind
        assert answered[-1]["response"]["status"] == "completed"
        assert not [e for e in errors(answered) if e["type"] == "server_error"]
    finally:
        s.close()


def test_instructions_changed_during_the_pause_after_speech(shared):
    """session.update while the speculative answer started at the pause is open: applied at the turn boundary (it
    used to kill the session: set_engines() under an answer)."""
    s = _Running(shared, ServerOptions(port=0))
    try:
        speech = pcm_at(turn_file("morning", 3))  # "Who is the owner?"
        pause = np.zeros(24000 * 120 // 1000, np.int16)  # 120 ms: past the early pause (90), before webrtcvad's

        async def go():
            async with websockets.connect(s.url()) as ws:
                await _events_until(ws, lambda e: e["type"] == "session.created")
                for i in range(0, len(speech), 4800):
                    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(speech[i:i + 4800])}))
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(pause)}))
                await asyncio.sleep(0.03)
                await ws.send(json.dumps({"type": "session.update", "session": {
                    "type": "realtime", "instructions": "You answer the phone for Rapid Wheels. The owner is Tom."}}))
                silence = np.zeros(4800, np.int16)
                for _ in range(10):
                    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(silence)}))
                    await asyncio.sleep(0.2)
                return await _events_until(ws, lambda e: e["type"] == "response.done", 60)

        events = run(go(), 120)
        assert any(e["type"] == "session.updated" for e in events)
        assert not errors(events)
        assert events[-1]["response"]["status"] in ("completed", "cancelled")
    finally:
        s.close()


def test_lone_surrogates_and_oversize_frames_get_errors(shared):
    s = _Running(shared, ServerOptions(port=0))
    try:
        item = {"type": "conversation.item.create", "event_id": "e4", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi \ud800"}]}}
        frames = [json.dumps({"type": "response.create", "event_id": "\ud800"}),
                  json.dumps({"type": "session.update\udc00"}),
                  json.dumps({"type": "session.update", "event_id": "e3", "session": {"type": "realtime", "instructions": "\udfff"}}),
                  json.dumps(item)]

        async def go():
            async with websockets.connect(s.url(), max_size=None) as ws:
                await _events_until(ws, lambda e: e["type"] == "session.created")
                got = []
                for f in frames:
                    await ws.send(f)
                    got += await _events_until(ws, lambda e: e["type"] == "error")
                await ws.send("x" * (3 << 20))  # 3 MiB of text: too large, not an input backlog
                got += await _events_until(ws, lambda e: e["type"] == "error")
                await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}}))
                got += await _events_until(ws, lambda e: e["type"] == "session.updated")
            async with websockets.connect(s.url("/v1/stream"), max_size=None) as ws:
                await _events_until(ws, lambda e: e["type"] == "session.created")
                await ws.send(bytes(2_400_000))  # 2.4 MB of PCM in one binary frame
                got += await _events_until(ws, lambda e: e["type"] == "error")
                await ws.send(bytes(9600))  # a normal frame still goes in
                await ws.send(json.dumps({"type": "session.latency"}))
                got += await _events_until(ws, lambda e: e["type"] == "session.latency")
            return got

        got = run(go(), 60)
        errs = errors(got)
        assert [e["code"] for e in errs] == ["invalid_unicode"] * 4 + ["message_too_large", "message_too_large"]
        assert [e["event_id"] for e in errs[:4]] == [None, None, "e3", "e4"]
        assert [e["param"] for e in errs[:4]] == ["event_id", "type", "session.instructions", "item.content[0].text"]
        assert any(e["type"] == "session.updated" and e["session"]["instructions"] == "Be brief." for e in got)
    finally:
        s.close()


def test_audio_sent_faster_than_real_time_is_capped_with_one_error(shared):
    s = _Running(shared, ServerOptions(port=0))
    try:
        speech = pcm_at(turn_file("morning", 1))
        gap = np.zeros(24000, np.int16)
        minute = np.tile(np.concatenate([speech, gap]), int(np.ceil(60 * 24000 / (len(speech) + len(gap)))))[:60 * 24000]

        async def go():
            async with websockets.connect(s.url()) as ws:
                await _events_until(ws, lambda e: e["type"] == "session.created")
                t0 = time.monotonic()
                for i in range(0, len(minute), 4800):
                    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(minute[i:i + 4800])}))
                sent_s = time.monotonic() - t0
                await ws.send(json.dumps({"type": "session.latency"}))
                return sent_s, await _events_until(ws, lambda e: e["type"] == "session.latency", 120)

        sent_s, events = run(go(), 180)
        assert sent_s < 20  # far faster than real time
        overflow = [e for e in errors(events) if e["code"] == "input_audio_buffer_overflow"]
        # one error per episode: audio too far ahead of the clock, and/or a backlog the session has not read yet
        assert 1 <= len(overflow) <= 2 and len(errors(events)) == len(overflow)
        assert all("faster than real time" in e["message"] or "waiting to be processed" in e["message"] for e in overflow)
        taken = sum(1 for e in events if e["type"] == "input_audio_buffer.committed")
        assert taken <= 30 * ASR_RATE // (len(speech) * ASR_RATE // 24000) + 1  # only the first ~30 s were taken
    finally:
        s.close()
