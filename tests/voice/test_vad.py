"""The endpointer on real webrtcvad decisions over espeak-ng speech, noise and clicks (no mocks)."""

from __future__ import annotations

import io
import subprocess
from fractions import Fraction

import numpy as np
import pytest
import soundfile as sf
import webrtcvad
from kinds import ENGINES, kind
from scipy.signal import resample_poly

from voice.vad import (
    HINTS,
    TRANSITIONS,
    EarlyPause,
    Endpointer,
    EndpointerConfig,
    IllegalTransition,
    Pause,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    State,
    next_state,
)

RATE = 16000
# Sentences that end in a voiced sound (webrtcvad misses final fricatives; see test_final_fricative).
SENTENCES = ("When does the shop open", "Tomorrow morning", "What's the weather like in Paris this weekend")


def speak(text: str, rate: int = RATE) -> np.ndarray:
    """espeak-ng speech at ``rate``, float64 in -1..1, trimmed to its audible span."""
    wav = subprocess.run(["espeak-ng", "--stdout", text], capture_output=True, check=True).stdout
    x, sr = sf.read(io.BytesIO(wav), dtype="float64")
    ratio = Fraction(rate, sr)
    y = resample_poly(x, ratio.numerator, ratio.denominator)
    loud = np.nonzero(np.abs(y) > 0.02 * np.abs(y).max())[0]
    return 0.5 * y[loud[0] : loud[-1] + 1] / np.abs(y).max()


@pytest.fixture(scope="module")
@kind(ENGINES)
def voice() -> dict[str, np.ndarray]:
    return {text: speak(text) for text in (*SENTENCES, "I would like a table", "for two people", "Please turn off the lights")}


def pcm16(x: np.ndarray) -> np.ndarray:
    return np.clip(np.round(x * 32767), -32768, 32767).astype(np.int16)


def silence(ms: int, rate: int = RATE) -> np.ndarray:
    return np.zeros(rate * ms // 1000)


def run(pcm: np.ndarray, config: EndpointerConfig | None = None, chunks: list[int] | None = None) -> list:
    """All events of ``pcm`` fed in ``chunks`` (cycled; default: all at once)."""
    ep = Endpointer(config)
    if chunks is None:
        ep.feed(pcm)
    else:
        pos, k = 0, 0
        while pos < len(pcm):
            ep.feed(pcm[pos : pos + chunks[k % len(chunks)]])
            pos += chunks[k % len(chunks)]
            k += 1
    events = ep.events()
    check_invariants(events, ep.config)
    return events


def check_invariants(events: list, config: EndpointerConfig) -> None:
    """Holds for any input: legal sequence, decisions in order, never an early endpoint."""
    state = State.SILENCE
    for prev, ev in zip([None, *events], events):
        state = next_state(state, ev)  # raises on an illegal sequence
        assert prev is None or ev.sample >= prev.sample
        if isinstance(ev, Pause | SpeechStopped):
            hang = config.pause_ms if isinstance(ev, Pause) else config.stop_ms
            assert ev.sample >= ev.last_voiced_sample + 1 + config.rate * hang // 1000
            assert 0 <= ev.start_pad <= ev.first_voiced_sample < ev.last_voiced_sample < ev.end_pad <= ev.sample


def kinds(events: list) -> list[str]:
    return [type(e).__name__ for e in events]


def one_turn(events: list) -> SpeechStopped:
    """The turn's ``SpeechStopped``, checking the events are one turn: a start, pauses the voice
    came back from (a stop consonant's closure can be one), and a final pause and stop."""
    names = kinds(events)
    assert names[0] == "SpeechStarted" and names[-2:] == ["Pause", "SpeechStopped"], names
    assert names.count("SpeechStarted") == names.count("SpeechStopped") == 1, names
    assert names.count("Pause") == names.count("SpeechResumed") + 1, names
    assert events[-1].first_voiced_sample == events[0].first_voiced_sample
    return events[-1]


def ms(samples: int, rate: int = RATE) -> float:
    return samples * 1000 / rate


# -- configuration ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(rate=44100), "rate must be one of"),
        (dict(rate=22050), "rate must be one of"),
        (dict(frame_ms=25), "frame_ms must be one of"),
        (dict(aggressiveness=4), "aggressiveness"),
        (dict(start_ratio=0.0), "start_ratio"),
        (dict(start_ms=10), "start_ms must be at least frame_ms"),
        (dict(pause_ms=400, stop_ms=400), "pause_ms"),
        (dict(padding_ms=-1), "padding_ms"),
    ],
)
def test_invalid_config_raises(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EndpointerConfig(**kwargs)


def test_feed_takes_only_int16_mono():
    ep = Endpointer()
    with pytest.raises(ValueError, match="int16"):
        ep.feed(np.zeros(480, dtype=np.float32))
    with pytest.raises(ValueError, match="1-D"):
        ep.feed(np.zeros((480, 2), dtype=np.int16))


def test_transition_table_rejects_illegal_events():
    stopped = SpeechStopped(sample=0, first_voiced_sample=0, last_voiced_sample=0, start_pad=0, end_pad=0)
    with pytest.raises(IllegalTransition, match="SpeechStopped is not allowed in state SILENCE"):
        next_state(State.SILENCE, stopped)
    with pytest.raises(IllegalTransition):
        next_state(State.SPEECH, SpeechStarted(sample=0, first_voiced_sample=0))
    assert next_state(State.PAUSED, SpeechResumed(sample=0)) is State.SPEECH
    assert set(TRANSITIONS) == set(State)


# -- one utterance ------------------------------------------------------------------------------


@pytest.mark.parametrize("text", SENTENCES)
def test_one_utterance_bounds_and_endpoint(voice, text):
    cfg = EndpointerConfig()
    speech = voice[text]
    pcm = pcm16(np.concatenate([silence(700), speech, silence(1000)]))
    t0, t1 = RATE * 700 // 1000, RATE * 700 // 1000 + len(speech) - 1
    ep = Endpointer(cfg)
    ep.feed(pcm[: t0 + len(speech) // 2])
    assert ep.state is not State.SILENCE
    ep.feed(pcm[t0 + len(speech) // 2 :])
    assert ep.state is State.SILENCE
    events = ep.events()
    check_invariants(events, cfg)
    stopped = one_turn(events)
    pause = events[-2]
    assert abs(ms(stopped.first_voiced_sample - t0)) <= 60
    assert pause.first_voiced_sample == stopped.first_voiced_sample
    # never early: the last voiced sample is not before the speech ends (30 ms: one frame)
    assert -30 <= ms(stopped.last_voiced_sample - t1) <= 60
    assert pause.last_voiced_sample == stopped.last_voiced_sample
    assert ms(stopped.sample - stopped.last_voiced_sample) <= cfg.stop_ms + 2 * cfg.frame_ms
    pad = RATE * cfg.padding_ms // 1000
    assert (stopped.start_pad, stopped.end_pad) == (stopped.first_voiced_sample - pad, stopped.last_voiced_sample + 1 + pad)
    assert pause.end_pad == pause.sample  # the padding is clipped to the audio fed so far
    assert ep.events() == []  # drained


def test_webrtc_overhang_is_trimmed(voice):
    """webrtcvad alone runs ~90 ms past the speech (its hangover); the endpointer does not."""
    speech = voice["Tomorrow morning"]
    pcm = pcm16(np.concatenate([silence(510), speech, silence(600)]))
    vad, frame = webrtcvad.Vad(2), 480
    flags = [vad.is_speech(pcm[k : k + frame].tobytes(), RATE) for k in range(0, len(pcm) - frame + 1, frame)]
    raw_end = (len(flags) - flags[::-1].index(True)) * frame - 1
    end = 8160 + len(speech) - 1
    stopped = run(pcm)[-1]
    assert ms(raw_end - end) >= 75
    assert ms(raw_end - stopped.last_voiced_sample) == 90  # the overhang after a long run: 3 frames of 30 ms
    assert -30 <= ms(stopped.last_voiced_sample - end) <= 60


def test_final_fricative_is_found_by_its_high_band(voice):
    """webrtcvad works on the 0-4 kHz band and misses espeak's long final "ts" (~190 ms here); the
    endpointer's tail detector (power above 2.5 kHz) keeps it in the utterance."""
    speech = voice["Please turn off the lights"]
    pcm = pcm16(np.concatenate([silence(500), speech, silence(800)]))
    end = 8000 + len(speech) - 1
    stopped = one_turn(run(pcm))
    assert -60 <= ms(stopped.last_voiced_sample - end) <= 30
    assert stopped.end_pad > end
    plain = one_turn(run(pcm, EndpointerConfig(tail_db=None)))
    assert -250 <= ms(plain.last_voiced_sample - end) <= -100  # without it


# -- pauses ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("gap_ms", [200, 250, 300])
def test_comma_pause_is_a_pause_not_an_endpoint(voice, gap_ms):
    first, second = voice["I would like a table"], voice["for two people"]
    pcm = pcm16(np.concatenate([silence(500), first, silence(gap_ms), second, silence(800)]))
    events = run(pcm)
    assert kinds(events) == ["SpeechStarted", "Pause", "SpeechResumed", "Pause", "SpeechStopped"]
    end_first, start_second = 8000 + len(first) - 1, 8000 + len(first) + RATE * gap_ms // 1000
    pause, resumed, stopped = events[1], events[2], events[-1]
    assert -30 <= ms(pause.last_voiced_sample - end_first) <= 60
    assert resumed.sample > start_second
    assert stopped.first_voiced_sample == events[0].first_voiced_sample  # one turn


def test_long_gap_is_two_turns(voice):
    first, second = voice["I would like a table"], voice["for two people"]
    pcm = pcm16(np.concatenate([silence(500), first, silence(700), second, silence(800)]))
    assert kinds(run(pcm)) == ["SpeechStarted", "Pause", "SpeechStopped"] * 2


# -- the early pause (a hint before webrtcvad's hangover runs out) ---------------------------------------------------

EARLY = EndpointerConfig(early_pause_ms=60)


def without_hints(events: list) -> list:
    return [e for e in events if not isinstance(e, HINTS)]


def test_the_early_pause_comes_before_the_pause_and_changes_no_decision(voice):
    speech = voice["When does the shop open"]
    pcm = pcm16(np.concatenate([silence(500), speech, silence(900)]))
    ep = Endpointer(EARLY)
    ep.feed(pcm)
    events = ep.events()
    plain = run(pcm)  # the same input without the hint
    assert without_hints(events) == plain
    check_invariants(without_hints(events), EARLY)
    hint = [e for e in events if isinstance(e, EarlyPause)][-1]
    pause = next(e for e in plain if isinstance(e, Pause))
    assert hint.sample <= pause.sample - RATE * 30 // 1000  # at least a frame sooner
    assert hint.sample >= hint.last_voiced_sample + 1 + RATE * 60 // 1000
    assert hint.last_voiced_sample >= pause.last_voiced_sample  # it heard all the voice the pause counts
    assert hint.first_voiced_sample == pause.first_voiced_sample


@pytest.mark.parametrize("gap_ms", [200, 300])
def test_an_early_pause_inside_speech_is_withdrawn_when_the_voice_goes_on(voice, gap_ms):
    first, second = voice["I would like a table"], voice["for two people"]
    pcm = pcm16(np.concatenate([silence(500), first, silence(gap_ms), second, silence(900)]))
    ep = Endpointer(EARLY)
    ep.feed(pcm)
    events = ep.events()
    assert without_hints(events) == run(pcm)
    names = kinds(events)
    # every hint is withdrawn or followed by the endpointer's own pause, and only the last stands at the stop
    for i, name in enumerate(names):
        if name == "EarlyPause":
            assert names[i + 1] in ("EarlyResume", "Pause"), names
        if name == "EarlyResume":
            assert names[i - 1] == "EarlyPause", names
    assert names.count("EarlyPause") >= 2  # in the gap and at the end


def test_the_early_pause_needs_the_noise_gate():
    with pytest.raises(ValueError, match="early_pause_ms"):
        EndpointerConfig(early_pause_ms=60, noise_gate_db=None)
    with pytest.raises(ValueError, match="early_pause_ms"):
        EndpointerConfig(early_pause_ms=0)


# -- what must not start speech -------------------------------------------------------------------


def clicks(noise_rms: float, seconds: float = 3.0, seed: int = 5) -> np.ndarray:
    """Silence or steady noise with single-sample spikes, 5 ms bursts and a double click."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(int(seconds * RATE)) * noise_rms
    x[[4000, 12345, 20000, 30000]] = 0.98
    x[16000], x[16480] = -0.98, 0.98
    for at in (8000, 25000, 40000):
        x[at : at + 80] += rng.standard_normal(80) * 0.4
    return x


@pytest.mark.parametrize("noise_rms", [0.0, 0.001])
@pytest.mark.parametrize("frame_ms", [10, 20, 30])
def test_clicks_do_not_start_speech(noise_rms, frame_ms):
    assert run(pcm16(clicks(noise_rms)), EndpointerConfig(frame_ms=frame_ms)) == []


def test_steady_noise_does_not_start_speech():
    rng = np.random.default_rng(7)
    assert run(pcm16(rng.standard_normal(5 * RATE) * 0.0028)) == []  # -25 dB below the speech's RMS


def test_speech_in_noise_at_25_db_snr(voice):
    speech = np.concatenate([voice["When does the shop open"], silence(250), voice["Tomorrow morning"]])
    clean = np.concatenate([silence(800), speech, silence(1000)])
    rms = np.sqrt(np.mean(voice["When does the shop open"] ** 2))
    noisy = clean + clicks(rms * 10 ** (-25 / 20), seconds=len(clean) / RATE, seed=11)
    events = run(pcm16(noisy))
    assert kinds(events) == ["SpeechStarted", "Pause", "SpeechResumed", "Pause", "SpeechStopped"]
    t0, t1 = 12800, 12800 + len(speech) - 1
    assert abs(ms(events[-1].first_voiced_sample - t0)) <= 60
    assert -30 <= ms(events[-1].last_voiced_sample - t1) <= 60


# -- other rates ------------------------------------------------------------------------------------


@pytest.mark.parametrize("rate, frame_ms", [(8000, 30), (8000, 10), (48000, 30), (48000, 20), (32000, 30)])
def test_other_rates(rate, frame_ms):
    speech = speak("When does the shop open", rate)
    pcm = pcm16(np.concatenate([silence(600, rate), speech, silence(900, rate)]))
    cfg = EndpointerConfig(rate=rate, frame_ms=frame_ms)
    stopped = one_turn(run(pcm, cfg))
    t0, t1 = rate * 600 // 1000, rate * 600 // 1000 + len(speech) - 1
    assert abs(ms(stopped.first_voiced_sample - t0, rate)) <= 60
    assert -30 <= ms(stopped.last_voiced_sample - t1, rate) <= 60


# -- principle 3: chunking never changes results -----------------------------------------------------


@pytest.mark.parametrize("frame_ms", [10, 30])
def test_chunking_never_changes_events(voice, frame_ms):
    speech = np.concatenate([voice["I would like a table"], silence(220), voice["for two people"]])
    x = np.concatenate([silence(600), speech, silence(900), voice["Tomorrow morning"], silence(700)])
    x = x + clicks(0.002, seconds=len(x) / RATE, seed=3)
    pcm, cfg = pcm16(x), EndpointerConfig(frame_ms=frame_ms)
    whole = run(pcm, cfg)
    assert kinds(whole).count("SpeechStopped") == 2 and "SpeechResumed" in kinds(whole)
    assert run(pcm, cfg, chunks=[RATE // 100]) == whole
    assert run(pcm, cfg, chunks=[1, 7, 333, 4801]) == whole
    rng = np.random.default_rng(0)
    assert run(pcm, cfg, chunks=list(rng.integers(0, 2000, size=50))) == whole  # empty chunks too


def test_reset_starts_afresh(voice):
    pcm = pcm16(np.concatenate([silence(500), voice["Tomorrow morning"], silence(800)]))
    ep = Endpointer()
    ep.feed(pcm[:10000])
    ep.reset()
    assert ep.state is State.SILENCE and ep.events() == []
    ep.feed(pcm)
    assert ep.events() == run(pcm)


# -- the end-of-turn policy's stop ------------------------------------------------------------------


def _feed_until_pause(voice, text: str, config: EndpointerConfig):
    """An endpointer fed the words and then silence until its Pause; returns it, the events and the silence left."""
    speech = voice[text]
    pcm = pcm16(np.concatenate([silence(500), speech, silence(1500)]))
    ep = Endpointer(config)
    events, pos = [], 0
    while pos < len(pcm) and not any(isinstance(e, Pause) for e in events):
        ep.feed(pcm[pos:pos + 320])
        events += ep.events()
        pos += 320
    return ep, events, pcm[pos:]


@pytest.mark.parametrize("stop_ms", [200, 1000])
def test_set_stop_ms_moves_the_stop_of_this_pause(voice, stop_ms):
    cfg = EndpointerConfig(pause_ms=90)
    ep, events, rest = _feed_until_pause(voice, "When does the shop open", cfg)
    ep.set_stop_ms(stop_ms)
    stopped = None
    for i in range(0, len(rest), 320):
        ep.feed(rest[i:i + 320])
        for e in ep.events():
            if isinstance(e, SpeechStopped):
                stopped = e
    assert stopped is not None
    silence_ms = ms(stopped.sample - stopped.last_voiced_sample)
    assert stop_ms <= silence_ms <= stop_ms + 2 * cfg.frame_ms, silence_ms


def test_set_stop_ms_already_passed_stops_at_once_and_resets_after(voice):
    cfg = EndpointerConfig(pause_ms=90)
    ep, events, rest = _feed_until_pause(voice, "When does the shop open", cfg)
    ep.feed(rest[:320 * 8])  # 160 ms more: about 250 ms of silence
    assert not [e for e in ep.events() if isinstance(e, SpeechStopped)]
    assert ep.silence_ms >= 200
    ep.set_stop_ms(200)  # the decision arrives late: the turn ends now, at the samples fed
    (stopped,) = ep.events()
    assert isinstance(stopped, SpeechStopped) and ep.state is State.SILENCE
    ep.set_stop_ms(50)  # not paused: ignored
    assert ep.events() == [] and ep._stop_now == ep._stop_frames
