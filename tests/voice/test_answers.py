"""Answer quality: grounded personas (facts, the "Fact:" message after each question, declines),
personas from a Realtime client's ``instructions``, and bench/answers.py on the real model (bars:
fact accuracy >= 0.90, no reply repeated verbatim across questions about different facts, no
parroting)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from voice.llm import DECLINE, DEFAULT_FACTS, DEFAULT_SYSTEM, LLMConversation, Persona, PersonaError, decline, relevant_facts

BENCH = Path(__file__).resolve().parents[2] / "bench" / "answers.py"


def bench():
    spec = importlib.util.spec_from_file_location("bench_answers", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, mod)  # its dataclasses look their module up
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


DENTIST = {"Hours": "8 am to 5 pm, Monday to Friday", "Weekends": "closed", "Address": "40 Elm Avenue",
           "Dentist": "Dr. Lena Patel", "Cleaning": "90 dollars", "Parking": "free, behind the building"}


def keys(facts, question):
    name = "Bright Bakery" if tuple(facts) == DEFAULT_FACTS else "Clearview Dental"
    return [k for k, _ in relevant_facts(facts, question, name=name)]


# -- which facts answer a question (by meaning: tests/voice/test_retrieval.py has more) ------------------------

@pytest.mark.parametrize("question, expected", [
    ("Who runs the bakery?", ["Owner"]),
    ("Where are you located?", ["Address"]),
    ("When do you close in the evening?", ["Opening hours"]),
    ("And a sourdough loaf?", ["Sourdough loaf"]),
    ("Who won the football game last night?", []),  # "who" alone is not about the owner
    ("Can you tell me a joke?", []),
])
def test_relevant_facts_of_the_default_persona(question, expected):
    assert keys(DEFAULT_FACTS, question)[:1] == expected


def test_a_day_or_a_price_finds_its_fact():
    facts = list(DENTIST.items())
    assert keys(facts, "Are you open on Saturday?")[0] == "Weekends"
    assert keys(facts, "What time do you open?")[0] == "Hours"
    assert keys(facts, "How much is a cleaning?")[0] == "Cleaning"


# -- personas ------------------------------------------------------------------------------------------

def test_the_default_persona_is_grounded_and_its_examples_end_with_a_fact():
    p = Persona()
    assert p.grounded and p.name == "Bright Bakery" and p.facts == DEFAULT_FACTS and p.system == DEFAULT_SYSTEM
    assert "Facts:" in p.system and "- Owner: Maria." in p.system
    msgs = p.opening()
    assert msgs[0]["role"] == "system"
    roles = [m["role"] for m in msgs[1:]]
    assert roles == ["user", "system", "assistant"] * len(p.examples)
    assert msgs[-2]["content"].startswith("Fact: ") and msgs[-2]["content"] != "Fact: none."
    declines = [m for m in msgs if m["role"] == "assistant" and m["content"].startswith("I'm afraid I don't know about")]
    assert len(declines) == 2 and len({m["content"] for m in declines}) == 2


def test_a_turn_carries_its_facts_and_starts_with_the_best_one_or_is_the_decline():
    p = Persona()
    msgs, start = p.turn("Who is the owner?")
    assert msgs == [{"role": "user", "content": "Who is the owner?"}, {"role": "system", "content": "Fact: The owner is Maria."}]
    assert start == "The owner is"  # the answer goes on with the fact, not with the last example's answer
    msgs, start = p.turn("Tell me a story.")
    assert msgs[1]["content"] == "Fact: none." and start == p.decline == decline("Bright Bakery")
    assert start.startswith(DECLINE) and len(start.split()) <= 20 and not any(c.isdigit() for c in start)


def test_a_follow_up_that_leans_back_takes_the_previous_questions_facts():
    p = Persona()
    msgs, start = p.turn("How much is it?", previous="Do you have croissants?")
    assert msgs[1]["content"].startswith("Fact: The croissant costs 2 dollars.") and start == "The croissant costs"
    assert p.turn("Can you tell me a joke?", previous="Do you have croissants?")[1] == p.decline  # does not lean back


def test_a_plain_persona_is_not_grounded():
    p = Persona(system="You sell bikes.", examples=(("Hi?", "Hello!"),))
    assert not p.grounded and p.facts == ()
    assert p.opening() == [{"role": "system", "content": "You sell bikes."}, {"role": "user", "content": "Hi?"},
                           {"role": "assistant", "content": "Hello!"}]
    assert p.turn("Where are you?") == ([{"role": "user", "content": "Where are you?"}], "")


def test_from_facts_builds_the_system_text_and_examples():
    p = Persona.from_facts("Clearview Dental", DENTIST)
    assert p.grounded and p.name == "Clearview Dental" and p.facts == tuple(DENTIST.items())
    assert p.system.startswith("You are the phone assistant of Clearview Dental.")
    assert all(f"- {k}: {v}." in p.system for k, v in DENTIST.items())
    answers = [a for _, a in p.examples]
    assert "The hours are 8 am to 5 pm, Monday to Friday." in answers and "The address is 40 Elm Avenue." in answers
    assert "The dentist is Dr. Lena Patel." in answers
    with pytest.raises(PersonaError):
        Persona.from_facts("Nobody", {})


def test_from_instructions_reads_key_value_lines():
    text = "You are the receptionist of Clearview Dental. Be brief.\n" + "\n".join(f"{k}: {v}." for k, v in DENTIST.items())
    p = Persona.from_instructions(text)
    assert p.name == "Clearview Dental" and dict(p.facts) == DENTIST
    assert p.system.startswith("You are the receptionist of Clearview Dental. Be brief. Answer in one short sentence")


def test_from_instructions_reads_the_sentences_of_a_business_text():
    text = ("You answer the phone for Rapid Wheels, a bike repair shop. We are open from 10 am to 7 pm, Monday to Saturday. "
            "The owner is Tom. Fixing a flat tire costs 15 dollars and a full tune-up costs 60 dollars.")
    p = Persona.from_instructions(text)
    assert p.name == "Rapid Wheels"
    assert dict(p.facts) == {"Opening hours": "from 10 am to 7 pm, Monday to Saturday", "Owner": "Tom",
                             "Fixing a flat tire": "15 dollars", "Full tune-up": "60 dollars"}
    assert p.system.startswith("You answer the phone for Rapid Wheels, a bike repair shop. Answer")


def test_from_instructions_without_facts_stays_a_plain_prompt():
    assert Persona.from_instructions("  Be brief.  ") == Persona(system="Be brief.", examples=(), facts=())
    assert not Persona.from_instructions("Answer in French. Be friendly.").grounded


def test_the_default_persona_comes_back_from_its_own_text():
    """The server advertises the default persona's system text as its instructions; a client that
    sends it back (or edits one fact of it) gets the same grounding."""
    assert Persona.from_instructions(DEFAULT_SYSTEM) == Persona()
    edited = Persona.from_instructions(DEFAULT_SYSTEM.replace("Maria", "Anna"))
    assert dict(edited.facts)["Owner"] == "Anna" and edited.system.count("Answer in one short sentence") == 1


def test_from_file_accepts_facts(tmp_path):
    f = tmp_path / "dentist.json"
    f.write_text(json.dumps({"name": "Clearview Dental", "facts": DENTIST}))
    assert Persona.from_file(f) == Persona.from_facts("Clearview Dental", DENTIST)
    f.write_text(json.dumps({"system": "You sell bikes.", "examples": [["Hi?", "Hello!"]]}))
    assert not Persona.from_file(f).grounded
    f.write_text(json.dumps({"name": "X", "facts": {}}))
    with pytest.raises(PersonaError):
        Persona.from_file(f)


def test_the_bench_covers_three_personas_follow_ups_and_off_topic():
    b = bench()
    questions = [q for s in b.SPECS.values() for c in s.conversations + s.held_out for q in c]
    assert len(b.SPECS) >= 3 and len(questions) >= 40
    assert sum(q.off_topic for q in questions) >= 6
    assert all(len(c) > 1 for s in b.SPECS.values() for c in s.conversations)  # every conversation has follow-ups
    assert b.check(b.Q("x", "off:x"), "I'm afraid I don't know about the weather.")
    assert not b.check(b.Q("x", "off:x"), "The weather is sunny, 25 degrees.")
    assert b.parrots("Who is the owner?", "Who is the owner? Maria.")


# -- on the real model --------------------------------------------------------------------------------

def test_context_is_the_prompts_prefix(generator):
    """The end-of-turn scorer reads ``context()`` + the user's text: it must be how the prompt starts."""
    llm = LLMConversation(generator)
    llm.commit("Where are you located?", "The address is 12 Harbor Street.")
    user = {"role": "user", "content": "Who is the owner?"}
    head = generator.encode_chat(llm.context() + [user], add_generation_prompt=False)
    ids = llm.prompt_ids(user["content"])
    assert ids[:len(head)] == head and "Fact: The owner is Maria." in generator.tokenizer.decode(ids[len(head):])
    assert llm.context() == Persona().opening()  # history_turns=0: the last answer is not shown


def test_a_decline_is_said_without_the_model(generator):
    llm = LLMConversation(generator)
    pieces = list(llm.reply("Can you sing me a song?"))
    assert pieces == [llm.persona.decline] and llm.last_usage.output_tokens == 0


def test_a_reply_is_guarded(generator):
    """The guard stands between the model and the phrases: a reply on the real model states no figure that the persona
    and the conversation lack, whatever it was asked."""
    from voice.guard import knowledge, unsupported

    text = "You answer the phone for Rapid Wheels, a bike shop. The owner is Tom Baker. A tune-up costs 60 dollars."
    llm = LLMConversation(generator, persona=Persona.from_instructions(text))
    for q in ("How much is a tune-up?", "What's the price of a new chain?", "What time do you close on Friday?"):
        reply = "".join(llm.reply(q))
        assert reply and not unsupported(reply, knowledge(text, q)), (q, reply)
        llm.commit(q, reply)


def test_one_replys_instructions_ground_that_reply_only(generator):
    """A Realtime ``response.create`` with its own ``instructions``: that reply opens with their persona (and its
    facts); the next reply is this conversation's again."""
    llm = LLMConversation(generator)
    llm.instructions = "You answer the phone for Rapid Wheels, a bike shop. The owner is Tom Baker."
    assert "Tom" in "".join(llm.reply("Who is the owner?"))
    assert llm.instructions is None
    assert "Maria" in "".join(llm.reply("Who is the owner?"))
    assert llm.prompt_ids("Hi")[:20] == generator.encode_chat(Persona().opening())[:20]


def test_the_bench_meets_its_bars(generator):
    rows, summary = bench().run(generator=generator)
    a = summary["all"]
    bad = [(r.persona, r.question, r.reply, r.invented) for r in rows if not r.ok or r.invented]
    assert a["fact_accuracy"] >= 0.9, bad
    assert a["invented"] == 0, bad
    assert a["off_topic_pass"] >= 0.9, bad
    assert a["parroting"] == 0, bad
    # no answer copies the one before it in its conversation (what a small model does when it sees its last answer);
    # a reply said again for another question is otherwise a fact missed, counted above (the summary's repeat groups),
    # and the decline is one set sentence, said without the model
    copied = [(r.question, r.reply) for prev, r in zip(rows, rows[1:])
              if (prev.persona, prev.conversation) == (r.persona, r.conversation) and r.reply == prev.reply
              and not (r.ok and prev.ok) and not r.reply.startswith(DECLINE)]
    assert not copied, copied


def test_the_guard_takes_numbers_from_the_facts_shown(generator):
    """A figure of the persona's said of another thing is stopped too: one lesson is not the package's $500."""
    text = "You answer the phone for Green Light Driving School. Single lessons cost $55. A package of ten lessons is $500."
    llm = LLMConversation(generator, persona=Persona.from_instructions(text))
    guard = llm.guard(llm.persona, "What does one lesson cost?", "The single lessons cost $55.")
    out = guard.feed("The single lessons cost $500. ") + guard.finish()
    assert "500" not in out and guard.stopped == "claim: 500" and out.endswith("What I can tell you: The single lessons cost $55.")
    guard = llm.guard(llm.persona, "What does one lesson cost?", "The single lessons cost $55.")
    assert guard.feed("Green Light Driving School charges $55. ") + guard.finish() == "Green Light Driving School charges $55. "


def test_held_apart_prose_personas(generator):
    """The clean held-apart set (bench/personas/heldout4, run once before this test was written): nothing invented on
    any reply; facts and declines held at what was measured (0.64 and 4/5, BENCHMARKS.md) so that they do not fall
    back to the word table's 0.43 unnoticed. The issue's bar for facts (0.90) is not met: these are floors, not bars."""
    rows, summary = bench().run(generator=generator, set_name="heldout4")
    a = summary["all"]
    assert a["invented"] == 0, [(r.question, r.reply, r.invented) for r in rows if r.invented]
    assert a["fact_accuracy"] >= 0.6 and a["off_topic_pass"] >= 0.8, [(r.question, r.reply) for r in rows if not r.ok]


def test_every_persona_set_is_well_formed():
    b = bench()
    for name in b.SET_NOTES:
        specs = b.load_set(name)
        questions = [q for s in specs.values() for c in s.conversations + s.held_out for q in c]
        assert len(specs) >= 3 and sum(q.off_topic for q in questions) >= 2, name
        assert all(q.off_topic or q.expect for q in questions), name
    held = [q.text for n in b.SET_NOTES if n.startswith("heldout") for s in b.load_set(n).values()
            for c in s.conversations for q in c]
    tuned = {q.text for n in ("own", "dev") for s in b.load_set(n).values() for c in s.conversations + s.held_out for q in c}
    titles = {n: {s.title for s in b.load_set(n).values()} for n in b.SET_NOTES}
    assert len(held) >= 150 and len(tuned & set(held)) <= len(held) // 20  # a few stock questions ("Where are you located?")
    assert not (titles["own"] | titles["dev"]) & set().union(*(t for n, t in titles.items() if n.startswith("heldout")))
