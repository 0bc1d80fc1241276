"""Starting and stopping ``wafervox serve`` for the benchmarks that talk to it (a separate process, as in production,
on a free loopback port)."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
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
            # what it prints from now on is read and dropped: a full pipe would stop the server mid-turn
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, int(m.group(1))
    proc.kill()
    raise SystemExit(f"the server did not start within {timeout_s:.0f} s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


def conversations(wavs: list[str] | None = None) -> list[tuple[str, list[Path]]]:
    """The recordings sessions replay: the sample conversations (but ``default``, a copy of one), or ``wavs``, in that
    order, as one conversation (any WAV: the client resamples it)."""
    if wavs:
        missing = [w for w in wavs if not Path(w).is_file()]
        if missing:
            raise SystemExit(f"no such file: {', '.join(missing)}")
        return [("wavs", [Path(w) for w in wavs])]
    from voice.replay import SAMPLES, manifest

    return [(name, [SAMPLES / f for f in files]) for name, files in manifest()["conversations"].items() if name != "default"]


async def replay_sessions(url: str, plan: list[tuple[float, str, list[Path]]], budget_ms: float, label: str = "",
                          quiet: bool = False) -> list[dict]:
    """One ``wafervox client`` session per ``(start offset s, name, files)`` of ``plan``, all at once, each streaming its
    files in real time from its offset; every turn (the client's dict), tagged with its ``session`` and
    ``conversation``."""
    import asyncio

    from server.client import ClientOptions, run_client

    turns: list[dict] = []

    async def one(i: int, offset: float, name: str, files) -> None:
        await asyncio.sleep(offset)

        def on_turn(t: dict) -> None:
            t["session"], t["conversation"] = i, name
            turns.append(t)
            if not quiet:
                lat = t["latency_ms"]
                print(f"  [{label}] session {i} {name:8s} turn {t['turn']}: client {lat['voice_to_voice_ms'] or float('nan'):6.0f} ms, "
                      f"server {t['server_voice_to_voice_ms'] or float('nan'):6.0f} ms  {t['transcript']!r} -> {t['reply']!r}",
                      flush=True)

        await run_client(files, ClientOptions(url=url, tail_s=2.0, budget_ms=budget_ms), on_turn=on_turn)

    await asyncio.gather(*(one(i, *p) for i, p in enumerate(plan)))
    return turns
