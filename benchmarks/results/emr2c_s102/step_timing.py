"""Shared by append_attend_step.py and append_attend_batch_step.py: a decode step's time."""
import time

import numpy as np


def per_step(fresh, step, n=100, rounds=30):
    """Best over rounds of the median of n steps, each round's steps on fresh() (a new copy of the caches), in µs."""
    best = float("inf")
    for _ in range(rounds):
        state = fresh()
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            step(state)
            ts.append(time.perf_counter() - t)
        best = min(best, float(np.median(ts)))
    return best * 1e6
