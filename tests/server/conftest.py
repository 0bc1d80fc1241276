"""The server tests' shared engines, loaded once for every server test module, and the server each module runs on them."""

from __future__ import annotations

import pytest
from kinds import ENGINES, NETWORK, kind


@pytest.fixture(scope="session")
@kind(ENGINES, NETWORK)  # every test that takes them starts a server on them
def shared():
    from voice.engines import SharedEngines

    return SharedEngines.load()[0]


@pytest.fixture(scope="module")
def server(shared):
    """A VoiceServer on the shared engines on loopback, with the bearer token ``running_server.TOKEN``: one a test
    module (a module that wants other options defines its own ``server``)."""
    from running_server import TOKEN, Running

    from server.app import ServerOptions

    s = Running(shared, ServerOptions(port=0, token=TOKEN))
    yield s
    s.close()
