#!/usr/bin/env python3
"""The issue-3 benchmark through the REST API of a real coved (busybox template, ns runtime):
stop-the-world pause per snapshot of a sandbox with 100 MB written, pause and resume latency
from the local store (client wall time and coved's own figure), fork of 10 at once, and the
bytes an idle sandbox's next snapshot adds. Prints a markdown table.

    bench/timemachine.py --build build [--rounds 20] [--mb 100]

`make bench-tm` runs it. COVE_NS_EXPEDITE_FREEZE=1 in the environment is passed to coved
(docs/storage.md: RCU expedited during the freeze only)."""
import argparse
import os
import re
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "lib"))
from cove import Coved  # noqa: E402


def pct(xs, p):
    s = sorted(xs)
    k = (len(s) - 1) * p / 100.0
    i = int(k)
    j = min(i + 1, len(s) - 1)
    return s[i] + (s[j] - s[i]) * (k - i)


def row(name, xs, unit="ms"):
    return (f"| {name} | {pct(xs, 50):.1f} | {pct(xs, 90):.1f} | {min(xs):.1f} | {max(xs):.1f} "
            f"| {len(xs)} | {unit} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--templates", default=None)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--mb", type=int, default=100)
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: must run as root (coved's ns runtime needs it)")
    templates = a.templates or os.environ.get("COVE_TEMPLATES_DIR") or os.path.join(
        a.build, "test-templates")
    data = tempfile.mkdtemp(prefix="cove-bench-tm-")
    d = Coved(os.path.abspath(a.build), data_dir=data, templates_dir=templates)
    try:
        c = d.client
        body = {"template": "busybox", "timeout_s": 3600, "snapshot_interval_s": 0}
        sid = c.create(**body)["id"]
        r = c.exec(sid, f"dd if=/dev/urandom of=/home/big bs=1M count={a.mb} 2>/dev/null")
        assert r["exit_code"] == 0, r
        pause, snap_total = [], []
        first = None
        for i in range(a.rounds):
            c.exec(sid, f"dd if=/dev/urandom of=/home/f{i} bs=64k count=16 2>/dev/null")
            t0 = time.monotonic()
            s = c.post(f"/v1/sandboxes/{sid}/snapshots", {})
            snap_total.append((time.monotonic() - t0) * 1000)
            pause.append(s["pause_ms"])
            first = first or s
        # idle: two snapshots in a row with nothing changed
        s1 = c.post(f"/v1/sandboxes/{sid}/snapshots", {})
        s2 = c.post(f"/v1/sandboxes/{sid}/snapshots", {})
        # pause/resume of a small sandbox (what an agent's workspace looks like) and the big one
        small = c.create(**body)["id"]
        c.put_file(small, "/home/work.txt", b"x" * 100000)
        res = {}
        for name, s_id in (("small", small), (f"{a.mb} MB", sid)):
            pw, rw = [], []
            for i in range(a.rounds if name == "small" else max(3, a.rounds // 4)):
                t0 = time.monotonic()
                c.post(f"/v1/sandboxes/{s_id}/pause")
                t1 = time.monotonic()
                c.post(f"/v1/sandboxes/{s_id}/resume")
                t2 = time.monotonic()
                pw.append((t1 - t0) * 1000)
                rw.append((t2 - t1) * 1000)
            res[name] = (pw, rw)
        server = []
        with open(d.log_path, errors="replace") as f:
            for line in f:
                m = re.search(r"resumed from snapshot \S+ in ([\d.]+) ms \(restore ([\d.]+) ms, "
                              r"start ([\d.]+) ms\)", line)
                if m and small in line:
                    server.append(tuple(float(x) for x in m.groups()))
        # fork of 10 at once from the small sandbox's newest snapshot
        snap_id = c.sandbox(small)["last_snapshot_id"]
        t0 = time.monotonic()
        f = c.ok("POST", f"/v1/sandboxes/{small}/fork", {"snapshot_id": snap_id, "count": 10},
                 expect=(201,))
        fork_ms = (time.monotonic() - t0) * 1000
        for x in f["sandboxes"]:
            c.remove(x["id"], purge=True)
        print(f"time machine, ns runtime, busybox; {a.mb} MB written; load "
              f"{open('/proc/loadavg').read().split()[0]}; COVE_NS_EXPEDITE_FREEZE="
              f"{os.environ.get('COVE_NS_EXPEDITE_FREEZE', '0')}\n")
        print("| what | p50 | p90 | min | max | n | unit |")
        print("|---|---|---|---|---|---|---|")
        print(row(f"stop-the-world pause per snapshot ({a.mb} MB written)", pause))
        print(row("POST snapshot (pause + capture of ~1 MB new)", snap_total))
        for name, (pw, rw) in res.items():
            print(row(f"POST pause, {name} sandbox", pw))
            print(row(f"POST resume, {name} sandbox (client)", rw))
        if server:
            print(row("resume, small: coved's figure", [x[0] for x in server]))
            print(row("  of which restore from the store", [x[1] for x in server]))
            print(row("  of which start on the image", [x[2] for x in server]))
        print(f"\nfork of 10 at once: {fork_ms:.0f} ms total")
        print(f"idle snapshot: first {first['size_bytes'] / 1e6:.1f} MB logical; next snapshot of "
              f"the unchanged sandbox added {s2['new_bytes']} bytes "
              f"({100.0 * s2['new_bytes'] / max(1, s1['size_bytes']):.3f}% of its "
              f"{s1['size_bytes'] / 1e6:.1f} MB)")
    finally:
        d.stop()
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
