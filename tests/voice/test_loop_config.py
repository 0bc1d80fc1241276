"""The loop's settings and the mapping of a client's server_vad turn detection onto them."""

from __future__ import annotations

from voice.loop_config import MAX_PADDING_MS, MAX_STOP_MS, STOP_OVER_PAUSE_MS, LoopConfig


def test_server_vad_maps_onto_the_endpointer():
    base = LoopConfig()
    c = base.with_turn_detection(threshold=0.5, silence_duration_ms=600, prefix_padding_ms=300, interrupt_response=False)
    assert (c.endpointer.aggressiveness, c.endpointer.stop_ms, c.padding_ms, c.barge_in, c.turn_detection) == (2, 600, 300, False, True)
    assert c.endpointer.pause_ms == base.endpointer.pause_ms and c.budget_ms == base.budget_ms
    assert base.with_turn_detection(threshold=1.0, silence_duration_ms=0, prefix_padding_ms=0,
                                    interrupt_response=True).endpointer.aggressiveness == 3


def test_the_mapping_keeps_its_bounds():
    base = LoopConfig()
    short = base.with_turn_detection(threshold=0.0, silence_duration_ms=10, prefix_padding_ms=5000, interrupt_response=True)
    assert short.endpointer.stop_ms == base.endpointer.pause_ms + STOP_OVER_PAUSE_MS  # never below the speculative pause
    assert short.padding_ms == MAX_PADDING_MS and short.endpointer.aggressiveness == 0
    long = base.with_turn_detection(threshold=0.5, silence_duration_ms=60_000, prefix_padding_ms=0, interrupt_response=True)
    assert long.endpointer.stop_ms == MAX_STOP_MS
    assert base.manual().turn_detection is False and base.manual().endpointer == base.endpointer
