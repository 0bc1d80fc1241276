"""The simulator against published numbers and against this machine, in one run.

    .venv/bin/python bench/sim_validate.py [--rounds 5] [--tokens 64] [--json FILE]

1. The validation table (wafer/validate.py): each published result, the model's prediction and
   the error, by kind: one calibration point per wafer system (fitted), predictions (checked, not
   fitted), placements, and context rows (shown, never counted as a pass).
2. ``local-cpu``: the timing model built from micro-measurements of the decode kernels (fresh,
   not cached) predicts the decode core's tokens/s for SmolLM2-135M; measured here with
   ``decode.Generator``; measurement and decode alternate round by round, medians of each,
   ratio predicted / measured (bar: within 20%).
3. ``WaferPipeline`` on this machine: wall time of 1, 2 and 4 stages with 1 and 4 sequences in
   flight vs. the plain decode core, and the simulated time of the same run on the local-cpu
   model, so the pipeline's own cost and its modelled gain sit side by side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QUESTIONS = ["When do you open on Sunday?", "How much is a croissant?", "Tell me about your bread.",
             "Do you deliver to Harbor Street?"]


def validation() -> list[dict]:
    from wafer.validate import KINDS, table

    rows = [r.to_dict() for r in table()]
    print("1. predicted vs published")
    for kind in KINDS:
        part = [r for r in rows if r["kind"] == kind]
        if not part:
            continue
        print(f"   -- {kind}")
        print(f"   {'case':56} {'published':>10} {'predicted':>10} {'unit':9} {'error':>8} {'tol':>6}  ok")
        for r in part:
            tol = "fitted" if kind == "calibration" else ("-" if r["tolerance"] is None else f"{r['tolerance']:.0%}")
            ok = "n/a" if r["ok"] is None else ("yes" if r["ok"] else "NO")
            print(f"   {r['name']:56} {r['published']:>10,.1f} {r['predicted']:>10,.1f} {r['unit']:9} {r['error']:>+8.1%} {tol:>6}  "
                  f"{ok}")
    return rows


def local_cpu(rounds: int, tokens: int) -> dict:
    from decode.generate import Generator
    from wafer.localcpu import from_figures, measure
    from wafer.placement import place
    from wafer.specs import load_model
    from wafer.timing import CPUCost

    g = Generator()
    prompt = g.encode_chat([{"role": "user", "content": QUESTIONS[2]}])
    g.generate(prompt, max_tokens=8)  # warm
    shape = load_model("smollm2-135m")
    rates, predictions, figs = [], [], []
    for _ in range(rounds):  # kernel figures and decode alternate, so that noise hits both alike
        f = measure()
        figs.append(f)
        p = place(shape, from_figures(f), 1, bytes_per_param=None, context=len(prompt) + tokens)
        predictions.append(1 / CPUCost(p, context_used=len(prompt) + tokens // 2).token_time())
        g.reset()
        rates.append(g.generate(prompt, max_tokens=tokens, stop_ids=()).decode_tok_s)
    measured, predicted = statistics.median(rates), statistics.median(predictions)
    med = {k: statistics.median(f[k] for f in figs) for k in figs[0]}
    out = {"predicted_tok_s": predicted, "measured_tok_s": measured, "ratio": predicted / measured,
           "within_20pct": abs(predicted / measured - 1) <= 0.20, "rates": rates, "predictions": predictions,
           "gemv_bw_gbs": med["gemv_bw"] / 1e9, "head_bw_gbs": med["head_bw"] / 1e9,
           "call_overhead_us": med["call_overhead_s"] * 1e6}
    print(f"\n2. local-cpu: SmolLM2-135M decode predicted {predicted:.1f} tok/s, measured {measured:.1f} tok/s "
          f"(medians of {rounds} alternating rounds, {tokens} tokens each): ratio {predicted / measured:.2f} "
          f"({'within' if out['within_20pct'] else 'OUTSIDE'} 20%)")
    print(f"   from: layer matvecs {out['gemv_bw_gbs']:.1f} GB/s, Q8_0 head {out['head_bw_gbs']:.1f} GB/s, "
          f"{out['call_overhead_us']:.1f} µs per parallel kernel call")
    return out


def pipeline(rounds: int, tokens: int) -> list[dict]:
    from decode.generate import Generator
    from wafer.localcpu import local_cpu as cpu
    from wafer.pipeline import WaferPipeline
    from wafer.placement import place
    from wafer.specs import load_model

    g = Generator()
    prompts = [g.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
    shape, hw = load_model("smollm2-135m"), cpu()
    rows = []
    print("\n3. WaferPipeline on this machine (local-cpu model); every run's tokens are compared with the decode core's")
    print(f"   {'stages':>6} {'seqs':>4} {'wall tok/s':>10} {'vs core':>8} {'sim tok/s':>10} {'sim vs 1 stage':>14}  utilisation")
    core, ref = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        ref = [list(Generator(g.model).generate(p, max_tokens=tokens, stop_ids=()).token_ids) for p in prompts]
        core.append(len(prompts) * tokens / (time.perf_counter() - t0))
    core_rate = statistics.median(core)
    base_sim = {}
    for n in (1, 2, 4):
        pl = place(shape, hw, n, bytes_per_param=None, context=64 + tokens)
        with WaferPipeline(g.model, pl) as wp:
            for m in (1, 4):
                runs = [wp.run(prompts[:m], max_tokens=tokens) for _ in range(rounds)]
                wall = statistics.median(r.wall_tok_s for r in runs)
                sim = runs[0].sim_tok_s
                base_sim.setdefault(m, sim)
                util = runs[0].timeline.utilisation()
                same = all(r.tokens == ref[:m] for r in runs)
                rows.append({"stages": n, "sequences": m, "identical_tokens": same, "wall_tok_s": wall, "core_tok_s": core_rate,
                             "sim_tok_s": sim, "sim_vs_one_stage": sim / base_sim[m], "utilisation": util})
                print(f"   {n:>6} {m:>4} {wall:>10.1f} {wall / core_rate:>7.2f}x {sim:>10.1f} {sim / base_sim[m]:>13.2f}x  "
                      + " ".join(f"{u:.0%}" for u in util) + ("" if same else "  TOKENS DIFFER"))
    print(f"   plain decode core, the same {len(prompts)} prompts one after the other: {core_rate:.1f} tok/s (includes prefill)")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args()
    out = {"validation": validation(), "local_cpu": local_cpu(args.rounds, args.tokens),
           "pipeline": pipeline(max(1, args.rounds // 2), args.tokens // 2)}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    ok = (all(r["ok"] for r in out["validation"] if r["checked"]) and out["local_cpu"]["within_20pct"]
          and all(r["identical_tokens"] for r in out["pipeline"]))
    print(f"\n{'all within tolerance' if ok else 'SOME FIGURES OUTSIDE TOLERANCE'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
