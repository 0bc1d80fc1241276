"""Starting and stopping ``wafervox serve`` for the benchmarks that talk to it (a separate process, as in production,
on a free loopback port)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def start_server(extra: list[str], timeout_s: float = 180) -> tuple[subprocess.Popen, int]:
    """``wafervox serve --port 0 EXTRA...``; returns the process and its port once it listens."""
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "serve", "--host", "127.0.0.1", "--port", "0", *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"the server exited (rc {proc.poll()}) before listening")
        m = re.match(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            return proc, int(m.group(1))
    proc.kill()
    raise SystemExit(f"the server did not start within {timeout_s:.0f} s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
