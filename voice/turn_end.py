"""End of turn: P(the user's turn is over) from the text heard so far, and the silence to wait for it.

The score comes from the decode core itself.  The chat model ends a user message with its
end-of-message token (``<|im_end|>`` for SmolLM2); after the user's text in the chat template, the
probability it gives that token is how sure it is that nothing more follows.  Text turn detectors
work this way (LiveKit's first English one was a fine-tuned SmolLM2-135M).  Scoring runs on the
conversation's own generator and brings its KV cache up to the end of the user's text, which is the
prefix of the answer's prompt: a speculative answer started after it computes only the few tokens
that open the assistant's turn.

Zero-shot, that probability separates questions from fragments but not statements from fragments
(2026-12-03, default model and persona): "What time do you open tomorrow morning?" 0.76,
"I'd like to order" < 0.001, but "Thank you." 0.002 and "Yes." 0.024.  So it is one feature of a
small logistic head, trained by ``voice.turn_end_train`` on a generated, labelled set (complete
utterances, and the same cut at word boundaries, with and without ASR-style punctuation) over the
model's final hidden state at the end of the user's text.  The head is tied to the model it was
trained on (``model_key``); for another model the raw probability is used, with thresholds of its own.

``TurnEndPolicy`` turns a score into the silence that closes the turn (a sans-I/O rule: no clock),
by eagerness, as OpenAI's ``semantic_vad`` names it: a confident end closes after a short silence, an
unfinished turn waits up to about a second, anything else waits the plain silence.
"""

from __future__ import annotations

import hashlib
import re
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from . import head_file

#: The head trained for the default model (``python -m voice.turn_end_train`` writes it).
HEAD_PATH = Path(__file__).with_name("turn_end_head.npz")


def model_key(model) -> str:
    """What a head is tied to: the architecture's shape and a digest of the output norm's weights."""
    cfg = model.config
    digest = hashlib.sha256(np.ascontiguousarray(model.weights.output_norm).tobytes()).hexdigest()[:16]
    return f"{cfg.n_layers}x{cfg.d_model}/{cfg.vocab_size}/{digest}"


@dataclass(frozen=True, slots=True)
class TurnEndHead(head_file.HeadFile):
    """Logistic regression over ``[hidden (d_model), log P(end token)]``, standardized (its file: ``voice.head_file``)."""

    TIE: ClassVar[str] = "model_key"
    WHAT: ClassVar[str] = "turn-end head"

    weights: np.ndarray  # (d_model + 1,) f64
    bias: float
    mean: np.ndarray  # (d_model + 1,)
    scale: np.ndarray  # (d_model + 1,)
    model_key: str
    info: dict  # how it was trained and how it scored (for reports)

    def p_end(self, features: np.ndarray) -> float:
        return self.probability(features)


def scoring_context(llm) -> list[dict]:
    """The conversation the end-of-turn score reads the user's text after: the LLM's own context (whose prefix cache
    the answer then shares), or with a backend only the persona's opening (the local model is just the scorer)."""
    return llm.scoring_context()


@dataclass(frozen=True, slots=True)
class TurnEndScore:
    p_end: float  # P(the turn is over): the head's, or the raw token probability without one
    p_token: float  # the model's raw P(end-of-message token)
    source: str  # "head" or "zero-shot"


class TurnEndScorer:
    """Scores user text against a conversation on its generator (whose prefix cache is used and left
    at the end of the user's text).  ``head`` None: zero-shot."""

    def __init__(self, generator, head: TurnEndHead | None = None):
        self.generator = generator
        self.end_id = end_token(generator)
        self.head = head

    @classmethod
    def for_model(cls, generator, path: Path = HEAD_PATH) -> TurnEndScorer:
        """With the committed head when it was trained on this generator's model, else zero-shot."""
        head = None
        if path.is_file():
            head = TurnEndHead.load(path)
            if head.model_key != model_key(generator.model):
                head = None
        return cls(generator, head)

    def prefix_ids(self, context, text: str) -> list[int]:
        text = normalize(text)
        """The conversation with ``text`` as the user's message, up to (not including) its end token."""
        ids = self.generator.encode_chat(list(context) + [{"role": "user", "content": text}], add_generation_prompt=False)
        last = len(ids) - 1 - ids[::-1].index(self.end_id)
        return ids[:last]

    def features(self, context, text: str) -> tuple[np.ndarray, float]:
        """The head's input for ``text`` after ``context``, and the raw P(end token)."""
        logits = self.generator.logits_after(self.prefix_ids(context, text)).astype(np.float64)
        hidden = self.generator.last_hidden().astype(np.float64)
        logp = logits - logits.max()
        logp -= np.log(np.exp(logp).sum())
        lp_end = float(logp[self.end_id])
        return np.concatenate([hidden, [lp_end]]), float(np.exp(lp_end))

    def score(self, context, text: str) -> TurnEndScore:
        feats, p_token = self.features(context, text)
        if self.head is None:
            return TurnEndScore(p_end=p_token, p_token=p_token, source="zero-shot")
        return TurnEndScore(p_end=self.head.p_end(feats), p_token=p_token, source="head")

    def submit(self, context, text: str) -> Future:
        """``score`` as a future: on the decode core's compute thread when the generator's model runs on one (the
        caller goes on meanwhile; the generator's other uses wait for it), else computed now."""
        from decode.batching import BatchingModel

        model = self.generator.model
        if not isinstance(model, BatchingModel):
            done: Future = Future()
            done.set_result(self.score(context, text))
            return done
        return self.generator.run_aside(model.compute.submit, self.score, list(context), text)

    def p_end(self, context, text: str) -> float:
        return self.score(context, text).p_end


def normalize(text: str) -> str:
    """The user's text as scored: without a closing period, which an ASR writes at a pause whether
    the turn is over or not ("I'd like to order." is a fragment).  A comma, an ellipsis or a dash
    stays (Whisper writes them where the voice goes on: "Can I get a sourdough loaf," is not over),
    and so does a question or exclamation mark."""
    t = text.strip()
    if t.endswith(".") and not t.endswith(".."):
        t = t[:-1].rstrip()
    return t or text.strip()


def end_token(generator) -> int:
    """The token the template puts right after a user message's text: the last stop token of a
    rendered one-message conversation."""
    ids = generator.encode_chat([{"role": "user", "content": "Hello."}], add_generation_prompt=False)
    for t in reversed(ids):
        if t in generator.tokenizer.stop_ids:
            return int(t)
    raise ValueError("the chat template ends a user message with no stop token: no end-of-turn score")


# -- the policy ---------------------------------------------------------------------------------

#: Silences (ms) by eagerness: (confident end, anything else, unfinished).  ``auto`` is ``medium``.  The middle one
#: is long too: a pause inside a turn (a number read in groups, "um", a list, a name spelled) lasts up to 800 ms, and
#: an unsure score is as often such a turn ("My number is 555." 0.2) as a finished one; webrtcvad puts the last voiced
#: sample of a soft ending up to ~150 ms before it ends, so medium's middle wait is 1000 ms: dictation is never closed
#: at a pause of 800 ms or less unless the head is sure the turn is over (and never when it ends on a number or a
#: spelled letter: ``dictating``).  high is the eager setting (OpenAI's): it may.
EAGERNESS = {
    "high": (160, 500, 700),
    "medium": (200, 1000, 1200),
    "low": (300, 1200, 1500),
}

_NUMBER_WORDS = set("zero oh one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
                    "sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred "
                    "thousand".split())


#: "one" after these is a pronoun ("No, the other one.", "I'll take that one.").
_ONE_AS_PRONOUN = frozenset("the that this other which each every any no another same big small last first next new old "
                            "blue red green white black right left cheaper bigger smaller".split())


#: Words that hold the floor while the speaker looks something up or makes up their mind: what follows them is the turn
#: ("Let me think, I'll take the rye.", "Hold on, my card number is ..."); the issue names "let me think" beside dictation.
_HOLDING = re.compile(r"\b(?:let me (?:think|see|check|look|find)(?: (?:about )?(?:it|that|this))?|give me (?:a|one) "
                      r"(?:sec|second|moment|minute)|(?:just|wait|hang on|hold on) a (?:sec|second|moment|minute)|hold on|"
                      r"hang on|one (?:sec|second|moment)|bear with me)$")


def dictating(text: str) -> bool:
    """The heard text stops where dictation goes on: after a number ("My number is 555 1234", "twelve"), a letter
    spelled ("K, O, W"), a comma, or words that hold the floor ("Let me think about it.", "Hold on."); a question mark
    (Whisper heard a question's rise) is not dictation."""
    t = text.strip()
    if not t or t.endswith("?"):
        return False
    if t.endswith(","):
        return True
    if _HOLDING.search(" ".join(re.sub(r"[^a-z' ]", " ", t.lower()).split())):
        return True
    words = t.rstrip(".!;:-").split()
    word = (words[-1:] or [""])[0].strip("\"'()").lower()
    if word == "one" and len(words) > 1 and words[-2].strip(",").lower() in _ONE_AS_PRONOUN:
        return False  # "the other one", "that one": a pronoun, not a digit read out
    letters = word.replace(".", "")
    spelled = "-" in letters and all(len(x) == 1 and x.isalpha() for x in letters.split("-"))  # "O-W-A-L-S-K-I"
    return bool(word) and (any(c.isdigit() for c in word) or word in _NUMBER_WORDS or spelled
                           or (len(letters) == 1 and letters.isalpha() and letters not in ("a", "i")))


@dataclass(frozen=True, slots=True)
class Decision:
    stop_ms: int  # the silence after the last voiced sample that closes the turn
    rule: str  # "confident", "short", "dictation", "unsure", "unfinished"


@dataclass(frozen=True, slots=True)
class TurnEndPolicy:
    """A score and the words heard in, the silence to wait out.  ``confident``/``unfinished``:
    thresholds on ``p_end`` (the head's; a zero-shot score has its own, ``ZERO_SHOT_THRESHOLDS``).

    A confident end on fewer than ``min_words`` words waits the middle silence instead (rule
    "short"): a turn often opens with one word and a comma's pause ("Hi, what time do you open?",
    "Sorry, who owns it?"), which heard alone is a whole greeting.  So does one that stops on a number, a spelled
    letter, a comma or words that hold the floor (rule "dictation", ``dictating``): "My number is 555," is as often half a number as a whole
    one."""

    eagerness: str = "medium"
    #: 0.6, not 0.5: on the trainer's held-out texts 0.6 closes 92% of complete turns early and 4.2%
    #: of unfinished ones (0.5: 95% and 6.6%); with a cut-off counted as three late answers (the
    #: user is answered over and then repeats), 0.6 costs least of 0.2-0.7 (``turn_end_train``)
    confident: float = 0.6
    unfinished: float = 0.2
    min_words: int = 2
    #: the rule "dictation" (``dictating``) on
    dictation: bool = True
    #: (confident, middle, unfinished) silences in place of ``EAGERNESS[eagerness]`` (None: those)
    waits: tuple[int, int, int] | None = None

    def __post_init__(self) -> None:
        if self.eagerness not in EAGERNESS:
            raise ValueError(f"eagerness must be one of {', '.join(EAGERNESS)} or auto, got {self.eagerness!r}")
        if not 0.0 <= self.unfinished <= self.confident <= 1.0:
            raise ValueError(f"need 0 <= unfinished <= confident <= 1, got {self.unfinished}, {self.confident}")

    @classmethod
    def named(cls, eagerness: str = "auto", **kw) -> TurnEndPolicy:
        return cls(eagerness="medium" if eagerness == "auto" else eagerness, **kw)

    @property
    def silences(self) -> tuple[int, int, int]:
        return self.waits or EAGERNESS[self.eagerness]

    @property
    def max_stop_ms(self) -> int:
        return self.silences[2]

    @property
    def waiting_ms(self) -> int:
        """The silence that closes a turn whose score is not known yet (the middle one)."""
        return self.silences[1]

    def decide(self, score: TurnEndScore, text: str = "") -> Decision:
        short, mid, long = self.silences
        confident, unfinished = (self.confident, self.unfinished) if score.source == "head" else ZERO_SHOT_THRESHOLDS
        if score.p_end >= confident:
            if len(text.split()) < self.min_words:
                return Decision(mid, "short")
            if self.dictation and dictating(text):
                return Decision(mid, "dictation")
            return Decision(short, "confident")
        if score.p_end < unfinished:
            return Decision(long, "unfinished")
        return Decision(mid, "unsure")


#: Without a head: questions score 0.5-0.8, fragments < 0.001, statements anywhere from 0.002 up,
#: so only a likely question closes early and only a near-zero score waits long.
ZERO_SHOT_THRESHOLDS = (0.3, 0.001)
