"""bench/peers.py without Pipecat: its help, its one-line stop when bench/.venv-pipecat is missing, and the ratio it
prints (the real comparison needs `make bench-peers-env` and minutes of real-time audio: it is the benchmark's to run)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "peers.py"


def bench():
    spec = importlib.util.spec_from_file_location("bench_peers", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_help_exits_0_and_says_how_to_set_up():
    out = subprocess.run([sys.executable, str(BENCH), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "make bench-peers-env" in out.stdout and "--wavs" in out.stdout and "--json" in out.stdout


def test_missing_pipecat_venv_stops_with_the_make_target(tmp_path, monkeypatch):
    mod = bench()
    monkeypatch.setattr(mod, "PIPECAT_VENV", mod.ROOT / "bench" / f"no-such-venv-{tmp_path.name}")
    monkeypatch.setattr(sys, "argv", ["peers.py"])
    with pytest.raises(SystemExit) as e:
        mod.main()
    assert "run make bench-peers-env" in str(e.value)


def test_report_prints_both_distributions_and_their_ratio(capsys):
    mod = bench()
    turns = lambda vs: [{"v2v_ms": v} for v in vs]  # noqa: E731
    results = {"pipecat": {"turns": turns([1000.0, 2000.0, None]), "files": 3},
               "wafervox": {"turns": turns([400.0, 500.0, 600.0]), "files": 3}}
    out = mod.report(results, 500.0)
    s = out["summary"]
    assert s["pipecat"]["turns"] == 2 and s["pipecat"]["within_budget"] == 0
    assert s["wafervox"]["turns"] == 3 and s["wafervox"]["within_budget"] == 2 and s["wafervox"]["max_ms"] == 600.0
    r = out["ratio_pipecat_over_wafervox"]
    assert r["p50"] == pytest.approx(s["pipecat"]["p50_ms"] / s["wafervox"]["p50_ms"], abs=0.01)
    assert r["p95"] == pytest.approx(s["pipecat"]["p95_ms"] / s["wafervox"]["p95_ms"], abs=0.01)
    text = capsys.readouterr().out
    assert "pipecat / wafervox: p50" in text and "within" in text
