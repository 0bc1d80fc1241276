"""Hardware and model shapes as data: the catalogue in ``wafer/data``, each number with its source.

A hardware file names one system (a wafer, a GPU, or this machine's CPU): its parameters, each
``{value, source, assumption}``, and for wafers the one published point that calibrates the
per-layer latency.  A model file gives a transformer's shape; parameter and KV-cache sizes are
derived from it (and checked against the published totals by the tests).  Numbers marked as
assumptions can be overridden by name (``Hardware.with_overrides``).
"""

from __future__ import annotations

import copy
import functools
import math
import tomllib
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

from decode.errors import ModelFileError


class CatalogueError(ValueError):
    """An unknown name, or a catalogue file that does not hold what it must."""


@dataclass(frozen=True, slots=True)
class Param:
    value: float
    source: str
    assumption: bool = False


@dataclass(frozen=True, slots=True)
class Calibration:
    """The published decode speed that fixes a wafer's per-layer latency."""

    model: str
    units: int
    tok_s: float
    bytes_per_param: float
    source: str


@dataclass(frozen=True, slots=True)
class Hardware:
    name: str
    title: str
    kind: str  # "wafer" | "gpu" | "cpu"
    params: dict[str, Param]
    aliases: tuple[str, ...] = ()
    calibration: Calibration | None = None

    def __getitem__(self, key: str) -> float:
        try:
            return self.params[key].value
        except KeyError:
            raise CatalogueError(f"{self.name} has no parameter '{key}' (it has: {', '.join(sorted(self.params))})") from None

    @property
    def usable_bytes(self) -> float:
        return self["memory_bytes"] * self["usable_fraction"]

    def with_overrides(self, overrides: dict[str, float]) -> Hardware:
        """A copy with some parameters replaced (marked as set by the user)."""
        if not overrides:
            return self
        params = dict(self.params)
        for k, v in overrides.items():
            if k not in params:
                raise CatalogueError(f"{self.name} has no parameter '{k}' to set (it has: {', '.join(sorted(params))})")
            if not math.isfinite(v) or v < 0:
                raise CatalogueError(f"--set {k}={v}: must be a finite number >= 0")
            params[k] = Param(float(v), "set on the command line", True)
        return replace(self, params=params)


_MLP_GATED = 3  # gate, up, down


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A decoder-only transformer's shape.  Dense llama-style by default; a mixture of experts when
    ``n_experts`` is set (the first ``n_dense_layers`` layers stay dense)."""

    name: str
    title: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab: int
    tied_embeddings: bool
    source: str = ""
    aliases: tuple[str, ...] = ()
    mlp_matrices: int = _MLP_GATED
    n_dense_layers: int = 0
    n_experts: int = 0
    experts_per_token: int = 0
    n_shared_experts: int = 0
    expert_d_ff: int = 0
    attn_params: float = 0.0  # per layer, when it differs from plain multi-head attention
    kv_elems_per_token: int = 0  # per layer, when it differs from 2 * n_kv_heads * head_dim
    params_published: float = 0.0
    active_params_published: float = 0.0
    #: bytes as stored in a model file (embedding, each layer, head), when read from one
    file_bytes: tuple[float, tuple[float, ...], float] | None = field(default=None, compare=False)

    # -- parameter counts -------------------------------------------------------------------------

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    def _attn(self) -> float:
        if self.attn_params:
            return self.attn_params
        q = self.n_heads * self.head_dim
        kv = self.n_kv_heads * self.head_dim
        return self.d_model * (2 * q + 2 * kv)

    def _layer(self, i: int, routed: float) -> float:
        """Parameters of layer ``i`` counting ``routed`` of its routed experts (dense layers have none)."""
        base = self._attn() + 2 * self.d_model
        if not self.is_moe or i < self.n_dense_layers:
            return base + self.mlp_matrices * self.d_model * self.d_ff
        expert = self.mlp_matrices * self.d_model * self.expert_d_ff
        return base + (routed + self.n_shared_experts) * expert + self.d_model * self.n_experts

    def layer_params(self, i: int) -> float:
        """Parameters of layer ``i`` (all experts)."""
        return self._layer(i, self.n_experts)

    def layer_active_params(self, i: int) -> float:
        """Parameters a single token reads in layer ``i`` (its routed experts only)."""
        return self._layer(i, self.experts_per_token)

    def layer_batch_params(self, i: int, batch: int) -> float:
        """Parameters a step of ``batch`` sequences reads in layer ``i``: the union of the experts
        they are routed to (uniform routing), every expert at most once."""
        if not self.is_moe:
            return self.layer_params(i)
        touched = self.n_experts * (1 - (1 - self.experts_per_token / self.n_experts) ** batch)
        return self._layer(i, max(touched, self.experts_per_token))

    @property
    def embed_params(self) -> float:
        return self.vocab * self.d_model

    @property
    def head_params(self) -> float:
        return self.vocab * self.d_model + self.d_model

    @property
    def total_params(self) -> float:
        head = self.d_model if self.tied_embeddings else self.head_params
        return self.embed_params + sum(self.layer_params(i) for i in range(self.n_layers)) + head

    @property
    def active_params(self) -> float:
        """Parameters read per token (the head counts even when tied; the embedding is a lookup)."""
        return sum(self.layer_active_params(i) for i in range(self.n_layers)) + self.head_params

    # -- bytes ------------------------------------------------------------------------------------

    def layer_bytes(self, i: int, bytes_per_param: float | None) -> float:
        if bytes_per_param is None:
            return self._file()[1][i]
        return self.layer_params(i) * bytes_per_param

    def layer_active_bytes(self, i: int, bytes_per_param: float | None) -> float:
        if bytes_per_param is None:
            return self._file()[1][i]
        return self.layer_active_params(i) * bytes_per_param

    def embed_bytes(self, bytes_per_param: float | None) -> float:
        return self._file()[0] if bytes_per_param is None else self.embed_params * bytes_per_param

    def head_bytes(self, bytes_per_param: float | None) -> float:
        return self._file()[2] if bytes_per_param is None else self.head_params * bytes_per_param

    def weight_bytes(self, bytes_per_param: float | None) -> float:
        embed, head = self.embed_bytes(bytes_per_param), self.head_bytes(bytes_per_param)
        own_head = head - embed if self.tied_embeddings else head  # a tied head adds only its norm
        return embed + sum(self.layer_bytes(i, bytes_per_param) for i in range(self.n_layers)) + own_head

    def kv_bytes_per_token(self, kv_bytes: float = 2.0) -> float:
        """KV-cache bytes one token adds to one layer."""
        elems = self.kv_elems_per_token or 2 * self.n_kv_heads * self.head_dim
        return elems * kv_bytes

    def _file(self):
        if self.file_bytes is None:
            raise CatalogueError(f"{self.name} is not read from a model file: give bytes per parameter")
        return self.file_bytes


# -- the catalogue --------------------------------------------------------------------------------

def _data(kind: str):
    return resources.files("wafer") / "data" / kind


def _entries(kind: str) -> dict[str, Path]:
    return {p.name[:-5]: p for p in _data(kind).iterdir() if p.name.endswith(".toml")}


def _read(path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise CatalogueError(f"{path}: not valid TOML: {e}") from None


@functools.cache
def _catalogue(kind: str) -> dict[str, dict]:
    """Every entry of ``kind``, read once per process: ``{file stem: parsed TOML}``."""
    return {stem: _read(path) for stem, path in sorted(_entries(kind).items())}


def _lookup(kind: str, name: str, also: tuple[str, ...] = ()) -> dict:
    key = name.strip().lower()
    entries = _catalogue(kind)
    for stem, d in entries.items():
        if key == stem or key in [a.lower() for a in d.get("aliases", [])]:
            return copy.deepcopy(d)  # callers build from it; the cached copy stays as read
    known = ", ".join(sorted([*entries, *also]))
    raise CatalogueError(f"unknown {kind[:-1] if kind.endswith('s') else kind} '{name}' (known: {known})")


def hardware_names() -> list[str]:
    return sorted(_entries("hardware")) + ["local-cpu"]


def model_names() -> list[str]:
    return sorted(_entries("models")) + ["smollm2-135m"]


def hardware_from_dict(d: dict) -> Hardware:
    try:
        params = {k: Param(float(v["value"]), str(v["source"]), bool(v.get("assumption", False)))
                  for k, v in d["params"].items()}
        cal = d.get("calibration")
        calibration = None if cal is None else Calibration(
            model=str(cal["model"]), units=int(cal["units"]), tok_s=float(cal["tok_s"]),
            bytes_per_param=float(cal["bytes_per_param"]), source=str(cal["source"]))
        hw = Hardware(name=str(d["name"]), title=str(d["title"]), kind=str(d["kind"]), params=params,
                      aliases=tuple(d.get("aliases", ())), calibration=calibration)
    except (KeyError, TypeError, ValueError) as e:
        raise CatalogueError(f"hardware entry {d.get('name', '?')}: missing or bad field {e}") from None
    needed = {"wafer": ("memory_bytes", "memory_bw", "usable_fraction", "hop_latency_s", "hop_bw", "width_exponent"),
              "gpu": ("memory_bytes", "memory_bw", "hbm_efficiency", "usable_fraction", "allreduce_latency_s", "link_bw"),
              "cpu": ("gemv_bw", "call_overhead_s", "memory_bytes", "usable_fraction")}.get(hw.kind)
    if needed is None:
        raise CatalogueError(f"hardware entry {hw.name}: kind must be wafer, gpu or cpu, not '{hw.kind}'")
    missing = [k for k in needed if k not in params]
    if missing:
        raise CatalogueError(f"hardware entry {hw.name} lacks {', '.join(missing)}")
    if hw.kind == "wafer" and calibration is None:
        raise CatalogueError(f"wafer entry {hw.name} needs a [calibration] point")
    return hw


def load_hardware(name: str) -> Hardware:
    """A catalogued system by name or alias; ``local-cpu`` is measured on this machine (cached)."""
    if name.strip().lower() in ("local-cpu", "cpu", "local"):
        from .localcpu import local_cpu

        return local_cpu()
    return hardware_from_dict(_lookup("hardware", name, ("local-cpu",)))


_SHAPE_FIELDS = {f for f in ModelShape.__dataclass_fields__ if f not in ("file_bytes", "aliases")}


def load_model(name: str, gguf: str | Path | None = None) -> ModelShape:
    """A catalogued model shape by name or alias; ``smollm2-135m`` (or ``gguf=``) is read from a GGUF file."""
    if gguf is not None or name.strip().lower() in ("smollm2-135m", "smollm2", "local"):
        return shape_from_gguf(gguf)
    d = _lookup("models", name, ("smollm2-135m",))
    unknown = set(d) - _SHAPE_FIELDS - {"aliases"}
    if unknown:
        raise CatalogueError(f"model entry {d.get('name')}: unknown fields {', '.join(sorted(unknown))}")
    try:
        return ModelShape(**{k: v for k, v in d.items() if k != "aliases"}, aliases=tuple(d.get("aliases", ())))
    except TypeError as e:
        raise CatalogueError(f"model entry {d.get('name')}: {e}") from None


def shape_from_gguf(path=None) -> ModelShape:
    """The shape of a llama GGUF (by default the bundled SmolLM2-135M), with its tensors' real sizes."""
    from decode.gguf_file import open_gguf
    from decode.model import load_weights

    try:
        f = open_gguf(path)
        w = load_weights(f)
    except ModelFileError as e:
        raise CatalogueError(str(e)) from None
    c = f.config
    head = float(w.output.nbytes + w.output_norm.nbytes)
    name = "smollm2-135m" if path is None else Path(path).stem.lower()
    shape = ModelShape(
        name=name, title=f"{c.name} ({Path(f.path).name})", n_layers=c.n_layers, d_model=c.d_model,
        n_heads=c.n_heads, n_kv_heads=c.n_kv_heads, head_dim=c.head_dim, d_ff=c.d_ff, vocab=c.vocab_size,
        tied_embeddings=c.tied_embeddings, source=f"read from {f.path}",
        file_bytes=(float(w.token_embd.nbytes), tuple(float(layer.nbytes) for layer in w.layers), head),
    )
    return replace(shape, params_published=shape.total_params)
