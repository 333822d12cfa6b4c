"""OCI images made by the tests themselves, and a real registry (Debian's docker-registry)
on loopback to push them to.

make_layout(dir, layers, config) writes an OCI image layout by hand (so that a test can
put anything in a layer, hostile entries included); push() copies it into the registry
with skopeo; Registry runs /usr/bin/docker-registry on a free 127.0.0.1 port with its own
storage root, optionally behind htpasswd basic auth."""
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
import urllib.request
import warnings

from cove import free_port

REGISTRY_BIN = "/usr/bin/docker-registry"


def tar_bytes(add):
    """A tar stream built by add(tarfile.TarFile)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        add(t)
    return buf.getvalue()


def file_entry(t, name, data=b"", mode=0o644, uid=0, gid=0, kind=tarfile.REGTYPE, link=""):
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.mode = mode
    ti.uid, ti.gid = uid, gid
    ti.linkname = link
    ti.mtime = 1700000000
    if kind == tarfile.REGTYPE:
        ti.size = len(data)
        t.addfile(ti, io.BytesIO(data))
    else:
        t.addfile(ti)


def rootfs_layer(rootfs):
    """A tar of a directory tree (ownership and modes kept, nothing followed). Device nodes
    are left out, as `docker export` and image builders leave them out."""
    def nodev(ti):
        return None if ti.ischr() or ti.isblk() else ti

    def add(t):
        for name in sorted(os.listdir(rootfs)):
            t.add(os.path.join(rootfs, name), arcname=name, recursive=True, filter=nodev)
    return tar_bytes(add)


def make_layout(path, layers, arch="amd64", env=None, user=None, workdir=None, cmd=None,
                entrypoint=None, diff_ids=None, tag="latest", gzip_layers=True):
    """Write an OCI layout with the given uncompressed layer tars; returns the manifest
    digest. diff_ids overrides the config's (to make one lie)."""
    os.makedirs(os.path.join(path, "blobs", "sha256"), exist_ok=True)

    def blob(data):
        d = hashlib.sha256(data).hexdigest()
        with open(os.path.join(path, "blobs", "sha256", d), "wb") as f:
            f.write(data)
        return "sha256:" + d, len(data)

    descs, ids = [], []
    for tar in layers:
        ids.append("sha256:" + hashlib.sha256(tar).hexdigest())
        data = gzip.compress(tar, 1, mtime=0) if gzip_layers else tar
        dg, size = blob(data)
        descs.append({"mediaType": "application/vnd.oci.image.layer.v1.tar" +
                      ("+gzip" if gzip_layers else ""), "digest": dg, "size": size})
    cfg = {"architecture": arch, "os": "linux",
           "rootfs": {"type": "layers", "diff_ids": diff_ids if diff_ids is not None else ids},
           "config": {}}
    if env is not None:
        cfg["config"]["Env"] = env
    if user is not None:
        cfg["config"]["User"] = user
    if workdir is not None:
        cfg["config"]["WorkingDir"] = workdir
    if cmd is not None:
        cfg["config"]["Cmd"] = cmd
    if entrypoint is not None:
        cfg["config"]["Entrypoint"] = entrypoint
    cdg, csize = blob(json.dumps(cfg).encode())
    man = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cdg,
                      "size": csize},
           "layers": descs}
    mdg, msize = blob(json.dumps(man).encode())
    with open(os.path.join(path, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": mdg,
             "size": msize, "annotations": {"org.opencontainers.image.ref.name": tag}}]}, f)
    with open(os.path.join(path, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    return mdg


def skopeo(*args, timeout=300):
    r = subprocess.run(["skopeo", "--insecure-policy", *args], capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode != 0:
        raise AssertionError(f"skopeo {' '.join(args)}: {r.stderr[-2000:]}")
    return r.stdout


def push(layout, ref, tag="latest", creds=None):
    """Copy the layout into the registry (plain HTTP)."""
    extra = ["--dest-creds", creds] if creds else ["--dest-no-creds"]
    skopeo("copy", "--dest-tls-verify=false", *extra, f"oci:{layout}:{tag}", f"docker://{ref}")


class Registry:
    """docker-registry on 127.0.0.1:<free port>, storage in a temp dir, stopped by stop()."""

    def __init__(self, user=None, password=None):
        self.dir = tempfile.mkdtemp(prefix="cove-registry-")
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        cfg = ["version: 0.1", "log:", "  level: error", "storage:", "  filesystem:",
               f"    rootdirectory: {self.dir}/data", "  delete:", "    enabled: true",
               "http:", f"  addr: 127.0.0.1:{self.port}"]
        if user:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                import crypt
                h = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))
            with open(os.path.join(self.dir, "htpasswd"), "w") as f:
                f.write(f"{user}:{h}\n")
            cfg += ["auth:", "  htpasswd:", "    realm: cove-test",
                    f"    path: {self.dir}/htpasswd"]
        with open(os.path.join(self.dir, "config.yml"), "w") as f:
            f.write("\n".join(cfg) + "\n")
        self.log = open(os.path.join(self.dir, "registry.log"), "wb")
        self.proc = subprocess.Popen([REGISTRY_BIN, "serve", os.path.join(self.dir, "config.yml")],
                                     stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL)
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2)
                break
            except urllib.error.HTTPError:
                break  # 401 with auth on: it answers
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    raise AssertionError("docker-registry did not start: " +
                                         open(self.log.name).read()[-2000:])
                time.sleep(0.05)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
