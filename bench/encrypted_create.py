#!/usr/bin/env python3
"""Create latency with and without storage_encrypted. Plain creates take from the node's warm
pool; encrypted ones from the tenant's own pool, started after its first encrypted create
(that one is cold: printed apart). Starts its own coved; run as root from the checkout:
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
    # memory_mb 256 is not the pooled shape: a cold instance, its layer from the layer pool
    for enc, shape in ((False, {}), (True, {}), (False, {"memory_mb": 256}),
                       (True, {"memory_mb": 256})):
        ts = []
        for _ in range(n):
            t0 = time.monotonic()
            s = c.create(template="busybox", storage_encrypted=enc, **shape)
            ts.append((time.monotonic() - t0) * 1000)
            c.remove(s["id"])
            time.sleep(0.05)  # let the pool refill, as between real requests
        first = ts[0]
        ts.sort()
        what = "cold instance, memory_mb 256" if shape else "default shape"
        print(f"create storage_encrypted={str(enc).lower()} ({what}): "
              f"p50 {statistics.median(ts):.1f} ms, p90 {ts[int(len(ts) * 0.9)]:.1f} ms, "
              f"first {first:.1f} ms (n={n}, client-side, busybox)")
finally:
    d.stop()
