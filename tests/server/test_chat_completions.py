"""``POST /v1/chat/completions`` on the websocket server's port: the sans-I/O parts alone (the request reader, the
body's checks, the stop-string scanner), then the official ``openai`` client against a real server on the real
engines: plain and streamed completions, stop strings, the errors in OpenAI's shape, a Realtime session beside a
streaming completion, and a client that leaves mid-stream."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest
import websockets
from test_server import TOKEN, _events_until, _Running, run

from decode import GREEDY
from server.app import ServerOptions
from server.chat import StopScanner, parse_chat
from server.session import Limits

# ------------------------------------------------------------------ the request, as the server reads it (uvicorn's h11)


def _post(body: bytes, extra: str = "") -> bytes:
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def test_request_reader_gives_the_same_request_fed_whole_or_byte_by_byte(server):
    raw = _post(b'{"messages": []}', f"Authorization: Bearer {TOKEN}\r\nX-A: 1\r\nx-a: 2\r\n")
    whole = _raw(server.port, raw)
    assert whole == _raw(server.port, *[raw[i:i + 1] for i in range(len(raw))]) == _raw(server.port, raw[:7], raw[7:50], raw[50:])
    status, headers, body = whole  # the token read from its header, the body whole: the messages judged
    assert status == 400 and json.loads(body)["error"]["param"] == "messages"


@pytest.mark.parametrize("raw, status", [
    (_post(b"x" * 10, "X-Big: " + "a" * (17 << 10) + "\r\n"), 431),  # the head over 16 KB
    (b"POST /v1/chat/completions HTTP/1.1\r\n" + b"X: " + b"a" * (17 << 10), 431),  # ... even before it ends
    # (HTTP/1.1 requires a Host header: without one, uvicorn's h11 answers 400 before the framing is judged)
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n", 413),  # judged on the head alone
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n", 411),
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", 411),
    (b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 1, 2\r\n\r\n", 400),
    (b"POST /v1/chat/completions\r\n\r\n", 400),
    (b"POST /a HTTP/1.1\r\n folded: header\r\n\r\n", 400),
])
def test_request_reader_refuses_with_the_status_to_answer(server, raw, status):
    assert _raw(server.port, raw)[0] == status


# ------------------------------------------------------------------ sans-I/O: the body


def _body(**kw) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}).encode()


def test_parse_chat_maps_onto_the_decode_core():
    req = parse_chat(_body(messages=[{"role": "developer", "content": "Be brief."},
                                     {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                                     {"role": "assistant", "content": None}], max_tokens=7, stop="\n", stream=True,
                           stream_options={"include_usage": True}, tools=[{"type": "function"}], tool_choice="none"))
    assert req.messages == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "a\nb"},
                            {"role": "assistant", "content": ""})
    assert (req.max_tokens, req.stop, req.stream, req.include_usage, req.sampling) == (7, ("\n",), True, True, GREEDY)
    assert parse_chat(_body()).sampling == GREEDY and parse_chat(_body(temperature=0)).sampling == GREEDY
    s = parse_chat(_body(temperature=0.8, top_p=0.9, seed=-3, max_completion_tokens=5, max_tokens=9)).sampling
    assert (s.temperature, s.top_p, s.repetition_penalty, s.seed) == (0.8, 0.9, 1.0, (1 << 64) - 3)
    assert parse_chat(_body(max_completion_tokens=5, max_tokens=9)).max_tokens == 5


@pytest.mark.parametrize("body, code, param", [
    (b"{not json", "invalid_json", None),
    (b"[1, 2]", "invalid_type", None),
    (json.dumps({"model": "m"}).encode(), "missing_required_parameter", "messages"),
    (_body(messages=[]), "invalid_type", "messages"),
    (_body(messages=[{"role": "user", "content": 5}]), "invalid_type", "messages[0].content"),
    (_body(messages=[{"role": "robot", "content": "x"}]), "invalid_value", "messages[0].role"),
    (_body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), "invalid_value",
     "messages[0].content[0]"),
    (_body(messages=[{"role": "user", "content": "\ud800"}]), "invalid_unicode", "messages[0].content"),
    (_body(temperature="hot"), "invalid_type", "temperature"),
    (_body(temperature=3), "invalid_value", "temperature"),
    (_body(max_tokens=0), "invalid_value", "max_tokens"),
    (_body(max_tokens=True), "invalid_type", "max_tokens"),
    (_body(stream="yes"), "invalid_type", "stream"),
    (_body(stop=["a", "b", "c", "d", "e"]), "invalid_value", "stop"),
    (_body(n=2), "unsupported_value", "n"),
    (_body(logprobs=True), "unsupported_value", "logprobs"),
    (_body(response_format={"type": "json_object"}), "unsupported_value", "response_format"),
    (_body(tools=[{"type": "function", "function": {"name": "f"}}]), "tools_not_supported", "tools"),
    (_body(messages=[{"role": "tool", "content": "42", "tool_call_id": "c"}]), "tools_not_supported", "messages[0]"),
])
def test_parse_chat_refuses_in_openai_terms(body, code, param):
    from server.chat import ApiError

    with pytest.raises(ApiError) as e:
        parse_chat(body)
    assert (e.value.status, e.value.code, e.value.param) == (400, code, param)
    assert set(json.loads(e.value.body())["error"]) == {"message", "type", "param", "code"}


# ------------------------------------------------------------------ sans-I/O: stop strings


@pytest.mark.parametrize("stops", [(), ("\n",), ("END",), ("abcab", "b!"), ("aab",)])
def test_stop_scanner_gives_the_same_text_in_any_pieces(stops):
    text = "Hello there.\nIt is aababcabc b! and END of it"
    expect = text
    cuts = [text.find(s) for s in stops if s in text]
    if cuts:
        expect = text[:min(cuts)]
    for size in (len(text), 1, 2, 3, 5):
        sc = StopScanner(stops)
        out = "".join(sc.feed(text[i:i + size]) for i in range(0, len(text), size)) + sc.flush()
        assert out == expect, (size, stops)
        assert sc.stopped == bool(cuts)


# ------------------------------------------------------------------ the real server


@pytest.fixture(scope="module")
def server(shared):
    s = _Running(shared, ServerOptions(port=0, token=TOKEN))
    yield s
    s.close()


def _client(port, key=TOKEN):
    from openai import OpenAI

    return OpenAI(api_key=key, base_url=f"http://127.0.0.1:{port}/v1", max_retries=0, timeout=60)


def _raw(port, *parts: bytes, pause_s: float = 0.0) -> tuple[int, dict, bytes]:
    """One raw HTTP exchange: the parts sent (a pause between them), the answer read to the end."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        for i, p in enumerate(parts):
            if i and pause_s:
                time.sleep(pause_s)
            s.sendall(p)
        data = b""
        while chunk := s.recv(1 << 16):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split()[1]), headers, body


QUESTION = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Name three colours of the rainbow."}]


def test_completion_plain_and_streamed_give_the_same_greedy_text(server):
    c = _client(server.port)
    r = c.chat.completions.create(model="wafervox", messages=QUESTION, max_tokens=40)
    text = r.choices[0].message.content
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant" and text.strip()
    assert r.choices[0].finish_reason in ("stop", "length") and r.model == c.models.list().data[0].id
    u = r.usage
    assert u.prompt_tokens > 10 and 0 < u.completion_tokens <= 40 and u.total_tokens == u.prompt_tokens + u.completion_tokens

    chunks = list(c.chat.completions.create(model="wafervox", messages=QUESTION, max_tokens=40, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(ch.object == "chat.completion.chunk" and ch.id == chunks[0].id for ch in chunks)
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert streamed == text  # greedy: the same tokens either way
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finals == [r.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == u.completion_tokens
    assert chunks[-1].usage.prompt_tokens == u.prompt_tokens
    assert all(ch.usage is None for ch in chunks[:-1])

    plain = list(c.chat.completions.create(model="wafervox", messages=QUESTION, max_tokens=40, stream=True))
    assert all(ch.usage is None for ch in plain) and plain[-1].choices[0].finish_reason == finals[0]


def test_max_tokens_stop_strings_and_sampling(server):
    c = _client(server.port)
    r = c.chat.completions.create(model="m", messages=QUESTION, max_tokens=3)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
    full = c.chat.completions.create(model="m", messages=QUESTION, max_tokens=40).choices[0].message.content
    word = full.split()[2]
    cut = c.chat.completions.create(model="m", messages=QUESTION, max_tokens=40, stop=[word, "zzzz"]).choices[0]
    assert cut.finish_reason == "stop" and cut.message.content == full[:full.index(word)]
    a, b = (c.chat.completions.create(model="m", messages=QUESTION, max_tokens=12, temperature=0.9, seed=7).choices[0].message.content
            for _ in range(2))
    assert a == b and a.strip()  # a seed gives one draw


def test_models_and_errors_in_openai_shape(server):
    import openai

    c = _client(server.port)
    models = c.models.list().data
    assert len(models) == 1 and models[0].id.startswith("SmolLM2") and c.models.retrieve(models[0].id).id == models[0].id
    with pytest.raises(openai.AuthenticationError):
        _client(server.port, key="wrong").chat.completions.create(model="m", messages=QUESTION)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="m", messages=QUESTION, tools=[{"type": "function", "function": {"name": "lookup"}}])
    assert e.value.code == "tools_not_supported" and "tools" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="m", messages=QUESTION, n=2)
    assert e.value.code == "unsupported_value" and e.value.param == "n"
    with pytest.raises(openai.BadRequestError) as e:  # ~3,000 tokens: more than the 2,048-token context
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello there " * 1500}])
    assert e.value.code == "context_length_exceeded" and "2048" in e.value.message
    # the same answers to raw requests
    auth = f"Authorization: Bearer {TOKEN}\r\n"
    status, headers, body = _raw(server.port, _post(b'{"messages": [', auth))
    err = json.loads(body)["error"]
    assert status == 400 and headers["content-type"] == "application/json" and headers["connection"] == "close"
    assert err["type"] == "invalid_request_error" and err["code"] == "invalid_json" and set(err) == {"message", "type", "param", "code"}
    status, _, body = _raw(server.port, _post(_body()))  # no token
    assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    big = _post(_body(messages=[{"role": "user", "content": "x" * (1 << 20)}]), auth)
    status, _, body = _raw(server.port, big)  # answered on the head, the body read and dropped: no reset
    assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
    status, _, body = _raw(server.port, b"PUT /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 405 and json.loads(body)["error"]["code"] == "method_not_allowed"
    assert _raw(server.port, _post(_body()).replace(b"/v1/chat/completions", b"/v1/nope"))[0] == 404
    assert _raw(server.port, f"GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())[0] == 405
    # the first bytes split: the server waits for the whole head either way
    assert _raw(server.port, b"G", b"ET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", pause_s=0.2)[0] == 200
    raw = _post(_body(max_tokens=2), auth)
    assert _raw(server.port, raw[:2], raw[2:], pause_s=0.2)[0] == 200
    metrics = _raw(server.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")[2].decode()
    assert 'wafervox_chat_completions_total{finish="length"}' in metrics and 'wafervox_errors_total{code="invalid_json"}' in metrics


def test_a_realtime_session_keeps_working_while_a_completion_streams(server):
    """A text turn over the websocket, answered while a long chat completion streams: both finish, and the stream's
    chunks kept coming during the turn (the two decode side by side on the one core)."""
    from openai import AsyncOpenAI

    async def go():
        c = AsyncOpenAI(api_key=TOKEN, base_url=f"http://127.0.0.1:{server.port}/v1", max_retries=0, timeout=120)
        stamps, texts, started = [], [], asyncio.Event()

        async def complete():
            stream = await c.chat.completions.create(model="m", max_tokens=300, stream=True, messages=[
                {"role": "user", "content": "Count from one to one hundred in words, separated by commas."}])
            async for ch in stream:
                if ch.choices and ch.choices[0].delta.content:
                    stamps.append(time.monotonic())
                    texts.append(ch.choices[0].delta.content)
                    started.set()
                if ch.choices and ch.choices[0].finish_reason:
                    return ch.choices[0].finish_reason

        task = asyncio.create_task(complete())
        await started.wait()
        async with websockets.connect(server.url(), additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
            t0 = time.monotonic()
            await _events_until(ws, lambda e: e["type"] == "session.created")
            await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "How much is a croissant?"}]}}))
            await ws.send(json.dumps({"type": "response.create"}))
            events = await _events_until(ws, lambda e: e["type"] == "response.done", 60)
            t1 = time.monotonic()
        finish = await task
        return events, finish, "".join(texts), stamps, t0, t1

    events, finish, text, stamps, t0, t1 = run(go(), 180)
    done = events[-1]["response"]
    assert done["status"] == "completed" and "2" in done["output"][0]["content"][0]["transcript"]
    assert finish in ("stop", "length") and len(text) > 50
    assert sum(t0 < t < t1 for t in stamps) >= 3, "the completion's chunks stopped while the turn was answered"


def _healthz(port) -> dict:
    return json.loads(_raw(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")[2])


def test_a_client_leaving_mid_stream_frees_the_decode_core(server):
    """The client reads a few chunks of a long completion and goes: the decoding stops at once (the fork is closed and
    its slot free; counted in tokens, not timed: a few more than the client read, not the rest of the 1,500), it is
    counted as client_gone, and the next completion is answered."""
    gone = server.server.metrics.completions.labels("client_gone")
    before = gone._value.get()
    tokens = server.server.metrics.completion_tokens.labels("completion")
    tokens_before = tokens._value.get()

    async def leave():
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(_post(_body(max_tokens=1500, stream=True, messages=[
            {"role": "user", "content": "Write a very long story about a dragon and a baker."}]), f"Authorization: Bearer {TOKEN}\r\n"))
        data = b""
        while data.count(b'"content"') < 4:  # the role chunk, then three with text
            data += await reader.read(4096)
        assert _healthz(server.port)["completions"] == 1
        writer.transport.abort()
        return data.count(b'"content"') - 1  # text chunks read (a token each, or fewer)

    read = run(leave(), 60)
    deadline = time.monotonic() + 300  # (the whole completion, on a slow machine: then the count below says so)
    while _healthz(server.port)["completions"] and time.monotonic() < deadline:
        time.sleep(0.2)  # 5 polls a second: under the rate limit
    assert _healthz(server.port)["completions"] == 0
    decoded = tokens._value.get() - tokens_before
    print(f"{decoded} tokens decoded, {read} text chunks read by the client before it left")
    # stopping takes the token in progress (and those the client had not read yet); going on would be ~1,500
    assert read <= decoded < read + 100, f"the completion decoded {decoded} tokens; its client read {read} chunks and left"
    assert gone._value.get() == before + 1
    r = _client(server.port).chat.completions.create(model="m", messages=QUESTION, max_tokens=5)
    assert r.usage.completion_tokens == 5


def test_completions_share_the_session_slots(shared):
    """With one slot, a completion in progress fills the server: another completion gets 503 server_full and a
    websocket 1013; once it ends, the slot is free again."""
    s = _Running(shared, ServerOptions(port=0, limits=Limits(max_sessions=1)))
    try:
        async def go():
            reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
            writer.write(_post(_body(max_tokens=60, stream=True)))
            data = b""
            while b'"content"' not in data:
                data += await reader.read(4096)
            status, headers, body = await asyncio.to_thread(_raw, s.port, _post(_body(max_tokens=2)))
            async with websockets.connect(s.url()) as ws:
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await ws.recv()
            while chunk := await reader.read(4096):
                data += chunk
            writer.close()
            return status, headers, body, closed.value.rcvd, data

        status, headers, body, close, data = run(go(), 120)
        assert status == 503 and headers["retry-after"] == "1" and json.loads(body)["error"]["code"] == "server_full"
        assert close.code == 1013 and "server full" in close.reason
        assert data.rstrip().endswith(b"data: [DONE]\n\n\r\n0")
        deadline = time.monotonic() + 10
        while _healthz(s.port)["completions"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _client(s.port).chat.completions.create(model="m", messages=QUESTION, max_tokens=2).usage.completion_tokens == 2
    finally:
        s.close()
