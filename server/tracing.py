"""OpenTelemetry traces of voice sessions: one span per session, per turn and per stage of a turn.

Off unless asked for (``--otel console``, ``--otel otlp [--otel-endpoint URL]``).  The adapter is sans-I/O-ish: it never
keeps a turn's span open while the turn runs.  A turn's spans are made whole, after the fact, from its
``voice.latency.TurnReport``: every stage span starts and ends at the report's own stamps (the loop's clock, turned into
epoch nanoseconds with one offset taken when the session starts), so a barge-in, a cancel or a disconnect in the middle of
a turn cannot leave one open.  Only the session span lives as long as the session, and ``SessionTrace.close`` (idempotent,
called from a ``finally``) ends it.

The tree of one session::

    voice.session                                  wafervox.session.*, gen_ai.conversation.id
      voice.turn                                   wafervox.turn.*, wafervox.latency.*, wafervox.work.*,
                                                   wafervox.simulated.*, wafervox.end_of_turn.*; event "barge_in", "overlap"
        voice.user_speech      speech_start -> last_voiced
        voice.endpoint         last_voiced  -> endpoint          (end-of-turn policy included)
        voice.asr              asr_start    -> transcript
        voice.turn_end_score   transcript   -> turn_end_score
        chat {model}           transcript   -> first_phrase      GenAI conventions (gen_ai.*); event "gen_ai.first_token"
          voice.llm.first_token  transcript -> first_token
        voice.tts.first_audio  first_phrase -> tts_first_audio
        voice.hold             tts_first_audio -> answer_audio
        voice.playout          answer_audio -> done              (the answer's audio, to its end or to the cut)

A stage the turn never reached has no span.  A stage that had started when the turn was cut (a barge-in, a client's
cancel, a failed backend) ends at the cut, with ``wafervox.cut`` set to why.  Every stage span carries
``wafervox.stage`` (its stage's name, as in ``STAGES``) and, where the report has one, its ``wafervox.latency_ms``.
A turn still being answered when the session ends has no report, so no spans: the session's span says so
(``wafervox.session.cut_turn``).

Wiring: ``wafervox run`` opens one ``SessionTrace`` for the conversation and hands it each report (``server/cli/run.py``);
``wafervox serve`` ``install``s the process's ``Tracing`` and each ``server.session.RealtimeSession`` opens its own
(``open_session``), feeds it the loop's events and closes it in its thread's ``finally``.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from voice import loop_events as L
from voice.latency import TurnReport

#: the exporters ``--otel`` offers
EXPORTERS = ("console", "otlp")
OTLP_TRACES_PATH = "/v1/traces"
INSTRUMENTATION = "wafervox.voice"
log = logging.getLogger("wafervox.tracing")

#: stage, span name, start mark, end mark, the latency figure of the report it carries, and whether it ends at the cut
#: when the turn was cut before its end mark (a stage of the answer's work) or has no span then
STAGES = (
    ("user_speech", "voice.user_speech", "speech_start", "last_voiced", None, False),
    ("endpoint", "voice.endpoint", "last_voiced", "endpoint", "endpoint_ms", False),
    ("asr", "voice.asr", "asr_start", "transcript", "asr_ms", True),
    ("turn_end_score", "voice.turn_end_score", "transcript", "turn_end_score", None, False),
    ("llm", "chat", "transcript", "first_phrase", "first_phrase_ms", True),  # the name becomes "chat {model}"
    ("llm_first_token", "voice.llm.first_token", "transcript", "first_token", "llm_first_token_ms", True),
    ("tts_first_audio", "voice.tts.first_audio", "first_phrase", "tts_first_audio", "tts_first_audio_ms", True),
    ("hold", "voice.hold", "tts_first_audio", "answer_audio", "hold_ms", True),
    ("playout", "voice.playout", "answer_audio", "done", None, True),
)
STAGE_NAMES = tuple(s[0] for s in STAGES)
#: stages whose span is a child of the LLM's span rather than of the turn's
LLM_CHILDREN = ("llm_first_token",)
#: what each work figure of the report belongs to
WORK_OF = {"asr_run_ms": "asr", "turn_end_score_ms": "turn_end_score"}


@dataclass(frozen=True, slots=True)
class LLMInfo:
    """What the GenAI attributes of the LLM's span say of the model: ``provider`` (``gen_ai.provider.name``: "wafervox"
    for the local decode core, "openai" for an OpenAI-compatible backend), ``model`` (``gen_ai.request.model``),
    ``max_tokens``, and for a backend its ``server_address`` / ``server_port``."""

    provider: str = "wafervox"
    model: str = "unknown"
    max_tokens: int | None = None
    server_address: str | None = None
    server_port: int | None = None

    @classmethod
    def backend(cls, url: str, model: str | None, max_tokens: int | None = None) -> LLMInfo:
        parts = urlsplit(url)
        return cls(provider="openai", model=model or "default", max_tokens=max_tokens, server_address=parts.hostname,
                   server_port=parts.port or (443 if parts.scheme == "https" else 80))


def otlp_endpoint(url: str) -> str:
    """The traces URL for ``url``: a bare collector address (``http://host:4318``) gets OTLP's ``/v1/traces`` path, a URL
    with a path is used as it is."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    if parts.path in ("", "/"):
        parts = parts._replace(path=OTLP_TRACES_PATH)
    return urlunsplit(parts)


def _attr(value):
    """``value`` as an OpenTelemetry attribute value, or None when it has none (None, a dict, a mixed list)."""
    if isinstance(value, bool | str | int | float):
        return value
    if isinstance(value, list | tuple) and value and all(isinstance(v, str) for v in value):
        return tuple(value)
    if isinstance(value, list | tuple) and value and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
        return tuple(value)
    return None


def _put(attrs: dict, prefix: str, values: dict | None) -> None:
    for k, v in (values or {}).items():
        a = _attr(round(v, 3) if isinstance(v, float) else v)
        if a is not None:
            attrs[f"{prefix}{k}"] = a


class Tracing:
    """The tracer of a process, on its own ``TracerProvider`` (the global provider is left alone).  ``content``: put what
    was said (transcripts, replies) on the spans; off by default, as the GenAI conventions ask."""

    def __init__(self, provider, content: bool = False, owned: bool = True):
        self.provider = provider
        self.tracer = provider.get_tracer(INSTRUMENTATION)
        self.content = content
        self._owned = owned

    @classmethod
    def to(cls, exporter: str, endpoint: str | None = None, content: bool = False, service: str = "wafervox") -> Tracing:
        """``exporter`` "console" (JSON spans on stderr) or "otlp" (OTLP over HTTP/protobuf to ``endpoint``, else where
        ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT`` say, else a local collector), batched off
        the voice thread."""
        from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        if exporter == "console":
            if endpoint:
                raise ValueError("an endpoint goes with the otlp exporter, not the console")
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            out = ConsoleSpanExporter(out=sys.stderr)  # stdout is the turns' own (JSON Lines with --json)
        elif exporter == "otlp":
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            except ImportError:  # pragma: no cover - a dependency; missing only in a broken install
                raise ValueError("the otlp exporter needs the opentelemetry-exporter-otlp-proto-http package") from None
            out = OTLPSpanExporter(endpoint=otlp_endpoint(endpoint)) if endpoint else OTLPSpanExporter()
        else:
            raise ValueError(f"unknown exporter {exporter!r} (have: {', '.join(EXPORTERS)})")
        provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service, SERVICE_VERSION: _version()}))
        provider.add_span_processor(BatchSpanProcessor(out))
        return cls(provider, content=content)

    @classmethod
    def with_exporter(cls, exporter, content: bool = False) -> Tracing:
        """Spans handed to ``exporter`` as each ends (tests: the SDK's ``InMemorySpanExporter``)."""
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor

        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        return cls(provider, content=content)

    def session(self, llm: LLMInfo | None = None, *, session_id: str | None = None, now: Callable[[], float] | None = None,
                attributes: dict | None = None, server: bool = False) -> SessionTrace:
        """Open a session's span.  ``now``: the voice loop's clock (seconds); None: the loop's clock starts now (a loop
        made right after this call).  ``server``: a client's session on the server (span kind SERVER)."""
        return SessionTrace(self, llm or LLMInfo(), session_id=session_id, now=now, attributes=attributes, server=server)

    def shutdown(self) -> None:
        """Export what is queued and stop (the end of the process's tracing)."""
        if self._owned:
            self.provider.shutdown()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("wafervox")
    except PackageNotFoundError:  # pragma: no cover - run from a tree that is not installed
        return "unknown"


#: the process's tracing for the server's sessions (``install``), None: off
_installed: Tracing | None = None
_installed_llm: LLMInfo | None = None
_installed_attributes: dict = {}


def install(tracing: Tracing | None, llm: LLMInfo | None = None, attributes: dict | None = None) -> None:
    """Trace every server session of this process from now on (``wafervox serve --otel``; None: stop), their LLM spans
    saying ``llm``, their session spans carrying ``attributes`` too (the deployment, ...)."""
    global _installed, _installed_llm, _installed_attributes
    _installed, _installed_llm, _installed_attributes = tracing, llm, dict(attributes or {})


def installed() -> Tracing | None:
    return _installed


def open_session(name: str, loop, transport: str) -> SessionTrace | None:
    """A server session's trace, when tracing is installed (else None): its span starts now, on ``loop``'s clock, and its
    LLM spans read their token counts from the loop's conversation (``Conversation.last_usage``) as each turn ends."""
    t = _installed
    if t is None:
        return None
    st = t.session(_installed_llm, now=loop.clock.now, server=True,
                   attributes={**_installed_attributes, "wafervox.session.source": "serve", "wafervox.session.name": name,
                               "wafervox.session.transport": transport})
    st.usage_of = lambda: getattr(loop.e.llm, "last_usage", None)
    return st


class SessionTrace:
    """One session's spans.  ``turn(report)`` for each finished turn (``on_event`` does it from the loop's
    ``TurnEnded``), ``close()`` at the end, however it ends; use it as a context manager, or call ``close`` in a
    ``finally``."""

    def __init__(self, tracing: Tracing, llm: LLMInfo, *, session_id: str | None = None,
                 now: Callable[[], float] | None = None, attributes: dict | None = None, server: bool = False):
        self.tracing = tracing
        self.llm = llm
        self.id = session_id or uuid.uuid4().hex
        start = now() if now is not None else 0.0
        self._wall0 = time.perf_counter() - start
        self._epoch_ns = time.time_ns() - round(start * 1e9)  # epoch ns of the loop clock's zero
        self._lock = threading.Lock()
        self._closed = False
        self._last_s = start  # the latest loop time a span reached
        #: where ``on_event`` reads a turn's token counts when it is not given them (``open_session``)
        self.usage_of: Callable[[], object] | None = None
        self.turns = 0
        self.within_budget = 0
        self.barge_ins = 0
        self.non_speech = 0
        attrs = {"wafervox.session.id": self.id, "gen_ai.conversation.id": self.id}
        _put(attrs, "", attributes)
        self.span = tracing.tracer.start_span("voice.session", kind=SpanKind.SERVER if server else SpanKind.INTERNAL,
                                              attributes=attrs, start_time=self._ns(start))
        self._context = trace.set_span_in_context(self.span)

    def _ns(self, t: float) -> int:
        return self._epoch_ns + round(t * 1e9)

    @property
    def closed(self) -> bool:
        return self._closed

    # -- the voice loop's side ---------------------------------------------------------------------

    def on_event(self, ev: L.LoopEvent, usage=None) -> None:
        """Follow the loop (``VoiceLoop(on_event=...)``): a turn's spans when it ends; ``usage`` its LLM's token counts
        (``Conversation.last_usage``).  Tracing never ends a session: a failure here is logged and the event dropped."""
        try:
            self._on_event(ev, usage)
        except Exception:
            log.exception("tracing: %s dropped", type(ev).__name__)

    def _on_event(self, ev: L.LoopEvent, usage) -> None:
        if isinstance(ev, L.TurnEnded):
            if ev.report is None:
                self.non_speech += 1
                return
            if usage is None and self.usage_of is not None:
                usage = self.usage_of()
            self.turn(ev.report, reason=ev.reason, error=ev.error, called=ev.called, usage=usage)
        elif isinstance(ev, L.IdleTimeout) and not self._closed:
            self.span.add_event("idle_timeout", {"wafervox.idle.start_sample": ev.start_sample,
                                                 "wafervox.idle.end_sample": ev.end_sample})

    def turn(self, report: TurnReport, *, reason: str | None = None, error: str | None = None, called: bool = False,
             usage=None) -> list:
        """Emit one finished turn's spans (ended, children of the session's span); returns them, the turn's first."""
        with self._lock:
            if self._closed:
                return []
            spans = _TurnSpans(self, report, reason, error, called, usage).emit()
            self.turns += 1
            self.within_budget += report.within_budget
            self.barge_ins += report.barge_in
            return spans

    # -- the end ---------------------------------------------------------------------------------------

    def close(self, reason: str = "finished", at_s: float | None = None, error: BaseException | str | None = None,
              cut_turn: bool = False) -> None:
        """End the session's span (once; later calls do nothing).  ``reason``: "finished", "closed", "error", ...;
        ``at_s``: the loop's clock at the end (default: the time passed since the session began, and never before the
        last turn's end); ``cut_turn``: a turn was being answered (it will have no report, so no spans)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.usage_of = None  # (it holds the loop)
        end = at_s if at_s is not None else time.perf_counter() - self._wall0
        end = max(end, self._last_s)
        s = self.span
        s.set_attributes({"wafervox.session.end_reason": reason, "wafervox.session.turns": self.turns,
                          "wafervox.session.within_budget": self.within_budget, "wafervox.session.barge_ins": self.barge_ins,
                          "wafervox.session.non_speech": self.non_speech, "wafervox.session.cut_turn": cut_turn})
        if self.turns:
            s.set_attribute("wafervox.session.budget_hit_rate", round(self.within_budget / self.turns, 3))
        if error is not None:
            if isinstance(error, BaseException):
                s.record_exception(error, timestamp=self._ns(end))
            s.set_status(Status(StatusCode.ERROR, error if isinstance(error, str) else f"{type(error).__name__}: {error}"))
        s.end(end_time=self._ns(end))

    def __enter__(self) -> SessionTrace:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if exc is not None:
            self.close("error", error=exc)
        else:
            self.close()


class _TurnSpans:
    """The spans of one turn, made from its report."""

    def __init__(self, st: SessionTrace, r: TurnReport, reason, error, called, usage):
        self.st, self.r, self.error, self.called, self.usage = st, r, error, called, usage
        self.reason = reason if reason is not None else ("turn_detected" if r.barge_in else
                                                         "client_cancelled" if "cancelled" in r.mitigations else None)
        if error is not None and self.reason is None:
            self.reason = "failed"
        self.cut = self.reason is not None
        self.stamps = {k: v for k, v in r.stamps.items() if v is not None}
        self.lat = r.latency_ms

    def _bounds(self, start_mark: str, end_mark: str, to_cut: bool) -> tuple[float, float, bool] | None:
        s = self.stamps
        if start_mark not in s:
            return None
        t0 = s[start_mark]
        if end_mark in s:
            return t0, max(t0, s[end_mark]), False
        if to_cut and self.cut and "done" in s:
            return t0, max(t0, s["done"]), True
        return None

    def emit(self) -> list:
        r, st, s = self.r, self.st, self.stamps
        tracer = st.tracing.tracer
        if not s:
            return []
        start, end = min(s.values()), max(s.values())
        turn = tracer.start_span("voice.turn", context=st._context, attributes=self._turn_attrs(), start_time=st._ns(start))
        out = [turn]
        ctx = trace.set_span_in_context(turn)
        llm_ctx = None
        children = []
        for stage, name, a, b, figure, to_cut in STAGES:
            bounds = self._bounds(a, b, to_cut)
            if stage == "llm" and bounds is None:  # no phrase: the LLM ran to its first token, or was cut
                bounds = self._bounds(a, "first_token", to_cut)
            if bounds is None:
                continue
            t0, t1, was_cut = bounds
            attrs = {"wafervox.stage": stage}
            if figure and self.lat.get(figure) is not None:
                attrs["wafervox.latency_ms"] = round(self.lat[figure], 3)
            for work, of in WORK_OF.items():
                if of == stage and r.work_ms.get(work) is not None:
                    attrs["wafervox.work_ms"] = round(r.work_ms[work], 3)
            if was_cut:
                attrs["wafervox.cut"] = self.reason
            if stage == "llm":
                name = f"chat {st.llm.model}"
                attrs.update(self._llm_attrs(t0))
            if stage == "asr":
                attrs["wafervox.asr.speculative"] = "pause" in s
            if stage == "endpoint" and r.end_of_turn:
                _put(attrs, "wafervox.end_of_turn.", r.end_of_turn)
            if stage == "turn_end_score" and r.end_of_turn:
                _put(attrs, "wafervox.end_of_turn.", {k: v for k, v in r.end_of_turn.items() if k in ("p_end", "p_token", "source")})
            if stage == "playout":
                attrs["wafervox.playout.complete"] = not self.cut
            kind = SpanKind.CLIENT if stage == "llm" else SpanKind.INTERNAL
            parent = llm_ctx if stage in LLM_CHILDREN and llm_ctx is not None else ctx
            span = tracer.start_span(name, context=parent, kind=kind, attributes=attrs, start_time=st._ns(t0))
            if stage == "llm":
                llm_ctx = trace.set_span_in_context(span)
                if "first_token" in s:
                    span.add_event("gen_ai.first_token", timestamp=st._ns(s["first_token"]))
                if self.error is not None:
                    span.set_status(Status(StatusCode.ERROR, self.error))
                    span.set_attribute("error.type", "backend_failed")
            children.append((span, t1))
            end = max(end, t1)
        for span, t1 in children:  # (ended after the LLM's child spans were made under it)
            span.end(end_time=st._ns(t1))
            out.append(span)
        if "first_audio" in s and s.get("first_audio") != s.get("answer_audio"):
            turn.add_event("first_audio", {"wafervox.ack": "ack" in r.mitigations}, timestamp=st._ns(s["first_audio"]))
        for o in r.overlaps:  # speech over the answer that was no turn: the voice paused, then went on
            turn.add_event("overlap", {"wafervox.overlap.kind": o["kind"], "wafervox.overlap.text": o["text"],
                                       "wafervox.overlap.paused_ms": o["paused_ms"]}, timestamp=st._ns(o["speech_start_s"]))
        if self.cut:
            at = s.get("done", end)
            turn.add_event("barge_in" if self.reason == "turn_detected" else "cut", {"wafervox.turn.end_reason": self.reason},
                           timestamp=st._ns(at))
        if self.error is not None:
            turn.set_status(Status(StatusCode.ERROR, self.error))
        turn.end(end_time=st._ns(end))
        st._last_s = max(st._last_s, end)
        return out

    def _turn_attrs(self) -> dict:
        r = self.r
        attrs = {"wafervox.turn.number": r.turn, "wafervox.turn.budget_ms": r.budget_ms,
                 "wafervox.turn.within_budget": r.within_budget, "wafervox.turn.barge_in": r.barge_in,
                 "wafervox.turn.end_reason": self.reason or "completed", "wafervox.turn.typed": "last_voiced" not in self.stamps,
                 "wafervox.turn.mitigation": r.mitigation, "wafervox.turn.overlaps": len(r.overlaps)}
        if r.mitigations:
            attrs["wafervox.turn.mitigations"] = tuple(r.mitigations)
        v2v, answer = r.voice_to_voice_ms, r.answer_ms
        if answer is not None:
            attrs["wafervox.turn.overrun_ms"] = round(r.overrun_ms, 3)
        if v2v is not None:
            attrs["wafervox.turn.time_to_first_audio_ms"] = round(v2v, 3)  # the turn's time to first byte of the answer
        elif answer is not None:  # a text-only answer: its first text handed out
            attrs["wafervox.turn.time_to_first_text_ms"] = round(answer, 3)
        if r.forecast_ms is not None:
            attrs["wafervox.turn.forecast_ms"] = round(r.forecast_ms, 3)
        _put(attrs, "wafervox.latency.", self.lat)
        _put(attrs, "wafervox.work.", r.work_ms)
        _put(attrs, "wafervox.simulated.", r.simulated)
        _put(attrs, "wafervox.end_of_turn.", r.end_of_turn)
        if self.called:
            attrs["wafervox.turn.called_tool"] = True
        if self.st.tracing.content:
            attrs["wafervox.turn.transcript"] = r.transcript
            attrs["wafervox.turn.reply"] = r.reply
        return attrs

    def _llm_attrs(self, t0: float) -> dict:
        """The GenAI conventions' attributes of an inference span (and the older ``gen_ai.system`` beside
        ``gen_ai.provider.name``), the report's figures of the LLM, and its ``simulated`` ones."""
        info, r, s = self.st.llm, self.r, self.stamps
        a = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": info.provider, "gen_ai.system": info.provider,
             "gen_ai.request.model": info.model, "gen_ai.conversation.id": self.st.id, "gen_ai.output.type": "text",
             "gen_ai.request.stream": True}
        if info.max_tokens is not None:
            a["gen_ai.request.max_tokens"] = info.max_tokens
        if info.server_address:
            a["server.address"] = info.server_address
            if info.server_port:
                a["server.port"] = info.server_port
        u = self.usage
        if u is not None:
            a["gen_ai.usage.input_tokens"] = int(u.input_tokens)
            a["gen_ai.usage.output_tokens"] = int(u.output_tokens)
            if getattr(u, "cached_tokens", None):
                a["gen_ai.usage.cache_read.input_tokens"] = int(u.cached_tokens)
        finish = self._finish_reason(u)
        if finish:
            a["gen_ai.response.finish_reasons"] = (finish,)
        if "first_token" in s:
            a["gen_ai.response.time_to_first_chunk"] = round(max(0.0, s["first_token"] - t0), 6)  # seconds, as the conventions say
        for key in ("llm_first_token_ms", "first_phrase_ms"):
            if self.lat.get(key) is not None:
                a[f"wafervox.latency.{key}"] = round(self.lat[key], 3)
        if r.simulated:
            _put(a, "wafervox.simulated.", {k: v for k, v in r.simulated.items()
                                            if k in ("deployment", "llm_first_token_ms", "first_phrase_ms", "token_ms")})
        if self.st.tracing.content:
            a["gen_ai.input.messages"] = json.dumps([{"role": "user", "parts": [{"type": "text", "content": r.transcript}]}])
            a["gen_ai.output.messages"] = json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": r.reply}],
                                                       **({"finish_reason": finish} if finish else {})}])
        return a

    def _finish_reason(self, usage) -> str | None:
        """Why the reply stopped, in the conventions' words; None when it was cut (then whether it had finished is
        not known: ``wafervox.cut`` says why the turn stopped)."""
        if self.error is not None:
            return "error"
        if self.called:
            return "tool_call"
        if self.cut:
            return None
        if usage is not None and self.st.llm.max_tokens is not None and usage.output_tokens >= self.st.llm.max_tokens:
            return "length"
        return "stop"
