"""Turn-taking: does the loop wait through a pause inside a turn, and how soon does it close a complete one?

    .venv/bin/python bench/turntaking.py [--set own|heldout|FOLDER] [--realtime] [--json FILE] [--only paused|complete]
                                         [--limit N]

``--set`` picks the set (``SETS``): ``own`` is samples/turntaking/, the set the loop's thresholds were tuned on;
``heldout`` is samples/heldout/turntaking/, made with voices, texts and noise that no training or tuning touches
(samples/heldout/README.md); any folder with a manifest.json of the same form works. The set's name is printed first
and in the JSON. Every item of the set is played alone, as one conversation, through the default
engines (``voice.engines.load_engines``) and the loop's default settings (``LoopConfig()``; ``--waits`` and
``--no-dictation-rule`` change its end-of-turn policy), exactly as ``wafervox run FILE`` does. The conversation is
reset before each item. The default clock is virtual (``--fast``): compute costs its measured time and idle waits
cost nothing. ``--realtime`` paces the input in real time.

- Paused items are ONE user turn with a 400-800 ms silence inside it. The loop **cut the user off** when it ended a
  turn before the user's last part. That is: it made more than one turn report; or the first report's endpoint came
  before the second part began; or the only report starts after the pause. In that last case the first part was
  closed as a turn, and it made no report because its answer was cut before its transcript was ready. True sample
  times map to clock times as ``loop.file_offsets[0] + t``.
- Timing note: the virtual clock charges compute at its measured wall time. A second CPU-heavy process on the machine
  slows the decode core's threads many times over, and so the endpoints too. Run the bench on an idle machine.
- Complete items end at their last voiced sample. Their figure is ``endpoint_ms`` (the loop's own: its last voiced
  sample to its endpoint decision, ``TurnReport.latency_ms``), and beside it the endpoint after the manifest's true
  end of speech.

Printed: the false cut-off rate, the complete turns' endpoint p50/p95, both per noise condition, and the bars
(``BARS``). The bars come from the issue "Turn-taking and the critical path". The JSON (``--json``) holds the summary,
the bars with a pass flag each, and every item with its turn reports (``TurnReport.to_dict()``, so any field a report
gains shows up there). tests/e2e/test_turntaking.py runs this script and asserts the bars.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SET = ROOT / "samples" / "turntaking"
#: The named sets: the own one (tuned on) and the held-apart one (never tuned on).
SETS = {"own": SET, "heldout": ROOT / "samples" / "heldout" / "turntaking"}

#: The issue's bars: at most 10 % of paused turns cut off; complete turns closed within 250 ms (p50 of endpoint_ms).
BARS = {"false_cutoff_rate_max": 0.10, "complete_endpoint_p50_ms_max": 250.0}


def resolve_set(name: str) -> tuple[str, Path]:
    """A set's name and folder: a name of ``SETS`` or a folder holding a manifest.json."""
    if name in SETS:
        return name, SETS[name]
    path = Path(name)
    if not (path / "manifest.json").is_file():
        raise SystemExit(f"--set: {name!r} is neither a set ({', '.join(SETS)}) nor a folder with a manifest.json")
    return path.name, path


def noise_label(meta: dict) -> str:
    if meta["noise"] == "none":
        return meta.get("condition", "clean")  # the held-apart set's room, phone band
    return f"{meta['noise']}{meta['noise_dbfs']:+.0f}dBFS"


def level_label(meta: dict) -> str:
    return meta.get("condition", "clean") if meta["noise"] == "none" else f"{meta['noise_dbfs']:+.0f}dBFS"


def score_item(name: str, meta: dict, reports: list, offset: float, dropped: int = 0) -> dict:
    """One item's outcome from its turn reports. ``offset`` is the clock time at which the file started, and ``dropped``
    counts the utterances that the loop closed as turns without words. Those make no report: ``loop.non_speech``."""
    first = reports[0] if reports else None
    ep = first.stamps.get("endpoint") if first else None
    out = {
        "file": name,
        "kind": meta["kind"],
        "text": meta["text"],
        "noise": noise_label(meta),
        "level": level_label(meta),
        "voice": meta["voice"],
        "turns": len(reports),
        "dropped": dropped,
        "transcripts": [r.transcript for r in reports],
        "endpoint_ms": first.latency_ms["endpoint_ms"] if first else None,
        # the endpoint after the manifest's true end of the speech (the loop's endpoint_ms starts at its own last voiced
        # sample, which webrtcvad may put early, e.g. before a final fricative)
        "endpoint_after_true_end_ms": None if ep is None else round((ep - offset - meta["speech_end_s"]) * 1000, 1),
        "voice_to_voice_ms": first.latency_ms["voice_to_voice_ms"] if first else None,
        "end_of_turn": [getattr(r, "end_of_turn", None) for r in reports],
        "reports": [r.to_dict() for r in reports],
    }
    if meta["kind"] == "paused":
        resume = offset + meta["pause"]["end_s"]
        out["pause_ms"] = meta["pause"]["ms"]
        out["endpoint_before_resume_ms"] = None if ep is None else round((resume - ep) * 1000, 1)  # > 0: ended in the pause
        # The loop ended a turn before the last part: more than one turn, the first one's endpoint inside the pause, or
        # the only turn heard from after the pause on. The first part was then closed as a turn of its own, which made
        # no report when the answer was interrupted before its transcript was ready (the user's first part is lost).
        start = first.stamps.get("speech_start") if first else None
        out["starts_after_pause"] = start is not None and start >= offset + meta["pause"]["start_s"]
        out["cut_off"] = len(reports) > 1 or (ep is not None and ep < resume) or out["starts_after_pause"]
        last = reports[-1] if reports else None
        out["final_endpoint_ms"] = last.latency_ms["endpoint_ms"] if last else None
    else:
        out["split"] = len(reports) > 1  # a complete turn answered as more than one
    return out


def _pct(values, q):
    from voice.latency import percentile

    p = percentile([v for v in values if v is not None], q)
    return None if p is None else round(p, 1)


def summarize(items: list[dict]) -> dict:
    """The figures and the bars over scored items (``score_item``)."""
    paused = [i for i in items if i["kind"] == "paused"]
    complete = [i for i in items if i["kind"] == "complete"]
    out: dict = {"items": len(items), "paused": {}, "complete": {}, "bars": {}}
    if paused:
        cut = sum(i["cut_off"] for i in paused)
        out["paused"] = {
            "n": len(paused),
            "cut_off": cut,
            "false_cutoff_rate": round(cut / len(paused), 3),
            "no_turn": sum(i["turns"] == 0 for i in paused),
            "first_part_lost": sum(i["starts_after_pause"] for i in paused),
            "by_noise": {},
        }
        for label in sorted({i["noise"] for i in paused}):
            group = [i for i in paused if i["noise"] == label]
            out["paused"]["by_noise"][label] = {"n": len(group), "cut_off": sum(i["cut_off"] for i in group),
                                                "final_endpoint_ms_p50": _pct([i["final_endpoint_ms"] for i in group], 0.5)}
    if complete:
        eps = [i["endpoint_ms"] for i in complete]
        questions = [i["endpoint_ms"] for i in complete if i["text"].rstrip().endswith("?")]
        out["complete"] = {
            "n": len(complete),
            "questions": {"n": len(questions), "endpoint_ms_p50": _pct(questions, 0.5), "endpoint_ms_p95": _pct(questions, 0.95)},
            "answered": sum(i["turns"] > 0 for i in complete),
            "split": sum(i["split"] for i in complete),
            "endpoint_ms": {"p50": _pct(eps, 0.5), "p95": _pct(eps, 0.95)},
            "endpoint_after_true_end_ms": {"p50": _pct([i["endpoint_after_true_end_ms"] for i in complete], 0.5),
                                           "p95": _pct([i["endpoint_after_true_end_ms"] for i in complete], 0.95)},
            "voice_to_voice_ms": {"p50": _pct([i["voice_to_voice_ms"] for i in complete], 0.5),
                                  "p95": _pct([i["voice_to_voice_ms"] for i in complete], 0.95)},
            "by_noise": {},
            "by_level": {},
        }
        for key, field in (("by_noise", "noise"), ("by_level", "level")):
            for label in sorted({i[field] for i in complete}):
                group = [i["endpoint_ms"] for i in complete if i[field] == label]
                out["complete"][key][label] = {"n": len(group), "endpoint_ms_p50": _pct(group, 0.5),
                                               "endpoint_ms_p95": _pct(group, 0.95)}
    rules = [e.get("rule") for i in items for e in i["end_of_turn"] if isinstance(e, dict) and e.get("rule")]
    if rules:
        out["end_of_turn_rules"] = {r: rules.count(r) for r in sorted(set(rules))}
    if paused:
        rate = out["paused"]["false_cutoff_rate"]
        out["bars"]["false_cutoff_rate"] = {"value": rate, "max": BARS["false_cutoff_rate_max"],
                                            "pass": rate <= BARS["false_cutoff_rate_max"]}
    if complete:
        p50 = out["complete"]["endpoint_ms"]["p50"]
        out["bars"]["complete_endpoint_p50_ms"] = {"value": p50, "max": BARS["complete_endpoint_p50_ms_max"],
                                                   "pass": p50 is not None and p50 <= BARS["complete_endpoint_p50_ms_max"]}
    return out


def fmt(v, spec=".0f") -> str:
    return "-" if v is None else format(v, spec)


def print_item(i: dict) -> None:
    eot = " ".join(f"[{e.get('rule')} {fmt(e.get('silence_ms'))} ms"
                   + (f" p={e['p_end']:.2f}" if isinstance(e.get("p_end"), float) else "") + "]"
                   for e in i["end_of_turn"] if isinstance(e, dict))
    if i["kind"] == "paused":
        verdict = "CUT OFF" if i["cut_off"] else "waited "
        lost = " (1st part lost)" if i["starts_after_pause"] else ""
        what = (f"pause {i['pause_ms']:3.0f} ms  {verdict} turns {i['turns']}{lost}  "
                f"endpoint {fmt(i['endpoint_before_resume_ms'], '+.0f')} ms before resume")
    else:
        what = (f"endpoint {fmt(i['endpoint_ms']):>4s} ms (after the true end {fmt(i['endpoint_after_true_end_ms'], '+.0f')})  "
                f"turns {i['turns']}")
    print(f"  {i['file']:40s} {i['noise']:14s} {what}  {eot} {i['transcripts']!r}", flush=True)


def print_summary(s: dict, clock: str, wall_s: float) -> None:
    print(f"\n{s['items']} items, {clock} clock, {wall_s:.0f} s")
    p, c = s["paused"], s["complete"]
    if p:
        print(f"paused turns:   {p['cut_off']}/{p['n']} cut off = false cut-off rate {p['false_cutoff_rate']:.2f}"
              + (f", in {p['first_part_lost']} of them the first part was lost" if p["first_part_lost"] else "")
              + (f" ({p['no_turn']} with no turn at all)" if p["no_turn"] else ""))
        for label, g in p["by_noise"].items():
            print(f"    {label:16s} {g['cut_off']}/{g['n']} cut off, endpoint of the last turn p50 {fmt(g['final_endpoint_ms_p50'])} ms")
    if c:
        e, t = c["endpoint_ms"], c["endpoint_after_true_end_ms"]
        print(f"complete turns: endpoint_ms p50 {fmt(e['p50'])} / p95 {fmt(e['p95'])} ms "
              f"(after the true end: p50 {fmt(t['p50'])} / p95 {fmt(t['p95'])}); "
              f"{c['answered']}/{c['n']} answered, {c['split']} split in two")
        q = c["questions"]
        if q["n"]:
            print(f"    questions        n={q['n']:2d} endpoint_ms p50 {fmt(q['endpoint_ms_p50']):>4s} p95 {fmt(q['endpoint_ms_p95']):>4s}")
        for key in ("by_level", "by_noise"):
            for label, g in c[key].items():
                if key == "by_noise" and label in c["by_level"]:
                    continue  # printed by level (clean, and the held-apart set's room and phone band)
                print(f"    {label:16s} n={g['n']:2d} endpoint_ms p50 {fmt(g['endpoint_ms_p50']):>4s} p95 {fmt(g['endpoint_ms_p95']):>4s}")
    if "end_of_turn_rules" in s:
        print(f"end-of-turn rules: {s['end_of_turn_rules']}")
    for name, bar in s["bars"].items():
        value = fmt(bar["value"], ".2f" if "rate" in name else ".0f")
        print(f"bar {name:26s} {value:>6s} <= {bar['max']:g}: {'PASS' if bar['pass'] else 'FAIL'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    pace = ap.add_mutually_exclusive_group()
    pace.add_argument("--fast", dest="realtime", action="store_false", help="virtual clock (the default)")
    pace.add_argument("--realtime", dest="realtime", action="store_true", help="real-time pacing of the input")
    ap.set_defaults(realtime=False)
    ap.add_argument("--set", default="own", metavar="NAME", help=f"the set: {' or '.join(SETS)} (default own), or a folder "
                    "with a manifest.json")
    ap.add_argument("--only", choices=("paused", "complete"), help="play one half of the set only")
    ap.add_argument("--limit", type=int, help="at most this many items of each half")
    ap.add_argument("--json", metavar="FILE", help="write the summary, the bars and every item as JSON")
    ap.add_argument("--waits", metavar="SHORT,MID,LONG", help="the end-of-turn policy's silences in place of its own "
                    "(e.g. 200,800,1000, the medium ones before issue 28), to compare policies in one sitting")
    ap.add_argument("--no-dictation-rule", action="store_true", help="the policy without its dictation rule")
    args = ap.parse_args()

    from voice.engines import load_engines
    from voice.loop import LoopConfig
    from voice.replay import play_conversation
    from voice.turn_end import TurnEndPolicy

    policy = TurnEndPolicy(dictation=not args.no_dictation_rule,
                           waits=tuple(int(x) for x in args.waits.split(",")) if args.waits else None)
    config = LoopConfig(end_of_turn=policy)
    print(f"end-of-turn policy: silences {policy.silences} ms, dictation rule {'on' if policy.dictation else 'off'}", flush=True)

    set_name, set_dir = resolve_set(args.set)
    print(f"set: {set_name} ({set_dir.relative_to(ROOT) if set_dir.is_relative_to(ROOT) else set_dir})", flush=True)
    manifest = json.loads((set_dir / "manifest.json").read_text())["items"]
    chosen = []
    for kind in ("paused", "complete"):
        if args.only in (None, kind):
            names = [n for n, m in manifest.items() if m["kind"] == kind]
            chosen += names[: args.limit] if args.limit else names
    engines, load_ms = load_engines(progress=lambda m: print(m, flush=True))
    clock = "real-time" if args.realtime else "virtual"
    load_before = os.getloadavg()[0]
    if load_before > 1.0:
        print(f"warning: load average {load_before:.1f} on {os.cpu_count()} cores before the run: "
              "another process competes for the cores and the timings will be inflated", flush=True)
    t0 = time.perf_counter()
    items = []
    for name in chosen:
        engines.llm.reset()
        reports, loop = play_conversation(engines, [set_dir / name], realtime=args.realtime, config=config)
        item = score_item(name, manifest[name], reports, loop.file_offsets[0], dropped=loop.non_speech)
        print_item(item)
        items.append(item)
    wall_s = time.perf_counter() - t0
    summary = summarize(items)
    print_summary(summary, clock, wall_s)
    print(f"set: {set_name}")
    print(f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    if args.json:
        Path(args.json).write_text(json.dumps({"set": set_name, "policy": {"silences": policy.silences, "dictation": policy.dictation},
                                               "summary": summary, "clock": clock, "wall_s": round(wall_s, 1),
                                               "load_ms": load_ms, "loadavg_before": round(load_before, 2),
                                               "loadavg_after": round(os.getloadavg()[0], 2), "items": items}, indent=1))


if __name__ == "__main__":
    main()
