"""The simulator's models of issue 30 against hand-computed cases: attention kinds and the KV
cache, native precisions, experts per batch, split placement, prefill, speculative decoding,
serving many callers and the plan's search (against brute force)."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from wafer.deploy import Deployment
from wafer.placement import place
from wafer.serving import Replica, Workload, brute_force, plan_one, poisson_quantile, smallest
from wafer.specs import load_hardware, load_model
from wafer.speculation import Acceptance, accept_for, acceptance, eagle_head, speculate
from wafer.timing import GPUCost, WaferCost, expected_tokens, speculative_tok_s
from wafer.validate import table

ROOT = Path(__file__).resolve().parents[2]
NEW = ("llama-4-maverick", "gpt-oss-120b", "qwen3-235b-a22b", "deepseek-v3", "llama-3.3-70b", "qwen3-32b")


# ------------------------------------------------------------------ attention kinds, bytes

def test_gqa_sliding_window_kv_by_hand():
    m = load_model("gpt-oss-120b")
    per = 2 * 8 * 64 * 2  # K and V, 8 KV heads of 64, 2 bytes
    assert m.kv_bytes_per_token() == per
    assert [m.is_windowed(i) for i in range(4)] == [True, False, True, False]  # sliding, full, ...
    assert m.kv_bytes_per_sequence(1000) == 18 * 1000 * per + 18 * 128 * per
    assert m.kv_bytes_per_sequence(100) == 36 * 100 * per  # inside the window every layer keeps all


def test_mla_latent_cache_and_projections_by_hand():
    m = load_model("deepseek-v3")
    assert m.is_mla and m.kv_elems == 512 + 64 and m.kv_bytes_per_token() == 576 * 2
    d, h = 7168, 128
    attn = d * 1536 + 1536 + 1536 * h * (128 + 64) + d * (512 + 64) + 512 + 512 * h * (128 + 128) + h * 128 * d
    assert m.layer_parts(0)[0] == attn + 2 * d + 3 * d * 18432  # a dense layer: attention, two norms, its MLP
    assert abs(attn - 187.1e6) < 0.1e6
    # the first 3 layers dense, the rest 256 routed + 1 shared expert of 3 x 7168 x 2048
    assert not m.is_moe_layer(2) and m.is_moe_layer(3)
    expert = 3 * d * 2048
    assert m.layer_params(3) == attn + 2 * d + (256 + 1) * expert + d * 256
    assert m.layer_active_params(3) == attn + 2 * d + (8 + 1) * expert + d * 256
    assert m.layer_params(0) == attn + 2 * d + 3 * d * 18432


def test_interleaved_moe_layers_maverick():
    m = load_model("llama-4-maverick")
    assert [m.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert sum(m.is_moe_layer(i) for i in range(48)) == 24
    d = 5120
    attn = d * (2 * 40 * 128 + 2 * 8 * 128)
    assert m.layer_params(0) == attn + 2 * d + 3 * d * 16384
    assert m.layer_params(1) == attn + 2 * d + (128 + 1) * 3 * d * 8192 + d * 128
    assert [m.is_windowed(i) for i in range(4)] == [True, True, True, False]  # chunked, chunked, chunked, global


def test_native_precision_bytes_by_hand():
    m = load_model("gpt-oss-120b")
    nat = m.native
    assert (nat.expert, nat.linear, nat.embed) == (4.25 / 8, 2.0, 2.0)
    fixed, each, n = m.layer_parts(0)
    assert m.layer_bytes(0, nat) == fixed * 2 + n * each * 4.25 / 8
    assert m.layer_active_bytes(0, nat) == fixed * 2 + 4 * each * 4.25 / 8
    assert m.weight_bytes(nat) == pytest.approx(65.2e9, rel=0.01)  # the published 60.8 GiB checkpoint
    assert m.weight_bytes(2.0) == pytest.approx(m.total_params * 2, rel=1e-9)
    assert Deployment.parse("gpt-oss-120b@h100x1:native").bytes_per_param == nat


def test_experts_touched_by_a_batch():
    m = load_model("gpt-oss-120b")
    assert m.experts_touched(1) == 4
    assert m.experts_touched(2) == pytest.approx(128 * (1 - (124 / 128) ** 2))
    assert m.experts_touched(10_000) == pytest.approx(128)
    fixed, each, _ = m.layer_parts(5)
    assert m.layer_batch_bytes(5, 2, 2.0) == pytest.approx((fixed + m.experts_touched(2) * each) * 2)
    dense = load_model("llama-3.1-70b")
    assert dense.layer_batch_bytes(3, 64, 2.0) == dense.layer_bytes(3, 2.0)


def test_attention_flops_by_hand():
    m = load_model("llama-3.1-8b")
    w = 32 * 128
    assert m.layer_attention_flops(0, 4, 0) == 2 * (w + w) * (1 + 2 + 3 + 4)
    assert m.layer_attention_flops(0, 2, 10) == 2 * 2 * w * (11 + 12)
    g = load_model("gpt-oss-120b")
    w = 64 * 64
    assert g.layer_attention_flops(0, 3, 200) == 2 * 2 * w * 3 * 128  # a windowed layer sees 128 keys
    assert g.prefill_flops(5) == sum(g.layer_prefill_flops(i, 5) for i in range(36)) + 2 * g.head_params * 5


# ------------------------------------------------------------------ every new entry loads and places

@pytest.mark.parametrize("name", NEW)
def test_new_models_place_on_cs3_at_native_precision(name):
    m = load_model(name)
    assert m.native is not None and m.source and m.sources
    cs3 = load_hardware("wse3")
    p = place(m, cs3, bytes_per_param=m.native)
    assert p.n_units >= max(1, math.ceil(m.weight_bytes(m.native) / cs3.usable_bytes))
    assert p.stages[0].first == 0 and p.stages[-1].stop == m.n_layers
    for a, b in zip(p.stages, p.stages[1:]):
        assert a.stop == b.first and b.n_layers > 0  # the ranges a unit starts never overlap
        assert (a.last_share < 1) == (b.carry_share > 0) and a.last_share + b.carry_share == pytest.approx(1.0)
    assert all(s.bytes <= p.capacity * (1 + 1e-9) for s in p.stages)
    kv = sum(m.layer_kv_bytes(i, 8192) for i in range(m.n_layers))
    assert sum(s.bytes for s in p.stages) == pytest.approx(m.weight_bytes(m.native) + kv, rel=1e-9)


def test_a_deepseek_layer_no_longer_takes_a_wafer_of_its_own():
    m, cs3 = load_model("deepseek-v3"), load_hardware("wse3")
    whole = place(m, cs3, split=False)
    split = place(m, cs3)
    assert whole.n_units >= 55  # one 23 GB layer per 40 GB wafer
    need = (m.weight_bytes(2.0) + m.kv_bytes_per_sequence(8192)) / cs3.usable_bytes
    assert split.n_units <= math.ceil(need) + 1 and split.split_layers > 20
    raw = place(m, cs3.with_overrides({"usable_fraction": 1.0}))
    assert raw.n_units <= 32  # ~31 on the whole 44 GB
    cost = WaferCost(split)  # a split layer costs the next unit one more layer latency, no extra hop
    bw = cs3["memory_bw"]
    hand = sum((s.n_layers + (s.carry_share > 0) + s.has_head) * (cost.tau + s.weight_bytes / bw) for s in split.stages)
    assert cost.token_time() == pytest.approx(hand + (split.n_units - 1) * cost.hop_time())
    assert cost.token_time() > WaferCost(split, cost.cal).tau * (m.n_layers + 1 + split.split_layers)


def test_calibration_counts_a_split_layers_second_share():
    """A calibration placement whose layers split still reproduces the published rate exactly."""
    from dataclasses import replace

    from wafer.timing import calibrate

    hw = load_hardware("wse3")
    m = load_model(hw.calibration.model)
    whole = m.weight_bytes(2.0) + m.kv_bytes_per_sequence(1)
    tight = replace(hw.with_overrides({"memory_bytes": whole * 0.335, "usable_fraction": 1.0}),
                    calibration=replace(hw.calibration, units=3))
    p = place(m, tight, 3, context=1, bytes_per_param=2.0)
    assert p.n_units == 3 and p.split_layers > 0
    assert 1 / WaferCost(p, calibrate(tight)).token_time() == pytest.approx(hw.calibration.tok_s, rel=1e-9)


def test_whole_layers_stay_whole_where_they_fit():
    p = place(load_model("llama-3.1-70b"), load_hardware("wse3"))
    assert p.n_units == 4 and p.split_layers == 0
    assert place(load_model("smollm2-135m"), load_hardware("wse3"), 2, bytes_per_param=None).split_layers == 0


# ------------------------------------------------------------------ prefill

def test_gpu_prefill_is_flops_at_the_stated_efficiency():
    d = Deployment.parse("llama-3.1-70b@gh200x32", context=32769)
    p, c = d.build()
    hw = d.hardware
    m = d.model
    expect = m.prefill_flops(32767) / (32 * hw["flops_16bit"] * hw["prefill_mfu"]) + c.token_time()
    assert c.ttft(32768) == pytest.approx(expect)
    # 2 x 70.5B (layers and head) x 32767 for the weights, 2 x (8192 + 8192) x 32767 x 32768 / 2 per layer for attention
    hand = 2 * m.active_params * 32767 + 80 * 2 * 16384 * 32767 * 32768 / 2
    assert m.prefill_flops(32767) == pytest.approx(hand, rel=1e-3)


def test_wafer_prefill_fills_the_pipeline_with_chunks():
    d = Deployment.parse("llama-3.1-70b@wse3x4")
    _, c = d.build()
    assert c.prefill_time(1) == pytest.approx(c.token_time())  # a one-token prompt is a decode pass
    assert c.prefill_time(32) == pytest.approx(c.pass_time(32))  # one chunk crosses the pipeline once
    long = c.prefill_time(8192)
    serial = 8192 * 2 * d.model.active_params / (d.hardware["flops_16bit"] * d.hardware["prefill_mfu"])
    assert serial / 4 < long < serial  # the four wafers work on different chunks at once


# ------------------------------------------------------------------ speculative decoding

def test_expected_tokens_and_acceptance_by_hand():
    assert expected_tokens(3, 0.5) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(4, 0.0) == 1 and expected_tokens(4, 1.0) == 5
    a = accept_for(7, 4.81)
    assert expected_tokens(7, a) == pytest.approx(4.81, abs=1e-9)
    with pytest.raises(ValueError):
        accept_for(3, 5.0)  # more than k + 1 tokens per cycle
    pair = acceptance("eagle", "llama-3.3-70b")
    assert (pair.k, pair.tau) == (7, 4.81) and "nebius" in pair.source
    assert acceptance("eagle", "qwen3-32b").target == "*"  # the method's cited default
    assert Acceptance("draft", "*", 8, 3.15, "x").tokens(8) == pytest.approx(3.15)


class _Fixed:
    def __init__(self, tok, per_extra=0.0):
        self.tok, self.per_extra = tok, per_extra

    def token_time(self):
        return self.tok

    def pass_time(self, tokens=1):
        return self.tok + (tokens - 1) * self.per_extra


def test_speculative_rate_by_hand():
    target, draft = _Fixed(0.010, 0.0005), _Fixed(0.001)
    # k = 4, a = 0.5: 1.9375 tokens per cycle of 4 x 1 ms drafting + a 5-token check (10 + 2 ms)
    assert speculative_tok_s(target, draft, 4, 0.5) == pytest.approx(1.9375 / (0.004 + 0.012))


def test_speculation_on_the_same_hardware():
    d = Deployment.parse("llama-3.3-70b@wse3")
    s = speculate(d, "eagle")
    _, target = d.build()
    assert s.verify_s == pytest.approx(target.pass_time(8)) and s.k == 7
    assert s.tok_s == pytest.approx(s.tokens_per_cycle / (7 * s.draft_s + s.verify_s))
    assert s.draft_s < target.token_time() / 10  # one layer and the head
    draft = speculate(d, "draft", "llama-3.1-8b")
    assert draft.draft_s == pytest.approx(Deployment.parse("llama-3.1-8b@wse3").build()[1].token_time())
    head = eagle_head(load_model("deepseek-v3"))
    assert head.n_layers == 1 and head.d_model == 7168 and head.vocab == 129280


def test_gpu_verification_reads_the_experts_of_every_checked_token():
    d = Deployment.parse("gpt-oss-120b@h200x1:native")
    _, c = d.build()
    m, hw, nat = d.model, d.hardware, d.model.native
    bw = hw["memory_bw"] * hw["hbm_efficiency"]
    kv = m.layer_kv_bytes(1, c.context_used)
    flops = m.layer_prefill_flops(1, 8, c.context_used) / (hw["flops_16bit"] * hw["prefill_mfu"])
    assert c.layer_time(1, 8) == pytest.approx(max((m.layer_batch_bytes(1, 8, nat) + kv) / bw, flops))
    assert c.layer_time(1, 8) > 3 * c.layer_time(1, 1)  # 8 tokens touch ~28 of 128 experts, one token 4


def test_the_draft_runs_at_the_targets_serving_batch():
    d = Deployment.parse("llama-3.1-70b@h200x8,batch=16")
    s = speculate(d, "eagle")
    head = Deployment(eagle_head(d.model), d.hardware, 8, 2.0, d.context, batch=16).build()[1]
    alone = Deployment(eagle_head(d.model), d.hardware, 8, 2.0, d.context).build()[1]
    assert s.draft_s == pytest.approx(head.token_time()) and s.draft_s > alone.token_time()
    draft = speculate(d, "draft", "llama-3.1-8b")
    assert draft.draft_s == pytest.approx(Deployment.parse("llama-3.1-8b@h200,batch=16").build()[1].token_time())


def test_a_draft_model_beside_a_model_file():
    """The model file's own sizes are the target's; a catalogued draft is timed at 16-bit."""
    d = Deployment.default()
    assert d.bytes_per_param is None
    s = speculate(d, "draft", "llama-3.1-8b")
    assert s.draft_s == pytest.approx(Deployment.parse("llama-3.1-8b@wse3").build()[1].token_time())


# ------------------------------------------------------------------ serving and the plan

def test_poisson_quantile_by_hand():
    assert poisson_quantile(0) == 0
    assert poisson_quantile(1.0) == 3  # P(X <= 2) = 0.920, P(X <= 3) = 0.981
    assert poisson_quantile(10.0) == 15  # P(X <= 14) = 0.917, P(X <= 15) = 0.951


def test_gpu_batch_step_reads_weights_once_and_every_kv():
    m, hw = load_model("llama-3.1-8b"), load_hardware("h100")
    r = Replica(m, hw, 1, 2.0, Workload(context_tokens=2048))
    step, _ = r.step(16)
    c = GPUCost(r.placement, 1, 16, context_used=2048)
    bw = hw["memory_bw"] * hw["hbm_efficiency"]
    mem = sum(m.layer_bytes(i, 2.0) + 16 * m.layer_kv_bytes(i, 2048) for i in range(32)) / bw + m.head_bytes(2.0) / bw
    assert step == pytest.approx(c.token_time()) and step == pytest.approx(mem, rel=0.02)


def test_wafer_pipeline_holds_one_micro_batch_per_stage():
    m, hw = load_model("llama-3.1-70b"), load_hardware("wse3")
    r = Replica(m, hw, 4, 2.0, Workload())
    one, _ = r.step(1)
    four, _ = r.step(4)
    eight, _ = r.step(8)
    assert four == pytest.approx(one, rel=0.05)  # four sequences fill four stages
    assert eight > four  # two per micro-batch: each stage computes two tokens per pass


def test_plan_search_matches_brute_force_on_monotone_fits():
    rng = random.Random(7)
    for _ in range(200):
        cands = sorted(rng.sample(range(1, 20), rng.randint(1, 6)))
        cap = {u: rng.randint(0, 3) * u // 2 + rng.randint(0, 4) for u in cands}  # callers one replica of u holds
        callers = rng.randint(1, 30)

        def fits(u, n, cap=cap):
            return n <= cap[u]

        assert smallest(cands, callers, fits) == brute_force(cands, callers, fits), (cands, cap, callers)


@pytest.mark.parametrize("hw,model,budget,period,context", (("h100", "llama-3.1-70b", 440, 2, 8192),
                                                            ("h200", "qwen3-32b", 420, 1, 16384),
                                                            ("wse3", "llama-3.1-70b", 420, 1, 4096)))
def test_plan_search_matches_brute_force_on_the_model(hw, model, budget, period, context):
    from wafer.deploy import TurnFigures

    work = Workload(turn_period_s=period, answer_tokens=100, context_tokens=context, figures=TurnFigures(budget_ms=budget))
    replicas = set()
    for callers in (1, 5, 40, 120):
        a = plan_one(load_model(model), load_hardware(hw), callers, work)
        b = plan_one(load_model(model), load_hardware(hw), callers, work, search=brute_force)
        assert (a is None) == (b is None)
        if a:
            assert (a.units, a.replicas) == (b.units, b.replicas), (callers, a, b)
            assert a.load.fits and a.load.voice_to_voice_s * 1e3 <= budget
            replicas.add(a.replicas)
    if hw != "wse3":
        assert max(replicas) > 1  # the search had more than one replica to find


def test_plan_for_a_hundred_callers():
    work = Workload()
    for name in ("wse3", "h100", "h200", "b200"):
        p = plan_one(load_model("llama-3.1-70b"), load_hardware(name), 100, work)
        assert p is not None and p.load.fits and p.cost_per_hour > 0
        assert p.load.voice_to_voice_s * 1e3 <= 500
        hw = load_hardware(name)
        assert p.cost_per_hour == pytest.approx(p.units * hw["price_per_hour"])
    cheap = plan_one(load_model("llama-3.1-70b"), load_hardware("h100").with_overrides({"price_per_hour": 1.0}), 100, work)
    assert cheap.cost_per_hour == cheap.units


# ------------------------------------------------------------------ the validation table's kinds

def test_validation_kinds_and_predictions_per_system():
    rows = table()
    assert {r.kind for r in rows} == {"calibration", "prediction", "placement", "context"}
    for system in ("wafer", "gpu"):
        preds = [r for r in rows if r.kind == "prediction" and r.system == system]
        assert len(preds) >= 2 and all(r.ok for r in preds), system
        assert all(r.assumptions for r in preds)
    assert sum(1 for r in rows if r.kind == "prediction" and r.name.startswith("TTFT")) >= 2
    for r in rows:
        if r.kind == "context":
            assert r.ok is None and r.status == "n/a" and r.to_dict()["ok"] is None


def _sim(*args):
    return subprocess.run([sys.executable, "-m", "server.cli", "sim", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.engines  # the CLI in a subprocess
def test_cli_plan_and_list():
    out = _sim("--plan", "--model", "llama-3.1-70b", "--callers", "100", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert {p["kind"] for p in d["plans"]} == {"wafer", "gpu"} and all(p["units"] and p["cost_per_hour"] for p in d["plans"])
    human = _sim("--plan", "--callers", "20", "--hardware", "wse3,h200", "--set", "price_per_hour=2")
    assert human.returncode == 0 and "wse3" in human.stdout and "h200" in human.stdout
    listed = _sim("--model", "gpt-oss-120b", "--list", "--json")
    assert listed.returncode == 0, listed.stderr
    info = json.loads(listed.stdout)
    native = [p for p in info["placements"] if p["precision"].startswith("MXFP4")][0]
    assert native["units"] >= 1 and info["attention"].startswith("grouped-query")
    help_text = _sim("--help").stdout
    for opt in ("--plan", "--callers", "--budget-ms", "native", "eagle"):
        assert opt in help_text
