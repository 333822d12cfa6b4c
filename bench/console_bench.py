#!/usr/bin/env python3
"""Operator console first load on loopback: the bytes and the time to fetch what the login
page loads (index.html, style.css, xterm.css, app.js) and what a sandbox's page adds
(xterm.mjs), one keep-alive connection as a browser would use, from a real coved. Anchor from
the same run: GET /v1/sandboxes (the first API call the page makes) on the same connection.
Prints median and p90 in ms and the load average. The browser-side figure (Chromium, navigation
to the login form) is printed by tests/integration/test_console.py.

    bench/console_bench.py --build build [--rounds 200]
"""
import argparse
import http.client
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "lib"))
from benchlib import loadavg, pct, timed  # noqa: E402
from cove import Coved, remove_data_dir  # noqa: E402

LOGIN = ("/ui", "/ui/style.css", "/ui/xterm.css", "/ui/app.js")
SANDBOX = ("/ui/xterm.mjs",)


def fetch_all(port, paths, headers=None):
    h = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    n = 0
    for p in paths:
        h.request("GET", p, headers=headers or {})
        r = h.getresponse()
        body = r.read()
        assert r.status == 200, (p, r.status)
        n += len(body)
    h.close()
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=200)
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: must run as root (coved needs it)")
    data = tempfile.mkdtemp(prefix="cove-bench-console-")
    d = Coved(os.path.abspath(a.build), data_dir=data, extra_args=["--pool", "0"])
    try:
        auth = {"Authorization": f"Bearer {d.client.key}"}
        rows = []
        for name, paths, hdr in (("login page (4 files)", LOGIN, None),
                                 ("sandbox page adds xterm.mjs", SANDBOX, None),
                                 ("anchor: GET /v1/sandboxes", ("/v1/sandboxes",), auth)):
            fetch_all(d.port, paths, hdr)  # warm the page cache
            ms = []
            for _ in range(a.rounds):
                nbytes, t = timed(lambda: fetch_all(d.port, paths, hdr))
                ms.append(t)
            rows.append((name, nbytes, pct(ms, 50), pct(ms, 90)))
        print(f"console first load on loopback, {a.rounds} rounds, load average {loadavg()}")
        print("| what | bytes | median ms | p90 ms |\n|---|---:|---:|---:|")
        for name, nbytes, p50, p90 in rows:
            print(f"| {name} | {nbytes} | {p50:.2f} | {p90:.2f} |")
    finally:
        d.stop()
        remove_data_dir(data)


if __name__ == "__main__":
    main()
