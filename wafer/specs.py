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
class Precision:
    """Bytes per parameter by part of the model: a checkpoint's native format stores the routed
    experts, the other matrices (attention, dense MLPs, shared experts, router) and the
    embedding/head at different widths (gpt-oss: MXFP4 experts, BF16 elsewhere)."""

    name: str
    expert: float
    linear: float
    embed: float
    source: str = ""

    @classmethod
    def uniform(cls, bytes_per_param: float) -> Precision:
        return cls(f"{bytes_per_param * 8:g}-bit", bytes_per_param, bytes_per_param, bytes_per_param)

    @property
    def label(self) -> str:
        return self.name


def as_precision(bytes_per_param: float | Precision) -> Precision:
    return bytes_per_param if isinstance(bytes_per_param, Precision) else Precision.uniform(float(bytes_per_param))


def precision_label(bytes_per_param: float | Precision | None) -> str:
    """``16-bit``, ``8-bit``, a native format's name, or ``model file sizes``."""
    if bytes_per_param is None:
        return "model file sizes"
    return as_precision(bytes_per_param).label


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
    ``n_experts`` is set (the first ``n_dense_layers`` layers stay dense, and with ``moe_every = k``
    only every k-th layer after them routes: layers ``k-1, 2k-1, ...``).

    Attention kinds: grouped-query (``n_kv_heads`` K and V heads of ``head_dim``); multi-head latent
    (``kv_lora_rank`` > 0: one latent of that rank plus a ``qk_rope_head_dim`` key is cached per
    token and layer); sliding windows (``sliding_window`` > 0: a windowed layer keeps and reads at
    most that many tokens; with ``full_attention_every = k`` every k-th layer attends to everything)."""

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
    moe_every: int = 1
    n_experts: int = 0
    experts_per_token: int = 0
    n_shared_experts: int = 0
    expert_d_ff: int = 0
    attn_params: float = 0.0  # per layer, when given outright (otherwise derived from the attention kind)
    kv_elems_per_token: int = 0  # per layer, when given outright
    # multi-head latent attention (DeepSeek-V2/V3); 0 = not used
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # windowed attention; 0 = every layer attends to the whole context
    sliding_window: int = 0
    full_attention_every: int = 0
    params_published: float = 0.0
    active_params_published: float = 0.0
    #: the published active count includes the embedding lookup (publishers differ)
    active_counts_embedding: bool = False
    #: the checkpoint's weights as published, in its native format
    native: Precision | None = None
    checkpoint_bytes_published: float = 0.0
    #: where each number comes from: (field, source) pairs, beside the entry's overall ``source``
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    #: bytes as stored in a model file (embedding, each layer, head), when read from one
    file_bytes: tuple[float, tuple[float, ...], float] | None = field(default=None, compare=False)

    # -- layer kinds ------------------------------------------------------------------------------

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def is_moe_layer(self, i: int) -> bool:
        return self.is_moe and i >= self.n_dense_layers and i % self.moe_every == self.moe_every - 1

    def is_windowed(self, i: int) -> bool:
        if not self.sliding_window:
            return False
        k = self.full_attention_every
        return not (k and i % k == k - 1)

    @property
    def attention_kind(self) -> str:
        kind = "multi-head latent" if self.is_mla else ("grouped-query" if self.n_kv_heads < self.n_heads else "multi-head")
        if self.sliding_window:
            every = f", one layer in {self.full_attention_every} full" if self.full_attention_every else ""
            kind += f", {self.sliding_window}-token windows{every}"
        return kind

    # -- parameter counts -------------------------------------------------------------------------

    def _attn(self) -> float:
        if self.attn_params:
            return self.attn_params
        d, h = self.d_model, self.n_heads
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (d * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * h * qk) if self.q_lora_rank else d * h * qk
            kv = d * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank \
                + self.kv_lora_rank * h * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv + h * self.v_head_dim * d
        q = h * self.head_dim
        kv = self.n_kv_heads * self.head_dim
        return d * (2 * q + 2 * kv)

    def _expert(self) -> float:
        return self.mlp_matrices * self.d_model * self.expert_d_ff

    def layer_parts(self, i: int) -> tuple[float, float, int]:
        """(parameters outside the routed experts, parameters of one routed expert, routed experts)
        of layer ``i``: attention, norms and the dense MLP, or the shared experts and the router."""
        base = self._attn() + 2 * self.d_model
        if not self.is_moe_layer(i):
            return base + self.mlp_matrices * self.d_model * self.d_ff, 0.0, 0
        return base + self.n_shared_experts * self._expert() + self.d_model * self.n_experts, self._expert(), self.n_experts

    def _layer(self, i: int, routed: float) -> float:
        """Parameters of layer ``i`` counting ``routed`` of its routed experts (dense layers have none)."""
        fixed, each, n = self.layer_parts(i)
        return fixed + (routed * each if n else 0.0)

    def layer_params(self, i: int) -> float:
        """Parameters of layer ``i`` (all experts)."""
        return self._layer(i, self.n_experts)

    def layer_active_params(self, i: int) -> float:
        """Parameters a single token reads in layer ``i`` (its routed experts only)."""
        return self._layer(i, self.experts_per_token)

    def experts_touched(self, batch: int) -> float:
        """Routed experts a step of ``batch`` sequences reads in one layer: the union of the experts
        they are routed to (uniform routing), every expert at most once."""
        if not self.is_moe:
            return 0.0
        touched = self.n_experts * (1 - (1 - self.experts_per_token / self.n_experts) ** batch)
        return max(touched, float(self.experts_per_token))

    def layer_batch_params(self, i: int, batch: int) -> float:
        """Parameters a step of ``batch`` sequences reads in layer ``i`` (the experts' union)."""
        return self._layer(i, self.experts_touched(batch))

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

    def layer_bytes_with(self, i: int, routed: float, bytes_per_param: float | Precision) -> float:
        """Bytes of layer ``i`` holding ``routed`` of its routed experts, at ``bytes_per_param``."""
        p = as_precision(bytes_per_param)
        fixed, each, n = self.layer_parts(i)
        return fixed * p.linear + (routed * each * p.expert if n else 0.0)

    def layer_bytes(self, i: int, bytes_per_param: float | Precision | None) -> float:
        if bytes_per_param is None:
            return self._file()[1][i]
        return self.layer_bytes_with(i, self.n_experts, bytes_per_param)

    def layer_active_bytes(self, i: int, bytes_per_param: float | Precision | None) -> float:
        if bytes_per_param is None:
            return self._file()[1][i]
        return self.layer_bytes_with(i, self.experts_per_token, bytes_per_param)

    def layer_batch_bytes(self, i: int, batch: int, bytes_per_param: float | Precision | None) -> float:
        """Bytes a step of ``batch`` sequences reads in layer ``i`` (the union of their experts)."""
        if bytes_per_param is None:
            return self._file()[1][i]
        return self.layer_bytes_with(i, self.experts_touched(batch), bytes_per_param)

    def embed_bytes(self, bytes_per_param: float | Precision | None) -> float:
        return self._file()[0] if bytes_per_param is None else self.embed_params * as_precision(bytes_per_param).embed

    def head_bytes(self, bytes_per_param: float | Precision | None) -> float:
        return self._file()[2] if bytes_per_param is None else self.head_params * as_precision(bytes_per_param).embed

    def weight_bytes(self, bytes_per_param: float | Precision | None) -> float:
        embed, head = self.embed_bytes(bytes_per_param), self.head_bytes(bytes_per_param)
        own_head = head - embed if self.tied_embeddings else head  # a tied head adds only its norm
        return embed + sum(self.layer_bytes(i, bytes_per_param) for i in range(self.n_layers)) + own_head

    def active_bytes(self, bytes_per_param: float | Precision | None) -> float:
        """Weight bytes one token reads (batch 1): every layer's active part and the head."""
        return sum(self.layer_active_bytes(i, bytes_per_param) for i in range(self.n_layers)) + self.head_bytes(bytes_per_param)

    # -- the KV cache -----------------------------------------------------------------------------

    @property
    def kv_elems(self) -> int:
        """Cached elements one token adds to one (unwindowed) layer: K and V of every KV head, or
        MLA's latent and its RoPE key."""
        if self.kv_elems_per_token:
            return self.kv_elems_per_token
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.n_kv_heads * self.head_dim

    def kv_bytes_per_token(self, kv_bytes: float = 2.0) -> float:
        """KV-cache bytes one token adds to one layer (a windowed layer stops adding at its window)."""
        return self.kv_elems * kv_bytes

    def kv_tokens(self, i: int, context: int) -> int:
        """Tokens of KV layer ``i`` keeps (and a decode step reads) at ``context`` tokens."""
        return min(context, self.sliding_window) if self.is_windowed(i) else context

    def layer_kv_bytes(self, i: int, context: int, kv_bytes: float = 2.0) -> float:
        """Bytes of layer ``i``'s KV cache for one sequence of ``context`` tokens."""
        return self.kv_tokens(i, context) * self.kv_elems * kv_bytes

    def kv_bytes_per_sequence(self, context: int, kv_bytes: float = 2.0) -> float:
        """Bytes of one sequence's KV cache over every layer: a caller's memory at ``context`` tokens."""
        return sum(self.layer_kv_bytes(i, context, kv_bytes) for i in range(self.n_layers))

    # -- prompt processing ------------------------------------------------------------------------

    def _attn_width(self) -> tuple[int, int]:
        """(query-key width, value width) summed over heads, as a prompt pass computes them."""
        if self.is_mla:
            return self.n_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim), self.n_heads * self.v_head_dim
        w = self.n_heads * self.head_dim
        return w, w

    def layer_attention_flops(self, i: int, tokens: int, past: int = 0) -> float:
        """FLOPs of layer ``i``'s score and value products for ``tokens`` new tokens after ``past``
        cached ones (causal: the t-th new token attends to ``past + t`` keys, or its window)."""
        qk, v = self._attn_width()
        if self.is_windowed(i):
            w = self.sliding_window
            keys = sum(min(past + t, w) for t in range(1, tokens + 1)) if tokens <= 4 * w else tokens * w
        else:
            keys = tokens * past + tokens * (tokens + 1) / 2
        return 2 * (qk + v) * keys

    def layer_prefill_flops(self, i: int, tokens: int, past: int = 0) -> float:
        """FLOPs of layer ``i`` for ``tokens`` new tokens: each multiplies its active weights once
        (two FLOPs a parameter), plus attention over the cache."""
        return 2 * self.layer_active_params(i) * tokens + self.layer_attention_flops(i, tokens, past)

    def prefill_flops(self, tokens: int, past: int = 0) -> float:
        """FLOPs of a prompt of ``tokens`` new tokens (every layer and the head)."""
        layers = sum(self.layer_prefill_flops(i, tokens, past) for i in range(self.n_layers))
        return layers + 2 * self.head_params * tokens

    def _file(self):
        if self.file_bytes is None:
            raise CatalogueError(f"{self.name} is not read from a model file: give bytes per parameter")
        return self.file_bytes


# -- the catalogue --------------------------------------------------------------------------------

def data_file(name: str):
    """A file (or folder) of the catalogue in ``wafer/data``."""
    return resources.files("wafer") / "data" / name


def _entries(kind: str) -> dict[str, Path]:
    return {p.name[:-5]: p for p in data_file(kind).iterdir() if p.name.endswith(".toml")}


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


_SHAPE_FIELDS = {f for f in ModelShape.__dataclass_fields__ if f not in ("file_bytes", "aliases", "native", "sources")}


def _native(d: dict, model: str) -> Precision:
    try:
        return Precision(str(d["name"]), float(d["expert_bits"]) / 8, float(d["linear_bits"]) / 8,
                         float(d["embed_bits"]) / 8, str(d["source"]))
    except (KeyError, TypeError, ValueError) as e:
        raise CatalogueError(f"model entry {model}: [native] needs name, expert_bits, linear_bits, embed_bits and "
                             f"source ({e})") from None


def load_model(name: str, gguf: str | Path | None = None) -> ModelShape:
    """A catalogued model shape by name or alias; ``smollm2-135m`` (or ``gguf=``) is read from a GGUF file."""
    if gguf is not None or name.strip().lower() in ("smollm2-135m", "smollm2", "local"):
        return shape_from_gguf(gguf)
    d = _lookup("models", name, ("smollm2-135m",))
    unknown = set(d) - _SHAPE_FIELDS - {"aliases", "native", "sources"}
    if unknown:
        raise CatalogueError(f"model entry {d.get('name')}: unknown fields {', '.join(sorted(unknown))}")
    extra = {"aliases": tuple(d.get("aliases", ())), "sources": tuple((str(k), str(v)) for k, v in d.get("sources", {}).items())}
    if "native" in d:
        extra["native"] = _native(d["native"], d.get("name", name))
    try:
        return ModelShape(**{k: v for k, v in d.items() if k not in ("aliases", "native", "sources")}, **extra)
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
