#!/usr/bin/env python3
"""Create latency with and without storage_encrypted (an encrypted sandbox is a cold start:
no warm pool). Starts its own coved; run as root from the checkout:
  COVE_BUILD=$PWD/build COVE_TEMPLATES_DIR=... python3 bench/encrypted_create.py [N]"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "lib"))
from cove import Coved  # noqa: E402

n = int(sys.argv[1]) if len(sys.argv) > 1 else 15
d = Coved(os.environ.get("COVE_BUILD", os.path.abspath("build")),
          templates_dir=os.environ.get("COVE_TEMPLATES_DIR"))
try:
    c = d.client
    for enc in (False, True):
        ts = []
        for _ in range(n):
            t0 = time.monotonic()
            s = c.create(template="busybox", storage_encrypted=enc)
            ts.append((time.monotonic() - t0) * 1000)
            c.remove(s["id"])
            time.sleep(0.05)  # let the pool refill, as between real requests
        ts.sort()
        print(f"create storage_encrypted={str(enc).lower()}: p50 {statistics.median(ts):.1f} ms, "
              f"p90 {ts[int(len(ts) * 0.9)]:.1f} ms (n={n}, client-side, busybox)")
finally:
    d.stop()
