#!/usr/bin/env python3
"""make bench-cluster: the cluster's own costs, each next to the single process (`coved`,
role all, SQLite and the local store) measured in the same run. Figures only.

  placement   placement cycles/s on a throwaway PostgreSQL next to a SQLite file
              (bench/cluster_bench.c)
  create      create→ready p50/p90 through a control replica vs role all
  resume      resume of a paused sandbox on another node (small and 100 MB written;
              files and full snapshots) vs a resume on the same role-all coved
  drain       drain of 20 sandboxes off one node: wall time, the longest time one sandbox
              was not running (sampled through the API), vs pause+resume of 20 in role all
  idle        what an idle node's lease and job loop cost: CPU ticks of its coved over a
              window (default 60 s) and PostgreSQL transactions/s, vs an idle role-all
              coved (CPU ticks) and one on PostgreSQL (transactions/s)

The cluster parts start a whole cluster on this machine (tests/lib/cluster.py: PostgreSQL,
radosgw, node hosts in network namespaces, a control replica); they need root. A part whose
cluster role coved does not run yet prints SKIP with coved's reason. The nodes share this
machine's cores with everything else: read ratios, not absolute figures. Every coved runs
with --pool 0 (no warm sandboxes), so create→ready is the cold path on both sides.

Usage: cluster_bench.py --build DIR [--parts placement,create,resume,drain,idle]
       [--n CYCLES] [--clients C] [--creates N] [--drain N] [--idle-s S] [--mb MB]"""
import argparse
import os
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
import pgserver  # noqa: E402
from cove import CoveError  # noqa: E402

PARTS = ("placement", "create", "resume", "drain", "idle")
COVE_CPUS = 1  # cpus of each drained sandbox (small ones)
HOG = ("nohup python3 -c 'import os, time; b = os.urandom({mb} << 20);"
       " open(\"/tmp/ready\", \"w\").write(\"1\"); time.sleep(1e9)' >/dev/null 2>&1 &")


def load():
    return "load %.2f %.2f %.2f" % os.getloadavg()


def pct(xs, p):
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * p / 100.0
    i = int(k)
    j = min(i + 1, len(s) - 1)
    return s[i] + (s[j] - s[i]) * (k - i)


def line(name, cluster, single, unit="ms"):
    ratio = (cluster / single) if cluster and single else float("nan")
    print(f"| {name} | {cluster:.1f} | {single:.1f} | {ratio:.2f} | {unit} |", flush=True)


def header(title):
    print(f"\n### {title} ({load()})")
    print("| figure | cluster | role all | cluster / role all | unit |")
    print("|---|---|---|---|---|", flush=True)


def ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        x = f.read().rsplit(")", 1)[1].split()
    return int(x[11]) + int(x[12])  # utime + stime of coved itself, not its sandboxes


def pg_xacts(pg, db):
    return int(pg.psql("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE "
                       f"datname = '{db}'").strip())


# --- the parts ---------------------------------------------------------------------------
def part_placement(a):
    exe = os.path.join(os.path.abspath(a.build), "bench", "cluster_bench")
    print(f"\n### placement transactions ({load()})", flush=True)
    with pgserver.PgServer() as pg:
        url = pg.create_db("bench")
        return subprocess.run([exe, "--pg", url, "--n", str(a.n), "--clients",
                               str(a.clients)]).returncode


def single(a, extra=()):
    from cove import Coved
    return Coved(a.build_abs, templates_dir=a.templates, extra_args=["--pool", "0", *extra])


def cluster(a, nodes=2):
    from cluster import Cluster
    # --cpu-overcommit: placement counts each node's cpus that many times, so one node of
    # this small machine takes the drain's sandboxes (the default, 4, fits 8 on 2 cpus)
    return Cluster(a.build_abs, a.templates, None, nodes=nodes, controls=1, lease_ttl=10,
                   lease_renew=2,
                   control_args=["--cpu-overcommit", str(max(4, a.drain * COVE_CPUS))])


def create_ready(c, n):
    out = []
    for _ in range(n):
        t0 = time.monotonic()
        sb = c.create(template="busybox", snapshot_interval_s=0)
        c.wait_state(sb["id"], "running", timeout=300)
        out.append((time.monotonic() - t0) * 1000)
        c.remove(sb["id"], purge=True)
    return out


def part_create(a, cl, d):
    header(f"create→ready, busybox, {a.creates} sequential")
    create_ready(d.client, 2)  # warm caches on both sides alike
    create_ready(cl.client(), 2)
    s = create_ready(d.client, a.creates)
    k = create_ready(cl.client(), a.creates)
    line("create→ready p50", pct(k, 50), pct(s, 50))
    line("create→ready p90", pct(k, 90), pct(s, 90))


def paused_with(c, mb, kind):
    """A sandbox paused with a kind snapshot holding mb MB: written to a file (files) or
    held in RAM by a process (full; the base template, for python3)."""
    hold = bool(mb and kind == "full")
    sid = c.create(template="base" if hold else "busybox", snapshot_interval_s=0,
                   memory_mb=max(512, mb * 3))["id"]
    c.wait_state(sid, "running", timeout=300)
    try:
        if mb and kind == "files":
            c.exec(sid, f"dd if=/dev/urandom of=/home/big bs=1M count={mb} 2>/dev/null")
        if hold:
            c.exec(sid, HOG.format(mb=mb))
    except CoveError as e:  # e.g. a control that does not forward exec yet
        c.remove(sid, purge=True)
        return None, str(e)[:160]
        deadline = time.monotonic() + 300
        while c.get_file(sid, "/tmp/ready").status != 200:
            if time.monotonic() > deadline:
                return None, "the RAM holder did not start"
            time.sleep(0.1)
    # the snapshot to resume from, of the kind asked (a pause takes what the node can)
    r = c.request("POST", f"/v1/sandboxes/{sid}/snapshots", {"kind": kind}, timeout=600)
    if r.status != 201:
        c.remove(sid, purge=True)
        return None, f"snapshot {kind}: {r.status} {r.body[:120]!r}"
    snap = r.json()["id"]
    r = c.request("POST", f"/v1/sandboxes/{sid}/pause", {}, timeout=600)
    if r.status != 200:
        c.remove(sid, purge=True)
        return None, f"pause: {r.status} {r.body[:120]!r}"
    return (sid, snap), None


def timed_resume(c, sid_snap):
    sid, snap = sid_snap
    t0 = time.monotonic()
    r = c.request("POST", f"/v1/sandboxes/{sid}/resume", {"snapshot_id": snap}, timeout=600)
    dt = (time.monotonic() - t0) * 1000
    if r.status != 200:
        return None, f"resume: {r.status} {r.body[:160]!r}"
    c.wait_state(sid, "running", timeout=300)
    return dt, None


def part_resume(a, cl, d):
    header("resume of a paused sandbox (cluster: on another node, chunks from S3)")
    cc = cl.client()
    for mb in (0, a.mb):
        for kind in ("files", "full"):
            label = f"resume {kind}, {mb or 'small'}{' MB' if mb else ''}"
            ps, why = paused_with(d.client, mb, kind)
            s = None
            if ps:
                s, why = timed_resume(d.client, ps)
                d.client.remove(ps[0], purge=True)
            if s is None:
                print(f"| {label} | SKIP: {why} | | | |")
                continue
            ps, why = paused_with(cc, mb, kind)
            k = None
            if ps:
                src = cl.placement(ps[0])[0]
                r = cc.request("POST", f"/v1/nodes/{src}/cordon", {})
                if r.status != 200:
                    why = f"cordon: {r.status} {r.body[:120]!r}"
                else:
                    k, why = timed_resume(cc, ps)
                    moved = cl.placement(ps[0])[0] != src
                    cc.request("POST", f"/v1/nodes/{src}/uncordon", {})
                    if k is not None and not moved:
                        k, why = None, "the resume stayed on its node"
                cc.remove(ps[0], purge=True)
            if k is None:
                print(f"| {label} | SKIP: {why} | {s:.1f} | | ms |")
                continue
            line(label, k, s)


def sample_states(c, sids, stop, gaps):
    """The longest time each sandbox was seen not running, sampled every ~50 ms."""
    down = {}
    while not stop.is_set():
        now = time.monotonic()
        for sid in sids:
            try:
                st = c.sandbox(sid).get("state")
            except Exception:  # a replica busy or restarting: not a state
                continue
            if st != "running":
                down.setdefault(sid, now)
            elif sid in down:
                gaps[sid] = max(gaps.get(sid, 0), now - down.pop(sid))
        stop.wait(0.05)
    for sid, t in down.items():
        gaps[sid] = max(gaps.get(sid, 0), time.monotonic() - t)


def part_drain(a, cl, d):
    header(f"drain of {a.drain} sandboxes (cluster) vs pause+resume of each (role all)")
    cc = cl.client()
    src, dst = cl.nodes[0].name, cl.nodes[1].name
    r = cc.request("POST", f"/v1/nodes/{dst}/cordon", {})
    if r.status != 200:
        print(f"| drain | SKIP: cordon: {r.status} {r.body[:160]!r} | | | |")
        return
    sids, full = [], ""
    for _ in range(a.drain):  # room for a.drain with the control's --cpu-overcommit
        r = cc.request("POST", "/v1/sandboxes", {"template": "busybox", "cpus": COVE_CPUS,
                                                 "memory_mb": 256, "snapshot_interval_s": 0},
                       timeout=300)
        if r.status == 503:
            full = r.error.get("message", "")
            break
        sids.append(r.json()["id"])
    for s in sids:
        cc.wait_state(s, "running", timeout=300)
    cc.request("POST", f"/v1/nodes/{dst}/uncordon", {})
    if full:
        print(f"(only {len(sids)} of {a.drain} fit on {src}: {full})")
    a.drain = len(sids)
    gaps, stop = {}, threading.Event()
    t = threading.Thread(target=sample_states, args=(cc, sids, stop, gaps), daemon=True)
    t.start()
    t0 = time.monotonic()
    r = cc.request("POST", f"/v1/nodes/{src}/drain", {}, timeout=3600)
    if r.status in (200, 202):  # done when each runs on another node (not just "running")
        deadline = time.monotonic() + 1800
        left = list(sids)
        while left and time.monotonic() < deadline:
            left = [s for s in left if (cl.placement(s) or (src,))[0] == src
                    or cc.get(f"/v1/sandboxes/{s}")["state"] != "running"]
            time.sleep(0.2)
    wall = time.monotonic() - t0
    stop.set()
    t.join()
    moved = sum(1 for s in sids if cl.placement(s)[0] != src)
    for s in sids:
        cc.remove(s, purge=True)
    cc.request("POST", f"/v1/nodes/{src}/uncordon", {})
    if r.status not in (200, 202):
        print(f"| drain | SKIP: {r.status} {r.body[:160]!r} | | | |")
        return
    ds = [d.client.create(template="busybox", cpus=COVE_CPUS, memory_mb=256,
                          snapshot_interval_s=0)["id"] for _ in range(a.drain)]
    longest, t1 = 0.0, time.monotonic()
    for s in ds:
        d.client.wait_state(s, "running", timeout=300)
    t1 = time.monotonic()
    for s in ds:
        p0 = time.monotonic()
        d.client.post(f"/v1/sandboxes/{s}/pause", timeout=600)
        d.client.post(f"/v1/sandboxes/{s}/resume", timeout=600)
        longest = max(longest, time.monotonic() - p0)
    swall = time.monotonic() - t1
    for s in ds:
        d.client.remove(s, purge=True)
    line(f"wall time ({moved}/{a.drain} moved)", wall, swall, "s")
    line("longest pause of one sandbox", max(gaps.values() or [0]) * 1000, longest * 1000)


def part_idle(a, cl, d, dpg, pg_db):
    header(f"idle cost over {a.idle_s} s (no sandboxes)")
    n = cl.nodes[0]
    x0, k0, s0, p0 = pg_xacts(cl.pg, cl.db), ticks(n.pid), ticks(d.proc.pid), \
        pg_xacts(dpg, pg_db)
    c0 = [ticks(c.pid) for c in cl.controls]
    time.sleep(a.idle_s)  # the window is the measurement
    x1, k1, s1, p1 = pg_xacts(cl.pg, cl.db), ticks(n.pid), ticks(d.proc.pid), \
        pg_xacts(dpg, pg_db)
    c1 = [ticks(c.pid) for c in cl.controls]
    hz = os.sysconf("SC_CLK_TCK")
    line(f"node coved CPU ticks ({hz}/s)", k1 - k0, s1 - s0, "ticks")
    line("control replica CPU ticks", sum(c1) - sum(c0), s1 - s0, "ticks")
    per = len(cl.nodes) + len(cl.controls)
    line(f"PostgreSQL transactions/s ({len(cl.nodes)} nodes + {len(cl.controls)} control; "
         f"role all on PostgreSQL)", (x1 - x0) / a.idle_s, (p1 - p0) / a.idle_s, "tx/s")
    print(f"({per} cluster processes; the psql probes add 2 transactions per window)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--creates", type=int, default=20)
    ap.add_argument("--drain", type=int, default=20)
    ap.add_argument("--idle-s", type=int, default=60)
    ap.add_argument("--mb", type=int, default=100)
    a = ap.parse_args()
    a.build_abs = os.path.abspath(a.build)
    a.templates = os.environ.get("COVE_TEMPLATES_DIR") or os.path.join(a.build_abs,
                                                                      "test-templates")
    parts = [p for p in a.parts.split(",") if p]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        ap.error(f"unknown parts {bad}; known: {PARTS}")
    why = pgserver.available()
    if why:
        print(f"cluster_bench: SKIP: {why}")
        return 0
    print(f"## cluster benchmark ({load()}, {os.cpu_count()} CPUs)")
    rc = 0
    if "placement" in parts:
        rc = part_placement(a)
    rest = [p for p in parts if p != "placement"]
    if not rest:
        return rc
    from cluster import RoleMissing, why_not
    why = why_not()
    if why:
        print(f"cluster_bench: SKIP {rest}: {why}")
        return rc
    try:
        cl = cluster(a)
    except RoleMissing as e:
        print(f"cluster_bench: SKIP {rest}: {e}")
        return rc
    d = dpg = None
    try:
        d = single(a)
        for p in rest:
            try:
                if p == "create":
                    part_create(a, cl, d)
                elif p == "resume":
                    part_resume(a, cl, d)
                elif p == "drain":
                    part_drain(a, cl, d)
                elif p == "idle":
                    dpg_db = "single"
                    cl.pg.create_db(dpg_db)
                    dpg = single(a, ["--db", cl.pg.url_of(dpg_db)])
                    part_idle(a, cl, d, cl.pg, dpg_db)
            except (CoveError, OSError, AssertionError) as e:  # the next part still runs
                print(f"| {p} | FAILED: {str(e)[:300]} | | | |")
                rc = 1
    finally:
        for x in (dpg, d):
            if x:
                x.stop()
        cl.close()
    print(f"\n(end: {load()})")
    return rc


if __name__ == "__main__":
    sys.exit(main())
