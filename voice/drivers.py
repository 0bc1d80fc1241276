"""The drivers of a voice loop: ``run_until`` works on it until a clock time, ``run_stream`` feeds it input chunks at
their audio time.  One driver for a file, the microphone demo and the server (``voice.loop``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from .audio import AudioChunk

if TYPE_CHECKING:
    from .loop import VoiceLoop


def run_until(loop: VoiceLoop, t: float, poll: Callable[[float], object] | None = None) -> None:
    """Work on ``loop``, one piece at a time, until its clock reaches ``t`` or it has no work left; then let the clock
    reach ``t``.

    Without ``poll`` (input that is due at known times: a file, silence) the clock is advanced to ``t`` (a virtual clock
    jumps, the real one sleeps), and the caller then feeds the input due at ``t``.

    A live driver (a microphone, a websocket) passes ``poll(timeout_s)``, which feeds the loop whatever input arrives
    within ``timeout_s`` and returns as soon as some did: it is called with 0 after each piece of work (input, and so a
    barge-in, is seen within one piece), then with the time left until ``t`` (the idle wait, which input cuts short;
    the clock is the caller's real one and is not advanced), and then ``loop.step()`` lets the loop see the time that
    passed (an acknowledgement due, an answer that finished playing) or start on the new input."""
    clock = loop.clock
    while clock.now() < t:
        if loop.has_work():
            loop.step()
            if poll is not None:
                poll(0.0)
            continue
        wake = loop.wake_at()  # a paced answer waiting for its simulated time
        if wake is None or wake >= t:
            break
        if poll is None:
            clock.advance_to(wake)
        else:
            poll(max(0.0, wake - clock.now()))
    if poll is None:
        clock.advance_to(t)
    else:
        poll(max(0.0, t - clock.now()))
        loop.step()


def run_stream(loop: VoiceLoop, chunks: Iterable[AudioChunk], drain: bool = True) -> None:
    """Drive ``loop`` with input chunks arriving at their audio time on ``loop.clock``:
    work fills the time between chunks; a chunk that arrives during work waits for it."""
    for chunk in chunks:
        run_until(loop, loop.input_time + len(chunk.pcm) / chunk.rate)
        loop.feed(chunk)
    if drain:
        loop.drain()
