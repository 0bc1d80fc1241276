"""bench/capacity.py: its search over session counts, and one real run against ``wafervox serve`` (behaviour only: the
steps it took, every turn answered, the figures it wrote; the capacity on the machine is the benchmark's to report)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "capacity.py"


def bench():
    sys.path.insert(0, str(BENCH.parent))
    spec = importlib.util.spec_from_file_location("bench_capacity", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("true_capacity, hi, tried", [
    (0, 16, [1]),
    (1, 16, [1, 2]),
    (5, 16, [1, 2, 4, 8, 6, 5]),
    (7, 16, [1, 2, 4, 8, 6, 7]),
    (16, 16, [1, 2, 4, 8, 16]),
    (12, 12, [1, 2, 4, 8, 12]),
    (11, 12, [1, 2, 4, 8, 12, 10, 11]),
])
def test_the_search_doubles_then_bisects(true_capacity, hi, tried):
    got, order = bench().search(lambda n: n <= true_capacity, hi)
    assert (got, order) == (true_capacity, tried)


@pytest.mark.engines
def test_a_real_run_over_the_server(tmp_path):
    out = tmp_path / "capacity.json"
    wav = ROOT / "samples" / "morning_01_open_tomorrow.wav"
    # a bar no turn can miss: both steps pass, so the search goes 1, 2 and stops at --max
    p = subprocess.run([sys.executable, str(BENCH), "--max", "2", "--p95-ms", "100000", "--spread-s", "1", "--wavs", str(wav),
                        "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "capacity: 2 concurrent session(s)" in p.stdout
    r = json.loads(out.read_text())
    assert r["capacity"] == 2 and r["tried"] == [1, 2]
    for step in r["steps"]:
        assert step["pass"] and len(step["per_session"]) == step["sessions"]
        assert step["overall"]["answered"] == step["expected_turns"] == step["sessions"]
        assert all(0 <= s["offset_s"] < 1 for s in step["per_session"])
        assert all(t["latency_ms"]["voice_to_voice_ms"] > 0 for t in step["per_turn"])
    bad = subprocess.run([sys.executable, str(BENCH), "--wavs", str(tmp_path / "missing.wav")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode != 0 and "no such file" in bad.stderr
