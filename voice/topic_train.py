"""Train the topic head (``voice.retrieval.TopicHead``): is a caller's question about the business at all?

    .venv/bin/python -m voice.topic_train [--corpus voice/topic_corpus.json] [--out voice/topic_head.npz] [--l2 X]

The corpus (``topic_corpus.json``) is two lists of questions written for this head and for nothing else: ``business``,
what callers ask a local business about itself (prices, hours, parking, booking, staff, what it does, its rules) over
many kinds of business, and ``general``, what callers drift into that no business's facts answer
(general knowledge, sums, words, weather, sport, news, advice on their own home, health, money or papers,
recommendations, chit-chat, songs and jokes).  Many questions on both sides share their form ("Who runs it?" and "Who
won it?", "How do I book?" and "How do I fix it?"), so what tells them apart is the topic.  None of it comes from
bench/personas: the persona sets measure the head, they do not train it.

Each question is embedded by the fact retrieval's own model (``voice.retrieval.MiniLM``); the vectors are
standardized and a logistic regression with an L2 penalty is fitted by Newton's method
(``voice.turn_end_train.fit_logistic``).  The penalty is chosen by five-fold cross-validation on the corpus
(``L2_GRID``, seeded folds) unless ``--l2`` names one; the head is then fitted on everything and saved with its
cross-validated accuracy.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from .retrieval import TOPIC_HEAD_PATH, TopicHead, embedder
from .turn_end_train import fit_logistic

CORPUS_PATH = Path(__file__).with_name("topic_corpus.json")
#: the penalties tried by cross-validation
L2_GRID = (1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)
FOLDS = 5
SEED = 5


def load_corpus(path: Path = CORPUS_PATH) -> tuple[list[str], list[str]]:
    """The corpus's business and general questions; ``ValueError`` naming the file when it is not one."""
    try:
        data = json.loads(Path(path).read_text())
        business, general = data["business"], data["general"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"bad topic corpus {path}: {exc}") from None
    if not (isinstance(business, list) and isinstance(general, list) and business and general
            and all(isinstance(t, str) and t.strip() for t in business + general)):
        raise ValueError(f"bad topic corpus {path}: 'business' and 'general' must be non-empty lists of questions")
    return business, general


def cross_validate(x: np.ndarray, y: np.ndarray, l2: float, folds: int = FOLDS, seed: int = SEED) -> float:
    """Accuracy at 0.5 over ``folds`` seeded folds, each standardized on its training part."""
    order = np.random.default_rng(seed).permutation(len(y))
    right = 0
    for part in np.array_split(order, folds):
        train = np.setdiff1d(order, part)
        mean, scale = x[train].mean(0), x[train].std(0) + 1e-6
        w, b = fit_logistic((x[train] - mean) / scale, y[train], l2)
        right += int((((x[part] - mean) / scale @ w + b > 0) == (y[part] == 1)).sum())
    return right / len(y)


def train(business: list[str], general: list[str], model=None, l2: float | None = None, progress=print) -> TopicHead:
    """The head for ``model`` (default: the retrieval's own) on these questions."""
    model = model or embedder()
    x = np.concatenate([model.embed(business), model.embed(general)]).astype(np.float64)
    y = np.r_[np.zeros(len(business)), np.ones(len(general))]
    scores = {}
    for candidate in ([l2] if l2 is not None else L2_GRID):
        scores[candidate] = cross_validate(x, y, candidate)
        progress(f"l2 {candidate:g}: {FOLDS}-fold accuracy {scores[candidate]:.3f}")
    best = max(scores, key=lambda k: (scores[k], k))  # ties: the stronger penalty
    mean, scale = x.mean(0), x.std(0) + 1e-6
    w, b = fit_logistic((x - mean) / scale, y, best)
    info = {"business": len(business), "general": len(general), "l2": best, "cv_accuracy": round(scores[best], 4),
            "folds": FOLDS, "seed": SEED}
    return TopicHead(weights=w, bias=b, mean=mean, scale=scale, model_id=model.model_id, info=info)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=CORPUS_PATH, help="the questions (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=TOPIC_HEAD_PATH, help="where to save the head (default: %(default)s)")
    ap.add_argument("--l2", type=float, help=f"the penalty (default: chosen by cross-validation from {', '.join(map(str, L2_GRID))})")
    args = ap.parse_args(argv)
    try:
        business, general = load_corpus(args.corpus)
    except ValueError as exc:
        sys.exit(str(exc))
    print(f"corpus: {len(business)} business and {len(general)} general questions ({args.corpus})", flush=True)
    head = train(business, general, l2=args.l2, progress=lambda m: print(m, flush=True))
    head.save(args.out)
    print(f"saved {args.out}: l2 {head.info['l2']:g}, cross-validated accuracy {head.info['cv_accuracy']:.3f}")


if __name__ == "__main__":
    main()
