"""Shared fixtures (one loaded default model per test session: loading costs seconds) and the
``engines`` marker: a test that loads a real engine (the model, Whisper, piper, a server or the
CLI on them) is marked, so that ``pytest -m "not engines"`` runs the pure suites in seconds.

The helper modules beside this file (``tiny_gguf``, ``quant_reference``, ``pulse``) are importable
from every test folder: pytest puts this folder on ``sys.path`` when it loads this file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"

#: Fixtures that load a real engine: a test that uses one is an ``engines`` test.
ENGINE_FIXTURES = frozenset({
    "model", "generator", "tokenizer", "reference",  # the decode core on the real model
    "transcriber", "piper", "espeak", "question_audio", "voice",  # Whisper, the voices
    "engines", "played", "shared", "server", "pulse", "browser_available",  # whole pipelines, servers, devices
    "llama_server",  # llama-cpp-python's OpenAI-compatible server on the default GGUF
})
#: Modules whose every test runs the real engines (through the CLI in a subprocess, mostly).
ENGINE_MODULES = frozenset({"test_cli", "test_voice_e2e", "test_browser", "test_mic", "test_server"})


def pytest_report_header(config):
    """The kernel path the run uses (``WAFERVOX_KERNELS``, else the fastest this CPU has) and the ones it could."""
    from decode import qint

    return f"wafervox kernels: {qint.select().name} (this CPU runs {', '.join(qint.available())}; {qint.KERNELS_ENV} picks one)"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if ENGINE_FIXTURES.intersection(getattr(item, "fixturenames", ())) or item.module.__name__.rsplit(".", 1)[-1] in ENGINE_MODULES:
            item.add_marker(pytest.mark.engines)


@pytest.fixture(scope="session")
def model():
    from decode import Model

    return Model()


@pytest.fixture(scope="session")
def generator(model):
    from decode import Generator

    return Generator(model=model)


@pytest.fixture(scope="session")
def tokenizer(generator):
    return generator.tokenizer


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory):
    """A real ``python -m llama_cpp.server`` on the default GGUF, on 127.0.0.1 (``tests/llama_server.py``):
    ``.base_url`` is ``http://127.0.0.1:PORT/v1``. It fails (never skips) when the server cannot start."""
    import llama_server as helper

    try:
        server = helper.start(log_dir=tmp_path_factory.mktemp("llama_server"))
    except helper.LlamaServerError as error:
        pytest.fail(str(error), pytrace=False)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def oracle():
    """llama.cpp's tokens and logits, recorded by bench/llamacpp_oracle.py."""
    return json.loads((FIXTURES / "llamacpp_smollm2.json").read_text())
