"""Shared fixtures (one loaded default model per test session: loading costs seconds), and each test's kind
(``unit``, ``engines``, ``browser``, ``network``: ``tests/kinds.py``) from its folder and its fixtures, so that
``pytest -m unit`` runs the pure suites in seconds and ``-m "not browser"`` and the like pick among the rest.

The helper modules beside this file (``kinds``, ``tiny_gguf``, ``quant_reference``, ``pulse``) are importable
from every test folder: pytest puts this folder on ``sys.path`` when it loads this file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kinds import DIRECTORY_KINDS, ENGINES, KINDS, NETWORK, UNIT, fixture_kinds, kind

FIXTURES = Path(__file__).parent / "fixtures"
TESTS = Path(__file__).parent
#: pytest-timeout's limit (s) for a test of the engines, network or browser kind that sets none itself: its fixtures'
#: set-up counts (the first test on the model may compile the numba kernels: minutes on a busy 2-core machine), and
#: some run a benchmark or a server whose own limits reach 600 s; the unit tests keep pyproject's ``timeout``
SLOW_KIND_TIMEOUT_S = 900


def pytest_report_header(config):
    """The kernel path the run uses (``WAFERVOX_KERNELS``, else the fastest this CPU has) and the ones it could."""
    from decode import qint

    return f"wafervox kernels: {qint.select().name} (this CPU runs {', '.join(qint.available())}; {qint.KERNELS_ENV} picks one)"


def _kinds(item) -> set[str]:
    """The kinds ``item`` has: its folder's, its fixtures' (the whole closure: a fixture built on the model is an
    engines fixture too), and the kind markers it carries; ``unit`` when none."""
    try:
        folder = item.path.relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        folder = ""
    kinds = set(DIRECTORY_KINDS.get(folder, ()))
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    for name in getattr(item, "fixturenames", ()):
        for fixture in definitions.get(name, ())[-1:]:  # the definition in force where the test is
            kinds |= fixture_kinds(fixture.func)
    kinds |= {m.name for m in item.iter_markers() if m.name in KINDS}
    if UNIT in kinds and len(kinds) > 1:
        raise pytest.UsageError(f"{item.nodeid}: marked unit but it is also {', '.join(sorted(kinds - {UNIT}))}")
    return kinds or {UNIT}


def pytest_collection_modifyitems(config, items):
    for item in items:
        kinds = _kinds(item)
        for k in sorted(kinds - {m.name for m in item.iter_markers()}):
            item.add_marker(getattr(pytest.mark, k))
        if kinds != {UNIT} and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SLOW_KIND_TIMEOUT_S))


@pytest.fixture(scope="session")
@kind(ENGINES)
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
@kind(ENGINES, NETWORK)
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
