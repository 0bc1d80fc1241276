"""What an operator wrote, split into what the assistant is, how it should talk, and the facts it may state.

A Realtime client's ``instructions`` are usually a paragraph ("You are Ava, the front desk agent for the Harborview
Inn. Check-in begins at 3 PM and check-out is by 11 AM. ... Keep answers short."), sometimes ``key: value`` lines,
sometimes Markdown sections ("# Role & Objective", "## Hours" and its list, "# Personality & Tone"): headings name a
section and are no text, each list item is a sentence of its own, a role section's lines are the intro and a tone or
rules section's lines are rules.
``split_instructions`` cuts either into:

- ``intro``: the sentences that say who the assistant is ("You are ...", "This is the voice assistant for ...");
  they are facts too (the intro often names the owner or the place), said in the first person;
- ``rules``: sentences that tell the assistant how to talk ("Keep answers short.", "Don't give medical advice."),
  which are no facts;
- ``facts``: every other sentence, cut further into clauses where a sentence states two things each with its own
  subject ("Check-in begins at 3 PM and check-out is by 11 AM." -> two facts), so that the fact shown with a
  question says one thing; ``key: value`` lines stay pairs, and so does each ``key: value`` sentence of a paragraph
  that runs several together ("Address: 1400 Industrial Parkway. Hours: ..."); a ``Role:`` is the intro, a ``Style:``
  a rule.  A FAQ written as pairs ("Q: How much are tickets?" then "A: Adults $28. Children $12.") gives each sentence
  of an answer as a fact keyed by its question: the question is what the fact is about (``subject``) when a caller's
  question is ranked, and the answer alone is said (``voice.llm``).  A table ("Size | Price | Time" over "Small dog |
  $40 | 1 hour", with Markdown's pipes and rules or without) gives a fact per row, keyed by its first cell.  A nested
  block (a YAML-like configuration, bullets under a bullet) or a pasted JSON object is flattened first: each
  ``key: value`` keyed by its parents' labels where they say something of it ("glow_jump:" over "price: $16" ->
  "Glow jump price"; "Prices" or "Business" only group), snake_case keys as words and abbreviated days written out
  ("mon-thu" -> "Monday to Thursday"), a ``# comment`` said in brackets; so is an INI-style block ("[prices]" over
  "key = value" lines), and terse notes written "key - value", two lines or more.

Plain text rules, no word lists about businesses: what a fact *means* is left to ``voice.retrieval``.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass

#: A dot after these ends no sentence ("Dr. Priya Raman", "St. Mary's", "e.g. a mat").
_ABBREVIATIONS = frozenset("dr mr mrs ms mx prof st jr sr vs e.g i.e etc approx no ste apt mt ft".split())
#: A dot after these ends a sentence only before a capital letter ("open 9 a.m. to 5" vs "until 5 p.m. We ...").
_TIME_DOTS = frozenset({"a.m", "p.m"})
#: How a sentence that tells the assistant how to behave starts (an imperative, or a rule about the answers).
_RULE = re.compile(r"^(?:please\s+)?(?:be|keep|answer|talk|speak|respond|reply|use|avoid|don't|do not|never|always|make sure|"
                   r"remember|stay|sound|greet|try|refer|act|only|politely|kindly|feel free|assist|address)\b|"
                   r"^(?:all\s+)?(?:responses|answers|replies)\s+(?:should|must|need|have to)\b|"
                   r"\b(?:your (?:answers|replies|responses|tone)|you (?:should|must|may not|never|always))\b|"
                   # "If a caller asks about anything else, say kindly that ...": what to do when
                   r"^(?:if|when|whenever)\s+(?:a|the|any)?\s*(?:callers?|customers?|users?|clients?|guests?|someone|somebody|"
                   r"anyone|they|people)\b.{0,120}?,\s*(?:please\s+)?(?:\w+ly\s+)?(?:say|tell|ask|offer|refer|suggest|explain|"
                   r"direct|redirect|steer|let them know|apologi[sz]e|decline)\b", re.I)
#: How a sentence that hands the assistant a fact starts ("You should know that we are open ...", "Please note: ...",
#: "Keep in mind that ..."): the rest is the fact ("Remember to smile" stays a rule: no "that" or colon).
_KNOW_THAT = re.compile(r"^(?:you (?:should|need to|ought to) (?:know|be aware)|it's (?:worth|good) (?:knowing|to know)|"
                        r"(?:please\s+)?(?:note|remember|keep in mind|be aware|bear in mind)|fyi|for your information)"
                        r"\s*(?:,\s*)?(?:that\b|:)\s*(?=\S)", re.I)
#: A sentence saying who the assistant is.
_INTRO = re.compile(r"^(?:you are|you're|you answer|you work|you handle|you take|your name is|"
                    r"this is the (?:\w+ ){0,3}(?:assistant|receptionist|agent|helper|line))\b", re.I)
#: A finite verb: a clause after ", and" / ";" that has a subject and one of these states a fact of its own.
_VERB = re.compile(r"\b(?:is|are|was|were|has|have|costs?|runs?|opens?|closes?|starts?|begins?|ends?|takes?|comes?|gets?|"
                   r"offers?|accepts?|serves?|sees?|delivers?|includes?|can|will|must|needs?|lasts?|stays?|"
                   r"[a-z]+ed)\b|'s\b|'re\b", re.I)
#: A clause that starts with one of these has no subject of its own ("... and takes two days"): it stays with its sentence.
_NO_SUBJECT = re.compile(r"^(?:is|are|was|were|has|have|costs?|runs?|opens?|closes?|starts?|begins?|ends?|takes?|comes?|"
                         r"gets?|offers?|accepts?|serves?|sees?|delivers?|includes?|can|will|must|needs?|lasts?|stays?|"
                         r"then|also|so|not|from|to|on|at|in|by|for|with|until|till|or|plus|bring|just|except|unless|when|if|"
                         r"which|who|where|because|since|after|before|as|though|although|including|"
                         r"over|under|older|younger|above|below)\b", re.I)  # "Patients aged 65 and over are charged ..."
#: A clause that opens with a participle in small letters has no subject of its own either: "A dress shirt washed and
#: pressed is $3.50" ("Haunted Library is ..." names a room).
_PARTICIPLE = re.compile(r"^[a-z]{2,}[^e\W]ed\b")
#: A capital letter after these is a unit's or a room's letter ("Unit B."), not an initial: its dot may end a sentence.
_LETTERED = frozenset("unit suite building room gate door floor level hall block lot wing section plan grade type".split())
_KEY_VALUE = re.compile(r"^[-*\u2022]?\s*([A-Za-z][\w '&/-]{0,60}?)\s*:(?!\d)\s*(\S.*?)\.?$")  # (not "at 9:00")
_NAME = re.compile(r"\b(?:of|for|at|from|called|named)\s+(?:the\s+)?((?:[A-Z][\w'&-]*)(?:\s+(?:[A-Z][\w'&-]*|&|(?:and|of)(?=\s+[A-Z])))*)")
_FIRST_PERSON = ((r"\byou are\b", "I am"), (r"\byou're\b", "I'm"), (r"\byour\b", "my"), (r"\byou\b", "I"))


@dataclass(frozen=True, slots=True)
class Instructions:
    """``split_instructions``' result: ``facts`` are (key, value) pairs, key "" for a fact sentence."""

    intro: str
    rules: tuple[str, ...]
    facts: tuple[tuple[str, str], ...]
    name: str


def sentences(text: str) -> list[str]:
    """``text`` cut into sentences: at ``.!?`` and line ends, not at the dot of a title, an initial, a number ("7.30",
    "$2.50") or "a.m." before a small letter."""
    out, start = [], 0
    text = text.strip()
    for m in re.finditer(r"[.!?]+[\"')\]]*(?=\s)|\n", text):
        end = m.end()
        if m.group() != "\n" and m.group()[0] == ".":
            piece = text[start:m.start() + 1]
            word = re.search(r"(?:([A-Za-z]+)\s+)?([A-Za-z.]+)\.*$", piece)
            key = word.group(2).rstrip(".").lower() if word else ""
            before = (word.group(1) or "").lower() if word else ""
            nxt = text[end:].lstrip()[:1]
            after_digit = bool(word) and piece[word.start(2) - 1:word.start(2)].isdigit()  # "1099s.": no initial
            if key in _ABBREVIATIONS or (len(key) == 1 and key.isalpha() and before not in _LETTERED and not after_digit):
                continue
            if key in _TIME_DOTS and not nxt.isupper():
                continue
        if part := text[start:end].strip():
            out.append(part)
        start = end
    if rest := text[start:].strip():
        out.append(rest)
    return out


def _has_subject_and_verb(clause: str) -> bool:
    words = clause.split()
    return (len(words) >= 3 and not _NO_SUBJECT.match(clause) and not _PARTICIPLE.match(clause)
            and bool(_VERB.search(" ".join(words[1:]))))


#: A piece that opens a condition or a time ("so if anything needs sorting out, folks can ask for me"): the clause
#: after its comma completes it.
_CONDITION = re.compile(r"^(?:(?:and|but|so|or)\s+)?(?:if|when|whenever|unless|once|because|since|although|though|"
                        r"as soon as|before|after|until)\b", re.I)


def clauses(sentence: str) -> list[str]:
    """A sentence cut where it states two things, each with a subject and a verb: at ";" and before ", and" / "and" /
    ", but" / a comma when what follows is such a clause ("Check-in begins at 3 PM and check-out is by 11 AM.");
    a list with no verb of its own stays whole ("open weekdays 8 to 9, Saturdays 9 to 6")."""
    body = sentence.strip().rstrip(".!")
    out = []
    for part in re.split(r"\s*;\s*", body):
        pieces = re.split(r",?\s+(?:and|but|while|whereas)\s+|,\s+", part)
        # glue back every piece that is not a clause of its own to the one before it
        glued: list[str] = []
        seps = re.findall(r",?\s+(?:and|but|while|whereas)\s+|,\s+", part)
        for i, piece in enumerate(pieces):
            after_condition = i > 0 and seps[i - 1].startswith(",") and bool(_CONDITION.match(pieces[i - 1]))
            if glued and (after_condition or _RELATIVE.match(piece)
                          or not (_has_subject_and_verb(piece) and _has_subject_and_verb(glued[-1]))):
                glued[-1] += seps[i - 1] + piece
            else:
                glued.append(piece)
        out += glued
    return [_sentence_case(p) for p in out if p.strip()]


#: A piece whose verb is a relative clause's: it says more of the noun before it ("owned by Gloria Hartwell, an
#: enrolled agent who has been doing taxes for 22 years", "Dev, who speaks Spanish"), no clause of its own.
_RELATIVE = re.compile(r"^(?:(?:a|an|the|our|their)\s+(?:[\w'-]+\s+){0,3})?(?:who|whom|whose|which)\b", re.I)


def _sentence_case(text: str) -> str:
    text = text.strip()
    return text[:1].upper() + text[1:] + ("" if text[-1:] in ".!?" else ".")


def first_person(sentence: str) -> str:
    """"You are Ava, the front desk agent ..." -> "I am Ava, the front desk agent ..." (the assistant's own words)."""
    for pattern, repl in _FIRST_PERSON:
        sentence = re.sub(pattern, repl, sentence, flags=re.I)
    return _sentence_case(sentence)


def business_name(text: str) -> str:
    """The business the instructions name: in the sentence saying who the assistant is ("... the front desk agent for
    the Harborview Inn in Portland" -> "Harborview Inn"), else in any sentence; "" if none."""
    found = [s for s in sentences(text) if _INTRO.search(s)] + sentences(text)
    for s in found:
        if m := _NAME.search(s):
            return m.group(1)
    return ""


def split_instructions(text: str) -> Instructions:
    """``text`` as intro, rules and facts (see the module's docstring)."""
    text = _dash_pairs(_flatten_nested(_flatten_json(_flatten_ini(_flatten_xml(_page_chrome(text))))))
    intro, rules, facts = [], [], []
    lines, aims = [], []
    asked = ""  # a FAQ's question waiting for its answer ("Q: ..." then "A: ...")
    header: list[str] | None = None  # a table's column names, while its rows go on
    for section, line in _sections(text):
        if section != "role" and (cells := _table_cells(line)) is not None:
            if not cells:  # (Markdown's "|---|---|" under the header)
                continue
            if header is None and not re.search(r"\d", line):  # the header: a first row without a number
                header = cells
                continue
            facts.append(_table_fact(cells, header))
            header = header or []  # (a table without a header: its rows are still one table)
            continue
        header = None
        if faq := _FAQ.match(line):
            if faq.group(1)[0] in "Qq":
                asked = faq.group(2).strip()
                continue
            if asked:  # each sentence of the answer a fact, keyed by its question (``subject``: what it is about)
                facts += [(asked, c.rstrip(".")) for s in sentences(faq.group(2)) for c in clauses(s)]
                asked = ""
                continue
        if section == "role":  # "Your goal is to help callers ..." under "# Role & Objective": after who it is
            said = sentences(line)
            aims += [_end(x) for x in said if not (_INTRO.search(x) or re.search(r"\d", x))]
            lines += [x for x in said if _INTRO.search(x) or re.search(r"\d", x)]
        elif (section == "style" and not _INTRO.search(line) and not _PATRONS.match(line)
              and (_RULE.search(line) or not re.search(r"\d", line))):
            rules.append(_end(line))  # (who the assistant is, a line with a number in it or about the business's
            # patrons, wherever it stands: a gym's "# Rules" are its members')
        else:
            lines += _inline_pairs(line)
    lines = [part for ln in lines for part in _key_over_paragraph(ln)]
    pairs = [m.groups() for ln in lines if (m := _KEY_VALUE.match(ln)) and not _NOT_A_KEY.match(m.group(1))]
    # the prose in order, a key: value line between two parts of it as None (a question before one leads into nothing:
    # a FAQ's "How often should it be swept?" over "Wood burners: twice a year.")
    prose = [None if (m := _KEY_VALUE.match(ln)) and not _NOT_A_KEY.match(m.group(1)) else _end(ln)
             for ln in lines if not ln.endswith(":")]
    for k, v in pairs:
        k, v = k.strip(), v.strip().rstrip(".")
        if _ROLE_KEY.match(k):  # "Role: phone assistant for Thunder Lanes." says who the assistant is
            article = "" if v[:1].isupper() or re.match(r"(?:a|an|the|my|your)\b", v, re.I) else "the "
            intro.append(f"You are {article}{v}.")
        elif _STYLE_KEY.match(k):  # "Style: upbeat, short answers." says how to talk
            rules.append(f"{k}: {v}.")
        else:
            facts.append((k, v))
    lead = ""  # a question that leads into the next sentence ("Arriving after hours? Use the drop box.") is part of it
    for s in (s for part in prose for s in ([None] if part is None else sentences(part))):
        if s is None:
            lead = ""
            continue
        if s.endswith("?"):
            lead += s + " "
            continue
        s, lead = lead + s, ""
        if known := _KNOW_THAT.match(s):  # "You should know that we are open ...": what follows is a fact
            s = _sentence_case(s[known.end():])
        if _INTRO.search(s):
            intro.append(s)
            if _has_content(s):  # (one fact per clause: "...; the shop's number is ... and the manager is ...")
                facts += [("", c.rstrip(".")) for c in clauses(first_person(s))]
        elif _RULE.search(s):
            rules.append(s)
        else:
            facts += [("", c.rstrip(".")) for c in clauses(s)]
    return Instructions(intro=" ".join(intro + aims), rules=tuple(rules), facts=tuple(facts), name=business_name(text))


#: A Markdown heading ("## Hours"), a heading line ("Hours:"), and a list item's mark ("- ", "* ", "1. ").
_HEADING = re.compile(r"^#{1,6}\s*(.*?)\s*#*$")
_HEADING_LINE = re.compile(r"^([A-Za-z][\w '&/-]{0,40}):$")
_BULLET = re.compile(r"^(?:[-*+\u2022]|\d{1,2}[.)])\s+")
#: Sections whose lines say who the assistant is, or how it should talk (the headings of a Realtime prompt written in
#: sections: "# Role & Objective", "# Personality & Tone", "# Instructions / Rules", "# Conversation Flow", ...).
_ROLE_SECTION = re.compile(r"^(?:role|objective|identity|persona|who you are|about you)\b", re.I)
_STYLE_SECTION = re.compile(r"^(?:personality|tone|style|voice|rules?|instructions?|guidelines?|behaviou?r|conversation|"
                            r"flow|safety|escalation|language|pacing|pronunciations?|reference pronunciations?|sample|"
                            r"tools?|format|how to)\b", re.I)


def _sections(text: str) -> list[tuple[str, str]]:
    """``text``'s lines without Markdown's marks, each with the kind of section it stands in: "role", "style" or ""
    (any other: the business's facts).  A plain heading (``_plain_heading``: "Hours", "Prices" alone on a line before
    the lines it heads) is no line, and opens a section of facts: "Rules" there are the business's ("Under 18s need
    a parent to sign"), not the assistant's."""
    out, section = [], ""
    lines = [line.strip() for line in text.strip().splitlines()] + [""]
    for i, line in enumerate(lines):
        heading = _HEADING.match(line) or _HEADING_LINE.match(line) or _FAQ_HEADING.match(line)
        if heading:
            name = heading.group(1).strip("*_ ")
            section = "role" if _ROLE_SECTION.match(name) else "style" if _STYLE_SECTION.match(name) else ""
            continue
        if _plain_heading(lines, i):
            section = ""
            if not lines[i + 2] and not _KEY_VALUE.match(lines[i + 1]):  # over one line: its key ("Parking" / "Free lot")
                lines[i + 1] = f"{line}: {_BULLET.sub('', lines[i + 1]).strip()}"
            continue
        line = _BULLET.sub("", line).strip()
        if line:
            out.append((section, line))
    return out


def _key_over_paragraph(line: str) -> list[str]:
    """A ``key: value`` line whose value runs to three sentences or more, as the lines it states: the key with its first
    sentence, the rest as prose ("Where we are: 9 Ropewalk Yard. Our number is 555-0100. ..."), but for a few words
    with no subject and verb, which are the key's too ("Farm shop: Open all year. Cash and card. ..."); where that first
    sentence is a whole one, with its own subject and verb, the key was a heading and every sentence is prose ("Our
    prices: shortening trousers costs $16 a pair. A new zip is $18. ...").  Any other line as it is (a value of one or
    two sentences stays the key's: "Parking: free lot behind us. Overflow on Elm Street.")."""
    m = _KEY_VALUE.match(line)
    if not m or _NOT_A_KEY.match(m.group(1)) or _ROLE_KEY.match(m.group(1).strip()) or _STYLE_KEY.match(m.group(1).strip()):
        return [line]
    said = sentences(m.group(2))
    if len(said) < 3:
        return [line]
    if not re.match(r"[$£€\d]", said[0]) and _has_subject_and_verb(said[0]):  # (not "$110 a month for open studio time")
        return [" ".join(_end(x) for x in said)]
    key = m.group(1).strip()
    out = [f"{key}: {said[0].rstrip('.')}"]
    for x in said[1:]:  # a few words with no subject and verb of their own are the key's too ("Cash and card.")
        fragment = len(x.split()) <= 5 and not _has_subject_and_verb(x) and not _RULE.match(x)
        out.append(f"{key}: {x.rstrip('.')}" if fragment else _end(x))
    return out


def _table_cells(line: str) -> list[str] | None:
    """A table row's cells ("Small dog | $40 | 1 hour", Markdown's "| Small dog | $40 |"), [] for Markdown's
    separator row, None for a line that is no table row (fewer than two cells)."""
    body = line.strip()
    if "|" not in body:
        return None
    cells = [c.strip() for c in body.strip("|").split("|")]
    if len(cells) < 2:
        return None
    if all(re.fullmatch(r":?-{2,}:?", c) for c in cells):
        return []
    return cells


def _table_fact(cells: list[str], header: list[str]) -> tuple[str, str]:
    """A table row as a fact keyed by its first cell: the second cell, then each further cell after its column's name
    ("Small dog (under 10 kg)", "$40, time on the table 1 hour")."""
    names = header[1:] if header else []
    said = [f"{names[i][:1].lower()}{names[i][1:]} {c}" if 0 < i < len(names) and names[i] else c
            for i, c in enumerate(cells[1:]) if c]
    return cells[0], ", ".join(said)


#: A FAQ's own heading on a line alone ("FAQ", "Frequently asked questions", "Q&A"): no fact.
_FAQ_HEADING = re.compile(r"^((?:FAQs?|frequently asked questions|common questions|Q ?& ?A)):?$", re.I)
#: A line of a FAQ written as pairs: "Q: Do you take cards?" then "A: Yes, all of them." (or "Question:" and "Answer:",
#: "Q." and "A)", in bold or not).  The answer's sentences are facts keyed by the question.
_FAQ = re.compile(r"^(?:\*\*|__)?(Q|A|Question|Answer)(?:\*\*|__)?\s*[:.)]\s*(?:\*\*|__)?\s*(\S.*)$")


#: A line about the business's patrons ("Everyone signs the waiver before their first visit.", "Guests must check out by
#: 11"): a policy callers ask about, a fact though it stands in a section of rules.
_PATRONS = re.compile(r"^(?:everyone|everybody|anyone|all (?:guests|customers|clients|visitors|members|patients|students|"
                      r"climbers|riders|players)|guests|customers|clients|visitors|members|patients|students|kids|children|"
                      r"parents|minors|pets|dogs)\b", re.I)


#: A plain heading's words: one to three, letters only ("Hours", "Prices", "Opening times", "Kids & families").
_PLAIN_HEADING = re.compile(r"^[A-Z][A-Za-z'&/-]*(?: [A-Za-z'&/-]+){0,2}$")


def _plain_heading(lines: list[str], i: int) -> bool:
    """Whether ``lines[i]`` heads the lines below it: a few words without a number or a stop, at a paragraph's start
    (the first line, or after an empty one), with a line of its own below."""
    return (bool(_PLAIN_HEADING.match(lines[i])) and (i == 0 or not lines[i - 1]) and i + 1 < len(lines)
            and bool(lines[i + 1]))


def _end(line: str) -> str:
    """A line as a sentence: with its full stop (a list item often has none, and the next one would run into it)."""
    return line if line[-1:] in ".!?:" else line + "."


#: What opens a line as a key does but names no fact: "Note: pets are welcome." is a sentence, "Facts:" a heading.
_NOT_A_KEY = re.compile(r"^(?:note|facts?)$", re.I)
#: Keys of a ``key: value`` pair that say who the assistant is, and how it should talk: no facts.
_ROLE_KEY = re.compile(r"^(?:role|persona|identity|assistant|agent|you are)$", re.I)
_STYLE_KEY = re.compile(r"^(?:style|tone|voice|manner|rules?|guidelines?|instructions?|behaviou?r|personality|"
                        r"answers?|replies|format)$", re.I)


def _inline_pairs(line: str) -> list[str]:
    """A line that runs several ``key: value`` statements together ("Role: phone assistant for Thunder Lanes. Address:
    1400 Industrial Parkway. Hours: ...": how many write a whole persona in one paragraph) as its sentences, each a line
    of its own (a key's value is its one sentence, the sentences after it are prose); any other line as it is (a single
    ``key: value`` line keeps every sentence of its value)."""
    parts = [part.strip() for part in _NEXT_KEY.split(line) if part.strip()]
    if sum(bool(_KEY_VALUE.match(p)) for p in parts) < 2:
        return [line]
    return [s for part in parts for s in sentences(part)]  # a key's value is its sentence; what follows is prose


#: Where a sentence that opens with a key of its own follows the one before: ". Hours: ..." (not "9:00", whose colon
#: has no space after it).
_NEXT_KEY = re.compile(r"(?<=[.;!?])\s+(?=[A-Z][\w'&/-]*(?: [\w'&/()+-]+){0,4}\s*:\s)")


def _has_content(intro_sentence: str) -> bool:
    """Whether an intro sentence says more than who the assistant is and for whom (an owner, a year, a place:
    "... Gearhead Cycles, a family-owned bike shop run by Luis Ortega since 2009")."""
    return len(intro_sentence.split()) > 12 or bool(re.search(r"\d|\b(?:run|owned|founded|since|in|located)\b", intro_sentence))


def subject(key: str, value: str) -> str:
    """What a fact is about: its key, or the words of a fact sentence before its first verb ("Check-out is by 11 AM" ->
    "Check-out", "Guests can park in our garage ..." -> "Guests"); the whole sentence when it opens with its verb."""
    if key:
        return key
    m = _VERB.search(value)
    return value[:m.start()].strip(" ,") if m and m.start() > 0 else value


#: A ``key: value`` line of a nested block (its indent, key and value; a list mark and bold marks around the key
#: dropped), and a label alone on its line, a parent's ("prices:", "- Manicures", "**Hours**").
_NESTED_PAIR = re.compile(r"^(\s*)(?:[-*+\u2022]\s+)?(?:\*\*|__)?([A-Za-z_][\w '&/+.,()-]{0,60}?)(?:\*\*|__)?\s*:(?:\*\*|__)?"
                          r"\s+(\S.*?)\s*$")
_NESTED_LABEL = re.compile(r"^(\s*)(?:[-*+\u2022]\s+)?(?:\*\*|__)?([A-Za-z_][^:\n\d]{0,60}?)(?:\*\*|__)?\s*:?(?:\*\*|__)?\s*$")
#: A parent's label that only groups its children, saying nothing of what they are about ("Business", "Details",
#: "Prices", "Rules"): its children keep their own keys.
_GROUPING = re.compile(r"^(?:business|details?|info(?:rmation)?|general|contact(?: details| info)?|other|misc(?:ellaneous)?|"
                       r"basics|about(?: us)?|facts?|key facts|context|data|rules?|polic(?:y|ies)|prices?|pricing|price list|"
                       r"rates?|fees?|costs?|tariffs?|services?(?: (?:and|&) prices?)?|menu|extras|config(?:uration)?|"
                       r"settings|location|the business)$", re.I)
#: Words a configuration's keys shorten: said in full ("jump_60_min" -> "jump 60 minutes", "min_age" -> "minimum age").
_KEY_WORDS = {"min": "minimum", "max": "maximum", "hrs": "hours", "hr": "hour", "mins": "minutes", "qty": "quantity",
              "num": "number", "addr": "address", "tel": "phone", "info": "information", "approx": "about",
              "temp": "temperature", "dept": "department", "appt": "appointment"}
#: A unit a configuration's key ends with ("depth_m", "water_temp_c"), as said after "in".
_UNITS = {"m": "metres", "km": "kilometres", "cm": "centimetres", "mm": "millimetres", "c": "degrees",
          "f": "degrees", "kg": "kilograms", "g": "grams", "lb": "pounds", "lbs": "pounds", "mi": "miles"}
#: At most this many of a key's nearest parents lead it (a key deep in a long path is said as its last few parts).
_PARENTS = 3
#: At most this many words in each item of a list that is said as one value ("not_carried:" over "- live animals").
_LIST_WORDS = 6
_DAY_ABBREV = {"mon": "Monday", "tue": "Tuesday", "tues": "Tuesday", "wed": "Wednesday", "thu": "Thursday",
               "thur": "Thursday", "thurs": "Thursday", "fri": "Friday", "sat": "Saturday", "sun": "Sunday"}
_WEEK = tuple(dict.fromkeys(_DAY_ABBREV.values()))  # Monday .. Sunday
_DAY_NAMES = frozenset(d.lower() for d in _WEEK)


def _key_words(key: str) -> str:
    """A configuration's key as words: "main_park_min_age" -> "main park minimum age", "jump_60_min" -> "jump 60 minutes",
    "mon-thu" -> "Monday to Thursday", "openingHours" -> "opening hours"."""
    key = key.strip()
    ranged = bool(re.search(r"[a-z][-_][a-z]", key, re.I))  # "mon-thu", "mon_fri": a run of days
    if " " not in key:  # camelCase: "openingHours" -> "opening hours"
        key = re.sub(r"(?<=[a-z])([A-Z])", lambda m: " " + m.group(1).lower(), key)
    key = re.sub(r"[_]+", " ", key)
    words = key.split()
    days = [w for w in re.split(r"\s*(?:[-&+/,\s]|\bto\b|\band\b)\s*", key.lower()) if w]
    if days and all(d.rstrip(".") in _DAY_ABBREV for d in days):  # a key naming days only: "mon-thu", "sat", "tue & thu"
        names = [_DAY_ABBREV[d.rstrip(".")] for d in days]
        if ranged and len(names) == 2 and (_WEEK.index(names[1]) - _WEEK.index(names[0])) % 7 > 1:
            return " to ".join(names)  # (two days next to each other are both days either way)
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    out = []
    for i, w in enumerate(words):
        low = w.lower()
        if low == "min" and i and words[i - 1][:1].isdigit():
            out.append("minutes")
        elif low in _KEY_WORDS:
            out.append(_KEY_WORDS[low])
        elif low in _DAY_NAMES:  # "saturday" as a key: a day's name
            out.append(low.capitalize())
        elif i and i == len(words) - 1 and low in _UNITS:  # "length_m": "length in metres"
            out.append(f"in {_UNITS[low]}")
        else:
            out.append(w)
    return " ".join(out)


def _nested_key(parents: list[str], key: str) -> str:
    """A child's key with what its parents say of it ("Glow jump" + "price" -> "Glow jump price", "Opening hours" +
    "Saturday" -> "Opening hours Saturday"); a parent that only groups (``_GROUPING``) or whose words the key has
    already ("Manicures" over "Classic manicure") adds nothing."""
    own = _key_words(key)
    words = {w.lower().rstrip("s") for w in re.findall(r"[A-Za-z]+", own)}
    lead = []
    for p in parents:
        label = re.sub(r"\s*\(.*?\)\s*", " ", _key_words(p)).strip()
        if not label or _GROUPING.match(label) or {w.lower().rstrip("s") for w in re.findall(r"[A-Za-z]+", label)} <= words:
            continue
        lead.append(label)
    return _cap(" ".join([*lead, own]))


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _comment(value: str) -> str:
    """A configuration's value as said: its quotes dropped and its trailing comment in brackets ("\"$3\"  # compulsory"
    -> "$3 (compulsory)")."""
    m = re.search(r"\s+#\s*(.*)$", value)
    said, note = (value[:m.start()].rstrip(), m.group(1).strip()) if m else (value, "")
    if len(said) > 1 and said[0] == said[-1] and said[0] in "\"'":
        said = said[1:-1].strip()
    return f"{said} ({note})" if note else said


def _flatten_nested(text: str) -> str:
    """Nested ``key: value`` lines (a YAML-like block, Markdown bullets under a bullet) as flat ones, each key led by
    what its parents say of it (``_nested_key``): "hours:" over "  sat: 09:00-19:00" -> "Hours Saturday:
    09:00-19:00" ... ; a parent is a label alone on its line ("prices:", "- Manicures") with its children indented
    deeper.  A ``key:`` over a list of short items is one fact, the items its value; any other parent whose children
    are no ``key: value`` lines stays as it was (a heading over its list)."""
    lines = text.splitlines()
    n = len(lines)
    indents = [len(ln) - len(ln.lstrip()) if ln.strip() else -1 for ln in lines]
    ends = list(range(1, n + 1))  # where each line's block of deeper lines ends (an empty line ends every one)
    open_: list[int] = []
    for j in range(n):
        while open_ and (indents[j] < 0 or indents[open_[-1]] >= indents[j]):
            ends[open_.pop()] = j
        if indents[j] >= 0:
            open_.append(j)
    for j in open_:
        ends[j] = n
    # running counts over the lines, so that a parent's children are judged in one step whatever their number
    pairs, bullets, short = ([0] * (n + 1) for _ in range(3))
    for j, ln in enumerate(lines):
        item = _BULLET.sub("", ln.strip())
        pairs[j + 1] = pairs[j] + bool(_NESTED_PAIR.match(ln))
        bullets[j + 1] = bullets[j] + bool(_BULLET.match(ln.strip()))
        short[j + 1] = short[j] + (len(item.split()) <= _LIST_WORDS)
    out: list[str] = []
    stack: list[tuple[int, str]] = []  # (indent, label) of the parents open at this line
    config = False
    skip_to = 0  # lines said already (a short list's items, in its key's value)
    for i, raw in enumerate(lines):
        if not raw.strip():
            stack.clear()
            out.append(raw)
            continue
        indent = indents[i]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if i < skip_to:
            continue
        a, b = i + 1, ends[i]  # its children: lines a .. b - 1
        parents = [p for _, p in stack][-_PARENTS:]
        label = _NESTED_LABEL.match(raw)
        if label and b > a and pairs[b] > pairs[a]:
            stack.append((indent, label.group(2).strip()))
            config = True
            continue
        if (label and raw.rstrip().endswith(":") and b > a and bullets[b] - bullets[a] == b - a
                and short[b] - short[a] == b - a):
            # "not_carried:" over "- alcohol" and "- live animals": one fact, its items its value
            items = [_comment(_BULLET.sub("", x.strip())) for x in lines[a:b]]
            out.append(f"{_nested_key(parents, label.group(2))}: {', '.join(items)}")
            skip_to = b
            continue
        pair = _NESTED_PAIR.match(raw)
        if stack and pair:
            out.append(f"{_nested_key(parents, pair.group(2))}: {_comment(pair.group(3))}")
            continue
        if stack and label:  # a label over nothing
            continue
        out.append(raw if not stack else raw.strip())
    if config:  # a configuration's own top-level keys: "online_code: BOING10  # mon-thu only"
        out = [f"{_cap(_key_words(p.group(2)))}: {_comment(p.group(3))}" if (p := _NESTED_PAIR.match(ln)) and not p.group(1)
               and "_" in p.group(2) else ln for ln in out]
    return "\n".join(out)


def _flatten_json(text: str) -> str:
    """A JSON object pasted into the instructions as ``key: value`` lines, nested keys led by their parents'
    (``_nested_key``), a list of plain values as one value ("a, b, c"), a list of objects as one line each."""
    start = text.find("{")
    if start < 0:
        return text
    end = text.rfind("}")
    if end < start:
        return text
    try:
        data = json.loads(text[start:end + 1])
    except (ValueError, RecursionError):  # (not JSON, or nested past Python's stack)
        return text
    if not isinstance(data, dict):
        return text
    lines: list[str] = []

    def said(v) -> str:
        if isinstance(v, bool):
            return "yes" if v else "no"
        if v is None:
            return "none"
        return str(v)

    def walk(obj, parents: list[str]) -> None:
        for k, v in obj.items():
            if isinstance(v, dict):
                walk(v, [*parents, str(k)])
            elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
                for x in v:
                    items = list(x.items())
                    if not items:
                        continue
                    head = said(items[0][1])
                    rest = ", ".join(f"{_key_words(str(a))} {said(b)}" for a, b in items[1:]
                                     if not isinstance(b, (dict, list)))
                    lines.append(f"{_nested_key([*parents, str(k)], head)}: {rest}" if rest else
                                 f"{_nested_key(parents, str(k))}: {head}")
            elif isinstance(v, list):
                lines.append(f"{_nested_key(parents, str(k))}: {', '.join(said(x) for x in v)}")
            else:
                lines.append(f"{_nested_key(parents, str(k))}: {said(v)}")

    try:
        walk(data, [])
    except RecursionError:
        return text
    return f"{text[:start].rstrip()}\n" + "\n".join(lines) + f"\n{text[end + 1:].lstrip()}"


#: An XML-style tag that opens a line or closes one (mid-line, "<farm_info>" is a sentence naming a section):
#: ``<tag attr="value">`` or ``</tag>``.
_XML_OPEN = re.compile(r"^\s*<([A-Za-z_][\w.-]*)((?:\s+[\w:.-]+\s*=\s*(?:\"[^\"]*\"|'[^']*'))*)\s*>")
_XML_CLOSE = re.compile(r"</([A-Za-z_][\w.-]*)>\s*$")
_XML_ATTR = re.compile(r"[\w:.-]+\s*=\s*(?:\"([^\"]*)\"|'([^']*)')")


class _Element:
    __slots__ = ("tag", "key", "children")

    def __init__(self, tag: str, attrs: str):
        values = [a or b for a, b in _XML_ATTR.findall(attrs)]
        self.tag = tag
        self.key = " ".join([*[v for v in values if v.strip()], tag])  # <crop name="strawberries"> -> "strawberries crop"
        self.children: list[_Element | str] = []

    def text(self) -> str:
        return " ".join(" ".join(c.split()) for c in self.children if isinstance(c, str) and c.strip())

    def elements(self) -> list[_Element]:
        return [c for c in self.children if isinstance(c, _Element)]


def _flatten_xml(text: str) -> str:
    """A prompt written in XML-style tags (``<role>``, ``<rules>``, ``<farm_info>`` over ``<owner>Tom runs the
    farm.</owner>`` ...) as the sections and ``key: value`` lines the split reads: a top-level element over others, or
    one whose name says role or style (``_ROLE_SECTION``, ``_STYLE_SECTION``), is a section headed by its name; an
    element inside one is a ``key: value`` line keyed by its name and its attributes' values, led by its parents'
    (``_nested_key``: ``<pick_your_own>`` over ``<crop name="strawberries">`` -> "Pick your own strawberries crop").
    Tags count only where they open or close a line; text whose tags do not nest is left as it is."""
    lines = text.splitlines()
    if sum(bool(_XML_OPEN.match(ln)) for ln in lines) < 2:
        return text
    root = _Element("", "")
    stack = [root]
    for line in lines:
        rest = line
        opened = _XML_OPEN.match(rest)
        if opened:
            el = _Element(opened.group(1), opened.group(2))
            stack[-1].children.append(el)
            stack.append(el)
            rest = rest[opened.end():]
        closed = _XML_CLOSE.search(rest)
        if closed:
            rest = rest[:closed.start()]
        if rest.strip():
            stack[-1].children.append(html.unescape(rest))
        if closed:
            if len(stack) < 2 or stack[-1].tag != closed.group(1):
                return text  # (tags that do not nest: not a document of them)
            stack.pop()
    if len(stack) != 1:
        return text
    out: list[str] = []

    def walk(el: _Element, parents: list[str]) -> None:
        if el.text():
            out.append(f"{_nested_key(parents, el.key)}: {el.text()}")
        for child in el.elements():
            walk(child, [*parents, el.key])

    try:
        for part in root.children:
            if isinstance(part, str):
                out.append(part)
                continue
            label = _cap(_key_words(part.key))
            if part.elements() or _ROLE_SECTION.match(label) or _STYLE_SECTION.match(label):
                out += ["", f"## {label}", *(c.strip() for c in part.children if isinstance(c, str) and c.strip())]
                for child in part.elements():
                    walk(child, [])
                out.append("")
            elif part.text():
                out.append(f"{label}: {part.text()}")
    except RecursionError:  # (nested past Python's stack: the text as it is)
        return text
    return "\n".join(out)


#: What a page pasted from a website carries besides its text: a menu ("Home | Services | Prices | FAQ": four items or
#: more between bars, no digit, no table's rows under it), links ("Read more »"), the footer ("© 2025 ..."), and a
#: price list's dot leaders ("Standard sweep ........ $85").
_MENU = re.compile(r"^\s*[A-Za-z][^|\n\d]{0,24}(?:\s\|\s[A-Za-z][^|\n\d]{0,24}){3,}\s*$")
_LINK = re.compile(r"^\s*(?:read more|learn more|see more|more info|click here|find out more)\b[^\n]{0,10}$|^\s*\S.{0,30}[»›]\s*$",
                   re.I)
_FOOTER = re.compile(r"^\s*(?:©|\(c\)|copyright\b)", re.I)
_LEADERS = re.compile(r"^(\s*(?:[-*+\u2022]\s+)?[A-Za-z][^.\n]*?)\s*(?:\.{4,}|…{2,}|_{4,})\s*(\S.*)$")
#: A transcript's time stamp at a line's start ("[00:31] Right, where we are.").
_STAMP = re.compile(r"^\s*\[\d{1,2}:\d{2}(?::\d{2})?\]\s*")


def _page_chrome(text: str) -> str:
    """``text`` without a pasted page's menu, links and footer, a price list's dot leaders as ``key: value`` lines, and
    a transcript's time stamps dropped."""
    out = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        menu = _MENU.match(line) and "|" not in next((ln for ln in lines[i + 1:i + 4] if ln.strip()), "")
        # (not a table's header over its rows)
        if menu or _LINK.match(line) or _FOOTER.match(line):
            continue
        line = _STAMP.sub("", line)
        if m := _LEADERS.match(line):
            line = f"{m.group(1)}: {m.group(2)}"
        out.append(line)
    return "\n".join(out)


_INI_SECTION = re.compile(r"^\s*\[([A-Za-z][^\]\n]{0,40})\]\s*$")
_INI_PAIR = re.compile(r"^\s*([A-Za-z_][\w .'/&-]{0,60}?)\s*=\s*(\S.*?)\s*$")


def _flatten_ini(text: str) -> str:
    """An INI-style block ("[prices]" over "lesson_30_min = $35  ; group of 4") as ``key: value`` lines, each key led by
    its section's label where it says something (``_nested_key``); text with no section over such pairs as it is."""
    lines = text.splitlines()
    if not any(_INI_SECTION.match(ln) for ln in lines) or sum(bool(_INI_PAIR.match(ln)) for ln in lines) < 2:
        return text
    out, section = [], None
    for ln in lines:
        if m := _INI_SECTION.match(ln):
            section = m.group(1).strip()
            continue
        if section is not None and (m := _INI_PAIR.match(ln)):
            value = re.sub(r"\s+;\s*", " # ", m.group(2), count=1)  # an INI comment, said as a configuration's is
            out.append(f"{_nested_key([section], m.group(1))}: {_comment(value)}")
            continue
        out.append(ln)  # (a blank line inside a section goes on with it)
    return "\n".join(out)


#: A line of terse notes, "key - value" ("screen repair - $89, w/ 90 day warranty", "Monday - closed"): a key of a few
#: words with no verb, a dash with spaces around it, the value.
_DASH_PAIR = re.compile(r"^(\s*(?:[-*+\u2022]\s+)?)([A-Za-z][\w '&/+.]{0,40}?)\s+[-\u2013\u2014]\s+(\S.*?)\s*$")


def _dash_pairs(text: str) -> str:
    """Lines of terse notes written "key - value" as ``key: value`` lines, when at least two lines are so written (a
    list of them, not a sentence's dash: "We're open late - until 9 on Fridays" has a verb before its dash)."""
    lines = text.splitlines()
    found = [m if (m := _DASH_PAIR.match(ln)) and len(m.group(2).split()) <= 5 and not _VERB.search(m.group(2))
             and not _INTRO.search(m.group(2)) else None for ln in lines]
    if sum(m is not None for m in found) < 2:
        return text
    return "\n".join(f"{m.group(1)}{_cap(_key_words(m.group(2)))}: {m.group(3)}" if m else ln for ln, m in zip(lines, found))
