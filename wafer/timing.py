"""The analytic timing model: what one token, a prompt and a pipeline of sequences cost.

Wafers are bound by per-layer latency, not SRAM bandwidth: a layer costs
``tau(d) = tau_ref * (d_model / d_ref) ** width_exponent`` plus the time to read its unit's
weights at that unit's share of the SRAM bandwidth, and ``tau_ref`` is fixed once per wafer
by its published calibration point.  A token crosses every unit in turn:
``T_tok = sum(stage times) + (N - 1) * hop``.  GPUs are bound by HBM:
``T_tok = (weights + KV) / tp / (bw * efficiency) + collectives`` (or by FLOPs, whichever is
slower).  This machine's CPU is modelled from its measured kernel rates.

For one sequence a pipeline adds no speed.  With ``M`` sequences in flight a unit works on one
token at a time, so the period of the pipeline is ``max(T_tok, M * slowest stage)``: the
aggregate rate grows with ``M`` up to the stage count and no further.
"""

from __future__ import annotations

from dataclasses import dataclass

from .placement import Placement, PlacementError, place
from .specs import Hardware, ModelShape, load_model, precision_label

#: Tokens in a decode step.
_ONE = 1


@dataclass(frozen=True, slots=True)
class Throughput:
    sequences: int
    period_s: float  # time between two tokens of one sequence
    per_user_tok_s: float
    aggregate_tok_s: float


class CostModel:
    """Per-layer, per-stage and per-hop times for one placement; the interface the simulated
    clock and ``WaferPipeline`` are given (times in seconds)."""

    placement: Placement

    def layer_time(self, layer: int, tokens: int = _ONE) -> float:
        raise NotImplementedError

    def head_time(self) -> float:
        raise NotImplementedError

    def hop_time(self, tokens: int = _ONE) -> float:
        raise NotImplementedError

    def prefill_time(self, tokens: int, past: int = 0) -> float:
        """Processing a prompt of ``tokens`` new tokens after ``past`` cached ones, up to its first
        token out (the last prompt token's pass included)."""
        raise NotImplementedError

    def collective_time(self, layer: int) -> float:
        return 0.0

    def carry_time(self, stage, tokens: int = _ONE) -> float:
        """The share of the previous unit's last layer that ``stage`` also runs (a split layer)."""
        return 0.0

    # -- derived ----------------------------------------------------------------------------------

    def stage_time(self, stage: int, tokens: int = _ONE) -> float:
        memo = self.__dict__.setdefault("_stage_memo", {})  # the simulation asks for the same ones over and over
        key = (stage, tokens)
        if key not in memo:
            s = self.placement.stages[stage]
            t = sum(self.layer_time(i, tokens) + self.collective_time(i) for i in s.layers)
            t += self.carry_time(s, tokens) if s.carry_share else 0.0
            memo[key] = t + (self.head_time() if s.has_head else 0.0)
        return memo[key]

    def pass_time(self, tokens: int = _ONE) -> float:
        """One pass of ``tokens`` tokens through every unit and hop (a decode step at 1, the
        verification of a speculative draft at k + 1)."""
        n = self.placement.n_units
        return sum(self.stage_time(k, tokens) for k in range(n)) + (n - 1) * self.hop_time(tokens)

    def token_time(self) -> float:
        """Latency of one decode step for one sequence."""
        return self.pass_time(_ONE)

    def throughput(self, sequences: int) -> Throughput:
        t = self.token_time()
        bottleneck = max(self.stage_time(k) for k in range(self.placement.n_units))
        period = max(t, sequences * bottleneck)
        return Throughput(sequences, period, 1 / period, sequences / period)

    def ttft(self, prompt_tokens: int, past: int = 0) -> float:
        """Time to first token for a prompt of ``prompt_tokens`` new tokens after ``past`` cached ones."""
        return self.prefill_time(max(1, prompt_tokens), past)


# -- wafers ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class WaferCalibration:
    tau_ref_s: float
    d_ref: int
    source: str


def calibrate(hw: Hardware) -> WaferCalibration:
    """Solve the wafer's calibration point for ``tau_ref``: the only fitted number of a wafer."""
    cal = hw.calibration
    model = load_model(cal.model)
    p = place(model, hw, cal.units, context=1, bytes_per_param=cal.bytes_per_param)
    n = p.n_units
    hop = hw["hop_latency_s"] + model.d_model * 2 / hw["hop_bw"]
    reads = sum(_stage_read(p, k) * (p.stages[k].n_layers + p.stages[k].has_head + (p.stages[k].carry_share > 0))
                for k in range(n))
    layers = model.n_layers + 1 + p.split_layers  # the head and each split layer's second share cost one layer-equivalent
    tau = (1 / cal.tok_s - (n - 1) * hop - reads) / layers
    if tau <= 0:
        raise ValueError(f"{hw.name}: the calibration point leaves no time for the layers")
    return WaferCalibration(tau, model.d_model, cal.source)


def _stage_read(p: Placement, k: int) -> float:
    """Time for one layer of unit ``k`` to read its weights: each layer has the unit's bandwidth
    in proportion to its bytes, so every layer takes the unit's bytes over the full bandwidth."""
    s = p.stages[k]
    return s.weight_bytes / p.hardware["memory_bw"]


#: prompt chunk sizes a wafer pipeline may be filled with (the fastest is taken)
PREFILL_CHUNKS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)


class WaferCost(CostModel):
    """Per-layer latency plus the unit's SRAM read for each layer; a chunk of ``tokens`` adds its
    FLOPs at the wafer's prefill efficiency (all of the wafer's cores work on the chunk's layers)."""

    def __init__(self, placement: Placement, calibration: WaferCalibration | None = None):
        self.placement = p = placement
        hw = p.hardware
        self.cal = calibration or calibrate(hw)
        self.tau = self.cal.tau_ref_s * (p.model.d_model / self.cal.d_ref) ** hw["width_exponent"]
        self._read = [_stage_read(p, k) for k in range(p.n_units)]
        self._flops = hw["flops_16bit"] * hw["prefill_mfu"]
        self.past = 0  # tokens already cached when a chunk is processed (prefill_time sets it)

    def _share(self, layer: int, share: float, tokens: int) -> float:
        """FLOP time of ``share`` of layer ``layer``'s divisible part (its experts or MLP) for ``tokens`` tokens."""
        m = self.placement.model
        fixed, each, n = m.layer_parts(layer)
        div = m.experts_per_token * each if n else m.mlp_matrices * m.d_model * m.d_ff
        return 2 * div * share * tokens / self._flops

    def layer_time(self, layer: int, tokens: int = _ONE) -> float:
        """The layer's latency; a prompt chunk of ``tokens`` adds the compute of the others."""
        st = self.placement.stage_of(layer)
        t = self.tau + self._read[st.index]
        if tokens > 1:
            m = self.placement.model
            t += (m.layer_prefill_flops(layer, tokens, self.past) - 2 * m.layer_active_params(layer)) / self._flops
            if st.stop - 1 == layer and st.last_share < 1:  # the rest of its experts run on the next unit
                t -= self._share(layer, 1 - st.last_share, tokens - 1)
        return t

    def carry_time(self, stage, tokens: int = _ONE) -> float:
        t = self.tau + self._read[stage.index]
        return t + (self._share(stage.first - 1, stage.carry_share, tokens - 1) if tokens > 1 else 0.0)

    def head_time(self) -> float:
        return self.tau + self._read[-1]

    def hop_time(self, tokens: int = _ONE) -> float:
        hw = self.placement.hardware
        return hw["hop_latency_s"] + tokens * self.placement.model.d_model * 2 / hw["hop_bw"]

    def prefill_time(self, tokens: int, past: int = 0) -> float:
        """The pipeline filled with prompt chunks: the first chunk crosses every unit, each further
        one leaves one slowest-stage time later; the chunk size that finishes first is taken."""
        best = None
        n = self.placement.n_units
        for c in sorted({min(tokens, c) for c in PREFILL_CHUNKS}):
            chunks = -(-tokens // c)
            self.past = past + (tokens - c) // 2  # a chunk's attention sees the average prefix
            self.__dict__.pop("_stage_memo", None)
            try:
                stage = [self.stage_time(k, c) for k in range(n)]
                t = sum(stage) + (n - 1) * self.hop_time(c) + (chunks - 1) * max(max(stage), self.hop_time(c))
            finally:
                self.past = 0
                self.__dict__.pop("_stage_memo", None)
            best = t if best is None else min(best, t)
        return best


# -- GPUs -----------------------------------------------------------------------------------------

class GPUCost(CostModel):
    """``gpus`` GPUs as ``pp`` pipeline stages of ``tp`` tensor-parallel GPUs (tp within one node),
    serving ``batch`` sequences per step (1 = the latency case)."""

    def __init__(self, placement: Placement, tp: int, batch: int = 1, context_used: int | None = None):
        self.placement = p = placement
        self.tp, self.batch = tp, batch
        self.context_used = p.context if context_used is None else context_used
        hw = p.hardware
        self.bw = hw["memory_bw"] * hw["hbm_efficiency"]

    def _layer_read_bytes(self, i: int, tokens: int = _ONE) -> float:
        """Weight bytes of layer ``i`` a step reads: every token of every sequence is routed, so a
        mixture of experts reads the union of the experts of ``batch * tokens`` tokens."""
        return self.placement.model.layer_batch_bytes(i, self.batch * tokens, self.placement.bytes_per_param)

    def layer_time(self, layer: int, tokens: int = _ONE) -> float:
        """A step of ``batch`` sequences with ``tokens`` tokens each: the weights they touch (the
        union of their experts) and their KV caches read once, or their FLOPs, whichever is slower."""
        m, hw = self.placement.model, self.placement.hardware
        kv = self.batch * m.layer_kv_bytes(layer, self.context_used)
        mem = (self._layer_read_bytes(layer, tokens) + kv) / self.tp / self.bw
        flops = self.batch * m.layer_prefill_flops(layer, tokens, self.context_used) / self.tp / (hw["flops_16bit"] * hw["prefill_mfu"])
        return max(mem, flops)

    def head_time(self) -> float:
        m, hw = self.placement.model, self.placement.hardware
        mem = m.head_bytes(self.placement.bytes_per_param) / self.tp / self.bw
        flops = 2 * self.batch * m.head_params / self.tp / (hw["flops_16bit"] * hw["prefill_mfu"])
        return max(mem, flops)

    def collective_time(self, layer: int) -> float:
        if self.tp == 1:
            return 0.0
        hw, m = self.placement.hardware, self.placement.model
        msg = self.batch * m.d_model * 2
        one = hw["allreduce_latency_s"] + 2 * (self.tp - 1) / self.tp * msg / hw["link_bw"]
        return 2 * one  # after attention and after the MLP

    def hop_time(self, tokens: int = _ONE) -> float:
        return self.placement.hardware["internode_latency_s"]

    def prefill_time(self, tokens: int, past: int = 0) -> float:
        """Compute-bound: the FLOPs (weights and attention) of all but the last prompt token over
        every GPU at the prefill efficiency (collectives assumed overlapped), then the last
        token's pass as a decode step."""
        hw, m = self.placement.hardware, self.placement.model
        gpus = self.tp * self.placement.n_units
        rest = m.prefill_flops(tokens - 1, past) if tokens > 1 else 0.0
        return rest / (gpus * hw["flops_16bit"] * hw["prefill_mfu"]) + self.token_time()

    def throughput(self, sequences: int) -> Throughput:
        if self.batch > 1:  # a batched step serves `batch` sequences at once
            t = self.token_time()
            return Throughput(self.batch, t, 1 / t, self.batch / t)
        return CostModel.throughput(self, sequences)


def place_gpus(model: ModelShape, hw: Hardware, gpus: int | None, *, context: int = 8192, sequences: int = 1,
               bytes_per_param: float = 2.0) -> tuple[Placement, int]:
    """Tensor parallel within a node (up to ``node_gpus``), pipeline stages across nodes; ``None``
    picks the fewest GPUs (1, 2, 4, 8, then whole nodes) that hold the model.  Returns (placement, tp)."""
    node = int(hw["node_gpus"])
    candidates = [gpus] if gpus else [1, 2, 4, 8] + [node * k for k in range(2, 65)]
    for g in candidates:
        tp = min(g, node)
        if g % tp:
            raise PlacementError(f"{g} GPUs do not split into nodes of {node}")
        try:
            return place(model, hw, g // tp, context=context, sequences=sequences, bytes_per_param=bytes_per_param,
                         capacity=hw.usable_bytes * tp, split=False), tp
        except PlacementError:
            continue
    bits = precision_label(bytes_per_param)
    need = model.weight_bytes(bytes_per_param) / hw.usable_bytes
    raise PlacementError(f"{model.name} at {bits} with KV for {context} tokens x {sequences} sequences does not fit on "
                         f"{gpus or candidates[-1]} {hw.name} GPUs ({hw.usable_bytes / 1e9:.0f} GB usable each; the weights "
                         f"alone need {need:.1f}); use more GPUs (a multiple of {node}) or fewer bits")


# -- this machine's CPU ---------------------------------------------------------------------------

class CPUCost(CostModel):
    """The decode core on this machine: weights streamed at the measured kernel rates (which include
    the four matrix-vector calls of a layer), plus the measured cost of the layer's other kernel
    calls (attention in parallel, 7 serial: norms, RoPE, residual adds, SiLU) and the float32 KV read."""

    PARALLEL_CALLS = 1
    SERIAL_CALLS = 7

    def __init__(self, placement: Placement, context_used: int = 256):
        self.placement = placement
        self.context_used = context_used

    def layer_time(self, layer: int, tokens: int = _ONE) -> float:
        hw, m = self.placement.hardware, self.placement.model
        kv = m.layer_kv_bytes(layer, self.context_used, 4.0)  # float32 K and V
        t = ((self.placement.model.layer_bytes(layer, self.placement.bytes_per_param) + kv) / hw["gemv_bw"]
             + self.PARALLEL_CALLS * hw["call_overhead_s"] + self.SERIAL_CALLS * hw["serial_call_s"])
        if tokens > 1:  # a prompt chunk: the matrix-matrix kernels are compute-bound
            t = max(t, 2 * m.layer_active_params(layer) * tokens / hw["flops_16bit"])
        return t

    def head_time(self) -> float:
        hw = self.placement.hardware
        return self.placement.model.head_bytes(self.placement.bytes_per_param) / hw["head_bw"] + hw["call_overhead_s"]

    def hop_time(self, tokens: int = _ONE) -> float:
        return self.placement.hardware["hop_latency_s"]

    def prefill_time(self, tokens: int, past: int = 0) -> float:
        rest = self.placement.model.prefill_flops(tokens - 1, past) if tokens > 1 else 0.0
        return rest / self.placement.hardware["flops_16bit"] + self.token_time()


def cost_model(placement: Placement, tp: int = 1, batch: int = 1, context_used: int | None = None) -> CostModel:
    kind = placement.hardware.kind
    if kind == "wafer":
        return WaferCost(placement)
    if kind == "gpu":
        return GPUCost(placement, tp, batch, context_used)
    return CPUCost(placement, context_used if context_used is not None else 256)


# -- speculative decoding -------------------------------------------------------------------------

def expected_tokens(k: int, accept: float) -> float:
    """Tokens one draft-and-verify cycle yields when each of ``k`` drafted tokens is kept with
    chance ``accept`` until the first miss, plus the target's own token: (1 - a^(k+1)) / (1 - a)."""
    if not 0 <= accept <= 1:
        raise ValueError("acceptance rate must be in [0, 1]")
    return k + 1.0 if accept == 1 else (1 - accept ** (k + 1)) / (1 - accept)


def speculative_tok_s(target: CostModel, draft: CostModel, k: int, accept: float) -> float:
    """Tokens/s of one sequence when a draft proposes ``k`` tokens (``k`` draft steps) and the
    target checks them in one pass over ``k + 1`` tokens; ``accept`` is the chance each drafted
    token is kept."""
    if not 0 <= accept < 1:
        raise ValueError("acceptance rate must be in [0, 1)")
    return expected_tokens(k, accept) / (k * draft.token_time() + target.pass_time(k + 1))
