"""A node's catalog through a control replica (store/catalog_remote.c against the
control's POST /v1/cluster/catalog/{op}), on a real PostgreSQL and radosgw with a real
`coved --role control`:
- driven as node n1 by tests/unit/test_catalog_remote.c: every op on n1's own rows works;
  every access to node n2's sandbox, lease, jobs or snapshots, and to API keys, is refused
  and changes nothing;
- raw requests whose Cove-Node signature is missing, forged, expired, replayed, made for
  another body or another node are refused, a good one gets an answer signed for it;
- a `coved --role node --control URL` without --db runs sandboxes the control places on it
  (create, pause with a snapshot, resume, delete) with no refusal in the control's log;
- role all serves no node; a node given both --control and --db refuses to start."""
import hashlib
import hmac
import http.client
import json
import os
import subprocess
import tempfile
import time
import uuid

import pytest

import pgserver
from cove import Client, CoveError, Coved, free_port, poll
from s3rgw import S3Rgw

PG_WHY = pgserver.available()
S3_WHY = S3Rgw.available()
pytestmark = [pytest.mark.root,
              pytest.mark.skipif(bool(PG_WHY or S3_WHY), reason=PG_WHY or S3_WHY or "")]


@pytest.fixture(scope="module")
def pg():
    with pgserver.PgServer() as server:
        yield server


@pytest.fixture(scope="module")
def rgw():
    with S3Rgw() as r:
        yield r


@pytest.fixture(scope="module")
def cluster_key(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ckey") / "cluster.key")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32))
    os.close(fd)
    return path


@pytest.fixture(scope="module")
def started(build_dir, log_dir):
    """coveds started by this module's tests, stopped at its end"""
    procs = []
    yield procs
    for d in reversed(procs):
        d.stop()


def _kek():
    """the default KEK every control and node of this module's cluster is given"""
    fd, path = tempfile.mkstemp(prefix="cove-rc-kek-")
    os.write(fd, os.urandom(32))
    os.close(fd)
    os.chmod(path, 0o600)
    return path


KEK = _kek()


def store_args(url, rgw):
    return ["--db", url, "--store", f"s3://cove-rc-{uuid.uuid4().hex[:8]}/c", "--s3-endpoint",
            rgw.endpoint, "--default-kek-file", KEK]


@pytest.fixture(scope="module")
def control(build_dir, log_dir, started, pg, rgw, cluster_key):
    url = pg.create_db("remote_cat")
    d = Coved(build_dir, templates_dir=None, log_dir=log_dir, env=rgw.env,
              extra_args=["--role", "control", "--cluster-key-file", cluster_key,
                          *store_args(url, rgw)])
    started.append(d)
    return d, url


class Node(Coved):
    """coved --role node: it writes no admin key; ready once /healthz answers."""

    def start(self, timeout=120):
        self.port = free_port()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=log, env=self.env,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        probe = Client(self.port)
        deadline = time.time() + timeout
        while True:
            if self.proc.poll() is not None:
                raise CoveError(f"node exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if probe.request("GET", "/healthz", auth=False, timeout=2).status == 200:
                    return probe
            except OSError:
                pass
            if time.time() > deadline:
                raise CoveError(f"node did not answer within {timeout} s:\n{self.log_tail()}")
            time.sleep(0.05)


def token_of(key_file, name):
    with open(key_file, "rb") as f:
        key = f.read()
    return hmac.new(key, b"cove-node-token\0" + name.encode(), hashlib.sha256).hexdigest()


def sign(token, name, method, path, body, ts=None, nonce=None, tenant=""):
    ts = int(time.time() * 1000) if ts is None else ts
    nonce = nonce or os.urandom(8).hex()
    msg = "\0".join(["cove-node-req", method, path, str(ts), nonce, tenant,
                     hashlib.sha256(body).hexdigest()]).encode()
    sig = hmac.new(token.encode(), msg, hashlib.sha256).hexdigest()
    return f"Cove-Node name={name},ts={ts},nonce={nonce},sig={sig}", sig


def post(port, path, body, auth=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    h = {"Content-Type": "application/json", **(headers or {})}
    if auth:
        h["Authorization"] = auth
    c.request("POST", path, body=body, headers=h)
    r = c.getresponse()
    out = (r.status, r.getheader("Cove-Node-Answer"), r.read())
    c.close()
    return out


def test_node_ops_through_the_control(build_dir, control, cluster_key):
    """Node n1, through the control, does every op on its own rows (lease, job claim,
    observe, finish, sandbox get/update/list, snapshots, egress, lease documents, secrets
    of its tenant read-only, audit append, a wake-up long poll woken by a placement); every
    access to n2's rows or to API keys and every control-plane op is refused (403) and
    leaves n2's rows as they were. Garbage and unsigned answers are errors, never a crash."""
    d, url = control
    env = dict(os.environ, COVE_TEST_REMOTE_URL=f"http://127.0.0.1:{d.port}",
               COVE_TEST_REMOTE_KEY_FILE=cluster_key, COVE_TEST_REMOTE_DB=url)
    r = subprocess.run([os.path.join(build_dir, "tests", "unit", "test_catalog_remote")],
                       env=env, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "skipped" not in out, out[-2000:]
    assert "[  PASSED  ] 5 test(s)." in out, out[-2000:]
    for line in out.splitlines():
        if "remote catalog cost" in line:
            print(line, f"(load {os.getloadavg()[0]:.1f})")
    log = open(d.log_path, errors="replace").read()
    assert token_of(cluster_key, "n1") not in log
    assert "cluster.deny" in log  # the refusals were logged, by node and op


def test_signatures_checked(control, cluster_key):
    """Missing, forged (another key), expired, replayed, wrong-body and wrong-name
    Cove-Node requests get 401 and no Cove-Node-Answer; a good one gets 200 with the
    answer HMAC of its own signature; an unknown op and a malformed body get signed
    404 / 400 answers."""
    d, _ = control
    path = "/v1/cluster/catalog/schema_version"
    body = b"{}"
    t1 = token_of(cluster_key, "n1")
    auth, sig = sign(t1, "n1", "POST", path, body)
    st, ans, b = post(d.port, path, body, auth)
    assert st == 200, b
    assert ans == hmac.new(t1.encode(), b"cove-node-ans\0" + sig.encode(),
                           hashlib.sha256).hexdigest()
    assert json.loads(b)["version"] > 0
    # the same request again: a replay
    st, ans, b = post(d.port, path, body, auth)
    assert (st, ans) == (401, None), b
    assert b"replayed" in b
    refused = {
        "missing": None,
        "bearer": "Bearer nope",
        "forged": sign("0" * 64, "n1", "POST", path, body)[0],
        "expired": sign(t1, "n1", "POST", path, body, ts=int(time.time() * 1000) - 120000)[0],
        "future": sign(t1, "n1", "POST", path, body, ts=int(time.time() * 1000) + 120000)[0],
        "other body": sign(t1, "n1", "POST", path, b'{"x":1}')[0],
        "other path": sign(t1, "n1", "POST", "/v1/cluster/catalog/node_list", body)[0],
        "other name": sign(t1, "n2", "POST", path, body)[0],
        "bad name": sign(t1, "N1!", "POST", path, body)[0],
        "garbage": "Cove-Node name=n1,ts=x,nonce=y,sig=z",
    }
    for why, a in refused.items():
        st, ans, b = post(d.port, path, body, a)
        assert (st, ans) == (401, None), (why, b)
    # a tenant header is not part of a catalog call
    a, _ = sign(t1, "n1", "POST", path, body, tenant="default")
    st, _, b = post(d.port, path, body, a, {"X-Cove-Tenant": "default"})
    assert st == 401, b
    # signed answers for an unknown op and a body that is not JSON
    p2 = "/v1/cluster/catalog/drop_everything"
    a, sig = sign(t1, "n1", "POST", p2, body)
    st, ans, b = post(d.port, p2, body, a)
    assert st == 404 and ans, b
    p3 = "/v1/cluster/catalog/sandbox_get"
    for junk in [b"not json", b"[]", b'{"id":5}', b'{"id":"' + b"a" * 5000 + b'"}',
                 b'{"id":"a\\u0000b"}']:
        a, _ = sign(t1, "n1", "POST", p3, junk)
        st, ans, b = post(d.port, p3, junk, a)
        assert st == 400 and ans, (junk[:40], st, b)
    st, _, _ = post(d.port, path, body, sign(t1, "n1", "POST", path, body)[0])
    assert st == 200  # coved is still serving


def test_role_all_serves_no_node(coved_factory, cluster_key):
    """A role-all coved answers 404 on the nodes' catalog endpoint, signed or not: only a
    control replica serves it."""
    d = coved_factory(extra_args=["--pool", "0"])
    path = "/v1/cluster/catalog/schema_version"
    st, ans, b = post(d.port, path, b"{}", sign(token_of(cluster_key, "n1"), "n1", "POST", path,
                                                  b"{}")[0])
    assert (st, ans) == (404, None), b


def test_node_refuses_both_control_and_db(build_dir, tmp_path):
    """A node given --control and --db refuses to start (one source of truth for the
    catalog) and says which flags to choose between."""
    key = tmp_path / "ck"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    tok = tmp_path / "n1.token"
    tok.write_text(subprocess.run([os.path.join(build_dir, "coved"), "node-token",
                                   "--cluster-key-file", str(key), "--node-name", "n1"],
                                  capture_output=True, text=True, check=True).stdout)
    tok.chmod(0o600)
    r = subprocess.run([os.path.join(build_dir, "coved"), "--data-dir", str(tmp_path / "d"),
                        "--role", "node", "--node-name", "n1", "--node-token-file", str(tok),
                        "--store", "s3://b", "--s3-endpoint", "http://127.0.0.1:1",
                        "--db", "postgres://u@127.0.0.1:1/x", "--control", "http://127.0.0.1:1",
                        "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "--control URL" in r.stderr and "not both" in r.stderr, r.stderr


def test_node_without_db_runs_what_the_control_places(build_dir, templates_dir, log_dir, started,
                                                      control, pg, rgw, cluster_key, tmp_path):
    """A node started with --control and no --db (no database URL or password anywhere in
    its arguments or environment) takes its lease, claims the start job of a sandbox
    created through the control, runs it, pauses it (snapshot row, sandbox row, job result
    through the control), resumes it and deletes it; the control's log shows no refused
    call of that node."""
    d, url = control
    tok = tmp_path / "rn1.token"
    tok.write_text(subprocess.run([os.path.join(build_dir, "coved"), "node-token",
                                   "--cluster-key-file", cluster_key, "--node-name", "rn1"],
                                  capture_output=True, text=True, check=True).stdout)
    tok.chmod(0o600)
    octet = 64 + (os.getpid() * 11) % 180
    env = {k: v for k, v in rgw.env.items()}
    node = Node(build_dir, data_dir=tempfile.mkdtemp(prefix="cove-rn1-"), start=False,
                templates_dir=templates_dir, log_dir=log_dir, env=env,
                extra_args=["--role", "node", "--node-name", "rn1", "--node-token-file", str(tok),
                            "--control", f"http://127.0.0.1:{d.port}", "--lease-ttl", "6",
                            "--lease-renew", "1", "--pool", "0", "--egress-pool",
                            f"10.{octet}.0.0/16", "--store", store_args(url, rgw)[3],
                            "--s3-endpoint", rgw.endpoint, "--default-kek-file", KEK])
    node.own_data = True
    started.append(node)
    node.start()
    argv = " ".join(node.argv())
    assert "--db" not in argv and "postgres" not in argv
    assert not any(k.startswith("PG") for k in (node.env or os.environ))
    assert "catalog: remote" in node.log_tail(20000)
    cc = d.client
    poll(lambda: pg.psql("SELECT count(*) FROM nodes WHERE name = 'rn1' AND epoch > 0",
                         db="remote_cat").strip() == "1", timeout=60, what="the node's lease")
    sb = cc.create(template="busybox", snapshot_interval_s=0)
    sid = sb["id"]
    assert sb["state"] == "running" and sb["node"] == "rn1", sb
    p = cc.post(f"/v1/sandboxes/{sid}/pause")
    assert p["sandbox"]["state"] == "paused", p
    snaps = cc.get(f"/v1/sandboxes/{sid}/snapshots")["snapshots"]
    assert snaps, "the pause's snapshot is listed"
    r = cc.post(f"/v1/sandboxes/{sid}/resume")
    assert r["state"] == "running" and r["node"] == "rn1", r
    cc.remove(sid)
    assert cc.request("GET", f"/v1/sandboxes/{sid}").status == 404
    log = open(d.log_path, errors="replace").read()
    denied = [ln for ln in log.splitlines() if "cluster.deny" in ln and "rn1" in ln]
    assert not denied, "\n".join(denied[:8])
