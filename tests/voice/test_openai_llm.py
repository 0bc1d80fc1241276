"""``voice.openai_llm``: the conversation over an OpenAI-compatible backend, against a scripted HTTP server on
loopback that answers as such backends do (and as broken ones do).  The real engines (llama.cpp's server,
``wafervox serve``) are in tests/server/test_llm_backend.py."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kinds import NETWORK, kind

from voice.errors import LLMBackendError
from voice.llm import Persona
from voice.openai_llm import Backend, OpenAIConversation, chat_tool, chat_tool_choice
from voice.protocols import FunctionCallPiece


def chunk(delta: dict, finish=None) -> dict:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


class Script:
    """What the scripted backend answers next: ``status``, and SSE ``events`` (dicts, or raw strings sent as is)."""

    def __init__(self):
        self.status = 200
        self.events: list = []
        self.body = b""
        self.requests: list[dict] = []
        self.stall = threading.Event()  # set: the stream stops after its events without ending
        self.disconnected = threading.Event()


@pytest.fixture
@kind(NETWORK)
def backend():
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            n = int(self.headers.get("Content-Length", 0))
            script.requests.append({"path": self.path, "auth": self.headers.get("Authorization"),
                                    "body": json.loads(self.rfile.read(n))})
            if script.status != 200:
                self.send_response(script.status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(script.body)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            try:
                for ev in script.events:
                    self.wfile.write(("data: " + (ev if isinstance(ev, str) else json.dumps(ev)) + "\n\n").encode())
                    self.wfile.flush()
                if script.stall.is_set():
                    for _ in range(100):  # bounded: 10 s at most
                        self.wfile.write(b": keep-alive\n\n")
                        self.wfile.flush()
                        threading.Event().wait(0.1)
                    return
                self.wfile.write(b"data: [DONE]\n\n")
            except OSError:
                script.disconnected.set()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    script.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    yield script
    server.shutdown()
    server.server_close()


def conversation(script, **kw) -> OpenAIConversation:
    return OpenAIConversation(Backend(script.url, model="m", api_key="k"), persona=Persona(), **kw)


def test_reply_streams_text_and_records_usage_and_history(backend):
    backend.events = [chunk({"role": "assistant"}), chunk({"content": "We open"}), chunk({"content": " at nine."}),
                      chunk({}, "stop"), {"choices": [], "usage": {"prompt_tokens": 120, "completion_tokens": 5,
                                                                   "prompt_tokens_details": {"cached_tokens": 100}}}]
    conv = conversation(backend)
    assert "".join(conv.reply("When do you open?")) == "We open at nine."
    req = backend.requests[-1]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer k"
    body = req["body"]
    assert body["stream"] is True and body["model"] == "m" and body["max_tokens"] == conv.max_tokens
    assert body["messages"][0]["role"] == "system" and body["messages"][-2:][0] == {"role": "user", "content": "When do you open?"}
    assert "tools" not in body
    assert (conv.last_usage.input_tokens, conv.last_usage.cached_tokens, conv.last_usage.output_tokens) == (120, 100, 5)
    conv.commit("When do you open?", "We open at nine.")
    list(conv.reply("And on Sunday?"))
    msgs = backend.requests[-1]["body"]["messages"]
    assert {"role": "assistant", "content": "We open at nine."} in msgs


def test_tool_calls_stream_as_pieces_and_go_into_the_history(backend):
    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    backend.events = [chunk({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                                   "function": {"name": "get_weather", "arguments": ""}}]}),
                      chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
                      chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
                      chunk({}, "tool_calls")]
    conv = conversation(backend)
    conv.tools, conv.tool_choice = (chat_tool(tool),), chat_tool_choice({"type": "function", "name": "get_weather"})
    pieces = list(conv.reply("Weather in Paris?"))
    assert all(isinstance(p, FunctionCallPiece) for p in pieces)
    assert [p.delta for p in pieces] == ['{"city": ', '"Paris"}', ""] and pieces[-1].done
    assert pieces[-1].arguments == '{"city": "Paris"}' and pieces[-1].call_id == "call_1" and pieces[-1].name == "get_weather"
    body = backend.requests[-1]["body"]
    assert body["tools"] == [{"type": "function", "function": {"name": "get_weather", "parameters": tool["parameters"]}}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    conv.commit("Weather in Paris?", "")
    conv.add_function_output("call_1", '{"sky": "sunny"}')
    backend.events = [chunk({"content": "It is sunny."}), chunk({}, "stop")]
    assert "".join(conv.reply(None)) == "It is sunny."
    msgs = backend.requests[-1]["body"]["messages"]
    assert msgs[-3] == {"role": "user", "content": "Weather in Paris?"}
    assert msgs[-2]["role"] == "assistant" and msgs[-2]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    assert msgs[-1] == {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "sunny"}'}


def test_per_reply_instructions_replace_the_system_message_once(backend):
    backend.events = [chunk({"content": "Ahoy."}), chunk({}, "stop")]
    conv = conversation(backend)
    conv.instructions = "Talk like a pirate."
    list(conv.reply("Hi"))
    assert backend.requests[-1]["body"]["messages"][0] == {"role": "system", "content": "Talk like a pirate."}
    list(conv.reply("Hi"))
    assert backend.requests[-1]["body"]["messages"][0]["content"] == Persona().system


def test_backend_errors_are_one_clear_error(backend):
    backend.status, backend.body = 401, json.dumps({"error": {"message": "Incorrect API key provided"}}).encode()
    with pytest.raises(LLMBackendError, match="HTTP 401: Incorrect API key provided"):
        list(conversation(backend).reply("Hi"))
    backend.status, backend.body = 500, b"<html>oops</html>"
    with pytest.raises(LLMBackendError, match="HTTP 500: <html>oops"):
        conversation(backend).warmup()
    backend.status = 200
    backend.events = [chunk({"content": "We"}), {"error": {"message": "the model crashed"}}]
    stream = conversation(backend).reply("Hi")
    assert next(stream) == "We"
    with pytest.raises(LLMBackendError, match="the model crashed"):
        next(stream)
    backend.events = [chunk({"content": "We open"})]  # and the stream just ends, as llama.cpp's does when it fails
    with pytest.raises(LLMBackendError, match="without a finish_reason"):
        list(conversation(backend).reply("Hi"))
    backend.events = ["not json"]
    with pytest.raises(LLMBackendError, match="not JSON"):
        list(conversation(backend).reply("Hi"))


def test_an_unreachable_backend_fails_fast_with_its_address():
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(LLMBackendError, match=f"127.0.0.1:{port}/v1 cannot be reached"):
        OpenAIConversation(Backend(f"http://127.0.0.1:{port}/v1")).warmup()
    with pytest.raises(ValueError, match="not an http"):
        Backend("127.0.0.1:8080")


def test_closing_a_reply_closes_the_stream(backend):
    backend.events = [chunk({"content": "We"})]
    backend.stall.set()
    stream = conversation(backend).reply("Hi")
    assert next(stream) == "We"
    stream.close()  # a barge-in: the backend sees the connection go
    assert backend.disconnected.wait(5)
