"""Horizontal scale: sessions keep no state outside their process, so N ``wafervox serve`` processes behind any TCP
load balancer serve N times the sessions.  Two real server processes (``--max-sessions 2`` each) behind a round-robin
TCP balancer (a few lines of asyncio here, as HAProxy's ``mode tcp`` / ``balance roundrobin`` would do): four sessions
at once all get their answers, spread two and two, and a fifth is refused as a full server refuses it."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import subprocess
import sys
import urllib.request

import pytest
import websockets
from test_server import ROOT, TOKEN, run

pytestmark = pytest.mark.engines


class RoundRobin:
    """A TCP balancer on 127.0.0.1: each new connection goes to the next backend port, bytes copied both ways."""

    def __init__(self, ports: list[int]):
        self.ports = itertools.cycle(ports)
        self.chosen: list[int] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _client(self, reader, writer) -> None:
        port = next(self.ports)
        self.chosen.append(port)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()
            return

        async def pipe(r, w):
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                w.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def stop(self) -> None:
        self.server.close()


def _start_server() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "server.cli", "serve", "--port", "0", "--max-sessions", "2", "--token", TOKEN],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _port(p: subprocess.Popen) -> int:
    line = p.stdout.readline()  # "listening on http://127.0.0.1:PORT" once the engines are loaded
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
    if not m:
        p.kill()
        raise AssertionError(f"serve did not start: {line!r}")
    return int(m.group(1))


def _sessions_served(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return float(re.search(r"^wafervox_sessions_total (\S+)$", text, re.M).group(1))


@pytest.fixture(scope="module")
def two_servers():
    procs = [_start_server() for _ in range(2)]  # both load their engines at once
    try:
        yield [_port(p) for p in procs]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()


def test_two_processes_behind_a_tcp_balancer_serve_twice_the_sessions(two_servers):
    balancer = RoundRobin(two_servers)

    async def session(port: int, question: str) -> str:
        async with websockets.connect(f"ws://127.0.0.1:{port}/v1/realtime", additional_headers={"Authorization": f"Bearer {TOKEN}"},
                                      max_size=None) as ws:
            await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": question}]}}))
            await ws.send(json.dumps({"type": "response.create"}))
            async with asyncio.timeout(120):
                while True:
                    ev = json.loads(await ws.recv())
                    if ev["type"] == "response.done":
                        return ev["response"]["output"][0]["content"][0]["transcript"]

    async def refused(port: int) -> int | None:
        async with websockets.connect(f"ws://127.0.0.1:{port}/v1/realtime", additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
            try:
                async with asyncio.timeout(30):
                    while True:
                        await ws.recv()
            except websockets.ConnectionClosed as e:
                return e.rcvd.code if e.rcvd else None

    async def go():
        port = await balancer.start()
        try:
            questions = ["How much is a croissant?", "Where are you located?", "Who is the owner?", "Do you deliver?"]
            holders = [websockets.connect(f"ws://127.0.0.1:{port}/v1/realtime",
                                          additional_headers={"Authorization": f"Bearer {TOKEN}"}) for _ in range(4)]
            # four sessions open at once (two on each process: each process's limit), each answered
            answers = await asyncio.gather(*(session(port, q) for q in questions))
            opened = [await h.__aenter__() for h in holders]  # now hold all four slots
            try:
                code = await refused(port)  # a fifth: the process it lands on is full
            finally:
                for ws in opened:
                    await ws.close()
            return answers, code
        finally:
            await balancer.stop()

    answers, code = run(go(), timeout=400)
    assert all(a.strip() for a in answers), answers
    assert code == 1013
    assert sorted(balancer.chosen[:4]) == sorted(two_servers * 2)  # spread two and two
    assert [_sessions_served(p) for p in two_servers] == [4, 4]  # each process served its half (the refused one aside)
