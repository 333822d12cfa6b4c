#!/usr/bin/env python3
"""Code interpreter: `1+1` round trip on a warm Python context through POST …/code, next to
the same cell sent straight to the interpreter server from inside the sandbox (its
loopback: what the relay adds) and to `python3 -c 'print(1+1)'` through exec (a fresh
interpreter per call, what a user without contexts does); the first cell of a new sandbox
(server start + kernel start + the cell). Prints p50/p90 in ms and the load average.

    bench/code_bench.py --build build [--rounds 100] [--first 3]
"""
import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "lib"))
from cove import Coved  # noqa: E402
from benchlib import loadavg, pct  # noqa: E402

DIRECT = r'''
import http.client, json, sys, time
n = int(sys.argv[1]); lat = []
body = json.dumps({"code": "1+1"})
for _ in range(n):
    t = time.monotonic()
    h = http.client.HTTPConnection("127.0.0.1", 49999, timeout=60)
    h.request("POST", "/execute", body=body, headers={"Content-Type": "application/json"})
    r = h.getresponse(); out = r.read(); h.close()
    assert b'"2"' in out, out
    lat.append((time.monotonic() - t) * 1000)
print(json.dumps(lat))
'''


def run_ms(c, sid, code):
    t = time.monotonic()
    lines = list(c.stream(f"/v1/sandboxes/{sid}/code", {"code": code}, timeout=600))
    ms = (time.monotonic() - t) * 1000
    assert any(x.get("text") == "2" for x in lines), lines
    return ms


def row(name, xs):
    print(f"| {name} | {pct(xs, 50):.1f} | {pct(xs, 90):.1f} | {len(xs)} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--templates", default=None)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--first", type=int, default=3)
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: must run as root (coved's ns runtime needs it)")
    templates = a.templates or os.environ.get("COVE_TEMPLATES_DIR") or os.path.join(
        a.build, "test-templates")
    data = tempfile.mkdtemp(prefix="cove-bench-code-")
    d = Coved(os.path.abspath(a.build), data_dir=data, templates_dir=templates,
              extra_args=["--templates", "busybox,code-interpreter", "--pool", "0"])
    try:
        c = d.client
        print(f"# code interpreter bench, load average {loadavg()}, {os.cpu_count()} cpus")
        first = []
        for _ in range(a.first):
            sid = c.create("code-interpreter", snapshot_interval_s=0)["id"]
            first.append(run_ms(c, sid, "1+1"))
            c.remove(sid)
        sid = c.create("code-interpreter", snapshot_interval_s=0)["id"]
        run_ms(c, sid, "1+1")  # warm
        warm = [run_ms(c, sid, "1+1") for _ in range(a.rounds)]
        c.put_file(sid, "/tmp/direct.py", DIRECT.encode())
        r = c.exec(sid, ["python3", "/tmp/direct.py", str(a.rounds)], timeout=600)
        direct = json.loads(r["stdout"])
        fresh = []
        for _ in range(min(a.rounds, 30)):
            t = time.monotonic()
            out = c.exec(sid, ["python3", "-c", "print(1+1)"])
            fresh.append((time.monotonic() - t) * 1000)
            assert out["stdout"].strip() == "2"
        print("| what | p50 ms | p90 ms | n |\n|---|---|---|---|")
        row("runCode('1+1') through POST …/code (warm context)", warm)
        row("the same cell to the server from inside the sandbox", direct)
        row("exec python3 -c 'print(1+1)' (no context)", fresh)
        row("first cell of a new sandbox (server + kernel start)", first)
        print(f"\nload average after: {loadavg()}")
        c.remove(sid)
    finally:
        d.stop()


if __name__ == "__main__":
    main()
