"""The validation table: published results, what the model predicts for them, and the error.

Each wafer system is calibrated once (its ``[calibration]`` point, marked as such below); every
other row is a prediction.  Rows with a tolerance are checked (tests, ``bench/sim_validate.py``);
rows without one are shown for context (their conditions differ from the model's, e.g. the
published run used speculative decoding).
"""

from __future__ import annotations

from dataclasses import dataclass

from .deploy import Deployment, speculative
from .placement import place
from .specs import load_hardware, load_model


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    published: float
    predicted: float
    unit: str
    tolerance: float | None  # relative; None = not checked
    source: str
    kind: str = "prediction"  # "prediction" | "calibration" | "placement" | "context"

    @property
    def error(self) -> float:
        return (self.predicted - self.published) / self.published

    @property
    def ok(self) -> bool:
        if self.kind == "placement":
            return self.predicted >= self.published if self.name.endswith(">=") else self.predicted == self.published
        return self.tolerance is None or abs(self.error) <= self.tolerance

    def to_dict(self) -> dict:
        return {"name": self.name, "published": self.published, "predicted": self.predicted, "unit": self.unit,
                "error": self.error, "tolerance": self.tolerance, "ok": self.ok, "kind": self.kind, "source": self.source}


def _tok_s(spec: str, **kw) -> float:
    _, cost = Deployment.parse(spec, **kw).build()
    return 1 / cost.token_time()


def _ms(spec: str, **kw) -> float:
    _, cost = Deployment.parse(spec, **kw).build()
    return cost.token_time() * 1e3


#: the draft model, tokens per draft and acceptance rate assumed for speculative decoding on wafers
SEEDS_DRAFT = ("llama-3.1-8b", 4, 0.7)


def seeds_cases(model: str = "frontier-moe") -> list[tuple[str, Deployment, tuple | None]]:
    """The seeds' flagship comparison at 8-bit: standard serving batches 64 users per GPU step; the
    wafer pipeline serves one sequence per step, alone and with a speculative draft.
    (label, deployment, draft or None)."""
    gpu, wafer = f"{model}@h200x8:8bit", f"{model}@wse3:8bit"
    return [("GPU, standard serving", Deployment.parse(gpu, batch=64), None),
            ("GPU, batch 1", Deployment.parse(gpu, batch=1), None),
            ("wafer pipeline", Deployment.parse(wafer), None),
            ("wafer pipeline + speculation", Deployment.parse(wafer), SEEDS_DRAFT)]


def seeds_rates() -> tuple[float, float]:
    """(standard GPU serving, wafer pipeline with speculation) per-user tokens/s for the frontier-class model."""
    cases = seeds_cases()
    std = 1 / cases[0][1].build()[1].token_time()
    return std, speculative(cases[3][1], *cases[3][2])


def table() -> list[Row]:
    cs3 = load_hardware("wse3")
    rows = [
        Row("Cerebras Llama 3.1 8B, 1 CS-3", 1800, _tok_s("llama-3.1-8b@wse3x1"), "tok/s", 1e-9,
            cs3.calibration.source, "calibration"),
        Row("Cerebras Llama 3.1 70B, 4 CS-3", 450, _tok_s("llama-3.1-70b@wse3x4"), "tok/s", 0.15,
            "Cerebras Inference launch, Aug 2024: 70B at 450 tokens/s on 4 CS-3, 16-bit, no speculative decoding"),
        Row("70B at 16-bit: CS-3 wafers", 4, place(load_model("llama-3.1-70b"), cs3).n_units, "wafers", None,
            "Cerebras, Aug 2024: Llama 3.1 70B served on 4 CS-3 systems", "placement"),
        Row("405B at 16-bit: CS-3 wafers >=", 19, place(load_model("llama-3.1-405b"), cs3).n_units, "wafers", None,
            "811 GB of 16-bit weights over 44 GB per wafer: at least 19 wafers", "placement"),
        Row("WaferLLM Llama3-8B, WSE-2", 2700, _tok_s("llama-3.1-8b@wse2x1"), "tok/s", 1e-9,
            load_hardware("wse2").calibration.source, "calibration"),
        Row("WaferLLM Qwen2-72B, WSE-2", 840, _tok_s("qwen2-72b@wse2"), "tok/s", 0.20,
            "WaferLLM (arXiv 2502.04563): Qwen2-72B decode 840 tokens/s per request, 16-bit"),
        Row("FasterTransformer 13B, 1 A100", 22.0, _ms("gpt-13b@a100x1", context=2048), "ms/token", 0.10,
            "FasterTransformer GPT benchmark: 13B, batch 1, 22.0 ms per token on one A100"),
        Row("FasterTransformer 13B, 2 A100 (TP2)", 13.5, _ms("gpt-13b@a100x2", context=2048), "ms/token", 0.10,
            "FasterTransformer GPT benchmark: 13B, batch 1, 13.5 ms per token on two A100 (tensor parallel)"),
        Row("Llama 3.1 70B, 8 x H200, no speculation", 180, _tok_s("llama-3.1-70b@h200x8"), "tok/s", None,
            "published 8 x H200 serving of 70B at batch 1 without speculative decoding (~180 tokens/s)", "context"),
        Row("Cerebras Llama 3.1 405B (with speculation)", 969,
            speculative(Deployment.parse("llama-3.1-405b@wse3"), "llama-3.1-8b", 4, 0.7), "tok/s", None,
            "Cerebras, Nov 2024: 405B at 969 tokens/s; modelled with an 8B draft, k=4, acceptance 0.7 (assumed)", "context"),
    ]
    std, wafer = seeds_rates()
    rows += [
        Row("seeds: frontier model, standard GPU serving", 53, std, "tok/s", None,
            "seeds' claim; modelled as frontier-moe at 8-bit on 8 x H200, batch 64 per step", "context"),
        Row("seeds: frontier model, wafer pipeline", 750, wafer, "tok/s", None,
            "seeds' claim; modelled as frontier-moe at 8-bit on CS-3 wafers, 8B draft k=4 acceptance 0.7", "context"),
        Row("seeds: wafer vs standard ratio", 750 / 53, wafer / std, "x", None,
            "the seeds' 14x; the model's ratio comes from the serving batch and the expert union on GPUs "
            "versus one sequence per step and per-layer latency on wafers", "context"),
    ]
    return rows
