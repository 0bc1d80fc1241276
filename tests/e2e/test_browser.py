"""The browser demo page end to end: `wafervox serve` + headless Debian chromium (through Playwright)
with a fake microphone that plays a recorded user turn.  The page must connect, stream the microphone,
show the user's transcript and the agent's answer, and draw the latency waterfall for the turn, without
uncaught script errors.  A screenshot is kept (tmp_path/demo.png, and $WAFERVOX_ARTIFACTS if set).

Skipped when /usr/bin/chromium or the playwright module is missing (never `playwright install`:
DESIGN.md, "Tests and benchmarks").  Loopback only; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import struct
import subprocess
import sys
import threading
import time
import wave
from pathlib import Path

import numpy as np
import pytest
from kinds import BROWSER, ENGINES, NETWORK, kind

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"
CHROMIUM = Path("/usr/bin/chromium")
SERVER_CMD = [sys.executable, "-m", "server.cli", "serve", "--host", "127.0.0.1", "--port", "0"]
READY_TIMEOUT_S = 120   # the server loads and warms its models before it listens
PAGE_TIMEOUT_S = 90     # from page load to a drawn turn
FAKE_RATE = 48000
TRAIL_SILENCE_S = 6.0   # chromium loops the file: leave the agent time to answer before the question repeats

CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",  # ?autostart=1 has no click to unlock the AudioContext
    "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
]

# What the page must show before the screenshot: a drawn turn, a user line and a non-empty agent line.
READY_JS = """() => {
  const drawn = document.querySelector('#waterfall g.turn rect.stage');
  const user = [...document.querySelectorAll('#transcript p.user .text')].some(e => e.textContent.trim());
  const agent = [...document.querySelectorAll('#transcript p.agent .text')].some(e => e.textContent.trim());
  return !!(drawn && user && agent);
}"""

STATE_JS = """() => ({
  status: document.getElementById('status').textContent,
  turns: document.querySelectorAll('#waterfall g.turn').length,
  stages: [...document.querySelectorAll('#waterfall rect.stage')].map(r => r.dataset.stage),
  simulated: [...document.querySelectorAll('#waterfall path.simulated title')].map(t => t.textContent),
  simulatedCells: [...document.querySelectorAll('#turns td.sim')].map(td => td.textContent),
  user: [...document.querySelectorAll('#transcript p.user .text')].map(e => e.textContent),
  agent: [...document.querySelectorAll('#transcript p.agent .text')].map(e => e.textContent),
  inputSent: window.wafervox ? window.wafervox.inputSent : null,
  outputReceived: window.wafervox ? window.wafervox.outputReceived : null,
  audioState: window.wafervox && window.wafervox.ctx ? window.wafervox.ctx.state : null,
})"""


def fake_capture_wav(path: Path) -> Path:
    """The first turn of the "morning" conversation as mono PCM16 at 48 kHz with a long silent tail."""
    from scipy.signal import resample_poly

    manifest = json.loads((SAMPLES / "manifest.json").read_text())
    name = manifest["conversations"]["morning"][0]
    with wave.open(str(SAMPLES / name), "rb") as w:
        assert w.getsampwidth() == 2, f"{name}: expected PCM16"
        rate, channels = w.getframerate(), w.getnchannels()
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float64)
    if channels > 1:
        x = x.reshape(-1, channels).mean(axis=1)
    g = np.gcd(FAKE_RATE, rate)
    y = resample_poly(x, FAKE_RATE // g, rate // g)
    y = np.concatenate([y, np.zeros(int(TRAIL_SILENCE_S * FAKE_RATE))])
    pcm = np.clip(np.round(y), -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(FAKE_RATE)
        w.writeframes(pcm.tobytes())
    return path


def start_server(cmd: list[str], log_path: Path) -> tuple[subprocess.Popen, int, list[str]]:
    """Start the server; return it, its port (from `listening on http://HOST:PORT`) and its stdout lines
    (kept up to date by a reader thread, so that the pipe never fills).  stderr goes to ``log_path``."""
    log = open(log_path, "wb")  # noqa: SIM115 - closed with the process by stop_server
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    proc._wafervox_log = log  # type: ignore[attr-defined]
    lines: list[str] = []
    ready: queue.Queue[int] = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            m = re.search(r"listening on http://[^\s:]+:(\d+)", line)
            if m:
                ready.put(int(m.group(1)))

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            return proc, ready.get(timeout=0.5), lines
        except queue.Empty:
            if proc.poll() is not None:
                break
    stop_server(proc)
    tail = log_path.read_text(errors="replace")[-3000:]
    raise AssertionError(f"server did not report 'listening on http://...:PORT' within {READY_TIMEOUT_S} s "
                         f"(exit code {proc.returncode}); stdout: {lines[-20:]}\nstderr tail:\n{tail}")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
    log = getattr(proc, "_wafervox_log", None)
    if log is not None:
        log.close()


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def open_page(port: int, wav: Path, shot: Path, *, query: str = "", args: tuple[str, ...] = (), ready_js: str = READY_JS,
              states: tuple[str, ...] = (STATE_JS,), watch=None, timeout_s: float = PAGE_TIMEOUT_S) -> dict:
    """Open the demo page (``?autostart=1`` and ``query``) in chromium (``CHROMIUM_ARGS`` and ``args``) with the fake
    microphone playing ``wav``, wait until ``ready_js`` holds, take the screenshot.  ``watch(page)``, if given, hooks
    its own listeners before the page loads.  Returns whether it got ready, the page's state (every ``states``
    script's object, merged), its uncaught errors and its console errors."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    console: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                    args=[*CHROMIUM_ARGS, *args, f"--use-file-for-fake-audio-capture={wav}"])
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 900})  # a fresh, private profile
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
            if watch is not None:
                watch(page)
            page.goto(f"http://127.0.0.1:{port}/?autostart=1{query}", wait_until="load", timeout=30_000)
            try:
                page.wait_for_function(ready_js, timeout=timeout_s * 1000, polling=250)
                ready = True
            except PlaywrightError:
                ready = False
            state = {}
            for js in states:
                state |= page.evaluate(js)
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    return {"ready": ready, "state": state, "errors": errors, "console": console}


def run_page(port: int, wav: Path, shot: Path, *, timeout_s: float = PAGE_TIMEOUT_S) -> dict:
    """The demo page in its websocket mode until a turn is drawn: ``open_page``'s answer and the page's client
    events (``sent``)."""
    sent: list[dict] = []  # the page's client events, minus the audio payloads

    def on_frame(payload) -> None:
        if isinstance(payload, str):
            ev = json.loads(payload)
            ev.pop("audio", None)
            sent.append(ev)

    def watch(page) -> None:
        page.on("websocket", lambda ws: ws.on("framesent", on_frame))

    return open_page(port, wav, shot, watch=watch, timeout_s=timeout_s) | {"sent": sent}


def serve_page(tmp_path: Path, shot_name: str, run) -> tuple[dict, str]:
    """``wafervox serve`` on a free port, and ``run(port, wav, shot)`` on it (the page with the fake microphone playing
    the first "morning" turn); the screenshot ``tmp_path/shot_name`` is copied to ``$WAFERVOX_ARTIFACTS`` if set.
    Returns ``run``'s answer and what to show on a failure (the page's state and errors, the server's output)."""
    wav = fake_capture_wav(tmp_path / "fake_mic.wav")
    shot = tmp_path / shot_name
    proc, port, stdout = start_server(SERVER_CMD, tmp_path / "server.log")
    try:
        out = run(port, wav, shot)
    finally:
        stop_server(proc)

    artifacts = os.environ.get("WAFERVOX_ARTIFACTS")
    if artifacts and shot.exists():
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(artifacts) / shot_name)

    diag = (f"page state: {json.dumps(out['state'])}\npage errors: {out['errors']}\nconsole errors: {out['console'][-10:]}\n"
            f"server stdout: {stdout[-10:]}\nserver stderr tail:\n"
            f"{(tmp_path / 'server.log').read_text(errors='replace')[-2000:]}")
    return out, diag


@pytest.fixture(scope="module")
@kind(BROWSER, ENGINES, NETWORK)
def browser_available():
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium); the browser test needs Debian's chromium")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("the playwright module is missing (pip install playwright; never `playwright install`)")


def test_demo_page_answers_and_draws_waterfall(browser_available, tmp_path):
    out, diag = serve_page(tmp_path, "demo.png", run_page)
    shot, st = tmp_path / "demo.png", out["state"]
    assert out["ready"], f"no drawn turn with user and agent transcript within {PAGE_TIMEOUT_S} s\n{diag}"
    assert st["turns"] >= 1 and st["stages"], diag
    # every turn also shows what it would have taken on the simulated deployment (default: smollm2 on CS-3)
    assert st["simulated"] and all("smollm2-135m@wse3x1" in t for t in st["simulated"]), diag
    assert st["simulatedCells"] and "wse3x1" in st["simulatedCells"][0], diag
    assert any(u.strip() for u in st["user"]), diag
    assert any(a.strip() for a in st["agent"]), diag
    assert st["inputSent"] > FAKE_RATE, diag   # more than a second of microphone audio went up
    assert st["outputReceived"] > 0, diag
    assert not out["errors"], f"uncaught errors on the page: {out['errors']}\n{diag}"

    # The client side of the protocol: session.update first (input at the AudioContext's rate, output at
    # 24 kHz), then the microphone, and the moment the answer started playing (our extension event).
    sent = out["sent"]
    assert sent and sent[0]["type"] == "session.update", [e["type"] for e in sent[:5]]
    fmt = sent[0]["session"]["audio"]
    assert 8000 <= fmt["input"]["format"]["rate"] <= 48000 and fmt["output"]["format"]["rate"] == 24000, fmt
    assert any(e["type"] == "input_audio_buffer.append" for e in sent)
    played = [e for e in sent if e["type"] == "output_audio.played"]
    assert played, f"the page never reported the start of playback; sent: {sorted({e['type'] for e in sent})}"
    p = played[0]
    assert isinstance(p["sample"], int) and p["sample"] >= 0 and isinstance(p["input_sample"], int) and p["input_sample"] > 0, p
    assert p["response_id"] and p["item_id"], p

    w, h = png_size(shot)
    assert w >= 600 and h >= 400 and shot.stat().st_size > 10_000, f"screenshot {w}x{h}, {shot.stat().st_size} bytes"


OVERLAP_READY_JS = """() => !!window.wafervox && window.wafervox.overlaps.length > 0
  && [...document.querySelectorAll('#transcript p.agent .text')].some(e => e.textContent.trim())"""
OVERLAP_STATE_JS = """() => ({overlaps: window.wafervox.overlaps,
  interrupted: document.querySelectorAll('#transcript p.agent.interrupted').length,
  users: [...document.querySelectorAll('#transcript p.user .text')].map(e => e.textContent)})"""


def test_a_backchannel_over_the_answer_pauses_it_on_the_page_and_it_goes_on(browser_available, tmp_path):
    """The fake microphone asks, then says "uh-huh" (an espeak-ng voice of samples/overlap) two seconds after the
    question, over the answer: the page hears output_audio.paused and .resumed, its answer is not cut (no truncate, not
    marked interrupted) and the backchannel is no user turn."""
    from scipy.signal import resample_poly

    base = fake_capture_wav(tmp_path / "question.wav")
    with wave.open(str(base), "rb") as w:
        q = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    manifest = json.loads((SAMPLES / "manifest.json").read_text())
    end_s = manifest["turns"][manifest["conversations"]["morning"][0]]["speech_end_s"]
    with wave.open(str(SAMPLES / "overlap" / "uh_huh.wav"), "rb") as w:
        bc = resample_poly(np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float64), FAKE_RATE, w.getframerate())
    at = int((end_s + 2.0) * FAKE_RATE)
    mix = q.astype(np.float64)
    mix[at:at + len(bc)] += bc
    wav = tmp_path / "fake_mic.wav"
    with wave.open(str(wav), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(FAKE_RATE)
        w.writeframes(np.clip(np.round(mix), -32768, 32767).astype("<i2").tobytes())

    sent: list[dict] = []

    def watch(page) -> None:
        page.on("websocket", lambda ws: ws.on("framesent", lambda p: sent.append(json.loads(p)) if isinstance(p, str) else None))

    proc, port, stdout = start_server(SERVER_CMD, tmp_path / "server.log")
    try:
        out = open_page(port, wav, tmp_path / "overlap.png", ready_js=OVERLAP_READY_JS, states=(STATE_JS, OVERLAP_STATE_JS),
                        watch=watch)
    finally:
        stop_server(proc)
    st = out["state"]
    diag = f"page state: {json.dumps(st)}\nerrors: {out['errors']}\nserver stdout: {stdout[-10:]}"
    assert out["ready"], f"no output_audio.resumed within {PAGE_TIMEOUT_S} s\n{diag}"
    assert st["overlaps"][0]["kind"] in ("backchannel", "noise"), diag
    assert st["interrupted"] == 0 and not any(e["type"] == "conversation.item.truncate" for e in sent), diag
    assert len([u for u in st["users"] if u.strip()]) == 1, diag  # the question only: "uh-huh" made no turn
    assert not out["errors"], diag
