"""Speech over the answer with the real engines (webrtcvad, Whisper tiny.en, the numba LLM, piper): each recorded case
of samples/overlap played over the answer to a sample question (``voice.replay.play_overlap``, on the virtual clock).
Backchannels, a cough and a knock leave the answer whole and make no turn; interruptions stop it (the voice pauses as
soon as the endpointer hears speech, within 300 ms of the sound's first sample on the audio's time) and are answered."""

from __future__ import annotations

import json

import pytest
from kinds import ENGINES, kind

from voice.loop_events import OutputPaused, OutputResumed, TurnEnded, UserSpeechStarted
from voice.replay import SAMPLES, play_overlap

SET = SAMPLES / "overlap"
META = json.loads((SET / "cases.json").read_text())
QUESTION = SAMPLES / "visit_01_address.wav"


@pytest.fixture(scope="module")
@kind(ENGINES)
def engines():
    from voice.engines import load_engines

    eng, _ = load_engines()
    return eng


@pytest.mark.parametrize("case", META["cases"], ids=lambda c: c["name"])
def test_each_recorded_case_has_its_outcome(engines, case):
    engines.llm.reset()
    loop, events, at = play_overlap(engines, QUESTION, SET / case["file"])
    ends = [e for e in events if isinstance(e, TurnEnded) and e.report is not None]
    if case["expected"] == "resume":
        assert loop.barge_ins == [] and len(loop.reports) == 1, [e.transcript for e in ends]
        (end,) = ends
        assert end.reason is None and end.spoken == end.report.reply  # the whole answer, played (and so kept in history)
        assert [o["kind"] for o in end.report.overlaps] == [e.kind for e in events if isinstance(e, OutputResumed)] != []
    else:
        assert len(loop.barge_ins) == 1 and len(loop.reports) == 2, [e.transcript for e in ends]
        first, second = loop.reports
        assert first.barge_in and not second.barge_in and second.reply
        # the voice paused when the endpointer heard speech (which was within 300 ms of the sound's first sample, on the
        # audio's own time), before the words were judged; the answer stopped there (bench/interruptions.py times it)
        (paused,) = [e for e in events if isinstance(e, OutputPaused)]
        kinds = [type(e) for e in events]
        assert kinds.index(OutputPaused) < kinds.index(UserSpeechStarted, kinds.index(OutputPaused))
        assert loop.barge_ins[0].stopped_s == paused.at_s
        assert loop.barge_ins[0].detected_s - (at + META["lead_silence_s"]) <= 0.3
