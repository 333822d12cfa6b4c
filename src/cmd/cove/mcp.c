/* cove mcp: a Model Context Protocol server over stdio (JSON-RPC 2.0, one message per
 * line; mcp_proto.c), whose tools are calls of the cove REST API made with this CLI's
 * client. A failing call is a tool result with isError and the API's "code: message";
 * nothing but protocol messages is written to stdout. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client.h"
#include "cove.h"
#include "mcp_proto.h"
#include "util/cleanup.h"

#define FILE_MAX (1u << 20)   /* bytes read_file returns */
#define OUTPUT_MAX (1u << 20) /* bytes of stdout/stderr an exec result carries, each */

#define SBX "\"sandbox_id\":{\"type\":\"string\",\"description\":\"sbx_… id\"}"
#define SNAP(n, d) "\"" n "\":{\"type\":\"string\",\"description\":\"" d "\"}"

static const struct mcp_tool tools[] = {
    {"create_sandbox", "Create a sandbox from a template and return it (its id is sbx_…).",
     "{\"type\":\"object\",\"properties\":{\"template\":{\"type\":\"string\",\"description\":"
     "\"template name, e.g. base or busybox (default base)\"},\"runtime\":{\"type\":\"string\","
     "\"enum\":[\"ns\",\"vm\"]},\"cpus\":{\"type\":\"integer\",\"minimum\":1},\"memory_mb\":{"
     "\"type\":\"integer\",\"minimum\":32},\"disk_mb\":{\"type\":\"integer\",\"minimum\":16},"
     "\"timeout_s\":{\"type\":\"integer\",\"minimum\":1},\"env\":{\"type\":\"object\","
     "\"additionalProperties\":{\"type\":\"string\"}},\"metadata\":{\"type\":\"object\","
     "\"additionalProperties\":{\"type\":\"string\"}}}}"},
    {"exec", "Run a command in a sandbox and wait for it: exit code, stdout, stderr.",
     "{\"type\":\"object\",\"properties\":{" SBX ",\"command\":{\"type\":\"string\","
     "\"description\":\"shell command line (/bin/sh -c)\"},\"argv\":{\"type\":\"array\","
     "\"items\":{\"type\":\"string\"},\"description\":\"program and arguments, no shell\"},"
     "\"cwd\":{\"type\":\"string\"},\"env\":{\"type\":\"object\",\"additionalProperties\":{"
     "\"type\":\"string\"}},\"timeout_s\":{\"type\":\"integer\",\"minimum\":1}},"
     "\"required\":[\"sandbox_id\"]}"},
    {"read_file", "Read a file of a sandbox (up to 1 MiB; text, or base64 when not UTF-8).",
     "{\"type\":\"object\",\"properties\":{" SBX ",\"path\":{\"type\":\"string\"}},"
     "\"required\":[\"sandbox_id\",\"path\"]}"},
    {"write_file", "Write (replace atomically) a file of a sandbox; the parent must exist.",
     "{\"type\":\"object\",\"properties\":{" SBX ",\"path\":{\"type\":\"string\"},\"content\":{"
     "\"type\":\"string\",\"description\":\"the file's text\"},\"content_b64\":{\"type\":"
     "\"string\",\"description\":\"or its bytes in base64\"},\"mode\":{\"type\":\"string\","
     "\"description\":\"octal permission bits, e.g. 0755\"}},\"required\":[\"sandbox_id\","
     "\"path\"]}"},
    {"list_files", "List a directory of a sandbox (name, type, size, mode, mtime).",
     "{\"type\":\"object\",\"properties\":{" SBX ",\"path\":{\"type\":\"string\"},\"depth\":{"
     "\"type\":\"integer\",\"minimum\":1,\"maximum\":32}},\"required\":[\"sandbox_id\"]}"},
    {"snapshot", "Take a snapshot of a running sandbox and return it (its id is snap_…).",
     "{\"type\":\"object\",\"properties\":{" SBX ",\"label\":{\"type\":\"string\"},\"kind\":{"
     "\"type\":\"string\",\"enum\":[\"files\",\"full\"]}},\"required\":[\"sandbox_id\"]}"},
    {"list_snapshots", "A sandbox's snapshots, newest first.",
     "{\"type\":\"object\",\"properties\":{" SBX "},\"required\":[\"sandbox_id\"]}"},
    {"diff",
     "What changed between two snapshots (files added, changed, removed); with file_path, "
     "that file's unified diff.",
     "{\"type\":\"object\",\"properties\":{" SNAP("from_snapshot", "snap_… id (before)") "," SNAP(
         "to_snapshot",
         "snap_… id (after)") ",\"path\":{\"type\":\"string\",\"description\":"
                              "\"only this "
                              "directory\"},\"file_path\":{\"type\":\"string\",\"description\":"
                              "\"the "
                              "unified diff of this "
                              "file\"}},\"required\":[\"from_snapshot\",\"to_snapshot\"]}"},
    {"fork", "New sandboxes from a snapshot (default: from the sandbox's current state).",
     "{\"type\":\"object\",\"properties\":{" SBX
     "," SNAP("snapshot_id", "snap_… id") ","
                                          "\"count\":{\"type\":\"integer\",\"minimum\":1,"
                                          "\"maximum\":20}},\"required\":[\"sandbox_id\""
                                          "]}"},
    {"rewind", "Put a sandbox back to a snapshot; returns the snapshot that undoes it.",
     "{\"type\":\"object\",\"properties\":{" SBX
     "," SNAP("snapshot_id", "snap_… id") "},"
                                          "\"required\":[\"sandbox_id\",\"snapshot_id\"]}"},
    {"pause", "Snapshot a sandbox, then stop it (frees memory and CPU).",
     "{\"type\":\"object\",\"properties\":{" SBX "},\"required\":[\"sandbox_id\"]}"},
    {"resume", "Start a paused sandbox again, from its last (or a named) snapshot.",
     "{\"type\":\"object\",\"properties\":{" SBX
     "," SNAP("snapshot_id", "snap_… id") "},"
                                          "\"required\":[\"sandbox_id\"]}"},
    {"delete", "Destroy a sandbox (its snapshots stay unless purge is true).",
     "{\"type\":\"object\",\"properties\":{" SBX ",\"purge\":{\"type\":\"boolean\"}},"
     "\"required\":[\"sandbox_id\"]}"},
};

struct ctx {
        struct cli *c;
};

static int fail(char *msg, size_t cap, const char *fmt, const char *a)
{
        snprintf(msg, cap, fmt, a);
        return -1;
}

/* A string argument: NULL when absent; -1 (msg) when present and not a string or
 * required and absent. */
static int str_arg(json_t *args, const char *k, int required, const char **out, char *msg,
                   size_t cap)
{
        json_t *v = json_object_get(args, k);
        *out = NULL;
        if (!v || json_is_null(v))
                return required ? fail(msg, cap, "argument %s is required", k) : 0;
        if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
                return fail(msg, cap, "argument %s must be a string", k);
        *out = json_string_value(v);
        return 0;
}

static int api(struct ctx *x, const char *method, const char *path, json_t *body, json_t **out,
               char *msg, size_t cap)
{
        struct cove_err err = {0};
        if (cli_call(x->c, method, path, body, out, NULL, &err) < 0)
                return fail(msg, cap, "%s", err.msg);
        if (out && !*out)
                *out = json_pack("{s:b}", "ok", 1);
        return 0;
}

/* Copy the listed optional fields of args into body, checking their JSON types. */
static int copy_fields(json_t *args, json_t *body, const char *const *names, const int *types,
                       char *msg, size_t cap)
{
        for (size_t i = 0; names[i]; i++) {
                json_t *v = json_object_get(args, names[i]);
                if (!v || json_is_null(v))
                        continue;
                if ((int)json_typeof(v) != types[i] &&
                    !(types[i] == JSON_INTEGER && json_is_integer(v)))
                        return fail(msg, cap, "argument %s has the wrong type", names[i]);
                json_object_set(body, names[i], v);
        }
        return 0;
}

/* Cut r[k] (text) or r[k_b64] (bytes that are not UTF-8) to OUTPUT_MAX bytes. */
static void cap_output(json_t *r, const char *k)
{
        char kb[32];
        snprintf(kb, sizeof(kb), "%s_b64", k);
        json_t *v = json_object_get(r, k), *b = json_object_get(r, kb);
        if (json_is_string(v) && json_string_length(v) > OUTPUT_MAX) {
                /* back to the start of a UTF-8 sequence, so the cut text stays valid */
                size_t n = OUTPUT_MAX;
                const unsigned char *t = (const unsigned char *)json_string_value(v);
                while (n > 0 && (t[n] & 0xc0) == 0x80)
                        n--;
                json_object_set_new(r, k, json_stringn((const char *)t, n));
                json_object_set_new(r, "truncated", json_true());
        }
        if (json_is_string(b) && json_string_length(b) > OUTPUT_MAX / 3 * 4) {
                json_object_set_new(r, kb, json_stringn(json_string_value(b), OUTPUT_MAX / 3 * 4));
                json_object_set_new(r, "truncated", json_true());
        }
}

static int read_file(struct ctx *x, const char *id, const char *path, json_t **out, char *msg,
                     size_t cap)
{
        /* past the bound curl stops at the Content-Length: a huge file is not fetched */
        cleanup_free char *ei = cli_urlenc(id);
        cleanup_free char *ep = cli_urlenc(path);
        cleanup_free char *url = cli_fmt("/v1/sandboxes/%s/files?path=%s", ei, ep);
        struct cove_err err = {0};
        if (cli_connect(x->c, &err) < 0)
                return fail(msg, cap, "%s", err.msg);
        struct cli_req *r = cli_req_new(x->c, "GET", url, NULL);
        if (!r)
                return fail(msg, cap, "%s", "out of memory");
        curl_easy_setopt(r->h, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)FILE_MAX);
        struct cli_loop loop = {0};
        int rc = cli_perform(x->c, r, &loop, &err);
        if (rc == 0 && (r->status < 200 || r->status >= 300))
                rc = cli_http_error(x->c, r->status, r->body, r->len, &err);
        if (rc < 0) {
                cli_req_free(r);
                if (strstr(err.msg, "aximum file size") || strstr(err.msg, "larger than"))
                        return fail(msg, cap,
                                    "%s is larger than 1 MiB: read_file returns up to 1 MiB "
                                    "(use exec with head, tail or grep)",
                                    path);
                return fail(msg, cap, "%s", err.msg);
        }
        json_t *o = json_pack("{s:s, s:I}", "path", path, "size", (json_int_t)r->len);
        json_t *text = r->len ? json_stringn(r->body, r->len) : json_string("");
        if (text) {
                json_object_set_new(o, "content", text);
        } else {
                cleanup_free char *b64 = NULL;
                size_t n = 4 * ((r->len + 2) / 3) + 1;
                b64 = malloc(n);
                static const char t[] =
                    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
                size_t j = 0;
                const unsigned char *s = (const unsigned char *)r->body;
                for (size_t i = 0; b64 && i < r->len; i += 3) {
                        unsigned v = s[i] << 16 | (i + 1 < r->len ? s[i + 1] << 8 : 0) |
                                     (i + 2 < r->len ? s[i + 2] : 0);
                        b64[j++] = t[v >> 18 & 63];
                        b64[j++] = t[v >> 12 & 63];
                        b64[j++] = i + 1 < r->len ? t[v >> 6 & 63] : '=';
                        b64[j++] = i + 2 < r->len ? t[v & 63] : '=';
                }
                if (b64) {
                        b64[j] = 0;
                        json_object_set_new(o, "content_b64", json_string(b64));
                }
        }
        cli_req_free(r);
        *out = o;
        return 0;
}

static int write_file(struct ctx *x, json_t *args, const char *id, const char *path, json_t **out,
                      char *msg, size_t cap)
{
        const char *content, *b64, *mode;
        if (str_arg(args, "content", 0, &content, msg, cap) < 0 ||
            str_arg(args, "content_b64", 0, &b64, msg, cap) < 0 ||
            str_arg(args, "mode", 0, &mode, msg, cap) < 0)
                return -1;
        if (!!content == !!b64)
                return fail(msg, cap, "%s", "give exactly one of content and content_b64");
        cleanup_free unsigned char *data = NULL;
        long n;
        if (b64) {
                data = malloc(3 * strlen(b64) / 4 + 3);
                n = data ? cli_b64_decode(b64, strlen(b64), data) : -1;
                if (n < 0)
                        return fail(msg, cap, "%s", "content_b64 is not base64");
        } else {
                n = (long)json_string_length(json_object_get(args, "content"));
        }
        if (mode && (strspn(mode, "01234567") != strlen(mode) || !*mode || strlen(mode) > 4))
                return fail(msg, cap, "%s", "mode must be octal digits, e.g. 0644");
        cleanup_free char *ei = cli_urlenc(id);
        cleanup_free char *ep = cli_urlenc(path);
        cleanup_free char *url = cli_fmt("/v1/sandboxes/%s/files?path=%s%s%s", ei, ep,
                                         mode ? "&mode=" : "", mode ? mode : "");
        struct cove_err err = {0};
        if (cli_connect(x->c, &err) < 0)
                return fail(msg, cap, "%s", err.msg);
        struct cli_req *r = cli_req_new(x->c, "PUT", url, "application/octet-stream");
        if (!r)
                return fail(msg, cap, "%s", "out of memory");
        curl_easy_setopt(r->h, CURLOPT_POSTFIELDSIZE, n);
        curl_easy_setopt(r->h, CURLOPT_COPYPOSTFIELDS, b64 ? (const char *)data : content);
        struct cli_loop loop = {0};
        int rc = cli_perform(x->c, r, &loop, &err);
        if (rc == 0 && (r->status < 200 || r->status >= 300))
                rc = cli_http_error(x->c, r->status, r->body, r->len, &err);
        json_error_t je;
        json_t *o = rc == 0 && r->len ? json_loadb(r->body, r->len, 0, &je) : NULL;
        cli_req_free(r);
        if (rc < 0)
                return fail(msg, cap, "%s", err.msg);
        *out = o ? o : json_pack("{s:s, s:I}", "path", path, "size", (json_int_t)n);
        return 0;
}

static int call(void *arg, const char *tool, json_t *args, json_t **out, char *msg, size_t cap)
{
        struct ctx *x = arg;
        const char *id = NULL, *snap = NULL, *path = NULL;
        /* every tool but create_sandbox and diff names a sandbox */
        if (strcmp(tool, "create_sandbox") && strcmp(tool, "diff") &&
            str_arg(args, "sandbox_id", 1, &id, msg, cap) < 0)
                return -1;
        cleanup_free char *ei = id ? cli_urlenc(id) : NULL;
        if (!strcmp(tool, "create_sandbox")) {
                static const char *const names[] = {"runtime",   "cpus", "memory_mb", "disk_mb",
                                                    "timeout_s", "env",  "metadata",  NULL};
                static const int types[] = {JSON_STRING,  JSON_INTEGER, JSON_INTEGER, JSON_INTEGER,
                                            JSON_INTEGER, JSON_OBJECT,  JSON_OBJECT};
                const char *tpl;
                if (str_arg(args, "template", 0, &tpl, msg, cap) < 0)
                        return -1;
                json_t *body = json_pack("{s:s}", "template", tpl ? tpl : "base");
                int rc = copy_fields(args, body, names, types, msg, cap);
                if (rc == 0)
                        rc = api(x, "POST", "/v1/sandboxes", body, out, msg, cap);
                json_decref(body);
                return rc;
        }
        if (!strcmp(tool, "exec")) {
                const char *cmd;
                json_t *argv = json_object_get(args, "argv");
                if (str_arg(args, "command", 0, &cmd, msg, cap) < 0)
                        return -1;
                if (!!cmd == !!(argv && !json_is_null(argv)))
                        return fail(msg, cap, "%s", "give exactly one of command and argv");
                json_t *body = cmd ? json_pack("{s:s, s:b}", "shell", cmd, "wait", 1)
                                   : json_pack("{s:O, s:b}", "cmd", argv, "wait", 1);
                static const char *const names[] = {"cwd", "env", "timeout_s", NULL};
                static const int types[] = {JSON_STRING, JSON_OBJECT, JSON_INTEGER};
                int rc = copy_fields(args, body, names, types, msg, cap);
                cleanup_free char *url = cli_fmt("/v1/sandboxes/%s/exec", ei);
                if (rc == 0)
                        rc = api(x, "POST", url, body, out, msg, cap);
                json_decref(body);
                if (rc == 0) {
                        cap_output(*out, "stdout");
                        cap_output(*out, "stderr");
                }
                return rc;
        }
        if (!strcmp(tool, "read_file") || !strcmp(tool, "write_file")) {
                if (str_arg(args, "path", 1, &path, msg, cap) < 0)
                        return -1;
                return tool[0] == 'r' ? read_file(x, id, path, out, msg, cap)
                                      : write_file(x, args, id, path, out, msg, cap);
        }
        if (!strcmp(tool, "list_files")) {
                if (str_arg(args, "path", 0, &path, msg, cap) < 0)
                        return -1;
                json_t *d = json_object_get(args, "depth");
                if (d && !json_is_integer(d))
                        return fail(msg, cap, "%s", "argument depth must be an integer");
                cleanup_free char *ep = cli_urlenc(path ? path : "/");
                cleanup_free char *url = cli_fmt("/v1/sandboxes/%s/fs?path=%s&depth=%lld", ei, ep,
                                                 d ? (long long)json_integer_value(d) : 1LL);
                return api(x, "GET", url, NULL, out, msg, cap);
        }
        if (!strcmp(tool, "snapshot")) {
                const char *label, *kind;
                if (str_arg(args, "label", 0, &label, msg, cap) < 0 ||
                    str_arg(args, "kind", 0, &kind, msg, cap) < 0)
                        return -1;
                json_t *body = json_object();
                if (label)
                        json_object_set_new(body, "label", json_string(label));
                if (kind)
                        json_object_set_new(body, "kind", json_string(kind));
                cleanup_free char *url = cli_fmt("/v1/sandboxes/%s/snapshots", ei);
                int rc = api(x, "POST", url, body, out, msg, cap);
                json_decref(body);
                return rc;
        }
        if (!strcmp(tool, "list_snapshots")) {
                cleanup_free char *url = cli_fmt("/v1/sandboxes/%s/snapshots", ei);
                return api(x, "GET", url, NULL, out, msg, cap);
        }
        if (!strcmp(tool, "diff")) {
                const char *a, *b, *file;
                if (str_arg(args, "from_snapshot", 1, &a, msg, cap) < 0 ||
                    str_arg(args, "to_snapshot", 1, &b, msg, cap) < 0 ||
                    str_arg(args, "path", 0, &path, msg, cap) < 0 ||
                    str_arg(args, "file_path", 0, &file, msg, cap) < 0)
                        return -1;
                cleanup_free char *ea = cli_urlenc(a);
                cleanup_free char *eb = cli_urlenc(b);
                cleanup_free char *ep = cli_urlenc(file ? file : path ? path : "");
                cleanup_free char *url =
                    cli_fmt("/v1/snapshots/%s/diff/%s%s%s%s", ea, eb, file ? "/file" : "",
                            file || path ? "?path=" : "", file || path ? ep : "");
                return api(x, "GET", url, NULL, out, msg, cap);
        }
        if (!strcmp(tool, "fork") || !strcmp(tool, "rewind") || !strcmp(tool, "resume")) {
                if (str_arg(args, "snapshot_id", !strcmp(tool, "rewind"), &snap, msg, cap) < 0)
                        return -1;
                json_t *body = json_object();
                if (snap)
                        json_object_set_new(body, "snapshot_id", json_string(snap));
                json_t *n = json_object_get(args, "count");
                if (!strcmp(tool, "fork") && n && !json_is_null(n)) {
                        if (!json_is_integer(n)) {
                                json_decref(body);
                                return fail(msg, cap, "%s", "argument count must be an integer");
                        }
                        json_object_set(body, "count", n);
                }
                cleanup_free char *url = cli_fmt("/v1/sandboxes/%s/%s", ei, tool);
                int rc = api(x, "POST", url, body, out, msg, cap);
                json_decref(body);
                return rc;
        }
        if (!strcmp(tool, "pause")) {
                cleanup_free char *url = cli_fmt("/v1/sandboxes/%s/pause", ei);
                return api(x, "POST", url, NULL, out, msg, cap);
        }
        if (!strcmp(tool, "delete")) {
                json_t *p = json_object_get(args, "purge");
                if (p && !json_is_boolean(p) && !json_is_null(p))
                        return fail(msg, cap, "%s", "argument purge must be a boolean");
                cleanup_free char *url =
                    cli_fmt("/v1/sandboxes/%s%s", ei, json_is_true(p) ? "?purge=true" : "");
                return api(x, "DELETE", url, NULL, out, msg, cap);
        }
        return fail(msg, cap, "no tool %s", tool);
}

static void help(void)
{
        puts("Usage: cove mcp\n"
             "\n"
             "Serve the Model Context Protocol on stdin/stdout (JSON-RPC 2.0, one message per\n"
             "line) for an agent host: tools create_sandbox, exec, read_file, write_file,\n"
             "list_files, snapshot, list_snapshots, diff, fork, rewind, pause, resume, delete,\n"
             "each a call of coved's API with this CLI's --url and --api-key. Ends at EOF.");
}

static int emit(char *line)
{
        if (!line)
                return 0;
        int rc = fputs(line, stdout) < 0 || fputc('\n', stdout) < 0 || fflush(stdout) != 0;
        free(line);
        return rc ? -1 : 0;
}

int cmd_mcp(struct cli *c, int argc, char **argv)
{
        static const struct option opts[] = {CLI_GLOBAL_OPTIONS, {0}};
        int opt;
        while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
                if (cli_global_opt(c, opt, optarg))
                        continue;
                if (opt == 'h') {
                        help();
                        return CLI_OK;
                }
                return cli_usage_error("mcp", "bad option");
        }
        if (optind < argc)
                return cli_usage_error("mcp", "no arguments expected");
        struct ctx x = {c};
        struct mcp_server s = {tools, sizeof(tools) / sizeof(tools[0]), call, &x, COVE_VERSION, 0};
        size_t cap = 65536, len = 0;
        char *buf = malloc(cap);
        int discarding = 0;
        if (!buf)
                return CLI_FAIL;
        for (;;) {
                if (len == cap) {
                        size_t ncap = cap * 2 > MCP_LINE_MAX + 1 ? MCP_LINE_MAX + 1 : cap * 2;
                        char *nb = ncap > cap ? realloc(buf, ncap) : NULL;
                        if (!nb) { /* a line past the bound: drop it up to its newline */
                                if (!discarding && emit(mcp_too_long()) < 0)
                                        break;
                                discarding = 1;
                                len = 0;
                                continue;
                        }
                        buf = nb;
                        cap = ncap;
                }
                ssize_t n = read(STDIN_FILENO, buf + len, cap - len);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        break;
                size_t start = 0, end = len + (size_t)n;
                for (size_t i = len; i < end; i++) {
                        if (buf[i] != '\n')
                                continue;
                        if (!discarding && emit(mcp_handle_line(&s, buf + start, i - start)) < 0)
                                goto out;
                        discarding = 0;
                        start = i + 1;
                }
                memmove(buf, buf + start, end - start);
                len = end - start;
                if (discarding)
                        len = 0;
        }
out:
        free(buf);
        return CLI_OK;
}
