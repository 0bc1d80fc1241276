"""``--llm URL``: the LLM stage on a real OpenAI-compatible engine, llama.cpp's server (llama-cpp-python, started by
the test on the same GGUF), for ``wafervox run`` and for ``wafervox serve`` sessions: spoken and typed turns, a tool
call round trip over the Realtime wire (every frame validated strictly), and the errors a user sees when the
backend is not there."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
import websockets
from test_conformance import StrictClient
from test_server import ROOT, TOKEN, _Running, b64, pcm_at, run, turn_file

from server.app import ServerOptions

pytestmark = pytest.mark.engines

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city now.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def backend_server(llama_server):
    from voice.engines import EngineOptions, SharedEngines
    from voice.openai_llm import Backend

    shared = SharedEngines.load(EngineOptions(backend=Backend(llama_server.base_url)))[0]
    s = _Running(shared, ServerOptions(port=0, token=TOKEN))
    yield s
    s.close()


def test_run_answers_the_sample_conversation_through_llama_cpp(llama_server):
    out = subprocess.run([sys.executable, "-m", "server.cli", "run", "--fast", "--json", "--llm", llama_server.base_url],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.strip()]
    turns, summary = lines[:-1], lines[-1]["summary"]
    assert len(turns) == 4 and summary["turns"] == 4
    for t in turns:
        assert t["transcript"] and t["reply"], t  # every turn answered, by the backend
        assert t["simulated"] is None  # no decode on the simulated deployment: the backend answered
        assert t["latency_ms"]["first_phrase_ms"] is not None
    assert "answers from" in out.stderr


def test_an_unreachable_backend_is_one_line_at_start():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run([sys.executable, "-m", "server.cli", "run", "--fast", "--llm", f"http://127.0.0.1:{port}/v1"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 2
    assert f"--llm: the LLM backend at http://127.0.0.1:{port}/v1 cannot be reached" in out.stderr
    assert "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "server.cli", "run", "--llm", "127.0.0.1:8080"], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 2 and "is not an http(s) URL" in out.stderr
    out = subprocess.run([sys.executable, "-m", "server.cli", "serve", "--llm-model", "gpt-x"], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 2 and "--llm-model needs --llm URL" in out.stderr


def test_a_spoken_turn_and_a_tool_call_round_trip_over_the_realtime_wire(backend_server):
    async def go():
        async with websockets.connect(backend_server.url("/v1/realtime"), additional_headers={"Authorization": f"Bearer {TOKEN}"},
                                      max_size=None) as ws:
            c = StrictClient(ws)
            await c.until(lambda e: e["type"] == "session.created")
            # a spoken turn: answered by the backend, audio and all
            pcm = pcm_at(turn_file("morning", 0))
            for i in range(0, len(pcm), 2400):
                await c.send(type="input_audio_buffer.append", audio=b64(pcm[i:i + 2400]))
            await c.send(type="input_audio_buffer.append", audio=b64(pcm[:24000] * 0))
            spoken = await c.until(lambda e: e["type"] == "response.done", 120)
            # tools: kept, no error; a forced call to get_weather
            await c.send(type="session.update", session={"type": "realtime", "tools": [WEATHER],
                                                         "tool_choice": {"type": "function", "name": "get_weather"}})
            updated = await c.until(lambda e: e["type"] in ("session.updated", "error"))
            await c.send(type="conversation.item.create", item={"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "What is the weather in Paris?"}]})
            await c.send(type="response.create")
            called = await c.until(lambda e: e["type"] == "response.done", 120)
            done = called[-1]["response"]
            call = done["output"][0]
            await c.send(type="conversation.item.create", item={"type": "function_call_output", "call_id": call["call_id"],
                                                                "output": json.dumps({"sky": "sunny", "celsius": 21})})
            await c.send(type="response.create", response={"tool_choice": "none", "metadata": {"step": "after-tool"}})
            answered = await c.until(lambda e: e["type"] == "response.done", 120)
            return c, spoken, updated, called, answered

    c, spoken, updated, called, answered = run(go(), timeout=400)
    done = spoken[-1]["response"]
    assert done["status"] == "completed" and done["output"][0]["content"][0]["transcript"]
    assert any(e["type"] == "response.output_audio.delta" for e in spoken)
    assert updated[-1]["type"] == "session.updated", updated[-1]
    assert updated[-1]["session"]["tools"] == [WEATHER]
    assert updated[-1]["session"]["tool_choice"] == {"type": "function", "name": "get_weather"}

    types = [e["type"] for e in called]
    done = called[-1]["response"]
    assert done["status"] == "completed" and [o["type"] for o in done["output"]] == ["function_call"]
    call = done["output"][0]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]).get("city")
    assert "response.function_call_arguments.delta" in types
    args_done = next(e for e in called if e["type"] == "response.function_call_arguments.done")
    assert (args_done["call_id"], args_done["arguments"], args_done["item_id"]) == (call["call_id"], call["arguments"], call["id"])
    assert types.index("response.output_item.added") < types.index("response.function_call_arguments.delta") \
        < types.index("response.function_call_arguments.done") < types.index("response.output_item.done")
    assert "response.output_audio.delta" not in types  # a call is not spoken
    assert c.items[call["id"]]["type"] == "function_call" and c.items[call["id"]]["status"] == "completed"

    done = answered[-1]["response"]
    assert done["status"] == "completed" and done["metadata"] == {"step": "after-tool"}
    assert done["output"][0]["type"] == "message" and done["output"][0]["content"][0]["transcript"]
    assert any(e["type"] == "response.output_audio.delta" for e in answered)
    outputs = [it for it in c.items.values() if it["type"] == "function_call_output"]
    assert len(outputs) == 1 and outputs[0]["call_id"] == call["call_id"]
    assert not [e for e in c.frames if e["type"] == "error"]
