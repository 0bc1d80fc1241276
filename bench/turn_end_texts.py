"""The end-of-turn policy on texts alone: whole turns and turns heard at a pause, from many kinds of voice assistant.

    .venv/bin/python bench/turn_end_texts.py [--set heldout|FILE ...] [--head FILE ...] [--context persona|bare]
                                              [--verbose]

No audio and no clock: each text is scored as the loop scores what Whisper heard at a pause (``TurnEndScorer`` on the
real decode core, after the default persona's opening or a bare system line) and ``TurnEndPolicy.decide`` says which
silence would close the turn there.  Printed per set and head:

- complete turns closed after the short silence (~200 ms: the quick endpoints), and those left waiting the longest
  silence (rule "unfinished", 1.2 s at medium: a user who is done waits over a second);
- paused turns closed after the short silence at their pause (a cut-off: the user is answered over), all of them and
  the "hard" ones (a first part that reads as a whole turn, "Can I get the apple pie?" ... "And the carrot cake").

Sets (``bench/turn_end_texts/``): ``heldout`` was written by a helper who never saw the head's training code or data
(``voice/turn_end_train.py``, ``voice/turn_end_corpus.json``, ``samples/``): measure on it, never tune on it.  A set is a
JSON file ``{"note", "complete": [text], "paused": [{"text", "rest", "hard"?}]}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SETS_DIR = ROOT / "bench" / "turn_end_texts"


def load(name: str) -> tuple[str, dict]:
    path = Path(name)
    if not path.suffix:
        path = SETS_DIR / f"{name}.json"
    if not path.is_file():
        sys.exit(f"no such set: {name} (looked for {path}; sets: {', '.join(p.stem for p in SETS_DIR.glob('*.json'))})")
    return path.stem, json.loads(path.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", action="append", help="a set's name in bench/turn_end_texts/ or a JSON file (default: heldout)")
    ap.add_argument("--head", action="append", type=Path, help="head file(s) to compare (default: the committed one)")
    ap.add_argument("--context", choices=["persona", "bare"], default="persona",
                    help="what the user's text is scored after: the default persona's opening (as the loop) or a bare "
                         "system line")
    ap.add_argument("--verbose", action="store_true", help="print every mistake")
    args = ap.parse_args()

    from decode import Generator, Model
    from voice.engines import one_blas_thread
    from voice.llm import Persona
    from voice.turn_end import HEAD_PATH, TurnEndHead, TurnEndPolicy, TurnEndScorer
    from voice.turn_end_train import contexts

    one_blas_thread()
    gen = Generator(model=Model())
    ctx = contexts(Persona().opening())[args.context]
    policy = TurnEndPolicy()
    short, _, longest = policy.silences
    heads = args.head or [HEAD_PATH]
    print(f"context: {args.context}; policy: medium, silences {policy.silences} ms; one row per set and head")
    print(f"{'set':10s} {'head':28s} {'complete':>8s} {'closed 200 ms':>13s} {'wait 1.2 s':>10s} {'paused':>6s} "
          f"{'cut off':>8s} {'hard cut off':>12s} {'ms/score':>8s}")
    for set_name in args.set or ["heldout"]:
        name, data = load(set_name)
        for head_path in heads:
            scorer = TurnEndScorer(gen, TurnEndHead.load(head_path))
            took = []

            def decide(text: str, scorer=scorer, took=took):
                t = time.perf_counter()
                score = scorer.score(ctx, text)
                took.append((time.perf_counter() - t) * 1000)
                return policy.decide(score, text), score.p_end

            quick = waits = 0
            for text in data["complete"]:
                d, p = decide(text)
                quick += d.stop_ms == short
                waits += d.stop_ms == longest
                if args.verbose and d.stop_ms != short:
                    print(f"   complete {p:.2f} {d.rule:10s} {text!r}")
            cut = hard = n_hard = 0
            for item in data["paused"]:
                d, p = decide(item["text"])
                closed = d.stop_ms == short
                cut += closed
                n_hard += bool(item.get("hard"))
                hard += closed and bool(item.get("hard"))
                if args.verbose and closed:
                    print(f"   cut off  {p:.2f} {item['text']!r} ... {item['rest']!r}")
            nc, npz = len(data["complete"]), len(data["paused"])
            print(f"{name:10s} {head_path.name[:28]:28s} {nc:8d} {quick / nc:13.2f} {waits / nc:10.2f} {npz:6d} "
                  f"{cut / npz:8.2f} {f'{hard}/{n_hard}':>12s} {statistics.median(took):8.1f}", flush=True)


if __name__ == "__main__":
    main()
