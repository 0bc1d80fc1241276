"""A ``VoiceServer`` on its own event-loop thread, on loopback: what the server test modules talk to over real
sockets (``tests/server/conftest.py``'s ``server`` fixture, and the tests that start one with other options)."""

from __future__ import annotations

import asyncio
import threading

from server.app import ServerOptions, VoiceServer

#: the bearer token of the ``server`` fixture's server
TOKEN = "test-token-123"


class Running:
    """A VoiceServer on its own event loop thread."""

    def __init__(self, shared, opts: ServerOptions):
        self.loop = asyncio.new_event_loop()
        self.server = VoiceServer(shared, opts)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(self.server.start())
        self.port = self.server.port
        self.base = f"http://127.0.0.1:{self.port}"

    def call(self, coro, timeout=30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self):
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def url(self, path="/v1/realtime?extensions=1"):
        """Our own test clients ask for the extension events (turn.latency), as our client and page do."""
        return f"ws://127.0.0.1:{self.port}{path}"
