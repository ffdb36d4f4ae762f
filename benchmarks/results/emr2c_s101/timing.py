"""The sixty-first session's timing helper: the minimum of fn's times over secs seconds (after one warm-up call)."""
import time


def best(fn, secs):
    fn()
    b = 1e9
    t_end = time.time() + secs
    while time.time() < t_end:
        t = time.perf_counter()
        fn()
        b = min(b, time.perf_counter() - t)
    return b
