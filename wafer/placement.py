"""Placement: contiguous layer ranges per unit (wafer, GPU pipeline stage, CPU stage) under its memory.

A pure function of the model shape, the hardware and the deployment's numbers.  The items laid
out in order are the embedding, the layers and the output head; each unit holds the weights of
its items plus the KV cache of its layers for ``context`` tokens of ``sequences`` sequences.
With a tied embedding the last unit keeps its own copy of the matrix for the head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .specs import Hardware, ModelShape


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
                        "kv_bytes": s.kv_bytes, "embed": s.has_embed, "head": s.has_head} for s in self.stages],
        }


def _gb(b: float) -> str:
    return f"{b / 1e9:.2f} GB" if b >= 1e8 else f"{b / 1e6:.1f} MB"


def _layer_items(model: ModelShape, bpp, context: int, sequences: int, kv_bytes: float):
    kv = model.kv_bytes_per_token(kv_bytes) * context * sequences
    return [(model.layer_bytes(i, bpp), kv) for i in range(model.n_layers)]


def place(model: ModelShape, hw: Hardware, units: int | None = None, *, context: int = 8192, sequences: int = 1,
          bytes_per_param: float | None = 2.0, kv_bytes: float = 2.0, capacity: float | None = None) -> Placement:
    """Lay ``model`` out on ``units`` units of ``hw`` (``None``: as few as fit), balancing the layer
    count per unit.  ``capacity`` overrides the usable bytes of one unit."""
    if context < 1 or sequences < 1:
        raise PlacementError("context and sequences must be at least 1")
    cap = float(capacity if capacity is not None else hw.usable_bytes)
    layers = _layer_items(model, bytes_per_param, context, sequences, kv_bytes)
    embed = model.embed_bytes(bytes_per_param)
    head = model.head_bytes(bytes_per_param)
    what = f"{model.name} ({'file sizes' if bytes_per_param is None else f'{bytes_per_param * 8:g}-bit'})"
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
