"""The turn-taking bars on samples/turntaking/, through the whole pipeline: ``bench/turntaking.py --json`` in a
subprocess (virtual clock, the default engines and ``LoopConfig()``).

- Paused turns (one turn with a 400-800 ms silence inside): the loop cuts off at most ``CUTOFF_GUARD`` of them.
- Complete turns: ``endpoint_ms`` p50 is at most ``ENDPOINT_GUARD_MS``.

These are regression guards with one item's margin over what the loop measured on an idle machine (2-3 of 24 cut
off, p50 222-237 ms); the issue's bars (10 %, 250 ms) are the bench's, which prints them with a pass flag each
(BENCHMARKS.md). A loop that ends every turn on 400 ms of silence fails both guards (23/24 cut off, 420 ms).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engines

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "turntaking.py"
MANIFEST = json.loads((ROOT / "samples" / "turntaking" / "manifest.json").read_text())["items"]
#: About 45 s on an idle 2-core machine (engine load and 46 items). The limit leaves room for a busy one.
TIMEOUT_S = 300
CUTOFF_GUARD = 4 / 24
ENDPOINT_GUARD_MS = 300.0


@pytest.fixture(scope="module")
def turntaking_run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("turntaking") / "turntaking.json"
    load = os.getloadavg()[0]
    try:
        proc = subprocess.run([sys.executable, str(BENCH), "--json", str(out)], cwd=ROOT, capture_output=True,
                              text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        done = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        pytest.fail(f"bench/turntaking.py did not finish in {TIMEOUT_S} s (load average {load:.1f} at the start, "
                    f"{os.getloadavg()[0]:.1f} now, on {os.cpu_count()} cores: a competing process slows the decode "
                    f"core's threads many times over). Its output so far:\n{done[-2000:]}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(proc.stdout[-2500:])
    return json.loads(out.read_text())


def test_every_item_played(turntaking_run):
    items = turntaking_run["items"]
    assert [i["file"] for i in items] == [n for k in ("paused", "complete") for n, m in MANIFEST.items() if m["kind"] == k]
    assert turntaking_run["clock"] == "virtual"
    for i in items:
        assert i["turns"] >= 1 or i["kind"] == "paused", f"{i['file']}: no turn answered"


def test_paused_turns_are_not_cut_off(turntaking_run):
    s = turntaking_run["summary"]
    bar = s["bars"]["false_cutoff_rate"]
    cut = [i["file"] for i in turntaking_run["items"] if i["kind"] == "paused" and i["cut_off"]]
    print(f"issue bar: false cut-off rate {bar['value']:.2f} <= {bar['max']}: {'met' if bar['pass'] else 'not met'}")
    assert bar["value"] <= CUTOFF_GUARD + 1e-9, (f"false cut-off rate {bar['value']:.2f} > {CUTOFF_GUARD:.2f} "
                                                 f"({s['paused']['cut_off']}/{s['paused']['n']}: {cut})")


def test_complete_turns_end_quickly(turntaking_run):
    s = turntaking_run["summary"]
    bar = s["bars"]["complete_endpoint_p50_ms"]
    print(f"issue bar: complete endpoint p50 {bar['value']} ms <= {bar['max']}: {'met' if bar['pass'] else 'not met'}")
    assert bar["value"] <= ENDPOINT_GUARD_MS, (f"complete turns' endpoint_ms p50 {bar['value']} ms > {ENDPOINT_GUARD_MS} ms "
                         f"(p95 {s['complete']['endpoint_ms']['p95']} ms; by noise level {s['complete']['by_level']})")
