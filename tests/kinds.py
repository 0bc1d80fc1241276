"""The kinds of test (pytest markers, declared in ``pyproject.toml``) and how a fixture declares its own.

A test's kinds come from where it lives and what it uses (``tests/conftest.py`` applies them at collection): the
folder's kinds (``DIRECTORY_KINDS``), the kinds of every fixture it uses, directly or through other fixtures, and
any kind marker it or its module carries itself (``pytestmark = pytest.mark.engines``, for a module whose tests
start the product in a subprocess without a fixture).  A test with none of them is a ``unit`` test.  A fixture that loads an engine,
starts a server or drives a browser says so where it is defined::

    @pytest.fixture(scope="module")
    @kind("engines")
    def piper():
        ...

(``kind`` under ``pytest.fixture``: it tags the function the fixture runs).
"""

from __future__ import annotations

#: pure code and stand-ins: no engine, no socket, no subprocess of ours; ``pytest -m unit`` runs them in seconds
UNIT = "unit"
#: the real model, Whisper, the voices (piper, espeak-ng), or the CLI or a benchmark running them
ENGINES = "engines"
#: headless chromium through Playwright
BROWSER = "browser"
#: a server or a socket on loopback (ours, llama.cpp's, a stand-in HTTP backend)
NETWORK = "network"
KINDS = (UNIT, ENGINES, BROWSER, NETWORK)

#: kinds every test in a folder of ``tests/`` has, whatever its fixtures
DIRECTORY_KINDS = {
    "cli": (ENGINES,),  # the ``wafervox`` command (or a benchmark) in a subprocess, on the real engines
}

_ATTRIBUTE = "wafervox_kinds"


def kind(*kinds: str):
    """Decorator for a fixture's function: every test that uses the fixture has these kinds."""
    if not kinds or not set(kinds) <= set(KINDS[1:]):  # unit is what a test is without any other
        raise ValueError(f"kind() takes some of {', '.join(KINDS[1:])}; got {kinds}")

    def tag(fn):
        setattr(fn, _ATTRIBUTE, frozenset(kinds) | getattr(fn, _ATTRIBUTE, frozenset()))
        return fn

    return tag


def fixture_kinds(fn) -> frozenset[str]:
    """The kinds ``kind`` gave the function ``fn`` (empty: none)."""
    return getattr(fn, _ATTRIBUTE, frozenset())
