"""The E2B-compatible surface (docs/e2b.md) driven by the real `e2b` npm SDK.

Installs the SDK pinned in tests/e2b/package-lock.json (`npm ci`, into the build dir so
parallel builds never share a node_modules), starts a coved with both E2B listeners on
free ports and the base template, and runs tests/e2b/e2b.test.mjs with node's built-in
test runner. Skips, saying why, when node/npm are missing or `npm ci` fails (no registry).
"""
import os
import shutil
import subprocess

import pytest

from cove import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "tests", "e2b")
FILES = ("package.json", "package-lock.json", "e2b.test.mjs")


def e2b_key(cove_key):
    """The E2B API key for a cove API key: e2b_ + hex of its bytes."""
    return "e2b_" + cove_key.encode().hex()


@pytest.fixture(scope="module")
def sdk_dir(build_dir):
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        pytest.skip("node and npm are needed for the E2B SDK tests (apt install nodejs npm)")
    out = subprocess.run([node, "--version"], capture_output=True, text=True)
    major = int(out.stdout.strip().lstrip("v").split(".")[0] or 0)
    if major < 18:
        pytest.skip(f"node {out.stdout.strip()} is too old for the e2b SDK (needs >= 18)")
    d = os.path.join(build_dir, "e2b-sdk")
    os.makedirs(d, exist_ok=True)
    stale = not os.path.isdir(os.path.join(d, "node_modules", "e2b"))
    for f in FILES:
        src, dst = os.path.join(SRC, f), os.path.join(d, f)
        with open(src, "rb") as a:
            new = a.read()
        old = open(dst, "rb").read() if os.path.exists(dst) else None
        if old != new:
            if f != "e2b.test.mjs":
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


def test_e2b_sdk(sdk_dir, coved_factory):
    api, sbx = free_port(), free_port()
    d = coved_factory(extra_args=["--templates", "busybox,base",
                                  "--e2b-api-listen", f"127.0.0.1:{api}",
                                  "--e2b-sandbox-listen", f"127.0.0.1:{sbx}"])
    env = dict(os.environ,
               E2B_API_URL=f"http://127.0.0.1:{api}",
               E2B_SANDBOX_URL=f"http://127.0.0.1:{sbx}",
               E2B_API_KEY=e2b_key(d.client.key),
               COVE_E2B_TEMPLATE=os.environ.get("COVE_E2B_TEMPLATE", "base"),
               # "full": pause keeps running processes (CRIU); "files": it keeps files only
               COVE_SNAPSHOTS=d.client.snapshot_kind())
    env.pop("E2B_DEBUG", None)
    r = subprocess.run(["node", "--test", "--test-concurrency=1", "--test-reporter=tap",
                        "e2b.test.mjs"], cwd=sdk_dir, env=env, capture_output=True, text=True,
                       timeout=900)
    out = r.stdout + r.stderr
    summary = [line for line in out.splitlines() if line.startswith(("# pass", "# fail"))]
    assert r.returncode == 0, f"E2B SDK tests failed ({', '.join(summary)}):\n{out[-12000:]}"
    assert summary and summary[0].startswith("# pass") and int(summary[0].split()[2]) > 0, out
    print("\n".join(summary))
