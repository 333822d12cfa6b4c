#!/usr/bin/env python3
"""Create latency with and without storage_encrypted. An encrypted sandbox is a cold start
(no warm pool: its key is per sandbox): ns gets an fscrypt layer, vm a LUKS qcow2 overlay.
Starts its own coved; run as root from the checkout:
  COVE_BUILD=$PWD/build COVE_TEMPLATES_DIR=... python3 bench/encrypted_create.py [N] [--runtime vm]
With --runtime vm both series are cold clones (--vm-pool 0), so the difference is the
encrypted overlay's cost (its creation and LUKS open); the template build is done first,
unmeasured."""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "lib"))
from cove import Coved  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("n", nargs="?", type=int, default=15)
ap.add_argument("--runtime", choices=("ns", "vm"), default="ns")
a = ap.parse_args()
vm = a.runtime == "vm"
d = Coved(os.environ.get("COVE_BUILD", os.path.abspath("build")),
          templates_dir=os.environ.get("COVE_TEMPLATES_DIR"),
          extra_args=["--vm-pool", "0"] if vm else [])
try:
    c = d.client
    if vm:
        c.remove(c.create(template="busybox", runtime="vm")["id"], purge=True)
    for enc in (False, True):
        ts = []
        for _ in range(a.n):
            t0 = time.monotonic()
            s = c.create(template="busybox", runtime=a.runtime, storage_encrypted=enc)
            ts.append((time.monotonic() - t0) * 1000)
            c.remove(s["id"], purge=vm)
            time.sleep(0.05)  # let the pool refill, as between real requests
        ts.sort()
        print(f"create runtime={a.runtime} storage_encrypted={str(enc).lower()}: "
              f"p50 {statistics.median(ts):.1f} ms, p90 {ts[int(len(ts) * 0.9)]:.1f} ms "
              f"(n={a.n}, client-side, busybox{', no pool' if vm else ''})")
finally:
    d.stop()
