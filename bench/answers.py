"""Answer quality of the LLM stage: does each reply carry the fact the question asks for?

    .venv/bin/python bench/answers.py [--set own|dev|heldout] [--persona NAME ...] [--build instructions|facts]
                                      [--history-turns N|all] [--temperature T] [--repetition-penalty R]
                                      [--verbose | --quiet] [--json FILE]

Text in, text out, no audio: each persona's conversations run through the real
``voice.llm.LLMConversation`` on the real decode core (``decode.Model`` + ``decode.Generator``),
turn after turn as the voice loop drives it: ``reply(question)``, the streamed text cut after two
sentences as the loop's ``max_sentences=2`` cuts it (phrases from ``voice.phrases.PhraseChunker``,
the loop's sentence-end rule), then ``commit(question, spoken)``, so that the earlier exchanges
are in the history of the next question.  Each conversation starts from ``reset()``.

Personas: the default Bright Bakery (``voice.llm.Persona()``), plus a dentist's office ("key: value"
lines) and a bike repair shop (plain sentences) defined here, each as a facts table and as the
free-text ``instructions`` a Realtime client would send; ``--build`` picks which one the persona is
built from: ``instructions`` (default) is the server's path, ``Persona.from_instructions``;
``facts`` is ``Persona.from_facts``.

Sets (``--set``, printed first): ``own`` (default), the three personas above, written here with the grounding; ``dev``,
``heldout`` and ``heldout2``, prose personas in ``bench/personas/<set>/*.json`` written as a user writes a Realtime
client's ``instructions`` (a paragraph of facts), with questions worded unlike the facts.  ``dev`` may be used to tune;
the held-apart ones never are: they are the figures for personas and wording nobody tuned on
(``bench/personas/README.md`` says what each has been used for).

Each question is one of:
- fact: a paraphrase of a question about one fact, a follow-up after a question about another
  fact (the check that the model answers the new question, not the last one), or an elliptical
  follow-up ("And a sourdough loaf?", "Is it free?") that needs the previous exchange.  Passes
  when the reply matches the expected fact's regex (case-insensitive).
- off: an off-topic question (weather, jokes, trivia).  Expected: a short polite reply that invents
  no fact.  Passes when the reply has at most 30 words, contains no digit (no invented hour,
  price or address), and declines or redirects (matches ``DECLINE``).
Each persona's ``held_out`` conversations were written after the grounding's cue words were
chosen (``voice.llm.relevant_facts``), as the check on questions it was not tuned on.

Every reply is also checked for invented claims (``invented``): a number (digits or a number word), a time or a
capitalized name that neither the persona's text nor the conversation's questions so far contain (the bar is none);
the check is written here, apart from the product's guard (``voice.guard``), so that it does not grade itself.

Printed: one row per question (persona, conversation.turn, kind, pass, P = parroting, h = held
out, question, reply), then per persona and overall: fact accuracy (fact questions passed / fact
questions; the bar is >= 0.90), split into the tuned and the held-out questions and the follow-ups;
off-topic pass rate; verbatim repeats: identical replies, within one persona, to questions about
different facts (every off-topic question is its own fact), unless that one reply passes each of
them (printed as "shared": one fact sentence answering two questions), the persona's set decline
left out (a declined fact question counts as a missed fact); the bar is none; parroting
(replies equal to or containing the question); and the prompt sizes: the opening's tokens
(prefilled once at warm-up and cached) and the mean prompt tokens per turn beyond the opening (the
history shown, the question, its facts: what a turn prefills, on its path or in ``prepare()``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: What a polite off-topic reply says: it declines or points back to the business.
DECLINE = re.compile(r"\b(sorry|afraid|apolog\w*|can't|cannot|can not|unable|not able|don't know|do not know|not sure|only|help|assist|"
                     r"questions?|ask)\b", re.I)
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*$")  # the voice loop's rule (voice/loop.py)
MAX_SENTENCES = 2  # the voice loop's default (voice/loop_config.py)
OFF_MAX_WORDS = 30


@dataclass(frozen=True, slots=True)
class Q:
    text: str
    fact: str  # the key of the fact asked for; "off:<topic>" for an off-topic question
    expect: str | None = None  # regex a fact reply must match (None for off-topic)

    @property
    def off_topic(self) -> bool:
        return self.fact.startswith("off:")


@dataclass(frozen=True, slots=True)
class PersonaSpec:
    name: str
    title: str  # the business's name
    facts: dict  # key -> value, as Persona.from_facts takes them
    instructions: str | None  # what a Realtime client would send; None: the default persona
    conversations: tuple[tuple[Q, ...], ...]
    #: Written after the grounding's cue words were chosen, never used to tune them: the figure for
    #: questions the retrieval has not seen.
    held_out: tuple[tuple[Q, ...], ...] = ()


def script(expect: dict[str, str], text: str) -> tuple[tuple[Q, ...], ...]:
    """Conversations written one question a line, ``KEY question``, a blank line between two conversations.  KEY is
    ``off:TOPIC`` for an off-topic question, else a key of ``expect``, the regex the reply must match; the fact asked
    for is KEY up to a dot (``hours.close``: the fact ``hours``, the reply saying when the place closes)."""
    def q(key: str, question: str) -> Q:
        return Q(question, key) if key.startswith("off:") else Q(question, key.split(".")[0], expect[key])

    return tuple(tuple(q(*line.split(None, 1)) for line in block.splitlines())
                 for block in re.split(r"\n\s*\n", text.strip()))


def persona_spec(name: str, title: str, facts: dict, instructions: str | None, conversations: str, held_out: str,
                 expect: dict[str, str]) -> PersonaSpec:
    """A persona and its questions: its conversations and the held-out ones, written as ``script`` reads them, with
    ``expect``, the regex a reply must match for each KEY."""
    return PersonaSpec(name, title, facts, instructions, script(expect, conversations), script(expect, held_out))


CLOSED = r"\bclosed\b|not open|\bno\b"  # the reply to "are you open on <the day it is closed>?"

# -- Bright Bakery: the default persona (voice/llm.py) ------------------------------------------------

BAKERY = persona_spec("bakery", "Bright Bakery", {}, None, """
    address         Where are you located?
    owner           Who is the owner?
    hours.open      What time do you open?
    croissant       How much is a croissant?
    sourdough       And a sourdough loaf?

    address         What's your address?
    owner           Who runs the bakery?
    hours.close     When do you close in the evening?
    mondays         Are you open on Mondays?
    delivery        Do you do deliveries?
    delivery        Is it free?
    sourdough       What does the sourdough cost?

    off:weather     What's the weather like today?
    off:joke        Can you tell me a joke?
    hours.open      OK. What time do you open tomorrow morning?
    off:capital     What is the capital of France?
    hours.days      Which days of the week are you open?

    hours.open      Hi, what time do you open tomorrow morning?
    address         Where exactly is the bakery?
    croissant       How much for one croissant?
    owner           Who owns Bright Bakery?
    off:football    Who won the football game last night?
    delivery        Is delivery free?
""", held_out="""
    hours.close     How late are you open?
    mondays         Can I come by on a Monday?
    croissant       What's the price of a croissant?
    sourdough       How much do you charge for a loaf of sourdough?

    address         Where's the shop?
    owner           Who's the boss there?
    off:weather     Tell me about the weather tomorrow.
    delivery        Can you deliver a cake to my house?
    off:arithmetic  What's two plus two?
""", expect={
    "hours.open": r"\b7\b|seven",
    "hours.close": r"\b6\b|six",
    "hours.days": r"tuesday",
    "mondays": CLOSED,
    "address": r"harbou?r",
    "owner": r"maria",
    "croissant": r"\b2\b|two",
    "sourdough": r"\b5\b|five",
    "delivery": r"\b30\b|thirty",
})

# -- a dentist's office: "key: value" instructions -----------------------------------------------------

DENTIST_FACTS = {
    "Hours": "8 am to 5 pm, Monday to Friday",
    "Weekends": "closed",
    "Address": "40 Elm Avenue",
    "Dentist": "Dr. Lena Patel",
    "Cleaning": "90 dollars",
    "Whitening": "250 dollars",
    "New patients": "welcome, the first exam is free",
    "Parking": "free, behind the building",
}
DENTIST_INSTRUCTIONS = ("You are the receptionist of Clearview Dental. Be brief and friendly.\n"
                        + "\n".join(f"{k}: {v}." for k, v in DENTIST_FACTS.items()))

DENTIST = persona_spec("dentist", "Clearview Dental", DENTIST_FACTS, DENTIST_INSTRUCTIONS, """
    address         Where is your office?
    dentist         Who is the dentist?
    cleaning        How much is a cleaning?
    whitening       And teeth whitening?

    hours.open      What time do you open?
    weekends        Are you open on Saturday?
    parking         Can I park there?
    new             Do you take new patients?
    address         What's the address?

    off:movie       Can you recommend a good movie?
    hours.close     When do you close?
    off:president   Who is the president of the United States?
    whitening       What does whitening cost?
    weekends        Can I do it on a Saturday?
    dentist         What's the dentist's name?
""", held_out="""
    hours.open      What are your opening hours?
    parking         Is there somewhere to park?
    cleaning        How much does a teeth cleaning cost?
    weekends        Can I come in on Sunday?
    off:cat         What's a good name for a cat?
    dentist         Who will I see there?
""", expect={
    "hours.open": r"\b8\b|eight",
    "hours.close": r"\b5\b|five",
    "weekends": CLOSED,
    "address": r"\belm\b",
    "dentist": r"patel",
    "cleaning": r"\b90\b|ninety",
    "whitening": r"\b250\b",
    "new": r"free|welcome",
    "parking": r"free|behind",
})

# -- a bike repair shop: instructions in sentences -----------------------------------------------------

BIKES_FACTS = {
    "Hours": "10 am to 7 pm, Monday to Saturday",
    "Sundays": "closed",
    "Address": "5 Mill Road",
    "Owner": "Tom",
    "Flat tire repair": "15 dollars",
    "Tune-up": "60 dollars",
    "Bike rental": "20 dollars a day",
    "Repair time": "most repairs are done the same day",
}
BIKES_INSTRUCTIONS = (
    "You answer the phone for Rapid Wheels, a bike repair shop. We are open from 10 am to 7 pm, Monday to Saturday, "
    "and closed on Sundays. The shop is at 5 Mill Road. The owner is Tom. Fixing a flat tire costs 15 dollars and a "
    "full tune-up costs 60 dollars. Bike rental is 20 dollars a day. Most repairs are done the same day."
)

BIKES = persona_spec("bikes", "Rapid Wheels", BIKES_FACTS, BIKES_INSTRUCTIONS, """
    address         Where is the shop?
    owner           Who is the owner?
    flat            How much to fix a flat tire?
    tuneup          And a tune-up?
    time            How long does that take?

    hours.open      What time do you open?
    sundays         Are you open on Sunday?
    rental          Can I rent a bike?
    time            How long does a repair take?
    owner           Who runs the shop?

    off:recipe      Do you know a good pasta recipe?
    address         What's your address?
    off:song        Can you sing me a song?
    hours.close     When do you close?
    tuneup          What does a full tune-up cost?
""", held_out="""
    address         Where are you?
    rental          How much is a bike rental for a day?
    sundays         Is the shop open on Sunday?
    owner           Who's in charge of the shop?
    time            When can I pick up my bike after a repair?
    off:football    What's the best football team?
""", expect={
    "hours.open": r"\b10\b|ten",
    "hours.close": r"\b7\b|seven",
    "sundays": CLOSED,
    "address": r"\bmill\b",
    "owner": r"\btom\b",
    "flat": r"\b15\b|fifteen",
    "tuneup": r"\b60\b|sixty",
    "rental": r"\b20\b|twenty",
    "time": r"same day|today",
})

SPECS = {s.name: s for s in (BAKERY, DENTIST, BIKES)}
PERSONAS_DIR = ROOT / "bench" / "personas"
#: what each set is, printed with its figures
SET_NOTES = {"own": "the bakery, dentist and bike personas written with the grounding (bench/answers.py)",
             "dev": "prose personas that tuning may look at (bench/personas/dev)",
             "heldout": "prose personas and questions held apart: never used to tune (bench/personas/heldout)",
             "heldout2": "prose personas written after the retrieval was frozen, run once (bench/personas/heldout2)",
             "heldout3": "prose personas written after heldout2's run, before any later change (bench/personas/heldout3)",
             "heldout4": "prose personas written at 02:00, before the last changes, run once at the end (bench/personas/heldout4)",
             "heldout5": "prose personas by a helper who never read the retrieval code (bench/personas/heldout5)",
             "heldout6": "prose personas by a helper who never read the retrieval code (bench/personas/heldout6)",
             "heldout7": "prose personas by a helper who never read the retrieval code, run once at the end (bench/personas/heldout7)",
             "heldout8": "prose personas by a helper who never read the retrieval code, written after 80b2f29 (bench/personas/heldout8)",
             "heldout9": "prose, list and Markdown personas by a helper who never read the code, run once (bench/personas/heldout9)",
             "heldout10": "prose, Markdown and terse personas by a helper who never read the code, run once "
                          "(bench/personas/heldout10)",
             "heldout11": "prose, sectioned-list and Q/A personas by a helper who never read the code, run once "
                          "(bench/personas/heldout11)",
             "heldout12": "second-person prose, Markdown with a table line, and an owner's email by a helper who never "
                          "read the code, run once (bench/personas/heldout12)",
             "heldout13": "first-person prose with a late correction, key: value lines, and a Realtime-guide Markdown prompt "
                          "by a helper who never read the code, run once (bench/personas/heldout13)",
             "heldout14": "a numbered list, a non-native speaker's prose, and plain capitalised sections by a helper who never "
                          "read the code, run once (bench/personas/heldout14)",
             "heldout15": "third-person prose, nested Markdown bullets with bold labels, and a YAML-like block by a helper who "
                          "never read the code, run once (bench/personas/heldout15)",
             "heldout16": "a nested YAML-like configuration, a pasted JSON object, and an owner's rambling prose by a helper "
                          "who never read the code, run once (bench/personas/heldout16)",
             "heldout17": "quick chat-box lines, Markdown sections of bullet sentences, and a formal third-person paragraph by a "
                          "helper who never read the code, run once (bench/personas/heldout17)",
             "heldout18": "a plain paragraph, a role paragraph over a FAQ, and an INI-style config, businesses and registers "
                          "chosen by a helper who never read the code, run once (bench/personas/heldout18)",
             "heldout19": "an owner's dictated voice memo, an XML-tagged system prompt, and text pasted from a website, "
                          "businesses and registers chosen by a helper who never read the code, run once "
                          "(bench/personas/heldout19)"}


def load_spec(path: Path) -> PersonaSpec:
    """A persona of a set: ``{"title", "instructions", "conversations": [[{"q", "fact", "expect"} | {"q", "off"}, ...],
    ...]}`` (``bench/personas/README.md``)."""
    data = json.loads(Path(path).read_text())

    def q(turn: dict) -> Q:
        if "off" in turn:
            return Q(turn["q"], "off:" + turn["off"])
        re.compile(turn["expect"])
        return Q(turn["q"], turn["fact"].split(".")[0], turn["expect"])

    convs = tuple(tuple(q(t) for t in conv) for conv in data["conversations"])
    return PersonaSpec(Path(path).stem, data["title"], {}, data["instructions"], convs)


def load_set(name: str) -> dict[str, PersonaSpec]:
    """The personas of a set, by name: ``own`` (SPECS) or a folder of ``bench/personas``."""
    if name == "own":
        return dict(SPECS)
    folder = PERSONAS_DIR / name
    files = sorted(folder.glob("*.json"))
    if not files:
        raise SystemExit(f"no persona set {name!r}: {folder} has no *.json")
    return {f.stem: load_spec(f) for f in files}


def build_persona(spec: PersonaSpec, build: str):
    """The persona the conversation runs with: the default one for the bakery; else the server's
    path (``Persona.from_instructions`` on the client's text) or ``Persona.from_facts``."""
    from voice.llm import Persona

    if spec.instructions is None:
        return Persona()
    if build == "facts":
        return Persona.from_facts(spec.title, spec.facts)
    return Persona.from_instructions(spec.instructions)


# -- one turn as the voice loop plays it -------------------------------------------------------------

def spoken_reply(llm, question: str, max_sentences: int = MAX_SENTENCES) -> str:
    """``llm.reply`` cut as the voice loop cuts it: phrases until ``max_sentences`` sentence ends."""
    from voice.phrases import PhraseChunker

    chunker, phrases, sentences = PhraseChunker(), [], 0
    stream = llm.reply(question)
    try:
        while sentences < max_sentences:
            piece = next(stream, None)
            if piece is None:
                break
            chunker.feed(piece)
            for ph in chunker.drain():
                phrases.append(ph.text)
                sentences += bool(_SENTENCE_END.search(ph.text))
        if sentences < max_sentences:
            phrases += [ph.text for ph in chunker.flush()]
    finally:
        stream.close()
    return " ".join(phrases)


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split())


def check(q: Q, reply: str) -> bool:
    if not q.off_topic:
        return bool(re.search(q.expect, reply, re.I))
    return (0 < len(reply.split()) <= OFF_MAX_WORDS and not re.search(r"\d", reply) and bool(DECLINE.search(reply)))


_NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen twenty".split())} | {"thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80,
                                           "ninety": 90, "hundred": 100, "thousand": 1000, "noon": 12, "midnight": 12}
_ALWAYS_SAID = frozenset("i i'm i'll i've i'd am pm a.m p.m ok okay".split())


def _numbers(text: str) -> set[int]:
    """The numbers a text states: digit runs ("7:30" is 7 and 30, ":00" none) and number words read as numbers
    ("forty-five" is 45, "one hundred forty" 140, "seven thirty" 7 and 30)."""
    out = {int(d) for d in re.findall(r"\d+", text) if int(d) != 0}
    current = None
    for w in re.findall(r"[a-z]+", text.lower()) + [""]:
        v = _NUMBER_WORDS.get(w)
        if v is None or w in ("noon", "midnight"):
            if current:
                out.add(current)
            current = None
            if v:
                out.add(v)
        elif v in (100, 1000):
            current = (current or 1) * v
        elif current is None:
            current = v
        elif v < 10 and current % 10 == 0 and current % 100 >= 20 or current % 100 == 0 and v < 100:
            current += v  # forty-five, one hundred forty
        else:
            out.add(current)  # seven thirty: two numbers
            current = v
    return out


def _names(text: str) -> set[str]:
    """Capitalized words that do not open a sentence: the names a reply says ("Daniel Okafor", "SHEBELLA")."""
    out = set()
    for sentence in re.split(r"(?<=[.!?:;])\s+|\n", text):
        words = re.findall(r"[A-Za-z][A-Za-z'.-]*", sentence)
        out |= {w.rstrip(".").lower() for w in words[1:] if w[0].isupper() and w.rstrip(".").lower() not in _ALWAYS_SAID}
    return out


def invented(reply: str, known: str) -> list[str]:
    """Numbers and names in ``reply`` that ``known`` (the persona's text and the questions asked) does not contain; a
    day of the week it names by an abbreviation or in a run ("sat: 09:00-14:00", "mon_fri", "Mon-Thu") is known."""
    from voice.retrieval import weekdays

    words = {w.lower() for w in re.findall(r"[A-Za-z][A-Za-z'-]*", known)}
    words |= {f"{d}day" for d in weekdays(re.sub(r"(?<![A-Za-z])([a-z]{3})(?![a-z])", lambda m: m.group(1).capitalize(),
                                                 known.replace("_", "-")))}
    words |= {p for w in list(words) for p in w.split("-")} | {w[:-2] for w in words if w.endswith("'s")}
    nums = _numbers(known)
    bad = [str(n) for n in sorted(_numbers(reply) - nums)]
    return bad + sorted(n for n in _names(reply) if n not in words and n.split("'")[0] not in words)


def parrots(question: str, reply: str) -> bool:
    q, r = _norm(question), _norm(reply)
    return bool(q) and q in r


@dataclass
class Row:
    persona: str
    conversation: int
    turn: int
    kind: str
    fact: str
    question: str
    reply: str
    ok: bool
    parrot: bool
    turn_tokens: int  # prompt tokens beyond the cached opening
    reply_ms: float
    held_out: bool = False
    invented: tuple[str, ...] = ()  # numbers and names the persona and the conversation do not contain


def persona_text(spec: PersonaSpec) -> str:
    """Everything the operator wrote for ``spec``: its instructions, else the default persona's system text."""
    if spec.instructions is not None:
        return spec.instructions
    from voice.llm import Persona

    return Persona().system


def run_persona(llm, spec: PersonaSpec, opening_tokens: int) -> list[Row]:
    rows = []
    convs = [(c, False) for c in spec.conversations] + [(c, True) for c in spec.held_out]
    for ci, (conv, held_out) in enumerate(convs, 1):
        llm.reset()
        known = persona_text(spec) + " " + spec.title
        for ti, q in enumerate(conv, 1):
            known += " " + q.text
            n = len(llm.prompt_ids(q.text)) - opening_tokens
            t = time.perf_counter()
            reply = spoken_reply(llm, q.text)
            ms = (time.perf_counter() - t) * 1000
            llm.commit(q.text, reply)
            kind = "off" if q.off_topic else ("follow" if ti > 1 else "fact")
            rows.append(Row(spec.name, ci, ti, kind, q.fact, q.text, reply, check(q, reply), parrots(q.text, reply), n, ms,
                            held_out, tuple(invented(reply, known))))
    return rows


def _same_reply(rows: list[Row]) -> list[list[Row]]:
    """Replies said word for word to questions about different facts; the persona's decline is not one (it is one
    set sentence, ``voice.llm.decline``: a fact question declined is a fact missed, counted there)."""
    from voice.llm import DECLINE as SET_DECLINE

    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        if r.reply.startswith(SET_DECLINE):
            continue
        groups.setdefault((r.persona, _norm(r.reply)), []).append(r)
    return [g for g in groups.values() if len({r.fact for r in g}) > 1]


def repeats(rows: list[Row]) -> list[list[Row]]:
    """Groups of identical replies (within one persona) to questions about different facts, unless
    the one reply passes every question of the group: those are ``shared``."""
    return [g for g in _same_reply(rows) if not all(r.ok for r in g)]


def shared(rows: list[Row]) -> list[list[Row]]:
    """Identical replies to questions about different facts that carry every expected fact (one fact
    sentence that answers both: "... and closed on Sundays" for the hours and for Sundays)."""
    return [g for g in _same_reply(rows) if all(r.ok for r in g)]


def _acc(rows: list[Row]) -> float | None:
    return sum(r.ok for r in rows) / len(rows) if rows else None


def summarize(rows: list[Row], opening: dict[str, int]) -> dict:
    def part(rs):
        facts = [r for r in rs if r.kind != "off"]
        offs = [r for r in rs if r.kind == "off"]
        return {
            "questions": len(rs),
            "fact_questions": len(facts),
            "fact_accuracy": sum(r.ok for r in facts) / len(facts) if facts else None,
            "tuned_accuracy": _acc([r for r in facts if not r.held_out]),
            "held_out_accuracy": _acc([r for r in facts if r.held_out]),
            "follow_up_accuracy": (sum(r.ok for r in facts if r.kind == "follow") / n
                                   if (n := sum(r.kind == "follow" for r in facts)) else None),
            "off_topic": len(offs),
            "off_topic_pass": sum(r.ok for r in offs) / len(offs) if offs else None,
            "repeat_groups": len(rep := repeats(rs)),
            "repeated_replies": sum(len(g) for g in rep),
            "shared_replies": sum(len(g) for g in shared(rs)),
            "parroting": sum(r.parrot for r in rs),
            "invented": sum(bool(r.invented) for r in rs),
            "turn_tokens_mean": sum(r.turn_tokens for r in rs) / len(rs),
            "turn_tokens_max": max(r.turn_tokens for r in rs),
            "reply_ms_mean": sum(r.reply_ms for r in rs) / len(rs),
        }

    out = {name: {**part([r for r in rows if r.persona == name]), "opening_tokens": opening[name]}
           for name in dict.fromkeys(r.persona for r in rows)}
    out["all"] = part(rows)
    return out


def load_llm(history_turns, sampling=None, generator=None):
    from decode import Generator, Model
    from voice.engines import one_blas_thread
    from voice.llm import LLMConversation

    one_blas_thread()
    gen = generator or Generator(model=Model())
    kw = {} if history_turns == "default" else {"history_turns": history_turns}
    if sampling is not None:
        kw["sampling"] = sampling
    return lambda persona: LLMConversation(gen, persona=persona, **kw)


def run(names=None, build: str = "instructions", history_turns="default", sampling=None, progress=None,
        generator=None, set_name: str = "own") -> tuple[list[Row], dict]:
    """Every question of the named personas of ``set_name`` (default: all of them) through LLMConversation's defaults
    (or the given ``history_turns``, ``sampling``); returns the rows and the summary."""
    make = load_llm(history_turns, sampling, generator)
    specs = load_set(set_name)
    rows, opening = [], {}
    for name in names or specs:
        spec = specs[name]
        llm = make(build_persona(spec, build))
        llm.warmup()
        opening[name] = len(llm.generator.encode_chat(llm.persona.opening(), add_generation_prompt=False))
        rs = run_persona(llm, spec, opening[name])
        rows += rs
        if progress:
            for r in rs:
                progress(r)
    return rows, summarize(rows, opening)


def _fmt(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="own", choices=list(SET_NOTES),
                    help="the personas: own (default), dev, or a held-apart one, heldout..heldout19 (bench/personas/<set>; the "
                         "held-apart ones never used to tune)")
    ap.add_argument("--persona", action="append", help="run only this persona of the set (repeatable; default: all)")
    ap.add_argument("--build", choices=["instructions", "facts"], default="instructions",
                    help="build the non-default personas from the client's instructions text (the server's path, "
                         "default) or from the facts table")
    ap.add_argument("--history-turns", default="default",
                    help="earlier exchanges shown to the model: an integer, 'all', or 'default' (LLMConversation's)")
    ap.add_argument("--temperature", type=float, help="sample at this temperature (default: LLMConversation's, greedy)")
    ap.add_argument("--repetition-penalty", type=float, default=1.0, help="with --temperature (0 = greedy with the penalty)")
    ap.add_argument("--seed", type=int, default=0, help="the sampler's seed, with --temperature")
    shown = ap.add_mutually_exclusive_group()
    shown.add_argument("--verbose", action="store_true", help="print the full reply (default: cut at 70 characters)")
    shown.add_argument("--quiet", action="store_true", help="print the figures only, no question or reply: a new held-apart "
                       "set's first run, whose failures should stay unread (bench/personas/README.md)")
    ap.add_argument("--json", metavar="FILE", help="also write the rows and the summary as JSON")
    args = ap.parse_args()
    ht = args.history_turns
    ht = "default" if ht == "default" else None if ht == "all" else int(ht)

    width = None if args.verbose else 70

    def show(r: Row):
        if args.quiet:
            return
        reply = r.reply if width is None or len(r.reply) <= width else r.reply[:width - 3] + "..."
        marks = ("ok " if r.ok else "BAD") + (" P" if r.parrot else "  ") + ("h" if r.held_out else " ")
        extra = f"  INVENTED {', '.join(r.invented)}" if r.invented else ""
        print(f"{r.persona:8s} {r.conversation}.{r.turn} {r.kind:6s} {marks} {r.question!r:46s} -> {reply!r}{extra}", flush=True)

    specs = load_set(args.set)
    for name in args.persona or []:
        if name not in specs:
            ap.error(f"no persona {name!r} in set {args.set} (it has: {', '.join(specs)})")
    print(f"set: {args.set}: {SET_NOTES[args.set]}; personas: {', '.join(args.persona or specs)}")
    if not args.quiet:
        print(f"{'persona':8s} c.t {'kind':6s} pass {'question':46s}    reply")
    sampling = None
    if args.temperature is not None:
        from decode import SamplingParams

        sampling = SamplingParams(temperature=args.temperature, repetition_penalty=args.repetition_penalty, seed=args.seed)
    rows, summary = run(args.persona, args.build, ht, sampling, progress=show, set_name=args.set)
    print()
    print(f"{'persona':8s} {'qs':>3s} {'fact acc':>8s} {'tuned':>6s} {'held':>6s} {'follow':>6s} {'off ok':>6s} {'repeats':>7s} "
          f"{'parrot':>6s} {'invented':>8s} {'opening tok':>11s} {'turn tok':>8s} {'reply ms':>8s}")
    for name, s in summary.items():
        print(f"{name:8s} {s['questions']:3d} {_fmt(s['fact_accuracy']):>8s} {_fmt(s['tuned_accuracy']):>6s} "
              f"{_fmt(s['held_out_accuracy']):>6s} {_fmt(s['follow_up_accuracy']):>6s} "
              f"{_fmt(s['off_topic_pass']):>6s} {s['repeated_replies']:7d} {s['parroting']:6d} {s['invented']:8d} "
              f"{s.get('opening_tokens', '-')!s:>11s} {s['turn_tokens_mean']:8.1f} {s['reply_ms_mean']:8.0f}")
    for g in [] if args.quiet else repeats(rows):
        print(f"repeated verbatim ({g[0].persona}): {g[0].reply!r} for " + ", ".join(repr(r.question) for r in g))
    for g in [] if args.quiet else shared(rows):
        print(f"shared, correct for each ({g[0].persona}): {g[0].reply!r} for " + ", ".join(repr(r.question) for r in g))
    a = summary["all"]
    verdict = (a["fact_accuracy"] >= 0.9 and a["repeat_groups"] == 0 and a["invented"] == 0
               and (a["off_topic_pass"] is None or a["off_topic_pass"] >= 0.9))
    print(f"\nset {args.set}: fact accuracy {a['fact_accuracy']:.2f} (bar >= 0.90), {a['invented']} replies with invented numbers "
          f"or names (bar: none), off-topic declined {_fmt(a['off_topic_pass'])} (bar >= 0.90), {a['repeated_replies']} replies "
          f"repeated verbatim across different questions (bar: none), {a['parroting']} parroting: {'PASS' if verdict else 'FAIL'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": [asdict(r) for r in rows], "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
