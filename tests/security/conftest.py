"""Shared helpers of tests/security (see docs/security.md for the threat model).

Every test runs an attack from inside a sandbox (through the exec or files API, as root of
the sandbox unless stated) and fails if the attack works. Static helper binaries
(tests/helpers/sysprobe.c, evil_guest.c) are built by meson into <build>/tests/unit/.
"""
import os
import secrets

import pytest

@pytest.fixture(scope="session")
def helper(build_dir):
    """helper(name) → absolute path of a static helper binary in the build dir."""

    def find(name):
        p = os.path.join(build_dir, "tests", "unit", name)
        if not os.access(p, os.X_OK):
            pytest.skip(f"{p} not built (make BUILD={os.path.basename(build_dir)} with tests "
                        f"enabled builds it)")
        return p

    return find


@pytest.fixture
def upload(client):
    """upload(sid, host_path, sandbox_path): copies an executable into the sandbox."""

    def up(sid, src, dst):
        with open(src, "rb") as f:
            client.put_file(sid, dst, f.read(), mode=0o755)
        return dst

    return up


@pytest.fixture
def host_marker():
    """A host file under /tmp with random content: (path, content). Removed afterwards."""
    content = "cove-sec-marker-" + secrets.token_hex(16)
    path = f"/tmp/cove-sec-marker-{secrets.token_hex(6)}"
    with open(path, "w") as f:
        f.write(content + "\n")
    os.chmod(path, 0o644)
    yield path, content
    try:
        os.unlink(path)
    except OSError:
        pass
