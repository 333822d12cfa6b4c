"""Full snapshots (CRIU) of an ns sandbox holding 100 MB in RAM (docs/storage.md "Full
snapshots"). Run as root from the checkout after `make`:
    BUILD=build python3 bench/full_snapshot_bench.py [--mb 100] [--runs 3] [--template base]
or `make bench-full`. Starts its own coved on a temp data dir (templates from
COVE_TEMPLATES_DIR, default $BUILD/test-templates) and prints a markdown table:
- the first pause (a full snapshot whose 100 MB are all new to the store, then stop): the
  stop-the-world time (freeze to the end of the dump) and the API time; sizes and bytes added
  to the store on disk;
- resume (restore from the local store + criu restore + rechannel), and that the in-memory
  data survived (a sha256 the restored process writes);
- a full snapshot of the idle resumed sandbox (dedup), and a second pause/resume.
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
        rows = {k: [] for k in ("p1_api", "p1_pause", "p1_size", "p1_new", "p1_disk", "r1_api",
                                "s2_api", "s2_pause", "s2_new", "s2_disk", "p2_api", "r2_api")}

        def resumed_intact(sid, digest):
            c.exec(sid, "rm -f /tmp/alive")  # the restored process writes it again
            alive = wait(lambda: file_of(c, sid, "/tmp/alive"), "the restored process")
            assert alive == digest, "memory changed across pause/resume"

        for run in range(a.runs):
            sid = c.create(template=a.template, memory_mb=max(512, a.mb * 3),
                           snapshot_interval_s=0)["id"]
            list(c.stream(f"/v1/sandboxes/{sid}/exec",
                          {"cmd": ["python3", "-c", HOLD.format(mb=a.mb)]}, max_events=1))
            digest = wait(lambda: file_of(c, sid, "/tmp/ready"), "the process to fill its RAM")
            # 1. first pause: a full snapshot with all 100 MB new to the store, then stop
            b0 = du(store)
            t = time.perf_counter()
            p = c.post(f"/v1/sandboxes/{sid}/pause")
            rows["p1_api"].append((time.perf_counter() - t) * 1000)
            assert p["snapshot"]["kind"] == "full", p
            rows["p1_pause"].append(p["snapshot"]["pause_ms"])
            rows["p1_size"].append(p["snapshot"]["size_bytes"])
            rows["p1_new"].append(p["snapshot"]["new_bytes"])
            rows["p1_disk"].append(du(store) - b0)
            t = time.perf_counter()
            c.post(f"/v1/sandboxes/{sid}/resume")
            rows["r1_api"].append((time.perf_counter() - t) * 1000)
            resumed_intact(sid, digest)
            # 2. a full snapshot of the (idle) resumed sandbox: what dedup leaves
            b1 = du(store)
            t = time.perf_counter()
            s2 = c.post(f"/v1/sandboxes/{sid}/snapshots", {"label": "idle"}, expect=201)
            rows["s2_api"].append((time.perf_counter() - t) * 1000)
            rows["s2_pause"].append(s2["pause_ms"])
            rows["s2_new"].append(s2["new_bytes"])
            rows["s2_disk"].append(du(store) - b1)
            # 3. pause/resume again: the capture is mostly already in the store
            t = time.perf_counter()
            c.post(f"/v1/sandboxes/{sid}/pause")
            rows["p2_api"].append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            c.post(f"/v1/sandboxes/{sid}/resume")
            rows["r2_api"].append((time.perf_counter() - t) * 1000)
            resumed_intact(sid, digest)
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
            f"| 1st pause: stop-the-world (freeze → criu dump → layer clone; frozen until stopped) | "
            f"{med['p1_pause']:.0f} ms |",
            f"| 1st pause: API time (dump + capture of all of it into the store + stop) | "
            f"{med['p1_api']:.0f} ms |",
            f"| 1st full snapshot: logical size / new / added on disk | {med['p1_size'] / mb:.1f} MB"
            f" / {med['p1_new'] / mb:.1f} MB / {med['p1_disk'] / mb:.1f} MB |",
            f"| resume (restore from the local store + criu restore + rechannel), API time | "
            f"{med['r1_api']:.0f} ms |",
            f"| full snapshot of the idle resumed sandbox: stop-the-world / API time | "
            f"{med['s2_pause']:.0f} ms / {med['s2_api']:.0f} ms |",
            f"| full snapshot of the idle resumed sandbox: new / added on disk | "
            f"{med['s2_new'] / mb:.2f} MB / {med['s2_disk'] / mb:.2f} MB |",
            f"| 2nd pause / resume (store already has most chunks), API time | "
            f"{med['p2_api']:.0f} ms / {med['r2_api']:.0f} ms |",
            "| RAM content after each resume | identical (sha256 from the restored process) |",
        ]
        print("\n".join(lines))
        print(json.dumps({"runs": rows}, indent=None))
    finally:
        d.stop()


if __name__ == "__main__":
    main()
