"""A coved with a fleet of busybox sandboxes, the part bench/density.py and bench/soak.py
share: their common flags, the setup they need (root, a high NOFILE limit), one coved
(bench.Bench), the run under SIGTERM/SIGHUP with the load printed before and after, the
count of what the fleet left on the host once coved stopped, and the NAME.md / NAME.json
they write."""
import argparse
import datetime
import json
import os
import resource
import signal
import sys

from bench import Bench, machine
from benchlib import loadavg
import hostcount as hc


def parser():
    """The flags every fleet bench takes (--build, --out, --templates, --pool)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default=None)
    ap.add_argument("--templates", default=None)
    ap.add_argument("--pool", type=int, default=4)
    return ap


def setup(a, name):
    """Fills the default --out and --templates, checks root, lifts NOFILE (the bench's own
    client sockets: a few per thread, but be generous)."""
    a.out = a.out or os.path.join(a.build, "bench")
    os.makedirs(a.out, exist_ok=True)
    a.templates = a.templates or os.environ.get("COVE_TEMPLATES_DIR") or os.path.join(
        a.build, "test-templates")
    if os.geteuid() != 0:
        sys.exit(f"{name}: must run as root (coved's ns runtime needs it)")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Fleet:
    """Subclasses fill run(); self.ids are the sandboxes whose cgroups must be gone after."""

    def __init__(self, a):
        self.a = a
        self.b = Bench(argparse.Namespace(build=a.build, out=a.out, templates=a.templates,
                                          pool=a.pool))
        self.res = {}
        self.ids = []

    def run(self):
        raise NotImplementedError

    def interrupted(self):
        """On SIGINT/SIGTERM/SIGHUP during run(): True to report what was measured, False
        to stop with the exception."""
        return False

    def stopping(self):
        """Before coved is stopped, whatever run() did: stop the client threads."""

    def finish(self):
        """Stops coved and counts the loop devices, mounts and cgroups the fleet left."""
        data = self.b.d.data if self.b.d else None
        self.b.stop()
        if data:
            self.res["left"] = {"loops": hc.loops_under(data), "mounts": hc.mounts_under(data),
                                "cgroups": hc.cgroups_of(self.ids),
                                "host_loops_after": hc.loops_total()}

    def main_run(self):
        """run() then finish(), under signals; returns the load average before and after."""
        def bail(signum, frame):
            raise KeyboardInterrupt

        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, bail)
        load0 = loadavg()
        self.res["date"] = datetime.datetime.now(datetime.timezone.utc).strftime(
            "%Y-%m-%d %H:%M UTC")
        self.res["machine"] = machine()
        try:
            self.run()
        except KeyboardInterrupt:
            if not self.interrupted():
                raise
        finally:
            self.stopping()
            self.finish()
        return load0, loadavg()


def write(a, name, md, data):
    """OUT/NAME.md and OUT/NAME.json, and the markdown on stdout."""
    with open(os.path.join(a.out, f"{name}.md"), "w") as f:
        f.write(md)
    with open(os.path.join(a.out, f"{name}.json"), "w") as f:
        json.dump(data, f, indent=1, default=str)
    print(md)
