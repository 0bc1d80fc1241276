"""Phone calls (``server.twilio``): the Media Streams core message by message, the TwiML answer, and whole calls over
a real server on loopback with the real engines, placed by ``bench/phone.py``'s ``Phone`` (the caller's side as
Twilio documents it: 8 kHz mu-law in real time, marks echoed only once their audio would have played)."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from server.twilio import FRAME, STREAM_PATH, VOICE_PATH, MediaStream, StreamError, signature, signed_urls, stream_url, twiml
from voice import g711

ROOT = Path(__file__).resolve().parents[2]
SID = "MZ0123"


def _bench_phone():
    spec = importlib.util.spec_from_file_location("bench_phone", ROOT / "bench" / "phone.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _start(**start) -> str:
    body = {"streamSid": SID, "callSid": "CA9", "tracks": ["inbound"], "customParameters": {"token": "t", "who": "me"},
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}, **start}
    return json.dumps({"event": "start", "sequenceNumber": "1", "start": body, "streamSid": SID})


def _media(payload: bytes) -> str:
    return json.dumps({"event": "media", "streamSid": SID, "media": {"track": "inbound", "chunk": "1", "timestamp": "0",
                                                                     "payload": base64.b64encode(payload).decode()}})


def _delta(n: int, rid: str = "resp_1", item: str = "item_1", value: int = 0x10) -> dict:
    return {"type": "response.output_audio.delta", "response_id": rid, "item_id": item,
            "delta": base64.b64encode(bytes([value]) * n).decode()}


def _started() -> MediaStream:
    s = MediaStream()
    assert s.from_call(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"})) == []
    [update] = s.from_call(_start())
    assert update == {"type": "session.update", "session": {"type": "realtime", "audio": {
        "input": {"format": {"type": "audio/pcmu"}}, "output": {"format": {"type": "audio/pcmu"}}}}}
    return s


# --------------------------------------------------------------------------- the protocol core


def test_start_and_inbound_media_pass_the_payload_as_it_came():
    s = _started()
    assert (s.stream_sid, s.call_sid, s.parameters) == (SID, "CA9", {"token": "t", "who": "me"})
    frame = bytes(range(160))
    [append] = s.from_call(_media(frame))
    assert append == {"type": "input_audio_buffer.append", "audio": base64.b64encode(frame).decode()}
    assert s.input_samples == 160
    both = json.loads(_media(frame))
    both["media"]["track"] = "outbound"
    assert s.from_call(json.dumps(both)) == [] and s.input_samples == 160  # our own voice coming back is not input
    assert s.from_call(json.dumps({"event": "stop", "streamSid": SID, "stop": {"callSid": "CA9"}})) == [] and s.stopped


def test_bad_streams_are_refused():
    with pytest.raises(StreamError, match="before 'start'"):
        MediaStream().from_call(_media(b"\xff" * 160))
    with pytest.raises(StreamError, match="only audio/x-mulaw"):
        MediaStream().from_call(_start(mediaFormat={"encoding": "audio/x-l16", "sampleRate": 16000, "channels": 1}))
    with pytest.raises(StreamError, match="not JSON"):
        _started().from_call("{")
    with pytest.raises(StreamError, match="not base64"):
        _started().from_call(json.dumps({"event": "media", "media": {"payload": "@@@"}}))
    s = _started()
    with pytest.raises(StreamError, match="second"):
        s.from_call(_start())
    [update] = MediaStream().from_call(_start(customParameters={"instructions": "Answer for the bakery."}))
    assert update["session"]["instructions"] == "Answer for the bakery."


def test_answer_audio_goes_out_in_20_ms_frames_between_marks():
    s = _started()
    to_call, to_session = s.from_session(_delta(500))
    assert to_session == []
    kinds = [m["event"] for m in to_call]
    assert kinds == ["mark", "media", "media", "media", "mark"]  # the answer's first sample, 3 whole frames, the chunk's end
    assert all(m["streamSid"] == SID for m in to_call)
    assert [len(base64.b64decode(m["media"]["payload"])) for m in to_call if m["event"] == "media"] == [FRAME] * 3
    to_call, _ = s.from_session(_delta(140))  # 20 left over + 140: one more whole frame
    assert [m["event"] for m in to_call] == ["media", "mark"] and s.sent == 640
    to_call, _ = s.from_session(_delta(10))
    assert [m["event"] for m in to_call] == ["mark"]  # less than a frame waits
    to_call, _ = s.from_session({"type": "response.output_audio.done", "response_id": "resp_1", "item_id": "item_1"})
    [media, mark] = to_call
    last = base64.b64decode(media["media"]["payload"])
    assert len(last) == FRAME and last[:10] == bytes([0x10]) * 10 and last[10:] == bytes([g711.MULAW_SILENCE]) * 150
    assert mark["event"] == "mark" and s.sent == s.out_samples == 650


def test_the_first_marks_echo_is_the_answers_start_on_the_calls_clock():
    s = _started()
    to_call, _ = s.from_session(_delta(320))
    first, end = to_call[0]["mark"]["name"], to_call[-1]["mark"]["name"]
    for _ in range(5):
        s.from_call(_media(b"\xff" * FRAME))
    [played] = s.from_call(json.dumps({"event": "mark", "streamSid": SID, "mark": {"name": first}}))
    assert played == {"type": "output_audio.played", "sample": 0, "input_sample": 800, "response_id": "resp_1", "item_id": "item_1"}
    s.from_call(_media(b"\xff" * FRAME))
    assert s.playing_position() == 160  # the last echo, moved on by the input since
    assert s.from_call(json.dumps({"event": "mark", "streamSid": SID, "mark": {"name": end}})) == []
    assert (s.played_sample, s.queued) == (320, False)
    assert s.from_call(json.dumps({"event": "mark", "streamSid": SID, "mark": {"name": "not-ours"}})) == []
    # a second answer's first mark starts at the session's sample count
    to_call, _ = s.from_session(_delta(160, rid="resp_2", item="item_2"))
    [played] = s.from_call(json.dumps({"event": "mark", "streamSid": SID, "mark": {"name": to_call[0]["mark"]["name"]}}))
    assert (played["sample"], played["response_id"]) == (320, "resp_2")


def test_barge_in_clears_at_once_and_truncates_at_what_the_call_played():
    s = _started()
    to_call, _ = s.from_session(_delta(8000))  # one second of answer
    first = to_call[0]["mark"]["name"]
    s.from_call(json.dumps({"event": "mark", "streamSid": SID, "mark": {"name": first}}))
    for _ in range(15):  # 300 ms of the call
        s.from_call(_media(b"\xff" * FRAME))
    to_call, to_session = s.from_session({"type": "input_audio_buffer.speech_started", "audio_start_ms": 0, "item_id": "item_9"})
    assert to_call == [{"event": "clear", "streamSid": SID}]
    assert to_session == [{"type": "conversation.item.truncate", "item_id": "item_1", "content_index": 0, "audio_end_ms": 300}]
    assert not s.queued and s.clears == 1
    # the echoes Twilio sends for the cleared marks say nothing; speech with nothing queued clears nothing
    assert s.from_call(json.dumps({"event": "mark", "streamSid": SID, "mark": {"name": first}})) == []
    assert s.from_session({"type": "input_audio_buffer.speech_started", "audio_start_ms": 0, "item_id": "item_10"}) == ([], [])


def _playing_300_ms() -> MediaStream:
    s = _started()
    to_call, _ = s.from_session(_delta(8000))  # one second of answer
    s.from_call(json.dumps({"event": "mark", "streamSid": SID, "mark": {"name": to_call[0]["mark"]["name"]}}))
    for _ in range(15):  # 300 ms of the call
        s.from_call(_media(b"\xff" * FRAME))
    return s


def _payload(msgs: list[dict]) -> bytes:
    return b"".join(base64.b64decode(m["media"]["payload"]) for m in msgs if m["event"] == "media")


def test_speech_judged_over_the_answer_pauses_the_call_and_a_backchannel_resumes_it_where_it_stopped():
    s = _playing_300_ms()
    assert s.from_session({"type": "output_audio.paused", "audio_start_ms": 0}) == ([{"event": "clear", "streamSid": SID}], [])
    assert not s.queued and s.clears == 1
    to_call, _ = s.from_session(_delta(800, value=0x20))  # the session goes on sending: held
    assert to_call == []
    for _ in range(10):  # 200 ms of the call while it is judged: nothing plays
        s.from_call(_media(b"\xff" * FRAME))
    to_call, to_session = s.from_session({"type": "output_audio.resumed", "kind": "backchannel", "text": "Uh-huh."})
    sent = _payload(to_call)
    assert to_session == [] and sent == bytes([0x10]) * 5600 + bytes([0x20]) * 800  # from 300 ms on, then what came
    assert to_call[-1]["event"] == "mark" and s.queued
    # a later interruption truncates at what the call played, counted without the pause
    for _ in range(5):
        s.from_call(_media(b"\xff" * FRAME))
    _, to_session = s.from_session({"type": "input_audio_buffer.speech_started", "audio_start_ms": 0, "item_id": "item_9"})
    assert to_session == [{"type": "conversation.item.truncate", "item_id": "item_1", "content_index": 0, "audio_end_ms": 400}]


def test_an_interruption_after_the_pause_truncates_at_where_the_call_stopped():
    s = _playing_300_ms()
    s.from_session({"type": "output_audio.paused", "audio_start_ms": 0})
    s.from_session(_delta(800))
    for _ in range(10):
        s.from_call(_media(b"\xff" * FRAME))
    to_call, to_session = s.from_session({"type": "input_audio_buffer.speech_started", "audio_start_ms": 0, "item_id": "item_9"})
    assert to_call == [] and s.clears == 1  # cleared at the pause already
    assert to_session == [{"type": "conversation.item.truncate", "item_id": "item_1", "content_index": 0, "audio_end_ms": 300}]
    assert s.from_session({"type": "output_audio.resumed", "kind": "noise", "text": ""}) == ([], [])  # (nothing held)
    assert s.from_session({"type": "response.done", "response": {"status": "cancelled"}}) == ([], [])


def test_the_end_of_a_held_answer_goes_out_on_resume_padded_to_a_frame():
    s = _playing_300_ms()
    s.from_session({"type": "output_audio.paused", "audio_start_ms": 0})
    s.from_session(_delta(100, value=0x30))
    assert s.from_session({"type": "response.output_audio.done", "response_id": "resp_1", "item_id": "item_1"}) == ([], [])
    to_call, _ = s.from_session({"type": "output_audio.resumed", "kind": "noise", "text": ""})
    sent = _payload(to_call)
    assert len(sent) % FRAME == 0 and sent[:5600] == bytes([0x10]) * 5600 and sent[5600:5700] == bytes([0x30]) * 100


def test_dtmf_is_kept_and_becomes_a_turn():
    s = _started()
    evs = s.from_call(json.dumps({"event": "dtmf", "streamSid": SID, "dtmf": {"track": "inbound_track", "digit": "5"}}))
    assert s.dtmf == ["5"]
    assert [e["type"] for e in evs] == ["conversation.item.create", "response.create"]
    assert evs[0]["item"]["content"][0] == {"type": "input_text", "text": "(The caller pressed 5 on the keypad.)"}


def test_twiml_and_the_stream_url():
    doc = ET.fromstring(twiml("wss://example.test/v1/twilio/stream", {"token": 'a"<b'}))
    stream = doc.find("./Connect/Stream")
    assert doc.tag == "Response" and stream.get("url") == "wss://example.test/v1/twilio/stream"
    assert [(p.get("name"), p.get("value")) for p in stream.findall("Parameter")] == [("token", 'a"<b')]
    assert stream_url(None, "abc.ngrok.app", "http") == "wss://abc.ngrok.app" + STREAM_PATH  # a provider connects to wss only
    assert stream_url(None, "127.0.0.1:8765", "http") == "ws://127.0.0.1:8765" + STREAM_PATH
    assert stream_url(None, "[::1]:8765", "http") == "ws://[::1]:8765" + STREAM_PATH
    assert stream_url("https://voice.example.com/", "127.0.0.1:1", "http") == "wss://voice.example.com" + STREAM_PATH
    assert stream_url("voice.example.com", "x", "https") == "wss://voice.example.com" + STREAM_PATH


def test_the_signature_is_twilios_on_its_published_example():
    """The example of Twilio's security page (its URL, form and auth token '12345'), and what may have been signed."""
    form = {"CallSid": ["CA1234567890ABCDE"], "Caller": ["+12349013030"], "Digits": ["1234"], "From": ["+12349013030"],
            "To": ["+18005551212"]}
    assert signature("12345", "https://mycompany.com/myapp.php?foo=1&bar=2", form) == "0/KCTR6DLpKmkAf8muzZqo1nDgQ="
    assert signature("12345", "https://mycompany.com/myapp.php?foo=1&bar=2", {**form, "Digits": ["1235"]}) != \
        "0/KCTR6DLpKmkAf8muzZqo1nDgQ="
    local = "http://127.0.0.1:8765/v1/twilio/voice?token=t"
    assert signed_urls(None, local, VOICE_PATH, "token=t") == [local]  # a port of its own stays
    assert signed_urls("https://abc.ngrok.app/", local, VOICE_PATH, "token=t") == [
        "https://abc.ngrok.app/v1/twilio/voice?token=t", "https://abc.ngrok.app:443/v1/twilio/voice?token=t"]
    assert signed_urls(None, "https://x.example:443/v1/twilio/voice", VOICE_PATH, "") == [
        "https://x.example:443/v1/twilio/voice", "https://x.example/v1/twilio/voice"]


# --------------------------------------------------------------------------- over a real server


TOKEN = "phone-token-1"


@pytest.fixture(scope="module")
def server(shared):
    from test_server import _Running

    from server.app import ServerOptions

    s = _Running(shared, ServerOptions(port=0, token=TOKEN))
    yield s
    s.close()


def _post(port: int, path: str, body: bytes = b"CallSid=CA1&From=%2B15550001", headers: dict | None = None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method="POST",
                                 headers={"Content-Type": "application/x-www-form-urlencoded", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def _record(server, before: int, timeout_s: float = 15) -> dict:
    """The server's record of the call after the ``before`` first, once that call has closed."""
    deadline = time.monotonic() + timeout_s
    while len(server.server.twilio.ended) <= before and time.monotonic() < deadline:
        time.sleep(0.05)
    return server.server.twilio.ended[before]


def test_the_voice_webhook_answers_with_twiml(server):
    status, ctype, body = _post(server.port, f"{VOICE_PATH}?token={TOKEN}")
    assert status == 200 and ctype.startswith("text/xml")
    stream = ET.fromstring(body).find("./Connect/Stream")
    assert stream.get("url") == f"ws://127.0.0.1:{server.port}{STREAM_PATH}"
    params = {p.get("name"): p.get("value") for p in stream.findall("Parameter")}
    assert params == {"token": TOKEN, "callSid": "CA1"}
    assert _post(server.port, VOICE_PATH)[0] == 401
    assert _post(server.port, VOICE_PATH, headers={"Authorization": "Bearer nope"})[0] == 401


def test_with_the_auth_token_only_a_signed_webhook_gets_twiml(shared):
    from running_server import Running

    from server.app import ServerOptions

    auth, body, form = "acct-auth-token", b"CallSid=CA1&From=%2B15550001", {"CallSid": ["CA1"], "From": ["+15550001"]}
    for public in (None, "https://voice.example.com"):
        s = Running(shared, ServerOptions(port=0, twilio_auth_token=auth, public_url=public))
        try:
            local = f"http://127.0.0.1:{s.port}{VOICE_PATH}"
            url = local if public is None else public + VOICE_PATH  # Twilio signs the URL it called
            good = {"X-Twilio-Signature": signature(auth, url, form)}
            status, ctype, twiml_body = _post(s.port, VOICE_PATH, body, good)
            assert status == 200 and ET.fromstring(twiml_body).find("./Connect/Stream") is not None
            assert _post(s.port, VOICE_PATH, body)[0] == 403  # unsigned
            assert _post(s.port, VOICE_PATH, body.replace(b"CA1", b"CA2"), good)[0] == 403  # the form changed
            assert _post(s.port, VOICE_PATH, body, {"X-Twilio-Signature": signature("another", url, form)})[0] == 403
            if public is not None:  # behind a proxy, a signature over the local address is not Twilio's
                assert _post(s.port, VOICE_PATH, body, {"X-Twilio-Signature": signature(auth, local, form)})[0] == 403
            status, _, text = _post(s.port, VOICE_PATH, body)
            assert "X-Twilio-Signature" in text
        finally:
            s.close()


def test_a_stream_without_the_token_is_closed(server):
    import websockets

    phone_mod = _bench_phone()

    async def go(params):
        async with websockets.connect(server.url(STREAM_PATH)) as ws:
            phone = phone_mod.Phone(ws, parameters=params)
            await phone.start()
            try:
                async with asyncio.timeout(15):
                    async for _ in ws:
                        pass
            except websockets.ConnectionClosed:
                pass
            return ws.close_code, ws.close_reason

    code, reason = asyncio.run(go({"token": "wrong"}))
    assert code == 1008 and "token" in reason


def test_a_whole_call_every_turn_answered_on_the_calls_clock(server):
    phone_mod = _bench_phone()
    before = len(server.server.twilio.ended)
    turns = phone_mod.conversation_turns("morning")
    r = asyncio.run(asyncio.wait_for(phone_mod.call(server.url(STREAM_PATH), turns, parameters={"token": TOKEN}), 300))
    assert len(r["voice_to_voice_ms"]) == len(turns) and None not in r["voice_to_voice_ms"], r
    assert all(v > 0 for v in r["voice_to_voice_ms"])
    assert r["marks_echoed"] > len(turns) and r["frames_played"] > 50 * len(turns)  # seconds of answers played
    assert r["clears"] == []
    record = _record(server, before)
    last = {t["report"]["response_id"]: t["report"] for t in record["turns"] if t["report"].get("response_id")}  # (sent again
    clients = [t["client"] for t in last.values() if t.get("client")]  # once the client's figure is known)
    # the session measured each answered turn on the call's clock, from the marks' echoes
    assert len(clients) == len(turns) and {c["clock"] for c in clients} == {"client_audio"}, record["turns"]
    ours = sorted(r["voice_to_voice_ms"])
    theirs = sorted(c["voice_to_voice_ms"] for c in clients)
    assert all(abs(a - b) <= 60 for a, b in zip(ours, theirs)), (ours, theirs)  # both clocks agree to a few frames


def test_barge_in_sends_clear_and_dtmf_is_a_turn(server):
    import websockets

    phone_mod = _bench_phone()
    before = len(server.server.twilio.ended)
    b = asyncio.run(asyncio.wait_for(phone_mod.barge_in_call(server.url(STREAM_PATH), headers={"Authorization": f"Bearer {TOKEN}"}),
                                     120))
    assert len(b["clears"]) >= 1 and b["clear_after_ms"] is not None and 0 < b["clear_after_ms"] < 1500, b
    assert _record(server, before)["clears"] >= 1
    before = len(server.server.twilio.ended)

    async def keypad():
        async with websockets.connect(server.url(STREAM_PATH), additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
            phone = phone_mod.Phone(ws)
            reader = asyncio.create_task(phone.receive())
            await phone.start()
            await phone.run_for(0.5)
            await phone.dtmf("7")
            answered = await phone.run_until(lambda: bool(phone.onsets), 30)
            await phone.stop()
            reader.cancel()
            return answered

    assert asyncio.run(keypad())
    assert _record(server, before)["dtmf"] == ["7"]


def test_a_key_during_an_answer_cancels_it_then_becomes_the_turn():
    s = _started()
    s.from_session({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}})
    s.from_session(_delta(1600))
    key = json.dumps({"event": "dtmf", "streamSid": SID, "dtmf": {"track": "inbound_track", "digit": "1"}})
    assert s.from_call(key) == [{"type": "response.cancel"}]
    assert s.from_call(key.replace('"1"', '"2"')) == []  # one cancel; the latest key is the turn
    to_call, to_session = s.from_session({"type": "response.done", "response": {"id": "resp_1", "status": "cancelled"}})
    assert to_call == [{"event": "clear", "streamSid": SID}]
    assert [e["type"] for e in to_session] == ["conversation.item.truncate", "conversation.item.create", "response.create"]
    assert to_session[1]["item"]["content"][0]["text"] == "(The caller pressed 2 on the keypad.)" and s.dtmf == ["1", "2"]
    assert not s.responding and s.from_session({"type": "response.done", "response": {"status": "completed"}}) == ([], [])


def test_public_url_is_checked():
    from server.twilio import check_public_url

    assert check_public_url("https://voice.example.com/phone") == "https://voice.example.com/phone"
    assert stream_url("https://voice.example.com/phone", "x", "http") == "wss://voice.example.com/phone" + STREAM_PATH
    for bad in ("voice.example.com", "ftp://x", "https://", "https://x/?a=1"):
        with pytest.raises(ValueError, match="--public-url"):
            check_public_url(bad)
