"""The server tests' shared engines: loaded once for every server test module."""

from __future__ import annotations

import pytest
from kinds import ENGINES, NETWORK, kind


@pytest.fixture(scope="session")
@kind(ENGINES, NETWORK)  # every test that takes them starts a server on them
def shared():
    from voice.engines import SharedEngines

    return SharedEngines.load()[0]
