/* PostgreSQL catalog backend (libpq): the same ops and schema migrations as SQLite, for a
 * cluster of control replicas and nodes sharing one database. A small pool of connections
 * (one per concurrent call); every value is a bound parameter, never SQL text. Commits wait
 * for the WAL flush (synchronous_commit = on); timeouts are bounded so a hung server never
 * hangs a caller; a call that loses its connection fails with COVE_E_UNAVAILABLE and the
 * next one reconnects. Lease times use the server's clock. */
#include "store/catalog.h"
#include "store/catalog_schema.h"
#include "util/util.h"

#include <errno.h>
#include <inttypes.h>
#include <libpq-events.h>
#include <libpq-fe.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POOL_MAX 8
#define NOTIFY_CHANNEL "cove_jobs"
#define DONE_CHANNEL "cove_job_done" /* payload: the job id; job_finish sends it */
/* the server's clock in unix ms: leases are compared against one clock for every node */
#define NOW_MS "(extract(epoch from clock_timestamp()) * 1000)::bigint"
/* any id, so concurrent opens apply each migration once */
#define MIGRATE_LOCK "7269676"

struct cove_catalog {
        char *dsn;          /* as given (holds the password: never in a message) */
        char redacted[512]; /* for messages */
        pthread_mutex_t mu; /* pool */
        pthread_cond_t cv;
        PGconn *idle[POOL_MAX];
        int nidle, nopen;
        pthread_mutex_t listen_mu; /* wait_wakeup's own connection */
        PGconn *listen;
        int listened; /* LISTEN was set up once: a later reconnect may have missed NOTIFYs */
        int64_t call_timeout_ms; /* longest wait for one answer (COVE_PG_CALL_TIMEOUT_MS) */
};

/* ---- bounded calls ----
 * statement_timeout is enforced by the server; a server that is stopped (SIGSTOP, a paused
 * VM) or a link that drops packets answers nothing, and its kernel may still ACK, so TCP
 * timeouts never fire. Every call therefore waits at most call_timeout_ms here, then gives
 * the connection up (conn_put drops it). */
#define TIMED_OUT ((PGresult *)-1) /* returned by exec_bounded when the deadline passed */

static PGresult *exec_bounded(PGconn *conn, int64_t timeout_ms, const char *sql, int n,
                              const char *const *vals)
{
        int sent = n >= 0 ? PQsendQueryParams(conn, sql, n, NULL, vals, NULL, NULL, 0)
                          : PQsendQuery(conn, sql); /* n < 0: several statements, no params */
        if (!sent)
                return NULL;
        int64_t deadline = cove_mono_ns() + timeout_ms * 1000000;
        for (;;) {
                int f = PQflush(conn);
                if (f < 0)
                        return NULL;
                if (f == 0) {
                        if (!PQconsumeInput(conn))
                                return NULL;
                        if (!PQisBusy(conn))
                                break;
                }
                int64_t left = (deadline - cove_mono_ns()) / 1000000;
                if (left <= 0)
                        return TIMED_OUT;
                struct pollfd pfd = {.fd = PQsocket(conn),
                                     .events = (short)(POLLIN | (f == 1 ? POLLOUT : 0))};
                if (poll(&pfd, 1, left > 1000 ? 1000 : (int)left) < 0 && errno != EINTR)
                        return NULL;
        }
        /* several statements give several results: the first error, else the last one */
        PGresult *res = NULL, *r;
        while ((r = PQgetResult(conn)) != NULL) {
                ExecStatusType st = PQresultStatus(r);
                int bad = st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK;
                int have_bad = res && PQresultStatus(res) != PGRES_COMMAND_OK &&
                               PQresultStatus(res) != PGRES_TUPLES_OK;
                if (!have_bad || (bad && !res)) {
                        PQclear(res);
                        res = r;
                } else {
                        PQclear(r);
                }
                if (PQstatus(conn) != CONNECTION_OK)
                        break;
        }
        return res;
}

static int timed_out_err(struct cove_err *err, int64_t ms, const char *ctx)
{
        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                             "catalog: %s: PostgreSQL did not answer within %lld ms; the next "
                             "call reconnects",
                             ctx, (long long)ms);
}

/* ---- connections ---- */

/* Each connection carries its catalog's call timeout as libpq instance data. */
static int conn_event(PGEventId id, void *info, void *arg)
{
        (void)id;
        (void)info;
        (void)arg;
        return 1;
}

static int64_t call_timeout_ms(const PGconn *conn)
{
        const int64_t *ms = PQinstanceData(conn, conn_event);
        return ms ? *ms : 35000;
}

static PGconn *pg_connect(struct cove_catalog *c, struct cove_err *err)
{
        /* defaults first: the dsn (expanded last) overrides any of them */
        static const char *const keys[] = {"connect_timeout",  "keepalives",
                                           "keepalives_idle",  "keepalives_interval",
                                           "keepalives_count", "tcp_user_timeout",
                                           "application_name", "options",
                                           "dbname",           NULL};
        const char *vals[] = {"5",
                              "1",
                              "5",
                              "2",
                              "3",
                              "15000",
                              "coved",
                              "-c statement_timeout=30000 -c lock_timeout=15000"
                              " -c idle_in_transaction_session_timeout=60000",
                              c->dsn,
                              NULL};
        PGconn *conn = PQconnectdbParams(keys, vals, 1);
        if (!conn || PQstatus(conn) != CONNECTION_OK) {
                char msg[256] = "out of memory";
                if (conn)
                        snprintf(msg, sizeof(msg), "%s", PQerrorMessage(conn));
                msg[strcspn(msg, "\n")] = '\0';
                PQfinish(conn);
                cove_err_setk(err, COVE_E_UNAVAILABLE, 0, "catalog %s: cannot connect: %s",
                              c->redacted, msg);
                return NULL;
        }
        if (!PQregisterEventProc(conn, conn_event, "cove", NULL) ||
            !PQsetInstanceData(conn, conn_event, &c->call_timeout_ms)) {
                PQfinish(conn);
                cove_err_set(err, ENOMEM, "catalog %s: connection set-up", c->redacted);
                return NULL;
        }
        /* commits are durable whatever the server's default (and the dsn's options) say */
        PGresult *res = exec_bounded(conn, c->call_timeout_ms,
                                     "SET synchronous_commit = on; SET client_min_messages ="
                                     " warning; SET client_encoding = 'UTF8'",
                                     -1, NULL);
        int ok = res != TIMED_OUT && PQresultStatus(res) == PGRES_COMMAND_OK;
        if (res != TIMED_OUT)
                PQclear(res);
        if (!ok) {
                cove_err_setk(err, COVE_E_UNAVAILABLE, 0, "catalog %s: set up session: %s",
                              c->redacted, PQerrorMessage(conn));
                PQfinish(conn);
                return NULL;
        }
        return conn;
}

/* An idle pool connection has nothing to read: the server says nothing between calls on a
 * connection that does not LISTEN. One that is readable or hung up was closed by the server
 * (a restart, an administrator's terminate: its FATAL message and then EOF), and a call on
 * it would fail with "connection lost" although the server is back; it is dropped instead. */
static int idle_conn_gone(PGconn *conn)
{
        struct pollfd pfd = {.fd = PQsocket(conn), .events = POLLIN};
        if (pfd.fd < 0)
                return 1;
        return poll(&pfd, 1, 0) > 0;
}

static PGconn *conn_get(struct cove_catalog *c, struct cove_err *err)
{
        pthread_mutex_lock(&c->mu);
        for (;;) { /* the pool's bound is checked again after each connection dropped */
                while (c->nidle == 0 && c->nopen >= POOL_MAX)
                        pthread_cond_wait(&c->cv, &c->mu);
                if (c->nidle == 0)
                        break;
                PGconn *conn = c->idle[--c->nidle];
                if (!idle_conn_gone(conn)) {
                        pthread_mutex_unlock(&c->mu);
                        return conn;
                }
                c->nopen--; /* closed outside the lock; its slot is free for any waiter */
                pthread_cond_broadcast(&c->cv);
                pthread_mutex_unlock(&c->mu);
                PQfinish(conn);
                pthread_mutex_lock(&c->mu);
        }
        c->nopen++;
        pthread_mutex_unlock(&c->mu);
        PGconn *conn = pg_connect(c, err);
        if (!conn) {
                pthread_mutex_lock(&c->mu);
                c->nopen--;
                pthread_cond_signal(&c->cv);
                pthread_mutex_unlock(&c->mu);
        }
        return conn;
}

/* Hand a connection back. A broken one is closed, and so is every idle one: a lost
 * connection usually means the server restarted, and each of them would fail its next
 * call too. A connection left inside a transaction is rolled back first. */
static void conn_put(struct cove_catalog *c, PGconn *conn)
{
        PGTransactionStatusType ts = PQtransactionStatus(conn);
        if (PQstatus(conn) == CONNECTION_OK && (ts == PQTRANS_INTRANS || ts == PQTRANS_INERROR)) {
                PGresult *res = exec_bounded(conn, call_timeout_ms(conn), "ROLLBACK", -1, NULL);
                if (res != TIMED_OUT)
                        PQclear(res);
        }
        int broken = PQstatus(conn) != CONNECTION_OK || PQtransactionStatus(conn) != PQTRANS_IDLE;
        PGconn *drop[POOL_MAX];
        int ndrop = 0;
        pthread_mutex_lock(&c->mu);
        if (broken) {
                drop[ndrop++] = conn;
                c->nopen--;
                while (c->nidle > 0 && ndrop < POOL_MAX) {
                        drop[ndrop++] = c->idle[--c->nidle];
                        c->nopen--;
                }
        } else {
                c->idle[c->nidle++] = conn;
        }
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        for (int i = 0; i < ndrop; i++)
                PQfinish(drop[i]);
}

/* ---- errors ---- */

/* Fill err from a failed result: "catalog: <context>: <server message>", classified by
 * SQLSTATE. Returns -1. */
static int pg_err(PGconn *conn, const PGresult *res, struct cove_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int pg_err(PGconn *conn, const PGresult *res, struct cove_err *err, const char *fmt, ...)
{
        char ctx[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ctx, sizeof(ctx), fmt, ap);
        va_end(ap);
        const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
        const char *prim = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
        char msg[256];
        snprintf(msg, sizeof(msg), "%s", prim ? prim : PQerrorMessage(conn));
        msg[strcspn(msg, "\n")] = '\0';
        if (!state || PQstatus(conn) != CONNECTION_OK || !strncmp(state, "08", 2) ||
            !strncmp(state, "57P", 3))
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "catalog: %s: PostgreSQL connection lost (%s); the next "
                                     "call reconnects",
                                     ctx, msg[0] ? msg : "no answer");
        enum cove_err_kind kind = COVE_E_INTERNAL;
        if (!strcmp(state, "23505"))
                kind = COVE_E_CONFLICT;
        else if (!strcmp(state, "23503"))
                kind = COVE_E_NOT_FOUND;
        else if (!strncmp(state, "23", 2) || !strncmp(state, "22", 2))
                kind = COVE_E_BAD_REQUEST;
        else if (!strcmp(state, "57014") || !strcmp(state, "55P03") || !strncmp(state, "53", 2) ||
                 !strncmp(state, "40", 2))
                kind = COVE_E_UNAVAILABLE; /* timed out, lock wait, resources, retry */
        return cove_err_setk(err, kind, 0, "catalog: %s: %s", ctx, msg);
}

/* ---- queries ---- */

struct params {
        const char *v[32];
        char buf[32][24];
        int n;
};

#define P_MAX ((int)(sizeof(((struct params *)0)->v) / sizeof(const char *)))

static void p_text(struct params *p, const char *s)
{
        if (p->n >= P_MAX)
                abort(); /* a programming error: every call site has a fixed count */
        p->v[p->n++] = s;
}

static void p_int(struct params *p, int64_t x)
{
        if (p->n >= P_MAX)
                abort();
        snprintf(p->buf[p->n], sizeof(p->buf[p->n]), "%" PRId64, x);
        p->v[p->n] = p->buf[p->n];
        p->n++;
}

/* Run sql with params; NULL with err filled when it did not succeed. */
static PGresult *run(PGconn *conn, const char *sql, const struct params *p, struct cove_err *err,
                     const char *ctx)
{
        int64_t ms = call_timeout_ms(conn);
        PGresult *res = exec_bounded(conn, ms, sql, p ? p->n : 0, p ? p->v : NULL);
        if (res == TIMED_OUT)
                return timed_out_err(err, ms, ctx), NULL;
        ExecStatusType st = PQresultStatus(res);
        if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK)
                return res;
        pg_err(conn, res, err, "%s", ctx);
        PQclear(res);
        return NULL;
}

/* One statement on a pooled connection. */
static PGresult *run1(struct cove_catalog *c, const char *sql, const struct params *p,
                      struct cove_err *err, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static PGresult *run1(struct cove_catalog *c, const char *sql, const struct params *p,
                      struct cove_err *err, const char *fmt, ...)
{
        char ctx[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ctx, sizeof(ctx), fmt, ap);
        va_end(ap);
        PGconn *conn = conn_get(c, err);
        if (!conn)
                return cove_err_wrap(err, "%s", ctx), NULL;
        PGresult *res = run(conn, sql, p, err, ctx);
        conn_put(c, conn);
        return res;
}

static int exec_ok(PGconn *conn, const char *sql, struct cove_err *err, const char *ctx)
{
        int64_t ms = call_timeout_ms(conn);
        PGresult *res = exec_bounded(conn, ms, sql, -1, NULL);
        if (res == TIMED_OUT)
                return timed_out_err(err, ms, ctx);
        ExecStatusType st = PQresultStatus(res);
        int r = (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK)
                    ? 0
                    : pg_err(conn, res, err, "%s", ctx);
        PQclear(res);
        return r;
}

static int64_t get_i64(const PGresult *res, int row, int col)
{
        return PQgetisnull(res, row, col) ? 0 : strtoll(PQgetvalue(res, row, col), NULL, 10);
}

static int get_copy(const PGresult *res, int row, int col, char *dst, size_t cap)
{
        size_t n = (size_t)PQgetlength(res, row, col);
        if (n >= cap)
                return -1;
        memcpy(dst, PQgetvalue(res, row, col), n);
        dst[n] = '\0';
        return 0;
}

static char *get_dup(const PGresult *res, int row, int col, const char *dflt)
{
        if (PQgetisnull(res, row, col))
                return dflt ? strdup(dflt) : NULL;
        return strndup(PQgetvalue(res, row, col), (size_t)PQgetlength(res, row, col));
}

static int changed(const PGresult *res)
{
        return atoi(PQcmdTuples((PGresult *)res));
}

static int field_ok(const char *f, size_t cap)
{
        return strnlen(f, cap) < cap;
}

/* ---- open, migrations, close ---- */

static int migrate(struct cove_catalog *c, PGconn *conn, struct cove_err *err)
{
        for (;;) {
                if (exec_ok(conn,
                            "BEGIN; SELECT pg_advisory_xact_lock(" MIGRATE_LOCK ");"
                            "CREATE TABLE IF NOT EXISTS schema_migrations ("
                            " version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)",
                            err, "begin migration") < 0)
                        goto fail;
                PGresult *res = run(conn, "SELECT coalesce(max(version), 0) FROM schema_migrations",
                                    NULL, err, "read schema version");
                if (!res)
                        goto fail;
                int v = (int)get_i64(res, 0, 0);
                PQclear(res);
                if (v > cove_catalog_schema_version) {
                        cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                      "catalog %s: schema version %d is newer than this build "
                                      "supports (%d); run a newer cove or restore a backup",
                                      c->redacted, v, cove_catalog_schema_version);
                        goto fail_quiet;
                }
                if (v == cove_catalog_schema_version)
                        return exec_ok(conn, "COMMIT", err, "commit");
                const struct cove_migration *m = &cove_catalog_migrations[v];
                char what[64];
                snprintf(what, sizeof(what), "migration %d", v + 1);
                char *sql = cove_catalog_sql_pg(m->sql);
                if (!sql) {
                        cove_err_set(err, ENOMEM, "catalog: %s", what);
                        goto fail;
                }
                int r = (m->pg_before && exec_ok(conn, m->pg_before, err, what) < 0) ||
                                exec_ok(conn, sql, err, what) < 0 ||
                                (m->pg_after && exec_ok(conn, m->pg_after, err, what) < 0)
                            ? -1
                            : 0;
                free(sql);
                if (r < 0)
                        goto fail;
                struct params p = {0};
                p_int(&p, v + 1);
                p_int(&p, cove_now_ms());
                res =
                    run(conn, "INSERT INTO schema_migrations(version, applied_at) VALUES ($1, $2)",
                        &p, err, what);
                if (!res)
                        goto fail;
                PQclear(res);
                if (exec_ok(conn, "COMMIT", err, what) < 0)
                        goto fail;
        }
fail:
        cove_err_wrap(err, "open catalog %s", c->redacted);
fail_quiet:
        return -1; /* conn_put rolls back */
}

static void pg_close(struct cove_catalog *c)
{
        if (!c)
                return;
        for (int i = 0; i < c->nidle; i++)
                PQfinish(c->idle[i]);
        PQfinish(c->listen);
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->listen_mu);
        if (c->dsn)
                explicit_bzero(c->dsn, strlen(c->dsn));
        free(c->dsn);
        free(c);
}

static struct cove_catalog *pg_open(const char *dsn, struct cove_err *err)
{
        if (!dsn || (strncmp(dsn, "postgres://", 11) && strncmp(dsn, "postgresql://", 13))) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                              "catalog: a PostgreSQL catalog needs a postgres:// URL");
                return NULL;
        }
        struct cove_catalog *c = calloc(1, sizeof(*c));
        if (!c || !(c->dsn = strdup(dsn))) {
                free(c);
                cove_err_set(err, ENOMEM, "catalog: open");
                return NULL;
        }
        cove_catalog_dsn_redact(dsn, c->redacted, sizeof(c->redacted));
        /* statement_timeout (30 s) plus a margin, unless the environment says otherwise */
        const char *t = getenv("COVE_PG_CALL_TIMEOUT_MS");
        c->call_timeout_ms = t && atoll(t) > 0 ? atoll(t) : 35000;
        pthread_mutex_init(&c->mu, NULL);
        pthread_cond_init(&c->cv, NULL);
        pthread_mutex_init(&c->listen_mu, NULL);
        PGconn *conn = conn_get(c, err);
        if (!conn) {
                pg_close(c);
                return NULL;
        }
        int r = migrate(c, conn, err);
        conn_put(c, conn);
        if (r < 0) {
                pg_close(c);
                return NULL;
        }
        return c;
}

static int pg_schema_version(struct cove_catalog *c, int *version, struct cove_err *err)
{
        PGresult *res = run1(c, "SELECT coalesce(max(version), 0) FROM schema_migrations", NULL,
                             err, "read schema version");
        if (!res)
                return -1;
        *version = (int)get_i64(res, 0, 0);
        PQclear(res);
        return 0;
}

/* ---- tenants, API keys ---- */

#define TENANT_COLS                                                                                \
        "id, name, created_at, max_sandboxes, max_cpus, max_memory_mb, max_storage_mb, deleted_at"

static int pg_tenant_put(struct cove_catalog *c, const struct cove_tenant_row *t,
                         struct cove_err *err)
{
        if (!field_ok(t->id, sizeof(t->id)) || !field_ok(t->name, sizeof(t->name)) || !t->id[0])
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog: put tenant: id or name missing or too long");
        struct params p = {0};
        p_text(&p, t->id);
        p_text(&p, t->name);
        p_int(&p, t->created_at);
        p_int(&p, t->max_sandboxes);
        p_int(&p, t->max_cpus);
        p_int(&p, t->max_memory_mb);
        p_int(&p, t->max_storage_mb);
        p_int(&p, t->deleted_at);
        PGresult *res = run1(c,
                             "INSERT INTO tenants(" TENANT_COLS ") VALUES ($1, $2, $3, $4, $5,"
                             " $6, $7, $8) ON CONFLICT(id) DO UPDATE SET name = excluded.name,"
                             " max_sandboxes = excluded.max_sandboxes,"
                             " max_cpus = excluded.max_cpus,"
                             " max_memory_mb = excluded.max_memory_mb,"
                             " max_storage_mb = excluded.max_storage_mb,"
                             " deleted_at = greatest(tenants.deleted_at, excluded.deleted_at)",
                             &p, err, "put tenant %s", t->id);
        PQclear(res);
        return res ? 0 : -1;
}

static int tenant_read(const PGresult *res, int i, struct cove_tenant_row *o)
{
        memset(o, 0, sizeof(*o));
        if (get_copy(res, i, 0, o->id, sizeof(o->id)) < 0 ||
            get_copy(res, i, 1, o->name, sizeof(o->name)) < 0)
                return -1;
        o->created_at = get_i64(res, i, 2);
        o->max_sandboxes = get_i64(res, i, 3);
        o->max_cpus = get_i64(res, i, 4);
        o->max_memory_mb = get_i64(res, i, 5);
        o->max_storage_mb = get_i64(res, i, 6);
        o->deleted_at = get_i64(res, i, 7);
        return 0;
}

static int pg_tenant_get(struct cove_catalog *c, const char *id, struct cove_tenant_row *out,
                         struct cove_err *err)
{
        struct params p = {0};
        p_text(&p, id);
        PGresult *res = run1(c, "SELECT " TENANT_COLS " FROM tenants WHERE id = $1", &p, err,
                             "get tenant %s", id);
        if (!res)
                return -1;
        int r = PQntuples(res) == 0 ? 1
                : tenant_read(res, 0, out) < 0
                    ? cove_err_set(err, 0, "catalog: get tenant %s: stored field too long", id)
                    : 0;
        PQclear(res);
        return r;
}

static int pg_tenant_list(struct cove_catalog *c, cove_tenant_cb cb, void *arg,
                          struct cove_err *err)
{
        PGresult *res = run1(c,
                             "SELECT " TENANT_COLS " FROM tenants WHERE deleted_at = 0"
                             " ORDER BY created_at, rid",
                             NULL, err, "list tenants");
        if (!res)
                return -1;
        for (int i = 0; i < PQntuples(res); i++) {
                struct cove_tenant_row t;
                if (tenant_read(res, i, &t) == 0 && cb(&t, arg) < 0)
                        break;
        }
        PQclear(res);
        return 0;
}

static int pg_apikey_list(struct cove_catalog *c, const char *tenant, cove_apikey_cb cb, void *arg,
                          struct cove_err *err)
{
        struct params p = {0};
        p_text(&p, tenant);
        PGresult *res = run1(c,
                             "SELECT id, tenant, admin, revoked, created_at FROM api_keys"
                             " WHERE tenant = $1 ORDER BY created_at, rid",
                             &p, err, "list api keys of %s", tenant);
        if (!res)
                return -1;
        for (int i = 0; i < PQntuples(res); i++) {
                struct cove_apikey_row k;
                memset(&k, 0, sizeof(k));
                if (get_copy(res, i, 0, k.id, sizeof(k.id)) < 0 ||
                    get_copy(res, i, 1, k.tenant, sizeof(k.tenant)) < 0)
                        continue;
                k.admin = (int)get_i64(res, i, 2);
                k.revoked = (int)get_i64(res, i, 3);
                k.created_at = get_i64(res, i, 4);
                if (cb(&k, arg) < 0) /* salt and hash are not handed out by a list */
                        break;
        }
        PQclear(res);
        return 0;
}

static int pg_apikey_put(struct cove_catalog *c, const struct cove_apikey_row *k,
                         struct cove_err *err)
{
        if (!field_ok(k->id, sizeof(k->id)) || !field_ok(k->tenant, sizeof(k->tenant)) ||
            !field_ok(k->salt_hex, sizeof(k->salt_hex)) ||
            !field_ok(k->hash_hex, sizeof(k->hash_hex)) || !k->id[0])
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog: put api key: a field is missing or too long");
        struct params p = {0};
        p_text(&p, k->id);
        p_text(&p, k->tenant);
        p_text(&p, k->salt_hex);
        p_text(&p, k->hash_hex);
        p_int(&p, k->admin ? 1 : 0);
        p_int(&p, k->revoked ? 1 : 0);
        p_int(&p, k->created_at);
        /* tenant, salt and hash never change; revoked never goes back */
        PGresult *res = run1(c,
                             "INSERT INTO api_keys(id, tenant, salt_hex, hash_hex, admin, revoked,"
                             " created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)"
                             " ON CONFLICT(id) DO UPDATE SET admin = excluded.admin,"
                             " revoked = greatest(api_keys.revoked, excluded.revoked)"
                             " WHERE api_keys.tenant = excluded.tenant"
                             " AND api_keys.salt_hex = excluded.salt_hex"
                             " AND api_keys.hash_hex = excluded.hash_hex",
                             &p, err, "put api key %s (tenant %s)", k->id, k->tenant);
        if (!res)
                return -1;
        int r = changed(res) == 0 ? cove_err_setk(err, COVE_E_CONFLICT, 0,
                                                  "catalog: put api key %s: exists with another "
                                                  "tenant or secret",
                                                  k->id)
                                  : 0;
        PQclear(res);
        return r;
}

static int pg_apikey_get(struct cove_catalog *c, const char *id, struct cove_apikey_row *out,
                         struct cove_err *err)
{
        struct params p = {0};
        p_text(&p, id);
        PGresult *res = run1(c,
                             "SELECT id, tenant, salt_hex, hash_hex, admin, revoked, created_at"
                             " FROM api_keys WHERE id = $1",
                             &p, err, "get api key %s", id);
        if (!res)
                return -1;
        int r = 1;
        if (PQntuples(res) > 0) {
                memset(out, 0, sizeof(*out));
                r = get_copy(res, 0, 0, out->id, sizeof(out->id)) < 0 ||
                            get_copy(res, 0, 1, out->tenant, sizeof(out->tenant)) < 0 ||
                            get_copy(res, 0, 2, out->salt_hex, sizeof(out->salt_hex)) < 0 ||
                            get_copy(res, 0, 3, out->hash_hex, sizeof(out->hash_hex)) < 0
                        ? cove_err_set(err, 0, "catalog: get api key %s: stored field too long", id)
                        : 0;
                out->admin = (int)get_i64(res, 0, 4);
                out->revoked = (int)get_i64(res, 0, 5);
                out->created_at = get_i64(res, 0, 6);
        }
        PQclear(res);
        return r;
}

static int pg_apikey_count(struct cove_catalog *c, int64_t *n, struct cove_err *err)
{
        PGresult *res = run1(c, "SELECT count(*) FROM api_keys", NULL, err, "count api keys");
        if (!res)
                return -1;
        *n = get_i64(res, 0, 0);
        PQclear(res);
        return 0;
}

/* ---- sandboxes ---- */

#define SBX_COLS                                                                                   \
        "id, tenant, state, template_name, runtime, created_at, expires_at, cpus, memory_mb,"      \
        " disk_mb, timeout_s, on_timeout, uid_base, node, last_snapshot_id, metadata_json,"        \
        " env_json, error, snapshot_interval_s, retention_json, storage_encrypted, recovered_from"

static void sbx_params(struct params *p, const struct cove_sandbox_row *s)
{
        p_text(p, s->id);
        p_text(p, s->tenant);
        p_text(p, s->state);
        p_text(p, s->template_name);
        p_text(p, s->runtime);
        p_int(p, s->created_at);
        p_int(p, s->expires_at);
        p_int(p, s->cpus);
        p_int(p, s->memory_mb);
        p_int(p, s->disk_mb);
        p_int(p, s->timeout_s);
        p_text(p, s->on_timeout);
        p_int(p, s->uid_base);
        p_text(p, s->node);
        p_text(p, s->last_snapshot_id);
        p_text(p, s->metadata_json ? s->metadata_json : "{}");
        p_text(p, s->env_json ? s->env_json : "{}");
}

static int sbx_read(const PGresult *res, int i, struct cove_sandbox_row *o)
{
        memset(o, 0, sizeof(*o));
        if (get_copy(res, i, 0, o->id, sizeof(o->id)) < 0 ||
            get_copy(res, i, 1, o->tenant, sizeof(o->tenant)) < 0 ||
            get_copy(res, i, 2, o->state, sizeof(o->state)) < 0 ||
            get_copy(res, i, 3, o->template_name, sizeof(o->template_name)) < 0 ||
            get_copy(res, i, 4, o->runtime, sizeof(o->runtime)) < 0 ||
            get_copy(res, i, 11, o->on_timeout, sizeof(o->on_timeout)) < 0 ||
            get_copy(res, i, 13, o->node, sizeof(o->node)) < 0 ||
            get_copy(res, i, 14, o->last_snapshot_id, sizeof(o->last_snapshot_id)) < 0)
                return -EOVERFLOW;
        o->created_at = get_i64(res, i, 5);
        o->expires_at = get_i64(res, i, 6);
        o->cpus = (int)get_i64(res, i, 7);
        o->memory_mb = (int)get_i64(res, i, 8);
        o->disk_mb = (int)get_i64(res, i, 9);
        o->timeout_s = (int)get_i64(res, i, 10);
        o->uid_base = (uint32_t)get_i64(res, i, 12);
        o->metadata_json = get_dup(res, i, 15, "{}");
        o->env_json = get_dup(res, i, 16, "{}");
        o->error = get_dup(res, i, 17, NULL);
        o->snapshot_interval_s = (int)get_i64(res, i, 18);
        o->retention_json = get_dup(res, i, 19, NULL);
        o->storage_encrypted = (int)get_i64(res, i, 20);
        o->recovered_from_json = get_dup(res, i, 21, NULL);
        if (!o->metadata_json || !o->env_json || (!o->error && !PQgetisnull(res, i, 17)) ||
            (!o->recovered_from_json && !PQgetisnull(res, i, 21)) ||
            (!o->retention_json && !PQgetisnull(res, i, 19))) {
                cove_sandbox_row_clear(o);
                return -ENOMEM;
        }
        return 0;
}

static int sbx_read_err(int r, const char *id, struct cove_err *err)
{
        if (r == -ENOMEM)
                return cove_err_set(err, ENOMEM, "catalog: read sandbox %s", id);
        return cove_err_set(err, 0, "catalog: read sandbox %s: stored field too long", id);
}

#define SBX_UPDATE_SQL                                                                             \
        "UPDATE sandboxes SET state = $3, template_name = $4, runtime = $5,"                       \
        " created_at = $6, expires_at = $7, cpus = $8, memory_mb = $9,"                            \
        " disk_mb = $10, timeout_s = $11, on_timeout = $12, uid_base = $13,"                       \
        " node = $14, last_snapshot_id = $15, metadata_json = $16,"                                \
        " env_json = $17, error = $18, snapshot_interval_s = $19,"                                 \
        " retention_json = $20, storage_encrypted = $21, recovered_from = $22"                     \
        " WHERE id = $1 AND tenant = $2"

/* fence: NULL, or the node whose (epoch, generation) the write must hold under */
static int pg_sandbox_write(struct cove_catalog *c, int insert, const struct cove_sandbox_row *s,
                            const char *fence, int64_t epoch, int64_t generation,
                            struct cove_err *err)
{
        const char *op = insert ? "insert" : "update";
        if (cove__sandbox_check(s, err, op) < 0)
                return -1;
        struct params p = {0};
        sbx_params(&p, s);
        p_text(&p, s->error);
        p_int(&p, s->snapshot_interval_s);
        p_text(&p, s->retention_json);
        p_int(&p, s->storage_encrypted ? 1 : 0);
        p_text(&p, s->recovered_from_json);
        if (fence) {
                p_text(&p, fence);
                p_int(&p, epoch);
                p_int(&p, generation);
        }
        /* fenced: FOR SHARE waits for a placement or lease write in flight and re-checks
         * against its outcome, so a move or a lapse committed first refuses the write */
        const char *sql =
            insert  ? "INSERT INTO sandboxes(" SBX_COLS ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8,"
                      " $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22)"
            : fence ? SBX_UPDATE_SQL " AND EXISTS (SELECT 1 FROM placements WHERE sandbox_id = $1"
                                     " AND node = $23 AND generation = $25 FOR SHARE)"
                                     " AND EXISTS (SELECT 1 FROM nodes WHERE name = $23"
                                     " AND epoch = $24 AND lease_expires_at > " NOW_MS " FOR SHARE)"
                    : SBX_UPDATE_SQL;
        PGresult *res = run1(c, sql, &p, err, "%s sandbox %s (tenant %s)", op, s->id, s->tenant);
        if (!res)
                return -1;
        int r = !insert && changed(res) == 0 ? 1 : 0;
        PQclear(res);
        if (r == 1 && fence) { /* absent, or the fence did not hold: which? */
                struct params q = {0};
                p_text(&q, s->id);
                p_text(&q, s->tenant);
                res = run1(c, "SELECT count(*) FROM sandboxes WHERE id = $1 AND tenant = $2", &q,
                           err, "get sandbox %s", s->id);
                if (!res)
                        return -1;
                if (get_i64(res, 0, 0) > 0)
                        r = cove_err_setk(err, COVE_E_CONFLICT, 0,
                                          "catalog: update sandbox %s: node %s epoch %lld "
                                          "generation %lld is stale",
                                          s->id, fence, (long long)epoch, (long long)generation);
                PQclear(res);
        }
        return r;
}

static int pg_sandbox_insert(struct cove_catalog *c, const struct cove_sandbox_row *s,
                             struct cove_err *err)
{
        return pg_sandbox_write(c, 1, s, NULL, 0, 0, err);
}

static int pg_sandbox_update(struct cove_catalog *c, const struct cove_sandbox_row *s,
                             struct cove_err *err)
{
        return pg_sandbox_write(c, 0, s, NULL, 0, 0, err);
}

static int pg_sandbox_update_fenced(struct cove_catalog *c, const struct cove_sandbox_row *s,
                                    const char *node, int64_t epoch, int64_t generation,
                                    struct cove_err *err)
{
        return pg_sandbox_write(c, 0, s, node ? node : "", epoch, generation, err);
}

static int pg_sandbox_get(struct cove_catalog *c, const char *tenant, const char *id,
                          struct cove_sandbox_row *out, struct cove_err *err)
{
        struct params p = {0};
        p_text(&p, id);
        p_text(&p, tenant);
        PGresult *res = run1(c,
                             "SELECT " SBX_COLS " FROM sandboxes WHERE id = $1"
                             " AND ($2::text IS NULL OR tenant = $2)",
                             &p, err, "get sandbox %s", id);
        if (!res)
                return -1;
        int r = 1;
        if (PQntuples(res) > 0) {
                r = sbx_read(res, 0, out);
                if (r < 0)
                        r = sbx_read_err(r, id, err);
        }
        PQclear(res);
        return r;
}

static int pg_sandbox_list(struct cove_catalog *c, const char *tenant, const char *states,
                           cove_sandbox_cb cb, void *arg, struct cove_err *err)
{
        char filter[256];
        int any;
        if (cove__states_filter(states, filter, sizeof(filter), &any) < 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog: list sandboxes: state filter too long");
        if (!any && filter[0] == '\0')
                return 0; /* only unknown states: nothing can match */
        struct params p = {0};
        p_text(&p, any ? NULL : filter);
        p_text(&p, tenant);
        PGresult *res = run1(c,
                             "SELECT " SBX_COLS " FROM sandboxes"
                             " WHERE ($1::text IS NULL OR position(',' || state || ',' in $1) > 0)"
                             " AND ($2::text IS NULL OR tenant = $2) ORDER BY created_at, rid",
                             &p, err, "list sandboxes");
        if (!res)
                return -1;
        /* every row is read before any is handed out: on error the list would be partial */
        int n = PQntuples(res), r = 0;
        struct cove_sandbox_row *rows = calloc((size_t)n + 1, sizeof(*rows));
        if (!rows)
                r = cove_err_set(err, ENOMEM, "catalog: list sandboxes");
        int got = 0;
        for (; r == 0 && got < n; got++) {
                int e = sbx_read(res, got, &rows[got]);
                if (e < 0)
                        r = sbx_read_err(e, PQgetvalue(res, got, 0), err);
        }
        if (r < 0 && got > 0)
                got--; /* the failed row cleared itself */
        PQclear(res);
        int stop = r < 0;
        for (int i = 0; i < got; i++) {
                if (!stop && cb(&rows[i], arg) < 0)
                        stop = 1;
                cove_sandbox_row_clear(&rows[i]);
        }
        free(rows);
        return r;
}

static int delete1(struct cove_catalog *c, const char *sql, struct params *p, struct cove_err *err,
                   const char *what, const char *id)
{
        PGresult *res = run1(c, sql, p, err, "delete %s %s", what, id);
        if (!res)
                return -1;
        int r = changed(res) == 0 ? 1 : 0;
        PQclear(res);
        return r;
}

static int pg_sandbox_delete(struct cove_catalog *c, const char *id, struct cove_err *err)
{
        struct params p = {0};
        p_text(&p, id);
        return delete1(c, "DELETE FROM sandboxes WHERE id = $1", &p, err, "sandbox", id);
}

/* ---- snapshots ---- */

#define SNAP_COLS                                                                                  \
        "id, tenant, sandbox_id, parent_id, kind, created_at, label, size_bytes, new_bytes,"       \
        " pause_us, rolling"

static int pg_snapshot_insert(struct cove_catalog *c, const struct cove_snapshot_row *s,
                              struct cove_err *err)
{
        if (!field_ok(s->id, sizeof(s->id)) || !s->id[0] ||
            !field_ok(s->tenant, sizeof(s->tenant)) || !s->tenant[0] ||
            !field_ok(s->sandbox_id, sizeof(s->sandbox_id)) ||
            !field_ok(s->parent_id, sizeof(s->parent_id)) || !field_ok(s->kind, sizeof(s->kind)) ||
            !field_ok(s->label, sizeof(s->label)) || s->size_bytes > INT64_MAX ||
            s->new_bytes > INT64_MAX)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog: insert snapshot: a field is missing or too long");
        struct params p = {0};
        p_text(&p, s->id);
        p_text(&p, s->tenant);
        p_text(&p, s->sandbox_id);
        p_text(&p, s->parent_id);
        p_text(&p, s->kind);
        p_int(&p, s->created_at);
        p_text(&p, s->label);
        p_int(&p, (int64_t)s->size_bytes);
        p_int(&p, (int64_t)s->new_bytes);
        p_int(&p, s->pause_us);
        p_int(&p, s->rolling ? 1 : 0);
        PGresult *res = run1(c,
                             "INSERT INTO snapshots(" SNAP_COLS ") VALUES ($1, $2, $3, $4, $5, $6,"
                             " $7, $8, $9, $10, $11)",
                             &p, err, "insert snapshot %s (sandbox %s)", s->id, s->sandbox_id);
        PQclear(res);
        return res ? 0 : -1;
}

static int snap_read(const PGresult *res, int i, struct cove_snapshot_row *o)
{
        memset(o, 0, sizeof(*o));
        if (get_copy(res, i, 0, o->id, sizeof(o->id)) < 0 ||
            get_copy(res, i, 1, o->tenant, sizeof(o->tenant)) < 0 ||
            get_copy(res, i, 2, o->sandbox_id, sizeof(o->sandbox_id)) < 0 ||
            get_copy(res, i, 3, o->parent_id, sizeof(o->parent_id)) < 0 ||
            get_copy(res, i, 4, o->kind, sizeof(o->kind)) < 0 ||
            get_copy(res, i, 6, o->label, sizeof(o->label)) < 0)
                return -1;
        o->created_at = get_i64(res, i, 5);
        o->size_bytes = (uint64_t)get_i64(res, i, 7);
        o->new_bytes = (uint64_t)get_i64(res, i, 8);
        o->pause_us = get_i64(res, i, 9);
        o->rolling = (int)get_i64(res, i, 10);
        return 0;
}

static int pg_snapshot_get(struct cove_catalog *c, const char *tenant, const char *id,
                           struct cove_snapshot_row *out, struct cove_err *err)
{
        struct params p = {0};
        p_text(&p, id);
        p_text(&p, tenant);
        PGresult *res = run1(c,
                             "SELECT " SNAP_COLS " FROM snapshots WHERE id = $1"
                             " AND ($2::text IS NULL OR tenant = $2)",
                             &p, err, "get snapshot %s", id);
        if (!res)
                return -1;
        int r = PQntuples(res) == 0 ? 1
                : snap_read(res, 0, out) < 0
                    ? cove_err_set(err, 0, "catalog: get snapshot %s: stored field too long", id)
                    : 0;
        PQclear(res);
        return r;
}

static int pg_snapshot_list(struct cove_catalog *c, const char *tenant, const char *sandbox_id,
                            cove_snapshot_cb cb, void *arg, struct cove_err *err)
{
        struct params p = {0};
        p_text(&p, tenant);
        p_text(&p, sandbox_id);
        PGresult *res = run1(c,
                             "SELECT " SNAP_COLS " FROM snapshots"
                             " WHERE ($1::text IS NULL OR tenant = $1)"
                             " AND ($2::text IS NULL OR sandbox_id = $2)"
                             " ORDER BY created_at DESC, rid DESC",
                             &p, err, "list snapshots");
        if (!res)
                return -1;
        int r = 0;
        for (int i = 0; i < PQntuples(res); i++) {
                struct cove_snapshot_row s;
                if (snap_read(res, i, &s) < 0) {
                        r = cove_err_set(err, 0, "catalog: list snapshots: stored field too long");
                        break;
                }
                if (cb(&s, arg) < 0)
                        break;
        }
        PQclear(res);
        return r;
}

static int pg_snapshot_delete(struct cove_catalog *c, const char *id, struct cove_err *err)
{
        struct params p = {0};
        p_text(&p, id);
        return delete1(c, "DELETE FROM snapshots WHERE id = $1", &p, err, "snapshot", id);
}

/* ---- audit events, egress policies ---- */

#define AUDIT_COLS "seq, at, tenant, sandbox, kind, action, verdict, detail_json, prev_hash, hash"
#define AUDIT_NCOLS 10

/* All rows in one INSERT (placeholders only: $1..$10n). */
static int audit_insert(PGconn *conn, const struct cove_audit_row *rows, size_t n,
                        struct cove_err *err)
{
        size_t cap = 256 + n * 96; /* the column list, then ($1,…,$10) per row */
        char *sql = malloc(cap);
        const char **vals = calloc(n * AUDIT_NCOLS, sizeof(*vals));
        char(*ints)[24] = calloc(n * 2, sizeof(*ints));
        int r = -1;
        if (!sql || !vals || !ints) {
                cove_err_set(err, ENOMEM, "catalog: append audit events");
                goto out;
        }
        size_t o = (size_t)snprintf(sql, cap, "INSERT INTO audit_events(" AUDIT_COLS ") VALUES ");
        for (size_t i = 0; i < n; i++) {
                o += (size_t)snprintf(sql + o, cap - o, "%s(", i ? "," : "");
                for (int k = 0; k < AUDIT_NCOLS; k++)
                        o += (size_t)snprintf(sql + o, cap - o, "%s$%zu", k ? "," : "",
                                              i * AUDIT_NCOLS + (size_t)k + 1);
                o += (size_t)snprintf(sql + o, cap - o, ")");
                if (o >= cap) { /* cannot happen with the sizes above; never write past */
                        cove_err_set(err, 0, "catalog: append audit events: statement too long");
                        goto out;
                }
                const struct cove_audit_row *a = &rows[i];
                const char **v = vals + i * AUDIT_NCOLS;
                snprintf(ints[2 * i], 24, "%" PRId64, a->seq);
                snprintf(ints[2 * i + 1], 24, "%" PRId64, a->at);
                v[0] = ints[2 * i];
                v[1] = ints[2 * i + 1];
                v[2] = a->tenant;
                v[3] = a->sandbox;
                v[4] = a->kind;
                v[5] = a->action;
                v[6] = a->verdict;
                v[7] = a->detail_json ? a->detail_json : "{}";
                v[8] = a->prev_hash;
                v[9] = a->hash;
        }
        int64_t ms = call_timeout_ms(conn);
        PGresult *res = exec_bounded(conn, ms, sql, (int)(n * AUDIT_NCOLS), vals);
        if (res == TIMED_OUT) {
                r = timed_out_err(err, ms, "append audit events");
                goto out;
        }
        r = PQresultStatus(res) == PGRES_COMMAND_OK
                ? 0
                : pg_err(conn, res, err, "append audit events %lld..", (long long)rows[0].seq);
        PQclear(res);
out:
        free(sql);
        free(vals);
        free(ints);
        return r;
}

static int pg_audit_append(struct cove_catalog *c, const struct cove_audit_row *rows, size_t n,
                           struct cove_err *err)
{
        for (size_t i = 0; i < n; i++)
                if (!field_ok(rows[i].tenant, sizeof(rows[i].tenant)) ||
                    !field_ok(rows[i].sandbox, sizeof(rows[i].sandbox)) ||
                    !field_ok(rows[i].kind, sizeof(rows[i].kind)) ||
                    !field_ok(rows[i].action, sizeof(rows[i].action)) ||
                    !field_ok(rows[i].verdict, sizeof(rows[i].verdict)) ||
                    strnlen(rows[i].prev_hash, 65) != 64 || strnlen(rows[i].hash, 65) != 64)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "catalog: append audit event: bad field");
        if (n == 0)
                return 0;
        if (n > 4096)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog: append audit events: at most 4096 at once");
        PGconn *conn = conn_get(c, err);
        if (!conn)
                return -1;
        /* The chain head is locked for the transaction: a second appender (another coved)
         * waits, then finds the head moved and gets CONFLICT (control/audit.c re-reads the
         * head and retries). SHARE ROW EXCLUSIVE conflicts with itself and with inserts,
         * not with readers. */
        int r = exec_ok(conn, "BEGIN; LOCK TABLE audit_events IN SHARE ROW EXCLUSIVE MODE", err,
                        "begin audit append");
        if (r == 0) {
                PGresult *res = run(conn, "SELECT coalesce(max(seq), 0) FROM audit_events", NULL,
                                    err, "audit chain head");
                if (!res) {
                        r = -1;
                } else {
                        int64_t have = get_i64(res, 0, 0);
                        PQclear(res);
                        if (rows[0].seq != have + 1)
                                r = cove_err_setk(err, COVE_E_CONFLICT, 0,
                                                  "catalog: audit event %lld does not follow %lld",
                                                  (long long)rows[0].seq, (long long)have);
                }
        }
        if (r == 0)
                r = audit_insert(conn, rows, n, err);
        if (r == 0)
                r = exec_ok(conn, "COMMIT", err, "commit audit events");
        conn_put(c, conn); /* rolls back what did not commit */
        return r;
}

static int pg_audit_last(struct cove_catalog *c, int64_t *seq, char hash[65], struct cove_err *err)
{
        PGresult *res = run1(c, "SELECT seq, hash FROM audit_events ORDER BY seq DESC LIMIT 1",
                             NULL, err, "last audit event");
        if (!res)
                return -1;
        int r = 1;
        if (PQntuples(res) > 0) {
                *seq = get_i64(res, 0, 0);
                r = get_copy(res, 0, 1, hash, 65) < 0
                        ? cove_err_set(err, 0, "catalog: last audit event: bad hash")
                        : 0;
        }
        PQclear(res);
        return r;
}

static int pg_audit_list(struct cove_catalog *c, const char *tenant, const char *sandbox,
                         const char *kind, int64_t after_seq, int64_t since_ms, int limit,
                         cove_audit_cb cb, void *arg, struct cove_err *err)
{
        struct params p = {0};
        p_text(&p, tenant);
        p_text(&p, sandbox);
        p_text(&p, kind);
        p_int(&p, after_seq);
        p_int(&p, since_ms);
        if (limit > 0)
                p_int(&p, limit);
        else
                p_text(&p, NULL); /* LIMIT NULL: no limit */
        PGresult *res = run1(c,
                             "SELECT " AUDIT_COLS " FROM audit_events WHERE seq > $4 AND at >= $5"
                             " AND ($1::text IS NULL OR tenant = $1)"
                             " AND ($2::text IS NULL OR sandbox = $2)"
                             " AND ($3::text IS NULL OR kind = $3) ORDER BY seq LIMIT $6::bigint",
                             &p, err, "list audit events");
        if (!res)
                return -1;
        int r = 0;
        for (int i = 0; i < PQntuples(res); i++) {
                struct cove_audit_row a;
                memset(&a, 0, sizeof(a));
                a.seq = get_i64(res, i, 0);
                a.at = get_i64(res, i, 1);
                if (get_copy(res, i, 2, a.tenant, sizeof(a.tenant)) < 0 ||
                    get_copy(res, i, 3, a.sandbox, sizeof(a.sandbox)) < 0 ||
                    get_copy(res, i, 4, a.kind, sizeof(a.kind)) < 0 ||
                    get_copy(res, i, 5, a.action, sizeof(a.action)) < 0 ||
                    get_copy(res, i, 6, a.verdict, sizeof(a.verdict)) < 0 ||
                    get_copy(res, i, 8, a.prev_hash, sizeof(a.prev_hash)) < 0 ||
                    get_copy(res, i, 9, a.hash, sizeof(a.hash)) < 0) {
                        r = cove_err_set(err, 0, "catalog: list audit events: bad stored row");
                        break;
                }
                a.detail_json = PQgetvalue(res, i, 7); /* valid while res lives */
                if (cb(&a, arg) < 0)
                        break;
        }
        PQclear(res);
        return r;
}

static int pg_egress_put(struct cove_catalog *c, const char *sandbox_id, const char *tenant,
                         const char *json, struct cove_err *err)
{
        struct params p = {0};
        p_text(&p, sandbox_id);
        p_text(&p, tenant);
        p_text(&p, json);
        p_int(&p, cove_now_ms());
        PGresult *res = run1(c,
                             "INSERT INTO egress_policies(sandbox_id, tenant, policy_json,"
                             " updated_at) VALUES ($1, $2, $3, $4) ON CONFLICT(sandbox_id) DO"
                             " UPDATE SET policy_json = excluded.policy_json,"
                             " updated_at = excluded.updated_at"
                             " WHERE egress_policies.tenant = excluded.tenant",
                             &p, err, "put egress policy of %s", sandbox_id);
        if (!res)
                return -1;
        int r = changed(res) == 0 ? cove_err_setk(err, COVE_E_CONFLICT, 0,
                                                  "catalog: egress policy of %s belongs to "
                                                  "another tenant",
                                                  sandbox_id)
                                  : 0;
        PQclear(res);
        return r;
}

static int get_json(struct cove_catalog *c, const char *sql, struct params *p, char **json,
                    struct cove_err *err, const char *what, const char *id)
{
        PGresult *res = run1(c, sql, p, err, "get %s %s", what, id);
        if (!res)
                return -1;
        int r = 1;
        if (PQntuples(res) > 0)
                r = (*json = get_dup(res, 0, 0, "{}")) ? 0 : cove_err_set(err, ENOMEM, "%s", what);
        PQclear(res);
        return r;
}

static int pg_egress_get(struct cove_catalog *c, const char *sandbox_id, char **json,
                         struct cove_err *err)
{
        struct params p = {0};
        p_text(&p, sandbox_id);
        return get_json(c, "SELECT policy_json FROM egress_policies WHERE sandbox_id = $1", &p,
                        json, err, "egress policy of", sandbox_id);
}

static int pg_egress_delete(struct cove_catalog *c, const char *sandbox_id, struct cove_err *err)
{
        struct params p = {0};
        p_text(&p, sandbox_id);
        return delete1(c, "DELETE FROM egress_policies WHERE sandbox_id = $1", &p, err,
                       "egress policy of", sandbox_id);
}

static int pg_doc_put(struct cove_catalog *c, const char *kind, const char *tenant, const char *key,
                      const char *owner, const char *json, struct cove_err *err)
{
        struct params p = {0};
        p_text(&p, kind);
        p_text(&p, tenant);
        p_text(&p, key);
        p_text(&p, owner ? owner : "");
        p_text(&p, json);
        p_int(&p, cove_now_ms());
        PGresult *res = run1(c,
                             "INSERT INTO egress_docs(kind, tenant, key, owner, doc_json,"
                             " updated_at) VALUES ($1, $2, $3, $4, $5, $6)"
                             " ON CONFLICT(kind, tenant, key) DO UPDATE SET owner = excluded.owner,"
                             " doc_json = excluded.doc_json, updated_at = excluded.updated_at",
                             &p, err, "put %s %s", kind, key);
        PQclear(res);
        return res ? 0 : -1;
}

static int pg_doc_get(struct cove_catalog *c, const char *kind, const char *tenant, const char *key,
                      char **json, struct cove_err *err)
{
        struct params p = {0};
        p_text(&p, kind);
        p_text(&p, tenant);
        p_text(&p, key);
        return get_json(c,
                        "SELECT doc_json FROM egress_docs WHERE kind = $1 AND tenant = $2"
                        " AND key = $3",
                        &p, json, err, kind, key);
}

/* ---- key records (schema 8) ---- */

static int pg_keyrec_get(struct cove_catalog *c, const char *tenant, char **json, int64_t *gen,
                         struct cove_err *err)
{
        struct params p = {0};
        p_text(&p, tenant);
        PGresult *res = run1(c, "SELECT record_json, gen FROM key_records WHERE tenant = $1", &p,
                             err, "key record of %s", tenant);
        if (!res)
                return -1;
        int r = 1;
        if (PQntuples(res) > 0) {
                *gen = get_i64(res, 0, 1);
                r = (*json = get_dup(res, 0, 0, "{}")) ? 0
                                                       : cove_err_set(err, ENOMEM, "key record");
        }
        PQclear(res);
        return r;
}

static int pg_keyrec_put(struct cove_catalog *c, const char *tenant, const char *json,
                         int64_t expect_gen, int64_t *gen, struct cove_err *err)
{
        struct params p = {0};
        p_text(&p, tenant);
        p_text(&p, json);
        p_int(&p, cove_now_ms());
        p_int(&p, expect_gen);
        PGresult *res =
            run1(c,
                 expect_gen == 0 ? "INSERT INTO key_records(tenant, gen, record_json, updated_at)"
                                   " SELECT $1, 1, $2, $3 WHERE $4::bigint = 0"
                                   " ON CONFLICT(tenant) DO NOTHING RETURNING gen"
                                 : "UPDATE key_records SET gen = gen + 1, record_json = $2,"
                                   " updated_at = $3 WHERE tenant = $1 AND gen = $4 RETURNING gen",
                 &p, err, "put key record of %s", tenant);
        if (!res)
                return -1;
        int r = 0;
        if (PQntuples(res) == 1)
                *gen = get_i64(res, 0, 0);
        else
                r = cove_err_setk(err, COVE_E_CONFLICT, 0,
                                  "catalog: key record of %s was %s by another process", tenant,
                                  expect_gen == 0 ? "created" : "changed");
        PQclear(res);
        return r;
}

static int pg_doc_list(struct cove_catalog *c, const char *kind, const char *tenant,
                       const char *owner, cove_doc_cb cb, void *arg, struct cove_err *err)
{
        struct params p = {0};
        p_text(&p, kind);
        p_text(&p, tenant);
        p_text(&p, owner);
        PGresult *res = run1(c,
                             "SELECT key, owner, doc_json, tenant FROM egress_docs WHERE kind = $1"
                             " AND ($2::text IS NULL OR tenant = $2)"
                             " AND ($3::text IS NULL OR owner = $3) ORDER BY key",
                             &p, err, "list %s", kind);
        if (!res)
                return -1;
        for (int i = 0; i < PQntuples(res); i++)
                if (cb(PQgetvalue(res, i, 3), PQgetvalue(res, i, 0), PQgetvalue(res, i, 1),
                       PQgetvalue(res, i, 2), arg) < 0)
                        break;
        PQclear(res);
        return 0;
}

static int pg_doc_delete(struct cove_catalog *c, const char *kind, const char *tenant,
                         const char *key, struct cove_err *err)
{
        struct params p = {0};
        p_text(&p, kind);
        p_text(&p, tenant);
        p_text(&p, key);
        return delete1(c, "DELETE FROM egress_docs WHERE kind = $1 AND tenant = $2 AND key = $3",
                       &p, err, kind, key);
}

/* ---- cluster (schema 6) ---- */

static int name_ok(const char *s, size_t cap)
{
        return s && s[0] && strnlen(s, cap) < cap;
}

static int pg_node_lease_acquire(struct cove_catalog *c, const struct cove_node_row *n,
                                 int64_t ttl_ms, int64_t *epoch, int64_t *expires_at,
                                 struct cove_err *err)
{
        if (!name_ok(n->name, sizeof(n->name)) || !field_ok(n->address, sizeof(n->address)) ||
            !field_ok(n->features, sizeof(n->features)) || ttl_ms <= 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog: acquire node lease: bad name, address, features "
                                     "or ttl");
        struct params p = {0};
        p_text(&p, n->name);
        p_int(&p, ttl_ms);
        p_int(&p, n->cpus);
        p_int(&p, n->memory_mb);
        p_int(&p, n->disk_mb);
        p_text(&p, n->address);
        p_text(&p, n->features[0] ? n->features : "{}");
        /* the upsert locks the row: of two racing acquirers one updates, the other then
         * sees an unexpired lease and changes nothing */
        PGresult *res = run1(
            c,
            "INSERT INTO nodes(name, state, epoch, lease_expires_at, cpus, memory_mb, disk_mb,"
            " address, last_seen, features) VALUES ($1, 'ready', 1, " NOW_MS " + $2::bigint, $3,"
            " $4, $5, $6, " NOW_MS ", $7) ON CONFLICT(name) DO UPDATE SET epoch = nodes.epoch + 1,"
            " lease_expires_at = excluded.lease_expires_at, cpus = excluded.cpus,"
            " memory_mb = excluded.memory_mb, disk_mb = excluded.disk_mb,"
            " address = excluded.address, last_seen = excluded.last_seen,"
            " features = excluded.features,"
            " state = CASE nodes.state WHEN 'lost' THEN 'ready' ELSE nodes.state END"
            " WHERE nodes.lease_expires_at <= excluded.last_seen RETURNING epoch, lease_expires_at",
            &p, err, "acquire lease of node %s", n->name);
        if (!res)
                return -1;
        int r = 0;
        if (PQntuples(res) == 0) {
                r = cove_err_setk(err, COVE_E_CONFLICT, 0,
                                  "catalog: node %s: its lease is held and has not expired",
                                  n->name);
        } else {
                if (epoch)
                        *epoch = get_i64(res, 0, 0);
                if (expires_at)
                        *expires_at = get_i64(res, 0, 1);
        }
        PQclear(res);
        return r;
}

static int pg_node_lease_renew(struct cove_catalog *c, const char *name, int64_t epoch,
                               int64_t ttl_ms, int64_t *expires_at, struct cove_err *err)
{
        if (ttl_ms <= 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "catalog: renew lease: bad ttl");
        struct params p = {0};
        p_text(&p, name);
        p_int(&p, epoch);
        p_int(&p, ttl_ms);
        PGresult *res = run1(c,
                             "UPDATE nodes SET lease_expires_at = " NOW_MS " + $3::bigint,"
                             " last_seen = " NOW_MS " WHERE name = $1 AND epoch = $2"
                             " AND lease_expires_at > " NOW_MS " RETURNING lease_expires_at",
                             &p, err, "renew lease of node %s", name);
        if (!res)
                return -1;
        int r = 0;
        if (PQntuples(res) == 0)
                r = cove_err_setk(err, COVE_E_CONFLICT, 0,
                                  "catalog: node %s: lease of epoch %lld is stale or expired", name,
                                  (long long)epoch);
        else if (expires_at)
                *expires_at = get_i64(res, 0, 0);
        PQclear(res);
        return r;
}

static int pg_node_set_state(struct cove_catalog *c, const char *name, const char *state,
                             struct cove_err *err)
{
        if (!cove_node_state_valid(state))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog: node state must be ready, cordoned, draining or "
                                     "lost");
        struct params p = {0};
        p_text(&p, name);
        p_text(&p, state);
        return delete1(c, "UPDATE nodes SET state = $2 WHERE name = $1", &p, err, "node state of",
                       name);
}

static int pg_node_list(struct cove_catalog *c, cove_node_cb cb, void *arg, struct cove_err *err)
{
        PGresult *res = run1(
            c,
            "SELECT n.name, n.state, n.epoch, n.lease_expires_at, n.cpus, n.memory_mb, n.disk_mb,"
            " coalesce(sum(s.cpus), 0), coalesce(sum(s.memory_mb), 0), coalesce(sum(s.disk_mb), 0),"
            " n.address, n.last_seen, n.features FROM nodes n LEFT JOIN placements p ON p.node = "
            "n.name"
            " AND p.desired_state <> 'stopped' LEFT JOIN sandboxes s ON s.id = p.sandbox_id"
            " GROUP BY n.name ORDER BY n.name",
            NULL, err, "list nodes");
        if (!res)
                return -1;
        int r = 0;
        for (int i = 0; i < PQntuples(res); i++) {
                struct cove_node_row o;
                memset(&o, 0, sizeof(o));
                if (get_copy(res, i, 0, o.name, sizeof(o.name)) < 0 ||
                    get_copy(res, i, 1, o.state, sizeof(o.state)) < 0 ||
                    get_copy(res, i, 10, o.address, sizeof(o.address)) < 0 ||
                    get_copy(res, i, 12, o.features, sizeof(o.features)) < 0) {
                        r = cove_err_set(err, 0, "catalog: list nodes: stored field too long");
                        break;
                }
                o.epoch = get_i64(res, i, 2);
                o.lease_expires_at = get_i64(res, i, 3);
                o.cpus = get_i64(res, i, 4);
                o.memory_mb = get_i64(res, i, 5);
                o.disk_mb = get_i64(res, i, 6);
                o.alloc_cpus = get_i64(res, i, 7);
                o.alloc_memory_mb = get_i64(res, i, 8);
                o.alloc_disk_mb = get_i64(res, i, 9);
                o.last_seen = get_i64(res, i, 11);
                if (cb(&o, arg) < 0)
                        break;
        }
        PQclear(res);
        return r;
}

#define PLACE_COLS "sandbox_id, node, generation, desired_state, observed_state, updated_at"

static int pg_placement_get(struct cove_catalog *c, const char *sandbox_id,
                            struct cove_placement_row *out, struct cove_err *err)
{
        struct params p = {0};
        p_text(&p, sandbox_id);
        PGresult *res = run1(c, "SELECT " PLACE_COLS " FROM placements WHERE sandbox_id = $1", &p,
                             err, "get placement of %s", sandbox_id);
        if (!res)
                return -1;
        int r = 1;
        if (PQntuples(res) > 0) {
                memset(out, 0, sizeof(*out));
                r = get_copy(res, 0, 0, out->sandbox_id, sizeof(out->sandbox_id)) < 0 ||
                            get_copy(res, 0, 1, out->node, sizeof(out->node)) < 0 ||
                            get_copy(res, 0, 3, out->desired_state, sizeof(out->desired_state)) <
                                0 ||
                            get_copy(res, 0, 4, out->observed_state, sizeof(out->observed_state)) <
                                0
                        ? cove_err_set(err, 0, "catalog: placement of %s: bad stored row",
                                       sandbox_id)
                        : 0;
                out->generation = get_i64(res, 0, 2);
                out->updated_at = get_i64(res, 0, 5);
        }
        PQclear(res);
        return r;
}

/* The body of placement_write, inside a transaction on conn. */
static int place_txn(PGconn *conn, const char *sandbox_id, const char *node,
                     const char *desired_state, const char *job_kind, const char *job_args,
                     int64_t expect_generation, int64_t *generation, int64_t *job_id,
                     struct cove_err *err)
{
        struct params p = {0};
        p_text(&p, sandbox_id);
        PGresult *res = run(conn,
                            "SELECT generation, node FROM placements WHERE sandbox_id = $1"
                            " FOR UPDATE",
                            &p, err, "place");
        if (!res)
                return -1;
        int placed = PQntuples(res) > 0;
        int64_t cur = placed ? get_i64(res, 0, 0) : 0;
        char owner[64] = "";
        if (placed)
                get_copy(res, 0, 1, owner, sizeof(owner));
        PQclear(res);
        if (expect_generation >= 0 && cur != expect_generation)
                return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                     "catalog: place %s: generation is %lld, not %lld", sandbox_id,
                                     (long long)cur, (long long)expect_generation);
        int64_t gen = cur;
        if (node) {
                p = (struct params){0};
                p_text(&p, node);
                res = run(conn, "SELECT state FROM nodes WHERE name = $1 FOR SHARE", &p, err,
                          "place: node");
                if (!res)
                        return -1;
                char state[16] = "";
                int found = PQntuples(res) > 0;
                if (found)
                        get_copy(res, 0, 0, state, sizeof(state));
                PQclear(res);
                if (!found)
                        return cove_err_setk(err, COVE_E_NOT_FOUND, 0,
                                             "catalog: place %s: no node %s", sandbox_id, node);
                if (strcmp(state, "ready") != 0)
                        return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                             "catalog: place %s: node %s is %s", sandbox_id, node,
                                             state);
                gen = cur + 1;
                p = (struct params){0};
                p_text(&p, sandbox_id);
                p_text(&p, node);
                p_int(&p, gen);
                p_text(&p, desired_state);
                /* a plain INSERT for a first placement: of two racing replicas the second
                 * hits the primary key (CONFLICT), it never overwrites the first */
                res = run(conn,
                          placed ? "UPDATE placements SET node = $2, generation = $3,"
                                   " desired_state = $4, observed_state = '',"
                                   " updated_at = " NOW_MS " WHERE sandbox_id = $1"
                                   " AND generation = $3::bigint - 1"
                                 : "INSERT INTO placements(sandbox_id, node, generation,"
                                   " desired_state, observed_state, updated_at)"
                                   " VALUES ($1, $2, $3, $4, '', " NOW_MS ")",
                          &p, err, "place");
                snprintf(owner, sizeof(owner), "%s", node);
        } else {
                if (!placed)
                        return cove_err_setk(err, COVE_E_NOT_FOUND, 0,
                                             "catalog: %s is not placed on any node", sandbox_id);
                p = (struct params){0};
                p_text(&p, sandbox_id);
                p_text(&p, desired_state);
                res = run(conn,
                          "UPDATE placements SET desired_state = $2, updated_at = " NOW_MS
                          " WHERE sandbox_id = $1",
                          &p, err, "place");
        }
        if (!res)
                return cove_err_wrap(err, "%s", sandbox_id);
        PQclear(res);
        p = (struct params){0};
        p_text(&p, sandbox_id);
        p_int(&p, gen);
        res = run(conn,
                  "UPDATE jobs SET state = 'failed', result_json = '\"superseded\"',"
                  " updated_at = " NOW_MS " WHERE sandbox_id = $1 AND generation < $2"
                  " AND state IN ('queued', 'claimed')",
                  &p, err, "place: supersede jobs");
        if (!res)
                return -1;
        PQclear(res);
        int64_t id = 0;
        if (job_kind) {
                p = (struct params){0};
                p_text(&p, sandbox_id);
                p_text(&p, job_kind);
                p_int(&p, gen);
                p_text(&p, job_args);
                res = run(conn,
                          "INSERT INTO jobs(sandbox_id, kind, generation, created_at, updated_at,"
                          " args_json) VALUES ($1, $2, $3, " NOW_MS ", " NOW_MS ", $4)"
                          " RETURNING id",
                          &p, err, "enqueue job");
                if (!res)
                        return -1;
                id = get_i64(res, 0, 0);
                PQclear(res);
        }
        /* delivered to the listeners at commit, not before */
        p = (struct params){0};
        p_text(&p, owner);
        res = run(conn, "SELECT pg_notify('" NOTIFY_CHANNEL "', $1)", &p, err, "notify");
        if (!res)
                return -1;
        PQclear(res);
        if (generation)
                *generation = gen;
        if (job_id)
                *job_id = id;
        return 0;
}

static int pg_placement_write(struct cove_catalog *c, const char *sandbox_id, const char *node,
                              const char *desired_state, const char *job_kind,
                              const char *job_args_json, int64_t expect_generation,
                              int64_t *generation, int64_t *job_id, struct cove_err *err)
{
        if (!name_ok(sandbox_id, 64) || (node && !name_ok(node, 64)) || !desired_state ||
            !cove_sandbox_state_valid(desired_state, strlen(desired_state)) ||
            (job_kind && !name_ok(job_kind, 16)))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog: place: bad sandbox id, node, desired state or "
                                     "job kind");
        PGconn *conn = conn_get(c, err);
        if (!conn)
                return -1;
        int r = exec_ok(conn, "BEGIN", err, "begin placement");
        if (r == 0)
                r = place_txn(conn, sandbox_id, node, desired_state, job_kind, job_args_json,
                              expect_generation, generation, job_id, err);
        if (r == 0)
                r = exec_ok(conn, "COMMIT", err, "commit placement");
        conn_put(c, conn);
        return r;
}

static int pg_placement_observe(struct cove_catalog *c, const char *sandbox_id, const char *node,
                                int64_t epoch, int64_t generation, const char *observed_state,
                                const char *desired_state, struct cove_err *err)
{
        if (cove_observe_valid(sandbox_id, observed_state, desired_state, err) < 0)
                return -1;
        struct params p = {0};
        p_text(&p, sandbox_id);
        p_text(&p, node);
        p_int(&p, epoch);
        p_int(&p, generation);
        p_text(&p, observed_state);
        p_text(&p, desired_state);
        int r = delete1(c,
                        "UPDATE placements SET observed_state = $5, updated_at = " NOW_MS
                        ", desired_state = coalesce($6::text, desired_state)"
                        " WHERE sandbox_id = $1 AND node = $2 AND generation = $4"
                        " AND EXISTS (SELECT 1 FROM nodes WHERE name = $2 AND epoch = $3"
                        " AND lease_expires_at > " NOW_MS ")",
                        &p, err, "observe", sandbox_id);
        if (r == 1)
                r = cove_err_setk(err, COVE_E_CONFLICT, 0,
                                  "catalog: observe %s: node %s epoch %lld generation %lld is "
                                  "stale",
                                  sandbox_id, node, (long long)epoch, (long long)generation);
        return r;
}

#define JOB_COLS                                                                                   \
        "id, sandbox_id, kind, generation, state, claimed_by, claimed_epoch, result_json,"         \
        " created_at, updated_at, args_json"

static int job_read(const PGresult *res, int i, struct cove_job_row *o)
{
        memset(o, 0, sizeof(*o));
        o->id = get_i64(res, i, 0);
        if (get_copy(res, i, 1, o->sandbox_id, sizeof(o->sandbox_id)) < 0 ||
            get_copy(res, i, 2, o->kind, sizeof(o->kind)) < 0 ||
            get_copy(res, i, 4, o->state, sizeof(o->state)) < 0 ||
            get_copy(res, i, 5, o->claimed_by, sizeof(o->claimed_by)) < 0)
                return -1;
        o->generation = get_i64(res, i, 3);
        o->claimed_epoch = get_i64(res, i, 6);
        if (!PQgetisnull(res, i, 7) && !(o->result_json = get_dup(res, i, 7, NULL)))
                return -1;
        o->created_at = get_i64(res, i, 8);
        o->updated_at = get_i64(res, i, 9);
        if (!PQgetisnull(res, i, 10) && !(o->args_json = get_dup(res, i, 10, NULL)))
                return -1;
        return 0;
}

static int lease_live(struct cove_catalog *c, const char *node, int64_t epoch, struct cove_err *err)
{
        struct params p = {0};
        p_text(&p, node);
        p_int(&p, epoch);
        PGresult *res = run1(c,
                             "SELECT count(*) FROM nodes WHERE name = $1 AND epoch = $2"
                             " AND lease_expires_at > " NOW_MS,
                             &p, err, "lease of node %s", node);
        if (!res)
                return -1;
        int live = get_i64(res, 0, 0) > 0;
        PQclear(res);
        return live;
}

static int pg_job_claim(struct cove_catalog *c, const char *node, int64_t epoch,
                        struct cove_job_row *out, struct cove_err *err)
{
        struct params p = {0};
        p_text(&p, node);
        p_int(&p, epoch);
        /* SKIP LOCKED: a concurrent claimer passes over the row another one is taking */
        PGresult *res =
            run1(c,
                 "UPDATE jobs SET state = 'claimed', claimed_by = $1, claimed_epoch = $2,"
                 " updated_at = " NOW_MS " WHERE id = (SELECT j.id FROM jobs j JOIN placements p"
                 " ON p.sandbox_id = j.sandbox_id AND p.generation = j.generation"
                 " WHERE p.node = $1 AND (j.state = 'queued' OR (j.state = 'claimed'"
                 " AND j.claimed_by = $1 AND j.claimed_epoch < $2)) ORDER BY j.id LIMIT 1"
                 " FOR UPDATE OF j SKIP LOCKED)"
                 " AND EXISTS (SELECT 1 FROM nodes WHERE name = $1 AND epoch = $2"
                 " AND lease_expires_at > " NOW_MS ") RETURNING " JOB_COLS,
                 &p, err, "claim a job for node %s", node);
        if (!res)
                return -1;
        int r = 1;
        if (PQntuples(res) > 0)
                r = job_read(res, 0, out) < 0
                        ? (cove_job_row_clear(out),
                           cove_err_set(err, 0, "catalog: claim: bad stored job"))
                        : 0;
        PQclear(res);
        if (r == 1) {
                int live = lease_live(c, node, epoch, err);
                if (live < 0)
                        return -1;
                if (!live)
                        return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                             "catalog: claim: node %s epoch %lld holds no live "
                                             "lease",
                                             node, (long long)epoch);
        }
        return r;
}

static int pg_job_get(struct cove_catalog *c, int64_t job_id, struct cove_job_row *out,
                      struct cove_err *err)
{
        struct params p = {0};
        p_int(&p, job_id);
        PGresult *res = run1(c, "SELECT " JOB_COLS " FROM jobs WHERE id = $1", &p, err,
                             "get job %lld", (long long)job_id);
        if (!res)
                return -1;
        int r = 1;
        if (PQntuples(res) > 0)
                r = job_read(res, 0, out) < 0
                        ? (cove_job_row_clear(out),
                           cove_err_set(err, 0, "catalog: job %lld: bad row", (long long)job_id))
                        : 0;
        PQclear(res);
        return r;
}

static int pg_job_finish(struct cove_catalog *c, int64_t job_id, const char *node, int64_t epoch,
                         int64_t generation, int ok, const char *result_json, struct cove_err *err)
{
        struct params p = {0};
        p_int(&p, job_id);
        p_text(&p, node);
        p_int(&p, epoch);
        p_int(&p, generation);
        p_text(&p, ok ? "done" : "failed");
        p_text(&p, result_json);
        char idtxt[24];
        snprintf(idtxt, sizeof(idtxt), "%lld", (long long)job_id);
        int r = delete1(c,
                        "UPDATE jobs SET state = $5, result_json = $6, updated_at = " NOW_MS
                        " WHERE id = $1 AND claimed_by = $2 AND claimed_epoch = $3"
                        " AND generation = $4 AND (state = 'claimed' OR (state = $5"
                        " AND result_json IS NOT DISTINCT FROM $6::text))"
                        " AND EXISTS (SELECT 1 FROM placements p WHERE p.sandbox_id ="
                        " jobs.sandbox_id AND p.generation = jobs.generation AND p.node = $2)"
                        " AND EXISTS (SELECT 1 FROM nodes WHERE name = $2 AND epoch = $3"
                        " AND lease_expires_at > " NOW_MS ")",
                        &p, err, "finish job", idtxt);
        if (r == 0) { /* wake the replica waiting for it (a hint: it polls too) */
                struct params q = {0};
                struct cove_err ne;
                p_text(&q, idtxt);
                PGresult *nr =
                    run1(c, "SELECT pg_notify('" DONE_CHANNEL "', $1)", &q, &ne, "notify");
                if (nr)
                        PQclear(nr);
        }
        if (r != 1)
                return r;
        struct cove_job_row j;
        int g = pg_job_get(c, job_id, &j, err);
        if (g < 0)
                return -1;
        if (g == 1)
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "catalog: no job %lld",
                                     (long long)job_id);
        cove_job_row_clear(&j);
        return cove_err_setk(err, COVE_E_CONFLICT, 0,
                             "catalog: finish job %lld: node %s epoch %lld generation %lld is "
                             "stale (or the job is not claimed by it)",
                             (long long)job_id, node, (long long)epoch, (long long)generation);
}

/* listen_mu held: a listening connection, or -1. *fresh = 1 when it was just (re)made. */
static int listen_ensure(struct cove_catalog *c, int *fresh, struct cove_err *err)
{
        *fresh = 0;
        if (c->listen && PQstatus(c->listen) == CONNECTION_OK)
                return 0;
        PQfinish(c->listen);
        c->listen = pg_connect(c, err);
        if (!c->listen)
                return -1;
        if (exec_ok(c->listen, "LISTEN " NOTIFY_CHANNEL "; LISTEN " DONE_CHANNEL, err,
                    "listen for jobs") < 0) {
                PQfinish(c->listen);
                c->listen = NULL;
                return -1;
        }
        *fresh = 1;
        return 0;
}

static int pg_job_counts(struct cove_catalog *c, const char *kinds, cove_count_cb cb, void *arg,
                         struct cove_err *err)
{
        char filter[260];
        if (cove__kinds_filter(kinds, filter, sizeof(filter)) < 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "catalog: job kinds too long");
        struct params p = {0};
        p_text(&p, filter);
        PGresult *res = run1(c,
                             "SELECT p.node, count(*) FROM jobs j JOIN placements p"
                             " ON p.sandbox_id = j.sandbox_id AND p.generation = j.generation"
                             " WHERE j.state IN ('queued', 'claimed')"
                             " AND strpos($1, ',' || j.kind || ',') > 0"
                             " GROUP BY p.node ORDER BY p.node",
                             &p, err, "count jobs");
        if (!res)
                return -1;
        int r = 0;
        for (int i = 0; i < PQntuples(res); i++) {
                char name[64];
                if (get_copy(res, i, 0, name, sizeof(name)) < 0) {
                        r = cove_err_set(err, 0, "catalog: count jobs: node name too long");
                        break;
                }
                if (cb(name, get_i64(res, i, 1), arg) < 0)
                        break;
        }
        PQclear(res);
        return r;
}

static int pg_wait_wakeup(struct cove_catalog *c, const char *node, int timeout_ms,
                          struct cove_err *err)
{
        pthread_mutex_lock(&c->listen_mu);
        int fresh, r;
        if (listen_ensure(c, &fresh, err) < 0) {
                pthread_mutex_unlock(&c->listen_mu);
                return -1;
        }
        /* a reconnect may have missed notifications sent while the link was down */
        if (fresh && c->listened) {
                pthread_mutex_unlock(&c->listen_mu);
                return 0;
        }
        c->listened = 1;
        int64_t until = cove_mono_ns() + (int64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000;
        for (;;) {
                if (!PQconsumeInput(c->listen)) {
                        r = cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                          "catalog: wait for jobs: PostgreSQL connection lost "
                                          "(%s); the next call reconnects",
                                          PQerrorMessage(c->listen));
                        PQfinish(c->listen);
                        c->listen = NULL;
                        break;
                }
                PGnotify *nt;
                int woken = 0;
                while ((nt = PQnotifies(c->listen)) != NULL) {
                        /* node NULL: any placement or finished job; else the node's work */
                        if (!node || (!strcmp(nt->relname, NOTIFY_CHANNEL) &&
                                      (!nt->extra || !nt->extra[0] || !strcmp(nt->extra, node))))
                                woken = 1;
                        PQfreemem(nt);
                }
                if (woken) {
                        r = 0;
                        break;
                }
                int64_t left = (until - cove_mono_ns()) / 1000000;
                if (left <= 0) {
                        r = 1;
                        break;
                }
                struct pollfd pfd = {.fd = PQsocket(c->listen), .events = POLLIN};
                if (poll(&pfd, 1, left > 60000 ? 60000 : (int)left) < 0 && errno != EINTR) {
                        r = cove_err_set(err, errno, "catalog: wait for jobs");
                        break;
                }
        }
        pthread_mutex_unlock(&c->listen_mu);
        return r;
}

const struct cove_catalog_ops cove_catalog_pg = {
    .name = "postgres",
    .open = pg_open,
    .close = pg_close,
    .schema_version = pg_schema_version,
    .tenant_put = pg_tenant_put,
    .tenant_get = pg_tenant_get,
    .tenant_list = pg_tenant_list,
    .apikey_list = pg_apikey_list,
    .apikey_put = pg_apikey_put,
    .apikey_get = pg_apikey_get,
    .apikey_count = pg_apikey_count,
    .sandbox_insert = pg_sandbox_insert,
    .sandbox_update = pg_sandbox_update,
    .sandbox_get = pg_sandbox_get,
    .sandbox_list = pg_sandbox_list,
    .sandbox_delete = pg_sandbox_delete,
    .snapshot_insert = pg_snapshot_insert,
    .snapshot_get = pg_snapshot_get,
    .snapshot_list = pg_snapshot_list,
    .snapshot_delete = pg_snapshot_delete,
    .audit_append = pg_audit_append,
    .keyrec_get = pg_keyrec_get,
    .keyrec_put = pg_keyrec_put,
    .audit_last = pg_audit_last,
    .audit_list = pg_audit_list,
    .egress_put = pg_egress_put,
    .egress_get = pg_egress_get,
    .egress_delete = pg_egress_delete,
    .doc_put = pg_doc_put,
    .doc_get = pg_doc_get,
    .doc_list = pg_doc_list,
    .doc_delete = pg_doc_delete,
    .node_lease_acquire = pg_node_lease_acquire,
    .node_lease_renew = pg_node_lease_renew,
    .node_set_state = pg_node_set_state,
    .node_list = pg_node_list,
    .placement_write = pg_placement_write,
    .placement_get = pg_placement_get,
    .placement_observe = pg_placement_observe,
    .sandbox_update_fenced = pg_sandbox_update_fenced,
    .job_claim = pg_job_claim,
    .job_finish = pg_job_finish,
    .job_get = pg_job_get,
    .wait_wakeup = pg_wait_wakeup,
    .job_counts = pg_job_counts,
};
