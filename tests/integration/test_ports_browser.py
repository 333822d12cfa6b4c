"""A preview URL in a real browser: headless Chromium (Debian's `chromium`, driven by the
playwright-core pinned in tests/browser/package-lock.json) opens the URL of a private port
as the API answered it, the page's own requests ride on the HttpOnly cookie, and a WebSocket
from the page echoes. Skips, saying why, without node, npm, chromium or the npm registry."""
import json
import os
import shutil
import subprocess

import pytest

from cove import Coved, free_port
from test_ports import DOMAIN, HTTP, WS, start_app

pytestmark = pytest.mark.root
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "tests", "browser")
FILES = ("package.json", "package-lock.json", "preview.mjs")


@pytest.fixture(scope="module")
def browser_dir(build_dir):
    node, npm = shutil.which("node"), shutil.which("npm")
    chromium = shutil.which("chromium")
    if not node or not npm:
        pytest.skip("node and npm are needed for the browser test (apt install nodejs npm)")
    if not chromium:
        pytest.skip("Debian's chromium is needed for the browser test (apt install chromium)")
    d = os.path.join(build_dir, "browser-tests")
    os.makedirs(d, exist_ok=True)
    stale = not os.path.isdir(os.path.join(d, "node_modules", "playwright-core"))
    for f in FILES:
        with open(os.path.join(SRC, f), "rb") as a:
            new = a.read()
        dst = os.path.join(d, f)
        old = open(dst, "rb").read() if os.path.exists(dst) else None
        if old != new:
            stale = stale or f != "preview.mjs"
            with open(dst, "wb") as b:
                b.write(new)
    if stale:
        r = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=d, capture_output=True,
                           text=True, timeout=600)
        if r.returncode != 0:
            pytest.skip(f"npm ci failed (is the npm registry reachable?): "
                        f"{(r.stderr or r.stdout).strip()[-400:]}")
    return d, node, chromium


def test_chromium_opens_a_private_preview_url(browser_dir, build_dir, templates_dir, log_dir):
    d_, node, chromium = browser_dir
    pport = free_port()
    d = Coved(build_dir, templates_dir=templates_dir, log_dir=log_dir,
              extra_args=["--templates", "busybox,base", "--pool", "0",
                          "--ports-listen", f"127.0.0.1:{pport}", "--ports-domain", DOMAIN])
    try:
        c = d.client
        sid = c.create(template="base")["id"]
        start_app(c, sid)
        url = c.post(f"/v1/sandboxes/{sid}/ports", {"port": HTTP})["url"]
        c.post(f"/v1/sandboxes/{sid}/ports", {"port": WS, "public": True})
        ws = f"ws://{WS}-{sid}.{DOMAIN}:{pport}/"
        env = dict(os.environ, CHROMIUM=chromium, HOST_RULES=f"MAP *.{DOMAIN} 127.0.0.1")
        r = subprocess.run([node, "preview.mjs", url, ws], cwd=d_, env=env, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["status"] == 200 and out["heading"] == "hello from the sandbox"
        assert out["title"] == "loaded /headers"  # the page's fetch got through on the cookie
        assert out["documentCookie"] == ""  # HttpOnly: scripts never see the token
        ck = [k for k in out["cookies"] if k["name"] == "cove_port_token"]
        assert ck and ck[0]["httpOnly"] and ck[0]["domain"] == f"{HTTP}-{sid}.{DOMAIN}"
        assert out["echo"] == "hello from chromium"
        assert out["againStatus"] == 200
        c.remove(sid, purge=True)
    finally:
        d.stop()
