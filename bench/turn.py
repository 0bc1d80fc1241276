"""Voice-to-voice latency of the whole pipeline, replaying every sample conversation in real time.

    .venv/bin/python bench/turn.py [--fast] [--budget-ms 500] [--json FILE] [--llm URL | --vs-llama-server] [--busy N]

Each conversation of samples/manifest.json (the default one is a copy and is skipped)
plays at real-time pace through the default engines (webrtcvad, Whisper tiny.en, the
numba LLM, piper), exactly as ``wafervox run`` does, with the semantic end of turn
(``--turn-end silence`` for plain silence).  Prints p50/p95 of every stage and of
voice_to_voice_ms, the budget hit rate, and p50/p95 as ratios of the budget (the limit
this project holds itself to); then the critical path's own work (ASR, end-of-turn score,
ASR start to the answer's first audio) against its bars, and the end-of-turn rules fired.
``--busy N``: N other programs keep a core busy each during the replay (``python -c "while True: pass"`` at the
default priority, as a browser tab or a build would), started once the engines are loaded and stopped at the end.
The kernel path (``WAFERVOX_KERNELS``) and the compute threads are printed first.
``--vs-llama-server``: the same replay twice in one run, answered by the local decode core and
then by llama.cpp's OpenAI-compatible server on the same GGUF (``--llm``), side by side.

Bars (issue "turn-taking and the critical path"): voice-to-voice p50 <= 350 ms, p95 <= 450
ms, >= 11 of 12 within 500 ms; critical path p50 <= 200 ms, ASR <= 80, first phrase <= 60
after the transcript, TTS first audio <= 40.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def play_all(engines, config, fast: bool, wavs: list[str] | None = None) -> list:
    """Every sample conversation but the default one (or ``wavs``, as one conversation), through ``engines``; prints each
    turn; returns the reports."""
    from _serve import conversations

    from voice.replay import play_conversation

    reports = []
    for name, files in conversations(wavs):
        engines.llm.reset()
        reps, _ = play_conversation(engines, files, realtime=not fast, config=config)
        for r in reps:
            lat = r.latency_ms
            print(f"  {name:8s} turn {r.turn}: v2v {lat['voice_to_voice_ms'] or float('nan'):6.0f} ms  "
                  f"(endpoint {lat['endpoint_ms'] or 0:.0f}, asr {lat['asr_ms'] or 0:.0f}, "
                  f"1st phrase {lat['first_phrase_ms'] or 0:.0f}, tts {lat['tts_first_audio_ms'] or 0:.0f}; "
                  f"{(r.end_of_turn or {}).get('rule', '-')}, critical path {r.work_ms['critical_path_ms'] or float('nan'):.0f}) "
                  f"{r.mitigation:12s} {r.transcript!r} -> {r.reply!r}", flush=True)
        reports += reps
    return reports


def report(reports: list, budget_ms: float, fast: bool) -> dict:
    from voice.latency import STAGES, summarize

    s = summarize(reports)
    print(f"\n{len(reports)} turns, {'virtual clock' if fast else 'real time'}, budget {budget_ms:.0f} ms")
    print(f"{'stage':22s} {'p50 ms':>8s} {'p95 ms':>8s}")
    for stage in STAGES:
        p50, p95 = s[stage]["p50"], s[stage]["p95"]
        print(f"{stage:22s} {p50 if p50 is not None else float('nan'):8.0f} {p95 if p95 is not None else float('nan'):8.0f}")
    v = s["voice_to_voice_ms"]
    print(f"voice_to_voice p50 = {v['p50'] / budget_ms:.2f}x budget, p95 = {v['p95'] / budget_ms:.2f}x budget; "
          f"hit rate {s['budget_hit_rate']:.2f} ({s['within_budget']}/{s['turns']})")
    print(f"\n{'work':22s} {'p50 ms':>8s} {'p95 ms':>8s} {'bar p50':>8s}")
    for name, bar in (("asr_run_ms", 80), ("first_phrase_ms", 60), ("tts_first_audio_ms", 40), ("turn_end_score_ms", None),
                      ("critical_path_ms", 200)):
        p50, p95 = s[name]["p50"], s[name]["p95"]
        print(f"{name:22s} {p50 if p50 is not None else float('nan'):8.0f} {p95 if p95 is not None else float('nan'):8.0f} "
              f"{bar if bar else '-':>8}" + ("" if bar is None or p50 is None else f"   {p50 / bar:.2f}x bar"))
    print("end-of-turn rules: " + ", ".join(f"{k} {n}" for k, n in s["end_of_turn_rules"].items()))
    print("mitigations (turns): " + (", ".join(f"{k} {n}" for k, n in s["mitigations"].items()) or "none"))
    return s


class BusyNeighbours:
    """``n`` processes spinning on the CPU at the default priority, for as long as the ``with`` block lasts."""

    def __init__(self, n: int):
        self.n, self.procs = n, []

    def __enter__(self):
        import subprocess

        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.n)]
        if self.n:
            print(f"{self.n} busy process(es) beside the replay (pids {', '.join(str(p.pid) for p in self.procs)})", flush=True)
        return self

    def __exit__(self, *exc):
        for proc in self.procs:
            proc.kill()
            proc.wait(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fast", action="store_true", help="virtual clock instead of real-time pacing")
    ap.add_argument("--budget-ms", type=float, default=500.0)
    ap.add_argument("--json", metavar="FILE", help="also write the reports and the summary as JSON")
    ap.add_argument("--wavs", nargs="+", metavar="WAV", help="replay these recordings (one conversation, in this order) "
                    "instead of the sample conversations")
    ap.add_argument("--turn-end", choices=("semantic", "silence"), default="semantic",
                    help="semantic end of turn (default) or plain 400 ms silence")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--llm", metavar="URL", help="answer with this OpenAI-compatible backend instead of the local decode core")
    which.add_argument("--vs-llama-server", action="store_true",
                    help="one run, two passes: the local decode core, then llama.cpp's OpenAI-compatible server "
                         "(llama-cpp-python, started here on the same GGUF, 2 threads) as the --llm backend; "
                         "prints both and their ratio")
    ap.add_argument("--no-mitigation", action="store_true", help="never degrade a turn forecast late (voice.mitigation)")
    ap.add_argument("--busy", type=int, default=0, metavar="N", help="N busy processes beside the replay (default 0)")
    ap.add_argument("--asr-threads", type=int, default=None, metavar="N",
                    help="Whisper encoder's CTranslate2 threads while the cores are free (default: EngineOptions')")
    ap.add_argument("--priority", action="store_true",
                    help="raise this process to nice -10 first, as `wafervox serve` and `mic` do where allowed")
    args = ap.parse_args()
    if not 0 <= args.busy <= 16:
        ap.error("--busy takes 0 to 16 processes")

    from dataclasses import replace

    from decode import cpu, qint
    from voice.engines import EngineOptions, load_engines
    from voice.loop import LoopConfig
    from voice.openai_llm import Backend

    config = LoopConfig(budget_ms=args.budget_ms)
    if args.turn_end == "silence":
        config = LoopConfig(budget_ms=args.budget_ms, end_of_turn=None)
    if args.no_mitigation:
        config = replace(config, mitigation=None)

    if args.priority:
        print(cpu.raise_priority(), flush=True)
    opts = EngineOptions(backend=Backend(args.llm) if args.llm else None)
    if args.asr_threads:
        opts = replace(opts, asr_threads=args.asr_threads)
    engines, load_ms = load_engines(opts, progress=lambda m: print(m, flush=True))
    print(f"kernel path: {qint.select().name} (this CPU runs {', '.join(qint.available())}); {cpu.process_share().describe()}",
          flush=True)
    with BusyNeighbours(args.busy):
        turns, passes = run_passes(args, engines, config)
    if args.busy:
        print(f"compute team changes during the run: {cpu.process_share().changes}, others' cores at the end "
              f"{cpu.process_share().others:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": next(iter(passes.values())), "passes": passes, "busy": args.busy,
                                               "kernels": qint.select().name,
                                               "turns": {k: [r.to_dict() for r in v] for k, v in turns.items()},
                                               "load_ms": load_ms}, indent=1))


def run_passes(args, engines, config) -> tuple[dict, dict]:
    """The replay once (or twice with ``--vs-llama-server``): the turns and the summary of each pass, by name."""
    from dataclasses import replace

    from voice.openai_llm import Backend, OpenAIConversation

    turns, passes = {}, {}
    if args.vs_llama_server:
        import tempfile

        sys.path.append(str(ROOT / "tests"))
        import llama_server

        turns["local decode core"] = play_all(engines, config, args.fast, args.wavs)
        passes["local decode core"] = report(turns["local decode core"], args.budget_ms, args.fast)
        server = llama_server.start(log_dir=Path(tempfile.mkdtemp(prefix="wafervox-llama-")))
        try:
            remote = OpenAIConversation(Backend(server.base_url), persona=engines.llm.persona, max_tokens=engines.llm.max_tokens)
            remote.warmup()
            print(f"\nllama.cpp server ready in {server.startup_s:.1f} s at {server.base_url}", flush=True)
            turns["--llm llama.cpp server"] = play_all(replace(engines, llm=remote), config, args.fast, args.wavs)
        finally:
            server.stop()
        passes["--llm llama.cpp server"] = report(turns["--llm llama.cpp server"], args.budget_ms, args.fast)
        (a, sa), (b, sb) = passes.items()
        print(f"\n{'same run':26s} {'v2v p50':>8s} {'v2v p95':>8s} {'1st phrase p50':>15s} {'within':>7s}")
        for name, s in passes.items():
            print(f"{name:26s} {s['voice_to_voice_ms']['p50']:8.0f} {s['voice_to_voice_ms']['p95']:8.0f} "
                  f"{s['first_phrase_ms']['p50']:15.0f} {s['within_budget']:>4d}/{s['turns']}")
        print(f"v2v p50 ratio ({b} / {a}): {sb['voice_to_voice_ms']['p50'] / sa['voice_to_voice_ms']['p50']:.2f}x; "
              f"first phrase: {sb['first_phrase_ms']['p50'] / sa['first_phrase_ms']['p50']:.2f}x")
    else:
        turns["this run"] = play_all(engines, config, args.fast, args.wavs)
        passes["this run"] = report(turns["this run"], args.budget_ms, args.fast)
    return turns, passes


if __name__ == "__main__":
    main()
