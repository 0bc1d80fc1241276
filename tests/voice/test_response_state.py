"""A response's phase (``voice.response``): every move the transition table allows, every other one refused, and the
loop's named moves (park, resume, adopt, finish, close) on top of it."""

from __future__ import annotations

import itertools

import pytest

from voice.response import FINISHED, SPECULATIVE, TRANSITIONS, Kind, Phase, Response
from voice.turns import IllegalTransition

ALLOWED = [(a, b) for a, tos in TRANSITIONS.items() for b in tos]
REFUSED = [(a, b) for a, b in itertools.product(Phase, Phase) if b not in TRANSITIONS[a]]


def _at(phase: Phase, **kw) -> Response:
    return Response(first_voiced=0, last_voiced=100, phase=phase, **kw)


def test_the_table_covers_every_phase_and_closed_is_the_only_end():
    assert set(TRANSITIONS) == set(Phase)
    assert [p for p in Phase if not TRANSITIONS[p]] == [Phase.CLOSED]
    assert all(Phase.CLOSED in TRANSITIONS[p] for p in Phase if p is not Phase.CLOSED)  # anything may be stopped
    assert all(p not in TRANSITIONS[p] for p in Phase)  # no move stays in place
    assert len(ALLOWED) == 15 and len(ALLOWED) + len(REFUSED) == len(Phase) ** 2


@pytest.mark.parametrize("start, to", ALLOWED, ids=[f"{a.value}->{b.value}" for a, b in ALLOWED])
def test_every_allowed_move(start, to):
    r = _at(start)
    r.advance(to)
    assert r.phase is to


@pytest.mark.parametrize("start, to", REFUSED, ids=[f"{a.value}->{b.value}" for a, b in REFUSED])
def test_every_other_move_is_refused(start, to):
    r = _at(start)
    with pytest.raises(IllegalTransition, match=f"from {start.value} to {to.value}"):
        r.advance(to)
    assert r.phase is start


def test_what_each_phase_says():
    assert SPECULATIVE == {Phase.SPECULATING, Phase.PARKED, Phase.HELD}
    assert FINISHED == {Phase.HELD, Phase.DONE, Phase.FAILED, Phase.CLOSED}
    for p in Phase:
        r = _at(p)
        assert r.speculative == (p in SPECULATIVE) and r.finished == (p in FINISHED)
        assert r.released == (p in (Phase.ANSWERING, Phase.DONE))
        assert r.ready(0.0) == (p in (Phase.SPECULATING, Phase.ANSWERING))  # parked work waits
    r = _at(Phase.ANSWERING, due_s=2.0)
    assert not r.ready(1.0) and r.ready(2.0)  # a paced answer waits for its simulated time


def test_a_speculation_adopted_at_each_point_of_its_work():
    r = _at(Phase.SPECULATING)
    r.adopt()
    assert r.phase is Phase.ANSWERING
    r = _at(Phase.PARKED)
    r.adopt()
    assert r.phase is Phase.ANSWERING
    r = _at(Phase.SPECULATING)
    r.finish()  # the whole answer made while held
    assert r.phase is Phase.HELD
    r.adopt()
    assert r.phase is Phase.DONE
    for p in (Phase.FAILED, Phase.ANSWERING, Phase.DONE, Phase.CLOSED):
        with pytest.raises(IllegalTransition):
            _at(p).adopt()


def test_park_and_resume_touch_only_work_under_way():
    r = _at(Phase.SPECULATING)
    r.park()
    assert r.phase is Phase.PARKED
    r.park()
    assert r.phase is Phase.PARKED
    r.resume()
    assert r.phase is Phase.SPECULATING
    r.resume()
    assert r.phase is Phase.SPECULATING
    for p in (Phase.HELD, Phase.FAILED):  # nothing left to wait: no move
        r = _at(p)
        r.park()
        r.resume()
        assert r.phase is p


def test_finish_and_close():
    r = _at(Phase.ANSWERING)
    r.finish()
    assert r.phase is Phase.DONE
    r = _at(Phase.SPECULATING)
    r.advance(Phase.FAILED)  # a degenerate transcription
    r.finish()  # (its work then ran out)
    assert r.phase is Phase.FAILED
    with pytest.raises(IllegalTransition):
        _at(Phase.DONE).finish()
    closed = []

    def work():
        try:
            yield
        finally:
            closed.append(True)

    r = _at(Phase.ANSWERING)
    r.gen = work()
    next(r.gen)
    r.close()
    assert r.phase is Phase.CLOSED and closed == [True]
    r.close()  # stopped once: nothing more
    assert r.phase is Phase.CLOSED and closed == [True]
    with pytest.raises(IllegalTransition):
        r.advance(Phase.CLOSED)


def test_kinds_and_what_they_answer():
    assert _at(Phase.ANSWERING).kind is Kind.ANSWER
    assert [k for k in Kind if _at(Phase.ANSWERING, kind=k).user_turn] == [Kind.ANSWER, Kind.TRANSCRIBE]


def test_answered_and_transcribed_are_data():
    r = _at(Phase.ANSWERING)
    assert r.transcript is None and not r.answered
    r.transcript, r.announced = "", 1
    assert r.answered
