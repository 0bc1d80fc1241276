"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import pytest
from kinds import ENGINES, kind
from pulse import PulseServer


@pytest.fixture(scope="module")
@kind(ENGINES)
def pulse():
    """A private PulseAudio server (``tests/pulse.py``) for a module's tests of the real sound-device path."""
    server = PulseServer()
    yield server
    server.close()
