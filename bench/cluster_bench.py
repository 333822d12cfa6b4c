#!/usr/bin/env python3
"""make bench-cluster: starts a throwaway PostgreSQL (tests/lib/pgserver.py) and runs
bench/cluster_bench.c against it and a SQLite file in the same run. Figures only.
Usage: cluster_bench.py --build DIR [--n CYCLES] [--clients C]"""
import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
import pgserver  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--clients", type=int, default=4)
    a = ap.parse_args()
    why = pgserver.available()
    if why:
        print(f"cluster_bench: SKIP: {why}")
        return 0
    exe = os.path.join(os.path.abspath(a.build), "bench", "cluster_bench")
    with pgserver.PgServer() as pg:
        url = pg.create_db("bench")
        return subprocess.run([exe, "--pg", url, "--n", str(a.n), "--clients",
                               str(a.clients)]).returncode


if __name__ == "__main__":
    sys.exit(main())
