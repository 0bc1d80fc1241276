"""The decode core: GGUF models run by our numba kernels, token by token.

Public entry points: ``Model`` (weights + forward pass), ``Generator`` (streaming
generation with a prefix KV cache, tokenizer and chat template), ``SamplingParams``.
"""

from .errors import ContextLengthError, DecodeError, ModelFileError
from .generate import GenerationStats, Generator, Piece
from .gguf_file import Config, default_model_path, open_gguf
from .model import Model, RunState
from .sampling import GREEDY, SamplingParams

__all__ = [
    "GREEDY", "Config", "ContextLengthError", "DecodeError", "GenerationStats", "Generator", "Model",
    "ModelFileError", "Piece", "RunState", "SamplingParams", "default_model_path", "open_gguf",
]
