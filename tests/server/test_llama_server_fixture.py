"""The ``llama_server`` fixture: a real llama-cpp-python OpenAI-compatible server on the default GGUF,
driven by the official ``openai`` client, and what it does with tools.

It formats prompts with the chat template stored in the GGUF (SmolLM2's ChatML template, which
renders neither ``tools`` nor an assistant's ``tool_calls``). So, as pinned below:

* a named ``tool_choice`` yields a tool call, streamed or not: llama-cpp-python constrains the
  reply with a grammar built from the tool's JSON schema; ``finish_reason`` is ``"tool_calls"``;
* ``"auto"`` (and ``"required"``, which it ignores) yields plain text, never a tool call;
* every streamed tool-call chunk repeats ``index``, ``id``, ``type`` and ``function.name`` beside its
  piece of ``arguments`` (OpenAI sends them once), so a client must set those, not concatenate them;
* a follow-up turn needs the assistant's ``content`` to be a string (``""``): ``None`` is a 500.
"""

from __future__ import annotations

import json

import openai
import pytest

pytestmark = pytest.mark.engines

QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]
GET_WEATHER = {"type": "function", "function": {"name": "get_weather"}}
#: greedy, short replies: the same answer every run, in about a second on two cores
SAMPLING = {"temperature": 0.0, "max_tokens": 32}


@pytest.fixture(scope="module")
def client(llama_server):
    return openai.OpenAI(base_url=llama_server.base_url, api_key="unused", max_retries=0, timeout=120.0)


def _stream(client, **request):
    return list(client.chat.completions.create(model="default", stream=True, **SAMPLING, **request))


def test_fixture_serves_the_default_gguf_on_loopback(llama_server, client):
    assert llama_server.base_url.startswith("http://127.0.0.1:") and llama_server.base_url.endswith("/v1")
    assert llama_server.process.poll() is None
    assert [m.id for m in client.models.list().data] == [str(llama_server.model)]


def test_streaming_chat_completion(client):
    chunks = _stream(client, messages=QUESTION)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text.strip()
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_chat_completion(client):
    reply = client.chat.completions.create(model="default", messages=QUESTION, **SAMPLING)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length") and not choice.message.tool_calls
    assert reply.usage.completion_tokens > 0


def test_named_tool_choice_returns_a_tool_call(client):
    choice = client.chat.completions.create(model="default", messages=QUESTION, tools=TOOLS, tool_choice=GET_WEATHER,
                                            **SAMPLING).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert isinstance(json.loads(call.function.arguments)["city"], str)


def test_named_tool_choice_streams_the_arguments(client):
    chunks = _stream(client, messages=QUESTION, tools=TOOLS, tool_choice=GET_WEATHER)
    first, last = chunks[0].choices[0], chunks[-1].choices[0]
    assert first.delta.role == "assistant" and not first.delta.tool_calls and first.delta.content is None
    assert last.finish_reason == "tool_calls" and not last.delta.tool_calls
    pieces = [c.choices[0].delta.tool_calls for c in chunks[1:-1]]
    assert pieces and all(p is not None and len(p) == 1 for p in pieces)
    calls = [p[0] for p in pieces]
    # every chunk repeats the call's index, id, type and name (OpenAI sends them in the first only)
    assert {(c.index, c.id, c.type, c.function.name) for c in calls} == {(0, calls[0].id, "function", "get_weather")}
    assert all(c.choices[0].delta.content is None for c in chunks)
    assert isinstance(json.loads("".join(c.function.arguments for c in calls))["city"], str)


@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_unnamed_tool_choice_answers_in_text(client, tool_choice):
    """The GGUF's template does not show the model its tools: no tool call, whatever ``tool_choice`` asks."""
    choice = client.chat.completions.create(model="default", messages=QUESTION, tools=TOOLS, tool_choice=tool_choice,
                                            **SAMPLING).choices[0]
    assert choice.finish_reason in ("stop", "length") and not choice.message.tool_calls
    assert choice.message.content.strip()
    chunks = _stream(client, messages=QUESTION, tools=TOOLS, tool_choice=tool_choice)
    assert not any(c.choices[0].delta.tool_calls for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks).strip()
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


@pytest.fixture(scope="module")
def tool_result_turn(client):
    """The question, the server's own tool call (content ``""``) and the tool's result."""
    call = client.chat.completions.create(model="default", messages=QUESTION, tools=TOOLS, tool_choice=GET_WEATHER,
                                          **SAMPLING).choices[0].message.tool_calls[0]
    return QUESTION + [
        {"role": "assistant", "content": "", "tool_calls": [call.model_dump(include={"id", "type", "function"})]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]


def test_tool_result_follow_up_answers_in_text(client, tool_result_turn):
    choice = client.chat.completions.create(model="default", messages=tool_result_turn, tools=TOOLS, **SAMPLING).choices[0]
    assert choice.finish_reason in ("stop", "length") and not choice.message.tool_calls
    assert choice.message.content.strip()


def test_tool_result_follow_up_streams_text(client, tool_result_turn):
    chunks = _stream(client, messages=tool_result_turn, tools=TOOLS)
    assert not any(c.choices[0].delta.tool_calls for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks).strip()
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_follow_up_with_assistant_content_none_is_rejected(client, tool_result_turn):
    """llama-cpp-python types an assistant message's content as ``str``: ``None`` (what OpenAI itself returns
    beside tool calls) fails request validation, answered as a 500; a client must send ``""``."""
    messages = [dict(m, content=None) if m["role"] == "assistant" else m for m in tool_result_turn]
    with pytest.raises(openai.InternalServerError, match="Input should be a valid string"):
        client.chat.completions.create(model="default", messages=messages, **SAMPLING)
