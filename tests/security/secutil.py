"""Plain helpers of tests/security (the fixtures are in conftest.py)."""
import glob
import os


def sh(client, sid, script, **kw):
    """exec a shell script as root of the sandbox; the result dict (stdout/stderr str)."""
    return client.exec(sid, script, **kw)


def split_shell_literal(s):
    """A shell expression that yields s without s appearing literally in the command (so a
    search for s does not find the searching command's own argv)."""
    h = len(s) // 2
    return f"\"$(printf %s '{s[:h]}')$(printf %s '{s[h:]}')\""


def read_kv(path):
    out = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2:
                try:
                    out[parts[0]] = int(parts[1])
                except ValueError:
                    pass
    return out


def vm_rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def layer_dir(coved, sid):
    """The host directory holding the sandbox's upper layer (<data>/ns/layers/<id>)."""
    cands = glob.glob(os.path.join(coved.data, "ns", "layers", sid))
    return cands[0] if cands else None
