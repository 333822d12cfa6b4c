#!/usr/bin/env python3
"""Create latency with and without storage_encrypted. Starts its own coved; run as root from
the checkout:
  COVE_BUILD=$PWD/build COVE_TEMPLATES_DIR=... python3 bench/encrypted_create.py [N] \
      [--runtime vm [--vm-pool P]]
ns: plain creates take from the node's warm pool; encrypted ones (an fscrypt layer) from the
tenant's own pool, started after its first encrypted create (that one is cold: printed
apart as `first`); memory_mb 256 is not the pooled shape, so those rows are cold instances
(their layer from the layer pool).
vm: an encrypted sandbox (a LUKS qcow2 overlay) is always a cold clone. With the default
--vm-pool 0 both series are cold clones, so the difference is the encrypted overlay's cost
(its creation and LUKS open); with --vm-pool 2 the plain creates come from the warm pool.
The template build is done first, unmeasured; plain and encrypted creates are interleaved
(a load change on this shared host hits both series)."""
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
        series = [(False, {}), (True, {})]
    else:
        series = [(False, {}), (True, {}), (False, {"memory_mb": 256}),
                  (True, {"memory_mb": 256})]
    times = {i: [] for i in range(len(series))}
    for _ in range(a.n):
        for i, (enc, shape) in enumerate(series):
            t0 = time.monotonic()
            s = c.create(template="busybox", runtime=a.runtime, storage_encrypted=enc, **shape)
            times[i].append((time.monotonic() - t0) * 1000)
            c.remove(s["id"], purge=vm)
            # let the pool refill, as between real requests (a vm clone takes longer)
            time.sleep(2.0 if vm and a.vm_pool else 0.05)
    for i, (enc, shape) in enumerate(series):
        ts = times[i]
        first = ts[0]
        ts = sorted(ts)
        what = "cold instance, memory_mb 256" if shape else "default shape"
        extra = f", vm pool {a.vm_pool}" if vm else ""
        print(f"create runtime={a.runtime} storage_encrypted={str(enc).lower()} ({what}): "
              f"p50 {statistics.median(ts):.1f} ms, p90 {ts[int(len(ts) * 0.9)]:.1f} ms, "
              f"first {first:.1f} ms (n={a.n}, client-side, busybox{extra})")
finally:
    d.stop()
