"""A throwaway PostgreSQL server for tests and benchmarks, all under its own directory.

    with PgServer() as pg:          # initdb + start; stop and remove everything on exit
        pg.url                      # postgres://postgres:PW@127.0.0.1:PORT/postgres
        pg.create_db("x")           # → URL of a new database
        pg.stop_server(); pg.start_server()   # a restart, data kept

As root the server runs as the OS user `postgres` (the directory is handed to it); as any
other user it runs as that user. It listens on 127.0.0.1 only (scram password over TCP,
trust on its own unix socket in the directory), on a port below 32768 found free by a
probe (ports in the ephemeral range can be held by outgoing connections). fsync stays on;
dynamic shared memory lives in the directory, not /dev/shm. Every wait is bounded, and a
failed start keeps the log path in its error. Also a command line, for shell users:
    python3 tests/lib/pgserver.py start DIR   → prints the URL (server keeps running)
    python3 tests/lib/pgserver.py stop DIR
"""
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from cove import free_port

PG_BIN = os.environ.get("COVE_PG_BIN", "/usr/lib/postgresql/15/bin")
WAIT_S = 90
MARK = ".cove-pgserver"


def available():
    """'' when a server can be started here, else the reason."""
    if not os.path.exists(os.path.join(PG_BIN, "initdb")):
        return f"{PG_BIN}/initdb not found (apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "no 'postgres' OS user to run the server as (apt-get install postgresql)"
    return ""


class PgServer:
    def __init__(self, base=None, port=None, listen=(), hba=()):
        """listen: more local addresses to listen on besides 127.0.0.1 (e.g. a test
        bridge's, for clients in network namespaces); hba: networks (CIDR) allowed to log in
        over TCP with the password besides 127.0.0.1/32."""
        self.base = base
        self.port = port
        self.listen = tuple(listen)
        self.hba = tuple(hba)
        self.dir = None
        self.password = secrets.token_hex(12)
        self.pid = None

    # --- as the cluster's owner
    def _as_owner(self, argv, **kw):
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--"] + argv
        return subprocess.run(argv, cwd=self.dir, capture_output=True, text=True,
                              timeout=WAIT_S + 30, **kw)

    @property
    def data(self):
        return os.path.join(self.dir, "data")

    @property
    def log(self):
        return os.path.join(self.dir, "postgres.log")

    @property
    def url(self):
        return self.url_of("postgres")

    def url_of(self, db, host="127.0.0.1"):
        return f"postgres://postgres:{self.password}@{host}:{self.port}/{db}"

    def start(self):
        why = available()
        if why:
            raise RuntimeError(why)
        # short: the unix socket path must fit in 107 bytes
        self.dir = tempfile.mkdtemp(prefix="cove-pg-", dir=self.base or "/tmp")
        os.chmod(self.dir, 0o700)
        open(os.path.join(self.dir, MARK), "w").close()
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        pwfile = os.path.join(self.dir, "pwfile")
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, (self.password + "\n").encode())
        os.close(fd)
        if os.geteuid() == 0:
            os.chown(pwfile, pw.pw_uid, pw.pw_gid)
        try:
            r = self._as_owner([os.path.join(PG_BIN, "initdb"), "-D", self.data, "-U", "postgres",
                                f"--pwfile={pwfile}", "-A", "trust",
                                "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C",
                                "--no-sync", "--no-instructions"])
        finally:
            os.unlink(pwfile)
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed: {r.stderr.strip()[-400:]} (dir {self.dir})")
        with open(os.path.join(self.data, "pg_hba.conf"), "w") as f:
            f.write("local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n")
            for net in self.hba:
                f.write(f"host all all {net} scram-sha-256\n")
        for attempt in range(5):
            self.port = self.port or free_port()
            with open(os.path.join(self.data, "postgresql.auto.conf"), "w") as f:
                addrs = ",".join(("127.0.0.1",) + self.listen)
                f.write(f"listen_addresses = '{addrs}'\nport = {self.port}\n"
                        f"unix_socket_directories = '{self.dir}'\nfsync = on\n"
                        "dynamic_shared_memory_type = mmap\nlogging_collector = off\n"
                        "max_connections = 100\n")
            try:
                self.start_server()
                return self
            except RuntimeError:
                if "could not bind" not in self._log_tail() or attempt == 4:
                    raise
                self.port = None  # someone took the port between probe and bind
        return self

    def _log_tail(self):
        try:
            with open(self.log) as f:
                return f.read()[-2000:]
        except OSError:
            return ""

    def start_server(self):
        """Start (again) the server on its data dir; bounded by WAIT_S."""
        r = self._as_owner([os.path.join(PG_BIN, "pg_ctl"), "-D", self.data, "-l", self.log,
                            "-w", "-t", str(WAIT_S), "-s", "start"])
        if r.returncode != 0:
            raise RuntimeError(f"postgres did not start within {WAIT_S}s; read {self.log}: "
                               f"{self._log_tail()[-300:]}")
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            self.pid = int(f.readline())

    def stop_server(self, mode="fast"):
        """Stop the server, keep its data (fast: SIGINT; immediate: SIGQUIT)."""
        if not self.pid:
            return
        r = self._as_owner([os.path.join(PG_BIN, "pg_ctl"), "-D", self.data, "-m", mode, "-w",
                            "-t", "30", "-s", "stop"])
        if r.returncode != 0 and self._alive():
            os.kill(self.pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while self._alive() and time.monotonic() < deadline:
                time.sleep(0.05)
        self.pid = None

    def _alive(self):
        if not self.pid:
            return False
        try:
            with open(f"/proc/{self.pid}/cmdline", "rb") as f:
                return self.data.encode() in f.read()
        except OSError:
            return False

    def psql(self, sql, db="postgres"):
        """Run sql over the unix socket as the superuser; returns stdout."""
        r = self._as_owner([os.path.join(PG_BIN, "psql"), "-h", self.dir, "-p", str(self.port),
                            "-U", "postgres", "-d", db, "-XAtq", "-v", "ON_ERROR_STOP=1",
                            "-c", sql])
        if r.returncode != 0:
            raise RuntimeError(f"psql: {r.stderr.strip()}")
        return r.stdout

    def create_db(self, name):
        assert name.replace("_", "").isalnum(), name
        self.psql(f"CREATE DATABASE {name}")
        return self.url_of(name)

    def stop(self):
        """Stop the server and remove its directory (only one made by start)."""
        if not self.dir:
            return
        self.stop_server()
        if os.path.exists(os.path.join(self.dir, MARK)):
            shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None

    def __enter__(self):
        if not self.dir:
            self.start()
        return self

    def __exit__(self, *exc):
        self.stop()


def _main(argv):
    if len(argv) == 3 and argv[1] == "start":
        os.makedirs(argv[2], exist_ok=True)
        pg = PgServer(base=argv[2]).start()
        with open(os.path.join(argv[2], "pgserver.state"), "w") as f:
            f.write(f"{pg.dir}\n{pg.port}\n{pg.password}\n{pg.pid}\n")
        print(pg.url)
        return 0
    if len(argv) == 3 and argv[1] == "stop":
        state = os.path.join(argv[2], "pgserver.state")
        if not os.path.exists(state):
            print(f"pgserver: {state} not found: nothing to stop", file=sys.stderr)
            return 0
        d, port, pw, pid = open(state).read().split()
        pg = PgServer()
        pg.dir, pg.port, pg.password, pg.pid = d, int(port), pw, int(pid)
        pg.stop()
        os.unlink(state)
        return 0
    print("usage: pgserver.py start DIR | stop DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
