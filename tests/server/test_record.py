"""``wafervox serve --record DIR``: a session over a real websocket (our client, in real time) leaves a stereo WAV in
DIR, the user's question on the left and the agent's answer on the right on one clock, and its turns' JSON."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
import soundfile as sf
from running_server import TOKEN, Running

from server.app import ServerOptions
from server.client import ClientOptions, run_client
from voice.replay import SAMPLES, manifest


@pytest.fixture(scope="module")
def recorded(shared, tmp_path_factory):
    out = tmp_path_factory.mktemp("recordings")
    server = Running(shared, ServerOptions(port=0, token=TOKEN, record=str(out)))
    try:
        name = manifest()["conversations"]["visit"][0]
        turns = []
        asyncio.run(run_client([SAMPLES / name], ClientOptions(url=server.url("/v1/stream"), token=TOKEN, tail_s=2.0),
                               on_turn=turns.append))
        deadline = time.monotonic() + 30
        while not list(out.glob("*.json")) and time.monotonic() < deadline:  # written once the session has ended
            time.sleep(0.1)
    finally:
        server.close()
    return out, name, turns


def _level(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(x.astype(np.float64) ** 2))) if len(x) else 0.0


def test_a_session_is_recorded_as_stereo_with_its_turns(recorded):
    out, name, turns = recorded
    wavs, metas = list(out.glob("*.wav")), list(out.glob("*.json"))
    assert len(wavs) == 1 and len(metas) == 1, (wavs, metas)
    meta = json.loads(metas[0].read_text())
    assert meta["channels"] == ["user", "agent"] and meta["wav"] == wavs[0].name
    assert len(meta["turns"]) == 1 and len(turns) == 1
    turn = meta["turns"][0]
    assert turn["transcript"] == turns[0]["transcript"] and turn["reply"]
    data, rate = sf.read(str(wavs[0]), dtype="int16", always_2d=True)
    assert data.shape[1] == 2 and rate == meta["rate"]
    user, agent = data[:, 0], data[:, 1]
    # the user's question is on the left, where the report says it was said; the agent's answer on the right after it
    stamps = turn["stamps"]
    info = manifest()["turns"][name]
    voiced_user = np.flatnonzero(np.abs(user) > 1000)
    voiced_agent = np.flatnonzero(np.abs(agent) > 1000)
    assert len(voiced_user) and len(voiced_agent)
    said = (voiced_user[-1] - voiced_user[0]) / rate
    assert abs(said - (info["speech_end_s"] - info["speech_start_s"])) < 0.3
    assert voiced_agent[0] > voiced_user[-1]  # on one clock: the answer after the question
    gap = (voiced_agent[0] - voiced_user[-1]) / rate
    assert gap < 2.0, gap
    assert _level(agent[:voiced_user[-1]]) < 50  # nothing on the agent's side while the user spoke
    # the report's stamps are times on the WAV's axis: the answer starts where it says, the question ends where it says
    assert abs(voiced_agent[0] / rate - stamps["answer_audio"]) < 0.1, (voiced_agent[0] / rate, stamps)
    assert abs(voiced_user[-1] / rate - stamps["last_voiced"]) < 0.15, (voiced_user[-1] / rate, stamps)
