"""Echo cancellation (``voice.aec``) measured: echo return loss enhancement (ERLE, dB) with and without double talk,
the delay estimate's error, and with ``--loop`` the speakerphone through the real voice loop (self-interruptions with
and without the canceller, the stop time of a real interruption).

The scene (``voice.speakerphone``): the agent's voice (the sample recordings, played at 22,050 Hz as piper's are) comes
back into the microphone through a synthetic room (an exponentially decaying impulse response, RT60 ``--rt60``), a
delay and a gain (echo at ``--level-db`` of the played level, -6 dB by default), on top of the microphone's noise
(-60 dBFS) and, for double talk, the user's voice (another recording) for 3 s in the middle.

ERLE = 10 log10(echo power / residual echo power) after the first ``--settle`` seconds, where the residual echo is the
output less the user's voice passed through the same gains (the canceller's probe), so double talk is measured too.
"linear" is the adaptive filter's own output (before the suppressor), "total" the canceller's output.  Near-end loss: how
much of the user's voice the canceller takes away during double talk.

    .venv/bin/python bench/echo.py                 # ERLE and delay error over three delays
    .venv/bin/python bench/echo.py --loop          # and the loop on the sample conversations (loads the engines)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _report import write_json  # noqa: E402

from voice.aec import BLOCK, EchoCanceller, EchoReference  # noqa: E402
from voice.audio import read_wav, resample  # noqa: E402
from voice.protocols import ASR_RATE  # noqa: E402
from voice.replay import SAMPLES, manifest  # noqa: E402
from voice.speakerphone import Room, Say, room_impulse_response, run_scene  # noqa: E402

FAR = ("morning_01_open_tomorrow.wav", "morning_02_located.wav", "morning_03_croissant_cost.wav", "morning_04_owner.wav",
       "visit_01_address.wav", "visit_02_croissant_price.wav")
NEAR = ("visit_03_bakery_open.wav", "visit_04_owns_bakery.wav")
RATE = 22050  # the played side's rate (piper's)


def _load(names, rate) -> np.ndarray:
    return np.concatenate([resample(*read_wav(SAMPLES / n), rate) for n in names])


def _db(a: np.ndarray, b: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(a.astype(np.float64) ** 2) / max(np.sum(b.astype(np.float64) ** 2), 1e-20)))


def measure(delay_s: float, double_talk: bool, *, rt60: float, level_db: float, settle_s: float) -> dict:
    far = _load(FAR, RATE)
    room = Room(RATE, delay_s=delay_s, level_db=level_db, rir=room_impulse_response(rt60))
    ref = EchoReference(RATE)
    start = 0.2
    room.play(start, far)
    ref.play(start, far)
    n = int((start + len(far) / RATE + 0.5) * ASR_RATE)
    echo = room.echo(0, n)
    near = np.zeros(n, np.float32)
    talk = slice(0, 0)
    if double_talk:
        v = _load(NEAR, ASR_RATE).astype(np.float32) / 32768
        a = n // 2 - int(1.5 * ASR_RATE)
        talk = slice(a, a + 3 * ASR_RATE)
        near[talk] = v[int(0.3 * ASR_RATE):int(0.3 * ASR_RATE) + 3 * ASR_RATE]
    mic = echo + near + 10 ** (-60 / 20) * np.random.default_rng(0).standard_normal(n).astype(np.float32)
    c = EchoCanceller(ref)
    c.linear = []  # the adaptive filter's own output (before the suppressor), for its ERLE
    out, kept = np.zeros(n, np.float32), np.zeros(n, np.float32)
    t0 = time.perf_counter()
    for k in range(0, n, 320):
        out[k:k + 320], kept[k:k + 320] = c.process(mic[k:k + 320], k, probe=near[k:k + 320])
    cpu = time.perf_counter() - t0
    lag = BLOCK
    residual = (out - kept)[lag:]
    e = echo[:n - lag]
    late = slice(int(settle_s * ASR_RATE), n - lag)
    first = slice(0, int(settle_s * ASR_RATE))
    lin = np.concatenate(c.linear)
    lin_res = lin - near[:len(lin)]  # (the filter is linear: its residual echo is its output less the user's voice)
    lin_echo = echo[:len(lin)]
    fig = {"delay_ms": delay_s * 1000, "double_talk": double_talk,
           "erle_linear_db": round(_db(lin_echo[late], lin_res[late]), 1),
           "erle_db": round(_db(e[late], residual[late]), 1),
           "erle_linear_first_s_db": round(_db(lin_echo[first], lin_res[first]), 1),
           "erle_first_s_db": round(_db(e[first], residual[first]), 1),
           "delay_estimate_ms": round(c.delay / ASR_RATE * 1000, 2),
           "delay_error_ms": round(abs(c.delay - delay_s * ASR_RATE) / ASR_RATE * 1000, 2),
           "first_estimate_s": round(c.delays[0][0] / ASR_RATE, 2) if c.delays else None,
           "cpu_per_audio_s": round(cpu / (n / ASR_RATE), 4)}
    if double_talk:
        d = slice(talk.start, talk.stop)
        fig["erle_linear_during_double_talk_db"] = round(_db(lin_echo[d], lin_res[d]), 1)
        fig["erle_during_double_talk_db"] = round(_db(e[d], residual[d]), 1)
        fig["near_end_loss_db"] = round(_db(near[:n - lag][d], kept[lag:][d]), 2)
    return fig


def loop_figures(rt60: float, level_db: float) -> dict:
    """The speakerphone through the real loop: self-interruptions over the sample conversations with and without the
    canceller, and how soon a real interruption over the agent's voice stops it."""
    from voice.engines import load_engines

    engines, _ = load_engines()
    m = manifest()
    rooms = {"morning": 0.04, "visit": 0.09, "noisy": 0.22}
    fig = {"conversations": {}}
    for aec in (True, False):
        for name, delay in rooms.items():
            engines.llm.reset()
            says = [Say.file(SAMPLES / f) for f in m["conversations"][name]]
            scene = run_scene(engines, says, aec=aec, delay_s=delay, level_db=level_db, rir=room_impulse_response(rt60),
                              max_s=120.0 if aec else 20.0)
            fig["conversations"][f"{name}{'' if aec else ' (no aec)'}"] = {
                "turns": len(scene.loop.reports), "questions": len(says), "self_interruptions": len(scene.loop.barge_ins),
                "questions_said": sum(s.started_s is not None for s in says)}
            if not aec:
                break  # one is enough to show it (the agent then talks to itself until the time runs out)
    b = m["barge_in"]
    pcm, rate = read_wav(SAMPLES / b["file"])
    pcm = resample(pcm, rate, ASR_RATE)
    second = b["turns"][1]
    stops = []
    for question in ("morning_02_located.wav", "visit_01_address.wav", "morning_01_open_tomorrow.wav"):
        engines.llm.reset()
        cut = int((second["speech_start_s"] - 0.3) * ASR_RATE)
        says = [Say.file(SAMPLES / question), Say(pcm[cut:], barge_after_s=0.5, speech_start_s=0.3)]
        scene = run_scene(engines, says, aec=True, delay_s=0.09, level_db=level_db, rir=room_impulse_response(rt60))
        speech = says[1].started_s + says[1].speech_start_s
        after = [t for t in scene.room.clears if t >= speech - 0.05]
        playing = any(a <= speech < b for a, b in scene.room.plays)
        stops.append(round((after[0] - speech) * 1000) if after else None if playing else "answer over first")
    fig["interruption_stop_ms"] = stops
    return fig


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delays", default="40,90,220", help="delays between play and capture, ms (default 40,90,220)")
    ap.add_argument("--rt60", type=float, default=0.25, help="the room's reverberation time, s (default 0.25)")
    ap.add_argument("--level-db", type=float, default=-6.0, help="the echo's level against the played level (default -6)")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds left out at the start (convergence; default 3)")
    ap.add_argument("--loop", action="store_true", help="also the speakerphone through the real loop (loads the engines)")
    ap.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    args = ap.parse_args()
    rows = []
    print(f"room: RT60 {args.rt60:.2f} s, echo {args.level_db:+.0f} dB, noise -60 dBFS; ERLE after {args.settle:.0f} s "
          f"(and in the first {args.settle:.0f} s)")
    print(f"{'delay':>6} {'talk':>7} {'ERLE linear':>12} {'total':>7} {'first 3 s':>14} {'during DT':>14} {'near loss':>9} "
          f"{'delay est':>9} {'error':>7} {'found at':>8} {'cpu':>6}")
    for delay in (float(d) / 1000 for d in args.delays.split(",")):
        for dt in (False, True):
            f = measure(delay, dt, rt60=args.rt60, level_db=args.level_db, settle_s=args.settle)
            rows.append(f)
            during = f"{f['erle_linear_during_double_talk_db']:>5.1f}/{f['erle_during_double_talk_db']:.1f}dB" if dt else "-"
            print(f"{f['delay_ms']:>4.0f}ms {'double' if dt else 'single':>7} {f['erle_linear_db']:>10.1f}dB {f['erle_db']:>5.1f}dB "
                  f"{f['erle_linear_first_s_db']:>6.1f}/{f['erle_first_s_db']:.1f}dB {during:>14} "
                  f"{(str(f.get('near_end_loss_db')) + 'dB') if dt else '-':>9} {f['delay_estimate_ms']:>7.2f}ms "
                  f"{f['delay_error_ms']:>5.2f}ms {f['first_estimate_s'] or '-':>7}s {f['cpu_per_audio_s'] * 100:>5.1f}%",
                  flush=True)
    figures = {"rows": rows}
    if args.loop:
        loop = loop_figures(args.rt60, args.level_db)
        figures["loop"] = loop
        for name, c in loop["conversations"].items():
            print(f"loop {name}: {c['turns']} turns for {c['questions_said']} of {c['questions']} questions said, "
                  f"{c['self_interruptions']} self-interruptions")
        print(f"a real interruption over the agent's voice stopped it after {loop['interruption_stop_ms']} ms (bar 300)")
    write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
