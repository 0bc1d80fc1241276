"""voice.g711: the ITU-T G.711 laws against the standard's known codes, its segment structure and round trips."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from voice import g711

ALL_CODES = bytes(range(256))
ALL_PCM = np.arange(-32768, 32768).astype(np.int16)


def test_mulaw_known_codes():
    # silence is 0xFF (and 0x7F, "negative zero"); the extremes are the first and last segment's ends
    assert g711.mulaw_decode(bytes([0xFF, 0x7F, 0x80, 0x00, 0xFE, 0x7E])).tolist() == [0, 0, 32124, -32124, 8, -8]
    assert g711.mulaw_encode(np.array([0, 32767, -32768, 8, -8], np.int16)) == bytes([0xFF, 0x80, 0x00, 0xFE, 0x7E])
    assert g711.mulaw_encode(np.zeros(160, np.int16)) == bytes([g711.MULAW_SILENCE]) * 160


def test_alaw_known_codes():
    # every even bit inverted: silence is 0xD5 (+8) and 0x55 (-8); the ends are 0xAA / 0x2A
    assert g711.alaw_decode(bytes([0xD5, 0x55, 0xAA, 0x2A])).tolist() == [8, -8, 32256, -32256]
    assert g711.alaw_encode(np.array([0, -1, 32767, -32768], np.int16)) == bytes([0xD5, 0x55, 0xAA, 0x2A])
    assert g711.alaw_encode(np.zeros(160, np.int16)) == bytes([g711.ALAW_SILENCE]) * 160


@pytest.mark.parametrize("law", ["audio/pcmu", "audio/pcma"])
def test_every_code_round_trips(law):
    encode, decode = g711.CODECS[law]
    again = encode(decode(ALL_CODES))
    expected = bytearray(ALL_CODES)
    if law == "audio/pcmu":
        expected[0x7F] = 0xFF  # negative zero decodes to 0, which is sent as positive zero
    assert again == bytes(expected)


@pytest.mark.parametrize("law", ["audio/pcmu", "audio/pcma"])
def test_segments_are_monotonic_and_double_their_step(law):
    encode, decode = g711.CODECS[law]
    levels = decode(encode(ALL_PCM)).astype(np.int32)
    assert np.all(np.diff(levels) >= 0)  # the quantizer never goes down as the input goes up
    for seg in range(8):  # 8 segments of 16 levels each, evenly spaced; each step twice the one below
        codes = [(~((seg << 4) | m)) & 0xFF if law == "audio/pcmu" else ((seg << 4) | m) ^ 0xD5 for m in range(16)]
        steps = set(np.diff(decode(bytes(codes)).astype(np.int32)).tolist())
        expected = 8 << seg if law == "audio/pcmu" else 16 << max(seg - 1, 0)  # (A-law's first two share one)
        assert steps == {expected}, (seg, steps)
        negative = decode(bytes(c ^ 0x80 for c in codes)).astype(np.int32)
        assert (negative == -decode(bytes(codes)).astype(np.int32)).all()  # the sign bit mirrors the level


@pytest.mark.parametrize("law", ["audio/pcmu", "audio/pcma"])
def test_quantization_error_is_within_half_a_step(law):
    encode, decode = g711.CODECS[law]
    x = ALL_PCM[(ALL_PCM > -32000) & (ALL_PCM < 32000)]
    err = np.abs(decode(encode(x)).astype(np.int32) - x)
    rel = err / np.maximum(np.abs(x.astype(np.int32)), 256)
    assert rel.max() < 0.07  # about 6 % of the level at most: 8 bits of a logarithmic scale
    assert g711.mulaw_encode(x[:0]) == b"" and len(decode(b"")) == 0


def test_matches_the_reference_implementation_where_python_still_has_it():
    audioop = pytest.importorskip("audioop")  # deprecated since 3.11, gone in 3.13: a cross-check only
    raw = ALL_PCM.tobytes()
    assert g711.mulaw_encode(ALL_PCM) == audioop.lin2ulaw(raw, 2)
    assert g711.alaw_encode(ALL_PCM) == audioop.lin2alaw(raw, 2)
    assert g711.mulaw_decode(ALL_CODES).tobytes() == audioop.ulaw2lin(ALL_CODES, 2)
    assert g711.alaw_decode(ALL_CODES).tobytes() == audioop.alaw2lin(ALL_CODES, 2)


def test_a_sine_keeps_its_level_through_the_laws():
    t = np.arange(8000) / 8000
    x = (np.sin(2 * np.pi * 440 * t) * 10000).astype(np.int16)
    for encode, decode in g711.CODECS.values():
        y = decode(encode(x)).astype(np.float64)
        snr = 10 * np.log10(np.sum(x.astype(np.float64) ** 2) / np.sum((y - x) ** 2))
        assert snr > 30  # G.711's ~38 dB at speech levels


# --------------------------------------------------------------------------- the Realtime codec's audio/pcmu and audio/pcma


def _update(proto, audio: dict, event_id: str = "u1"):
    from server import realtime as P

    [ev] = proto.receive(json.dumps({"type": "session.update", "event_id": event_id, "session": {"type": "realtime", "audio": audio}}))
    return ev if not isinstance(ev, P.ProtocolError) else ev


@pytest.mark.parametrize("law", ["audio/pcmu", "audio/pcma"])
def test_a_session_in_g711_echoes_the_format_and_codes_its_audio(law):
    from openai.types import realtime as rt
    from test_protocol import validate

    from server import realtime as P

    proto = P.ProtocolSession(ids=P.IdSource())
    ev = _update(proto, {"input": {"format": {"type": law}}, "output": {"format": {"type": law}}})
    assert isinstance(ev, P.SessionUpdate) and {"input_format", "input_rate", "output_format_type", "output_rate"} <= ev.changed
    assert (ev.config.input_rate, ev.config.output_rate) == (8000, 8000)
    for built in (proto.session_updated(), proto.session_created()):
        session = json.loads(built.to_json())["session"]
        assert session["audio"]["input"]["format"] == {"type": law}  # in full, as openai's AudioPCMU/AudioPCMA: no rate
        assert session["audio"]["output"]["format"] == {"type": law}
        validate(built)
    assert isinstance(validate(proto.session_updated()).session.audio.input.format, rt.realtime_audio_formats.AudioPCMU
                      if law == "audio/pcmu" else rt.realtime_audio_formats.AudioPCMA)
    encode, decode = g711.CODECS[law]
    speech = (np.sin(np.arange(160) / 3) * 8000).astype(np.int16)
    [app] = proto.receive(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(encode(speech)).decode()}))
    assert app.rate == 8000 and app.samples.dtype == np.int16 and np.array_equal(app.samples, decode(encode(speech)))
    delta = validate(proto.audio_delta("resp_1", "item_1", speech))
    assert base64.b64decode(delta.delta) == encode(speech)  # one byte a sample
    assert json.loads(proto.response_created().to_json())["response"]["audio"]["output"]["format"] == {"type": law}


def test_g711_rates_and_switching_back():
    from server import realtime as P

    proto = P.ProtocolSession(ids=P.IdSource())
    before = proto.config
    err = _update(proto, {"input": {"format": {"type": "audio/pcmu", "rate": 16000}}})
    assert isinstance(err, P.ProtocolError) and err.code == "invalid_value" and err.param == "session.audio.input.format.rate"
    assert proto.config == before
    assert _update(proto, {"input": {"format": {"type": "audio/pcma", "rate": 8000}}}).config.input_rate == 8000
    err = _update(proto, {"input": {"format": {"rate": 24000}}})  # a rate alone keeps the format: G.711 has one rate
    assert isinstance(err, P.ProtocolError) and err.code == "invalid_value"
    back = _update(proto, {"input": {"format": {"type": "audio/pcm"}}}).config  # PCM again, at its default rate
    assert (back.input_format, back.input_rate) == ("audio/pcm", 24000)
    err = _update(proto, {"output": {"format": {"type": "audio/opus"}}})
    assert isinstance(err, P.ProtocolError) and err.code == "unsupported_format" and "audio/pcmu" in err.message
    [bad] = proto.receive(json.dumps({"type": "input_audio_buffer.append", "audio": "not base64!"}))
    assert isinstance(bad, P.ProtocolError) and bad.code == "invalid_audio"


# --------------------------------------------------------------------------- a whole Realtime session in audio/pcmu


def test_the_input_backlog_holds_the_same_seconds_in_g711_as_in_pcm16():
    """A session's input backlog limit counts a G.711 sample as one byte (PCM16: two), as base64 text or binary."""
    from server.session import Limits

    lim = Limits(max_input_s=2.0, max_message_bytes=1000)
    assert lim.backlog_bytes(8000, g711=True, binary=True) == 2 * 8000 + 1000
    assert lim.backlog_bytes(8000, g711=True) == int(2 * 8000 * 4 / 3) + 1000
    assert lim.backlog_bytes(24000) == int(2 * 24000 * 2 * 4 / 3) + 1000
    assert lim.backlog_bytes(24000, binary=True) == 2 * 24000 * 2 + 1000


def test_a_session_in_pcmu_passes_the_strict_conformance_client(server):
    """A spoken turn and a typed one in audio/pcmu both ways: every server event validates against the openai SDK's
    union with no field outside it, the session echoes the format, and the answer comes as mu-law at 8 kHz."""
    import asyncio

    import websockets
    from test_conformance import StrictClient
    from test_server import TOKEN, run, turn_file

    from voice.audio import read_wav, resample

    x, src = read_wav(turn_file())
    speech = np.concatenate([resample(x, src, 8000), np.zeros(8000 * 2, np.int16)])
    law = {"type": "audio/pcmu"}

    async def go():
        async with websockets.connect(server.url("/v1/realtime"), additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
            c = StrictClient(ws)
            await c.until(lambda e: e["type"] == "session.created")
            await c.send(type="session.update", session={"type": "realtime", "audio": {"input": {"format": law},
                                                                                       "output": {"format": law}}})
            updated = (await c.until(lambda e: e["type"] == "session.updated"))[-1]
            for i in range(0, len(speech), 1600):  # 200 ms appends at about real-time pace
                await c.send(type="input_audio_buffer.append", audio=base64.b64encode(g711.mulaw_encode(speech[i:i + 1600])).decode())
                await asyncio.sleep(0.05)
            spoken = await c.until(lambda e: e["type"] == "response.done", 120)
            await c.send(type="conversation.item.create", item={"type": "message", "role": "user",
                                                                "content": [{"type": "input_text", "text": "Who is the owner?"}]})
            await c.send(type="response.create")
            typed = await c.until(lambda e: e["type"] == "response.done", 120)
            return updated, spoken, typed

    updated, spoken, typed = run(go(), 300)
    assert updated["session"]["audio"]["input"]["format"] == law and updated["session"]["audio"]["output"]["format"] == law
    for turn in (spoken, typed):
        done = turn[-1]["response"]
        assert done["status"] == "completed" and done["audio"]["output"]["format"] == law
        audio = b"".join(base64.b64decode(e["delta"]) for e in turn if e["type"] == "response.output_audio.delta")
        assert len(audio) > 8000 // 2  # over half a second of answer, one byte a sample
        pcm = g711.mulaw_decode(audio).astype(np.float64)
        assert np.sqrt(np.mean(pcm ** 2)) > 300  # speech, not silence or noise of the wrong law
    transcript = next(e["transcript"] for e in spoken if e["type"] == "conversation.item.input_audio_transcription.completed")
    assert "open" in transcript.lower(), transcript  # the 8 kHz mu-law question was heard


def test_the_band_widener_streams_and_fills_the_upper_band_at_its_gain():
    rate = 8000
    t = np.arange(rate) / rate
    tone = (np.sin(2 * np.pi * 1000 * t) * 8000).astype(np.int16)
    whole = g711.BandWidener()(tone)
    w = g711.BandWidener()
    parts = np.concatenate([w(tone[i:i + 160]) for i in range(0, len(tone), 160)])  # 20 ms at a time, as a call sends
    assert len(whole) == 2 * len(tone) and whole.dtype == np.int16 and np.array_equal(parts, whole)
    n = 8000  # half a second at 16 kHz, past the filter's start: whole periods of both tones
    spectrum = np.abs(np.fft.rfft(whole[2000:2000 + n].astype(np.float64)))
    level = {f: spectrum[f * n // 16000] for f in (1000, 7000)}
    assert 0.95 < level[1000] / (8000 * n / 2) < 1.05  # the base band at unit gain
    assert 0.25 < level[7000] / level[1000] < 0.35  # its mirror image (8 kHz - 1 kHz) at image_gain 0.3, about -10 dB
    assert g711.BandWidener()(np.zeros(0, np.int16)).size == 0
