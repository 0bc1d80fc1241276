"""``wafervox sim``: the wafer/GPU simulator on the command line (a thin adapter over ``wafer``)."""

from __future__ import annotations

import json

from .common import CLIError

BITS = {"16": 2.0, "8": 1.0, "4": 0.5, "native": None}


def add_parser(sub) -> None:
    s = sub.add_parser(
        "sim", help="what a token and a voice turn cost on N wafers or on a GPU cluster",
        description="Place a model on simulated wafers (or GPUs), predict per-token latency, tokens/s per user "
                    "and aggregate, time to first token, and the verdict for a typical voice turn against 500 ms. "
                    "Wafers are calibrated once on a published point; --validate prints predicted vs published "
                    "(calibration, prediction, placement and context rows apart). --plan finds, per system, the "
                    "smallest deployment that keeps N concurrent voice callers inside the budget, and its hourly cost.")
    s.add_argument("--model", default=None, help="model shape (see --list; default llama-3.1-70b, with --compare frontier-moe); "
                                                 "with --list, that model's numbers, sources and wafers needed")
    s.add_argument("--hardware", default=None,
                   help="system: wse3 (cs3), wse2, h100, h200, b200, a100, gh200, local-cpu (default wse3); with --plan a "
                        "comma-separated list (default wse3,h100,h200,b200)")
    s.add_argument("--wafers", "--units", "--gpus", dest="units", default="auto", metavar="N|auto",
                   help="how many wafers (or GPUs); auto = as few as hold the model (default)")
    s.add_argument("--context", type=int, default=8192, help="KV-cache context per sequence in tokens (default 8192)")
    s.add_argument("--sequences", type=int, default=1, help="sequences in flight through the pipeline (default 1)")
    s.add_argument("--bits", choices=tuple(BITS), default="16",
                   help="weight precision (default 16); native = the checkpoint's own format (gpt-oss: MXFP4 experts, "
                        "DeepSeek-V3: FP8)")
    s.add_argument("--batch", type=int, default=1, help="GPU serving batch per step (default 1)")
    s.add_argument("--prompt-tokens", type=int, default=512, help="prompt length for the time to first token (default 512)")
    s.add_argument("--speculative", metavar="DRAFT[:K[:ACCEPT]]",
                   help="speculative decoding: DRAFT is eagle (an EAGLE-style head on the target's units) or a draft "
                        "model (e.g. llama-3.1-8b, on its own units); K drafted tokens and the per-token ACCEPT rate "
                        "default to the published acceptance length for the pair (wafer/data/speculation.toml); "
                        "the target verifies K+1 tokens per cycle")
    s.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="override a hardware parameter (e.g. hop_latency_s=5e-6); repeatable")
    s.add_argument("--compare", action="store_true",
                   help="the seeds' question: one frontier model, standard GPU serving vs. the wafer pipeline")
    s.add_argument("--validate", action="store_true",
                   help="print the validation table (predicted vs published); every row has a kind: calibration "
                        "(fitted), prediction (checked, not fitted), placement, context (shown, never counted as a pass)")
    s.add_argument("--plan", action="store_true",
                   help="the smallest deployment per system (--hardware) for --callers concurrent voice callers inside "
                        "--budget-ms at p95 voice-to-voice, its per-caller rate and cost per hour (price_per_hour in the "
                        "hardware file; --set price_per_hour=X); --plot draws callers vs units")
    s.add_argument("--callers", type=int, default=None, metavar="N", help="concurrent voice callers for --plan")
    s.add_argument("--budget-ms", type=float, default=None, help="voice-to-voice budget for --plan (default 500)")
    s.add_argument("--asr-ms", type=float, default=None, help="ASR time per turn for --plan (default: this machine's, 75)")
    s.add_argument("--tts-ms", type=float, default=None, help="TTS time to first audio for --plan (default: this machine's, 62)")
    s.add_argument("--answer-tokens", type=int, default=60, help="tokens of one spoken answer for --plan (default 60)")
    s.add_argument("--turn-period", type=float, default=10.0, metavar="S",
                   help="seconds between a caller's turns for --plan (default 10)")
    s.add_argument("--caller-context", type=int, default=4096,
                   help="KV tokens each caller keeps resident for --plan (persona, tools, history; default 4096)")
    s.add_argument("--list", action="store_true", help="list the catalogued models and systems")
    s.add_argument("--run", type=int, nargs="?", const=32, metavar="TOKENS",
                   help="also run the real model (smollm2-135m only) through WaferPipeline on this placement, one "
                        "sequence per --sequences, TOKENS tokens each (default 32): wall time here next to simulated "
                        "time on the target, stage utilisation and bubbles")
    s.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    s.add_argument("--plot", metavar="PNG", help="draw the pipeline timeline and tokens/s vs unit count")
    s.set_defaults(func=run)


def _overrides(items) -> dict[str, float]:
    out = {}
    for it in items:
        name, sep, value = it.partition("=")
        try:
            if not sep:
                raise ValueError
            out[name.strip()] = float(value)
        except ValueError:
            raise CLIError(f"--set {it}: expected NAME=NUMBER") from None
    return out


def _deployment(args):
    from wafer.deploy import Deployment
    from wafer.specs import load_hardware

    if args.context < 1 or args.sequences < 1 or args.batch < 1 or args.prompt_tokens < 1:
        raise CLIError("--context, --sequences, --batch and --prompt-tokens must be >= 1")
    units = args.units.strip().lower()
    if units != "auto" and (not units.isdigit() or int(units) < 1):
        raise CLIError(f"--wafers {args.units}: expected a positive number or 'auto'")
    name = args.hardware or "wse3"
    hw = load_hardware(name).with_overrides(_overrides(args.set))
    dep = Deployment.parse(f"{args.model or 'llama-3.1-70b'}@{name}")
    kw = dict(units=None if units == "auto" else int(units), context=args.context, sequences=args.sequences,
              batch=args.batch)
    kw["bytes_per_param"] = _bits(args, dep.model) if not (dep.bytes_per_param is None and args.bits == "16") else None
    return type(dep)(dep.model, hw, **kw)


def _bits(args, model):
    if args.bits != "native":
        return BITS[args.bits]
    if model.native is None:
        raise CLIError(f"--bits native: {model.name} has no native format in the catalogue (use 16, 8 or 4)")
    return model.native


def _speculation(args, dep):
    """The speculation asked for (``wafer.speculation.Speculation``), or None."""
    if not args.speculative:
        return None
    from wafer.speculation import speculate

    parts = args.speculative.split(":")
    try:
        if len(parts) > 3 or not parts[0]:
            raise ValueError
        k = int(parts[1]) if len(parts) > 1 else None
        acc = float(parts[2]) if len(parts) > 2 else None
    except ValueError:
        raise CLIError(f"--speculative {args.speculative}: expected DRAFT[:K[:ACCEPT]], e.g. eagle, eagle:5, "
                       "llama-3.1-8b:4:0.7") from None
    if (k is not None and k < 1) or (acc is not None and not 0 <= acc < 1):
        raise CLIError(f"--speculative {args.speculative}: K must be >= 1 and ACCEPT in [0, 1)")
    method = "eagle" if parts[0].lower() == "eagle" else "draft"
    return speculate(dep, method, None if method == "eagle" else parts[0], k, acc)  # an unknown draft is the catalogue's error


def _gb(b: float) -> str:
    return f"{b / 1e9:.2f}" if b >= 1e7 else f"{b / 1e9:.4f}"


def _scaling_points(dep, counts):
    """(units, per-user tok/s, aggregate tok/s with one sequence per pipeline stage) for each count that fits."""
    from dataclasses import replace

    from wafer.placement import PlacementError

    pts = []
    for u in counts:
        try:
            _, c = replace(dep, units=u).build()
        except (PlacementError, ValueError):
            continue
        pts.append((u, 1 / c.token_time(), c.throughput(c.placement.n_units).aggregate_tok_s))
    return pts


def run(args) -> int:
    from wafer.placement import PlacementError
    from wafer.specs import CatalogueError

    try:
        if args.plan or args.callers is not None:
            return _plan(args)
        if args.list:
            return _list(args)
        if args.validate:
            return _validate(args)
        if args.compare:
            return _compare(args)
        return _one(args)
    except (CatalogueError, PlacementError) as e:
        raise CLIError(str(e)) from None


def _list(args) -> int:
    from wafer.specs import hardware_names, model_names

    if args.model:
        return _describe(args)
    if args.json:
        print(json.dumps({"models": model_names(), "hardware": hardware_names()}))
    else:
        print("models:   " + ", ".join(model_names()))
        print("hardware: " + ", ".join(hardware_names()))
    return 0


def _one(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from wafer.deploy import project_turn
    from wafer.pipeline import simulate
    from wafer.specs import precision_label

    dep = _deployment(args)
    placement, cost = dep.build()
    t_tok = cost.token_time()
    thr = cost.throughput(args.sequences)
    speculation = _speculation(args, dep)
    spec = speculation.tok_s if speculation else None
    ttft = cost.ttft(args.prompt_tokens)
    hw = dep.hardware
    unit = "GPU" if hw.kind == "gpu" else ("stage" if hw.kind == "cpu" else "wafer")
    name = f"{dep.model.name}@{hw.name}x{placement.n_units * getattr(cost, 'tp', 1)}"
    proj = project_turn(cost, name, tok_s=spec)
    out = {
        "deployment": name, "model": dep.model.name, "hardware": hw.name,
        "units": placement.n_units * getattr(cost, "tp", 1), "pipeline_stages": placement.n_units,
        "tensor_parallel": getattr(cost, "tp", 1), "bytes_per_param": dep.bytes_per_param,
        "placement": placement.to_dict()["stages"], "token_ms": t_tok * 1e3, "per_user_tok_s": 1 / t_tok,
        "sequences": args.sequences, "period_ms": thr.period_s * 1e3, "aggregate_tok_s": thr.aggregate_tok_s,
        "per_user_tok_s_at_sequences": thr.per_user_tok_s, "ttft_ms": ttft * 1e3, "prompt_tokens": args.prompt_tokens,
        "speculative_tok_s": spec, "speculation": speculation.to_dict() if speculation else None,
        "voice_turn": proj.to_dict(), "precision": precision_label(dep.bytes_per_param),
        "kv_per_sequence_bytes": dep.model.kv_bytes_per_sequence(args.context) if dep.model.file_bytes is None else None,
        "assumptions": {k: p.value for k, p in hw.params.items() if p.assumption},
    }
    run = _run_pipeline(args, placement, cost) if args.run else None
    if run is not None:
        out["run"] = run
    if args.plot:
        tl = simulate(cost, sequences=max(1, min(args.sequences, 8)), tokens=3)
        lo = placement.n_units
        if hw.kind == "gpu":  # GPU counts: tensor parallel within a node, then whole nodes as pipeline stages
            node = int(hw["node_gpus"])
            counts = [g for g in (1, 2, 4, 8, 2 * node, 4 * node, 8 * node) if g <= 8 * node]
        else:
            counts = sorted({*range(lo, 2 * lo + 5, max(1, lo // 4))})
        pts = _scaling_points(dep, counts)
        from wafer.plot import sim_figure

        sim_figure(tl, f"{name}: 3 tokens x {max(1, min(args.sequences, 8))} sequence(s), stages and hops",
                   pts, f"{dep.model.name} on {hw.name}: tokens/s vs {unit}s", args.plot)
        out["plot"] = args.plot
    if args.json:
        print(json.dumps(out))
        return 0
    con = Console(width=max(100, Console().width))
    n_units = placement.n_units * getattr(cost, "tp", 1)
    con.print(f"[bold]{dep.model.title}[/bold] on [bold]{n_units} x {hw.title}[/bold]"
              f"  ({precision_label(dep.bytes_per_param)} weights,"
              f" context {args.context}, {args.sequences} sequence(s) in flight"
              + (f", tensor parallel {cost.tp}, batch {cost.batch}" if hw.kind == "gpu" else "") + ")")
    t = Table(title="placement", title_justify="left")
    for col in (unit if hw.kind != "gpu" else f"stage ({cost.tp} GPUs)", "layers", "weights GB", "KV GB", "fill", "stage µs"):
        t.add_column(col, justify="right")
    shown = placement.stages if len(placement.stages) <= 12 else placement.stages[:6] + placement.stages[-3:]
    for s in shown:
        extra = (" +embed" if s.has_embed else "") + (" +head" if s.has_head else "")
        t.add_row(str(s.index), f"{s.first}-{s.stop - 1}{extra}", _gb(s.weight_bytes), _gb(s.kv_bytes),
                  f"{s.bytes / placement.capacity:.0%}", f"{cost.stage_time(s.index) * 1e6:.1f}")
    if len(shown) < len(placement.stages):
        t.caption = f"{len(placement.stages) - len(shown)} more units not shown"
    con.print(t)
    con.print(f"per token {t_tok * 1e3:.3f} ms -> {1 / t_tok:,.0f} tok/s per user"
              + (f"; hop {cost.hop_time() * 1e6:.1f} µs" if placement.n_units > 1 else ""))
    con.print(f"{args.sequences} sequence(s) in flight: {thr.aggregate_tok_s:,.0f} tok/s aggregate, "
              f"{thr.per_user_tok_s:,.0f} tok/s each")
    if speculation:
        sp = speculation
        con.print(f"with speculative decoding ({sp.draft}, k={sp.k}, acceptance {sp.accept:.2f} per token -> "
                  f"{sp.tokens_per_cycle:.2f} tokens per cycle): draft {sp.draft_s * 1e3:.3f} ms/token, verify {sp.k + 1} "
                  f"tokens {sp.verify_s * 1e3:.3f} ms -> {sp.tok_s:,.0f} tok/s per user ({sp.speedup:.2f}x)")
        con.print(f"[dim]acceptance: {sp.source}[/dim]")
    if dep.model.file_bytes is None:
        con.print(f"memory per caller (KV for {args.context} tokens, {dep.model.attention_kind} attention): "
                  f"{_gb(dep.model.kv_bytes_per_sequence(args.context))} GB")
    con.print(f"time to first token for {args.prompt_tokens} prompt tokens: {ttft * 1e3:.1f} ms")
    con.print(f"voice turn (ASR/TTS as measured here, LLM as modelled): first phrase {proj.first_phrase_ms:.0f} ms, "
              f"voice-to-voice {proj.voice_to_voice_ms:.0f} ms -> [bold]{proj.verdict}[/bold] ({proj.budget_ms:.0f} ms); "
              f"without the speculative start {proj.sequential_ms:.0f} ms")
    if hw.kind == "cpu":
        con.print(f"measured here: read {hw['read_bw'] / 1e9:.1f} GB/s (one thread), layer matvecs {hw['gemv_bw'] / 1e9:.1f} GB/s, "
                  f"Q8_0 head {hw['head_bw'] / 1e9:.1f} GB/s, {hw['call_overhead_s'] * 1e6:.1f} µs per parallel kernel call "
                  f"[dim]({hw.params['gemv_bw'].source.split(': ')[0]})[/dim]")
    assumed = [f"{k}={p.value:g}" for k, p in hw.params.items() if p.assumption]
    if assumed:
        con.print("[dim]assumptions (override with --set): " + ", ".join(assumed) + "[/dim]")
    if run is not None:
        con.print(f"ran {run['sequences']} sequence(s) x {run['tokens']} tokens through {placement.n_units} stage(s): "
                  f"wall {run['wall_s'] * 1e3:.0f} ms here ({run['wall_tok_s']:.0f} tok/s), simulated "
                  f"{run['sim_s'] * 1e3:.3f} ms on {hw.name} ({run['sim_tok_s']:,.0f} tok/s); tokens identical to the "
                  f"decode core: {'yes' if run['identical'] else 'NO'}")
        con.print("stage utilisation " + " ".join(f"{u:.0%}" for u in run["utilisation"])
                  + "; bubbles " + " ".join(f"{b * 1e6:.0f}" for b in run["bubbles_s"]) + " µs"
                  + "; busy here " + " ".join(f"{b * 1e3:.0f}" for b in run["stage_busy_wall_s"]) + " ms")
    if args.plot:
        con.print(f"plot: {args.plot}")
    return 0


def _run_pipeline(args, placement, cost) -> dict:
    """The real model through ``WaferPipeline`` on ``placement``; checked against ``Generator``."""
    if placement.model.file_bytes is None:
        raise CLIError(f"--run needs a model that runs here (smollm2-135m); {placement.model.name} is a shape only")
    if args.run < 1:
        raise CLIError("--run TOKENS must be >= 1")
    from decode.generate import Generator
    from wafer.pipeline import WaferPipeline

    g = Generator(n_ctx=min(2048, 64 + args.run))
    qs = ("When do you open on Sunday?", "How much is a croissant?", "Tell me about your bread.", "Do you deliver?")
    prompts = [g.encode_chat([{"role": "user", "content": qs[j % len(qs)]}]) for j in range(args.sequences)]
    ref = [list(Generator(g.model).generate(p, max_tokens=args.run, stop_ids=()).token_ids) for p in prompts]
    with WaferPipeline(g.model, placement, cost) as wp:
        r = wp.run(prompts, max_tokens=args.run)
    d = r.to_dict()
    d.update(sequences=len(prompts), tokens=args.run, identical=r.tokens == ref)  # token lists give way to the count
    return d


def _validate(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from wafer.validate import KINDS, all_ok, table

    rows = table()
    if args.json:
        print(json.dumps({"validation": [r.to_dict() for r in rows], "all_checked_ok": all_ok(rows)}))
        return 0 if all_ok(rows) else 1
    con = Console(width=max(130, Console().width))
    titles = {"calibration": "fitted: the one calibration point per wafer system",
              "prediction": "predicted, not fitted (checked against the tolerance)",
              "placement": "placement (checked)", "context": "context: shown, not checked (ok n/a, never a pass)"}
    for kind in KINDS:
        part = [r for r in rows if r.kind == kind]
        if not part:
            continue
        t = Table(title=titles[kind], title_justify="left")
        for col in ("case", "published", "predicted", "unit", "error", "tolerance", "ok", "kind", "assumptions"):
            t.add_column(col, justify="left" if col in ("case", "kind", "assumptions") else "right")
        for r in part:
            t.add_row(r.name, f"{r.published:,.1f}", f"{r.predicted:,.1f}", r.unit, f"{r.error:+.1%}",
                      "fitted" if kind == "calibration" else ("-" if r.tolerance is None else f"{r.tolerance:.0%}"),
                      r.status, r.kind, r.assumptions)
        con.print(t)
    return 0 if all_ok(rows) else 1


def _describe(args) -> int:
    """``--list --model M``: the shape as catalogued, where each number comes from, and what it needs."""
    from wafer.placement import place
    from wafer.specs import load_hardware, load_model, precision_label

    m = load_model(args.model)
    cs3 = load_hardware(args.hardware or "wse3").with_overrides(_overrides(args.set))
    precisions = [("16-bit", 2.0)] + ([(m.native.label, m.native)] if m.native else [])
    places = []
    for label, bpp in precisions:
        if cs3.kind == "gpu":
            from wafer.timing import place_gpus

            p, tp = place_gpus(m, cs3, None, context=args.context, bytes_per_param=bpp)
            n = p.n_units * tp
        else:
            p = place(m, cs3, None, context=args.context, bytes_per_param=bpp)
            n = p.n_units
        places.append({"precision": label, "units": n, "weights_gb": m.weight_bytes(bpp) / 1e9,
                       "bytes_per_token_gb": m.active_bytes(bpp) / 1e9, "split_layers": getattr(p, "split_layers", 0)})
    out = {"model": m.name, "title": m.title, "source": m.source, "layers": m.n_layers, "d_model": m.d_model,
           "heads": m.n_heads, "kv_heads": m.n_kv_heads, "attention": m.attention_kind,
           "experts": m.n_experts, "experts_per_token": m.experts_per_token, "shared_experts": m.n_shared_experts,
           "dense_layers": sum(1 for i in range(m.n_layers) if not m.is_moe_layer(i)),
           "total_params": m.total_params, "active_params": m.active_params, "params_published": m.params_published,
           "kv_bytes_per_token": m.kv_bytes_per_sequence(1), "kv_bytes_at_context": m.kv_bytes_per_sequence(args.context),
           "context": args.context, "native": precision_label(m.native) if m.native else None,
           "native_source": m.native.source if m.native else None, "hardware": cs3.name, "placements": places,
           "sources": dict(m.sources)}
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{m.title}  [{m.name}]")
    print(f"  source: {m.source}")
    moe = (f"; {m.n_experts} experts, {m.experts_per_token} per token" + (f" + {m.n_shared_experts} shared" if m.n_shared_experts else "")
           + f", {out['dense_layers']} dense layers") if m.is_moe else ""
    print(f"  {m.n_layers} layers, d_model {m.d_model}, {m.n_heads} heads / {m.n_kv_heads} KV heads, {m.attention_kind} attention{moe}")
    print(f"  parameters {m.total_params / 1e9:.1f}B (published {m.params_published / 1e9:.1f}B), "
          f"{m.active_params / 1e9:.2f}B read per token")
    print(f"  KV cache {m.kv_bytes_per_sequence(1) / 1e3:.1f} KB per token; {m.kv_bytes_per_sequence(args.context) / 1e9:.2f} GB per "
          f"sequence at {args.context} tokens")
    if m.native:
        print(f"  native precision: {m.native.label} ({m.native.source})")
    for pl in places:
        split = f", {pl['split_layers']} layers split across units" if pl["split_layers"] else ""
        print(f"  {pl['precision']}: {pl['weights_gb']:.1f} GB of weights, {pl['bytes_per_token_gb']:.2f} GB read per token "
              f"(batch 1) -> {pl['units']} x {cs3.name}{split}")
    for k, v in m.sources:
        print(f"  [{k}] {v}")
    return 0


def _plan(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from wafer.deploy import TurnFigures
    from wafer.serving import DEFAULT_PLAN_HARDWARE, Workload, callers_curve, plan
    from wafer.specs import load_hardware, load_model, precision_label

    if args.callers is None or args.callers < 1:
        raise CLIError(f"--plan needs --callers N with N >= 1 (got {args.callers})")
    if args.budget_ms is not None and args.budget_ms <= 0:
        raise CLIError("--budget-ms must be > 0")
    if args.answer_tokens < 1 or args.turn_period <= 0 or args.caller_context < 1:
        raise CLIError("--answer-tokens, --turn-period and --caller-context must be > 0")
    model = load_model(args.model or "llama-3.1-70b")
    names = [h.strip() for h in (args.hardware or ",".join(DEFAULT_PLAN_HARDWARE)).split(",") if h.strip()]
    if not names:
        raise CLIError(f"--hardware {args.hardware!r}: name at least one system (e.g. wse3,h200)")
    overrides = _overrides(args.set)
    hws = [load_hardware(n) for n in names]  # an unknown system is the catalogue's error
    for k in overrides:
        if not any(k in h.params for h in hws):
            raise CLIError(f"--set {k}: none of {', '.join(h.name for h in hws)} has that parameter")
    base = TurnFigures()
    fig = TurnFigures(asr_ms=base.asr_ms if args.asr_ms is None else args.asr_ms,
                      tts_first_audio_ms=base.tts_first_audio_ms if args.tts_ms is None else args.tts_ms,
                      budget_ms=base.budget_ms if args.budget_ms is None else args.budget_ms)
    work = Workload(turn_period_s=args.turn_period, answer_tokens=args.answer_tokens, context_tokens=args.caller_context,
                    figures=fig)
    bpp = _bits(args, model) if args.bits != "16" else 2.0
    plans = plan(model, args.callers, [h.name for h in hws], work, bpp, overrides)
    rows = [{"hardware": hw.name, "kind": hw.kind, **(p.to_dict() if p else {"units": None, "why": "no deployment up to the "
                                                                              "largest tried keeps them inside the budget"})}
            for hw, p in plans]
    if args.plot:
        from wafer.plot import plan_figure

        grid = sorted({max(1, round(args.callers * f)) for f in (0.1, 0.25, 0.5, 0.75, 1, 1.5, 2)})
        curves = [(hw.name, callers_curve(model, hw, grid, work, bpp)) for hw, _ in plans]
        plan_figure(curves, f"{model.name}: units for N callers inside {fig.budget_ms:.0f} ms (p95)", args.plot)
    if args.json:
        print(json.dumps({"model": model.name, "callers": args.callers, "workload": work.to_dict(), "plans": rows,
                          "plot": args.plot}))
        return 0
    con = Console(width=max(130, Console().width))
    t = Table(title=f"{model.title}: the smallest deployment for {args.callers} concurrent voice callers, p95 voice-to-voice "
                    f"<= {fig.budget_ms:.0f} ms", title_justify="left")
    for col in ("system", "kind", "deployment", "units", "per-caller tok/s", "in flight p95", "TTFT ms", "v2v p95 ms",
                "KV per caller GB", "KV", "$/hour", "$/caller-hour"):
        t.add_column(col, justify="left" if col in ("system", "kind", "deployment", "KV") else "right")
    for hw, p in plans:
        if p is None:
            t.add_row(hw.name, hw.kind, "none found", "-", "-", "-", "-", "-", "-", "-", "-", "-")
            continue
        ld = p.load
        where = ("spilled" if ld.kv_spilled else "SRAM") if hw.kind == "wafer" else "HBM"
        t.add_row(hw.name, hw.kind, f"{p.replicas} x {p.units_per_replica} {'wafers' if hw.kind == 'wafer' else 'GPUs'}",
                  str(p.units), f"{ld.per_user_tok_s:,.0f}", str(ld.active_p95), f"{ld.ttft_s * 1e3:.1f}",
                  f"{ld.voice_to_voice_s * 1e3:.0f}", f"{ld.kv_per_caller_bytes / 1e9:.2f}", where,
                  f"{p.cost_per_hour:,.0f}" + ("*" if p.price_assumed else ""), f"{p.cost_per_hour / args.callers:.2f}")
    con.print(t)
    con.print(f"[dim]each caller: a turn every {work.turn_period_s:g} s, {work.answer_tokens} answer tokens, "
              f"{fig.new_prompt_tokens} new prompt tokens after {work.context_tokens} cached (KV resident); ASR {fig.asr_ms:g} ms, "
              f"TTS first audio {fig.tts_first_audio_ms:g} ms, endpoint {fig.endpoint_ms:g} ms, pause {fig.pause_ms:g} ms; "
              f"p95 = the 95th percentile of sequences in flight (Poisson); precision {precision_label(bpp)}; "
              "no speculation[/dim]")
    con.print("[dim]* price per unit-hour is an estimate (assumption in the hardware file; override with --set "
              "price_per_hour=X)[/dim]")
    if args.plot:
        con.print(f"plot: {args.plot}")
    return 0


def _compare(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from wafer.deploy import TurnFigures, project_turn, speculative
    from wafer.validate import seeds_cases

    model = args.model or "frontier-moe"
    cases = seeds_cases(model)
    rows = []
    for label, dep, spec in cases:
        p, cost = dep.build()
        rate = speculative(dep, *spec) if spec else 1 / cost.token_time()
        proj = project_turn(cost, dep.name, tok_s=rate)
        rows.append({"case": label, "deployment": dep.name, "units": p.n_units * getattr(cost, "tp", 1), "batch": dep.batch,
                     "per_user_tok_s": rate, "first_phrase_ms": proj.first_phrase_ms,
                     "answer_ready_ms": proj.ready_ms, "voice_to_voice_ms": proj.voice_to_voice_ms,
                     "sequential_ms": proj.sequential_ms,
                     "within_budget": proj.within_budget})
    ratio = rows[3]["per_user_tok_s"] / rows[0]["per_user_tok_s"]
    if args.json:
        print(json.dumps({"model": model, "compare": rows, "wafer_vs_standard": ratio, "seeds_claim": 750 / 53}))
        return 0
    t = Table(title=f"{model}: standard GPU serving vs. the wafer pipeline (seeds' claim: 53 vs 750 tok/s, 14x)",
              title_justify="left")
    for col in ("case", "deployment", "units", "batch", "tok/s per user", "1st phrase ms", "answer ready ms", "voice-to-voice ms",
                "without spec. start", "fits 500 ms"):
        t.add_column(col, justify="left" if col in ("case", "deployment") else "right")
    for r in rows:
        t.add_row(r["case"], r["deployment"], str(r["units"]), str(r["batch"]), f"{r['per_user_tok_s']:,.0f}",
                  f"{r['first_phrase_ms']:.0f}", f"{r['answer_ready_ms']:.0f}", f"{r['voice_to_voice_ms']:.0f}",
                  f"{r['sequential_ms']:.0f}",
                  "yes" if r["within_budget"] else "no")
    con = Console(width=max(130, Console().width))
    con.print(t)
    con.print(f"wafer pipeline with speculation vs standard serving: {ratio:.1f}x (seeds: {750 / 53:.1f}x)")
    fig = TurnFigures()
    con.print(f"[dim]each turn: pause {fig.pause_ms:.0f} ms + ASR {fig.asr_ms:.0f} ms + the case's first phrase + TTS "
              f"{fig.tts_first_audio_ms:.0f} ms = answer ready; it plays at the endpoint ({fig.endpoint_ms:.0f} ms of "
              "silence) at the earliest (this machine's medians, wafer/deploy.py TurnFigures)[/dim]")
    reads = "most experts and every user's KV" if cases[0][1].model.is_moe else "the weights once and every user's KV"
    con.print(f"[dim]standard serving batches {cases[0][1].batch} users per step, so each step reads {reads}; "
              "the wafer serves one sequence per step and is bound by per-layer latency and hops[/dim]")
    return 0
