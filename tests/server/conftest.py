"""The server tests' shared engines: loaded once for every server test module."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def shared():
    from voice.engines import SharedEngines

    return SharedEngines.load()[0]
