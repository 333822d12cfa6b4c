/* The catalog through a control replica (store/catalog.h, cove_catalog_remote): every op is
 * one signed POST /v1/cluster/catalog/<op> with a JSON body; the control runs it on its own
 * catalog, for this node only (docs/cluster.md "Trust"). The answer is untrusted input: its
 * Cove-Node-Answer must prove the holder of this node's token answered, its size is
 * bounded and every row is decoded by store/catalog_wire.c. */
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "cluster/nodeauth.h"
#include "store/catalog.h"
#include "store/catalog_remote.h"
#include "store/catalog_schema.h"
#include "store/catalog_wire.h"
#include "util/util.h"

#define POOL_MAX 8

struct cove_catalog {
        char base[256]; /* http(s)://host:port, no trailing slash */
        char name[COVE_NODE_NAME_MAX + 1];
        char token[COVE_NODEAUTH_TOKEN_HEX];
        pthread_mutex_t mu;
        CURL *pool[POOL_MAX]; /* idle handles: each keeps its connection alive */
        int npool;
        int call_timeout_ms;
        int connect_timeout_ms;
        const char *canned; /* tests: the answer to every call (cove_catalog_remote_canned) */
        size_t canned_len;
};

/* how a failed attempt may be repeated (catalog.h defines which ops are idempotent) */
enum retry { R_READ, R_IDEM, R_ONCE };

struct answer {
        char *buf;
        size_t len, cap;
        int too_big;
        char node_answer[65];
};

static size_t on_body(char *p, size_t sz, size_t n, void *arg)
{
        struct answer *a = arg;
        size_t len = sz * n;
        if (a->len + len > COVE_REMOTE_ANSWER_MAX) {
                a->too_big = 1;
                return 0; /* aborts the transfer */
        }
        if (a->len + len + 1 > a->cap) {
                size_t cap = a->cap ? a->cap : 4096;
                while (cap < a->len + len + 1)
                        cap *= 2;
                char *b = realloc(a->buf, cap);
                if (!b)
                        return 0;
                a->buf = b;
                a->cap = cap;
        }
        memcpy(a->buf + a->len, p, len);
        a->len += len;
        a->buf[a->len] = '\0';
        return len;
}

static size_t on_header(char *p, size_t sz, size_t n, void *arg)
{
        struct answer *a = arg;
        size_t len = sz * n;
        static const char k[] = "cove-node-answer:";
        if (len > sizeof(k) - 1 && strncasecmp(p, k, sizeof(k) - 1) == 0) {
                const char *v = p + sizeof(k) - 1;
                size_t vl = len - (sizeof(k) - 1);
                while (vl && (*v == ' ' || *v == '\t'))
                        v++, vl--;
                while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' '))
                        vl--;
                if (vl == 64) {
                        memcpy(a->node_answer, v, 64);
                        a->node_answer[64] = '\0';
                }
        }
        return len;
}

static CURL *handle_take(struct cove_catalog *c)
{
        CURL *h = NULL;
        pthread_mutex_lock(&c->mu);
        if (c->npool)
                h = c->pool[--c->npool];
        pthread_mutex_unlock(&c->mu);
        return h ? h : curl_easy_init();
}

static void handle_give(struct cove_catalog *c, CURL *h, int keep)
{
        if (!h)
                return;
        pthread_mutex_lock(&c->mu);
        if (keep && c->npool < POOL_MAX) {
                c->pool[c->npool++] = h;
                h = NULL;
        }
        pthread_mutex_unlock(&c->mu);
        if (h)
                curl_easy_cleanup(h);
}

static void body_hash(const char *body, size_t len, char out[65])
{
        unsigned char md[32];
        unsigned int mdlen = 0;
        EVP_Digest(body, len, md, &mdlen, EVP_sha256(), NULL);
        cove_hex(md, 32, out);
}

/* printable ASCII of an untrusted message, at most cap-1 bytes */
static void sanitize(const char *in, char *out, size_t cap)
{
        size_t o = 0;
        for (; in && *in && o + 1 < cap; in++)
                out[o++] = (*in >= 0x20 && *in < 0x7f) ? *in : '?';
        out[o] = '\0';
}

static enum cove_err_kind kind_of(const char *code, long status)
{
        static const struct {
                const char *code;
                enum cove_err_kind kind;
        } map[] = {
            {"bad_request", COVE_E_BAD_REQUEST},   {"not_found", COVE_E_NOT_FOUND},
            {"conflict", COVE_E_CONFLICT},         {"limit_exceeded", COVE_E_LIMIT},
            {"unauthorized", COVE_E_UNAUTHORIZED}, {"forbidden", COVE_E_UNAUTHORIZED},
            {"unavailable", COVE_E_UNAVAILABLE},   {"key_revoked", COVE_E_KEY_REVOKED},
        };
        for (size_t i = 0; code && i < sizeof(map) / sizeof(map[0]); i++)
                if (!strcmp(map[i].code, code))
                        return map[i].kind;
        return status == 503 || status == 502 || status == 504 ? COVE_E_UNAVAILABLE
                                                               : COVE_E_INTERNAL;
}

/* An error answer: {"error":{"code","message"}} (anything else: by status) */
static int answer_error(struct cove_catalog *c, const char *op, long status, const char *body,
                        size_t len, int signed_ok, struct cove_err *err)
{
        json_t *j = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES, NULL);
        json_t *e = json_is_object(j) ? json_object_get(j, "error") : NULL;
        json_t *jc = json_is_object(e) ? json_object_get(e, "code") : NULL;
        json_t *jm = json_is_object(e) ? json_object_get(e, "message") : NULL;
        char code[32], msg[320];
        sanitize(json_is_string(jc) ? json_string_value(jc) : "", code, sizeof(code));
        sanitize(json_is_string(jm) ? json_string_value(jm) : "", msg, sizeof(msg));
        enum cove_err_kind k = kind_of(code, status);
        if (!signed_ok) /* not the control's word: only whether to retry is taken from it */
                k = (status == 502 || status == 503 || status == 504) ? COVE_E_UNAVAILABLE
                    : status == 401                                   ? COVE_E_UNAUTHORIZED
                                                                      : COVE_E_UNAVAILABLE;
        json_decref(j);
        return cove_err_setk(err, k, 0, "catalog via %s: %s: %s%s(%ld%s%s)", c->base, op,
                             signed_ok ? "" : "unsigned answer ", msg[0] ? msg : "", status,
                             code[0] ? " " : "", code);
}

/* One attempt. 0 with *out (the answer object), -1 with err; *sent 0 when the request
 * surely never reached the control (connect failed), *transient when a retry may help. */
static int attempt(struct cove_catalog *c, const char *op, const char *body, size_t blen,
                   int timeout_ms, json_t **out, int *sent, int *transient, struct cove_err *err)
{
        char path[128], url[400], auth[COVE_NODEAUTH_HDR_MAX + 32], hash[65], sig[65];
        *sent = 1;
        *transient = 0;
        *out = NULL;
        snprintf(path, sizeof(path), "/v1/cluster/catalog/%s", op);
        snprintf(url, sizeof(url), "%s%s", c->base, path);
        body_hash(body, blen, hash);
        struct cove_nodeauth_req q = {
            .method = "POST", .path_query = path, .tenant = NULL, .body_sha256_hex = hash};
        char hv[COVE_NODEAUTH_HDR_MAX];
        if (cove_nodeauth_sign(c->token, c->name, &q, cove_now_ms(), hv, sizeof(hv), sig, err) < 0)
                return -1;
        snprintf(auth, sizeof(auth), "Authorization: %s", hv);
        CURL *h = handle_take(c);
        if (!h)
                return cove_err_setk(err, COVE_E_INTERNAL, ENOMEM, "catalog via %s: %s", c->base,
                                     op);
        struct curl_slist *hl = curl_slist_append(NULL, auth);
        hl = curl_slist_append(hl, "Content-Type: application/json");
        hl = curl_slist_append(hl, "Expect:");
        struct answer a = {0};
        curl_easy_reset(h);
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)blen);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
        curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)c->connect_timeout_ms);
        curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
        curl_easy_setopt(h, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)COVE_REMOTE_ANSWER_MAX);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &a);
        curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(h, CURLOPT_HEADERDATA, &a);
        CURLcode cc = curl_easy_perform(h);
        long status = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
        curl_slist_free_all(hl);
        int rc = -1;
        if (cc != CURLE_OK) {
                handle_give(c, h, 0);
                if (a.too_big || cc == CURLE_FILESIZE_EXCEEDED) {
                        cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                      "catalog via %s: %s: answer larger than %u bytes", c->base,
                                      op, (unsigned)COVE_REMOTE_ANSWER_MAX);
                } else {
                        *sent = !(cc == CURLE_COULDNT_CONNECT || cc == CURLE_COULDNT_RESOLVE_HOST);
                        *transient = 1;
                        cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                      "catalog via %s: %s: %s (the control did not answer)",
                                      c->base, op, curl_easy_strerror(cc));
                }
                goto out;
        }
        handle_give(c, h, 1);
        int signed_ok =
            a.node_answer[0] && cove_nodeauth_answer_check(c->token, sig, a.node_answer, NULL) == 0;
        if (status != 200) {
                *transient = status == 502 || status == 503 || status == 504;
                answer_error(c, op, status, a.buf, a.len, signed_ok, err);
                goto out;
        }
        if (!signed_ok) {
                cove_err_setk(err, COVE_E_UNAUTHORIZED, 0,
                              "catalog via %s: %s: the answer does not prove it comes from a "
                              "control replica (Cove-Node-Answer missing or wrong)",
                              c->base, op);
                goto out;
        }
        json_error_t je;
        json_t *j = json_loadb(a.buf ? a.buf : "", a.len, JSON_REJECT_DUPLICATES, &je);
        if (!json_is_object(j)) {
                json_decref(j);
                cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                              "catalog via %s: %s: the answer is not a JSON object", c->base, op);
                goto out;
        }
        *out = j;
        rc = 0;
out:
        free(a.buf);
        return rc;
}

/* Run op with body (stolen). Retries with backoff and jitter: R_READ and R_IDEM after any
 * transient failure, R_ONCE only when the request surely did not reach the control. */
static int call(struct cove_catalog *c, const char *op, json_t *body, enum retry rt, int timeout_ms,
                json_t **out, struct cove_err *err)
{
        char *s = body ? json_dumps(body, JSON_COMPACT) : NULL;
        json_decref(body);
        if (!s)
                return cove_err_setk(err, COVE_E_INTERNAL, ENOMEM, "catalog: %s: encode", op);
        int rc = -1;
        if (c->canned) {
                json_t *j = json_loadb(c->canned, c->canned_len, JSON_REJECT_DUPLICATES, NULL);
                free(s);
                if (json_is_object(j)) {
                        *out = j;
                        return 0;
                }
                json_decref(j);
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "catalog: %s: the answer is not a JSON object", op);
        }
        for (int i = 0; i < 3; i++) {
                int sent, transient;
                rc = attempt(c, op, s, strlen(s), timeout_ms ? timeout_ms : c->call_timeout_ms, out,
                             &sent, &transient, err);
                if (rc == 0 || !transient || (rt == R_ONCE && sent) || i == 2)
                        break;
                unsigned char r = 0;
                cove_random(&r, 1, NULL);
                int64_t ms = (int64_t)(100 << (2 * i)) + r % 100; /* 100, 400 ms + jitter */
                struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
                nanosleep(&ts, NULL);
        }
        free(s);
        return rc;
}

static int bad_answer(struct cove_catalog *c, const char *op, struct cove_err *err)
{
        return cove_err_wrap(err, "catalog via %s: %s: bad answer", c->base, op);
}

/* ---- open / close ---- */

struct cove_catalog *cove_catalog_remote_open(const char *url, const char *node_name,
                                              const char *token, struct cove_err *err)
{
        const char *u = url ? url : "";
        if (!strncmp(u, "cove+", 5))
                u += 5;
        if ((strncmp(u, "http://", 7) && strncmp(u, "https://", 8)) || strlen(u) >= 256 ||
            strpbrk(u, " \t\r\n?#")) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                              "--control must be http(s)://HOST:PORT of a control replica");
                return NULL;
        }
        if (!node_name || !cove_node_name_valid(node_name) || !token || strlen(token) != 64) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                              "the remote catalog needs the node's name and token");
                return NULL;
        }
        curl_global_init(CURL_GLOBAL_DEFAULT); /* as the S3 store does; counted by curl */
        struct cove_catalog *c = calloc(1, sizeof(*c));
        if (!c) {
                cove_err_set(err, ENOMEM, "remote catalog");
                return NULL;
        }
        snprintf(c->base, sizeof(c->base), "%s", u);
        size_t n = strlen(c->base);
        while (n && c->base[n - 1] == '/')
                c->base[--n] = '\0';
        snprintf(c->name, sizeof(c->name), "%s", node_name);
        memcpy(c->token, token, 65);
        pthread_mutex_init(&c->mu, NULL);
        const char *t = getenv("COVE_REMOTE_CALL_TIMEOUT_MS");
        c->call_timeout_ms = t && atoi(t) > 0 ? atoi(t) : 35000;
        c->connect_timeout_ms = 5000;
        int v = 0;
        if (cove_catalog_remote.schema_version(c, &v, err) < 0) {
                cove_catalog_remote.close(c);
                return NULL;
        }
        if (v > cove_catalog_schema_version) {
                cove_err_setk(err, COVE_E_CONFLICT, 0,
                              "catalog via %s: schema %d is newer than this coved's %d: upgrade "
                              "the node",
                              c->base, v, cove_catalog_schema_version);
                cove_catalog_remote.close(c);
                return NULL;
        }
        return c;
}

struct cove_catalog *cove_catalog_remote_canned(const char *answer, size_t len)
{
        struct cove_catalog *c = calloc(1, sizeof(*c));
        if (!c)
                return NULL;
        snprintf(c->base, sizeof(c->base), "canned");
        pthread_mutex_init(&c->mu, NULL);
        c->canned = answer;
        c->canned_len = len;
        return c;
}

static struct cove_catalog *r_open(const char *dsn, struct cove_err *err)
{
        (void)dsn;
        cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                      "the remote catalog is opened with the node's identity "
                      "(cove_catalog_remote_open), not a dsn");
        return NULL;
}

static void r_close(struct cove_catalog *c)
{
        if (!c)
                return;
        for (int i = 0; i < c->npool; i++)
                curl_easy_cleanup(c->pool[i]);
        pthread_mutex_destroy(&c->mu);
        explicit_bzero(c->token, sizeof(c->token));
        free(c);
}

/* ---- helpers for the op bodies ---- */

static json_t *jstr(const char *s)
{
        return s ? json_string(s) : json_null();
}

/* {"found":bool} → 0 found / 1 not; -1 bad */
static int found_of(json_t *a, struct cove_err *err)
{
        int f;
        if (cove_wire_bool(a, "found", &f, 1, err) < 0)
                return -1;
        return f ? 0 : 1;
}

static void sandbox_defaults(struct cove_sandbox_row *s)
{
        if (!s->metadata_json)
                s->metadata_json = strdup("{}");
        if (!s->env_json)
                s->env_json = strdup("{}");
}

/* a list answer's array member, each element decoded by dec into row then passed to cb */
#define LIST_ANSWER(a, member, rowtype, dec, clear, cb, arg)                                       \
        ({                                                                                         \
                int rc_ = 0;                                                                       \
                json_t *arr_ = json_object_get((a), (member));                                     \
                if (!json_is_array(arr_)) {                                                        \
                        rc_ = cove_err_setk(err, COVE_E_BAD_REQUEST, 0,                            \
                                            "catalog wire: \"%s\" is not an array", (member));     \
                } else {                                                                           \
                        size_t i_;                                                                 \
                        json_t *v_;                                                                \
                        json_array_foreach(arr_, i_, v_)                                           \
                        {                                                                          \
                                rowtype row_;                                                      \
                                if (dec(v_, &row_, err) < 0) {                                     \
                                        rc_ = -1;                                                  \
                                        break;                                                     \
                                }                                                                  \
                                int s_ = (cb)(&row_, (arg));                                       \
                                clear(&row_);                                                      \
                                if (s_ < 0)                                                        \
                                        break;                                                     \
                        }                                                                          \
                }                                                                                  \
                rc_;                                                                               \
        })

static void no_clear(void *p)
{
        (void)p;
}
static void audit_clear(struct cove_audit_row *a)
{
        free(a->detail_json);
        a->detail_json = NULL;
}
static int sandbox_dec(const json_t *o, struct cove_sandbox_row *s, struct cove_err *err)
{
        if (cove_wire_sandbox_from(o, s, err) < 0)
                return -1;
        sandbox_defaults(s);
        return 0;
}

/* Each op: encode, call, decode. 0/1 as catalog.h, -1 with err. */
#define CALL(op, body, rt, a)                                                                      \
        do {                                                                                       \
                if (call(c, (op), (body), (rt), 0, &(a), err) < 0)                                 \
                        return -1;                                                                 \
        } while (0)

static int r_schema_version(struct cove_catalog *c, int *version, struct cove_err *err)
{
        json_t *a;
        CALL("schema_version", json_object(), R_READ, a);
        int64_t v;
        int rc = cove_wire_i64(a, "version", &v, 0, 100000, 1, err);
        json_decref(a);
        if (rc < 0)
                return bad_answer(c, "schema_version", err);
        *version = (int)v;
        return 0;
}

static int r_tenant_put(struct cove_catalog *c, const struct cove_tenant_row *t,
                        struct cove_err *err)
{
        json_t *a;
        CALL("tenant_put", json_pack("{s:o}", "tenant", cove_wire_tenant(t)), R_IDEM, a);
        json_decref(a);
        return 0;
}

static int r_tenant_get(struct cove_catalog *c, const char *id, struct cove_tenant_row *out,
                        struct cove_err *err)
{
        json_t *a;
        CALL("tenant_get", json_pack("{s:o}", "id", jstr(id)), R_READ, a);
        int rc = found_of(a, err);
        if (rc == 0 && cove_wire_tenant_from(json_object_get(a, "tenant"), out, err) < 0)
                rc = -1;
        json_decref(a);
        return rc < 0 ? bad_answer(c, "tenant_get", err) : rc;
}

static int r_tenant_list(struct cove_catalog *c, cove_tenant_cb cb, void *arg, struct cove_err *err)
{
        json_t *a;
        CALL("tenant_list", json_object(), R_READ, a);
        int rc = LIST_ANSWER(a, "tenants", struct cove_tenant_row, cove_wire_tenant_from, no_clear,
                             cb, arg);
        json_decref(a);
        return rc < 0 ? bad_answer(c, "tenant_list", err) : 0;
}

static int r_apikey_list(struct cove_catalog *c, const char *tenant, cove_apikey_cb cb, void *arg,
                         struct cove_err *err)
{
        json_t *a;
        CALL("apikey_list", json_pack("{s:o}", "tenant", jstr(tenant)), R_READ, a);
        int rc = LIST_ANSWER(a, "keys", struct cove_apikey_row, cove_wire_apikey_from, no_clear, cb,
                             arg);
        json_decref(a);
        return rc < 0 ? bad_answer(c, "apikey_list", err) : 0;
}

static int r_apikey_put(struct cove_catalog *c, const struct cove_apikey_row *k,
                        struct cove_err *err)
{
        json_t *a;
        CALL("apikey_put", json_pack("{s:o}", "key", cove_wire_apikey(k)), R_IDEM, a);
        json_decref(a);
        return 0;
}

static int r_apikey_get(struct cove_catalog *c, const char *id, struct cove_apikey_row *out,
                        struct cove_err *err)
{
        json_t *a;
        CALL("apikey_get", json_pack("{s:o}", "id", jstr(id)), R_READ, a);
        int rc = found_of(a, err);
        if (rc == 0 && cove_wire_apikey_from(json_object_get(a, "key"), out, err) < 0)
                rc = -1;
        json_decref(a);
        return rc < 0 ? bad_answer(c, "apikey_get", err) : rc;
}

static int r_apikey_count(struct cove_catalog *c, int64_t *n, struct cove_err *err)
{
        json_t *a;
        CALL("apikey_count", json_object(), R_READ, a);
        int rc = cove_wire_i64(a, "count", n, 0, INT64_MAX, 1, err);
        json_decref(a);
        return rc < 0 ? bad_answer(c, "apikey_count", err) : 0;
}

static int r_sandbox_insert(struct cove_catalog *c, const struct cove_sandbox_row *s,
                            struct cove_err *err)
{
        json_t *a;
        CALL("sandbox_insert", json_pack("{s:o}", "sandbox", cove_wire_sandbox(s)), R_ONCE, a);
        json_decref(a);
        return 0;
}

static int r_sandbox_update(struct cove_catalog *c, const struct cove_sandbox_row *s,
                            struct cove_err *err)
{
        json_t *a;
        CALL("sandbox_update", json_pack("{s:o}", "sandbox", cove_wire_sandbox(s)), R_IDEM, a);
        int rc = found_of(a, err);
        json_decref(a);
        return rc < 0 ? bad_answer(c, "sandbox_update", err) : rc;
}

static int r_sandbox_update_fenced(struct cove_catalog *c, const struct cove_sandbox_row *s,
                                   const char *node, int64_t epoch, int64_t generation,
                                   struct cove_err *err)
{
        json_t *a;
        CALL("sandbox_update_fenced",
             json_pack("{s:o, s:o, s:I, s:I}", "sandbox", cove_wire_sandbox(s), "node", jstr(node),
                       "epoch", (json_int_t)epoch, "generation", (json_int_t)generation),
             R_IDEM, a);
        int rc = found_of(a, err);
        json_decref(a);
        return rc < 0 ? bad_answer(c, "sandbox_update_fenced", err) : rc;
}

static int r_sandbox_get(struct cove_catalog *c, const char *tenant, const char *id,
                         struct cove_sandbox_row *out, struct cove_err *err)
{
        json_t *a;
        CALL("sandbox_get", json_pack("{s:o, s:o}", "tenant", jstr(tenant), "id", jstr(id)), R_READ,
             a);
        int rc = found_of(a, err);
        if (rc == 0 && sandbox_dec(json_object_get(a, "sandbox"), out, err) < 0)
                rc = -1;
        json_decref(a);
        return rc < 0 ? bad_answer(c, "sandbox_get", err) : rc;
}

static int r_sandbox_list(struct cove_catalog *c, const char *tenant, const char *states,
                          cove_sandbox_cb cb, void *arg, struct cove_err *err)
{
        json_t *a;
        CALL("sandbox_list",
             json_pack("{s:o, s:o}", "tenant", jstr(tenant), "states", jstr(states)), R_READ, a);
        int rc = LIST_ANSWER(a, "sandboxes", struct cove_sandbox_row, sandbox_dec,
                             cove_sandbox_row_clear, cb, arg);
        json_decref(a);
        return rc < 0 ? bad_answer(c, "sandbox_list", err) : 0;
}

static int r_sandbox_delete(struct cove_catalog *c, const char *id, struct cove_err *err)
{
        json_t *a;
        CALL("sandbox_delete", json_pack("{s:o}", "id", jstr(id)), R_ONCE, a);
        int rc = found_of(a, err);
        json_decref(a);
        return rc < 0 ? bad_answer(c, "sandbox_delete", err) : rc;
}

static int r_snapshot_insert(struct cove_catalog *c, const struct cove_snapshot_row *s,
                             struct cove_err *err)
{
        json_t *a;
        CALL("snapshot_insert", json_pack("{s:o}", "snapshot", cove_wire_snapshot(s)), R_ONCE, a);
        json_decref(a);
        return 0;
}

static int r_snapshot_get(struct cove_catalog *c, const char *tenant, const char *id,
                          struct cove_snapshot_row *out, struct cove_err *err)
{
        json_t *a;
        CALL("snapshot_get", json_pack("{s:o, s:o}", "tenant", jstr(tenant), "id", jstr(id)),
             R_READ, a);
        int rc = found_of(a, err);
        if (rc == 0 && cove_wire_snapshot_from(json_object_get(a, "snapshot"), out, err) < 0)
                rc = -1;
        json_decref(a);
        return rc < 0 ? bad_answer(c, "snapshot_get", err) : rc;
}

static int r_snapshot_list(struct cove_catalog *c, const char *tenant, const char *sandbox_id,
                           cove_snapshot_cb cb, void *arg, struct cove_err *err)
{
        json_t *a;
        CALL("snapshot_list",
             json_pack("{s:o, s:o}", "tenant", jstr(tenant), "sandbox_id", jstr(sandbox_id)),
             R_READ, a);
        int rc = LIST_ANSWER(a, "snapshots", struct cove_snapshot_row, cove_wire_snapshot_from,
                             no_clear, cb, arg);
        json_decref(a);
        return rc < 0 ? bad_answer(c, "snapshot_list", err) : 0;
}

static int r_snapshot_delete(struct cove_catalog *c, const char *id, struct cove_err *err)
{
        json_t *a;
        CALL("snapshot_delete", json_pack("{s:o}", "id", jstr(id)), R_ONCE, a);
        int rc = found_of(a, err);
        json_decref(a);
        return rc < 0 ? bad_answer(c, "snapshot_delete", err) : rc;
}

static int r_audit_append(struct cove_catalog *c, const struct cove_audit_row *rows, size_t n,
                          struct cove_err *err)
{
        json_t *arr = json_array();
        for (size_t i = 0; i < n; i++)
                json_array_append_new(arr, cove_wire_audit(&rows[i]));
        json_t *a;
        CALL("audit_append", json_pack("{s:o}", "rows", arr), R_ONCE, a);
        json_decref(a);
        return 0;
}

static int r_audit_last(struct cove_catalog *c, int64_t *seq, char hash[65], struct cove_err *err)
{
        json_t *a;
        CALL("audit_last", json_object(), R_READ, a);
        int rc = found_of(a, err);
        if (rc == 0 && (cove_wire_i64(a, "seq", seq, 1, INT64_MAX, 1, err) < 0 ||
                        cove_wire_str(a, "hash", hash, 65, 1, err) < 0))
                rc = -1;
        json_decref(a);
        return rc < 0 ? bad_answer(c, "audit_last", err) : rc;
}

static int r_audit_list(struct cove_catalog *c, const char *tenant, const char *sandbox,
                        const char *kind, int64_t after_seq, int64_t since_ms, int limit,
                        cove_audit_cb cb, void *arg, struct cove_err *err)
{
        json_t *a;
        CALL("audit_list",
             json_pack("{s:o, s:o, s:o, s:I, s:I, s:i}", "tenant", jstr(tenant), "sandbox",
                       jstr(sandbox), "kind", jstr(kind), "after_seq", (json_int_t)after_seq,
                       "since_ms", (json_int_t)since_ms, "limit", limit),
             R_READ, a);
        int rc = LIST_ANSWER(a, "rows", struct cove_audit_row, cove_wire_audit_from, audit_clear,
                             cb, arg);
        json_decref(a);
        return rc < 0 ? bad_answer(c, "audit_list", err) : 0;
}

static int r_egress_put(struct cove_catalog *c, const char *sandbox_id, const char *tenant,
                        const char *json, struct cove_err *err)
{
        json_t *a;
        CALL("egress_put",
             json_pack("{s:o, s:o, s:o}", "sandbox_id", jstr(sandbox_id), "tenant", jstr(tenant),
                       "json", jstr(json)),
             R_IDEM, a);
        json_decref(a);
        return 0;
}

static int text_answer(struct cove_catalog *c, const char *op, json_t *a, char **json,
                       struct cove_err *err)
{
        int rc = found_of(a, err);
        if (rc == 0 && (cove_wire_text(a, "json", json, COVE_WIRE_TEXT_MAX, 1, err) < 0))
                rc = -1;
        json_decref(a);
        return rc < 0 ? bad_answer(c, op, err) : rc;
}

static int r_egress_get(struct cove_catalog *c, const char *sandbox_id, char **json,
                        struct cove_err *err)
{
        json_t *a;
        CALL("egress_get", json_pack("{s:o}", "sandbox_id", jstr(sandbox_id)), R_READ, a);
        return text_answer(c, "egress_get", a, json, err);
}

static int r_egress_delete(struct cove_catalog *c, const char *sandbox_id, struct cove_err *err)
{
        json_t *a;
        CALL("egress_delete", json_pack("{s:o}", "sandbox_id", jstr(sandbox_id)), R_ONCE, a);
        int rc = found_of(a, err);
        json_decref(a);
        return rc < 0 ? bad_answer(c, "egress_delete", err) : rc;
}

static int r_doc_put(struct cove_catalog *c, const char *kind, const char *tenant, const char *key,
                     const char *owner, const char *json, struct cove_err *err)
{
        json_t *a;
        CALL("doc_put",
             json_pack("{s:o, s:o, s:o, s:o, s:o}", "kind", jstr(kind), "tenant", jstr(tenant),
                       "key", jstr(key), "owner", jstr(owner), "json", jstr(json)),
             R_IDEM, a);
        json_decref(a);
        return 0;
}

static int r_doc_get(struct cove_catalog *c, const char *kind, const char *tenant, const char *key,
                     char **json, struct cove_err *err)
{
        json_t *a;
        CALL("doc_get",
             json_pack("{s:o, s:o, s:o}", "kind", jstr(kind), "tenant", jstr(tenant), "key",
                       jstr(key)),
             R_READ, a);
        return text_answer(c, "doc_get", a, json, err);
}

/* Key records: a node reads those of tenants with a sandbox on it; it never writes one (the
 * control answers 403): rotation, revocation and new keys are the control plane's. */
static int r_keyrec_get(struct cove_catalog *c, const char *tenant, char **json, int64_t *gen,
                        struct cove_err *err)
{
        json_t *a;
        CALL("keyrec_get", json_pack("{s:o}", "tenant", jstr(tenant)), R_READ, a);
        int rc = found_of(a, err);
        if (rc == 0 && (cove_wire_i64(a, "gen", gen, 1, INT64_MAX, 1, err) < 0 ||
                        cove_wire_text(a, "json", json, COVE_WIRE_TEXT_MAX, 1, err) < 0))
                rc = -1;
        json_decref(a);
        return rc < 0 ? bad_answer(c, "keyrec_get", err) : rc;
}

static int r_keyrec_put(struct cove_catalog *c, const char *tenant, const char *json,
                        int64_t expect_gen, int64_t *gen, struct cove_err *err)
{
        json_t *a;
        CALL("keyrec_put",
             json_pack("{s:o, s:o, s:I}", "tenant", jstr(tenant), "json", jstr(json), "expect_gen",
                       (json_int_t)expect_gen),
             R_ONCE, a);
        int rc = cove_wire_i64(a, "gen", gen, 1, INT64_MAX, 1, err);
        json_decref(a);
        return rc < 0 ? bad_answer(c, "keyrec_put", err) : 0;
}

static int r_doc_list(struct cove_catalog *c, const char *kind, const char *tenant,
                      const char *owner, cove_doc_cb cb, void *arg, struct cove_err *err)
{
        json_t *a;
        CALL("doc_list",
             json_pack("{s:o, s:o, s:o}", "kind", jstr(kind), "tenant", jstr(tenant), "owner",
                       jstr(owner)),
             R_READ, a);
        json_t *arr = json_object_get(a, "docs");
        int rc = 0;
        if (!json_is_array(arr)) {
                rc = cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                   "catalog wire: \"docs\" is not an array");
        } else {
                size_t i;
                json_t *v;
                json_array_foreach(arr, i, v)
                {
                        char t[64], k[128], o[64];
                        const char *js;
                        if (!json_is_object(v) ||
                            cove_wire_str(v, "tenant", t, sizeof(t), 1, err) < 0 ||
                            cove_wire_str(v, "key", k, sizeof(k), 1, err) < 0 ||
                            cove_wire_str(v, "owner", o, sizeof(o), 0, err) < 0 ||
                            cove_wire_opt(v, "json", &js, COVE_WIRE_TEXT_MAX, err) < 0 || !js) {
                                rc = cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                                   "catalog wire: a document is malformed");
                                break;
                        }
                        if (cb(t, k, o, js, arg) < 0)
                                break;
                }
        }
        json_decref(a);
        return rc < 0 ? bad_answer(c, "doc_list", err) : 0;
}

static int r_doc_delete(struct cove_catalog *c, const char *kind, const char *tenant,
                        const char *key, struct cove_err *err)
{
        json_t *a;
        CALL("doc_delete",
             json_pack("{s:o, s:o, s:o}", "kind", jstr(kind), "tenant", jstr(tenant), "key",
                       jstr(key)),
             R_ONCE, a);
        int rc = found_of(a, err);
        json_decref(a);
        return rc < 0 ? bad_answer(c, "doc_delete", err) : rc;
}

static int r_node_lease_acquire(struct cove_catalog *c, const struct cove_node_row *n,
                                int64_t ttl_ms, int64_t *epoch, int64_t *expires_at,
                                struct cove_err *err)
{
        json_t *a;
        CALL("node_lease_acquire",
             json_pack("{s:o, s:I}", "node", cove_wire_node(n), "ttl_ms", (json_int_t)ttl_ms),
             R_ONCE, a);
        int64_t e = 0, x = 0;
        int rc = cove_wire_i64(a, "epoch", &e, 1, INT64_MAX, 1, err) < 0 ||
                         cove_wire_i64(a, "expires_at", &x, 0, INT64_MAX, 1, err) < 0
                     ? -1
                     : 0;
        json_decref(a);
        if (rc < 0)
                return bad_answer(c, "node_lease_acquire", err);
        if (epoch)
                *epoch = e;
        if (expires_at)
                *expires_at = x;
        return 0;
}

static int r_node_lease_renew(struct cove_catalog *c, const char *name, int64_t epoch,
                              int64_t ttl_ms, int64_t *expires_at, struct cove_err *err)
{
        json_t *a;
        CALL("node_lease_renew",
             json_pack("{s:o, s:I, s:I}", "name", jstr(name), "epoch", (json_int_t)epoch, "ttl_ms",
                       (json_int_t)ttl_ms),
             R_IDEM, a);
        int64_t x = 0;
        int rc = cove_wire_i64(a, "expires_at", &x, 0, INT64_MAX, 1, err);
        json_decref(a);
        if (rc < 0)
                return bad_answer(c, "node_lease_renew", err);
        if (expires_at)
                *expires_at = x;
        return 0;
}

static int r_node_set_state(struct cove_catalog *c, const char *name, const char *state,
                            struct cove_err *err)
{
        json_t *a;
        CALL("node_set_state", json_pack("{s:o, s:o}", "name", jstr(name), "state", jstr(state)),
             R_IDEM, a);
        int rc = found_of(a, err);
        json_decref(a);
        return rc < 0 ? bad_answer(c, "node_set_state", err) : rc;
}

static int r_node_list(struct cove_catalog *c, cove_node_cb cb, void *arg, struct cove_err *err)
{
        json_t *a;
        CALL("node_list", json_object(), R_READ, a);
        int rc =
            LIST_ANSWER(a, "nodes", struct cove_node_row, cove_wire_node_from, no_clear, cb, arg);
        json_decref(a);
        return rc < 0 ? bad_answer(c, "node_list", err) : 0;
}

static int r_placement_write(struct cove_catalog *c, const char *sandbox_id, const char *node,
                             const char *desired_state, const char *job_kind,
                             const char *job_args_json, int64_t expect_generation,
                             int64_t *generation, int64_t *job_id, struct cove_err *err)
{
        json_t *a;
        CALL("placement_write",
             json_pack("{s:o, s:o, s:o, s:o, s:o, s:I}", "sandbox_id", jstr(sandbox_id), "node",
                       jstr(node), "desired_state", jstr(desired_state), "job_kind", jstr(job_kind),
                       "job_args_json", jstr(job_args_json), "expect_generation",
                       (json_int_t)expect_generation),
             R_ONCE, a);
        int64_t g = 0, j = 0;
        int rc = cove_wire_i64(a, "generation", &g, 0, INT64_MAX, 1, err) < 0 ||
                         cove_wire_i64(a, "job_id", &j, 0, INT64_MAX, 0, err) < 0
                     ? -1
                     : 0;
        json_decref(a);
        if (rc < 0)
                return bad_answer(c, "placement_write", err);
        if (generation)
                *generation = g;
        if (job_id)
                *job_id = j;
        return 0;
}

static int r_placement_get(struct cove_catalog *c, const char *sandbox_id,
                           struct cove_placement_row *out, struct cove_err *err)
{
        json_t *a;
        CALL("placement_get", json_pack("{s:o}", "sandbox_id", jstr(sandbox_id)), R_READ, a);
        int rc = found_of(a, err);
        if (rc == 0 && cove_wire_placement_from(json_object_get(a, "placement"), out, err) < 0)
                rc = -1;
        json_decref(a);
        return rc < 0 ? bad_answer(c, "placement_get", err) : rc;
}

static int r_placement_observe(struct cove_catalog *c, const char *sandbox_id, const char *node,
                               int64_t epoch, int64_t generation, const char *observed_state,
                               const char *desired_state, struct cove_err *err)
{
        json_t *a;
        json_t *args = json_pack("{s:o, s:o, s:I, s:I, s:o}", "sandbox_id", jstr(sandbox_id),
                                 "node", jstr(node), "epoch", (json_int_t)epoch, "generation",
                                 (json_int_t)generation, "observed_state", jstr(observed_state));
        if (args && desired_state) /* absent: unchanged (what an older control expects) */
                json_object_set_new(args, "desired_state", json_string(desired_state));
        CALL("placement_observe", args, R_IDEM, a);
        json_decref(a);
        return 0;
}

static int r_job_claim(struct cove_catalog *c, const char *node, int64_t epoch,
                       struct cove_job_row *out, struct cove_err *err)
{
        json_t *a;
        CALL("job_claim", json_pack("{s:o, s:I}", "node", jstr(node), "epoch", (json_int_t)epoch),
             R_ONCE, a);
        int rc = found_of(a, err);
        if (rc == 0 && cove_wire_job_from(json_object_get(a, "job"), out, err) < 0)
                rc = -1;
        json_decref(a);
        return rc < 0 ? bad_answer(c, "job_claim", err) : rc;
}

static int r_job_finish(struct cove_catalog *c, int64_t job_id, const char *node, int64_t epoch,
                        int64_t generation, int ok, const char *result_json, struct cove_err *err)
{
        json_t *a;
        CALL("job_finish",
             json_pack("{s:I, s:o, s:I, s:I, s:b, s:o}", "job_id", (json_int_t)job_id, "node",
                       jstr(node), "epoch", (json_int_t)epoch, "generation", (json_int_t)generation,
                       "ok", ok, "result_json", jstr(result_json)),
             R_IDEM, a);
        json_decref(a);
        return 0;
}

static int r_job_get(struct cove_catalog *c, int64_t job_id, struct cove_job_row *out,
                     struct cove_err *err)
{
        json_t *a;
        CALL("job_get", json_pack("{s:I}", "job_id", (json_int_t)job_id), R_READ, a);
        int rc = found_of(a, err);
        if (rc == 0 && cove_wire_job_from(json_object_get(a, "job"), out, err) < 0)
                rc = -1;
        json_decref(a);
        return rc < 0 ? bad_answer(c, "job_get", err) : rc;
}

static int r_wait_wakeup(struct cove_catalog *c, const char *node, int timeout_ms,
                         struct cove_err *err)
{
        if (timeout_ms < 0)
                timeout_ms = 0;
        if (timeout_ms > COVE_REMOTE_WAIT_MAX_MS)
                timeout_ms = COVE_REMOTE_WAIT_MAX_MS; /* a hint: the caller polls anyway */
        json_t *a;
        if (call(c, "wait_wakeup",
                 json_pack("{s:o, s:i}", "node", jstr(node), "timeout_ms", timeout_ms), R_READ,
                 timeout_ms + 10000, &a, err) < 0)
                return -1;
        int woken;
        int rc = cove_wire_bool(a, "woken", &woken, 1, err);
        json_decref(a);
        return rc < 0 ? bad_answer(c, "wait_wakeup", err) : woken ? 0 : 1;
}

const struct cove_catalog_ops cove_catalog_remote = {
    .name = "remote",
    .open = r_open,
    .close = r_close,
    .schema_version = r_schema_version,
    .tenant_put = r_tenant_put,
    .tenant_get = r_tenant_get,
    .tenant_list = r_tenant_list,
    .apikey_list = r_apikey_list,
    .apikey_put = r_apikey_put,
    .apikey_get = r_apikey_get,
    .apikey_count = r_apikey_count,
    .sandbox_insert = r_sandbox_insert,
    .sandbox_update = r_sandbox_update,
    .sandbox_get = r_sandbox_get,
    .sandbox_list = r_sandbox_list,
    .sandbox_delete = r_sandbox_delete,
    .snapshot_insert = r_snapshot_insert,
    .snapshot_get = r_snapshot_get,
    .snapshot_list = r_snapshot_list,
    .snapshot_delete = r_snapshot_delete,
    .audit_append = r_audit_append,
    .audit_last = r_audit_last,
    .audit_list = r_audit_list,
    .egress_put = r_egress_put,
    .egress_get = r_egress_get,
    .egress_delete = r_egress_delete,
    .doc_put = r_doc_put,
    .doc_get = r_doc_get,
    .keyrec_get = r_keyrec_get,
    .keyrec_put = r_keyrec_put,
    .doc_list = r_doc_list,
    .doc_delete = r_doc_delete,
    .node_lease_acquire = r_node_lease_acquire,
    .node_lease_renew = r_node_lease_renew,
    .node_set_state = r_node_set_state,
    .node_list = r_node_list,
    .placement_write = r_placement_write,
    .placement_get = r_placement_get,
    .placement_observe = r_placement_observe,
    .sandbox_update_fenced = r_sandbox_update_fenced,
    .job_claim = r_job_claim,
    .job_finish = r_job_finish,
    .job_get = r_job_get,
    .wait_wakeup = r_wait_wakeup,
};
