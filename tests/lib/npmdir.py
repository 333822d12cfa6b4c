"""An npm project of the tests (a package.json + package-lock.json under tests/) installed
into the build dir with `npm ci` (so parallel builds never share a node_modules), again
only when its package files change. Skips the calling test, saying why, when node/npm are
missing or too old or `npm ci` fails (no registry)."""
import os
import shutil
import subprocess

import pytest


def npm_dir(build_dir, src, files, name, installed, what):
    """build_dir/name holding src's files (test scripts refreshed every time); installed is
    the node_modules path that proves an earlier install; what names the tests in skips."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        pytest.skip(f"node and npm are needed for the {what} (apt install nodejs npm)")
    out = subprocess.run([node, "--version"], capture_output=True, text=True)
    major = int(out.stdout.strip().lstrip("v").split(".")[0] or 0)
    if major < 18:
        pytest.skip(f"node {out.stdout.strip()} is too old for the {what} (needs >= 18)")
    d = os.path.join(build_dir, name)
    os.makedirs(d, exist_ok=True)
    stale = not os.path.isdir(os.path.join(d, "node_modules", installed))
    for f in files:
        with open(os.path.join(src, f), "rb") as a:
            new = a.read()
        dst = os.path.join(d, f)
        old = open(dst, "rb").read() if os.path.exists(dst) else None
        if old != new:
            if not f.endswith(".mjs"):
                stale = True
            with open(dst, "wb") as b:
                b.write(new)
    if stale:
        r = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=d, capture_output=True,
                           text=True, timeout=600)
        if r.returncode != 0:
            shutil.rmtree(os.path.join(d, "node_modules"), ignore_errors=True)
            pytest.skip(f"npm ci failed (is the npm registry reachable?): "
                        f"{(r.stderr or r.stdout).strip()[-400:]}")
    return d
