"""Escaping through the files API: `..`, absolute host paths, planted symlinks (to host
paths, to /proc/1/root, loops), /proc/self/root. Reads return the sandbox's own file or an
error, never host content; writes never create or modify a host file."""
import os
import secrets

import pytest

from secutil import sh


def _q(p):
    import urllib.parse
    return urllib.parse.quote(p, safe="/")


def _assert_not_host(r, forbidden, what):
    assert r.status in (200, 400, 404, 409), f"{what}: unexpected status {r.status} {r.body[:200]!r}"
    if r.status != 200:
        e = r.error
        assert e.get("code") and e.get("message"), f"{what}: error without the error shape"
    for f in forbidden:
        assert f not in r.body, f"{what}: host content returned: {r.body[:200]!r}"


@pytest.mark.root
def test_read_escapes(client, sandbox, host_marker):
    sid = sandbox["id"]
    path, content = host_marker
    forbidden = [content.encode()]
    try:
        with open("/etc/shadow", "rb") as f:
            sh_host = f.read()
        forbidden += [l for l in sh_host.splitlines() if b":$" in l]
    except OSError:
        pass
    # symlinks planted inside, pointing at host paths and through /proc magic links
    sh(client, sid, f"""
        cd /tmp
        ln -sf {path} l_marker
        ln -sf /proc/1/root{path} l_proc1root
        ln -sf /proc/self/root/../../..{path} l_procself
        ln -sf ../../../../../../..{path} l_rel
        ln -sf /proc/1/root l_rootdir
        ln -sf /etc/shadow l_shadow
        ln -sf loop_b loop_a; ln -sf loop_a loop_b
        ln -sf /proc/1/cwd/../../.. l_cwd
        ln -sf /proc/self/fd/3 l_chan
    """)
    paths = [
        path, "/../../.." + path, "../../../../.." + path, "/proc/1/root" + path,
        "/proc/self/root" + path, "/proc/1/root/../../.." + path, "/tmp/l_marker",
        "/tmp/l_proc1root", "/tmp/l_procself", "/tmp/l_rel", "/tmp/l_rootdir" + path,
        "/tmp/l_cwd" + path, "/tmp/l_rootdir/etc/shadow", "/../../etc/shadow",
        "/etc/../../../etc/shadow", "/tmp/l_shadow", "/proc/1/root/etc/shadow",
        "/tmp/loop_a", "/tmp/loop_a/x", "/tmp/l_chan", "/proc/1/fd/3",
        "/proc/self/fd/3", "/proc/1/environ", "/proc/1/mem", "/proc/kcore",
        "/dev/../" + path, "//" + path, "/./" + path,
    ]
    for p in paths:
        r = client.get_file(sid, p, timeout=60)
        _assert_not_host(r, forbidden, f"GET files {p}")
    # listing through the same tricks shows the sandbox, never the host's /tmp
    marker_name = os.path.basename(path).encode()
    for p in ["/../../../tmp", "/proc/1/root/tmp", "/tmp/l_rootdir/tmp", "/tmp/l_cwd/tmp",
              "/proc/self/root/../../tmp"]:
        r = client.request("GET", f"/v1/sandboxes/{sid}/fs?path={_q(p)}&depth=2", timeout=60)
        _assert_not_host(r, [marker_name], f"GET fs {p}")
    # stat/list of a loop answers (error or entry), no hang
    r = client.request("GET", f"/v1/sandboxes/{sid}/fs?path={_q('/tmp/loop_a')}&depth=1")
    assert r.status in (200, 400, 404, 409), r


@pytest.mark.root
def test_write_escapes(client, sandbox):
    sid = sandbox["id"]
    tag = secrets.token_hex(6)
    host_new = f"/tmp/cove-sec-new-{tag}"           # must never be created
    host_old = f"/tmp/cove-sec-old-{tag}"           # must never be modified
    host_dir = f"/tmp/cove-sec-dir-{tag}"           # nothing may appear inside
    with open(host_old, "w") as f:
        f.write("original\n")
    os.mkdir(host_dir)
    try:
        sh(client, sid, f"""
            cd /tmp
            ln -sf {host_new} w_new
            ln -sf {host_old} w_old
            ln -sf /proc/1/root{host_old} w_proc_old
            ln -sf {host_dir} w_dir
            ln -sf /proc/1/root/../../../..{host_dir} w_procdir
            ln -sf /proc/1/cwd/../../.. w_cwd
            ln -sf wl_b wl_a; ln -sf wl_a wl_b
        """)
        writes = [
            host_new, "/../../.." + host_new, "../../../../.." + host_new,
            "/proc/1/root" + host_new, "/proc/self/root/../.." + host_new,
            host_old, "/../.." + host_old, "/tmp/w_new", "/tmp/w_old", "/tmp/w_proc_old",
            "/tmp/w_dir/evil", "/tmp/w_procdir/evil", f"/tmp/w_cwd{host_dir}/evil",
            "/tmp/wl_a", "/tmp/wl_a/x", f"{host_dir}/evil",
        ]
        for p in writes:
            r = client.request("PUT", f"/v1/sandboxes/{sid}/files?path={_q(p)}",
                               b"PWNED\n", headers={"Content-Type": "application/octet-stream"},
                               timeout=60)
            assert r.status in (200, 201, 400, 404, 409), f"PUT {p}: {r.status} {r.body[:200]!r}"
            assert not os.path.exists(host_new), f"PUT {p} created the host file {host_new}"
            with open(host_old) as f:
                assert f.read() == "original\n", f"PUT {p} modified the host file {host_old}"
            assert os.listdir(host_dir) == [], f"PUT {p} created {os.listdir(host_dir)} on host"
        # mkdir / move / remove through the same tricks
        for op, body in [
            ("mkdir", {"path": f"/../../..{host_dir}/sub"}),
            ("mkdir", {"path": "/tmp/w_dir/sub"}),
            ("move", {"from": "/tmp/w_old", "to": f"/../../..{host_dir}/moved"}),
            ("move", {"from": f"/../../..{host_old}", "to": "/tmp/stolen"}),
            ("remove", {"path": f"/../../..{host_old}"}),
            ("remove", {"path": "/tmp/w_old"}),
            ("remove", {"path": "/tmp/w_procdir", "recursive": True}),
            ("remove", {"path": f"/proc/1/root{host_dir}", "recursive": True}),
        ]:
            r = client.request("POST", f"/v1/sandboxes/{sid}/fs/{op}", body, timeout=60)
            assert r.status in (200, 201, 204, 400, 404, 409), f"{op} {body}: {r.status}"
            assert os.path.isdir(host_dir) and os.listdir(host_dir) == [], \
                f"fs/{op} {body} touched the host dir {host_dir}"
            assert os.path.exists(host_old), f"fs/{op} {body} removed the host file {host_old}"
            with open(host_old) as f:
                assert f.read() == "original\n"
        # a stolen file (if the move "succeeded" inside) is not the host's
        r = client.get_file(sid, "/tmp/stolen")
        assert r.status == 404 or b"original" not in r.body
    finally:
        for p in (host_new, host_old):
            try:
                os.unlink(p)
            except OSError:
                pass
        for n in os.listdir(host_dir):
            os.unlink(os.path.join(host_dir, n))
        os.rmdir(host_dir)
