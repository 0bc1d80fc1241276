"""Hostile clients against ``wafervox serve`` with the real engines, over loopback: memory freed when sessions close
(with the garbage collector off), input too large for the context, instructions changed under a speculative
answer, lone surrogates, oversize frames and audio sent faster than real time.  Each gets its error event and the
session (and the server) goes on."""

from __future__ import annotations

import asyncio
import contextlib
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
                item = json.loads(text_turn("x" * 10_000)[0])
                for k in range(4):  # text items piling up without response.create: the 4th is past what is kept
                    await ws.send(json.dumps({**item, "event_id": f"item{k}"}))
                piled = await _events_until(ws, lambda e: e["type"] == "error")
                await ws.send(json.dumps({"type": "response.create"}))  # the three kept are too long for a prompt
                piled += await _events_until(ws, lambda e: e["type"] == "error")
                big_text += piled
                await ws.send(json.dumps({"type": "session.update", "event_id": "upd1",
                                          "session": {"type": "realtime", "instructions": "Always be kind. " * 700}}))
                big_instr = await _events_until(ws, lambda e: e["type"] in ("error", "session.updated"))
                await ws.send(json.dumps({"type": "session.update", "event_id": "upd2", "session": {
                    "type": "realtime", "instructions": "The widget costs $5. " * 20_000}}))  # 420 KB: refused unread
                huge_instr = await _events_until(ws, lambda e: e["type"] in ("error", "session.updated"))
                big_instr += huge_instr
                await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}}))
                ok = await _events_until(ws, lambda e: e["type"] == "session.updated")
                for m in text_turn("What are your hours?"):
                    await ws.send(m)
                answered = await _events_until(ws, lambda e: e["type"] == "response.done", 60)
                return big_text, big_instr, ok, answered

        big_text, big_instr, ok, answered = run(go(), 120)
        assert [e["code"] for e in errors(big_text)] == ["context_length_exceeded"] * 3
        assert errors(big_text)[1]["event_id"] == "item3" and "waiting" in errors(big_text)[1]["message"]
        assert big_instr[-1]["type"] == "error"
        err, huge = errors(big_instr)
        assert err["code"] == "context_length_exceeded" and err["param"] == "session.instructions" and err["event_id"] == "upd1"
        assert (huge["code"], huge["event_id"]) == ("context_length_exceeded", "upd2") and "characters" in huge["message"]
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
                for i in range(0, len(minute), 4800):  # as fast as the socket takes it: far faster than real time
                    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(minute[i:i + 4800])}))
                await ws.send(json.dumps({"type": "session.latency"}))
                return await _events_until(ws, lambda e: e["type"] == "session.latency", 120)

        events = run(go(), 180)
        overflow = [e for e in errors(events) if e["code"] == "input_audio_buffer_overflow"]
        # one error per episode: audio too far ahead of the clock, and/or a backlog the session has not read yet
        assert 1 <= len(overflow) <= 2 and len(errors(events)) == len(overflow)
        assert all("faster than real time" in e["message"] or "waiting to be processed" in e["message"] for e in overflow)
        taken = sum(1 for e in events if e["type"] == "input_audio_buffer.committed")
        assert taken <= 30 * ASR_RATE // (len(speech) * ASR_RATE // 24000) + 1  # only the first ~30 s were taken
    finally:
        s.close()


async def _text_turn(ws, on_first_audio=lambda: None, text="What are your hours?") -> list[dict]:
    """A text turn: ``on_first_audio()`` is called when the answer's first audio arrives; returns the turn's events
    once the response is done (none of them an error)."""
    for m in text_turn(text):
        await ws.send(m)
    events, heard = [], False
    async with asyncio.timeout(180):
        while True:
            ev = json.loads(await ws.recv())
            events.append(ev)
            assert ev["type"] != "error", ev
            if ev["type"] == "response.output_audio.delta" and not heard:
                heard = True
                on_first_audio()
            if ev["type"] == "response.done":
                assert heard and ev["response"]["status"] == "completed", ev
                return events


@contextlib.asynccontextmanager
async def _neighbour(s: _Running, update: dict):
    """A fresh session with ``update`` applied to it."""
    async with websockets.connect(s.url()) as ws:
        await _events_until(ws, lambda e: e["type"] == "session.created")
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", **update}}))
        updated = await _events_until(ws, lambda e: e["type"] in ("session.updated", "error"))
        assert updated[-1]["type"] == "session.updated", updated[-1]  # accepted: the work it sets going is what is checked
        yield ws


class _BulkSlices:
    """The bulk prefill slices the shared compute thread runs (``ComputeThread.step(..., bulk=True)``), in order: the
    sequence (its state) and first position of each, appended once the slice is done."""

    def __init__(self, compute, monkeypatch):
        self.done: list[tuple[int, int]] = []
        step = compute.step

        def counting(model, state, tokens, pos0, bulk=False):
            out = step(model, state, tokens, pos0, bulk=bulk)
            if bulk:
                self.done.append((id(state), pos0))
            return out

        monkeypatch.setattr(compute, "step", counting)


def test_a_neighbours_long_instructions_do_not_hold_up_a_turn(shared, monkeypatch):
    """Another session's instructions (an opening of ~1,300 tokens) are prefilled as bulk work, in slices that yield: a healthy
    session's text turn asked for while that prefill is under way has its first audio before the prefill is done, the
    neighbour's slices running on both sides of it (counted in slices, not timed: bench/neighbours.py times it)."""
    slices = _BulkSlices(shared.compute, monkeypatch)
    long = " ".join(f"Rule {i}: always greet the caller warmly and kindly." for i in range(30))  # a ~1,300-token opening
    s = _Running(shared, ServerOptions(port=0))
    try:
        async def go():
            async with websockets.connect(s.url()) as healthy:
                await _events_until(healthy, lambda e: e["type"] == "session.created")
                await _text_turn(healthy)  # its own context prefilled and answered first
                slices.done.clear()
                async with _neighbour(s, {"instructions": long}) as neighbour:
                    await wait_for(lambda: slices.done, 120)  # the neighbour's prefill is under way
                    asked = len(slices.done)
                    heard = []
                    await _text_turn(healthy, lambda: heard.append(len(slices.done)))
                    for m in text_turn("Hello?"):  # the neighbour's own answer comes after its whole prefill
                        await neighbour.send(m)
                    await _events_until(neighbour, lambda e: e["type"] == "response.done", 300)
                    return asked, heard[0], list(slices.done)

        asked, heard, done = run(go(), 600)
        neighbour = max(set(sid for sid, _ in done), key=[sid for sid, _ in done].count)  # the ~1,300-token opening
        mine = [i for i, (sid, _) in enumerate(done) if sid == neighbour]
        before, after = [i for i in mine if i < heard], [i for i in mine if i >= heard]
        print(f"{len(mine)} slices of the neighbour's prefill: {asked} done before the turn was asked, {heard} before its "
              "first audio")
        assert mine[0] < asked and before and after, (asked, heard, len(mine))  # slices before and after the answer,
        assert done[before[-1]][1] < done[after[0]][1]  # of one prefill going on across it (positions onwards)
    finally:
        s.close()


def test_a_neighbours_long_utterance_does_not_hold_up_a_turn(shared):
    """Another session commits a ~25 s utterance (its transcription runs beside the other work, not before it): a
    healthy session's text turn asked for once it is committed has its first audio before that transcription is
    done (in the order the events arrive, not timed: bench/neighbours.py times it)."""
    speech = np.concatenate([pcm_at(turn_file("morning", i)) for i in range(4)] * 2)[:25 * 24000]
    s = _Running(shared, ServerOptions(port=0))
    try:
        async def go():
            order: list[str] = []
            async with websockets.connect(s.url()) as healthy:
                await _events_until(healthy, lambda e: e["type"] == "session.created")
                await _text_turn(healthy)  # warm
                async with _neighbour(s, {"audio": {"input": {"turn_detection": None}}}) as neighbour:
                    committed = asyncio.Event()

                    async def watch():  # the neighbour's events as they arrive, beside the healthy session's
                        async with asyncio.timeout(300):
                            while True:
                                ev = json.loads(await neighbour.recv())
                                if ev["type"] == "input_audio_buffer.committed":
                                    committed.set()
                                elif ev["type"] == "conversation.item.input_audio_transcription.completed":
                                    order.append("neighbour transcribed")
                                elif ev["type"] == "response.done":
                                    return

                    watcher = asyncio.create_task(watch())
                    for i in range(0, len(speech), 24000):
                        await neighbour.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(speech[i:i + 24000])}))
                    await neighbour.send(json.dumps({"type": "input_audio_buffer.commit"}))
                    await asyncio.wait_for(committed.wait(), 60)
                    order.append("healthy asked")
                    await _text_turn(healthy, lambda: order.append("healthy heard"))
                    await watcher
            return order

        order = run(go(), 600)
        assert order == ["healthy asked", "healthy heard", "neighbour transcribed"], order
    finally:
        s.close()


async def _get(port: int, path: str) -> int:
    """A raw HTTP GET on loopback; the status code."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    writer.close()
    return status


def test_a_reconnect_storm_does_not_hold_up_a_turn_and_is_rate_limited(shared):
    """Another client opens and aborts connections and polls /metrics as fast as it can: past its burst it gets HTTP
    429 (the rate limit per address), and the healthy session's text turns, asked for while the storm goes on, are
    answered in full meanwhile (how much slower is bench/neighbours.py's to measure)."""
    s = _Running(shared, ServerOptions(port=0, connect_rate=5.0))
    try:
        async def go():
            outcomes = {"opened": 0, "limited": 0, "metrics": 0}

            async def storm(stop: asyncio.Event):
                while not stop.is_set():
                    status = await _get(s.port, "/metrics")
                    assert status in (200, 429)
                    outcomes["metrics"] += status == 200
                    try:
                        ws = await websockets.connect(s.url(), open_timeout=10)
                        outcomes["opened"] += 1
                        ws.transport.abort()
                    except websockets.InvalidStatus as e:
                        assert e.response.status_code == 429
                        outcomes["limited"] += 1
                    await asyncio.sleep(0.02)  # ~40 attempts a second, 8x the limit (the test client shares this process)

            async with websockets.connect(s.url()) as healthy:
                await _events_until(healthy, lambda e: e["type"] == "session.created")
                await _text_turn(healthy)  # warm
                stop = asyncio.Event()
                task = asyncio.create_task(storm(stop))
                await wait_for(lambda: outcomes["limited"] >= 1, 60)  # the storm is past its burst
                during = []
                for _ in range(3):
                    before = sum(outcomes.values())
                    await _text_turn(healthy)
                    during.append(sum(outcomes.values()) - before)
                stop.set()
                await task
                return during, outcomes

        during, outcomes = run(go(), 300)
        print(f"storm attempts during each turn {during}, {outcomes}")
        assert all(n >= 1 for n in during), during  # the storm went on through every turn, and every turn was answered
        assert outcomes["limited"] > outcomes["opened"] >= 5 and outcomes["metrics"] >= 1
        assert s.server.metrics.rejected.labels("rate")._value.get() >= outcomes["limited"]
    finally:
        s.close()


def test_the_rate_limiter_is_a_token_bucket_per_address():
    from server.app import RateLimiter

    now = [0.0]
    rl = RateLimiter(rate=2.0, burst=4.0, clock=lambda: now[0], max_tracked=3)
    assert [rl.allow("a") for _ in range(5)] == [True] * 4 + [False]  # the burst, then refused
    assert rl.allow("b")  # another address has its own bucket
    now[0] = 0.5
    assert rl.allow("a") and not rl.allow("a")  # 2 a second: one more after half a second
    for i in range(10):  # many addresses: those whose bucket refilled are forgotten, the table stays small
        now[0] += 10
        rl.allow(f"x{i}")
    assert len(rl._buckets) <= 4
