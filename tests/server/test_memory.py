"""server/memory.py: the allocator settings the server runs with.  A turn's temporaries (a few MB, Whisper's) must be
reused from the heap, not handed back and faulted in again on every call: counted in page faults, not timed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = textwrap.dedent("""
    import resource, sys
    import numpy as np
    sys.path.insert(0, {root!r})
    from server import memory
    if sys.argv[1] == "server":
        assert memory.fixed_mmap_threshold()
    else:  # the threshold fixed alone: glibc's trim threshold stays at 128 KiB
        memory._glibc().mallopt(memory._M_MMAP_THRESHOLD, 4 << 20)
    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    keep = []
    for _ in range(3):  # warm up
        a = np.ones(3 << 18)  # 6 MB: mapped of its own (over the 4 MiB threshold)
        b = [np.ones(1 << 16) for _ in range(4)]  # 4 x 512 KiB on the heap
        del a, b
    before = faults()
    for _ in range(20):
        b = [np.ones(1 << 16) for _ in range(4)]
        del b
    print(faults() - before)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_heap_temporaries_are_reused_not_faulted_in_again():
    def faults(mode: str) -> int:
        p = subprocess.run([sys.executable, "-c", PROBE.format(root=str(ROOT)), mode], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        return int(p.stdout.strip())

    shrinking = faults("threshold-only")
    assert shrinking > 20 * 100  # each round faulted its 2 MB (512 pages) back in: the heap had been trimmed
    assert faults("server") < 200  # the server's settings: the same memory reused
