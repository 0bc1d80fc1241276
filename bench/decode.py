"""Decode and prefill speed of the numba core vs. llama.cpp on the same GGUF, and vs. the memory roofline.

    .venv/bin/python bench/decode.py [--threads 2] [--rounds 5] [--tokens 64]

Both engines run with the same thread count, greedy, on the same prompts; rounds
alternate between them so that noise on this shared machine hits both alike.  The
figures are medians over rounds; ratios are ours / theirs.  llama.cpp runs in its
own environment (``make bench-env`` builds it, bench/.venv-llamacpp) as a worker
process driven over a pipe.  The roofline is bytes read per decoded token
(weights + KV cache) over this machine's read bandwidth, measured here with the
same thread count.  JIT: the first token of a fresh process is measured in a
subprocess, once with the numba cache warm and once with an empty cache.  The
staged model (the decode core on its default simulated deployment, as every voice
turn runs it) takes part in the same rounds: its wall-time overhead over the plain
model is printed beside the simulated rate.  The same model on its float kernels only
(``Model(int_kernels=False)``) and with prompts on the float kernels (``int_prefill=False``,
integer decode steps) take part too: int / float is the median of per-round ratios.  Then the matrix-vector
kernels alone, in GB/s of weights read (one decode step's products over all layers, and the
head), the integer path beside the float one, the batched decode step (``forward_batch``,
B sequences per pass), the Python share of a decode step, and the load-time repack.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PEER_PYTHON = ROOT / "bench" / ".venv-llamacpp" / "bin" / "python"

from _prompts import LIGHTHOUSE  # noqa: E402  (beside this script: its folder is on sys.path)

PREFILL_PROMPT = LIGHTHOUSE + ", and satellite navigation has taken over much of their role."
DECODE_PROMPT = "<|im_start|>user\nTell me a long story about a lighthouse keeper.<|im_end|>\n<|im_start|>assistant\n"

PEER_WORKER = r'''
import json, sys, time
from llama_cpp import Llama
model, threads = sys.argv[1], int(sys.argv[2])
llm = Llama(model_path=model, n_ctx=1024, n_batch=512, n_threads=threads, n_threads_batch=threads,
            logits_all=False, verbose=False, use_extra_bufts=False)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    ids = llm.tokenize(req["text"].encode(), add_bos=False, special=True)
    llm.reset()
    t0 = time.perf_counter(); llm.eval(ids); t1 = time.perf_counter()
    out = {"n_prompt": len(ids), "prefill_s": t1 - t0}
    if req["decode"]:
        tok = 198
        t2 = time.perf_counter()
        for _ in range(req["decode"]):
            llm.eval([tok])
        out["decode_s"] = time.perf_counter() - t2
    print(json.dumps(out), flush=True)
'''


def read_bandwidth_gbs(threads: int) -> float:
    """Bytes/s of a streaming read of a 512 MiB array with ``threads`` threads (median of 5)."""
    import numba
    import numpy as np
    from numba import njit, prange

    @njit(parallel=True, fastmath=True)
    def _sum(a):
        s = 0.0
        for i in prange(a.shape[0]):
            s += a[i]
        return s

    numba.set_num_threads(threads)
    a = np.ones(512 * 1024 * 1024 // 4, np.float32)
    _sum(a)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        _sum(a)
        times.append(time.perf_counter() - t0)
    return a.nbytes / statistics.median(times) / 1e9


class Ours:
    def __init__(self, threads: int, model=None):
        import numba

        from decode import Generator, cpu

        numba.set_num_threads(threads)
        cpu.process_share().pin(threads)  # every forward pass fits its team to the share: this many threads
        self.gen = Generator(model=model)
        self.model = self.gen.model
        self.run("warm up", decode=4)

    @classmethod
    def float_kernels(cls, threads: int) -> Ours:
        """The default model on its float kernels only (the path before the integer kernels)."""
        from decode import Model

        return cls(threads, Model(int_kernels=False))

    @classmethod
    def float_prefill(cls, threads: int) -> Ours:
        """The default model with prompts on the float kernels (``Model(int_prefill=False)``)."""
        from decode import Model

        return cls(threads, Model(int_prefill=False))

    @classmethod
    def staged(cls, plain: Ours, threads: int, deployment: str | None = None) -> Ours:
        """The same loaded model through ``wafer.staged`` on ``deployment`` (default: CS-3 wafers)."""
        from wafer.deploy import Deployment
        from wafer.staged import stage

        dep = Deployment.parse(deployment) if deployment else Deployment.default()
        return cls(threads, stage(plain.model, dep))

    def run(self, text: str, decode: int) -> dict:
        ids = self.gen.tokenizer.encode(text)
        state = self.model.new_state()
        t0 = time.perf_counter()
        self.model.forward(state, ids, 0)
        t1 = time.perf_counter()
        out = {"n_prompt": len(ids), "prefill_s": t1 - t0}
        if decode:
            tok, pos = 198, len(ids)
            t2 = time.perf_counter()
            for i in range(decode):
                self.model.forward(state, [tok], pos + i)
            out["decode_s"] = time.perf_counter() - t2
        return out


class Peer:
    def __init__(self, model: Path, threads: int):
        self.proc = subprocess.Popen([str(PEER_PYTHON), "-c", PEER_WORKER, str(model), str(threads)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        json.loads(self.proc.stdout.readline())
        self.run("warm up", decode=4)

    def run(self, text: str, decode: int) -> dict:
        self.proc.stdin.write(json.dumps({"text": text, "decode": decode}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _median_s(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def kernel_rates(model, float_model, reps: int = 15) -> dict:
    """GB/s of weights read by one decode step's matrix products over every layer, and by the head,
    on the integer kernels (packed weights) and the float ones (the file's blocks); the rounds
    alternate between them."""
    import numpy as np

    from decode.quant import matvec, matvec3

    cfg, ker, pw = model.config, model.kernels, model.packed
    b = model.new_state().step.first(1)
    x = np.random.default_rng(0).standard_normal((1, max(cfg.d_model, cfg.d_ff)), dtype=np.float32)
    xd, xf = x[:, :cfg.d_model], x[:, :cfg.d_ff]
    gu = np.zeros((1, 2 * cfg.d_ff), np.float32)
    out = np.zeros((1, max(cfg.d_model, cfg.d_ff * 2, cfg.n_heads * cfg.head_dim + 2 * cfg.kv_dim)), np.float32)

    def int_layers():
        for p in pw.layers:
            ker(p.qkv, xd, b.act, b.qkv)
            ker(p.wo, xd, b.act, out[:, :cfg.d_model])
            ker(p.gate_up, xd, b.act, b.gu)
            gu[:] = 0.1
            ker(p.down, gu, b.act, out[:, :cfg.d_model], swiglu=True)

    def float_layers():
        for w in float_model.weights.layers:
            matvec3(int(w.wq.qtype), w.wq.data, int(w.wk.qtype), w.wk.data, int(w.wv.qtype), w.wv.data,
                    xd[0], b.q[0], b.k[0], b.v[0])
            matvec(int(w.wo.qtype), w.wo.data, xd[0], out[0, :cfg.d_model])
            matvec3(int(w.w_gate.qtype), w.w_gate.data, int(w.w_up.qtype), w.w_up.data, int(w.w_up.qtype), w.w_up.data[:0],
                    xd[0], b.gate[0], b.up[0], b.up[0, :0])
            matvec(int(w.w_down.qtype), w.w_down.data, xf[0], out[0, :cfg.d_model])

    head = float_model.weights.output
    cases = {
        "layers int": (int_layers, sum(m.nbytes for p in pw.layers for m in (p.qkv, p.wo, p.gate_up, p.down))),
        "layers float": (float_layers, sum(w.nbytes - w.attn_norm.nbytes - w.ffn_norm.nbytes for w in float_model.weights.layers)),
        "head int": (lambda: ker(pw.head, xd, b.act, b.logits), pw.head.nbytes),
        "head float": (lambda: matvec(int(head.qtype), head.data, xd[0], b.logits[0]), head.nbytes),
        "one gate|up int (cache-resident)": (lambda: ker(pw.layers[0].gate_up, xd, b.act, b.gu), pw.layers[0].gate_up.nbytes),
    }
    times = {k: [] for k in cases}
    for r in range(reps):
        for k, (fn, _) in (cases.items() if r % 2 == 0 else reversed(cases.items())):
            times[k].append(_median_s(fn, 3))
    return {k: nbytes / statistics.median(times[k]) / 1e9 for k, (_, nbytes) in cases.items()}


def batched_decode(model, tokenizer, sizes=(1, 2, 4, 8), steps: int = 32, rounds: int = 7) -> tuple[dict, dict]:
    """Tokens/s of ``forward_batch`` stepping B sequences together (each its own state and
    position): ``rounds`` rounds of ``steps`` steps per size, the sizes' order alternating.
    Returns the median rate per size and the median per-round ratio to B=1."""
    ids = tokenizer.encode(DECODE_PROMPT)
    runs = {}
    for B in sizes:
        states = [model.new_state() for _ in range(B)]
        for s in states:
            model.forward(s, ids, 0)
        model.forward_batch(states, [198] * B, [len(ids)] * B)
        runs[B] = (states, len(ids) + 1)
    rates = {B: [] for B in sizes}
    for r in range(rounds):
        for B in sizes if r % 2 == 0 else sizes[::-1]:
            states, pos = runs[B]
            t0 = time.perf_counter()
            for i in range(steps):
                model.forward_batch(states, [198] * B, [pos + i] * B)
            rates[B].append(B * steps / (time.perf_counter() - t0))
            runs[B] = (states, pos + steps)
    med = {B: statistics.median(v) for B, v in rates.items()}
    ratio = {B: statistics.median([b / one for b, one in zip(v, rates[1])]) for B, v in rates.items()}
    return med, ratio


def python_share(model, tokenizer, steps: int = 64, rounds: int = 5) -> dict:
    """What a decode step spends outside the numba kernels: the step with every numba entry point
    of ``decode.model`` replaced by a Python no-op (what is left is the Python around them), the
    entries per step, and the cost of entering the layer stack (``step_ops.LAYERS`` on an empty
    range of layers: the full argument dispatch, no work)."""
    import decode.model as dm
    from decode.step_ops import head_width

    s = model.new_state()
    ids = tokenizer.encode(DECODE_PROMPT)
    model.forward(s, ids, 0)
    pos = [len(ids)]
    calls = [0]

    def nop(*a, **k):
        calls[0] += 1

    def run() -> float:
        t0 = time.perf_counter()
        for _ in range(steps):
            model.forward(s, [198], pos[0])
            pos[0] += 1
        return (time.perf_counter() - t0) / steps

    real = {"LAYERS": dm.LAYERS, "embed": dm.embed, "rmsnorm": dm.rmsnorm}
    matvec = model.kernels.matvec
    full, stub = [], []
    for _ in range(rounds):
        full.append(run())
        dm.LAYERS, dm.embed, dm.rmsnorm = dict.fromkeys(real["LAYERS"], nop), nop, nop
        object.__setattr__(model.kernels, "matvec", nop)
        calls[0] = 0
        try:
            stub.append(run())
        finally:
            dm.LAYERS, dm.embed, dm.rmsnorm = real["LAYERS"], real["embed"], real["rmsnorm"]
            object.__setattr__(model.kernels, "matvec", matvec)
    b, cfg = s.step.first(1), model.config
    layers = real["LAYERS"][model.kernels.name, head_width(cfg.head_dim)]
    args = (0, 0, b.x, b.xb, b.qkv, b.att, b.gu, b.act.q, b.act.d, b.act.s, b.act.m, *model._stack, cfg.norm_eps,
            *s.caches, b.pos, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.rope_dims, model.cos, model.sin)
    layers(*args)
    t0 = time.perf_counter()
    for _ in range(2000):
        layers(*args)
    entry = (time.perf_counter() - t0) / 2000
    step, py = statistics.median(full), statistics.median(stub)
    per_step = calls[0] / steps  # counted in the last stubbed round
    return {"step_ms": step * 1e3, "python_us": py * 1e6, "numba_calls_per_step": per_step,
            "layers_entry_us": entry * 1e6, "share": (py + per_step * entry) / step}


def repack_seconds(model, reps: int = 5) -> float:
    from decode.model import pack_weights

    return statistics.median(pack_weights(model.weights).seconds for _ in range(reps))


def fresh_process_first_token(cold: bool) -> dict:
    """``wafervox generate`` in a new process; with ``cold`` numba gets an empty cache dir."""
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        if cold:
            env["NUMBA_CACHE_DIR"] = tmp
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "server.cli", "generate", "--prompt", "Hello", "--greedy",
                               "--max-tokens", "2", "--json"], cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(proc.stderr)
    out = json.loads(proc.stdout)
    return {"wall_s": wall, "load_ms": out["load_ms"], "first_token_ms": out["first_token_ms"],
            "compiled": out["jit"]["compiled"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64, help="decode steps per round")
    ap.add_argument("--no-peer", action="store_true", help="skip llama.cpp (ratios are not printed)")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold-cache (compiling) fresh-process run")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    ap.add_argument("--deployment", default=None, metavar="MODEL@HWxN",
                    help="deployment of the staged model (default: this model on CS-3 wafers)")
    ap.add_argument("--no-staged", action="store_true", help="skip the staged model")
    ap.add_argument("--no-float", action="store_true",
                    help="skip the float-kernel and int_prefill models, the kernel rates and forward_batch")
    args = ap.parse_args()

    from decode import default_model_path

    model_path = default_model_path()
    print(f"model {model_path.name}, {args.threads} threads, {args.rounds} rounds, {args.tokens} decode tokens/round",
          flush=True)
    ours = Ours(args.threads)
    kern, packed = ours.model.kernels, ours.model.packed
    print(f"decode kernels: {kern.name if kern else 'float'}"
          + (f", weights repacked at load in {packed.seconds * 1000:.0f} ms" if packed else ""), flush=True)
    floats = None if args.no_float else Ours.float_kernels(args.threads)
    fpre = None if args.no_float else Ours.float_prefill(args.threads)
    staged = None if args.no_staged else Ours.staged(ours, args.threads, args.deployment)
    peer = None
    if not args.no_peer:
        if not PEER_PYTHON.exists():
            raise SystemExit("llama.cpp environment missing: run `make bench-env` (or pass --no-peer)")
        peer = Peer(model_path, args.threads)

    res = {"ours": {"decode": [], "prefill": []}, "llama.cpp": {"decode": [], "prefill": []},
           "staged": {"decode": [], "prefill": []}, "float": {"decode": [], "prefill": []},
           "float_prefill": {"decode": [], "prefill": []}}
    engines = ([("ours", ours)] + ([("float", floats), ("float_prefill", fpre)] if floats else [])
               + ([("staged", staged)] if staged else []) + ([("llama.cpp", peer)] if peer else []))
    n_prefill = 0
    for r in range(args.rounds):
        for name, eng in engines if r % 2 == 0 else engines[::-1]:
            d = eng.run(DECODE_PROMPT, decode=args.tokens)
            res[name]["decode"].append(args.tokens / d["decode_s"])
            p = eng.run(PREFILL_PROMPT, decode=0)
            n_prefill = p["n_prompt"]
            res[name]["prefill"].append(p["n_prompt"] / p["prefill_s"])
        line = f"  round {r + 1}/{args.rounds}: decode ours {res['ours']['decode'][-1]:.1f}"
        if floats:
            line += f", float kernels {res['float']['decode'][-1]:.1f}"
        if staged:
            line += f", staged {res['staged']['decode'][-1]:.1f}"
        if peer:
            line += f" vs llama.cpp {res['llama.cpp']['decode'][-1]:.1f} tok/s"
        print(line, flush=True)
    if peer:
        peer.close()

    med = {e: {k: statistics.median(v) for k, v in d.items() if v} for e, d in res.items()}
    # paired: ours / theirs within each round, then the median (robust to a noisy round)
    paired = {k: statistics.median([o / t for o, t in zip(res["ours"][k], res["llama.cpp"][k])]) for k in ("decode", "prefill")
              if res["llama.cpp"][k]}
    cfg = ours.model.config
    weight_bytes = ours.model.weights.nbytes
    kv_positions = len(ours.gen.tokenizer.encode(DECODE_PROMPT)) + args.tokens // 2
    kv_read = 2 * cfg.n_layers * cfg.kv_dim * ours.gen.state.k_cache.itemsize * kv_positions
    bytes_per_token = weight_bytes + kv_read
    bw = read_bandwidth_gbs(args.threads)
    roofline = bw * 1e9 / bytes_per_token

    print()
    print(f"decode  ours {med['ours']['decode']:7.1f} tok/s", end="")
    if peer:
        print(f"   llama.cpp {med['llama.cpp']['decode']:7.1f} tok/s   ratio {paired['decode']:.2f}x (median of per-round ratios)")
    else:
        print()
    print(f"prefill ours {med['ours']['prefill']:7.1f} tok/s", end="")
    if peer:
        print(f"   llama.cpp {med['llama.cpp']['prefill']:7.1f} tok/s   ratio {paired['prefill']:.2f}x   ({n_prefill}-token prompt)")
    else:
        print()
    if floats:
        vs = {k: statistics.median([o / f for o, f in zip(res["ours"][k], res["float"][k])]) for k in ("decode", "prefill")}
        print(f"int vs float kernels: decode {med['ours']['decode']:.1f} vs {med['float']['decode']:.1f} tok/s, "
              f"ratio {vs['decode']:.2f}x (median of per-round ratios); prefill ratio {vs['prefill']:.2f}x")
        ip = statistics.median([o / f for o, f in zip(res["ours"]["prefill"], res["float_prefill"]["prefill"])])
        line = (f"float prefill (int_prefill=False): {med['float_prefill']['prefill']:.1f} tok/s; "
                f"the default integer prefill is {ip:.2f}x it")
        if peer:
            vs_peer = statistics.median([f / t for f, t in zip(res["float_prefill"]["prefill"], res["llama.cpp"]["prefill"])])
            line += f"; float prefill {vs_peer:.2f}x llama.cpp"
        print(line)
        vs["int_prefill_over_float_prefill"] = ip
    if staged:
        over = {k: statistics.median([o / st - 1 for o, st in zip(res["ours"][k], res["staged"][k])]) for k in ("decode", "prefill")}
        sim = staged.model
        print(f"staged  decode {med['staged']['decode']:7.1f} tok/s here, wall-time overhead {over['decode']:+.1%} decode, "
              f"{over['prefill']:+.1%} prefill (median of per-round ratios); on simulated {sim.deployment} "
              f"{1 / sim.token_s():,.0f} tok/s")
        figures_staged = {"deployment": sim.deployment, "overhead": over, "sim_tok_s": 1 / sim.token_s()}
    achieved = med["ours"]["decode"] * bytes_per_token / 1e9
    print(f"roofline {bytes_per_token / 1e6:.1f} MB read per token, read bandwidth {bw:.1f} GB/s "
          f"-> {roofline:.0f} tok/s; ours reads {achieved:.1f} GB/s = {med['ours']['decode'] / roofline:.2f}x of the limit")

    figures = {"threads": args.threads, "rounds": args.rounds, "median": med, "paired_ratio": paired if peer else None,
               "bytes_per_token": bytes_per_token,
               "read_gb_s": bw, "roofline_tok_s": roofline, "staged": figures_staged if staged else None}
    if floats:
        figures["int_vs_float"] = vs
    if floats and ours.model.packed:
        rates = kernel_rates(ours.model, floats.model)
        print("kernels, GB/s of weights read (median, alternating): " + ", ".join(f"{k} {v:.1f}" for k, v in rates.items())
              + f"; read bandwidth {bw:.1f}")
        batched, batch_ratio = batched_decode(ours.model, ours.gen.tokenizer)
        print("forward_batch (median of 7 alternating rounds of 32 steps): "
              + ", ".join(f"B={b} {v:.0f} tok/s ({batch_ratio[b]:.2f}x)" for b, v in batched.items())
              + " (ratio: median of per-round ratios to B=1)")
        ps = python_share(ours.model, ours.gen.tokenizer)
        print(f"Python per decode step: {ps['python_us']:.0f} us around {ps['numba_calls_per_step']:.0f} numba calls "
              f"(entering the layer stack {ps['layers_entry_us']:.1f} us); with the entries {ps['share']:.1%} of a "
              f"{ps['step_ms']:.2f} ms step (median of 5)")
        figures["python_share"] = ps
        rp = repack_seconds(ours.model)
        print(f"repack of {ours.model.packed.nbytes / 1e6:.0f} MB: {rp * 1000:.0f} ms warm (median of 5), "
              f"{ours.model.packed.seconds * 1000:.0f} ms at this process's load")
        figures.update(kernel_gb_s=rates, forward_batch_tok_s=batched, forward_batch_ratio=batch_ratio, repack_s=rp,
                       repack_at_load_s=ours.model.packed.seconds)
    warm = fresh_process_first_token(cold=False)
    print(f"fresh process, warm numba cache: load {warm['load_ms']:.0f} ms, first token {warm['first_token_ms']:.0f} ms, "
          f"{warm['compiled']} compilations")
    figures["fresh_warm"] = warm
    if not args.no_cold:
        cold = fresh_process_first_token(cold=True)
        print(f"fresh process, empty numba cache: load {cold['load_ms'] / 1000:.1f} s (compiling at the load's "
              f"warm-up step), first token {cold['first_token_ms']:.0f} ms ({cold['compiled']} compilations), "
              f"whole run {cold['wall_s']:.1f} s")
        figures["fresh_cold"] = cold
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
