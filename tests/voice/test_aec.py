"""Echo cancellation (``voice.aec``): its parts on signals made here, and the speakerphone simulation
(``voice.speakerphone``): the real loop (webrtcvad, Whisper, the LLM, piper) on a virtual clock, its answers coming back
into its microphone through a synthetic room at -6 dB, the user's recorded questions on top.

Bars (issue 29): with the canceller the agent never interrupts itself over the sample conversations; a real
interruption over its own voice stops it within 300 ms of the interruption's speech start (on the clock); without the
canceller the same scene does interrupt itself (so the bar can fail)."""

from __future__ import annotations

import numpy as np
import pytest
from kinds import ENGINES, kind

from voice.aec import BLOCK, DelayEstimator, EchoCanceller, EchoCancellingInput, EchoReference, EchoTee
from voice.audio import AudioChunk, BufferSink, read_wav, resample
from voice.clock import VirtualClock
from voice.protocols import ASR_RATE
from voice.replay import SAMPLES, manifest
from voice.speakerphone import Room, Say, room_impulse_response, run_scene

# -- the parts, on signals made here -----------------------------------------------------------------------------------


def _speech(rate: int, names=("morning_01_open_tomorrow.wav", "visit_02_croissant_price.wav")) -> np.ndarray:
    return np.concatenate([resample(*read_wav(SAMPLES / n), rate) for n in names])


def test_reference_follows_what_the_sink_plays():
    """Added at play, cut at clear_after, read back at 16 kHz in any span as if resampled whole."""
    ref = EchoReference(22050)
    pcm = _speech(22050)[15435:15435 + 22050]  # (past the lead silence)
    ref.play(0.5, pcm)
    whole = resample(np.concatenate([np.zeros(11025, np.int16), pcm]), 22050, ASR_RATE).astype(np.float32) / 32768
    pieces = np.concatenate([ref.read16(k, k + 160) for k in range(0, 24000, 160)])
    core = slice(8000 + 100, 24000 - 100)  # (the whole-file resampling has edges of its own)
    assert np.max(np.abs(pieces[core] - whole[core])) < 2e-3
    ref.clear_after(1.0)  # the rest is dropped: nothing plays after 1.0 s
    assert not ref.read16(16000, 24000)[50:].any()
    assert ref.read16(8000, 16000).any()
    assert ref.end_s == pytest.approx(1.0)
    ref.play(1.2, pcm[:2205])  # played again later (a resumed answer): there again
    assert ref.read16(19200 + 20, 19200 + 1500).any()


def test_tee_plays_into_both():
    buf = BufferSink(16000)
    ref = EchoReference(16000)
    tee = EchoTee(buf, ref)
    tee.play(0.0, np.full(1600, 1000, np.int16))
    tee.clear_after(0.05)
    assert len(buf.render()) == 800 and ref.end_s == pytest.approx(0.05)
    assert tee.rate == 16000


@pytest.mark.parametrize("delay_ms", [30, 120, 260])
def test_delay_estimate(delay_ms):
    """GCC-PHAT finds the delay of a reverberant echo within a millisecond, with the user's voice on top."""
    x = _speech(ASR_RATE).astype(np.float32) / 32768
    d = int(delay_ms * ASR_RATE / 1000)
    echo = 0.5 * np.convolve(np.concatenate([np.zeros(d, np.float32), x]), room_impulse_response())[:len(x)]
    near = np.roll(_speech(ASR_RATE, ("visit_03_bakery_open.wav",)).astype(np.float32) / 32768, 0)
    mic = echo.copy()
    mic[:len(near)] += 0.5 * near[:len(mic)]
    est = DelayEstimator()
    n = est.window + est.max_delay
    found = [est.update(x[e - n:e], mic[e - est.window:e]) for e in range(n, len(x), 4000)]
    found = [f for f in found if f is not None]
    assert found and abs(found[-1] - d) <= ASR_RATE // 1000, (found, d)


def test_no_reference_no_change():
    """With nothing played the canceller passes the microphone through (one block later)."""
    c = EchoCanceller(EchoReference(22050))
    x = (_speech(ASR_RATE)[:16000].astype(np.float32) / 32768)
    out = np.concatenate([c.process(x[k:k + 320], k) for k in range(0, 16000, 320)])
    assert np.max(np.abs(out[BLOCK:] - x[:-BLOCK])) < 1e-4


def _far_near(delay_s: float, double_talk: bool):
    rate = 22050
    far = _speech(rate, ("morning_01_open_tomorrow.wav", "morning_02_located.wav", "morning_03_croissant_cost.wav",
                         "visit_01_address.wav"))
    room = Room(rate, delay_s=delay_s)
    room.play(0.2, far)
    n = int((0.2 + len(far) / rate) * ASR_RATE)
    echo = room.echo(0, n)
    near = np.zeros(n, np.float32)
    if double_talk:
        v = _speech(ASR_RATE, ("visit_04_owns_bakery.wav",)).astype(np.float32) / 32768
        near[6 * ASR_RATE:6 * ASR_RATE + len(v)] = v[:n - 6 * ASR_RATE]
    return far, rate, echo, near


@pytest.mark.parametrize("double_talk", [False, True])
def test_echo_is_taken_out(double_talk):
    """After the first seconds the echo comes out over 20 dB down; during double talk the user's voice comes through
    (within 2 dB) while the echo stays down."""
    far, rate, echo, near = _far_near(0.09, double_talk)
    ref = EchoReference(rate)
    ref.play(0.2, far)
    c = EchoCanceller(ref)
    mic = echo + near + 1e-3 * np.random.default_rng(0).standard_normal(len(echo)).astype(np.float32)
    out, kept = np.zeros_like(mic), np.zeros_like(mic)
    for k in range(0, len(mic), 320):
        out[k:k + 320], kept[k:k + 320] = c.process(mic[k:k + 320], k, probe=near[k:k + 320])
    residual = (out - kept)[BLOCK:]
    e = echo[:-BLOCK]
    late = slice(4 * ASR_RATE, len(e))
    erle = 10 * np.log10(np.sum(e[late] ** 2) / np.sum(residual[late] ** 2))
    assert erle > 20, erle
    assert abs(c.delay - int(0.09 * ASR_RATE)) <= ASR_RATE // 1000 * 4
    if double_talk:
        talk = slice(6 * ASR_RATE, 6 * ASR_RATE + 2 * ASR_RATE)
        loss = 10 * np.log10(np.sum(near[:-BLOCK][talk] ** 2) / np.sum(kept[BLOCK:][talk] ** 2))
        assert loss < 2, loss


def test_input_stage_maps_chunks_to_the_clock():
    """The input stage gives the loop chunks of the same length, cleaned, at 16 kHz (another rate is resampled)."""
    ref = EchoReference(16000)
    stage = EchoCancellingInput(EchoCanceller(ref), VirtualClock())
    out = stage(AudioChunk(np.full(320, 100, np.int16), 16000, 0))
    assert len(out.pcm) == 320 and out.rate == ASR_RATE
    out = stage(AudioChunk(np.full(480, 100, np.int16), 24000, 320))
    assert out.rate == ASR_RATE


# -- the speakerphone, through the real loop ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
@kind(ENGINES)
def engines():
    from voice.engines import load_engines

    eng, _ = load_engines()
    return eng


#: the sample conversations, each in a room of its own (delay between play and capture, reverberation)
ROOMS = {"morning": (0.04, 0.2), "visit": (0.09, 0.3), "noisy": (0.22, 0.25)}


@pytest.mark.parametrize("name", sorted(ROOMS))
def test_speakerphone_never_interrupts_itself(engines, name):
    delay_s, rt60 = ROOMS[name]
    files = manifest()["conversations"][name]
    engines.llm.reset()
    says = [Say.file(SAMPLES / f) for f in files]
    scene = run_scene(engines, says, aec=True, delay_s=delay_s, level_db=-6.0, rir=room_impulse_response(rt60, seed=len(name)))
    assert scene.loop.barge_ins == [], [(b.speech_s, b.stopped_s) for b in scene.loop.barge_ins]
    reports = scene.loop.reports
    assert len(reports) == len(files), [r.transcript for r in reports]
    assert not any(r.barge_in for r in reports)
    assert all(r.reply for r in reports)
    assert scene.room.plays, "the agent never spoke"
    assert abs(scene.canceller.delay - delay_s * ASR_RATE) <= 4 * ASR_RATE // 1000, scene.canceller.delays


def test_without_echo_cancellation_it_interrupts_itself(engines):
    """The same room without the canceller: the agent hears its own answer as the user and cuts itself off."""
    engines.llm.reset()
    says = [Say.file(SAMPLES / "morning_01_open_tomorrow.wav")]
    scene = run_scene(engines, says, aec=False, delay_s=0.04, level_db=-6.0, max_s=15.0)
    assert scene.loop.barge_ins, "no self-interruption without the canceller: the scene does not test the canceller"
    first = scene.loop.reports[0]
    assert first.barge_in


def test_a_real_interruption_still_stops_the_answer(engines):
    """During the answer to the first question the user asks another: the answer stops within 300 ms of the
    interruption's speech start, and the new question is heard and answered."""
    m = manifest()
    b = m["barge_in"]
    pcm, rate = read_wav(SAMPLES / b["file"])
    pcm = resample(pcm, rate, ASR_RATE)
    second = b["turns"][1]
    cut = int((second["speech_start_s"] - 0.3) * ASR_RATE)
    engines.llm.reset()
    says = [Say.file(SAMPLES / "morning_02_located.wav"),
            Say(pcm[cut:], barge_after_s=1.0, speech_start_s=0.3)]
    scene = run_scene(engines, says, aec=True, delay_s=0.09, level_db=-6.0)
    speech = says[1].started_s + says[1].speech_start_s
    # the answer is silent from 300 ms after the interruption's start until the new question is over (its voice may have
    # paused already: speech over the answer, a residue of its own echo, is judged while it goes on, voice.overlap)
    stops = [t for t in scene.room.clears if t <= speech + 0.3]
    assert stops, "the answer was never stopped"
    end = says[1].started_s + (second["speech_end_s"] - second["speech_start_s"]) + 0.3
    quiet = scene.room.played.read16(int((speech + 0.3) * ASR_RATE), int(end * ASR_RATE))
    assert not np.abs(quiet).max() > 1e-3, "the answer still played 300 ms after the interruption's start"
    reports = scene.loop.reports
    assert reports[0].barge_in
    assert "owner" in reports[-1].transcript.lower(), [r.transcript for r in reports]
    assert len(scene.loop.barge_ins) == 1
