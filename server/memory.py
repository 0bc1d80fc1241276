"""The process's memory as glibc's allocator holds it: big buffers in mappings of their own, freed memory handed
back to the system (a closed session's, or what a turn's temporaries left in the allocator's heaps).  Everything
here is a no-op where the C library is not glibc."""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_libc = None
_lock = threading.Lock()
_last_trim = 0.0


def _glibc():
    global _libc
    if _libc is None:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc = lib if hasattr(lib, "mallopt") and hasattr(lib, "malloc_trim") else False
        except OSError:
            _libc = False
    return _libc or None


#: the free memory at the top of a heap that glibc hands back by itself (``trim()`` hands back the rest, between turns)
TRIM_THRESHOLD = 256 << 20


def fixed_mmap_threshold(threshold: int = 4 << 20) -> bool:
    """Serve every allocation over ``threshold`` with its own mapping, returned to the system when freed.  By default
    glibc raises the threshold to the size of a freed mapping (up to 32 MiB), after which a closed session's KV cache
    and scratch (tens of MB each) come from the heap and stay with the process.  False where this is not glibc.

    A fixed threshold also fixes glibc's trim threshold at its 128 KiB default (both are dynamic until one is set):
    every free that left that much at the top of the heap shrank it, and the next allocation grew it again with fresh
    pages.  A Whisper transcription then took 137-142 ms instead of 97-110 (median of 15, AVX2-only EPYC; its
    temporaries are a few MB), so the trim threshold is set high (``TRIM_THRESHOLD``) and the server trims between
    turns itself (``trim``): 98.5 ms."""
    lib = _glibc()
    if lib:
        lib.mallopt(_M_ARENA_MAX, 2)  # one heap per core, not eight: many short-lived session threads fragment fewer
        lib.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    return bool(lib and lib.mallopt(_M_MMAP_THRESHOLD, threshold))


def trim(min_interval_s: float = 0.0) -> bool:
    """Hand the free memory in the allocator's heaps back to the system (``malloc_trim``), at most once every
    ``min_interval_s`` for the whole process; True if it ran."""
    global _last_trim
    lib = _glibc()
    if not lib:
        return False
    with _lock:
        now = time.monotonic()
        if now - _last_trim < min_interval_s:
            return False
        _last_trim = now
    lib.malloc_trim(0)
    return True
