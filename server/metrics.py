"""Prometheus metrics of one server (its own registry, so that several servers can live in one process)."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from voice.latency import STAGES, TEXT_STAGES

_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.stage = Histogram("wafervox_turn_stage_seconds", "Per-turn latency of each stage (DESIGN.md definitions)",
                               ["stage"], buckets=_BUCKETS, registry=r)
        self.client = Histogram("wafervox_client_voice_to_voice_seconds", "Voice-to-voice on the client's clock "
                                "(from output_audio.played)", buckets=_BUCKETS, registry=r)
        self.turns = Counter("wafervox_turns", "Answered user turns (spoken or text-only)", registry=r)
        self.within = Counter("wafervox_turns_within_budget", "Turns whose voice-to-voice met the budget", registry=r)
        self.hit_rate = Gauge("wafervox_budget_hit_rate", "Share of turns within budget since the server started", registry=r)
        self.active = Gauge("wafervox_sessions_active", "Open sessions", registry=r)
        self.sessions = Counter("wafervox_sessions", "Sessions opened", registry=r)
        self.rejected = Counter("wafervox_sessions_rejected", "Connections refused", ["reason"], registry=r)
        self.errors = Counter("wafervox_errors", "Error events sent to clients, by code", ["code"], registry=r)
        self.dropped = Counter("wafervox_output_dropped_bytes", "Output bytes dropped for clients that did not read", registry=r)
        self.completions = Counter("wafervox_chat_completions", "Chat completions (/v1/chat/completions) decoded, by how they "
                                   "ended: stop, length, error, client_gone", ["finish"], registry=r)
        self.completion_tokens = Counter("wafervox_chat_completion_tokens", "Tokens of chat completions: their prompts' and "
                                         "those generated", ["kind"], registry=r)
        self._n = self._ok = 0
        self._lock = threading.Lock()

    def turn(self, report: dict) -> None:
        """A finished turn's report: each stage it has, and an answered turn (spoken, or a text-only answer held
        against the budget by its voice-to-text) in the counts and the hit rate."""
        lat = report["latency_ms"]
        for stage in STAGES + TEXT_STAGES:
            v = lat.get(stage)
            if v is not None and v >= 0:
                self.stage.labels(stage).observe(v / 1000)
        if lat.get("voice_to_voice_ms") is None and lat.get("voice_to_text_ms") is None:
            return
        self.turns.inc()
        if report["within_budget"]:
            self.within.inc()
        with self._lock:
            self._n += 1
            self._ok += bool(report["within_budget"])
            self.hit_rate.set(self._ok / self._n)

    def client_turn(self, v2v_ms: float) -> None:
        self.client.observe(max(0.0, v2v_ms) / 1000)

    def error(self, code: str) -> None:
        self.errors.labels(code).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
