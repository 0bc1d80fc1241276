"""The validation table: published results, what the model predicts for them, and the error.

Every row has a kind.  ``calibration``: the one published point per wafer system that fixes its
per-layer latency (fitted, so it matches by construction).  ``prediction``: a published figure
the model was not fitted to, checked against its tolerance, with the assumptions it is predicted
under (precision, speculation, batch).  ``placement``: a count of units, checked.  ``context``:
shown beside the others but not checked, because the published run's conditions are not the
model's or are not known (speculative decoding with an unpublished acceptance, a prompt longer
than a voice turn's); a context row's ``ok`` is ``None``, never a pass.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

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
    assumptions: str = ""  # what the prediction assumes: precision, speculation, batch, prompt
    system: str = ""  # "wafer" | "gpu": the kind of system the figure is for

    @property
    def error(self) -> float:
        return (self.predicted - self.published) / self.published

    @property
    def checked(self) -> bool:
        return self.kind != "context"

    @property
    def ok(self) -> bool | None:
        """Within tolerance (a placement: the count); ``None`` for a context row, which is not checked."""
        if self.kind == "context":
            return None
        if self.kind == "placement":
            return self.predicted >= self.published if self.name.endswith(">=") else self.predicted == self.published
        return self.tolerance is not None and abs(self.error) <= self.tolerance

    @property
    def status(self) -> str:
        return "n/a" if self.ok is None else ("yes" if self.ok else "NO")

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "published": self.published, "predicted": self.predicted,
                "unit": self.unit, "error": self.error, "tolerance": self.tolerance, "ok": self.ok, "checked": self.checked,
                "assumptions": self.assumptions, "system": self.system, "source": self.source}


KINDS = ("calibration", "prediction", "placement", "context")


def all_ok(rows: list[Row]) -> bool:
    """Every checked row within its tolerance (context rows do not count either way)."""
    return all(r.ok for r in rows if r.checked)


def _ttft_ms(spec: str, prompt: int) -> float:
    _, cost = Deployment.parse(spec, context=prompt + 1).build()
    return cost.ttft(prompt) * 1e3


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
    nvl32 = ("NVIDIA Technical Blog, Low Latency Inference Chapter 2 (Oct 2024): GH200 NVL32, TensorRT-LLM, "
             "Llama 3.1 {m}, {p:,}-token input: time to first token {t}")
    ttft_assume = ("32 GPUs as one tensor-parallel group; BF16 peak at prefill efficiency 0.5 (the catalogue's); "
                   "precision of the run not stated")
    rows = [
        # -- fitted: one point per wafer system
        Row("Cerebras Llama 3.1 8B, 1 CS-3", 1800, _tok_s("llama-3.1-8b@wse3x1"), "tok/s", 1e-9,
            cs3.calibration.source, "calibration", "16-bit, batch 1, no speculation"),
        Row("WaferLLM Llama3-8B, WSE-2", 2700, _tok_s("llama-3.1-8b@wse2x1"), "tok/s", 1e-9,
            load_hardware("wse2").calibration.source, "calibration", "16-bit, batch 1, no speculation"),
        # -- predicted, not fitted: wafers
        Row("Cerebras Llama 3.1 70B, 4 CS-3", 450, _tok_s("llama-3.1-70b@wse3x4"), "tok/s", 0.15,
            "Cerebras Inference launch, Aug 2024: 70B at 450 tokens/s on 4 CS-3, 16-bit, no speculative decoding",
            "prediction", "16-bit, one sequence, no speculation; per-layer latency scaled from the 8B calibration"),
        Row("WaferLLM Qwen2-72B, WSE-2", 840, _tok_s("qwen2-72b@wse2"), "tok/s", 0.20,
            "WaferLLM (arXiv 2502.04563): Qwen2-72B decode 840 tokens/s per request, 16-bit",
            "prediction", "16-bit, one request, no speculation; per-layer latency scaled from the 8B calibration"),
        # -- predicted, not fitted: GPUs
        Row("FasterTransformer 13B, 1 A100", 22.0, _ms("gpt-13b@a100x1", context=2048), "ms/token", 0.10,
            "FasterTransformer GPT benchmark: 13B, batch 1, 22.0 ms per token on one A100", "prediction",
            "16-bit, batch 1, HBM efficiency 0.75 (published range)"),
        Row("FasterTransformer 13B, 2 A100 (TP2)", 13.5, _ms("gpt-13b@a100x2", context=2048), "ms/token", 0.10,
            "FasterTransformer GPT benchmark: 13B, batch 1, 13.5 ms per token on two A100 (tensor parallel)", "prediction",
            "16-bit, batch 1, tensor parallel 2, HBM efficiency 0.75"),
        Row("TTFT Llama 3.1 70B, 32K prompt, GH200 NVL32", 472, _ttft_ms("llama-3.1-70b@gh200x32", 32768), "ms", 0.25,
            nvl32.format(m="70B", p=32768, t="472 ms"), "prediction", ttft_assume),
        Row("TTFT Llama 3.1 405B, 32K prompt, GH200 NVL32", 1600, _ttft_ms("llama-3.1-405b@gh200x32", 32768), "ms", 0.25,
            nvl32.format(m="405B", p=32768, t="about 1.6 s"), "prediction", ttft_assume),
        # -- placements
        Row("70B at 16-bit: CS-3 wafers", 4, place(load_model("llama-3.1-70b"), cs3).n_units, "wafers", None,
            "Cerebras, Aug 2024: Llama 3.1 70B served on 4 CS-3 systems", "placement", "16-bit, 8192-token KV"),
        Row("405B at 16-bit: CS-3 wafers >=", 19, place(load_model("llama-3.1-405b"), cs3).n_units, "wafers", None,
            "811 GB of 16-bit weights over 44 GB per wafer: at least 19 wafers", "placement", "16-bit, 8192-token KV"),
        Row("DeepSeek-V3 671B at 16-bit: CS-3 wafers >=", 31, place(load_model("deepseek-v3"), cs3).n_units, "wafers", None,
            "1,342 GB of 16-bit weights over 44 GB per wafer: at least 31 wafers (the model keeps 10% of SRAM free, "
            "so it needs more; layers split across wafers, 58 with whole layers)", "placement", "16-bit, 8192-token KV"),
        # -- context: not checked
        Row("TTFT Llama 3.1 405B, 122,880-token prompt, GH200 NVL32", 7500, _ttft_ms("llama-3.1-405b@gh200x32", 122880), "ms",
            None, nvl32.format(m="405B", p=122880, t="7.5 s") + "; past the 2-32k prompts of a voice turn, where the "
            "attention's quadratic FLOPs (counted at the GEMMs' efficiency) dominate", "context", ttft_assume),
        Row("Llama 3.1 70B, 8 x H200, no speculation", 180, _tok_s("llama-3.1-70b@h200x8"), "tok/s", None,
            "published 8 x H200 serving of 70B at batch 1 without speculative decoding (~180 tokens/s)", "context",
            "16-bit here; the run's precision is not known"),
        Row("NVIDIA Llama 3.1 70B with Medusa, 8 x H200", 268, speculative(Deployment.parse("llama-3.1-70b@h200x8"), "eagle"),
            "tok/s", None, "NVIDIA Technical Blog, Low Latency Inference Chapter 1 (Sep 2024): 268 tokens/s/user with Medusa "
            "on HGX H200; Medusa's acceptance is not published there", "context",
            "16-bit; modelled with an EAGLE-style head at the default acceptance (tau 2.88 at k = 7)"),
        Row("Cerebras Llama 3.1 70B (with speculation), CS-3", 2148, speculative(Deployment.parse("llama-3.1-70b@wse3"), "eagle"),
            "tok/s", None, "Cerebras blog 'How is Cerebras so fast' (Oct 2024): Llama 3.1 70B at 2,148 tokens/s with "
            "speculative decoding; its draft and acceptance are not published", "context",
            "16-bit; an EAGLE-style head at the default acceptance (tau 2.88 at k = 7)"),
        Row("Cerebras Llama 3.1 405B (with speculation)", 969, speculative(Deployment.parse("llama-3.1-405b@wse3"), "llama-3.1-8b"),
            "tok/s", None, "Cerebras, Nov 2024: 405B at 969 tokens/s with speculative decoding; its draft and acceptance "
            "are not published", "context", "16-bit; an 8B draft model on its own wafer at the draft-model default (tau 3.15 at k = 8)"),
    ]
    std, wafer = seeds_rates()
    rows += [
        Row("seeds: frontier model, standard GPU serving", 53, std, "tok/s", None,
            "seeds' claim; modelled as frontier-moe at 8-bit on 8 x H200, batch 64 per step", "context", "8-bit, batch 64"),
        Row("seeds: frontier model, wafer pipeline", 750, wafer, "tok/s", None,
            "seeds' claim; modelled as frontier-moe at 8-bit on CS-3 wafers, 8B draft k=4 acceptance 0.7", "context",
            "8-bit, one sequence, 8B draft k=4 acceptance 0.7 (assumed)"),
        Row("seeds: wafer vs standard ratio", 750 / 53, wafer / std, "x", None,
            "the seeds' 14x; the model's ratio comes from the serving batch and the expert union on GPUs "
            "versus one sequence per step and per-layer latency on wafers", "context", "as the two rows above"),
    ]
    rows = [r if r.system else replace(r, system=_system(r.name)) for r in rows]
    return sorted(rows, key=lambda r: KINDS.index(r.kind))


def _system(name: str) -> str:
    return "wafer" if any(w in name for w in ("CS-3", "WSE", "wafer", "Cerebras")) else "gpu"
