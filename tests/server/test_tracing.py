"""server.tracing: a turn's report as OpenTelemetry spans (session -> turn -> stages), read back from the SDK's
in-memory exporter; hand-made reports (a whole answer, a barge-in, missing stamps, a failed backend), the session's end
however it comes, and the OTLP exporter against a loopback collector."""

from __future__ import annotations

import http.server
import threading

import pytest
from kinds import NETWORK, kind
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from spans import OpenSpans

from server.tracing import STAGE_NAMES, LLMInfo, Tracing, otlp_endpoint
from voice import loop_events as L
from voice.latency import TurnTrace
from voice.llm import Usage

SIM = {"deployment": "smollm2-135m@cs3x1", "llm_first_token_ms": 1.5, "first_phrase_ms": 3.0, "token_ms": 0.4,
       "voice_to_voice_ms": 310.0, "within_budget": True, "overrun_ms": 0.0}
EOT = {"rule": "confident", "silence_ms": 210.0, "p_end": 0.93, "source": "model"}



@pytest.fixture
def traced():
    exporter = InMemorySpanExporter()
    tracing = Tracing.with_exporter(exporter)
    opened = OpenSpans()
    tracing.provider.add_span_processor(opened)
    return tracing, exporter, opened


def report(stamps: dict, *, turn=1, barge_in=False, mitigations=(), simulated=SIM, end_of_turn=EOT, transcript="when do you open",
           reply="We open at seven."):
    tr = TurnTrace(turn=turn, budget_ms=500.0)
    for k, v in stamps.items():
        tr.mark(k, v)
    tr.barge_in = barge_in
    tr.mitigations = list(mitigations)
    tr.end_of_turn = end_of_turn
    tr.transcript, tr.reply = transcript, reply
    return tr.report(simulated=simulated)


#: a whole answered turn, speculative (the transcript before the endpoint), on the loop's clock (s)
FULL = {"speech_start": 10.0, "last_voiced": 11.0, "pause": 11.12, "asr_start": 11.12, "transcript": 11.18,
        "turn_end_score": 11.2, "endpoint": 11.21, "first_token": 11.24, "first_phrase": 11.27, "tts_first_audio": 11.33,
        "answer_audio": 11.34, "first_audio": 11.34, "done": 12.9}


def by_stage(spans):
    return {s.attributes.get("wafervox.stage"): s for s in spans if "wafervox.stage" in s.attributes}


def ms(span):
    return (span.end_time - span.start_time) / 1e6


def test_a_whole_turn_is_a_span_per_stage_under_its_turn_under_the_session(traced):
    tracing, exporter, opened = traced
    st = tracing.session(LLMInfo(model="SmolLM2-135M-Instruct", max_tokens=48), session_id="s1", now=lambda: 10.0)
    st.turn(report(FULL), usage=Usage(input_tokens=40, cached_tokens=30, output_tokens=7))
    st.close(at_s=13.0)
    spans = exporter.get_finished_spans()
    assert not opened.open
    (session,) = [s for s in spans if s.name == "voice.session"]
    (turn,) = [s for s in spans if s.name == "voice.turn"]
    stages = by_stage(spans)
    assert set(stages) == set(STAGE_NAMES)  # every stage reached
    assert turn.parent.span_id == session.context.span_id
    llm = stages["llm"]
    for name, s in stages.items():
        want = llm if name == "llm_first_token" else turn
        assert s.parent.span_id == want.context.span_id, name
        assert turn.start_time <= s.start_time <= s.end_time <= turn.end_time, name
        assert s.context.trace_id == session.context.trace_id
    assert session.start_time <= turn.start_time and turn.end_time <= session.end_time
    # the spans are the report's stamps
    assert ms(stages["endpoint"]) == pytest.approx(210, abs=1e-3)
    assert ms(stages["asr"]) == pytest.approx(60, abs=1e-3)
    assert ms(stages["llm_first_token"]) == pytest.approx(60, abs=1e-3)
    assert ms(stages["llm"]) == pytest.approx(90, abs=1e-3)
    assert ms(stages["tts_first_audio"]) == pytest.approx(60, abs=1e-3)
    assert ms(stages["playout"]) == pytest.approx(1560, abs=1e-3)
    assert (turn.start_time, turn.end_time) == (stages["user_speech"].start_time, stages["playout"].end_time)
    # the figures
    a = turn.attributes
    assert a["wafervox.turn.number"] == 1 and a["wafervox.turn.within_budget"] is True and a["wafervox.turn.barge_in"] is False
    assert a["wafervox.latency.voice_to_voice_ms"] == pytest.approx(340)
    assert a["wafervox.turn.time_to_first_audio_ms"] == pytest.approx(340)
    assert a["wafervox.work.asr_run_ms"] == pytest.approx(60)
    assert a["wafervox.simulated.deployment"] == SIM["deployment"] and a["wafervox.simulated.voice_to_voice_ms"] == 310.0
    assert a["wafervox.end_of_turn.rule"] == "confident" and a["wafervox.end_of_turn.p_end"] == 0.93
    assert a["wafervox.turn.end_reason"] == "completed"
    assert "wafervox.turn.transcript" not in a  # content is opt-in
    assert stages["asr"].attributes["wafervox.asr.speculative"] is True
    assert stages["endpoint"].attributes["wafervox.latency_ms"] == pytest.approx(210)
    # the LLM's span, by the GenAI conventions
    assert llm.name == "chat SmolLM2-135M-Instruct" and llm.kind is SpanKind.CLIENT
    g = llm.attributes
    assert g["gen_ai.operation.name"] == "chat" and g["gen_ai.provider.name"] == "wafervox" and g["gen_ai.system"] == "wafervox"
    assert g["gen_ai.request.model"] == "SmolLM2-135M-Instruct" and g["gen_ai.request.max_tokens"] == 48
    assert (g["gen_ai.usage.input_tokens"], g["gen_ai.usage.output_tokens"], g["gen_ai.usage.cache_read.input_tokens"]) == (40, 7, 30)
    assert g["gen_ai.response.finish_reasons"] == ("stop",)
    assert g["gen_ai.response.time_to_first_chunk"] == pytest.approx(0.06)
    assert g["gen_ai.conversation.id"] == "s1"
    assert g["wafervox.simulated.llm_first_token_ms"] == 1.5
    assert [e.name for e in llm.events] == ["gen_ai.first_token"]
    assert llm.events[0].timestamp == stages["llm_first_token"].end_time
    # the session's end
    sa = session.attributes
    assert sa["wafervox.session.turns"] == 1 and sa["wafervox.session.within_budget"] == 1
    assert sa["wafervox.session.end_reason"] == "finished" and session.status.status_code is StatusCode.UNSET


def test_the_loop_clock_becomes_epoch_time_with_one_offset(traced):
    import time

    tracing, exporter, _ = traced
    before = time.time_ns()
    st = tracing.session(now=lambda: 10.0)  # the loop's clock reads 10 s as the session starts
    st.turn(report(FULL))
    st.close(at_s=13.0)
    spans = exporter.get_finished_spans()
    session = next(s for s in spans if s.name == "voice.session")
    turn = next(s for s in spans if s.name == "voice.turn")
    assert before <= session.start_time <= time.time_ns()
    assert turn.start_time - session.start_time == pytest.approx(0, abs=1000)  # speech_start 10.0
    assert session.end_time - session.start_time == pytest.approx(3e9, abs=1000)


def test_speech_over_the_answer_that_was_no_turn_is_an_event_of_the_turn(traced):
    tracing, exporter, opened = traced
    st = tracing.session(LLMInfo(model="m", max_tokens=48), now=lambda: 0.0)
    rep = report(FULL)
    tr = TurnTrace(turn=1, budget_ms=500.0, overlaps=({"kind": "backchannel", "text": "Uh-huh.", "speech_start_s": 12.0,
                                                      "paused_ms": 480.0},))
    tr.stamps, tr.end_of_turn, tr.transcript, tr.reply = dict(FULL), EOT, rep.transcript, rep.reply
    st.turn(tr.report(simulated=SIM))
    st.close(at_s=13.0)
    (turn,) = [s for s in exporter.get_finished_spans() if s.name == "voice.turn"]
    assert turn.attributes["wafervox.turn.overlaps"] == 1 and turn.attributes["wafervox.turn.barge_in"] is False
    (ev,) = turn.events
    assert ev.name == "overlap" and dict(ev.attributes) == {"wafervox.overlap.kind": "backchannel",
                                                            "wafervox.overlap.text": "Uh-huh.", "wafervox.overlap.paused_ms": 480.0}
    assert ev.timestamp - turn.start_time == pytest.approx(2e9, abs=1000)  # speech_start 10.0, the overlap at 12.0
    assert not opened.open


def test_a_barge_in_turn_has_the_stages_it_reached_ended_at_the_cut(traced):
    tracing, exporter, opened = traced
    st = tracing.session(LLMInfo(model="m", max_tokens=48), now=lambda: 0.0)
    # the answer was playing when the user spoke over it: cut at 2.0, its playout ends there
    cut_playing = {k: v - 10.0 for k, v in FULL.items() if k != "done"} | {"done": 2.0}
    st.turn(report(cut_playing, barge_in=True), usage=Usage(40, 0, 12))
    # cut while the LLM was still before its first phrase: no TTS, hold or playout span; the LLM's ends at the cut
    early = {k: FULL[k] - 10.0 + 5.0 for k in ("speech_start", "last_voiced", "pause", "asr_start", "transcript", "endpoint",
                                                "first_token")} | {"done": 6.3}
    st.turn(report(early, turn=2, barge_in=True))
    st.close(at_s=7.0)
    assert not opened.open
    spans = exporter.get_finished_spans()
    turns = sorted((s for s in spans if s.name == "voice.turn"), key=lambda s: s.attributes["wafervox.turn.number"])
    first = by_stage(s for s in spans if s.parent and s.parent.span_id in {turns[0].context.span_id} | {
        c.context.span_id for c in spans if c.attributes.get("wafervox.stage") == "llm" and c.parent.span_id == turns[0].context.span_id})
    assert set(first) == set(STAGE_NAMES)
    assert ms(first["playout"]) == pytest.approx(2000 - 1340, abs=1e-3)
    assert first["playout"].attributes["wafervox.playout.complete"] is False
    assert "wafervox.cut" not in first["playout"].attributes  # it had reached its end mark: the cut is its end
    assert turns[0].attributes["wafervox.turn.barge_in"] is True
    assert turns[0].attributes["wafervox.turn.end_reason"] == "turn_detected"
    assert [e.name for e in turns[0].events] == ["barge_in"]
    assert turns[0].events[0].timestamp == turns[0].end_time
    assert "gen_ai.response.finish_reasons" not in first["llm"].attributes  # cut: whether it had finished is not known
    second_ids = {turns[1].context.span_id}
    second = [s for s in spans if s.parent and s.parent.span_id in second_ids]
    second_ids |= {s.context.span_id for s in second if s.attributes.get("wafervox.stage") == "llm"}
    second = by_stage(s for s in spans if s.parent and s.parent.span_id in second_ids)
    assert set(second) == {"user_speech", "endpoint", "asr", "llm", "llm_first_token"}
    assert second["llm"].attributes["wafervox.cut"] == "turn_detected"
    assert second["llm"].end_time == turns[1].end_time  # at the cut
    assert "wafervox.cut" not in second["llm_first_token"].attributes
    assert turns[1].attributes["wafervox.turn.within_budget"] is False
    assert "wafervox.turn.time_to_first_audio_ms" not in turns[1].attributes  # no answer audio


def test_missing_stamps_give_no_span_and_no_figure(traced):
    tracing, exporter, opened = traced
    st = tracing.session(now=lambda: 0.0)
    # silence end of turn (no score), not speculative, no simulated block and no end-of-turn record
    stamps = {k: v for k, v in FULL.items() if k not in ("turn_end_score", "pause")}
    st.turn(report(stamps, simulated=None, end_of_turn=None))
    # a typed turn: no voice at all
    st.turn(report({"transcript": 20.0, "first_token": 20.1, "first_phrase": 20.2, "tts_first_audio": 20.3,
                    "answer_audio": 20.3, "done": 21.0}, turn=2, simulated=None, end_of_turn=None))
    st.close(at_s=22.0)
    assert not opened.open
    spans = exporter.get_finished_spans()
    turns = sorted((s for s in spans if s.name == "voice.turn"), key=lambda s: s.attributes["wafervox.turn.number"])
    names = [{s.attributes["wafervox.stage"] for s in spans if "wafervox.stage" in s.attributes
              and s.context.trace_id == t.context.trace_id and s.start_time >= t.start_time and s.end_time <= t.end_time}
             for t in turns]
    assert names[0] == set(STAGE_NAMES) - {"turn_end_score"}
    assert names[1] == {"llm", "llm_first_token", "tts_first_audio", "hold", "playout"}
    a0 = turns[0].attributes
    assert not any(k.startswith(("wafervox.simulated.", "wafervox.end_of_turn.")) for k in a0)
    assert "wafervox.latency.first_audio_ms" in a0 and "wafervox.work.turn_end_score_ms" not in a0
    assert turns[1].attributes["wafervox.turn.typed"] is True
    assert "wafervox.latency.voice_to_voice_ms" not in turns[1].attributes
    asr = next(s for s in spans if s.attributes.get("wafervox.stage") == "asr" and s.start_time < turns[1].start_time)
    assert asr.attributes["wafervox.asr.speculative"] is False


def test_stamps_out_of_order_never_make_a_negative_span(traced):
    tracing, exporter, _ = traced
    st = tracing.session(now=lambda: 0.0)
    # the answer was scheduled to play after the moment it was cut
    stamps = {k: v - 10.0 for k, v in FULL.items() if k != "done"} | {"answer_audio": 1.5, "done": 1.36}
    st.turn(report(stamps, barge_in=True))
    st.close()
    for s in exporter.get_finished_spans():
        assert s.end_time >= s.start_time, s.name
        if s.name != "voice.session":
            turn = next(t for t in exporter.get_finished_spans() if t.name == "voice.turn")
            assert turn.start_time <= s.start_time and s.end_time <= turn.end_time, s.name


def test_loop_events_drive_it_and_a_failed_backend_is_an_error(traced):
    tracing, exporter, opened = traced
    st = tracing.session(LLMInfo.backend("http://127.0.0.1:8080/v1", "qwen", max_tokens=5), now=lambda: 0.0)
    st.on_event(L.UserSpeechStarted(first_voiced_sample=0, barge_in=False))
    st.on_event(L.TurnEnded(transcript="uh", spoken="", reason=None, report=None))  # a noise: no turn
    r = report({k: v - 10.0 for k, v in FULL.items()})
    st.on_event(L.TurnEnded(transcript=r.transcript, spoken=r.reply, reason=None, report=r), usage=Usage(30, 0, 5))
    cut = report({k: v - 5.0 for k, v in FULL.items() if k not in ("first_phrase", "tts_first_audio", "answer_audio",
                                                                    "first_audio")}, turn=2)
    st.on_event(L.TurnEnded(transcript=cut.transcript, spoken="", reason="failed", report=cut, error="backend gone"))
    st.on_event(L.IdleTimeout(start_sample=0, end_sample=16000))
    st.close(at_s=9.0)
    assert not opened.open
    spans = exporter.get_finished_spans()
    session = next(s for s in spans if s.name == "voice.session")
    assert session.attributes["wafervox.session.turns"] == 2 and session.attributes["wafervox.session.non_speech"] == 1
    assert [e.name for e in session.events] == ["idle_timeout"]
    chats = sorted((s for s in spans if s.name == "chat qwen"), key=lambda s: s.start_time)
    assert len(chats) == 2
    ok, failed = chats
    assert ok.attributes["gen_ai.provider.name"] == "openai" and ok.attributes["server.address"] == "127.0.0.1"
    assert ok.attributes["server.port"] == 8080
    assert ok.attributes["gen_ai.response.finish_reasons"] == ("length",)  # 5 tokens of max 5
    assert failed.status.status_code is StatusCode.ERROR and failed.attributes["gen_ai.response.finish_reasons"] == ("error",)
    assert failed.attributes["wafervox.cut"] == "failed"
    turn2 = next(s for s in spans if s.name == "voice.turn" and s.attributes["wafervox.turn.number"] == 2)
    assert turn2.status.status_code is StatusCode.ERROR and turn2.attributes["wafervox.turn.end_reason"] == "failed"
    assert [e.name for e in turn2.events] == ["cut"]


def test_content_only_when_asked(traced):
    _, exporter, _ = traced
    tracing = Tracing.with_exporter(exporter, content=True)
    st = tracing.session(LLMInfo(model="m"), now=lambda: 0.0)
    st.turn(report({k: v - 10.0 for k, v in FULL.items()}))
    st.close()
    turn = next(s for s in exporter.get_finished_spans() if s.name == "voice.turn")
    chat = next(s for s in exporter.get_finished_spans() if s.name == "chat m")
    assert turn.attributes["wafervox.turn.transcript"] == "when do you open"
    assert turn.attributes["wafervox.turn.reply"] == "We open at seven."
    assert "when do you open" in chat.attributes["gen_ai.input.messages"]
    assert "We open at seven." in chat.attributes["gen_ai.output.messages"]


def test_the_session_span_ends_once_however_the_session_ends(traced):
    tracing, exporter, opened = traced
    with pytest.raises(RuntimeError):
        with tracing.session(now=lambda: 0.0) as st:
            st.turn(report({k: v - 10.0 for k, v in FULL.items()}))
            raise RuntimeError("the client went away")
    st.close()  # again: nothing
    assert st.closed and not opened.open
    st.turn(report({k: v - 10.0 for k, v in FULL.items()}, turn=2))  # after the end: dropped, nothing opened
    assert not opened.open
    sessions = [s for s in exporter.get_finished_spans() if s.name == "voice.session"]
    assert len(sessions) == 1
    (s,) = sessions
    assert s.status.status_code is StatusCode.ERROR and s.attributes["wafervox.session.end_reason"] == "error"
    assert [e.name for e in s.events] == ["exception"]
    assert s.end_time >= next(t for t in exporter.get_finished_spans() if t.name == "voice.turn").end_time
    assert len([t for t in exporter.get_finished_spans() if t.name == "voice.turn"]) == 1
    with tracing.session(now=lambda: 0.0) as st2:
        pass
    assert st2.closed and not opened.open


def test_disconnect_mid_turn_leaves_nothing_open(traced):
    tracing, exporter, opened = traced
    st = tracing.session(now=lambda: 0.0, server=True, attributes={"wafervox.session.transport": "realtime"})
    st.turn(report({k: v - 10.0 for k, v in FULL.items()}))
    # the client left while the next turn was being answered: the loop never reports it, the session ends
    st.close("closed", cut_turn=True)
    assert not opened.open
    session = next(s for s in exporter.get_finished_spans() if s.name == "voice.session")
    assert session.kind is SpanKind.SERVER and session.attributes["wafervox.session.end_reason"] == "closed"
    assert session.attributes["wafervox.session.cut_turn"] is True
    assert session.attributes["wafervox.session.transport"] == "realtime"


def test_otlp_endpoint_url():
    assert otlp_endpoint("http://127.0.0.1:4318") == "http://127.0.0.1:4318/v1/traces"
    assert otlp_endpoint("http://127.0.0.1:4318/") == "http://127.0.0.1:4318/v1/traces"
    assert otlp_endpoint("https://collector.local/custom/traces") == "https://collector.local/custom/traces"
    for bad in ("127.0.0.1:4318", "ftp://x", "http://"):
        with pytest.raises(ValueError):
            otlp_endpoint(bad)
    with pytest.raises(ValueError):
        Tracing.to("console", "http://127.0.0.1:4318")
    with pytest.raises(ValueError):
        Tracing.to("jaeger")


@pytest.fixture
@kind(NETWORK)
def collector():
    """A loopback HTTP server that keeps the bodies POSTed to it."""
    got = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            got.append((self.path, self.headers.get("Content-Type"), self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", got
    server.shutdown()
    server.server_close()


def test_otlp_export_reaches_a_collector(collector):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    url, got = collector
    tracing = Tracing.to("otlp", url)
    st = tracing.session(LLMInfo(model="m"), now=lambda: 0.0)
    st.turn(report({k: v - 10.0 for k, v in FULL.items()}))
    st.close()
    tracing.shutdown()  # flushes the batch
    assert got and all(path == "/v1/traces" and ctype == "application/x-protobuf" for path, ctype, _ in got)
    names = []
    for _, _, body in got:
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        for rs in req.resource_spans:
            assert any(a.key == "service.name" and a.value.string_value == "wafervox" for a in rs.resource.attributes)
            names += [s.name for ss in rs.scope_spans for s in ss.spans]
    assert sorted(names) == sorted(["voice.session", "voice.turn", "chat m", "voice.user_speech", "voice.endpoint", "voice.asr",
                                    "voice.turn_end_score", "voice.llm.first_token", "voice.tts.first_audio", "voice.hold",
                                    "voice.playout"])


def test_the_flags_ask_for_an_exporter_or_nothing():
    import argparse

    from server.cli.common import CLIError, llm_info, otel_flags, otel_tracing

    ap = argparse.ArgumentParser()
    ap.add_argument("wav", nargs="*")
    otel_flags(ap)
    assert otel_tracing(ap.parse_args(["a.wav"])) is None  # off unless asked
    args = ap.parse_args(["a.wav", "--otel"])
    assert args.otel == "console" and args.wav == ["a.wav"]
    t = otel_tracing(args)
    assert isinstance(t, Tracing) and not t.content
    t.shutdown()
    args = ap.parse_args(["--otel-endpoint", "http://127.0.0.1:4318"])
    t = otel_tracing(args)  # an endpoint: otlp
    assert isinstance(t, Tracing)
    t.shutdown()
    for bad, needle in ((["--otel", "console", "--otel-endpoint", "http://127.0.0.1:4318"], "otlp"),
                        (["--otel", "otlp", "--otel-endpoint", "127.0.0.1:4318"], "--otel-endpoint"),
                        (["--otel-content"], "needs --otel")):
        with pytest.raises(CLIError, match=needle):
            otel_tracing(ap.parse_args(bad))
    with pytest.raises(SystemExit):
        ap.parse_args(["--otel", "jaeger"])

    class Conv:
        max_tokens = 48

    local = llm_info(argparse.Namespace(llm=None, llm_model=None, model="models/tiny-llama.Q8_0.gguf"), Conv())
    assert (local.provider, local.model, local.max_tokens) == ("wafervox", "tiny-llama.Q8_0", 48)
    remote = llm_info(argparse.Namespace(llm="https://llm.example/v1", llm_model="qwen", model=None), Conv())
    assert (remote.provider, remote.model, remote.server_address, remote.server_port) == ("openai", "qwen", "llm.example", 443)


#: a text-only answer (output_modalities ["text"]): no TTS; its first text handed out at ``answer_text``
TEXT = {k: v for k, v in FULL.items() if k not in ("tts_first_audio", "answer_audio", "first_audio")} | {"answer_text": 11.28}


def test_a_text_only_turn_carries_its_time_to_first_text(traced):
    tracing, exporter, opened = traced
    st = tracing.session(LLMInfo(model="SmolLM2-135M-Instruct", max_tokens=48), session_id="s1", now=lambda: 10.0)
    st.turn(report(TEXT))
    st.close(at_s=13.0)
    (turn,) = [s for s in exporter.get_finished_spans() if s.name == "voice.turn"]
    assert turn.attributes["wafervox.turn.time_to_first_text_ms"] == pytest.approx(280.0)
    assert "wafervox.turn.time_to_first_audio_ms" not in turn.attributes
    assert turn.attributes["wafervox.turn.overrun_ms"] == 0.0 and turn.attributes["wafervox.turn.within_budget"] is True
    assert not opened.open


def test_metrics_count_a_text_only_turn_as_answered():
    from server.metrics import Metrics

    m = Metrics()
    m.turn(report(TEXT).to_dict())
    m.turn(report(FULL).to_dict())
    m.turn(report({"speech_start": 10.0, "last_voiced": 11.0, "endpoint": 11.3}).to_dict())  # no answer: not counted
    text = m.render().decode()
    assert "wafervox_turns_total 2.0" in text and "wafervox_turns_within_budget_total 2.0" in text
    assert 'wafervox_turn_stage_seconds_count{stage="voice_to_text_ms"} 1.0' in text
    assert 'wafervox_turn_stage_seconds_count{stage="voice_to_voice_ms"} 1.0' in text
