"""The node's data disk filling up: coved keeps answering, refuses what needs space with a
clear 503 (never a raw 500), keeps every snapshot and catalog row it had, and works again
once space returns (docs/api.md "Errors", docs/storage.md "When the data disk fills up"). The data dir is
on a 256 MB ext4 the test makes on a loop device of its own (templates stay outside)."""
import os
import subprocess
import tempfile
import time

import pytest

from cove import poll, remove_data_dir

pytestmark = pytest.mark.root

DISK_MSG = "no space left on the node's data disk"


@pytest.fixture
def small_disk():
    d = tempfile.mkdtemp(prefix="cove-diskfull-")
    img, mnt = os.path.join(d, "disk.img"), os.path.join(d, "mnt")
    os.makedirs(mnt)
    subprocess.run(["truncate", "-s", "256M", img], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", img], check=True)
    # mount -o loop attaches a loop device of its own (autoclear: it goes with the unmount)
    subprocess.run(["mount", "-o", "loop", img, mnt], check=True)
    try:
        yield mnt
    finally:
        remove_data_dir(os.path.join(mnt, "data"))  # coved's mounts under it, if any
        subprocess.run(["umount", mnt], check=False)
        if os.path.ismount(mnt):
            subprocess.run(["umount", "-l", mnt], check=False)
        os.unlink(img)
        os.rmdir(mnt)
        os.rmdir(d)


def fill(path):
    """Writes path until the filesystem is full."""
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", "conv=fsync"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    subprocess.run(["sync"], check=False)
    st = os.statvfs(path)
    assert st.f_bavail * st.f_frsize < (4 << 20), "the filesystem did not fill up"


def assert_disk_refusal(r, what):
    assert r.status in (429, 503), f"{what}: {r.status} {r.body[:300]!r}"
    assert r.error["code"] in ("unavailable", "limit_exceeded"), r.error
    assert DISK_MSG in r.error["message"], f"{what}: {r.error}"


def test_full_data_disk_refuses_clearly_loses_nothing_and_recovers(coved_factory, small_disk):
    d = coved_factory(data_dir=os.path.join(small_disk, "data"))
    c = d.client
    a = c.create(template="busybox")["id"]
    c.exec(a, "echo kept-a > /root/keep && sync")
    snap_a = c.post(f"/v1/sandboxes/{a}/snapshots", {"label": "before a"})["id"]
    b = c.create(template="busybox")["id"]
    c.exec(b, "echo kept-b > /root/keep && sync")
    snap_b = c.post(f"/v1/sandboxes/{b}/snapshots", {"label": "before b"})["id"]
    sandboxes = {s["id"] for s in c.get("/v1/sandboxes")["sandboxes"]}
    def listed(sid):
        return {s["id"] for s in c.get(f"/v1/sandboxes/{sid}/snapshots")["snapshots"]}
    before = {sid: listed(sid) for sid in (a, b)}
    assert snap_a in before[a] and snap_b in before[b]

    filler = os.path.join(small_disk, "filler")
    fill(filler)
    try:
        assert c.request("GET", "/healthz", auth=False).status == 200
        assert_disk_refusal(c.request("POST", "/v1/sandboxes", {"template": "busybox"}),
                            "create")
        assert_disk_refusal(c.request("POST", f"/v1/sandboxes/{a}/snapshots", {}), "snapshot")
        assert_disk_refusal(c.request("POST", f"/v1/sandboxes/{a}/fork",
                                      {"snapshot_id": snap_a}), "fork")
        # what needs no space still works, and nothing is answered with a 500
        r = c.request("POST", f"/v1/sandboxes/{b}/exec", {"shell": "cat /root/keep",
                                                          "wait": True})
        assert r.status == 200 and r.json()["stdout"] == "kept-b\n", r
        r = c.request("PUT", f"/v1/sandboxes/{b}/files?path=/root/new", b"y" * (4 << 20))
        assert r.status != 500, r
        assert {s["id"] for s in c.get("/v1/sandboxes")["sandboxes"]} == sandboxes
        for sid in (a, b):
            assert listed(sid) >= before[sid]
        # held full a while: the node's background work (pool refills, heartbeats) meets it
        time.sleep(3)
        assert c.request("GET", "/healthz", auth=False).status == 200
    finally:
        os.unlink(filler)

    # space is back: new sandboxes and snapshots work, every earlier snapshot restores
    def created():
        r = c.request("POST", "/v1/sandboxes", {"template": "busybox"})
        return r.json()["id"] if r.status == 201 else None
    new = poll(created, timeout=60, what="a create after the disk had room again")
    assert c.exec(new, "echo fresh > /root/f && cat /root/f")["stdout"] == "fresh\n"
    c.post(f"/v1/sandboxes/{new}/snapshots", {})
    for snap, want in ((snap_a, "kept-a\n"), (snap_b, "kept-b\n")):
        forks = c.post(f"/v1/sandboxes/{a}/fork", {"snapshot_id": snap})["sandboxes"]
        f = forks[0]["id"]
        assert c.exec(f, "cat /root/keep")["stdout"] == want
        assert c.exec(f, "echo w > /root/w && cat /root/w")["stdout"] == "w\n"
        c.remove(f)
    assert {s["id"] for s in c.get("/v1/sandboxes")["sandboxes"]} >= sandboxes
    for sid in (a, b):
        assert listed(sid) >= before[sid]
    for sid in (a, b, new):
        c.remove(sid)
