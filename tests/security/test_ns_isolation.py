"""What an ns sandbox must not reach or see of its host and its neighbours: socket families
outside its network isolation (vsock above all), host paths and other sandboxes' ids in
procfs and sysfs, the host's file locks, metadata writes to the host's device nodes, the
guest's life under memory pressure, and the host's size instead of the sandbox's own.
Each test attacks from inside (exec as the sandbox's root) and fails if the attack works.
Sockets are only created and bound, never connected anywhere."""
import json
import os
import socket
import time

import pytest

from secutil import sh

# address families a sandbox has no business with (name, number): the number is given so the
# test does not depend on what the sandbox's python knows
DENIED_FAMILIES = [
    ("AF_VSOCK", 40), ("AF_PACKET", 17), ("AF_XDP", 44), ("AF_KEY", 15), ("AF_ALG", 38),
    ("AF_TIPC", 30), ("AF_RDS", 21), ("AF_CAN", 29), ("AF_BLUETOOTH", 31),
    ("AF_QIPCRTR", 42), ("AF_APPLETALK", 5), ("AF_X25", 9), ("AF_NFC", 39), ("AF_SMC", 43),
    ("AF_MCTP", 45), ("AF_KCM", 41), ("AF_LLC", 26), ("AF_PPPOX", 24), ("AF_RXRPC", 33),
    ("AF_IEEE802154", 36), ("AF_PHONET", 35), ("AF_CAIF", 37), ("AF_IUCV", 32),
]

SOCKET_PROBE = r"""
import ctypes, errno, json, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR_SOCKET = 41  # x86_64
fams = json.loads(sys.argv[1])
out = {}
def raw(domain, typ, proto):
    r = libc.syscall(ctypes.c_long(NR_SOCKET), ctypes.c_long(domain), ctypes.c_long(typ),
                     ctypes.c_long(proto))
    if r >= 0:
        import os; os.close(r); return "OK"
    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
for name, af in fams:
    res = []
    for typ in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET, socket.SOCK_RAW):
        try:
            s = socket.socket(af, typ, 0)
        except OSError as e:
            res.append(errno.errorcode.get(e.errno, str(e.errno)))
            continue
        res.append("OK")
        if name == "AF_VSOCK":
            try:  # bind + listen on a port of the host's vsock space
                s.bind((0xFFFFFFFF, 0x7C0E))  # VMADDR_CID_ANY, an unusual port
                if typ == socket.SOCK_STREAM:
                    s.listen(1)
                res.append("BOUND")
            except OSError as e:
                res.append("bind:" + errno.errorcode.get(e.errno, str(e.errno)))
        s.close()
    out[name] = res
    # high bits above the int: the kernel truncates them, the filter must not be fooled
    out[name + "+hi"] = [raw((1 << 32) | af, socket.SOCK_DGRAM, 0)]
for name, af in (("AF_UNIX", 1), ("AF_INET", 2), ("AF_INET6", 10)):
    s = socket.socket(af, socket.SOCK_DGRAM, 0); s.close(); out[name] = ["OK"]
for name, proto in (("NETLINK_ROUTE", 0), ("NETLINK_SOCK_DIAG", 4), ("NETLINK_NETFILTER", 12),
                    ("NETLINK_XFRM", 6), ("NETLINK_GENERIC", 16), ("NETLINK_AUDIT", 9),
                    ("NETLINK_KOBJECT_UEVENT", 15)):
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, proto).close(); out[name] = ["OK"]
    except OSError as e:
        out[name] = [errno.errorcode.get(e.errno, str(e.errno))]
print(json.dumps(out))
"""


def _python_sandbox(client, **kw):
    sb = client.create(template="base", **kw)
    r = sh(client, sb["id"], "command -v python3")
    if r["exit_code"] != 0:
        client.remove(sb["id"])
        pytest.skip("the base template has no python3")
    return sb


@pytest.fixture
def base_sandbox(client):
    sb = _python_sandbox(client)
    yield sb
    client.remove(sb["id"])


@pytest.mark.root
def test_foreign_socket_families_refused(client, base_sandbox):
    """socket() of vsock, packet, xdp, key, alg, tipc, rds, can, bluetooth... fails with
    EAFNOSUPPORT (so nothing binds a port of the host's vsock space); unix, inet, inet6 and
    netlink route still work, other netlink protocols fail with EPROTONOSUPPORT."""
    sid = base_sandbox["id"]
    client.put_file(sid, "/tmp/sockprobe.py", SOCKET_PROBE.encode())
    r = sh(client, sid, "python3 /tmp/sockprobe.py '%s'" % json.dumps(DENIED_FAMILIES))
    assert r["exit_code"] == 0, r
    res = json.loads(r["stdout"])
    bad = {k: v for k, v in res.items()
           if any(x.split(":")[-1] != "EAFNOSUPPORT" for x in v)
           and not k.startswith(("AF_UNIX", "AF_INET", "NETLINK_"))}
    assert not bad, f"address families usable inside the sandbox: {bad}"
    for ok in ("AF_UNIX", "AF_INET", "AF_INET6", "NETLINK_ROUTE", "NETLINK_SOCK_DIAG"):
        assert res[ok] == ["OK"], f"{ok} broken inside the sandbox: {res[ok]}"
    for no in ("NETLINK_NETFILTER", "NETLINK_XFRM", "NETLINK_GENERIC", "NETLINK_AUDIT",
               "NETLINK_KOBJECT_UEVENT"):
        assert res[no] == ["EPROTONOSUPPORT"], f"{no} inside the sandbox gave {res[no]}"
    # name resolution still works (with AI_ADDRCONFIG glibc asks netlink route)
    r = sh(client, sid, "python3 -c \"import socket; print(socket.getaddrinfo('127.0.0.1', 80, "
                        "flags=socket.AI_ADDRCONFIG)[0][4][1])\"")
    assert r["stdout"] == "80\n", r


SCAN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "procsys_scan.py")


@pytest.mark.root
@pytest.mark.slow
def test_proc_and_sys_show_no_host_paths_or_other_sandboxes(client, coved):
    """A scan of /proc and /sys inside a sandbox finds neither the node's data dir, nor the
    host's hostname, nor the id of any other sandbox (a second one runs meanwhile; loop
    devices' backing_file used to name them all)."""
    a = _python_sandbox(client)
    b = client.create(template="busybox")
    try:
        host = socket.gethostname()
        # a short hostname ("vm") is a word of kernel files too: then only where a hostname
        # would be shown
        tokens = [host] if len(host) >= 5 else []
        needles = [os.path.realpath(coved.data), b["id"]]
        client.put_file(a["id"], "/tmp/scan.py", open(SCAN, "rb").read())
        r = client.exec(a["id"], ["python3", "/tmp/scan.py", json.dumps(needles),
                                  json.dumps(tokens), a["id"], "240"], timeout=400)
        assert r["exit_code"] == 0, r
        res = json.loads(r["stdout"])
        assert res["files"] > 1000, f"the scan read only {res['files']} files"
        assert not res["hits"], f"host facts inside the sandbox: {res['hits'][:20]}"
        r = sh(client, a["id"], "cat /proc/sys/kernel/hostname; uname -n")
        assert r["stdout"] == f"{a['id']}\n{a['id']}\n", r
        # the block devices are gone from /sys and /proc, the rest of sysfs is still there
        r = sh(client, a["id"], "ls -A /sys/block /sys/class/block /sys/devices/virtual/block "
                                "/sys/dev/block | grep -v : | grep -c . ; "
                                "cat /proc/diskstats /proc/partitions | wc -c; "
                                "ls -A /sys/class/net /sys/kernel | grep -v : | grep -c .")
        w = r["stdout"].split()
        assert w[:2] == ["0", "0"] and int(w[2]) > 2 and not r["stderr"], r
    finally:
        client.remove(a["id"])
        client.remove(b["id"])


# an open file description lock (F_OFD_SETLKW) of the whole file: the kernel lists these in
# every /proc/locks whatever the reader's pid namespace (they have no owner pid)
OFD_LOCK = ("import fcntl, struct; fcntl.fcntl({fd}, 38, "  # F_OFD_SETLKW
            "struct.pack('hhqqi4x', fcntl.F_WRLCK, 0, 0, 0, 0))")


@pytest.mark.root
def test_proc_locks_hide_host_and_other_sandboxes(client, coved, tmp_path):
    """/proc/locks inside shows neither a lock the host holds nor one another sandbox
    holds (device and inode of host files, and a covert channel between sandboxes)."""
    a = _python_sandbox(client)
    b = _python_sandbox(client)
    lockf = tmp_path / "held"
    lockf.write_text("x")
    try:
        with open(lockf, "r+") as f:
            exec(OFD_LOCK.format(fd=f.fileno()))
            ino = os.fstat(f.fileno()).st_ino
            # b holds a lock of its own for as long as the test runs
            prog = ("import time; f = open('/tmp/l', 'w'); " + OFD_LOCK.format(fd="f.fileno()")
                    + "; open('/tmp/locked', 'w'); time.sleep(600)")
            sh(client, b["id"], f"python3 -c \"{prog}\" >/dev/null 2>&1 &")
            deadline = time.time() + 60
            while sh(client, b["id"], "test -e /tmp/locked && echo y")["stdout"] != "y\n":
                assert time.time() < deadline, "the lock in the other sandbox never came"
                time.sleep(0.2)
            bino = sh(client, b["id"], "stat -c %i /tmp/l")["stdout"].strip()
            with open("/proc/locks") as hl:
                host_view = hl.read()
            assert f":{ino} " in host_view and f":{bino} " in host_view, \
                "the host does not see the locks this test holds"
            seen = sh(client, a["id"], "cat /proc/locks && echo end")
            assert seen["stdout"] == "end\n", f"/proc/locks inside the sandbox: {seen}"
    finally:
        client.remove(a["id"])
        client.remove(b["id"])


@pytest.mark.root
def test_device_nodes_take_no_metadata_writes(client, sandbox):
    """touch, chmod and chown of /dev/null, zero, full, random, urandom and tty inside leave
    the host's inodes as they were (the nodes are read-only binds); the devices still work."""
    sid = sandbox["id"]
    devs = ["null", "zero", "full", "random", "urandom", "tty"]
    before = {d: os.stat(f"/dev/{d}") for d in devs}
    r = sh(client, sid, " ; ".join(f"touch -c /dev/{d}; chmod 0600 /dev/{d}" for d in devs)
           + "; echo done")
    assert r["stdout"].endswith("done\n"), r
    for d in devs:
        st = os.stat(f"/dev/{d}")
        assert (st.st_mtime_ns, st.st_ctime_ns, st.st_mode) == (
            before[d].st_mtime_ns, before[d].st_ctime_ns, before[d].st_mode), \
            f"/dev/{d} of the host changed from inside the sandbox"
    r = sh(client, sid, "echo x > /dev/null && echo null-ok; head -c 5 /dev/zero | wc -c; "
                        "head -c 7 /dev/urandom | wc -c; head -c 3 /dev/random | wc -c; "
                        "echo x > /dev/full || echo full-refuses")
    assert r["stdout"].split() == ["null-ok", "5", "7", "3", "full-refuses"], r


def _guest_alive(client, sid, started):
    """the sandbox is running, execs, and its PID 1 is the guest it started with"""
    assert client.sandbox(sid)["state"] == "running"
    r = sh(client, sid, "cut -d' ' -f22 /proc/1/stat; tr '\\0' ' ' < /proc/1/cmdline; echo")
    lines = r["stdout"].split("\n")
    assert lines[0] == started and lines[1].startswith("/dev/.cove-guest"), r


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("full", [False, True], ids=["fresh", "after-full-pause"])
def test_memory_bombs_end_the_bomb_not_the_guest(client, coved, helper, upload, full):
    """Memory no OOM kill gives back to a process's size (a /dev/shm fill, a memfd written
    with write()) no longer takes PID 1 (the guest) along: /dev/shm fills up to its size,
    the workload's own cgroup OOMs inside, and the sandbox keeps running and answering exec
    (also after a full pause/resume, where CRIU restored every process)."""
    if full and client.snapshot_kind() != "full":
        pytest.skip("this coved has no full snapshots (criu missing or its self-check failed)")
    sb = _python_sandbox(client, memory_mb=64)
    sid = sb["id"]
    try:
        if full:
            client.post(f"/v1/sandboxes/{sid}/pause")
            client.wait_state(sid, "paused", timeout=120)
            client.post(f"/v1/sandboxes/{sid}/resume")
            client.wait_state(sid, "running", timeout=120)
        started = sh(client, sid, "cut -d' ' -f22 /proc/1/stat")["stdout"].strip()
        # /dev/shm: files there are memory no OOM kill frees
        r = sh(client, sid, "dd if=/dev/zero of=/dev/shm/fill bs=1M count=2000 2>&1; echo rc=$?",
               timeout=300)
        assert "rc=0" not in r["stdout"], f"a 2000 MiB /dev/shm file in a 64 MiB sandbox: {r}"
        _guest_alive(client, sid, started)
        # with /dev/shm full, a process bomb still ends with the bomb
        r = sh(client, sid, "head -c 2000m /dev/zero | tail > /dev/null; echo rc=$?", timeout=300)
        assert "rc=0" not in r["stdout"], r
        _guest_alive(client, sid, started)
        # a small process filling a memfd with write(): those pages count in no process's
        # size, so the OOM killer, picking by size, used to take the bigger guest
        upload(sid, helper("memfd_bomb"), "/tmp/memfd_bomb")
        for _ in range(3):
            r = sh(client, sid, "/tmp/memfd_bomb; echo rc=$?", timeout=300)
            assert "rc=0" not in r["stdout"], f"64 GiB in a memfd of a 64 MiB sandbox: {r}"
            _guest_alive(client, sid, started)
        assert sh(client, sid, "rm /dev/shm/fill && echo gone")["stdout"] == "gone\n"
    finally:
        client.remove(sid)


@pytest.mark.root
def test_sandbox_sees_its_own_size(client, coved):
    """A sandbox with memory_mb=256 and cpus=1 sees 256 MiB and 1 CPU wherever programs look
    (/proc/meminfo, free, nproc, os.cpu_count(), /proc/cpuinfo, /sys/devices/system/cpu/online,
    /proc/stat), not the host's size."""
    view = [ln for ln in coved.log_lines() if ln.get("event") == "runtime.view"]
    if view and view[-1].get("level") != "info":
        pytest.skip(f"no per-sandbox views on this node: {view[-1].get('msg')}")
    sb = _python_sandbox(client, memory_mb=256, cpus=1)
    sid = sb["id"]
    try:
        r = sh(client, sid, "grep MemTotal /proc/meminfo; nproc; "
                            "python3 -c 'import os; print(os.cpu_count())'; "
                            "grep -c ^processor /proc/cpuinfo; cat /sys/devices/system/cpu/online; "
                            "grep -c '^cpu[0-9]' /proc/stat; grep SwapTotal /proc/meminfo")
        out = r["stdout"].split("\n")
        mem_kb = int(out[0].split()[1])
        assert abs(mem_kb - 256 * 1024) <= 1024, f"MemTotal inside: {out[0]}"
        assert out[1:6] == ["1", "1", "1", "0", "1"], \
            f"CPU count inside (nproc, cpu_count, cpuinfo, online, /proc/stat): {out[1:6]}"
        with open("/proc/meminfo") as f:
            host_kb = int(f.readline().split()[1])
        assert host_kb > 2 * mem_kb, "this host is too small to tell the views apart"
        assert int(out[6].split()[1]) == 0, f"swap inside: {out[6]}"
    finally:
        client.remove(sid)
