"""Run INSIDE a sandbox (python3 procsys_scan.py NEEDLES TOKENS OWN_ID SECONDS): walk /proc
(the scanner's own process and PID 1 only, of the per-process dirs) and /sys, depth <= 10,
reading at most 1 MiB of each readable regular file with 0.5 s per file and SECONDS in all,
and print as JSON every place (file content, file name or symlink target) where one of
NEEDLES (literal strings), TOKENS (whole words) or a sandbox id other than OWN_ID appears."""
import json, os, re, signal, stat, sys, time
needles = json.loads(sys.argv[1])   # list of literal strings
token = json.loads(sys.argv[2])     # literal strings matched as whole tokens
own = sys.argv[3]
ids = re.compile(rb"sbx_[a-z0-9]{20}")
pats = [re.compile(re.escape(n.encode())) for n in needles]
pats += [re.compile(rb"(?<![A-Za-z0-9_.-])" + re.escape(t.encode()) + rb"(?![A-Za-z0-9_.-])") for t in token]
MAXDEPTH, MAXREAD, DEADLINE = 10, 1 << 20, time.time() + float(sys.argv[4])
SKIP = {"/proc/kcore", "/proc/kmsg", "/proc/kpagecount", "/proc/kpageflags", "/proc/kpagecgroup",
        "/proc/sysrq-trigger"}
SKIPNAME = {"mem", "pagemap", "clear_refs", "coredump_filter"}
hits, nfiles, timed_out = [], 0, False
def alarm(*a): raise TimeoutError()
signal.signal(signal.SIGALRM, alarm)
def check(where, data):
    for p in pats:
        if p.search(data): hits.append([where, p.pattern.decode(errors="replace")[:60]])
    for m in ids.finditer(data):
        if m.group().decode() != own: hits.append([where, m.group().decode()])
def walk(d, depth):
    global nfiles, timed_out
    if depth > MAXDEPTH: return
    try: names = os.listdir(d)
    except OSError: return
    for n in names:
        if time.time() > DEADLINE: timed_out = True; return
        p = os.path.join(d, n)
        check("name:" + p, p.encode())
        if d == "/proc" and n.isdigit() and n != "1": continue  # self and the guest only
        if p in SKIP or n in SKIPNAME: continue
        try: st = os.lstat(p)
        except OSError: continue
        if stat.S_ISLNK(st.st_mode):
            try: check("link:" + p, os.readlink(p).encode())
            except OSError: pass
            continue
        if stat.S_ISDIR(st.st_mode):
            if p in ("/proc/self", "/proc/thread-self"): continue
            walk(p, depth + 1); continue
        if not stat.S_ISREG(st.st_mode) or not (st.st_mode & 0o444): continue
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
            try: data = os.read(fd, MAXREAD)
            finally: os.close(fd)
            nfiles += 1
            check(p, data)
        except (OSError, TimeoutError): pass
        finally: signal.setitimer(signal.ITIMER_REAL, 0)
for root in ("/proc", "/sys"): walk(root, 0)
print(json.dumps({"hits": hits, "files": nfiles, "timed_out": timed_out}))
