"""Phone calls: the sample conversations over ``/v1/twilio/stream`` as 8 kHz mu-law, and the telephone band's effect
on transcripts and endpointing.

    .venv/bin/python bench/phone.py [--calls] [--band] [--conversations morning visit noisy] [--json]

``--calls`` (default with ``--band``: both) starts ``wafervox serve`` on loopback and places one call per
conversation with ``Phone``, a caller's side of Twilio's Media Streams as Twilio documents it: the recordings
resampled to 8 kHz and mu-law coded, sent in 20 ms ``media`` messages at real-time pace; the answer's ``media`` played
at real-time pace from a queue; a ``mark`` echoed only once the audio before it would have played (or at once when
``clear`` drops it); each turn's next recording sent once the answer has played out.  Voice-to-voice on the call's
clock: the caller's input samples sent from the utterance's last voiced sample to the first sample of the answer
playing.  Then the barge-in recording: how soon after the interruption's first voiced sample ``clear`` came.

``--band`` runs the voice loop on the virtual clock over each recording: wideband (16 kHz), through the phone (8 kHz
mu-law) fed at 8 kHz, and widened to 16 kHz as the server feeds 8 kHz input (``voice.g711.BandWidener``): word error
against the manifest's text, and ``endpoint_ms`` p50.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from voice import g711  # noqa: E402

RATE, FRAME = 8000, 160


def phone_pcm(path: Path) -> np.ndarray:
    """A recording as the phone line carries it: 8 kHz, through mu-law and back (int16)."""
    from voice.audio import read_wav, resample

    x, src = read_wav(path)
    return g711.mulaw_decode(g711.mulaw_encode(resample(x, src, RATE)))


class Phone:
    """The caller's side of a Media Stream (what Twilio does), on an open websocket ``ws``."""

    def __init__(self, ws, stream_sid: str = "MZ00000000000000000000000000000001", call_sid: str = "CA0000000000000000000000001",
                 parameters: dict | None = None):
        self.ws, self.stream_sid, self.call_sid, self.parameters = ws, stream_sid, call_sid, parameters or {}
        self.sent = 0  # input samples sent (the call's clock, in 8 kHz samples)
        self.queue: deque = deque()  # ("audio", bytes) and ("mark", name), as the server sent them
        self.onsets: list[int] = []  # where (input samples) an answer's audio started playing after silence
        self.clears: list[int] = []  # where each clear arrived
        self.marks_echoed = 0
        self.frames_played = 0
        self.received: list[dict] = []  # every message from the server
        self._playing = False
        self._seq = 0
        self._source = np.zeros(0, np.uint8)  # mu-law bytes still to send
        self.closed = False

    def _msg(self, event: str, **body) -> str:
        self._seq += 1
        return json.dumps({"event": event, "sequenceNumber": str(self._seq), "streamSid": self.stream_sid, **body})

    async def start(self) -> None:
        await self.ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        await self.ws.send(self._msg("start", start={
            "streamSid": self.stream_sid, "accountSid": "AC0000000000000000000000000000001", "callSid": self.call_sid,
            "tracks": ["inbound"], "customParameters": self.parameters,
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": RATE, "channels": 1}}))

    def say(self, pcm: np.ndarray) -> None:
        """Queue 8 kHz PCM16 for the caller to speak (after what is queued)."""
        self._source = np.concatenate([self._source, np.frombuffer(g711.mulaw_encode(pcm), np.uint8)])

    @property
    def speaking(self) -> bool:
        return len(self._source) > 0

    @property
    def playing(self) -> bool:
        return any(kind == "audio" for kind, _ in self.queue)

    async def dtmf(self, digit: str) -> None:
        await self.ws.send(self._msg("dtmf", dtmf={"track": "inbound_track", "digit": digit}))

    async def stop(self) -> None:
        await self.ws.send(self._msg("stop", stop={"accountSid": "AC0000000000000000000000000000001", "callSid": self.call_sid}))

    async def receive(self) -> None:
        """Read the server's messages until the socket closes."""
        try:
            async for text in self.ws:
                msg = json.loads(text)
                self.received.append(msg)
                kind = msg.get("event")
                if kind == "media":
                    self.queue.append(("audio", base64.b64decode(msg["media"]["payload"])))
                elif kind == "mark":
                    self.queue.append(("mark", msg["mark"]["name"]))
                elif kind == "clear":
                    self.clears.append(self.sent)
                    names = [name for kind, name in self.queue if kind == "mark"]
                    self.queue.clear()
                    for name in names:  # Twilio answers the marks of cleared audio at once
                        await self._echo(name)
        except Exception:
            pass
        finally:
            self.closed = True

    async def _echo(self, name: str) -> None:
        self.marks_echoed += 1
        await self.ws.send(self._msg("mark", mark={"name": name}))

    async def tick(self) -> None:
        """20 ms of the call: one inbound frame sent, 20 ms of the answer played, the marks it reached echoed."""
        frame, self._source = self._source[:FRAME], self._source[FRAME:]
        frame = frame.tobytes() + bytes([g711.MULAW_SILENCE]) * (FRAME - len(frame))
        ts = self.sent * 1000 // RATE
        await self.ws.send(self._msg("media", media={"track": "inbound", "chunk": str(self._seq), "timestamp": str(ts),
                                                     "payload": base64.b64encode(frame).decode()}))
        # playback: marks before any audio are reached now; then up to 160 samples of audio
        want, played = FRAME, False
        while self.queue:
            kind, item = self.queue[0]
            if kind == "mark":
                self.queue.popleft()
                await self._echo(item)
                continue
            if want == 0:
                break
            take = item[:want]
            if len(take) == len(item):
                self.queue.popleft()
            else:
                self.queue[0] = ("audio", item[len(take):])
            want -= len(take)
            played = True
        if played and not self._playing:
            self.onsets.append(self.sent)
        self._playing = played
        if played:
            self.frames_played += 1
        self.sent += FRAME

    async def run_for(self, seconds: float) -> None:
        await self.run_until(lambda: False, seconds)

    async def run_until(self, done, timeout_s: float) -> bool:
        """Tick at real-time pace until ``done()`` or ``timeout_s``; True when done."""
        loop = asyncio.get_running_loop()
        t0, n = loop.time(), 0
        while loop.time() - t0 < timeout_s and not self.closed:
            if done():
                return True
            await self.tick()
            n += 1
            delay = t0 + n * FRAME / RATE - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        return done()


async def call(url: str, turns: list[tuple[np.ndarray, float]], *, answer_timeout_s: float = 25.0, settle_s: float = 1.0,
               parameters: dict | None = None, headers: dict | None = None) -> dict:
    """One call: each turn's 8 kHz PCM spoken, then its answer waited for and played out.  ``turns``: (pcm, last voiced
    sample's offset in it, s).  Returns the per-turn voice-to-voice on the call's clock (ms, None when unanswered)."""
    import websockets

    async with websockets.connect(url, additional_headers=headers or {}, max_size=None) as ws:
        phone = Phone(ws, parameters=parameters)
        reader = asyncio.create_task(phone.receive())
        await phone.start()
        await phone.run_for(0.5)
        v2v: list[float | None] = []
        for pcm, voiced_end_s in turns:
            start = phone.sent
            phone.say(pcm)
            last_voiced = start + int(voiced_end_s * RATE)
            await phone.run_until(lambda: not phone.speaking, len(pcm) / RATE + 5)
            answered = await phone.run_until(lambda at=last_voiced: any(o >= at for o in phone.onsets), answer_timeout_s)
            onset = next((o for o in phone.onsets if o >= last_voiced), None)
            v2v.append(None if not answered or onset is None else (onset - last_voiced) * 1000 / RATE)
            await phone.run_until(_played_out(phone, settle_s), 60)
        await phone.stop()
        await asyncio.sleep(0.2)
        reader.cancel()
        return {"voice_to_voice_ms": v2v, "clears": phone.clears, "marks_echoed": phone.marks_echoed,
                "frames_played": phone.frames_played}


async def barge_in_call(url: str, headers: dict | None = None, timeout_s: float = 60.0) -> dict:
    """The barge-in recording as the caller: its question, then (0.8 s into the answer's playback) its interruption
    spoken over the answer.  Returns where the interruption's first voiced sample was and when ``clear`` came."""
    import websockets

    from voice.replay import SAMPLES, manifest

    b = manifest()["barge_in"]
    pcm = phone_pcm(SAMPLES / b["file"])
    question, interruption = b["turns"]
    lead = int(0.2 * RATE)
    asked = pcm[:int(question["speech_end_s"] * RATE) + int(0.3 * RATE)]
    interrupting = pcm[int(interruption["speech_start_s"] * RATE) - lead:]
    async with websockets.connect(url, additional_headers=headers or {}, max_size=None) as ws:
        phone = Phone(ws)
        reader = asyncio.create_task(phone.receive())
        await phone.start()
        await phone.run_for(0.3)
        phone.say(asked)
        await phone.run_until(lambda: bool(phone.onsets), timeout_s)
        await phone.run_for(0.8)  # the answer plays a while
        said_at = phone.sent + lead  # the interruption's first voiced sample (0.2 s of lead kept)
        phone.say(interrupting)
        await phone.run_until(lambda: bool(phone.clears), 10)
        await phone.run_for(0.5)
        await phone.stop()
        reader.cancel()
        return {"speech_at": said_at, "clears": phone.clears,
                "clear_after_ms": (phone.clears[0] - said_at) * 1000 / RATE if phone.clears else None,
                "played_after_clear": phone.playing}


def _played_out(phone: Phone, settle_s: float):
    """A test: the answer has played out (nothing played for ``settle_s``)."""
    quiet_since = [phone.sent]

    def done() -> bool:
        if phone.playing:
            quiet_since[0] = phone.sent
        return phone.sent - quiet_since[0] >= settle_s * RATE

    return done


def conversation_turns(name: str) -> list[tuple[np.ndarray, float]]:
    from voice.replay import SAMPLES, manifest

    m = manifest()
    return [(phone_pcm(SAMPLES / f), m["turns"][f]["speech_end_s"]) for f in m["conversations"][name]]


# --------------------------------------------------------------------------- the telephone band, offline


def band(names: list[str]) -> dict:
    """Each conversation through the voice loop on the virtual clock, wideband (16 kHz), then through the phone (8 kHz
    mu-law) fed at 8 kHz, then widened as the server feeds it (``voice.g711.BandWidener``): word error against the
    manifest's text, and endpoint_ms, over all turns."""
    from voice.audio import BufferSink, chunks, read_wav, resample
    from voice.clock import VirtualClock
    from voice.engines import load_engines
    from voice.loop import LoopConfig, VoiceLoop, run_stream
    from voice.replay import SAMPLES, manifest, word_error_rate

    m = manifest()
    engines, _ = load_engines()
    out = {}
    for label in ("wideband", "phone", "phone_widened"):
        errors, words, endpoint, transcripts = 0.0, 0, [], []
        for name in names:
            loop = VoiceLoop(engines, BufferSink(engines.tts.sample_rate), VirtualClock(), LoopConfig())
            refs = []
            for f in m["conversations"][name]:
                x, src = read_wav(SAMPLES / f)
                if label == "wideband":
                    pcm, rate = resample(x, src, 16000), 16000
                else:  # through the phone: as it was fed before (8 kHz), and as the server feeds it (widened to 16 kHz)
                    pcm, rate = g711.mulaw_decode(g711.mulaw_encode(resample(x, src, RATE))), RATE
                    if label == "phone_widened":
                        widen = g711.BandWidener()
                        pcm, rate = np.concatenate([widen(pcm[i:i + FRAME]) for i in range(0, len(pcm), FRAME)]), 2 * RATE
                refs.append(m["turns"][f]["text"])
                run_stream(loop, chunks(pcm, rate, 20))
            loop.finish()
            for ref, rep in zip(refs, loop.reports):
                n = len(ref.split())
                errors += word_error_rate(ref, rep.transcript) * n
                words += n
                transcripts.append(rep.transcript)
                ms = rep.to_dict()["latency_ms"].get("endpoint_ms")
                if ms is not None:
                    endpoint.append(ms)
        out[label] = {"wer": errors / max(1, words), "endpoint_p50_ms": statistics.median(endpoint) if endpoint else None,
                      "turns": len(endpoint), "transcripts": transcripts}
    return out


def q(values: list[float], p: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p * (len(v) - 1))))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", action="store_true", help="the calls over the phone route (default: both)")
    ap.add_argument("--band", action="store_true", help="the telephone band against wideband, offline (default: both)")
    ap.add_argument("--conversations", nargs="+", default=["morning", "visit", "noisy"])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    both = not (args.calls or args.band)
    result: dict = {}
    if args.calls or both:
        from _serve import start_server, stop_server

        proc, port = start_server([])
        try:
            url = f"ws://127.0.0.1:{port}/v1/twilio/stream"
            v2v, unanswered = [], 0
            for name in args.conversations:
                t = time.monotonic()
                r = asyncio.run(call(url, conversation_turns(name)))
                got = [x for x in r["voice_to_voice_ms"] if x is not None]
                unanswered += len(r["voice_to_voice_ms"]) - len(got)
                v2v += got
                if not args.json:
                    print(f"{name}: voice-to-voice on the call's clock {[round(x) for x in got]} ms, "
                          f"{len(r['voice_to_voice_ms']) - len(got)} unanswered ({time.monotonic() - t:.0f} s)")
            b = asyncio.run(barge_in_call(url))
            # the same conversations over /v1/realtime (24 kHz PCM, `wafervox client`, its own clock): the wideband peer
            from _serve import conversations, replay_sessions

            files = dict(conversations())
            wide = []
            for name in args.conversations:
                turns = asyncio.run(replay_sessions(f"ws://127.0.0.1:{port}/v1/realtime", [(0.0, name, files[name])], 500.0, quiet=True))
                wide += [t["latency_ms"]["voice_to_voice_ms"] for t in turns if t["latency_ms"]["voice_to_voice_ms"] is not None]
            result["calls"] = {"turns": len(v2v) + unanswered, "answered": len(v2v), "v2v_p50_ms": q(v2v, 0.5) if v2v else None,
                               "v2v_p95_ms": q(v2v, 0.95) if v2v else None, "barge_in_clear_after_ms": b["clear_after_ms"],
                               "realtime_v2v_p50_ms": q(wide, 0.5) if wide else None,
                               "realtime_v2v_p95_ms": q(wide, 0.95) if wide else None, "realtime_turns": len(wide)}
        finally:
            stop_server(proc)
    if args.band or both:
        result["band"] = band(args.conversations)
    if args.json:
        print(json.dumps(result))
        return 0
    if "calls" in result:
        c = result["calls"]
        print(f"phone route, 8 kHz mu-law: {c['answered']} / {c['turns']} turns answered; voice-to-voice on the call's clock "
              f"p50 {c['v2v_p50_ms']:.0f} / p95 {c['v2v_p95_ms']:.0f} ms (bar p50 <= 400); barge-in: clear "
              f"{c['barge_in_clear_after_ms']} ms after the interruption's first voiced sample")
        if c["realtime_v2v_p50_ms"] is not None:
            print(f"  the same conversations over /v1/realtime (24 kHz PCM, wafervox client's clock, same server): "
                  f"{c['realtime_turns']} turns, voice-to-voice p50 {c['realtime_v2v_p50_ms']:.0f} / p95 {c['realtime_v2v_p95_ms']:.0f} ms")
    if "band" in result:
        w = result["band"]["wideband"]
        for label in ("phone", "phone_widened"):
            p = result["band"][label]
            ratio = p["wer"] / w["wer"] if w["wer"] else float("inf") if p["wer"] else 1.0
            print(f"telephone band ({label}): word error {p['wer']:.3f} vs wideband {w['wer']:.3f} ({ratio:.2f}x, bar 1.5x); "
                  f"endpoint p50 {p['endpoint_p50_ms']:.0f} vs {w['endpoint_p50_ms']:.0f} ms "
                  f"({p['endpoint_p50_ms'] - w['endpoint_p50_ms']:+.0f}, bar 50)")
            if label == "phone_widened":
                print(f"  {[t for t, r in zip(p['transcripts'], w['transcripts']) if t != r]} (where the wideband differs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
