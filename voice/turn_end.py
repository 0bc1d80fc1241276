"""P(the user's turn is over), from the text heard so far, with the decode core itself.

The chat model ends a user message with its end-of-message token (``<|im_end|>`` for
SmolLM2).  After the user's text in the chat template, the probability it gives that token is
how sure it is that nothing more follows: text turn detectors work this way (LiveKit's first
English one was a fine-tuned SmolLM2-135M).  Ours is zero-shot, on the conversation's own
generator: scoring brings the KV cache up to the end of the user's text, which is the prefix
of the answer's prompt, so a speculative answer started after it computes only the few tokens
that open the assistant's turn.

Measured zero-shot on the default model (2026-12-03, system line only, Whisper-style
punctuation): questions 0.51-0.83 ("What time do you open tomorrow morning?" 0.76); fragments
("I'd like to order", "my number is five five five", "so, um,", "What time do you") below 0.001;
but short statements are low too ("Thank you." 0.002, "Yes." 0.024): a threshold alone would
make them wait, so the policy that uses this score needs calibration (see the issue notes).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from decode import Generator


class TurnEndScorer:
    """Scores user text against a conversation's context on ``generator`` (its prefix cache is
    used and left at the end of the user's text)."""

    def __init__(self, generator: Generator):
        self.generator = generator
        self.end_id = self._end_token()

    def _end_token(self) -> int:
        """The token the template puts right after a user message's text: the last stop token of
        a rendered one-message conversation."""
        g = self.generator
        ids = g.encode_chat([{"role": "user", "content": "Hello."}], add_generation_prompt=False)
        for t in reversed(ids):
            if t in g.tokenizer.stop_ids:
                return int(t)
        raise ValueError("the chat template ends a user message with no stop token: no end-of-turn score")

    def prefix_ids(self, context: Sequence[dict], text: str) -> list[int]:
        """The conversation with ``text`` as the user's message, up to (not including) its end token."""
        ids = self.generator.encode_chat(list(context) + [{"role": "user", "content": text}], add_generation_prompt=False)
        last = len(ids) - 1 - ids[::-1].index(self.end_id)
        return ids[:last]

    def score(self, context: Sequence[dict], text: str) -> float:
        """P(end of message | context, the user's ``text``), in [0, 1]."""
        logits = self.generator.logits_after(self.prefix_ids(context, text)).astype(np.float64)
        p = np.exp(logits - logits.max())
        return float(p[self.end_id] / p.sum())
