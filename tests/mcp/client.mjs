// Drives `cove mcp` with the official MCP client (@modelcontextprotocol/sdk, pinned in
// package.json): lists the tools and calls each one against a real coved, then prints one
// JSON report on stdout for tests/integration/test_mcp.py to check.
// Env: COVE_BIN (the cove binary), COVE_URL, COVE_API_KEY, TEMPLATE.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const transport = new StdioClientTransport({
  command: process.env.COVE_BIN,
  args: ["mcp"],
  env: { COVE_URL: process.env.COVE_URL, COVE_API_KEY: process.env.COVE_API_KEY,
         PATH: process.env.PATH },
  stderr: "inherit",
});
const client = new Client({ name: "cove-test", version: "1.0.0" });
const report = { calls: {}, called: [] };

async function call(name, args, key = name) {
  report.called.push(name);
  const r = await client.callTool({ name, arguments: args });
  const text = r.content?.[0]?.text ?? "";
  let parsed = null;
  try { parsed = JSON.parse(text); } catch { /* plain text */ }
  report.calls[key] = { isError: !!r.isError, text, structured: r.structuredContent ?? null,
                        parsed };
  return report.calls[key];
}

try {
  await client.connect(transport);
  report.server = client.getServerVersion();
  report.tools = (await client.listTools()).tools;
  const sb = (await call("create_sandbox", { template: process.env.TEMPLATE })).parsed;
  const id = sb.id;
  await call("exec", { sandbox_id: id, command: "echo hi; echo err >&2; exit 3" });
  await call("exec", { sandbox_id: id, argv: ["cat", "/root/a.txt"] }, "exec_missing_file");
  await call("write_file", { sandbox_id: id, path: "/root/a.txt", content: "one\n" });
  await call("read_file", { sandbox_id: id, path: "/root/a.txt" });
  await call("list_files", { sandbox_id: id, path: "/root" });
  const s1 = await call("snapshot", { sandbox_id: id, label: "one", kind: "files" });
  if (!s1.isError) {
    await call("write_file", { sandbox_id: id, path: "/root/a.txt", content: "two\n" }, "write2");
    const s2 = await call("snapshot", { sandbox_id: id, kind: "files" }, "snapshot2");
    await call("list_snapshots", { sandbox_id: id });
    await call("diff", { from_snapshot: s1.parsed.id, to_snapshot: s2.parsed.id });
    await call("diff", { from_snapshot: s1.parsed.id, to_snapshot: s2.parsed.id,
                         file_path: "/root/a.txt" }, "diff_file");
    const f = await call("fork", { sandbox_id: id, snapshot_id: s1.parsed.id });
    if (!f.isError)
      await call("delete", { sandbox_id: f.parsed.sandboxes[0].id, purge: true }, "delete_fork");
    await call("rewind", { sandbox_id: id, snapshot_id: s1.parsed.id });
    await call("read_file", { sandbox_id: id, path: "/root/a.txt" }, "read_after_rewind");
    await call("pause", { sandbox_id: id });
    await call("resume", { sandbox_id: id });
  }
  await call("exec", { sandbox_id: "sbx_aaaaaaaaaaaaaaaaaaaa", command: "true" }, "exec_404");
  await call("exec", { sandbox_id: id }, "exec_no_command");
  await call("read_file", { sandbox_id: id, path: 7 }, "read_bad_type");
  try {
    await client.callTool({ name: "no_such_tool", arguments: {} });
    report.unknown_tool = "answered";
  } catch (e) {
    report.unknown_tool = String(e.message || e);
  }
  report.ping = await client.ping();
  await call("delete", { sandbox_id: id, purge: true });
  await call("exec", { sandbox_id: id, command: "true" }, "exec_after_delete");
} catch (e) {
  report.fatal = String(e.stack || e);
} finally {
  await client.close();
}
process.stdout.write(JSON.stringify(report) + "\n");
