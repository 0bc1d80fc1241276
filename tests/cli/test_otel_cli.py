"""``--otel`` on the command line: ``wafervox serve --otel otlp --otel-endpoint URL`` sends each session's spans to a
collector (a loopback HTTP server here) as OTLP/protobuf, the session's span ending when the client leaves and the
rest flushed when the server stops; a bad ``--otel`` is a one-line error before the engines load."""

from __future__ import annotations

import asyncio
import http.server
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from server.client import ClientOptions, run_client
from voice.replay import SAMPLES, conversation_files

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.network


def wafervox(*args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "server.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("argv, needle", [
    (["run", "--otel", "console", "--otel-endpoint", "http://127.0.0.1:4318"], "otlp"),
    (["run", "--otel-endpoint", "127.0.0.1:4318"], "--otel-endpoint"),
    (["run", "--otel-content"], "--otel"),
    (["serve", "--otel", "otlp", "--otel-endpoint", "ftp://127.0.0.1"], "--otel-endpoint"),
])
def test_a_bad_otel_flag_is_one_line_before_the_load(argv, needle):
    proc = wafervox(*argv)
    assert proc.returncode == 2, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("wafervox: error:") and needle in lines[0], proc.stderr


def test_help_says_how_to_turn_it_on():
    for command in ("run", "serve"):
        out = wafervox(command, "--help").stdout
        assert "--otel" in out and "--otel-endpoint" in out and "OTLP" in out


class _Collector:
    """An OTLP/HTTP receiver on loopback: keeps the bodies POSTed to /v1/traces."""

    def __init__(self):
        self.bodies = []
        got = self.bodies

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                got.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def spans(self) -> list:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        out = []
        for path, body in self.bodies:
            assert path == "/v1/traces"
            req = ExportTraceServiceRequest()
            req.ParseFromString(body)
            out += [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
        return out

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _attrs(span) -> dict:
    out = {}
    for kv in span.attributes:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value"))
    return out


def test_serve_sends_each_sessions_spans_to_the_collector():
    collector = _Collector()
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "serve", "--port", "0", "--max-sessions", "1",
                             "--otel", "otlp", "--otel-endpoint", collector.url], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # "listening on http://127.0.0.1:PORT" once the engines are loaded
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
        wav = conversation_files("default")[1]
        turns = []
        opts = ClientOptions(url=f"ws://127.0.0.1:{m.group(1)}/v1/stream", tail_s=2.0, timeout_s=120)
        summary = asyncio.run(asyncio.wait_for(run_client([SAMPLES / wav.name], opts, on_turn=turns.append), 180))
        assert summary["turns"] == 1 and len(turns) == 1
    finally:
        proc.send_signal(signal.SIGTERM)  # the server stops; its exporter flushes what is queued
        try:
            proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            collector.close()
    spans = collector.spans()
    by_name = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    (session,) = by_name["voice.session"]
    sa = _attrs(session)
    assert sa["wafervox.session.source"] == "serve" and sa["wafervox.session.transport"] == "stream"
    assert sa["wafervox.session.end_reason"] == "closed" and sa["wafervox.session.turns"] == 1
    assert session.kind == 2  # SPAN_KIND_SERVER
    (turn,) = by_name["voice.turn"]
    assert turn.parent_span_id == session.span_id
    ta = _attrs(turn)
    assert ta["wafervox.latency.voice_to_voice_ms"] == pytest.approx(turns[0]["server_voice_to_voice_ms"], abs=1.0)
    stages = {_attrs(s).get("wafervox.stage"): s for s in spans if s.parent_span_id == turn.span_id}
    assert {"user_speech", "endpoint", "asr", "llm", "tts_first_audio", "hold", "playout"} <= set(stages)
    chat = _attrs(stages["llm"])
    assert chat["gen_ai.operation.name"] == "chat" and chat["gen_ai.request.model"].startswith("SmolLM2")
    assert chat["gen_ai.usage.output_tokens"] > 0 and "wafervox.simulated.deployment" in chat
    assert [s.name for s in spans if s.parent_span_id == stages["llm"].span_id] == ["voice.llm.first_token"]
    for s in spans:
        assert session.start_time_unix_nano <= s.start_time_unix_nano <= s.end_time_unix_nano <= session.end_time_unix_nano
