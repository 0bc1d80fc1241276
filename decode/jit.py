"""What numba compiled in this process: to tell a warm start (cache hits only) from a cold one."""

from __future__ import annotations

from numba.core.registry import CPUDispatcher


def _dispatchers():
    from . import ops, qint, quant, step_ops

    found = [obj for mod in (quant, qint, step_ops, ops) for obj in vars(mod).values()]
    found += list(ops._EMBED.values())  # the embedding kernel of each block type used so far
    for kernels in qint.KERNELS.values():  # each path's kernels (``qint._instantiate``), and its layer stack
        found += [kernels.matvec, kernels.block_isums] + [step_ops.LAYERS[kernels.name, w] for w in step_ops.WIDTHS]
    seen = set()
    for obj in found:
        if isinstance(obj, CPUDispatcher) and id(obj) not in seen:
            seen.add(id(obj))
            yield obj


def compile_counts() -> dict[str, int]:
    """``{"cache_hits": n, "compiled": m}`` over the decode kernels used so far in this process."""
    hits = misses = 0
    for d in _dispatchers():
        hits += sum(d.stats.cache_hits.values())
        misses += sum(d.stats.cache_misses.values())
    return {"cache_hits": hits, "compiled": misses}
