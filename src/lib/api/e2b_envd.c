/* E2B in-sandbox surface (E2B_SANDBOX_URL): what envd answers inside an E2B sandbox,
 * served by the node and translated into guest channel calls. Connect RPC with the JSON
 * codec for process.Process and filesystem.Filesystem (unary: application/json; server
 * streams: application/connect+json envelopes ending with an end-stream frame), plain
 * /health and GET/POST /files (multipart or octet-stream, signed URLs). Requests name
 * their sandbox with E2b-Sandbox-Id (or a {port}-{id}.domain Host) and prove access with
 * X-Access-Token; a dead sandbox answers 502 and its open streams are cut without an
 * end frame, as E2B's proxy does. See docs/e2b.md for what differs from envd. */
#include <ctype.h>
#include <errno.h>
#include <microhttpd.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "api/code.h"
#include "api/e2b.h"
#include "api/forward.h"
#include "control/tbuild.h"
#include "api/routes.h"
#include "util/cleanup.h"
#include "util/util.h"

#define PATH_MAX_LEN 4096
#define KEEPALIVE_DEFAULT_S 50

/* ---- small codecs ------------------------------------------------------------------ */

static int b64val(int c)
{
        if (c >= 'A' && c <= 'Z')
                return c - 'A';
        if (c >= 'a' && c <= 'z')
                return c - 'a' + 26;
        if (c >= '0' && c <= '9')
                return c - '0' + 52;
        if (c == '+' || c == '-')
                return 62;
        if (c == '/' || c == '_')
                return 63;
        return -1;
}

/* Standard or URL-safe base64, padding optional. Returns a new buffer or NULL. */
static unsigned char *b64_decode(const char *s, size_t *out_len)
{
        size_t n = strlen(s);
        unsigned char *out = malloc(n * 3 / 4 + 3);
        if (!out)
                return NULL;
        size_t o = 0;
        unsigned acc = 0;
        int bits = 0;
        for (size_t i = 0; i < n; i++) {
                if (s[i] == '=')
                        break;
                int v = b64val((unsigned char)s[i]);
                if (v < 0) {
                        free(out);
                        return NULL;
                }
                acc = acc << 6 | (unsigned)v;
                bits += 6;
                if (bits >= 8) {
                        bits -= 8;
                        out[o++] = (unsigned char)(acc >> bits);
                        acc &= (1u << bits) - 1;
                }
        }
        *out_len = o;
        return out;
}

/* ---- Connect errors ---------------------------------------------------------------- */

static const char *connect_code(enum cove_err_kind k)
{
        switch (k) {
        case COVE_E_BAD_REQUEST:
                return "invalid_argument";
        case COVE_E_NOT_FOUND:
                return "not_found";
        case COVE_E_CONFLICT:
                return "failed_precondition";
        case COVE_E_LIMIT:
                return "resource_exhausted";
        case COVE_E_UNAUTHORIZED:
        case COVE_E_KEY_REVOKED:
                return "unauthenticated";
        case COVE_E_UNAVAILABLE:
                return "unavailable";
        default:
                return "internal";
        }
}

static unsigned connect_status(const char *code)
{
        static const struct {
                const char *code;
                unsigned status;
        } map[] = {
            {"invalid_argument", 400}, {"failed_precondition", 400}, {"not_found", 404},
            {"already_exists", 409},   {"resource_exhausted", 429},  {"unauthenticated", 401},
            {"unavailable", 503},      {"deadline_exceeded", 504},   {"unimplemented", 501},
        };
        for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
                if (!strcmp(map[i].code, code))
                        return map[i].status;
        return 500;
}

static int rpc_error(struct cove_req *r, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int rpc_error(struct cove_req *r, const char *code, const char *fmt, ...)
{
        char msg[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        return cove_reply_json(r, connect_status(code),
                               json_pack("{s:s, s:s}", "code", code, "message", msg));
}

static int rpc_err(struct cove_req *r, const struct cove_err *err)
{
        return rpc_error(r, connect_code(err->kind), "%s", err->msg[0] ? err->msg : "error");
}

/* envd's plain HTTP errors: {code: <status>, message}. */
static int http_error(struct cove_req *r, unsigned status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int http_error(struct cove_req *r, unsigned status, const char *fmt, ...)
{
        char msg[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        return cove_reply_json(r, status,
                               json_pack("{s:i, s:s}", "code", (int)status, "message", msg));
}

static unsigned http_status(const struct cove_err *err)
{
        switch (err->kind) {
        case COVE_E_BAD_REQUEST:
        case COVE_E_CONFLICT:
                return 400;
        case COVE_E_NOT_FOUND:
                return 404;
        case COVE_E_LIMIT:
                return 507;
        case COVE_E_UNAUTHORIZED:
                return 401;
        case COVE_E_UNAVAILABLE:
                return 503;
        default:
                return 500;
        }
}

/* What E2B's proxy answers for a sandbox that is not running (the SDK's isRunning() is
 * false exactly on 502). */
static int reply_gone(struct cove_req *r, const char *id)
{
        return cove_reply_json(r, 502,
                               json_pack("{s:s, s:s, s:i}", "sandboxId", id ? id : "", "message",
                                         "The sandbox was not found", "code", 502));
}

/* ---- request context: sandbox, access, user ----------------------------------------- */

struct ctx {
        struct cove_e2b *e;
        char id[64];
        struct cove_chan *c; /* referenced */
        char user[64];
        char home[128];
        char *env_json;      /* the sandbox's default env (owned) */
        char workdir[1024];  /* the template image's WORKDIR: the default cwd ("" none) */
        uint64_t disk_bytes; /* the sandbox's disk size: bounds a decompressed upload */
};

/* The template image's WORKDIR of the sandbox in row, for commands that name no cwd. */
static void ctx_workdir(struct ctx *x, const struct cove_sandbox_row *row)
{
        json_t *cfg = coved_template_config(x->e->d, row->tenant, row->template_name);
        const char *w = json_string_value(json_object_get(cfg, "workdir"));
        snprintf(x->workdir, sizeof(x->workdir), "%s", w && w[0] == '/' ? w : "");
        json_decref(cfg);
}

static void ctx_clear(struct ctx *x)
{
        if (x->c)
                cove_chan_unref(x->c);
        x->c = NULL;
        free(x->env_json);
        x->env_json = NULL;
}

static int valid_user(const char *u)
{
        size_t n = strlen(u);
        if (n == 0 || n > 32)
                return 0;
        for (size_t i = 0; i < n; i++)
                if (!(isalnum((unsigned char)u[i]) || u[i] == '_' || u[i] == '-' || u[i] == '.'))
                        return 0;
        return 1;
}

static void set_user(struct ctx *x, const char *u)
{
        snprintf(x->user, sizeof(x->user), "%s", u && *u ? u : COVE_E2B_USER);
        if (!strcmp(x->user, "root"))
                snprintf(x->home, sizeof(x->home), "/root");
        else
                snprintf(x->home, sizeof(x->home), "/home/%s", x->user);
}

/* A request a control replica forwarded to this node's API (api/forward.h): the replica
 * checked the access token or signature (it holds the secret; a node does not) and sends
 * the sandbox in E2b-Sandbox-Id and the RPC's user in X-Cove-E2b-User. */
static int trusted(struct cove_req *r)
{
        return !strncmp(r->key_id, "node:", 5);
}

/* The user of an RPC: "Authorization: Basic base64(user:)" or the default. */
static int user_from_auth(struct cove_req *r, struct ctx *x)
{
        if (trusted(r)) {
                const char *u = cove_req_header(r, "X-Cove-E2b-User");
                if (u && *u && !valid_user(u))
                        return -1;
                set_user(x, u);
                return 0;
        }
        const char *a = cove_req_header(r, "Authorization");
        if (!a || strncasecmp(a, "Basic ", 6) != 0) {
                set_user(x, NULL);
                return 0;
        }
        size_t n;
        cleanup_free unsigned char *dec = b64_decode(a + 6, &n);
        if (!dec || n >= 64)
                return -1;
        dec[n] = '\0';
        char *colon = strchr((char *)dec, ':');
        if (colon)
                *colon = '\0';
        if (*dec && !valid_user((char *)dec))
                return -1;
        set_user(x, (char *)dec);
        return 0;
}

/* Sandbox id (and port) from E2b-Sandbox-Id/-Port or a "{port}-{id}.domain" Host. */
static void target(struct cove_req *r, char *id, size_t cap, long *port)
{
        id[0] = '\0';
        *port = COVE_E2B_ENVD_PORT;
        const char *h = cove_req_header(r, "E2b-Sandbox-Id");
        const char *p = cove_req_header(r, "E2b-Sandbox-Port");
        if (h && *h) {
                snprintf(id, cap, "%s", h);
                if (p && *p)
                        *port = strtol(p, NULL, 10);
                return;
        }
        const char *host = cove_req_header(r, "Host");
        if (!host)
                return;
        char *end;
        long pt = strtol(host, &end, 10);
        if (end == host || *end != '-')
                return;
        const char *s = end + 1, *dot = strchr(s, '.');
        size_t n = dot ? (size_t)(dot - s) : strcspn(s, ":");
        if (n == 0 || n >= cap)
                return;
        memcpy(id, s, n);
        id[n] = '\0';
        *port = pt;
}

/* Fill x for a running sandbox; answers (502, 401, …) itself and returns -1 on failure.
 * need_token: X-Access-Token must match (else the caller checks a signature). */
static int resolve(struct cove_e2b *e, struct cove_req *r, struct ctx *x, int need_token, int rpc)
{
        memset(x, 0, sizeof(*x));
        x->e = e;
        long port;
        target(r, x->id, sizeof(x->id), &port);
        if (!x->id[0])
                return http_error(r, 400,
                                  "which sandbox? send the E2b-Sandbox-Id header (set "
                                  "E2B_SANDBOX_URL for the SDK)"),
                       -1;
        if (port != COVE_E2B_ENVD_PORT)
                return cove_reply_json(r, 502,
                                       json_pack("{s:s, s:s, s:i, s:i}", "sandboxId", x->id,
                                                 "message",
                                                 "cove serves only envd (port 49983) of a "
                                                 "sandbox: forwarding other ports is not "
                                                 "supported",
                                                 "port", (int)port, "code", 502)),
                       -1;
        struct cove_sandbox_row row;
        struct cove_err err;
        if (cove_sandbox_chan(e->d, NULL, x->id, &x->c, &row, &err) < 0)
                return reply_gone(r, x->id), -1;
        x->env_json = row.env_json;
        row.env_json = NULL;
        x->disk_bytes = (uint64_t)(row.disk_mb > 0 ? row.disk_mb : 1) << 20;
        ctx_workdir(x, &row);
        cove_sandbox_row_clear(&row);
        const char *tok = cove_req_header(r, "X-Access-Token");
        if (need_token && !trusted(r)) {
                char want[COVE_E2B_TOKEN_HEX];
                cove_e2b_token(e, x->id, want);
                if (!tok || strlen(tok) != strlen(want) ||
                    CRYPTO_memcmp(tok, want, strlen(want)) != 0) {
                        ctx_clear(x);
                        return (rpc ? rpc_error(r, "unauthenticated",
                                                "missing or wrong X-Access-Token")
                                    : http_error(r, 401, "missing or wrong X-Access-Token")),
                               -1;
                }
        }
        if (user_from_auth(r, x) < 0) {
                ctx_clear(x);
                return (rpc ? rpc_error(r, "invalid_argument", "bad Authorization header")
                            : http_error(r, 400, "bad Authorization header")),
                       -1;
        }
        return 0;
}

/* Absolute path inside the sandbox: relative paths and "~" resolve against the home of
 * the request's user, as envd does. Returns 0 or -1 (empty, too long, NUL). */
static int abs_path(const struct ctx *x, const char *p, char *out, size_t cap)
{
        if (!p)
                p = "";
        int n;
        if (p[0] == '/')
                n = snprintf(out, cap, "%s", p);
        else if (!p[0] || !strcmp(p, "~"))
                n = snprintf(out, cap, "%s", x->home);
        else if (!strncmp(p, "~/", 2))
                n = snprintf(out, cap, "%s/%s", x->home, p + 2);
        else
                n = snprintf(out, cap, "%s/%s", x->home, p);
        return n < 0 || (size_t)n >= cap || n > PATH_MAX_LEN ? -1 : 0;
}

/* ---- Connect request bodies --------------------------------------------------------- */

/* The request message: a bare JSON body (unary) or one envelope (server streams). */
static json_t *rpc_body(struct cove_req *r, int stream)
{
        const char *b = r->body ? r->body : "";
        size_t n = r->body_len;
        if (stream) {
                if (n < 5) {
                        rpc_error(r, "invalid_argument", "expected one Connect envelope");
                        return NULL;
                }
                if (b[0] & 1) {
                        rpc_error(r, "unimplemented", "compressed messages are not supported");
                        return NULL;
                }
                uint32_t len = (uint32_t)(unsigned char)b[1] << 24 |
                               (uint32_t)(unsigned char)b[2] << 16 |
                               (uint32_t)(unsigned char)b[3] << 8 | (unsigned char)b[4];
                if (len > n - 5) {
                        rpc_error(r, "invalid_argument", "truncated Connect envelope");
                        return NULL;
                }
                b += 5;
                n = len;
        }
        if (n == 0)
                return json_object();
        json_error_t je;
        json_t *j = json_loadb(b, n, 0, &je);
        if (!json_is_object(j)) {
                json_decref(j);
                rpc_error(r, "invalid_argument", "request is not a JSON object: %s", je.text);
                return NULL;
        }
        return j;
}

static int is_stream_req(struct cove_req *r)
{
        const char *ct = cove_req_header(r, "Content-Type");
        return ct && !strncmp(ct, "application/connect+", 20);
}

/* A JSON uint32 (number or decimal string); 0 when absent or invalid. */
static uint32_t json_u32(json_t *v)
{
        if (json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) < 1L << 32)
                return (uint32_t)json_integer_value(v);
        if (json_is_string(v)) {
                char *end;
                unsigned long u = strtoul(json_string_value(v), &end, 10);
                if (!*end && u < 1UL << 32)
                        return (uint32_t)u;
        }
        return 0;
}

/* ProcessSelector {pid} | {tag} → pid (0 and answered not_found when unknown). */
static uint32_t select_pid(struct cove_req *r, struct ctx *x, json_t *sel, int running_only)
{
        uint32_t pid = json_u32(json_object_get(sel, "pid"));
        const char *tag = json_string_value(json_object_get(sel, "tag"));
        json_t *list = cove_chan_proc_list(x->c), *p;
        size_t i;
        uint32_t found = 0;
        json_array_foreach(json_object_get(list, "processes"), i, p)
        {
                uint32_t ppid = json_u32(json_object_get(p, "pid"));
                const char *ptag = json_string_value(json_object_get(p, "tag"));
                int match = pid ? ppid == pid : (tag && ptag && !strcmp(tag, ptag));
                if (match && (!running_only || json_is_true(json_object_get(p, "running"))))
                        found = ppid;
        }
        json_decref(list);
        if (!found) {
                if (pid)
                        rpc_error(r, "not_found", "process with pid %u not found", pid);
                else
                        rpc_error(r, "not_found", "process with tag \"%.64s\" not found",
                                  tag ? tag : "");
        }
        return found;
}

/* ---- Connect server streams ------------------------------------------------------- */

enum { FS_RUN, FS_FINISH, FS_ABORT };

struct fstream {
        struct cove_e2b *e;
        struct cove_chan *c;
        struct cove_watch *w; /* WatchDir */
        uint32_t pid;         /* process streams */
        uint64_t after;
        int state;
        char *buf;
        size_t len, off, cap;
        int64_t last_ns, keep_ns;
        char root[PATH_MAX_LEN + 2]; /* WatchDir: event paths are relative to this */
        int include_entry;
        struct cove_stream_hup *hup; /* ends an idle wait when the client goes */
};

static void fs_wake(void *c)
{
        cove_chan_wake(c);
}

static void fs_free(void *p)
{
        struct fstream *s = p;
        cove_stream_hup_release(s->hup);
        if (s->w)
                cove_chan_watch_free(s->w);
        if (s->c)
                cove_chan_unref(s->c);
        free(s->buf);
        free(s);
}

static int fs_put(struct fstream *s, uint8_t flags, json_t *o)
{
        char *j = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        if (!j)
                return -1;
        size_t n = strlen(j);
        if (s->len + n + 5 > s->cap) {
                size_t nc = (s->len + n + 5) * 2;
                char *nb = realloc(s->buf, nc);
                if (!nb) {
                        free(j);
                        return -1;
                }
                s->buf = nb;
                s->cap = nc;
        }
        unsigned char *h = (unsigned char *)s->buf + s->len;
        h[0] = flags;
        h[1] = (unsigned char)(n >> 24);
        h[2] = (unsigned char)(n >> 16);
        h[3] = (unsigned char)(n >> 8);
        h[4] = (unsigned char)n;
        memcpy(s->buf + s->len + 5, j, n);
        s->len += n + 5;
        free(j);
        s->last_ns = cove_mono_ns();
        return 0;
}

/* The mandatory last frame: {} or {"error":{code,message}}. */
static int fs_end(struct fstream *s, const char *code, const char *msg)
{
        s->state = FS_FINISH;
        return fs_put(s, 0x02,
                      code ? json_pack("{s:{s:s, s:s}}", "error", "code", code, "message", msg)
                           : json_object());
}

static const char *signame_go(const char *sig)
{
        static const struct {
                const char *name, *go;
        } m[] = {{"KILL", "killed"},
                 {"TERM", "terminated"},
                 {"INT", "interrupt"},
                 {"HUP", "hangup"},
                 {"QUIT", "quit"},
                 {"SEGV", "segmentation fault"},
                 {"ABRT", "aborted"},
                 {"PIPE", "broken pipe"},
                 {"USR1", "user defined signal 1"},
                 {"USR2", "user defined signal 2"},
                 {"ALRM", "alarm clock"},
                 {"BUS", "bus error"}};
        for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++)
                if (!strcmp(m[i].name, sig))
                        return m[i].go;
        return NULL;
}

/* The guest's EXIT → envd's EndEvent (Go's ProcessState: -1 and "signal: killed" for a
 * signalled process, "exit status N" as the error of a non-zero exit). */
static json_t *end_event(const struct cove_ev *ev)
{
        json_error_t je;
        json_t *x = json_loadb((const char *)ev->data, ev->len, 0, &je);
        json_t *code = json_object_get(x, "exit_code");
        const char *sig = json_string_value(json_object_get(x, "signal"));
        char status[96];
        json_t *end;
        if (json_is_integer(code)) {
                int c = (int)json_integer_value(code);
                snprintf(status, sizeof(status), "exit status %d", c);
                end = json_pack("{s:i, s:b, s:s}", "exitCode", c, "exited", 1, "status", status);
                if (c != 0)
                        json_object_set_new(end, "error", json_string(status));
        } else {
                const char *go = sig ? signame_go(sig) : NULL;
                snprintf(status, sizeof(status), "signal: %s", go ? go : sig ? sig : "unknown");
                end = json_pack("{s:i, s:b, s:s, s:s}", "exitCode", -1, "exited", 0, "status",
                                status, "error", status);
        }
        json_decref(x);
        return json_pack("{s:{s:o}}", "event", "end", end);
}

static json_t *data_event(const struct cove_ev *ev)
{
        const char *k = ev->type == COVE_EV_STDOUT   ? "stdout"
                        : ev->type == COVE_EV_STDERR ? "stderr"
                                                     : "pty";
        char *b = cove_b64(ev->data, ev->len);
        if (!b)
                return NULL;
        json_t *o = json_pack("{s:{s:{s:s}}}", "event", "data", k, b);
        free(b);
        return o;
}

static json_t *entry_json(json_t *e);

static const char *watch_type(const char *t)
{
        if (!t)
                return NULL;
        if (!strcmp(t, "create"))
                return "EVENT_TYPE_CREATE";
        if (!strcmp(t, "write"))
                return "EVENT_TYPE_WRITE";
        if (!strcmp(t, "remove"))
                return "EVENT_TYPE_REMOVE";
        if (!strcmp(t, "rename"))
                return "EVENT_TYPE_RENAME";
        if (!strcmp(t, "chmod"))
                return "EVENT_TYPE_CHMOD";
        return NULL;
}

/* One watch event → FilesystemEvent {name (relative to the watched dir), type, entry?}. */
static json_t *watch_event(struct fstream *s, const struct cove_ev *ev)
{
        json_error_t je;
        json_t *x = json_loadb((const char *)ev->data, ev->len, 0, &je);
        const char *path = json_string_value(json_object_get(x, "path"));
        const char *type = watch_type(json_string_value(json_object_get(x, "type")));
        json_t *o = NULL;
        if (path && type) {
                size_t rl = strlen(s->root);
                const char *name = path;
                if (!strncmp(path, s->root, rl) && path[rl] == '/')
                        name = path + rl + 1;
                else if (!strcmp(path, s->root))
                        name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
                json_t *fe = json_pack("{s:s, s:s}", "name", name, "type", type);
                if (s->include_entry && strcmp(type, "EVENT_TYPE_REMOVE") &&
                    strcmp(type, "EVENT_TYPE_RENAME")) {
                        json_t *req = json_pack("{s:s, s:s}", "op", "stat", "path", path), *resp;
                        struct cove_err err;
                        if (cove_chan_call(s->c, req, &resp, 0, &err) == 0) {
                                json_t *en = entry_json(json_object_get(resp, "entry"));
                                if (en)
                                        json_object_set_new(fe, "entry", en);
                                json_decref(resp);
                        }
                        json_decref(req);
                }
                o = json_pack("{s:o}", "filesystem", fe);
        }
        json_decref(x);
        return o;
}

/* Produce the next frames, waiting up to wait_ms for an event (or the client's going). 1
 * produced, 0 nothing yet, -1 failed (abort). */
static int fs_produce(struct fstream *s, int wait_ms)
{
        struct cove_ev *ev = NULL;
        uint64_t lost = 0;
        struct cove_err err;
        const int *gone = cove_stream_hup_flag(s->hup);
        int rc = s->w
                     ? cove_chan_watch_wait(s->w, s->after, &ev, &lost, wait_ms, gone, &err)
                     : cove_chan_proc_wait(s->c, s->pid, s->after, &ev, &lost, wait_ms, gone, &err);
        if (rc == 0)
                return 0;
        if (rc == 2) { /* dropped from the replay buffer: continue after the gap */
                s->after = lost;
                return 0;
        }
        if (rc != 1) /* stream ended without an exit: the sandbox went away */
                return -1;
        s->after = ev->seq;
        json_t *o = NULL;
        int r = 0;
        switch (ev->type) {
        case COVE_EV_STDOUT:
        case COVE_EV_STDERR:
        case COVE_EV_PTY:
                o = data_event(ev);
                r = o ? fs_put(s, 0, o) : -1;
                break;
        case COVE_EV_EXIT:
                r = fs_put(s, 0, end_event(ev));
                if (r == 0)
                        r = fs_end(s, NULL, NULL);
                break;
        case COVE_EV_JSON:
                o = watch_event(s, ev);
                if (o)
                        r = fs_put(s, 0, o);
                break;
        case COVE_EV_ERROR: /* the sandbox stopped: cut the stream, as E2B does */
                r = -1;
                break;
        default:
                break;
        }
        free(ev);
        return r < 0 ? -1 : 1;
}

static ssize_t fs_read(void *ctx, uint64_t pos, char *buf, size_t max)
{
        struct fstream *s = ctx;
        while (s->off >= s->len) {
                s->off = s->len = 0;
                if (s->state == FS_FINISH)
                        return -1; /* clean end of the chunked body */
                if (s->state == FS_ABORT || s->e->d->quitting || cove_stream_hup_gone(s->hup))
                        return -2; /* cut: no end-stream frame */
                /* nothing to send: wait for an event until the next keepalive is due */
                int64_t left = (s->keep_ns - (cove_mono_ns() - s->last_ns)) / 1000000;
                if (left > COVE_STREAM_IDLE_MS)
                        left = COVE_STREAM_IDLE_MS;
                int r = fs_produce(s, left > 0 ? (int)left : 0);
                if (r < 0) {
                        s->state = FS_ABORT;
                        continue;
                }
                if (r == 0 && s->len == 0) {
                        if (cove_mono_ns() - s->last_ns < s->keep_ns)
                                return 0;
                        json_t *k = s->w ? json_pack("{s:{}}", "keepalive")
                                         : json_pack("{s:{s:{}}}", "event", "keepalive");
                        if (fs_put(s, 0, k) < 0)
                                s->state = FS_ABORT;
                }
        }
        size_t n = s->len - s->off;
        if (n > max)
                n = max;
        memcpy(buf, s->buf + s->off, n);
        s->off += n;
        return (ssize_t)n;
}

static struct fstream *fs_new(struct cove_e2b *e, struct cove_req *r)
{
        struct fstream *s = calloc(1, sizeof(*s));
        if (!s)
                return NULL;
        s->e = e;
        const char *k = cove_req_header(r, "Keepalive-Ping-Interval");
        long ks = k ? strtol(k, NULL, 10) : 0;
        if (ks <= 0 || ks > 3600)
                ks = KEEPALIVE_DEFAULT_S;
        s->keep_ns = ks * 1000000000LL;
        s->last_ns = cove_mono_ns();
        return s;
}

/* Answer a server stream whose frames so far are in s (takes s and its references). */
static int fs_reply(struct cove_req *r, struct fstream *s)
{
        if (s->c)
                s->hup = cove_req_hup(r, fs_wake, s->c);
        return cove_reply_stream(r, 200, "application/connect+json", -1, fs_read, fs_free, s);
}

/* A server stream that fails before it starts: 200 with only the end-stream frame. */
static int stream_error(struct cove_e2b *e, struct cove_req *r, const char *code, const char *msg)
{
        struct fstream *s = fs_new(e, r);
        if (!s || fs_end(s, code, msg) < 0) {
                if (s)
                        fs_free(s);
                return rpc_error(r, "internal", "out of memory");
        }
        return fs_reply(r, s);
}

/* ---- process.Process ------------------------------------------------------------- */

static int exec_start(struct ctx *x, json_t *body, uint32_t *pid, struct cove_err *err)
{
        json_t *req = NULL, *cmd = NULL;
        char why[256];
        if (cove_exec_request_build(body, x->env_json, &req, &cmd, why, sizeof(why)) < 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "%s", why);
        int rc = cove_chan_exec(x->c, req, json_string_value(json_object_get(body, "tag")), cmd,
                                pid, err);
        json_decref(req);
        json_decref(cmd);
        pthread_mutex_lock(&x->e->d->mu);
        x->e->d->m.execs++;
        pthread_mutex_unlock(&x->e->d->mu);
        return rc;
}

/* Answer with the Connect stream of process pid: the start event, then its events (the
 * stream takes over x's channel reference). */
static int process_stream(struct cove_e2b *e, struct cove_req *r, struct ctx *x, uint32_t pid)
{
        struct fstream *s = fs_new(e, r);
        if (!s ||
            fs_put(s, 0, json_pack("{s:{s:{s:I}}}", "event", "start", "pid", (json_int_t)pid)) <
                0) {
                if (s)
                        fs_free(s);
                return rpc_error(r, "internal", "out of memory");
        }
        s->c = x->c;
        x->c = NULL;
        s->pid = pid;
        return fs_reply(r, s);
}

static int h_process_start(struct cove_e2b *e, struct cove_req *r, struct ctx *x, json_t *b)
{
        json_t *proc = json_object_get(b, "process");
        const char *cmd = json_string_value(json_object_get(proc, "cmd"));
        if (!cmd || !*cmd)
                return stream_error(e, r, "invalid_argument", "process.cmd is required");
        json_t *argv = json_pack("[s]", cmd), *a;
        size_t i;
        json_array_foreach(json_object_get(proc, "args"), i, a) json_array_append(argv, a);
        json_t *body = json_pack("{s:o, s:s}", "cmd", argv, "user", x->user);
        json_t *envs = json_object_get(proc, "envs");
        if (json_is_object(envs))
                json_object_set(body, "env", envs);
        const char *cwd = json_string_value(json_object_get(proc, "cwd"));
        char path[PATH_MAX_LEN + 256];
        if (cwd && *cwd) {
                if (abs_path(x, cwd, path, sizeof(path)) < 0) {
                        json_decref(body);
                        return stream_error(e, r, "invalid_argument", "cwd is too long");
                }
                json_object_set_new(body, "cwd", json_string(path));
        } else if (x->workdir[0]) {
                json_object_set_new(body, "cwd", json_string(x->workdir));
        }
        json_t *pty = json_object_get(json_object_get(b, "pty"), "size");
        if (pty)
                json_object_set_new(body, "pty",
                                    json_pack("{s:O, s:O}", "cols", json_object_get(pty, "cols"),
                                              "rows", json_object_get(pty, "rows")));
        /* a PTY takes its input through stdin */
        json_object_set_new(body, "stdin",
                            json_boolean(pty || json_is_true(json_object_get(b, "stdin"))));
        json_t *tag = json_object_get(b, "tag");
        if (json_is_string(tag))
                json_object_set(body, "tag", tag);
        /* envd kills the process when the request's Connect-Timeout-Ms passes */
        const char *tm = cove_req_header(r, "Connect-Timeout-Ms");
        long ms = tm ? strtol(tm, NULL, 10) : 0;
        if (ms > 0)
                json_object_set_new(body, "timeout_s", json_integer((ms + 999) / 1000));
        uint32_t pid = 0;
        struct cove_err err;
        int rc = exec_start(x, body, &pid, &err);
        if (rc < 0 && err.kind == COVE_E_NOT_FOUND && !strcmp(cmd, "/bin/bash")) {
                /* templates without bash (busybox): the SDK always asks for bash -l -c */
                json_array_set_new(json_object_get(body, "cmd"), 0, json_string("/bin/sh"));
                rc = exec_start(x, body, &pid, &err);
        }
        json_decref(body);
        if (rc < 0)
                return stream_error(e, r, connect_code(err.kind), err.msg);
        return process_stream(e, r, x, pid);
}

static int h_process_connect(struct cove_e2b *e, struct cove_req *r, struct ctx *x, json_t *b)
{
        json_t *sel = json_object_get(b, "process");
        uint32_t pid = json_u32(json_object_get(sel, "pid"));
        const char *tag = json_string_value(json_object_get(sel, "tag"));
        json_t *list = cove_chan_proc_list(x->c), *p;
        size_t i;
        uint32_t found = 0;
        json_array_foreach(json_object_get(list, "processes"), i, p)
        {
                uint32_t ppid = json_u32(json_object_get(p, "pid"));
                const char *ptag = json_string_value(json_object_get(p, "tag"));
                if ((pid ? ppid == pid : (tag && ptag && !strcmp(tag, ptag))) &&
                    json_is_true(json_object_get(p, "running")))
                        found = ppid;
        }
        json_decref(list);
        if (!found)
                return stream_error(e, r, "not_found", "process not found");
        return process_stream(e, r, x, found);
}

static int h_process_list(struct cove_req *r, struct ctx *x)
{
        json_t *list = cove_chan_proc_list(x->c), *p, *out = json_array();
        size_t i;
        json_array_foreach(json_object_get(list, "processes"), i, p)
        {
                if (!json_is_true(json_object_get(p, "running")))
                        continue;
                json_t *argv = json_object_get(p, "cmd"), *args = json_array();
                for (size_t k = 1; k < json_array_size(argv); k++)
                        json_array_append(args, json_array_get(argv, k));
                const char *c0 = json_string_value(json_array_get(argv, 0));
                json_t *o = json_pack("{s:{s:s, s:o, s:{}}, s:O}", "config", "cmd", c0 ? c0 : "",
                                      "args", args, "envs", "pid", json_object_get(p, "pid"));
                const char *tag = json_string_value(json_object_get(p, "tag"));
                if (tag && *tag)
                        json_object_set_new(o, "tag", json_string(tag));
                json_array_append_new(out, o);
        }
        json_decref(list);
        return cove_reply_json(r, 200, json_pack("{s:o}", "processes", out));
}

static int h_process_input(struct cove_req *r, struct ctx *x, json_t *b, int close_stdin)
{
        uint32_t pid = select_pid(r, x, json_object_get(b, "process"), 0);
        if (!pid)
                return 0;
        struct cove_err err;
        int rc;
        if (close_stdin) {
                rc = cove_chan_proc_stdin(x->c, pid, "", 0, 1, &err);
        } else {
                json_t *in = json_object_get(b, "input");
                const char *d = json_string_value(json_object_get(in, "stdin"));
                if (!d)
                        d = json_string_value(json_object_get(in, "pty"));
                size_t n = 0;
                cleanup_free unsigned char *bytes = b64_decode(d ? d : "", &n);
                if (!bytes)
                        return rpc_error(r, "invalid_argument", "input must be base64");
                rc = n ? cove_chan_proc_stdin(x->c, pid, bytes, n, 0, &err) : 0;
        }
        if (rc < 0)
                return rpc_err(r, &err);
        return cove_reply_json(r, 200, json_object());
}

static int h_process_signal(struct cove_req *r, struct ctx *x, json_t *b)
{
        uint32_t pid = select_pid(r, x, json_object_get(b, "process"), 0);
        if (!pid)
                return 0;
        json_t *sg = json_object_get(b, "signal");
        const char *name = NULL;
        if ((json_is_string(sg) && !strcmp(json_string_value(sg), "SIGNAL_SIGKILL")) ||
            (json_is_integer(sg) && json_integer_value(sg) == 9))
                name = "KILL";
        else if ((json_is_string(sg) && !strcmp(json_string_value(sg), "SIGNAL_SIGTERM")) ||
                 (json_is_integer(sg) && json_integer_value(sg) == 15))
                name = "TERM";
        if (!name)
                return rpc_error(r, "invalid_argument",
                                 "signal must be SIGNAL_SIGKILL or "
                                 "SIGNAL_SIGTERM");
        json_t *req = json_pack("{s:s, s:I, s:s}", "op", "signal", "pid", (json_int_t)pid, "signal",
                                name),
               *resp = NULL;
        struct cove_err err;
        int rc = cove_chan_call(x->c, req, &resp, 0, &err);
        json_decref(req);
        json_decref(resp);
        return rc < 0 ? rpc_err(r, &err) : cove_reply_json(r, 200, json_object());
}

static int h_process_update(struct cove_req *r, struct ctx *x, json_t *b)
{
        uint32_t pid = select_pid(r, x, json_object_get(b, "process"), 0);
        if (!pid)
                return 0;
        json_t *size = json_object_get(json_object_get(b, "pty"), "size");
        if (!size)
                return cove_reply_json(r, 200, json_object());
        json_int_t cols = json_integer_value(json_object_get(size, "cols"));
        json_int_t rows = json_integer_value(json_object_get(size, "rows"));
        if (cols < 1 || cols > 10000 || rows < 1 || rows > 10000)
                return rpc_error(r, "invalid_argument", "pty size must be 1..10000");
        json_t *req = json_pack("{s:s, s:I, s:I, s:I}", "op", "resize", "pid", (json_int_t)pid,
                                "cols", cols, "rows", rows),
               *resp = NULL;
        struct cove_err err;
        int rc = cove_chan_call(x->c, req, &resp, 0, &err);
        json_decref(req);
        json_decref(resp);
        return rc < 0 ? rpc_err(r, &err) : cove_reply_json(r, 200, json_object());
}

static int h_process(void *app, struct cove_req *r)
{
        struct cove_e2b *e = app;
        const char *m = r->params[0];
        int stream = !strcmp(m, "Start") || !strcmp(m, "Connect");
        if (!strcmp(m, "StreamInput"))
                return rpc_error(r, "unimplemented",
                                 "StreamInput is not supported (use SendInput)");
        json_t *b = rpc_body(r, stream && is_stream_req(r));
        if (!b)
                return 0;
        struct ctx x;
        if (resolve(e, r, &x, 1, 1) < 0) {
                json_decref(b);
                return 0;
        }
        int rc;
        if (!strcmp(m, "Start"))
                rc = h_process_start(e, r, &x, b);
        else if (!strcmp(m, "Connect"))
                rc = h_process_connect(e, r, &x, b);
        else if (!strcmp(m, "List"))
                rc = h_process_list(r, &x);
        else if (!strcmp(m, "SendInput"))
                rc = h_process_input(r, &x, b, 0);
        else if (!strcmp(m, "CloseStdin"))
                rc = h_process_input(r, &x, b, 1);
        else if (!strcmp(m, "SendSignal"))
                rc = h_process_signal(r, &x, b);
        else if (!strcmp(m, "Update"))
                rc = h_process_update(r, &x, b);
        else
                rc = rpc_error(r, "unimplemented", "process.Process/%.64s is not implemented", m);
        json_decref(b);
        ctx_clear(&x);
        return rc;
}

/* ---- filesystem.Filesystem -------------------------------------------------------- */

#define META_MAX 32 /* file metadata: keys per file, bytes per value (as the guest bounds) */
#define META_VAL_MAX 1024

/* A guest's file metadata {key: text}, checked and bounded; NULL if none or malformed. */
static json_t *meta_clean(json_t *m)
{
        if (!json_is_object(m) || !json_object_size(m) || json_object_size(m) > META_MAX)
                return NULL;
        const char *k;
        json_t *v;
        json_object_foreach(m, k, v)
        {
                if (!*k || strlen(k) > 200 || !json_is_string(v) ||
                    json_string_length(v) > META_VAL_MAX ||
                    strlen(json_string_value(v)) != json_string_length(v))
                        return NULL;
        }
        return json_deep_copy(m);
}

/* A guest entry {name, path, type, size, mode, mtime, owner, group, link?, metadata?} →
 * envd's EntryInfo. */
static json_t *entry_json(json_t *e)
{
        if (!json_is_object(e))
                return NULL;
        const char *type = json_string_value(json_object_get(e, "type"));
        const char *ft = "FILE_TYPE_UNSPECIFIED";
        char tc = '-';
        if (type && !strcmp(type, "file"))
                ft = "FILE_TYPE_FILE";
        else if (type && !strcmp(type, "dir"))
                ft = "FILE_TYPE_DIRECTORY", tc = 'd';
        else if (type && !strcmp(type, "symlink"))
                ft = "FILE_TYPE_SYMLINK", tc = 'L';
        unsigned mode = (unsigned)json_integer_value(json_object_get(e, "mode")) & 0777;
        char perm[11] = {tc};
        const char *rwx = "rwxrwxrwx";
        for (int i = 0; i < 9; i++)
                perm[1 + i] = (mode & (0400u >> i)) ? rwx[i] : '-';
        perm[10] = '\0';
        char size[32];
        snprintf(size, sizeof(size), "%lld",
                 (long long)json_integer_value(json_object_get(e, "size")));
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *path = json_string_value(json_object_get(e, "path"));
        json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:i, s:s}", "name", name ? name : "", "type",
                              ft, "path", path ? path : "", "size", size, "mode", (int)mode,
                              "permissions", perm);
        json_t *mt = json_object_get(e, "mtime");
        if (json_is_string(mt))
                json_object_set(o, "modifiedTime", mt);
        /* from the guest: only bounded text is passed on */
        static const char *const names[][2] = {
            {"owner", "owner"}, {"group", "group"}, {"link", "symlinkTarget"}};
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
                json_t *v = json_object_get(e, names[i][0]);
                if (json_is_string(v) && json_string_length(v) <= PATH_MAX_LEN &&
                    strlen(json_string_value(v)) == json_string_length(v))
                        json_object_set(o, names[i][1], v);
        }
        json_t *m = meta_clean(json_object_get(e, "metadata"));
        if (m)
                json_object_set_new(o, "metadata", m);
        return o;
}

static int fs_call(struct ctx *x, json_t *req, json_t **resp, struct cove_err *err)
{
        json_object_set_new(req, "user", json_string(x->user));
        int rc = cove_chan_call(x->c, req, resp, 0, err);
        json_decref(req);
        return rc;
}

static int body_path(struct cove_req *r, struct ctx *x, json_t *b, const char *key, char *out,
                     size_t cap)
{
        const char *p = json_string_value(json_object_get(b, key));
        if (!p || strlen(p) != json_string_length(json_object_get(b, key)) ||
            abs_path(x, p, out, cap) < 0)
                return rpc_error(r, "invalid_argument", "%s must be a path", key), -1;
        return 0;
}

static int h_fs_entry(struct cove_req *r, struct ctx *x, json_t *req)
{
        json_t *resp = NULL;
        struct cove_err err;
        if (fs_call(x, req, &resp, &err) < 0)
                return rpc_err(r, &err);
        json_t *en = entry_json(json_object_get(resp, "entry"));
        json_decref(resp);
        return cove_reply_json(r, 200, json_pack("{s:o}", "entry", en ? en : json_object()));
}

static int h_fs_watch(struct cove_e2b *e, struct cove_req *r, struct ctx *x, const char *path,
                      json_t *b)
{
        /* envd refuses a path that is not a directory */
        json_t *resp = NULL;
        struct cove_err err;
        if (fs_call(x, json_pack("{s:s, s:s}", "op", "stat", "path", path), &resp, &err) < 0)
                return stream_error(e, r, connect_code(err.kind), err.msg);
        int dir = !strcmp(json_string_value(json_object_get(json_object_get(resp, "entry"), "type"))
                              ?: "",
                          "dir");
        json_decref(resp);
        if (!dir)
                return stream_error(e, r, "invalid_argument", "path is not a directory");
        struct cove_watch *w = NULL;
        if (cove_chan_watch(x->c, path, json_is_true(json_object_get(b, "recursive")), &w, &err) <
            0)
                return stream_error(e, r, connect_code(err.kind), err.msg);
        struct fstream *s = fs_new(e, r);
        if (!s || fs_put(s, 0, json_pack("{s:{}}", "start")) < 0) {
                cove_chan_watch_free(w);
                if (s)
                        fs_free(s);
                return rpc_error(r, "internal", "out of memory");
        }
        snprintf(s->root, sizeof(s->root), "%s", path);
        size_t rl = strlen(s->root);
        while (rl > 1 && s->root[rl - 1] == '/')
                s->root[--rl] = '\0';
        s->include_entry = json_is_true(json_object_get(b, "includeEntry"));
        s->w = w;
        s->c = x->c;
        x->c = NULL;
        return fs_reply(r, s);
}

static int h_filesystem(void *app, struct cove_req *r)
{
        struct cove_e2b *e = app;
        const char *m = r->params[0];
        int stream = !strcmp(m, "WatchDir");
        json_t *b = rpc_body(r, stream && is_stream_req(r));
        if (!b)
                return 0;
        struct ctx x;
        if (resolve(e, r, &x, 1, 1) < 0) {
                json_decref(b);
                return 0;
        }
        char p1[PATH_MAX_LEN + 256], p2[PATH_MAX_LEN + 256];
        int rc = 0;
        struct cove_err err;
        json_t *resp = NULL;
        if (!strcmp(m, "Stat")) {
                if (body_path(r, &x, b, "path", p1, sizeof(p1)) == 0)
                        rc = h_fs_entry(r, &x, json_pack("{s:s, s:s}", "op", "stat", "path", p1));
        } else if (!strcmp(m, "ListDir")) {
                json_int_t depth = json_integer_value(json_object_get(b, "depth"));
                if (depth < 1)
                        depth = 1;
                if (depth > 64)
                        depth = 64;
                if (body_path(r, &x, b, "path", p1, sizeof(p1)) == 0) {
                        if (fs_call(&x,
                                    json_pack("{s:s, s:s, s:I}", "op", "list", "path", p1, "depth",
                                              depth),
                                    &resp, &err) < 0) {
                                rc = rpc_err(r, &err);
                        } else {
                                json_t *arr = json_array(), *en;
                                size_t i;
                                json_array_foreach(json_object_get(resp, "entries"), i, en)
                                {
                                        json_t *o = entry_json(en);
                                        if (o)
                                                json_array_append_new(arr, o);
                                }
                                json_decref(resp);
                                rc = cove_reply_json(r, 200, json_pack("{s:o}", "entries", arr));
                        }
                }
        } else if (!strcmp(m, "MakeDir")) {
                if (body_path(r, &x, b, "path", p1, sizeof(p1)) == 0) {
                        /* envd answers already_exists (the SDK's makeDir() → false) */
                        if (fs_call(&x, json_pack("{s:s, s:s}", "op", "stat", "path", p1), &resp,
                                    &err) == 0) {
                                json_decref(resp);
                                rc = rpc_error(r, "already_exists", "path %s already exists", p1);
                        } else {
                                rc = h_fs_entry(r, &x,
                                                json_pack("{s:s, s:s}", "op", "mkdir", "path", p1));
                        }
                }
        } else if (!strcmp(m, "Move")) {
                if (body_path(r, &x, b, "source", p1, sizeof(p1)) == 0 &&
                    body_path(r, &x, b, "destination", p2, sizeof(p2)) == 0)
                        rc = h_fs_entry(
                            r, &x,
                            json_pack("{s:s, s:s, s:s}", "op", "move", "from", p1, "to", p2));
        } else if (!strcmp(m, "Remove")) {
                if (body_path(r, &x, b, "path", p1, sizeof(p1)) == 0) {
                        /* os.RemoveAll: recursive, and a missing path is not an error */
                        if (fs_call(&x,
                                    json_pack("{s:s, s:s, s:b}", "op", "remove", "path", p1,
                                              "recursive", 1),
                                    &resp, &err) < 0 &&
                            err.kind != COVE_E_NOT_FOUND)
                                rc = rpc_err(r, &err);
                        else
                                rc = cove_reply_json(r, 200, json_object());
                        json_decref(resp);
                }
        } else if (!strcmp(m, "WatchDir")) {
                if (body_path(r, &x, b, "path", p1, sizeof(p1)) == 0)
                        rc = h_fs_watch(e, r, &x, p1, b);
        } else {
                rc = rpc_error(r, "unimplemented",
                               "filesystem.Filesystem/%.64s is not implemented (use WatchDir)", m);
        }
        json_decref(b);
        ctx_clear(&x);
        return rc;
}

/* ---- plain HTTP: /health, /files --------------------------------------------------- */

static int h_health(void *app, struct cove_req *r)
{
        struct cove_e2b *e = app;
        char id[64];
        long port;
        target(r, id, sizeof(id), &port);
        struct cove_sandbox_row row;
        struct cove_err err;
        if (!id[0] || port != COVE_E2B_ENVD_PORT ||
            cove_sandbox_load(e->d, NULL, id, &row, &err) < 0)
                return reply_gone(r, id);
        int running = !strcmp(row.state, "running");
        cove_sandbox_row_clear(&row);
        return running ? cove_reply_empty(r, 204) : reply_gone(r, id);
}

/* v1_ + base64(sha256("path:op:user:token[:exp]")) without '=' (the SDK's getSignature). */
static void signature(const char *path, const char *op, const char *user, const char *token,
                      const char *exp, char *out, size_t cap)
{
        EVP_MD_CTX *m = EVP_MD_CTX_new();
        unsigned char h[32];
        unsigned int hl = 0;
        EVP_DigestInit_ex(m, EVP_sha256(), NULL);
        const char *parts[5] = {path, op, user, token, exp};
        for (int i = 0; i < 5 && parts[i]; i++) {
                if (i)
                        EVP_DigestUpdate(m, ":", 1);
                EVP_DigestUpdate(m, parts[i], strlen(parts[i]));
        }
        EVP_DigestFinal_ex(m, h, &hl);
        EVP_MD_CTX_free(m);
        char b[64];
        EVP_EncodeBlock((unsigned char *)b, h, 32);
        size_t n = strlen(b);
        while (n && b[n - 1] == '=')
                b[--n] = '\0';
        snprintf(out, cap, "v1_%s", b);
}

struct sigscan {
        struct cove_e2b *e;
        const char *path, *op, *user, *exp, *sig;
        char id[64];
};

static int sig_matches(struct cove_e2b *e, const char *id, const struct sigscan *q)
{
        char tok[COVE_E2B_TOKEN_HEX], want[128];
        cove_e2b_token(e, id, tok);
        signature(q->path, q->op, q->user, tok, q->exp, want, sizeof(want));
        return strlen(want) == strlen(q->sig) && CRYPTO_memcmp(want, q->sig, strlen(want)) == 0;
}

static int sig_one(const struct cove_sandbox_row *row, void *arg)
{
        struct sigscan *q = arg;
        if (sig_matches(q->e, row->id, q)) {
                snprintf(q->id, sizeof(q->id), "%s", row->id);
                return -1; /* found: stop */
        }
        return 0;
}

/* Access to /files: a matching X-Access-Token, or a signed URL. A signed URL without the
 * sandbox header (a plain download link) names its sandbox by the signature alone: the
 * running sandbox whose token reproduces it. Answers itself and returns -1 on failure. */
/* The sandbox a signed /files URL names (id filled), or -1 answered (401). */
static int signed_id(struct cove_e2b *e, struct cove_req *r, const char *op, char id_out[64])
{
        const char *sig = cove_req_query(r, "signature");
        const char *exp = cove_req_query(r, "signature_expiration");
        if (exp) {
                char *end;
                long long t = strtoll(exp, &end, 10);
                if (!*exp || *end || t * 1000 < cove_now_ms())
                        return http_error(r, 401, "signature is already expired"), -1;
        }
        const char *user = cove_req_query(r, "username");
        struct sigscan q = {.e = e,
                            .path = cove_req_query(r, "path") ? cove_req_query(r, "path") : "",
                            .op = op,
                            .user = user ? user : "",
                            .exp = exp,
                            .sig = sig};
        char id[64];
        long port;
        target(r, id, sizeof(id), &port);
        if (id[0]) {
                if (sig_matches(e, id, &q))
                        snprintf(q.id, sizeof(q.id), "%s", id);
        } else {
                struct cove_err err;
                e->d->cat_ops->sandbox_list(e->d->cat, NULL, "running", sig_one, &q, &err);
        }
        if (!q.id[0])
                return http_error(r, 401, "invalid signature"), -1;
        snprintf(id_out, 64, "%s", q.id);
        return 0;
}

/* Access to /files: a matching X-Access-Token, or a signed URL. A signed URL without the
 * sandbox header (a plain download link) names its sandbox by the signature alone: the
 * running sandbox whose token reproduces it. Answers itself and returns -1 on failure. */
static int files_access(struct cove_e2b *e, struct cove_req *r, struct ctx *x, const char *op)
{
        if (!cove_req_query(r, "signature") || trusted(r))
                return resolve(e, r, x, 1, 0);
        memset(x, 0, sizeof(*x));
        x->e = e;
        if (signed_id(e, r, op, x->id) < 0)
                return -1;
        struct cove_sandbox_row row;
        struct cove_err err;
        if (cove_sandbox_chan(e->d, NULL, x->id, &x->c, &row, &err) < 0)
                return reply_gone(r, x->id), -1;
        x->env_json = row.env_json;
        row.env_json = NULL;
        x->disk_bytes = (uint64_t)(row.disk_mb > 0 ? row.disk_mb : 1) << 20;
        ctx_workdir(x, &row);
        cove_sandbox_row_clear(&row);
        set_user(x, NULL);
        return 0;
}

static int query_user(struct cove_req *r, struct ctx *x)
{
        const char *u = cove_req_query(r, "username");
        if (u && *u) {
                if (!valid_user(u))
                        return http_error(r, 400, "invalid username"), -1;
                set_user(x, u);
        }
        return 0;
}

struct getctx {
        struct cove_chan *c;
        struct cove_xfer *xf;
};

static ssize_t get_read(void *p, uint64_t pos, char *buf, size_t max)
{
        struct getctx *g = p;
        struct cove_err err;
        long n = cove_chan_xfer_read(g->xf, buf, max, 60000, &err);
        return n > 0 ? n : n == 0 ? -1 : -2;
}

static void get_free(void *p)
{
        struct getctx *g = p;
        cove_chan_xfer_free(g->xf);
        cove_chan_unref(g->c);
        free(g);
}

static int h_files_get(void *app, struct cove_req *r)
{
        struct cove_e2b *e = app;
        struct ctx x;
        if (files_access(e, r, &x, "read") < 0)
                return 0;
        char path[PATH_MAX_LEN + 256];
        int rc;
        if (query_user(r, &x) < 0) {
                rc = 0;
        } else if (abs_path(&x, cove_req_query(r, "path"), path, sizeof(path)) < 0) {
                rc = http_error(r, 400, "invalid path");
        } else {
                struct cove_xfer *xf = NULL;
                uint64_t size;
                uint32_t mode;
                struct cove_err err;
                struct getctx *g;
                if (cove_chan_read_begin(x.c, path, &xf, &size, &mode, &err) < 0) {
                        rc = err.kind == COVE_E_CONFLICT
                                 ? http_error(r, 400, "path '%s' is a directory", path)
                                 : http_error(r, http_status(&err), "%s", err.msg);
                } else if (!(g = calloc(1, sizeof(*g)))) {
                        cove_chan_xfer_free(xf);
                        rc = http_error(r, 500, "out of memory");
                } else {
                        g->c = x.c;
                        x.c = NULL;
                        g->xf = xf;
                        /* as the cove route: a length only when all of it is here */
                        uint64_t len;
                        int whole = cove_chan_xfer_prefetch(xf, 60000, &len, &err);
                        if (whole < 0) {
                                get_free(g);
                                rc = http_error(r, http_status(&err), "%s", err.msg);
                        } else {
                                rc = cove_reply_stream(r, 200, "application/octet-stream",
                                                       whole ? (int64_t)len : -1, get_read,
                                                       get_free, g);
                        }
                }
        }
        ctx_clear(&x);
        return rc;
}

/* POST /files: octet-stream (?path=) or multipart/form-data with "file" parts (the part's
 * filename is the path when ?path= is absent). Each file streams into the guest's atomic
 * write; parents are created for the user and the file is given to the user, as envd
 * does. */
struct upctx {
        struct ctx x;
        int ready;  /* sandbox resolved and access checked */
        int failed; /* an answer is recorded in status/msg */
        unsigned status;
        char msg[COVE_ERR_MSG_MAX];
        struct MHD_PostProcessor *pp;
        struct cove_xfer *xf; /* current file */
        char cur[PATH_MAX_LEN + 256];
        char part_name[PATH_MAX_LEN + 1]; /* filename of the current part */
        char qpath[PATH_MAX_LEN + 1];     /* ?path= (wins over part filenames) */
        uint64_t part_bytes;              /* written of the current part */
        json_t *results;
        json_t *meta; /* X-Metadata-* headers: {key: value}, or NULL */
        int gz;       /* Content-Encoding: gzip: z inflates the body */
        z_stream z;
        uint64_t gz_out; /* bytes inflated so far */
};

static void up_fail(struct upctx *u, const struct cove_err *err)
{
        if (u->failed)
                return;
        u->failed = 1;
        u->status = http_status(err);
        snprintf(u->msg, sizeof(u->msg), "%s", err->msg);
}

static void up_cleanup(void *app, struct cove_req *r)
{
        struct upctx *u = r->state;
        if (!u)
                return;
        if (u->pp)
                MHD_destroy_post_processor(u->pp);
        cove_chan_xfer_free(u->xf); /* an unfinished upload is aborted: the old file stays */
        ctx_clear(&u->x);
        json_decref(u->results);
        json_decref(u->meta);
        if (u->gz)
                inflateEnd(&u->z);
        free(u);
        r->state = NULL;
}

static int file_open(struct upctx *u, const char *target)
{
        struct cove_err err;
        if (abs_path(&u->x, target, u->cur, sizeof(u->cur)) < 0) {
                cove_err_setk(&err, COVE_E_BAD_REQUEST, 0, "invalid path");
                return up_fail(u, &err), -1;
        }
        char parent[sizeof(u->cur)];
        snprintf(parent, sizeof(parent), "%s", u->cur);
        char *slash = strrchr(parent, '/');
        if (slash && slash != parent) {
                *slash = '\0';
                json_t *resp = NULL;
                if (fs_call(&u->x, json_pack("{s:s, s:s}", "op", "mkdir", "path", parent), &resp,
                            &err) < 0)
                        return up_fail(u, &err), -1;
                json_decref(resp);
        }
        if (cove_chan_write_begin_meta(u->x.c, u->cur, 0644, u->x.user, u->meta, &u->xf, &err) < 0)
                return up_fail(u, &err), -1;
        return 0;
}

static int file_close(struct upctx *u)
{
        if (!u->xf)
                return 0;
        json_t *entry = NULL;
        struct cove_err err;
        int rc = cove_chan_write_finish(u->xf, &entry, &err);
        cove_chan_xfer_free(u->xf);
        u->xf = NULL;
        json_decref(entry);
        if (rc < 0)
                return up_fail(u, &err), -1;
        const char *base = strrchr(u->cur, '/');
        json_t *res = json_pack("{s:s, s:s, s:s}", "name", base ? base + 1 : u->cur, "type", "file",
                                "path", u->cur);
        if (u->meta)
                json_object_set(res, "metadata", u->meta);
        json_array_append_new(u->results, res);
        return 0;
}

static enum MHD_Result up_part(void *cls, enum MHD_ValueKind kind, const char *key,
                               const char *filename, const char *content_type,
                               const char *transfer_encoding, const char *data, uint64_t off,
                               size_t size)
{
        struct upctx *u = cls;
        if (u->failed || !key || strcmp(key, "file") != 0)
                return MHD_YES;
        struct cove_err err;
        /* a new part: another filename, or offset 0 again once bytes were written (MHD may
         * announce a part with an empty call before its data) */
        if (!u->xf || strcmp(filename ? filename : "", u->part_name) != 0 ||
            (off == 0 && u->part_bytes > 0)) {
                if (file_close(u) < 0)
                        return MHD_YES;
                snprintf(u->part_name, sizeof(u->part_name), "%s", filename ? filename : "");
                u->part_bytes = 0;
                if (file_open(u, u->qpath[0] ? u->qpath : u->part_name) < 0)
                        return MHD_YES;
        }
        u->part_bytes += size;
        if (size && cove_chan_xfer_write(u->xf, data, size, &err) < 0)
                up_fail(u, &err);
        return MHD_YES;
}

/* X-Metadata-<key>: <value> headers → u->meta ({lowercased key: value}); E2B's rules:
 * the key an HTTP token, the value printable ASCII; bounded as the guest bounds it. */
static enum MHD_Result meta_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value)
{
        struct upctx *u = cls;
        if (u->failed || !key || strncasecmp(key, "X-Metadata-", 11) != 0)
                return MHD_YES;
        const char *k = key + 11;
        size_t kl = strlen(k);
        int ok = kl > 0 && kl <= 200 && value && strlen(value) <= META_VAL_MAX;
        for (size_t i = 0; ok && i < kl; i++)
                ok = isalnum((unsigned char)k[i]) || strchr("!#$%&'*+-.^_`|~", k[i]);
        for (const char *v = value; ok && *v; v++)
                ok = *v >= 0x20 && *v <= 0x7e;
        if (!u->meta)
                u->meta = json_object();
        ok = ok && json_object_size(u->meta) < META_MAX;
        struct cove_err err;
        if (!ok) {
                cove_err_setk(&err, COVE_E_BAD_REQUEST, 0,
                              "file metadata: at most %d X-Metadata-<token> headers with "
                              "printable values of at most %d bytes",
                              META_MAX, META_VAL_MAX);
                up_fail(u, &err);
                return MHD_YES;
        }
        char lk[201];
        for (size_t i = 0; i <= kl; i++)
                lk[i] = (char)tolower((unsigned char)k[i]);
        json_object_set_new(u->meta, lk, json_string(value));
        return MHD_YES;
}

/* What a gzip body may inflate to: the sandbox's free disk space as its guest reports it
 * (its own uploads are all a guest could misreport), at most the disk's size. */
static void gz_bound(struct upctx *u)
{
        json_t *req = json_pack("{s:s}", "op", "usage"), *resp = NULL;
        struct cove_err err;
        if (cove_chan_call(u->x.c, req, &resp, 0, &err) == 0) {
                json_t *t = json_object_get(resp, "disk_total_bytes");
                json_t *used = json_object_get(resp, "disk_used_bytes");
                if (json_is_integer(t) && json_is_integer(used) && json_integer_value(used) >= 0 &&
                    json_integer_value(t) >= json_integer_value(used)) {
                        uint64_t free_b =
                            (uint64_t)(json_integer_value(t) - json_integer_value(used));
                        if (free_b < u->x.disk_bytes)
                                u->x.disk_bytes = free_b;
                }
        }
        json_decref(req);
        json_decref(resp);
}

/* Body bytes after decoding: into the multipart parser or the file. */
static void up_feed(struct upctx *u, const char *data, size_t len)
{
        struct cove_err err;
        if (u->pp) {
                if (MHD_post_process(u->pp, data, len) != MHD_YES && !u->failed) {
                        cove_err_setk(&err, COVE_E_BAD_REQUEST, 0, "malformed multipart body");
                        up_fail(u, &err);
                }
        } else if (u->xf && cove_chan_xfer_write(u->xf, data, len, &err) < 0) {
                up_fail(u, &err);
        }
}

/* A gzip body: inflated in pieces, at most the sandbox's disk size in all (more could not
 * be stored: a decompression bomb is refused, not written). */
static void up_inflate(struct upctx *u, const char *data, size_t len, int end)
{
        char out[64 * 1024];
        u->z.next_in = (Bytef *)data;
        u->z.avail_in = (uInt)len;
        while (!u->failed) {
                u->z.next_out = (Bytef *)out;
                u->z.avail_out = sizeof(out);
                int zr = inflate(&u->z, Z_NO_FLUSH);
                size_t got = sizeof(out) - u->z.avail_out;
                struct cove_err err;
                if (zr != Z_OK && zr != Z_STREAM_END && zr != Z_BUF_ERROR) {
                        cove_err_setk(&err, COVE_E_BAD_REQUEST, 0, "gzip body: %s",
                                      u->z.msg ? u->z.msg : "corrupt");
                        up_fail(u, &err);
                        return;
                }
                u->gz_out += got;
                if (u->gz_out > u->x.disk_bytes) {
                        u->failed = 1;
                        u->status = 413;
                        snprintf(u->msg, sizeof(u->msg),
                                 "limit_exceeded: the gzip body inflates to more than the "
                                 "sandbox's free disk space (%llu bytes)",
                                 (unsigned long long)u->x.disk_bytes);
                        return;
                }
                if (got)
                        up_feed(u, out, got);
                if (zr == Z_STREAM_END) {
                        if (u->z.avail_in) {
                                inflateReset(&u->z); /* another gzip member follows */
                                continue;
                        }
                        u->gz = 2; /* complete */
                        return;
                }
                if (!u->z.avail_in && u->z.avail_out) {
                        if (end && zr == Z_BUF_ERROR) {
                                cove_err_setk(&err, COVE_E_BAD_REQUEST, 0,
                                              "gzip body is cut short");
                                up_fail(u, &err);
                        }
                        return;
                }
        }
}

static int up_begin(struct cove_e2b *e, struct cove_req *r)
{
        struct upctx *u = calloc(1, sizeof(*u));
        if (!u)
                return -1;
        r->state = u;
        r->cleanup = up_cleanup;
        u->results = json_array();
        if (files_access(e, r, &u->x, "write") < 0 || query_user(r, &u->x) < 0) {
                u->failed = 1;
                u->status = 0; /* already answered */
                return -1;
        }
        u->ready = 1;
        struct cove_err err;
        MHD_get_connection_values(r->conn, MHD_HEADER_KIND, meta_header, u);
        if (u->failed)
                return -1;
        const char *qp = cove_req_query(r, "path");
        snprintf(u->qpath, sizeof(u->qpath), "%s", qp ? qp : "");
        const char *ct = cove_req_header(r, "Content-Type");
        const char *ce = cove_req_header(r, "Content-Encoding");
        if (ce && !strcasecmp(ce, "gzip")) {
                if (inflateInit2(&u->z, 15 + 16) != Z_OK) {
                        cove_err_setk(&err, COVE_E_INTERNAL, 0, "gzip: inflateInit failed");
                        return up_fail(u, &err), -1;
                }
                u->gz = 1;
                gz_bound(u);
        } else if (ce && strcasecmp(ce, "identity") != 0) {
                cove_err_setk(&err, COVE_E_BAD_REQUEST, 0,
                              "Content-Encoding %.32s is not supported (gzip or identity)", ce);
                return up_fail(u, &err), -1;
        }
        if (ct && !strncasecmp(ct, "multipart/form-data", 19)) {
                u->pp = MHD_create_post_processor(r->conn, 64 * 1024, up_part, u);
                if (!u->pp) {
                        cove_err_setk(&err, COVE_E_BAD_REQUEST, 0, "malformed multipart body");
                        return up_fail(u, &err), -1;
                }
                return 0;
        }
        if (!u->qpath[0]) {
                cove_err_setk(&err, COVE_E_BAD_REQUEST, 0,
                              "path is required for an application/octet-stream upload");
                return up_fail(u, &err), -1;
        }
        return file_open(u, u->qpath);
}

static int up_files(void *app, struct cove_req *r, const char *data, size_t len)
{
        struct cove_e2b *e = app;
        if (!r->state && up_begin(e, r) < 0)
                return 0; /* keep consuming: the handler answers */
        struct upctx *u = r->state;
        if (!u || u->failed)
                return 0;
        if (u->gz == 2 && len) {
                struct cove_err err;
                cove_err_setk(&err, COVE_E_BAD_REQUEST, 0, "bytes after the end of the gzip body");
                up_fail(u, &err);
        } else if (u->gz) {
                up_inflate(u, data, len, 0);
        } else {
                up_feed(u, data, len);
        }
        return 0;
}

static int h_files_post(void *app, struct cove_req *r)
{
        struct cove_e2b *e = app;
        if (!r->state)
                up_begin(e, r);
        struct upctx *u = r->state;
        if (!u)
                return http_error(r, 500, "out of memory");
        if (u->failed && !u->status)
                return 0; /* answered by the access check */
        if (u->gz == 1 && !u->failed) {
                struct cove_err err;
                cove_err_setk(&err, COVE_E_BAD_REQUEST, 0, "gzip body is cut short");
                up_fail(u, &err);
        }
        if (u->pp && !u->failed) {
                MHD_destroy_post_processor(u->pp);
                u->pp = NULL;
        }
        if (!u->failed)
                file_close(u);
        if (u->failed)
                return http_error(r, u->status, "%s", u->msg);
        if (!json_array_size(u->results))
                return http_error(r, 400, "no file in the request (multipart field \"file\")");
        return cove_reply_json(r, 200, json_incref(u->results));
}

/* ---- the code interpreter (port 49999, @e2b/code-interpreter) ----------------------- */

#define COVE_E2B_INTERP_PORT 49999

/* The sandbox of a code interpreter request, with its access checked: X-Access-Token
 * (envdAccessToken, sent on runs) or E2B-Traffic-Access-Token (sent on every call). */
static struct cove_chan *interp_target(struct cove_e2b *e, struct cove_req *r,
                                       struct cove_sandbox_row *row)
{
        char id[64];
        long port;
        target(r, id, sizeof(id), &port);
        if (!id[0] || port != COVE_E2B_INTERP_PORT) {
                http_error(r, 404, "no route %s %s on port %ld", r->method, r->url, port);
                return NULL;
        }
        char tok[COVE_E2B_TOKEN_HEX], tt[80];
        cove_e2b_token(e, id, tok);
        cove_e2b_traffic_token(e, id, tt);
        const char *a = cove_req_header(r, "X-Access-Token");
        const char *t = cove_req_header(r, "E2B-Traffic-Access-Token");
        /* forwarded by a control replica, which checked the token (it holds the secret) */
        int ok = trusted(r) ||
                 (a && strlen(a) == strlen(tok) && !CRYPTO_memcmp(a, tok, strlen(tok))) ||
                 (t && strlen(t) == strlen(tt) && !CRYPTO_memcmp(t, tt, strlen(tt)));
        OPENSSL_cleanse(tok, sizeof(tok));
        OPENSSL_cleanse(tt, sizeof(tt));
        if (!ok) {
                http_error(r, 401, "missing or wrong access token for the code interpreter");
                return NULL;
        }
        struct cove_chan *c = NULL;
        struct cove_err err;
        if (cove_sandbox_chan(e->d, NULL, id, &c, row, &err) < 0) {
                reply_gone(r, id);
                return NULL;
        }
        return c;
}

static int h_interp_execute(void *app, struct cove_req *r)
{
        struct cove_e2b *e = app;
        json_t *body = cove_req_json(r, 0);
        if (!body)
                return 0;
        struct cove_sandbox_row row;
        struct cove_chan *c = interp_target(e, r, &row);
        if (!c) {
                json_decref(body);
                return 0;
        }
        struct cove_err err;
        int rc = cove_code_run(e->d, r, c, &row, body, 1, &err);
        json_decref(body);
        cove_chan_unref(c);
        cove_sandbox_row_clear(&row);
        return rc < 0 ? http_error(r, http_status(&err), "%s", err.msg) : 0;
}

static int interp_contexts(struct cove_e2b *e, struct cove_req *r, enum cove_code_op op)
{
        json_t *body = NULL;
        if (op == COVE_CODE_CREATE && !(body = cove_req_json(r, 1)))
                return 0;
        struct cove_sandbox_row row;
        struct cove_chan *c = interp_target(e, r, &row);
        if (!c) {
                json_decref(body);
                return 0;
        }
        json_t *out = NULL;
        struct cove_err err;
        int rc = cove_code_context(e->d, c, &row, op, r->nparams ? r->params[0] : NULL, body, &out,
                                   &err);
        json_decref(body);
        cove_chan_unref(c);
        cove_sandbox_row_clear(&row);
        if (rc < 0)
                return http_error(r, http_status(&err), "%s", err.msg);
        return out ? cove_reply_json(r, 200, out) : cove_reply_empty(r, 204);
}

static int h_interp_ctx_create(void *app, struct cove_req *r)
{
        return interp_contexts(app, r, COVE_CODE_CREATE);
}
static int h_interp_ctx_list(void *app, struct cove_req *r)
{
        return interp_contexts(app, r, COVE_CODE_LIST);
}
static int h_interp_ctx_delete(void *app, struct cove_req *r)
{
        return interp_contexts(app, r, COVE_CODE_DELETE);
}
static int h_interp_ctx_restart(void *app, struct cove_req *r)
{
        return interp_contexts(app, r, COVE_CODE_RESTART);
}

const struct cove_route cove_e2b_envd_routes[] = {
    {"GET", "/health", h_health, NULL, COVE_ROUTE_PUBLIC},
    {"GET", "/files", h_files_get, NULL, COVE_ROUTE_PUBLIC},
    {"POST", "/files", h_files_post, up_files, COVE_ROUTE_PUBLIC},
    {"POST", "/process.Process/{method}", h_process, NULL, COVE_ROUTE_PUBLIC},
    {"POST", "/filesystem.Filesystem/{method}", h_filesystem, NULL, COVE_ROUTE_PUBLIC},
    {"POST", "/execute", h_interp_execute, NULL, COVE_ROUTE_PUBLIC},
    {"POST", "/contexts", h_interp_ctx_create, NULL, COVE_ROUTE_PUBLIC},
    {"GET", "/contexts", h_interp_ctx_list, NULL, COVE_ROUTE_PUBLIC},
    {"DELETE", "/contexts/{cid}", h_interp_ctx_delete, NULL, COVE_ROUTE_PUBLIC},
    {"POST", "/contexts/{cid}/restart", h_interp_ctx_restart, NULL, COVE_ROUTE_PUBLIC},
};
const size_t cove_e2b_envd_nroutes = sizeof(cove_e2b_envd_routes) / sizeof(cove_e2b_envd_routes[0]);

/* ---- in a cluster (docs/cluster.md "Sandbox traffic") ------------------------------- */

/* Role control: check access as the node would (the sandbox, its token or a signed URL, the
 * RPC's user), then forward to the node that runs the sandbox. 0 with id and user, or -1
 * answered. */
static int ctl_access(struct cove_e2b *e, struct cove_req *r, const char *op, int rpc, char id[64],
                      char user[64])
{
        user[0] = '\0';
        if (op && cove_req_query(r, "signature"))
                return signed_id(e, r, op, id); /* the node applies ?username= itself */
        long port;
        target(r, id, 64, &port);
        if (!id[0])
                return http_error(r, 400,
                                  "which sandbox? send the E2b-Sandbox-Id header (set "
                                  "E2B_SANDBOX_URL for the SDK)"),
                       -1;
        if (port != COVE_E2B_ENVD_PORT)
                return cove_reply_json(r, 502,
                                       json_pack("{s:s, s:s, s:i, s:i}", "sandboxId", id, "message",
                                                 "cove serves only envd (port 49983) of a "
                                                 "sandbox: forwarding other ports is not "
                                                 "supported",
                                                 "port", (int)port, "code", 502)),
                       -1;
        struct cove_sandbox_row row;
        struct cove_err err;
        if (cove_sandbox_load(e->d, NULL, id, &row, &err) < 0)
                return reply_gone(r, id), -1;
        int running = !strcmp(row.state, "running");
        cove_sandbox_row_clear(&row);
        if (!running)
                return reply_gone(r, id), -1;
        const char *tok = cove_req_header(r, "X-Access-Token");
        char want[COVE_E2B_TOKEN_HEX];
        cove_e2b_token(e, id, want);
        if (!tok || strlen(tok) != strlen(want) || CRYPTO_memcmp(tok, want, strlen(want)) != 0)
                return (rpc ? rpc_error(r, "unauthenticated", "missing or wrong X-Access-Token")
                            : http_error(r, 401, "missing or wrong X-Access-Token")),
                       -1;
        struct ctx x = {0};
        if (user_from_auth(r, &x) < 0)
                return (rpc ? rpc_error(r, "invalid_argument", "bad Authorization header")
                            : http_error(r, 400, "bad Authorization header")),
                       -1;
        if (cove_req_header(r, "Authorization"))
                snprintf(user, 64, "%s", x.user);
        return 0;
}

static int fwd_err_http(struct cove_req *r, const struct cove_err *err)
{
        return http_error(r, http_status(err), "%s", err->msg);
}

static void fwd_req(struct cove_fwd_req *q, const char **h, const char *id, const char *user,
                    int rpc)
{
        h[0] = "E2b-Sandbox-Id";
        h[1] = id;
        h[2] = "X-Cove-E2b-User";
        h[3] = user;
        *q = (struct cove_fwd_req){.prefix = "/e2b",
                                   .any_tenant = 1,
                                   .hdrs = h,
                                   .nhdrs = user[0] ? 2 : 1,
                                   .reply_err = rpc ? rpc_err : fwd_err_http};
}

static int ctl_rpc(void *app, struct cove_req *r)
{
        struct cove_e2b *e = app;
        char id[64], user[64];
        if (ctl_access(e, r, NULL, 1, id, user) < 0)
                return 0;
        const char *h[4];
        struct cove_fwd_req q;
        fwd_req(&q, h, id, user, 1);
        return cove_forward_ex(e->d, r, id, &q);
}

static int ctl_files_get(void *app, struct cove_req *r)
{
        struct cove_e2b *e = app;
        char id[64], user[64];
        if (ctl_access(e, r, "read", 0, id, user) < 0)
                return 0;
        const char *h[4];
        struct cove_fwd_req q;
        fwd_req(&q, h, id, user, 0);
        return cove_forward_ex(e->d, r, id, &q);
}

/* The upload's state is the forwarder's (r->state); the sandbox id for the node is kept
 * with the request by the first piece's access check. */
static int ctl_up_files(void *app, struct cove_req *r, const char *data, size_t len)
{
        struct cove_e2b *e = app;
        char id[64], user[64];
        if (!r->state) {
                if (ctl_access(e, r, "write", 0, id, user) < 0)
                        return 1; /* answered */
                const char *h[4];
                struct cove_fwd_req q;
                fwd_req(&q, h, id, user, 0);
                return cove_forward_upload_ex(e->d, r, id, &q, data, len);
        }
        return cove_forward_upload_ex(e->d, r, "", NULL, data, len);
}

static int ctl_files_post(void *app, struct cove_req *r)
{
        struct cove_e2b *e = app;
        char id[64] = "", user[64] = "";
        if (!r->state && ctl_access(e, r, "write", 0, id, user) < 0)
                return 0;
        const char *h[4];
        struct cove_fwd_req q;
        fwd_req(&q, h, id, user, 0);
        return cove_forward_ex(e->d, r, id, &q);
}

/* The code interpreter's routes (port 49999): its access checked here as one process checks
 * it (the envd token or the traffic token, with the sandbox running), then forwarded to
 * the node under /e2b with the sandbox and the port in E2b-Sandbox-Id / -Port. */
static int ctl_interp(void *app, struct cove_req *r)
{
        struct cove_e2b *e = app;
        char id[64];
        long port;
        target(r, id, sizeof(id), &port);
        if (!id[0] || port != COVE_E2B_INTERP_PORT)
                return http_error(r, 404, "no route %s %s on port %ld", r->method, r->url, port);
        char tok[COVE_E2B_TOKEN_HEX], tt[80];
        cove_e2b_token(e, id, tok);
        cove_e2b_traffic_token(e, id, tt);
        const char *a = cove_req_header(r, "X-Access-Token");
        const char *t = cove_req_header(r, "E2B-Traffic-Access-Token");
        int ok = (a && strlen(a) == strlen(tok) && !CRYPTO_memcmp(a, tok, strlen(tok))) ||
                 (t && strlen(t) == strlen(tt) && !CRYPTO_memcmp(t, tt, strlen(tt)));
        OPENSSL_cleanse(tok, sizeof(tok));
        OPENSSL_cleanse(tt, sizeof(tt));
        if (!ok)
                return http_error(r, 401, "missing or wrong access token for the code interpreter");
        struct cove_sandbox_row row;
        struct cove_err err;
        if (cove_sandbox_load(e->d, NULL, id, &row, &err) < 0)
                return reply_gone(r, id);
        int running = !strcmp(row.state, "running");
        cove_sandbox_row_clear(&row);
        if (!running)
                return reply_gone(r, id);
        char pstr[8];
        snprintf(pstr, sizeof(pstr), "%d", COVE_E2B_INTERP_PORT);
        const char *h[4] = {"E2b-Sandbox-Id", id, "E2b-Sandbox-Port", pstr};
        struct cove_fwd_req q = {
            .prefix = "/e2b", .any_tenant = 1, .hdrs = h, .nhdrs = 2, .reply_err = fwd_err_http};
        return cove_forward_ex(e->d, r, id, &q);
}

const struct cove_route cove_e2b_envd_ctl_routes[] = {
    {"GET", "/health", h_health, NULL, COVE_ROUTE_PUBLIC},
    {"GET", "/files", ctl_files_get, NULL, COVE_ROUTE_PUBLIC},
    {"POST", "/files", ctl_files_post, ctl_up_files, COVE_ROUTE_PUBLIC},
    {"POST", "/process.Process/{method}", ctl_rpc, NULL, COVE_ROUTE_PUBLIC},
    {"POST", "/filesystem.Filesystem/{method}", ctl_rpc, NULL, COVE_ROUTE_PUBLIC},
    {"POST", "/execute", ctl_interp, NULL, COVE_ROUTE_PUBLIC},
    {"POST", "/contexts", ctl_interp, NULL, COVE_ROUTE_PUBLIC},
    {"GET", "/contexts", ctl_interp, NULL, COVE_ROUTE_PUBLIC},
    {"DELETE", "/contexts/{cid}", ctl_interp, NULL, COVE_ROUTE_PUBLIC},
    {"POST", "/contexts/{cid}/restart", ctl_interp, NULL, COVE_ROUTE_PUBLIC},
};
const size_t cove_e2b_envd_ctl_nroutes =
    sizeof(cove_e2b_envd_ctl_routes) / sizeof(cove_e2b_envd_ctl_routes[0]);

/* Role node: the same handlers under /e2b on the node API (app: the struct coved; its e2b
 * context holds no listener), for control replicas only. */
static int node_process(void *app, struct cove_req *r)
{
        return h_process(((struct coved *)app)->e2b, r);
}

static int node_filesystem(void *app, struct cove_req *r)
{
        return h_filesystem(((struct coved *)app)->e2b, r);
}

static int node_files_get(void *app, struct cove_req *r)
{
        return h_files_get(((struct coved *)app)->e2b, r);
}

static int node_up_files(void *app, struct cove_req *r, const char *data, size_t len)
{
        return up_files(((struct coved *)app)->e2b, r, data, len);
}

static int node_files_post(void *app, struct cove_req *r)
{
        return h_files_post(((struct coved *)app)->e2b, r);
}

static int node_interp_execute(void *app, struct cove_req *r)
{
        return h_interp_execute(((struct coved *)app)->e2b, r);
}

static int node_interp_ctx_create(void *app, struct cove_req *r)
{
        return h_interp_ctx_create(((struct coved *)app)->e2b, r);
}

static int node_interp_ctx_list(void *app, struct cove_req *r)
{
        return h_interp_ctx_list(((struct coved *)app)->e2b, r);
}

static int node_interp_ctx_delete(void *app, struct cove_req *r)
{
        return h_interp_ctx_delete(((struct coved *)app)->e2b, r);
}

static int node_interp_ctx_restart(void *app, struct cove_req *r)
{
        return h_interp_ctx_restart(((struct coved *)app)->e2b, r);
}

const struct cove_route cove_e2b_node_routes[] = {
    {"GET", "/e2b/files", node_files_get, NULL, COVE_ROUTE_E2B},
    {"POST", "/e2b/files", node_files_post, node_up_files, COVE_ROUTE_E2B},
    {"POST", "/e2b/process.Process/{method}", node_process, NULL, COVE_ROUTE_E2B},
    {"POST", "/e2b/filesystem.Filesystem/{method}", node_filesystem, NULL, COVE_ROUTE_E2B},
    {"POST", "/e2b/execute", node_interp_execute, NULL, COVE_ROUTE_E2B},
    {"POST", "/e2b/contexts", node_interp_ctx_create, NULL, COVE_ROUTE_E2B},
    {"GET", "/e2b/contexts", node_interp_ctx_list, NULL, COVE_ROUTE_E2B},
    {"DELETE", "/e2b/contexts/{cid}", node_interp_ctx_delete, NULL, COVE_ROUTE_E2B},
    {"POST", "/e2b/contexts/{cid}/restart", node_interp_ctx_restart, NULL, COVE_ROUTE_E2B},
};
const size_t cove_e2b_node_nroutes = sizeof(cove_e2b_node_routes) / sizeof(cove_e2b_node_routes[0]);
