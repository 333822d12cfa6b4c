"""Gaining host root through a setuid binary made inside the sandbox."""
import json
import os
import time

import pytest

from secutil import layer_dir, sh
from test_kernel import PROBES, REFUSED

UID_RANGE_MIN = 0x10000000


def _host_procs_with_argv(argv):
    want = "\0".join(argv).encode() + b"\0"
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if f.read() == want:
                    out.append(int(p))
        except OSError:
            pass
    return out


def _status_ids(pid):
    ids = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("Uid:", "Gid:")):
                ids[line[:3]] = [int(x) for x in line.split()[1:]]
            if line.startswith("NoNewPrivs:"):
                ids["nnp"] = int(line.split()[1])
    return ids


@pytest.mark.root
def test_setuid_copy_is_not_host_root(client, sandbox, coved):
    sid = sandbox["id"]
    r = sh(client, sid, "mkdir -p /tmp/suid && cp /bin/busybox /tmp/suid/busybox && "
                        "chown 0:0 /tmp/suid/busybox && "
                        "chmod 4755 /tmp/suid/busybox && ls -ln /tmp/suid/busybox")
    assert r["exit_code"] == 0, r
    assert r["stdout"].startswith("-rws"), r
    # run it as the unprivileged user of the sandbox (busybox itself drops the setuid
    # privilege for applets such as cat: its status shows the filter, not the ids)
    r = client.exec(sid, ["/tmp/suid/busybox", "cat", "/proc/self/status"], user="user")
    assert r["exit_code"] == 0, r
    st = r["stdout"]
    assert "Seccomp:\t2" in st, f"the seccomp filter is not on the setuid process: {st}"

    # as seen from the host, the process runs with ids of the sandbox's private range
    tag = f"{os.getpid() % 10000}{int(time.time()) % 100000}"
    sh(client, sid, f"/tmp/suid/busybox sleep 3{tag} >/dev/null 2>&1 &", user="user")
    deadline = time.time() + 30
    pids = []
    while time.time() < deadline and not pids:
        pids = _host_procs_with_argv(["/tmp/suid/busybox", "sleep", f"3{tag}"])
        if not pids:
            pids = _host_procs_with_argv(["sleep", f"3{tag}"])
        time.sleep(0.05)
    assert pids, "setuid process not found on the host"
    for pid in pids:
        ids = _status_ids(pid)
        for k in ("Uid", "Gid"):
            assert min(ids[k]) >= UID_RANGE_MIN, \
                f"sandbox process {pid} has host {k} {ids[k]} (below {UID_RANGE_MIN:#x})"
    sh(client, sid, f"pkill -f 3{tag} 2>/dev/null; kill $(pidof sleep) 2>/dev/null; true")

    # On the host the layer stores *sandbox* ids (the sandbox reaches it through an idmapped
    # mount), so the copy is root-owned and setuid on disk. It must be harmless there: the
    # layer filesystem is mounted nosuid,nodev on the host, and no host user but root can
    # reach it (some directory on the way is closed to others).
    ld = layer_dir(coved, sid)
    if ld is None:
        pytest.skip("layer directory of the sandbox not found under the data dir")
    found = []
    for root, _dirs, files in os.walk(ld):
        if "busybox" in files and root.endswith("suid"):
            found.append(os.path.join(root, "busybox"))
    assert found, f"setuid copy not found in the upper layer under {ld}"
    for p in found:
        st = os.lstat(p)
        if st.st_uid >= UID_RANGE_MIN and st.st_gid >= UID_RANGE_MIN:
            continue  # shifted ownership on disk: nothing to exploit
        opts = _mount_options_of(p)
        assert "nosuid" in opts and "nodev" in opts, \
            f"{p} is host-root-owned on a mount without nosuid,nodev ({sorted(opts)})"
        assert not _reachable_by_others(p), f"{p} is reachable by non-root host users"


def _mount_options_of(path):
    """Per-mount options of the mount holding path (longest mount point prefix)."""
    best, opts = "", set()
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            mp = parts[4].replace("\\040", " ")
            if (path == mp or path.startswith(mp.rstrip("/") + "/")) and len(mp) > len(best):
                best, opts = mp, set(parts[5].split(","))
    return opts


def _reachable_by_others(path):
    """True if every directory from / down to path lets 'others' search it (x bit)."""
    d = os.path.dirname(os.path.realpath(path))
    while True:
        if not os.stat(d).st_mode & 0o001:
            return False
        if d == "/":
            return True
        d = os.path.dirname(d)


def _setuid_copy(client, sid, src, dst):
    """dst: a root-owned setuid copy of src inside the sandbox."""
    r = sh(client, sid, f"mkdir -p {os.path.dirname(dst)} && cp {src} {dst} && chown 0:0 {dst} "
                        f"&& chmod 4755 {dst} && ls -ln {dst}")
    assert r["exit_code"] == 0 and r["stdout"].startswith("-rws"), r


@pytest.mark.root
def test_setuid_root_gets_no_host_privilege(client, sandbox, helper, upload, host_marker):
    """A setuid-root program run by the sandbox's unprivileged user becomes the sandbox's
    root and nothing more: every privileged syscall the filter refuses is still refused
    (modules, mounts, namespaces, bpf, keyctl, open_by_handle_at, ...), the host's files
    stay out of reach, and a root-only host file cannot be found."""
    sid = sandbox["id"]
    path, content = host_marker
    os.chmod(path, 0o600)  # host root only
    upload(sid, helper("sysprobe"), "/tmp/sysprobe")
    _setuid_copy(client, sid, "/tmp/sysprobe", "/tmp/suid/sysprobe")
    r = client.exec(sid, ["/tmp/suid/sysprobe", path], user="user")
    assert r["exit_code"] == 0, r
    res = dict(l.split("=", 1) for l in r["stdout"].splitlines() if "=" in l)
    # the setuid bit took effect (real uid 1000, effective 0): the probes ran as root
    assert res.get("ids") == "1000,0", r["stdout"][:300]
    for name in PROBES:
        if name in ("iopl", "ioperm") and name not in res:
            continue
        assert res.get(name) in REFUSED, \
            f"{name} from a setuid-root program gave {res.get(name)}, expected refusal"
    assert res.get("chroot_escape") != "OK", "chroot escape reached a host path"
    assert content not in r["stdout"]
    # nor through the shell tricks, as the sandbox's root reached by setuid
    tricks = [path, f"/proc/1/root{path}", f"/proc/self/root/../..{path}"]
    _setuid_copy(client, sid, "/bin/busybox", "/tmp/bb")
    r = sh(client, sid, "".join(f"/tmp/bb cat {t} 2>/dev/null\n" for t in tricks), user="user")
    assert content not in r["stdout"]


SUDO_ATTACKS = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
out = {"ids": [os.getuid(), os.geteuid()]}
def err(f):
    try:
        f()
        return "OK"
    except OSError as e:
        return e.__class__.__name__ + ":" + str(e.errno)
def sys_rc(nr, *a):
    r = libc.syscall(nr, *a)
    return "OK" if r == 0 else "errno:%d" % ctypes.get_errno()
def write(path, data):
    with open(path, "w") as f:
        f.write(data)
out["uid_map"] = err(lambda: write("/proc/self/uid_map", "0 0 1\n"))
out["gid_map_pid1"] = err(lambda: write("/proc/1/gid_map", "0 0 1\n"))
out["setuid_unmapped"] = err(lambda: os.setresuid(0, 4000000000, 0))
out["finit_module"] = sys_rc(313, -1, b"", 0)        # x86_64
out["init_module"] = sys_rc(175, None, 0, b"")
out["mount_bind_root"] = "OK" if libc.mount(b"/", b"/mnt", None, 4096, None) == 0     else "errno:%d" % ctypes.get_errno()
out["mount_proc"] = "OK" if libc.mount(b"proc", b"/mnt", b"proc", 0, None) == 0     else "errno:%d" % ctypes.get_errno()
out["unshare_user"] = "OK" if libc.unshare(0x10000000) == 0 else "errno:%d" % ctypes.get_errno()
out["host_file"] = err(lambda: open(sys.argv[1]).read())
out["kmsg"] = err(lambda: open("/dev/kmsg").read(1))
print(json.dumps(out))
"""


@pytest.mark.root
def test_sudo_root_cannot_leave_the_uid_map(client, coved, host_marker):
    """Passwordless sudo in the base template makes the user the sandbox's root; as that
    root, writing the uid/gid maps, switching to an unmapped id, loading a module, mounting,
    new user namespaces, the host's root-only file and the kernel log all fail, and the
    process seen from the host runs with ids of the sandbox's private range."""
    path, content = host_marker
    os.chmod(path, 0o600)
    sb = client.create(template="base")
    try:
        sid = sb["id"]
        if sh(client, sid, "command -v python3 && command -v sudo")["exit_code"] != 0:
            pytest.skip("the base template has no python3 or sudo")
        client.put_file(sid, "/tmp/attacks.py", SUDO_ATTACKS.encode())
        r = client.exec(sid, ["sudo", "-n", "python3", "/tmp/attacks.py", path], user="user")
        assert r["exit_code"] == 0, r
        res = json.loads(r["stdout"].strip().splitlines()[-1])
        assert res["ids"] == [0, 0], f"sudo did not give the sandbox's root: {res}"
        for k, v in res.items():
            if k != "ids":
                assert v != "OK", f"{k} worked as the sandbox's root (via sudo): {res}"
        assert content not in r["stdout"]
        # from the host: sudo's process has only ids of the sandbox's range
        tag = f"{os.getpid() % 10000}{int(time.time()) % 100000}"
        sh(client, sid, f"sudo -n sleep 4{tag} >/dev/null 2>&1 &", user="user")
        deadline = time.time() + 30
        pids = []
        while time.time() < deadline and not pids:
            pids = _host_procs_with_argv(["sleep", f"4{tag}"])
            time.sleep(0.05)
        assert pids, "sudo's process not found on the host"
        for pid in pids:
            ids = _status_ids(pid)
            for k in ("Uid", "Gid"):
                assert min(ids[k]) >= UID_RANGE_MIN, f"sudo's process has host {k} {ids[k]}"
    finally:
        client.remove(sb["id"])
