"""The reply guard: a number, time, price, name or password that the operator's text and the conversation do not
contain is never handed out to be spoken.

A small model asked about a check-in time it was not given says one ("10:30 PM"); the guard stands between the model's
pieces and the phrase chunker (``voice.phrases``), so that whatever the chunker cuts into phrases was checked first:

- ``ReplyGuard.feed(piece)`` returns the text that may go on now: everything up to the last whitespace, each word
  checked once it is whole (a word is only whole when the next whitespace comes, which the chunker waits for too, so
  holding the unfinished word costs no time);
- a word that states an unsupported claim (``unsupported``) stops the reply there: the guard hands out ``fallback``
  instead (what the agent does know, or that it does not know) and nothing more of the model's text;
- a reply that starts saying again what it said (four words in a row it already said), says six words in a row again,
  or says one, two or three words three times in a row ("Sorry, I'm sorry, I'm sorry, I'm") stops there too: the words
  that began the repeat are held back while they match and dropped (the repetition stop of a small model's loops).

What counts as a claim: digits ("3", "10:30", "$18.50", "seagull42"), number words ("forty-five"), a word of letters and
digits as a whole ("seagull42": not only its 42), a word written with a capital letter that does not open a sentence (a
name: "Daniel Okafor", "SHEBELLA", "Tuesday"), and the word said as a password, code or PIN.  A claim is supported
when ``Knowledge`` (built from the persona's text and the conversation) has it: the same number, the same time or
decimal, the same word.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_UNITS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
                                     "fifteen sixteen seventeen eighteen nineteen".split())}
_TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90}
_SCALES = {"hundred": 100, "thousand": 1000}
_NUMBER_WORDS = {**_UNITS, **_TENS, **_SCALES}
#: Number words that say no quantity in speech ("one of our rooms", "no one").
_NOT_A_COUNT = frozenset({"zero", "one"})
#: Capitalized words that name nothing.
_PLAIN = frozenset("i i'm i'll i've i'd am pm a.m p.m ok okay mr mrs ms dr".split())
_NUMERIC = re.compile(r"\d+(?:[:.]\d+)?")
_WORD = re.compile(r"[A-Za-z0-9$](?:[A-Za-z0-9'’.-]|:(?=\d))*")
_SECRET_CUE = re.compile(r"\b(?:password|passcode|code|pin|wi-?fi key)\s*(?:is|:)?\s*$", re.I)
_SENTENCE_END = re.compile(r"[.!?:;][\"')\]]*$")
#: A word of letters and digits, three letters in a row among them: a code, a password, a product ("seagull42",
#: "LANTERN25"), which is stated only as the operator wrote it (its digits alone may be known: "88" of "papercut88").
_CODE = re.compile(r"(?=[a-z0-9]*[a-z]{3})(?=[a-z]*\d)[a-z0-9]+")
#: ... but not a number with its unit or ordinal ("10am", "5th", "30mins", "12kg").
_UNIT = re.compile(r"\d+(?:st|nd|rd|th|am|pm|hrs?|mins?|secs?|kgs?|kms?|lbs?|mph|kph|kmh|gb|mb|kb|ml|cm|mm|days?|"
                   r"weeks?|months?|years?|yrs?)")
REPEAT_WORDS = 4
LOOP_WORDS = 6
#: the longest run of words that may not come three times in a row (a loop too short for ``LOOP_WORDS``)
STUTTER_WORDS = 3


def _numeric_claims(token: str) -> list[str]:
    """"10:30" -> ["10:30"], "3:00" -> ["3"], "18.50" -> ["18.50"], "seagull42" -> ["42"], "2009" -> ["2009"]."""
    out = []
    for m in _NUMERIC.finditer(token):
        t = m.group()
        if (":" in t or "." in t) and re.fullmatch(r"\d+[:.]0+", t):
            t = re.split(r"[:.]", t)[0]
        out.append(str(int(t)) if t.isdigit() else t)
    return out


def number_words(text: str) -> list[tuple[int, int, int]]:
    """The numbers ``text`` says in words, as (start word index, end word index, value): "forty-five" is 45, "one
    hundred forty" 140, "seven thirty" 7 and 30; a comma or a full stop ends a number; indices count ``_WORD``
    matches."""
    matches = list(_WORD.finditer(text))
    words = [m.group().lower().strip(".'’") for m in matches]
    joined = [i > 0 and not text[matches[i - 1].end():m.start()].strip(" -") and not matches[i - 1].group().endswith(".")
              for i, m in enumerate(matches)]  # only spaces (or a hyphen) between this word and the one before

    def is_number(i: int) -> bool:
        return all(p in _NUMBER_WORDS for p in words[i].split("-"))

    out, i = [], 0
    while i < len(words):
        scaled = i + 1 < len(words) and joined[i + 1] and words[i + 1] in _SCALES
        if not is_number(i) or (words[i] in _NOT_A_COUNT and not scaled):
            i += 1
            continue
        j, current = i, None
        while j < len(words) and is_number(j) and (j == i or joined[j]):
            parts, stop = words[j].split("-"), False
            for p in parts:
                v = _NUMBER_WORDS[p]
                if p in _SCALES:
                    current = (current or 1) * v
                elif current is None:
                    current = v
                elif v < 10 and current % 10 == 0 and current % 100 >= 20 or current % 100 == 0 and v < 100 and current >= 100:
                    current += v
                else:
                    stop = True  # "seven thirty": the next number starts here
                    break
            if stop:
                break
            j += 1
        out.append((i, j, current))
        i = max(j, i + 1)
    return out


@dataclass
class Knowledge:
    """What the operator's text and the conversation say: numbers, times and decimals, and words (lower case)."""

    numbers: set[str] = field(default_factory=set)
    words: set[str] = field(default_factory=set)

    def add(self, text: str) -> Knowledge:
        for token in _WORD.findall(text):
            self.numbers.update(_numeric_claims(token))
            w = token.lower().strip(".'’")
            self.words.add(w)
            self.words.update(p for p in re.split(r"[-'’.]", w) if p)
        for *_, value in number_words(text):
            self.numbers.add(str(value))
        for t in list(self.numbers):  # "7:30" also says 7 (and 30: "seven thirty")
            if ":" in t:
                self.numbers.update(str(int(p)) for p in t.split(":"))
        return self

    def has_number(self, claim: str) -> bool:
        return claim in self.numbers

    def has_word(self, word: str) -> bool:
        w = word.lower().strip(".'’")
        return w in self.words or w.split("'")[0].split("’")[0] in self.words


def knowledge(*texts: str) -> Knowledge:
    k = Knowledge()
    for t in texts:
        if t:
            k.add(t)
    return k


def unsupported(text: str, known: Knowledge) -> list[str]:
    """The claims of ``text`` that ``known`` does not support, in order."""
    return [claim for _, claim in _claims(text, known)]


def _claims(text: str, known: Knowledge) -> list[tuple[int, str]]:
    """(index of the word, claim) for every unsupported claim of ``text``, in order."""
    out = []
    for i, (m, first) in enumerate(_words(text)):
        token = m.group()
        for claim in _numeric_claims(token):
            if not known.has_number(claim):
                out.append((i, claim))
        word = token.strip(".'’-")
        if _CODE.fullmatch(word.lower()) and not _UNIT.fullmatch(word.lower()) and not known.has_word(word):
            out.append((i, word))  # a code or password said whole ("paperclip88" for "papercut88": its 88 is known)
        elif (word[:1].isupper() and not first and word.lower() not in _PLAIN and not any(c.isdigit() for c in word)
                and not known.has_word(word)):
            out.append((i, word))
        elif _SECRET_CUE.search(text[:m.start()]) and not known.has_word(word) and not any(c.isdigit() for c in word):
            out.append((i, word))
    out += [(start, str(value)) for start, _, value in number_words(text) if not known.has_number(str(value))]
    return sorted(out)


def _words(text: str) -> list[tuple[re.Match, bool]]:
    """``text``'s words, each with whether it opens a sentence."""
    out = []
    for m in _WORD.finditer(text):
        before = text[:m.start()].rstrip()
        out.append((m, not before or bool(_SENTENCE_END.search(before))))
    return out


def _norm(word: str) -> str:
    return re.sub(r"[^a-z0-9]", "", word.lower())


class ReplyGuard:
    """Between the model's text pieces and the phrase chunker: see the module's docstring."""

    def __init__(self, known: Knowledge, fallback: str) -> None:
        self.known = known
        self.fallback = fallback
        self.text = ""  # what was handed out
        self._pending = ""  # fed, not yet whole (after the last whitespace) or held as a possible repeat
        self.stopped: str | None = None  # None, "claim: <what>" or "repeat"

    def feed(self, piece: str) -> str:
        """Text that may be handed out now ("" when none, always "" once stopped, the fallback once on a claim)."""
        if self.stopped:
            return ""
        self._pending += piece
        cut = max(self._pending.rfind(" "), self._pending.rfind("\n"))
        if cut < 0:
            return ""
        return self._release(cut + 1, final=False)

    def finish(self, cut: bool = False) -> str:
        """The end of the model's text: the rest, checked (or nothing, once stopped).  ``cut``: the model was stopped
        at its token limit, so its last word may be half a word ("... From this month, S"): that word is dropped."""
        if self.stopped:
            return ""
        if cut:
            self._pending = self._pending[:max(self._pending.rfind(" "), self._pending.rfind("\n")) + 1]
        return self._release(len(self._pending), final=True)

    def _release(self, end: int, final: bool) -> str:
        ready, rest = self._pending[:end], self._pending[end:]
        claims = _claims(self.text + ready, self.known)
        said_words = len(_WORD.findall(self.text))
        new = [(i, c) for i, c in claims if i >= said_words]
        if new:
            i = new[0][0] - said_words  # the first bad word of ``ready``: hand out what comes before it, then the fallback
            words = list(_WORD.finditer(ready))
            head = ready[:words[i].start()]
            self.stopped = f"claim: {new[0][1]}"
            self._pending = ""
            return self._out(head + self._fallback_after(self.text + head))
        # the repetition stop: a sentence that starts the way an earlier one did is held while it does; four words of
        # it, or six words in a row said before anywhere, end the reply there
        marked = [(_norm(m.group()), first) for m, first in _words(self.text + ready)]
        held, stop = _repeating_tail(marked)
        if stop:
            self.stopped = "repeat"
            words = list(_WORD.finditer(ready))
            keep = len(marked) - held - said_words
            head = ready[:words[keep].start()] if 0 <= keep < len(words) else ("" if keep < 0 else ready)
            self._pending = ""
            return self._out(_end_sentence(head) if (self.text + head).strip() else head)
        if held and not final:
            words = list(_WORD.finditer(ready))
            keep = max(0, len(words) - held)
            split = words[keep].start() if keep < len(words) else len(ready)
            self._pending = ready[split:] + rest
            return self._out(ready[:split])
        self._pending = rest
        return self._out(ready)

    def _out(self, text: str) -> str:
        self.text += text
        return text

    def _fallback_after(self, said: str) -> str:
        """The fallback, after whatever part of a sentence was already said."""
        if not said.strip():
            return self.fallback
        if _SENTENCE_END.search(said.rstrip()):
            return ("" if said.endswith((" ", "\n")) else " ") + self.fallback
        return ("" if said.endswith(" ") else " ") + "— " + self.fallback[:1].lower() + self.fallback[1:]


def _repeating_tail(words: list[tuple[str, bool]]) -> tuple[int, bool]:
    """(how many of the last words to hold, whether to stop): the last ``k`` words open a sentence the way an earlier
    sentence opened (held while ``k`` < ``REPEAT_WORDS``, a stop at it), or the last ``LOOP_WORDS`` were said before
    in that order (a stop)."""
    text = [w for w, _ in words]
    n = len(text)
    if n >= 2 * LOOP_WORDS and any(text[j:j + LOOP_WORDS] == text[n - LOOP_WORDS:] for j in range(n - 2 * LOOP_WORDS + 1)):
        return LOOP_WORDS, True
    for p in range(1, STUTTER_WORDS + 1):  # "Sorry, I'm sorry, I'm sorry, I'm ...": a short run three times in a row
        unit = text[n - p:]
        if (n >= 3 * p and text[n - 2 * p:n - p] == unit and text[n - 3 * p:n - 2 * p] == unit
                and not any(w.isdigit() or w in _NUMBER_WORDS for w in unit)):  # (not digits read out: "nine nine nine")
            return 2 * p, True
    starts = [i for i, (_, first) in enumerate(words) if first]
    if not starts or starts[-1] == 0:
        return 0, False
    s = starts[-1]  # the sentence in progress started here
    k = n - s
    if not 1 <= k <= REPEAT_WORDS:
        return 0, False
    if any(text[j:j + k] == text[s:] for j in starts[:-1] if j + k <= s):
        return k, k >= REPEAT_WORDS
    return 0, False


def _end_sentence(text: str) -> str:
    t = text.rstrip()
    if not t:
        return text
    return t if _SENTENCE_END.search(t) else t.rstrip(",;:—-") + "."
