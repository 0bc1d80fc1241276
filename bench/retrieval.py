"""Fact retrieval alone: does the fact shown with a question carry its answer?  Candidates side by side.

    .venv/bin/python bench/retrieval.py [--set own|dev|heldout|heldout2..heldout7|all] [--method NAME ...]

No generation: for every fact question of a set's personas (``bench/answers.py``'s sets), the persona's facts are
ranked for the question (with the previous question of its conversation, for a follow-up) and the question passes
when the best fact's text (as the "Fact:" message states it) matches the question's expected regex (``top1``), or one
of the facts that would be shown (``shown``: what the model gets).  Off-topic questions pass when no fact is shown.
Also printed: the best fact's similarity for fact and for off-topic questions (what ``MIN_SCORE`` separates) and the
time to rank one question (embedding it included; the facts' embeddings are made once per persona, not timed).

Methods:
- ``words``: the grounding before issue 28, word overlap with a table of cue words (``relevant_facts``, kept here);
- ``minilm``: ``voice.retrieval``, all-MiniLM-L6-v2 int8 ONNX (the product's), with its answer-type prior;
- ``minilm-notype``: the same without the answer-type prior (``voice.retrieval.ANSWER_TYPES``);
- ``smol-mean``: the decode core's own last hidden states (SmolLM2-135M), mean-pooled over the text's tokens;
- ``smol-eol``: the same model's last hidden state after a prompt that asks for the text's meaning in one word
  ('This sentence: "..." means in one word: "').
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from answers import load_set  # noqa: E402


def persona_of(spec):
    from answers import build_persona

    return build_persona(spec, "instructions")


class Smol:
    """Sentence vectors from the decode core's last layer (before the final norm), on a sequence of its own."""

    def __init__(self, mode: str):
        from decode import Generator, Model
        from voice.engines import one_blas_thread

        one_blas_thread()
        self.gen = Generator(model=Model())
        self.mode = mode
        self.state = self.gen.model.new_state()

    def _vec(self, text: str) -> np.ndarray:
        m = self.gen.model
        if self.mode == "eol":
            text = f'This sentence: "{text}" means in one word: "'
        ids = np.asarray(self.gen.tokenizer.encode(text), np.int64)[: self.state.chunk]
        x = self.state.x[: len(ids)]
        m.embed(ids, x)
        m.layers(self.state, 0, m.config.n_layers, x, 0)
        v = x.mean(0) if self.mode == "mean" else x[-1].copy()
        return v / np.linalg.norm(v)

    def embed_one(self, text):
        return self._vec(text)

    def embed(self, texts):
        return np.stack([self._vec(t) for t in texts]) if texts else np.zeros((0, self.gen.model.config.d_model))


def rank_words(persona):
    from voice.llm import _answer

    facts = list(persona.facts)
    old = _old_relevant_facts()

    def search(q, previous):
        t = time.perf_counter()
        chosen = old(facts, q)
        if not chosen and previous and re.search(r"\b(it|its|that|this|they|them|those|these|one)\b", q, re.I):
            chosen = old(facts, previous)
        return [_answer(*f) for f in chosen], None, (time.perf_counter() - t) * 1000

    return search


def _old_relevant_facts():
    """The word-table grounding as it was before issue 28 (voice/llm.py at 193d90d), for comparison."""
    stop = frozenset("a an the and or up of to in on at for is are was be do does did you your we our i me my it this that "
                     "what which whom how can could would will there here please tell about with any some many get have has hi "
                     "hello ok okay so just like know".split())

    def stem(word):
        w = re.sub(r"'s$", "", word.lower()).strip("'")
        for suffix in ("ies", "ing", "es", "ed", "al", "s"):
            if len(w) > len(suffix) + 2 and w.endswith(suffix):
                w = w[: -len(suffix)] + ("y" if suffix == "ies" else "")
                break
        return w[:-1] if len(w) > 3 and w.endswith("e") else w

    def words(text):
        out = set()
        for w in re.findall(r"[A-Za-z][A-Za-z'-]*|\d+", text):
            if w.lower() not in stop:
                out.add(stem(w))
                if "-" in w:
                    out |= {stem(p) for p in w.split("-") if len(p) > 2 and p.lower() not in stop}
        return out

    cue_weight = {**dict.fromkeys(words("who name much today tomorrow morning evening"), 0.5),
                  **dict.fromkeys(words("open close time hours"), 0.75),
                  **dict.fromkeys(words("monday tuesday wednesday thursday friday saturday sunday weekend"), 1.0)}
    concepts = tuple((words(t), words(c)) for t, c in (
        ("hours open opening", "open close hours time when day week morning evening tomorrow today late early"),
        ("address location street road avenue lane", "where address located location find street directions"),
        ("owner owns manager boss founder", "owner own runs who boss manager charge"),
        ("dentist doctor dr", "who dentist doctor name"),
        ("dollars price cost euros pounds fee", "much cost price charge fee pay"),
        ("weekends", "saturday sunday weekend"),
        ("delivery deliver", "deliver delivery ship bring"),
        ("parking park", "park parking car drive"),
        ("rental rent", "rent rental hire borrow"),
        ("time minutes same", "long take wait ready quick fast soon"),
    ))

    def relevant(facts, question, most=2):
        q = words(question)
        scored = []
        for i, (k, v) in enumerate(facts):
            own = words(k) | words(v)
            cues = set().union(*(cue for trigger, cue in concepts if trigger & own)) - own
            score = sum(cue_weight.get(w, 1.0 if w in own else 0.75) for w in q & (own | cues))
            if score >= 0.75:
                scored.append((-score, i))
        scored.sort()
        return [facts[i] for s, i in scored if s == scored[0][0]][:most]

    return relevant


def rank_embedded(persona, model, types=True):
    from voice.llm import _answer
    from voice.persona import subject
    from voice.retrieval import FactIndex

    texts = tuple(_answer(k, v) for k, v in persona.facts)
    index = FactIndex(texts, tuple(subject(k, v) for k, v in persona.facts), persona.name, model=model)
    if not types:
        index.type_bonus = 0.0

    def search(q, previous):
        getattr(model, "_recent", {}).clear()  # timed as a new question
        t = time.perf_counter()
        hits = index.search(q, previous)
        ms = (time.perf_counter() - t) * 1000
        best = index.search(q, previous, min_score=-1.0, sure=-1.0, off_topic=False)[0]
        return [texts[h.index] for h in hits], (texts[best.index], best.score), ms

    return search


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="all", choices=["own", "dev", "heldout", *(f"heldout{i}" for i in range(2, 20)), "all"],
                    help="all (default): own, dev and heldout..heldout4, the sets already looked at; heldout5..heldout19 "
                         "run only by name (once, to measure: bench/personas/README.md)")
    ap.add_argument("--method", action="append", choices=["words", "minilm", "minilm-notype", "smol-mean", "smol-eol"])
    ap.add_argument("--verbose", action="store_true", help="print every question's best fact")
    args = ap.parse_args()
    sets = ["own", "dev", "heldout", "heldout2", "heldout3", "heldout4"] if args.set == "all" else [args.set]
    methods = args.method or ["words", "minilm", "minilm-notype", "smol-mean", "smol-eol"]
    models = {}
    for m in methods:
        if m.startswith("minilm"):
            from voice.retrieval import embedder

            models[m] = embedder()
        elif m.startswith("smol"):
            models[m] = Smol(m.split("-")[1])
    print(f"{'set':8s} {'method':10s} {'facts':>5s} {'top1':>6s} {'shown':>6s} {'off ok':>6s} {'fact sim p10':>12s} "
          f"{'off sim p90':>11s} {'ms/q p50':>8s} {'ms/q max':>8s}")
    for set_name in sets:
        specs = load_set(set_name)
        for m in methods:
            top1 = shown = n = off_ok = n_off = 0
            fact_sims, off_sims, ms = [], [], []
            for spec in specs.values():
                persona = persona_of(spec)
                search = rank_words(persona) if m == "words" else rank_embedded(persona, models[m], m != "minilm-notype")
                for conv in spec.conversations + spec.held_out:
                    previous = None
                    for q in conv:
                        facts, best, took = search(q.text, previous)
                        ms.append(took)
                        if args.verbose and best and (q.off_topic or best[1] < 0.35):
                            print(f"   {'off ' if q.off_topic else 'fact'} {best[1]:.2f} {spec.name}: {q.text!r} -> {best[0]!r}")
                        if q.off_topic:
                            n_off += 1
                            off_ok += not facts
                            if best:
                                off_sims.append(best[1])
                        else:
                            n += 1
                            first = facts[0] if facts else (best[0] if best else "")
                            ok1 = bool(re.search(q.expect, first, re.I))
                            top1 += ok1
                            shown += any(re.search(q.expect, f, re.I) for f in facts)
                            if best:
                                fact_sims.append(best[1])
                            if args.verbose and not ok1:
                                print(f"   miss {spec.name}: {q.text!r} -> {first!r}")
                        previous = q.text
            p = lambda xs, k: f"{np.percentile(xs, k):.2f}" if xs else "-"  # noqa: E731
            print(f"{set_name:8s} {m:10s} {n:5d} {top1 / n:6.2f} {shown / n:6.2f} {off_ok / max(1, n_off):6.2f} "
                  f"{p(fact_sims, 10):>12s} {p(off_sims, 90):>11s} {np.median(ms):8.2f} {max(ms):8.2f}", flush=True)


if __name__ == "__main__":
    main()
