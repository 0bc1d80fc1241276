"""``local-cpu``: this machine as a catalogue entry, measured rather than published.

Micro-measurements, none of them a decode step: the read bandwidth of one thread
(``read_bw``); the rate at which the layer's matrix-vector kernels stream Q4_1 weights from
memory (``gemv_bw``) and a vocabulary-sized Q8_0 output head (``head_bw``); the cost of one
parallel and one serial kernel call on a tiny input (``call_overhead_s``, ``serial_call_s``);
and ``matmat``'s FLOP rate for prefill (``flops_16bit``, named like the other entries').  The
figures are cached per machine in ``~/.cache/wafervox/local-cpu.json``.
"""

from __future__ import annotations

import json
import os
import platform
import time
from datetime import date
from pathlib import Path

import numpy as np

from .specs import Hardware, hardware_from_dict

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "wafervox" / "local-cpu.json"
_FORMAT = 4


def _machine_key() -> str:
    import numba

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}|cpus={os.cpu_count()}|numba_threads={numba.get_num_threads()}|v{_FORMAT}"


def _median_time(fn, repeat: int) -> float:
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def _q4_1(rng, shape) -> np.ndarray:
    """Random Q4_1 rows with sane scales: ``(rows, row_bytes)`` uint8."""
    from decode.quant import QType, row_bytes

    rows, cols = shape
    w = rng.integers(0, 255, size=(rows, row_bytes(QType.Q4_1, cols)), dtype=np.uint8)
    w.reshape(rows, cols // 32, 20)[..., 0:4] = np.frombuffer(np.array([0.01, 0.0], np.float16).tobytes(), np.uint8)
    return w


def measure(ring_bytes: float = 128e6, d: int = 576, kv: int = 192, ff: int = 1536) -> dict[str, float]:
    """Run the micro-measurements (a few seconds) and return their figures.  The matrix-vector rate
    is taken the way a decode layer calls the kernels (q/k/v and gate/up fused in ``matvec3``,
    ``wo`` and ``down`` alone), at a llama layer's shapes (default: the bundled model's), over a
    ring of layers four times larger than the last-level cache, so every byte comes from memory."""
    from decode.ops import add_into
    from decode.quant import QType, matmat, matvec, matvec3, row_bytes

    rng = np.random.default_rng(0)
    shapes = ((d, d), (kv, d), (kv, d), (d, d), (ff, d), (ff, d), (d, ff))
    one = sum(r * row_bytes(QType.Q4_1, c) for r, c in shapes)
    ring = [[_q4_1(rng, sh) for sh in shapes] for _ in range(max(2, int(ring_bytes // one)))]
    x, xf = rng.standard_normal(d).astype(np.float32), rng.standard_normal(ff).astype(np.float32)
    q, k, v, o = (np.zeros(r, np.float32) for r in (d, kv, kv, d))
    g, u = np.zeros(ff, np.float32), np.zeros(ff, np.float32)
    q4 = int(QType.Q4_1)

    def sweep():
        for wq, wk, wv, wo, wg, wu, wd in ring:
            matvec3(q4, wq, q4, wk, q4, wv, x, q, k, v)
            matvec(q4, wo, x, o)
            matvec3(q4, wg, q4, wu, q4, wu[:0], x, g, u, u[:0])
            matvec(q4, wd, xf, o)

    sweep()  # compile or load from the cache, and touch every page
    gemv_bw = len(ring) * one / _median_time(sweep, 9)
    cols = d
    x = rng.standard_normal(cols).astype(np.float32)
    ring = ring[0]

    # the output head: a vocabulary-sized Q8_0 matrix (two of them, so that neither stays in cache)
    hrows, hrb = 49152, row_bytes(QType.Q8_0, cols)
    heads = rng.integers(-100, 100, size=(2, hrows, hrb), dtype=np.int8).view(np.uint8)
    heads.reshape(2, hrows, cols // 32, 34)[..., 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    hout = np.zeros(hrows, np.float32)
    q8 = int(QType.Q8_0)
    matvec(q8, heads[0], x, hout)

    def head_sweep():
        matvec(q8, heads[0], x, hout)
        matvec(q8, heads[1], x, hout)

    head_bw = heads.nbytes / _median_time(head_sweep, 9)

    tiny_w = ring[0][:64]
    tiny_out = np.zeros(64, np.float32)

    def par_calls():
        for _ in range(200):
            matvec(q4, tiny_w, x, tiny_out)

    call = _median_time(par_calls, 5) / 200
    a = np.zeros((1, d), np.float32)
    b = np.ones((1, d), np.float32)
    add_into(a, b)

    def ser_calls():
        for _ in range(500):
            add_into(a, b)

    serial = _median_time(ser_calls, 5) / 500

    xs = rng.standard_normal((64, cols)).astype(np.float32)
    big = ring[4]  # the gate matrix
    mo = np.zeros((64, big.shape[0]), np.float32)
    matmat(q4, big, xs, mo)
    flops = 2 * 64 * big.shape[0] * cols / _median_time(lambda: matmat(q4, big, xs, mo), 5)
    big_read = np.ones(int(ring_bytes // 4), np.float32)
    big_read.sum()
    read_bw = big_read.nbytes / _median_time(big_read.sum, 5)
    return {"read_bw": read_bw, "gemv_bw": gemv_bw, "head_bw": head_bw, "call_overhead_s": call, "serial_call_s": serial,
            "flops_16bit": flops}


def _memory_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        return 8e9


def local_cpu(remeasure: bool = False, cache: Path | None = CACHE) -> Hardware:
    """This machine's entry; measured once and cached (``remeasure=True`` measures again)."""
    key = _machine_key()
    figures = None
    if cache is not None and not remeasure and cache.exists():
        try:
            saved = json.loads(cache.read_text())
            if saved.get("key") == key:
                figures, when = saved["figures"], saved["date"]
        except (OSError, ValueError, KeyError):
            figures = None  # a damaged cache is measured again
    if figures is None:
        figures, when = measure(), date.today().isoformat()
        if cache is not None:
            try:
                cache.parent.mkdir(parents=True, exist_ok=True)
                cache.write_text(json.dumps({"key": key, "date": when, "figures": figures}, indent=1))
            except OSError:
                pass
    return from_figures(figures, when, key.split("|")[0])


def from_figures(figures: dict[str, float], when: str | None = None, machine: str | None = None) -> Hardware:
    """The ``local-cpu`` entry for a set of ``measure()`` figures."""
    machine = machine or _machine_key().split("|")[0]
    src = f"measured on this machine ({machine}) on {when or date.today().isoformat()} with the decode kernels"
    params = {
        "read_bw": {"value": figures["read_bw"], "source": src + ": one thread summing 128 MB of float32 (NumPy)"},
        "gemv_bw": {"value": figures["gemv_bw"], "source": src + ": Q4_1 matvec/matvec3 as a layer calls them, 128 MB ring"},
        "head_bw": {"value": figures["head_bw"], "source": src + ": Q8_0 matvec of a 49152-row head"},
        "call_overhead_s": {"value": figures["call_overhead_s"], "source": src + ": one parallel kernel call"},
        "serial_call_s": {"value": figures["serial_call_s"], "source": src + ": one serial kernel call"},
        "flops_16bit": {"value": figures["flops_16bit"], "source": src + ": Q4_1 matmat, 64 tokens"},
        "memory_bytes": {"value": _memory_bytes(), "source": "physical memory of this machine"},
        "usable_fraction": {"value": 0.5, "assumption": True, "source": "share of RAM a model may take here"},
        "hop_latency_s": {"value": 2e-6, "assumption": True, "source": "a stage-to-stage hand-off between threads"},
    }
    return hardware_from_dict({"name": "local-cpu", "title": "this machine's CPU (measured)", "kind": "cpu",
                               "params": params, "aliases": ["cpu"]})
