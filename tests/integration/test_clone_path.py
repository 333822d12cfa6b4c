"""Full snapshots do not depend on where the project is: a coved (and its cove-guest) run
from under a directory only root may enter (mode 0700, as `mktemp -d` and root's home make
it) still passes its CRIU self-check, because sandboxes run a copy of the guest that coved
keeps where their uids can reach it; and `cove up` says at start when full snapshots are
unavailable, and why."""
import os
import shutil
import subprocess
import tempfile

import pytest
from cove import Coved, remove_data_dir

pytestmark = pytest.mark.root


@pytest.fixture
def private_build(build_dir):
    """A copy of the built coved and cove-guest under a fresh 0700 directory."""
    top = tempfile.mkdtemp(prefix="cove-0700-")
    assert os.stat(top).st_mode & 0o777 == 0o700
    b = os.path.join(top, "clone", "build")
    os.makedirs(b)
    for f in ("coved", "cove-guest", "cove"):
        shutil.copy2(os.path.join(build_dir, f), os.path.join(b, f))
    yield b
    shutil.rmtree(top, ignore_errors=True)


@pytest.mark.parametrize("data_inside", [False, True], ids=["data-in-tmp", "data-under-0700"])
def test_full_snapshots_from_a_build_under_a_0700_directory(private_build, templates_dir,
                                                            log_dir, data_inside):
    criu = [p for p in ("/usr/local/sbin/criu", "/usr/sbin/criu", "/sbin/criu")
            if os.access(p, os.X_OK)]
    if not criu or os.environ.get("COVE_CRIU") == "off":
        pytest.skip("criu is not installed (scripts/install-deps builds it): no full snapshots")
    data = os.path.join(os.path.dirname(private_build), "data") if data_inside else None
    d = Coved(private_build, data_dir=data, templates_dir=templates_dir, log_dir=log_dir)
    try:
        # the copy sandboxes run: every directory above it open to others, not the build's
        staged = [e.get("msg", "").split()[2] for e in d.log_lines()
                  if e.get("event") == "guest"]
        assert staged and not staged[-1].startswith(os.path.dirname(private_build)), staged
        p = os.path.dirname(staged[-1])
        while p != "/":
            assert os.stat(p).st_mode & 0o001, f"{p} is closed to the sandbox's uids"
            p = os.path.dirname(p)
        kind = d.client.snapshot_kind()
        why = [e.get("msg") for e in d.log_lines() if e.get("event") == "snapshot.full"]
        assert kind == "full", why
        sid = d.client.create(template="busybox", snapshot_interval_s=0)["id"]
        r = d.client.post(f"/v1/sandboxes/{sid}/pause")
        assert r["snapshot"]["kind"] == "full", r["snapshot"]
        assert d.client.post(f"/v1/sandboxes/{sid}/resume")["state"] == "running"
        assert d.client.exec(sid, "echo ok")["stdout"] == "ok\n"
        d.client.remove(sid, purge=True)
    finally:
        d.stop()
        if data:
            remove_data_dir(data)


def test_cove_up_says_when_full_snapshots_are_unavailable(build_dir, templates_dir):
    from cove import Client, free_port, poll, remove_data_dir
    data = tempfile.mkdtemp(prefix="cove-up-")
    port = free_port()
    err = os.path.join(data, "up.stderr")
    argv = [os.path.join(build_dir, "cove"), "up", "--data-dir", data, "--listen",
            f"127.0.0.1:{port}", "--templates-dir", templates_dir, "--templates", "busybox",
            "--e2b-api-listen", "none", "--e2b-sandbox-listen", "none",
            "--egress-pool", f"10.{64 + os.getpid() % 180}.0.0/16", "--pool", "0"]
    with open(err, "wb") as f:
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=f, stdin=subprocess.DEVNULL,
                             env=dict(os.environ, COVE_CRIU="off"), start_new_session=True)
    try:
        c = Client(port)

        def up():
            assert p.poll() is None, f"cove up exited {p.returncode}"
            try:
                return c.request("GET", "/healthz", auth=False).status == 200
            except OSError:
                return False

        poll(up, timeout=300, what="cove up's coved to answer")
        assert c.snapshot_kind() == "files"
        with open(err) as f:
            lines = [line for line in f.read().splitlines() if line.startswith("cove up:")]
        assert lines and "full snapshots unavailable" in lines[0], lines
        assert "COVE_CRIU=off" in lines[0], lines  # the reason, as /healthz's kind has it
    finally:
        if p.poll() is None:
            p.terminate()
            p.wait(timeout=60)
        remove_data_dir(data)
