/* The Model Context Protocol's JSON-RPC 2.0 side for `cove mcp` (stdio, one message per
 * line): initialize, ping, tools/list, tools/call and notifications, with the tools and
 * their effects supplied by the caller. Every line is untrusted input: bounded, parsed
 * with jansson, checked for the shapes JSON-RPC and MCP require; a bad one gets a JSON-RPC
 * error, never a crash. No I/O here (tests/fuzz/fuzz_mcp.c drives it directly). */
#ifndef COVE_CLI_MCP_PROTO_H
#define COVE_CLI_MCP_PROTO_H

#include <stddef.h>

#include <jansson.h>

#define MCP_LINE_MAX (8u << 20) /* bytes of one message (a write_file of a few MiB fits) */

struct mcp_tool {
        const char *name;
        const char *description;
        const char *schema; /* JSON Schema of the arguments, as JSON text */
};

/* Run tool (one of the table's) with args (an object). Returns 0 with *out (a new
 * reference: an object, or a string for plain text), or -1 with msg filled: the tool
 * failed and the client gets msg as a tool error (isError), not a protocol error. */
typedef int (*mcp_call_fn)(void *arg, const char *tool, json_t *args, json_t **out, char *msg,
                           size_t cap);

struct mcp_server {
        const struct mcp_tool *tools;
        size_t ntools;
        mcp_call_fn call;
        void *arg;
        const char *version; /* serverInfo.version */
        int initialized;     /* an initialize was answered */
};

/* Handle one line (without its newline). Returns the answer line (malloc'd, no newline) or
 * NULL when none is due (a notification, a response from the client, a blank line). */
char *mcp_handle_line(struct mcp_server *s, const char *line, size_t len);
/* The answer to a line longer than MCP_LINE_MAX (its id cannot be known). */
char *mcp_too_long(void);

#endif
