"""The LLM stage: the decode core behind ``TokenStream``, holding the conversation.

The system prompt (a persona with the facts the answers must use) and a few example
exchanges open the conversation; ``warmup()`` prefills them once, so every turn only
prefills its own new tokens (the decode core's prefix KV cache keeps the rest).
``reply(user_text)`` streams the answer; ``commit(user_text, spoken)`` records what was
actually said (after a barge-in, only the part the user heard).

When the decode core runs on a simulated deployment (a staged model, whose sequences carry a
simulated clock), ``sim_elapsed_s()`` says how much simulated time the reply in progress has
taken so far, which the loop stamps beside its measured times.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from decode import GREEDY, Generator, SamplingParams
from decode.generate import common_prefix

from .guard import ReplyGuard, knowledge

# -- grounding: which facts answer a question -----------------------------------------------------------
# By meaning: sentence embeddings of the facts and of the question (voice.retrieval), not by shared words; the facts
# themselves are cut from what the operator wrote by voice.persona.  bench/retrieval.py measures it on personas and
# questions written apart from it (bench/personas/heldout).


def relevant_facts(facts, question: str, previous: str | None = None, most: int = 2,
                   min_score: float | None = None, name: str = "") -> list[tuple[str, str]]:
    """The facts that answer ``question`` (at most ``most``, best first; a follow-up leaning on ``previous`` is ranked
    with it too), none when no fact is near it in meaning (``min_score``, by default ``voice.retrieval.MIN_SCORE``);
    ``name``: the business's (``voice.retrieval.FactIndex``)."""
    facts = tuple(facts)
    if not facts:
        return []
    from .persona import subject
    from .retrieval import fact_index

    index = fact_index(tuple(_answer(k, v) for k, v in facts), tuple(subject(k, v) for k, v in facts), name)
    hits = index.search(question, previous) if min_score is None else index.search(question, previous, min_score, sure=min_score)
    return [facts[h.index] for h in hits][:most]


def _fact_text(key: str, value: str) -> str:
    value = value.strip().rstrip(".")
    if key.endswith("?"):  # a FAQ's answer after its question ("How much are tickets? Adults $28.")
        return f"{key} {value[:1].upper()}{value[1:]}."
    return f"{key}: {value}." if key else f"{value[:1].upper()}{value[1:]}."


_PRICE = re.compile(r"^(?:\$\s*\d|\d[\d.,]*\s*(?:dollars?|euros?|pounds?|cents?)\b)", re.I)


def _answer(key: str, value: str) -> str:
    """An example answer stating a fact (a FAQ's answer without its question)."""
    if not key or key.endswith("?"):
        return _fact_text("", value)
    value = value.strip().rstrip(".")
    from .retrieval import fact_types

    if "day" in fact_types(key):  # a key naming a day, "Saturday: 10 AM to 2 PM", is said as written ("The saturday is")
        return _fact_text(key, value)
    plural = key.endswith("s") and not key.endswith("ss")
    if _PRICE.match(value):
        verb = "cost" if plural else "costs"  # "The croissant is ..." went on about croissants
    else:
        verb = "are" if plural else "is"
    # no article before a gerund with an object ("Fixing a flat tire"), a determiner ("Most repairs", "Your hosts", "No
    # late fees": "The your hosts are ..." was said) or a possessive ("Everybody's favorite")
    the = "" if re.match(r"\w+ing\s+(?:a|an|the|your|my|our)\b|(?:a|an|the|most|all|some|any|every|each|no|our|my|your|"
                         r"his|her|their|its|this|that|these|those)\b|\w+'s\b", key, re.I) else "The "
    subject = key.lower() if the else key
    return f"{the}{subject} {verb} {value}."


_SUBJECT_IS = re.compile(r"^(?:the |our |a |an )?(?!(?:we|i|you|they|it|he|she|this|that|there)\b)([a-z][\w' -]{0,30}?) "
                         r"(?:is|are|costs?) (.+?)\.?$", re.I)
_OPEN_FROM = re.compile(r"^(?:we are|we're|the \w+ is|it is|it's) open (.+?)\.?$", re.I)


def _sentence_fact(sentence: str) -> tuple[str, str]:
    """A sentence as a fact: "The owner is Tom." -> ("Owner", "Tom"), "We are open from 9 am ..." ->
    ("Opening hours", "from 9 am ..."); others stay whole ("", ...)."""
    if m := _OPEN_FROM.match(sentence.strip()):
        return "Opening hours", m.group(1)
    if m := _SUBJECT_IS.match(sentence.strip()):
        key = m.group(1).strip()
        return key[:1].upper() + key[1:], m.group(2).strip()
    return "", sentence.strip().rstrip(".")


DEFAULT_NAME = "Bright Bakery"
DEFAULT_FACTS = (
    ("Opening hours", "7 am to 6 pm, Tuesday to Sunday"),
    ("Mondays", "closed"),
    ("Address", "12 Harbor Street"),
    ("Sourdough loaf", "5 dollars"),
    ("Croissant", "2 dollars"),
    ("Delivery", "free for orders over 30 dollars"),
    ("Owner", "Maria"),
)
#: How a grounded persona answers a question no fact answers (off-topic, or a fact the operator did not write): one
#: short sentence, said as it is (the model is not asked: a 135M model asked anyway invents the fact or loops on
#: itself), then ``decline(name)``'s offer of what it can help with.
DECLINE = "Sorry, I can't help with that"


def decline(name: str) -> str:
    """The whole decline of a persona named ``name``: one sentence."""
    return f"{DECLINE}, but I'm happy to answer questions about {name or 'us'}."


#: A social turn (thanks, a greeting, a goodbye, a bare yes or okay) is no question for the facts: it gets its set
#: reply, said as it is like a decline (before, "Thank you." was declined: "Sorry, I can't help with that").
_SOCIAL = {
    "thanks": ({"thank", "thanks", "cheers", "appreciate", "appreciated"}, "You're welcome!"),
    "bye": ({"bye", "goodbye", "farewell", "later"}, "Goodbye, have a nice day!"),
    "hello": ({"hi", "hello", "hey", "morning", "afternoon", "evening"}, "Hello! How can I help?"),
    "ack": ({"yes", "yeah", "yep", "ok", "okay", "sure", "great", "perfect", "cool", "alright", "fine", "no", "nope",
             "nothing", "that's"}, "Okay. Anything else I can help with?"),
}
#: words a social turn may also hold ("thank you so much", "that's all, bye", "good morning")
_SOCIAL_FILLER = {"you", "so", "much", "very", "a", "lot", "all", "it", "that", "is", "oh", "um", "uh", "and", "well", "good",
                  "please", "for", "your", "help", "then", "have", "nice", "day", "great", "see", "later", "there", "else",
                  "thats", "i", "think", "just", "wanted", "to", "say", "again"}
SOCIAL_REPLIES = frozenset(reply for _, reply in _SOCIAL.values())


def social_reply(user_text: str) -> str | None:
    """The set reply to a social turn ("Thanks!", "Hi there", "Okay, bye"), None for any other: one whose words are all
    social words or fillers and that is no question."""
    if "?" in user_text:
        return None
    words = re.findall(r"[a-z']+", user_text.lower())
    if not words or any(w not in _SOCIAL_FILLER and not any(w in ws for ws, _ in _SOCIAL.values()) for w in words):
        return None
    if "no" in words or "nope" in words:  # "no thanks": nothing more wanted
        return _SOCIAL["ack"][1] if not any(w in _SOCIAL["bye"][0] for w in words) else _SOCIAL["bye"][1]
    for key in ("bye", "thanks", "hello", "ack"):  # (a goodbye with thanks is a goodbye)
        words_of, reply = _SOCIAL[key]
        if any(w in words_of for w in words):
            return reply
    return None


def _example_decline(topic: str, name: str) -> str:
    """An example exchange's decline: worded as before issue 28, "I'm afraid I don't know about the weather, but ...";
    examples that declined with "Sorry, I can't ..." made the model deny facts it was given ("The delivery is not
    free.", bench/answers.py --set own)."""
    return f"I'm afraid I don't know about {topic}, but I can help with questions about {name}."


#: At most how many words of the best fact an answer starts with (``Persona.turn``).  8, not 4: a key of several words
#: ("The junior swim age 5 to 15 costs") was cut to its first two and the model went on with a number of its own
#: ("The junior swim age is 5 to 15 dollars."); on every set facts right the same or better (heldout 0.82 -> 0.84).
LEAD_WORDS = 8
_LEAD_VERB = re.compile(r"^(?:is|are|was|were|has|have|costs?|runs?|opens?|closes?|starts?|begins?|takes?|can|will|"
                        r"comes?|gets?|includes?|accepts?|offers?|sees?|serves?|delivers?|\w+'re|\w+'s)$", re.I)


def _lead(fact: str) -> str:
    """The words an answer is started with: the best fact's words up to its first verb ("The croissant costs", "We're",
    "Check-in begins"; at most ``LEAD_WORDS``, two when no verb comes, up to a clause mark), so that the model goes on
    with that fact rather than with the last example's answer ("Where are you?" answered with the head mechanic's
    name, bench/answers.py --set dev), a denial of it, or a word of its own ("The croissant is a classic ...")."""
    words = []
    for w in fact.split()[:LEAD_WORDS]:
        words.append(w)
        if w[-1:] in ",;:" or _LEAD_VERB.match(w):
            break
    else:
        words = words[:2]
    return " ".join(words).rstrip(",;:.!?")


def _rules(name: str) -> str:
    return (f"Answer in one short sentence with the fact given after the question. If no fact is given, say politely "
            f"that you can only help with questions about {name}.")


def grounded_system(name: str, facts, intro: str | None = None) -> str:
    """The system text of a grounded persona: who it is, the answer rule, then a "Facts:" list."""
    head = intro.strip() if intro and intro.strip() else f"You are the phone assistant of {name}."
    return "\n".join([f"{head} {_rules(name)}", "Facts:", *(f"- {_fact_text(k, v)}" for k, v in facts)])


DEFAULT_SYSTEM = grounded_system(DEFAULT_NAME, DEFAULT_FACTS)
#: The questions a grounded persona's examples are drawn from (each kept when one of the persona's
#: facts answers it), and the declined ones.  Every example answer restates its "Fact:" message
#: ("The owner is Maria."): answers worded freely ("We are at ...") were copied into later answers
#: ("We are at 5 dollars."), and an example the model answers last primes the next answer most, so
#: the examples end with a fact.
_EXAMPLE_QUESTIONS = ("What are your hours?", "Where can I find you?", "Who owns the place?", "How much does it cost?")
_N_FACT_EXAMPLES = 4
#: An example question's fact must be this near it (a wrong example teaches a wrong answer; "What are your hours?" is
#: not about a shuttle's timetable): above ``voice.retrieval.MIN_SCORE``.
EXAMPLE_MIN_SCORE = 0.4
_OFF_TOPIC_EXAMPLES = (("What's the weather like?", "the weather"), ("Tell me a joke.", "jokes"))


def grounded_examples(name: str, facts) -> tuple[tuple[str, str], ...]:
    """Example exchanges for a grounded persona: fact, decline, fact, decline, fact."""
    answers, used = [], set()
    for q in _EXAMPLE_QUESTIONS:
        if (found := relevant_facts(facts, q, most=1, min_score=EXAMPLE_MIN_SCORE, name=name)) and found[0] not in used:
            used.add(found[0])
            answers.append((q, _answer(*found[0])))
    keyed = [f for f in facts if f[0] and f not in used]
    keyed = [f for i, f in enumerate(keyed) if not any(g[0] == f[0] for g in keyed[:i])]  # (a FAQ's answer: its first fact)
    answers += [(k if k.endswith("?") else f"What about the {k.lower()}?", _answer(k, v))
                for k, v in keyed[: max(0, _N_FACT_EXAMPLES - len(answers))]]
    offs = [(q, _example_decline(topic, name)) for q, topic in _OFF_TOPIC_EXAMPLES]
    answers = answers[:_N_FACT_EXAMPLES]
    out = []
    for i, ex in enumerate(answers):
        out.append(ex)
        if i < len(answers) - 1 and i < len(offs):
            out.append(offs[i])
    return tuple(out) if len(answers) > 1 else tuple(offs) + tuple(answers)


#: The default persona's examples, written out (as ``grounded_examples`` drew them from the word table before issue 28):
#: importing this module loads no embedding model.
DEFAULT_EXAMPLES = (
    ("What are your hours?", "The opening hours are 7 am to 6 pm, Tuesday to Sunday."),
    ("What's the weather like?", _example_decline("the weather", DEFAULT_NAME)),
    ("Where can I find you?", "The address is 12 Harbor Street."),
    ("Tell me a joke.", _example_decline("jokes", DEFAULT_NAME)),
    ("Who owns the place?", "The owner is Maria."),
    ("How much does it cost?", "The sourdough loaf costs 5 dollars."),
)


class PersonaError(ValueError):
    """A persona file that cannot be used (reported in one line)."""


@dataclass(frozen=True, slots=True)
class Persona:
    """A system prompt and example exchanges; with ``facts`` it is *grounded*: each user turn is
    followed by a "Fact:" message carrying the facts that answer it (``relevant_facts``), and a turn
    no fact answers is answered with a decline (``DECLINE``), so the small model copies the right
    fact instead of choosing among them (or the last answer)."""

    system: str = DEFAULT_SYSTEM
    examples: tuple[tuple[str, str], ...] = DEFAULT_EXAMPLES
    #: (key, value) pairs ("" key: the value is a whole sentence); None: the default persona's facts
    #: when ``system`` is the default one, else none.
    facts: tuple[tuple[str, str], ...] | None = None
    name: str = ""

    def __post_init__(self):
        if self.facts is None:
            default = self.system == DEFAULT_SYSTEM
            object.__setattr__(self, "facts", DEFAULT_FACTS if default else ())
            if default and not self.name:
                object.__setattr__(self, "name", DEFAULT_NAME)
        else:
            object.__setattr__(self, "facts", tuple((str(k), str(v)) for k, v in self.facts))

    @property
    def grounded(self) -> bool:
        return bool(self.facts)

    @classmethod
    def from_facts(cls, name: str, facts, intro: str | None = None, examples=None) -> Persona:
        """A grounded persona from ``facts`` (a dict, or (key, value) pairs; a "" key makes the
        value a fact sentence): the system text lists them, and unless ``examples`` are given, the
        examples are the common questions one of the facts answers plus two declined ones."""
        facts = tuple((str(k).strip(), str(v).strip().rstrip(".")) for k, v in (facts.items() if isinstance(facts, dict) else facts))
        if not facts:
            raise PersonaError("a grounded persona needs at least one fact")
        if examples is None:  # (the default persona's own, written out: DEFAULT_EXAMPLES)
            examples = DEFAULT_EXAMPLES if (name, facts) == (DEFAULT_NAME, DEFAULT_FACTS) else grounded_examples(name, facts)
        return cls(system=grounded_system(name, facts, intro), examples=tuple((str(q), str(a)) for q, a in examples),
                   facts=facts, name=name)

    @classmethod
    def from_instructions(cls, text: str) -> Persona:
        """The persona for a Realtime client's free-text ``instructions``, split by ``voice.persona.split_instructions``:
        "key: value" lines and the sentences (or clauses) that state something become facts; the sentences saying who
        the assistant is and how to talk stay its introduction.  Text with no facts in it (or one fact sentence and no
        business named) stays a plain system prompt."""
        from .persona import business_name, split_instructions

        text = text.strip()
        # a grounded persona's own text comes back whole: its rule sentence and its "Facts:" heading are not repeated
        name = business_name(text)
        parsed = split_instructions(text.replace(_rules(name or "us"), ""))
        facts = [(k, v) if k else _sentence_fact(v) for k, v in parsed.facts]
        prose = [f for f, (k, _) in zip(facts, parsed.facts) if not k]
        if not facts or (len(facts) == len(prose) and len(prose) < 2 and not name):
            return cls(system=text, examples=(), facts=())
        intro = " ".join(" ".join([parsed.intro, *parsed.rules]).split())
        return cls.from_facts(name or "us", facts, intro=intro or None)

    @classmethod
    def from_file(cls, path) -> Persona:
        """A JSON file ``{"system": "...", "examples": [["question", "answer"], ...]}``, or a grounded
        one ``{"name": "...", "facts": {"key": "value", ...}}`` (optional "intro", "examples")."""
        import json
        from pathlib import Path

        try:
            data = json.loads(Path(path).read_text())
            examples = tuple((str(q), str(a)) for q, a in data.get("examples", []))
            if "facts" in data:
                facts = data["facts"]
                pairs = facts.items() if isinstance(facts, dict) else [tuple(f) for f in facts]
                return cls.from_facts(str(data.get("name") or "us"), [(k, v) for k, v in pairs], intro=data.get("intro"),
                                      examples=examples or None)
            system = data["system"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PersonaError(f"bad persona file {path}: {exc} (expected {{\"system\": str, \"examples\": [[q, a], ...]}} "
                               f"or {{\"name\": str, \"facts\": {{key: value}}}})") from None
        if not isinstance(system, str) or not system.strip():
            raise PersonaError(f"bad persona file {path}: 'system' must be a non-empty string")
        return cls(system=system, examples=examples)

    def turn(self, user_text: str, previous: str | None = None) -> tuple[list[dict], str]:
        """The messages of one user turn and the text the answer starts with: for a grounded persona the user's
        message, then a "Fact:" message with the facts that answer it (ranked by meaning, with the ``previous``
        question for a follow-up that leans on it: ``relevant_facts``); when none does, "Fact: none." and the whole
        answer is the decline (``decline``), which is said without asking the model; a social turn's is its set reply
        (``social_reply``), said so too."""
        if user_text is None:  # the conversation going on, no new question
            return [], ""
        msgs = [{"role": "user", "content": user_text}]
        if not self.grounded:
            return msgs, ""
        if (said := social_reply(user_text)) is not None:  # thanks, hello, bye, okay: its set reply
            return msgs + [{"role": "system", "content": "Fact: none."}], said
        chosen = relevant_facts(self.facts, user_text, previous, name=self.name)
        if not chosen:
            return msgs + [{"role": "system", "content": "Fact: none."}], self.decline
        shown = [_answer(k, v) for k, v in chosen]
        return msgs + [{"role": "system", "content": "Fact: " + " ".join(shown)}], _lead(shown[0])

    @property
    def decline(self) -> str:
        return decline(self.name)

    def knowledge_text(self) -> str:
        """Everything the operator gave this persona (the system text lists every fact): what a reply may state."""
        return f"{self.system} {self.name}"

    def opening(self) -> list[dict]:
        """The system text and the example exchanges; a grounded persona's example is shown as a turn is: the
        question, its "Fact:" message (the fact its answer states, or "none." for a declined one: not what the
        retrieval would find, which may be another fact than the answer's and would teach the model to answer past
        its fact), then the answer."""
        msgs = [{"role": "system", "content": self.system}]
        for q, a in self.examples:
            msgs.append({"role": "user", "content": q})
            if self.grounded:
                declined = a.startswith((DECLINE, "I'm afraid I don't know about"))
                msgs.append({"role": "system", "content": "Fact: none." if declined else f"Fact: {a}"})
            msgs.append({"role": "assistant", "content": a})
        return msgs


@dataclass(frozen=True, slots=True)
class Usage:
    """One reply's tokens: its whole prompt (``cached_tokens`` of them from the prefix cache) and what it generated."""

    input_tokens: int
    cached_tokens: int
    output_tokens: int

    def to_realtime(self) -> dict:
        """The ``usage`` object of a Realtime ``response.done`` (text tokens only: the audio is ours)."""
        return {"total_tokens": self.input_tokens + self.output_tokens, "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens,
                "input_token_details": {"cached_tokens": self.cached_tokens, "text_tokens": self.input_tokens, "audio_tokens": 0},
                "output_token_details": {"text_tokens": self.output_tokens, "audio_tokens": 0}}


@dataclass
class LLMConversation:
    """A ``TokenStream`` over our numba decode core."""

    generator: Generator
    persona: Persona = field(default_factory=Persona)
    max_tokens: int = 48
    sampling: SamplingParams = GREEDY
    #: Earlier exchanges shown to the model (None = all).  A 135M model copies its previous answer
    #: when it sees it ("Who is the owner?" after the address got the address): with a grounded
    #: persona, the facts a follow-up needs come with it (the previous question's, when it leans
    #: back on it), so none are shown (bench/answers.py: fact accuracy 0.98 and no repeated reply with
    #: none; with one, 0.92 and 9 replies repeating the previous answer, and 58 prompt tokens a turn, not 33).
    history_turns: int | None = 0
    history: list[dict] = field(default_factory=list)  # every turn, as heard
    last_usage: Usage | None = None  # the last reply's token counts
    #: the next reply's own instructions (a Realtime ``response.create``'s): for that reply only, the persona they
    #: make (``Persona.from_instructions``) opens the conversation instead of this one's; the KV cache's prefix then
    #: differs, so that reply prefills its opening (and the idle ``prepare()`` after it, this persona's again)
    instructions: str | None = None
    #: the local model calls no tools (``calls_tools`` is False): kept only so that every conversation has them
    tools: tuple[dict, ...] = ()
    tool_choice: str | dict | None = None

    def __post_init__(self):
        self._opening = self.persona.opening()
        if not self.history:
            self.history = list(self._opening)
        self._sim0: float | None = None  # the sequence's simulated clock when the reply started

    @property
    def n_ctx(self) -> int:
        return self.generator.n_ctx

    def close(self) -> None:
        """Free this conversation's sequence (its KV cache and scratch) on the decode core."""
        self.generator.close()

    @property
    def calls_tools(self) -> bool:
        return False

    def add_function_output(self, call_id: str, output: str) -> None:
        raise ValueError("the local model calls no tools, so there is no call to answer")

    def with_persona(self, persona: Persona) -> LLMConversation:
        """The same sequence of the decode core with ``persona``: the history starts afresh."""
        return LLMConversation(self.generator, persona=persona, max_tokens=self.max_tokens, sampling=self.sampling,
                               history_turns=self.history_turns)

    def _sim_now(self) -> float | None:
        sim = getattr(self.generator.state, "sim", None)  # a staged model's sequences carry one
        return None if sim is None else sim.now_s

    def sim_elapsed_s(self) -> float | None:
        """Simulated seconds the current (or last) reply has taken on the deployment; None when
        the decode core is not staged."""
        now = self._sim_now()
        if now is None:
            return None
        return 0.0 if self._sim0 is None else now - self._sim0

    def warmup(self) -> None:
        """Prefill the persona and examples (and compile/load the kernels)."""
        ids = self.generator.encode_chat(self.history, add_generation_prompt=False)
        for _ in self.generator.stream(ids, max_tokens=1, sampling=self.sampling):
            pass

    def context(self) -> list[dict]:
        """The messages the model sees: the persona's opening and the last ``history_turns`` exchanges."""
        return self._context(self._opening)

    def _context(self, opening: list[dict]) -> list[dict]:
        """``context()`` opened by ``opening`` (a reply's own instructions make another)."""
        turns = self.history[len(self._opening):]
        if self.history_turns is not None:
            turns = turns[len(turns) - 2 * self.history_turns:] if self.history_turns else []
        return opening + turns

    def scoring_context(self) -> list[dict]:
        """The end-of-turn score reads the user's text after this conversation's own context (whose prefix cache the
        answer then shares)."""
        return self.context()

    def prepare(self) -> int:
        """Prefill what the next prompt will start with (the context and the next user message's
        header, ``<|im_start|>user\n`` in ChatML: 3 tokens, ~5 ms at the persona's ~460 positions),
        so a turn only computes its own tokens; returns the tokens computed."""
        return self.generator.prefill(self.next_prefix())

    def next_prefix(self) -> list[int]:
        """The ids every next prompt starts with: those two different user messages after ``context()`` share."""
        context = self.context()
        a, b = (self.generator.encode_chat(context + [{"role": "user", "content": c}], add_generation_prompt=False)
                for c in ("a", "b"))
        return a[:common_prefix(a, b)]

    def opening_tokens(self, persona: Persona | None = None) -> int:
        """Tokens of ``persona``'s opening (this conversation's by default): its system text and examples."""
        opening = self._opening if persona is None else persona.opening()
        return len(self.generator.encode_chat(opening, add_generation_prompt=False))

    def prompt_tokens(self, user_text: str) -> int:
        """Tokens of the prompt that answers ``user_text`` (``prompt_ids``)."""
        return len(self._turn(user_text)[0])

    def _turn(self, user_text: str | None) -> tuple[list[int], str, Persona, str]:
        """The prompt's ids, forced start, the persona that answers and the facts shown with the question; earlier
        exchanges are left out, oldest first, until the prompt and the answer fit the context (the prompt alone may still
        not: ``stream`` then raises ContextLengthError)."""
        previous = next((m["content"] for m in reversed(self.history[len(self._opening):]) if m["role"] == "user"), None)
        persona = self.persona if self.instructions is None else Persona.from_instructions(self.instructions)
        opening = self._opening if persona is self.persona else persona.opening()
        msgs, start = persona.turn(user_text, previous)
        context = self._context(opening)
        tail = self.generator.tokenizer.encode(start) if start else []
        while True:
            ids = self.generator.encode_chat(context + msgs) + tail
            if len(ids) + self.max_tokens <= self.generator.n_ctx or len(context) <= len(opening):
                shown = msgs[-1]["content"] if len(msgs) > 1 and msgs[-1]["role"] == "system" else ""
                return ids, start, persona, shown.removeprefix("Fact: ").removesuffix("none.").strip()
            context = opening + context[len(opening) + 2:]

    def guard(self, persona: Persona, user_text: str | None, facts: str = "") -> ReplyGuard:
        """The reply's guard (``voice.guard``): names and words may be any that ``persona``'s text or the conversation
        (every turn as heard, and ``user_text``) contain; numbers only those of the conversation and of the ``facts``
        shown with the question (a grounded persona's; a plain one's whole text), so that a figure of the persona's is
        not said of another thing ("one lesson costs $500": $500 is the ten-lesson package's).  On anything else it
        says what the facts shown say, or that it does not know."""
        said = " ".join(str(m["content"]) for m in self.history[len(self._opening):])
        known = knowledge(persona.knowledge_text(), said, user_text or "")
        if persona.grounded:
            known.numbers = knowledge(facts, said, user_text or "").numbers
        if facts:
            fallback = f"Sorry, I'm not sure of that. What I can tell you: {facts}"
        else:
            fallback = "Sorry, I don't have that information." if persona.grounded else "Sorry, I'm not sure of that."
        return ReplyGuard(known, fallback)

    def prompt_ids(self, user_text: str) -> list[int]:
        """The whole prompt of the answer to ``user_text``: ``context()``, the user's message (with a
        grounded persona, the facts that answer it after it) and the answer's forced start, if any."""
        return self._turn(user_text)[0]

    def reply(self, user_text: str | None) -> Iterator[str]:
        """Text pieces of the answer; the first ``next()`` pays the prefill of the new tokens.  When it ends (or is
        closed), ``last_usage`` holds its token counts.  A grounded persona's decline is said as it is, without the model;
        every other answer goes through the reply's guard (``guard``), which holds each word until it is whole and stops
        the answer at a number, time, name or password the persona and the conversation do not contain (or at a
        repeat), so the phrases cut from what it yields were all checked."""
        self._sim0 = self._sim_now()
        ids, start, persona, facts = self._turn(user_text)
        self.instructions = None  # (one reply's)
        cached = min(common_prefix(self.generator.cached, ids), len(ids) - 1)
        out = 0
        try:
            if persona.grounded and (start == persona.decline or start in SOCIAL_REPLIES):
                yield start
                return
            guard = self.guard(persona, user_text, facts)
            if start and (text := guard.feed(start)):
                yield text
            for piece in self.generator.stream(ids, max_tokens=self.max_tokens, sampling=self.sampling):
                out += piece.token_id >= 0
                if piece.text and (text := guard.feed(piece.text)):
                    yield text
                if guard.stopped:
                    break
            if text := guard.finish(cut=out >= self.max_tokens):  # (at the token limit: a half word is not said)
                yield text
        finally:
            self.last_usage = Usage(input_tokens=len(ids), cached_tokens=max(0, cached), output_tokens=out)

    def commit(self, user_text: str | None, spoken: str) -> None:
        """Record the turn as it was heard (``user_text`` None: an answer of the agent's own, the idle prompt)."""
        if user_text is not None:
            self.history.append({"role": "user", "content": user_text})
        self.history.append({"role": "assistant", "content": spoken.strip()})

    def amend_last(self, spoken: str) -> None:
        """The last answer was heard only up to ``spoken`` (the client truncated it)."""
        if len(self.history) > len(self._opening) and self.history[-1]["role"] == "assistant":
            self.history[-1] = {"role": "assistant", "content": spoken.strip()}

    def reset(self) -> None:
        self.history = list(self._opening)
