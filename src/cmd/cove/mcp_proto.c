/* JSON-RPC 2.0 / MCP message handling for `cove mcp` (mcp_proto.h). Protocol versions are
 * negotiated as the MCP lifecycle says: the client's version when this server speaks it,
 * else the newest one it does. */
#include <stdlib.h>
#include <string.h>

#include "mcp_proto.h"

static const char *const versions[] = {"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"};

enum {
        PARSE_ERROR = -32700,
        INVALID_REQUEST = -32600,
        METHOD_NOT_FOUND = -32601,
        INVALID_PARAMS = -32602,
        INTERNAL_ERROR = -32603,
};

static char *dump(json_t *msg)
{
        char *s = json_dumps(msg, JSON_COMPACT);
        json_decref(msg);
        return s;
}

static char *error(json_t *id, int code, const char *message)
{
        return dump(json_pack("{s:s, s:O, s:{s:i, s:s}}", "jsonrpc", "2.0", "id",
                              id ? id : json_null(), "error", "code", code, "message", message));
}

static char *result(json_t *id, json_t *res)
{
        return dump(json_pack("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", id, "result", res));
}

char *mcp_too_long(void)
{
        return error(NULL, INVALID_REQUEST, "message longer than 8 MiB");
}

static json_t *initialize(struct mcp_server *s, json_t *params)
{
        const char *want = json_string_value(json_object_get(params, "protocolVersion"));
        const char *v = versions[0];
        for (size_t i = 0; want && i < sizeof(versions) / sizeof(versions[0]); i++)
                if (!strcmp(want, versions[i]))
                        v = versions[i];
        s->initialized = 1;
        return json_pack("{s:s, s:{s:{s:b}}, s:{s:s, s:s}, s:s}", "protocolVersion", v,
                         "capabilities", "tools", "listChanged", 0, "serverInfo", "name", "cove",
                         "version", s->version ? s->version : "dev", "instructions",
                         "Tools for cove sandboxes: create one, run commands and edit files in "
                         "it, snapshot it, see what changed between snapshots (diff), fork "
                         "or rewind it. Sandbox ids look like sbx_…, snapshot ids snap_….");
}

static json_t *tools_list(struct mcp_server *s)
{
        json_t *arr = json_array();
        for (size_t i = 0; i < s->ntools; i++) {
                json_error_t je;
                json_t *schema = json_loads(s->tools[i].schema, 0, &je);
                if (!schema) /* a bug in the table: name it instead of answering garbage */
                        schema = json_pack("{s:s, s:s}", "type", "object", "description",
                                           "schema did not parse");
                json_array_append_new(arr, json_pack("{s:s, s:s, s:o}", "name", s->tools[i].name,
                                                     "description", s->tools[i].description,
                                                     "inputSchema", schema));
        }
        return json_pack("{s:o}", "tools", arr);
}

static char *tools_call(struct mcp_server *s, json_t *id, json_t *params)
{
        const char *name = json_string_value(json_object_get(params, "name"));
        json_t *args = json_object_get(params, "arguments");
        if (!name)
                return error(id, INVALID_PARAMS, "tools/call needs params.name (a string)");
        if (args && !json_is_object(args) && !json_is_null(args))
                return error(id, INVALID_PARAMS, "params.arguments must be an object");
        size_t i = 0;
        while (i < s->ntools && strcmp(s->tools[i].name, name))
                i++;
        if (i == s->ntools)
                return error(id, INVALID_PARAMS, "unknown tool");
        json_t *own = json_is_object(args) ? json_incref(args) : json_object();
        json_t *out = NULL;
        char msg[1024] = "";
        int rc = s->call(s->arg, s->tools[i].name, own, &out, msg, sizeof(msg));
        json_decref(own);
        json_t *res;
        if (rc < 0) {
                json_decref(out);
                res = json_pack("{s:[{s:s, s:s}], s:b}", "content", "type", "text", "text",
                                msg[0] ? msg : "the tool failed", "isError", 1);
        } else if (json_is_string(out)) {
                res = json_pack("{s:[{s:s, s:O}], s:b}", "content", "type", "text", "text", out,
                                "isError", 0);
                json_decref(out);
        } else {
                char *text = out ? json_dumps(out, JSON_COMPACT) : NULL;
                res = json_pack("{s:[{s:s, s:s}], s:b}", "content", "type", "text", "text",
                                text ? text : "{}", "isError", 0);
                free(text);
                if (json_is_object(out))
                        json_object_set_new(res, "structuredContent", out);
                else
                        json_decref(out);
        }
        return res ? result(id, res) : error(id, INTERNAL_ERROR, "out of memory");
}

char *mcp_handle_line(struct mcp_server *s, const char *line, size_t len)
{
        size_t k = 0;
        while (k < len && (line[k] == ' ' || line[k] == '\t' || line[k] == '\r'))
                k++;
        if (k == len)
                return NULL;
        json_error_t je;
        json_t *msg = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
        if (!msg)
                return error(NULL, PARSE_ERROR, "parse error: not one JSON value");
        char *ans = NULL;
        json_t *id = json_object_get(msg, "id");
        json_t *method = json_object_get(msg, "method");
        if (!json_is_object(msg)) {
                ans = error(NULL, INVALID_REQUEST,
                            "a message must be one JSON-RPC object "
                            "(batches are not part of MCP)");
        } else if (id && !json_is_string(id) && !json_is_integer(id)) {
                ans = error(NULL, INVALID_REQUEST, "id must be a string or an integer");
        } else if (!json_is_string(json_object_get(msg, "jsonrpc")) ||
                   strcmp(json_string_value(json_object_get(msg, "jsonrpc")), "2.0")) {
                ans = id ? error(id, INVALID_REQUEST, "jsonrpc must be \"2.0\"") : NULL;
        } else if (!method) {
                ans = NULL; /* a response to us (we send no requests): nothing to do */
        } else if (!json_is_string(method)) {
                ans = error(id, INVALID_REQUEST, "method must be a string");
        } else if (!id) {
                ans = NULL; /* notifications: initialized, cancelled, …: no answer */
        } else {
                const char *m = json_string_value(method);
                json_t *params = json_object_get(msg, "params");
                if (params && !json_is_object(params))
                        ans = error(id, INVALID_PARAMS, "params must be an object");
                else if (!strcmp(m, "initialize"))
                        ans = result(id, initialize(s, params));
                else if (!strcmp(m, "ping"))
                        ans = result(id, json_object());
                else if (!strcmp(m, "tools/list"))
                        ans = result(id, tools_list(s));
                else if (!strcmp(m, "tools/call"))
                        ans = tools_call(s, id, params);
                else
                        ans = error(id, METHOD_NOT_FOUND, "method not found");
        }
        json_decref(msg);
        return ans;
}
