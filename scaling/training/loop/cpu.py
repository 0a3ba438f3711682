"""CPU tuning of a training process: glibc's allocator keeps large freed blocks (Linux)."""

from __future__ import annotations


def tune_cpu_allocator(max_cached_bytes: int = 1 << 30) -> bool:
    """Keep large freed blocks in glibc's heap instead of returning them to the OS (Linux only).

    glibc serves allocations above M_MMAP_THRESHOLD (dynamic, at most 32 MiB) with fresh
    mmap pages, so every step's multi-MiB activations page-fault again on first touch. On this
    project's 2-core VM that made elementwise ops on a 64 MiB tensor ~4x slower (a clone 35 ms
    vs 8.7 ms) and a d=128 proxy training step ~1.2x slower (5.2k vs 6.0-6.4k tokens/s, one
    thread, benchmarks/train_throughput.py --no-tune-malloc). mallopt(M_MMAP_THRESHOLD) and
    mallopt(M_TRIM_THRESHOLD) set to ``max_cached_bytes`` make glibc reuse that memory
    (the effect LD_PRELOAD=jemalloc/tcmalloc is usually used for). Process-wide; call once,
    early, in a training process. Returns False where it does not apply (non-glibc).
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
        return bool(
            libc.mallopt(m_mmap_threshold, int(max_cached_bytes))
            and libc.mallopt(m_trim_threshold, int(max_cached_bytes))
        )
    except (OSError, AttributeError):
        return False
