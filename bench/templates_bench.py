#!/usr/bin/env python3
"""Templates from images through the REST API of a real coved (ns runtime), each figure next
to its anchor from the same run:

- pull + unpack of an image of a few hundred MB (the `base` template's rootfs as one gzip
  layer, plus a small one) from a local docker-registry: coved's build (skopeo copy into an
  OCI layout, then its own digest-checked unpack and hard-link rootfs) vs `skopeo copy` +
  `umoci unpack` run by hand;
- a rebuild of the same image when its layers are on the node already (another template
  holds them) vs the cold build (Dockerfile builds are not implemented: no step cache yet);
- create → running of a sandbox from the custom template vs from the built-in `base`;
- storage of two templates that share the base layer vs twice one template.

    bench/templates_bench.py --build build [--rounds 5]

`make bench-templates` runs it. Needs root, skopeo, umoci, docker-registry and a built
`base` template (COVE_TEMPLATES_DIR, default build/test-templates); it works on hard-link
copies of that in a temp dir, never writing the shared one."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "lib"))
from cove import Coved, poll  # noqa: E402
import oci  # noqa: E402


def du(path):
    """Bytes allocated under path, hard links counted once (du -s)."""
    out = subprocess.run(["du", "-s", "-B1", path], capture_output=True, text=True).stdout
    return int(out.split()[0]) if out else 0


def du_many(paths):
    out = subprocess.run(["du", "-s", "-c", "-B1", *paths], capture_output=True,
                         text=True).stdout
    return int(out.strip().splitlines()[-1].split()[0])


def build(c, name, ref, timeout=1800):
    t0 = time.monotonic()
    c.post("/v1/templates", {"name": name, "from": {"image": ref}, "insecure": True},
           expect=(202,))
    t = poll(lambda: (x := c.get(f"/v1/templates/{name}"))["state"] != "building" and x,
             timeout=timeout, every=0.02, what=f"template {name}")
    dt = time.monotonic() - t0
    if t["state"] != "ready":
        raise SystemExit(f"bench: build {name} failed: {t.get('error')}")
    return t, dt


def create_ready(c, template, rounds):
    xs = []
    for _ in range(rounds):
        t0 = time.monotonic()
        sb = c.create(template=template)
        c.wait_state(sb["id"], ("running",), timeout=300)
        c.exec(sb["id"], ["true"])
        xs.append((time.monotonic() - t0) * 1000)
        c.remove(sb["id"])
    xs.sort()
    return xs[len(xs) // 2], xs[0], xs[-1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: must run as root (coved's ns runtime needs it)")
    shared = os.environ.get("COVE_TEMPLATES_DIR") or os.path.join(a.build, "test-templates")
    base_rootfs = os.path.join(shared, "base", "rootfs")
    if not os.path.isdir(base_rootfs):
        sys.exit(f"bench: no base template in {shared} (build it: cove template build base)")
    work = tempfile.mkdtemp(prefix="cove-bench-tpl-")
    tdir = os.path.join(work, "templates")
    os.makedirs(tdir)
    # hard-link copies: read only here, nothing written into the shared directory
    for t in ("base", "busybox"):
        if os.path.isdir(os.path.join(shared, t)):
            subprocess.run(["cp", "-al", os.path.join(shared, t), tdir], check=True)
    reg = oci.Registry()
    d = None
    try:
        print(f"# templates bench, load average {os.getloadavg()[0]:.2f} "
              f"{os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}, {os.cpu_count()} cpus")
        base_tar = oci.rootfs_layer(base_rootfs)

        def small(name):
            return oci.tar_bytes(lambda t: oci.file_entry(t, name, b"x" * 4096))

        lay = os.path.join(work, "layout")
        oci.make_layout(lay, [base_tar, small("one.txt")])
        ref1 = f"{reg.host}/bench/one:latest"
        oci.push(lay, ref1)
        shutil.rmtree(lay)
        oci.make_layout(lay, [base_tar, small("two.txt")])
        ref2 = f"{reg.host}/bench/two:latest"
        oci.push(lay, ref2)
        shutil.rmtree(lay)
        img_mb = len(base_tar) / 1e6
        print(f"image: {img_mb:.0f} MB uncompressed (base rootfs + 4 KB layer), gzip -1")

        d = Coved(os.path.abspath(a.build), templates_dir=tdir,
                  extra_args=["--templates", "busybox,base"])
        c = d.client
        # cold build, then the anchor by hand in the same minute
        t1, cold = build(c, "one", ref1)
        hand = os.path.join(work, "hand")
        os.makedirs(hand)
        t0 = time.monotonic()
        oci.skopeo("copy", "--src-tls-verify=false", f"docker://{ref1}", f"oci:{hand}/img:x")
        t_copy = time.monotonic() - t0
        r = subprocess.run(["umoci", "unpack", "--image", f"{hand}/img:x", f"{hand}/bundle"],
                           capture_output=True, text=True)
        t_hand = time.monotonic() - t0
        if r.returncode != 0:
            sys.exit(f"bench: umoci unpack failed: {r.stderr[-500:]}")
        shutil.rmtree(hand)
        print("\n| figure | cove | anchor (same run) | unit |\n|---|---|---|---|")
        print(f"| pull + unpack, {img_mb:.0f} MB image | {cold:.2f} s ({img_mb / cold:.0f} MB/s)"
              f" | skopeo copy + umoci unpack: {t_hand:.2f} s ({img_mb / t_hand:.0f} MB/s; "
              f"copy alone {t_copy:.2f} s) | s |")
        # the same image again while "one" holds its layers; then a second image sharing one
        _, shared_build = build(c, "two", ref2)
        _, warm = build(c, "one-again", ref1)
        print(f"| rebuild, layers on the node | {warm:.2f} s | cold build {cold:.2f} s | s |")
        print(f"| second image sharing the base layer | {shared_build:.2f} s | cold build "
              f"{cold:.2f} s | s |")
        stored = du_many([os.path.join(tdir, "tenants"), os.path.join(tdir, "layers")])
        # a Dockerfile: cold, then the same steps again (every step cached)
        df = ("FROM base\nENV MODE=bench\nWORKDIR /opt/app\n"
              "RUN dd if=/dev/zero of=blob bs=1M count=20 2>/dev/null && echo $MODE > mode\n"
              "RUN python3 -c 'print(1)' > py.txt\n")

        def dfbuild(name):
            t0 = time.monotonic()
            c.post("/v1/templates", {"name": name, "from": {"dockerfile": df}}, expect=(202,))
            t = poll(lambda: (x := c.get(f"/v1/templates/{name}"))["state"] != "building" and x,
                     timeout=1800, every=0.02, what=name)
            if t["state"] != "ready":
                raise SystemExit(f"bench: Dockerfile build failed: {t.get('error')}")
            return time.monotonic() - t0

        dcold = dfbuild("df-cold")
        dwarm = dfbuild("df-warm")
        print(f"| Dockerfile (FROM base, WORKDIR, 2 RUN), rebuild with every step cached | "
              f"{dwarm:.2f} s | cold build {dcold:.2f} s | s |")
        custom = create_ready(c, "one", a.rounds)
        base = create_ready(c, "base", a.rounds)
        print(f"| create → exec answers, custom template | {custom[0]:.0f} (min {custom[1]:.0f},"
              f" max {custom[2]:.0f}) | base: {base[0]:.0f} (min {base[1]:.0f}, max "
              f"{base[2]:.0f}) | ms, median of {a.rounds} |")
        one = t1["size_bytes"]
        print(f"| storage of 3 templates (2 images sharing a layer) | {stored / 1e6:.0f} MB "
              f"(du) | 3 × one: {3 * one / 1e6:.0f} MB (logical size) | MB |")
        print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    finally:
        if d:
            d.stop()
        reg.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
