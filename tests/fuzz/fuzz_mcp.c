/* libFuzzer target: one line of `cove mcp`'s stdin through its JSON-RPC / MCP handling
 * (src/cmd/cove/mcp_proto.c), with a stub tool table: every answer must be one JSON object
 * with the jsonrpc member, or none. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mcp_proto.h"

static const struct mcp_tool tools[] = {
    {"echo", "returns its arguments", "{\"type\":\"object\"}"},
    {"fail", "always fails", "{\"type\":\"object\",\"properties\":{}}"},
    {"text", "returns a string", "{\"type\":\"object\"}"},
};

static int call(void *arg, const char *tool, json_t *args, json_t **out, char *msg, size_t cap)
{
        (void)arg;
        if (!strcmp(tool, "echo")) {
                *out = json_deep_copy(args);
                return 0;
        }
        if (!strcmp(tool, "text")) {
                *out = json_string("plain");
                return 0;
        }
        strncpy(msg, "not_found: nothing", cap - 1);
        msg[cap - 1] = 0;
        return -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        struct mcp_server s = {tools, 3, call, NULL, "fuzz", 0};
        char *ans = mcp_handle_line(&s, (const char *)data, size);
        if (ans) {
                json_error_t je;
                json_t *j = json_loads(ans, 0, &je);
                if (!json_is_object(j) || !json_is_string(json_object_get(j, "jsonrpc")))
                        abort();
                json_decref(j);
                free(ans);
        }
        return 0;
}
