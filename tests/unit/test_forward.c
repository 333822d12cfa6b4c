/* api/forward.c: a control replica's forwarder and a node's API, both on loopback in this
 * process over one SQLite catalog. The node's routes are stand-in handlers (echo, upload,
 * download, an endless stream, an answer without Cove-Node-Answer) behind the real node
 * API authentication; the control serves the same table through cove_fwd_routes() with a
 * stand-in API-key hook ("Bearer t1" is tenant t1). Checks: what is forwarded and what is
 * not, streaming both ways with back-pressure, a client leaving ends the node's stream,
 * 503 for an unplaced sandbox, an unreachable node and an answer that is not authentic,
 * 404 for another tenant's sandbox; on the node: API keys, forged, replayed, expired and
 * altered Cove-Node requests refused, a sandbox placed elsewhere 404. Plus the answer-head
 * parser and the chunked decoder on malformed input. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/evp.h>

#include "api/e2b.h"
#include "api/forward.h"
#include "api/http.h"
#include "cluster/nodeauth.h"
#include "store/catalog.h"
#include "util/cleanup.h"
#include "util/util.h"

static struct coved g_ctl, g_node;
static struct cove_http *g_hctl, *g_hnode;
static int g_pctl, g_pnode, g_penvd;
static struct cove_e2b *g_e2b; /* the control's E2B envd listener */
static const struct cove_catalog_ops *ops = &cove_catalog_sqlite;
static char g_dir[256];

/* node stand-in state */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_hold;           /* the node's upload handler blocks while set */
static uint64_t g_up_bytes;  /* bytes the node's upload handler took */
static int g_stream_ended;   /* the node's endless stream was closed */
static int g_stream_started; /* … and had begun */

static int free_port(void)
{
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
        socklen_t l = sizeof(sa);
        getsockname(fd, (struct sockaddr *)&sa, &l);
        close(fd);
        return ntohs(sa.sin_port);
}

/* ---- node stand-in handlers ---- */

static int h_echo(void *app, struct cove_req *r)
{
        char target[COVE_FWD_TARGET_MAX];
        cove_req_target(r, target, sizeof(target));
        const char *a = cove_req_header(r, "Authorization");
        json_t *o = json_pack("{s:s, s:s, s:s, s:s%, s:s}", "tenant", r->tenant, "target", target,
                              "auth", a && !strncmp(a, "Cove-Node ", 10) ? "cove-node" : "other",
                              "body", r->body ? r->body : "", r->body_len, "key_id", r->key_id);
        const char *flags[] = {"cookie",   "Cookie",       "custom",
                               "X-Custom", "access_token", "X-Access-Token"};
        for (size_t i = 0; i < 6; i += 2)
                json_object_set_new(o, flags[i],
                                    json_boolean(cove_req_header(r, flags[i + 1]) != NULL));
        const char *vals[] = {"range",   "Range",          "ctype",    "Content-Type",
                              "sbx_hdr", "E2b-Sandbox-Id", "e2b_user", "X-Cove-E2b-User"};
        for (size_t i = 0; i < 8; i += 2) {
                const char *v = cove_req_header(r, vals[i + 1]);
                if (v)
                        json_object_set_new(o, vals[i], json_string(v));
        }
        return cove_reply_json(r, 200, o);
}

struct up {
        EVP_MD_CTX *md;
        uint64_t n;
};

static void up_cleanup(void *app, struct cove_req *r)
{
        struct up *u = r->state;
        if (u) {
                EVP_MD_CTX_free(u->md);
                free(u);
        }
        r->state = NULL;
}

static int up_piece(void *app, struct cove_req *r, const char *data, size_t len)
{
        struct up *u = r->state;
        if (!u) {
                u = calloc(1, sizeof(*u));
                u->md = EVP_MD_CTX_new();
                EVP_DigestInit_ex(u->md, EVP_sha256(), NULL);
                r->state = u;
                r->cleanup = up_cleanup;
        }
        pthread_mutex_lock(&g_mu);
        while (g_hold)
                pthread_cond_wait(&g_cv, &g_mu);
        g_up_bytes += len;
        pthread_mutex_unlock(&g_mu);
        EVP_DigestUpdate(u->md, data, len);
        u->n += len;
        return 0;
}

static int h_up(void *app, struct cove_req *r)
{
        struct up *u = r->state;
        unsigned char md[32];
        char hex[65] = "";
        if (u) {
                unsigned int l;
                EVP_DigestFinal_ex(u->md, md, &l);
                cove_hex(md, 32, hex);
        }
        return cove_reply_json(
            r, 200, json_pack("{s:I, s:s}", "bytes", (json_int_t)(u ? u->n : 0), "sha256", hex));
}

static unsigned char pat(uint64_t i)
{
        return (unsigned char)((i * 7 + 3) ^ (i >> 13));
}

struct big {
        uint64_t n;
};

static ssize_t big_read(void *ctx, uint64_t pos, char *buf, size_t max)
{
        struct big *b = ctx;
        if (pos >= b->n)
                return -1;
        size_t k = b->n - pos < max ? (size_t)(b->n - pos) : max;
        for (size_t i = 0; i < k; i++)
                buf[i] = (char)pat(pos + i);
        return (ssize_t)k;
}

static int h_big(void *app, struct cove_req *r)
{
        struct big *b = calloc(1, sizeof(*b));
        b->n = strtoull(cove_req_query(r, "n"), NULL, 10);
        int len = cove_req_query(r, "len") != NULL;
        return cove_reply_stream(r, 200, "application/octet-stream", len ? (int64_t)b->n : -1,
                                 big_read, free, b);
}

struct endless {
        int fd;
};

static ssize_t endless_read(void *ctx, uint64_t pos, char *buf, size_t max)
{
        struct endless *e = ctx;
        __atomic_store_n(&g_stream_started, 1, __ATOMIC_SEQ_CST);
        struct timespec ts = {0, 50 * 1000000};
        nanosleep(&ts, NULL);
        if (cove_sock_closed(e->fd))
                return -2;
        int n = snprintf(buf, max, "{\"tick\":%llu}\n", (unsigned long long)pos);
        return n;
}

static void endless_free(void *ctx)
{
        __atomic_store_n(&g_stream_ended, 1, __ATOMIC_SEQ_CST);
        free(ctx);
}

static int h_stream(void *app, struct cove_req *r)
{
        struct endless *e = calloc(1, sizeof(*e));
        e->fd = cove_req_sockfd(r);
        return cove_reply_stream(r, 200, "application/x-ndjson", -1, endless_read, endless_free, e);
}

/* a node that answers without its Cove-Node-Answer (whatever took its address) */
static int h_forged(void *app, struct cove_req *r)
{
        r->answer_hdr_name = NULL;
        return cove_reply_json(r, 200, json_pack("{s:b}", "secret", 1));
}

static const struct cove_route test_routes[] = {
    {"GET", "/healthz", h_echo, NULL, COVE_ROUTE_PUBLIC},
    {"POST", "/v1/sandboxes", h_echo, NULL, 0}, /* not sandbox traffic: not on the node */
    {"GET", "/v1/sandboxes/{id}/echo", h_echo, NULL, COVE_ROUTE_SANDBOX},
    {"POST", "/v1/sandboxes/{id}/exec", h_echo, NULL, COVE_ROUTE_SANDBOX},
    {"PUT", "/v1/sandboxes/{id}/files", h_up, up_piece, COVE_ROUTE_SANDBOX},
    {"GET", "/v1/sandboxes/{id}/big", h_big, NULL, COVE_ROUTE_SANDBOX},
    {"GET", "/v1/sandboxes/{id}/stream", h_stream, NULL, COVE_ROUTE_SANDBOX},
    {"GET", "/v1/sandboxes/{id}/forged", h_forged, NULL, COVE_ROUTE_SANDBOX},
};

/* the node's envd routes, stand-ins under the real /e2b paths */
static const struct cove_route test_node_e2b[] = {
    {"POST", "/e2b/process.Process/{method}", h_echo, NULL, COVE_ROUTE_E2B},
};

/* stand-in for the control's API keys: "Bearer t1" is tenant t1 */
static int ctl_auth(void *app, struct cove_req *r, const char *a, struct cove_err *err)
{
        if (!a || strncmp(a, "Bearer ", 7) != 0)
                return cove_err_setk(err, COVE_E_UNAUTHORIZED, 0, "no key");
        snprintf(r->tenant, sizeof(r->tenant), "%s", a + 7);
        return 0;
}

/* ---- a small HTTP client ---- */

static int dial(int port)
{
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET,
                                 .sin_port = htons((uint16_t)port),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
        return fd;
}

static void send_str(int fd, const char *s, size_t n)
{
        while (n) {
                ssize_t k = send(fd, s, n, MSG_NOSIGNAL);
                assert_true(k > 0);
                s += k;
                n -= (size_t)k;
        }
}

struct resp {
        unsigned status;
        struct cove_fwd_head h;
        char *body;
        size_t len;
        json_t *json;
};

static void resp_free(struct resp *r)
{
        free(r->body);
        json_decref(r->json);
        memset(r, 0, sizeof(*r));
}

/* Read a whole answer from fd (the server closes: Connection: close). */
static void read_resp(int fd, struct resp *out)
{
        memset(out, 0, sizeof(*out));
        size_t cap = 1 << 16, n = 0;
        char *buf = malloc(cap);
        for (;;) {
                if (n == cap)
                        buf = realloc(buf, cap *= 2);
                ssize_t k = recv(fd, buf + n, cap - n, 0);
                if (k <= 0)
                        break;
                n += (size_t)k;
        }
        const char *why = NULL;
        assert_int_equal(cove_fwd_parse_head(buf, n, &out->h, &why), 1);
        out->status = out->h.status;
        out->body = malloc(n + 1);
        const char *b = buf + out->h.head_len;
        size_t bl = n - out->h.head_len;
        if (out->h.chunked) {
                struct cove_fwd_chunked c = {0};
                int done = 0;
                long used = cove_fwd_dechunk(&c, b, bl, out->body, n, &out->len, &done);
                assert_true(used >= 0);
                assert_true(done);
        } else {
                assert_int_equal((int64_t)bl, out->h.content_length);
                memcpy(out->body, b, bl);
                out->len = bl;
        }
        out->body[out->len] = '\0';
        json_error_t je;
        out->json = json_loadb(out->body, out->len, 0, &je);
        free(buf);
        close(fd);
}

static void req(int port, const char *method, const char *target, const char *hdrs,
                const char *body, struct resp *out)
{
        int fd = dial(port);
        char head[8192];
        int n = snprintf(head, sizeof(head),
                         "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s"
                         "Content-Length: %zu\r\n\r\n",
                         method, target, hdrs ? hdrs : "", body ? strlen(body) : 0);
        send_str(fd, head, (size_t)n);
        if (body)
                send_str(fd, body, strlen(body));
        read_resp(fd, out);
}

static const char *err_code(struct resp *r)
{
        return json_string_value(json_object_get(json_object_get(r->json, "error"), "code"));
}

static const char *err_msg(struct resp *r)
{
        const char *m =
            json_string_value(json_object_get(json_object_get(r->json, "error"), "message"));
        return m ? m : "";
}

/* ---- fixture ---- */

static void add_sandbox(const char *id, const char *tenant)
{
        struct cove_sandbox_row s = {0};
        snprintf(s.id, sizeof(s.id), "%s", id);
        snprintf(s.tenant, sizeof(s.tenant), "%s", tenant);
        strcpy(s.state, "running");
        strcpy(s.template_name, "busybox");
        strcpy(s.runtime, "ns");
        s.created_at = cove_now_ms();
        s.cpus = 1;
        s.memory_mb = 64;
        s.disk_mb = 64;
        s.timeout_s = 300;
        strcpy(s.on_timeout, "kill");
        struct cove_err err = {0};
        assert_int_equal(ops->sandbox_insert(g_ctl.cat, &s, &err), 0);
}

static void add_node(const char *name, int port)
{
        struct cove_node_row n = {0};
        snprintf(n.name, sizeof(n.name), "%s", name);
        n.cpus = 2;
        n.memory_mb = 1024;
        n.disk_mb = 1024;
        snprintf(n.address, sizeof(n.address), "http://127.0.0.1:%d", port);
        int64_t epoch, exp;
        struct cove_err err = {0};
        assert_int_equal(ops->node_lease_acquire(g_ctl.cat, &n, 600000, &epoch, &exp, &err), 0);
}

static void place(const char *id, const char *node)
{
        struct cove_err err = {0};
        int64_t gen, job;
        assert_int_equal(
            ops->placement_write(g_ctl.cat, id, node, "running", NULL, NULL, -1, &gen, &job, &err),
            0);
}

static int setup(void **st)
{
        snprintf(g_dir, sizeof(g_dir), "/tmp/cove-test-forward-XXXXXX");
        assert_non_null(mkdtemp(g_dir));
        char path[512];
        snprintf(path, sizeof(path), "%s/catalog.db", g_dir);
        struct cove_err err = {0};
        struct cove_catalog *cat = ops->open(path, &err);
        assert_non_null(cat);
        struct cove_tenant_row t = {0};
        strcpy(t.id, "t1");
        strcpy(t.name, "t1");
        t.created_at = 1;
        assert_int_equal(ops->tenant_put(cat, &t, &err), 0);
        strcpy(t.id, "t2");
        strcpy(t.name, "t2");
        assert_int_equal(ops->tenant_put(cat, &t, &err), 0);

        struct coved *ds[2] = {&g_ctl, &g_node};
        for (int i = 0; i < 2; i++) {
                ds[i]->log.fd = 2;
                ds[i]->log.level = COVE_LOG_ERROR + 1; /* quiet */
                ds[i]->cat_ops = ops;
                ds[i]->cat = cat;
                ds[i]->fwd = cove_fwd_new(NULL, &err);
                assert_non_null(ds[i]->fwd);
        }
        g_ctl.role = COVED_ROLE_CONTROL;
        assert_int_equal(cove_random(g_ctl.cluster_key, 32, &err), 0);
        g_ctl.has_cluster_key = 1;
        g_node.role = COVED_ROLE_NODE;
        strcpy(g_node.node_name, "n1");
        assert_int_equal(cove_nodeauth_token(g_ctl.cluster_key, "n1", g_node.node_token, &err), 0);

        g_pnode = free_port();
        g_pctl = free_port();
        char addr[64];
        size_t n;
        struct cove_http_config hn = {.auth = cove_nodeapi_auth,
                                      .app = &g_node,
                                      .log = &g_node.log,
                                      .quitting = &g_node.quitting};
        hn.routes =
            cove_fwd_routes(g_node.fwd, COVED_ROLE_NODE, test_routes, COVE_ARRAY_SIZE(test_routes),
                            test_node_e2b, COVE_ARRAY_SIZE(test_node_e2b), &n);
        hn.nroutes = n;
        snprintf(addr, sizeof(addr), "127.0.0.1:%d", g_pnode);
        g_hnode = cove_http_start(&hn, addr, NULL, &err);
        assert_non_null(g_hnode);
        struct cove_http_config hc = {
            .auth = ctl_auth, .app = &g_ctl, .log = &g_ctl.log, .quitting = &g_ctl.quitting};
        hc.routes = cove_fwd_routes(g_ctl.fwd, COVED_ROLE_CONTROL, test_routes,
                                    COVE_ARRAY_SIZE(test_routes), NULL, 0, &n);
        hc.nroutes = n;
        snprintf(addr, sizeof(addr), "127.0.0.1:%d", g_pctl);
        g_hctl = cove_http_start(&hc, addr, NULL, &err);
        assert_non_null(g_hctl);

        g_penvd = free_port();
        snprintf(addr, sizeof(addr), "127.0.0.1:%d", g_penvd);
        assert_int_equal(cove_e2b_start(&g_ctl, NULL, addr, &g_e2b, &err), 0);
        add_node("n1", g_pnode);
        add_node("n2", free_port()); /* nothing listens there */
        add_sandbox("sbx_a", "t1");
        add_sandbox("sbx_b", "t2");
        add_sandbox("sbx_c", "t1");
        add_sandbox("sbx_d", "t1");
        place("sbx_a", "n1");
        place("sbx_b", "n1");
        place("sbx_c", "n2");
        /* sbx_d: never placed */
        return 0;
}

static int teardown(void **st)
{
        cove_e2b_stop(g_e2b);
        cove_http_stop(g_hctl);
        cove_http_stop(g_hnode);
        ops->close(g_ctl.cat);
        cove_fwd_free(g_ctl.fwd);
        cove_fwd_free(g_node.fwd);
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
        return system(cmd) == 0 ? 0 : -1;
}

/* ---- through the control ---- */

static void test_forwards_what_matters_only(void **st)
{
        struct resp r;
        req(g_pctl, "GET", "/v1/sandboxes/sbx_a/echo?path=/tmp/a%20b&x&q=%2B",
            "Authorization: Bearer t1\r\nCookie: session=1\r\nX-Custom: 1\r\n"
            "X-Access-Token: tok\r\nRange: bytes=0-3\r\n",
            NULL, &r);
        assert_int_equal(r.status, 200);
        assert_non_null(r.json);
        assert_string_equal(json_string_value(json_object_get(r.json, "tenant")), "t1");
        assert_string_equal(json_string_value(json_object_get(r.json, "auth")), "cove-node");
        assert_string_equal(json_string_value(json_object_get(r.json, "target")),
                            "/v1/sandboxes/sbx_a/echo?path=%2Ftmp%2Fa%20b&x&q=%2B");
        assert_false(json_is_true(json_object_get(r.json, "cookie")));
        assert_false(json_is_true(json_object_get(r.json, "custom")));
        assert_false(json_is_true(json_object_get(r.json, "access_token")));
        assert_string_equal(json_string_value(json_object_get(r.json, "range")), "bytes=0-3");
        /* the node's signature header never reaches the client */
        assert_int_equal(r.h.answer[0], '\0');
        resp_free(&r);

        req(g_pctl, "POST", "/v1/sandboxes/sbx_a/exec",
            "Authorization: Bearer t1\r\nContent-Type: application/json\r\n",
            "{\"cmd\":[\"true\"]}", &r);
        assert_int_equal(r.status, 200);
        assert_string_equal(json_string_value(json_object_get(r.json, "body")),
                            "{\"cmd\":[\"true\"]}");
        assert_string_equal(json_string_value(json_object_get(r.json, "ctype")),
                            "application/json");
        resp_free(&r);
}

static void test_tenants_and_placement(void **st)
{
        struct resp r;
        /* another tenant's sandbox: 404, the same as one that does not exist */
        req(g_pctl, "GET", "/v1/sandboxes/sbx_b/echo", "Authorization: Bearer t1\r\n", NULL, &r);
        assert_int_equal(r.status, 404);
        assert_string_equal(err_code(&r), "not_found");
        resp_free(&r);
        req(g_pctl, "GET", "/v1/sandboxes/sbx_b/echo", "Authorization: Bearer t2\r\n", NULL, &r);
        assert_int_equal(r.status, 200);
        assert_string_equal(json_string_value(json_object_get(r.json, "tenant")), "t2");
        resp_free(&r);
        req(g_pctl, "GET", "/v1/sandboxes/sbx_d/echo", "Authorization: Bearer t1\r\n", NULL, &r);
        assert_int_equal(r.status, 503);
        assert_string_equal(err_code(&r), "unavailable");
        assert_non_null(strstr(err_msg(&r), "not placed"));
        resp_free(&r);
        req(g_pctl, "GET", "/v1/sandboxes/sbx_c/echo", "Authorization: Bearer t1\r\n", NULL, &r);
        assert_int_equal(r.status, 503);
        assert_non_null(strstr(err_msg(&r), "unreachable"));
        resp_free(&r);
}

static void test_answer_not_authentic(void **st)
{
        struct resp r;
        req(g_pctl, "GET", "/v1/sandboxes/sbx_a/forged", "Authorization: Bearer t1\r\n", NULL, &r);
        assert_int_equal(r.status, 503);
        assert_string_equal(err_code(&r), "unavailable");
        assert_non_null(strstr(err_msg(&r), "not authentic"));
        assert_null(strstr(r.body, "secret"));
        resp_free(&r);
}

static void check_download(int with_len, uint64_t n)
{
        int fd = dial(g_pctl);
        char head[512];
        int k = snprintf(head, sizeof(head),
                         "GET /v1/sandboxes/sbx_a/big?n=%llu%s HTTP/1.1\r\nHost: x\r\n"
                         "Authorization: Bearer t1\r\nConnection: close\r\n\r\n",
                         (unsigned long long)n, with_len ? "&len=1" : "");
        send_str(fd, head, (size_t)k);
        static char buf[1 << 16], out[1 << 16];
        size_t have = 0;
        struct cove_fwd_head h;
        const char *why;
        for (;;) {
                ssize_t g = recv(fd, buf + have, sizeof(buf) - have, 0);
                assert_true(g > 0);
                have += (size_t)g;
                int pr = cove_fwd_parse_head(buf, have, &h, &why);
                assert_true(pr >= 0);
                if (pr == 1)
                        break;
        }
        assert_int_equal(h.status, 200);
        assert_int_equal(h.chunked, !with_len);
        if (with_len)
                assert_int_equal(h.content_length, (int64_t)n);
        uint64_t pos = 0;
        struct cove_fwd_chunked c = {0};
        int done = 0;
        size_t off = h.head_len;
        for (;;) {
                while (off < have) {
                        size_t ol;
                        const char *data;
                        if (h.chunked) {
                                long used = cove_fwd_dechunk(&c, buf + off, have - off, out,
                                                             sizeof(out), &ol, &done);
                                assert_true(used >= 0);
                                off += (size_t)used;
                                data = out;
                        } else {
                                data = buf + off;
                                ol = have - off;
                                off = have;
                        }
                        for (size_t i = 0; i < ol; i++)
                                if ((unsigned char)data[i] != pat(pos + i))
                                        fail_msg("byte %llu differs",
                                                 (unsigned long long)(pos + i));
                        pos += ol;
                }
                have = off = 0;
                ssize_t g = recv(fd, buf, sizeof(buf), 0);
                if (g <= 0)
                        break;
                have = (size_t)g;
        }
        close(fd);
        assert_int_equal(pos, n);
        if (h.chunked)
                assert_true(done);
}

static void test_download_streams(void **st)
{
        check_download(0, 64ull << 20);
        check_download(1, 64ull << 20);
        check_download(0, 0);
}

/* The node holds the upload: the client must stall long before the body is all sent (the
 * control buffers nothing whole), then everything arrives once released. */
static void test_upload_back_pressure(void **st)
{
        const uint64_t total = 256ull << 20;
        pthread_mutex_lock(&g_mu);
        g_hold = 1;
        g_up_bytes = 0;
        pthread_mutex_unlock(&g_mu);
        int fd = dial(g_pctl);
        char head[512];
        int k = snprintf(head, sizeof(head),
                         "PUT /v1/sandboxes/sbx_a/files?path=/x HTTP/1.1\r\nHost: x\r\n"
                         "Authorization: Bearer t1\r\nConnection: close\r\n"
                         "Content-Length: %llu\r\n\r\n",
                         (unsigned long long)total);
        send_str(fd, head, (size_t)k);
        static char blk[1 << 16];
        EVP_MD_CTX *md = EVP_MD_CTX_new();
        EVP_DigestInit_ex(md, EVP_sha256(), NULL);
        uint64_t sent = 0, blkpos = 0;
        int stalled = 0;
        fcntl(fd, F_SETFL, O_NONBLOCK);
        int64_t deadline = cove_mono_ns() / 1000000 + 120000;
        while (sent < total && cove_mono_ns() / 1000000 < deadline) {
                if (blkpos == 0)
                        for (size_t i = 0; i < sizeof(blk); i++)
                                blk[i] = (char)pat(sent + i);
                struct pollfd pf = {.fd = fd, .events = POLLOUT};
                if (poll(&pf, 1, 2000) == 0) {
                        stalled = 1; /* nothing moved for 2 s: held back */
                        break;
                }
                ssize_t w = send(fd, blk + blkpos, sizeof(blk) - blkpos, MSG_NOSIGNAL);
                if (w < 0 && errno == EAGAIN)
                        continue;
                assert_true(w > 0);
                EVP_DigestUpdate(md, blk + blkpos, (size_t)w);
                sent += (uint64_t)w;
                blkpos = (blkpos + (size_t)w) % sizeof(blk);
        }
        pthread_mutex_lock(&g_mu);
        uint64_t up = g_up_bytes;
        g_hold = 0;
        pthread_cond_broadcast(&g_cv);
        pthread_mutex_unlock(&g_mu);
        int held = stalled && sent < total / 2 && up <= sent;
        uint64_t sent_held = sent;
        fcntl(fd, F_SETFL, 0);
        while (sent < total) {
                if (blkpos == 0)
                        for (size_t i = 0; i < sizeof(blk); i++)
                                blk[i] = (char)pat(sent + i);
                size_t want = sizeof(blk) - blkpos;
                send_str(fd, blk + blkpos, want);
                EVP_DigestUpdate(md, blk + blkpos, want);
                sent += want;
                blkpos = 0;
        }
        unsigned char d[32];
        unsigned int l;
        EVP_DigestFinal_ex(md, d, &l);
        EVP_MD_CTX_free(md);
        char hex[65];
        cove_hex(d, 32, hex);
        struct resp r;
        read_resp(fd, &r);
        if (!held)
                fail_msg("not held back: sent %llu of %llu, stalled %d, node took %llu; answer "
                         "%u %.300s",
                         (unsigned long long)sent_held, (unsigned long long)total, stalled,
                         (unsigned long long)up, r.status, r.body);
        assert_int_equal(r.status, 200);
        assert_int_equal(json_integer_value(json_object_get(r.json, "bytes")), (json_int_t)total);
        assert_string_equal(json_string_value(json_object_get(r.json, "sha256")), hex);
        resp_free(&r);
}

static void test_chunked_upload(void **st)
{
        int fd = dial(g_pctl);
        const char *m = "PUT /v1/sandboxes/sbx_a/files?path=/y HTTP/1.1\r\nHost: x\r\n"
                        "Authorization: Bearer t1\r\nConnection: close\r\n"
                        "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
        send_str(fd, m, strlen(m));
        struct resp r;
        read_resp(fd, &r);
        assert_int_equal(r.status, 200);
        assert_int_equal(json_integer_value(json_object_get(r.json, "bytes")), 11);
        assert_string_equal(json_string_value(json_object_get(r.json, "sha256")),
                            "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9");
        resp_free(&r);
}

static void test_client_leaving_ends_node_stream(void **st)
{
        __atomic_store_n(&g_stream_ended, 0, __ATOMIC_SEQ_CST);
        __atomic_store_n(&g_stream_started, 0, __ATOMIC_SEQ_CST);
        int fd = dial(g_pctl);
        const char *m = "GET /v1/sandboxes/sbx_a/stream HTTP/1.1\r\nHost: x\r\n"
                        "Authorization: Bearer t1\r\nConnection: close\r\n\r\n";
        send_str(fd, m, strlen(m));
        char buf[4096];
        size_t have = 0;
        while (have < 200) { /* the head and a few ticks */
                ssize_t k = recv(fd, buf + have, sizeof(buf) - have, 0);
                assert_true(k > 0);
                have += (size_t)k;
        }
        assert_non_null(strstr(buf, "tick"));
        assert_int_equal(__atomic_load_n(&g_stream_ended, __ATOMIC_SEQ_CST), 0);
        close(fd);
        int64_t deadline = cove_mono_ns() / 1000000 + 60000;
        while (!__atomic_load_n(&g_stream_ended, __ATOMIC_SEQ_CST) &&
               cove_mono_ns() / 1000000 < deadline) {
                struct timespec ts = {0, 20 * 1000000};
                nanosleep(&ts, NULL);
        }
        assert_int_equal(__atomic_load_n(&g_stream_ended, __ATOMIC_SEQ_CST), 1);
}

/* The E2B envd surface of a control: access checked there (the node cannot: it holds no
 * secret), then forwarded under /e2b with the sandbox and the user in headers, as the
 * sandbox's tenant. */
static void test_envd_forwarded(void **st)
{
        char tok[COVE_E2B_TOKEN_HEX], hdrs[512];
        cove_e2b_token(g_e2b, "sbx_b", tok);
        struct resp r;
        snprintf(hdrs, sizeof(hdrs),
                 "E2b-Sandbox-Id: sbx_b\r\nX-Access-Token: %s\r\n"
                 "Authorization: Basic cm9vdDo=\r\nContent-Type: application/json\r\n",
                 tok);
        req(g_penvd, "POST", "/process.Process/List", hdrs, "{}", &r);
        assert_int_equal(r.status, 200);
        assert_string_equal(json_string_value(json_object_get(r.json, "tenant")), "t2");
        assert_string_equal(json_string_value(json_object_get(r.json, "target")),
                            "/e2b/process.Process/List");
        assert_string_equal(json_string_value(json_object_get(r.json, "sbx_hdr")), "sbx_b");
        assert_string_equal(json_string_value(json_object_get(r.json, "e2b_user")), "root");
        assert_string_equal(json_string_value(json_object_get(r.json, "key_id")), "node:n1");
        assert_false(json_is_true(json_object_get(r.json, "access_token")));
        resp_free(&r);
        /* the sandbox named by the Host form */
        snprintf(hdrs, sizeof(hdrs), "X-Access-Token: %s\r\n", tok);
        int fd = dial(g_penvd);
        char m[1024];
        int n = snprintf(m, sizeof(m),
                         "POST /process.Process/List HTTP/1.1\r\nHost: 49983-sbx_b.cove.test\r\n"
                         "Connection: close\r\n%sContent-Length: 2\r\n\r\n{}",
                         hdrs);
        send_str(fd, m, (size_t)n);
        read_resp(fd, &r);
        assert_int_equal(r.status, 200);
        assert_string_equal(json_string_value(json_object_get(r.json, "sbx_hdr")), "sbx_b");
        resp_free(&r);
        /* a wrong token never reaches the node */
        req(g_penvd, "POST", "/process.Process/List",
            "E2b-Sandbox-Id: sbx_b\r\nX-Access-Token: nope\r\n", "{}", &r);
        assert_int_equal(r.status, 401);
        assert_null(json_object_get(r.json, "tenant"));
        resp_free(&r);
        /* another sandbox's token */
        cove_e2b_token(g_e2b, "sbx_a", tok);
        snprintf(hdrs, sizeof(hdrs), "E2b-Sandbox-Id: sbx_b\r\nX-Access-Token: %s\r\n", tok);
        req(g_penvd, "POST", "/process.Process/List", hdrs, "{}", &r);
        assert_int_equal(r.status, 401);
        resp_free(&r);
}

/* ---- the node API itself ---- */

static void signed_req(const char *token, const char *name, const char *method,
                       const char *signed_target, const char *sent_target,
                       const char *signed_tenant, const char *sent_tenant, int64_t ts,
                       char authz[COVE_NODEAUTH_HDR_MAX], char sig[65], struct resp *out)
{
        struct cove_err err = {0};
        if (!authz[0]) {
                struct cove_nodeauth_req q = {
                    .method = method, .path_query = signed_target, .tenant = signed_tenant};
                assert_int_equal(cove_nodeauth_sign(token, name, &q, ts, authz,
                                                    COVE_NODEAUTH_HDR_MAX, sig, &err),
                                 0);
        }
        char hdrs[1024];
        snprintf(hdrs, sizeof(hdrs), "Authorization: %s\r\nX-Cove-Tenant: %s\r\n", authz,
                 sent_tenant);
        req(g_pnode, method, sent_target, hdrs, NULL, out);
}

static void test_node_api_auth(void **st)
{
        struct resp r;
        struct cove_err err = {0};
        const char *tok = g_node.node_token;
        char authz[COVE_NODEAUTH_HDR_MAX] = "", sig[65];
        const char *t = "/v1/sandboxes/sbx_a/echo?a=1";
        int64_t now = cove_now_ms();

        /* a good one: answered, with an answer bound to its signature */
        signed_req(tok, "n1", "GET", t, t, "t1", "t1", now, authz, sig, &r);
        assert_int_equal(r.status, 200);
        assert_int_equal(cove_nodeauth_answer_check(tok, sig, r.h.answer, &err), 0);
        resp_free(&r);
        /* the same request again: a replay */
        signed_req(tok, "n1", "GET", t, t, "t1", "t1", now, authz, sig, &r);
        assert_int_equal(r.status, 401);
        assert_non_null(strstr(err_msg(&r), "replayed"));
        assert_int_equal(r.h.answer[0], '\0');
        resp_free(&r);
        /* expired, and from the future */
        authz[0] = '\0';
        signed_req(tok, "n1", "GET", t, t, "t1", "t1", now - 2 * COVE_NODEAUTH_SKEW_MS, authz, sig,
                   &r);
        assert_int_equal(r.status, 401);
        resp_free(&r);
        authz[0] = '\0';
        signed_req(tok, "n1", "GET", t, t, "t1", "t1", now + 2 * COVE_NODEAUTH_SKEW_MS, authz, sig,
                   &r);
        assert_int_equal(r.status, 401);
        resp_free(&r);
        /* altered target or tenant after signing */
        authz[0] = '\0';
        signed_req(tok, "n1", "GET", t, "/v1/sandboxes/sbx_a/echo?a=2", "t1", "t1", now, authz, sig,
                   &r);
        assert_int_equal(r.status, 401);
        resp_free(&r);
        authz[0] = '\0';
        signed_req(tok, "n1", "GET", t, t, "t1", "t2", now, authz, sig, &r);
        assert_int_equal(r.status, 401);
        resp_free(&r);
        /* another node's token, and a request signed for another node */
        char other[65];
        assert_int_equal(cove_nodeauth_token(g_ctl.cluster_key, "n2", other, &err), 0);
        authz[0] = '\0';
        signed_req(other, "n1", "GET", t, t, "t1", "t1", now, authz, sig, &r);
        assert_int_equal(r.status, 401);
        resp_free(&r);
        authz[0] = '\0';
        signed_req(other, "n2", "GET", t, t, "t1", "t1", now, authz, sig, &r);
        assert_int_equal(r.status, 401);
        resp_free(&r);
        /* a forged signature */
        authz[0] = '\0';
        signed_req(tok, "n1", "GET", t, t, "t1", "t1", now, authz, sig, &r);
        resp_free(&r);
        char *s = strstr(authz, "sig=");
        assert_non_null(s);
        s[4] = s[4] == '0' ? '1' : '0';
        signed_req(tok, "n1", "GET", t, t, "t1", "t1", now, authz, sig, &r);
        assert_int_equal(r.status, 401);
        resp_free(&r);
        /* API keys and nothing at all */
        req(g_pnode, "GET", t, "Authorization: Bearer t1\r\nX-Cove-Tenant: t1\r\n", NULL, &r);
        assert_int_equal(r.status, 401);
        assert_non_null(strstr(err_msg(&r), "API keys are not accepted"));
        resp_free(&r);
        req(g_pnode, "GET", t, NULL, NULL, &r);
        assert_int_equal(r.status, 401);
        resp_free(&r);
        /* a sandbox placed on another node: 404 (with a valid answer: a clean error) */
        authz[0] = '\0';
        signed_req(tok, "n1", "GET", "/v1/sandboxes/sbx_c/echo", "/v1/sandboxes/sbx_c/echo", "t1",
                   "t1", now, authz, sig, &r);
        assert_int_equal(r.status, 404);
        assert_int_equal(cove_nodeauth_answer_check(tok, sig, r.h.answer, &err), 0);
        resp_free(&r);
        /* only sandbox traffic is served on a node; /healthz stays public */
        authz[0] = '\0';
        signed_req(tok, "n1", "POST", "/v1/sandboxes", "/v1/sandboxes", "t1", "t1", now, authz, sig,
                   &r);
        assert_int_equal(r.status, 404);
        resp_free(&r);
        req(g_pnode, "GET", "/healthz", NULL, NULL, &r);
        assert_int_equal(r.status, 200);
        resp_free(&r);
}

/* ---- parsers ---- */

static void test_head_parser(void **st)
{
        struct cove_fwd_head h;
        const char *why;
        const char *ok = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n"
                         "Cove-Node-Answer: "
                         "0123456789abcdef0123456789abcdef0123456789abcdef"
                         "0123456789abcdef\r\nSet-Cookie: x=1\r\n\r\nhello";
        assert_int_equal(cove_fwd_parse_head(ok, strlen(ok), &h, &why), 1);
        assert_int_equal(h.status, 200);
        assert_int_equal(h.content_length, 5);
        assert_int_equal(h.nkeep, 1); /* Set-Cookie is not relayed */
        assert_string_equal(h.keep_name[0], "Content-Type");
        assert_int_equal(strlen(h.answer), 64);
        assert_int_equal(cove_fwd_parse_head(ok, 20, &h, &why), 0);
        const char *bad[] = {
            "HTTP/1.1 100 Continue\r\nContent-Length: 0\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            "HTTP/1.1 200 OK\r\n\r\n",
            "HTTP/1.1 200 OK\r\nX: a\rb\r\nContent-Length: 0\r\n\r\n",
            "HTTP/1.1 200 OK\r\n folded: x\r\nContent-Length: 0\r\n\r\n",
            "HTTP/2 200 OK\r\nContent-Length: 0\r\n\r\n",
            "HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n",
            "HTTP/1.1 204 No Content\r\nContent-Length: 3\r\n\r\n",
        };
        for (size_t i = 0; i < COVE_ARRAY_SIZE(bad); i++)
                if (cove_fwd_parse_head(bad[i], strlen(bad[i]), &h, &why) != -1)
                        fail_msg("accepted: %s", bad[i]);
        char *big = malloc(COVE_FWD_HEAD_MAX + 10);
        memset(big, 'a', COVE_FWD_HEAD_MAX + 10);
        memcpy(big, "HTTP/1.1 200 OK\r\nX: ", 20);
        assert_int_equal(cove_fwd_parse_head(big, COVE_FWD_HEAD_MAX + 10, &h, &why), -1);
        free(big);
        /* repeated Cove-Node-Answer never passes as one */
        const char *two =
            "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nCove-Node-Answer: "
            "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\r\n"
            "Cove-Node-Answer: "
            "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\r\n\r\n";
        assert_int_equal(cove_fwd_parse_head(two, strlen(two), &h, &why), 1);
        assert_int_equal(h.answer[0], '\0');
}

static void test_dechunk(void **st)
{
        struct cove_fwd_chunked c = {0};
        char out[64];
        size_t ol;
        int done;
        const char *in = "3;ext=1\r\nabc\r\nA\r\n0123456789\r\n0\r\nTrailer: x\r\n\r\n";
        /* byte by byte: the state carries across feeds */
        char got[64];
        size_t gl = 0;
        for (size_t i = 0; i < strlen(in); i++) {
                long u = cove_fwd_dechunk(&c, in + i, 1, out, sizeof(out), &ol, &done);
                assert_int_equal(u, 1);
                memcpy(got + gl, out, ol);
                gl += ol;
        }
        assert_true(done);
        assert_int_equal(gl, 13);
        assert_memory_equal(got, "abc0123456789", 13);
        const char *bad[] = {"x\r\n", "3\nabc\r\n", "3\r\nabcd\r\n", "\r\n",
                             "ffffffffffffffff1\r\n"};
        for (size_t i = 0; i < COVE_ARRAY_SIZE(bad); i++) {
                memset(&c, 0, sizeof(c));
                assert_int_equal(
                    cove_fwd_dechunk(&c, bad[i], strlen(bad[i]), out, sizeof(out), &ol, &done), -1);
        }
}

int main(void)
{
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_head_parser),
            cmocka_unit_test(test_dechunk),
            cmocka_unit_test(test_forwards_what_matters_only),
            cmocka_unit_test(test_tenants_and_placement),
            cmocka_unit_test(test_answer_not_authentic),
            cmocka_unit_test(test_node_api_auth),
            cmocka_unit_test(test_envd_forwarded),
            cmocka_unit_test(test_chunked_upload),
            cmocka_unit_test(test_download_streams),
            cmocka_unit_test(test_upload_back_pressure),
            cmocka_unit_test(test_client_leaving_ends_node_stream),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
