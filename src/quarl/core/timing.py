"""Latency measurement shared by ``bench``, the benchmarks and the automatic int mode choice."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np


def median_us(fn: Callable[[np.ndarray], Any], x: np.ndarray, budget_s: float) -> float:
    """Median wall time of ``fn(x)`` in microseconds: 3 warm-up calls, then calls until
    ``budget_s`` has passed (at least 5)."""
    for _ in range(3):
        fn(x)
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while time.perf_counter() < deadline or len(times) < 5:
        t = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e6
