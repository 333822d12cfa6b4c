"""Gaining host root through a setuid binary made inside the sandbox."""
import os
import time

import pytest

from secutil import layer_dir, sh

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
    # run it as the unprivileged user of the sandbox
    r = client.exec(sid, ["/tmp/suid/busybox", "cat", "/proc/self/status"], user="user")
    assert r["exit_code"] == 0, r
    st = r["stdout"]
    assert "NoNewPrivs:\t1" in st, f"no_new_privs not set for sandbox processes: {st}"
    uid_line = [l for l in st.splitlines() if l.startswith("Uid:")][0].split()[1:]
    # with no_new_privs the setuid bit is ignored: still uid 1000 (root only inside at most)
    assert uid_line[1] in ("1000", "0"), uid_line

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
        assert ids["nnp"] == 1
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
