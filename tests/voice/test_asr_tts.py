"""ASR and TTS on the real engines: Piper/espeak-ng speech transcribed back by Whisper tiny.en."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from kinds import ENGINES, kind
from scipy.signal import resample_poly

from voice.asr import FULL_WINDOW_S, Decoded, WhisperTranscriber, split_segments, window_for
from voice.protocols import ASR_RATE
from voice.replay import word_error_rate as wer
from voice.replay import words
from voice.tts import EspeakSynthesizer, PiperSynthesizer, make_synthesizer, parse_wav_header, split_voice

QUESTION = "What time do you open tomorrow?"


def to_asr_audio(chunks: list[np.ndarray], rate: int) -> np.ndarray:
    pcm = np.concatenate(chunks).astype(np.float32) / 32768.0
    return resample_poly(pcm, ASR_RATE, rate).astype(np.float32)


@pytest.fixture(scope="module")
@kind(ENGINES)
def transcriber():
    t = WhisperTranscriber()
    t.warmup()
    return t


@pytest.fixture(scope="module")
@kind(ENGINES)
def piper():
    return PiperSynthesizer()


@pytest.fixture(scope="module")
@kind(ENGINES)
def espeak():
    return EspeakSynthesizer()


@pytest.fixture(scope="module")
def question_audio(piper):
    return to_asr_audio(list(piper.synthesize(QUESTION)), piper.sample_rate)


def test_piper_round_trip_matches_text_and_stock_faster_whisper(transcriber, question_audio):
    result = transcriber.transcribe(question_audio)
    assert wer(QUESTION, result.text) == 0, result.text
    assert result.text == result.text.strip()
    assert result.audio_s == pytest.approx(len(question_audio) / ASR_RATE)
    assert result.compute_ms > 0
    segments, _ = transcriber.model.transcribe(question_audio, language="en")  # stock: 30 s window, beam 5
    stock = " ".join(s.text.strip() for s in segments)
    assert words(result.text) == words(stock)


def test_espeak_round_trip(transcriber, espeak):
    audio = to_asr_audio(list(espeak.synthesize(QUESTION)), espeak.sample_rate)
    assert wer(QUESTION, transcriber.transcribe(audio).text) <= 0.2


def test_window_is_sized_to_the_utterance(transcriber, question_audio):
    three_s = np.zeros(3 * ASR_RATE, dtype=np.float32)
    three_s[: len(question_audio)] = question_audio
    result = transcriber.transcribe(three_s)
    assert result.audio_s == pytest.approx(3.0)
    assert transcriber.last_window_s < FULL_WINDOW_S
    assert transcriber.last_fallback is None
    assert wer(QUESTION, result.text) == 0


def test_a_late_turn_reads_a_shorter_window_with_the_same_words(transcriber, question_audio):
    from voice.asr import SHORT_WINDOW

    usual = transcriber.transcribe(question_audio)
    usual_window = transcriber.last_window_s
    short = transcriber.transcribe(question_audio, short=True)
    assert transcriber.last_window_s == window_for(short.audio_s + transcriber.lead_pad_s, min_window_s=SHORT_WINDOW[0],
                                                   pad_s=SHORT_WINDOW[1], step_s=transcriber.step_s) < usual_window
    assert words(short.text) == words(usual.text) and transcriber.last_fallback is None


def test_window_policy():
    assert window_for(3.3, min_window_s=8, pad_s=3, step_s=1) == 8
    assert window_for(6.2, min_window_s=8, pad_s=3, step_s=1) == 10
    assert window_for(6.2, min_window_s=4, pad_s=3, step_s=2) == 10
    assert window_for(29.0, min_window_s=8, pad_s=3, step_s=1) == FULL_WINDOW_S


def test_split_segments_reads_timestamps():
    begin = 1000  # timestamp token for 0.00 s; +1 per 20 ms
    ids = [begin, 1, 2, begin + 50, begin + 50, 3, begin + 90]
    segments = split_segments(ids, begin)
    assert [(s.start_s, s.tokens) for s in segments] == [(0.0, (1, 2)), (1.0, (3,))]


def test_piper_streams_a_sentence_in_vocoder_chunks(piper):
    assert piper.streaming  # the joe voice splits into front and vocoder
    chunks = list(piper.synthesize("We open at seven. The kitchen closes at ten."))
    assert piper.sample_rate == 22050
    assert len(chunks) >= 4  # two sentences, each in chunks that double
    assert all(c.dtype == np.int16 and c.ndim == 1 and len(c) > 0 for c in chunks)
    assert len(chunks[0]) == piper.first_frames * 256  # the vocoder's hop: 256 samples a frame
    peak = max(int(np.abs(c.astype(np.int32)).max()) for c in chunks)
    assert 8000 < peak <= 32767  # the voice's fixed gain: loud, never wrapped


def test_vocoder_chunks_join_like_the_whole_sentence(piper, monkeypatch):
    ids = next(piper._sentence_ids("The owner is Tom Baker, and he is in on weekdays."))
    latent = piper._latent_frames(ids, noise=False)
    whole = piper._decode(latent)
    tolerance = 1e-4
    parts = list(piper.chunks(latent))  # the default context
    assert len(parts) >= 4 and len(parts[0]) == piper.first_frames * 256
    joined = np.concatenate(parts)
    assert joined.shape == whole.shape
    assert np.abs(joined - whole).max() < tolerance
    monkeypatch.setattr(piper, "context_frames", 0)  # no context: audible seams, so the context is what joins them
    assert np.abs(np.concatenate(list(piper.chunks(latent))) - whole).max() > 10 * tolerance


def test_piper_gain_is_the_same_at_every_load(piper):
    assert PiperSynthesizer().gain == pytest.approx(piper.gain)
    assert 1.0 < piper.gain < 4.0


def test_a_voice_without_a_vocoder_input_is_not_split(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["input"], ["output"], name="/whole")], "g",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1])])
    path = tmp_path / "other.onnx"
    onnx.save(helper.make_model(graph), str(path))
    assert split_voice(path, tmp_path / "out") is None
    assert not (tmp_path / "out").exists()


def test_piper_first_chunk_comes_before_the_rest_is_synthesized(piper):
    stream = piper.synthesize("Sure. Let me check the opening hours for tomorrow and the day after.")
    first = next(stream)
    assert 0 < len(first) < 0.8 * piper.sample_rate  # only "Sure." so far
    rest = list(stream)
    assert len(rest) >= 1 and len(rest[0]) > len(first)


def test_espeak_streams_small_chunks(espeak):
    espeak.warmup()
    chunks = list(espeak.synthesize("We open at seven."))
    assert espeak.sample_rate == 22050
    assert len(chunks) > 5
    assert all(c.dtype == np.int16 and c.ndim == 1 for c in chunks)
    assert all(len(c) == espeak.sample_rate * 20 // 1000 for c in chunks[:-1])


def test_espeak_text_starting_with_a_dash_is_spoken(espeak):
    assert sum(len(c) for c in espeak.synthesize("-5 degrees")) > espeak.sample_rate // 4


def test_espeak_stream_closed_early_stops_the_process(espeak, monkeypatch):
    """A consumer that stops after the first chunk (barge-in): closing the stream kills espeak-ng, which is still
    writing (four seconds of audio do not fit in the pipe), reaps it and closes its pipes: no process left behind."""
    import subprocess

    started = []

    class Spy(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(subprocess, "Popen", Spy)
    stream = espeak.synthesize("A long sentence that the listener interrupts after the first chunk.")
    next(stream)
    assert len(started) == 1 and started[0].poll() is None  # still speaking when the consumer stops
    stream.close()
    proc = started[0]
    assert proc.returncode == -9  # killed (SIGKILL) and reaped: no zombie, no orphan
    assert proc.stdout.closed and proc.stderr.closed
    with pytest.raises(StopIteration):
        next(stream)


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_empty_text_yields_nothing(piper, espeak, text):
    assert list(piper.synthesize(text)) == []
    assert list(espeak.synthesize(text)) == []


def test_silence_transcribes_to_near_empty_text(transcriber):
    assert len(words(transcriber.transcribe(np.zeros(2 * ASR_RATE, dtype=np.float32)).text)) <= 1
    assert transcriber.transcribe(np.zeros(0, dtype=np.float32)).text == ""


def test_int16_input_is_accepted(transcriber, question_audio):
    pcm16 = np.clip(question_audio * 32768.0, -32768, 32767).astype(np.int16)
    assert wer(QUESTION, transcriber.transcribe(pcm16).text) == 0


def test_bad_audio_shape_is_rejected(transcriber):
    with pytest.raises(ValueError):
        transcriber.transcribe(np.zeros((2, 100), dtype=np.float32))


def test_engine_errors_say_how_to_fix(tmp_path):
    with pytest.raises(RuntimeError, match="apt-get install espeak-ng"):
        EspeakSynthesizer(binary="espeak-ng-not-installed")
    with pytest.raises(RuntimeError, match="voice"):
        EspeakSynthesizer(voice="xx-no-such-voice")
    with pytest.raises(RuntimeError, match="Piper voice not found"):
        PiperSynthesizer(tmp_path / "missing.onnx")
    with pytest.raises(RuntimeError, match="Whisper model folder not found"):
        WhisperTranscriber(tmp_path / "missing")
    with pytest.raises(ValueError):
        make_synthesizer("festival")


def test_wav_header_parser_waits_for_the_data_chunk():
    header = b"RIFF\x24\xf0\xff\x7fWAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00\x22\x56\x00\x00\x44\xac\x00\x00\x02\x00\x10\x00"
    assert parse_wav_header(header[:20]) is None
    assert parse_wav_header(header) is None
    assert parse_wav_header(header + b"data\x00\xf0\xff\x7f") == (22050, 1, 16, 44)


def test_a_degenerate_window_is_retried_on_30_s_except_at_a_pause(transcriber, question_audio, monkeypatch):
    """The short window's decoding is made to come out degenerate (the real decoder behind it): at the endpoint the
    whole 30 s window is decoded again; at a pause (``speculative``) it is not, and the transcript says so."""
    real = transcriber._decode
    windows = []

    def decode(features, audio_s, window_s):
        windows.append(window_s)
        d = real(features, audio_s, window_s)
        return d if window_s >= FULL_WINDOW_S else Decoded(d.text, d.window_s, "repeated word")

    monkeypatch.setattr(transcriber, "_decode", decode)
    final = transcriber.transcribe(question_audio)
    assert windows[-1] == FULL_WINDOW_S and len(windows) == 2 and not final.retry and final.text
    windows.clear()
    spec = transcriber.transcribe(question_audio, speculative=True)
    assert len(windows) == 1 and windows[0] < FULL_WINDOW_S
    assert spec.retry and transcriber.last_fallback == "repeated word"
    assert spec.compute_ms < final.compute_ms


HELDOUT_ASR = Path(__file__).resolve().parents[2] / "samples" / "heldout" / "asr"
BAKERY = "Bright Bakery. Harbor Street, Sourdough loaf, Croissant, Maria."


def heldout(name: str) -> np.ndarray:
    from voice.audio import read_wav, resample, to_float

    pcm, rate = read_wav(HELDOUT_ASR / name)
    return to_float(resample(pcm, rate, ASR_RATE))


def test_the_persona_vocabulary_makes_its_words_heard(transcriber):
    """A held-apart voice (espeak-ng en-gb-x-gbcwmd+m6, white noise) asking for the persona's products: tiny.en alone
    hears "a soda bottle off"; with the persona's names as its initial prompt, "a sourdough loaf"; and "Bright Bakery on
    Harbor Street" likewise (en-us-nyc+m7, the telephone band)."""
    sourdough = heldout("asr_01_can_i_get_a.flac")
    assert "sourdough" not in words(transcriber.transcribe(sourdough, prompt="").text)
    assert "sourdough" in words(transcriber.transcribe(sourdough, prompt=BAKERY).text)
    bakery = heldout("asr_02_is_bright_bakery_on.flac")
    heard = words(transcriber.transcribe(bakery, prompt=BAKERY).text)
    assert {"bright", "bakery", "harbor", "street"} <= set(heard), heard
    assert not {"bakery", "harbor"} & set(words(transcriber.transcribe(bakery, prompt="").text))


def test_a_transcriber_keeps_its_own_vocabulary_unless_told_otherwise(question_audio):
    with_voc = WhisperTranscriber(vocabulary=BAKERY)
    assert with_voc.prompt_ids()[1:-1] == with_voc.prompt_ids(BAKERY)[1:-1] and len(with_voc.prompt_ids()) > 5
    assert with_voc.prompt_ids("") == list(with_voc.tokenizer.sot_sequence)
    assert wer(QUESTION, with_voc.transcribe(question_audio).text) == 0  # a question outside the vocabulary is unharmed


def test_unknown_asr_models_say_what_there_is():
    from voice.asr import whisper_model_dir
    from voice.errors import EngineError

    with pytest.raises(EngineError, match="no package ships the English-only one"):
        whisper_model_dir("base.en")
    with pytest.raises(EngineError, match="tiny.en, base"):
        whisper_model_dir("large")


def test_a_sentence_written_twice_in_a_row_is_kept_once():
    from voice.asr import once

    assert once("Who is the owner? Who is the owner?") == "Who is the owner?"
    assert once("I'd like two. I'd like two. I'd like two.") == "I'd like two."
    assert once("No. No, thanks.") == "No. No, thanks." and once("Yes, yes.") == "Yes, yes."
    assert once("My email is tom.at.example.com") == "My email is tom.at.example.com" and once("") == ""
