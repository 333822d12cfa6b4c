"""Templates users bring: OCI images pulled from a real registry (Debian's docker-registry on
loopback) or imported from oci-archive / docker-archive files, unpacked by coved itself.
Images are made by the tests (tests/lib/oci.py); hostile layers too."""
import json
import os
import shutil
import socket
import stat
import subprocess
import tarfile
import tempfile
import threading

import pytest

from cove import Coved, poll
import oci

BUSYBOX_FILES = None


@pytest.fixture(scope="module")
def tdir():
    d = tempfile.mkdtemp(prefix="cove-tpl-test-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def node(build_dir, tdir, log_dir):
    if os.geteuid() != 0:
        pytest.skip("coved's namespace runtime needs root")
    d = Coved(build_dir, templates_dir=tdir, log_dir=log_dir)
    yield d
    d.stop()


@pytest.fixture(scope="module")
def registry():
    r = oci.Registry()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def base_tar(node, tdir):
    """The busybox template's rootfs as one layer (built by coved at start)."""
    return oci.rootfs_layer(os.path.join(tdir, "busybox", "rootfs"))


def app_layer():
    def add(t):
        oci.file_entry(t, "app", kind=tarfile.DIRTYPE, mode=0o755)
        oci.file_entry(t, "app/hello.txt", b"hello from the image\n")
        oci.file_entry(t, "app/suid", b"#!/bin/sh\necho x\n", mode=0o4755)
    return oci.tar_bytes(add)


def build(client, name, timeout=300, **body):
    out = client.post("/v1/templates", {"name": name, **body}, expect=(202,))
    assert out == {"name": name, "state": "building"}
    return poll(lambda: (t := client.get(f"/v1/templates/{name}"))["state"] != "building" and t,
                timeout=timeout, what=f"template {name} built")


def push_image(registry, base_tar, repo, layers=None, **cfg):
    lay = tempfile.mkdtemp(prefix="cove-oci-")
    try:
        oci.make_layout(lay, layers if layers is not None else [base_tar, app_layer()], **cfg)
        ref = f"{registry.host}/{repo}:latest"
        oci.push(lay, ref)
        return ref
    finally:
        shutil.rmtree(lay, ignore_errors=True)


def debris(tdir):
    """What a failed or killed build must not leave: build dirs, unfinished layers."""
    out = []
    for root, dirs, _ in os.walk(os.path.join(tdir, "tenants")):
        out += [os.path.join(root, x) for x in dirs if x.startswith(".build-")]
    ld = os.path.join(tdir, "layers")
    if os.path.isdir(ld):
        out += [x for x in os.listdir(ld) if x.startswith(".tmp-")]
    return out


def test_image_from_registry_runs_with_its_config(node, registry, base_tar, tdir):
    """An image pushed to a registry becomes a template; a sandbox of it has the image's
    files, and exec runs in its WORKDIR, as its USER, with its ENV."""
    c = node.client
    ref = push_image(registry, base_tar, "team/app", env=["FOO=bar", "PATH=/bin:/usr/bin"],
                     user="1000", workdir="/app", cmd=["sh"])
    t = build(c, "app", **{"from": {"image": ref}, "insecure": True})
    assert t["state"] == "ready", t
    assert t["digest"].startswith("sha256:") and t["size_bytes"] > 100000
    assert t["config"]["workdir"] == "/app" and t["config"]["user"] == "1000"
    assert t["config"]["env"]["FOO"] == "bar" and t["config"]["cmd"] == ["sh"]
    assert t["source"] == {"image": ref}
    names = [x["name"] for x in c.get("/v1/templates")["templates"]]
    assert "app" in names and "busybox" in names
    ev = list(c.stream("/v1/templates/app/build/events", max_events=10000))
    kinds = [e.get("type") for e in ev]
    assert kinds[0] == "start" and kinds[-1] == "end" and ev[-1]["state"] == "ready"
    assert sum(1 for e in ev if e.get("type") == "layer" and e.get("state") == "unpacked") == 2
    sb = c.create(template="app")
    try:
        r = c.exec(sb["id"], ["sh", "-c", "pwd; id -u; echo $FOO; cat hello.txt"])
        assert r["exit_code"] == 0, r
        assert r["stdout"].split("\n")[:4] == ["/app", "1000", "bar",
                                                         "hello from the image"]
        # the setuid bit is kept for the sandbox
        r = c.exec(sb["id"], ["stat", "-c", "%a", "/app/suid"])
        assert r["stdout"].strip() == "4755"
        # in use: not deleted
        c.expect_error("DELETE", "/v1/templates/app", 409, "conflict")
    finally:
        c.remove(sb["id"])
    # never effective on the host: a host user cannot even reach the file
    suid = os.path.join(tdir, "tenants", "default", "app", "rootfs", "app", "suid")
    assert os.stat(suid).st_mode & 0o7777 == 0o4755
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", suid],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "Permission denied" in r.stderr, r
    c.ok("DELETE", "/v1/templates/app")
    c.expect_error("GET", "/v1/templates/app", 404, "not_found")
    assert not os.path.exists(os.path.join(tdir, "tenants", "default", "app"))
    assert [x for x in os.listdir(os.path.join(tdir, "layers")) if x.startswith("sha256-")] == []


def test_tenant_template_is_invisible_to_other_tenants(node, registry, base_tar):
    c = node.client
    ref = push_image(registry, base_tar, "team/private", layers=[base_tar])
    assert build(c, "mine", **{"from": {"image": ref}, "insecure": True})["state"] == "ready"
    c.post("/v1/tenants", {"id": "other-t"}, expect=(201,))
    key = c.post("/v1/tenants/other-t/api-keys", {}, expect=(201,))["key"]
    o = c.with_key(key)
    o.expect_error("GET", "/v1/templates/mine", 404, "not_found")
    assert "mine" not in [x["name"] for x in o.get("/v1/templates")["templates"]]
    assert "busybox" in [x["name"] for x in o.get("/v1/templates")["templates"]]
    o.expect_error("POST", "/v1/sandboxes", 400, "bad_request", {"template": "mine"})
    c.ok("DELETE", "/v1/templates/mine")


def test_layers_shared_by_two_templates_are_stored_once(node, registry, base_tar, tdir):
    c = node.client
    r1 = push_image(registry, base_tar, "share/one")
    def add(t):
        oci.file_entry(t, "two.txt", b"two\n")
    r2 = push_image(registry, base_tar, "share/two", layers=[base_tar, oci.tar_bytes(add)])
    for n, r in (("one", r1), ("two", r2)):
        assert build(c, n, **{"from": {"image": r}, "insecure": True})["state"] == "ready"
    ev = list(c.stream("/v1/templates/two/build/events", max_events=10000))
    assert any(e.get("state") == "cached" for e in ev if e.get("type") == "layer")
    a = os.stat(os.path.join(tdir, "tenants", "default", "one", "rootfs", "bin", "busybox"))
    b = os.stat(os.path.join(tdir, "tenants", "default", "two", "rootfs", "bin", "busybox"))
    assert a.st_ino == b.st_ino  # one file on disk
    layers = [x for x in os.listdir(os.path.join(tdir, "layers")) if x.startswith("sha256-")]
    assert len(layers) == 3
    c.ok("DELETE", "/v1/templates/one")
    # the shared base layer stays for "two"
    assert len([x for x in os.listdir(os.path.join(tdir, "layers"))
                if x.startswith("sha256-")]) == 2
    c.ok("DELETE", "/v1/templates/two")


def _hostile(kind):
    def add(t):
        if kind == "dotdot":
            oci.file_entry(t, "../../escape.txt", b"x")
        elif kind == "absolute":
            oci.file_entry(t, "/etc/escape.txt", b"x")
        elif kind == "symlink_parent":
            oci.file_entry(t, "evil", kind=tarfile.SYMTYPE, link="/tmp")
            oci.file_entry(t, "evil/escape.txt", b"x")
        elif kind == "hardlink_out":
            oci.file_entry(t, "passwd", kind=tarfile.LNKTYPE, link="../../../../etc/passwd")
        elif kind == "device":
            oci.file_entry(t, "mem", kind=tarfile.CHRTYPE, mode=0o666)
        elif kind == "whiteout_out":
            oci.file_entry(t, "../.wh.etc", b"")
        elif kind == "bomb":
            oci.file_entry(t, "zeros", b"\0" * (3 << 20))
    return oci.tar_bytes(add)


HOSTILE = {
    "dotdot": '"..\\" in the path refused',
    "absolute": "absolute path refused",
    "symlink_parent": "a parent is not a directory",
    "hardlink_out": "hardlink target",
    "device": "device node",
    "whiteout_out": '"..\\" in the path refused',
    "bomb": "size limit",
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_layer_fails_naming_the_layer_and_leaves_nothing(node, registry, base_tar,
                                                                 tdir, kind):
    c = node.client
    ref = push_image(registry, base_tar, f"hostile/{kind.replace('_', '-')}",
                     layers=[base_tar, _hostile(kind)])
    name = f"bad-{kind.replace('_', '-')}"
    body = {"from": {"image": ref}, "insecure": True}
    if kind == "bomb":
        body["max_size_mb"] = 4  # busybox (~1 MB) fits, 3 MB of zeros on top do not
    t = build(c, name, **body)
    assert t["state"] == "failed", t
    msg = t["error"]["message"]
    assert "layer 2 (sha256:" in msg, msg
    assert HOSTILE[kind].replace('\\"', '"') in msg.replace('\\"', '"'), msg
    if kind == "bomb":
        assert t["error"]["code"] == "limit_exceeded"
    assert not os.path.exists(os.path.join(tdir, "tenants", "default", name))
    assert debris(tdir) == []
    assert not os.path.exists("/tmp/escape.txt")
    c.expect_error("POST", "/v1/sandboxes", 400, "bad_request", {"template": name})
    c.ok("DELETE", f"/v1/templates/{name}")  # forgets the failed build
    c.expect_error("GET", f"/v1/templates/{name}", 404, "not_found")


def test_config_for_another_architecture_is_refused(node, registry, base_tar):
    c = node.client
    ref = push_image(registry, base_tar, "arch/arm", layers=[base_tar], arch="arm64")
    t = build(c, "armimg", **{"from": {"image": ref}, "insecure": True})
    assert t["state"] == "failed" and "linux/arm64" in t["error"]["message"], t
    c.ok("DELETE", "/v1/templates/armimg")


def test_layer_not_matching_the_config_diff_id_is_refused(node, registry, base_tar, tdir):
    c = node.client
    ref = push_image(registry, base_tar, "lie/diffid", layers=[base_tar],
                     diff_ids=["sha256:" + "0" * 64])
    t = build(c, "liar", **{"from": {"image": ref}, "insecure": True})
    assert t["state"] == "failed", t
    assert "layer 1 (sha256:" in t["error"]["message"]
    assert "diff_id" in t["error"]["message"]
    assert debris(tdir) == []
    c.ok("DELETE", "/v1/templates/liar")


class Hang:
    """A TCP server that accepts and never answers."""

    def __init__(self):
        self.s = socket.socket()
        self.s.bind(("127.0.0.1", 0))
        self.s.listen(16)
        self.port = self.s.getsockname()[1]
        self.conns = []
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        while True:
            try:
                self.conns.append(self.s.accept()[0])
            except OSError:
                return

    def close(self):
        self.s.close()
        for x in self.conns:
            x.close()


def test_registry_that_hangs_hits_the_deadline(node, tdir):
    c = node.client
    h = Hang()
    try:
        t = build(c, "hangs", **{"from": {"image": f"127.0.0.1:{h.port}/x/y:1"},
                                 "insecure": True, "timeout_s": 3}, timeout=120)
    finally:
        h.close()
    assert t["state"] == "failed", t
    assert debris(tdir) == []
    c.ok("DELETE", "/v1/templates/hangs")


def test_bad_requests(node):
    c = node.client
    c.expect_error("POST", "/v1/templates", 400, "bad_request",
                   {"name": "x", "from": {"image": "a", "oci_archive": "/b"}})
    c.expect_error("POST", "/v1/templates", 400, "bad_request",
                   {"name": "x", "from": {"image": "r.example/a"}, "bogus": 1})
    c.expect_error("POST", "/v1/templates", 409, "conflict",
                   {"name": "busybox", "from": {"image": "r.example/a"}})
    c.expect_error("POST", "/v1/templates", 404, "not_found",
                   {"name": "x", "from": {"image": "r.example/a"},
                    "registry_auth": {"secret": "NOPE"}})
    # a short name would be resolved by the host's registries.conf: refused
    t = build(c, "short", **{"from": {"image": "busybox:latest"}})
    assert t["state"] == "failed" and "must name its registry" in t["error"]["message"]
    c.ok("DELETE", "/v1/templates/short")
    c.expect_error("DELETE", "/v1/templates/busybox", 409, "conflict")


def test_oci_and_docker_archives_import_without_a_registry(node, base_tar, tdir):
    c = node.client
    work = tempfile.mkdtemp(prefix="cove-archive-")
    try:
        lay = os.path.join(work, "layout")
        oci.make_layout(lay, [base_tar, app_layer()], workdir="/app")
        oa = os.path.join(work, "img.oci.tar")
        with tarfile.open(oa, "w") as t:
            for n in os.listdir(lay):
                t.add(os.path.join(lay, n), arcname=n)
        da = os.path.join(work, "img.docker.tar")
        oci.skopeo("copy", f"oci:{lay}:latest", f"docker-archive:{da}:cove/img:latest")
        for name, frm in (("from-oci", {"oci_archive": oa}), ("from-docker", {"docker_archive": da})):
            t = build(c, name, **{"from": frm})
            assert t["state"] == "ready", t
            assert t["config"]["workdir"] == "/app"
            sb = c.create(template=name)
            try:
                r = c.exec(sb["id"], ["cat", "/app/hello.txt"])
                assert r["stdout"] == "hello from the image\n"
            finally:
                c.remove(sb["id"])
            c.ok("DELETE", f"/v1/templates/{name}")
        # a path on the node is for admins only
        c.post("/v1/tenants", {"id": "arch-t"}, expect=(201,))
        key = c.post("/v1/tenants/arch-t/api-keys", {}, expect=(201,))["key"]
        c.with_key(key).expect_error("POST", "/v1/templates", 403, "unauthorized",
                                     {"name": "x", "from": {"oci_archive": oa}})
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_private_registry_credential_comes_from_a_secret_and_goes_nowhere(
        node, base_tar, tdir, build_dir):
    c = node.client
    password = "s3cret-registry-pass-7781"
    reg = oci.Registry(user="puller", password=password)
    try:
        lay = tempfile.mkdtemp(prefix="cove-oci-")
        oci.make_layout(lay, [base_tar])
        oci.push(lay, f"{reg.host}/priv/img:latest", creds=f"puller:{password}")
        ref = f"localhost:{reg.port}/priv/img:latest"  # a secret binds to names
        shutil.rmtree(lay)
        # no credential: refused by the registry
        t = build(c, "priv0", **{"from": {"image": ref}, "insecure": True})
        assert t["state"] == "failed", t
        c.ok("DELETE", "/v1/templates/priv0")
        # a secret bound to other hosts is not sent to this registry
        c.put("/v1/secrets/REG_ELSEWHERE", {"value": f"puller:{password}",
                                            "hosts": ["api.example.com"], "inject": {"placeholder": True}})
        c.expect_error("POST", "/v1/templates", 400, "bad_request",
                       {"name": "priv1", "from": {"image": ref}, "insecure": True,
                        "registry_auth": {"secret": "REG_ELSEWHERE"}})
        c.put("/v1/secrets/REG", {"value": f"puller:{password}", "hosts": ["localhost"], "inject": {"placeholder": True}})
        t = build(c, "priv", **{"from": {"image": ref}, "insecure": True,
                               "registry_auth": {"secret": "REG"}})
        assert t["state"] == "ready", t
        blob = json.dumps(t) + json.dumps(list(c.stream("/v1/templates/priv/build/events",
                                                   max_events=10000)))
        assert password not in blob
        with open(node.log_path, "rb") as f:
            assert password.encode() not in f.read()
        r = subprocess.run(["grep", "-rlaF", password, os.path.join(tdir, "tenants")],
                           capture_output=True)
        assert r.stdout == b"", r.stdout
        c.ok("DELETE", "/v1/templates/priv")
    finally:
        reg.stop()


def test_kill9_mid_build_leaves_no_template_and_no_debris(build_dir, tdir, log_dir, base_tar):
    h = Hang()
    d = Coved(build_dir, templates_dir=tdir, log_dir=log_dir)
    try:
        c = d.client
        c.post("/v1/templates", {"name": "killed", "from": {"image": f"127.0.0.1:{h.port}/a/b:1"},
                                 "insecure": True}, expect=(202,))
        bd = os.path.join(tdir, "tenants", "default")
        poll(lambda: any(x.startswith(".build-killed-") for x in os.listdir(bd)),
             what="the build started")
        d.kill9()
        d.start()
        c = d.client
        c.expect_error("GET", "/v1/templates/killed", 404, "not_found")
        assert debris(tdir) == []
        assert not os.path.exists(os.path.join(bd, "killed"))
    finally:
        h.close()
        d.stop()


def test_cli_template_build_ls_inspect_rm(node, registry, base_tar, build_dir):
    """`cove template build NAME --image REF` waits for the build and prints the template;
    ls, inspect and rm act on it; a failed build exits 1 with the layer's error."""
    env = dict(os.environ, COVE_URL=f"http://127.0.0.1:{node.port}", COVE_API_KEY=node.client.key)
    cove = os.path.join(build_dir, "cove")

    def run(*a):
        return subprocess.run([cove, *a], capture_output=True, text=True, env=env, timeout=300)

    ref = push_image(registry, base_tar, "cli/app", workdir="/app")
    r = run("template", "build", "cliapp", "--image", ref, "--insecure",
            "--start-cmd", "sleep 1000", "--ready-cmd", "true", "--ready-timeout", "30")
    assert r.returncode == 0, r.stderr
    t = json.loads(r.stdout)
    assert t["name"] == "cliapp" and t["state"] == "ready" and t["config"]["workdir"] == "/app"
    assert (t["start_cmd"], t["ready_cmd"], t["ready_timeout_s"]) == ("sleep 1000", "true", 30)
    r = run("template", "ls")
    assert r.returncode == 0 and "cliapp" in [x["name"] for x in json.loads(r.stdout)["templates"]]
    r = run("template", "inspect", "cliapp")
    assert r.returncode == 0 and json.loads(r.stdout)["digest"] == t["digest"]
    r = run("template", "rm", "cliapp")
    assert r.returncode == 0, r.stderr
    r = run("template", "inspect", "cliapp")
    assert r.returncode == 1 and "not_found" in r.stderr
    bad = push_image(registry, base_tar, "cli/bad", layers=[base_tar, _hostile("device")])
    r = run("template", "build", "clibad", "--image", bad, "--insecure")
    assert r.returncode == 1 and "device node" in r.stderr and "layer 2" in r.stderr, r.stderr
    run("template", "rm", "clibad")
    # -f Dockerfile CONTEXT: the directory goes up as a tar
    work = tempfile.mkdtemp(prefix="cove-cli-df-")
    try:
        with open(os.path.join(work, "Dockerfile"), "w") as f:
            f.write("FROM busybox\nCOPY note.txt /opt/\nRUN cat /opt/note.txt > /opt/seen\n")
        os.makedirs(os.path.join(work, "ctx"))
        with open(os.path.join(work, "ctx", "note.txt"), "w") as f:
            f.write("noted\n")
        r = run("template", "build", "clidf", "-f", os.path.join(work, "Dockerfile"),
                os.path.join(work, "ctx"))
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["state"] == "ready"
        sb = node.client.create(template="clidf")
        try:
            assert node.client.exec(sb["id"], "cat /opt/seen")["stdout"] == "noted\n"
        finally:
            node.client.remove(sb["id"])
        assert run("template", "rm", "clidf").returncode == 0
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # the built-ins build by name (what the create error tells users to run)
    r = run("template", "build", "busybox")
    assert r.returncode == 0 and json.loads(r.stdout)["state"] == "ready", r.stderr


def test_template_from_a_sandbox_and_from_a_snapshot(node, tdir):
    """"Save this as a template": a running sandbox's changes (new files, removed ones)
    become a template over its own; a snapshot's files likewise, without what came after."""
    c = node.client
    sb = c.create(template="busybox")
    sid = sb["id"]
    try:
        r = c.exec(sid, "mkdir -p /opt/tool && echo v1 > /opt/tool/conf && rm /bin/vi && "
                        "chmod 4755 /opt/tool/conf")
        assert r["exit_code"] == 0, r
        snap = c.post(f"/v1/sandboxes/{sid}/snapshots", {"kind": "files"})
        assert c.exec(sid, "echo later > /opt/tool/later")["exit_code"] == 0
        t = build(c, "saved", **{"from": {"sandbox": sid}})
        assert t["state"] == "ready", t
        assert t["source"] == {"sandbox": sid}
        t2 = build(c, "saved-snap", **{"from": {"snapshot": snap["id"]}})
        assert t2["state"] == "ready", t2
        # the template is in use by no sandbox yet: sandboxes of each see their files
        for name, later in (("saved", True), ("saved-snap", False)):
            s2 = c.create(template=name)
            try:
                r = c.exec(s2["id"], "cat /opt/tool/conf; stat -c %a /opt/tool/conf; "
                                     "test -e /bin/vi && echo vi; test -e /opt/tool/later && "
                                     "echo later; test -e /bin/sh && echo sh")
                want = "v1\n4755\n" + ("later\n" if later else "") + "sh\n"
                assert r["stdout"] == want, (name, r)
            finally:
                c.remove(s2["id"])
        # the builtin's files are hard links, not copies
        a = os.stat(os.path.join(tdir, "busybox", "rootfs", "bin", "busybox"))
        b = os.stat(os.path.join(tdir, "tenants", "default", "saved", "rootfs", "bin", "busybox"))
        assert a.st_ino == b.st_ino
        # a template from a sandbox of a saved template keeps both layers
        s3 = c.create(template="saved")
        try:
            assert c.exec(s3["id"], "echo v2 > /opt/tool/conf")["exit_code"] == 0
            t3 = build(c, "saved-2", **{"from": {"sandbox": s3["id"]}})
            assert t3["state"] == "ready" and len(t3["layers"]) == 2, t3
        finally:
            c.remove(s3["id"])
        s4 = c.create(template="saved-2")
        try:
            assert c.exec(s4["id"], "cat /opt/tool/conf")["stdout"] == "v2\n"
        finally:
            c.remove(s4["id"])
        t = build(c, "nosuch", **{"from": {"sandbox": "sbx_doesnotexist"}})
        assert t["state"] == "failed" and "not found" in t["error"]["message"], t
    finally:
        c.remove(sid)
    for n in ("saved-2", "saved", "saved-snap", "nosuch"):
        c.ok("DELETE", f"/v1/templates/{n}")
    assert debris(tdir) == []


def test_image_template_runs_under_the_vm_runtime(build_dir, tdir, log_dir, registry, base_tar):
    """The vm runtime starts a sandbox from an image template too (its template snapshot is
    made from the same rootfs), with the image's files and WORKDIR."""
    qemu = os.environ.get("COVE_QEMU", "/usr/bin/qemu-system-x86_64")
    kdir = os.environ.get("COVE_VM_KERNEL_DIR", "/var/cache/cove/vm")
    if not os.access(qemu, os.X_OK) or not os.access(os.path.join(kdir, "vmlinux"), os.R_OK):
        pytest.skip(f"no QEMU ({qemu}) or guest kernel ({kdir}/vmlinux): the vm runtime is off")
    d = Coved(build_dir, templates_dir=tdir, log_dir=log_dir,
              extra_args=["--pool", "0", "--vm-pool", "0"])
    try:
        c = d.client
        ref = push_image(registry, base_tar, "vm/app", workdir="/app")
        t = build(c, "vmapp", **{"from": {"image": ref}, "insecure": True})
        assert t["state"] == "ready", t
        sb = c.create(template="vmapp", runtime="vm")
        try:
            c.wait_state(sb["id"], ("running",), timeout=600)
            r = c.exec(sb["id"], "pwd; cat hello.txt", timeout=300)
            assert r["stdout"] == "/app\nhello from the image\n", r
        finally:
            c.remove(sb["id"])
        c.ok("DELETE", "/v1/templates/vmapp")
    finally:
        d.stop()


def _context(files):
    def add(t):
        for name, data in files.items():
            oci.file_entry(t, name, data)
    import base64
    return base64.b64encode(oci.tar_bytes(add)).decode()


def test_dockerfile_build_runs_steps_in_sandboxes_and_caches_them(node, tdir):
    """A Dockerfile FROM a cove template: RUN runs in a sandbox of the state so far, COPY
    takes the uploaded context, ENV/WORKDIR/USER/CMD become the config; a rebuild of the
    same steps runs nothing; a changed step runs from there on."""
    c = node.client
    df = ("FROM busybox\n"
          "ARG GREETING=hi\n"
          "ENV APP_MODE=prod\n"
          "WORKDIR /srv/app\n"
          "COPY conf.txt ./\n"
          "RUN echo \"$GREETING $APP_MODE\" > made.txt && \\\n"
          "    cat conf.txt >> made.txt && id -u >> made.txt\n"
          "USER 1000\n"
          "CMD [\"sh\"]\n")
    ctx = _context({"conf.txt": b"from the context\n"})
    t = build(c, "df1", **{"from": {"dockerfile": df, "context_b64": ctx}})
    assert t["state"] == "ready", t.get("error")
    assert t["config"]["workdir"] == "/srv/app" and t["config"]["user"] == "1000"
    assert t["config"]["env"]["APP_MODE"] == "prod" and t["config"]["cmd"] == ["sh"]
    ev = list(c.stream("/v1/templates/df1/build/events", max_events=10000))
    steps = [e for e in ev if e.get("type") == "step"]
    assert [e["state"] for e in steps if e["state"] != "running"] == ["done"] * 3, steps
    sb = c.create(template="df1")
    try:
        r = c.exec(sb["id"], "pwd; cat made.txt; id -u")
        assert r["stdout"] == "/srv/app\nhi prod\nfrom the context\n0\n1000\n", r
    finally:
        c.remove(sb["id"])
    # the step caches are not listed as templates
    assert not [x for x in c.get("/v1/templates")["templates"] if ".." in x["name"]]
    # the same steps again: every file-changing step cached
    t = build(c, "df2", **{"from": {"dockerfile": df, "context_b64": ctx}})
    assert t["state"] == "ready", t
    ev = list(c.stream("/v1/templates/df2/build/events", max_events=10000))
    assert [e["state"] for e in ev if e.get("type") == "step"] == ["cached"] * 3, ev
    # a changed RUN runs again, the steps before it stay cached
    t = build(c, "df3", **{"from": {"dockerfile": df.replace("id -u >>", "echo x >>"),
                                    "context_b64": ctx}})
    assert t["state"] == "ready", t
    ev = list(c.stream("/v1/templates/df3/build/events", max_events=10000))
    assert [e["state"] for e in ev if e.get("type") == "step" and e["state"] != "running"] \
        == ["cached", "cached", "done"], ev
    for n in ("df1", "df2", "df3"):
        c.ok("DELETE", f"/v1/templates/{n}")


@pytest.mark.parametrize("df,why", [
    ("RUN true\n", "line 1: the first instruction must be FROM"),
    ("FROM busybox\nHEALTHCHECK CMD true\n", "line 2: HEALTHCHECK is not supported"),
    ("FROM busybox\n\n# c\nVOLUME /data\n", "line 4: VOLUME is not supported"),
    ("FROM busybox AS x\n", "line 1: FROM takes one"),
    ("FROM busybox\nADD https://example.com/x /x\n", "line 2: ADD of a URL"),
    ("FROM busybox\nCOPY --chown=1 a b\n", "line 2: COPY/ADD flags"),
    ("FROM busybox\nFROM base\n", "line 2: a second FROM"),
    ("FROM busybox\nBOGUS x\n", "line 2: unknown instruction BOGUS"),
])
def test_dockerfile_refused_with_its_line(node, df, why):
    e = node.client.expect_error("POST", "/v1/templates", 400, "bad_request",
                                 {"name": "dfbad", "from": {"dockerfile": df}})
    assert why in e["message"], e


def test_dockerfile_run_failure_names_the_line_and_leaves_nothing(node, tdir):
    c = node.client
    t = build(c, "dffail", **{"from": {"dockerfile": "FROM busybox\nRUN echo boom; exit 3\n"}})
    assert t["state"] == "failed", t
    assert "line 2: RUN exited with 3: boom" in t["error"]["message"], t
    assert debris(tdir) == []
    # the RUN sandbox is gone
    assert not [s for s in c.get("/v1/sandboxes")["sandboxes"] if s["template"] == "busybox"
                and s["state"] != "stopped"]
    c.ok("DELETE", "/v1/templates/dffail")


def test_dockerfile_run_has_no_network_by_default(node):
    """RUN steps get the build's egress policy, deny by default: no name resolves."""
    c = node.client
    t = build(c, "dfnet", **{"from": {"dockerfile":
                                      "FROM busybox\nRUN nslookup deb.debian.org\n"}})
    assert t["state"] == "failed" and "line 2: RUN exited with" in t["error"]["message"], t
    c.ok("DELETE", "/v1/templates/dfnet")


def test_dockerfile_from_a_registry_image(node, registry, base_tar):
    """FROM REGISTRY/REPO:TAG pulls the image as from: {image} does (insecure for this plain
    HTTP registry), once: a second build of it finds the pull cached; the image's config
    is the starting config."""
    c = node.client
    ref = push_image(registry, base_tar, "df/fromimg", workdir="/app")
    df = f"FROM {ref}\nRUN cat hello.txt > again.txt\n"
    t = build(c, "dfimg", **{"from": {"dockerfile": df}, "insecure": True})
    assert t["state"] == "ready", t
    assert t["config"]["workdir"] == "/app", t
    ev = list(c.stream("/v1/templates/dfimg/build/events", max_events=10000))
    assert [e["state"] for e in ev if e.get("type") == "step" and e["op"] == "FROM"] \
        == ["running", "done"], ev
    assert [e for e in ev if e.get("type") == "layer"], ev  # the pull's own events
    sb = c.create(template="dfimg")
    try:
        r = c.exec(sb["id"], "pwd; cat again.txt")
        assert r["stdout"] == "/app\nhello from the image\n", r
    finally:
        c.remove(sb["id"])
    t = build(c, "dfimg2", **{"from": {"dockerfile": df}, "insecure": True})
    assert t["state"] == "ready", t
    ev = list(c.stream("/v1/templates/dfimg2/build/events", max_events=10000))
    assert [e["state"] for e in ev if e.get("type") == "step"] == ["cached", "cached"], ev
    # a registry that is not there: the line and the reference in the error
    t = build(c, "dfimg3", **{"from": {"dockerfile": "FROM 127.0.0.1:9/no/such:1\n"},
                              "insecure": True, "timeout_s": 30})
    assert t["state"] == "failed", t
    assert "Dockerfile line 1: FROM 127.0.0.1:9/no/such:1" in t["error"]["message"], t
    for n in ("dfimg", "dfimg2", "dfimg3"):
        c.ok("DELETE", f"/v1/templates/{n}")


def _context_raw(add):
    import base64
    return base64.b64encode(oci.tar_bytes(add)).decode()


def test_dockerfile_add_unpacks_a_local_archive(node):
    """ADD of a tar (plain or gzip) from the context unpacks it into DEST, as Docker does;
    COPY of the same file copies it as it is."""
    import gzip
    inner = oci.tar_bytes(lambda t: (oci.file_entry(t, "pkg", kind=tarfile.DIRTYPE, mode=0o755),
                                     oci.file_entry(t, "pkg/a.txt", b"from the archive\n")))

    def add(t):
        oci.file_entry(t, "plain.tar", inner)
        oci.file_entry(t, "zipped.tar.gz", gzip.compress(inner))
    ctx = _context_raw(add)
    df = ("FROM busybox\nADD plain.tar /opt/p/\nADD zipped.tar.gz /opt/z\n"
          "COPY plain.tar /opt/c/\n")
    c = node.client
    t = build(c, "dfadd", **{"from": {"dockerfile": df, "context_b64": ctx}})
    assert t["state"] == "ready", t
    sb = c.create(template="dfadd")
    try:
        r = c.exec(sb["id"], "cat /opt/p/pkg/a.txt /opt/z/pkg/a.txt; ls /opt/c")
        assert r["stdout"] == "from the archive\nfrom the archive\nplain.tar\n", r
    finally:
        c.remove(sb["id"])
    c.ok("DELETE", "/v1/templates/dfadd")


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "hardlink_out", "device", "bomb"])
def test_dockerfile_add_of_a_hostile_archive_is_refused(node, tdir, kind):
    """ADD unpacks with the layer unpacker's refusals and the build's size bound (a
    decompression bomb: a small gzip that unpacks past it)."""
    import gzip
    blob = _hostile(kind)
    if kind == "bomb":
        blob = gzip.compress(blob)

    def add(t):
        oci.file_entry(t, "evil.tar", blob)
    ctx = _context_raw(add)
    c = node.client
    body = {"from": {"dockerfile": "FROM busybox\nADD evil.tar /x/\n", "context_b64": ctx}}
    if kind == "bomb":
        body["max_size_mb"] = 2
    name = f"dfevil-{kind.replace('_', '-')}"
    t = build(c, name, **body)
    assert t["state"] == "failed", t
    msg = t["error"]["message"].replace('\\"', '"')
    assert "Dockerfile line 2: ADD: archive evil.tar: " in msg, msg
    assert HOSTILE[kind].replace('\\"', '"') in msg, msg
    assert not os.path.exists("/tmp/escape.txt") and not os.path.exists("/etc/escape.txt")
    assert debris(tdir) == []
    c.ok("DELETE", f"/v1/templates/{name}")


def test_dockerfile_template_keeps_its_start_and_ready_commands(node):
    """start_cmd/ready_cmd given with a Dockerfile build go with the named template (not its
    step caches); CMD is not started."""
    c = node.client
    df = ("FROM busybox\nWORKDIR /www\nCMD [\"sh\", \"-c\", \"touch /tmp/cmd-ran\"]\n")
    t = build(c, "dfsrv", **{"from": {"dockerfile": df},
                             "start_cmd": "echo up > index.html && exec httpd -f -p 8000",
                             "ready_cmd": "wget -q -O - http://127.0.0.1:8000/"})
    assert t["state"] == "ready" and t["ready_cmd"].startswith("wget"), t
    sb = c.create(template="dfsrv")
    try:
        r = c.exec(sb["id"], "wget -q -O - http://127.0.0.1:8000/; ls /tmp")
        assert r["stdout"] == "up\n", r
    finally:
        c.remove(sb["id"])
    c.ok("DELETE", "/v1/templates/dfsrv")


def _fcap(caps, effective=True, rev=2, rootid=0):
    """A security.capability value: struct vfs_cap_data revision 2 (or 3 with a rootid)."""
    import struct
    magic = (rev << 24) | (1 if effective else 0)
    v = struct.pack("<IIIII", magic, caps & 0xffffffff, 0, caps >> 32, 0)
    return v + (struct.pack("<I", rootid) if rev == 3 else b"")


def _cap_entry(t, name, data, value):
    ti = tarfile.TarInfo(name)
    ti.mode, ti.uid, ti.gid, ti.size, ti.mtime = 0o755, 0, 0, len(data), 1700000000
    # a binary PAX value, as buildkit and tar --xattrs write it
    ti.pax_headers = {"SCHILY.xattr.security.capability":
                      value.decode("utf-8", "surrogateescape"),
                      "SCHILY.xattr.user.overlay.opaque": "y"}
    t.addfile(ti, __import__("io").BytesIO(data))


def test_file_capabilities_of_an_image_are_kept_and_never_effective(node, registry, base_tar,
                                                                     tdir):
    """security.capability from a layer's PAX records: kept on the file as the image says
    (a revision 3 value made revision 2), never reachable by a host user, and in effect in
    a sandbox as the image says (as setuid files are: within the sandbox's own user
    namespace only); other xattrs (user.overlay.*, which overlayfs would obey) are
    dropped."""
    NET_RAW = 1 << 13
    with open("/bin/busybox", "rb") as f:
        bb = f.read()
    layer = oci.tar_bytes(lambda t: (
        oci.file_entry(t, "app", kind=tarfile.DIRTYPE, mode=0o755),
        oci.file_entry(t, "app/v2", kind=tarfile.DIRTYPE, mode=0o755),
        oci.file_entry(t, "app/v3", kind=tarfile.DIRTYPE, mode=0o755),
        _cap_entry(t, "app/v2/busybox", bb, _fcap(NET_RAW)),
        _cap_entry(t, "app/v3/busybox", bb, _fcap(NET_RAW, rev=3, rootid=100000))))
    ref = push_image(registry, base_tar, "caps/app", layers=[base_tar, layer])
    c = node.client
    t = build(c, "capapp", **{"from": {"image": ref}, "insecure": True})
    assert t["state"] == "ready", t
    root = os.path.join(tdir, "tenants", "default", "capapp", "rootfs", "app")
    for n in ("v2/busybox", "v3/busybox"):
        assert os.getxattr(os.path.join(root, n), "security.capability") == _fcap(NET_RAW)
        assert "user.overlay.opaque" not in os.listxattr(os.path.join(root, n))
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            "/bin/sh", "-c", f"exec {os.path.join(root, n)} true"],
                           capture_output=True, text=True)
        assert r.returncode == 126 and "Permission denied" in r.stderr, r
    sb = c.create(template="capapp")
    try:
        for n in ("v2/busybox", "v3/busybox"):
            r = c.exec(sb["id"], [f"/app/{n}", "grep", "^CapEff", "/proc/self/status"],
                       user="1000")
            assert r["exit_code"] == 0, r
            assert int(r["stdout"].split()[1], 16) == NET_RAW, r
    finally:
        c.remove(sb["id"])
    c.ok("DELETE", "/v1/templates/capapp")


@pytest.mark.parametrize("value", [b"\x00\x00\x00\x02" + b"\0" * 15,      # short
                                   b"\x01\x00\x00\x01" + b"\0" * 8,       # revision 1
                                   b"\x03\x00\x00\x02" + b"\0" * 16])     # unknown flag
def test_malformed_file_capability_is_refused_naming_the_layer(node, registry, base_tar, value):
    layer = oci.tar_bytes(lambda t: _cap_entry(t, "capx", b"x", value))
    ref = push_image(registry, base_tar, "caps/bad", layers=[base_tar, layer])
    t = build(node.client, "capbad", **{"from": {"image": ref}, "insecure": True})
    assert t["state"] == "failed", t
    msg = t["error"]["message"]
    assert "layer 2 (sha256:" in msg and "bad PAX value for SCHILY.xattr.security.c" in msg, msg
    node.client.ok("DELETE", "/v1/templates/capbad")


def _metric(c, name):
    body = c.request("GET", "/metrics", auth=False).body.decode()
    return int(float([l.split()[1] for l in body.splitlines() if l.startswith(name + " ")][0]))


def test_template_warm_pool_is_filled_taken_kept_over_restarts_and_dropped(build_dir, tdir,
                                                                           log_dir):
    """pool: N keeps N warm sandboxes of the template (a create takes one), again after a
    restart of coved; deleting the template stops them."""
    data = tempfile.mkdtemp(prefix="cove-pool-data-")
    d = Coved(build_dir, data_dir=data, templates_dir=tdir, log_dir=log_dir,
              extra_args=["--pool", "0"])
    try:
        c = d.client
        assert _metric(c, "cove_pool_ready") == 0
        sb = c.create(template="busybox")
        c.exec(sb["id"], "echo pooled > /etc/which")
        t = build(c, "pooled", **{"from": {"sandbox": sb["id"]}, "pool": 1})
        c.remove(sb["id"])
        assert t["state"] == "ready" and t["pool"] == 1, t
        poll(lambda: _metric(c, "cove_pool_ready") == 1, timeout=120, what="pool filled")
        s2 = c.create(template="pooled")
        assert _metric(c, "cove_pool_taken_total") == 1
        assert c.exec(s2["id"], "cat /etc/which")["stdout"] == "pooled\n"
        c.remove(s2["id"])
        poll(lambda: _metric(c, "cove_pool_ready") == 1, timeout=120, what="pool refilled")
        d.stop()
        d = Coved(build_dir, data_dir=data, templates_dir=tdir, log_dir=log_dir,
                  extra_args=["--pool", "0"])
        c = d.client
        poll(lambda: _metric(c, "cove_pool_ready") == 1, timeout=120, what="pool restored")
        c.ok("DELETE", "/v1/templates/pooled")
        assert _metric(c, "cove_pool_ready") == 0
        c.expect_error("POST", "/v1/templates", 400, "bad_request",
                       {"name": "x", "from": {"sandbox": "sbx_x"}, "pool": 17})
    finally:
        d.stop()
        shutil.rmtree(data, ignore_errors=True)
