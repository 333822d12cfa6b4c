"""The E2B-compatible surface (docs/e2b.md) driven by the real `e2b` npm SDK.

Installs the SDK pinned in tests/e2b/package-lock.json (`npm ci`, into the build dir so
parallel builds never share a node_modules), starts a coved with both E2B listeners on
free ports and the base template, and runs tests/e2b/e2b.test.mjs with node's built-in
test runner. Skips, saying why, when node/npm are missing or `npm ci` fails (no registry).
"""
import os
import subprocess

import pytest

from cove import free_port
from npmdir import npm_dir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "tests", "e2b")
FILES = ("package.json", "package-lock.json", "e2b.test.mjs", "e2b_template.test.mjs")


def e2b_key(cove_key):
    """The E2B API key for a cove API key: e2b_ + hex of its bytes."""
    return "e2b_" + cove_key.encode().hex()


@pytest.fixture(scope="module")
def sdk_dir(build_dir):
    return npm_dir(build_dir, SRC, FILES, "e2b-sdk", "e2b", "E2B SDK tests")


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


def test_e2b_sdk_custom_template(sdk_dir, build_dir, log_dir, tmp_path):
    """Sandbox.create('NAME') works for a template the tenant built from an OCI image."""
    import shutil as _sh
    import tempfile
    from cove import Coved, poll
    import oci
    if os.geteuid() != 0:
        pytest.skip("coved's namespace runtime needs root")
    tdir = str(tmp_path / "templates")
    api, sbx = free_port(), free_port()
    d = Coved(build_dir, templates_dir=tdir, log_dir=log_dir,
              extra_args=["--e2b-api-listen", f"127.0.0.1:{api}",
                          "--e2b-sandbox-listen", f"127.0.0.1:{sbx}"])
    reg = oci.Registry()
    try:
        def app(t):
            oci.file_entry(t, "app", kind=oci.tarfile.DIRTYPE, mode=0o755)
            oci.file_entry(t, "app/hello.txt", b"hello from the image\n")
        lay = tempfile.mkdtemp(prefix="cove-oci-")
        oci.make_layout(lay, [oci.rootfs_layer(os.path.join(tdir, "busybox", "rootfs")),
                              oci.tar_bytes(app)], workdir="/app")
        ref = f"{reg.host}/e2b/custom:latest"
        oci.push(lay, ref)
        _sh.rmtree(lay)
        c = d.client
        c.post("/v1/templates", {"name": "my-template", "from": {"image": ref}, "insecure": True},
               expect=(202,))
        t = poll(lambda: (x := c.get("/v1/templates/my-template"))["state"] != "building" and x,
                 timeout=300, what="template built")
        assert t["state"] == "ready", t
        env = dict(os.environ, E2B_API_URL=f"http://127.0.0.1:{api}",
                   E2B_SANDBOX_URL=f"http://127.0.0.1:{sbx}", E2B_API_KEY=e2b_key(c.key),
                   COVE_E2B_TEMPLATE="my-template")
        env.pop("E2B_DEBUG", None)
        r = subprocess.run(["node", "--test", "--test-reporter=tap", "e2b_template.test.mjs"],
                           cwd=sdk_dir, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    finally:
        reg.stop()
        d.stop()
