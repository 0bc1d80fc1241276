"""A first run's numba compiling on two cores: a second process compiles the matrix kernel and Whisper's decoder
while this one loads the LLM and compiles its embedding and attention, so the first turn waits for half the compiling.

numba compiles in the calling thread, one function after another: a first run on a fresh machine compiled the
integer matrix kernel (``qint.qmatvec_<path>``, ~12-15 s), the decode core's attention and layer stack (~15 s),
Whisper's decoder step (~8 s) and a few smaller kernels, all on one core.  Every kernel is cached on disk
(``cache=True``) and a dispatcher looks in that cache before it compiles a new signature, so what another
process has compiled and saved is loaded here instead.  ``load_engines`` starts ``python -m voice.precompile
<path>`` when the cache holds no layer stack or Whisper step for the path, then:

- loads the LLM's weights and compiles its embedding and attention (``Model.compile_parts``), then Whisper's step's
  float32 parts and greedy's rules (``whisper_decoder.compile_parts``), while the worker compiles the matrix kernel
  (stage ``qmatvec``);
- waits for that stage, then runs the LLM's first step: its layer stack finds the matrix kernel in the cache;
- loads the voice while the worker loads Whisper and transcribes half a second of silence (stage ``whisper``);
- waits for that stage, then loads Whisper: every kernel it runs is in the cache.

A worker that fails or is missing costs nothing but the wait for its exit: this process then compiles what it
needs itself, as without it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np

#: The worker's stages, in its order: each a line on its standard output when done.
STAGES = ("qmatvec", "whisper")
#: The most a stage is waited for (seconds): past it, this process compiles the kernel itself.
STAGE_TIMEOUT_S = 600.0


def cold(kind: str) -> bool:
    """Whether numba's cache lacks path ``kind``'s layer stack or Whisper step (a first run): only then is a
    worker worth its start.  Unknown cache internals count as warm."""
    from decode import qint, step_ops
    from voice import whisper_decoder

    try:
        paths = [d._cache._cache_file._index_path for d in
                 (qint.KERNELS[kind].matvec, step_ops.LAYERS[kind], whisper_decoder.STEPS[kind])]
    except (AttributeError, KeyError):
        return False
    return not all(os.path.exists(p) for p in paths)


class Precompile:
    """The worker process and the stages it has reported (``wait``)."""

    def __init__(self, kind: str, proc: subprocess.Popen):
        self.kind = kind
        self.proc = proc
        self.done = {stage: threading.Event() for stage in STAGES}
        self.errors: list[str] = []
        self._out = threading.Thread(target=self._read, name="precompile-out", daemon=True)
        self._err = threading.Thread(target=self._drain, name="precompile-err", daemon=True)
        self._out.start()
        self._err.start()

    @classmethod
    def start(cls, kind: str) -> Precompile | None:
        """The worker for path ``kind``, or None when it cannot start."""
        env = dict(os.environ, WAFERVOX_KERNELS=kind)
        try:
            proc = subprocess.Popen([sys.executable, "-m", "voice.precompile", kind], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        except OSError:
            return None
        return cls(kind, proc)

    def _read(self) -> None:
        for line in self.proc.stdout:
            stage = line.strip()
            if stage in self.done:
                self.done[stage].set()
        self.proc.wait()
        for event in self.done.values():  # exited: nothing more to wait for, whatever it reached
            event.set()

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.errors = (self.errors + [line.rstrip()])[-20:]

    def wait(self, stage: str, timeout: float = STAGE_TIMEOUT_S) -> bool:
        """Block until the worker reports ``stage`` (or exits, or ``timeout`` passes); True when it reported it and has
        not failed since."""
        self.done[stage].wait(timeout)
        return self.done[stage].is_set() and (self.proc.poll() is None or self.proc.returncode == 0)

    def failure(self) -> str | None:
        """What went wrong with a worker that exited with an error (its last line of stderr), else None."""
        if self.proc.poll() in (None, 0):
            return None
        last = self.errors[-1] if self.errors else "no message"
        return f"the compile worker exited with {self.proc.returncode}: {last}"

    def close(self, timeout: float = 5.0) -> None:
        """Wait a little for the worker to exit (it does after its last stage), else stop it."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._out.join(1.0)
        self._err.join(1.0)


def compile_qmatvec(kind: str) -> None:
    """Path ``kind``'s matrix kernel, called once on a small matrix with the argument types its callers give it
    (read-only weight stacks' 3-D slices, a read-only norm, float32 rows, int8 activations): the one signature
    the decode core's layer stack and Whisper's decoder step both call."""
    from decode import qint
    from decode.quant import QType
    from voice.whisper_decoder import q8_0_blocks

    rng = np.random.default_rng(0)
    p = qint.pack([(QType.Q8_0, q8_0_blocks(rng.standard_normal((32, 64)).astype(np.float32)))])
    x = rng.standard_normal((1, 64)).astype(np.float32)
    act = qint.Activations(64)
    out = np.zeros((1, 32), np.float32)
    qint.KERNELS[kind].matvec(int(p.qtype), p.qs, p.d, p.m, x, np.int64(qint.PREP_NONE), qint.NO_NORM, 0.0,
                              np.zeros((1, 64), np.float32), act.q, act.d, act.s, act.m, out, False)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    from decode import qint

    if len(args) != 1 or args[0] not in qint.KINDS:
        print(f"usage: python -m voice.precompile {{{','.join(qint.KINDS)}}}: compile that kernel path's matrix "
              "kernel and Whisper's decoder into numba's cache (what `wafervox` does on a first run)", file=sys.stderr)
        return 2
    kind = args[0]
    t0 = time.perf_counter()
    compile_qmatvec(kind)
    print("qmatvec", flush=True)
    from voice.asr import WhisperTranscriber

    WhisperTranscriber(cpu_threads=1).warmup()
    print("whisper", flush=True)
    print(f"compiled the {kind} path's matrix kernel and Whisper's decoder in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
