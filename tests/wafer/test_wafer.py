"""The simulated wafer pipeline: catalogue, placement, timing model, event clock, the pipelined
executor on the real model, validation against published numbers, and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from kinds import ENGINES, kind

from wafer.clock import EventQueue, Kind
from wafer.deploy import Deployment, TurnFigures, project_turn
from wafer.pipeline import WaferPipeline, decode_rate, simulate
from wafer.placement import PlacementError, place
from wafer.specs import CatalogueError, Param, hardware_from_dict, hardware_names, load_hardware, load_model, model_names
from wafer.timing import WaferCost, calibrate, cost_model
from wafer.validate import table

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ catalogue

def test_every_catalogued_number_has_a_source():
    for name in hardware_names():
        if name == "local-cpu":
            continue
        hw = load_hardware(name)
        assert hw.params, name
        for key, p in hw.params.items():
            assert isinstance(p, Param) and p.source.strip(), f"{name}.{key} has no source"
            assert p.value >= 0
        if hw.kind == "wafer":
            assert hw.calibration.source and hw.calibration.tok_s > 0


def test_model_shapes_match_their_published_sizes():
    for name in model_names():
        m = load_model(name)
        assert abs(m.total_params / m.params_published - 1) < 0.02, (name, m.total_params)
        if m.active_params_published:  # some publishers count the embedding lookup as active, some do not
            active = m.active_params + (m.embed_params if m.active_counts_embedding else 0)
            assert abs(active / m.active_params_published - 1) < 0.03, (name, active)
        if m.checkpoint_bytes_published:  # the native format's bytes against the published checkpoint
            assert abs(m.weight_bytes(m.native) / m.checkpoint_bytes_published - 1) < 0.03, (name, m.weight_bytes(m.native))


def test_smollm2_shape_is_read_from_its_gguf():
    from decode.model import Model

    m = load_model("smollm2-135m")
    real = Model()
    assert (m.n_layers, m.d_model, m.vocab) == (real.config.n_layers, real.config.d_model, real.config.vocab_size)
    assert m.weight_bytes(None) == pytest.approx(real.weights.nbytes, rel=1e-6)


def test_unknown_names_and_bad_entries_are_clear_errors():
    with pytest.raises(CatalogueError, match="known:.*llama-3.1-70b"):
        load_model("gpt-9")
    with pytest.raises(CatalogueError, match="known:.*wse3"):
        load_hardware("tpu")
    good = {"name": "x", "title": "X", "kind": "gpu", "params": {}}
    with pytest.raises(CatalogueError, match="lacks"):
        hardware_from_dict(good)
    with pytest.raises(CatalogueError, match="kind"):
        hardware_from_dict({**good, "kind": "abacus"})
    with pytest.raises(CatalogueError, match="no parameter 'bogus'"):
        load_hardware("wse3").with_overrides({"bogus": 1.0})
    assert load_hardware("cs3").name == "wse3"  # aliases


# ------------------------------------------------------------------ placement

def _contiguous(p):
    assert p.stages[0].first == 0 and p.stages[-1].stop == p.model.n_layers
    for a, b in zip(p.stages, p.stages[1:]):
        assert a.stop == b.first and a.n_layers > 0
    assert all(s.bytes <= p.capacity for s in p.stages)
    assert p.stages[0].has_embed and p.stages[-1].has_head


def test_published_placements():
    cs3 = load_hardware("wse3")
    p70 = place(load_model("llama-3.1-70b"), cs3)
    assert p70.n_units == 4
    _contiguous(p70)
    p405 = place(load_model("llama-3.1-405b"), cs3)
    assert p405.n_units >= 19
    _contiguous(p405)
    assert place(load_model("llama-3.1-8b"), cs3).n_units == 1


def test_placement_exact_fit_and_one_byte_short():
    m, hw = load_model("llama-3.1-8b"), load_hardware("wse3")
    whole = place(m, hw, 1, context=1024)
    need = whole.stages[0].bytes
    assert place(m, hw, 1, context=1024, capacity=need).n_units == 1  # exactly full
    with pytest.raises(PlacementError, match="needs at least 2"):
        place(m, hw, 1, context=1024, capacity=need - 1)
    assert place(m, hw, None, context=1024, capacity=need - 1).n_units == 2  # auto takes one more


def test_one_layer_too_big_is_named():
    m, hw = load_model("llama-3.1-405b"), load_hardware("wse3")
    layer = m.layer_bytes(0, 2.0)
    with pytest.raises(PlacementError, match=r"layer 0 .* needs"):
        place(m, hw, capacity=layer * 0.99, context=1)


def test_placement_rejects_impossible_counts():
    m, hw = load_model("llama-3.1-70b"), load_hardware("wse3")
    with pytest.raises(PlacementError, match="needs at least 4"):
        place(m, hw, 3)
    with pytest.raises(PlacementError, match="at least one layer"):
        place(m, hw, 81)
    p = place(m, hw, 8)
    assert p.n_units == 8 and max(s.n_layers for s in p.stages) == 10
    _contiguous(p)


# ------------------------------------------------------------------ timing model

def test_calibration_reproduces_its_point_and_predicts_the_rest():
    for name in ("wse3", "wse2"):
        hw = load_hardware(name)
        cal = hw.calibration
        p = place(load_model(cal.model), hw, cal.units, context=1, bytes_per_param=cal.bytes_per_param)
        assert 1 / WaferCost(p).token_time() == pytest.approx(cal.tok_s, rel=1e-9)
        assert calibrate(hw).tau_ref_s > 0


def test_validation_table_is_within_tolerance():
    rows = table()
    checked = [r for r in rows if r.tolerance is not None or r.kind == "placement"]
    assert len(checked) >= 8
    bad = [(r.name, r.predicted, r.published) for r in checked if not r.ok]
    assert not bad, bad
    # the seeds' ratio comes out of the model, within a third of the claim
    ratio = next(r for r in rows if r.name.startswith("seeds: wafer vs"))
    assert 0.66 < ratio.predicted / ratio.published < 1.5


def test_a_pipeline_adds_no_speed_to_one_sequence():
    m, hw = load_model("llama-3.1-8b"), load_hardware("wse3")
    one = cost_model(place(m, hw, 1, context=1024))
    four = cost_model(place(m, hw, 4, context=1024))
    assert four.token_time() >= one.token_time() * 0.97  # hops cost; less SRAM per wafer helps a little
    assert four.throughput(4).aggregate_tok_s > 3 * one.throughput(4).aggregate_tok_s


def test_throughput_rises_with_sequences_up_to_the_stage_count():
    for units in (1, 2, 4):
        cost = cost_model(place(load_model("llama-3.1-8b"), load_hardware("wse3"), units, context=1024))
        n = cost.placement.n_units
        analytic = [cost.throughput(m).aggregate_tok_s for m in range(1, 2 * n + 2)]
        simulated = [decode_rate(simulate(cost, m, 20), 20)[1] for m in range(1, 2 * n + 2)]
        for rates in (analytic, simulated):
            for m in range(1, n):
                assert rates[m] > rates[m - 1] * 1.2, (n, m, rates)  # a new sequence fills an idle stage
        # beyond the stage count only the hops' share of a token's trip is left to fill
        t = cost.token_time()
        hops = (n - 1) * cost.hop_time()
        bound = analytic[n - 1] * t / (t - hops) * 1.0001
        assert max(analytic[n:]) <= bound, (n, analytic)
        for a, s in zip(analytic, simulated):
            assert s <= a * 1.0001  # a run has a fill and a drain; the steady state bounds it
        assert max(simulated) <= bound
        assert simulated[n - 1] > 0.85 * analytic[n - 1]


def test_a_prompt_chunk_costs_more_than_a_decode_step():
    for spec in ("llama-3.1-70b@cs3x4", "llama-3.1-70b@h200x8", "smollm2-135m@local-cpu"):
        cost = Deployment.parse(spec).build()[1]
        assert cost.stage_time(0, 256) > 1.2 * cost.stage_time(0, 1), spec
        assert cost.ttft(512) > cost.ttft(32) > cost.token_time()


def test_gpu_model_scales_with_tensor_parallel_and_batch():
    one = Deployment.parse("gpt-13b@a100x1", context=2048).build()[1]
    two = Deployment.parse("gpt-13b@a100x2", context=2048).build()[1]
    assert 0.5 < two.token_time() / one.token_time() < 0.7  # the collectives keep it above half
    b1 = Deployment.parse("frontier-moe@h200x8:8bit", batch=1).build()[1]
    b64 = Deployment.parse("frontier-moe@h200x8:8bit", batch=64).build()[1]
    assert b64.token_time() > 5 * b1.token_time()  # the batch touches most experts
    assert b64.throughput(64).aggregate_tok_s > 5 * b1.throughput(1).aggregate_tok_s


def test_turn_projection_follows_the_speculative_policy():
    fast = Deployment.parse("llama-3.1-8b@wse3x1").build()[1]
    proj = project_turn(fast, "x")
    fig = TurnFigures()
    # the whole chain (ASR, LLM, TTS) runs from the pause and is ready before the endpoint: hidden behind it
    assert proj.voice_to_voice_ms == pytest.approx(fig.endpoint_ms)
    assert proj.ready_ms == pytest.approx(fig.pause_ms + fig.asr_ms + proj.first_phrase_ms + fig.tts_first_audio_ms)
    assert proj.within_budget
    slow = project_turn(fast, "x", tok_s=10.0)  # 10 tok/s: the first phrase alone takes 700 ms
    assert slow.voice_to_voice_ms > 900 and not slow.within_budget
    assert slow.sequential_ms > slow.voice_to_voice_ms


def test_deployment_specs():
    d = Deployment.parse("llama-3.1-70b@cs3x4")
    assert d.name == "llama-3.1-70b@wse3x4" and d.bytes_per_param == 2.0
    assert Deployment.parse("frontier-moe@h200x16:8bit").bytes_per_param == 1.0
    assert Deployment.parse("smollm2-135m@local-cpu").bytes_per_param is None  # the file's own sizes
    for bad in ("llama", "llama-3.1-70b@", "llama-3.1-70b@cs3x0", "x@wse3"):
        with pytest.raises(CatalogueError):
            Deployment.parse(bad)


# ------------------------------------------------------------------ the event clock

def test_event_queue_tie_break():
    q = EventQueue()
    q.push(1.0, Kind.ARRIVE, 0, "a1")
    q.push(1.0, Kind.DONE, 0, "d1")
    q.push(0.5, Kind.ARRIVE, 1, "a0")
    q.push(1.0, Kind.DONE, 1, "d2")
    assert [q.pop().item for _ in range(4)] == ["a0", "d1", "d2", "a1"]
    with pytest.raises(ValueError, match="past"):
        q.push(0.9, Kind.ARRIVE, 0, "late")


def _check_timeline(tl, hop_s):
    for k in range(tl.n_stages):  # no stage runs two items at once
        spans = tl.stage_spans(k)
        for a, b in zip(spans, spans[1:]):
            assert b.start >= a.end - 1e-15
    stage = {(s.stage, s.sequence, s.token): s for s in tl.spans if s.what == "stage"}
    hops = [s for s in tl.spans if s.what == "hop"]
    for h in hops:  # a hop leaves when its stage ends and arrives before the next stage starts
        src = stage[(h.stage, h.sequence, h.token)]
        dst = stage[(h.stage + 1, h.sequence, h.token)]
        assert h.start == src.end and dst.start >= h.end - 1e-15
        assert h.end - h.start >= hop_s * (1 - 1e-9)  # a prefill chunk's hop carries more bytes
    for k in range(tl.n_stages - 1):  # hops on one link stay in order
        link = sorted((h for h in hops if h.stage == k), key=lambda h: h.start)
        arrivals = [stage[(k + 1, h.sequence, h.token)].start for h in link]
        assert arrivals == sorted(arrivals)


def test_simulated_timeline_invariants():
    cost = cost_model(place(load_model("llama-3.1-70b"), load_hardware("wse3"), 4))
    tl = simulate(cost, 6, 5)
    _check_timeline(tl, cost.hop_time())
    util = tl.utilisation()
    assert all(0.5 < u <= 1.0 for u in util)
    one = simulate(cost, 1, 5)
    assert all(u < 0.3 for u in one.utilisation())  # one sequence leaves each wafer idle 3/4 of the time
    assert all(b > 0 for b in one.bubbles())


# ------------------------------------------------------------------ the pipeline on the real model

@pytest.fixture(scope="module")
@kind(ENGINES)
def generator():
    from decode.generate import Generator

    return Generator()


def _prompts(g):
    qs = ["When do you open on Sunday?", "How much is a croissant?", "Tell me about your bread."]
    return [g.encode_chat([{"role": "user", "content": q}]) for q in qs]


def test_pipeline_tokens_match_the_decode_core(generator):
    from decode.generate import Generator

    prompts = _prompts(generator)
    ref = [list(Generator(generator.model).generate(p, max_tokens=16).token_ids) for p in prompts]
    shape = load_model("smollm2-135m")
    for hw in ("wse3", "local-cpu"):
        for n in (1, 2, 4):
            pl = place(shape, load_hardware(hw), n, bytes_per_param=None, context=256)
            with WaferPipeline(generator.model, pl, stop_ids=generator.tokenizer.stop_ids) as wp:
                run = wp.run(prompts, max_tokens=16)  # three sequences in flight at once
                assert run.tokens == ref, (hw, n)
                assert run.wall_s > 0 and run.sim_s > 0 and len(run.stage_busy_s) == n
                _check_timeline(run.timeline, wp.cost.hop_time())
                if n == 1:
                    assert wp.run(prompts[:1], max_tokens=16).tokens == ref[:1]


def test_pipeline_overlaps_sequences_on_the_simulated_clock(generator):
    shape = load_model("smollm2-135m")
    pl = place(shape, load_hardware("wse3"), 4, bytes_per_param=None, context=256)
    prompts = _prompts(generator)
    with WaferPipeline(generator.model, pl, stop_ids=()) as wp:
        one = wp.run(prompts[:1], max_tokens=12)
        three = wp.run(prompts, max_tokens=12)
    assert three.sim_tok_s > 2.2 * one.sim_tok_s
    assert max(three.timeline.utilisation()) > 2 * max(one.timeline.utilisation())


def test_pipeline_rejects_a_placement_for_another_model(generator):
    pl = place(load_model("llama-3.1-8b"), load_hardware("wse3"), 2)
    with pytest.raises(ValueError, match="layers"):
        WaferPipeline(generator.model, pl)


# ------------------------------------------------------------------ local-cpu and the CLI

@pytest.mark.engines  # measures this CPU with the decode kernels: not a unit test
def test_local_cpu_is_measured_and_cached(tmp_path):
    from wafer.localcpu import local_cpu

    cache = tmp_path / "cpu.json"
    hw = local_cpu(cache=cache)
    assert cache.exists()
    for k in ("gemv_bw", "head_bw", "call_overhead_s", "flops_16bit"):
        assert hw[k] > 0 and "measured" in hw.params[k].source
    again = local_cpu(cache=cache)
    assert again["gemv_bw"] == hw["gemv_bw"]  # from the cache
    cache.write_text("{not json")
    assert local_cpu(cache=cache)["gemv_bw"] > 0  # a damaged cache is measured again


def wafervox(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "server.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.engines  # the CLI in a subprocess
def test_cli_sim_json_and_plot(tmp_path):
    out = wafervox("sim", "--model", "llama-3.1-70b", "--hardware", "cs3", "--sequences", "4", "--json",
                   "--plot", str(tmp_path / "sim.png"))
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["units"] == 4 and len(d["placement"]) == 4
    assert d["aggregate_tok_s"] > 3 * d["per_user_tok_s"] * 0.9
    turn = d["voice_turn"]  # 70B on 4 CS-3: the first phrase is ready well before the endpoint
    assert turn["within_budget"] and turn["first_phrase_ms"] < 100 and d["ttft_ms"] > 0
    assert turn["voice_to_voice_without_speculation_ms"] > turn["voice_to_voice_ms"]
    assert (tmp_path / "sim.png").stat().st_size > 10_000
    out = wafervox("sim", "--validate", "--json")
    assert out.returncode == 0, out.stdout
    rows = json.loads(out.stdout)["validation"]
    assert all(r["kind"] in ("calibration", "prediction", "placement", "context") for r in rows)
    assert all(r["ok"] for r in rows if r["kind"] != "context")
    assert all(r["ok"] is None and not r["checked"] for r in rows if r["kind"] == "context")  # never a pass
    out = wafervox("sim", "--compare", "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["wafer_vs_standard"] > 5
    human = wafervox("sim", "--hardware", "h200", "--gpus", "8")
    assert human.returncode == 0 and "tok/s per user" in human.stdout and "voice-to-voice" in human.stdout


@pytest.mark.engines
def test_cli_sim_runs_the_real_model_on_a_placement():
    out = wafervox("sim", "--model", "smollm2-135m", "--hardware", "wse3", "--wafers", "2", "--sequences", "2",
                   "--run", "8", "--json")
    assert out.returncode == 0, out.stderr
    run = json.loads(out.stdout)["run"]
    assert run["identical"] and run["sequences"] == 2 and run["tokens"] == 8
    assert len(run["utilisation"]) == 2 and run["wall_s"] > run["sim_s"] > 0
    bad = wafervox("sim", "--model", "llama-3.1-8b", "--run", "4")
    assert bad.returncode == 2 and "shape only" in bad.stderr


@pytest.mark.engines  # the CLI in a subprocess
def test_cli_sim_bad_input_in_one_line():
    for args, needle in ((("--model", "gpt-9"), "unknown model"), (("--hardware", "h200", "--gpus", "8", "--model", "frontier-moe"),
                                                                    "does not fit"),
                         (("--wafers", "0"), "--wafers"), (("--wafers", "3"), "needs at least 4"),
                         (("--set", "bogus=1"), "bogus"), (("--set", "hop_latency_s"), "NAME=NUMBER"),
                         (("--speculative", "llama-3.1-8b:four"), "DRAFT[:K[:ACCEPT]]"),
                         (("--speculative", "eagle:4:1.5"), "ACCEPT in [0, 1)"),
                         (("--plan", "--callers", "0"), "--callers N with N >= 1"),
                         (("--plan", "--callers", "10", "--model", "gpt-9"), "unknown model"),
                         (("--plan", "--callers", "10", "--hardware", "tpu"), "unknown hardware"),
                         (("--plan", "--callers", "10", "--hardware", ","), "at least one system"),
                         (("--model", "gpt-oss-120b", "--bits", "native", "--hardware", "h100", "--gpus", "1",
                           "--set", "memory_bytes=1e9"), "does not fit"),
                         (("--model", "llama-3.1-8b", "--bits", "native"), "no native format")):
        out = wafervox("sim", *args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert out.stderr.startswith("wafervox: error: ") and needle in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.engines  # the CLI in a subprocess
def test_sim_set_overrides_an_assumption():
    base = json.loads(wafervox("sim", "--json").stdout)
    slow = json.loads(wafervox("sim", "--json", "--set", "hop_latency_s=1e-3").stdout)
    assert slow["token_ms"] == pytest.approx(base["token_ms"] + 3 * (1e-3 - 20e-6) * 1e3, rel=1e-6)


def test_simulated_turn_block_follows_the_loop_policy():
    """One formula: the answer's first audio is ready at transcript + the deployment's first phrase + TTS,
    and plays no earlier than the endpoint."""
    from wafer.deploy import simulated_turn

    stamps = {"last_voiced": 1.0, "endpoint": 1.4, "transcript": 1.25, "first_phrase": 1.45, "tts_first_audio": 1.5}
    fast = simulated_turn("x@wse3x1", 2e-4, stamps, {"first_token": 0.001, "first_phrase": 0.002}, 500)
    assert fast["voice_to_voice_ms"] == pytest.approx(400.0)  # endpoint-bound
    slow = simulated_turn("y@h100x16", 0.05, stamps, {"first_token": 0.05, "first_phrase": 0.3}, 500)
    assert slow["voice_to_voice_ms"] == pytest.approx((0.25 + 0.3 + 0.05) * 1000)
    assert slow["within_budget"] is False and slow["overrun_ms"] == pytest.approx(100.0)
    assert (slow["deployment"], slow["token_ms"], slow["first_phrase_ms"]) == ("y@h100x16", 50.0, 300.0)
    late = dict(stamps, transcript=1.6)  # no speculation: the transcript came after the endpoint
    assert simulated_turn("x", 2e-4, late, {"first_phrase": 0.002}, 500)["voice_to_voice_ms"] == pytest.approx(652.0)
    assert simulated_turn("x", 2e-4, {"last_voiced": 1.0}, {"first_phrase": 0.002}, 500) is None


#: a persona of a system prompt alone: the model says every word of the answer (a grounded persona's answer starts
#: with its fact's own words, or is a set decline, before the model runs: no LLM time on its first phrase)
PLAIN_PERSONA = {"system": "You are the assistant of Bright Bakery at 12 Harbor Street. Answer in one short sentence.",
                 "examples": [["Where are you?", "We are at 12 Harbor Street."]]}


def _run_json(*args):
    wav = str(ROOT / "samples" / "morning_02_located.wav")
    persona = Path(tempfile.mkdtemp()) / "plain.json"
    persona.write_text(json.dumps(PLAIN_PERSONA))
    out = wafervox("run", "--fast", "--json", "--persona", str(persona), *args, wav, timeout=600)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    return lines[:-1], lines[-1]["summary"]


@pytest.mark.engines
def test_every_turn_of_run_carries_the_simulated_block():
    """By default every turn's decode runs on this model on simulated CS-3 wafers; --deployment picks another."""
    turns, summary = _run_json()
    assert turns and all(t["simulated"]["deployment"] == "smollm2-135m@wse3x1" for t in turns)
    s = turns[0]["simulated"]
    assert 0 < s["llm_first_token_ms"] <= s["first_phrase_ms"] < turns[0]["latency_ms"]["first_phrase_ms"]
    assert s["token_ms"] < 1 and s["voice_to_voice_ms"] >= turns[0]["latency_ms"]["endpoint_ms"] - 1
    assert summary["simulated"]["deployment"] == "smollm2-135m@wse3x1" and summary["simulated"]["turns"] == len(turns)
    turns, _ = _run_json("--emulate", "llama-3.1-70b@cs3x4")  # the old name still works
    assert all(t["simulated"]["deployment"] == "llama-3.1-70b@wse3x4" for t in turns)
    bad = wafervox("run", "--fast", "--deployment", "llama-3.1-70b@cs3x2", str(ROOT / "samples" / "morning_02_located.wav"))
    assert bad.returncode == 2 and "needs at least 4" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.engines
def test_pace_on_the_virtual_clock_follows_the_simulated_llm_both_ways():
    """With --fast the clock charges the LLM stage its simulated time: a slow deployment's answer comes later
    than this machine's, a fast one's sooner, and the measured LLM span is the simulated one."""
    plain, _ = _run_json("--no-mitigation")  # (a turn forecast late would change its first phrase, or play the ack first)
    slow, _ = _run_json("--pace", "--deployment", "llama-3.1-405b@h100x16", "--no-speculative", "--no-mitigation")
    fast, _ = _run_json("--pace", "--no-speculative", "--no-mitigation")
    for t in slow + fast:
        assert t["latency_ms"]["first_phrase_ms"] == pytest.approx(t["simulated"]["first_phrase_ms"], abs=0.2)
    p, sl, fa = (t[0]["latency_ms"]["first_phrase_ms"] for t in (plain, slow, fast))
    assert sl > fa + 40 and p > fa, (sl, p, fa)
    assert slow[0]["latency_ms"]["voice_to_voice_ms"] > fast[0]["latency_ms"]["voice_to_voice_ms"] + 100
