/* E2B control plane (the API of E2B_API_URL) over cove's sandbox lifecycle, plus the
 * start-up of both E2B listeners and the per-node secret behind envd access tokens.
 * Field names and error bodies ({code: <number>, message}) follow E2B's public OpenAPI
 * file and what the npm `e2b` SDK's dist/ sends and reads; see docs/e2b.md. */
#include "api/e2b.h"

#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "control/apikey.h"
#include "control/ports.h"
#include "control/snapshot.h"
#include "util/cleanup.h"
#include "util/util.h"

#define LIST_LIMIT_MAX 100

/* ---- credentials ------------------------------------------------------------------ */

void cove_e2b_token(const struct cove_e2b *e, const char *sandbox_id, char out[COVE_E2B_TOKEN_HEX])
{
        unsigned char mac[32];
        unsigned int len = sizeof(mac);
        HMAC(EVP_sha256(), e->secret, sizeof(e->secret), (const unsigned char *)sandbox_id,
             strlen(sandbox_id), mac, &len);
        cove_hex(mac, sizeof(mac), out);
}

/* The sandbox's traffic access token (its ports, E2B's form): "cpt_" + hex HMAC-SHA256
 * (secret, "traffic:" + id), so every answer about the sandbox can carry it again. */
static void traffic_token(const struct cove_e2b *e, const char *sandbox_id, char out[80])
{
        char msg[96];
        snprintf(msg, sizeof(msg), "traffic:%s", sandbox_id);
        unsigned char mac[32];
        unsigned int len = sizeof(mac);
        HMAC(EVP_sha256(), e->secret, sizeof(e->secret), (const unsigned char *)msg, strlen(msg),
             mac, &len);
        char hex[65];
        cove_hex(mac, sizeof(mac), hex);
        snprintf(out, 80, "cpt_%.48s", hex);
        OPENSSL_cleanse(mac, sizeof(mac));
}

static int hexval(char c)
{
        if (c >= '0' && c <= '9')
                return c - '0';
        if (c >= 'a' && c <= 'f')
                return c - 'a' + 10;
        return -1;
}

int cove_e2b_key_decode(const char *k, char *out, size_t cap)
{
        if (!k || strncmp(k, "e2b_", 4) != 0)
                return -1;
        k += 4;
        size_t n = strlen(k);
        if (n == 0 || n % 2 || n / 2 >= cap)
                return -1;
        for (size_t i = 0; i < n / 2; i++) {
                int hi = hexval(k[2 * i]), lo = hexval(k[2 * i + 1]);
                if (hi < 0 || lo < 0)
                        return -1;
                out[i] = (char)(hi << 4 | lo);
                if (!out[i])
                        return -1;
        }
        out[n / 2] = '\0';
        return 0;
}

/* <data_dir>/e2b.secret: 32 random bytes, created once. link() publishes the new file only
 * if none exists, so two starters can never end up with different secrets. */
static int load_secret(struct cove_e2b *e, struct cove_err *err)
{
        char path[PATH_MAX];
        snprintf(path, sizeof(path), "%s/e2b.secret", e->d->data_dir);
        for (int attempt = 0; attempt < 3; attempt++) {
                cleanup_free char *have = NULL;
                size_t len = 0;
                struct cove_err e2;
                if (cove_read_file(path, 64, &have, &len, &e2) == 0) {
                        if (len != sizeof(e->secret))
                                return cove_err_setk(err, COVE_E_INTERNAL, 0,
                                                     "%s holds %zu bytes, not 32: remove it to "
                                                     "issue a new secret (this invalidates every "
                                                     "envdAccessToken)",
                                                     path, len);
                        memcpy(e->secret, have, sizeof(e->secret));
                        return 0;
                }
                if (e2.errnum != ENOENT)
                        return cove_err_set(err, e2.errnum, "read %s", path);
                unsigned char s[32];
                if (cove_random(s, sizeof(s), err) < 0)
                        return -1;
                char tmp[PATH_MAX];
                snprintf(tmp, sizeof(tmp), "%s/.e2b.secret.%d", e->d->data_dir, (int)getpid());
                int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
                if (fd < 0)
                        return cove_err_set(err, errno, "create %s", tmp);
                int ok = write(fd, s, sizeof(s)) == (ssize_t)sizeof(s) && fsync(fd) == 0;
                int saved = errno;
                close(fd);
                OPENSSL_cleanse(s, sizeof(s));
                if (!ok) {
                        unlink(tmp);
                        return cove_err_set(err, saved, "write %s", tmp);
                }
                int r = link(tmp, path);
                saved = errno;
                unlink(tmp);
                if (r < 0 && saved != EEXIST)
                        return cove_err_set(err, saved, "publish %s", path);
                /* loop: read back what is now there (ours or a concurrent starter's) */
        }
        return cove_err_set(err, 0, "%s: could not create nor read it", path);
}

/* ---- answers ---------------------------------------------------------------------- */

static int reply_error(struct cove_req *r, unsigned status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int reply_error(struct cove_req *r, unsigned status, const char *fmt, ...)
{
        char msg[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        return cove_reply_json(r, status,
                               json_pack("{s:i, s:s}", "code", (int)status, "message", msg));
}

static unsigned err_status(const struct cove_err *err)
{
        switch (err->kind) {
        case COVE_E_BAD_REQUEST:
                return 400;
        case COVE_E_NOT_FOUND:
                return 404;
        case COVE_E_CONFLICT:
                return 409;
        case COVE_E_LIMIT:
                return 429;
        case COVE_E_UNAUTHORIZED:
                return 401;
        case COVE_E_KEY_REVOKED:
                return 403;
        case COVE_E_UNAVAILABLE:
                return 503;
        default:
                return 500;
        }
}

static int reply_err(struct cove_req *r, const struct cove_err *err)
{
        return reply_error(r, err_status(err), "%s", err->msg[0] ? err->msg : "error");
}

/* X-API-KEY: e2b_<hex of a cove key> → the key's tenant. Answers 401 itself on failure. */
static int auth(struct cove_e2b *e, struct cove_req *r)
{
        const char *k = cove_req_header(r, "X-API-KEY");
        char key[256];
        if (!k)
                return reply_error(r, 401,
                                   "missing API key: send X-API-KEY: e2b_<hex of a cove API "
                                   "key> (see docs/e2b.md)"),
                       -1;
        if (cove_e2b_key_decode(k, key, sizeof(key)) < 0)
                return reply_error(r, 401,
                                   "invalid API key: expected e2b_<hex of a cove API "
                                   "key>"),
                       -1;
        struct cove_apikey_row row;
        struct cove_err err;
        int rc = cove_apikey_verify(e->d->cat_ops, e->d->cat, key, &row, &err);
        OPENSSL_cleanse(key, sizeof(key));
        if (rc < 0) {
                if (err.kind != COVE_E_UNAUTHORIZED) {
                        cove_warn(&e->d->log, "e2b.auth", "%s", err.msg);
                        return reply_error(r, 503, "cannot check the API key now"), -1;
                }
                return reply_error(r, 401, "invalid API key"), -1;
        }
        snprintf(r->tenant, sizeof(r->tenant), "%s", row.tenant);
        snprintf(r->key_id, sizeof(r->key_id), "%s", row.id);
        r->admin = row.admin;
        return 0;
}

#define AUTH(e, r)                                                                                 \
        do {                                                                                       \
                if (auth(e, r) < 0)                                                                \
                        return 0;                                                                  \
        } while (0)

static int live_state(const char *s)
{
        return !strcmp(s, "running") || !strcmp(s, "starting");
}

/* Paused for E2B: paused, or on the way into or out of it (a connect resumes it). */
static int paused_state(const char *s)
{
        return !strcmp(s, "paused") || !strcmp(s, "pausing") || !strcmp(s, "resuming");
}

/* E2B's SandboxDetail / ListedSandbox for a cove row. */
static json_t *detail(struct cove_e2b *e, const struct cove_sandbox_row *s, int with_token)
{
        char started[40], end[40];
        cove_rfc3339(s->created_at, started, sizeof(started));
        cove_rfc3339(s->expires_at ? s->expires_at : s->created_at, end, sizeof(end));
        json_error_t je;
        json_t *meta = json_loads(s->metadata_json ? s->metadata_json : "{}", 0, &je);
        const char *state = live_state(s->state)     ? "running"
                            : paused_state(s->state) ? "paused"
                                                     : s->state;
        json_t *o = json_pack(
            "{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:i, s:i, s:i, s:s, s:o, s:{s:s, s:b}}",
            "sandboxID", s->id, "templateID", s->template_name, "alias", s->template_name,
            "clientID", s->node, "startedAt", started, "endAt", end, "state", state, "cpuCount",
            s->cpus, "memoryMB", s->memory_mb, "diskSizeMB", s->disk_mb, "envdVersion",
            COVE_E2B_ENVD_VERSION, "metadata", json_is_object(meta) ? meta : json_object(),
            "lifecycle", "onTimeout", s->on_timeout, "autoResume", 0);
        if (!json_is_object(meta))
                json_decref(meta);
        if (o && with_token) {
                char tok[COVE_E2B_TOKEN_HEX];
                cove_e2b_token(e, s->id, tok);
                json_object_set_new(o, "envdAccessToken", json_string(tok));
                const char *dom = coved_ports_domain(e->d);
                json_object_set_new(o, "domain", dom[0] ? json_string(dom) : json_null());
                if (dom[0] || e->d->ports) {
                        char tt[80];
                        traffic_token(e, s->id, tt);
                        json_object_set_new(o, "trafficAccessToken", json_string(tt));
                        OPENSSL_cleanse(tt, sizeof(tt));
                }
        }
        return o;
}

/* The tenant's live (or, with paused_ok, paused) sandbox, or an answered 404 (E2B forgets
 * stopped sandboxes). */
static int load_known(struct cove_e2b *e, struct cove_req *r, struct cove_sandbox_row *row,
                      int paused_ok)
{
        struct cove_err err;
        if (cove_sandbox_load(e->d, r->tenant, r->params[0], row, &err) < 0) {
                if (err.kind == COVE_E_NOT_FOUND)
                        reply_error(r, 404, "sandbox \"%.64s\" not found", r->params[0]);
                else
                        reply_err(r, &err);
                return -1;
        }
        if (!live_state(row->state) && !(paused_ok && paused_state(row->state))) {
                reply_error(r, 404, "sandbox \"%s\" is %s%s%s", row->id, row->state,
                            row->error ? ": " : "", row->error ? row->error : "");
                cove_sandbox_row_clear(row);
                return -1;
        }
        return 0;
}

static int load_live(struct cove_e2b *e, struct cove_req *r, struct cove_sandbox_row *row)
{
        return load_known(e, r, row, 0);
}

/* ---- handlers --------------------------------------------------------------------- */

static int h_health(void *app, struct cove_req *r)
{
        return cove_reply_json(r, 200, json_pack("{s:s}", "message", "Health check successful"));
}

static int nonempty(json_t *v)
{
        return v && !json_is_null(v) && !json_is_false(v) &&
               !(json_is_object(v) && json_object_size(v) == 0) &&
               !(json_is_array(v) && json_array_size(v) == 0);
}

/* network: absent, or an object with nothing but allowPublicTraffic (a boolean) */
static int network_ok(json_t *n)
{
        if (!nonempty(n))
                return 1;
        if (!json_is_object(n))
                return 0;
        const char *k;
        json_t *v;
        json_object_foreach(n, k, v)
        {
                if (strcmp(k, "allowPublicTraffic") || !json_is_boolean(v))
                        return 0;
        }
        return 1;
}

/* Whether pauses here keep memory and processes (runtime full snapshots, CRIU); waits for
 * coved's start-up self-check when it still runs (1-3 s), as a pause itself would. */
static int full_snapshots(struct cove_e2b *e)
{
        char why[320];
        /* TODO(cl-fwd): a control replica asks the sandbox's node */
        return e->d->node && cove_node_full_wait(e->d->node, 60000, why, sizeof(why)) == 1;
}

/* POST /sandboxes and /v2/sandboxes: build cove's create body from E2B's NewSandbox. */
static int h_create(void *app, struct cove_req *r)
{
        struct cove_e2b *e = app;
        AUTH(e, r);
        json_t *b = cove_req_json(r, 0);
        if (!b)
                return 0;
        const char *why = NULL;
        json_t *tpl = json_object_get(b, "templateID"), *to = json_object_get(b, "timeout");
        int public_traffic =
            json_is_true(json_object_get(json_object_get(b, "network"), "allowPublicTraffic"));
        if (!json_is_string(tpl) || !json_string_length(tpl))
                why = "templateID is required (cove templates: base, busybox)";
        else if (to && !json_is_null(to) && !json_is_integer(to))
                why = "timeout must be an integer number of seconds";
        else if (json_is_true(json_object_get(b, "autoPauseMemory")) && !full_snapshots(e))
                why = "onTimeout.keepMemory is not supported on this node: it has no full "
                      "snapshots (CRIU), so a pause keeps the sandbox's files, not its memory "
                      "(running processes end); use keepMemory: false";
        else if (json_is_true(json_object_get(json_object_get(b, "autoResume"), "enabled")))
                why = "lifecycle.autoResume is not supported: resume a paused sandbox with "
                      "Sandbox.connect()";
        else if (nonempty(json_object_get(b, "mcp")))
                why = "MCP gateways are not supported by cove";
        else if (nonempty(json_object_get(b, "volumeMounts")))
                why = "volume mounts are not supported by cove";
        else if (!network_ok(json_object_get(b, "network")))
                why = "network rules are not supported yet: cove sandboxes have no network beyond "
                      "their own loopback (network.allowPublicTraffic is)";
        if (why) {
                json_decref(b);
                return reply_error(r, 400, "%s", why);
        }
        json_t *body = json_pack("{s:O, s:s}", "template", tpl, "on_timeout",
                                 json_is_true(json_object_get(b, "autoPause")) ? "pause" : "kill");
        if (json_is_integer(to) && json_integer_value(to) > 0)
                json_object_set(body, "timeout_s", to);
        else if (json_is_integer(to))
                json_object_set_new(body, "timeout_s", json_integer(1));
        json_t *meta = json_object_get(b, "metadata"), *env = json_object_get(b, "envVars");
        if (meta && !json_is_null(meta))
                json_object_set(body, "metadata", meta);
        if (env && !json_is_null(env))
                json_object_set(body, "env", env);
        json_decref(b);
        json_t *out = NULL;
        struct cove_err err;
        int rc = cove_sandbox_create(e->d, r->tenant, body, &out, &err);
        json_decref(body);
        if (rc < 0)
                return reply_err(r, &err);
        const char *id = json_string_value(json_object_get(out, "id"));
        struct cove_sandbox_row row;
        if (id) { /* its ports: behind the traffic token unless allowPublicTraffic: true */
                char tt[80];
                traffic_token(e, id, tt);
                if (coved_ports_expose_all(e->d, r->tenant, id, public_traffic, tt, &err) < 0)
                        cove_warn(&e->d->log, "e2b", "ports of %s: %s", id, err.msg);
                OPENSSL_cleanse(tt, sizeof(tt));
        }
        rc = id ? cove_sandbox_load(e->d, r->tenant, id, &row, &err) : -1;
        json_decref(out);
        if (rc < 0)
                return reply_error(r, 500, "sandbox created but not readable back");
        json_t *o = detail(e, &row, 1);
        cove_sandbox_row_clear(&row);
        return cove_reply_json(r, 201, o);
}

static int h_get(void *app, struct cove_req *r)
{
        struct cove_e2b *e = app;
        AUTH(e, r);
        struct cove_sandbox_row row;
        if (load_known(e, r, &row, 1) < 0)
                return 0;
        json_t *o = detail(e, &row, 1);
        cove_sandbox_row_clear(&row);
        return cove_reply_json(r, 200, o);
}

static int h_kill(void *app, struct cove_req *r)
{
        struct cove_e2b *e = app;
        AUTH(e, r);
        struct cove_sandbox_row row;
        struct cove_err err;
        if (cove_sandbox_load(e->d, r->tenant, r->params[0], &row, &err) < 0)
                return err.kind == COVE_E_NOT_FOUND
                           ? reply_error(r, 404, "sandbox \"%.64s\" not found", r->params[0])
                           : reply_err(r, &err);
        int was_live = live_state(row.state) || paused_state(row.state);
        cove_sandbox_row_clear(&row);
        /* a stopped sandbox is gone for E2B (kill() → false), but its row is still cleaned */
        if (cove_sandbox_delete(e->d, r->tenant, r->params[0], 1, &err) < 0)
                return reply_err(r, &err);
        if (!was_live)
                return reply_error(r, 404, "sandbox \"%.64s\" not found", r->params[0]);
        return cove_reply_empty(r, 204);
}

/* Set the timeout to `timeout` s from now; with only_extend, never shorten it. */
static int set_timeout(struct cove_e2b *e, struct cove_req *r, struct cove_sandbox_row *row,
                       json_int_t t, int only_extend, struct cove_err *err)
{
        if (t < 1)
                t = 1;
        if (only_extend && row->expires_at && cove_now_ms() + t * 1000 <= row->expires_at)
                return 0;
        json_t *body = json_pack("{s:I}", "timeout_s", t);
        json_t *out = NULL;
        int rc = cove_sandbox_set_timeout(e->d, r->tenant, row->id, body, &out, err);
        json_decref(body);
        if (rc == 0) {
                /* report what was stored, not a second reading of the clock */
                struct cove_sandbox_row now;
                struct cove_err e2;
                if (cove_sandbox_load(e->d, r->tenant, row->id, &now, &e2) == 0) {
                        row->expires_at = now.expires_at;
                        cove_sandbox_row_clear(&now);
                }
        }
        json_decref(out);
        return rc;
}

static int h_timeout(void *app, struct cove_req *r)
{
        struct cove_e2b *e = app;
        AUTH(e, r);
        json_t *b = cove_req_json(r, 0);
        if (!b)
                return 0;
        json_t *t = json_object_get(b, "timeout");
        if (!json_is_integer(t) || json_integer_value(t) < 0) {
                json_decref(b);
                return reply_error(r, 400, "timeout must be a number of seconds");
        }
        json_int_t secs = json_integer_value(t);
        json_decref(b);
        struct cove_sandbox_row row;
        if (load_live(e, r, &row) < 0)
                return 0;
        struct cove_err err;
        int rc = set_timeout(e, r, &row, secs, 0, &err);
        cove_sandbox_row_clear(&row);
        return rc < 0 ? reply_err(r, &err) : cove_reply_empty(r, 204);
}

/* Resume the tenant's paused sandbox id (cove_sandbox_resume: its last snapshot into a
 * fresh layer, a new instance, the timeout starts again) and reload it into row. Answers
 * itself and returns -1 on failure; returns 1 (row loaded, untouched) when it turned out
 * to be running already (a concurrent connect resumed it first). */
static int resume(struct cove_e2b *e, struct cove_req *r, struct cove_sandbox_row *row)
{
        struct cove_err err;
        json_t *out = NULL;
        int rc = cove_sandbox_resume(e->d, r->tenant, r->params[0], NULL, &out, &err);
        json_decref(out);
        if (rc < 0 && err.kind != COVE_E_CONFLICT)
                return reply_err(r, &err), -1;
        if (load_live(e, r, row) < 0)
                return -1;
        return rc < 0 ? 1 : 0;
}

/* The optional {timeout} of connect and resume: seconds, or -1 when absent. */
static int body_timeout(struct cove_req *r, json_int_t *secs)
{
        json_t *b = cove_req_json(r, 1);
        if (!b)
                return -1;
        json_t *t = json_object_get(b, "timeout");
        int bad = t && !json_is_null(t) && (!json_is_integer(t) || json_integer_value(t) < 0);
        *secs = json_is_integer(t) ? json_integer_value(t) : -1;
        json_decref(b);
        if (bad)
                return reply_error(r, 400, "timeout must be a number of seconds"), -1;
        return 0;
}

/* POST /sandboxes/{id}/connect and /v2/…: 200 when running (the timeout only ever
 * extends); a paused sandbox is resumed first: 201, with the timeout set as asked. The
 * body's `memory` is not looked at: a resume always restores the files only. */
static int h_connect(void *app, struct cove_req *r)
{
        struct cove_e2b *e = app;
        AUTH(e, r);
        json_int_t secs;
        if (body_timeout(r, &secs) < 0)
                return 0;
        struct cove_sandbox_row row;
        if (load_known(e, r, &row, 1) < 0)
                return 0;
        unsigned status = 200;
        if (paused_state(row.state)) {
                cove_sandbox_row_clear(&row);
                int rc = resume(e, r, &row);
                if (rc < 0)
                        return 0;
                status = rc == 0 ? 201 : 200;
        }
        struct cove_err err;
        if (secs >= 0 && set_timeout(e, r, &row, secs, status == 200, &err) < 0) {
                cove_sandbox_row_clear(&row);
                return reply_err(r, &err);
        }
        json_t *o = detail(e, &row, 1);
        cove_sandbox_row_clear(&row);
        return cove_reply_json(r, status, o);
}

/* POST /sandboxes/{id}/pause → 204; 409 when already paused (the SDK's pause() then
 * answers false). On a node with full snapshots (CRIU) the pause keeps memory and running
 * processes, as E2B's does; without, only the sandbox's files are kept (a snapshot of kind
 * "files": its processes end), so an explicit {"memory": true} is refused, not ignored. */
static int h_pause(void *app, struct cove_req *r)
{
        struct cove_e2b *e = app;
        AUTH(e, r);
        json_t *b = cove_req_json(r, 1);
        if (!b)
                return 0;
        int memory = json_is_true(json_object_get(b, "memory"));
        json_decref(b);
        /* a vm sandbox's pause always keeps memory; an ns one's where CRIU works */
        if (memory && !(e->d->node && cove_node_has_full(e->d->node, r->params[0])) &&
            !full_snapshots(e))
                return reply_error(r, 400,
                                   "keepMemory is not supported on this node: it has no full "
                                   "snapshots (CRIU), so a pause keeps the sandbox's files, not "
                                   "its memory (running processes end); pause without "
                                   "keepMemory or with keepMemory: false");
        struct cove_sandbox_row row;
        if (load_known(e, r, &row, 1) < 0)
                return 0;
        int paused = paused_state(row.state);
        cove_sandbox_row_clear(&row);
        if (paused)
                return reply_error(r, 409, "sandbox \"%.64s\" is already paused", r->params[0]);
        json_t *out = NULL;
        struct cove_err err;
        if (cove_sandbox_pause(e->d, r->tenant, r->params[0], &out, &err) < 0)
                return err.kind == COVE_E_CONFLICT
                           ? reply_error(r, 409, "sandbox \"%.64s\" cannot be paused now: %s",
                                         r->params[0], err.msg)
                           : reply_err(r, &err);
        json_decref(out);
        return cove_reply_empty(r, 204);
}

/* POST /sandboxes/{id}/resume (deprecated by E2B for connect): 201 when resumed, 409 when
 * running. */
static int h_resume(void *app, struct cove_req *r)
{
        struct cove_e2b *e = app;
        AUTH(e, r);
        json_int_t secs;
        if (body_timeout(r, &secs) < 0)
                return 0;
        struct cove_sandbox_row row;
        if (load_known(e, r, &row, 1) < 0)
                return 0;
        int paused = paused_state(row.state);
        cove_sandbox_row_clear(&row);
        if (!paused)
                return reply_error(r, 409, "sandbox \"%.64s\" is already running", r->params[0]);
        int rc = resume(e, r, &row);
        if (rc < 0)
                return 0;
        if (rc > 0) {
                cove_sandbox_row_clear(&row);
                return reply_error(r, 409, "sandbox \"%.64s\" is already running", r->params[0]);
        }
        struct cove_err err;
        if (secs >= 0 && set_timeout(e, r, &row, secs, 0, &err) < 0) {
                cove_sandbox_row_clear(&row);
                return reply_err(r, &err);
        }
        json_t *o = detail(e, &row, 1);
        cove_sandbox_row_clear(&row);
        return cove_reply_json(r, 201, o);
}

static int h_metrics(void *app, struct cove_req *r)
{
        struct cove_e2b *e = app;
        AUTH(e, r);
        struct cove_sandbox_row row;
        struct cove_chan *c = NULL;
        struct cove_err err;
        if (cove_sandbox_chan(e->d, r->tenant, r->params[0], &c, &row, &err) < 0)
                return err.kind == COVE_E_NOT_FOUND || err.kind == COVE_E_CONFLICT
                           ? reply_error(r, 404, "sandbox \"%.64s\" not found", r->params[0])
                           : reply_err(r, &err);
        json_t *req = json_pack("{s:s}", "op", "usage"), *u = NULL;
        int rc = cove_chan_call(c, req, &u, 0, &err);
        json_decref(req);
        cove_chan_unref(c);
        if (rc < 0) {
                cove_sandbox_row_clear(&row);
                return reply_err(r, &err);
        }
        int64_t now = cove_now_ms();
        char ts[40];
        cove_rfc3339(now, ts, sizeof(ts));
        /* cpuUsedPct: the average since the sandbox started (one sample, no history kept) */
        double alive_us = (double)(now - row.created_at) * 1000.0;
        double cpu_us = (double)json_integer_value(json_object_get(u, "cpu_usec"));
        double pct = alive_us > 0 ? 100.0 * cpu_us / (alive_us * (row.cpus ? row.cpus : 1)) : 0;
        if (pct > 100)
                pct = 100;
        json_t *m =
            json_pack("{s:s, s:I, s:i, s:f, s:I, s:I, s:I, s:I}", "timestamp", ts, "timestampUnix",
                      (json_int_t)(now / 1000), "cpuCount", row.cpus, "cpuUsedPct", pct, "memUsed",
                      json_integer_value(json_object_get(u, "mem_bytes")), "memTotal",
                      (json_int_t)row.memory_mb << 20, "diskUsed",
                      json_integer_value(json_object_get(u, "disk_used_bytes")), "diskTotal",
                      json_integer_value(json_object_get(u, "disk_total_bytes")));
        json_decref(u);
        cove_sandbox_row_clear(&row);
        return cove_reply_json(r, 200, json_pack("[o]", m));
}

/* One layer of form decoding ('+' is a space) in place. */
static void form_decode(char *s)
{
        char *o = s;
        for (; *s; s++) {
                if (*s == '+') {
                        *o++ = ' ';
                } else if (*s == '%' && hexval((char)(s[1] | 0x20)) >= 0 &&
                           hexval((char)(s[2] | 0x20)) >= 0) {
                        *o++ =
                            (char)(hexval((char)(s[1] | 0x20)) << 4 | hexval((char)(s[2] | 0x20)));
                        s += 2;
                } else {
                        *o++ = *s;
                }
        }
        *o = '\0';
}

struct list_item {
        char id[64];
        json_t *o;
};

struct list_ctx {
        struct cove_e2b *e;
        json_t *meta; /* required key/values */
        struct list_item *items;
        size_t n, cap;
        int failed;
};

static int list_one(const struct cove_sandbox_row *row, void *arg)
{
        struct list_ctx *x = arg;
        if (!cove_sandbox_metadata_matches(row, x->meta))
                return 0;
        if (x->n == x->cap) {
                size_t nc = x->cap ? x->cap * 2 : 32;
                void *nb = realloc(x->items, nc * sizeof(*x->items));
                if (!nb) {
                        x->failed = 1;
                        return -1;
                }
                x->items = nb;
                x->cap = nc;
        }
        snprintf(x->items[x->n].id, sizeof(x->items[x->n].id), "%s", row->id);
        x->items[x->n].o = detail(x->e, row, 0);
        x->n++;
        return 0;
}

static int item_cmp(const void *a, const void *b)
{
        return strcmp(((const struct list_item *)a)->id, ((const struct list_item *)b)->id);
}

/* GET /v2/sandboxes (and the older GET /sandboxes): metadata and state filters, paging by
 * X-Next-Token (the last id of a page; items are ordered by id). */
static int h_list(void *app, struct cove_req *r)
{
        struct cove_e2b *e = app;
        AUTH(e, r);
        struct list_ctx x = {.e = e, .meta = json_object()};
        const char *mq = cove_req_query(r, "metadata");
        if (mq && *mq) {
                cleanup_free char *buf = strdup(mq);
                char *save = NULL;
                for (char *kv = buf ? strtok_r(buf, "&", &save) : NULL; kv;
                     kv = strtok_r(NULL, "&", &save)) {
                        char *eq = strchr(kv, '=');
                        if (!eq)
                                continue;
                        *eq = '\0';
                        char *v = eq + 1;
                        /* url.ParseQuery, then QueryUnescape of each part, as E2B does */
                        form_decode(kv);
                        form_decode(kv);
                        form_decode(v);
                        form_decode(v);
                        json_object_set_new(x.meta, kv, json_string(v));
                }
        }
        char states[128] = "";
        const char *sq = cove_req_query(r, "state");
        if (!sq || !*sq)
                sq = "running,paused";
        {
                cleanup_free char *buf = strdup(sq);
                char *save = NULL;
                for (char *s = buf ? strtok_r(buf, ",", &save) : NULL; s;
                     s = strtok_r(NULL, ",", &save)) {
                        const char *add = !strcmp(s, "running")  ? "starting,running"
                                          : !strcmp(s, "paused") ? "pausing,paused,resuming"
                                                                 : NULL;
                        if (!add) {
                                json_decref(x.meta);
                                return reply_error(r, 400,
                                                   "state must be running and/or paused, not "
                                                   "\"%.32s\"",
                                                   s);
                        }
                        size_t l = strlen(states);
                        snprintf(states + l, sizeof(states) - l, "%s%s", l ? "," : "", add);
                }
        }
        long limit = LIST_LIMIT_MAX;
        const char *lq = cove_req_query(r, "limit");
        if (lq) {
                char *end;
                limit = strtol(lq, &end, 10);
                if (!*lq || *end || limit < 1 || limit > LIST_LIMIT_MAX) {
                        json_decref(x.meta);
                        return reply_error(r, 400, "limit must be an integer from 1 to 100");
                }
        }
        const char *after = cove_req_query(r, "nextToken");
        struct cove_err err;
        int rc = e->d->cat_ops->sandbox_list(e->d->cat, r->tenant, states, list_one, &x, &err);
        json_decref(x.meta);
        json_t *arr = json_array();
        size_t shown = 0, next = 0;
        if (rc == 0 && !x.failed) {
                if (x.n)
                        qsort(x.items, x.n, sizeof(*x.items), item_cmp);
                for (size_t i = 0; i < x.n; i++) {
                        if (after && *after && strcmp(x.items[i].id, after) <= 0)
                                continue;
                        if (shown == (size_t)limit) {
                                next = 1;
                                break;
                        }
                        json_array_append(arr, x.items[i].o);
                        shown++;
                }
        }
        char token[64] = "";
        if (next && shown)
                snprintf(token, sizeof(token), "%s",
                         json_string_value(
                             json_object_get(json_array_get(arr, shown - 1), "sandboxID")));
        for (size_t i = 0; i < x.n; i++)
                json_decref(x.items[i].o);
        free(x.items);
        if (rc < 0 || x.failed) {
                json_decref(arr);
                return rc < 0 ? reply_err(r, &err) : reply_error(r, 500, "out of memory");
        }
        if (!token[0])
                return cove_reply_json(r, 200, arr);
        /* the paging header needs the response object: build it here */
        char *s = json_dumps(arr, JSON_COMPACT);
        json_decref(arr);
        if (!s)
                return reply_error(r, 500, "out of memory");
        struct MHD_Response *resp =
            MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
        if (!resp) {
                free(s);
                return reply_error(r, 500, "out of memory");
        }
        MHD_add_response_header(resp, "Content-Type", "application/json");
        MHD_add_response_header(resp, "X-Next-Token", token);
        MHD_add_response_header(resp, "Cache-Control", "no-store");
        MHD_queue_response(r->conn, 200, resp);
        MHD_destroy_response(resp);
        r->answered = 1;
        return 0;
}

static const struct cove_route e2b_api_routes[] = {
    {"GET", "/health", h_health, NULL, COVE_ROUTE_PUBLIC},
    {"POST", "/sandboxes", h_create, NULL, COVE_ROUTE_PUBLIC},
    {"POST", "/v2/sandboxes", h_create, NULL, COVE_ROUTE_PUBLIC},
    {"GET", "/sandboxes", h_list, NULL, COVE_ROUTE_PUBLIC},
    {"GET", "/v2/sandboxes", h_list, NULL, COVE_ROUTE_PUBLIC},
    {"GET", "/sandboxes/{id}", h_get, NULL, COVE_ROUTE_PUBLIC},
    {"DELETE", "/sandboxes/{id}", h_kill, NULL, COVE_ROUTE_PUBLIC},
    {"POST", "/sandboxes/{id}/timeout", h_timeout, NULL, COVE_ROUTE_PUBLIC},
    {"POST", "/sandboxes/{id}/connect", h_connect, NULL, COVE_ROUTE_PUBLIC},
    {"POST", "/v2/sandboxes/{id}/connect", h_connect, NULL, COVE_ROUTE_PUBLIC},
    {"POST", "/sandboxes/{id}/pause", h_pause, NULL, COVE_ROUTE_PUBLIC},
    {"POST", "/sandboxes/{id}/resume", h_resume, NULL, COVE_ROUTE_PUBLIC},
    {"GET", "/sandboxes/{id}/metrics", h_metrics, NULL, COVE_ROUTE_PUBLIC},
};

/* A route E2B does not have: answered in E2B's error shape, not cove's. */
static int h_unknown(void *app, struct cove_req *r)
{
        (void)app;
        return reply_error(r, 404, "no such route: %.16s %.200s", r->method ? r->method : "",
                           r->url ? r->url : "");
}

static const struct cove_route e2b_unknown = {"*", "*", h_unknown, NULL, COVE_ROUTE_PUBLIC};

/* Every route is public to the generic front end: each handler authenticates itself, so
 * that even a missing key is answered in E2B's error shape. */
static int no_auth(void *app, struct cove_req *r, const char *authorization, struct cove_err *err)
{
        return cove_err_setk(err, COVE_E_UNAUTHORIZED, 0, "unauthorized");
}

int cove_e2b_start(struct coved *d, const char *api_listen, const char *sandbox_listen,
                   struct cove_e2b **out, struct cove_err *err)
{
        *out = NULL;
        if (!api_listen && !sandbox_listen)
                return 0;
        struct cove_e2b *e = calloc(1, sizeof(*e));
        if (!e)
                return cove_err_set(err, ENOMEM, "e2b");
        e->d = d;
        if (load_secret(e, err) < 0)
                goto fail;
        if (api_listen) {
                struct cove_http_config hc = {
                    .routes = e2b_api_routes,
                    .nroutes = sizeof(e2b_api_routes) / sizeof(e2b_api_routes[0]),
                    .auth = no_auth,
                    .app = e,
                    .log = &d->log,
                    .quitting = &d->quitting,
                    .fallback = &e2b_unknown,
                };
                e->api = cove_http_start(&hc, api_listen, NULL, err);
                if (!e->api) {
                        cove_err_wrap(err, "E2B API listener");
                        goto fail;
                }
        }
        if (sandbox_listen) {
                struct cove_http_config hc = {
                    .routes = cove_e2b_envd_routes,
                    .nroutes = cove_e2b_envd_nroutes,
                    .auth = no_auth,
                    .app = e,
                    .log = &d->log,
                    .quitting = &d->quitting,
                    .fallback = &e2b_unknown,
                };
                e->envd = cove_http_start(&hc, sandbox_listen, NULL, err);
                if (!e->envd) {
                        cove_err_wrap(err, "E2B sandbox listener");
                        goto fail;
                }
        }
        cove_info(&d->log, "e2b.start", "E2B API on %s, E2B sandbox (envd) surface on %s",
                  api_listen ? api_listen : "(off)", sandbox_listen ? sandbox_listen : "(off)");
        *out = e;
        return 0;
fail:
        cove_e2b_stop(e);
        return -1;
}

void cove_e2b_stop(struct cove_e2b *e)
{
        if (!e)
                return;
        if (e->api)
                cove_http_stop(e->api);
        if (e->envd)
                cove_http_stop(e->envd);
        OPENSSL_cleanse(e->secret, sizeof(e->secret));
        free(e);
}
