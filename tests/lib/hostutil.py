"""Host-side helpers shared by tests/security and tests/integration: a recording TCP
listener, the host's IPv4 addresses, a sandbox's cgroup files, loop devices under a path."""
import glob
import os
import socket
import subprocess
import threading

CGROUP_ROOT = "/sys/fs/cgroup"


class Listener:
    """TCP listener on the host that records every accepted connection."""

    def __init__(self, host, port=0):
        self.s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.s.bind((host, port))
        self.s.listen(16)
        self.port = self.s.getsockname()[1]
        self.hits = []
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        while True:
            try:
                c, a = self.s.accept()
            except OSError:
                return
            self.hits.append(a)
            try:
                c.sendall(b"HOST-SERVICE\n")
            finally:
                c.close()

    def close(self):
        self.s.close()


def host_ipv4():
    """the host's IPv4 addresses other than loopback"""
    out = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    addrs = []
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            a = parts[parts.index("inet") + 1].split("/")[0]
            if not a.startswith("127."):
                addrs.append(a)
    return addrs


def cgroup_file(sid, controller, name):
    """Path of a controller file of the sandbox's cgroup (v2 unified or v1), or None."""
    for p in (os.path.join(CGROUP_ROOT, "cove", sid, name),
              os.path.join(CGROUP_ROOT, "unified", "cove", sid, name),
              os.path.join(CGROUP_ROOT, controller, "cove", sid, name)):
        if os.path.exists(p):
            return p
    return None


def loops_under(path, ids=None):
    """(loopN, backing file) of the host's loop devices whose backing file is path or lies
    under it (and names one of ids, when given)."""
    real = os.path.realpath(path)
    out = []
    for bf in glob.glob("/sys/block/loop*/loop/backing_file"):
        try:
            with open(bf) as f:
                b = f.read().strip()
        except OSError:
            continue
        if (b == real or b.startswith(real + "/")) and (ids is None or any(i in b for i in ids)):
            out.append((bf.split("/")[3], b))
    return out
