"""Smart Turn v3: a published end-of-turn model that hears the audio, measured beside our score of the text
(``voice.turn_end``) by ``bench/turn_end.py``. The product does not use it (BENCHMARKS.md, 2026-12-07: on the own and
the held-apart turn-taking sets it called 13 of 24 paused turns complete at their pause, against our head's 3-4, and
cost about three times our score a call), so it lives here, beside the bench that measured it.

Smart Turn v3 (Daily, BSD-2-Clause) is a Whisper-tiny-sized audio encoder with a classification head, exported to
ONNX (about 8 MB, int8). The ``pipecat-ai`` wheel ships it as ``pipecat/audio/turn/smart_turn/data/
smart-turn-v3.2-cpu.onnx``; this module reads that file from the pipecat-ai in this environment or in
bench/.venv-pipecat (``make bench-peers-env``) (nothing is imported from pipecat, nothing is downloaded) and runs it on
onnxruntime, which piper already needs. Its input, as pipecat documents and feeds it: the last 8 s of the
utterance at 16 kHz (zeros in front when shorter), scaled to zero mean and unit variance, as Whisper's log-mel
features (80 bins, 25 ms windows every 10 ms: ``input_features`` of shape (1, 80, 800)); its output is P(the turn is
complete).  ``WAFERVOX_SMART_TURN_MODEL`` names another file of the same form.
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import numpy as np

from voice.errors import EngineError

ROOT = Path(__file__).resolve().parent.parent
RATE = 16000
WINDOW_S = 8
#: where the pipecat-ai wheel keeps the model, under its ``pipecat`` package
PACKAGED = Path("audio") / "turn" / "smart_turn" / "data" / "smart-turn-v3.2-cpu.onnx"


def model_path() -> Path:
    """The Smart Turn v3 ONNX file: ``$WAFERVOX_SMART_TURN_MODEL``, else the one in this environment's pipecat-ai, else
    bench/.venv-pipecat's."""
    env = os.environ.get("WAFERVOX_SMART_TURN_MODEL")
    if env:
        path = Path(env)
        if not path.is_file():
            raise EngineError(f"no Smart Turn v3 model at {path}")
        return path
    spec = importlib.util.find_spec("pipecat")
    places = [Path(p) for p in (spec.submodule_search_locations or [])] if spec is not None else []
    places += sorted((ROOT / "bench" / ".venv-pipecat" / "lib").glob("python3*/site-packages/pipecat"))
    for place in places:
        if (place / PACKAGED).is_file():
            return place / PACKAGED
    raise EngineError("Smart Turn v3 ships in the pipecat-ai wheel: make bench-peers-env (bench/.venv-pipecat), or "
                      "WAFERVOX_SMART_TURN_MODEL=FILE")


def features(audio: np.ndarray) -> np.ndarray:
    """The model's ``input_features`` (1, 80, 800) of ``audio`` (16 kHz float): its last 8 s, normalized."""
    from faster_whisper.feature_extractor import FeatureExtractor

    n = WINDOW_S * RATE
    x = np.asarray(audio, np.float32)[-n:]
    x = np.concatenate([np.zeros(n - len(x), np.float32), x])
    x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
    global _EXTRACTOR
    if _EXTRACTOR is None:
        _EXTRACTOR = FeatureExtractor(feature_size=80, sampling_rate=RATE, hop_length=160, chunk_length=WINDOW_S, n_fft=400)
    mel = _EXTRACTOR(x, padding=0)  # 801 frames, the last one dropped
    return np.ascontiguousarray(mel[None, :, : WINDOW_S * 100], np.float32)


_EXTRACTOR = None


class SmartTurn:
    """P(the user's turn is complete) from the audio of the utterance so far (its end at the pause)."""

    def __init__(self, path: str | Path | None = None, threads: int = 1):
        import onnxruntime as ort

        self.path = Path(path) if path is not None else model_path()
        so = ort.SessionOptions()
        so.inter_op_num_threads = 1
        so.intra_op_num_threads = threads
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            self.session = ort.InferenceSession(str(self.path), sess_options=so, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime's own error types
            raise EngineError(f"cannot load Smart Turn v3 from {self.path}: {exc}") from None
        self.input_name = self.session.get_inputs()[0].name
        self.last_ms: float | None = None

    def p_end(self, audio: np.ndarray) -> float:
        t0 = time.perf_counter()
        out = self.session.run(None, {self.input_name: features(audio)})[0]
        self.last_ms = (time.perf_counter() - t0) * 1000
        return float(np.asarray(out).reshape(-1)[0])

    def warmup(self) -> None:
        self.p_end(np.zeros(RATE, np.float32))
