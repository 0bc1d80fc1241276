"""Where the agent's output stands in time, and which words of an answer were heard.

Any monotonic unit works: the voice loop counts seconds on its clock, the server counts output samples since its session
began.  A ``Playout`` holds the play cursor (when the output is free again) and, for the answer in progress, its phrases
and the spans their audio occupies:

- ``begin_phrase(text)`` makes ``text`` the phrase the next audio belongs to;
- ``play(now, length)`` queues a piece of it after what is already queued (never before ``now``) and records its span;
- ``schedule(now, length)`` queues audio that belongs to no phrase (an acknowledgement sound);
- ``stop(at)`` forgets what was queued after ``at`` (a barge-in); ``cut(at)`` takes it back (a pause) and ``replay``
  queues a phrase's rest again (the resume);
- ``heard(upto)`` is the words played before ``upto``: whole phrases, and of a phrase cut in the middle the share of its
  words that matches the share of its audio played.  A phrase with no audio was not heard.
- ``next_answer()`` forgets the phrases; the cursor stays.
"""

from __future__ import annotations


class Playout:
    def __init__(self, start: float = 0.0):
        self.cursor = start  # when the output is free again
        self.texts: list[str] = []  # the answer's phrases, in order
        self.spans: list[tuple[int, float, float]] = []  # (phrase index, start, end) of each piece played
        self.taken: dict[int, float] = {}  # phrase index -> length of its audio taken back by ``cut``, not queued again

    def begin_phrase(self, text: str) -> int:
        """``text`` is the phrase the next audio belongs to; returns its index in the answer."""
        self.texts.append(text)
        return len(self.texts) - 1

    def schedule(self, now: float, length: float) -> float:
        """Queue ``length`` of audio that is no phrase; returns where it starts."""
        start = max(now, self.cursor)
        self.cursor = start + length
        return start

    def play(self, now: float, length: float) -> float:
        """Queue ``length`` of the current phrase's audio; returns where it starts."""
        if not self.texts:
            raise ValueError("play() before begin_phrase(): audio of no phrase goes through schedule()")
        start = self.schedule(now, length)
        self.spans.append((len(self.texts) - 1, start, self.cursor))
        return start

    def stop(self, at: float) -> None:
        """Nothing plays after ``at`` any more."""
        self.cursor = min(self.cursor, at)

    def cut(self, at: float) -> None:
        """What was queued after ``at`` is taken back (a pause): the cursor and the spans end there; each phrase's audio
        taken back still counts in its length (``heard``) until it is queued again (``replay``)."""
        self.stop(at)
        for i, a, b in self.spans:
            if b > at:
                self.taken[i] = self.taken.get(i, 0.0) + b - max(a, at)
        self.spans = [(i, a, min(b, at)) for i, a, b in self.spans if a < at]

    def replay(self, phrase: int, now: float, length: float) -> float:
        """Queue ``length`` of phrase ``phrase``'s audio again (the rest of it after a pause); returns where it starts."""
        start = self.schedule(now, length)
        self.spans.append((phrase, start, self.cursor))
        if phrase in self.taken:
            self.taken[phrase] = max(0.0, self.taken[phrase] - length)
        return start

    def heard(self, upto: float) -> str:
        """The words of the answer played before ``upto``."""
        heard = []
        for index, text in enumerate(self.texts):
            spans = [(a, b) for i, a, b in self.spans if i == index]
            if not spans:
                continue
            total = sum(b - a for a, b in spans) + self.taken.get(index, 0.0)
            played = sum(max(0.0, min(b, upto) - a) for a, b in spans)
            heard.append(_prefix_words(text, played / total if total > 0 else 0.0))
        return " ".join(h for h in heard if h)

    def next_answer(self) -> None:
        self.texts.clear()
        self.spans.clear()
        self.taken.clear()


def _prefix_words(text: str, fraction: float) -> str:
    if fraction >= 0.999:
        return text
    words = text.split()
    return " ".join(words[: int(len(words) * max(0.0, fraction))])
