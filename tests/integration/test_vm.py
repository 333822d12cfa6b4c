"""vm sandboxes (docs/vm.md): a QEMU microvm with its own kernel per sandbox, cloned
from a template snapshot, same API as ns. One coved for the module: the template (per
template and shape) boots once, in the first create, and every test clones it. Under TCG
(this machine has no usable KVM) a template boot takes ~10-20 s and a clone well under 1 s.

Skipped with the reason when QEMU or the guest kernel (scripts/install-deps) is missing."""
import base64
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import pytest

from cove import Coved, grep_data
from hostutil import Listener, cgroup_file, host_ipv4
from testnet import contained_coved

pytestmark = pytest.mark.root

QEMU = os.environ.get("COVE_QEMU", "/usr/bin/qemu-system-x86_64")
KDIR = os.environ.get("COVE_VM_KERNEL_DIR", "/var/cache/cove/vm")
POOL = 2


def _missing():
    if not os.access(QEMU, os.X_OK):
        return f"{QEMU} not installed (scripts/install-deps installs qemu-system-x86)"
    for f in ("vmlinux", "modules/order"):
        if not os.access(os.path.join(KDIR, f), os.R_OK):
            return f"no guest kernel: {KDIR}/{f} missing (run scripts/install-deps)"
    return None


@pytest.fixture(scope="module")
def vmd(request, build_dir, templates_dir, log_dir):
    why = _missing()
    if why:
        pytest.skip(why)
    if os.geteuid() != 0:
        pytest.skip("coved needs root")
    d = Coved(build_dir, templates_dir=templates_dir, log_dir=log_dir,
              extra_args=["--pool", "0", "--vm-pool", str(POOL)])
    yield d
    failed = request.session.testsfailed > 0
    rc, _ = d.stop(keep_log_as="vm" if failed else None)
    assert rc == 0, f"coved exited with {rc} on SIGTERM"
    assert not _qemus_of(d), "QEMU processes left after coved stopped"


def _qemus_of(d):
    """pids of QEMU processes whose parent is this coved"""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                st = f.read()
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        ppid = int(st.rsplit(")", 1)[1].split()[1])
        if b"qemu-system" in cmd and d.proc and ppid == d.proc.pid:
            out.append(int(p))
    return out


def _qemu_of(sid):
    """the QEMU pid in cgroup cove/<sid>"""
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cgroup") as f:
                cg = f.read()
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if f"cove/{sid}" in cg and b"qemu-system" in cmd:
            return int(p)
    return None


@pytest.fixture
def vm(vmd):
    c = vmd.client
    sb = c.create(template="busybox", runtime="vm")
    yield sb
    c.remove(sb["id"])


def test_vm_runs_its_own_kernel(vmd, vm):
    c = vmd.client
    assert vm["runtime"] == "vm" and vm["state"] == "running"
    r = c.exec(vm["id"], "uname -r; hostname; cat /proc/1/comm")
    kernel, host, init = r["stdout"].split()
    assert kernel != os.uname().release, "the guest kernel must not be the host's"
    assert host == vm["id"]
    assert init == "init"  # cove-guest is PID 1 of the VM
    assert c.sandbox(vm["id"])["runtime"] == "vm"
    # the kernel lives in a QEMU process of the sandbox's own unprivileged uid
    pid = _qemu_of(vm["id"])
    assert pid, "no QEMU process in the sandbox's cgroup"
    uid = os.stat(f"/proc/{pid}").st_uid
    assert uid >= 0x10000000, f"QEMU runs as uid {uid}"


def test_vm_init_loads_every_listed_module(vmd, vm):
    """the initramfs carries and loads what modules/order lists, the vsock ones included
    when scripts/install-deps extracted them (the guest channel for Firecracker)"""
    with open(os.path.join(KDIR, "modules/order")) as f:
        want = {m.strip()[:-3].replace("-", "_") for m in f if m.strip()}
    loaded = vmd.client.exec(vm["id"], "cat /proc/modules")["stdout"]
    names = {line.split()[0] for line in loaded.splitlines()}
    # built-in ones (none in Debian's config) would not be listed: every listed one is a module
    assert want <= names, f"not loaded in the guest: {sorted(want - names)}"


def test_vm_exec_exit_codes_stderr_and_env(vmd, vm):
    c = vmd.client
    r = c.exec(vm["id"], "echo out; echo err >&2; exit 7", env={"X": "y"})
    assert (r["exit_code"], r["stdout"], r["stderr"]) == (7, "out\n", "err\n")
    assert c.exec(vm["id"], ["sh", "-c", "echo $X"], env={"X": "y"})["stdout"] == "y\n"


def test_vm_pty(vmd, vm):
    c = vmd.client
    ev = list(c.exec(vm["id"], "tty; stty size", wait=False, pty={"cols": 91, "rows": 33}))
    out = c.output(ev, "pty").decode()
    assert re.search(r"/dev/pts/\d+", out), out
    assert "33 91" in out, out
    assert any(e.get("type") == "exit" and e.get("exit_code") == 0 for e in ev), ev


def test_vm_files_round_trip(vmd, vm):
    c = vmd.client
    data = os.urandom(300 * 1024)
    c.put_file(vm["id"], "/tmp/blob", data)
    r = c.get_file(vm["id"], "/tmp/blob")
    assert r.status == 200 and r.body == data
    assert c.exec(vm["id"], "wc -c < /tmp/blob")["stdout"].strip() == str(len(data))
    assert c.get_file(vm["id"], "/tmp/nope").status == 404


def test_vm_disk_is_private_per_sandbox(vmd):
    c = vmd.client
    a = c.create(template="busybox", runtime="vm")
    b = c.create(template="busybox", runtime="vm")
    try:
        c.exec(a["id"], "echo mine > /etc/only-a; sync")
        assert c.exec(b["id"], "cat /etc/only-a")["exit_code"] != 0
        assert c.exec(a["id"], "cat /etc/only-a")["stdout"] == "mine\n"
    finally:
        c.remove(a["id"])
        c.remove(b["id"])


def test_vm_five_concurrent_clones_have_own_identity(vmd):
    c = vmd.client
    made, errs = [], []

    def one():
        try:
            made.append(c.create(template="busybox", runtime="vm",
                                 egress={"allow": ["allowed.test:80"], "deny": []}))
        except Exception as e:  # noqa: BLE001 (reported below)
            errs.append(e)

    ts = [threading.Thread(target=one) for _ in range(5)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    try:
        assert not errs, errs
        assert len(made) == 5
        seen = {"host": set(), "rng": set(), "boot_id": set(), "uuid": set(), "address": set(),
                "netns": set()}
        for sb in made:
            r = c.exec(sb["id"], "hostname; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n';"
                                 f" echo; cat {BOOT_ID} /proc/sys/kernel/random/uuid")
            host, rnd, boot_id, uuid = r["stdout"].split()
            assert host == sb["id"]
            seen["host"].add(host)
            seen["rng"].add(rnd)
            seen["boot_id"].add(boot_id)
            seen["uuid"].add(uuid)
        pids = {_qemu_of(sb["id"]) for sb in made}
        uids = {os.stat(f"/proc/{p}").st_uid for p in pids}
        assert len(uids) == 5, "each VM's QEMU runs under its own uid"
        # network: the guest side (169.254.100.2 behind QEMU's tap) is the same in every VM,
        # each in a netns of its own; what the network sees is the sandbox's own address
        for sb in made:
            addr = c.get(f"/v1/sandboxes/{sb['id']}/egress")["address"]
            pid = _qemu_of(sb["id"])
            r = subprocess.run(["nsenter", "-t", str(pid), "-n", "ip", "-4", "-o", "addr",
                                "show", "dev", "eth0"], capture_output=True, text=True)
            assert f" {addr}/" in r.stdout, (addr, r.stdout, r.stderr)
            seen["address"].add(addr)
            seen["netns"].add(os.stat(f"/proc/{pid}/ns/net").st_ino)
        # no two clones of one template share an id, RNG output or address
        assert {k: len(v) for k, v in seen.items()} == {k: 5 for k in seen}, seen
    finally:
        for sb in made:
            c.remove(sb["id"])


def test_vm_pool_create_is_warm_and_fast(vmd):
    c = vmd.client
    times = []
    made = []
    try:
        for _ in range(POOL):
            _wait_pool_ready(vmd, 1)
            t = time.time()
            made.append(c.create(template="busybox", runtime="vm"))
            times.append(time.time() - t)
        warm = [ln for ln in vmd.log_lines() if ln.get("event") == "sandbox.create"
                and "(warm)" in ln.get("msg", "") and any(s["id"] in ln["msg"] for s in made)]
        assert len(warm) == POOL, warm
        assert min(times) < 0.5, times
        for sb in made:
            assert c.exec(sb["id"], "echo ok")["stdout"] == "ok\n"
    finally:
        for sb in made:
            c.remove(sb["id"])


def _wait_pool_ready(d, n, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = d.client.request("GET", "/metrics", auth=False)
        if r.status == 200:
            m = re.search(rb"cove_pool_ready\S*\s+(\d+)", r.body)
            if m and int(m.group(1)) >= n:
                return
        time.sleep(0.1)
    raise AssertionError("the vm pool did not refill")


def test_vm_guest_sees_no_monitor_and_no_other_vm(vmd, vm):
    c = vmd.client
    r = c.exec(vm["id"], "ls /sys/class/net; cat /sys/class/virtio-ports/*/name")
    assert r["stdout"].split() == ["eth0", "lo", "cove"], r
    # without egress its eth0 ends in QEMU's own empty netns: nothing on the host or
    # another VM answers (coved's API port here), only QEMU's tap end
    r = c.exec(vm["id"], f"nc -w 3 127.0.0.1 {vmd.port} </dev/null; echo rc=$?; "
                         f"ip route; nc -w 3 169.254.100.1 {vmd.port} </dev/null; echo rc=$?")
    assert r["stdout"].count("rc=1") == 2, r
    # the host side: QEMU's monitor and channel are socketpairs, no path anyone can reach
    pid = _qemu_of(vm["id"])
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            t = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        m = re.fullmatch(r"socket:\[(\d+)\]", t)
        if m:
            inodes.add(m.group(1))
    assert inodes, "QEMU should hold its monitor and channel sockets"
    with open("/proc/net/unix") as f:
        for line in f.read().splitlines()[1:]:
            parts = line.split()
            if parts[6] in inodes:
                assert len(parts) < 8 or not parts[7].startswith("/"), \
                    f"QEMU socket bound to a path: {line}"
    # QEMU opens no file by path: every file it uses was handed to it by coved
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        args = f.read().split(b"\0")
    for a in args:
        for m in re.finditer(rb"(?:mem-path|filename|path)=([^,]+)", a):
            assert m.group(1).startswith(b"/proc/self/fd/"), a


def test_vm_flood_slows_only_itself(vmd):
    c = vmd.client
    a = c.create(template="busybox", runtime="vm")
    b = c.create(template="busybox", runtime="vm")
    try:
        # a floods its channel with output nobody reads fast
        stream = c.exec(a["id"], "cat /dev/zero", wait=False)
        next(stream)
        t = time.time()
        assert c.exec(b["id"], "echo fine", timeout=20)["stdout"] == "fine\n"
        assert time.time() - t < 10
        assert c.request("GET", "/healthz", auth=False, timeout=5).status == 200
        stream.close()
    finally:
        c.remove(a["id"])
        c.remove(b["id"])


def test_vm_qemu_killed_marks_sandbox_failed(vmd):
    c = vmd.client
    sb = c.create(template="busybox", runtime="vm")
    pid = _qemu_of(sb["id"])
    assert pid
    os.kill(pid, signal.SIGKILL)
    got = c.wait_state(sb["id"], ("error",), timeout=30)
    assert got["state"] == "error"
    r = c.request("POST", f"/v1/sandboxes/{sb['id']}/exec", {"shell": "true", "wait": True})
    assert r.status in (409, 503), r.body
    c.remove(sb["id"])


def test_vm_bad_requests(vmd):
    c = vmd.client
    c.expect_error("POST", "/v1/sandboxes", 400, "bad_request",
                   {"template": "busybox", "runtime": "xen"})
    c.expect_error("POST", "/v1/sandboxes", 400, "bad_request",
                   {"template": "busybox", "runtime": "vm", "memory_mb": 16})


def test_vm_delete_leaves_nothing(vmd):
    c = vmd.client
    sb = c.create(template="busybox", runtime="vm")
    pid = _qemu_of(sb["id"])
    c.remove(sb["id"], purge=True)
    assert not os.path.exists(f"/proc/{pid}") or \
        open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    assert not os.path.exists(os.path.join(vmd.data, "sandboxes", sb["id"]))


def test_vm_unavailable_says_why(coved_factory, monkeypatch):
    """Without a guest kernel the vm runtime is unavailable; ns still works and a vm
    request gets 503 naming what is missing (runs without QEMU too)."""
    monkeypatch.setenv("COVE_VM_KERNEL_DIR", "/nonexistent-cove-kernel")
    d = coved_factory(extra_args=["--pool", "0"])
    e = d.client.expect_error("POST", "/v1/sandboxes", 503, "unavailable",
                              {"template": "busybox", "runtime": "vm"})
    assert "install-deps" in e["message"], e
    sb = d.client.create(template="busybox")
    assert sb["runtime"] == "ns"
    d.client.remove(sb["id"])


# writes a new file and renames it over the old one: a reader never sees it half-written
COUNTER = ("setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /dev/shm/count.t; "
           "mv /dev/shm/count.t /dev/shm/count; sleep 0.05; done' </dev/null >/dev/null 2>&1 &")


BOOT_ID = "/proc/sys/kernel/random/boot_id"


def _count(c, sid):
    return int(c.exec(sid, "cat /dev/shm/count")["stdout"])


def _counter_pid(c, sid):
    return c.exec(sid, "pgrep -f 'echo .i > /dev/shm/count.t' | head -1")["stdout"].strip()


@pytest.mark.slow
def test_vm_pause_resume_keeps_live_memory(vmd):
    """/dev/shm is guest RAM: a counter process writing there continues after a full
    snapshot and restore (same process, value past the one seen before the pause)."""
    c = vmd.client
    sb = c.create(template="busybox", runtime="vm")
    sid = sb["id"]
    try:
        c.exec(sid, COUNTER)
        deadline = time.time() + 30
        while c.exec(sid, "test -s /dev/shm/count")["exit_code"] and time.time() < deadline:
            time.sleep(0.1)
        pid = _counter_pid(c, sid)
        boot_id = c.exec(sid, f"cat {BOOT_ID}")["stdout"]
        before = _count(c, sid)
        # a vm's disk and memory are one image: no files-only snapshot of it
        e = c.expect_error("POST", f"/v1/sandboxes/{sid}/snapshots", 409, "conflict",
                           body={"kind": "files"})
        assert "vm" in e["message"], e
        r = c.post(f"/v1/sandboxes/{sid}/pause")
        assert r["sandbox"]["state"] == "paused"
        assert r["snapshot"]["kind"] == "full", r
        assert c.sandbox(sid)["state"] == "paused"
        assert _qemu_of(sid) is None, "a paused vm keeps no QEMU"
        r = c.post(f"/v1/sandboxes/{sid}/resume", {})
        assert r["state"] == "running", r
        after = _count(c, sid)
        assert after >= before, (before, after)
        assert _counter_pid(c, sid) == pid, "the same process continues"
        t = time.time()
        while _count(c, sid) <= after and time.time() - t < 20:
            time.sleep(0.1)
        assert _count(c, sid) > after, "the counter does not run after the resume"
        assert c.exec(sid, "hostname")["stdout"].strip() == sid
        assert c.exec(sid, f"cat {BOOT_ID}")["stdout"] == boot_id, "a resume is the same boot"
    finally:
        c.remove(sid, purge=True)


@pytest.mark.slow
def test_vm_fork_into_two_that_diverge(vmd):
    c = vmd.client
    sb = c.create(template="busybox", runtime="vm")
    sid = sb["id"]
    kids = []
    try:
        c.exec(sid, "echo base > /dev/shm/x; echo disk > /root/y; sync")
        c.exec(sid, COUNTER)
        boot_id = c.exec(sid, f"cat {BOOT_ID}")["stdout"]
        r = c.post(f"/v1/sandboxes/{sid}/fork", {"count": 2})
        kids = [k["id"] for k in r["sandboxes"]]
        assert len(kids) == 2 and sid not in kids
        # the parent's kernel had made its boot_id already: each fork gets a new one
        ids = [c.exec(k, f"cat {BOOT_ID}")["stdout"] for k in kids]
        assert len({boot_id, *ids}) == 3, (boot_id, ids)
        assert all(re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-"
                                r"[0-9a-f]{12}\n", i) for i in ids), ids
        assert c.exec(sid, f"cat {BOOT_ID}")["stdout"] == boot_id
        for i, k in enumerate(kids):
            out = c.exec(k, "hostname; cat /dev/shm/x /root/y")["stdout"].split()
            assert out == [k, "base", "disk"], out
            c.exec(k, f"echo kid{i} > /dev/shm/x")
        assert [c.exec(k, "cat /dev/shm/x")["stdout"] for k in kids] == ["kid0\n", "kid1\n"]
        assert c.exec(sid, "cat /dev/shm/x")["stdout"] == "base\n"
        rnd = {c.exec(k, "head -c 16 /dev/urandom | od -An -tx1")["stdout"] for k in kids}
        assert len(rnd) == 2, "forks must not share RNG state"
        for k in kids:  # the counter runs on in each copy
            a = _count(c, k)
            t = time.time()
            while _count(c, k) <= a and time.time() - t < 20:
                time.sleep(0.1)
            assert _count(c, k) > a
    finally:
        for k in kids + [sid]:
            c.remove(k, purge=True)


PID_COUNTER = ("setsid sh -c 'echo $$ > /dev/shm/count.pid; i=0; while :; do i=$((i+1)); "
               "echo $i > /dev/shm/count.t; mv /dev/shm/count.t /dev/shm/count; sleep 0.05; "
               "done' </dev/null >/dev/null 2>&1 &")
CHURN = ("setsid sh -c 'while :; do find / -xdev >/dev/null 2>&1; "
         "dd if=/dev/urandom of=/dev/shm/churn bs=64k count=32 2>/dev/null; "
         "rm -f /dev/shm/churn; done' </dev/null >/dev/null 2>&1 &")
KERNEL_TROUBLE = re.compile(r"BUG[: ]|Oops|Kernel panic|general protection fault|"
                            r"list_(add|del) corruption|Bad page|invalid opcode")


def _kernel_trouble(c, sid):
    """the lines of the guest kernel's log that tell of corrupted memory"""
    log = c.exec(sid, "dmesg")["stdout"]
    return [line for line in log.splitlines() if KERNEL_TROUBLE.search(line)]


@pytest.mark.slow
def test_vm_forks_of_a_busy_guest_are_sound(vmd):
    """Every full snapshot of a guest that keeps allocating and freeing kernel memory while
    it is taken (the snapshot streams RAM while the guest runs) restores into a guest whose
    kernel is sound: several forks in a row each run the parent's processes on and their
    kernel log tells of no BUG, Oops or panic (a stale page in the image shows up as slab
    corruption or a panic within seconds of the restore)."""
    c = vmd.client
    sb = c.create(template="busybox", runtime="vm")
    sid = sb["id"]
    kids = []
    try:
        c.exec(sid, PID_COUNTER)
        c.exec(sid, CHURN)
        deadline = time.time() + 60
        while c.exec(sid, "test -s /dev/shm/count")["exit_code"] and time.time() < deadline:
            time.sleep(0.1)
        pid = c.exec(sid, "cat /dev/shm/count.pid")["stdout"].strip()
        assert c.exec(sid, f"test -d /proc/{pid}")["exit_code"] == 0, "the counter runs"
        for i in range(6):
            r = c.post(f"/v1/sandboxes/{sid}/fork", {"count": 1})
            kid = r["sandboxes"][0]["id"]
            kids.append(kid)
            # the kernel needs a moment of running to trip over a stale page: let the
            # restored counter step a few times, then read the log
            a = _count(c, kid)
            t = time.time()
            while _count(c, kid) < a + 5 and time.time() - t < 30:
                time.sleep(0.1)
            assert _count(c, kid) >= a + 5, f"fork {i}: the counter does not run on"
            assert c.exec(kid, f"test -d /proc/{pid}")["exit_code"] == 0, \
                f"fork {i}: the parent's counter process is gone"
            assert _kernel_trouble(c, kid) == [], f"fork {i}"
            c.remove(kid, purge=True)
            kids.remove(kid)
        assert _kernel_trouble(c, sid) == [], "the parent"
    finally:
        for k in kids + [sid]:
            c.remove(k, purge=True)


def _steal_fd(pid, fd):
    """a copy of fd of process pid (pidfd_getfd, Linux >= 5.6)"""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        r = libc.syscall(438, pidfd, fd, 0)  # SYS_pidfd_getfd
        if r < 0:
            raise OSError(ctypes.get_errno(), "pidfd_getfd")
        return r
    finally:
        os.close(pidfd)


def test_vm_corrupt_channel_breaks_only_itself(vmd):
    """A guest (or its QEMU) that writes garbage on the channel: the node drops that
    sandbox (error state) and serves another one normally. The garbage is written on
    QEMU's own end of the channel socketpair (fd 9, see vm_qemu.c's fd layout), as a
    compromised guest+QEMU could."""
    c = vmd.client
    bad = c.create(template="busybox", runtime="vm")
    good = c.create(template="busybox", runtime="vm")
    try:
        pid = _qemu_of(bad["id"])
        assert os.readlink(f"/proc/{pid}/fd/9").startswith("socket:")
        fd = _steal_fd(pid, 9)
        try:
            os.write(fd, b"\xff" * 12 + os.urandom(4096))
        finally:
            os.close(fd)
        got = c.wait_state(bad["id"], ("error",), timeout=30)
        assert got["state"] == "error"
        t = time.time()
        assert c.exec(good["id"], "echo fine", timeout=20)["stdout"] == "fine\n"
        assert time.time() - t < 10
        assert vmd.alive()
    finally:
        c.remove(bad["id"])
        c.remove(good["id"])


def test_vm_coved_kill9_then_restart(coved_factory):
    """coved dies hard: its QEMUs die with it (PDEATHSIG), the restart reconciles the vm
    sandbox to stopped, frees its cgroup, and vm sandboxes work again (the template
    snapshot on disk is reused, not rebuilt). The start collects older template builds;
    a full snapshot of another build of the same template key is refused (409)."""
    why = _missing()
    if why:
        pytest.skip(why)
    d = coved_factory(extra_args=["--pool", "0"])
    c = d.client
    sid = c.create(template="busybox", runtime="vm")["id"]
    pid = _qemu_of(sid)
    assert pid
    paused = c.create(template="busybox", runtime="vm")["id"]
    assert c.post(f"/v1/sandboxes/{paused}/pause")["snapshot"]["kind"] == "full"
    d.kill9()
    deadline = time.time() + 20
    while os.path.exists(f"/proc/{pid}") and time.time() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}"), "QEMU outlived coved"
    planted = _plant_old_builds(d.data)
    # the template is rebuilt under the same key (as after its dir was lost): another build
    # id, and another base.qcow2 under the paused sandbox's disk
    ready = os.path.join(planted["current"], "ready")
    with open(ready) as f:
        rec = f.read()
    with open(ready, "w") as f:
        f.write(re.sub(r"^build [0-9a-f]+$", "build 0badc0de", rec, flags=re.M))
    c = d.start()
    sb = c.sandbox(sid)
    assert sb["state"] == "stopped" and sb.get("error"), sb
    e = c.expect_error("POST", f"/v1/sandboxes/{paused}/resume", 409, "conflict", {})
    assert "another build of its template" in e["message"], e
    assert c.sandbox(paused)["state"] == "paused"
    assert not any(os.path.exists(f"/sys/fs/cgroup/{ctl}/cove/{sid}")
                   for ctl in ("memory", "pids", "cpu", "freezer", "unified"))
    # the start collected the older builds nothing uses, kept the current one and the one a
    # sandbox's disk still backs onto
    for what, path in planted.items():
        assert os.path.exists(path) == (what in ("current", "backed", "current_initrd")), \
            (what, path)
    assert any(ln.get("event") == "runtime.collect" and "removed 3 item" in ln.get("msg", "")
               for ln in d.log_lines()), "no runtime.collect line"
    t = time.time()
    sid2 = c.create(template="busybox", runtime="vm")["id"]
    assert time.time() - t < 8, "the template was rebuilt after the restart"
    assert c.exec(sid2, "echo again")["stdout"] == "again\n"
    c.remove(sid, purge=True)
    c.remove(sid2, purge=True)
    c.remove(paused, purge=True)


def _plant_old_builds(data):
    """Next to the real template build, what older builds leave in <data>/vm: a complete
    build whose record (a copy of the real one) no longer hashes to its dir name, as after
    a rootfs, kernel or guest change; an unfinished build (no ready); an old initramfs; and
    an old build that a sandbox's disk.qcow2 still backs onto."""
    tpl = os.path.join(data, "vm", "tpl")
    (cur,) = os.listdir(tpl)
    cur = os.path.join(tpl, cur)
    with open(os.path.join(cur, "ready"), "rb") as f:
        record = f.read()
    assert record.startswith(b"cove-vm-template 2\n"), record
    (initrd,) = [f for f in os.listdir(os.path.join(data, "vm")) if f.startswith("initrd-")]
    p = {"current": cur, "current_initrd": os.path.join(data, "vm", initrd),
         "stale": os.path.join(tpl, "00000000000000aa"),
         "unfinished": os.path.join(tpl, "00000000000000bb"),
         "backed": os.path.join(tpl, "00000000000000cc"),
         "old_initrd": os.path.join(data, "vm", "initrd-00000000000000dd")}
    for k in ("stale", "unfinished", "backed"):
        os.makedirs(p[k])
        with open(os.path.join(p[k], "ram"), "wb") as f:
            f.truncate(64 << 20)
    for k in ("stale", "backed"):
        with open(os.path.join(p[k], "ready"), "wb") as f:
            f.write(record)
    open(p["old_initrd"], "wb").close()
    base = os.path.join(p["backed"], "base.qcow2")
    sd = os.path.join(data, "sandboxes", "sbx_planted_old_disk")
    os.makedirs(sd)
    for img, backing in ((base, None), (os.path.join(sd, "disk.qcow2"), base)):
        cmd = ["qemu-img", "create", "-q", "-f", "qcow2"]
        if backing:
            cmd += ["-u", "-b", backing, "-F", "qcow2"]
        subprocess.run(cmd + [img, "64M"], check=True)
    return p


# ---- hostile guest and compromised QEMU: the vm equivalents of tests/security (they live
# here to share this module's template boot; tests/security's own files run against ns) ----

PROBE_AS = r"""
import json, os, signal, sys
out = {}
for p in sys.argv[2:]:
    kind, path = p.split(":", 1)
    try:
        if kind == "ls":
            os.listdir(path)
        else:
            os.close(os.open(path, os.O_RDWR if kind == "rw" else os.O_RDONLY))
        out[p] = "OK"
    except OSError as e:
        out[p] = e.strerror
try:
    os.kill(int(sys.argv[1]), 0)
    out["kill"] = "OK"
except OSError as e:
    out["kill"] = e.strerror
print(json.dumps(out))
"""


def _probe_as(uid, other_pid, targets):
    """open/list each 'kind:path' as uid (QEMU's credentials, without its seccomp filter,
    i.e. more than QEMU itself may do) and signal 0 to other_pid: {target: 'OK' | error}"""
    r = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                        "--inh-caps=-all", "/usr/bin/python3", "-c", PROBE_AS, str(other_pid)]
                       + targets, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _status(pid):
    with open(f"/proc/{pid}/status") as f:
        return dict(ln.split(":", 1) for ln in f.read().splitlines() if ":" in ln)


def test_vm_qemu_is_confined(vmd):
    """QEMU (what a guest that escapes into it would hold): its own unprivileged uid, no
    capabilities or groups, seccomp (-sandbox on), its own cgroup with limits and network
    namespace; it cannot open another sandbox's state dir or disk, coved's files, or write
    the template, nor signal another sandbox's QEMU."""
    c = vmd.client
    a = c.create(template="busybox", runtime="vm")
    b = c.create(template="busybox", runtime="vm")
    try:
        pa, pb = _qemu_of(a["id"]), _qemu_of(b["id"])
        st = _status(pa)
        uids, gids = st["Uid"].split(), st["Gid"].split()
        assert len(set(uids)) == 1 and int(uids[0]) >= 0x10000000, st["Uid"]
        assert len(set(gids)) == 1 and gids[0] == uids[0], st["Gid"]
        assert st["Groups"].strip() == "", st["Groups"]
        assert int(st["CapEff"], 16) == 0 and int(st["CapPrm"], 16) == 0, st["CapEff"]
        assert st["Seccomp"].strip() == "2", "QEMU runs without its seccomp filter"
        assert st["NoNewPrivs"].strip() == "1"
        assert _status(pb)["Uid"].split()[0] != uids[0]
        # its own cgroup, with the sandbox's limits
        with open(f"/proc/{pa}/cgroup") as f:
            assert f"cove/{a['id']}" in f.read()
        lim = cgroup_file(a["id"], "memory", "memory.limit_in_bytes") or \
            cgroup_file(a["id"], "memory", "memory.max")
        pids = cgroup_file(a["id"], "pids", "pids.max")
        assert lim and pids, "no memory/pids cgroup for the VM"
        mem = a["memory_mb"] << 20
        assert mem < int(open(lim).read()) <= mem + (256 << 20), open(lim).read()
        assert open(pids).read().strip() == "256"
        # its own network namespace: not the host's, not the other VM's
        nets = {os.stat(f"/proc/{p}/ns/net").st_ino for p in (pa, pb, "self")}
        assert len(nets) == 3, "VMs share a network namespace with each other or the host"
        # files, as QEMU's uid
        sa = os.path.join(vmd.data, "sandboxes", a["id"])
        sb_ = os.path.join(vmd.data, "sandboxes", b["id"])
        assert os.path.exists(os.path.join(sb_, "disk.qcow2"))
        (tpl,) = [os.path.join(vmd.data, "vm", "tpl", t)
                  for t in os.listdir(os.path.join(vmd.data, "vm", "tpl"))
                  if os.path.exists(os.path.join(vmd.data, "vm", "tpl", t, "ready"))
                  and a["memory_mb"] == _tpl_mem(os.path.join(vmd.data, "vm", "tpl", t))]
        targets = [f"ls:{sb_}", f"ro:{sb_}/disk.qcow2", f"rw:{sb_}/disk.qcow2",
                   f"ro:{sb_}/qemu.log", f"ls:{sa}", f"ls:{vmd.data}/sandboxes",
                   f"rw:{tpl}/ram", f"rw:{tpl}/base.qcow2", f"rw:{tpl}/root.img",
                   f"rw:{tpl}/state", f"ls:/proc/{pb}/fd", f"ro:/proc/{pb}/mem",
                   f"ro:/proc/{pb}/environ"]
        # coved's own files (coved.log is this harness's capture of coved's stderr)
        targets += [f"ro:{os.path.join(vmd.data, n)}" for n in os.listdir(vmd.data)
                    if os.path.isfile(os.path.join(vmd.data, n)) and n != "coved.log"]
        got = _probe_as(int(uids[0]), pb, targets)
        opened = {k: v for k, v in got.items() if v == "OK"}
        assert not opened, f"QEMU's uid can reach: {opened}"
        # the probe can succeed: the same uid may signal its own QEMU
        assert _probe_as(int(uids[0]), pa, [])["kill"] == "OK"
    finally:
        c.remove(a["id"])
        c.remove(b["id"])


def _tpl_mem(d):
    with open(os.path.join(d, "ready")) as f:
        m = re.search(r"^mem (\d+)$", f.read(), re.M)
    return int(m.group(1)) if m else None


def test_vm_guest_network_only_through_egress(vmd):
    """Host services from inside a VM: without egress nothing answers (QEMU's netns has
    only its tap); with an egress policy the guest's packets leave through the sandbox's
    link and its rules: the host's own addresses, the link's gateway and a destination the
    policy does not allow are refused (as tests/security/test_network.py for ns)."""
    c = vmd.client
    lst = Listener("0.0.0.0")
    plain = c.create(template="busybox", runtime="vm")
    eg = c.create(template="busybox", runtime="vm",
                  egress={"allow": ["allowed.test:80"], "deny": []})
    try:
        addr = c.get(f"/v1/sandboxes/{eg['id']}/egress").get("address")
        assert addr, "the egress sandbox has no address"
        # (addresses off this machine: test_vm_off_machine_addresses_unreachable)
        targets = [f"127.0.0.1 {lst.port}", f"127.0.0.1 {vmd.port}",
                   f"169.254.100.1 {lst.port}"]
        targets += [f"{a} {lst.port}" for a in host_ipv4()]
        targets += [f"{a} {vmd.port}" for a in host_ipv4()]
        script = "".join(
            f"echo x | timeout 5 nc -w 2 {t} 2>/dev/null | grep -q . && echo REACHED:{t}\n"
            for t in targets) + "ip route | grep -q default && echo ROUTE\n"
        for sb in (plain, eg):
            r = c.exec(sb["id"], script, timeout=300)
            reached = [ln for ln in r["stdout"].splitlines() if ln.startswith("REACHED")]
            assert not reached, (sb["id"], reached)
            assert "ROUTE" in r["stdout"], r  # the guest does try: it has a default route
        assert not lst.hits, f"a host listener got connections from a VM: {lst.hits}"
        # the refusals are the egress rules' (audited), not a dead link: a denied connect
        ev = c.get(f"/v1/audit?sandbox={eg['id']}&kind=egress")["events"]
        assert any(e.get("verdict") == "deny" for e in ev), ev
    finally:
        lst.close()
        c.remove(plain["id"])
        c.remove(eg["id"])


def test_vm_off_machine_addresses_unreachable(build_dir, templates_dir, log_dir):
    """Metadata, QEMU's user-net host and private gateways from inside a VM, with and
    without egress, on a coved whose namespace routes them to test hosts only
    (tests/lib/testnet.py): refused, and the test hosts received nothing."""
    why = _missing()
    if why:
        pytest.skip(why)
    if os.geteuid() != 0:
        pytest.skip("coved needs root")
    with contained_coved(build_dir, templates_dir, log_dir, "vm-contained",
                         ["--pool", "0", "--vm-pool", "0"]) as (d, net):
        c = d.client
        made = [c.create(template="busybox", runtime="vm"),
                c.create(template="busybox", runtime="vm",
                         egress={"allow": ["allowed.test:80"], "deny": []})]
        try:
            targets = [f"{a} {p}" for a in ("169.254.169.254", "10.0.2.2", "10.0.0.1",
                                            "172.17.0.1", "192.168.0.1") for p in (80, 22)]
            targets += ["8.8.8.8 53", "1.1.1.1 443"]
            script = "".join(
                f"echo x | timeout 5 nc -w 2 {t} 2>/dev/null | grep -q . && echo REACHED:{t}\n"
                for t in targets)
            script += ("for a in 8.8.8.8 10.0.2.3 169.254.169.254; do echo x | nc -u -w 1 $a 53;"
                       " ping -c 1 -W 1 $a; done >/dev/null 2>&1\n"
                       "ip route | grep -q default && echo ROUTE\n")
            for sb in made:
                r = c.exec(sb["id"], script, timeout=300)
                reached = [ln for ln in r["stdout"].splitlines() if ln.startswith("REACHED")]
                assert not reached, (sb["id"], reached)
                assert "ROUTE" in r["stdout"], r  # the guest does try: it has a default route
            net.assert_nothing_received()
        finally:
            for sb in made:
                c.remove(sb["id"])


def _guest_chan_fd(c, sid):
    """the fd number of cove-guest's virtio-serial port in the guest's PID 1"""
    r = c.exec(sid, "for f in /proc/1/fd/*; do echo \"${f##*/} $(readlink $f)\"; done")
    fds = [ln.split()[0] for ln in r["stdout"].splitlines() if "/dev/vport" in ln]
    assert len(fds) == 1, r["stdout"]
    return fds[0]


@pytest.mark.parametrize("frame", [
    "8000000005000000000000010000",  # a header announcing 2 GiB of output (over the max)
    "00000000770000000000002a",      # a frame of an unknown type
])
def test_vm_guest_root_forging_frames_breaks_only_itself(vmd, build_dir, frame):
    """Root inside a VM takes cove-guest's channel fd (pidfd_getfd on PID 1) and writes a
    forged frame: the node drops that sandbox (error) and serves another one normally."""
    probe = os.path.join(build_dir, "tests", "unit", "sysprobe")
    if not os.access(probe, os.X_OK):
        pytest.skip(f"{probe} not built")
    c = vmd.client
    bad = c.create(template="busybox", runtime="vm")
    good = c.create(template="busybox", runtime="vm")
    try:
        with open(probe, "rb") as f:
            c.put_file(bad["id"], "/tmp/sysprobe", f.read(), mode=0o755)
        fd = _guest_chan_fd(c, bad["id"])
        # the exec's own answer may never come: its channel is what breaks
        r = c.request("POST", f"/v1/sandboxes/{bad['id']}/exec",
                      {"cmd": ["/tmp/sysprobe", "--write-fd", "1", fd, frame], "wait": True},
                      timeout=60)
        assert r.status in (200, 503), r.body[:300]
        if r.status == 200:
            assert "write=OK" in r.json()["stdout"], r.json()
        got = c.wait_state(bad["id"], ("error",), timeout=30)
        assert got["state"] == "error" and got.get("error"), got
        assert _qemu_of(bad["id"]) is None, "the broken VM's QEMU still runs"
        t = time.time()
        assert c.exec(good["id"], "echo fine", timeout=20)["stdout"] == "fine\n"
        assert time.time() - t < 10
        assert c.request("GET", "/healthz", auth=False, timeout=5).status == 200
        assert vmd.alive()
    finally:
        c.remove(bad["id"])
        c.remove(good["id"])


@pytest.fixture
def open_tmp():
    """a temp dir the sandbox uids can reach (pytest's tmp_path is under a 0700 dir)"""
    d = tempfile.mkdtemp(prefix="cove-fc-")
    os.chmod(d, 0o755)
    yield pathlib.Path(d)
    shutil.rmtree(d, ignore_errors=True)


def test_vm_firecracker_driver_against_fake_vmm(coved_factory, build_dir, open_tmp):
    """COVE_VM_DRIVER=firecracker puts the Firecracker driver behind runtime "vm". This host has
    no firecracker and no usable KVM, so the VMM is a test double: the unit-test binary
    re-executed as `firecracker` (test_vm.c fake_vmm_main) answers the REST API, makes and
    loads snapshot files and hands each hybrid-vsock connection to a real cove-guest running
    as a host process (no VM). Everything else is real: coved, the node's handshake over the
    vsock stream, the driver's processes, uids, cgroups, files, full snapshots (pause)."""
    if os.geteuid() != 0:
        pytest.skip("coved needs root")
    try:
        os.close(os.open("/dev/kvm", os.O_RDWR))
    except OSError as e:
        pytest.skip(f"/dev/kvm cannot be opened ({e}): the driver's KVM check fails")
    tmp_path = open_tmp
    fake = tmp_path / "firecracker"
    with open(os.path.join(build_dir, "tests/unit/test_vm"), "rb") as src:
        fake.write_bytes(src.read())
    fake.chmod(0o755)
    guest = tmp_path / "cove-guest"
    with open(os.path.join(build_dir, "cove-guest"), "rb") as src:
        guest.write_bytes(src.read())
    guest.chmod(0o755)
    kdir = tmp_path / "k"
    (kdir / "modules").mkdir(parents=True)
    (kdir / "vmlinux").write_text("not a kernel")
    (kdir / "modules/order").write_text("a.ko\n")
    (kdir / "modules/a.ko").write_text("module")
    (kdir / "version").write_text("fake 1")
    d = coved_factory(extra_args=["--pool", "0", "--runtime", "ns"],
                      env={"COVE_VM_DRIVER": "firecracker", "COVE_FIRECRACKER": str(fake),
                           "COVE_VM_ACCEL": "kvm", "COVE_VM_KERNEL_DIR": str(kdir),
                           "FAKE_VMM_GUEST": str(guest)})
    c = d.client
    sb = c.create(template="busybox", runtime="vm")
    assert sb["runtime"] == "vm" and sb["state"] == "running"
    r = c.exec(sb["id"], ["sh", "-c", "echo hi; id -u"])
    assert r["exit_code"] == 0 and r["stdout"].startswith("hi\n"), r
    # the fake runs the guest as the VMM's uid: the sandbox's own unprivileged one
    assert int(r["stdout"].split()[1]) >= 0x10000000, r
    vmm = os.path.join(d.data, "sandboxes", sb["id"], "fc")
    with open(os.path.join(vmm, "fake-vmm.log")) as f:
        assert "PUT /snapshot/load" in f.read()
    # pause = a full snapshot through the driver (PUT /snapshot/create), resume = a load
    assert c.post(f"/v1/sandboxes/{sb['id']}/pause")["sandbox"]["state"] == "paused"
    c.post(f"/v1/sandboxes/{sb['id']}/resume", {})
    assert c.exec(sb["id"], "echo back")["stdout"] == "back\n"
    with open(os.path.join(vmm, "fake-vmm.log")) as f:
        log = f.read()
    assert '"snapshot_path":"/proc/self/fd/3"' in log, log
    c.remove(sb["id"], purge=True)
    assert not os.path.exists(os.path.join(d.data, "sandboxes", sb["id"]))


def _disk_key_hex(data_dir, tenant, disk_id):
    """The LUKS passphrase coved gives QEMU for a vm disk, recomputed from the key files:
    the tenant's DEK (AES-256-GCM-wrapped under the node KEK, docs/storage.md "Keys"), HKDF
    to cove/v1/disk, HKDF to cove/v1/disk/<disk id>, in hex."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    kdir = os.path.join(data_dir, "keys")
    kek = open(os.path.join(kdir, "node.kek"), "rb").read()
    if len(kek) != 32:
        kek = bytes.fromhex(kek.decode().strip())
    rec = json.load(open(os.path.join(kdir, f"{tenant}.key")))
    blob = base64.b64decode(rec["wrapped"])
    dek = AESGCM(kek).decrypt(blob[:12], blob[12:], b"cove/v1/wrap\0" + tenant.encode())

    def hkdf(ikm, info):
        return HKDF(hashes.SHA256(), 32, None, info.encode()).derive(ikm)

    return hkdf(hkdf(dek, "cove/v1/disk"), f"cove/v1/disk/{disk_id}").hex()


def _write_marker(c, sid, marker):
    # built inside the guest, so the marker is not in exec's argv (nor in coved's log)
    h = len(marker) // 2
    c.exec(sid, f"printf '%s%s\\n' '{marker[:h]}' '{marker[h:]}' > /root/marker.txt && sync")
    assert c.exec(sid, "cat /root/marker.txt")["stdout"] == marker + "\n"


@pytest.mark.slow
def test_vm_encrypted_disk(vmd):
    """storage_encrypted for vm: the overlay is a LUKS qcow2 under a key from the tenant's DEK,
    handed to QEMU through a pipe (never on its command line, in a file or in the log): a
    marker synced inside the guest is in no file of the data dir (the same grep finds a
    plain vm's marker in its overlay), it survives pause/resume, a fork (which keeps its
    source's disk key) and a rewind, and a revoked key stops the sandboxes and refuses
    create, resume and fork."""
    admin = vmd.client
    t = admin.post("/v1/tenants", {}, expect=201)
    tid = t["id"]
    c = admin.with_key(admin.post(f"/v1/tenants/{tid}/api-keys", {}, expect=201)["key"])
    s = c.create(template="busybox", runtime="vm", storage_encrypted=True)
    sid = s["id"]
    plain = c.create(template="busybox", runtime="vm")
    assert s["storage_encrypted"] is True and plain["storage_encrypted"] is False
    mark = "COVE-VMENC-" + os.urandom(12).hex()
    pmark = "COVE-VMPLAIN-" + os.urandom(12).hex()
    _write_marker(c, sid, mark)
    _write_marker(c, plain["id"], pmark)
    hits = grep_data(vmd.data, pmark)
    assert any(h.endswith(f"{plain['id']}/disk.qcow2") for h in hits), \
        f"the plain vm's marker is not in its overlay: the grep is blind ({hits})"
    assert grep_data(vmd.data, mark) == [], "plaintext of an encrypted vm disk found at rest"

    # the key: QEMU reads it from a pipe; it is on no command line, in no file, not in the log
    key = _disk_key_hex(vmd.data, tid, sid)
    disk = os.path.join(vmd.data, "sandboxes", sid, "disk.qcow2")
    opened = subprocess.run(
        ["qemu-img", "check", "-U", "-q", "--object", "secret,id=k,file=/dev/stdin",
         "--image-opts", f"driver=qcow2,file.filename={disk},encrypt.key-secret=k"],
        input=key.encode(), capture_output=True)
    assert opened.returncode == 0, f"the derived key does not open the disk: {opened.stderr}"
    pid = _qemu_of(sid)
    cmd = open(f"/proc/{pid}/cmdline", "rb").read()
    assert b"encrypt.key-secret=dsec" in cmd and b"secret,id=dsec,file=/proc/self/fd/" in cmd
    assert key.encode() not in cmd and key.encode() not in open(f"/proc/{pid}/environ", "rb").read()
    assert grep_data(vmd.data, key) == [] and grep_data(vmd.data, key.upper()) == []

    # pause/resume (the image keeps the disk key id), then a fork of the resumed sandbox
    r = c.post(f"/v1/sandboxes/{sid}/pause")
    assert r["snapshot"]["kind"] == "full" and r["sandbox"]["storage_encrypted"] is True
    paused_snap = r["snapshot"]["id"]
    r = c.post(f"/v1/sandboxes/{sid}/resume", {})
    assert r["state"] == "running" and r["storage_encrypted"] is True
    assert c.exec(sid, "cat /root/marker.txt")["stdout"] == mark + "\n"
    c.exec(sid, "echo later > /root/later.txt && sync")
    kid = c.post(f"/v1/sandboxes/{sid}/fork", {})["sandboxes"][0]
    assert kid["storage_encrypted"] is True
    assert c.exec(kid["id"], "cat /root/marker.txt /root/later.txt")["stdout"] == \
        mark + "\nlater\n"
    c.exec(kid["id"], "echo kid > /root/kid.txt && sync")
    # rewind to the pause: later.txt is gone, the marker is back from the encrypted image
    rw = c.post(f"/v1/sandboxes/{sid}/rewind", {"snapshot_id": paused_snap})
    assert rw["sandbox"]["state"] == "running" and rw["sandbox"]["storage_encrypted"] is True
    assert c.exec(sid, "cat /root/marker.txt; test -e /root/later.txt || echo gone")["stdout"] \
        == mark + "\ngone\n"
    assert grep_data(vmd.data, mark) == []

    # revoke: running vm sandboxes stop, a paused one cannot resume, nothing new starts
    c.post(f"/v1/sandboxes/{sid}/pause")
    st = admin.post("/v1/keys/revoke", {"tenant": tid})
    assert st["state"] == "revoked" and st["sandboxes_stopped"] == 3, st
    for x in (kid["id"], plain["id"]):
        assert c.sandbox(x)["state"] == "stopped" and _qemu_of(x) is None
    c.expect_error("POST", "/v1/sandboxes", 403, "key_revoked",
                   body={"template": "busybox", "runtime": "vm", "storage_encrypted": True})
    c.expect_error("POST", f"/v1/sandboxes/{sid}/resume", 403, "key_revoked", body={})
    c.expect_error("POST", f"/v1/sandboxes/{sid}/fork", 403, "key_revoked", body={})
    assert _qemu_of(sid) is None
    assert grep_data(vmd.data, mark) == [] and grep_data(vmd.data, key) == []
