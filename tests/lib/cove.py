"""Test helpers: start a real coved and drive it over its REST API (docs/api.md), the way
an outside client does. Standard library only; used by tests/conftest.py's fixtures.

    d = Coved(build_dir, templates_dir=...)   # starts coved on a fresh data dir
    c = d.client                              # Client: request/json helpers/exec/stream/files
    sb = c.create(template="busybox")
    assert c.exec(sb["id"], "echo hi")["stdout"] == "hi\\n"
    d.kill9(); d.start()                      # crash and restart on the same data dir
    d.stop()                                  # SIGTERM, then remove the data dir
"""
import base64
import collections
import ctypes
import glob
import hashlib
import http.client
import itertools
import json
import os
import random
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
import urllib.parse

START_TIMEOUT_S = float(os.environ.get("COVE_START_TIMEOUT", "900"))  # first start may build base


class CoveError(AssertionError):
    """An API call did not answer as the test expected."""


def free_port(host="127.0.0.1"):
    """A port on host nobody is bound to, below the kernel's ephemeral range: a port the
    kernel hands out (bind to port 0, a connect) could be given to the very coved the
    caller then starts on it (its egress proxy binds port 0 before --listen)."""
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    lo = 10000 if low > 12000 else 1024
    for _ in range(500):
        port = lo + int.from_bytes(os.urandom(2), "big") % (low - lo)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port on {host} below {low}")


_CLONE_NEWNET = 0x40000000


def socket_in(netns, family=socket.AF_INET, type=socket.SOCK_STREAM):
    """A socket of the named network namespace (/run/netns/<netns>), made by a thread that
    joins it (setns changes only the calling thread; a socket keeps its namespace)."""
    box = {}

    def make():
        fd = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
                e = ctypes.get_errno()
                raise OSError(e, f"setns {netns}: {os.strerror(e)}")
            box["s"] = socket.socket(family, type)
        except BaseException as e:  # re-raised in the caller's thread
            box["e"] = e
        finally:
            os.close(fd)

    t = threading.Thread(target=make)
    t.start()
    t.join()
    if "e" in box:
        raise box["e"]
    return box["s"]


class _NetnsConnection(http.client.HTTPConnection):
    """HTTPConnection whose socket lives in another network namespace."""

    def __init__(self, netns, host, port, timeout):
        super().__init__(host, port, timeout=timeout)
        self.netns = netns

    def connect(self):
        s = socket_in(self.netns)
        try:
            s.settimeout(self.timeout)
            s.connect((self.host, self.port))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except BaseException:
            s.close()
            raise
        self.sock = s


class Response(collections.namedtuple("Response", "status headers body")):
    """(status, headers, body) that also offers .json() and .error (the error object)."""

    def json(self):
        try:
            return json.loads(self.body.decode() or "null")
        except ValueError:
            raise CoveError(f"status {self.status}: not JSON: {self.body[:200]!r}")

    @property
    def error(self):
        """The {"code","message"} object of an error answer, or {} when there is none."""
        try:
            j = json.loads(self.body.decode() or "null")
        except ValueError:
            return {}
        return (j or {}).get("error") or {} if isinstance(j, dict) else {}


class Client:
    """HTTP client for one coved (TCP on 127.0.0.1:port) with one API key; netns: the
    network namespace coved listens in (None: the test's own)."""

    def __init__(self, port, key=None, host="127.0.0.1", netns=None):
        self.host, self.port, self.key, self.netns = host, port, key, netns

    def with_key(self, key):
        return Client(self.port, key, self.host, self.netns)

    def conn(self, timeout=60):
        if self.netns:
            return _NetnsConnection(self.netns, self.host, self.port, timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    # -- raw ---------------------------------------------------------------------------
    def request(self, method, path, body=None, headers=None, auth=True, key=None, timeout=120):
        """Returns Response(status, headers, body). dict/list bodies are sent as JSON."""
        h = dict(headers or {})
        if auth and (key or self.key):
            h.setdefault("Authorization", f"Bearer {key or self.key}")
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            h.setdefault("Content-Type", "application/json")
        elif isinstance(body, str):
            body = body.encode()
        c = self.conn(timeout)
        try:
            try:
                c.request(method, path, body=body, headers=h)
            except (BrokenPipeError, ConnectionResetError):
                # a server may answer (413) and close before reading a large body; the
                # answer can still be waiting in the socket
                if body is None or len(body) < 1024 * 1024:
                    raise
            r = c.getresponse()
            return Response(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
        finally:
            c.close()

    # -- JSON --------------------------------------------------------------------------
    def ok(self, method, path, body=None, expect=(200, 201, 204), **kw):
        """The decoded JSON answer (None for an empty body); CoveError on another status."""
        r = self.request(method, path, body, **kw)
        if r.status not in ((expect,) if isinstance(expect, int) else expect):
            raise CoveError(f"{method} {path} -> {r.status} {r.body[:400]!r}")
        return r.json() if r.body else None

    def get(self, path, **kw):
        return self.ok("GET", path, **kw)

    def post(self, path, body=None, **kw):
        return self.ok("POST", path, body if body is not None else {}, **kw)

    def put(self, path, body=None, **kw):
        return self.ok("PUT", path, body, **kw)

    def delete(self, path, **kw):
        return self.ok("DELETE", path, expect=kw.pop("expect", (200, 204)), **kw)

    def expect_error(self, method, path, status, code, body=None, **kw):
        """Asserts the documented error shape; returns the error object."""
        r = self.request(method, path, body, **kw)
        e = r.error
        if r.status != status or e.get("code") != code or not e.get("message"):
            raise CoveError(f"{method} {path}: expected {status} {code}, got {r.status} "
                            f"{r.body[:300]!r}")
        return e

    def snapshot_kind(self, timeout=60):
        """The kind snapshots of running sandboxes have on this coved ("full" or "files", from
        /healthz), once its start-up CRIU self-check is done."""
        deadline = time.time() + timeout
        while True:
            k = self.get("/healthz", auth=False).get("snapshots")
            if k != "checking":
                return k
            if time.time() > deadline:
                raise CoveError(f"/healthz still says snapshots: checking after {timeout} s")
            time.sleep(0.05)

    # -- sandboxes ---------------------------------------------------------------------
    def create(self, template="busybox", **fields):
        fields["template"] = template
        return self.ok("POST", "/v1/sandboxes", fields, expect=(200, 201))

    def remove(self, sid, purge=False):
        """DELETE the sandbox; True if it was there, False on 404."""
        r = self.request("DELETE", f"/v1/sandboxes/{sid}" + ("?purge=true" if purge else ""))
        if r.status == 404:
            return False
        if r.status not in (200, 204):
            raise CoveError(f"DELETE {sid} -> {r.status} {r.body[:300]!r}")
        return True

    def sandbox(self, sid):
        return self.get(f"/v1/sandboxes/{sid}")

    def wait_state(self, sid, states, timeout=60):
        states = {states} if isinstance(states, str) else set(states)
        deadline = time.time() + timeout
        while True:
            sb = self.sandbox(sid)
            if sb.get("state") in states:
                return sb
            if time.time() > deadline:
                raise CoveError(f"{sid} is {sb.get('state')}, not {sorted(states)} after "
                                f"{timeout} s")
            time.sleep(0.05)

    # -- processes ---------------------------------------------------------------------
    def exec(self, sid, what, wait=True, timeout=120, **fields):
        """what is a shell string or an argv list. wait=True: the result dict, with stdout
        and stderr decoded to str (from *_b64 when the server sent those). wait=False:
        a generator of stream events (see stream())."""
        body = dict(fields)
        if isinstance(what, str):
            body["shell"] = what
        else:
            body["cmd"] = list(what)
        if not wait:
            body.pop("wait", None)
            return self.stream(f"/v1/sandboxes/{sid}/exec", body, timeout=timeout)
        body["wait"] = True
        r = self.request("POST", f"/v1/sandboxes/{sid}/exec", body, timeout=timeout)
        if r.status != 200:
            raise CoveError(f"exec {what!r} -> {r.status} {r.body[:300]!r}")
        j = r.json()
        for k in ("stdout", "stderr"):
            if j.get(k) is None and j.get(k + "_b64") is not None:
                j[k] = base64.b64decode(j[k + "_b64"]).decode(errors="replace")
        return j

    def stream(self, path, body=None, method=None, max_events=None, timeout=60):
        """Yields decoded NDJSON events of a streaming answer; stops after max_events
        (dropping the connection, as a client that goes away does)."""
        method = method or ("POST" if body is not None else "GET")
        c = self.conn(timeout)
        h = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        try:
            c.request(method, path, body=data, headers=h)
            r = c.getresponse()
            if r.status != 200:
                raise CoveError(f"{method} {path} -> {r.status} {r.read()[:300]!r}")
            n, buf = 0, b""
            while True:
                chunk = r.read1(65536)
                if not chunk:
                    break
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if not line.strip():
                        continue
                    yield json.loads(line)
                    n += 1
                    if max_events and n >= max_events:
                        return
        finally:
            c.close()

    @staticmethod
    def output(events, kind="stdout"):
        """Concatenated bytes of the stdout/stderr/pty events of a stream."""
        return b"".join(base64.b64decode(e["data_b64"]) for e in events if e.get("type") == kind)

    # -- files -------------------------------------------------------------------------
    @staticmethod
    def _q(path):
        return urllib.parse.quote(path, safe="/")

    def put_file(self, sid, path, data, mode=None, timeout=300):
        q = f"/v1/sandboxes/{sid}/files?path={self._q(path)}"
        if mode is not None:
            q += f"&mode={mode:04o}" if isinstance(mode, int) else f"&mode={mode}"
        return self.ok("PUT", q, data, headers={"Content-Type": "application/octet-stream"},
                       timeout=timeout)

    def get_file(self, sid, path, timeout=300):
        """Response of GET …/files: .status 200 with .body, or 404."""
        return self.request("GET", f"/v1/sandboxes/{sid}/files?path={self._q(path)}",
                            timeout=timeout)



def poll(fn, timeout=60, what="condition", every=0.05):
    """fn()'s first truthy value, tried every `every` s; AssertionError naming `what` when
    none came within timeout s."""
    deadline = time.time() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.time() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(every)


def host_pid_of(cmdline):
    """Host pid of the first process whose command line (NULs as spaces) is cmdline, or None."""
    for p in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(p, "rb") as f:
                if f.read().replace(b"\0", b" ").strip() == cmdline:
                    return int(p.split("/")[2])
        except OSError:
            pass
    return None


def proc_status(pid, key):
    """The value of key in /proc/<pid>/status."""
    with open(f"/proc/{pid}/status") as f:
        return next(x.split(None, 1)[1].strip() for x in f if x.startswith(key + ":"))


# one marker per call in this run (a random base against other runs on the host): two
# sandboxes must never be told apart by a marker that may collide
_markers = itertools.count(random.SystemRandom().randrange(10**8, 9 * 10**8, 10**6))


def guest_pid(client, sid):
    """Host pid of the sandbox's guest (PID 1 inside): the parent of an orphaned sleep with
    a command line no other process of the host has."""
    marker = f"sleep {next(_markers)}"
    client.exec(sid, f"{marker} >/dev/null 2>&1 &")
    pid = poll(lambda: host_pid_of(marker.encode()), timeout=30,
               what=f"{sid}'s process on the host", every=0.05)
    return int(proc_status(pid, "PPid"))


def sh(client, sid, cmd):
    """stdout of cmd in the sandbox, asserting it exited 0."""
    r = client.exec(sid, cmd)
    assert r["exit_code"] == 0, r
    return r["stdout"]


def snapshots(client, sid):
    return client.get(f"/v1/sandboxes/{sid}/snapshots")["snapshots"]


def reap_helpers(data_dir):
    """Stop what a coved killed with SIGKILL left running for its data dir (its lxcfs, which
    keeps its mount point and, for a node in a network namespace, that namespace alive) and
    detach the lxcfs mount point: by pid, only processes whose command line names data_dir."""
    root = os.path.realpath(data_dir).encode()
    found = []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if root + b"/" in cmd:
            found.append((int(p), cmd.split(b"\0")))
    for pid, _ in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for pid, argv in found:
        poll(lambda: _gone_or_zombie(pid), timeout=30, what=f"pid {pid} gone")
        for a in argv:
            if a.startswith(b"/run/cove-lxcfs/"):
                subprocess.run(["umount", "-l", a.decode()], capture_output=True)
                try:
                    os.rmdir(a.decode())
                except OSError:
                    pass


def _gone_or_zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[:1] == ["Z"]
    except OSError:
        return True


def remove_data_dir(path):
    """rmtree of a coved data dir, after stopping what a coved killed with SIGKILL (and never
    restarted) left running for it (its lxcfs, whose mount point is outside the data dir) and
    detaching what it left mounted under it (its layer filesystem; the loop devices are
    autoclear and go with the last unmount). A plain rmtree stopped at those mounts and left
    them, and their loop devices, on the host."""
    reap_helpers(path)
    root = os.path.realpath(path)
    mounts = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                mp = line.split()[4].replace("\\040", " ")
                if mp == root or mp.startswith(root + "/"):
                    mounts.append(mp)
    except OSError:
        pass
    for mp in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", mp], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
    # its egress gateway's nftables table (one per data dir, named from the path coved was
    # given, control/egress.c): a coved killed with SIGKILL cannot remove it, and every
    # packet on the host walks every table left behind
    for p in {path, root}:
        table = "cove_" + hashlib.sha256(p.encode()).hexdigest()[:12]
        subprocess.run(["nft", "delete", "table", "inet", table], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
    shutil.rmtree(path, ignore_errors=True)

def grep_data(data_dir, needle):
    """Regular files under data_dir holding needle: what is at rest (the layer filesystem's
    image and the layer images on it included), not the live views of running sandboxes'
    layers mounted at ns/layers/<id> (those show whatever the sandbox can read). Reads only
    the data extents of sparse files (SEEK_DATA/SEEK_HOLE), in chunks."""
    pat = needle.encode()
    hits = []
    live = os.path.join(data_dir, "ns", "layers")
    for root, dirs, files in os.walk(data_dir):
        if root == live:
            dirs[:] = []
            continue
        for f in files:
            p = os.path.join(root, f)
            try:
                fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    continue
                size, off, tail = os.fstat(fd).st_size, 0, b""
                while off < size:
                    try:
                        off = os.lseek(fd, off, os.SEEK_DATA)
                        end = os.lseek(fd, off, os.SEEK_HOLE)
                    except OSError:
                        break
                    tail = b""
                    while off < end:
                        buf = os.pread(fd, min(8 << 20, end - off), off)
                        if not buf:
                            break
                        if pat in tail + buf:
                            hits.append(p)
                            off = size
                            break
                        tail = buf[-len(pat):]
                        off += len(buf)
                    if hits and hits[-1] == p:
                        break
            finally:
                os.close(fd)
    return hits


class Coved:
    """A real coved process on a data dir. The data dir is a fresh temp dir unless given;
    templates come from templates_dir, shared across runs so base is built once. netns:
    a network namespace (/run/netns/<netns>) to run it in instead of the test's own (see
    tests/lib/testnet.py); its client then connects from inside that namespace."""

    def __init__(self, build_dir, data_dir=None, templates_dir=None, extra_args=(),
                 log_dir=None, start=True, env=None, netns=None):
        self.bin = os.path.join(build_dir, "coved")
        if not os.access(self.bin, os.X_OK):
            raise CoveError(f"{self.bin} not built (make BUILD={os.path.basename(build_dir)})")
        self.own_data = data_dir is None
        self.data = data_dir or tempfile.mkdtemp(prefix="cove-test-")
        os.makedirs(self.data, exist_ok=True)
        self.templates = templates_dir
        self.extra = list(extra_args)
        self.env = dict(os.environ, **env) if env else None  # added to the environment
        self.netns = netns
        # a link pool of its own unless the test names one: coveds of parallel runs on one
        # host must not hand out the same addresses
        if not any(a.startswith("--egress-pool") for a in self.extra):
            self.pool_octet = 64 + (os.getpid() * 7 + id(self)) % 180
            self.extra += ["--egress-pool", f"10.{self.pool_octet}.0.0/16"]
        else:  # the second octet of a 10.X.0.0/16 the test names (None for another form)
            i = self.extra.index("--egress-pool") if "--egress-pool" in self.extra else -1
            m = re.fullmatch(r"10\.(\d+)\.0\.0/16", self.extra[i + 1]) if i >= 0 else None
            self.pool_octet = int(m.group(1)) if m else None
        self.log_dir = log_dir
        self.port = None
        self.proc = None
        self.client = None
        if start:
            try:
                self.start()
            except BaseException:
                # keep what explains the failure, drop the rest
                self.terminate()
                saved = self.save_log("start-failed")
                if self.own_data and not os.environ.get("COVE_KEEP"):
                    remove_data_dir(self.data)
                if saved:
                    print(f"coved log kept at {saved}")
                raise

    @property
    def log_path(self):
        return os.path.join(self.data, "coved.log")

    def argv(self):
        a = [self.bin, "--data-dir", self.data, "--listen", f"127.0.0.1:{self.port}"]
        if self.templates:
            a += ["--templates-dir", self.templates]
        return a + self.extra

    def in_netns(self, argv):
        """argv run in coved's network namespace (a client that must reach its 127.0.0.1)"""
        return (["nsenter", f"--net=/run/netns/{self.netns}", "--"] if self.netns else []) \
            + list(argv)

    def start(self, timeout=START_TIMEOUT_S):
        """Starts (or restarts) coved, waits for GET /healthz and reads admin.key."""
        self.port = free_port()
        with open(self.log_path, "ab") as log:
            # nsenter joins the namespace and execs coved (no fork): proc is coved itself
            self.proc = subprocess.Popen(self.in_netns(self.argv()), stdout=log, stderr=log, env=self.env,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        probe = Client(self.port, netns=self.netns)
        deadline = time.time() + timeout
        while True:
            if self.proc.poll() is not None:
                raise CoveError(f"coved exited with {self.proc.returncode}; log tail:\n"
                                f"{self.log_tail()}")
            try:
                if probe.request("GET", "/healthz", auth=False, timeout=2).status == 200:
                    break
            except (OSError, http.client.HTTPException):
                pass
            if time.time() > deadline:
                raise CoveError(f"coved did not answer /healthz within {timeout:.0f} s; log "
                                f"tail:\n{self.log_tail()}")
            time.sleep(0.05)
        kp = os.path.join(self.data, "admin.key")
        if not os.path.exists(kp):
            raise CoveError(f"no admin.key in {self.data} after start")
        with open(kp) as f:
            self.client = Client(self.port, f.read().strip(), netns=self.netns)
        return self.client

    def log_tail(self, n=2000):
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - n))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def log_lines(self):
        """coved's log as parsed JSON lines (non-JSON lines are skipped)."""
        out = []
        try:
            with open(self.log_path, "rb") as f:
                for line in f:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
        except OSError:
            pass
        return out

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill9(self):
        """SIGKILL, as a crash: nothing of coved's shutdown path runs."""
        if self.alive():
            self.proc.kill()
        if self.proc:
            self.proc.wait()

    def terminate(self, timeout=30):
        """SIGTERM and wait; SIGKILL after timeout. Returns the exit status."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode if self.proc else None

    def save_log(self, label):
        """Copies coved's log into log_dir (next to the test output); returns the path."""
        if not self.log_dir or not os.path.exists(self.log_path):
            return None
        os.makedirs(self.log_dir, exist_ok=True)
        dst = os.path.join(self.log_dir, f"coved-{label}-{os.getpid()}-{int(time.time())}.log")
        shutil.copyfile(self.log_path, dst)
        return dst

    def stop(self, keep_log_as=None):
        """SIGTERM; keeps the log (keep_log_as label) when asked; removes an own data dir."""
        rc = self.terminate()
        saved = self.save_log(keep_log_as) if keep_log_as else None
        if self.own_data and not os.environ.get("COVE_KEEP"):
            remove_data_dir(self.data)
        return rc, saved
