#!/usr/bin/env python3
"""Density (`make bench-density`, docs/benchmarks.md "Density"): how many idle busybox
sandboxes (default shape: its 1 GiB disk limit on a loop device each) one coved keeps alive,
and what each costs.

    bench/density.py --build build [--target 5000] [--checkpoints 1000,2000,5000]
                     [--min-avail-gib 4] [--threads 2] [--samples 40]

Ramps up with a few client threads, never past --target, and stops early at the first failed
create (its error message is printed: that is the limit this host or coved hit) or when
MemAvailable falls under --min-avail-gib (the machine is shared). At each checkpoint it takes
--samples sequential create→ready (POST + exec true) timings while that many sandboxes stay
alive (each sample sandbox is deleted again), and prints MemAvailable and coved's RSS, fds and
threads. At the end every sandbox is deleted, coved stopped and the host counted again: loop
devices, mounts and cgroups left behind are reported. Prints a markdown table; writes
OUT/density.md and density.json."""
import json
import os
import resource
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench  # noqa: E402
from bench import KA, exec_true, log, summary  # noqa: E402
from benchlib import loadavg, pct  # noqa: E402
import fleet  # noqa: E402
import hostcount as hc  # noqa: E402


def host_limits():
    """The host settings that bound density, as read now (printed with the result)."""
    def rd(p):
        try:
            with open(p) as f:
                return f.read().strip()
        except OSError:
            return "?"
    return {
        "loop.max_loop": rd("/sys/module/loop/parameters/max_loop"),
        "loop.max_part": rd("/sys/module/loop/parameters/max_part"),
        "fs.inotify.max_user_instances": rd("/proc/sys/fs/inotify/max_user_instances"),
        "fs.inotify.max_user_watches": rd("/proc/sys/fs/inotify/max_user_watches"),
        "kernel.pid_max": rd("/proc/sys/kernel/pid_max"),
        "kernel.threads-max": rd("/proc/sys/kernel/threads-max"),
        "fs.file-max": rd("/proc/sys/fs/file-max"),
        "fs.nr_open": rd("/proc/sys/fs/nr_open"),
        "fs.mount-max": rd("/proc/sys/fs/mount-max"),
        "user.max_user_namespaces": rd("/proc/sys/user/max_user_namespaces"),
        "user.max_net_namespaces": rd("/proc/sys/user/max_net_namespaces"),
        "user.max_mnt_namespaces": rd("/proc/sys/user/max_mnt_namespaces"),
        "fs.aio-max-nr": rd("/proc/sys/fs/aio-max-nr"),
        "vm.max_map_count": rd("/proc/sys/vm/max_map_count"),
        "net.core.somaxconn": rd("/proc/sys/net/core/somaxconn"),
        "bench NOFILE soft/hard": "/".join(str(x) for x in
                                           resource.getrlimit(resource.RLIMIT_NOFILE)),
    }


class Density(fleet.Fleet):
    def __init__(self, a):
        super().__init__(a)
        self.res.update({"target": a.target, "checkpoints": {}, "steps": []})
        self.lock = threading.Lock()
        self.stop_reason = None

    def snapshot(self, n):
        d = self.b.d
        c = hc.coved_counts(d.proc.pid)
        s = {"alive": n, "mem_available": hc.meminfo("MemAvailable"), "coved_rss": c["rss"],
             "coved_fds": c["fds"], "coved_threads": c["threads"],
             "loops": hc.loops_under(d.data), "mounts": hc.mounts_under(d.data),
             "load": loadavg(), "t": time.time(),
             "kernel": {k: hc.meminfo(k) for k in ("Slab", "SUnreclaim", "KernelStack",
                                                  "PageTables", "Shmem", "Buffers")}}
        return s

    def ramp_to(self, goal):
        """Creates sandboxes until goal are alive or a stop condition hits."""
        b, a = self.b, self.a
        floor = a.min_avail_gib * 2**30

        def worker():
            ka = KA(b.port, b.key)
            try:
                while True:
                    with self.lock:
                        if self.stop_reason or len(b.live) + self.inflight >= goal:
                            return
                        self.inflight += 1
                    try:
                        b.create(ka)
                    except Exception as e:
                        with self.lock:
                            if not self.stop_reason:
                                self.stop_reason = (f"create #{len(b.live) + 1} failed: "
                                                    f"{str(e)[:400]}")
                        return
                    finally:
                        with self.lock:
                            self.inflight -= 1
                    if time.monotonic() > self.deadline:
                        with self.lock:
                            self.stop_reason = (f"the bench's time bound ({a.max_minutes} min) "
                                                f"at {len(b.live)} alive")
                        return
                    if len(b.live) % 50 == 0 and hc.meminfo("MemAvailable") < floor:
                        with self.lock:
                            self.stop_reason = (f"MemAvailable under {a.min_avail_gib} GiB at "
                                                f"{len(b.live)} alive (the bench's own bound)")
                        return
            finally:
                ka.close()

        self.inflight = 0
        ts = [threading.Thread(target=worker) for _ in range(self.a.threads)]
        [t.start() for t in ts]
        [t.join() for t in ts]

    def sample(self):
        """--samples sequential create→ready (POST + exec true) with the others alive."""
        b = self.b
        ready, errs = [], []
        for _ in range(self.a.samples):
            t0 = time.perf_counter()
            try:
                sb = b.create()
                exec_true(b.ka, sb["id"])
            except Exception as e:
                errs.append(str(e)[:300])
                break
            ready.append((time.perf_counter() - t0) * 1e3)
            b.delete(sb["id"])
        return ready, errs

    def run(self):
        a, b = self.a, self.b
        self.deadline = time.monotonic() + a.max_minutes * 60
        self.res["limits"] = host_limits()
        self.res["body"] = bench.create_body()
        self.res["host_loops_before"] = hc.loops_total()
        b.start()
        d = b.d
        self.res["coved_nofile"] = open(f"/proc/{d.proc.pid}/limits").read().split(
            "Max open files")[1].split("\n")[0].split()[:2]
        exec_true(b.ka, b.create()["id"])  # warm: template, golden image
        b.delete_all()
        time.sleep(1)
        base = self.snapshot(0)
        self.res["base"] = base
        log(f"base: MemAvailable {base['mem_available'] / 2**30:.2f} GiB, coved RSS "
            f"{base['coved_rss'] / 2**20:.1f} MiB, {base['coved_fds']} fds")
        r0, _ = self.sample()
        self.res["checkpoints"][0] = {"ready": summary(r0) if r0 else None, **self.snapshot(0)}
        steps = sorted(set(list(range(a.step, a.target, a.step)) + a.checkpoints + [a.target]))
        steps = [s for s in steps if s <= a.target]
        t0 = time.perf_counter()
        for goal in steps:
            self.ramp_to(goal)
            n = len(b.live)
            s = self.snapshot(n)
            s["elapsed_s"] = time.perf_counter() - t0
            self.res["steps"].append(s)
            per = (base["mem_available"] - s["mem_available"]) / max(1, n) / 2**20
            log(f"{n} alive after {s['elapsed_s']:.0f} s: MemAvailable "
                f"{s['mem_available'] / 2**30:.2f} GiB ({per:.3f} MiB/sandbox), coved RSS "
                f"{s['coved_rss'] / 2**20:.1f} MiB, {s['coved_fds']} fds, {s['coved_threads']} "
                f"threads, {s['loops']} loops, {s['mounts']} mounts, load {s['load']}")
            if goal in a.checkpoints or (self.stop_reason and n > 0):
                ready, errs = self.sample()
                self.res["checkpoints"][n] = {"ready": summary(ready) if ready else None,
                                              "errors": errs, **s}
                if ready:
                    log(f"  create→ready at {n} alive: p50 {pct(ready, 50):.2f} ms, p90 "
                        f"{pct(ready, 90):.2f} ms")
                if errs and not self.stop_reason:
                    self.stop_reason = f"create at {n} alive failed: {errs[0]}"
            if self.stop_reason:
                log(f"stopped: {self.stop_reason}")
                break
        self.res["alive_max"] = max([s["alive"] for s in self.res["steps"]] or [0])
        self.res["stop_reason"] = self.stop_reason
        time.sleep(2)  # idle settle, then the figure
        self.res["settled"] = self.snapshot(len(b.live))
        ids = list(b.live)
        t = b.delete_all() or 0.0
        self.res["delete_all_s"] = t
        self.res["delete_all_n"] = len(ids)
        log(f"deleted {len(ids)} in {t:.1f} s")
        time.sleep(1)
        self.res["after_delete"] = self.snapshot(0)
        self.res["ids"] = len(ids)
        self.ids = ids

    def interrupted(self):
        self.stop_reason = self.stop_reason or "interrupted"
        self.res["stop_reason"] = self.stop_reason
        return False

    def stopping(self):
        self.stop_reason = self.stop_reason or "stopping"  # the ramp's threads stop creating

    def report(self, load0, load1):
        r = self.res
        rows = []

        def row(what, value, goal, ok, comp=""):
            rows.append((what, value, goal, "—" if ok is None else ("PASS" if ok else "FAIL"),
                         comp))

        base, st = r.get("base"), r.get("settled")
        n = r.get("alive_max", 0)
        if base and st and st["alive"]:
            per = (base["mem_available"] - st["mem_available"]) / st["alive"] / 2**20
            row(f"idle busybox sandboxes alive at once (of {r['target']})", f"{st['alive']}",
                "≥ 5,000", st["alive"] >= 5000,
                f"stopped: {r['stop_reason'] or 'target reached'}")
            row(f"MemAvailable per idle sandbox, {st['alive']} alive (MiB)", f"{per:.3f}",
                "≤ 1", per <= 1,
                f"MemAvailable {base['mem_available'] / 2**30:.2f} → "
                f"{st['mem_available'] / 2**30:.2f} GiB; coved RSS "
                f"{base['coved_rss'] / 2**20:.0f} → {st['coved_rss'] / 2**20:.0f} MiB, fds "
                f"{base['coved_fds']} → {st['coved_fds']}, threads {base['coved_threads']} → "
                f"{st['coved_threads']}; {st['loops']} loop devices, {st['mounts']} mounts "
                f"(machine shared: others' use moves this)")
            kb, ks = base.get("kernel"), st.get("kernel")
            if kb and ks:
                row(f"kernel memory per idle sandbox, {st['alive']} alive (KiB)",
                    ", ".join(f"{k} {(ks[k] - kb[k]) / st['alive'] / 1024:.0f}" for k in kb),
                    "(info)", None, "growth of /proc/meminfo fields over the ramp / alive")
        c0 = r["checkpoints"].get(0)
        for k in sorted(k for k in r["checkpoints"] if k):
            cp = r["checkpoints"][k]
            if not cp.get("ready"):
                row(f"create→ready with {k} alive", "—", "p50 ≤ 5", False,
                    "; ".join(cp.get("errors") or []))
                continue
            rd = cp["ready"]
            comp = (f"with 0 alive, same run: p50 {c0['ready']['p50']:.2f} / p90 "
                    f"{c0['ready']['p90']:.2f}" if c0 and c0.get("ready") else "")
            row(f"create→ready ms with {k} alive, {rd['n']} sequential (p50 / p90)",
                f"{rd['p50']:.2f} / {rd['p90']:.2f}", "p50 ≤ 5, p90 ≤ 5",
                rd["p50"] <= 5 and rd["p90"] <= 5, comp + f"; load {cp['load']}")
        if r.get("delete_all_n"):
            row(f"delete all {r['delete_all_n']} (2 connections) s", f"{r['delete_all_s']:.1f}",
                "(info)", None, f"{r['delete_all_s'] * 1e3 / r['delete_all_n']:.2f} ms each")
        left = r.get("left")
        if left:
            row("left after delete + stop (loop devices / mounts / cgroups)",
                f"{left['loops']} / {left['mounts']} / {left['cgroups']}", "0 / 0 / 0",
                left["loops"] == 0 and left["mounts"] == 0 and left["cgroups"] == 0,
                f"host loop devices bound: {r['host_loops_before']} before, "
                f"{left['host_loops_after']} after (other users included)")
        out = ["| measure | value | goal | pass | comparison / detail |", "|---|---|---|---|---|"]
        out += [f"| {a} | {b} | {g} | {p} | {d} |" for a, b, g, p, d in rows]
        head = (f"cove density, {r['date']}, {r['machine']}; load average before / after: "
                f"{load0} / {load1}; coved NOFILE {'/'.join(r.get('coved_nofile') or [])}; "
                f"create body {json.dumps(r.get('body'))}")
        steps = ["| alive | MemAvailable GiB | MiB/sandbox | coved RSS MiB | fds | threads | "
                 "loops | mounts | load |", "|---|---|---|---|---|---|---|---|---|"]
        for s in r["steps"]:
            per = (base["mem_available"] - s["mem_available"]) / max(1, s["alive"]) / 2**20
            steps.append(f"| {s['alive']} | {s['mem_available'] / 2**30:.2f} | {per:.3f} | "
                         f"{s['coved_rss'] / 2**20:.0f} | {s['coved_fds']} | "
                         f"{s['coved_threads']} | {s['loops']} | {s['mounts']} | {s['load']} |")
        lim = "Host limits read at start: " + ", ".join(f"{k}={v}" for k, v in
                                                          r["limits"].items())
        return "\n".join([head, ""] + out + ["", "Ramp:", ""] + steps + ["", lim]) + "\n"


def main():
    ap = fleet.parser()
    ap.add_argument("--target", type=int, default=5000)
    ap.add_argument("--step", type=int, default=250, help="print the counters every N alive")
    ap.add_argument("--checkpoints", type=lambda s: [int(x) for x in s.split(",") if x],
                    default=[1000, 2000, 5000])
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2, help="client threads that create")
    ap.add_argument("--min-avail-gib", type=float, default=4.0)
    ap.add_argument("--max-minutes", type=float, default=30, help="stop ramping after this")
    ap.add_argument("--snapshot-interval", type=int, default=None,
                    help="snapshot_interval_s of every sandbox (default: the API's, 60)")
    a = ap.parse_args()
    if a.snapshot_interval is not None:
        body = bench.create_body()
        body["snapshot_interval_s"] = a.snapshot_interval
        bench.create_body = lambda: dict(body)
    fleet.setup(a, "density")
    d = Density(a)
    load0, load1 = d.main_run()
    fleet.write(a, "density", d.report(load0, load1), d.res)


if __name__ == "__main__":
    main()
