"""The topic head (``voice.retrieval.TopicHead``, trained by ``voice.topic_train``): a question about no business is
declined even where it shares a word or an answer kind with a fact; questions about the business, and short
follow-ups, are not; a bad head or corpus file is reported by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
from kinds import ENGINES, kind

from voice import retrieval, topic_train
from voice.llm import Persona, relevant_facts
from voice.retrieval import MiniLM, TopicHead, follow_up, topic_head

HOTEL = ("You are Ava, the front desk agent for the Harborview Inn. Check-in begins at 3 PM and check-out is by 11 AM. "
         "Guests can park in our garage for $18 a night. The Wi-Fi password is seagull42. We're at 210 Waterfront Drive. "
         "The general manager is Daniel Okafor. Keep answers short.")
#: about no business, and each shares a word ("address") or an answer kind with a hotel's facts (none is in the corpus)
GENERAL = ("While I think of it, how do I register to vote at my new address?",
           "How do I renew my driving licence online at my address?")
#: about the hotel, worded unlike its facts (none is in the corpus)
BUSINESS = ("Is there somewhere to leave the car overnight?", "What time can we get into the room?", "Who looks after the place?")


@pytest.fixture(scope="module")
@kind(ENGINES)
def model():
    return retrieval.embedder()


@pytest.fixture(scope="module")
@kind(ENGINES)
def hotel():
    return Persona.from_instructions(HOTEL)


def test_the_committed_head_is_tied_to_the_retrievals_model_and_learned_its_corpus(model):
    head = topic_head(model)
    assert head is not None and head.model_id == model.model_id and head.weights.shape == (model.dim,)
    assert head.info["business"] >= 600 and head.info["general"] >= 600 and head.info["cv_accuracy"] >= 0.85
    corpus = json.loads(topic_train.CORPUS_PATH.read_text())
    assert not set(GENERAL + BUSINESS) & set(corpus["business"] + corpus["general"])  # measured off its corpus


def test_questions_about_no_business_score_high_and_questions_about_one_low(model):
    head = topic_head(model)
    general = [head.p_general(v) for v in model.embed(list(GENERAL))]
    business = [head.p_general(v) for v in model.embed(list(BUSINESS))]
    assert min(general) >= retrieval.TOPIC_SURE, general
    assert max(business) < 0.2, business


def found(persona, question, previous=None):
    return [v for _, v in relevant_facts(persona.facts, question, previous, name=persona.name)]


def test_the_head_declines_what_the_word_and_kind_gates_let_through(hotel, monkeypatch):
    monkeypatch.setattr(retrieval, "OFF_TOPIC_SCORE", 2.0)  # the prototypes never decide here: the head does
    for q in GENERAL:
        assert found(hotel, q) == [], q
    monkeypatch.setattr(retrieval, "TOPIC_SURE", 2.0)  # without the head, the same questions are shown a fact
    assert all(found(hotel, q) for q in GENERAL)


def test_questions_about_the_business_keep_their_facts(hotel, monkeypatch):
    shown = [found(hotel, q) for q in BUSINESS]
    assert any("garage" in v for v in shown[0]) and any("3 PM" in v for v in shown[1]) and all(shown)
    monkeypatch.setattr(retrieval, "TOPIC_SURE", 2.0)
    assert [found(hotel, q) for q in BUSINESS] == shown  # the head took nothing


def test_a_short_follow_up_is_left_to_the_question_before_it(hotel, model, monkeypatch):
    q = "And what about the rubbish?"  # alone it reads as the caller's own bins
    monkeypatch.setattr(retrieval, "OFF_TOPIC_SCORE", 2.0)
    monkeypatch.setattr(retrieval, "TOPIC_FACT_BELOW", 2.0)  # any similarity: only the follow-up rule keeps it
    monkeypatch.setattr(retrieval, "TOPIC_SURE", 0.0)  # the head "sure" of everything
    assert found(hotel, q, "Where do I park the car?")  # a follow-up: the head is not asked
    assert found(hotel, "Is there somewhere to leave the car overnight while I am staying with you for the conference?") == []


@pytest.mark.parametrize(("question", "expected"), [
    ("And for two of us?", True), ("What about Sundays?", True), ("Is that per person?", True),
    ("or the cheaper one", True),
    ("While I think of it, how do I get myself on the electoral roll at the new address?", False),
    ("This is going to bug me all day, what's the song that goes na na na?", False),
])
def test_follow_up(question, expected):
    assert follow_up(question) is expected


def test_a_corrupt_head_file_is_reported_by_name(tmp_path):
    bad = tmp_path / "topic_head.npz"
    bad.write_bytes(b"not a numpy archive")
    with pytest.raises(ValueError, match="bad topic head .*topic_head.npz"):
        TopicHead.load(bad)
    np.savez(bad, weights=np.zeros(3), bias=np.float64(0), mean=np.zeros(4), scale=np.ones(3), model_id=np.array("x"),
             info=np.array("{}"))
    with pytest.raises(ValueError, match="inconsistent shapes"):
        TopicHead.load(bad)


def test_a_head_for_another_model_is_not_used(tmp_path):
    class Other:
        dim = 384
        model_id = "another-model"

    path = tmp_path / "head.npz"
    TopicHead(weights=np.ones(384), bias=0.0, mean=np.zeros(384), scale=np.ones(384), model_id="all-MiniLM/x",
              info={}).save(path)
    assert TopicHead.load(path).model_id == "all-MiniLM/x"
    assert topic_head(Other(), path) is None


def test_a_bad_corpus_is_reported_by_name(tmp_path):
    path = tmp_path / "corpus.json"
    for text in ("{not json", json.dumps({"business": ["Are you open?"]}), json.dumps({"business": [], "general": ["Hi?"]}),
                 json.dumps({"business": ["Are you open?"], "general": [3]})):
        path.write_text(text)
        with pytest.raises(ValueError, match="bad topic corpus .*corpus.json"):
            topic_train.load_corpus(path)
    with pytest.raises(SystemExit, match="bad topic corpus"):
        topic_train.main(["--corpus", str(path), "--out", str(tmp_path / "head.npz")])
    assert not (tmp_path / "head.npz").exists()  # nothing written


def test_training_is_deterministic_and_separates_its_corpus(model, tmp_path):
    business, general = topic_train.load_corpus()
    business, general = business[::8], general[::8]  # 80 + 80: seconds
    a = topic_train.train(business, general, model=model, l2=30.0, progress=lambda _: None)
    b = topic_train.train(business, general, model=model, l2=30.0, progress=lambda _: None)
    assert np.array_equal(a.weights, b.weights) and a.bias == b.bias and a.model_id == model.model_id
    assert a.info["cv_accuracy"] >= 0.75
    a.save(tmp_path / "h.npz")
    again = TopicHead.load(tmp_path / "h.npz")
    v = model.embed(list(GENERAL + BUSINESS))
    assert [round(again.p_general(x), 6) for x in v] == [round(a.p_general(x), 6) for x in v]


def test_minilm_names_its_model(model):
    assert isinstance(model, MiniLM) and model.model_id.startswith("all-MiniLM-L6-v2")


def test_a_head_from_another_file_is_read_from_that_file(model, tmp_path):
    path = tmp_path / "head.npz"
    TopicHead(weights=np.zeros(model.dim), bias=3.0, mean=np.zeros(model.dim), scale=np.ones(model.dim),
              model_id=model.model_id, info={"made": "here"}).save(path)
    assert topic_head(model) is not None  # the committed one, cached
    mine = topic_head(model, path)
    assert mine.info == {"made": "here"} and mine.p_general(model.embed_one("Are you open?")) > 0.95
    assert topic_head(model).info != mine.info  # the cache holds the committed head only
