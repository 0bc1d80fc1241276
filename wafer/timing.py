"""The analytic timing model: what one token, a prompt and a pipeline of sequences cost.

Wafers are bound by per-layer latency, not SRAM bandwidth: a layer costs
``tau(d) = tau_ref * (d_model / d_ref) ** width_exponent`` plus the time to read its unit's
weights at that unit's share of the SRAM bandwidth, and ``tau_ref`` is fixed once per wafer
by its published calibration point.  A token crosses every unit in turn:
``T_tok = sum(stage times) + (N - 1) * hop``.  GPUs are bound by HBM:
``T_tok = (weights / tp + KV) / (bw * efficiency) + collectives``.  This machine's CPU is
modelled from its measured kernel rates.

For one sequence a pipeline adds no speed.  With ``M`` sequences in flight a unit works on one
token at a time, so the period of the pipeline is ``max(T_tok, M * slowest stage)``: the
aggregate rate grows with ``M`` up to the stage count and no further.
"""

from __future__ import annotations

from dataclasses import dataclass

from .placement import Placement, PlacementError, place
from .specs import Hardware, ModelShape, load_model

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

    def prefill_time(self, tokens: int) -> float:
        """Compute-bound prompt processing of ``tokens`` new tokens, excluding the last token's pass."""
        raise NotImplementedError

    def collective_time(self, layer: int) -> float:
        return 0.0

    # -- derived ----------------------------------------------------------------------------------

    def stage_time(self, stage: int, tokens: int = _ONE) -> float:
        memo = self.__dict__.setdefault("_stage_memo", {})  # the simulation asks for the same ones over and over
        key = (stage, tokens)
        if key not in memo:
            s = self.placement.stages[stage]
            t = sum(self.layer_time(i, tokens) + self.collective_time(i) for i in s.layers)
            memo[key] = t + (self.head_time() if s.has_head else 0.0)
        return memo[key]

    def token_time(self) -> float:
        """Latency of one decode step for one sequence."""
        n = self.placement.n_units
        return sum(self.stage_time(k) for k in range(n)) + (n - 1) * self.hop_time()

    def throughput(self, sequences: int) -> Throughput:
        t = self.token_time()
        bottleneck = max(self.stage_time(k) for k in range(self.placement.n_units))
        period = max(t, sequences * bottleneck)
        return Throughput(sequences, period, 1 / period, sequences / period)

    def ttft(self, prompt_tokens: int) -> float:
        """Time to first token for a prompt of ``prompt_tokens`` new tokens."""
        return self.prefill_time(max(0, prompt_tokens - 1)) + self.token_time()


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
    reads = sum(_stage_read(p, k) * (p.stages[k].n_layers + p.stages[k].has_head) for k in range(n))
    layers = model.n_layers + 1  # the head costs one layer-equivalent
    tau = (1 / cal.tok_s - (n - 1) * hop - reads) / layers
    if tau <= 0:
        raise ValueError(f"{hw.name}: the calibration point leaves no time for the layers")
    return WaferCalibration(tau, model.d_model, cal.source)


def _stage_read(p: Placement, k: int) -> float:
    """Time for one layer of unit ``k`` to read its weights: each layer has the unit's bandwidth
    in proportion to its bytes, so every layer takes the unit's bytes over the full bandwidth."""
    s = p.stages[k]
    return s.weight_bytes / p.hardware["memory_bw"]


class WaferCost(CostModel):
    def __init__(self, placement: Placement, calibration: WaferCalibration | None = None):
        self.placement = p = placement
        hw = p.hardware
        self.cal = calibration or calibrate(hw)
        self.tau = self.cal.tau_ref_s * (p.model.d_model / self.cal.d_ref) ** hw["width_exponent"]
        self._read = [_stage_read(p, k) for k in range(p.n_units)]

    def layer_time(self, layer: int, tokens: int = _ONE) -> float:
        """The layer's latency; a prompt chunk of ``tokens`` adds the compute of the others."""
        t = self.tau + self._read[self.placement.stage_of(layer).index]
        if tokens > 1:
            hw = self.placement.hardware
            t += 2 * self.placement.model.layer_active_params(layer) * (tokens - 1) / (hw["flops_16bit"] * hw["prefill_mfu"])
        return t

    def head_time(self) -> float:
        return self.tau + self._read[-1]

    def hop_time(self, tokens: int = _ONE) -> float:
        hw = self.placement.hardware
        return hw["hop_latency_s"] + tokens * self.placement.model.d_model * 2 / hw["hop_bw"]

    def prefill_time(self, tokens: int) -> float:
        hw, m = self.placement.hardware, self.placement.model
        return 2 * m.active_params * tokens / (hw["flops_16bit"] * hw["prefill_mfu"])


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

    def _layer_read_bytes(self, i: int) -> float:
        m, bpp = self.placement.model, self.placement.bytes_per_param
        if bpp is None:  # the sizes stored in a model file (a dense model)
            return m.layer_active_bytes(i, bpp)
        return m.layer_batch_params(i, self.batch) * bpp

    def layer_time(self, layer: int, tokens: int = _ONE) -> float:
        m, hw = self.placement.model, self.placement.hardware
        kv = self.batch * self.context_used * m.kv_bytes_per_token()
        mem = (self._layer_read_bytes(layer) + kv) / self.tp / self.bw
        flops = 2 * self.batch * tokens * m.layer_active_params(layer) / self.tp / (hw["flops_16bit"] * hw["prefill_mfu"])
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

    def prefill_time(self, tokens: int) -> float:
        hw, m = self.placement.hardware, self.placement.model
        gpus = self.tp * self.placement.n_units
        return 2 * m.active_params * tokens / (gpus * hw["flops_16bit"] * hw["prefill_mfu"])

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
                         capacity=hw.usable_bytes * tp), tp
        except PlacementError:
            continue
    bits = f"{bytes_per_param * 8:g}-bit"
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
        kv = 2 * self.context_used * m.n_kv_heads * m.head_dim * 4  # float32 K and V
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

    def prefill_time(self, tokens: int) -> float:
        return 2 * self.placement.model.active_params * tokens / self.placement.hardware["flops_16bit"]


def cost_model(placement: Placement, tp: int = 1, batch: int = 1, context_used: int | None = None) -> CostModel:
    kind = placement.hardware.kind
    if kind == "wafer":
        return WaferCost(placement)
    if kind == "gpu":
        return GPUCost(placement, tp, batch, context_used)
    return CPUCost(placement, context_used if context_used is not None else 256)


# -- speculative decoding -------------------------------------------------------------------------

def speculative_tok_s(target: CostModel, draft: CostModel, k: int, accept: float) -> float:
    """Tokens/s of one sequence when a draft proposes ``k`` tokens and the target checks them in
    one pass (latency-bound, so the check costs about one decode step); ``accept`` is the chance
    each drafted token is kept."""
    if not 0 <= accept < 1:
        raise ValueError("acceptance rate must be in [0, 1)")
    expected = (1 - accept ** (k + 1)) / (1 - accept)
    return expected / (k * draft.token_time() + target.token_time())

