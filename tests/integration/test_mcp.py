"""`cove mcp` driven by the official MCP client from npm (@modelcontextprotocol/sdk, the
version pinned in tests/mcp/package-lock.json, installed with `npm ci`): it lists the tools
with their schemas and calls each one against a real coved; failures are tool results with
isError and the API's message, an unknown tool a protocol error, and the server survives
all of it."""
import json
import os
import shutil
import subprocess
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = {"create_sandbox", "exec", "read_file", "write_file", "list_files", "snapshot",
         "list_snapshots", "diff", "fork", "rewind", "pause", "resume", "delete"}

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def mcp_client_dir():
    if not shutil.which("node") or not shutil.which("npm"):
        pytest.skip("node and npm are needed to run the official MCP client (apt: nodejs npm)")
    d = tempfile.mkdtemp(prefix="cove-mcp-client-")
    for f in ("package.json", "package-lock.json", "client.mjs"):
        shutil.copy(os.path.join(ROOT, "tests", "mcp", f), d)
    r = subprocess.run(["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=d,
                       capture_output=True, timeout=600)
    if r.returncode != 0:
        shutil.rmtree(d, ignore_errors=True)
        pytest.skip("npm ci of the pinned MCP client failed (is the npm registry reachable?): "
                    + r.stderr.decode(errors="replace")[-500:])
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_official_client_lists_and_calls_every_tool(coved, build_dir, mcp_client_dir):
    env = dict(os.environ, COVE_BIN=os.path.join(build_dir, "cove"),
               COVE_URL=f"http://127.0.0.1:{coved.port}", COVE_API_KEY=coved.client.key,
               TEMPLATE="busybox")
    r = subprocess.run(["node", "client.mjs"], cwd=mcp_client_dir, env=env,
                       capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    rep = json.loads(r.stdout)
    assert "fatal" not in rep, rep["fatal"]
    assert rep["server"]["name"] == "cove"
    tools = {t["name"]: t for t in rep["tools"]}
    assert set(tools) == TOOLS
    for t in tools.values():
        assert t["description"] and t["inputSchema"]["type"] == "object"
    assert "sandbox_id" in tools["exec"]["inputSchema"]["required"]
    c = rep["calls"]
    ok = {k for k, v in c.items() if not v["isError"]}
    e = c["exec"]["parsed"]
    assert (e["exit_code"], e["stdout"], e["stderr"]) == (3, "hi\n", "err\n")
    assert c["exec"]["structured"] == e  # structuredContent is the same object
    assert c["exec_missing_file"]["parsed"]["exit_code"] != 0  # a failing command is no tool error
    assert c["read_file"]["parsed"]["content"] == "one\n"
    assert "a.txt" in [x["name"] for x in c["list_files"]["parsed"]["entries"]]
    if c["snapshot"]["isError"]:
        pytest.skip("this node cannot snapshot: " + c["snapshot"]["text"])
    assert [x["path"] for x in c["diff"]["parsed"]["changed"]] == ["/root/a.txt"]
    assert "-one\n+two\n" in c["diff_file"]["parsed"]["diff"]
    assert len(c["list_snapshots"]["parsed"]["snapshots"]) >= 2
    assert not c["fork"]["isError"] and not c["delete_fork"]["isError"]
    assert c["rewind"]["parsed"]["undo_snapshot_id"].startswith("snap_")
    assert c["read_after_rewind"]["parsed"]["content"] == "one\n"
    assert c["pause"]["parsed"]["sandbox"]["state"] == "paused"
    assert c["resume"]["parsed"]["state"] == "running"
    # failures are tool errors carrying the API's message; the server lives on
    assert c["exec_404"]["isError"] and c["exec_404"]["text"].startswith("not_found:")
    assert c["exec_no_command"]["isError"] and "command" in c["exec_no_command"]["text"]
    assert c["read_bad_type"]["isError"] and "path" in c["read_bad_type"]["text"]
    assert "unknown tool" in rep["unknown_tool"]
    assert rep["ping"] == {}
    assert not c["delete"]["isError"]
    assert c["exec_after_delete"]["isError"]
    assert set(rep["called"]) == TOOLS  # every tool was called
    assert ok >= TOOLS  # and each answered without error at least once


def test_bad_lines_get_json_rpc_errors_and_the_server_survives(build_dir):
    lines = [b"not json", b"[1,2]", b'{"jsonrpc":"1.0","id":1,"method":"ping"}',
             b'{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}',
             b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"nope"}}',
             b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":[]}',
             b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
             b"x" * (9 << 20),  # past the 8 MiB bound
             b'{"jsonrpc":"2.0","id":4,"method":"ping"}']
    r = subprocess.run([os.path.join(build_dir, "cove"), "mcp"], input=b"\n".join(lines) + b"\n",
                       capture_output=True, timeout=120,
                       env=dict(os.environ, COVE_URL="http://127.0.0.1:9"))
    assert r.returncode == 0, r.stderr
    out = [json.loads(line) for line in r.stdout.splitlines()]
    codes = [o.get("error", {}).get("code") for o in out]
    assert codes == [-32700, -32600, -32600, -32600, -32602, -32602, -32600, None]
    assert out[-1] == {"jsonrpc": "2.0", "id": 4, "result": {}}
