#!/usr/bin/env python3
"""vm runtime benchmark (issue 5, docs/vm.md): everything through coved's REST API.

  template build  first vm create of a shape: mkfs of the root disk, cold boot of the
                  template VM to cove-guest, device-state snapshot (x-ignore-shared)
  create, no pool create→ready (201 with a guest that answered HELLO) of a clone, no warm pool
  create, pool    the same with a warm pool (--vm-pool), waiting for a refill between creates
  full snapshot   pause (save: stop, disk + migration stream into the chunk store) and
                  resume (restore: -incoming, cont) of 128 and 512 MB guests, stored bytes
  PSS             host memory per idle VM (QEMU's Pss from smaps_rollup)

Usage: bench/vm_bench.py [--build build] [--n 10]   (root; QEMU + guest kernel installed)"""
import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "lib"))
from cove import Coved  # noqa: E402


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def ms(xs):
    return (f"p50 {statistics.median(xs) * 1000:.1f} ms, p90 {pct(xs, 90) * 1000:.1f} ms, "
            f"min {min(xs) * 1000:.1f} ms (n={len(xs)})")


def qemu_of(sid):
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cgroup") as f:
                if f"cove/{sid}" not in f.read():
                    continue
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if b"qemu-system" in f.read():
                    return int(p)
        except OSError:
            continue
    return None


def pss_kb(pid):
    with open(f"/proc/{pid}/smaps_rollup") as f:
        m = re.search(r"^Pss:\s+(\d+) kB", f.read(), re.M)
    return int(m.group(1))


def wait_pool(d, n, timeout=180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = d.client.request("GET", "/metrics", auth=False)
        m = re.search(rb"cove_pool_ready\S*\s+(\d+)", r.body)
        if m and int(m.group(1)) >= n:
            return
        time.sleep(0.05)
    raise SystemExit("vm pool did not refill")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.environ.get("BUILD", "build"))
    ap.add_argument("--templates-dir", default=os.environ.get("COVE_TEMPLATES_DIR"))
    ap.add_argument("--n", type=int, default=10)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    tdir = a.templates_dir or os.path.join(build, "test-templates")
    data = tempfile.mkdtemp(prefix="cove-vmbench-")
    out = []
    try:
        # 1. no pool: template build, then clones
        d = Coved(build, data_dir=data, templates_dir=tdir, extra_args=["--pool", "0"])
        c = d.client
        t = time.time()
        sb = c.create(template="busybox", runtime="vm")
        out.append(f"template build + first create (512 MB, 1 CPU): {time.time() - t:.2f} s")
        c.remove(sb["id"], purge=True)
        xs = []
        for _ in range(a.n):
            t = time.time()
            sb = c.create(template="busybox", runtime="vm")
            xs.append(time.time() - t)
            c.remove(sb["id"], purge=True)
        out.append(f"create→ready, vm, no pool: {ms(xs)}")
        # PSS of idle VMs
        ids = [c.create(template="busybox", runtime="vm")["id"] for _ in range(5)]
        time.sleep(3)  # idle: let first-touch settle
        pss = [pss_kb(qemu_of(i)) for i in ids]
        out.append(f"host memory per idle VM (PSS of QEMU, 5 VMs of 512 MB): "
                   f"mean {statistics.mean(pss) / 1024:.1f} MB, max {max(pss) / 1024:.1f} MB")
        for i in ids:
            c.remove(i, purge=True)
        # full snapshots, 128 and 512 MB
        for mem in (128, 512):
            t = time.time()
            sb = c.create(template="busybox", runtime="vm", memory_mb=mem)
            tb = time.time() - t
            sid = sb["id"]
            c.exec(sid, "echo warm")
            t = time.time()
            r = c.post(f"/v1/sandboxes/{sid}/pause")
            save = time.time() - t
            snap = r["snapshot"]
            t = time.time()
            c.post(f"/v1/sandboxes/{sid}/resume", {})
            c.exec(sid, "true")
            rest = time.time() - t
            out.append(f"full snapshot, {mem} MB guest: pause (save) {save * 1000:.0f} ms "
                       f"(VM stopped {snap['pause_ms']:.0f} ms), resume+first exec "
                       f"{rest * 1000:.0f} ms, stream {snap['size_bytes'] / 1e6:.1f} MB, "
                       f"new bytes stored {snap['new_bytes'] / 1e6:.1f} MB "
                       f"(template build of this shape {tb:.1f} s)")
            c.remove(sid, purge=True)
        d.stop()
        # 2. with a pool, same data dir: the template is built already
        d = Coved(build, data_dir=data, templates_dir=tdir,
                  extra_args=["--pool", "0", "--vm-pool", "2"])
        c = d.client
        xs = []
        for _ in range(a.n):
            wait_pool(d, 1)
            t = time.time()
            sb = c.create(template="busybox", runtime="vm")
            xs.append(time.time() - t)
            c.remove(sb["id"], purge=True)
        out.append(f"create→ready, vm, from pool: {ms(xs)}")
        d.stop()
    finally:
        shutil.rmtree(data, ignore_errors=True)
    accel = "KVM" if os.environ.get("COVE_VM_ACCEL") == "kvm" else "TCG (no usable KVM here)"
    print(f"## vm runtime ({accel}, {os.cpu_count()} CPUs)")
    for line in out:
        print(f"- {line}")


if __name__ == "__main__":
    main()
