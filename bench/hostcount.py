"""What a coved holds on the host, counted from /proc and /sys (bench/density.py, bench/soak.py):
its RSS, fds and threads, the loop devices and mounts under its data dir, the cgroups of a
set of sandbox ids. Stdlib only; every reader tolerates things vanishing while it reads."""
import os

CGROUP_ROOT = "/sys/fs/cgroup"


def proc_status(pid, key):
    """A /proc/PID/status field in bytes (kB fields) or as an int (Threads)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for l in f:
                if l.startswith(key + ":"):
                    v = l.split()
                    return int(v[1]) * (1024 if len(v) > 2 and v[2] == "kB" else 1)
    except OSError:
        pass
    return 0


def fd_count(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def meminfo(key):
    with open("/proc/meminfo") as f:
        for l in f:
            if l.startswith(key + ":"):
                return int(l.split()[1]) * 1024
    return 0


def loops_under(path):
    """Loop devices whose backing file is under path."""
    real = os.path.realpath(path)
    n = 0
    try:
        names = os.listdir("/sys/block")
    except OSError:
        return 0
    for d in names:
        if not d.startswith("loop"):
            continue
        try:
            with open(f"/sys/block/{d}/loop/backing_file") as f:
                b = f.read().strip()
        except OSError:
            continue
        if b == real or b.startswith(real + "/"):
            n += 1
    return n


def loops_total():
    """Bound loop devices on the host (anyone's)."""
    n = 0
    for d in os.listdir("/sys/block"):
        if d.startswith("loop") and os.path.exists(f"/sys/block/{d}/loop/backing_file"):
            n += 1
    return n


def mounts_under(path):
    """Mounts (in our mount namespace) at or under path, or whose source is under it."""
    real = os.path.realpath(path)
    n = 0
    with open("/proc/self/mountinfo") as f:
        for l in f:
            if real in l:
                n += 1
    return n


def cgroups_of(ids):
    """cgroup directories named after one of ids, under any controller's cove/ parent."""
    ids = set(ids)
    n = 0
    try:
        ctrls = os.listdir(CGROUP_ROOT)
    except OSError:
        return 0
    parents = {os.path.join(CGROUP_ROOT, "cove")}
    parents |= {os.path.join(CGROUP_ROOT, c, "cove") for c in ctrls}
    for parent in parents:
        try:
            n += sum(1 for d in os.listdir(parent) if d in ids)
        except OSError:
            pass
    return n


def coved_counts(pid):
    return {"rss": proc_status(pid, "VmRSS"), "fds": fd_count(pid),
            "threads": proc_status(pid, "Threads")}
