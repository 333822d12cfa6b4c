#!/usr/bin/env python3
"""Starts a coved with both E2B listeners and runs tests/e2b/coverage.mjs against it: the
table of SDK calls that work per area. Not part of the test suite (a measuring tool).

  sudo COVE_TEMPLATES_DIR=/work/test-templates tests/e2b/run_coverage.py [--build DIR] [--verbose]

--build: the build dir whose coved to run (default build/); the SDK is installed with
`npm ci` (the version pinned in tests/e2b/package-lock.json) into <build>/e2b-sdk, or
--sdk DIR.
"""
import argparse
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from cove import Coved, free_port  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--sdk", default=None)
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    sdk = a.sdk or os.path.join(os.path.abspath(a.build), "e2b-sdk")
    os.makedirs(sdk, exist_ok=True)
    for f in ("package.json", "package-lock.json", "coverage.mjs"):
        shutil.copy(os.path.join(HERE, f), os.path.join(sdk, f))
    if not os.path.isdir(os.path.join(sdk, "node_modules", "e2b")):
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=sdk, check=True)
    api, sbx = free_port(), free_port()
    d = Coved(os.path.abspath(a.build), templates_dir=os.environ.get("COVE_TEMPLATES_DIR"),
              extra_args=["--templates", "busybox,base", "--e2b-api-listen", f"127.0.0.1:{api}",
                          "--e2b-sandbox-listen", f"127.0.0.1:{sbx}"])
    try:
        env = dict(os.environ, E2B_API_URL=f"http://127.0.0.1:{api}",
                   E2B_SANDBOX_URL=f"http://127.0.0.1:{sbx}",
                   E2B_API_KEY="e2b_" + d.client.key.encode().hex())
        env.pop("E2B_DEBUG", None)
        ver = subprocess.run(["node", "-p", "require('e2b/package.json').version"], cwd=sdk,
                             capture_output=True, text=True).stdout.strip()
        print(f"e2b {ver}, coved {a.build}, load {os.getloadavg()[0]:.1f}")
        r = subprocess.run(["node", "coverage.mjs"] + (["--verbose"] if a.verbose else []),
                           cwd=sdk, env=env, timeout=1800)
        return r.returncode
    finally:
        d.stop()


if __name__ == "__main__":
    sys.exit(main())
