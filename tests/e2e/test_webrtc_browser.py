"""The demo page's WebRTC mode end to end: `wafervox serve` + headless Debian chromium (through Playwright) with a fake
microphone playing a recorded user turn.  The page POSTs its SDP offer to /v1/realtime/calls, sends the microphone as
an Opus track, gets the events on the `oai-events` data channel and the answer on the inbound track; it must show the
user's transcript and the agent's answer, draw the turn, and time voice-to-voice on its own clock
(``window.wafervox.pageV2V``).  No websocket is opened.  ICE: loopback host candidates only (chromium's
--allow-loopback-in-peer-connection; the server, bound to 127.0.0.1, offers 127.0.0.1 alone); no STUN server.

Skipped when /usr/bin/chromium or the playwright module is missing.  Every wait is bounded.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_browser import (  # noqa: F401  (browser_available: the fixture, used by name)
    FAKE_RATE,
    PAGE_TIMEOUT_S,
    READY_JS,
    STATE_JS,
    browser_available,
    open_page,
    serve_page,
)

RTC_ARGS = ("--allow-loopback-in-peer-connection", "--disable-features=WebRtcHideLocalIpsWithMdns")
RTC_STATE_JS = """() => ({
  transport: window.wafervox ? window.wafervox.transport : null,
  pageV2V: window.wafervox ? window.wafervox.pageV2V : null,
  iceState: window.wafervox && window.wafervox.pc ? window.wafervox.pc.iceConnectionState : null,
  channel: window.wafervox && window.wafervox.dc ? window.wafervox.dc.readyState : null,
  clientCells: [...document.querySelectorAll('#turns td.num')].map(td => td.textContent),
})"""
READY_V2V_JS = f"() => ({READY_JS})() && window.wafervox.pageV2V.length > 0"


def run_rtc_page(port: int, wav: Path, shot: Path, *, timeout_s: float = PAGE_TIMEOUT_S) -> dict:
    """The demo page in its WebRTC mode until a turn is drawn and timed on the page's clock: ``open_page``'s answer,
    the websockets the page opened (``sockets``) and its POSTs (``posts``: URL and content type)."""
    sockets: list[str] = []
    posts: list[tuple[str, str | None]] = []

    def watch(page) -> None:
        page.on("websocket", lambda ws: sockets.append(ws.url))
        page.on("request", lambda r: posts.append((r.url, r.headers.get("content-type"))) if r.method == "POST" else None)

    out = open_page(port, wav, shot, query="&transport=webrtc", args=RTC_ARGS, ready_js=READY_V2V_JS,
                    states=(STATE_JS, RTC_STATE_JS), watch=watch, timeout_s=timeout_s)
    return out | {"sockets": sockets, "posts": posts}


@pytest.mark.usefixtures("browser_available")
def test_demo_page_webrtc_mode_answers_and_times_the_turn(tmp_path):
    out, diag = serve_page(tmp_path, "webrtc.png", run_rtc_page)
    st, diag = out["state"], f"POSTs: {out['posts']}\n{diag}"
    assert out["ready"], f"no drawn turn with transcripts and a page-clock voice-to-voice within {PAGE_TIMEOUT_S} s\n{diag}"
    assert st["transport"] == "webrtc", diag
    assert not out["sockets"], f"the WebRTC mode opened a websocket: {out['sockets']}"
    assert any(u.endswith("/v1/realtime/calls?extensions=1") and (t or "").startswith("application/sdp") for u, t in out["posts"]), diag
    assert st["iceState"] in ("connected", "completed") and st["channel"] == "open", diag
    assert any(u.strip() for u in st["user"]) and any(a.strip() for a in st["agent"]), diag
    assert st["turns"] >= 1 and st["stages"], diag
    assert st["inputSent"] > FAKE_RATE, diag  # more than a second of microphone went up while the call was open
    assert st["outputReceived"] > 0, diag  # the answer sounded on the inbound track
    v2v = st["pageV2V"][0]
    assert 0 < v2v < 10_000, diag  # the answer came after the question's last voiced sample, measured on the page's clock
    assert any("here" in c for c in st["clientCells"]), diag  # and the table shows it beside the server's figure
    assert not out["errors"], f"uncaught errors on the page: {out['errors']}\n{diag}"
    print(f"WebRTC voice-to-voice on the page's clock: {st['pageV2V']} ms")
