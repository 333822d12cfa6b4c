#!/usr/bin/env python3
"""The time machine benchmark through the REST API of a real coved (busybox template, ns runtime):
stop-the-world pause per snapshot of a sandbox with 100 MB written, for each kind (files:
what rolling snapshots take; full: files + memory + processes with CRIU, where the node can),
the pause of real rolling snapshots, pause and resume latency from the local store for
files and full snapshots (client wall time and coved's own figure), fork of 10 at once, and
the bytes an idle sandbox's next snapshot adds. Prints a markdown table, then goal 5 of the
performance work with PASS/FAIL next to anchors of the same run: a resume right after a full
pause (a thaw where coved keeps pauses hot) next to a resume from the store of an older full
snapshot (CRIU restore), the 100 MB sandbox's resume from a files snapshot (its kept layer
image cloned) next to `cp --reflink` of 100 MB, and the fork of 10 next to ten sequential
restores.

    bench/timemachine.py --build build [--rounds 20] [--mb 100]

`make bench-tm` runs it. COVE_CRIU=off in the environment hides CRIU from coved (then every
snapshot is files and the full rows are left out)."""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "lib"))
from cove import Coved  # noqa: E402
from benchlib import loadavg, pct, timed  # noqa: E402




def row(name, xs, unit="ms"):
    if not xs:
        return f"| {name} | - | - | - | - | 0 | {unit} |"
    return (f"| {name} | {pct(xs, 50):.1f} | {pct(xs, 90):.1f} | {min(xs):.1f} | {max(xs):.1f} "
            f"| {len(xs)} | {unit} |")




def reflink_anchor(data, mb):
    """`cp --reflink=always` of an mb MB file on coved's layer filesystem (what a resume that
    reuses a kept layer image costs at least), ms; None where there is no such filesystem."""
    lfs = os.path.join(data, "ns", "lfs")
    if not os.path.isdir(lfs):
        return None
    src, dst = os.path.join(lfs, "bench-reflink-src"), os.path.join(lfs, "bench-reflink-dst")
    try:
        with open(src, "wb") as f:
            for _ in range(mb):
                f.write(os.urandom(1 << 20))
            f.flush()
            os.fsync(f.fileno())
        _, ms = timed(lambda: subprocess.run(["cp", "--reflink=always", src, dst], check=True))
        return ms
    except (OSError, subprocess.CalledProcessError):
        return None
    finally:
        for x in (src, dst):
            try:
                os.unlink(x)
            except OSError:
                pass


def goals(res, mb, fork_kind, fork_ms, reflink_ms):
    """Issue 18 goal 5: memory resume, resume of the mb MB sandbox and fork of 10, each with
    PASS/FAIL next to an anchor of this same run."""
    def p50(xs):
        return pct(xs, 50) if xs else None

    def fig(v):
        return "-" if v is None else f"{v:.1f} ms"

    def verdict(v, limit):
        return "—" if v is None else ("PASS" if v <= limit else "FAIL")
    small, big = res["small"][2], res[f"{mb} MB"][2]
    hot, cold = p50(small.get("full")), p50(small.get("full, restored from the store"))
    big_files, big_full = p50(big.get("files")), p50(big.get("full"))
    small_files = p50(small.get("files"))
    print(f"\ngoals (load {loadavg()})\n")
    print("| goal | figure | target | | same-run anchor |")
    print("|---|---|---|---|---|")
    print(f"| memory resume p50, small sandbox (resume right after its pause: a thaw) | "
          f"{fig(hot)} | ≤ 30 ms | {verdict(hot, 30)} | resume from the store (CRIU restore) "
          f"of an older full snapshot of it: {fig(cold)} |")
    print(f"| resume p50 of the {mb} MB sandbox from a files snapshot (kept layer image) | "
          f"{fig(big_files)} | ≤ 50 ms | {verdict(big_files, 50)} | `cp --reflink` of {mb} MB "
          f"on the layer filesystem: {fig(reflink_ms)}; small sandbox: {fig(small_files)} |")
    print(f"| resume p50 of the {mb} MB sandbox from its pause's full snapshot (a thaw) | "
          f"{fig(big_full)} | ≤ 50 ms | {verdict(big_full, 50)} | - |")
    seq = None if cold is None else 10 * cold
    print(f"| fork of 10 from a {fork_kind} snapshot | {fork_ms:.0f} ms | ≤ 300 ms | "
          f"{verdict(fork_ms if fork_kind == 'full' else None, 300)} | ten sequential "
          f"restores from the store (10 × the p50 above): {fig(seq)} |")


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
        node_kind = c.snapshot_kind()  # waits for the CRIU self-check
        few = max(3, a.rounds // 4)
        body = {"template": "busybox", "timeout_s": 3600, "snapshot_interval_s": 0}
        sid = c.create(**body)["id"]
        r = c.exec(sid, f"dd if=/dev/urandom of=/home/big bs=1M count={a.mb} 2>/dev/null")
        assert r["exit_code"] == 0, r
        # POST snapshot of each kind; the kind each answer names labels its figures (an older
        # coved ignores "kind")
        pause, total = {}, {}
        first = None
        for kind, n in (("files", a.rounds), ("full", few if node_kind == "full" else 0)):
            for i in range(n):
                c.exec(sid, f"dd if=/dev/urandom of=/home/f-{kind}{i} bs=64k count=16 "
                            "2>/dev/null")
                s, ms = timed(lambda: c.post(f"/v1/sandboxes/{sid}/snapshots", {"kind": kind}))
                pause.setdefault(s["kind"], []).append(s["pause_ms"])
                total.setdefault(s["kind"], []).append(ms)
                first = first or s
        # idle: two snapshots in a row with nothing changed
        s1 = c.post(f"/v1/sandboxes/{sid}/snapshots", {"kind": "files"})
        s2 = c.post(f"/v1/sandboxes/{sid}/snapshots", {"kind": "files"})
        # rolling snapshots (interval 1 s) of another sandbox with as much written
        rsid = c.create(**dict(body, snapshot_interval_s=1))["id"]
        r = c.exec(rsid, f"dd if=/dev/urandom of=/home/big bs=1M count={a.mb} 2>/dev/null")
        assert r["exit_code"] == 0, r
        t_written = time.time()
        deadline = time.time() + 120
        rolling = []
        while time.time() < deadline:
            snaps = c.get(f"/v1/sandboxes/{rsid}/snapshots")["snapshots"]
            rolling = [s for s in snaps if s["rolling"] and s["size_bytes"] >= a.mb << 20]
            if len(rolling) >= a.rounds:
                break
            time.sleep(0.5)
        c.remove(rsid, purge=True)
        rolling_kinds = sorted({s["kind"] for s in rolling})
        # pause/resume of a small sandbox (what an agent's workspace looks like) and the big
        # one: resume from a files snapshot taken just before the pause, and (where the node
        # takes full snapshots) from the pause's own full snapshot
        small = c.create(**body)["id"]
        c.put_file(small, "/home/work.txt", b"x" * 100000)
        res, kind_of = {}, {}
        for name, s_id in (("small", small), (f"{a.mb} MB", sid)):
            pw, rs, pkind = [], {}, set()
            for i in range(a.rounds if name == "small" else few):
                sf = c.post(f"/v1/sandboxes/{s_id}/snapshots", {"kind": "files"})
                p, ms = timed(lambda: c.post(f"/v1/sandboxes/{s_id}/pause"))
                pw.append(ms)
                pkind.add(p["snapshot"]["kind"])
                for s in (sf, p["snapshot"]):
                    kind_of[s["id"]] = s["kind"]
                _, ms = timed(lambda: c.post(f"/v1/sandboxes/{s_id}/resume",
                                             {"snapshot_id": sf["id"]}))
                rs.setdefault(sf["kind"], []).append(ms)
                if p["snapshot"]["kind"] != sf["kind"]:  # a full pause: resume from it too
                    p1 = p
                    p = c.post(f"/v1/sandboxes/{s_id}/pause")
                    kind_of[p["snapshot"]["id"]] = p["snapshot"]["kind"]
                    _, ms = timed(lambda: c.post(f"/v1/sandboxes/{s_id}/resume"))
                    # a resume right after the pause: a thaw where coved keeps pauses hot
                    rs.setdefault(p["snapshot"]["kind"], []).append(ms)
                    # the same-run anchor: a full resume from the store (an older full
                    # snapshot than the pause's, so no frozen copy is at it: CRIU restores)
                    c.post(f"/v1/sandboxes/{s_id}/pause")
                    _, ms = timed(lambda: c.post(f"/v1/sandboxes/{s_id}/resume",
                                                 {"snapshot_id": p1["snapshot"]["id"]}))
                    rs.setdefault("full, restored from the store", []).append(ms)
            res[name] = (pw, "/".join(sorted(pkind)), rs)
        server = {}
        with open(d.log_path, errors="replace") as f:
            for line in f:
                m = re.search(r"resumed from snapshot (\S+) in ([\d.]+) ms \(restore ([\d.]+) "
                              r"ms, start ([\d.]+) ms\)", line)
                if m and small in line:
                    k = kind_of.get(m.group(1), "?")
                    if "a thaw of its hot pause" in line:
                        k += ", a thaw of its hot pause"
                    server.setdefault(k, []).append(tuple(float(x) for x in m.groups()[1:]))
        # fork of 10 at once from the small sandbox's newest snapshot
        snap_id = c.sandbox(small)["last_snapshot_id"]
        fk = c.get(f"/v1/snapshots/{snap_id}")["kind"]
        f, fork_ms = timed(lambda: c.ok("POST", f"/v1/sandboxes/{small}/fork",
                                        {"snapshot_id": snap_id, "count": 10}, expect=(201,)))
        for x in f["sandboxes"]:
            c.remove(x["id"], purge=True)
        reflink_ms = reflink_anchor(data, a.mb)
        print(f"time machine, ns runtime, busybox; {a.mb} MB written; load "
              f"{open('/proc/loadavg').read().split()[0]}; node snapshots: {node_kind}"
              f"{'; COVE_CRIU=' + os.environ['COVE_CRIU'] if 'COVE_CRIU' in os.environ else ''}"
              "\n")
        print("| what | p50 | p90 | min | max | n | unit |")
        print("|---|---|---|---|---|---|---|")
        for kind in sorted(pause):
            print(row(f"stop-the-world pause, POST snapshot kind {kind} ({a.mb} MB written)",
                      pause[kind]))
        print(row(f"stop-the-world pause, rolling snapshots ({'/'.join(rolling_kinds) or '-'}, "
                  f"interval 1 s, {a.mb} MB written)", [s["pause_ms"] for s in rolling]))
        for kind in sorted(total):
            print(row(f"POST snapshot kind {kind} (pause + capture of ~1 MB new)", total[kind]))
        for name, (pw, pkind, rs) in res.items():
            print(row(f"POST pause ({pkind} snapshot + stop), {name} sandbox", pw))
            for k in sorted(rs):
                print(row(f"POST resume from a {k} snapshot, {name} sandbox (client)", rs[k]))
        for k in sorted(server):
            print(row(f"resume from {k}, small: coved's figure", [x[0] for x in server[k]]))
            print(row("  of which restore from the store", [x[1] for x in server[k]]))
            print(row("  of which start on the image", [x[2] for x in server[k]]))
        print(f"\nfork of 10 at once (from a {fk} snapshot): {fork_ms:.0f} ms total")
        print(f"rolling snapshots: {len(rolling)} taken in {time.time() - t_written:.0f} s "
              "after the write")
        print(f"idle snapshot: first {first['size_bytes'] / 1e6:.1f} MB logical; next snapshot of "
              f"the unchanged sandbox added {s2['new_bytes']} bytes "
              f"({100.0 * s2['new_bytes'] / max(1, s1['size_bytes']):.3f}% of its "
              f"{s1['size_bytes'] / 1e6:.1f} MB)")
        goals(res, a.mb, fk, fork_ms, reflink_ms)
    finally:
        d.stop()
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
