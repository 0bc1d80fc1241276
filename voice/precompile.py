"""A first run's numba compiling on two cores: a second process compiles the matrix kernel, the layer stack and
Whisper's decoder while this one loads the LLM and compiles its embedding and attention and Whisper's float32 parts,
so the first turn waits for half the compiling.

numba compiles in the calling thread, one function after another: a first run on a fresh machine compiled the
integer matrix kernel (``qint.qmatvec_<path>``, ~9-15 s), the decode core's attention and layer stack (~8 s),
Whisper's decoder step (~6 s) and a few smaller kernels, all on one core.  Every kernel is cached on disk
(``cache=True``) and a dispatcher looks in that cache before it compiles a new signature, so what another
process has compiled and saved is loaded here instead.  ``load_engines`` starts ``python -m voice.precompile
<path> [<model.gguf>]`` when the cache holds no layer stack or Whisper step for the path, then:

- loads the LLM's weights and compiles its embedding and attention (``Model.compile_parts``) and tells the worker
  (``parts`` on its standard input), while the worker compiles the matrix kernel (stage ``qmatvec``);
- compiles Whisper's step's float32 parts and greedy's rules (``whisper_decoder.compile_parts``) and tells the
  worker (``whisper-parts``), while the worker loads the LLM and runs one step: it compiles the layer stack, finding
  the matrix kernel and the attention in the cache (stage ``layers``);
- loads the voice while the worker finishes that stage, then loads Whisper and transcribes half a second of silence
  (stage ``whisper``: Whisper's step compiled);
- waits for stage ``layers``, then runs the LLM's first step and prefills the persona, all from the cache;
- loads Whisper's weights, waits for stage ``whisper``, then warms Whisper up: every kernel it runs is in the cache.

The worker waits for each of this process's messages before the stage that needs what it names: without them both
would compile the same kernel at once.  A worker that fails or is missing costs nothing but the wait for its exit:
this process then compiles what it needs itself, as without it; one whose parent has gone (its input closed) goes
on alone."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np

#: The worker's stages, in its order: each a line on its standard output when done.
STAGES = ("qmatvec", "layers", "whisper")
#: What this process tells the worker, in order, each a line on its standard input: what it has compiled.
MESSAGES = ("parts", "whisper-parts")
#: The most a stage is waited for (seconds): past it, this process compiles the kernel itself.
STAGE_TIMEOUT_S = 600.0


def cold(kind: str) -> bool:
    """Whether numba's cache lacks path ``kind``'s layer stack or Whisper step (a first run): only then is a
    worker worth its start.  Unknown cache internals count as warm."""
    from decode import qint, step_ops
    from voice import whisper_decoder

    try:
        paths = [d._cache._cache_file._index_path for d in
                 (qint.KERNELS[kind].matvec, step_ops.LAYERS[kind, "64"], whisper_decoder.STEPS[kind])]
    except (AttributeError, KeyError):
        return False
    return not all(os.path.exists(p) for p in paths)


class Precompile:
    """The worker process and the stages it has reported (``wait``)."""

    def __init__(self, kind: str, proc: subprocess.Popen):
        self.kind = kind
        self.proc = proc
        self.told: list[str] = []
        self.done = {stage: threading.Event() for stage in STAGES}
        self.errors: list[str] = []
        self._out = threading.Thread(target=self._read, name="precompile-out", daemon=True)
        self._err = threading.Thread(target=self._drain, name="precompile-err", daemon=True)
        self._out.start()
        self._err.start()

    @classmethod
    def start(cls, kind: str, model: os.PathLike | str | None = None) -> Precompile | None:
        """The worker for path ``kind`` and the LLM file ``model`` (None: the default model), or None when it cannot
        start."""
        env = dict(os.environ, WAFERVOX_KERNELS=kind)
        cmd = [sys.executable, "-m", "voice.precompile", kind] + ([str(model)] if model is not None else [])
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        except OSError:
            return None
        return cls(kind, proc)

    def tell(self, message: str) -> None:
        """Tell the worker that ``message`` (one of ``MESSAGES``) is compiled and in the cache; a worker that has
        exited is not told."""
        if message not in MESSAGES:
            raise ValueError(f"unknown message {message!r}: one of {', '.join(MESSAGES)}")
        self.told.append(message)
        try:
            self.proc.stdin.write(message + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

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
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
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
    the decode core's layer stack and Whisper's decoder step both call.  The matrix is zeros in ``pack``'s shapes,
    not packed: ``pack``'s own kernel is what this process's parent compiles first."""
    from decode import qint
    from decode.quant import QType

    tiles, nb = 2, 2
    qs, d, m = (np.zeros(shape, dtype)[0] for shape, dtype in (((1, tiles, nb, qint.TILE_BLOCK_BYTES[QType.Q8_0]), np.uint8),
                                                                ((1, tiles, nb, qint.LANES), np.uint16),
                                                                ((1, 0, nb, qint.LANES), np.uint16)))
    for a in (qs, d, m):
        a.setflags(write=False)
    x = np.zeros((1, nb * 32), np.float32)
    act = qint.Activations(nb * 32)
    out = np.zeros((1, tiles * qint.LANES), np.float32)
    qint.KERNELS[kind].matvec(int(QType.Q8_0), qs, d, m, x, np.int64(qint.PREP_NONE), qint.NO_NORM, 0.0,
                              np.zeros((1, nb * 32), np.float32), act.q, act.d, act.s, act.m, out, False)


def compile_layers(model: str | None) -> None:
    """The LLM in ``model`` (None: the default model) loaded and one decode step run: its layer stack compiled with the types a forward pass
    gives it (the matrix kernel and the attention come from the cache)."""
    from decode import Model

    Model(model, warm=False).warm_up()


def _await(message: str) -> None:
    """Read this process's input up to ``message`` (or its end: the parent has gone, so go on alone)."""
    for line in sys.stdin:
        if line.strip() == message:
            return


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    from decode import qint

    if len(args) not in (1, 2) or args[0] not in qint.KINDS:
        print(f"usage: python -m voice.precompile {{{','.join(qint.KINDS)}}} [MODEL.gguf]: compile that kernel path's "
              "matrix kernel, the layer stack for MODEL (default: the shipped one) and Whisper's decoder into numba's "
              "cache (what `wafervox` does on a first run; its parent says on standard input when its own parts are "
              f"compiled: {', '.join(MESSAGES)})", file=sys.stderr)
        return 2
    kind, model = args[0], (args[1:] or [None])[0]
    t0 = time.perf_counter()
    compile_qmatvec(kind)
    print("qmatvec", flush=True)
    _await("parts")
    try:
        compile_layers(model)
    except Exception as e:  # (the parent reports a model that does not load; it compiles the stack itself then)
        print(f"the layer stack was not compiled: {e}", file=sys.stderr)
    print("layers", flush=True)
    from voice.asr import WhisperTranscriber

    asr = WhisperTranscriber(cpu_threads=1)
    _await("whisper-parts")
    asr.warmup()
    print("whisper", flush=True)
    print(f"compiled the {kind} path's matrix kernel, layer stack and Whisper's decoder in "
          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
