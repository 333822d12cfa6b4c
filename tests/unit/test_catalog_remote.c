/* The catalog through a control replica (store/catalog_remote.h). Offline, always: answers
 * that are garbage (not JSON, wrong types, NUL bytes, fields too long, unknown states) are
 * errors for every op, never a crash; an answer without a valid Cove-Node-Answer is refused;
 * a control that does not answer fails the call in bounded time. Live, when
 * tests/integration/test_remote_catalog.py starts PostgreSQL and a control
 * (COVE_TEST_REMOTE_URL: the control, COVE_TEST_REMOTE_KEY_FILE: its cluster key,
 * COVE_TEST_REMOTE_DB: its database, which this program also opens directly to play the
 * control plane's part): node n1 does every op on its own rows through the control, and
 * every access to node n2's rows (its sandbox, lease, jobs, snapshots) or to API keys is
 * refused, with n2's rows unchanged afterwards. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cluster/nodeauth.h"
#include "store/catalog.h"
#include "store/catalog_remote.h"
#include "util/util.h"

static const struct cove_catalog_ops *R = &cove_catalog_remote;

/* ---- every op against one canned answer ---- */

static int any_tenant(const struct cove_tenant_row *r, void *a)
{
        (void)r;
        ++*(int *)a;
        return 0;
}
static int any_key(const struct cove_apikey_row *r, void *a)
{
        (void)r;
        ++*(int *)a;
        return 0;
}
static int any_sbx(const struct cove_sandbox_row *r, void *a)
{
        assert_non_null(r->metadata_json); /* never NULL after a get */
        assert_true(strlen(r->id) < sizeof(r->id));
        ++*(int *)a;
        return 0;
}
static int any_snap(const struct cove_snapshot_row *r, void *a)
{
        (void)r;
        ++*(int *)a;
        return 0;
}
static int any_audit(const struct cove_audit_row *r, void *a)
{
        (void)r;
        ++*(int *)a;
        return 0;
}
static int any_doc(const char *t, const char *k, const char *o, const char *j, void *a)
{
        assert_non_null(t);
        assert_non_null(k);
        assert_non_null(o);
        assert_non_null(j);
        ++*(int *)a;
        return 0;
}
static int any_node(const struct cove_node_row *r, void *a)
{
        (void)r;
        ++*(int *)a;
        return 0;
}

/* Runs every op on c; returns how many succeeded (0 or 1 answers). */
static int every_op(struct cove_catalog *c)
{
        struct cove_err err;
        int ok = 0, n = 0, v;
        int64_t i64, e, x;
        char hash[65];
        char *json;
        struct cove_tenant_row t = {.id = "default"};
        struct cove_apikey_row k = {.id = "key_x", .tenant = "default"};
        struct cove_sandbox_row s = {
            .id = "sbx_x", .tenant = "default", .state = "running", .on_timeout = "kill"};
        struct cove_snapshot_row sn = {.id = "snap_x", .tenant = "default"};
        struct cove_audit_row au = {.seq = 1, .tenant = "default", .prev_hash = "0", .hash = "1"};
        struct cove_node_row nd = {.name = "n1"};
        struct cove_placement_row p;
        struct cove_job_row j;
#define TRY(call)                                                                                  \
        do {                                                                                       \
                int rc_ = (call);                                                                  \
                assert_true(rc_ >= -1 && rc_ <= 1);                                                \
                ok += rc_ >= 0;                                                                    \
        } while (0)
        TRY(R->schema_version(c, &v, &err));
        TRY(R->tenant_put(c, &t, &err));
        TRY(R->tenant_get(c, "default", &t, &err));
        TRY(R->tenant_list(c, any_tenant, &n, &err));
        TRY(R->apikey_list(c, "default", any_key, &n, &err));
        TRY(R->apikey_put(c, &k, &err));
        TRY(R->apikey_get(c, "key_x", &k, &err));
        TRY(R->apikey_count(c, &i64, &err));
        TRY(R->sandbox_insert(c, &s, &err));
        TRY(R->sandbox_update(c, &s, &err));
        TRY(R->sandbox_update_fenced(c, &s, "n1", 1, 1, &err));
        struct cove_sandbox_row got = {0};
        int rc = R->sandbox_get(c, NULL, "sbx_x", &got, &err);
        if (rc == 0) {
                assert_non_null(got.metadata_json);
                assert_non_null(got.env_json);
                assert_true(cove_sandbox_state_valid(got.state, strlen(got.state)));
                cove_sandbox_row_clear(&got);
        }
        ok += rc >= 0;
        TRY(R->sandbox_list(c, NULL, NULL, any_sbx, &n, &err));
        TRY(R->sandbox_delete(c, "sbx_x", &err));
        TRY(R->snapshot_insert(c, &sn, &err));
        TRY(R->snapshot_get(c, NULL, "snap_x", &sn, &err));
        TRY(R->snapshot_list(c, NULL, NULL, any_snap, &n, &err));
        TRY(R->snapshot_delete(c, "snap_x", &err));
        TRY(R->audit_append(c, &au, 1, &err));
        TRY(R->audit_last(c, &i64, hash, &err));
        TRY(R->audit_list(c, NULL, NULL, NULL, 0, 0, 0, any_audit, &n, &err));
        TRY(R->egress_put(c, "sbx_x", "default", "{}", &err));
        json = NULL;
        rc = R->egress_get(c, "sbx_x", &json, &err);
        ok += rc >= 0;
        if (rc == 0) {
                assert_non_null(json);
                free(json);
        }
        TRY(R->egress_delete(c, "sbx_x", &err));
        TRY(R->doc_put(c, "lease", "default", "l1", "sbx_x", "{}", &err));
        json = NULL;
        rc = R->doc_get(c, "lease", "default", "l1", &json, &err);
        ok += rc >= 0;
        if (rc == 0) {
                assert_non_null(json);
                free(json);
        }
        TRY(R->doc_list(c, "lease", NULL, NULL, any_doc, &n, &err));
        TRY(R->doc_delete(c, "lease", "default", "l1", &err));
        TRY(R->node_lease_acquire(c, &nd, 10000, &e, &x, &err));
        TRY(R->node_lease_renew(c, "n1", 1, 10000, &x, &err));
        TRY(R->node_set_state(c, "n1", "ready", &err));
        TRY(R->node_list(c, any_node, &n, &err));
        TRY(R->placement_write(c, "sbx_x", "n1", "running", "start", NULL, -1, &e, &x, &err));
        TRY(R->placement_get(c, "sbx_x", &p, &err));
        TRY(R->placement_observe(c, "sbx_x", "n1", 1, 1, "running", NULL, &err));
        memset(&j, 0, sizeof(j));
        TRY(R->job_claim(c, "n1", 1, &j, &err));
        cove_job_row_clear(&j);
        TRY(R->job_finish(c, 1, "n1", 1, 1, 1, "{}", &err));
        memset(&j, 0, sizeof(j));
        TRY(R->job_get(c, 1, &j, &err));
        cove_job_row_clear(&j);
        TRY(R->wait_wakeup(c, "n1", 0, &err));
#undef TRY
        return ok;
}

static int canned_ok(const char *answer)
{
        struct cove_catalog *c = cove_catalog_remote_canned(answer, strlen(answer));
        assert_non_null(c);
        int ok = every_op(c);
        R->close(c);
        return ok;
}

static void garbage_answers_are_errors(void **state)
{
        (void)state;
        /* not an object at all: every op fails */
        const char *never[] = {"",   "not json", "[]",       "null",
                               "42", "\"s\"",    "{\"a\":1", "{\"found\":1,\"found\":2}"};
        for (size_t i = 0; i < sizeof(never) / sizeof(never[0]); i++)
                assert_int_equal(canned_ok(never[i]), 0);
        /* objects with every member wrong: a row op must fail, not fill a row */
        const char *bad_rows[] = {
            "{\"found\":true}",
            "{\"found\":\"yes\"}",
            "{\"found\":true,\"sandbox\":{\"id\":123}}",
            "{\"found\":true,\"sandbox\":{\"id\":\"sbx_a\\u0000b\",\"tenant\":\"t\",\"state\":"
            "\"running\"}}",
            "{\"found\":true,\"sandbox\":{\"id\":\"sbx_"
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
            "aaaaaaaaaaaaaaaaaaaaaaaaa\",\"tenant\":\"t\",\"state\":\"running\"}}",
            "{\"found\":true,\"sandbox\":{\"id\":\"s\",\"tenant\":\"t\",\"state\":\"bogus\"}}",
            "{\"found\":true,\"sandbox\":{\"id\":\"s\",\"tenant\":\"t\",\"state\":\"running\","
            "\"cpus\":-1}}",
            "{\"found\":true,\"sandbox\":{\"id\":\"s\",\"tenant\":\"t\",\"state\":\"running\","
            "\"uid_base\":4294967296}}",
            "{\"found\":true,\"sandbox\":{\"id\":\"s\",\"tenant\":\"t\",\"state\":\"running\","
            "\"memory_mb\":1.5}}",
        };
        for (size_t i = 0; i < sizeof(bad_rows) / sizeof(bad_rows[0]); i++) {
                struct cove_catalog *c =
                    cove_catalog_remote_canned(bad_rows[i], strlen(bad_rows[i]));
                struct cove_sandbox_row s = {0};
                struct cove_err err;
                assert_int_equal(R->sandbox_get(c, NULL, "s", &s, &err), -1);
                assert_null(s.metadata_json);
                every_op(c); /* and nothing else crashes on it */
                R->close(c);
        }
        /* a list whose second element is bad: an error after the good one */
        const char *list = "{\"sandboxes\":[{\"id\":\"s1\",\"tenant\":\"t\",\"state\":\"running\"},"
                           "{\"id\":\"s2\",\"tenant\":\"t\",\"state\":7}]}";
        struct cove_catalog *c = cove_catalog_remote_canned(list, strlen(list));
        struct cove_err err;
        int n = 0;
        assert_int_equal(R->sandbox_list(c, NULL, NULL, any_sbx, &n, &err), -1);
        assert_int_equal(n, 1);
        R->close(c);
        /* a good row decodes; metadata defaults to {} */
        const char *good = "{\"found\":true,\"sandbox\":{\"id\":\"s1\",\"tenant\":\"t\",\"state\":"
                           "\"paused\",\"cpus\":2,\"node\":\"n1\"}}";
        c = cove_catalog_remote_canned(good, strlen(good));
        struct cove_sandbox_row s = {0};
        assert_int_equal(R->sandbox_get(c, NULL, "s1", &s, &err), 0);
        assert_string_equal(s.state, "paused");
        assert_string_equal(s.metadata_json, "{}");
        assert_int_equal(s.cpus, 2);
        cove_sandbox_row_clear(&s);
        R->close(c);
}

/* ---- a fake control on loopback ---- */

struct fake {
        int lfd, port;
        const char *reply; /* whole HTTP answer; NULL: read the request and never answer */
        int stop;
        pthread_t th;
};

static void *fake_run(void *arg)
{
        struct fake *f = arg;
        while (!f->stop) {
                int fd = accept(f->lfd, NULL, NULL);
                if (fd < 0)
                        continue;
                char buf[8192];
                ssize_t got = recv(fd, buf, sizeof(buf), 0); /* headers and a small body */
                (void)got;
                if (f->reply) {
                        ssize_t w = send(fd, f->reply, strlen(f->reply), MSG_NOSIGNAL);
                        (void)w;
                } else {
                        while (!f->stop && recv(fd, buf, sizeof(buf), 0) > 0) {
                        }
                }
                close(fd);
        }
        return NULL;
}

static void fake_start(struct fake *f, const char *reply)
{
        memset(f, 0, sizeof(*f));
        f->reply = reply;
        f->lfd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        assert_int_equal(bind(f->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
        socklen_t l = sizeof(a);
        getsockname(f->lfd, (struct sockaddr *)&a, &l);
        f->port = ntohs(a.sin_port);
        assert_int_equal(listen(f->lfd, 8), 0);
        struct timeval tv = {.tv_sec = 0, .tv_usec = 200000};
        setsockopt(f->lfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        pthread_create(&f->th, NULL, fake_run, f);
}

static void fake_stop(struct fake *f)
{
        f->stop = 1;
        pthread_join(f->th, NULL);
        close(f->lfd);
}

static const char token[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

static struct cove_catalog *open_fake(struct fake *f, struct cove_err *err)
{
        char url[64];
        snprintf(url, sizeof(url), "http://127.0.0.1:%d", f->port);
        return cove_catalog_remote_open(url, "n1", token, err);
}

static void unsigned_or_silent_control_refused(void **state)
{
        (void)state;
        struct fake f;
        struct cove_err err = {0};
        /* a valid answer, but nothing proves the holder of the token sent it */
        fake_start(&f, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                       "13\r\nConnection: close\r\n\r\n{\"version\":9}");
        assert_null(open_fake(&f, &err));
        assert_int_equal(err.kind, COVE_E_UNAUTHORIZED);
        assert_non_null(strstr(err.msg, "Cove-Node-Answer"));
        fake_stop(&f);
        /* a forged Cove-Node-Answer */
        fake_start(&f, "HTTP/1.1 200 OK\r\nCove-Node-Answer: "
                       "00000000000000000000000000000000000000000000000000000000000000ff\r\n"
                       "Content-Length: 13\r\nConnection: close\r\n\r\n{\"version\":9}");
        assert_null(open_fake(&f, &err));
        assert_int_equal(err.kind, COVE_E_UNAUTHORIZED);
        fake_stop(&f);
        /* an unsigned error answer with a hostile message: unavailable, message sanitized */
        fake_start(&f, "HTTP/1.1 500 Oops\r\nContent-Length: 62\r\nConnection: close\r\n\r\n"
                       "{\"error\":{\"code\":\"conflict\",\"message\":\"a\\u001b[2Jb\\nc\"}}   ");
        assert_null(open_fake(&f, &err));
        assert_int_equal(err.kind, COVE_E_UNAVAILABLE);
        for (const char *p = err.msg; *p; p++)
                assert_true(*p >= 0x20 && *p < 0x7f);
        fake_stop(&f);
        /* garbage instead of HTTP */
        fake_start(&f, "\x01\x02garbage\r\n\r\n");
        assert_null(open_fake(&f, &err));
        assert_int_equal(err.kind, COVE_E_UNAVAILABLE);
        fake_stop(&f);
        /* a control that never answers: bounded by COVE_REMOTE_CALL_TIMEOUT_MS (3 tries) */
        setenv("COVE_REMOTE_CALL_TIMEOUT_MS", "700", 1);
        fake_start(&f, NULL);
        int64_t t0 = cove_mono_ns();
        assert_null(open_fake(&f, &err));
        int64_t ms = (cove_mono_ns() - t0) / 1000000;
        assert_int_equal(err.kind, COVE_E_UNAVAILABLE);
        assert_true(ms < 30000);
        unsetenv("COVE_REMOTE_CALL_TIMEOUT_MS");
        fake_stop(&f);
        /* nobody listening */
        int port = f.port; /* closed now */
        char url[64];
        snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
        assert_null(cove_catalog_remote_open(url, "n1", token, &err));
        assert_int_equal(err.kind, COVE_E_UNAVAILABLE);
        /* bad arguments */
        assert_null(cove_catalog_remote_open("ftp://x", "n1", token, &err));
        assert_int_equal(err.kind, COVE_E_BAD_REQUEST);
        assert_null(cove_catalog_remote_open("http://127.0.0.1:1", "N1!", token, &err));
        assert_null(R->open("http://127.0.0.1:1", &err));
}

/* ---- live: n1 through a real control, n2 is another node ---- */

struct live {
        struct cove_catalog *db; /* direct: the control plane's own part */
        struct cove_catalog *n1; /* n1 through the control */
        char sa[64], sb[64], ten[64], snap_b[64];
        int64_t e1, e2;
};

static struct live L;

static void sandbox_row(struct cove_sandbox_row *s, const char *id, const char *node)
{
        memset(s, 0, sizeof(*s));
        snprintf(s->id, sizeof(s->id), "%s", id);
        snprintf(s->tenant, sizeof(s->tenant), "%s", L.ten);
        snprintf(s->state, sizeof(s->state), "starting");
        snprintf(s->template_name, sizeof(s->template_name), "busybox");
        snprintf(s->runtime, sizeof(s->runtime), "ns");
        snprintf(s->on_timeout, sizeof(s->on_timeout), "kill");
        snprintf(s->node, sizeof(s->node), "%s", node);
        s->cpus = 1;
        s->memory_mb = 256;
        s->created_at = cove_now_ms();
}

static int live_setup(void **state)
{
        (void)state;
        const char *url = getenv("COVE_TEST_REMOTE_URL"), *kf = getenv("COVE_TEST_REMOTE_KEY_FILE"),
                   *db = getenv("COVE_TEST_REMOTE_DB");
        if (!url || !kf || !db)
                return 0;
        struct cove_err err = {0};
        L.db = cove_catalog_pg.open(db, &err);
        if (!L.db)
                fail_msg("open %s: %s", db, err.msg);
        uint8_t key[32];
        char t1[65];
        assert_int_equal(cove_nodeauth_read_key(kf, key, &err), 0);
        assert_int_equal(cove_nodeauth_token(key, "n1", t1, &err), 0);
        L.n1 = cove_catalog_remote_open(url, "n1", t1, &err);
        if (!L.n1)
                fail_msg("remote open: %s", err.msg);
        int pid = (int)getpid();
        snprintf(L.ten, sizeof(L.ten), "ten_r%d", pid);
        snprintf(L.sa, sizeof(L.sa), "sbx_a%d", pid);
        snprintf(L.sb, sizeof(L.sb), "sbx_b%d", pid);
        snprintf(L.snap_b, sizeof(L.snap_b), "snap_b%d", pid);
        struct cove_tenant_row t = {.created_at = cove_now_ms()};
        snprintf(t.id, sizeof(t.id), "%s", L.ten);
        snprintf(t.name, sizeof(t.name), "remote test");
        assert_int_equal(cove_catalog_pg.tenant_put(L.db, &t, &err), 0);
        /* n1 takes its lease itself, through the control; n2 directly */
        struct cove_node_row n = {.name = "n1", .cpus = 2, .memory_mb = 1024, .disk_mb = 1024};
        snprintf(n.address, sizeof(n.address), "http://127.0.0.1:1");
        int64_t exp;
        if (R->node_lease_acquire(L.n1, &n, 600000, &L.e1, &exp, &err) < 0)
                fail_msg("n1 lease through the control: %s", err.msg);
        snprintf(n.name, sizeof(n.name), "n2");
        assert_int_equal(cove_catalog_pg.node_lease_acquire(L.db, &n, 600000, &L.e2, &exp, &err),
                         0);
        struct cove_sandbox_row s;
        sandbox_row(&s, L.sa, "n1");
        assert_int_equal(cove_catalog_pg.sandbox_insert(L.db, &s, &err), 0);
        sandbox_row(&s, L.sb, "n2");
        assert_int_equal(cove_catalog_pg.sandbox_insert(L.db, &s, &err), 0);
        int64_t gen, job;
        assert_int_equal(cove_catalog_pg.placement_write(L.db, L.sa, "n1", "running", "start", NULL,
                                                         0, &gen, &job, &err),
                         0);
        assert_int_equal(cove_catalog_pg.placement_write(L.db, L.sb, "n2", "running", "start", NULL,
                                                         0, &gen, &job, &err),
                         0);
        struct cove_snapshot_row sn = {.created_at = cove_now_ms(), .kind = "files"};
        snprintf(sn.id, sizeof(sn.id), "%s", L.snap_b);
        snprintf(sn.tenant, sizeof(sn.tenant), "%s", L.ten);
        snprintf(sn.sandbox_id, sizeof(sn.sandbox_id), "%s", L.sb);
        assert_int_equal(cove_catalog_pg.snapshot_insert(L.db, &sn, &err), 0);
        return 0;
}

static int live_teardown(void **state)
{
        (void)state;
        if (L.n1)
                R->close(L.n1);
        if (L.db)
                cove_catalog_pg.close(L.db);
        return 0;
}

#define LIVE()                                                                                     \
        do {                                                                                       \
                if (!L.n1) {                                                                       \
                        print_message("skipped: needs COVE_TEST_REMOTE_URL/_KEY_FILE/_DB "         \
                                      "(tests/integration/test_remote_catalog.py)\n");             \
                        return;                                                                    \
                }                                                                                  \
        } while (0)

struct ids {
        char seen[8][64];
        int n;
};
static int collect_sbx(const struct cove_sandbox_row *r, void *a)
{
        struct ids *x = a;
        if (x->n < 8)
                snprintf(x->seen[x->n++], 64, "%s", r->id);
        return 0;
}
static int collect_snap(const struct cove_snapshot_row *r, void *a)
{
        struct ids *x = a;
        if (x->n < 8)
                snprintf(x->seen[x->n++], 64, "%s", r->id);
        return 0;
}
static int collect_node(const struct cove_node_row *r, void *a)
{
        struct ids *x = a;
        if (x->n < 8)
                snprintf(x->seen[x->n++], 64, "%s", r->name);
        return 0;
}
static int collect_doc(const char *t, const char *k, const char *o, const char *j, void *a)
{
        (void)t;
        (void)o;
        (void)j;
        struct ids *x = a;
        if (x->n < 8)
                snprintf(x->seen[x->n++], 64, "%s", k);
        return 0;
}

struct waiter {
        int rc;
        int64_t ms;
};
static void *wait_thread(void *arg)
{
        struct waiter *w = arg;
        struct cove_err err;
        int64_t t0 = cove_mono_ns();
        w->rc = R->wait_wakeup(L.n1, "n1", 20000, &err);
        w->ms = (cove_mono_ns() - t0) / 1000000;
        return NULL;
}

static void expect_denied(int rc, struct cove_err *err, const char *what)
{
        if (rc != -1)
                fail_msg("%s: not refused (rc %d)", what, rc);
        if (err->kind != COVE_E_UNAUTHORIZED)
                fail_msg("%s: refused with kind %d, not 403: %s", what, err->kind, err->msg);
}

static void node_works_on_its_own_rows(void **state)
{
        (void)state;
        LIVE();
        struct cove_err err = {0};
        int v = 0;
        assert_int_equal(R->schema_version(L.n1, &v, &err), 0);
        assert_true(v > 0);
        /* tenant rows: yes */
        struct cove_tenant_row t;
        assert_int_equal(R->tenant_get(L.n1, L.ten, &t, &err), 0);
        assert_string_equal(t.name, "remote test");
        /* its own sandbox: read; written only under its fence (below), never by a plain
         * update; lists show only it */
        struct cove_sandbox_row s = {0};
        assert_int_equal(R->sandbox_get(L.n1, NULL, L.sa, &s, &err), 0);
        assert_string_equal(s.node, "n1");
        snprintf(s.state, sizeof(s.state), "error");
        expect_denied(R->sandbox_update(L.n1, &s, &err), &err, "plain update of own sandbox");
        cove_sandbox_row_clear(&s);
        assert_int_equal(cove_catalog_pg.sandbox_get(L.db, NULL, L.sa, &s, &err), 0);
        assert_string_not_equal(s.state, "error");
        cove_sandbox_row_clear(&s);
        struct ids x = {0};
        assert_int_equal(R->sandbox_list(L.n1, L.ten, NULL, collect_sbx, &x, &err), 0);
        assert_int_equal(x.n, 1);
        assert_string_equal(x.seen[0], L.sa);
        /* placement, job: claim, observe, finish, get */
        struct cove_placement_row p;
        assert_int_equal(R->placement_get(L.n1, L.sa, &p, &err), 0);
        assert_string_equal(p.node, "n1");
        struct cove_job_row j = {0};
        if (R->job_claim(L.n1, "n1", L.e1, &j, &err) != 0)
                fail_msg("claim: %s", err.msg);
        assert_string_equal(j.sandbox_id, L.sa);
        assert_string_equal(j.kind, "start");
        assert_int_equal(
            R->placement_observe(L.n1, L.sa, "n1", L.e1, j.generation, "running", NULL, &err), 0);
        /* its row under its fence: the live epoch writes; a stale epoch or generation
         * changes nothing (refused by the catalog, in the control's statement) */
        assert_int_equal(cove_catalog_pg.sandbox_get(L.db, NULL, L.sa, &s, &err), 0);
        snprintf(s.state, sizeof(s.state), "paused");
        if (R->sandbox_update_fenced(L.n1, &s, "n1", L.e1, j.generation, &err) != 0)
                fail_msg("fenced update of own sandbox: %s", err.msg);
        snprintf(s.state, sizeof(s.state), "error");
        assert_int_equal(R->sandbox_update_fenced(L.n1, &s, "n1", L.e1 + 1, j.generation, &err),
                         -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        assert_int_equal(R->sandbox_update_fenced(L.n1, &s, "n1", L.e1, j.generation + 1, &err),
                         -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        snprintf(s.state, sizeof(s.state), "running");
        assert_int_equal(R->sandbox_update_fenced(L.n1, &s, "n1", L.e1, j.generation, &err), 0);
        cove_sandbox_row_clear(&s);
        assert_int_equal(cove_catalog_pg.sandbox_get(L.db, NULL, L.sa, &s, &err), 0);
        assert_string_equal(s.state, "running");
        cove_sandbox_row_clear(&s);
        assert_int_equal(
            R->job_finish(L.n1, j.id, "n1", L.e1, j.generation, 1, "{\"ok\":true}", &err), 0);
        struct cove_job_row j2 = {0};
        assert_int_equal(R->job_get(L.n1, j.id, &j2, &err), 0);
        assert_string_equal(j2.state, "done");
        assert_string_equal(j2.result_json, "{\"ok\":true}");
        cove_job_row_clear(&j2);
        cove_job_row_clear(&j);
        assert_int_equal(R->job_claim(L.n1, "n1", L.e1, &j, &err), 1); /* n2's job is not n1's */
        /* lease renew; node_list shows itself only */
        int64_t exp;
        assert_int_equal(R->node_lease_renew(L.n1, "n1", L.e1, 600000, &exp, &err), 0);
        assert_true(exp > cove_now_ms());
        memset(&x, 0, sizeof(x));
        assert_int_equal(R->node_list(L.n1, collect_node, &x, &err), 0);
        assert_int_equal(x.n, 1);
        assert_string_equal(x.seen[0], "n1");
        /* snapshots of its sandbox */
        struct cove_snapshot_row sn = {.created_at = cove_now_ms(), .kind = "files"};
        snprintf(sn.id, sizeof(sn.id), "snap_a%d", (int)getpid());
        snprintf(sn.tenant, sizeof(sn.tenant), "%s", L.ten);
        snprintf(sn.sandbox_id, sizeof(sn.sandbox_id), "%s", L.sa);
        if (R->snapshot_insert(L.n1, &sn, &err) != 0)
                fail_msg("snapshot insert: %s", err.msg);
        struct cove_snapshot_row sg;
        assert_int_equal(R->snapshot_get(L.n1, NULL, sn.id, &sg, &err), 0);
        memset(&x, 0, sizeof(x));
        assert_int_equal(R->snapshot_list(L.n1, L.ten, NULL, collect_snap, &x, &err), 0);
        assert_int_equal(x.n, 1); /* not n2's snapshot */
        assert_string_equal(x.seen[0], sn.id);
        /* egress policy and a lease document of its sandbox */
        assert_int_equal(R->egress_put(L.n1, L.sa, L.ten, "{\"allow\":[]}", &err), 0);
        char *json = NULL;
        assert_int_equal(R->egress_get(L.n1, L.sa, &json, &err), 0);
        assert_non_null(strstr(json, "allow"));
        free(json);
        assert_int_equal(R->doc_put(L.n1, "lease", L.ten, "lease_1", L.sa, "{\"s\":1}", &err), 0);
        json = NULL;
        assert_int_equal(R->doc_get(L.n1, "lease", L.ten, "lease_1", &json, &err), 0);
        free(json);
        memset(&x, 0, sizeof(x));
        assert_int_equal(R->doc_list(L.n1, "lease", L.ten, NULL, collect_doc, &x, &err), 0);
        assert_int_equal(x.n, 1);
        /* secrets of a tenant it runs a sandbox of: readable, not writable */
        assert_int_equal(
            cove_catalog_pg.doc_put(L.db, "secret", L.ten, "API", "", "{\"v\":1}", &err), 0);
        json = NULL;
        assert_int_equal(R->doc_get(L.n1, "secret", L.ten, "API", &json, &err), 0);
        free(json);
        assert_int_equal(R->doc_put(L.n1, "secret", L.ten, "API", "", "{}", &err), -1);
        assert_int_equal(R->doc_delete(L.n1, "lease", L.ten, "lease_1", &err), 0);
        assert_int_equal(R->doc_put(L.n1, "port", L.ten, "8080", L.sa, "{\"port\":8080}", &err), 0);
        memset(&x, 0, sizeof(x));
        assert_int_equal(R->doc_list(L.n1, "port", NULL, NULL, collect_doc, &x, &err), 0);
        assert_int_equal(x.n, 1);
        assert_int_equal(R->doc_delete(L.n1, "port", L.ten, "8080", &err), 0);
        assert_int_equal(R->doc_put(L.n1, "apikeys", L.ten, "k", L.sa, "{}", &err), -1);
        assert_int_equal(R->egress_delete(L.n1, L.sa, &err), 0);
        assert_int_equal(R->snapshot_delete(L.n1, sn.id, &err), 0);
        /* audit: append an event of its sandbox after the last one */
        int64_t seq = 0;
        char hash[65] = "";
        int rc = R->audit_last(L.n1, &seq, hash, &err);
        assert_true(rc == 0 || rc == 1);
        struct cove_audit_row a = {.seq = seq + 1,
                                   .at = cove_now_ms(),
                                   .kind = "egress",
                                   .action = "connect",
                                   .verdict = "allow",
                                   .detail_json = "{\"host\":\"x\"}"};
        snprintf(a.tenant, sizeof(a.tenant), "%s", L.ten);
        snprintf(a.sandbox, sizeof(a.sandbox), "%s", L.sa);
        if (rc == 0)
                snprintf(a.prev_hash, sizeof(a.prev_hash), "%s", hash);
        else
                memset(a.prev_hash, '0', 64);
        memset(a.hash, 'a', 64);
        if (R->audit_append(L.n1, &a, 1, &err) != 0)
                fail_msg("audit append: %s", err.msg);
        /* a sandbox the control deleted while n1 still flushes its events: accepted while
         * its placement names n1 */
        char sc[64];
        snprintf(sc, sizeof(sc), "sbx_c%d", (int)getpid());
        struct cove_sandbox_row cs;
        sandbox_row(&cs, sc, "n1");
        int64_t g0, j0;
        assert_int_equal(cove_catalog_pg.sandbox_insert(L.db, &cs, &err), 0);
        assert_int_equal(cove_catalog_pg.placement_write(L.db, sc, "n1", "stopped", NULL, NULL, 0,
                                                         &g0, &j0, &err),
                         0);
        assert_int_equal(cove_catalog_pg.sandbox_delete(L.db, sc, &err), 0);
        struct cove_audit_row a2 = a;
        a2.seq = a.seq + 1;
        memcpy(a2.prev_hash, a.hash, sizeof(a2.prev_hash));
        memset(a2.hash, 'b', 64);
        snprintf(a2.sandbox, sizeof(a2.sandbox), "%s", sc);
        if (R->audit_append(L.n1, &a2, 1, &err) != 0)
                fail_msg("audit append for a deleted sandbox of n1: %s", err.msg);
        /* wait_wakeup: a placement for n1 written by the control plane wakes n1's long poll */
        assert_int_equal(R->wait_wakeup(L.n1, "n1", 0, &err), 1);
        /* two long polls at once (the replica runs one catalog waiter for all): both wake */
        struct waiter w[2] = {{.rc = -5}, {.rc = -5}};
        pthread_t th[2];
        for (int i = 0; i < 2; i++)
                pthread_create(&th[i], NULL, wait_thread, &w[i]);
        usleep(300000); /* let the polls reach the control; a miss only delays the wake */
        int64_t gen, job;
        assert_int_equal(cove_catalog_pg.placement_write(L.db, L.sa, NULL, "paused", "pause",
                                                         "{\"kind\":\"files\"}", -1, &gen, &job,
                                                         &err),
                         0);
        for (int i = 0; i < 2; i++) {
                pthread_join(th[i], NULL);
                assert_int_equal(w[i].rc, 0);
                assert_true(w[i].ms < 20000);
        }
        /* the woken node claims it */
        memset(&j, 0, sizeof(j));
        assert_int_equal(R->job_claim(L.n1, "n1", L.e1, &j, &err), 0);
        assert_string_equal(j.kind, "pause");
        cove_job_row_clear(&j);
}

static void cross_node_access_refused(void **state)
{
        (void)state;
        LIVE();
        struct cove_err err = {0};
        struct cove_sandbox_row s;
        struct cove_sandbox_row before;
        assert_int_equal(cove_catalog_pg.sandbox_get(L.db, NULL, L.sb, &before, &err), 0);
        /* reads of n2's rows: as if absent */
        assert_int_equal(R->sandbox_get(L.n1, NULL, L.sb, &s, &err), 1);
        assert_int_equal(R->sandbox_get(L.n1, L.ten, L.sb, &s, &err), 1);
        struct cove_placement_row p;
        assert_int_equal(R->placement_get(L.n1, L.sb, &p, &err), 1);
        struct cove_snapshot_row sn;
        assert_int_equal(R->snapshot_get(L.n1, NULL, L.snap_b, &sn, &err), 1);
        char *json = NULL;
        assert_int_equal(R->egress_get(L.n1, L.sb, &json, &err), 1);
        /* writes of n2's sandbox */
        sandbox_row(&s, L.sb, "n1");
        snprintf(s.state, sizeof(s.state), "stopped");
        expect_denied(R->sandbox_update(L.n1, &s, &err), &err, "update n2's sandbox");
        snprintf(s.node, sizeof(s.node), "n2");
        expect_denied(R->sandbox_update(L.n1, &s, &err), &err, "update n2's sandbox as n2");
        expect_denied(R->sandbox_update_fenced(L.n1, &s, "n2", L.e2, 1, &err), &err,
                      "fenced update as n2");
        snprintf(s.node, sizeof(s.node), "n1");
        expect_denied(R->sandbox_update_fenced(L.n1, &s, "n1", L.e1, 1, &err), &err,
                      "fenced update of n2's sandbox");
        snprintf(s.node, sizeof(s.node), "n2");
        expect_denied(R->sandbox_delete(L.n1, L.sb, &err), &err, "delete n2's sandbox");
        sandbox_row(&s, "sbx_new_unplaced", "n1");
        expect_denied(R->sandbox_insert(L.n1, &s, &err), &err, "insert an unplaced sandbox");
        /* its own sandbox moved to n2 by its row: refused */
        assert_int_equal(cove_catalog_pg.sandbox_get(L.db, NULL, L.sa, &s, &err), 0);
        snprintf(s.node, sizeof(s.node), "n2");
        expect_denied(R->sandbox_update(L.n1, &s, &err), &err, "own row naming n2");
        cove_sandbox_row_clear(&s);
        struct cove_snapshot_row ns = {.created_at = 1, .kind = "files"};
        snprintf(ns.id, sizeof(ns.id), "snap_x%d", (int)getpid());
        snprintf(ns.tenant, sizeof(ns.tenant), "%s", L.ten);
        snprintf(ns.sandbox_id, sizeof(ns.sandbox_id), "%s", L.sb);
        expect_denied(R->snapshot_insert(L.n1, &ns, &err), &err, "snapshot of n2's sandbox");
        snprintf(ns.sandbox_id, sizeof(ns.sandbox_id), "%s", L.sa);
        snprintf(ns.tenant, sizeof(ns.tenant), "default");
        expect_denied(R->snapshot_insert(L.n1, &ns, &err), &err, "snapshot naming another tenant");
        expect_denied(R->snapshot_delete(L.n1, L.snap_b, &err), &err, "delete n2's snapshot");
        expect_denied(R->egress_put(L.n1, L.sb, L.ten, "{}", &err), &err, "egress of n2's sandbox");
        expect_denied(R->egress_delete(L.n1, L.sb, &err), &err, "egress delete of n2's");
        expect_denied(R->doc_put(L.n1, "lease", L.ten, "lease_b", L.sb, "{}", &err), &err,
                      "lease of n2's sandbox");
        struct cove_audit_row a = {.seq = 1000000, .at = 1};
        memset(a.prev_hash, '0', 64);
        memset(a.hash, '1', 64);
        snprintf(a.tenant, sizeof(a.tenant), "%s", L.ten);
        snprintf(a.sandbox, sizeof(a.sandbox), "%s", L.sb);
        expect_denied(R->audit_append(L.n1, &a, 1, &err), &err, "audit of n2's sandbox");
        a.sandbox[0] = '\0';
        expect_denied(R->audit_append(L.n1, &a, 1, &err), &err, "audit of no sandbox");
        /* n2's sandbox deleted: still n2's placement, still refused */
        char sd[64];
        snprintf(sd, sizeof(sd), "sbx_d%d", (int)getpid());
        sandbox_row(&s, sd, "n2");
        int64_t g0, j0;
        assert_int_equal(cove_catalog_pg.sandbox_insert(L.db, &s, &err), 0);
        assert_int_equal(cove_catalog_pg.placement_write(L.db, sd, "n2", "stopped", NULL, NULL, 0,
                                                         &g0, &j0, &err),
                         0);
        assert_int_equal(cove_catalog_pg.sandbox_delete(L.db, sd, &err), 0);
        snprintf(a.sandbox, sizeof(a.sandbox), "%s", sd);
        expect_denied(R->audit_append(L.n1, &a, 1, &err), &err, "audit of n2's deleted sandbox");
        expect_denied(R->doc_put(L.n1, "port", L.ten, "22", L.sb, "{}", &err), &err,
                      "port of n2's sandbox");
        /* n2's lease and jobs */
        int64_t exp, e, g, jid;
        expect_denied(R->node_lease_renew(L.n1, "n2", L.e2, 600000, &exp, &err), &err,
                      "renew n2's lease");
        struct cove_node_row n = {.name = "n2"};
        expect_denied(R->node_lease_acquire(L.n1, &n, 600000, &e, &exp, &err), &err,
                      "acquire n2's lease");
        struct cove_job_row j = {0};
        expect_denied(R->job_claim(L.n1, "n2", L.e2, &j, &err), &err, "claim n2's job");
        expect_denied(R->job_finish(L.n1, 1, "n2", L.e2, 1, 1, NULL, &err), &err, "finish as n2");
        expect_denied(R->placement_observe(L.n1, L.sb, "n2", L.e2, 1, "stopped", NULL, &err), &err,
                      "observe as n2");
        expect_denied(R->wait_wakeup(L.n1, "n2", 0, &err), &err, "wait as n2");
        /* control-plane only ops and API keys */
        expect_denied(R->node_set_state(L.n1, "n2", "lost", &err), &err, "node_set_state");
        expect_denied(
            R->placement_write(L.n1, L.sb, "n1", "running", "start", NULL, -1, &g, &jid, &err),
            &err, "placement_write");
        struct cove_tenant_row t = {0};
        snprintf(t.id, sizeof(t.id), "%s", L.ten);
        expect_denied(R->tenant_put(L.n1, &t, &err), &err, "tenant_put");
        int dummy = 0;
        expect_denied(R->apikey_list(L.n1, "default", any_key, &dummy, &err), &err, "list keys");
        struct cove_apikey_row k;
        expect_denied(R->apikey_get(L.n1, "key_x", &k, &err), &err, "get a key");
        int64_t cnt;
        expect_denied(R->apikey_count(L.n1, &cnt, &err), &err, "count keys");
        struct cove_apikey_row nk = {.id = "key_evil", .admin = 1};
        snprintf(nk.tenant, sizeof(nk.tenant), "%s", L.ten);
        expect_denied(R->apikey_put(L.n1, &nk, &err), &err, "put a key");
        /* n2's rows are as they were */
        struct cove_sandbox_row after;
        assert_int_equal(cove_catalog_pg.sandbox_get(L.db, NULL, L.sb, &after, &err), 0);
        assert_string_equal(after.state, before.state);
        assert_string_equal(after.node, "n2");
        cove_sandbox_row_clear(&after);
        cove_sandbox_row_clear(&before);
        assert_int_equal(cove_catalog_pg.placement_get(L.db, L.sb, &p, &err), 0);
        assert_string_equal(p.node, "n2");
        assert_string_equal(p.observed_state, "");
        assert_int_equal(cove_catalog_pg.snapshot_get(L.db, NULL, L.snap_b, &sn, &err), 0);
        assert_int_equal(cove_catalog_pg.apikey_get(L.db, "key_evil", &k, &err), 1);
        /* n2 still holds its lease with its epoch, and its job is still queued */
        assert_int_equal(cove_catalog_pg.node_lease_renew(L.db, "n2", L.e2, 600000, &exp, &err), 0);
        memset(&j, 0, sizeof(j));
        assert_int_equal(cove_catalog_pg.job_claim(L.db, "n2", L.e2, &j, &err), 0);
        assert_string_equal(j.sandbox_id, L.sb);
        cove_job_row_clear(&j);
}

/* op round trips through the control next to the same ops on PostgreSQL directly */
static void remote_op_cost(void **state)
{
        (void)state;
        LIVE();
        struct cove_err err;
        const int n = 200;
        const char *names[] = {"lease renew", "job claim (none)", "sandbox_get"};
        for (int k = 0; k < 3; k++) {
                double us[2];
                for (int via = 0; via < 2; via++) {
                        struct cove_catalog *c = via ? L.n1 : L.db;
                        const struct cove_catalog_ops *o = via ? R : &cove_catalog_pg;
                        int64_t t0 = cove_mono_ns(), exp;
                        for (int i = 0; i < n; i++) {
                                struct cove_job_row j = {0};
                                struct cove_sandbox_row s;
                                int rc =
                                    k == 0 ? o->node_lease_renew(c, "n1", L.e1, 600000, &exp, &err)
                                    : k == 1 ? o->job_claim(c, "n1", L.e1, &j, &err)
                                             : o->sandbox_get(c, NULL, L.sa, &s, &err);
                                assert_true(rc >= 0);
                                if (k == 1 && rc == 0)
                                        cove_job_row_clear(&j);
                                if (k == 2)
                                        cove_sandbox_row_clear(&s);
                        }
                        us[via] = (double)(cove_mono_ns() - t0) / 1000.0 / n;
                }
                print_message("remote catalog cost: %s: %.0f us via the control, %.0f us direct "
                              "PostgreSQL (x%.1f)\n",
                              names[k], us[1], us[0], us[1] / us[0]);
        }
}

int main(void)
{
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(garbage_answers_are_errors),
            cmocka_unit_test(unsigned_or_silent_control_refused),
            cmocka_unit_test(node_works_on_its_own_rows),
            cmocka_unit_test(cross_node_access_refused),
            cmocka_unit_test(remote_op_cost),
        };
        return cmocka_run_group_tests(tests, live_setup, live_teardown);
}
