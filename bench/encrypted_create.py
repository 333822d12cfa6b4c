#!/usr/bin/env python3
"""Create latency with and without storage_encrypted. An encrypted sandbox is a cold start
(no warm pool: its key is per sandbox): ns gets an fscrypt layer, vm a LUKS qcow2 overlay.
Starts its own coved; run as root from the checkout:
  COVE_BUILD=$PWD/build COVE_TEMPLATES_DIR=... python3 bench/encrypted_create.py [N] \
      [--runtime vm [--vm-pool P]]
With --runtime vm and the default --vm-pool 0 both series are cold clones, so the
difference is the encrypted overlay's cost (its creation and LUKS open); with --vm-pool 2
the plain creates come from the warm pool (encrypted ones never do). The template build is
done first, unmeasured."""
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
ap.add_argument("--vm-pool", type=int, default=0)
a = ap.parse_args()
vm = a.runtime == "vm"
d = Coved(os.environ.get("COVE_BUILD", os.path.abspath("build")),
          templates_dir=os.environ.get("COVE_TEMPLATES_DIR"),
          extra_args=["--vm-pool", str(a.vm_pool)] if vm else [])
try:
    c = d.client
    if vm:
        c.remove(c.create(template="busybox", runtime="vm")["id"], purge=True)
    times = {False: [], True: []}
    for _ in range(a.n):  # interleaved: a load change on this shared host hits both series
        for enc in (False, True):
            t0 = time.monotonic()
            s = c.create(template="busybox", runtime=a.runtime, storage_encrypted=enc)
            times[enc].append((time.monotonic() - t0) * 1000)
            c.remove(s["id"], purge=vm)
            # let the pool refill, as between real requests (a vm clone takes longer)
            time.sleep(2.0 if vm and a.vm_pool else 0.05)
    for enc, ts in times.items():
        ts.sort()
        print(f"create runtime={a.runtime} storage_encrypted={str(enc).lower()}: "
              f"p50 {statistics.median(ts):.1f} ms, p90 {ts[int(len(ts) * 0.9)]:.1f} ms "
              f"(n={a.n}, client-side, busybox"
              f"{', vm pool ' + str(a.vm_pool) if vm else ''})")
finally:
    d.stop()
