"""``voice.persona``: what an operator wrote, split into the assistant's intro, its rules of speech, and facts (one
thing each), from prose as a Realtime client's ``instructions`` carry it or from ``key: value`` lines."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from voice.persona import business_name, clauses, sentences, split_instructions, subject

HOTEL = ("You are Ava, the virtual front desk agent for the Harborview Inn in Portland. Check-in begins at 3 PM and "
         "check-out is by 11 AM. Guests can park in our garage for $18 a night. The pharmacist is Dr. Priya Raman. "
         "Breakfast is served from 6:30 a.m. to 10 in the Lighthouse Room. Our address is 1200 Canal Road, Unit B. "
         "Keep answers short and friendly, and never make up information.")


def test_sentences_do_not_end_at_titles_times_or_prices():
    assert sentences(HOTEL) == [
        "You are Ava, the virtual front desk agent for the Harborview Inn in Portland.",
        "Check-in begins at 3 PM and check-out is by 11 AM.",
        "Guests can park in our garage for $18 a night.",
        "The pharmacist is Dr. Priya Raman.",
        "Breakfast is served from 6:30 a.m. to 10 in the Lighthouse Room.",
        "Our address is 1200 Canal Road, Unit B.",  # a unit's letter ends the sentence; an initial would not
        "Keep answers short and friendly, and never make up information.",
    ]
    assert sentences("Ask for J. Smith. He is in.") == ["Ask for J. Smith.", "He is in."]


@pytest.mark.parametrize("sentence, parts", [
    ("Check-in begins at 3 PM and check-out is by 11 AM.", ["Check-in begins at 3 PM.", "Check-out is by 11 AM."]),
    ("A drop-in class is $22, a ten-class pass is $180, and an unlimited month is $120.",
     ["A drop-in class is $22.", "A ten-class pass is $180.", "An unlimited month is $120."]),
    ("Store hours are 9 to 6; we're closed Sunday and Monday.", ["Store hours are 9 to 6.", "We're closed Sunday and Monday."]),
    # no subject of its own: the clause stays with its sentence
    ("A basic tune-up is $65 and takes two to three days.", ["A basic tune-up is $65 and takes two to three days."]),
    ("We're open weekdays 8 AM to 9 PM, Saturdays 9 to 6, and Sundays 10 to 4.",
     ["We're open weekdays 8 AM to 9 PM, Saturdays 9 to 6, and Sundays 10 to 4."]),
    ("We're open every day from 10 to 8, except Wednesdays when we close at 5.",
     ["We're open every day from 10 to 8, except Wednesdays when we close at 5."]),
    ("Dr. Hannah Brooks and Dr. Omar Said see patients on Mondays.", ["Dr. Hannah Brooks and Dr. Omar Said see patients on Mondays."]),
])
def test_clauses_cut_where_a_sentence_states_two_things(sentence, parts):
    assert clauses(sentence) == parts


def test_split_prose_instructions():
    parsed = split_instructions(HOTEL)
    assert parsed.name == "Harborview Inn"
    assert parsed.intro == "You are Ava, the virtual front desk agent for the Harborview Inn in Portland."
    assert parsed.rules == ("Keep answers short and friendly, and never make up information.",)
    assert [v for k, v in parsed.facts] == [
        "I am Ava, the virtual front desk agent for the Harborview Inn in Portland",  # the intro, said by the assistant
        "Check-in begins at 3 PM", "Check-out is by 11 AM", "Guests can park in our garage for $18 a night",
        "The pharmacist is Dr. Priya Raman", "Breakfast is served from 6:30 a.m. to 10 in the Lighthouse Room",
        "Our address is 1200 Canal Road, Unit B",
    ]
    assert all(k == "" for k, _ in parsed.facts)


def test_an_intro_that_only_names_the_business_is_no_fact():
    parsed = split_instructions("You are the assistant for Lotus Flow Yoga studio. A drop-in class is $22. Be warm.")
    assert parsed.name == "Lotus Flow Yoga" and parsed.facts == (("", "A drop-in class is $22"),)
    assert parsed.rules == ("Be warm.",)


def test_split_key_value_lines_and_prose_together():
    text = "You are the receptionist of Clearview Dental. Be brief.\nHours: 8 am to 5 pm.\nParking: free.\nWe take Cigna."
    parsed = split_instructions(text)
    assert parsed.name == "Clearview Dental" and parsed.rules == ("Be brief.",)
    assert parsed.facts == (("Hours", "8 am to 5 pm"), ("Parking", "free"), ("", "We take Cigna"))


def test_business_name_after_the():
    assert business_name("You are Ava, the front desk agent for the Harborview Inn in Portland.") == "Harborview Inn"
    assert business_name("This is the voice assistant for Gearhead Cycles, a bike shop.") == "Gearhead Cycles"
    assert business_name("You are the phone assistant at Crumb and Co, a bakery.") == "Crumb and Co"
    assert business_name("Answer in French.") == ""


def test_subject_is_what_a_fact_is_about():
    assert subject("Owner", "Maria") == "Owner"
    assert subject("", "Check-out is by 11 AM") == "Check-out"
    assert subject("", "Guests can park in our garage for $18 a night") == "Guests"
    assert subject("", "Is it free") == "Is it free"  # no words before the verb: the sentence itself


def test_a_question_in_the_instructions_leads_into_the_sentence_after_it():
    facts = split_instructions("You are Sam, the assistant for Pine Hollow Campground. Arriving after hours? Use the drop "
                               "box by the gate. Tent sites are $28 a night. Any questions?").facts
    texts = [v for _, v in facts]
    assert "Arriving after hours? Use the drop box by the gate" in texts
    assert not [t for t in texts if t.endswith("?")]  # no question stands as a fact


@pytest.mark.parametrize("sentence, answer", [
    ("Your hosts are Walt and Bev Harper.", "Your hosts are Walt and Bev Harper."),
    ("Everybody's favorite is Big Mabel.", "Everybody's favorite is Big Mabel."),
    ("No late fees are charged on children's books.", "No late fees are charged on children's books."),
    ("The owner is Maria.", "The owner is Maria."),
    ("Croissant costs 2 dollars.", "The croissant costs 2 dollars."),
])
def test_a_fact_sentence_is_said_back_without_an_article_before_a_determiner(sentence, answer):
    from voice.llm import _answer, _sentence_fact

    assert _answer(*_sentence_fact(sentence)) == answer


def test_a_paragraph_of_key_value_sentences_is_split_into_pairs():
    """One paragraph running "Key: value." statements together (heldout8's bowling alley: before, the whole paragraph
    was one fact keyed "Role"); a Role is who the assistant is, a Style how it talks; a plain sentence between the keys
    is a fact of its own, not part of the key before it."""
    text = ("Role: phone assistant for Thunder Lanes Bowling Center. Address: 1400 Industrial Parkway. Hours: Monday "
            "3 PM to 10 PM; Tuesday closed. Games: $6.50 per person per game. Closed on Christmas Day. Shoe rental: $4. "
            "Manager: Darnell Okafor. Style: upbeat, short answers.")
    got = split_instructions(text)
    assert got.intro == "You are the phone assistant for Thunder Lanes Bowling Center."
    assert got.rules == ("Style: upbeat, short answers.",)
    assert got.facts == (("Address", "1400 Industrial Parkway"), ("Hours", "Monday 3 PM to 10 PM; Tuesday closed"),
                         ("Games", "$6.50 per person per game"), ("Shoe rental", "$4"), ("Manager", "Darnell Okafor"),
                         ("", "Closed on Christmas Day"))
    assert got.name == "Thunder Lanes Bowling Center"
    # a single key line keeps every sentence of its value, as before
    assert split_instructions("Hours: Mon 9-5. Sat 10-2.").facts == (("Hours", "Mon 9-5. Sat 10-2"),)


def test_a_time_or_a_note_is_not_a_key():
    """"at 9:00" is no "key: value" (its colon has no space after it), and "Note: ..." is a sentence, kept as a fact
    (without its "Note:")."""
    assert split_instructions("We open at 9:00 a.m. daily. Our owner is Dr. Lee.").facts == (
        ("", "We open at 9:00 a.m. daily"), ("", "Our owner is Dr. Lee"))
    got = split_instructions("You are Ava at the Harborview Inn. Note: pets are welcome. Parking: free.")
    assert ("", "Pets are welcome") in got.facts


@pytest.mark.parametrize("sentence, fact", [
    ("You should know that we are open daily from 9 to 5.", "We are open daily from 9 to 5"),
    ("Please note that parking is free after 6 PM.", "Parking is free after 6 PM"),
    ("Keep in mind: the studio is closed on bank holidays.", "The studio is closed on bank holidays"),
])
def test_a_sentence_that_hands_the_assistant_a_fact_is_that_fact(sentence, fact):
    got = split_instructions(f"You are Ava at the Harborview Inn. {sentence} Remember to smile.")
    assert ("", fact) in got.facts and got.rules == ("Remember to smile.",)


def test_an_intro_that_states_several_things_is_a_fact_each():
    got = split_instructions("You are Wren at Inkwell Print, a print shop at 3 Foundry Street; the shop's number is "
                             "555-0100 and the manager is Odile Ferreira.")
    assert ("", "The shop's number is 555-0100") in got.facts and ("", "The manager is Odile Ferreira") in got.facts


@pytest.mark.parametrize("sentence, parts", [
    # a participle or "over" after "and" continues the subject, and a condition's comma is no clause's end
    ("A dress shirt washed and pressed is $3.50.", ["A dress shirt washed and pressed is $3.50."]),
    ("Patients aged 65 and over are charged $70 per session.", ["Patients aged 65 and over are charged $70 per session."]),
    ("I'm Tom, the owner, so if anything needs sorting out, folks can ask for me.",
     ["I'm Tom, the owner, so if anything needs sorting out, folks can ask for me."]),
    # a relative clause says more of the noun before it
    ("The office is owned by Gloria Hartwell, an enrolled agent who has been doing taxes for 22 years, and our other "
     "preparer is Dev Malhotra.", ["The office is owned by Gloria Hartwell, an enrolled agent who has been doing taxes "
                                   "for 22 years.", "Our other preparer is Dev Malhotra."]),
    # still two facts: a name that looks like a participle, a short noun ending in -ed
    ("Bank Heist is the easiest, Haunted Library is in the middle.", ["Bank Heist is the easiest.", "Haunted Library is in the middle."]),
    ("Bed linens are included and towels are extra.", ["Bed linens are included.", "Towels are extra."]),
])
def test_clauses_keep_a_subject_with_its_verb(sentence, parts):
    assert clauses(sentence) == parts


def test_sentences_about_how_to_answer_are_rules_not_facts():
    """A formal persona's "Please assist callers ..." and "Responses should be formal ..." are how to talk: offered as
    facts they were shown with questions they do not answer (heldout8's physiotherapy clinic)."""
    got = split_instructions("You are the virtual receptionist for Harbourside Physiotherapy Clinic. Please assist callers "
                             "courteously using the following information. Follow-up sessions cost $85. Responses should "
                             "be formal and concise.")
    assert got.rules == ("Please assist callers courteously using the following information.",
                         "Responses should be formal and concise.")
    assert got.facts == (("", "Follow-up sessions cost $85"),)


MARKDOWN = """# Role & Objective
You are Jo, the phone assistant for Corner Cuts Barbershop. Your goal is to book haircuts.
Help callers with hours, prices and bookings.

## Hours
- Monday to Friday: 9am to 6pm
- Sunday: closed

## Prices
- Haircut: $25
- Kids (under 10): $15
- Walk-ins welcome, but appointments get priority

## Personality & Tone
- Warm, upbeat, concise
- Keep answers under 2 sentences.
"""


def test_instructions_written_in_markdown_sections():
    """A prompt in sections, as the Realtime prompting guides write one: the headings are no facts, a role section is
    the intro, a tone section's lines are rules (one with a number would stay a fact), and each list item is a sentence
    of its own (before, the items without a full stop ran together into one "fact" with the headings in it)."""
    got = split_instructions(MARKDOWN)
    assert got.name == "Corner Cuts Barbershop"
    assert got.intro == ("You are Jo, the phone assistant for Corner Cuts Barbershop. Your goal is to book haircuts. "
                         "Help callers with hours, prices and bookings.")
    assert got.rules == ("Warm, upbeat, concise.", "Keep answers under 2 sentences.")
    assert got.facts == (("Monday to Friday", "9am to 6pm"), ("Sunday", "closed"), ("Haircut", "$25"),
                         ("", "Kids (under 10): $15"), ("", "Walk-ins welcome, but appointments get priority"))
    assert not any("#" in v for _, v in got.facts)


def test_a_rules_section_keeps_who_the_assistant_is_and_the_numbers_as_facts():
    """A short prompt with everything under "# Instructions": the "You are ..." line is the intro and a line with a
    price is a fact; only the lines on how to talk are rules."""
    got = split_instructions("# Instructions\nYou are Max, the assistant for Joe's Garage.\nAn oil change is $39.\nBe brief.")
    assert got.intro == "You are Max, the assistant for Joe's Garage." and got.name == "Joe's Garage"
    assert got.rules == ("Be brief.",) and got.facts == (("", "An oil change is $39"),)


def test_plain_headings_are_no_facts_and_head_facts():
    """Terse instructions with a word alone on a line over each part ("Hours", "Prices", "Rules"): the headings are
    no facts, and a gym's "Rules" are facts callers ask about, not rules for the assistant."""
    p = split_instructions("Phone assistant - Granite Loft Climbing.\n\nHours\nMon-Fri: 6am-11pm\nSat: 8am-10pm\n\n"
                           "Prices\nDay pass - $22\n\nRules\nEveryone signs the online waiver before their first visit.\n"
                           "Free parking")
    texts = [v for _, v in p.facts]
    assert not {"Hours", "Prices", "Rules"} & set(texts)
    assert ("Mon-Fri", "6am-11pm") in p.facts and ("Day pass", "$22") in p.facts  # (with the line above: "key - value")
    assert "Everyone signs the online waiver before their first visit" in texts
    assert "Free parking" in texts  # the last line heads nothing
    # a heading over one line is its key
    assert ("Parking", "Free lot next to the building") in split_instructions(
        "Hours\nMon-Fri: 6am-11pm\n\nParking\nFree lot next to the building\n\nNo pets.").facts


def test_a_number_with_a_letter_ends_a_sentence():
    """"W-2s and 1099s." ends its sentence (its "s." is no initial, as the "J." of "J. Smith" is)."""
    assert sentences("Bring all your W-2s and 1099s. The office is owned by Gloria Hartwell.") == [
        "Bring all your W-2s and 1099s.", "The office is owned by Gloria Hartwell."]
    assert sentences("Ask for J. Smith at the desk.") == ["Ask for J. Smith at the desk."]


def test_a_rules_section_keeps_the_business_rules_for_its_patrons_as_facts():
    """Under "# Rules", a line about the business's patrons ("Everyone signs the waiver", "Kids must be with an adult")
    is a policy callers ask about: a fact; a line telling the assistant what to do stays a rule."""
    p = split_instructions("# Role\nYou are Kai at Granite Loft Climbing.\n\n# Rules\n"
                           "- Everyone signs the online waiver before their first visit\n"
                           "- Never give climbing technique tips\n- Kids must be with an adult\n")
    assert p.rules == ("Never give climbing technique tips.",)
    assert ("", "Everyone signs the online waiver before their first visit") in p.facts
    assert ("", "Kids must be with an adult") in p.facts


FAQ = """You are Pip, the phone assistant of Copper Kettle Cycles. Keep answers short.

Frequently asked questions

Q: Do you fix electric bikes?
A: Yes, we service e-bikes from every major brand. Battery diagnostics cost $30.

**Q:** How long does a tune-up take?
**A:** Usually two days. Book at least a week ahead in spring.

Question: Who owns the shop?
Answer: Hana Sato, since 2015.
"""


def test_a_faq_of_question_and_answer_lines_is_facts_keyed_by_their_questions():
    p = split_instructions(FAQ)
    assert p.facts == (
        ("Do you fix electric bikes?", "Yes, we service e-bikes from every major brand"),
        ("Do you fix electric bikes?", "Battery diagnostics cost $30"),
        ("How long does a tune-up take?", "Usually two days"),
        ("How long does a tune-up take?", "Book at least a week ahead in spring"),
        ("Who owns the shop?", "Hana Sato, since 2015"),
    )
    assert p.rules == ("Keep answers short.",)  # the FAQ's heading is no fact, nor are the "Q:" lines
    assert subject(*p.facts[1]) == "Do you fix electric bikes?"  # what a fact of a FAQ is about: its question


def test_a_faq_question_without_its_answer_states_nothing():
    assert split_instructions("Q: Are you open late?").facts == ()


def test_a_table_gives_a_fact_per_row_keyed_by_its_first_cell():
    markdown = ("You are Ava at Spin Cycle.\n\n## Prices\n| Service | Price | Ready |\n|---|---|---|\n"
                "| Wash and fold | $2 a pound | next day |\n| Duvet | $25 | in 2 days |\n\nKeep answers short.")
    assert split_instructions(markdown).facts == (("Wash and fold", "$2 a pound, ready next day"),
                                                  ("Duvet", "$25, ready in 2 days"))
    bare = split_instructions("You are Ava at Spin Cycle.\n- Small dog | $40 | 1 hour\n- Large dog | $75 | 2 hours")
    assert bare.facts == (("Small dog", "$40, 1 hour"), ("Large dog", "$75, 2 hours"))  # no header: the cells alone


def test_a_key_over_a_paragraph_keeps_its_first_sentence_or_heads_prose():
    heading = split_instructions("You are Mira at Stitch in Time.\n\nOur prices: shortening trousers costs $16 a pair. A new "
                                 "zip is $18. Taking in a jacket starts from $45.")
    assert heading.facts[-3:] == (("", "Shortening trousers costs $16 a pair"), ("", "A new zip is $18"),
                                  ("", "Taking in a jacket starts from $45"))
    keyed = split_instructions("You are Ava at Tidewater.\n\nMinimum age: 12. Children 5 to 11 ride with an adult. "
                               "Under 5s stay ashore.\nParking: free lot behind us. Overflow on Elm Street.\n"
                               "Farm shop: Open all year. Cash and card. Our eggs are $3 a box.")
    # the few words after a key's first sentence that state nothing alone are the key's ("Cash and card.")
    assert keyed.facts[-7:] == (("Minimum age", "12"), ("Minimum age", "Under 5s stay ashore"),
                                ("Parking", "free lot behind us. Overflow on Elm Street"), ("Farm shop", "Open all year"),
                                ("Farm shop", "Cash and card"), ("", "Children 5 to 11 ride with an adult"),
                                ("", "Our eggs are $3 a box"))


CONFIG = """assistant: Rory
business: Hop Yard
hours:
  mon-thu: 15:00-20:00
  fri_sun: 10:00-22:00
  sat: 09:00-19:00
prices:
  jump_60_min: "$14"   # socks extra
not_allowed:
  - food or drink
  - glass bottles
night_jump:
  when: fridays 18:00-21:00
  price: $16 per person
rules:
  min_age: 5
  waiver: must be signed online before jumping
online_code: HOP10  # 10% off online

Keep answers short and cheerful. If a caller asks about anything else, say kindly that you can only help with Hop Yard."""


def test_a_nested_configuration_is_facts_keyed_by_their_parents():
    parsed = split_instructions(CONFIG)
    facts = dict(parsed.facts)
    assert facts["Hours Monday to Thursday"] == "15:00-20:00"  # days as written out, under what they are the days of
    assert facts["Hours Saturday"] == "09:00-19:00"
    assert facts["Hours Friday to Sunday"] == "10:00-22:00"  # (two days apart: a run of three)
    assert facts["Jump 60 minutes"] == "$14 (socks extra)"  # a grouping parent adds nothing; a comment is said
    assert facts["Not allowed"] == "food or drink, glass bottles"  # a short list: one fact
    assert facts["Night jump when"] == "fridays 18:00-21:00"
    assert facts["Night jump price"] == "$16 per person"
    assert facts["Minimum age"] == "5"
    assert facts["Waiver"] == "must be signed online before jumping"  # a configuration's "rules:" are the business's
    assert facts["Online code"] == "HOP10 (10% off online)"
    assert not any(k in ("hours", "prices", "rules", "night_jump") for k, _ in parsed.facts)
    assert parsed.rules == ("Keep answers short and cheerful.",
                            "If a caller asks about anything else, say kindly that you can only help with Hop Yard.")


def test_nested_bullets_take_their_parent_only_where_it_says_something():
    text = ("# Context\n- Business\n  - Name: Fret Shop\n  - Phone: 555-0100\n- Opening hours\n  - Saturday: 10 AM - 5 PM\n"
            "- Manicures\n  - Gel manicure: $38\n- Turnaround\n  - Setups: 3 working days\n- Policies\n"
            "  - Drop-offs welcome without an appointment")
    facts = split_instructions(text).facts
    assert ("Name", "Fret Shop") in facts and ("Phone", "555-0100") in facts  # "Business" only groups
    assert ("Opening hours Saturday", "10 AM - 5 PM") in facts
    assert ("Gel manicure", "$38") in facts  # its key says "manicure" already
    assert ("Turnaround Setups", "3 working days") in facts
    assert ("", "Drop-offs welcome without an appointment") in facts  # a parent over no key: value lines stays a heading
    assert not any(v in ("Business", "Manicures", "Turnaround") for _, v in facts)


def test_a_pasted_json_object_is_facts_keyed_by_their_path():
    text = ('You are the phone assistant for Lakeside Lanes. Use only this data:\n'
            '{"name": "Lakeside Lanes", "opening_hours": {"weekdays": "10:00-22:00", "sat_sun": "09:00-23:00", '
            '"monday": "closed"}, "lane_length_m": 18,\n'
            ' "prices": {"shoe_hire": "$2.50"}, "parties": [{"package": "Silver", "price": "$15 per child"}],\n'
            ' "payment": ["cash", "card"], "wheelchair_access": true}\nKeep it short.')
    parsed = split_instructions(text)
    facts = dict(parsed.facts)
    assert facts["Opening hours weekdays"] == "10:00-22:00"
    assert facts["Opening hours Saturday and Sunday"] == "09:00-23:00"
    assert facts["Opening hours Monday"] == "closed"
    assert facts["Lane length in metres"] == "18"
    assert facts["Shoe hire"] == "$2.50"
    assert facts["Parties Silver"] == "price $15 per child"
    assert facts["Payment"] == "cash, card"
    assert facts["Wheelchair access"] == "yes"
    assert parsed.name == "Lakeside Lanes"
    # not JSON after all: the text as it was
    assert split_instructions('Prices: {"a": 1, broken}').facts == (("Prices", '{"a": 1, broken}'),)


def test_an_ini_style_block_is_facts_keyed_by_their_sections():
    text = ("You are Pat, the assistant for Hill Stables.\n[general]\naddress = 4 Mill Lane\n\n[lessons]\n"
            "private_30_min = $35  ; per rider\ngroup_60_min = $25\n[hours]\ntue_sun = 08:00-17:00\nKeep answers short.")
    parsed = split_instructions(text)
    assert set(parsed.facts) >= {("Address", "4 Mill Lane"), ("Lessons private 30 minutes", "$35 (per rider)"),
                                 ("Lessons group 60 minutes", "$25"), ("Hours Tuesday to Sunday", "08:00-17:00")}
    assert parsed.rules == ("Keep answers short.",)
    # no section over them: "=" says nothing of a key
    assert split_instructions("Two plus two = four. Easy = fun.").facts == (("", "Two plus two = four"), ("", "Easy = fun"))


def test_a_deep_or_huge_nesting_is_read_through_and_its_keys_stay_short():
    deep = "\n".join(" " * i + ("north", "south", "east")[i % 3] + " wing:" for i in range(3000)) + "\n" + " " * 3000 + "price: $5"
    (key, value), = split_instructions(deep).facts
    assert value == "$5" and key == "North wing south wing east wing price"  # the nearest three parents only
    assert split_instructions("{" * 100_000 + "}" * 100_000).facts  # JSON nested past Python's stack: the text as it is
    assert split_instructions('{"a": ' * 900 + "1" + "}" * 900).facts == (("A", "1"),)


_LINE = st.tuples(st.integers(0, 6), st.sampled_from(["", "- ", "* ", "1. ", "[", "{", "\"", "## ", "<a>", "</a>", "<b n=\"x\">",
                                                     "[00:12] ", "Home | A | B | C | "]),
                  st.text(alphabet="abc_ :=$#-[]{}\"'09,.<>/|", max_size=20))


@settings(max_examples=300, deadline=None)
@given(st.lists(_LINE, max_size=25))
def test_any_nested_looking_text_splits_without_an_error(lines):
    text = "\n".join(" " * indent + mark + body for indent, mark, body in lines)
    parsed = split_instructions(text)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in parsed.facts)


def test_terse_key_dash_value_lines_are_pairs():
    text = ("screen repair - $89 approx, w/ 90 day warranty\nbattery swap - $49\nhrs - mon-sat 9-6\n"
            "We're open late - until 9 on Fridays.")
    facts = split_instructions(text).facts
    assert ("Screen repair", "$89 approx, w/ 90 day warranty") in facts and ("Battery swap", "$49") in facts
    assert ("Hours", "mon-sat 9-6") in facts  # the key said as words
    assert ("", "We're open late - until 9 on Fridays") in facts  # a verb before the dash: a sentence's dash
    # one such line alone is a sentence with a dash in it
    assert split_instructions("Parking - free behind the shop.").facts == (("", "Parking - free behind the shop"),)


def test_a_prompt_in_xml_tags_is_sections_and_keyed_facts():
    text = ("<role>\nYou are Ada, who answers calls for Elm Orchard.\n</role>\n\n<rules>\n- Keep answers short.\n"
            "- Only use what is inside <orchard_info>.\n</rules>\n\n<orchard_info>\n<owner>Sam Reed runs the orchard.</owner>\n"
            "<picking>\n  <season>August to October.</season>\n  <fruit name=\"apples\">$3 per kg.</fruit>\n"
            "  <parking>Free, behind the barn &amp; shop.</parking>\n</picking>\n</orchard_info>")
    parsed = split_instructions(text)
    assert "Ada" in parsed.intro
    assert parsed.rules == ("Keep answers short.", "Only use what is inside <orchard_info>.")  # a tag named mid-line: text
    assert set(parsed.facts) >= {("Owner", "Sam Reed runs the orchard"), ("Picking season", "August to October"),
                                 ("Picking apples fruit", "$3 per kg"), ("Picking parking", "Free, behind the barn & shop")}
    assert not any("<" in k + v for k, v in parsed.facts)


@pytest.mark.parametrize("text", [
    "<a>\n<b>one</b>\n</c>",  # tags that do not nest
    "<a>\n<b>one</b>\n",  # one never closed
    "Use <b>bold</b> words.\n<note>x",
])
def test_tags_that_do_not_nest_are_left_as_text(text):
    parsed = split_instructions(text)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in parsed.facts) and parsed.facts


def test_a_pasted_web_page_loses_its_menu_links_and_footer_and_reads_its_price_list():
    text = ("You answer calls for Ash Sweeps.\n\nHome | Services | Prices | FAQ | Contact\n\nOUR PRICES\n"
            "Standard sweep ........ $85\nSmoke test ........ $60\nRead more »\n\n© 2025 Ash Sweeps Ltd | Privacy\n")
    facts = split_instructions(text).facts
    assert ("Standard sweep", "$85") in facts and ("Smoke test", "$60") in facts
    assert not any(w in k + v for k, v in facts for w in ("Home", "Read more", "©", "Privacy"))
    # a table's header between bars is no menu: its rows follow
    table = "Prices:\n- Size | Price | Time\n- Small dog | $40 | 1 hour\n- Large dog | $75 | 2 hours"
    assert ("Small dog", "$40, time 1 hour") in split_instructions(table).facts


def test_a_transcripts_time_stamps_are_dropped():
    text = "[00:00] You're Jo, you answer for Kart Hub.\n[00:31] Parking is free out front.\n[01:02:15] Helmets are free."
    facts = split_instructions(text).facts
    assert ("", "Parking is free out front") in facts and ("", "Helmets are free") in facts
    assert not any("[" in v for _, v in facts)


def test_xml_nested_past_the_stack_or_huge_is_read_quickly():
    deep = "<a>\n" * 5000 + "<b>$5</b>\n" + "</a>\n" * 5000
    assert split_instructions(deep).facts  # the text as it is, no error
    wide = "<info>\n" + "".join(f"<item{i}>Price {i} is ${i}.</item{i}>\n" for i in range(3000)) + "</info>"
    assert len(split_instructions(wide).facts) == 3000


def test_a_question_over_key_value_lines_leads_into_nothing_after_them():
    text = ("You answer for Ash Sweeps.\nFAQ\n+ How often should it be swept?\nWood burners: twice a year.\n"
            "+ Can you remove a nest?\nNesting birds are protected by law, so we wait for the autumn.")
    facts = split_instructions(text).facts
    assert ("Wood burners", "twice a year") in facts
    assert ("", "Can you remove a nest? Nesting birds are protected by law, so we wait for the autumn") in facts
    assert not any("How often" in v for _, v in facts)
