"""Small helpers every benchmark script shares: percentiles, timing, the load average."""
import os
import time


def pct(xs, p):
    """Percentile by linear interpolation between closest ranks (xs need not be sorted)."""
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * p / 100.0
    i = int(k)
    j = min(i + 1, len(s) - 1)
    return s[i] + (s[j] - s[i]) * (k - i)


def timed(fn):
    """(fn(), milliseconds it took)."""
    t0 = time.monotonic()
    r = fn()
    return r, (time.monotonic() - t0) * 1000


def loadavg():
    """The 1, 5 and 15 minute load averages as printed by uptime."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
