"""Answer quality of the LLM stage: does each reply carry the fact the question asks for?

    .venv/bin/python bench/answers.py [--persona NAME ...] [--build instructions|facts]
                                      [--history-turns N|all] [--temperature T] [--repetition-penalty R]
                                      [--verbose] [--json FILE]

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

Printed: one row per question (persona, conversation.turn, kind, pass, P = parroting, h = held
out, question, reply), then per persona and overall: fact accuracy (fact questions passed / fact
questions; the bar is >= 0.90), split into the tuned and the held-out questions and the follow-ups;
off-topic pass rate; verbatim repeats: identical replies, within one persona, to questions about
different facts (every off-topic question is its own fact), unless that one reply passes each of
them (printed as "shared": one fact sentence answering two questions); the bar is none; parroting
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


def off(topic: str, text: str) -> Q:
    return Q(text, f"off:{topic}")


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


# -- Bright Bakery: the default persona (voice/llm.py) ------------------------------------------------

_B_OPEN, _B_CLOSE, _B_DAYS = r"\b7\b|seven", r"\b6\b|six", r"tuesday"
_B_MON, _B_ADDR, _B_OWNER = r"\bclosed\b|not open|\bno\b", r"harbou?r", r"maria"
_B_CROIS, _B_SOUR, _B_DELIV = r"\b2\b|two", r"\b5\b|five", r"\b30\b|thirty"

BAKERY = PersonaSpec("bakery", "Bright Bakery", facts={}, instructions=None, conversations=(
    (Q("Where are you located?", "address", _B_ADDR),
     Q("Who is the owner?", "owner", _B_OWNER),
     Q("What time do you open?", "hours", _B_OPEN),
     Q("How much is a croissant?", "croissant", _B_CROIS),
     Q("And a sourdough loaf?", "sourdough", _B_SOUR)),
    (Q("What's your address?", "address", _B_ADDR),
     Q("Who runs the bakery?", "owner", _B_OWNER),
     Q("When do you close in the evening?", "hours", _B_CLOSE),
     Q("Are you open on Mondays?", "mondays", _B_MON),
     Q("Do you do deliveries?", "delivery", _B_DELIV),
     Q("Is it free?", "delivery", _B_DELIV),
     Q("What does the sourdough cost?", "sourdough", _B_SOUR)),
    (off("weather", "What's the weather like today?"),
     off("joke", "Can you tell me a joke?"),
     Q("OK. What time do you open tomorrow morning?", "hours", _B_OPEN),
     off("capital", "What is the capital of France?"),
     Q("Which days of the week are you open?", "hours", _B_DAYS)),
    (Q("Hi, what time do you open tomorrow morning?", "hours", _B_OPEN),
     Q("Where exactly is the bakery?", "address", _B_ADDR),
     Q("How much for one croissant?", "croissant", _B_CROIS),
     Q("Who owns Bright Bakery?", "owner", _B_OWNER),
     off("football", "Who won the football game last night?"),
     Q("Is delivery free?", "delivery", _B_DELIV)),
), held_out=(
    (Q("How late are you open?", "hours", _B_CLOSE),
     Q("Can I come by on a Monday?", "mondays", _B_MON),
     Q("What's the price of a croissant?", "croissant", _B_CROIS),
     Q("How much do you charge for a loaf of sourdough?", "sourdough", _B_SOUR)),
    (Q("Where's the shop?", "address", _B_ADDR),
     Q("Who's the boss there?", "owner", _B_OWNER),
     off("weather", "Tell me about the weather tomorrow."),
     Q("Can you deliver a cake to my house?", "delivery", _B_DELIV),
     off("arithmetic", "What's two plus two?")),
))

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
_D_OPEN, _D_CLOSE, _D_WEEKEND = r"\b8\b|eight", r"\b5\b|five", r"\bclosed\b|not open|\bno\b"
_D_ADDR, _D_DOC, _D_CLEAN, _D_WHITE = r"\belm\b", r"patel", r"\b90\b|ninety", r"\b250\b"
_D_NEW, _D_PARK = r"free|welcome", r"free|behind"

DENTIST = PersonaSpec("dentist", "Clearview Dental", facts=DENTIST_FACTS, instructions=DENTIST_INSTRUCTIONS, conversations=(
    (Q("Where is your office?", "address", _D_ADDR),
     Q("Who is the dentist?", "dentist", _D_DOC),
     Q("How much is a cleaning?", "cleaning", _D_CLEAN),
     Q("And teeth whitening?", "whitening", _D_WHITE)),
    (Q("What time do you open?", "hours", _D_OPEN),
     Q("Are you open on Saturday?", "weekends", _D_WEEKEND),
     Q("Can I park there?", "parking", _D_PARK),
     Q("Do you take new patients?", "new", _D_NEW),
     Q("What's the address?", "address", _D_ADDR)),
    (off("movie", "Can you recommend a good movie?"),
     Q("When do you close?", "hours", _D_CLOSE),
     off("president", "Who is the president of the United States?"),
     Q("What does whitening cost?", "whitening", _D_WHITE),
     Q("Can I do it on a Saturday?", "weekends", _D_WEEKEND),
     Q("What's the dentist's name?", "dentist", _D_DOC)),
), held_out=(
    (Q("What are your opening hours?", "hours", _D_OPEN),
     Q("Is there somewhere to park?", "parking", _D_PARK),
     Q("How much does a teeth cleaning cost?", "cleaning", _D_CLEAN),
     Q("Can I come in on Sunday?", "weekends", _D_WEEKEND),
     off("cat", "What's a good name for a cat?"),
     Q("Who will I see there?", "dentist", _D_DOC)),
))

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
_K_OPEN, _K_CLOSE, _K_SUN = r"\b10\b|ten", r"\b7\b|seven", r"\bclosed\b|not open|\bno\b"
_K_ADDR, _K_OWNER, _K_FLAT = r"\bmill\b", r"\btom\b", r"\b15\b|fifteen"
_K_TUNE, _K_RENT, _K_TIME = r"\b60\b|sixty", r"\b20\b|twenty", r"same day|today"

BIKES = PersonaSpec("bikes", "Rapid Wheels", facts=BIKES_FACTS, instructions=BIKES_INSTRUCTIONS, conversations=(
    (Q("Where is the shop?", "address", _K_ADDR),
     Q("Who is the owner?", "owner", _K_OWNER),
     Q("How much to fix a flat tire?", "flat", _K_FLAT),
     Q("And a tune-up?", "tuneup", _K_TUNE),
     Q("How long does that take?", "time", _K_TIME)),
    (Q("What time do you open?", "hours", _K_OPEN),
     Q("Are you open on Sunday?", "sundays", _K_SUN),
     Q("Can I rent a bike?", "rental", _K_RENT),
     Q("How long does a repair take?", "time", _K_TIME),
     Q("Who runs the shop?", "owner", _K_OWNER)),
    (off("recipe", "Do you know a good pasta recipe?"),
     Q("What's your address?", "address", _K_ADDR),
     off("song", "Can you sing me a song?"),
     Q("When do you close?", "hours", _K_CLOSE),
     Q("What does a full tune-up cost?", "tuneup", _K_TUNE)),
), held_out=(
    (Q("Where are you?", "address", _K_ADDR),
     Q("How much is a bike rental for a day?", "rental", _K_RENT),
     Q("Is the shop open on Sunday?", "sundays", _K_SUN),
     Q("Who's in charge of the shop?", "owner", _K_OWNER),
     Q("When can I pick up my bike after a repair?", "time", _K_TIME),
     off("football", "What's the best football team?")),
))

SPECS = {s.name: s for s in (BAKERY, DENTIST, BIKES)}


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


def run_persona(llm, spec: PersonaSpec, opening_tokens: int) -> list[Row]:
    rows = []
    convs = [(c, False) for c in spec.conversations] + [(c, True) for c in spec.held_out]
    for ci, (conv, held_out) in enumerate(convs, 1):
        llm.reset()
        for ti, q in enumerate(conv, 1):
            n = len(llm.prompt_ids(q.text)) - opening_tokens
            t = time.perf_counter()
            reply = spoken_reply(llm, q.text)
            ms = (time.perf_counter() - t) * 1000
            llm.commit(q.text, reply)
            kind = "off" if q.off_topic else ("follow" if ti > 1 else "fact")
            rows.append(Row(spec.name, ci, ti, kind, q.fact, q.text, reply, check(q, reply), parrots(q.text, reply), n, ms,
                            held_out))
    return rows


def _same_reply(rows: list[Row]) -> list[list[Row]]:
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
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
        generator=None) -> tuple[list[Row], dict]:
    """Every question of the named personas (default: all) through LLMConversation's defaults (or
    the given ``history_turns``, ``sampling``); returns the rows and the summary."""
    make = load_llm(history_turns, sampling, generator)
    rows, opening = [], {}
    for name in names or SPECS:
        spec = SPECS[name]
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
    ap.add_argument("--persona", action="append", choices=list(SPECS), help="run only this persona (repeatable; default: all)")
    ap.add_argument("--build", choices=["instructions", "facts"], default="instructions",
                    help="build the non-default personas from the client's instructions text (the server's path, "
                         "default) or from the facts table")
    ap.add_argument("--history-turns", default="default",
                    help="earlier exchanges shown to the model: an integer, 'all', or 'default' (LLMConversation's)")
    ap.add_argument("--temperature", type=float, help="sample at this temperature (default: LLMConversation's, greedy)")
    ap.add_argument("--repetition-penalty", type=float, default=1.0, help="with --temperature (0 = greedy with the penalty)")
    ap.add_argument("--seed", type=int, default=0, help="the sampler's seed, with --temperature")
    ap.add_argument("--verbose", action="store_true", help="print the full reply (default: cut at 70 characters)")
    ap.add_argument("--json", metavar="FILE", help="also write the rows and the summary as JSON")
    args = ap.parse_args()
    ht = args.history_turns
    ht = "default" if ht == "default" else None if ht == "all" else int(ht)

    width = None if args.verbose else 70

    def show(r: Row):
        reply = r.reply if width is None or len(r.reply) <= width else r.reply[:width - 3] + "..."
        marks = ("ok " if r.ok else "BAD") + (" P" if r.parrot else "  ") + ("h" if r.held_out else " ")
        print(f"{r.persona:8s} {r.conversation}.{r.turn} {r.kind:6s} {marks} {r.question!r:46s} -> {reply!r}", flush=True)

    print(f"{'persona':8s} c.t {'kind':6s} pass {'question':46s}    reply")
    sampling = None
    if args.temperature is not None:
        from decode import SamplingParams

        sampling = SamplingParams(temperature=args.temperature, repetition_penalty=args.repetition_penalty, seed=args.seed)
    rows, summary = run(args.persona, args.build, ht, sampling, progress=show)
    print()
    print(f"{'persona':8s} {'qs':>3s} {'fact acc':>8s} {'tuned':>6s} {'held':>6s} {'follow':>6s} {'off ok':>6s} {'repeats':>7s} "
          f"{'parrot':>6s} {'opening tok':>11s} {'turn tok':>8s} {'reply ms':>8s}")
    for name, s in summary.items():
        print(f"{name:8s} {s['questions']:3d} {_fmt(s['fact_accuracy']):>8s} {_fmt(s['tuned_accuracy']):>6s} "
              f"{_fmt(s['held_out_accuracy']):>6s} {_fmt(s['follow_up_accuracy']):>6s} "
              f"{_fmt(s['off_topic_pass']):>6s} {s['repeated_replies']:7d} {s['parroting']:6d} "
              f"{s.get('opening_tokens', '-')!s:>11s} {s['turn_tokens_mean']:8.1f} {s['reply_ms_mean']:8.0f}")
    for g in repeats(rows):
        print(f"repeated verbatim ({g[0].persona}): {g[0].reply!r} for " + ", ".join(repr(r.question) for r in g))
    for g in shared(rows):
        print(f"shared, correct for each ({g[0].persona}): {g[0].reply!r} for " + ", ".join(repr(r.question) for r in g))
    a = summary["all"]
    verdict = a["fact_accuracy"] >= 0.9 and a["repeat_groups"] == 0
    print(f"\nfact accuracy {a['fact_accuracy']:.2f} (bar >= 0.90), {a['repeated_replies']} replies repeated verbatim across "
          f"different questions (bar: none), {a['parroting']} parroting, off-topic pass {_fmt(a['off_topic_pass'])}: "
          f"{'PASS' if verdict else 'FAIL'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": [asdict(r) for r in rows], "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
