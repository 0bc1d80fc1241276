"""Streaming generation with a prefix KV cache: the conversation's earlier tokens stay computed.

``Generator.stream(prompt_ids, ...)`` compares the prompt with the tokens already in
the KV cache, prefills only the new suffix in one pass, then decodes token by token,
yielding ``Piece``s (token id + the text it completes).  When the stream ends,
``Generator.last`` holds the figures of that call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from .chat import ChatTemplate
from .errors import ClosedError, ContextLengthError
from .model import Model
from .sampling import GREEDY, Sampler, SamplingParams
from .tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class Piece:
    token_id: int
    text: str  # may be "" (a control token, or half of a UTF-8 character)


@dataclass(frozen=True, slots=True)
class GenerationStats:
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]  # generated, without the stop token
    text: str
    finish_reason: str  # "stop" | "length" | "context_full"
    cached_tokens: int  # prompt tokens whose KV came from the prefix cache
    prefill_ms: float  # prefill of the new prompt tokens up to the first logits
    first_token_ms: float  # prefill + first sampling
    decode_ms: float  # from the first token to the end
    decode_tokens: int  # single-token forward passes in decode_ms

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / (self.decode_ms / 1000) if self.decode_ms > 0 else 0.0

    @property
    def prefill_tok_s(self) -> float:
        n = len(self.prompt_ids) - self.cached_tokens
        return n / (self.prefill_ms / 1000) if self.prefill_ms > 0 else 0.0


def end_reason(generated: int, max_tokens: int, in_context: int, n_ctx: int) -> str | None:
    """Why generation ends after a kept token (None: it goes on): ``max_tokens`` are out
    ("length"), or the sequence's ``in_context`` tokens (prompt and earlier output, before the
    new token is fed back) leave no room for it ("context_full").  A stop token is checked
    before, and never kept."""
    if generated >= max_tokens:
        return "length"
    if in_context >= n_ctx:
        return "context_full"
    return None


def common_prefix(a, b) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def state_bytes(obj, _seen: set | None = None, _depth: int = 0) -> int:
    """The bytes of the numpy arrays an object holds (its attributes, and theirs, a few levels down), each array's
    own buffer counted once (views count nothing)."""
    seen = set() if _seen is None else _seen
    if id(obj) in seen or _depth > 4:
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return obj.nbytes if obj.base is None else 0
    if isinstance(obj, (list, tuple)):
        return sum(state_bytes(x, seen, _depth + 1) for x in obj)
    attrs = getattr(obj, "__dict__", None)
    if attrs is None:
        return 0
    return sum(state_bytes(x, seen, _depth + 1) for x in attrs.values())


class _Closed:
    """A closed generator's state: any use says so."""

    def __getattr__(self, name):
        raise ClosedError("this generator was closed (its session ended); fork a new one")


_CLOSED = _Closed()


class Generator:
    """One model and one sequence's KV cache, with its tokenizer and chat template."""

    def __init__(self, model: Model | None = None, model_path=None, n_ctx: int | None = None):
        self.model = model if model is not None else Model(model_path, n_ctx=n_ctx)
        self.tokenizer = Tokenizer.from_gguf(self.model.file)
        self.template = ChatTemplate.from_gguf(self.model.file, self.tokenizer)
        self.state = self.model.new_state()
        self.cached: list[int] = []  # token ids whose K/V sit at positions 0..len-1
        self.last: GenerationStats | None = None
        self._busy: tuple[Future, list] | None = None  # work on this sequence running elsewhere (``run_aside``)

    def run_aside(self, submit, fn, *args) -> Future:
        """``fn(*args)`` (which uses this sequence) handed to ``submit`` (e.g. ``ComputeThread.submit``: it runs on
        that thread, and the caller goes on); until it is done, this sequence's other uses wait for it (from any
        thread but the one running it), so its cache stays one sequence's.  Returns its future."""
        self._settle()
        runner: list = []

        def job():
            runner.append(threading.get_ident())
            return fn(*args)

        work = submit(job)
        self._busy = (work, runner)
        return work

    def _settle(self) -> None:
        """Wait for work handed aside (``run_aside``) unless this thread is the one running it."""
        busy = self._busy
        if busy is not None and threading.get_ident() not in busy[1]:
            busy[0].exception()  # (its outcome is its caller's: this only waits)
            self._busy = None

    def fork(self) -> Generator:
        """Another sequence on the same loaded model, tokenizer and template (nothing is reloaded),
        starting from a copy of this one's cached prefix; use each from one thread at a time."""
        self._settle()
        g = object.__new__(Generator)
        g.model, g.tokenizer, g.template = self.model, self.tokenizer, self.template
        g._busy = None
        g.state = self.model.new_state()
        n = len(self.cached)
        g.state.k_cache[:, :n] = self.state.k_cache[:, :n]
        g.state.v_cache[:, :n] = self.state.v_cache[:, :n]
        g.cached = list(self.cached)
        g.last = None
        return g

    def close(self) -> None:
        """Let go of this sequence's KV cache and scratch now (a closed session's ~90 MB), without waiting for
        the garbage collector to find whatever still points at the generator; it cannot be used afterwards (work handed
        aside that is still running finds it closed)."""
        self._busy = None
        self.state = _CLOSED
        self.cached = []

    def memory_bytes(self) -> int:
        """Bytes this sequence holds of its own: the KV cache and the scratch buffers of its state."""
        return state_bytes(self.state)

    @property
    def closed(self) -> bool:
        return self.state is _CLOSED

    @property
    def n_ctx(self) -> int:
        return self.model.n_ctx

    def reset(self) -> None:
        """Forget the conversation (the cache is overwritten from position 0)."""
        self._settle()
        self.cached = []

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        return self.tokenizer.encode(self.template.render(messages, add_generation_prompt))

    def prefill(self, prompt_ids) -> int:
        """Bring the KV cache up to ``prompt_ids`` without generating (e.g. the part of the next
        prompt already known while waiting for the user); returns the tokens computed."""
        self._settle()
        prompt_ids = [int(t) for t in prompt_ids]
        if len(prompt_ids) >= self.n_ctx:
            raise ContextLengthError(f"prompt has {len(prompt_ids)} tokens; the context holds {self.n_ctx}")
        reuse = common_prefix(self.cached, prompt_ids)
        if reuse == len(prompt_ids):
            return 0
        self.cached = self.cached[:reuse]
        self.model.forward(self.state, prompt_ids[reuse:], reuse)
        self.cached = list(prompt_ids)
        return len(prompt_ids) - reuse

    def logits_after(self, prompt_ids) -> np.ndarray:
        """The next-token logits after ``prompt_ids`` (a copy), with the KV cache brought up to
        them as ``prefill`` does (the cached prefix reused), so a prompt that goes on from them
        later computes only its own new tokens."""
        self._settle()
        prompt_ids = [int(t) for t in prompt_ids]
        if not prompt_ids:
            raise ValueError("empty prompt")
        if len(prompt_ids) >= self.n_ctx:
            raise ContextLengthError(f"prompt has {len(prompt_ids)} tokens; the context holds {self.n_ctx}")
        reuse = common_prefix(self.cached, prompt_ids)
        if reuse == len(prompt_ids):
            reuse -= 1  # the last token is run again to get its logits
        self.cached = self.cached[:reuse]
        logits = self.model.forward(self.state, prompt_ids[reuse:], reuse).copy()
        self.cached = list(prompt_ids)
        return logits

    def last_hidden(self) -> np.ndarray:
        """The final-normed hidden state ``(d_model,)`` of the last position computed (a copy): what
        the output projection turned into the last logits (e.g. after ``logits_after``)."""
        return self.state.step.final[0].copy()

    def stream(self, prompt_ids, max_tokens: int = 128, sampling: SamplingParams = GREEDY,
               stop_ids=None) -> Iterator[Piece]:
        """Yield the generated pieces for ``prompt_ids``; stop at a stop token, ``max_tokens``,
        or a full context."""
        self._settle()
        prompt_ids = [int(t) for t in prompt_ids]
        if not prompt_ids:
            raise ValueError("empty prompt")
        if len(prompt_ids) >= self.n_ctx:
            raise ContextLengthError(
                f"prompt has {len(prompt_ids)} tokens; the context holds {self.n_ctx} "
                f"(raise it with n_ctx, up to the model's {self.model.config.context_length})"
            )
        stops = self.tokenizer.stop_ids if stop_ids is None else frozenset(stop_ids)
        sampler = Sampler(sampling)
        decoder = self.tokenizer.stream_decoder()

        reuse = common_prefix(self.cached, prompt_ids)
        if reuse == len(prompt_ids):
            reuse -= 1  # the last prompt token is run again to get its logits
        self.cached = self.cached[:reuse]
        t0 = time.perf_counter()
        logits = self.model.forward(self.state, prompt_ids[reuse:], reuse)
        self.cached = list(prompt_ids)
        prefill_ms = (time.perf_counter() - t0) * 1000

        out: list[int] = []
        pieces: list[str] = []
        finish = "length"  # max_tokens < 1 generates nothing
        first_ms = 0.0
        t1 = t0
        steps = 0  # single-token forward passes after the first token
        for i in range(max_tokens):
            tok = sampler(logits, self.cached)
            if i == 0:
                t1 = time.perf_counter()
                first_ms = (t1 - t0) * 1000
            if tok in stops:
                finish = "stop"
                break
            out.append(tok)
            text = decoder.feed(tok)
            pieces.append(text)
            yield Piece(tok, text)
            end = end_reason(len(out), max_tokens, len(self.cached), self.n_ctx)
            if end is not None:
                finish = end
                break
            logits = self.model.forward(self.state, [tok], len(self.cached))
            self.cached.append(tok)
            steps += 1
        tail = decoder.flush()
        if tail:
            pieces.append(tail)
            yield Piece(-1, tail)
        t2 = time.perf_counter()
        self.last = GenerationStats(
            prompt_ids=tuple(prompt_ids), token_ids=tuple(out), text="".join(pieces), finish_reason=finish,
            cached_tokens=reuse, prefill_ms=prefill_ms, first_token_ms=first_ms,
            decode_ms=(t2 - t1) * 1000 if steps else 0.0, decode_tokens=steps,
        )

    def generate(self, prompt_ids, max_tokens: int = 128, sampling: SamplingParams = GREEDY,
                 stop_ids=None) -> GenerationStats:
        """Run ``stream`` to the end and return its figures."""
        for _ in self.stream(prompt_ids, max_tokens, sampling, stop_ids):
            pass
        return self.last
