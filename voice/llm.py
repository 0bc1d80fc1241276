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

from collections.abc import Iterator
from dataclasses import dataclass, field

from decode import GREEDY, Generator, SamplingParams

DEFAULT_SYSTEM = (
    "You are the friendly phone assistant of Bright Bakery. Answer in one short sentence using these facts.\n"
    "Opening hours: 7 am to 6 pm, Tuesday to Sunday.\nMondays: closed.\nAddress: 12 Harbor Street.\n"
    "Sourdough loaf: 5 dollars.\nCroissant: 2 dollars.\nDelivery: free for orders over 30 dollars.\nOwner: Maria."
)
DEFAULT_EXAMPLES = (
    ("What are your hours?", "We are open from 7 am to 6 pm, Tuesday to Sunday."),
    ("How much is a croissant?", "A croissant costs 2 dollars."),
    ("Where can I find you?", "We are at 12 Harbor Street."),
    ("Do you deliver?", "Yes, delivery is free for orders over 30 dollars."),
)


class PersonaError(ValueError):
    """A persona file that cannot be used (reported in one line)."""


@dataclass(frozen=True, slots=True)
class Persona:
    system: str = DEFAULT_SYSTEM
    examples: tuple[tuple[str, str], ...] = DEFAULT_EXAMPLES

    @classmethod
    def from_file(cls, path) -> Persona:
        """A JSON file ``{"system": "...", "examples": [["question", "answer"], ...]}``."""
        import json
        from pathlib import Path

        try:
            data = json.loads(Path(path).read_text())
            system = data["system"]
            examples = tuple((str(q), str(a)) for q, a in data.get("examples", []))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PersonaError(f"bad persona file {path}: {exc} (expected {{\"system\": str, \"examples\": [[q, a], ...]}})") from None
        if not isinstance(system, str) or not system.strip():
            raise PersonaError(f"bad persona file {path}: 'system' must be a non-empty string")
        return cls(system=system, examples=examples)

    def opening(self) -> list[dict]:
        msgs = [{"role": "system", "content": self.system}]
        for q, a in self.examples:
            msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        return msgs


@dataclass
class LLMConversation:
    """A ``TokenStream`` over our numba decode core."""

    generator: Generator
    persona: Persona = field(default_factory=Persona)
    max_tokens: int = 48
    sampling: SamplingParams = GREEDY
    #: Earlier exchanges shown to the model (None = all).  A 135M model copies its previous
    #: answers when it sees many of them; one exchange keeps follow-ups working.
    history_turns: int | None = 1
    history: list[dict] = field(default_factory=list)  # every turn, as heard

    def __post_init__(self):
        self._opening = self.persona.opening()
        if not self.history:
            self.history = list(self._opening)
        self._sim0: float | None = None  # the sequence's simulated clock when the reply started

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
        """The messages the model sees: the opening and the last ``history_turns`` exchanges."""
        turns = self.history[len(self._opening):]
        if self.history_turns is not None:
            turns = turns[len(turns) - 2 * self.history_turns:] if self.history_turns else []
        return self._opening + turns

    def prepare(self) -> int:
        """Prefill what the next prompt will start with (the context up to the next user turn),
        so a turn only computes its own tokens; returns the tokens computed."""
        ids = self.generator.encode_chat(self.context(), add_generation_prompt=False)
        return self.generator.prefill(ids)

    def prompt_ids(self, user_text: str) -> list[int]:
        return self.generator.encode_chat(self.context() + [{"role": "user", "content": user_text}])

    def reply(self, user_text: str) -> Iterator[str]:
        """Text pieces of the answer; the first ``next()`` pays the prefill of the new tokens."""
        self._sim0 = self._sim_now()
        for piece in self.generator.stream(self.prompt_ids(user_text), max_tokens=self.max_tokens, sampling=self.sampling):
            if piece.text:
                yield piece.text

    def commit(self, user_text: str, spoken: str) -> None:
        """Record the turn as it was heard."""
        self.history += [{"role": "user", "content": user_text}, {"role": "assistant", "content": spoken.strip()}]

    def amend_last(self, spoken: str) -> None:
        """The last answer was heard only up to ``spoken`` (the client truncated it)."""
        if len(self.history) > len(self._opening) and self.history[-1]["role"] == "assistant":
            self.history[-1] = {"role": "assistant", "content": spoken.strip()}

    def reset(self) -> None:
        self.history = list(self._opening)
