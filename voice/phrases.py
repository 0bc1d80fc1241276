"""The phrase chunker: streamed reply text in, speakable phrases out, the first one early.

Owns where the reply is cut for the TTS. A sans-I/O core: ``feed(piece)`` takes text pieces of
any size (LLM tokens, characters, the whole reply), ``drain()`` returns the phrases released so
far, ``flush()`` ends the reply and releases the rest. A cut depends only on the text, never on
how it was split into pieces: a decision that needs a character not yet fed waits for it.

- The first phrase ends at the first clause mark (``, ; :`` or ``.!?`` followed by a space, or
  an em-dash) once it has ``min_first_words`` words, or is forced at a word boundary after
  ``max_first_words`` words: the TTS cost grows with the text, so a short first phrase is the
  lever on the time to first audio.
- Later phrases end at sentence ends or at a word boundary after ``max_words`` words, and at
  line breaks.
- A dot followed by a non-space ("7.30", "$2.50", "a.m") is not a boundary, nor is the dot of a
  title ("Mr."), of "e.g."/"i.e."/"vs.", of an initial ("J."), or of a list marker at the start
  of a phrase ("1."). "a.m."/"p.m."/"etc." end a sentence only before a capital letter.
- Markdown symbols a TTS would read aloud (``*``, ``#``, backticks) are dropped, whitespace is
  collapsed, and phrases with nothing to say (no letter or digit) are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

_UNSPOKEN = str.maketrans("", "", "*#`")
_CLAUSE_MARKS = ",;:"
_SENTENCE_MARKS = ".!?…"
_EM_DASH = "—"
_CLOSERS = "\"')]}”’»"
_OPENERS = "\"'([{“‘«"
#: A dot after these never ends a sentence (keys: the word before its last dot, lower case).
_NEVER_END = frozenset({"mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "vs", "e.g", "i.e", "cf", "approx"})
#: A dot after these ends a sentence only if the next word starts with a capital letter.
_END_BEFORE_CAPITAL = frozenset({"a.m", "p.m", "etc", "inc", "ltd", "co"})


class Reason(Enum):
    CLAUSE = "clause"  # first phrase, at a clause mark
    SENTENCE = "sentence"  # at a sentence end or a line break
    LENGTH = "length"  # forced at a word boundary (max_first_words / max_words)
    FLUSH = "flush"  # the rest, at the end of the reply


@dataclass(frozen=True, slots=True)
class Phrase:
    text: str
    index: int  # 0 for the reply's first phrase
    reason: Reason


@dataclass(frozen=True, slots=True)
class PhraseConfig:
    """Defaults: ``min_first_words=1`` so an opener like "Sure," or "Yes," is spoken at once
    (the cheapest TTS call there is); ``max_first_words=2`` bounds the first phrase's LLM and TTS
    cost when no clause mark comes: 3 tokens, and piper's first audio in ~42 ms ("The owner", 630 ms
    of audio) where 3 words took ~57 ms and 4 ~79 ms (2026-12-04, AMD EPYC VM: piper costs ~15 ms
    plus ~50 ms per second of audio); the rest of the sentence is synthesized while the first
    phrase plays.  ``max_words=25`` keeps one TTS call under ~200 ms while
    leaving whole sentences intact in practice."""

    min_first_words: int = 1
    max_first_words: int = 2
    max_words: int = 25

    def __post_init__(self) -> None:
        if not 1 <= self.min_first_words <= self.max_first_words:
            raise ValueError(f"need 1 <= min_first_words <= max_first_words, got {self.min_first_words}, {self.max_first_words}")
        if self.max_words < 1:
            raise ValueError(f"max_words must be >= 1, got {self.max_words}")


class PhraseChunker:
    def __init__(self, config: PhraseConfig | None = None) -> None:
        self.config = config or PhraseConfig()
        self._buf = ""  # text fed and not yet released (markdown symbols already dropped)
        self._index = 0  # index of the next phrase
        self._out: list[Phrase] = []

    def feed(self, text_piece: str) -> None:
        self._buf += text_piece.translate(_UNSPOKEN)
        self._release(final=False)

    def at_start(self) -> bool:
        """Nothing released yet: the first phrase's limits may still change (``config``)."""
        return self._index == 0 and not self._out

    def drain(self) -> list[Phrase]:
        out, self._out = self._out, []
        return out

    def flush(self) -> list[Phrase]:
        """End of the reply: release everything, return all undrained phrases, start afresh."""
        self._release(final=True)
        self._emit(self._buf, Reason.FLUSH)
        out = self.drain()
        self._buf, self._index = "", 0
        return out

    def _release(self, final: bool) -> None:
        while (cut := self._next_cut(final)) is not None:
            end, reason = cut
            self._emit(self._buf[:end], reason)
            self._buf = self._buf[end:]

    def _emit(self, raw: str, reason: Reason) -> None:
        text = " ".join(raw.split())
        if any(ch.isalnum() for ch in text):
            self._out.append(Phrase(text=text, index=self._index, reason=reason))
            self._index += 1

    def _next_cut(self, final: bool) -> tuple[int, Reason] | None:
        """The earliest cut in the buffer as ``(end, reason)``; None if there is none yet or
        deciding it needs text not fed yet (unless ``final``: the end of the text is known)."""
        buf, n = self._buf, len(self._buf)
        first = self._index == 0
        limit = self.config.max_first_words if first else self.config.max_words
        words, word_start, i = 0, -1, 0  # words completed; start of the current word (-1: none)
        while i < n:
            ch = buf[i]
            if ch.isspace():
                if word_start >= 0:
                    words, word_start = words + 1, -1
                if ch == "\n" and words:
                    return i, Reason.SENTENCE
                if words >= limit:
                    return i, Reason.LENGTH
                i += 1
                continue
            if word_start < 0:
                word_start = i
            if ch in _SENTENCE_MARKS or (first and ch in _CLAUSE_MARKS):
                j = i + 1
                while j < n and (buf[j] in _SENTENCE_MARKS or buf[j] in _CLOSERS):
                    j += 1
                if j == n:  # the next character decides
                    return (n, Reason.SENTENCE) if final and ch in _SENTENCE_MARKS else None
                if buf[j].isspace():
                    if ch in _CLAUSE_MARKS:
                        if words + 1 >= self.config.min_first_words:
                            return j, Reason.CLAUSE
                    else:
                        ends = self._ends_sentence(buf, word_start, i, j, final)
                        if ends is None:
                            return None
                        if ends:
                            return j, Reason.SENTENCE
                i = j
                continue
            if ch == _EM_DASH and first and words + 1 >= self.config.min_first_words:
                return i + 1, Reason.CLAUSE
            i += 1
        return None

    @staticmethod
    def _ends_sentence(buf: str, word_start: int, mark: int, space: int, final: bool) -> bool | None:
        """Whether the marks at ``mark`` (followed by whitespace at ``space``) end a sentence."""
        if buf[mark] != ".":
            return True
        key = buf[word_start:mark].lstrip(_OPENERS).lower()
        if key in _NEVER_END or (len(key) == 1 and key.isalpha()):
            return False
        if key.isdigit() and not buf[:word_start].strip():  # "1. " opening a phrase: a list marker
            return False
        if key in _END_BEFORE_CAPITAL:
            rest = buf[space:].lstrip()
            if not rest:
                return True if final else None
            return rest[0].isupper()
        return True
