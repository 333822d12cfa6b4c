"""Full snapshots (CRIU) of an ns sandbox holding 100 MB in RAM (docs/storage.md "Full
snapshots"). Run as root from the checkout after `make`:
    BUILD=build python3 bench/full_snapshot_bench.py [--mb 100] [--runs 3] [--template base]
or `make bench-full`. Starts its own coved on a temp data dir (templates from
COVE_TEMPLATES_DIR, default $BUILD/test-templates) and prints a markdown table:
- full snapshot (POST …/snapshots) of the sandbox: API time, stop-the-world pause (freeze to
  thaw: criu dump + layer clone), logical size, new bytes, bytes added to the store on disk;
- a second full snapshot of the idle sandbox (dedup);
- pause and resume with full snapshots (resume = restore from the local store + criu
  restore + rechannel), and that the in-memory data survived (a checksum the process prints).
The RAM is random bytes (incompressible, so stored bytes ~ what the process holds)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from cove import Coved  # noqa: E402

HOLD = ("import os,sys,time,hashlib\n"
        "b=os.urandom({mb}<<20)\n"
        "h=hashlib.sha256(b).hexdigest()\n"
        "open('/tmp/ready','w').write(h)\n"
        "while True:\n"
        "    time.sleep(0.2)\n"
        "    open('/tmp/alive','w').write(hashlib.sha256(b).hexdigest())\n")


def du(path):
    out = subprocess.run(["du", "-sb", path], capture_output=True, text=True).stdout
    return int(out.split()[0]) if out else 0


def wait(fn, what, timeout=120):
    end = time.time() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.time() > end:
            raise SystemExit(f"bench: timed out waiting for {what}")
        time.sleep(0.05)


def file_of(c, sid, path):
    r = c.request("GET", f"/v1/sandboxes/{sid}/files?path={path}")
    return r.body.decode() if r.status == 200 else ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.environ.get("BUILD", "build"))
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--template", default="base")
    a = ap.parse_args()
    build = a.build if os.path.isabs(a.build) else os.path.join(ROOT, a.build)
    tdir = os.environ.get("COVE_TEMPLATES_DIR") or os.path.join(build, "test-templates")
    d = Coved(build, templates_dir=tdir)
    try:
        c = d.client
        kind = c.snapshot_kind()
        if kind != "full":
            raise SystemExit(f"bench: this coved has no full snapshots (/healthz: {kind}); "
                             "install CRIU (scripts/install-deps) and see coved's log")
        store = os.path.join(d.data, "store")
        rows = {k: [] for k in ("snap_api", "snap_pause", "snap_size", "snap_new", "snap_disk",
                                "idle_new", "idle_disk", "idle_pause", "pause_api",
                                "resume_api", "pause_pause")}
        for run in range(a.runs):
            sid = c.create(template=a.template, memory_mb=max(512, a.mb * 3),
                           snapshot_interval_s=0)["id"]
            list(c.stream(f"/v1/sandboxes/{sid}/exec",
                          {"cmd": ["python3", "-c", HOLD.format(mb=a.mb)]}, max_events=1))
            digest = wait(lambda: file_of(c, sid, "/tmp/ready"), "the process to fill its RAM")
            b0 = du(store)
            t = time.perf_counter()
            s1 = c.post(f"/v1/sandboxes/{sid}/snapshots", {"label": "bench"}, expect=201)
            rows["snap_api"].append((time.perf_counter() - t) * 1000)
            assert s1["kind"] == "full", s1
            b1 = du(store)
            rows["snap_pause"].append(s1["pause_ms"])
            rows["snap_size"].append(s1["size_bytes"])
            rows["snap_new"].append(s1["new_bytes"])
            rows["snap_disk"].append(b1 - b0)
            s2 = c.post(f"/v1/sandboxes/{sid}/snapshots", {"label": "idle"}, expect=201)
            rows["idle_new"].append(s2["new_bytes"])
            rows["idle_disk"].append(du(store) - b1)
            rows["idle_pause"].append(s2["pause_ms"])
            t = time.perf_counter()
            p = c.post(f"/v1/sandboxes/{sid}/pause")
            rows["pause_api"].append((time.perf_counter() - t) * 1000)
            rows["pause_pause"].append(p["snapshot"]["pause_ms"])
            t = time.perf_counter()
            c.post(f"/v1/sandboxes/{sid}/resume")
            rows["resume_api"].append((time.perf_counter() - t) * 1000)
            # the same bytes are still in the process's memory after the restore
            c.exec(sid, "rm -f /tmp/alive")
            alive = wait(lambda: file_of(c, sid, "/tmp/alive"), "the restored process")
            assert alive == digest, "memory changed across pause/resume"
            c.remove(sid, purge=True)
        med = {k: statistics.median(v) for k, v in rows.items() if v}
        mb = 1e6
        lines = [
            f"Full snapshots, ns sandbox (template {a.template}) with a process holding "
            f"{a.mb} MB of random bytes in RAM; median of {a.runs} runs "
            f"(`BUILD={a.build} python3 bench/full_snapshot_bench.py --mb {a.mb} --runs {a.runs}`)",
            "",
            "| what | figure |",
            "|---|---|",
            f"| full snapshot, API time | {med['snap_api']:.0f} ms |",
            f"| full snapshot, stop-the-world (freeze → dump → layer clone → thaw) | "
            f"{med['snap_pause']:.0f} ms |",
            f"| full snapshot, logical size / new / on disk | {med['snap_size'] / mb:.1f} MB / "
            f"{med['snap_new'] / mb:.1f} MB / {med['snap_disk'] / mb:.1f} MB |",
            f"| 2nd full snapshot of the idle sandbox: new / on disk / pause | "
            f"{med['idle_new'] / mb:.2f} MB / {med['idle_disk'] / mb:.2f} MB / "
            f"{med['idle_pause']:.0f} ms |",
            f"| pause (full snapshot + stop), API time / its stop-the-world | "
            f"{med['pause_api']:.0f} ms / {med['pause_pause']:.0f} ms |",
            f"| resume (restore from the local store + criu restore + rechannel), API time | "
            f"{med['resume_api']:.0f} ms |",
            "| RAM content after resume | identical (sha256 printed by the restored process) |",
        ]
        print("\n".join(lines))
        print(json.dumps({"runs": rows}, indent=None))
    finally:
        d.stop()


if __name__ == "__main__":
    main()
