#!/usr/bin/env python3
"""Snapshot diff benchmark through the REST API of a real coved (busybox, ns runtime): a
sandbox writes a tree of --mb MB in --files files, is snapshotted, changes --changed of them,
and is snapshotted again. Figures: GET /v1/snapshots/{a}/diff/{b} (computed from the two
manifests) and a one-file diff, against the anchor a user has without it: restore both
snapshots (a fork of each, which restores its layer) and run `diff -rq` over the two restored
layers on the host. Prints the load average next to the figures.

    bench/snapdiff_bench.py --build build [--mb 200] [--files 2000] [--changed 100] [--rounds 5]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "lib"))
from cove import Coved, sh  # noqa: E402
from benchlib import timed  # noqa: E402




def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--templates", default=None)
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--changed", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: must run as root (coved's ns runtime needs it)")
    templates = a.templates or os.environ.get("COVE_TEMPLATES_DIR") or os.path.join(
        a.build, "test-templates")
    data = tempfile.mkdtemp(prefix="cove-bench-diff-")
    d = Coved(os.path.abspath(a.build), data_dir=data, templates_dir=templates)
    try:
        c = d.client
        sid = c.create(template="busybox", snapshot_interval_s=0,
                       disk_mb=max(1024, a.mb * 3))["id"]
        kb = a.mb * 1024 // a.files
        sh(c, sid, f"mkdir /data && i=0; while [ $i -lt {a.files} ]; do "
                   f"head -c {kb * 1024} /dev/urandom > /data/f$i; i=$((i+1)); done")
        s1 = c.post(f"/v1/sandboxes/{sid}/snapshots", {"kind": "files"})["id"]
        step = max(1, a.files // a.changed)
        sh(c, sid, f"i=0; while [ $i -lt {a.files} ]; do echo changed >> /data/f$i; "
                   f"i=$((i+{step})); done")
        s2 = c.post(f"/v1/sandboxes/{sid}/snapshots", {"kind": "files"})["id"]
        diffs, files = [], []
        for _ in range(a.rounds):
            r, t = timed(lambda: c.get(f"/v1/snapshots/{s1}/diff/{s2}"))
            diffs.append(t)
            _, t = timed(lambda: c.get(f"/v1/snapshots/{s1}/diff/{s2}/file?path=/data/f0"))
            files.append(t)
        n_changed = len(r["changed"])
        # the anchor: restore both (fork = restore into a new layer), diff -rq on the host
        anchors = []
        for _ in range(max(1, a.rounds // 2)):
            t0 = time.monotonic()
            fa = c.post(f"/v1/sandboxes/{sid}/fork", {"snapshot_id": s1})["sandboxes"][0]["id"]
            fb = c.post(f"/v1/sandboxes/{sid}/fork", {"snapshot_id": s2})["sandboxes"][0]["id"]
            la, lb = (os.path.join(data, "ns", "layers", x, "upper", "data") for x in (fa, fb))
            # the layers are mounted in coved's mount namespace
            p = subprocess.run(["nsenter", f"--mount=/proc/{d.proc.pid}/ns/mnt", "diff", "-rq",
                                la, lb], capture_output=True)
            anchors.append((time.monotonic() - t0) * 1000)
            lines = p.stdout.decode().count("\n")
            if p.returncode not in (0, 1) or lines != n_changed:
                print(f"anchor: diff -rq exited {p.returncode} with {lines} lines "
                      f"({p.stderr.decode()[:200]})")
            c.remove(fa, purge=True)
            c.remove(fb, purge=True)
        c.remove(sid, purge=True)
        load = os.getloadavg()
        print(f"| snapshot diff, {a.mb} MB in {a.files} files, {a.changed} changed "
              f"| median ms | min ms | rounds |")
        print("|---|---|---|---|")
        print(f"| GET …/diff (from manifests; {n_changed} changed reported) "
              f"| {statistics.median(diffs):.1f} | {min(diffs):.1f} | {len(diffs)} |")
        print(f"| GET …/diff/…/file (one {kb} KB file) | {statistics.median(files):.1f} "
              f"| {min(files):.1f} | {len(files)} |")
        print(f"| anchor: restore both (2 forks) + diff -rq | {statistics.median(anchors):.1f} "
              f"| {min(anchors):.1f} | {len(anchors)} |")
        print(f"load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
              f"({os.cpu_count()} CPUs)")
        print("PASS" if n_changed == a.changed else f"FAIL: {n_changed} changed reported, "
              f"{a.changed} made")
    finally:
        d.stop()
        subprocess.run(["rm", "-rf", data])


if __name__ == "__main__":
    main()
