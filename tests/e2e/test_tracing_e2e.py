"""``wafervox run --otel`` on the real engines: the default conversation and then the barge-in recording, played as one
session (in this process, on the virtual clock), its spans read from the SDK's in-memory exporter.  Every stage that
every turn reached is a span with the report's own times, under its turn (the LLM's first token under the LLM's span),
under the session; the figures are attributes; the barge-in turn ends at the cut; no span is left open."""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from spans import OpenSpans

from server import tracing as T
from voice.replay import SAMPLES, conversation_files, manifest

pytestmark = pytest.mark.engines



def expected_stages(report) -> dict[str, tuple[str, str]]:
    """Stage -> the marks its span runs between, for the stages whose both marks the report has (a cut turn may have
    more spans, ending at the cut: checked apart)."""
    s = report.stamps
    out = {stage: (a, b) for stage, _, a, b, _, _ in T.STAGES if a in s and b in s}
    if "llm" not in out and "transcript" in s and "first_token" in s and not report.barge_in:
        out["llm"] = ("transcript", "first_token")
    return out


@pytest.fixture(scope="module")
def traced_run():
    exporter, opened, reports, sessions = InMemorySpanExporter(), OpenSpans(), [], []

    def to(kind, endpoint=None, content=False, service="wafervox"):
        assert (kind, endpoint) == ("console", None)  # what a bare --otel asks for
        t = T.Tracing.with_exporter(exporter, content=content)
        t.provider.add_span_processor(opened)
        return t

    real_turn, real_init = T.SessionTrace.turn, T.SessionTrace.__init__

    def turn(self, report, **kw):
        reports.append((report, kw))
        return real_turn(self, report, **kw)

    def init(self, *a, **kw):
        real_init(self, *a, **kw)
        sessions.append(self)

    mp = pytest.MonkeyPatch()
    mp.setattr(T.Tracing, "to", staticmethod(to))
    mp.setattr(T.SessionTrace, "turn", turn)
    mp.setattr(T.SessionTrace, "__init__", init)
    import contextlib
    import io

    from server.cli import main

    files = [*conversation_files("default"), SAMPLES / manifest()["barge_in"]["file"]]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            rc = main(["run", *map(str, files), "--fast", "--json", "--otel"])
    finally:
        mp.undo()
    assert rc == 0
    lines = [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]
    return exporter.get_finished_spans(), opened, reports, lines[:-1], sessions


def test_one_session_span_and_one_turn_span_per_turn(traced_run):
    spans, opened, reports, printed, sessions = traced_run
    assert not opened.open, opened.open  # nothing left open
    assert opened.started == len(spans)
    (session,) = [s for s in spans if s.name == "voice.session"]
    assert session.parent is None
    turns = [s for s in spans if s.name == "voice.turn"]
    assert len(turns) == len(reports) == len(printed) >= 5
    assert sorted(t.attributes["wafervox.turn.number"] for t in turns) == [p["turn"] for p in printed]
    for t in turns:
        assert t.parent.span_id == session.context.span_id
        assert session.start_time <= t.start_time <= t.end_time <= session.end_time
    a = session.attributes
    assert a["wafervox.session.turns"] == len(turns) and a["wafervox.session.end_reason"] == "finished"
    assert a["wafervox.session.source"] == "run" and a["wafervox.session.clock"] == "virtual"
    assert a["wafervox.session.barge_ins"] == sum(p["barge_in"] for p in printed) >= 1
    assert a["wafervox.deployment"] == printed[0]["simulated"]["deployment"]
    assert {s.context.trace_id for s in spans} == {session.context.trace_id}
    assert sessions[0].closed


def test_every_stage_each_turn_reached_is_a_span_at_the_reports_times(traced_run):
    spans, _, reports, printed, sessions = traced_run
    st = sessions[0]
    by_turn = {t.attributes["wafervox.turn.number"]: t for t in spans if t.name == "voice.turn"}
    for (report, _), line in zip(reports, printed):
        assert report.turn == line["turn"]
        turn = by_turn[report.turn]
        children = [s for s in spans if s.parent and s.parent.span_id == turn.context.span_id]
        (llm,) = [s for s in children if s.attributes.get("wafervox.stage") == "llm"]
        children += [s for s in spans if s.parent and s.parent.span_id == llm.context.span_id]
        stages = {s.attributes["wafervox.stage"]: s for s in children}
        assert len(stages) == len(children)  # one span a stage
        want = expected_stages(report)
        assert set(want) <= set(stages), (report.turn, set(want) - set(stages))
        for stage, (a, b) in want.items():
            span = stages[stage]
            assert span.start_time == st._ns(report.stamps[a]), (report.turn, stage)
            assert span.end_time == st._ns(max(report.stamps[a], report.stamps[b])), (report.turn, stage)
            assert turn.start_time <= span.start_time <= span.end_time <= turn.end_time
        extra = set(stages) - set(want)
        assert not extra or report.barge_in, (report.turn, extra)  # only a cut turn has a stage ending at the cut
        for stage in extra:
            assert stages[stage].attributes["wafervox.cut"] == "turn_detected"
            assert stages[stage].end_time == st._ns(report.stamps["done"])
        assert stages["llm_first_token"].parent.span_id == llm.context.span_id
        # a full answer reaches every stage (the end-of-turn score too: the semantic end of turn is the default)
        if not report.barge_in:
            assert set(stages) == set(T.STAGE_NAMES), report.turn


def test_the_figures_are_attributes(traced_run):
    spans, _, reports, printed, _ = traced_run
    by_turn = {t.attributes["wafervox.turn.number"]: t for t in spans if t.name == "voice.turn"}
    for (report, _), line in zip(reports, printed):
        a = by_turn[report.turn].attributes
        for k, v in line["latency_ms"].items():
            if v is None:
                assert f"wafervox.latency.{k}" not in a
            else:
                assert a[f"wafervox.latency.{k}"] == pytest.approx(v, abs=0.06), k
        for k, v in line["work_ms"].items():
            assert a[f"wafervox.work.{k}"] == pytest.approx(v, abs=0.06), k
        sim = line["simulated"]
        assert sim, "the default run projects every turn on its deployment"
        for k, v in sim.items():
            assert a[f"wafervox.simulated.{k}"] == (pytest.approx(v, abs=1e-3) if isinstance(v, float) else v), k
        assert a["wafervox.turn.within_budget"] == line["within_budget"]
        assert a["wafervox.turn.barge_in"] == line["barge_in"]
        assert a["wafervox.turn.mitigation"] == line["mitigation"]
        assert a["wafervox.end_of_turn.rule"] == line["end_of_turn"]["rule"]
        assert "wafervox.turn.transcript" not in a  # no --otel-content


def test_the_llm_span_follows_the_genai_conventions(traced_run):
    spans, _, reports, printed, _ = traced_run
    chats = [s for s in spans if s.attributes.get("wafervox.stage") == "llm"]
    assert len(chats) == len(reports)
    for span in chats:
        g = span.attributes
        assert span.kind is SpanKind.CLIENT
        assert span.name == f"chat {g['gen_ai.request.model']}" and g["gen_ai.request.model"].startswith("SmolLM2")
        assert g["gen_ai.operation.name"] == "chat" and g["gen_ai.provider.name"] == "wafervox"
        assert g["gen_ai.request.max_tokens"] > 0
        assert g["gen_ai.usage.input_tokens"] > 0 and g["gen_ai.usage.output_tokens"] > 0
        assert g["gen_ai.response.time_to_first_chunk"] > 0
        assert [e.name for e in span.events] == ["gen_ai.first_token"]
        # (0 when the answer's first words are its fact's own, said before the model runs: the grounded persona's)
        assert g["wafervox.simulated.llm_first_token_ms"] >= 0 and g["wafervox.simulated.token_ms"] > 0
    turn_of = {t.context.span_id: t for t in spans if t.name == "voice.turn"}
    for span in chats:
        turn = turn_of[span.parent.span_id]
        if turn.attributes["wafervox.turn.barge_in"]:
            assert "gen_ai.response.finish_reasons" not in span.attributes
        else:
            assert span.attributes["gen_ai.response.finish_reasons"] in (("stop",), ("length",))


def test_the_barge_in_turn_ends_at_the_cut(traced_run):
    spans, _, reports, printed, sessions = traced_run
    cut = [(r, kw) for r, kw in reports if r.barge_in]
    assert cut, [line["reply"] for line in printed]
    for report, _ in cut:
        turn = next(t for t in spans if t.name == "voice.turn" and t.attributes["wafervox.turn.number"] == report.turn)
        assert turn.attributes["wafervox.turn.end_reason"] == "turn_detected"
        assert [e.name for e in turn.events] == ["barge_in"]
        assert turn.events[0].timestamp == sessions[0]._ns(report.stamps["done"])
        playout = [s for s in spans if s.parent and s.parent.span_id == turn.context.span_id
                   and s.attributes["wafervox.stage"] == "playout"]
        if "answer_audio" in report.stamps:  # the answer had started playing: its playout ends at the cut
            assert playout[0].attributes["wafervox.playout.complete"] is False
            assert playout[0].end_time == sessions[0]._ns(report.stamps["done"])
    # the turn after it is answered and traced in full
    after = [r for r, _ in reports if r.turn == cut[-1][0].turn + 1]
    assert after and after[0].reply
