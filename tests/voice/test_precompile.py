"""A first run's compiling on two processes (voice.precompile): the worker's stages, its failure, and that what it
compiles is the one signature the decode core and Whisper's decoder both call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from voice.precompile import Precompile


def _fake_worker(script: str) -> Precompile:
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return Precompile("plain", proc)


def test_each_stage_is_waited_for_in_order():
    pre = _fake_worker("""
        import sys
        print("qmatvec", flush=True)
        sys.stdin.readline()  # the second stage only once the test lets it
        print("whisper", flush=True)
    """)
    try:
        assert pre.wait("qmatvec", timeout=60)
        assert not pre.done["whisper"].is_set()
        pre.proc.stdin.write("go\n")
        pre.proc.stdin.flush()
        assert pre.wait("whisper", timeout=60)
        pre.close()
        assert pre.failure() is None and pre.proc.returncode == 0
    finally:
        pre.proc.kill()


def test_a_failed_worker_ends_every_wait_and_says_why():
    pre = _fake_worker("""
        import sys
        print("the numba cache folder is not writable", file=sys.stderr)
        sys.exit(3)
    """)
    t0 = time.monotonic()
    assert not pre.wait("qmatvec", timeout=60)  # returns at the exit, not at the timeout
    assert not pre.wait("whisper", timeout=60)
    assert time.monotonic() - t0 < 30
    pre.close()
    assert pre.failure() == "the compile worker exited with 3: the numba cache folder is not writable"


def test_a_stage_reported_before_a_crash_still_counts_as_reached_only_if_the_exit_is_clean():
    pre = _fake_worker("""
        import os
        print("qmatvec", flush=True)
        os._exit(1)
    """)
    pre.close()
    assert pre.done["qmatvec"].is_set() and pre.done["whisper"].is_set()
    assert not pre.wait("whisper", timeout=1)
    assert pre.failure().startswith("the compile worker exited with 1")


def test_the_worker_waits_for_the_message_it_needs_or_for_its_parent_to_go():
    """The worker's stage waits for the parent's line (``parts``) past any other, and goes on when its input closes
    (the parent has gone); the parent's ``tell`` knows only ``MESSAGES`` and does not fail on an exited worker."""
    script = "from voice.precompile import _await\n_await('parts')\nprint('after', flush=True)"
    for given in ("whisper-parts\nparts\n", ""):
        out = subprocess.run([sys.executable, "-c", script], input=given, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and out.stdout == "after\n", out.stderr[-2000:]
    proc = subprocess.Popen([sys.executable, "-c", "print('hello')"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    pre = Precompile("plain", proc)
    proc.wait()
    with pytest.raises(ValueError, match="unknown message"):
        pre.tell("qmatvec")
    pre.tell("parts")  # exited: nothing to tell, no error
    assert pre.told == ["parts"]
    pre.close()


def test_the_worker_refuses_an_unknown_path_with_its_usage():
    from voice.precompile import main

    assert main(["sse9"]) == 2
    assert main([]) == 2
    assert main(["plain", "a.gguf", "b.gguf"]) == 2


@pytest.mark.engines
def test_a_first_run_compiles_the_matrix_kernel_and_whisper_once_in_the_worker(tmp_path):
    """``load_engines`` on an empty numba cache (``NUMBA_CACHE_DIR``, in a fresh process): it starts the worker and
    says so; the matrix kernel, the layer stack and Whisper's step are loaded from what the worker saved, never
    compiled here; the attention (the 64-wide heads' alone) and Whisper's step's parts are compiled here, once each
    (one signature each: no literal or read-only variant compiled twice)."""
    script = textwrap.dedent("""
        import json
        from decode import qint, step_ops
        from voice import whisper_decoder
        from voice.engines import EngineOptions, load_engines
        said = []
        load_engines(EngineOptions(), None, said.append)
        kind = qint.select().name
        def counts(d):
            return {"compiled": sum(d.stats.cache_misses.values()), "loaded": sum(d.stats.cache_hits.values()),
                    "signatures": len(d.signatures)}
        parts = [whisper_decoder.cross_kv, whisper_decoder.layer_norm, whisper_decoder.self_attend,
                 whisper_decoder.cross_attend, whisper_decoder.gelu_bias, whisper_decoder._rules]
        print(json.dumps({"said": said, "qmatvec": counts(qint.KERNELS[kind].matvec),
                          "step": counts(whisper_decoder.STEPS[kind]), "layers": counts(step_ops.LAYERS[kind, "64"]),
                          "attend": counts(step_ops.ATTEND["64"]),
                          "attend_any": counts(step_ops.ATTEND["any"]), "whisper_parts": [counts(d) for d in parts]}))
    """)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["said"][0].startswith("first run: compiling the"), got["said"]
    assert not any("compile worker exited" in line for line in got["said"]), got["said"]
    assert got["qmatvec"] == {"compiled": 0, "loaded": 1, "signatures": 1}, got
    assert got["step"] == {"compiled": 0, "loaded": 1, "signatures": 1}, got
    assert got["layers"] == {"compiled": 0, "loaded": 1, "signatures": 1}, got
    assert got["attend"] == {"compiled": 1, "loaded": 0, "signatures": 1}, got
    assert got["attend_any"]["signatures"] == 0, got
    # Whisper's step's float32 parts and greedy's rules: compiled here while the worker compiles the matrix kernel
    # (or loaded, where a fast path's worker got to one first), with the types a transcription gives them: one
    # signature each, the transcription compiled none of its own
    parts = got["whisper_parts"]
    assert all(p["signatures"] == 1 and p["compiled"] + p["loaded"] == 1 for p in parts), parts
