"""Text-only output over a real server with the real engines: ``output_modalities: ["text"]`` (the session's, or one
``response.create``'s own) answers with ``response.output_text.*`` in an ``output_text`` part, no audio event at all and
no TTS work, while the user's spoken input is still transcribed; every event validates strictly against the openai SDK's
``RealtimeServerEvent`` union (our extension events aside, which this client asked for)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import websockets
from test_conformance import STRICT, _extras
from test_server import TOKEN, b64, pcm_at, run, turn_file, turn_info

from server.realtime.events import EXTENSION_EVENTS

EXTENSIONS = EXTENSION_EVENTS


@pytest.fixture
def synthesized(shared, monkeypatch):
    """Every text the real TTS is asked to synthesize while the test runs."""
    tts, texts = shared.base.tts, []
    real = tts.synthesize

    def counting(text, *a, **kw):
        texts.append(text)
        return real(text, *a, **kw)

    monkeypatch.setattr(tts, "synthesize", counting)
    return texts


async def _until(ws, got: list, pred, timeout: float = 60) -> list[dict]:
    """Events up to the first that ``pred`` accepts, each validated strictly as it arrives (appended to ``got``)."""
    out = []
    async with asyncio.timeout(timeout):
        while True:
            ev = json.loads(await ws.recv())
            if ev["type"] not in EXTENSIONS:
                model = STRICT.validate_python(ev)
                assert _extras(model) == [], (ev["type"], _extras(model))
            got.append(ev)
            out.append(ev)
            if pred(ev):
                return out


async def _quiet(ws, got: list, seconds: float) -> list[dict]:
    try:
        return await _until(ws, got, lambda e: False, seconds)
    except TimeoutError:
        return []


def _text_answer(evs: list[dict]) -> str:
    """The one text-only response in ``evs``: its deltas add up to its done text, which is its item's output_text part."""
    types = [e["type"] for e in evs]
    assert not [t for t in types if t.startswith("response.output_audio")], types
    deltas = [e["delta"] for e in evs if e["type"] == "response.output_text.delta"]
    [done] = [e for e in evs if e["type"] == "response.output_text.done"]
    assert deltas and "".join(deltas) == done["text"] and done["text"].strip()
    [added] = [e for e in evs if e["type"] == "response.content_part.added"]
    [part] = [e["part"] for e in evs if e["type"] == "response.content_part.done"]
    assert added["part"]["type"] == "text" and part == {"type": "text", "text": done["text"]}
    [item] = [e["item"] for e in evs if e["type"] == "response.output_item.done"]
    assert item["content"] == [{"type": "output_text", "text": done["text"]}] and item["status"] == "completed"
    response = evs[types.index("response.done")]["response"]
    assert response["status"] == "completed" and response["output_modalities"] == ["text"]
    assert response["output"][0]["content"] == item["content"]
    created = evs[types.index("response.created")]["response"]
    assert created["output_modalities"] == ["text"]
    return done["text"]


def test_a_text_only_session_answers_speech_with_text_only(server, synthesized):
    audio = np.concatenate([pcm_at(turn_file()), np.zeros(24000 * 2, np.int16)])

    async def go():
        async with websockets.connect(server.url(), additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
            got: list[dict] = []
            await _until(ws, got, lambda e: e["type"] == "session.created")
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}}))
            upd = (await _until(ws, got, lambda e: e["type"] in ("session.updated", "error")))[-1]
            start = len(got)
            for i in range(0, len(audio), 4800):
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(audio[i:i + 4800])}))
            await _until(ws, got, lambda e: e["type"] == "response.done", 120)
            await _quiet(ws, got, 1.5)
            return upd, got[start:]

    upd, turn = run(go(), 240)
    assert upd["type"] == "session.updated" and upd["session"]["output_modalities"] == ["text"]
    text = _text_answer(turn)
    transcript = next(e["transcript"] for e in turn if e["type"] == "conversation.item.input_audio_transcription.completed")
    assert transcript.strip()  # the user's speech is still transcribed ...
    assert any(k.lower() in text.lower() for k in turn_info()["keywords"])  # ... and answered, in text
    assert synthesized == []  # no TTS work at all
    [report] = [e["report"] for e in turn if e["type"] == "turn.latency"]
    lat = report["latency_ms"]
    assert report["reply"] == text and lat["voice_to_voice_ms"] is None and lat["tts_first_audio_ms"] is None
    assert lat["voice_to_text_ms"] > 0 and lat["voice_to_text_ms"] >= lat["first_phrase_ms"]  # timed to the first text


def test_one_response_create_may_ask_for_text_in_a_spoken_session(server, synthesized):
    async def go():
        async with websockets.connect(server.url(), additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
            got: list[dict] = []
            await _until(ws, got, lambda e: e["type"] == "session.created")
            turns = []
            for params in ({"output_modalities": ["text"]}, {}):
                await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                    "type": "message", "role": "user", "content": [{"type": "input_text", "text": "When do you open?"}]}}))
                await ws.send(json.dumps({"type": "response.create", "response": params}))
                start = len(got)
                await _until(ws, got, lambda e: e["type"] == "response.done", 120)
                turns.append(got[start:])
                if not turns[1:]:
                    texts = list(synthesized)
            return turns, texts

    (text_turn, audio_turn), texts = run(go(), 240)
    _text_answer(text_turn)
    assert texts == []  # nothing synthesized for the text response
    types = [e["type"] for e in audio_turn]  # the session's own modality again: spoken
    assert "response.output_audio.delta" in types and "response.output_text.delta" not in types and synthesized
    assert audio_turn[-1]["response"]["output_modalities"] == ["audio"]
