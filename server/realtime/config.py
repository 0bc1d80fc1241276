"""The negotiated session configuration of a Realtime session, and its validation from ``session.update``.

Owns: ``SessionConfig`` (instructions, voice, output modalities, input/output audio formats: ``audio/pcm`` at a rate,
or G.711 ``audio/pcmu`` / ``audio/pcma`` at 8 kHz) and ``TurnDetection``
(``semantic_vad``, the default: our end-of-turn model, ``voice.turn_end``; or ``server_vad``: silence alone),
their wire form (the ``session`` object of ``session.created`` /
``session.updated``), and ``apply_session_update``: a ``session.update`` message checked field by field and
applied all or nothing.  Also the field readers the codec shares (``read``, ``nonneg``, ``FieldError``).

We accept ``audio/pcm`` rates other than 24000 (``MIN_RATE``..``MAX_RATE``), which the openai types do not
allow; a session at another rate reports it, outside openai's schema.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

DEFAULT_RATE = 24000
MIN_RATE, MAX_RATE = 8000, 48000
PCM = "audio/pcm"
#: the G.711 formats (``voice.g711``): one byte a sample, always 8 kHz, no ``rate`` on the wire
G711_FORMATS = ("audio/pcmu", "audio/pcma")
G711_RATE = 8000
AUDIO_FORMATS = (PCM, *G711_FORMATS)


TURN_DETECTION_TYPES = ("server_vad", "semantic_vad")
EAGERNESS = ("low", "medium", "high", "auto")
#: The fields each type has on the wire (openai's ``ServerVad`` / ``SemanticVad``).
_WIRE_FIELDS = {
    "server_vad": ("threshold", "prefix_padding_ms", "silence_duration_ms", "create_response", "interrupt_response",
                   "idle_timeout_ms"),
    "semantic_vad": ("eagerness", "create_response", "interrupt_response"),
}


@dataclass(frozen=True, slots=True)
class TurnDetection:
    """``audio.input.turn_detection``.  ``server_vad``: the turn ends after ``silence_duration_ms`` of silence;
    the defaults are our endpointer's (``voice.vad``), not OpenAI's 300 / 500 ms: every ms of silence is spent
    from the budget.  ``semantic_vad`` (a session's default): at each pause our end-of-turn model scores what was
    said and picks the silence, by ``eagerness`` (``voice.turn_end.EAGERNESS``)."""

    type: str = "server_vad"
    threshold: float = 0.5
    prefix_padding_ms: int = 200
    silence_duration_ms: int = 400
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None
    eagerness: str = "auto"

    def to_dict(self) -> dict:
        return {"type": self.type, **{k: getattr(self, k) for k in _WIRE_FIELDS[self.type]}}


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """The effective session configuration; ``turn_detection=None`` means manual commits."""

    model: str = "wafervox"
    instructions: str = ""
    voice: str = "default"
    input_rate: int = DEFAULT_RATE
    output_rate: int = DEFAULT_RATE
    #: ``audio/pcm`` (PCM16 at the rate), ``audio/pcmu`` or ``audio/pcma`` (G.711 at 8 kHz)
    input_format: str = PCM
    output_format_type: str = PCM
    turn_detection: TurnDetection | None = field(default_factory=lambda: TurnDetection(type="semantic_vad"))
    output_modalities: tuple[str, ...] = ("audio",)
    #: function tools as the client declared them (``{"type": "function", "name", "description", "parameters"}``);
    #: echoed back; the local model cannot call them (the session says so with an error event)
    tools: tuple[dict, ...] = ()
    #: "auto", "none", "required", or ``{"type": "function", "name": ...}``
    tool_choice: str | dict = "auto"

    def to_dict(self) -> dict:
        """The ``session`` object of ``session.created`` / ``session.updated`` (RealtimeSessionCreateRequest)."""
        td = None if self.turn_detection is None else self.turn_detection.to_dict()
        return {
            "type": "realtime",
            "model": self.model,
            "instructions": self.instructions,
            "output_modalities": list(self.output_modalities),
            "audio": {
                "input": {"format": wire_format(self.input_format, self.input_rate), "turn_detection": td},
                "output": self.output_format(),
            },
            **({"tools": [dict(t) for t in self.tools]} if self.tools else {}),
            "tool_choice": dict(self.tool_choice) if isinstance(self.tool_choice, dict) else self.tool_choice,
        }

    def output_format(self) -> dict:
        """``audio.output``: of the session object, and of every response."""
        return {"format": wire_format(self.output_format_type, self.output_rate), "voice": self.voice}


def wire_format(kind: str, rate: int) -> dict:
    """A format object as openai's ``RealtimeAudioFormats`` has it: PCM with its rate, G.711 with its type alone."""
    return {"type": kind, "rate": rate} if kind == PCM else {"type": kind}


# --------------------------------------------------------------------------- field readers


class FieldError(Exception):
    """A client field we cannot accept: the codec turns it into one ``ProtocolError`` (code, message, param)."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


_MISSING = object()


def read(obj: dict, key: str, kinds: type | tuple[type, ...], where: str, required: bool = False, nullable: bool = True):
    """``obj[key]`` checked against ``kinds`` (bool is never an int here); ``None`` when absent and optional."""
    v = obj.get(key, _MISSING)
    path = f"{where}.{key}" if where else key
    if v is _MISSING or (v is None and nullable and not required):
        if required:
            raise FieldError("missing_required_parameter", f"missing required field '{path}'", path)
        return None
    names = kinds.__name__ if isinstance(kinds, type) else " or ".join(k.__name__ for k in kinds)
    if (isinstance(v, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,))) or not isinstance(v, kinds):
        raise FieldError("invalid_type", f"field '{path}' must be {names}, got {type(v).__name__}", path)
    return v


def nonneg(v: int | None, path: str) -> int | None:
    if v is not None and v < 0:
        raise FieldError("invalid_value", f"field '{path}' must be >= 0, got {v}", path)
    return v


# --------------------------------------------------------------------------- session.update


def _format(fmt: Any, path: str, kind: str, rate: int) -> tuple[str, int]:
    """``(type, rate)`` of a format object, from the current ``kind`` and ``rate`` for what it leaves out."""
    if fmt is None:
        return kind, rate
    if not isinstance(fmt, dict):
        raise FieldError("invalid_type", f"field '{path}' must be an object", path)
    new = read(fmt, "type", str, path)
    if new not in (None, *AUDIO_FORMATS):
        raise FieldError("unsupported_format", f"audio format '{new}' at '{path}' is not supported (only "
                         f"{', '.join(map(repr, AUDIO_FORMATS))})", path + ".type")
    if new is not None and new != kind:  # another format starts from its own rate
        kind, rate = new, (DEFAULT_RATE if new == PCM else G711_RATE)
    asked = read(fmt, "rate", int, path)
    if kind in G711_FORMATS:
        if asked not in (None, G711_RATE):
            raise FieldError("invalid_value", f"field '{path}.rate' must be {G711_RATE} for '{kind}' (G.711), got {asked}",
                             path + ".rate")
        return kind, G711_RATE
    if asked is None:
        return kind, rate
    if not MIN_RATE <= asked <= MAX_RATE:
        raise FieldError("invalid_value", f"field '{path}.rate' must be in {MIN_RATE}..{MAX_RATE} Hz, got {asked}", path + ".rate")
    return kind, asked


def _turn_detection(td: Any, current: TurnDetection | None) -> TurnDetection:
    path = "session.audio.input.turn_detection"
    if not isinstance(td, dict):
        raise FieldError("invalid_type", f"field '{path}' must be an object or null", path)
    kind = read(td, "type", str, path)
    if kind not in (None, *TURN_DETECTION_TYPES):
        raise FieldError("unsupported_turn_detection",
                         f"turn_detection type '{kind}' is not supported (only {' or '.join(map(repr, TURN_DETECTION_TYPES))})",
                         path + ".type")
    base = current or TurnDetection(type=kind or "server_vad")
    if kind is not None and kind != base.type:  # another type starts from its own defaults
        base = TurnDetection(type=kind)
    ch: dict[str, Any] = {}
    eagerness = read(td, "eagerness", str, path)
    if eagerness is not None:
        if eagerness not in EAGERNESS:
            raise FieldError("invalid_value", f"field '{path}.eagerness' must be one of {', '.join(EAGERNESS)}, got {eagerness!r}",
                             path + ".eagerness")
        ch["eagerness"] = eagerness
    thr = read(td, "threshold", (int, float), path)
    if thr is not None:
        if not 0.0 <= thr <= 1.0:
            raise FieldError("invalid_value", f"field '{path}.threshold' must be in 0..1, got {thr}", path + ".threshold")
        ch["threshold"] = float(thr)
    for k in ("prefix_padding_ms", "silence_duration_ms"):
        v = nonneg(read(td, k, int, path), f"{path}.{k}")
        if v is not None:
            ch[k] = v
    for k in ("create_response", "interrupt_response"):
        v = read(td, k, bool, path)
        if v is not None:
            ch[k] = v
    if "idle_timeout_ms" in td:
        ch["idle_timeout_ms"] = nonneg(read(td, "idle_timeout_ms", int, path), f"{path}.idle_timeout_ms")
    return replace(base, **ch)


def _voice(v: Any, path: str) -> str:
    if isinstance(v, dict):
        v = read(v, "id", str, path, required=True)
    if not isinstance(v, str):
        raise FieldError("invalid_type", f"field '{path}' must be a string or {{\"id\": string}}", path)
    return v


def apply_session_update(msg: dict, cfg: SessionConfig) -> tuple[SessionConfig, frozenset[str]]:
    """``cfg`` with a ``session.update`` message applied, and the ``SessionConfig`` field names it touched.
    Raises ``FieldError`` for the first field it cannot accept; ``cfg`` itself is never changed."""
    s = read(msg, "session", dict, "", required=True)
    kind = read(s, "type", str, "session")
    if kind not in (None, "realtime"):
        raise FieldError("unsupported_session_type", f"session type '{kind}' is not supported (only 'realtime')", "session.type")
    ch: dict[str, Any] = {}
    if (ins := read(s, "instructions", str, "session")) is not None:
        ch["instructions"] = ins
    if (mods := read(s, "output_modalities", list, "session")) is not None:
        if not mods or any(m not in ("text", "audio") for m in mods):
            raise FieldError("invalid_value", "field 'session.output_modalities' must be a non-empty list of 'text'/'audio'",
                             "session.output_modalities")
        ch["output_modalities"] = tuple(dict.fromkeys(mods))
    audio = read(s, "audio", dict, "session") or {}
    inp = read(audio, "input", dict, "session.audio") or {}
    out = read(audio, "output", dict, "session.audio") or {}
    if "format" in inp:
        ch["input_format"], ch["input_rate"] = _format(inp["format"], "session.audio.input.format", cfg.input_format, cfg.input_rate)
    if "turn_detection" in inp:
        td = inp["turn_detection"]
        ch["turn_detection"] = None if td is None else _turn_detection(td, cfg.turn_detection)
    if "format" in out:
        ch["output_format_type"], ch["output_rate"] = _format(out["format"], "session.audio.output.format", cfg.output_format_type,
                                                              cfg.output_rate)
    if out.get("voice") is not None:
        ch["voice"] = _voice(out["voice"], "session.audio.output.voice")
    if (tools := read(s, "tools", list, "session")) is not None:
        ch["tools"] = tuple(_tool(t, f"session.tools[{i}]") for i, t in enumerate(tools))
    if "tool_choice" in s:
        ch["tool_choice"] = tool_choice(s["tool_choice"], "session.tool_choice")
    return replace(cfg, **ch), frozenset(ch)


def tool_choice(v: Any, path: str) -> str | dict:
    """A Realtime ``tool_choice``: "auto", "none", "required", or a function by name."""
    if v in ("auto", "none", "required"):
        return v
    if isinstance(v, dict) and v.get("type") == "function" and isinstance(v.get("name"), str) and v["name"]:
        return {"type": "function", "name": v["name"]}
    raise FieldError("invalid_value", f"field '{path}' must be 'auto', 'none', 'required' or {{\"type\": \"function\", "
                     "\"name\": ...}", path)


def _tool(t: Any, path: str) -> dict:
    """A function tool, with the fields the Realtime schema has for one (others dropped)."""
    if not isinstance(t, dict):
        raise FieldError("invalid_type", f"field '{path}' must be an object", path)
    kind = read(t, "type", str, path)
    if kind not in (None, "function"):
        raise FieldError("unsupported_value", f"tool type '{kind}' at '{path}' is not supported (only 'function')", path + ".type")
    name = read(t, "name", str, path, required=True)
    out: dict[str, Any] = {"type": "function", "name": name}
    if (desc := read(t, "description", str, path)) is not None:
        out["description"] = desc
    if (params := read(t, "parameters", dict, path)) is not None:
        out["parameters"] = params
    return out
