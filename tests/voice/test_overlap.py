"""Speech over the answer judged by evidence (``voice.overlap``): the policy's verdicts, and the loop pausing, resuming
and interrupting on the stand-in scene of test_loop_policy.py (hand-made endpointer events on a virtual clock; the
answer "Sure." plays 1.9-2.15 s and "We open at nine." 2.15-3.15 s)."""

from __future__ import annotations

import pytest
from test_loop_policy import ANSWER, PAUSED, QUESTION, STARTED, STOPPED, Scene, _approx

from voice.loop import LoopConfig
from voice.loop_events import BargeIn, OutputPaused, OutputResumed, TurnEnded, UserSpeechStarted
from voice.overlap import LISTENER_PROMPT, InterruptionConfig, Verdict, content_words, judge
from voice.vad import Pause, SpeechResumed, SpeechStarted, SpeechStopped

pytestmark = pytest.mark.unit

CFG = InterruptionConfig()
OVER = SpeechStarted(sample=42400, first_voiced_sample=40000)  # 2.5 s, known at 2.65 s: half of "We open at nine." played
QUIET = Pause(sample=46400, first_voiced_sample=40000, last_voiced_sample=43199, start_pad=36800, end_pad=46400)  # 2.9 s
DONE = SpeechStopped(sample=50400, first_voiced_sample=40000, last_voiced_sample=43199, start_pad=36800, end_pad=46400)
REPLIES = {QUESTION: ANSWER, "Stop.": "Okay.", "Wait, when do you close?": "At six.", "Yeah, but when do you close?": "At six."}


def _the_user_ends(s: Scene, first_voiced: int) -> None:
    """The user's speech from ``first_voiced`` goes on to 3.5 s, pauses (3.75 s) and stops (4 s); the loop finishes."""
    span = dict(first_voiced_sample=first_voiced, last_voiced_sample=56000, start_pad=first_voiced - 3200, end_pad=60000)
    for ev in (Pause(sample=60000, **span), SpeechStopped(sample=64000, **span)):
        s.at(ev.sample, ev)
    s.loop.finish()


def _scene(*overlap_texts, config: LoopConfig | None = None) -> Scene:
    s = Scene(config, texts=(QUESTION, *overlap_texts), replies=REPLIES)
    for ev in (STARTED, PAUSED, STOPPED):
        s.at(ev.sample, ev)
    s.settle()  # the adopted answer's second phrase made
    return s


@pytest.mark.parametrize("text, words", [
    ("Uh-huh.", []), ("Mm-hmm.", []), ("Yeah, right.", []), ("OK. Got it.", []), ("All right", []), ("(coughing)", []),
    ("[BLANK_AUDIO]", []), ("Stop.", ["stop"]), ("Yeah, but when do you close?", ["but", "when", "do", "you", "close"]),
    ("No.", ["no"]), ("Wait", ["wait"]), ("Mm-m", []), ("M-H-M", []), ("MMMHMM", []), ("Uh-uh.", []), ("Ah, ooh.", []),
    ("Hmm, what about Monday?", ["what", "about", "monday"]), ("Hummus", ["hummus"]), ("Him.", ["him"]),
])
def test_content_words_leave_out_backchannels_and_non_speech(text, words):
    assert content_words(text) == words


@pytest.mark.parametrize("text, speech_ms, quiet, verdict", [
    (None, 300, False, Verdict.WAIT),  # not heard yet
    ("Uh-huh.", 400, True, Verdict.BACKCHANNEL),
    ("", 300, True, Verdict.NOISE),  # a cough: no words
    ("Stop.", 350, True, Verdict.INTERRUPT),  # one word of content is enough
    ("Wait, when", 500, False, Verdict.INTERRUPT),  # going on, and already words
    ("Here", 500, False, Verdict.WAIT),  # going on: one word may be a part misheard ("yeah" cut short)
    ("Here", 450, True, Verdict.INTERRUPT),  # ... the whole of it: one word is enough
    ("", 600, False, Verdict.WAIT),  # sound without words, not yet long
    ("", 1000, False, Verdict.INTERRUPT),  # ... long: a turn whatever it is
    ("Yeah yeah okay", 1500, False, Verdict.WAIT),  # backchannel words get longer
    ("Yeah yeah okay right", 2000, False, Verdict.INTERRUPT),
])
def test_judge(text, speech_ms, quiet, verdict):
    assert judge(text, speech_ms, quiet, CFG) is verdict


def test_the_config_is_checked():
    with pytest.raises(ValueError):
        InterruptionConfig(min_speech_ms=800, max_speech_ms=500)
    with pytest.raises(ValueError):
        InterruptionConfig(mode="louder")
    assert InterruptionConfig(mode="duck").mode.value == "duck"


def test_a_backchannel_pauses_the_answer_which_resumes_where_it_paused_and_is_no_turn():
    s = _scene("Uh-huh.")
    n, c = len(s.events), len(s.sink.calls)
    s.at(OVER.sample, OVER)
    assert s.events[n:] == [OutputPaused(first_voiced_sample=40000, at_s=_approx(2.65))]
    assert s.sink.calls[c:] == [("clear_after", 2.65)]  # the voice paused at once: 150 ms after the speech start
    s.at(QUIET.sample, QUIET)  # quiet at 2.9 s: transcribed (50 ms), a backchannel
    s.at(DONE.sample, DONE)  # the endpointer's end of that utterance: no turn
    s.loop.finish()
    assert s.events[n + 1] == OutputResumed(at_s=_approx(2.95), kind="backchannel", text="Uh-huh.")
    assert s.sink.calls[c:] == [("clear_after", 2.65), ("play", 2.95, 500)]  # the rest of "We open at nine."
    (end,) = [e for e in s.events[n:] if isinstance(e, TurnEnded)]
    assert (end.spoken, end.reason) == (ANSWER, None) and not end.report.barge_in
    assert end.report.stamps["done"] == _approx(3.45)
    assert end.report.overlaps == ({"kind": "backchannel", "text": "Uh-huh.", "speech_start_s": 2.5, "paused_ms": 300.0},)
    assert end.report.to_dict()["overlaps"] == list(end.report.overlaps)
    assert s.llm.commits == [(QUESTION, ANSWER)] and s.loop.barge_ins == [] and len(s.loop.reports) == 1
    assert s.asr.prompts == [None, LISTENER_PROMPT]  # the question with the transcriber's own words, the overlap a listener's


def test_a_cough_resumes_the_answer_as_noise():
    s = _scene("")
    for ev in (OVER, QUIET, DONE):
        s.at(ev.sample, ev)
    s.loop.finish()
    assert [e.kind for e in s.events if isinstance(e, OutputResumed)] == ["noise"]
    assert s.loop.reports[-1].reply == ANSWER and s.loop.barge_ins == [] and s.llm.opened == [QUESTION]


def test_one_word_of_content_interrupts_heard_up_to_the_pause_and_is_the_next_turn():
    s = _scene("Stop.", "Stop.")  # (the overlap's transcription, then the new turn's at its pause)
    n = len(s.events)
    for ev in (OVER, QUIET, DONE):
        s.at(ev.sample, ev)
    s.loop.finish()
    kinds = [type(e).__name__ for e in s.events[n:]]
    assert kinds[:3] == ["OutputPaused", "UserSpeechStarted", "TurnEnded"]
    assert s.events[n + 1] == UserSpeechStarted(first_voiced_sample=40000, barge_in=True)
    cut = s.events[n + 2]
    assert (cut.spoken, cut.reason) == ("Sure. We open", "turn_detected") and cut.report.barge_in
    assert cut.report.stamps["done"] == _approx(2.65)  # the answer stopped when it paused
    assert s.loop.barge_ins == [BargeIn(speech_s=2.5, detected_s=2.65, stopped_s=2.65)]
    assert [(r.transcript, r.reply) for r in s.loop.reports] == [(QUESTION, "Sure. We open"), ("Stop.", "Okay.")]
    assert s.loop.reports[1].stamps["speech_start"] == _approx(2.5)
    assert s.llm.commits == [(QUESTION, "Sure. We open"), ("Stop.", "Okay.")]


def test_a_sentence_interrupts_while_it_goes_on_once_its_words_are_heard():
    s = _scene("Wait, when", "Wait, when do you close?", "Wait, when do you close?")
    n = len(s.events)
    s.at(OVER.sample, OVER)
    s.silence_until(48640)  # 3.04 s: 500 ms after its first voiced sample, still speaking (no pause): transcribed
    assert [type(e).__name__ for e in s.events[n:]] == ["OutputPaused", "UserSpeechStarted", "TurnEnded"]
    assert s.loop.barge_ins[0].stopped_s == _approx(2.65) and s.events[-1].spoken == "Sure. We open"
    _the_user_ends(s, 40000)
    assert [r.transcript for r in s.loop.reports] == [QUESTION, "Wait, when do you close?"]
    assert s.loop.reports[1].reply == "At six."


def test_the_user_going_on_after_a_backchannel_is_judged_again():
    s = _scene("Yeah.", "Yeah, but when", "Yeah, but when do you close?")
    s.at(OVER.sample, OVER)
    s.at(QUIET.sample, QUIET)  # "Yeah.": resumed at 2.95 s
    s.at(47200, SpeechResumed(sample=47200))  # 2.95 s: the same utterance goes on
    assert [type(e).__name__ for e in s.events][-2:] == ["OutputResumed", "OutputPaused"]
    s.silence_until(56000)  # 3.5 s: 500 ms after it went on: words of content
    assert s.loop.barge_ins and s.loop.reports[0].overlaps[0]["kind"] == "backchannel"
    _the_user_ends(s, 47200)
    assert [r.transcript for r in s.loop.reports] == [QUESTION, "Yeah, but when do you close?"]


def test_output_the_sink_cannot_take_back_goes_on_until_an_interruption_is_decided():
    s = _scene("Stop.", "Stop.", config=LoopConfig(interruption=InterruptionConfig(hold_output=False)))
    c = len(s.sink.calls)
    s.at(OVER.sample, OVER)
    assert s.sink.calls[c:] == []  # nothing taken back: the client plays on
    s.at(QUIET.sample, QUIET)
    s.silence_until(47360)
    assert s.sink.calls[c:] == [("clear_after", 2.95)]  # decided at 2.95 s (quiet at 2.9, 50 ms to transcribe)
    assert s.loop.barge_ins[0].stopped_s == _approx(2.95)


def test_a_backchannel_with_output_going_on_changes_nothing_the_client_hears():
    s = _scene("Okay.", config=LoopConfig(interruption=InterruptionConfig(hold_output=False)))
    c = len(s.sink.calls)
    for ev in (OVER, QUIET, DONE):
        s.at(ev.sample, ev)
    s.loop.finish()
    assert s.sink.calls[c:] == [] and s.loop.reports[-1].reply == ANSWER and s.loop.reports[-1].stamps["done"] == _approx(3.15)


def test_ducked_the_voice_goes_on_quieter_and_then_at_full_level_from_where_it_had_got():
    s = _scene("Uh-huh.", config=LoopConfig(interruption=InterruptionConfig(mode="duck")))
    c = len(s.sink.calls)
    for ev in (OVER, QUIET, DONE):
        s.at(ev.sample, ev)
    s.loop.finish()
    # quieter from 2.65 s; at 2.95 s the quiet rest is dropped and the last 200 ms play at full level
    assert s.sink.calls[c:] == [("clear_after", 2.65), ("play", 2.65, 500), ("clear_after", 2.95), ("play", 2.95, 200)]
    assert s.loop.reports[-1].reply == ANSWER and s.loop.reports[-1].stamps["done"] == _approx(3.15)


def test_ducked_an_interruption_stops_the_voice_when_it_is_decided():
    s = _scene("Stop.", "Stop.", config=LoopConfig(interruption=InterruptionConfig(mode="duck")))
    for ev in (OVER, QUIET, DONE):
        s.at(ev.sample, ev)
    s.loop.finish()
    assert s.loop.barge_ins[0].stopped_s == _approx(2.95) and s.loop.reports[0].stamps["done"] == _approx(2.95)


def test_the_same_words_as_a_whole_turn_after_the_answer_are_answered():
    s = _scene("Uh-huh.")
    s.llm.replies = {**REPLIES, "Uh-huh.": "Anything else?"}
    s.silence_until(56000)  # 3.5 s: the answer played out (3.15 s)
    start = SpeechStarted(sample=56000, first_voiced_sample=54400)
    span = dict(first_voiced_sample=54400, last_voiced_sample=60000, start_pad=51200, end_pad=62000)
    for ev in (start, Pause(sample=62000, **span), SpeechStopped(sample=68000, **span)):
        s.at(ev.sample, ev)
    s.loop.finish()
    assert not any(isinstance(e, OutputPaused) for e in s.events) and s.loop.barge_ins == []
    assert [(r.transcript, r.reply) for r in s.loop.reports] == [(QUESTION, ANSWER), ("Uh-huh.", "Anything else?")]


def test_input_cleared_while_judged_resumes_the_answer_and_the_next_speech_is_heard():
    s = _scene("Stop.", "Stop.")
    s.at(OVER.sample, OVER)
    s.loop.clear_input()  # (input_audio_buffer.clear): the speech over it is gone
    assert [e.kind for e in s.events if isinstance(e, OutputResumed)] == ["noise"]
    s.silence_until(46400)  # 2.9 s: a new utterance over the answer, seen by the restarted endpointer
    s.loop.on_vad(SpeechStarted(sample=46400, first_voiced_sample=45000))
    assert [type(e).__name__ for e in s.events][-1] == "OutputPaused"


def test_a_cancel_while_judged_ends_the_answer_and_the_speech_is_the_next_turn():
    s = _scene("Stop.", "Stop.")
    s.at(OVER.sample, OVER)
    assert s.loop.cancel()
    cut = [e for e in s.events if isinstance(e, TurnEnded)][-1]
    assert (cut.spoken, cut.reason) == ("Sure. We open", "client_cancelled") and s.loop.barge_ins == []
    for ev in (QUIET, DONE):
        s.at(ev.sample, ev)
    s.loop.finish()
    assert [r.transcript for r in s.loop.reports] == [QUESTION, "Stop."]


def test_immediate_mode_and_barge_in_off_are_unchanged():
    s = _scene("Uh-huh.", config=LoopConfig(interruption=InterruptionConfig(mode="immediate")))
    s.at(OVER.sample, OVER)
    assert s.loop.barge_ins and not any(isinstance(e, OutputPaused) for e in s.events)


def test_backchannel_words_going_on_are_waited_for_without_spinning():
    """Past ``max_speech_ms`` with only backchannel words heard, the loop has no work until the next check (it would
    otherwise be woken for nothing, over and over, without the input moving on)."""
    s = _scene("Yeah, yeah", "Yeah, yeah, okay", "Yeah, yeah, okay, right", "Yeah, yeah, okay, right", "x", config=LoopConfig(
        interruption=InterruptionConfig(check_ms=600)))
    s.at(OVER.sample, OVER)
    s.silence_until(48640)  # 0.54 s: checked, backchannel words: wait
    s.silence_until(56960)  # 1.06 s: past max_speech_ms, the next check at 1.14 s
    assert not s.loop.has_work() and s.loop.barge_ins == []
    s.silence_until(72640)  # 2 s of it: an interruption whatever it says
    assert len(s.loop.barge_ins) == 1
