"""A real S3 server for tests: Ceph radosgw started by tests/lib/s3rgw.sh (one mon, one
memstore OSD, one radosgw, all under one temp directory), plus a minimal signed client
(curl --aws-sigv4) to look at what the store holds.

    with S3Rgw() as rgw:          # or rgw = S3Rgw().start() ... rgw.stop()
        rgw.env                   # AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION
        rgw.endpoint              # http://127.0.0.1:PORT
        rgw.keys("bucket", "pre/")   # {key: size} via ListObjectsV2 (all pages)
        rgw.pause(); rgw.resume()    # radosgw down / up again (objects stay)

S3Rgw.available() says why not when ceph is not installed (scripts/install-deps)."""
import os
import shutil
import subprocess
import tempfile
import urllib.parse
import xml.etree.ElementTree as ET

from cove import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "s3rgw.sh")
NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


class S3Rgw:
    def __init__(self, addr=None):
        """addr: the local address radosgw listens on (default 127.0.0.1), e.g. a test
        bridge's so that clients in network namespaces reach it."""
        self.addr = addr
        self.dir = None
        self.env = {}
        self.endpoint = None

    @staticmethod
    def available():
        """None when it can start, else the reason."""
        for b in ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "curl"):
            if not shutil.which(b):
                return f"{b} not installed (scripts/install-deps installs ceph-mon ceph-osd radosgw)"
        return None

    def start(self):
        base = tempfile.mkdtemp(prefix="cove-rgw-")
        self.dir = os.path.join(base, "rgw")
        last = None
        for _ in range(3):  # a port taken between the probe and the bind: another one
            port = free_port()
            env = dict(os.environ, S3_RGW_ADDR=self.addr) if self.addr else None
            r = subprocess.run([SCRIPT, "start", self.dir, str(port)], capture_output=True,
                               text=True, timeout=300, env=env)
            if r.returncode == 0:
                line = r.stdout.strip().splitlines()[-1]
                kv = dict(x.split("=", 1) for x in line.split())
                self.endpoint = kv.pop("S3_ENDPOINT")
                self.env = kv
                return self
            last = r.stderr
            subprocess.run([SCRIPT, "stop", self.dir], capture_output=True, timeout=120)
            if "already in use" not in (last or ""):
                break
        raise RuntimeError(f"radosgw did not start: {last}")

    def stop(self):
        if self.dir and os.path.exists(self.dir):
            r = subprocess.run([SCRIPT, "stop", self.dir], capture_output=True, text=True,
                               timeout=120)
            if r.returncode != 0:
                raise RuntimeError(f"s3rgw.sh stop: {r.stderr}")
            os.rmdir(os.path.dirname(self.dir))
        self.dir = None

    def pause(self):
        subprocess.run([SCRIPT, "pause", self.dir], check=True, timeout=120)

    def resume(self):
        subprocess.run([SCRIPT, "resume", self.dir], check=True, timeout=300)

    def __enter__(self):
        return self.start()

    def __exit__(self, *a):
        self.stop()

    def curl(self, method, path, query="", headers=(), timeout=30):
        """(status, body) of a signed request; path is /bucket[/key], query canonical."""
        url = self.endpoint + path + ("?" + query if query else "")
        args = ["curl", "-s", "-o", "-", "-w", "\n%{http_code}", "--max-time", str(timeout),
                "-X", method, "--aws-sigv4", f"aws:amz:{self.env['AWS_REGION']}:s3",
                "--user", f"{self.env['AWS_ACCESS_KEY_ID']}:{self.env['AWS_SECRET_ACCESS_KEY']}",
                "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"]
        for h in headers:
            args += ["-H", h]
        if method == "HEAD":
            args[args.index("-X"):args.index("-X") + 2] = ["-I"]
        r = subprocess.run(args + [url], capture_output=True, timeout=timeout + 10)
        body, _, code = r.stdout.rpartition(b"\n")
        return int(code or 0), body

    def keys(self, bucket, prefix=""):
        """{key: size} of every object under prefix (ListObjectsV2, every page)."""
        out, token = {}, None
        while True:
            q = {"list-type": "2", "max-keys": "1000", "prefix": prefix}
            if token:
                q["continuation-token"] = token
            query = "&".join(f"{k}={urllib.parse.quote(v, safe='')}" for k, v in sorted(q.items()))
            st, body = self.curl("GET", f"/{bucket}", query)
            if st == 404:
                return out
            assert st == 200, (st, body[:300])
            root = ET.fromstring(body)
            for c in root.iter(NS + "Contents"):
                out[c.find(NS + "Key").text] = int(c.find(NS + "Size").text)
            if root.findtext(NS + "IsTruncated") != "true":
                return out
            token = root.findtext(NS + "NextContinuationToken")

    def exists(self, bucket, key):
        st, _ = self.curl("HEAD", f"/{bucket}/{key}")
        return st == 200
