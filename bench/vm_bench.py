#!/usr/bin/env python3
"""vm runtime benchmark (docs/vm.md): everything through coved's REST API.

  template build  first vm create of a shape: mkfs of the root disk, cold boot of the
                  template VM to cove-guest, device-state snapshot (x-ignore-shared)
  create, no pool create→ready (201 with a guest that answered HELLO) of a clone, no warm pool
  create, pool    the same with a warm pool (--vm-pool), waiting for a refill between creates
  full snapshot   pause (save: stop, disk + migration stream into the chunk store) and
                  resume (restore: -incoming, cont) of 128 and 512 MB guests, stored bytes
  PSS             host memory per idle VM (QEMU's Pss from smaps_rollup)

Next to each figure, the same step with qemu-system-x86_64 started on its own (same kernel,
machine and accelerator flags as vm_qemu.c, a busybox initramfs instead of cove's, our QMP
calls from Python, no coved): cold boot to userspace, a clone from a RAM-file template
(launch → running, and a QEMU already waiting in -incoming defer), stop + migrate to a file
and restore for 128 and 512 MB guests, PSS of an idle clone. The difference is what cove adds
(API, catalog, qcow2 overlay, cgroup/uid/netns, HELLO, the chunk store).

Usage: bench/vm_bench.py [--build build] [--n 10]   (root; QEMU + guest kernel installed)"""
import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "lib"))
from cove import Coved  # noqa: E402
from benchlib import pct  # noqa: E402




def ms(xs):
    return (f"p50 {statistics.median(xs) * 1000:.1f} ms, p90 {pct(xs, 90) * 1000:.1f} ms, "
            f"min {min(xs) * 1000:.1f} ms (n={len(xs)})")


def qemu_of(sid):
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cgroup") as f:
                if f"cove/{sid}" not in f.read():
                    continue
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if b"qemu-system" in f.read():
                    return int(p)
        except OSError:
            continue
    return None


def pss_kb(pid):
    with open(f"/proc/{pid}/smaps_rollup") as f:
        m = re.search(r"^Pss:\s+(\d+) kB", f.read(), re.M)
    return int(m.group(1))


def wait_pool(d, n, timeout=180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = d.client.request("GET", "/metrics", auth=False)
        m = re.search(rb"cove_pool_ready\S*\s+(\d+)", r.body)
        if m and int(m.group(1)) >= n:
            return
        time.sleep(0.05)
    raise SystemExit("vm pool did not refill")


QEMU = os.environ.get("COVE_QEMU", "/usr/bin/qemu-system-x86_64")
KDIR = os.environ.get("COVE_VM_KERNEL_DIR", "/var/cache/cove/vm")
MARK = b"BARE-QEMU-READY"


def host_khz():
    with open("/proc/cpuinfo") as f:
        m = re.search(r"^cpu MHz\s*:\s*([\d.]+)", f.read(), re.M)
    return int(float(m.group(1)) * 1000)


def cpio(path, entries):
    """newc archive: entries (name, mode, data or (major, minor))"""
    with open(path, "wb") as f:
        for ino, (name, mode, data) in enumerate(entries + [("TRAILER!!!", 0, b"")], 1):
            rdev = data if isinstance(data, tuple) else (0, 0)
            body = b"" if isinstance(data, tuple) else data
            nm = name.encode() + b"\0"
            hdr = "070701" + "".join(f"{v:08X}" for v in (
                ino, mode, 0, 0, 1, 0, len(body), 0, 0, rdev[0], rdev[1], len(nm), 0))
            f.write(hdr.encode() + nm + b"\0" * ((4 - (110 + len(nm)) % 4) % 4))
            f.write(body + b"\0" * ((4 - len(body) % 4) % 4))


class Bare:
    """qemu-system-x86_64 on its own: the guest is the busybox initramfs whose /init prints
    MARK on the serial console and sleeps."""

    def __init__(self, work):
        self.work = work
        self.initrd = os.path.join(work, "bare-initrd")
        with open("/usr/bin/busybox" if os.path.exists("/usr/bin/busybox")
                  else "/bin/busybox", "rb") as f:
            bb = f.read()
        init = b"#!/bin/busybox sh\n/bin/busybox echo " + MARK + \
            b"\nexec /bin/busybox sleep 100000000\n"
        cpio(self.initrd, [("bin", 0o40755, b""), ("bin/busybox", 0o100755, bb),
                           ("dev", 0o40755, b""), ("dev/console", 0o20600, (5, 1)),
                           ("init", 0o100755, init)])
        self.append = (f"console=ttyS0 quiet loglevel=1 panic=-1 tsc_early_khz={host_khz()} "
                       f"tsc=reliable no_timer_check")
        self.n = 0

    def launch(self, mem, mem_path, share, incoming=None, serial=True):
        self.n += 1
        qmp = os.path.join(self.work, f"qmp{self.n}")
        args = [QEMU, "-M", "microvm,pit=on,pic=on,rtc=on,memory-backend=mem", "-accel", "tcg",
                "-cpu", "max", "-smp", "1", "-m", f"{mem}M", "-object",
                f"memory-backend-file,id=mem,size={mem}M,mem-path={mem_path},"
                f"share={'on' if share else 'off'}",
                "-nodefaults", "-no-user-config", "-no-reboot", "-display", "none",
                "-kernel", os.path.join(KDIR, "vmlinux"), "-initrd", self.initrd,
                "-append", self.append, "-qmp", f"unix:{qmp},server=on,wait=off",
                "-serial", "stdio" if serial else "null"]
        if incoming:
            args += ["-S", "-incoming", incoming]
        p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)
        return p, Qmp(qmp, p)

    def boot(self, mem, mem_path, share):
        """launch and wait for MARK on the console: (proc, qmp, seconds)"""
        t = time.time()
        p, q = self.launch(mem, mem_path, share)
        buf = b""
        while MARK not in buf:
            b = p.stdout.read1(4096)
            if not b:
                raise SystemExit("bare QEMU exited during boot")
            buf = (buf + b)[-4096:]
        return p, q, time.time() - t


class Qmp:
    def __init__(self, path, proc):
        deadline = time.time() + 30
        while True:
            try:
                self.s = socket.socket(socket.AF_UNIX)
                self.s.connect(path)
                break
            except OSError:
                self.s.close()
                if time.time() > deadline or proc.poll() is not None:
                    raise SystemExit("bare QEMU: no QMP socket")
                time.sleep(0.002)
        self.f = self.s.makefile("rwb")
        self.f.readline()  # greeting
        self.cmd("qmp_capabilities")

    def cmd(self, name, **args):
        self.f.write(json.dumps({"execute": name, "arguments": args}).encode() + b"\n")
        self.f.flush()
        while True:
            r = json.loads(self.f.readline())
            if "return" in r:
                return r["return"]
            if "error" in r:
                raise SystemExit(f"QMP {name}: {r['error']}")

    def wait_migration(self):
        while True:
            st = self.cmd("query-migrate").get("status")
            if st == "completed":
                return
            if st in ("failed", "cancelled"):
                raise SystemExit(f"bare QEMU: migration {st}")
            time.sleep(0.001)

    def cont(self):
        while True:  # "not finalized yet" for a moment after completed
            self.f.write(b'{"execute":"cont"}\n')
            self.f.flush()
            while True:
                r = json.loads(self.f.readline())
                if "return" in r or "error" in r:
                    break
            if "return" in r:
                return
            time.sleep(0.002)


def stop_proc(p):
    p.kill()
    p.wait()


def bare_figures(n, work):
    """the same steps with QEMU on its own: {key: text}"""
    b = Bare(work)
    f = {}
    shm = tempfile.mkdtemp(prefix="cove-vmbench-bare-", dir="/dev/shm")
    try:
        # cold boot to userspace, and a template: RAM in a file, device state x-ignore-shared
        ram = os.path.join(shm, "tpl-ram")
        boots = []
        for i in range(3):
            if os.path.exists(ram):
                os.unlink(ram)
            p, q, s = b.boot(512, ram, True)
            boots.append(s)
            if i < 2:
                stop_proc(p)
        f["cold"] = f"boot to userspace {statistics.median(boots):.2f} s (median of 3)"
        state = os.path.join(work, "tpl-state")
        q.cmd("stop")
        q.cmd("migrate-set-capabilities",
              capabilities=[{"capability": "x-ignore-shared", "state": True}])
        q.cmd("migrate", uri=f"exec:cat > {state}")
        q.wait_migration()
        stop_proc(p)
        # clones: launch → running; and a QEMU already waiting in -incoming defer
        launch, waiting, pss = [], [], []
        for i in range(n):
            t = time.time()
            p, q = b.launch(512, ram, False, incoming="defer", serial=False)
            t1 = time.time()
            q.cmd("migrate-set-capabilities",
                  capabilities=[{"capability": "x-ignore-shared", "state": True}])
            q.cmd("migrate-incoming", uri=f"exec:cat {state}")
            q.wait_migration()
            q.cont()
            launch.append(time.time() - t)
            waiting.append(time.time() - t1)
            if i == n - 1:
                time.sleep(3)
                pss.append(pss_kb(p.pid))
            stop_proc(p)
        f["clone"] = f"clone launch→running {ms(launch)}"
        f["pool"] = f"clone from a waiting QEMU: restore→running {ms(waiting)}"
        f["pss"] = f"idle clone {pss[0] / 1024:.1f} MB"
        # full save and restore, 128 and 512 MB guests (private RAM, all of it migrated)
        for mem in (128, 512):
            r = os.path.join(shm, f"ram{mem}")
            p, q, _ = b.boot(mem, r, False)
            snap = os.path.join(work, f"snap{mem}")
            t = time.time()
            q.cmd("stop")
            q.cmd("migrate", uri=f"exec:cat > {snap}")
            q.wait_migration()
            save = time.time() - t
            stop_proc(p)
            size = os.path.getsize(snap)
            t = time.time()
            p, q = b.launch(mem, r, False, incoming="defer", serial=False)
            q.cmd("migrate-incoming", uri=f"exec:cat {snap}")
            q.wait_migration()
            q.cont()
            rest = time.time() - t
            stop_proc(p)
            f[f"full{mem}"] = (f"save (stop + migrate to a file) {save * 1000:.0f} ms, "
                               f"restore (launch → running) {rest * 1000:.0f} ms, "
                               f"stream {size / 1e6:.1f} MB")
            os.unlink(snap)
            if mem == 512:
                # QEMU's own live (pre-copy) migration of the same idle VM to a file: what it
                # stops the guest for (query-migrate's downtime)
                p, q, _ = b.boot(mem, r, False)
                q.cmd("migrate-set-parameters", **{"max-bandwidth": 1 << 34,
                                                   "downtime-limit": 10})
                t = time.time()
                q.cmd("migrate", uri=f"exec:cat > {snap}")
                q.wait_migration()
                live = time.time() - t
                f["live_downtime"] = q.cmd("query-migrate").get("downtime")
                stop_proc(p)
                f["rolling"] = (f"live migrate (pre-copy) to a file: guest stopped "
                                f"{f['live_downtime']} ms, whole migration {live * 1000:.0f} ms, "
                                f"stream {os.path.getsize(snap) / 1e6:.1f} MB")
                os.unlink(snap)
            os.unlink(r)
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    return f


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.environ.get("BUILD", "build"))
    ap.add_argument("--templates-dir", default=os.environ.get("COVE_TEMPLATES_DIR"))
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--no-bare", action="store_true", help="skip the QEMU-alone column")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    tdir = a.templates_dir or os.path.join(build, "test-templates")
    data = tempfile.mkdtemp(prefix="cove-vmbench-")
    cove = {}
    load0 = os.getloadavg()[0]
    try:
        # 1. no pool: template build, then clones
        d = Coved(build, data_dir=data, templates_dir=tdir, extra_args=["--pool", "0"])
        c = d.client
        t = time.time()
        sb = c.create(template="busybox", runtime="vm")
        cove["cold"] = (f"template build + first create {time.time() - t:.2f} s (mkfs, boot to "
                        f"cove-guest, device-state snapshot, clone)")
        c.remove(sb["id"], purge=True)
        xs = []
        for _ in range(a.n):
            t = time.time()
            sb = c.create(template="busybox", runtime="vm")
            xs.append(time.time() - t)
            c.remove(sb["id"], purge=True)
        cove["clone"] = f"create→ready, no pool {ms(xs)}"
        # PSS of idle VMs
        ids = [c.create(template="busybox", runtime="vm")["id"] for _ in range(5)]
        time.sleep(3)  # idle: let first-touch settle
        pss = [pss_kb(qemu_of(i)) for i in ids]
        cove["pss"] = (f"mean {statistics.mean(pss) / 1024:.1f} MB, max {max(pss) / 1024:.1f} MB "
                       f"(5 idle clones)")
        for i in ids[1:]:
            c.remove(i, purge=True)
        # what a rolling snapshot would cost: consecutive full snapshots of one idle VM
        sid = ids[0]
        stopped, new, size = [], [], []
        for _ in range(4):
            sn = c.post(f"/v1/sandboxes/{sid}/snapshots", {"label": "bench"})
            stopped.append(sn["pause_ms"])
            new.append(sn["new_bytes"] / 1e6)
            size.append(sn["size_bytes"] / 1e6)
        cove["rolling_stop"] = statistics.median(stopped)
        cove["rolling_new"] = statistics.median(new[1:]) / (statistics.median(size[1:]) or 1)
        cove["rolling"] = (f"VM stopped {statistics.median(stopped):.0f} ms (max "
                           f"{max(stopped):.0f}), new bytes stored {new[0]:.1f} MB for the "
                           f"first, then {', '.join(f'{x:.1f}' for x in new[1:])} MB")
        c.remove(sid, purge=True)
        # full snapshots, 128 and 512 MB
        for mem in (128, 512):
            t = time.time()
            sb = c.create(template="busybox", runtime="vm", memory_mb=mem)
            tb = time.time() - t
            sid = sb["id"]
            c.exec(sid, "echo warm")
            t = time.time()
            r = c.post(f"/v1/sandboxes/{sid}/pause")
            save = time.time() - t
            snap = r["snapshot"]
            t = time.time()
            c.post(f"/v1/sandboxes/{sid}/resume", {})
            c.exec(sid, "true")
            rest = time.time() - t
            cove[f"full{mem}"] = (
                f"pause (save) {save * 1000:.0f} ms, VM stopped {snap['pause_ms']:.0f} ms, "
                f"resume + first exec {rest * 1000:.0f} ms, stream {snap['size_bytes'] / 1e6:.1f} "
                f"MB, new bytes stored {snap['new_bytes'] / 1e6:.1f} MB (this shape's template "
                f"build {tb:.1f} s)")
            c.remove(sid, purge=True)
        d.stop()
        # 2. with a pool, same data dir: the template is built already
        d = Coved(build, data_dir=data, templates_dir=tdir,
                  extra_args=["--pool", "0", "--vm-pool", "2"])
        c = d.client
        xs = []
        for _ in range(a.n):
            wait_pool(d, 1)
            t = time.time()
            sb = c.create(template="busybox", runtime="vm")
            xs.append(time.time() - t)
            c.remove(sb["id"], purge=True)
        cove["pool"] = f"create→ready, from pool (--vm-pool 2) {ms(xs)}"
        d.stop()
        bare = {} if a.no_bare else bare_figures(a.n, data)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    accel = "KVM" if os.environ.get("COVE_VM_ACCEL") == "kvm" else "TCG (no usable KVM here)"
    print(f"## vm runtime ({accel}, {os.cpu_count()} CPUs, load {load0:.1f} at start, "
          f"{os.getloadavg()[0]:.1f} at end)")
    print()
    print("| figure | cove (through the API) | qemu-system-x86_64 alone |")
    print("|---|---|---|")
    rows = [("cold boot", "cold"), ("create→ready, no pool", "clone"),
            ("create→ready, from pool", "pool"), ("full snapshot, 128 MB guest", "full128"),
            ("full snapshot, 512 MB guest", "full512"),
            ("4 consecutive full snapshots of one idle 512 MB VM (the cost of a rolling one)",
             "rolling"),
            ("host memory per idle VM (PSS)", "pss")]
    for name, k in rows:
        print(f"| {name} | {cove.get(k, '')} | {bare.get(k, '')} |")
    if "rolling_stop" in cove:
        print()
        print("| goal | figure | goal | result |")
        print("|---|---|---|---|")
        st = cove["rolling_stop"]
        print(f"| a rolling snapshot stops the VM (median of 4) | {st:.0f} ms | ≤ 20 ms "
              f"(QEMU alone: {bare.get('live_downtime', '?')} ms) | "
              f"{'PASS' if st <= 20 else 'FAIL'} |")
        nb = cove["rolling_new"] * 100
        print(f"| next snapshot of the idle VM adds (new bytes / its size) | {nb:.0f}% | "
              f"≤ 5% | {'PASS' if nb <= 5 else 'FAIL'} |")


if __name__ == "__main__":
    main()
