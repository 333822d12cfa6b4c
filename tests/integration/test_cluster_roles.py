"""coved --role control and --role node: one control replica and two nodes as plain
processes on loopback (distinct --listen ports, --egress-pool and data dirs) sharing a real
PostgreSQL and a real radosgw. A create through the control lands on a node and runs there;
delete, pause and a resume on the other node (files from S3); a node killed between running
a job and reporting it converges on restart without a second instance; a node stopped past
its lease finds itself fenced when it runs again: what moved away is stopped and its stale
report is refused.

Key records live in the catalog (every member has the same --default-kek-file), so a
snapshot one node encrypted can be restored by the other.
Sandbox traffic (exec, files) goes through the control, which forwards it to the sandbox's
node (the node's own listener answers control replicas only)."""
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
import uuid

import pytest

import pgserver
from cove import START_TIMEOUT_S, Client, CoveError, Coved, free_port, poll, sh
from s3rgw import S3Rgw

PG_WHY = pgserver.available()
S3_WHY = S3Rgw.available()
pytestmark = [pytest.mark.root,
              pytest.mark.skipif(bool(PG_WHY or S3_WHY), reason=PG_WHY or S3_WHY or "")]

TTL_S, RENEW_S = 4, 1
HOOKS_ENV = {"COVE_TEST_HOOKS": "1"}


@pytest.fixture(scope="module")
def pg():
    with pgserver.PgServer() as server:
        yield server


@pytest.fixture(scope="module")
def rgw():
    with S3Rgw() as r:
        yield r


class Member(Coved):
    """A coved of the cluster: the control writes admin.key; a node writes none, so its
    client uses the control's key (the catalog is shared)."""

    def __init__(self, build_dir, key_from=None, **kw):
        self.key_from = key_from
        super().__init__(build_dir, **kw)

    def start(self, timeout=START_TIMEOUT_S):  # a first start may build templates
        if self.key_from is None:
            return super().start(timeout)
        self.port = self.fixed_port or free_port()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=log, env=self.env,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        probe = Client(self.port)
        deadline = time.time() + timeout
        while True:
            if self.proc.poll() is not None:
                raise CoveError(f"coved exited with {self.proc.returncode}; log tail:\n"
                                f"{self.log_tail()}")
            try:
                if probe.request("GET", "/healthz", auth=False, timeout=2).status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise CoveError(f"node did not answer within {timeout} s:\n{self.log_tail()}")
            time.sleep(0.05)
        self.client = Client(self.port, self.key_from.client.key)
        return self.client

    fixed_port = None

    def argv(self):
        a = [self.bin, "--data-dir", self.data, "--listen", f"127.0.0.1:{self.port}"]
        if self.templates:
            a += ["--templates-dir", self.templates]
        return a + self.extra


class Cluster:
    def __init__(self, build_dir, templates_dir, pg, rgw, tmp):
        self.build_dir, self.templates, self.pg, self.rgw, self.tmp = \
            build_dir, templates_dir, pg, rgw, tmp
        self.db = pg.create_db(f"cl_{uuid.uuid4().hex[:8]}")
        self.dbname = self.db.rsplit("/", 1)[1]
        self.bucket = f"cove-cl-{uuid.uuid4().hex[:8]}"
        self.key = os.path.join(tmp, "cluster.key")
        with open(os.open(self.key, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(os.urandom(32))
        self.kek = os.path.join(tmp, "default.kek")  # the same default KEK on every member
        with open(os.open(self.kek, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(os.urandom(32))
        self.hooks = os.path.join(tmp, "hooks")
        open(self.hooks, "w").close()
        self.members = []
        self.log_dir = os.environ.get("COVE_TEST_OUT") or os.path.join(build_dir, "test-out")
        self.failed = False
        self.control = None
        self.nodes = {}

    def store_args(self):
        return ["--db", self.db, "--store", f"s3://{self.bucket}/c", "--s3-endpoint",
                self.rgw.endpoint, "--default-kek-file", self.kek]

    def env(self):
        return {**self.rgw.env, **HOOKS_ENV}

    def start_control(self):
        m = Member(self.build_dir, log_dir=self.log_dir, extra_args=["--role", "control", "--cluster-key-file",
                                               self.key, *self.store_args()],
                   env=self.env(), templates_dir=None)
        self.members.append(m)
        self.control = m
        return m

    def token(self, name):
        path = os.path.join(self.tmp, f"{name}.token")
        if not os.path.exists(path):
            out = subprocess.run([os.path.join(self.build_dir, "coved"), "node-token",
                                  "--cluster-key-file", self.key, "--node-name", name],
                                 capture_output=True, text=True, check=True).stdout
            with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                f.write(out)
        return path

    def start_node(self, name, data=None, port=None, extra=()):
        own = data is None  # a restart reuses the data dir its first process owns
        data = data or tempfile.mkdtemp(prefix=f"cove-{name}-")
        octet = 64 + (os.getpid() * 7 + len(self.members) * 13) % 180
        m = Member(self.build_dir, key_from=self.control, data_dir=data, start=False,
                   log_dir=self.log_dir,
                   templates_dir=self.templates, env=self.env(),
                   extra_args=["--role", "node", "--node-name", name, "--node-token-file",
                               self.token(name), "--lease-ttl", str(TTL_S), "--lease-renew",
                               str(RENEW_S), "--pool", "0", "--egress-pool",
                               f"10.{octet}.0.0/16", "--test-hooks", self.hooks,
                               *self.store_args(), *extra])
        m.fixed_port = port
        m.own_data = own
        m.start()
        self.members.append(m)
        self.nodes[name] = m
        return m

    def set_hooks(self, text):
        """the test hooks file, replaced whole (the nodes re-read it when it changes)"""
        tmp = self.hooks + ".new"
        with open(tmp, "w") as f:
            f.write(text)
        os.rename(tmp, self.hooks)

    def sql(self, q):
        return self.pg.psql(q, db=self.dbname).strip()

    def node_row(self, name):
        return self.sql(f"SELECT state, epoch, lease_expires_at > "
                        f"(extract(epoch from clock_timestamp()) * 1000)::bigint"
                        f" FROM nodes WHERE name = '{name}'")

    def stop(self):
        for m in reversed(self.members):
            try:
                if m.proc and m.proc.poll() is None:
                    os.kill(m.proc.pid, signal.SIGCONT)
            except OSError:
                pass
            m.stop(keep_log_as=f"cluster-{os.path.basename(m.data)}" if self.failed else None)


@pytest.fixture
def cluster(request, build_dir, templates_dir, pg, rgw, tmp_path):
    c = Cluster(build_dir, templates_dir, pg, rgw, str(tmp_path))
    c.start_control()
    yield c
    c.failed = getattr(request.node, "cove_failed", False)
    c.stop()


def live_nodes(c):
    return c.sql("SELECT string_agg(name, ',' ORDER BY name) FROM nodes WHERE state = 'ready'"
                 " AND lease_expires_at > (extract(epoch from clock_timestamp()) * 1000)::bigint")


def sandbox_procs(sid):
    """{pid: ppid} of every process on the host in the sandbox's cgroup"""
    out = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cgroup") as f:
                if sid not in f.read():
                    continue
            with open(f"/proc/{p}/stat") as f:
                out[int(p)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return out


def descends(pid, ancestor):
    for _ in range(64):
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def init_pid(member, sid):
    """a process of the sandbox that member's coved started (0 when none runs under it)"""
    for pid in sorted(sandbox_procs(sid)):
        if member.proc and descends(pid, member.proc.pid):
            return pid
    return 0


def exec_out(member, sid, cmd):
    """stdout of cmd run in the sandbox, through the control (which forwards it to the node
    the sandbox is placed on: member's init_pid checks say which one that is)"""
    return sh(member.key_from.client, sid, cmd)


def test_role_flags_checked(build_dir, tmp_path):
    """Each role refuses the flags of the other, and a node whose --control does not answer
    says so."""
    coved = os.path.join(build_dir, "coved")
    key = tmp_path / "k"
    key.write_bytes(os.urandom(32))
    os.chmod(key, 0o600)

    def run(*args):
        r = subprocess.run([coved, "--data-dir", str(tmp_path / "d"), *args],
                           capture_output=True, text=True, timeout=60)
        return r.returncode, r.stderr

    rc, err = run("--role", "control", "--cluster-key-file", str(key))
    assert rc != 0 and "--role control needs --db postgres://" in err, err
    rc, err = run("--role", "control", "--db", "postgres://x@127.0.0.1:1/x", "--store", "s3://b",
                  "--s3-endpoint", "http://127.0.0.1:1", "--cluster-key-file", str(key),
                  "--node-name", "n1")
    assert rc != 0 and "are flags of --role node" in err, err
    tok = tmp_path / "t"
    tok.write_text(subprocess.run([coved, "node-token", "--cluster-key-file", str(key),
                                   "--node-name", "n1"], capture_output=True, text=True,
                                  check=True).stdout)
    os.chmod(tok, 0o600)
    rc, err = run("--role", "node", "--node-name", "n1", "--node-token-file", str(tok),
                  "--store", "s3://b", "--s3-endpoint", "http://127.0.0.1:1", "--control",
                  "http://127.0.0.1:1", "--listen", "127.0.0.1:1")
    assert rc != 0 and "need --default-kek-file" in err, err
    kek = tmp_path / "kek"
    kek.write_bytes(os.urandom(32))
    os.chmod(kek, 0o600)
    rc, err = run("--role", "node", "--node-name", "n1", "--node-token-file", str(tok),
                  "--store", "s3://b", "--s3-endpoint", "http://127.0.0.1:1", "--control",
                  "http://127.0.0.1:1", "--listen", "127.0.0.1:1", "--default-kek-file", str(kek))
    assert rc != 0 and "catalog via http://127.0.0.1:1" in err and "did not answer" in err, err
    rc, err = run("--role", "node", "--node-name", "n1", "--cluster-key-file", str(key),
                  "--node-token-file", str(tok), "--store", "s3://b", "--s3-endpoint",
                  "http://127.0.0.1:1", "--db", "postgres://x@127.0.0.1:1/x", "--listen",
                  "127.0.0.1:1")
    assert rc != 0 and "does not hold the cluster key" in err, err
    rc, err = run("--node-name", "n1")
    assert rc != 0 and "need --role control or --role node" in err, err


def test_create_delete_through_control(cluster):
    """A create through the control is placed on a live node, started by that node (a start
    job), and answered running with its node; the instance runs on that node (its init under
    that node's data dir) and nowhere else. The control runs no instance and serves no
    sandbox traffic itself. Delete stops it on its node."""
    c = cluster
    a = c.start_node("na")
    c.start_node("nb")
    poll(lambda: live_nodes(c) == "na,nb", timeout=60, what="both nodes hold a lease")
    assert not os.path.exists(os.path.join(a.data, "admin.key")), "a node wrote an admin key"
    assert c.control.client.get("/healthz")["snapshots"] == "none"
    feats = json.loads(c.sql("SELECT features FROM nodes WHERE name = 'na'"))
    assert "ns" in feats["runtimes"] and "busybox" in feats["templates"], feats
    assert feats["kernel"] == os.uname().release
    cc = c.control.client
    sb = cc.create(template="busybox", snapshot_interval_s=0)
    sid = sb["id"]
    assert sb["state"] == "running", sb
    owner = c.nodes[sb["node"]]
    other = c.nodes["nb" if sb["node"] == "na" else "na"]
    got = cc.get(f"/v1/sandboxes/{sid}")
    assert got["node"] == sb["node"] and got["state"] == "running"
    assert init_pid(owner, sid) > 0, "no process of the sandbox on its node"
    assert init_pid(other, sid) == 0
    assert exec_out(owner, sid, "echo hi") == "hi\n"
    # the node's own listener answers control replicas only, never an API key
    r = owner.client.request("POST", f"/v1/sandboxes/{sid}/exec", {"cmd": ["true"]})
    assert r.status == 401, r.status
    assert c.sql(f"SELECT node || ':' || observed_state FROM placements"
                 f" WHERE sandbox_id = '{sid}'") == f"{sb['node']}:running"
    cc.remove(sid)
    r = cc.request("GET", f"/v1/sandboxes/{sid}")
    assert r.status == 404
    poll(lambda: init_pid(owner, sid) == 0, timeout=60, what="the instance gone")
    assert a.alive()
    # its node's timer ends a sandbox whose timeout passed (on_timeout kill)
    sb = cc.create(template="busybox", snapshot_interval_s=0, timeout_s=2)
    owner = c.nodes[sb["node"]]
    poll(lambda: cc.get(f"/v1/sandboxes/{sb['id']}")["state"] == "stopped", timeout=60,
         what="the timeout ran on the node")
    poll(lambda: init_pid(owner, sb["id"]) == 0, timeout=60, what="its instance gone")
    cc.remove(sb["id"])


def test_pause_on_one_node_resume_on_the_other(cluster):
    """Pause on node A writes a snapshot to S3 and frees A; with A cordoned, resume places it
    on node B, which restores the files from S3; B runs it and A does not."""
    c = cluster
    c.start_node("na")
    poll(lambda: live_nodes(c) == "na", timeout=60, what="node na holds a lease")
    cc = c.control.client
    sid = cc.create(template="busybox", snapshot_interval_s=0)["id"]
    a = c.nodes["na"]
    exec_out(a, sid, "echo moved > /home/state; head -c 300000 /dev/urandom > /home/blob;"
                     " sha256sum /home/blob > /home/sum")
    want = exec_out(a, sid, "cat /home/sum")
    # a snapshot through the control is taken by the node and listed once committed
    snap = cc.post(f"/v1/sandboxes/{sid}/snapshots", {"label": "before"})
    assert snap["label"] == "before" and snap["sandbox_id"] == sid, snap
    listed = cc.get(f"/v1/sandboxes/{sid}/snapshots")["snapshots"]
    assert snap["id"] in [x["id"] for x in listed]
    exec_out(a, sid, "echo later > /home/state")
    p = cc.post(f"/v1/sandboxes/{sid}/pause")
    assert p["sandbox"]["state"] == "paused" and p["snapshot"]["id"]
    assert init_pid(a, sid) == 0
    b = c.start_node("nb")
    c.sql("UPDATE nodes SET state = 'cordoned' WHERE name = 'na'")
    poll(lambda: live_nodes(c) == "nb", timeout=60, what="only nb ready")
    r = cc.post(f"/v1/sandboxes/{sid}/resume")
    assert r["state"] == "running" and r["node"] == "nb", r
    assert cc.get(f"/v1/sandboxes/{sid}")["node"] == "nb"
    assert init_pid(b, sid) > 0 and init_pid(a, sid) == 0
    assert exec_out(b, sid, "cat /home/state") == "later\n"
    assert exec_out(b, sid, "cat /home/sum") == want
    assert exec_out(b, sid, "sha256sum /home/blob") == want
    # rewind and fork through the control run on the sandbox's node (nb now)
    r = cc.post(f"/v1/sandboxes/{sid}/rewind", {"snapshot_id": snap["id"]})
    assert r["sandbox"]["state"] == "running", r
    assert exec_out(b, sid, "cat /home/state") == "moved\n"
    f = cc.ok("POST", f"/v1/sandboxes/{sid}/fork", {"snapshot_id": snap["id"], "count": 1},
              expect=(201,))
    fid = f["sandboxes"][0]["id"]
    assert f["sandboxes"][0]["node"] == "nb"
    assert c.sql(f"SELECT node || ':' || generation FROM placements WHERE sandbox_id = '{fid}'") \
        == "nb:1"
    assert exec_out(b, fid, "cat /home/state") == "moved\n"
    assert init_pid(a, fid) == 0
    cc.remove(fid)
    cc.remove(sid)


def test_node_killed_between_run_and_report_converges(cluster):
    """A node killed -9 after it started a sandbox's instance but before it reported the start
    job finds the job claimed by its old epoch when it restarts (after its old lease expired),
    takes it back and converges: one instance, the job done, the sandbox running."""
    c = cluster
    a = c.start_node("na")
    poll(lambda: live_nodes(c) == "na", timeout=60, what="node na holds a lease")
    epoch1 = int(c.node_row("na").split("|")[1])
    c.set_hooks("job_hold_ms 600000\n")
    res = {}

    def create():
        try:
            res["sb"] = c.control.client.create(template="busybox", snapshot_interval_s=0)
        except (CoveError, OSError) as e:  # the control may stop first (teardown)
            res["err"] = e
    t = threading.Thread(target=create)
    t.start()
    poll(lambda: "holding job" in a.log_tail(4000), timeout=120, what="the start job held")
    sid = c.sql("SELECT sandbox_id FROM jobs WHERE kind = 'start' AND state = 'claimed'")
    assert sid.startswith("sbx_")
    assert init_pid(a, sid) > 0  # started, not reported
    port, data = a.port, a.data
    a.kill9()
    c.set_hooks("")
    # the instance dies with its node process (its channel closed)
    poll(lambda: not sandbox_procs(sid), timeout=60, what="no process of the old instance")
    a2 = c.start_node("na", data=data, port=port)
    assert "the lease is still held" in a2.log_tail(20000) or \
        int(c.node_row("na").split("|")[1]) > epoch1
    t.join(timeout=300)
    assert "sb" in res, res
    assert res["sb"]["state"] == "running" and res["sb"]["id"] == sid
    assert int(c.node_row("na").split("|")[1]) == epoch1 + 1
    assert c.sql(f"SELECT state || ':' || claimed_epoch FROM jobs WHERE sandbox_id = '{sid}'"
                 f" AND kind = 'start'") == f"done:{epoch1 + 1}"
    procs = sandbox_procs(sid)
    assert procs, "the sandbox runs nowhere"
    assert all(descends(p, a2.proc.pid) for p in procs), "a process of it outside the node"
    assert exec_out(a2, sid, "echo ok") == "ok\n"
    c.control.client.remove(sid)


def test_stopped_node_finds_itself_fenced(cluster):
    """A node stopped (SIGSTOP) past its lease TTL, whose sandbox was placed elsewhere
    meanwhile, fences itself the moment it runs again: the instance it can no longer prove
    it owns is stopped, and it writes nothing more about it. Its report of a job it ran
    before the stop is refused as stale, and it undoes that job (stops the instance it
    started)."""
    c = cluster
    a = c.start_node("na")
    c.start_node("nb")
    poll(lambda: live_nodes(c) == "na,nb", timeout=60, what="both nodes hold a lease")
    c.sql("UPDATE nodes SET state = 'cordoned' WHERE name = 'nb'")
    cc = c.control.client
    sid = cc.create(template="busybox", snapshot_interval_s=0)["id"]
    assert cc.get(f"/v1/sandboxes/{sid}")["node"] == "na"
    assert init_pid(a, sid) > 0
    # a second sandbox whose start the node runs but has not reported when it is stopped
    c.set_hooks("job_hold_ms 600000\n")
    res = {}

    def create():
        try:
            res["sb"] = cc.create(template="busybox", snapshot_interval_s=0)
        except (CoveError, OSError) as e:  # the control may stop first (teardown)
            res["err"] = e
    t = threading.Thread(target=create)
    t.start()
    poll(lambda: "holding job" in a.log_tail(4000), timeout=120, what="the start job held")
    sid2 = c.sql("SELECT sandbox_id FROM jobs WHERE kind = 'start' AND state = 'claimed'")
    assert init_pid(a, sid2) > 0
    os.kill(a.proc.pid, signal.SIGSTOP)
    try:
        poll(lambda: c.node_row("na").endswith("|f"), timeout=60, what="na's lease expired")
        # what a node-loss recovery would do: place both elsewhere (a newer generation)
        c.sql("UPDATE nodes SET state = 'ready' WHERE name = 'nb'")
        c.sql(f"UPDATE placements SET node = 'nb', generation = generation + 1"
              f" WHERE sandbox_id IN ('{sid}', '{sid2}')")
        c.set_hooks("")
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    poll(lambda: "fenced itself" in a.log_tail(20000), timeout=60, what="the fence")
    poll(lambda: init_pid(a, sid) == 0, timeout=60, what="the moved sandbox stopped on na")
    # the held job's report was refused, and the node stopped what it had started
    poll(lambda: "the report was refused" in a.log_tail(40000), timeout=600,
         what="the stale report refused")
    poll(lambda: init_pid(a, sid2) == 0, timeout=60, what="the unreported start undone")
    # never reported done by na (the newer placement failed it as superseded, or it waits)
    assert c.sql(f"SELECT state FROM jobs WHERE sandbox_id = '{sid2}' AND kind = 'start'") \
        in ("claimed", "failed")
    assert c.sql(f"SELECT count(*) FROM jobs WHERE sandbox_id = '{sid2}' AND state = 'done'"
                 f" AND claimed_by = 'na'") == "0"
    # nothing about the moved sandboxes was written by na after the fence
    assert c.sql(f"SELECT node FROM placements WHERE sandbox_id = '{sid}'") == "nb"
    assert int(c.node_row("na").split("|")[1]) >= 2  # it holds a new epoch
    t.join(timeout=1)
