"""``wafervox generate``: output contract, bad input (one line, exit 2), warm numba cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as T
from tiny_gguf import write_tiny_llama

ROOT = Path(__file__).resolve().parents[2]


def wafervox(*args, timeout=300):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "server.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(proc, *needles):
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("wafervox: error: ")
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.fixture(scope="module")
def default_model_file():
    from decode import default_model_path

    return default_model_path()


def test_generate_json_contract():
    proc = wafervox("generate", "--prompt", "The capital of France is", "--greedy", "--max-tokens", "8", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for key in ("prompt_ids", "token_ids", "text", "prefill_ms", "decode_tok_s"):
        assert key in out
    assert out["prompt_ids"] == [504, 3575, 282, 4649, 314]  # llama.cpp's ids for this prompt
    assert out["token_ids"][0] == 7042  # " Paris", llama.cpp's greedy choice
    assert "Paris" in out["text"]
    assert len(out["token_ids"]) == 8 and out["decode_tok_s"] > 0


def test_second_process_does_not_recompile():
    first = wafervox("generate", "--chat", "--prompt", "Hi", "--greedy", "--max-tokens", "3", "--json")
    assert first.returncode == 0, first.stderr
    second = wafervox("generate", "--chat", "--prompt", "Hi", "--greedy", "--max-tokens", "3", "--json")
    jit = json.loads(second.stdout)["jit"]
    assert jit["compiled"] == 0 and jit["cache_hits"] > 0, jit


def test_chat_streams_text():
    proc = wafervox("generate", "--chat", "--prompt", "What is 2 plus 2?", "--greedy", "--max-tokens", "24")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    assert "tok/s" in proc.stderr


def test_missing_file():
    assert_one_line_error(wafervox("generate", "--model", "/nonexistent/x.gguf"), "not found", "/nonexistent/x.gguf")


def test_not_a_gguf(tmp_path):
    p = tmp_path / "notes.gguf"
    p.write_text("hello, I am not a model\n")
    assert_one_line_error(wafervox("generate", "--model", str(p)), "not a GGUF", "notes.gguf")


@pytest.mark.parametrize("nbytes", [3, 1000, 4_000_000])
def test_truncated_gguf(tmp_path, default_model_file, nbytes):
    p = tmp_path / "cut.gguf"
    with open(default_model_file, "rb") as src:
        p.write_bytes(src.read(nbytes))
    proc = wafervox("generate", "--model", str(p))
    assert_one_line_error(proc, "cut.gguf")
    assert "truncated" in proc.stderr or "not a GGUF" in proc.stderr


def test_truncated_in_tensor_data(tmp_path, default_model_file):
    p = tmp_path / "short.gguf"
    size = default_model_file.stat().st_size
    with open(default_model_file, "rb") as src:
        p.write_bytes(src.read(size - 1000))
    assert_one_line_error(wafervox("generate", "--model", str(p)), "truncated", "short.gguf")


def test_unsupported_architecture(tmp_path):
    p = tmp_path / "other.gguf"
    write_tiny_llama(p, arch="gpt2")
    assert_one_line_error(wafervox("generate", "--model", str(p)), "unsupported architecture", "gpt2")


def test_unsupported_quant_type(tmp_path):
    p = tmp_path / "q5.gguf"
    write_tiny_llama(p, types={"attn_v": T.Q5_0})
    assert_one_line_error(wafervox("generate", "--model", str(p)), "unsupported tensor type", "Q5_0")


def test_bad_flags_are_one_line_errors():
    assert_one_line_error(wafervox("generate", "--max-tokens", "0"), "--max-tokens")
    assert_one_line_error(wafervox("generate", "--top-p", "0"), "top_p")
    assert_one_line_error(wafervox("generate", "--ctx", "0"), "--ctx")
    assert_one_line_error(wafervox("generate", "--ctx", "-5"), "--ctx")
    assert_one_line_error(wafervox("generate", "--temperature", "nan"), "temperature", "finite")
    assert_one_line_error(wafervox("generate", "--repeat-penalty", "inf"), "repetition_penalty", "finite")


def test_a_prompt_that_is_not_utf8_is_a_one_line_error():
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "LC_ALL": "C.UTF-8"}
    proc = subprocess.run([sys.executable.encode(), b"-m", b"server.cli", b"generate", b"--prompt", b"caf\xe9 au lait"],
                          cwd=ROOT, env=env, capture_output=True, timeout=300)
    proc.stderr = proc.stderr.decode("utf-8", "replace")
    assert_one_line_error(proc, "--prompt", "not valid UTF-8", "0xe9")


def test_help_explains_generate():
    proc = wafervox("generate", "--help")
    assert proc.returncode == 0
    for flag in ("--prompt", "--chat", "--max-tokens", "--greedy", "--model", "--json"):
        assert flag in proc.stdout


def test_run_json_lines_contract(tmp_path):
    wav = ROOT / "samples" / "morning_02_located.wav"
    proc = wafervox("run", "--fast", "--json", str(wav), "--save-audio", str(tmp_path), "--plot", str(tmp_path / "w.png"))
    assert proc.returncode == 0, proc.stderr
    objs = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    turns, summary = objs[:-1], objs[-1]
    assert len(turns) == 1 and "summary" in summary
    t = turns[0]
    for key in ("turn", "transcript", "reply", "latency_ms", "budget_ms", "within_budget", "mitigation"):
        assert key in t
    for key in ("endpoint_ms", "asr_ms", "llm_first_token_ms", "first_phrase_ms", "tts_first_audio_ms", "voice_to_voice_ms"):
        assert t["latency_ms"][key] is not None
    assert "located" in t["transcript"].lower() and "harbor" in t["reply"].lower()
    assert summary["summary"]["turns"] == 1
    assert (tmp_path / "agent.wav").stat().st_size > 10000 and (tmp_path / "w.png").stat().st_size > 1000


def test_run_rejects_bad_input_in_one_line(tmp_path):
    bad = tmp_path / "noise.wav"
    bad.write_bytes(b"RIFF\x00\x00\x00\x00WAVEnot really")
    assert_one_line_error(wafervox("run", str(bad)), "noise.wav")
    assert_one_line_error(wafervox("run", str(tmp_path / "none.wav")), "not found")
    assert_one_line_error(wafervox("run", "--conversation", "nope"), "nope")
    assert_one_line_error(wafervox("run", "--budget-ms", "0"), "--budget-ms")
    import numpy as np
    import soundfile as sf

    x = np.zeros(16000, np.float32)
    x[4000] = np.nan
    sf.write(str(tmp_path / "nan.wav"), x, 16000, subtype="FLOAT")
    assert_one_line_error(wafervox("run", str(tmp_path / "nan.wav")), "nan.wav", "NaN or infinite")


def test_serve_and_client_reject_bad_input_in_one_line(tmp_path):
    import socket

    assert_one_line_error(wafervox("serve", "--max-sessions", "0"), "--max-sessions")
    assert_one_line_error(wafervox("serve", "--port", "70000"), "--port")
    proc = wafervox("serve", "--max-sessions", "1000000", "--port", "0")  # checked once the engines are loaded
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "listening" not in proc.stdout
    assert last.startswith("wafervox: error: --max-sessions 1000000 needs about") and "available" in last
    assert_one_line_error(wafervox("client", str(tmp_path / "none.wav")), "not found")
    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    wav = str(ROOT / "samples" / "morning_02_located.wav")
    assert_one_line_error(wafervox("client", wav, "--url", f"ws://127.0.0.1:{port}/v1/realtime"), "onnect")
    assert_one_line_error(wafervox("client", wav, "--url", "http://x"), "--url")


def test_memory_plan_refuses_sessions_that_do_not_fit():
    from server.cli.common import CLIError
    from server.cli.serve import memory_plan

    mb = 1 << 20
    assert memory_plan(100 * mb, 4, 1000 * mb) == ("memory: 4 sessions x 100 MB (KV cache, scratch, wire buffers) = 400 MB "
                                                    "of 1,000 MB available")
    with pytest.raises(CLIError, match="needs about 6,400 MB .* use --max-sessions 9 or less"):
        memory_plan(100 * mb, 64, 950 * mb)
    assert "unknown" in memory_plan(100 * mb, 4, None)


def test_help_explains_serve_and_client():
    proc = wafervox("serve", "--help")
    assert proc.returncode == 0
    for flag in ("--host", "--port", "--token", "--allow-origin", "--max-sessions", "--idle-timeout"):
        assert flag in proc.stdout
    proc = wafervox("client", "--help")
    assert proc.returncode == 0 and "--url" in proc.stdout and "--json" in proc.stdout


def test_turn_end_flags_build_the_loop_config():
    import argparse

    from server.cli.common import CLIError, loop_config, voice_flags
    from voice.turn_end import TurnEndPolicy

    ap = argparse.ArgumentParser()
    voice_flags(ap)
    assert loop_config(ap.parse_args([])).end_of_turn == TurnEndPolicy()
    assert loop_config(ap.parse_args(["--eagerness", "high"])).end_of_turn == TurnEndPolicy(eagerness="high")
    silence = loop_config(ap.parse_args(["--turn-end", "silence", "--silence-ms", "600"]))
    assert silence.end_of_turn is None and silence.endpointer.stop_ms == 600
    with pytest.raises(CLIError, match="--turn-end silence"):
        loop_config(ap.parse_args(["--silence-ms", "600"]))
    with pytest.raises(CLIError, match="--silence-ms must be"):
        loop_config(ap.parse_args(["--turn-end", "silence", "--silence-ms", "50"]))


@pytest.mark.parametrize("var, value, needle", [("WAFERVOX_KERNELS", "bogus", "not a kernel path"),
                                                ("WAFERVOX_THREADS", "two", "a number of threads")])
def test_a_bad_override_in_the_environment_is_one_line_before_the_load(monkeypatch, var, value, needle):
    monkeypatch.setenv(var, value)
    assert_one_line_error(wafervox("run", "--json", timeout=120), var, needle)
