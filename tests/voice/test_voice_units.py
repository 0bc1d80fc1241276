"""Sans-I/O parts of the voice loop with hand-made inputs: turn machine, latency report,
clocks, audio plumbing."""

from __future__ import annotations

import numpy as np
import pytest

from voice.audio import AudioError, BufferSink, Resampler, chunks, read_wav, resample, to_pcm16, write_wav
from voice.clock import VirtualClock
from voice.latency import TurnTrace, percentile, summarize
from voice.turns import IllegalTransition, TurnEvent, TurnMachine, TurnState


def test_turn_machine_normal_cycle_and_barge_in():
    m = TurnMachine()
    m.fire(TurnEvent.SPEECH_STARTED)
    assert m.fire(TurnEvent.SPEECH_STOPPED) is TurnState.THINKING
    assert m.fire(TurnEvent.ANSWER_AUDIO) is TurnState.SPEAKING
    assert m.fire(TurnEvent.BARGE_IN) is TurnState.LISTENING
    m.fire(TurnEvent.SPEECH_STOPPED)
    assert m.fire(TurnEvent.NO_ANSWER) is TurnState.LISTENING


def test_turn_machine_rejects_illegal_events():
    m = TurnMachine()
    with pytest.raises(IllegalTransition):
        m.fire(TurnEvent.ANSWER_AUDIO)
    m.fire(TurnEvent.SPEECH_STOPPED)
    with pytest.raises(IllegalTransition):
        m.fire(TurnEvent.SPEECH_STOPPED)


def _trace(**stamps):
    t = TurnTrace(turn=1, budget_ms=500)
    for k, v in stamps.items():
        t.mark(k, v)
    return t


def test_report_spans_add_up_and_verdict():
    # speculative turn: transcript before the endpoint, audio held until it
    t = _trace(speech_start=0.0, last_voiced=1.0, transcript=1.25, first_token=1.30, first_phrase=1.33,
               tts_first_audio=1.36, endpoint=1.40, answer_audio=1.40, first_audio=1.40)
    r = t.report()
    lat = r.latency_ms
    assert lat["asr_ms"] == pytest.approx(-150)
    parts = ("endpoint_ms", "asr_ms", "first_phrase_ms", "tts_first_audio_ms", "hold_ms")
    assert sum(lat[p] for p in parts) == pytest.approx(lat["voice_to_voice_ms"])
    assert lat["voice_to_voice_ms"] == pytest.approx(400)
    assert r.within_budget and r.overrun_ms == 0
    late = _trace(last_voiced=0.0, endpoint=0.4, transcript=0.5, first_phrase=0.7, tts_first_audio=0.75,
                  answer_audio=0.75).report()
    assert not late.within_budget and late.overrun_ms == pytest.approx(250)
    d = late.to_dict()
    for key in ("turn", "transcript", "reply", "latency_ms", "budget_ms", "within_budget", "mitigation"):
        assert key in d


def test_unanswered_turn_is_not_within_budget():
    r = _trace(last_voiced=0.0, endpoint=0.4).report()
    assert r.voice_to_voice_ms is None and not r.within_budget


def test_summary_percentiles():
    assert percentile([1, 2, 3, 4, 5], 0.5) == 3
    assert percentile([0, 10], 0.95) == pytest.approx(9.5)
    reps = [_trace(last_voiced=0.0, endpoint=0.4, answer_audio=0.4 + i / 10).report() for i in range(4)]
    s = summarize(reps)
    assert s["turns"] == 4 and s["within_budget"] == 2 and s["budget_hit_rate"] == 0.5
    assert s["voice_to_voice_ms"]["p50"] == pytest.approx(550)


def test_virtual_clock_adds_work_time_only():
    c = VirtualClock()
    c.advance_to(1.0)
    c.advance_to(0.5)  # never goes back
    assert c.now() == 1.0
    with c.working():
        sum(range(200000))
    assert c.now() > 1.0


def test_resampler_accounts_for_every_sample():
    rs = Resampler(44100, 16000)
    total = 0
    rng = np.random.default_rng(0)
    for n in rng.integers(1, 2000, size=300):
        total += len(rs(np.zeros(n, np.int16)))
    assert total + rs.lag == int(np.floor(rs._in * 16000 / 44100))
    assert 0 <= rs.lag < 16000 // 10  # the filter holds back well under 100 ms


def test_resample_preserves_a_tone():
    t = np.arange(8000) / 8000
    x = to_pcm16(0.5 * np.sin(2 * np.pi * 440 * t))
    y = resample(x, 8000, 16000)
    assert len(y) == 16000
    spec = np.abs(np.fft.rfft(y.astype(np.float32)))
    assert abs(np.argmax(spec) - 440) <= 1


def test_read_wav_mixes_channels_and_reports_bad_files(tmp_path):
    import soundfile as sf

    st = np.stack([np.full(800, 0.5), np.full(800, -0.5)], axis=1)
    sf.write(tmp_path / "s.wav", st, 8000)
    pcm, rate = read_wav(tmp_path / "s.wav")
    assert rate == 8000 and pcm.shape == (800,) and np.abs(pcm).max() <= 1
    (tmp_path / "bad.wav").write_bytes(b"RIFF0000WAVEjunk")
    with pytest.raises(AudioError, match="bad.wav"):
        read_wav(tmp_path / "bad.wav")
    with pytest.raises(AudioError, match="not found"):
        read_wav(tmp_path / "missing.wav")
    sf.write(tmp_path / "empty.wav", np.zeros((0, 1)), 16000)
    with pytest.raises(AudioError, match="no samples"):
        read_wav(tmp_path / "empty.wav")


def test_buffer_sink_render_and_cut(tmp_path):
    s = BufferSink(1000)
    s.play(0.0, np.full(500, 100, np.int16))
    s.play(0.5, np.full(500, 200, np.int16))
    s.clear_after(0.7)  # barge-in at 0.7 s: the rest of the second piece is dropped
    out = s.render()
    assert len(out) == 700 and out[100] == 100 and out[600] == 200
    write_wav(tmp_path / "o.wav", out, 8000)
    assert read_wav(tmp_path / "o.wav")[0].shape == (700,)


def test_chunks_cover_the_signal():
    x = np.arange(1000, dtype=np.int16)
    parts = list(chunks(x, 16000, 20))
    assert [c.start for c in parts] == [0, 320, 640, 960]
    assert np.array_equal(np.concatenate([c.pcm for c in parts]), x)


def test_input_buffer_stays_bounded_and_exact():
    """Hours of input keep memory bounded; recent audio stays addressable by stream position."""
    from voice.audio import AudioChunk
    from voice.input_buffer import KEEP_AUDIO_S, InputBuffer

    buf = InputBuffer(VirtualClock())
    n = 16000 * 2  # 2 s chunks
    total = (3 * KEEP_AUDIO_S) // 2 * n
    for i in range(0, total, n):
        pcm = np.full(n, (i // n) % 100, np.int16)
        buf.append(AudioChunk(pcm, 16000, i), keep_from=None)
    assert buf.end_sample == total and buf.input_time == total / 16000
    assert buf.capacity_samples <= 2 * KEEP_AUDIO_S * 16000 and buf.base_sample > 0  # ~2.5 MB, however long the session
    tail = buf.utterance(total - 3 * n, total - 1, padding_ms=200)
    expect = np.concatenate([np.full(n, ((total - k * n) // n) % 100, np.int16) for k in (3, 2, 1)])
    assert np.array_equal(np.round(tail[200 * 16:] * 32768).astype(np.int16), expect)


def test_input_buffer_keeps_what_a_turn_needs():
    """While a turn may still need its audio (``keep_from``), none of it is dropped, however long."""
    from voice.audio import AudioChunk
    from voice.input_buffer import InputBuffer

    buf = InputBuffer(VirtualClock(), keep_s=1)
    for i in range(5):
        buf.append(AudioChunk(np.full(16000, i, np.int16), 16000, 0), keep_from=0)
    assert buf.base_sample == 0
    first = buf.utterance(0, 16000, padding_ms=0)
    assert len(first) == 16000 and not first.any()


def test_input_buffer_stays_bounded_while_turns_come_and_go():
    """Sessions that talk and listen in turn: the buffer fills up while some turn is open, most times; it keeps that
    turn's audio and the last ``keep_s`` seconds, and its size stays bounded (it used to double each such time)."""
    from voice.audio import AudioChunk
    from voice.input_buffer import InputBuffer

    buf = InputBuffer(VirtualClock(), keep_s=4)
    n = 1600  # 0.1 s chunks
    for i in range(6000):  # 10 minutes: a 3 s turn starts every 6 s, open for 5 s (its speech and the answer)
        t = i % 60
        turn_first = (i - t) * n
        buf.append(AudioChunk(np.full(n, i % 30000, np.int16), 16000, 0), keep_from=turn_first if t < 50 else None)
        if t == 30:  # the turn's audio is all there
            audio = buf.utterance(turn_first, turn_first + 30 * n - 1, padding_ms=0)
            assert len(audio) == 30 * n - 1
            assert round(audio[0] * 32768) == i - 30 and round(audio[-1] * 32768) == i - 1
    assert buf.capacity_samples <= 16 * 16000


def test_input_buffer_maps_samples_to_clock_time_and_resampler_lag():
    """Input at another rate streams through a resampler; its filter delay is added back to the clock time."""
    from voice.audio import AudioChunk
    from voice.input_buffer import InputBuffer

    buf = InputBuffer(VirtualClock())
    out = buf.append(AudioChunk(np.zeros(4410, np.int16), 44100, 0), keep_from=None)
    assert len(out) + buf.lag_samples == 1600 and buf.lag_samples > 0
    assert buf.input_time == pytest.approx(0.1)  # what came out, plus what the filter still owes
    assert buf.audio_time(0) == pytest.approx(buf.lag_samples / 16000)


def test_input_buffer_manual_commits():
    from voice.audio import AudioChunk
    from voice.input_buffer import InputBuffer

    buf = InputBuffer(VirtualClock())
    assert buf.take_uncommitted() is None
    buf.append(AudioChunk(np.zeros(800, np.int16), 16000, 0), keep_from=None)
    assert buf.uncommitted_s == 0.05
    assert buf.take_uncommitted() == (0, 799) and buf.take_uncommitted() is None
    buf.append(AudioChunk(np.zeros(800, np.int16), 16000, 0), keep_from=None)
    buf.mark_committed()  # an automatic turn used it
    assert buf.uncommitted_s == 0.0 and buf.take_uncommitted() is None


def test_word_error_rate_counts_word_edits_over_the_reference():
    from voice.replay import edit_distance, word_error_rate, words

    assert words("Who's the owner-of Bright Bakery?") == ["who's", "the", "owner", "of", "bright", "bakery"]
    assert edit_distance(list("kitten"), list("sitting")) == 3
    assert word_error_rate("Who is the owner?", "who is the owner") == 0.0
    assert word_error_rate("Who is the owner?", "to the owner") == 0.5  # one substitution, one deletion, of 4
    assert word_error_rate("", "anything") == 1.0  # an insertion over no reference words counts against one
