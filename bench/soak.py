#!/usr/bin/env python3
"""The soak (`make soak`, docs/benchmarks.md "Soak"): N busybox sandboxes (default 200) kept
busy for a while (default 10 minutes) by client threads, each on its own keep-alive
connection, cycling over its share of the sandboxes:

  - PUT a file of random bytes (1–64 KiB) through the files API, GET it back, compare;
  - exec a shell loop that writes, appends and reads files inside the sandbox and prints its
    md5sum, compared with the one computed here;
  - exec `true` with wait.

Every minute it prints coved's RSS, open fds and threads, the operations done and the errors.
It fails (exit 1) on any error, when coved's RSS grows past --rss-growth-mib or its fds past
--fd-growth from the first minute's sample to the last, or when a loop device, mount or
cgroup of its sandboxes is left after they are deleted and coved stopped (counted before and
after). Timings are printed, never judged.

    bench/soak.py --build build [--sandboxes 200] [--minutes 10] [--threads 8]"""
import hashlib
import json
import os
import random
import sys
import threading
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench import KA, log  # noqa: E402
from benchlib import loadavg, pct  # noqa: E402
import fleet  # noqa: E402
import hostcount as hc  # noqa: E402

KEPT_FINISHED = 64  # coved keeps this many finished processes per sandbox (docs/api.md)
SHELL_LOOP = ("i=0; : > /tmp/soak; while [ $i -lt 20 ]; do echo \"$i {tag}\" >> /tmp/soak; "
              "i=$((i+1)); done; cp /tmp/soak /root/soak.copy; md5sum < /root/soak.copy")


def expected_sum(tag):
    """md5sum of the file SHELL_LOOP writes, as busybox md5sum prints it for stdin."""
    data = "".join(f"{i} {tag}\n" for i in range(20)).encode()
    return f"{hashlib.md5(data).hexdigest()}  -"


class Soak(fleet.Fleet):
    def __init__(self, a):
        super().__init__(a)
        self.lock = threading.Lock()
        self.errors = []
        self.ops = {"put": 0, "get": 0, "exec_loop": 0, "exec_true": 0}
        self.lat = {k: [] for k in self.ops}
        self.stop = threading.Event()
        self.minutes = []
        self.execs = {}  # sandbox id -> execs done
        self.phase = "warm-up"

    def err(self, what):
        with self.lock:
            self.errors.append(f"{time.strftime('%H:%M:%S')} {what}"[:400])
            if len(self.errors) >= self.a.max_errors:
                self.stop.set()

    def count(self, op, ms, sid=None):
        with self.lock:
            self.ops[op] += 1
            if sid is not None:
                self.execs[sid] = self.execs.get(sid, 0) + 1
            if len(self.lat[op]) < 200000:
                self.lat[op].append(ms)

    def one_round(self, ka, sid, rnd):
        # 1. file write + read back through the API
        body = rnd.randbytes(rnd.randint(1024, 65536))
        path = f"/root/f{rnd.randint(0, 3)}"
        t0 = time.perf_counter()
        st, b = self.put(ka, sid, path, body)
        if st != 200:
            return self.err(f"PUT {sid}{path}: {st} {b[:200]!r}")
        self.count("put", (time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        st, got = ka.req("GET", f"/v1/sandboxes/{sid}/files?path={path}")
        if st != 200 or got != body:
            return self.err(f"GET {sid}{path}: {st}, {len(got)} bytes, "
                            f"{'same' if got == body else 'different'} content")
        self.count("get", (time.perf_counter() - t0) * 1e3)
        # 2. an exec loop writing files inside
        tag = f"{zlib.crc32(body):08x}"
        t0 = time.perf_counter()
        st, b = ka.req("POST", f"/v1/sandboxes/{sid}/exec",
                       {"shell": SHELL_LOOP.format(tag=tag), "wait": True})
        try:
            j = json.loads(b)
        except ValueError:
            j = {}
        want = expected_sum(tag)
        if st != 200 or j.get("exit_code") != 0 or (j.get("stdout") or "").strip() != want:
            return self.err(f"exec loop {sid}: {st} {b[:300]!r} (want stdout {want})")
        self.count("exec_loop", (time.perf_counter() - t0) * 1e3, sid)
        # 3. a bare exec
        t0 = time.perf_counter()
        st, b = ka.req("POST", f"/v1/sandboxes/{sid}/exec", {"cmd": ["true"], "wait": True})
        if st != 200 or b'"exit_code":0' not in b.replace(b" ", b""):
            return self.err(f"exec true {sid}: {st} {b[:200]!r}")
        self.count("exec_true", (time.perf_counter() - t0) * 1e3, sid)

    @staticmethod
    def put(ka, sid, path, body):
        c = ka._conn()
        try:
            c.request("PUT", f"/v1/sandboxes/{sid}/files?path={path}&mode=0644", body=body,
                      headers={"Authorization": f"Bearer {ka.key}",
                               "Content-Type": "application/octet-stream"})
            r = c.getresponse()
            return r.status, r.read()
        except Exception:
            ka.close()
            raise

    def worker(self, i, ids):
        ka = KA(self.b.port, self.b.key)
        rnd = random.Random(i)
        try:
            while not self.stop.is_set():
                for sid in ids:
                    if self.stop.is_set():
                        break
                    try:
                        self.one_round(ka, sid, rnd)
                    except Exception as e:
                        ka.close()
                        self.err(f"{sid}: {type(e).__name__}: {e}")
        finally:
            ka.close()

    def settled(self, timeout_s=60):
        """coved's counts once its fds and the data dir's loop devices stopped changing for
        2 s (the warm pool refills and deleted sandboxes are cleaned in the background)."""
        pid, data = self.b.d.proc.pid, self.b.d.data
        deadline = time.monotonic() + timeout_s
        prev, same_since = None, time.monotonic()
        while True:
            c = hc.coved_counts(pid)
            key = (c["fds"], hc.loops_under(data))
            if key != prev:
                prev, same_since = key, time.monotonic()
            elif time.monotonic() - same_since >= 2 or time.monotonic() > deadline:
                return c
            time.sleep(0.2)

    def sample(self, minute):
        c = hc.coved_counts(self.b.d.proc.pid)
        with self.lock:
            least = min((self.execs.get(i, 0) for i in self.ids), default=0)
            s = {"minute": minute, "phase": self.phase, "least_execs": least, **c,
                 "ops": dict(self.ops), "errors": len(self.errors),
                 "load": loadavg(), "mem_available": hc.meminfo("MemAvailable")}
        self.minutes.append(s)
        log(f"{self.phase} minute {minute}: coved RSS {c['rss'] / 2**20:.1f} MiB, {c['fds']} fds, "
            f"{c['threads']} threads; ops {sum(s['ops'].values())} "
            f"({', '.join(f'{k} {v}' for k, v in s['ops'].items())}); errors {s['errors']}; "
            f"load {s['load']}; fewest execs in one sandbox {least}")

    def run(self):
        a, b = self.a, self.b
        self.res["host_loops_before"] = hc.loops_total()
        b.start()
        b.delete(b.create()["id"])  # warm: template, golden image, the pool refilled after
        self.res["start"] = self.settled()
        ids = []
        t0 = time.perf_counter()
        for _ in range(a.sandboxes):
            ids.append(b.create()["id"])
        self.ids = list(ids)
        self.res["create_s"] = time.perf_counter() - t0
        self.res["after_create"] = {**hc.coved_counts(b.d.proc.pid),
                                    "loops": hc.loops_under(b.d.data),
                                    "mounts": hc.mounts_under(b.d.data),
                                    "cgroups": hc.cgroups_of(ids)}
        log(f"{len(ids)} sandboxes in {self.res['create_s']:.1f} s: "
            f"{self.res['after_create']}")
        self.sample(0)
        shares = [ids[i::a.threads] for i in range(a.threads)]
        ts = [threading.Thread(target=self.worker, args=(i, s), daemon=True)
              for i, s in enumerate(shares)]
        self.t_work0 = time.monotonic()
        [t.start() for t in ts]
        # Warm-up: coved keeps the last KEPT_FINISHED finished processes of every sandbox
        # (with their events) for reconnects, so its RSS grows by design until each sandbox
        # has run that many; the soak's minutes (and the flatness check) start after.
        wdeadline = time.monotonic() + a.warmup_max_minutes * 60
        minute = 0
        while not self.stop.is_set() and time.monotonic() < wdeadline:
            with self.lock:
                least = min(self.execs.get(i, 0) for i in ids)
            if least > KEPT_FINISHED:
                break
            self.stop.wait(min(5.0, max(0.0, wdeadline - time.monotonic())))
            if time.monotonic() >= (minute + 1) * 60 + self.t_work0:
                minute += 1
                self.sample(minute)
        with self.lock:
            least = min(self.execs.get(i, 0) for i in ids)
        if least <= KEPT_FINISHED and not self.stop.is_set():
            self.err(f"warm-up: after {a.warmup_max_minutes} min a sandbox had run only "
                     f"{least} execs (the retention of {KEPT_FINISHED} finished processes is "
                     f"not full: RSS flatness cannot be judged)")
        self.res["warmup_s"] = time.monotonic() - self.t_work0
        self.phase = "soak"
        self.sample(0)
        end = time.monotonic() + a.minutes * 60
        minute = 0
        while not self.stop.is_set():
            left = end - time.monotonic()
            if left <= 0:
                break
            self.stop.wait(min(60.0, left))
            if self.stop.is_set():
                break
            minute += 1
            self.sample(minute)
        self.stop.set()
        [t.join(120) for t in ts]
        self.res["workers_stuck"] = sum(1 for t in ts if t.is_alive())
        if not self.minutes or self.minutes[-1]["minute"] != minute or minute == 0:
            minute += 1
            self.sample(minute)  # the run's end (a shorter last minute, or a stop on errors)
        b.delete_all()
        self.res["after_delete"] = {**self.settled(),
                                    "loops": hc.loops_under(b.d.data),
                                    "mounts": hc.mounts_under(b.d.data),
                                    "cgroups": hc.cgroups_of(ids)}

    def interrupted(self):
        self.err("interrupted")
        return True

    def stopping(self):
        self.stop.set()

    def verdict(self):
        a, r, m = self.a, self.res, self.minutes
        fails = []
        if self.errors:
            fails.append(f"{len(self.errors)} errors, first: {self.errors[0]}")
        if r.get("workers_stuck"):
            fails.append(f"{r['workers_stuck']} client threads did not stop within 120 s")
        # growth from the soak's start (retention full) to its last sample
        sm = [x for x in m if x.get("phase") == "soak"]
        ref = sm[0] if sm else None
        last = sm[-1] if len(sm) > 1 else None
        if ref and last:
            grow = last["rss"] - ref["rss"]
            if grow > a.rss_growth_mib * 2**20:
                fails.append(f"coved RSS grew {grow / 2**20:.1f} MiB (bound "
                             f"{a.rss_growth_mib} MiB) from minute {ref['minute']} to "
                             f"{last['minute']}")
            if last["fds"] - ref["fds"] > a.fd_growth:
                fails.append(f"coved fds grew {ref['fds']} → {last['fds']} (bound "
                             f"+{a.fd_growth})")
        ad = r.get("after_delete")
        if ad and ad["fds"] > r["start"]["fds"] + a.fd_growth:
            fails.append(f"coved holds {ad['fds']} fds after every sandbox was deleted "
                         f"({r['start']['fds']} at start)")
        left = r.get("left")
        if left and (left["loops"] or left["mounts"] or left["cgroups"]):
            fails.append(f"left after delete + stop: {left['loops']} loop devices, "
                         f"{left['mounts']} mounts, {left['cgroups']} cgroups")
        if not left:
            fails.append("coved did not stop cleanly (nothing counted after)")
        return fails

    def report(self, load0, load1, fails):
        r, m = self.res, self.minutes
        ops = sum(self.ops.values())
        lines = [f"cove soak, {r['date']}, {r['machine']}; load average before / after: "
                 f"{load0} / {load1}; {self.a.sandboxes} sandboxes, {self.a.threads} client "
                 f"threads, {self.a.minutes} min", "",
                 "| phase | minute | coved RSS MiB | fds | threads | ops so far | errors | load |",
                 "|---|---|---|---|---|---|---|---|"]
        for s in m:
            lines.append(f"| {s.get('phase')} | {s['minute']} | {s['rss'] / 2**20:.1f} | {s['fds']} | "
                         f"{s['threads']} | {sum(s['ops'].values())} | {s['errors']} | "
                         f"{s['load']} |")
        lines += ["", "| operation | count | p50 ms | p99 ms |", "|---|---|---|---|"]
        for k, xs in self.lat.items():
            if xs:
                lines.append(f"| {k} | {self.ops[k]} | {pct(xs, 50):.2f} | {pct(xs, 99):.2f} |")
        st, ac, ad, left = r.get("start"), r.get("after_create"), r.get("after_delete"), \
            r.get("left")
        lines += [""]
        if st and ac:
            lines.append(f"- coved at start: RSS {st['rss'] / 2**20:.1f} MiB, {st['fds']} fds; "
                         f"with {self.a.sandboxes} alive: {ac['loops']} loop devices, "
                         f"{ac['mounts']} mounts, {ac['cgroups']} cgroups "
                         f"({r['create_s']:.1f} s to create them)")
        if ad:
            lines.append(f"- after deleting them: coved RSS {ad['rss'] / 2**20:.1f} MiB, "
                         f"{ad['fds']} fds, {ad['loops']} loop devices, {ad['mounts']} "
                         f"mounts, {ad['cgroups']} cgroups")
        if left:
            lines.append(f"- after coved stopped: {left['loops']} loop devices, "
                         f"{left['mounts']} mounts, {left['cgroups']} cgroups of the run left; "
                         f"host loop devices bound {r['host_loops_before']} before, "
                         f"{left['host_loops_after']} after (other users included)")
        if "warmup_s" in r:
            lines.append(f"- warm-up (until every sandbox ran more than {KEPT_FINISHED} execs, "
                         f"the finished processes coved keeps per sandbox): "
                         f"{r['warmup_s']:.0f} s; the soak's minutes and its RSS and fd "
                         f"checks start after it")
        lines.append(f"- {ops} operations, {len(self.errors)} errors"
                     + (": " + "; ".join(self.errors[:5]) if self.errors else ""))
        lines.append("")
        lines.append("RESULT: " + ("PASS" if not fails else "FAIL: " + "; ".join(fails)))
        return "\n".join(lines) + "\n"


def main():
    ap = fleet.parser()
    ap.add_argument("--sandboxes", type=int, default=200)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--rss-growth-mib", type=float, default=16,
                    help="fail when coved's RSS grows more from minute 1 to the end")
    ap.add_argument("--fd-growth", type=int, default=8,
                    help="fail when coved's fd count grows more from minute 1 to the end")
    ap.add_argument("--max-errors", type=int, default=50, help="stop early after this many")
    ap.add_argument("--warmup-max-minutes", type=float, default=20,
                    help="longest warm-up (until every sandbox ran more execs than coved "
                         "keeps finished processes)")
    a = ap.parse_args()
    fleet.setup(a, "soak")
    s = Soak(a)
    load0, load1 = s.main_run()
    fails = s.verdict()
    fleet.write(a, "soak", s.report(load0, load1, fails),
                {**s.res, "minutes": s.minutes, "errors": s.errors, "ops": s.ops,
                 "verdict": "PASS" if not fails else "FAIL", "fails": fails})
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
