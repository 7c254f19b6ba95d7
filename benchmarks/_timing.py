"""Timing helpers shared by the benchmark scripts (run as ``python benchmarks/NAME.py``, so
this folder is on ``sys.path``)."""

from __future__ import annotations

import time


def best_of(fn, repeats: int) -> float:
    """Seconds of the fastest of ``repeats`` calls of ``fn()`` (call it once before to compile)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)
