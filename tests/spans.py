"""A span processor for the tracing tests: which spans are open (started, not yet ended) at any moment."""

from __future__ import annotations

from opentelemetry.sdk.trace import SpanProcessor


class OpenSpans(SpanProcessor):
    """Every span started and not yet ended, by span id (its name as the value); `started` counts them all."""

    def __init__(self):
        self.open = {}
        self.started = 0

    def on_start(self, span, parent_context=None):
        self.started += 1
        self.open[span.context.span_id] = span.name

    def on_end(self, span):
        self.open.pop(span.context.span_id, None)
