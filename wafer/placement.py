"""Placement: contiguous layer ranges per unit (wafer, GPU pipeline stage, CPU stage) under its memory.

A pure function of the model shape, the hardware and the deployment's numbers.  The items laid
out in order are the embedding, the layers and the output head; each unit holds the weights of
its items plus the KV cache of its layers for ``context`` tokens of ``sequences`` sequences.
With a tied embedding the last unit keeps its own copy of the matrix for the head.

Whole layers per unit waste memory when a layer is a large share of a unit (a DeepSeek-V3 layer
is 23 GB at 16-bit: one per 40 GB wafer).  So a layer may split where that takes fewer units: its
attention, norms, router and shared experts (and its KV cache) stay on the unit where the layer
starts, with as many of its routed experts (whole experts; for a dense layer, slices of its MLP)
as fit; the rest of them go to the next unit, which runs them before its own layers.  The
token's state still travels unit to unit in order, so a split layer adds no hop; the next unit
spends one more layer latency on its share.  A stage's ``first..stop`` are the layers it starts
(the ranges never overlap); ``carry_share`` is the part of layer ``first - 1`` it also holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .specs import Hardware, ModelShape, precision_label


class PlacementError(ValueError):
    """The model does not fit as asked (one layer too big, or too few units)."""


@dataclass(frozen=True, slots=True)
class Stage:
    index: int
    first: int  # first layer
    stop: int  # one past the last layer
    weight_bytes: float
    kv_bytes: float
    has_embed: bool
    has_head: bool
    carry_share: float = 0.0  # share of layer first-1's routed experts (or MLP) held here
    last_share: float = 1.0  # share of layer stop-1's routed experts (or MLP) held here

    @property
    def split(self) -> bool:
        return self.carry_share > 0 or self.last_share < 1

    @property
    def n_layers(self) -> int:
        return self.stop - self.first

    @property
    def layers(self) -> range:
        return range(self.first, self.stop)

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes


@dataclass(frozen=True, slots=True)
class Placement:
    model: ModelShape
    hardware: Hardware
    stages: tuple[Stage, ...]
    bytes_per_param: float | None  # None: the sizes stored in the model file
    context: int
    sequences: int
    capacity: float  # usable bytes per unit

    @property
    def n_units(self) -> int:
        return len(self.stages)

    def stage_of(self, layer: int) -> Stage:
        for s in self.stages:
            if s.first <= layer < s.stop:
                return s
        raise IndexError(layer)

    def to_dict(self) -> dict:
        return {
            "model": self.model.name, "hardware": self.hardware.name, "units": self.n_units,
            "bytes_per_param": self.bytes_per_param, "context": self.context, "sequences": self.sequences,
            "capacity_bytes": self.capacity,
            "stages": [{"unit": s.index, "layers": [s.first, s.stop - 1], "weight_bytes": s.weight_bytes,
                        "kv_bytes": s.kv_bytes, "embed": s.has_embed, "head": s.has_head,
                        "carry_share": s.carry_share, "last_share": s.last_share} for s in self.stages],
        }

    @property
    def split_layers(self) -> int:
        """Layers whose experts (or MLP) are spread over two units."""
        return sum(1 for s in self.stages if s.carry_share > 0)


def _gb(b: float) -> str:
    return f"{b / 1e9:.2f} GB" if b >= 1e8 else f"{b / 1e6:.1f} MB"


def _layer_items(model: ModelShape, bpp, context: int, sequences: int, kv_bytes: float):
    return [(model.layer_bytes(i, bpp), model.layer_kv_bytes(i, context, kv_bytes) * sequences) for i in range(model.n_layers)]


#: slices a dense layer's MLP may be cut into when it splits
_MLP_SLICES = 64


def _divisible(model: ModelShape, i: int, bpp) -> tuple[float, float]:
    """(bytes of layer ``i`` that may move to the next unit, the smallest piece of them): its routed
    experts, whole, or its dense MLP in slices."""
    fixed, each, n = model.layer_parts(i)
    if n:
        none = model.layer_bytes_with(i, 0, bpp)
        return model.layer_bytes(i, bpp) - none, model.layer_bytes_with(i, 1, bpp) - none
    mlp = model.mlp_matrices * model.d_model * model.d_ff
    part = mlp / fixed * model.layer_bytes(i, bpp)
    return part, part / _MLP_SLICES


def _pack_split(items, limit: float):
    """Greedy fill up to ``limit`` bytes per unit, splitting a layer's divisible part at the unit's
    end.  ``items``: per layer (fixed bytes incl. KV, embed and head; divisible bytes; piece).
    Returns [(first, stop, carry_share, last_share, bytes)] or None."""
    out = []
    first, used, carry = 0, 0.0, 0.0
    last = 1.0
    n = len(items)
    for i, (fixed, div, piece) in enumerate(items):
        start = fixed + (min(div, piece) if div else 0.0)
        if used + start > limit and i > first:
            out.append((first, i, carry, 1.0, used))
            first, used, carry = i, 0.0, 0.0
        if used + start > limit:
            return None
        used += fixed
        room = limit - used
        if div <= room * (1 + 1e-12):
            used += div
            continue
        k = int(room // piece)
        here = k * piece
        rest = div - here
        if rest > limit or i + 1 >= n:
            return None
        out.append((first, i + 1, carry, here / div, used + here))
        first, used, carry = i + 1, rest, rest / div
    out.append((first, n, carry, last, used))
    if any(a >= b for a, b, *_ in out):  # a unit that starts no layer of its own
        return None
    return out


def _split_placement(model, bpp, layers, embed, head, cap: float, units: int | None):
    n = model.n_layers
    items = []
    for i, (w, kv) in enumerate(layers):
        div, piece = _divisible(model, i, bpp) if i < n - 1 else (0.0, 0.0)  # the head follows the last layer whole
        fixed = w - div + kv + (embed if i == 0 else 0.0) + (head if i == n - 1 else 0.0)
        items.append((fixed, div, piece))
    best = _pack_split(items, cap)
    if best is None:
        return None
    if units is not None:
        if len(best) > units:
            return None
        lo, hi = sum(f + d for f, d, _ in items) / units, cap  # the smallest per-unit fill that packs in `units`
        for _ in range(40):
            mid = (lo + hi) / 2
            packed = _pack_split(items, mid)
            if packed is not None and len(packed) <= units:
                hi, best = mid, packed
            else:
                lo = mid
    return best


def place(model: ModelShape, hw: Hardware, units: int | None = None, *, context: int = 8192, sequences: int = 1,
          bytes_per_param=2.0, kv_bytes: float = 2.0, capacity: float | None = None, split: bool = True) -> Placement:
    """Lay ``model`` out on ``units`` units of ``hw`` (``None``: as few as fit), balancing the layer
    count per unit.  ``capacity`` overrides the usable bytes of one unit.  ``split``: a layer's
    routed experts (or MLP) may continue on the next unit where whole layers would need more units
    (never for the sizes read from a model file, which run here layer by layer)."""
    try:
        return _place_whole(model, hw, units, context=context, sequences=sequences, bytes_per_param=bytes_per_param,
                            kv_bytes=kv_bytes, capacity=capacity, prefer_split=split and bytes_per_param is not None)
    except _TrySplit as t:
        return t.placement
    except PlacementError:
        if not split or bytes_per_param is None or units is None or not 1 <= units <= model.n_layers:
            raise
        p = _place_split(model, hw, units, context, sequences, bytes_per_param, kv_bytes, capacity)
        if p is None:
            raise
        return p


class _TrySplit(Exception):
    def __init__(self, placement: Placement):
        self.placement = placement


def _place_split(model, hw, units, context, sequences, bpp, kv_bytes, capacity) -> Placement | None:
    cap = float(capacity if capacity is not None else hw.usable_bytes)
    layers = _layer_items(model, bpp, context, sequences, kv_bytes)
    embed, head = model.embed_bytes(bpp), model.head_bytes(bpp)
    packed = _split_placement(model, bpp, layers, embed, head, cap, units)
    if packed is None:
        return None
    n = model.n_layers
    stages = []
    for idx, (a, b, carry, last, _) in enumerate(packed):
        w = sum(x for x, _ in layers[a:b]) + (embed if a == 0 else 0.0) + (head if b == n else 0.0)
        if last < 1:
            w -= (1 - last) * _divisible(model, b - 1, bpp)[0]
        if carry:
            w += carry * _divisible(model, a - 1, bpp)[0]
        stages.append(Stage(idx, a, b, w, sum(kv for _, kv in layers[a:b]), a == 0, b == n, carry, last))
    return Placement(model, hw, tuple(stages), bpp, context, sequences, cap)


def _place_whole(model: ModelShape, hw: Hardware, units: int | None = None, *, context: int = 8192, sequences: int = 1,
                 bytes_per_param=2.0, kv_bytes: float = 2.0, capacity: float | None = None,
                 prefer_split: bool = False) -> Placement:
    if context < 1 or sequences < 1:
        raise PlacementError("context and sequences must be at least 1")
    cap = float(capacity if capacity is not None else hw.usable_bytes)
    layers = _layer_items(model, bytes_per_param, context, sequences, kv_bytes)
    embed = model.embed_bytes(bytes_per_param)
    head = model.head_bytes(bytes_per_param)
    what = f"{model.name} ({precision_label(bytes_per_param)})"
    for i, (w, kv) in enumerate(layers):
        if w + kv > cap:
            raise PlacementError(
                f"layer {i} of {what} needs {_gb(w + kv)} (weights {_gb(w)} + KV {_gb(kv)} for {context} tokens x "
                f"{sequences} sequences); one {hw.name} unit holds {_gb(cap)} usable")
    n = model.n_layers
    if units is not None:
        if units < 1:
            raise PlacementError("the number of units must be at least 1")
        if units > n:
            raise PlacementError(f"{units} units for {n} layers: each unit needs at least one layer")

    def stage_bytes(a: int, b: int) -> float:
        s = sum(w + kv for w, kv in layers[a:b])
        return s + (embed if a == 0 else 0.0) + (head if b == n else 0.0)

    def pack(max_layers: int) -> list[tuple[int, int]] | None:
        """Greedy contiguous packing with at most ``max_layers`` per unit; None if an end item cannot fit."""
        out, a = [], 0
        while a < n:
            b = a
            while b < n and b - a < max_layers and stage_bytes(a, b + 1) <= cap:
                b += 1
            if b == a:  # even one layer does not fit next to the embedding/head on this unit
                return None
            if b == n and stage_bytes(a, b) > cap:
                return None
            out.append((a, b))
            a = b
        return out

    greedy = pack(n)  # fill each unit as far as it goes: the fewest units that can hold the model
    if units is None:
        if greedy is None:
            raise PlacementError(f"{what} does not fit on {hw.name} units of {_gb(cap)} usable "
                                 "(the embedding or the head cannot share a unit with a layer)")
        units = len(greedy)
        if prefer_split and units > 1:  # fewer units when a layer may continue on the next one
            sp = _place_split(model, hw, None, context, sequences, bytes_per_param, kv_bytes, capacity)
            if sp is not None and sp.n_units < units:
                raise _TrySplit(sp)
    best = None
    for m in range(math.ceil(n / units), n + 1):  # the smallest layer count per unit that packs
        packed = pack(m)
        if packed is not None and len(packed) <= units:
            best = packed
            break
    if best is None:
        hint = f"; it needs at least {len(greedy)}" if greedy is not None else ""
        raise PlacementError(f"{what} with KV for {context} tokens x {sequences} sequences does not fit on "
                             f"{units} {hw.name} unit(s) of {_gb(cap)} usable{hint}")
    # split the largest ranges until there are exactly `units` of them
    while len(best) < units:
        k = max(range(len(best)), key=lambda j: best[j][1] - best[j][0])
        a, b = best[k]
        mid = (a + b + 1) // 2
        best[k:k + 1] = [(a, mid), (mid, b)]
    stages = []
    for idx, (a, b) in enumerate(best):
        w = sum(x for x, _ in layers[a:b]) + (embed if a == 0 else 0.0) + (head if b == n else 0.0)
        stages.append(Stage(idx, a, b, w, sum(kv for _, kv in layers[a:b]), a == 0, b == n))
    return Placement(model, hw, tuple(stages), bytes_per_param, context, sequences, cap)
