"""``wafervox sim``: the wafer/GPU simulator on the command line (a thin adapter over ``wafer``)."""

from __future__ import annotations

import json

from .common import CLIError

BITS = {"16": 2.0, "8": 1.0, "4": 0.5}


def add_parser(sub) -> None:
    s = sub.add_parser(
        "sim", help="what a token and a voice turn cost on N wafers or on a GPU cluster",
        description="Place a model on simulated wafers (or GPUs), predict per-token latency, tokens/s per user "
                    "and aggregate, time to first token, and the verdict for a typical voice turn against 500 ms. "
                    "Wafers are calibrated once on a published point; --validate prints predicted vs published.")
    s.add_argument("--model", default=None, help="model shape (see --list; default llama-3.1-70b, with --compare frontier-moe)")
    s.add_argument("--hardware", default="wse3", help="system: wse3 (cs3), wse2, h100, h200, b200, a100, local-cpu")
    s.add_argument("--wafers", "--units", "--gpus", dest="units", default="auto", metavar="N|auto",
                   help="how many wafers (or GPUs); auto = as few as hold the model (default)")
    s.add_argument("--context", type=int, default=8192, help="KV-cache context per sequence in tokens (default 8192)")
    s.add_argument("--sequences", type=int, default=1, help="sequences in flight through the pipeline (default 1)")
    s.add_argument("--bits", choices=tuple(BITS), default="16", help="weight precision (default 16)")
    s.add_argument("--batch", type=int, default=1, help="GPU serving batch per step (default 1)")
    s.add_argument("--prompt-tokens", type=int, default=512, help="prompt length for the time to first token (default 512)")
    s.add_argument("--speculative", metavar="DRAFT:K:ACCEPT",
                   help="speculative decoding with a draft model, e.g. llama-3.1-8b:4:0.7")
    s.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="override a hardware parameter (e.g. hop_latency_s=5e-6); repeatable")
    s.add_argument("--compare", action="store_true",
                   help="the seeds' question: one frontier model, standard GPU serving vs. the wafer pipeline")
    s.add_argument("--validate", action="store_true", help="print the validation table (predicted vs published)")
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
    hw = load_hardware(args.hardware).with_overrides(_overrides(args.set))
    dep = Deployment.parse(f"{args.model or 'llama-3.1-70b'}@{args.hardware}")
    kw = dict(units=None if units == "auto" else int(units), context=args.context, sequences=args.sequences,
              batch=args.batch)
    kw["bytes_per_param"] = dep.bytes_per_param if dep.bytes_per_param is None and args.bits == "16" else BITS[args.bits]
    return type(dep)(dep.model, hw, **kw)


def _spec_rate(args, dep) -> float | None:
    if not args.speculative:
        return None
    from wafer.deploy import speculative

    try:
        draft, k, acc = args.speculative.split(":")
        k, acc = int(k), float(acc)
    except ValueError:
        raise CLIError(f"--speculative {args.speculative}: expected DRAFT:K:ACCEPT, e.g. llama-3.1-8b:4:0.7") from None
    if k < 1 or not 0 <= acc < 1:
        raise CLIError(f"--speculative {args.speculative}: K must be >= 1 and ACCEPT in [0, 1)")
    return speculative(dep, draft, k, acc)  # an unknown draft model is reported by the catalogue


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

    dep = _deployment(args)
    placement, cost = dep.build()
    t_tok = cost.token_time()
    thr = cost.throughput(args.sequences)
    spec = _spec_rate(args, dep)
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
        "speculative_tok_s": spec, "voice_turn": proj.to_dict(),
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
              f"  ({'model file sizes' if dep.bytes_per_param is None else f'{dep.bytes_per_param * 8:g}-bit weights'},"
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
    if spec:
        con.print(f"with speculative decoding ({args.speculative}): {spec:,.0f} tok/s per user")
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

    from wafer.validate import table

    rows = table()
    if args.json:
        print(json.dumps({"validation": [r.to_dict() for r in rows]}))
        return 0 if all(r.ok for r in rows) else 1
    t = Table(title="predicted vs published", title_justify="left")
    for col in ("case", "published", "predicted", "unit", "error", "tolerance", "ok", "kind"):
        t.add_column(col, justify="left" if col in ("case", "kind") else "right")
    for r in rows:
        t.add_row(r.name, f"{r.published:,.1f}", f"{r.predicted:,.1f}", r.unit, f"{r.error:+.1%}",
                  "-" if r.tolerance is None else f"{r.tolerance:.0%}", "yes" if r.ok else "NO", r.kind)
    Console(width=max(130, Console().width)).print(t)
    return 0 if all(r.ok for r in rows) else 1


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
