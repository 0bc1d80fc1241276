"""A strict Realtime client's view of whole sessions: every frame the server sends validates against the openai SDK's
``RealtimeServerEvent`` union with no field its schema lacks, and the client's conversation can be kept from the item
events alone (``conversation.item.added`` / ``.done``, ``response.output_item.*``, ``response.content_part.*``,
``conversation.item.retrieve`` / ``.delete``)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pydantic
import websockets
from openai.types import realtime as rt
from test_protocol import _extras
from test_server import TOKEN, b64, pcm_at, run, turn_file, turn_info

from server.realtime.events import EXTENSION_EVENTS

STRICT = pydantic.TypeAdapter(rt.RealtimeServerEvent)
EXTENSIONS = EXTENSION_EVENTS


class StrictClient:
    """A websocket client that validates every server event as it arrives and keeps the conversation from item events."""

    def __init__(self, ws):
        self.ws = ws
        self.frames: list[dict] = []
        self.items: dict[str, dict] = {}  # item id -> the latest realtime.item, in the order added
        self.order: list[str] = []

    async def send(self, **event) -> None:
        await self.ws.send(json.dumps(event))

    async def until(self, pred, timeout: float = 60) -> list[dict]:
        got = []
        async with asyncio.timeout(timeout):
            while True:
                ev = json.loads(await self.ws.recv())
                model = STRICT.validate_python(ev)  # raises on anything outside the schema
                assert _extras(model) == [], (ev["type"], _extras(model))
                self.frames.append(ev)
                got.append(ev)
                if ev["type"] in ("conversation.item.added", "conversation.item.done"):
                    item = ev["item"]
                    if ev["type"] == "conversation.item.added":
                        assert item["id"] not in self.items, f"{item['id']} added twice"
                        prev = ev["previous_item_id"]
                        assert prev is None or prev in self.order, f"previous_item_id {prev} unknown"
                        self.order.append(item["id"])
                    self.items[item["id"]] = item
                elif ev["type"] == "conversation.item.deleted":
                    self.order.remove(ev["item_id"])
                    del self.items[ev["item_id"]]
                if pred(ev):
                    return got

    async def quiet(self, seconds: float = 1.0) -> list[dict]:
        """What arrives within ``seconds`` of silence."""
        try:
            return await self.until(lambda e: False, seconds)
        except TimeoutError:
            return []


def _types(evs: list[dict]) -> list[str]:
    return [e["type"] for e in evs]


def _index(turn: list[dict], name: str) -> int:
    """Where the first ``name`` event of ``turn`` is (of the item events, the assistant's)."""
    return next(i for i, e in enumerate(turn) if e["type"] == name
                and (not name.startswith("conversation.item.") or e["item"]["role"] == "assistant"))


def test_a_whole_session_validates_and_keeps_the_conversation(server):
    audio = np.concatenate([pcm_at(turn_file()), np.zeros(24000 * 2, np.int16)])

    async def go():
        async with websockets.connect(server.url("/v1/realtime"), additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
            c = StrictClient(ws)
            await c.until(lambda e: e["type"] == "session.created")
            await c.send(type="session.update", session={"type": "realtime",
                                                         "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}}})
            await c.until(lambda e: e["type"] == "session.updated")
            # 1. a spoken turn
            for i in range(0, len(audio), 4800):
                await c.send(type="input_audio_buffer.append", audio=b64(audio[i:i + 4800]))
            turn1 = await c.until(lambda e: e["type"] == "response.done")
            turn1 += await c.quiet(1.5)
            # 2. the user's item, retrieved
            user = next(e["item_id"] for e in turn1 if e["type"] == "input_audio_buffer.committed")
            await c.send(type="conversation.item.retrieve", item_id=user, event_id="evt_r1")
            retrieved = (await c.until(lambda e: e["type"] in ("conversation.item.retrieved", "error")))[-1]
            # 3. a typed turn
            await c.send(type="conversation.item.create", item={"type": "message", "role": "user",
                                                                "content": [{"type": "input_text", "text": "Who is the owner?"}]})
            await c.send(type="response.create", event_id="evt_c2",
                         response={"metadata": {"turn": "2"},
                                   "instructions": "You answer the phone for Rapid Wheels, a bike shop. The owner is Tom Baker."})
            turn2 = await c.until(lambda e: e["type"] == "response.done")
            # 4. a response cancelled at once
            await c.send(type="conversation.item.create", item={"type": "message", "role": "user",
                                                                "content": [{"type": "input_text", "text": "Where are you?"}]})
            await c.send(type="response.create")
            await c.until(lambda e: e["type"] == "response.created")
            await c.send(type="response.cancel")
            turn3 = await c.until(lambda e: e["type"] == "response.done")
            # 5. truncate the second answer, delete the first user item, then ask for it again; a bad event
            bot2 = next(e["item"]["id"] for e in turn2 if e["type"] == "response.output_item.added")
            await c.send(type="conversation.item.truncate", item_id=bot2, content_index=0, audio_end_ms=0)
            await c.until(lambda e: e["type"] == "conversation.item.truncated")
            await c.send(type="conversation.item.delete", item_id=user)
            await c.until(lambda e: e["type"] == "conversation.item.deleted")
            await c.send(type="conversation.item.retrieve", item_id=user, event_id="evt_r2")
            gone = (await c.until(lambda e: e["type"] == "error"))[-1]
            await c.send(type="conversation.item.retrieve", item_id=bot2)
            truncated = (await c.until(lambda e: e["type"] == "conversation.item.retrieved"))[-1]
            await c.send(type="no.such.event", event_id="evt_bad")
            bad = (await c.until(lambda e: e["type"] == "error"))[-1]
            await c.quiet(0.5)
            return c, turn1, retrieved, turn2, turn3, gone, truncated, bad

    c, turn1, retrieved, turn2, turn3, gone, truncated, bad = run(go(), 240)
    assert not EXTENSIONS & set(_types(c.frames))  # a client that did not ask gets only the schema's events

    # the spoken turn: the user's item added at commit, done with its transcript
    transcript = next(e["transcript"] for e in turn1 if e["type"] == "conversation.item.input_audio_transcription.completed")
    user_done = [e for e in turn1 if e["type"] == "conversation.item.done" and e["item"]["role"] == "user"]
    assert len(user_done) == 1 and user_done[0]["item"]["content"][0]["transcript"] == transcript
    assert retrieved["type"] == "conversation.item.retrieved" and retrieved["item"]["content"][0]["transcript"] == transcript

    # the answer's lifecycle, in the order of the GA API
    for turn in (turn1, turn2):
        kinds = _types(turn)
        order = ["response.created", "response.output_item.added", "conversation.item.added", "response.content_part.added",
                 "response.output_audio.delta", "response.output_audio.done", "response.output_audio_transcript.done",
                 "response.content_part.done", "response.output_item.done", "conversation.item.done", "response.done"]
        at = [_index(turn, name) for name in order]
        assert at == sorted(at), list(zip(order, at))
        done = turn[kinds.index("response.done")]["response"]
        item = turn[kinds.index("response.output_item.done")]["item"]
        assert done["status"] == "completed" and item["status"] == "completed"
        assert done["output"][0]["id"] == item["id"] and done["output"][0]["content"][0]["transcript"] == item["content"][0]["transcript"]
        usage = done["usage"]  # the reply's tokens: its whole prompt (most of it cached) and what it generated
        assert usage["output_tokens"] > 0 and usage["input_tokens"] > usage["input_token_details"]["cached_tokens"] > 0
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
        part = turn[kinds.index("response.content_part.done")]["part"]
        assert part == {"type": "audio", "transcript": item["content"][0]["transcript"]}

    # response.create's metadata echoed; its per-response instructions (with their own facts) answer that response
    kinds2 = _types(turn2)
    assert turn2[kinds2.index("response.created")]["response"]["metadata"] == {"turn": "2"}
    done2 = turn2[kinds2.index("response.done")]["response"]
    assert done2["metadata"] == {"turn": "2"} and "Tom" in done2["output"][0]["content"][0]["transcript"]
    assert not [e for e in turn2 if e["type"] == "error"]

    # the typed item: added and done at once, with its text; the cancelled answer is incomplete
    typed = [e for e in turn2 if e["type"] == "conversation.item.done" and e["item"]["role"] == "user"]
    assert len(typed) == 1 and typed[0]["item"]["content"][0] == {"type": "input_text", "text": "Who is the owner?"}
    assert _types(turn2).index("conversation.item.done") < _types(turn2).index("response.created")
    cancelled = turn3[-1]["response"]
    assert cancelled["status"] == "cancelled"
    if cancelled["output"]:
        assert c.items[cancelled["output"][0]["id"]]["status"] == "incomplete"

    # truncate, delete, retrieve
    assert truncated["item"]["status"] == "incomplete" and truncated["item"]["content"][0]["transcript"] == ""
    assert gone["error"]["code"] == "item_not_found" and gone["error"]["event_id"] == "evt_r2"
    assert bad["error"]["event_id"] == "evt_bad"

    # the conversation kept from item events: user, assistant, user, assistant, user, (cancelled) assistant, less the deleted
    roles = [c.items[i]["role"] for i in c.order]
    assert roles[:3] == ["assistant", "user", "assistant"], roles


def test_create_response_false_waits_for_response_create(server):
    """``turn_detection.create_response: false``: a detected turn is committed and transcribed, and answered only when
    the client sends ``response.create``."""
    audio = np.concatenate([pcm_at(turn_file()), np.zeros(24000 * 2, np.int16)])

    async def go():
        async with websockets.connect(server.url("/v1/realtime"), additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
            c = StrictClient(ws)
            await c.until(lambda e: e["type"] == "session.created")
            await c.send(type="session.update", session={"type": "realtime", "audio": {"input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "turn_detection": {"type": "server_vad", "create_response": False}}}})
            upd = (await c.until(lambda e: e["type"] in ("session.updated", "error")))[-1]
            for i in range(0, len(audio), 4800):
                await c.send(type="input_audio_buffer.append", audio=b64(audio[i:i + 4800]))
            heard = await c.until(lambda e: e["type"] == "conversation.item.input_audio_transcription.completed")
            waited = await c.quiet(2.0)  # nothing answers by itself
            await c.send(type="response.create")
            answer = await c.until(lambda e: e["type"] == "response.done")
            return upd, heard, waited, answer

    upd, heard, waited, answer = run(go(), 120)
    assert upd["type"] == "session.updated"
    assert upd["session"]["audio"]["input"]["turn_detection"]["create_response"] is False
    assert "input_audio_buffer.committed" in _types(heard)
    assert not {"response.created", "response.done"} & set(_types(heard + waited))
    transcript = heard[-1]["transcript"]
    done = answer[-1]["response"]
    assert done["status"] == "completed" and done["output"][0]["content"][0]["transcript"]
    info = turn_info()
    assert transcript and any(k.lower() in done["output"][0]["content"][0]["transcript"].lower() for k in info["keywords"])


def test_idle_timeout_prompts_a_silent_user(server):
    """``turn_detection.idle_timeout_ms`` (server_vad): nobody speaks for that long after the session began (or the last
    answer played): ``input_audio_buffer.timeout_triggered``, the silent audio committed as an empty user item, and a
    response prompting the user; it then counts again from that response's end."""
    silence = np.zeros(2400, np.int16)  # 100 ms

    async def go():
        async with websockets.connect(server.url("/v1/realtime"), additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
            c = StrictClient(ws)
            await c.until(lambda e: e["type"] == "session.created")
            await c.send(type="session.update", session={"type": "realtime", "audio": {"input": {
                "turn_detection": {"type": "server_vad", "idle_timeout_ms": 5000}}}})
            upd = (await c.until(lambda e: e["type"] in ("session.updated", "error")))[-1]
            start = len(c.frames)
            for _ in range(80):  # 8 s of silence, in real time
                await c.send(type="input_audio_buffer.append", audio=b64(silence))
                await c.quiet(0.1)  # (what arrives goes into c.frames)
                if any(e["type"] == "response.done" for e in c.frames[start:]):
                    break
            return upd, c.frames[start:]

    upd, got = run(go(), 120)
    assert upd["session"]["audio"]["input"]["turn_detection"]["idle_timeout_ms"] == 5000
    types = _types(got)
    assert types.count("input_audio_buffer.timeout_triggered") == 1, types
    t = got[types.index("input_audio_buffer.timeout_triggered")]
    assert 4500 <= t["audio_end_ms"] - t["audio_start_ms"] <= 6000
    committed = got[types.index("input_audio_buffer.committed")]
    assert committed["item_id"] == t["item_id"]
    assert types.index("input_audio_buffer.timeout_triggered") < types.index("response.created")
    done = got[-1]["response"]
    assert done["status"] == "completed" and done["output"][0]["content"][0]["transcript"] == "Are you still there?"
    assert "response.output_audio.delta" in types
