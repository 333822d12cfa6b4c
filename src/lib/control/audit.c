/* Audit log: queue, writer thread, hash chain and verification; see audit.h. */
#include "control/audit.h"

#include <errno.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/util.h"

#define BATCH_MAX 512
/* The writer lets a burst share one transaction: after the first event of a batch it waits
 * this long (less when BATCH_MAX are queued, a flush waits, or the log closes). Events sit
 * in memory meanwhile, as they already did while a transaction ran; the proxy thread that
 * queues them is woken for nothing and pays one wake-up per batch, not per event. */
#define LINGER_MS 10
#define ZERO_HASH "0000000000000000000000000000000000000000000000000000000000000000"

struct qev {
        struct qev *next;
        struct cove_audit_row row; /* seq, hashes filled by the writer */
};

struct cove_audit {
        const struct cove_catalog_ops *ops;
        struct cove_catalog *cat;
        const struct cove_log *log;
        pthread_mutex_t mu;
        pthread_cond_t cv, done_cv;
        struct qev *head, *tail;
        size_t queued;
        uint64_t enq, written; /* events queued / handled (stored or dropped) so far */
        uint64_t dropped;
        int quit;
        int flushing; /* callers waiting in cove_audit_flush */
        pthread_t thread;
        int64_t seq; /* chain head (writer thread only) */
        char hash[65];
};

void cove_audit_hash(const struct cove_audit_row *r, const char *prev_hash, char out[65])
{
        json_t *o = json_pack("{s:I, s:I, s:s, s:s, s:s, s:s, s:s, s:s}", "seq", (json_int_t)r->seq,
                              "at", (json_int_t)r->at, "tenant", r->tenant, "sandbox", r->sandbox,
                              "kind", r->kind, "action", r->action, "verdict", r->verdict, "detail",
                              r->detail_json ? r->detail_json : "{}");
        char *canon = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        json_decref(o);
        unsigned char md[32];
        unsigned mdl = 0;
        EVP_MD_CTX *ctx = EVP_MD_CTX_new();
        EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
        EVP_DigestUpdate(ctx, prev_hash, strlen(prev_hash));
        EVP_DigestUpdate(ctx, "\n", 1);
        if (canon)
                EVP_DigestUpdate(ctx, canon, strlen(canon));
        EVP_DigestFinal_ex(ctx, md, &mdl);
        EVP_MD_CTX_free(ctx);
        free(canon);
        cove_hex(md, 32, out);
}

json_t *cove_audit_json(const struct cove_audit_row *r)
{
        char at[40];
        cove_rfc3339(r->at, at, sizeof(at));
        json_error_t je;
        json_t *d = json_loads(r->detail_json ? r->detail_json : "{}", 0, &je);
        return json_pack("{s:I, s:s, s:I, s:s, s:o, s:s, s:s, s:s, s:o, s:s, s:s}", "seq",
                         (json_int_t)r->seq, "at", at, "at_ms", (json_int_t)r->at, "tenant",
                         r->tenant, "sandbox",
                         r->sandbox[0] ? json_string(r->sandbox) : json_null(), "kind", r->kind,
                         "action", r->action, "verdict", r->verdict, "detail",
                         d ? d : json_object(), "prev_hash", r->prev_hash, "hash", r->hash);
}

static void free_batch(struct qev *q)
{
        while (q) {
                struct qev *n = q->next;
                free(q->row.detail_json);
                free(q);
                q = n;
        }
}

/* Chain the batch onto the head (seq, hash) and append it. Another writer (a second coved
 * on the same PostgreSQL catalog, or a second handle on the same SQLite file) may have
 * moved the head since this one read it: the catalog refuses the batch with CONFLICT,
 * and the batch is re-chained onto the head read again and retried. Only other failures
 * (or a head that keeps moving) drop the batch. */
#define APPEND_TRIES 16

static void write_batch(struct cove_audit *a, struct qev *batch, size_t n)
{
        struct cove_audit_row *rows = calloc(n, sizeof(*rows));
        if (!rows) {
                __atomic_fetch_add(&a->dropped, n, __ATOMIC_RELAXED);
                return;
        }
        struct cove_err err = {0};
        for (int attempt = 0; attempt < APPEND_TRIES; attempt++) {
                int64_t seq = a->seq;
                char prev[65];
                snprintf(prev, sizeof(prev), "%s", a->hash);
                size_t i = 0;
                for (struct qev *q = batch; q; q = q->next, i++) {
                        q->row.seq = ++seq;
                        snprintf(q->row.prev_hash, sizeof(q->row.prev_hash), "%s", prev);
                        cove_audit_hash(&q->row, prev, q->row.hash);
                        snprintf(prev, sizeof(prev), "%s", q->row.hash);
                        rows[i] = q->row;
                }
                if (a->ops->audit_append(a->cat, rows, n, &err) == 0) {
                        a->seq = seq;
                        snprintf(a->hash, sizeof(a->hash), "%s", prev);
                        free(rows);
                        return;
                }
                /* another writer may have moved the head: read it again */
                int64_t s;
                char h[65];
                struct cove_err e2;
                int r = a->ops->audit_last(a->cat, &s, h, &e2);
                if (r == 0) {
                        a->seq = s;
                        snprintf(a->hash, sizeof(a->hash), "%s", h);
                } else if (r == 1) {
                        a->seq = 0;
                        snprintf(a->hash, sizeof(a->hash), ZERO_HASH);
                }
                if (err.kind != COVE_E_CONFLICT || r < 0)
                        break;
                /* many writers (nodes, replicas) racing for the head: back off with jitter
                 * so one of them does not lose every round (at most ~0.5 s in all) */
                uint8_t j = 0;
                cove_random(&j, 1, NULL);
                usleep((useconds_t)(attempt + 1) * (1000 + (useconds_t)j * 16));
        }
        cove_warn(a->log, "audit", "%zu audit events lost: %s", n, err.msg);
        __atomic_fetch_add(&a->dropped, n, __ATOMIC_RELAXED);
        free(rows);
}

static void *writer_main(void *arg)
{
        struct cove_audit *a = arg;
        pthread_mutex_lock(&a->mu);
        for (;;) {
                while (!a->head && !a->quit)
                        pthread_cond_wait(&a->cv, &a->mu);
                if (!a->head && a->quit)
                        break;
                struct timespec until;
                clock_gettime(CLOCK_MONOTONIC, &until);
                until.tv_nsec += LINGER_MS * 1000000L;
                if (until.tv_nsec >= 1000000000L) {
                        until.tv_sec++;
                        until.tv_nsec -= 1000000000L;
                }
                while (!a->quit && !a->flushing && a->queued < BATCH_MAX &&
                       pthread_cond_timedwait(&a->cv, &a->mu, &until) == 0) {
                }
                struct qev *batch = a->head, *last = a->head;
                size_t n = 1;
                while (last->next && n < BATCH_MAX) {
                        last = last->next;
                        n++;
                }
                a->head = last->next;
                if (!a->head)
                        a->tail = NULL;
                last->next = NULL;
                a->queued -= n;
                pthread_mutex_unlock(&a->mu);
                write_batch(a, batch, n);
                free_batch(batch);
                pthread_mutex_lock(&a->mu);
                a->written += n;
                pthread_cond_broadcast(&a->done_cv);
        }
        pthread_mutex_unlock(&a->mu);
        return NULL;
}

struct cove_audit *cove_audit_open(const struct cove_catalog_ops *ops, struct cove_catalog *cat,
                                   const struct cove_log *log, struct cove_err *err)
{
        struct cove_audit *a = calloc(1, sizeof(*a));
        if (!a) {
                cove_err_set(err, ENOMEM, "audit");
                return NULL;
        }
        a->ops = ops;
        a->cat = cat;
        a->log = log;
        snprintf(a->hash, sizeof(a->hash), ZERO_HASH);
        int r = ops->audit_last(cat, &a->seq, a->hash, err);
        if (r < 0) {
                free(a);
                return NULL;
        }
        if (r == 1) {
                a->seq = 0;
                snprintf(a->hash, sizeof(a->hash), ZERO_HASH);
        }
        pthread_mutex_init(&a->mu, NULL);
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&a->cv, &ca);
        pthread_condattr_destroy(&ca);
        pthread_cond_init(&a->done_cv, NULL);
        int e = pthread_create(&a->thread, NULL, writer_main, a);
        if (e) {
                free(a);
                cove_err_set(err, e, "audit writer thread");
                return NULL;
        }
        return a;
}

void cove_audit_close(struct cove_audit *a)
{
        if (!a)
                return;
        pthread_mutex_lock(&a->mu);
        a->quit = 1;
        pthread_cond_broadcast(&a->cv);
        pthread_mutex_unlock(&a->mu);
        pthread_join(a->thread, NULL);
        free_batch(a->head);
        pthread_mutex_destroy(&a->mu);
        pthread_cond_destroy(&a->cv);
        pthread_cond_destroy(&a->done_cv);
        free(a);
}

void cove_audit_log(struct cove_audit *a, const char *tenant, const char *sandbox, const char *kind,
                    const char *action, const char *verdict, json_t *detail)
{
        if (!a) {
                json_decref(detail);
                return;
        }
        struct qev *q = calloc(1, sizeof(*q));
        if (!detail)
                detail = json_object();
        char *d = json_dumps(detail, JSON_COMPACT | JSON_SORT_KEYS);
        json_decref(detail);
        if (!q || !d) {
                free(q);
                free(d);
                __atomic_fetch_add(&a->dropped, 1, __ATOMIC_RELAXED);
                return;
        }
        q->row.at = cove_now_ms();
        q->row.detail_json = d;
        snprintf(q->row.tenant, sizeof(q->row.tenant), "%s", tenant ? tenant : "");
        snprintf(q->row.sandbox, sizeof(q->row.sandbox), "%s", sandbox ? sandbox : "");
        snprintf(q->row.kind, sizeof(q->row.kind), "%s", kind);
        snprintf(q->row.action, sizeof(q->row.action), "%s", action);
        snprintf(q->row.verdict, sizeof(q->row.verdict), "%s", verdict ? verdict : "");
        pthread_mutex_lock(&a->mu);
        if (a->queued >= COVE_AUDIT_QUEUE_MAX || a->quit) {
                pthread_mutex_unlock(&a->mu);
                free(d);
                free(q);
                __atomic_fetch_add(&a->dropped, 1, __ATOMIC_RELAXED);
                return;
        }
        if (a->tail)
                a->tail->next = q;
        else
                a->head = q;
        a->tail = q;
        a->queued++;
        a->enq++;
        /* the writer waits for a first event, or lingers until BATCH_MAX */
        if (a->queued == 1 || a->queued == BATCH_MAX)
                pthread_cond_signal(&a->cv);
        pthread_mutex_unlock(&a->mu);
}

void cove_audit_flush(struct cove_audit *a)
{
        if (!a)
                return;
        pthread_mutex_lock(&a->mu);
        uint64_t target = a->enq;
        a->flushing++;
        pthread_cond_signal(&a->cv); /* no lingering while someone waits */
        while (a->written < target && !a->quit)
                pthread_cond_wait(&a->done_cv, &a->mu);
        a->flushing--;
        pthread_mutex_unlock(&a->mu);
}

uint64_t cove_audit_dropped(struct cove_audit *a)
{
        return a ? __atomic_load_n(&a->dropped, __ATOMIC_RELAXED) : 0;
}

struct verify_ctx {
        int64_t expect_seq, checked, first_bad;
        char prev[65];
        char *why;
        size_t cap;
};

static int verify_one(const struct cove_audit_row *r, void *arg)
{
        struct verify_ctx *v = arg;
        char h[65];
        if (r->seq != v->expect_seq)
                snprintf(v->why, v->cap, "event %lld follows %lld: an event is missing",
                         (long long)r->seq, (long long)(v->expect_seq - 1));
        else if (strcmp(r->prev_hash, v->prev) != 0)
                snprintf(v->why, v->cap,
                         "event %lld: prev_hash does not match the hash of event %lld",
                         (long long)r->seq, (long long)(r->seq - 1));
        else if (cove_audit_hash(r, v->prev, h), strcmp(h, r->hash) != 0)
                snprintf(v->why, v->cap,
                         "event %lld: its content does not match its hash (changed after it "
                         "was written)",
                         (long long)r->seq);
        else {
                v->checked++;
                v->expect_seq++;
                snprintf(v->prev, sizeof(v->prev), "%s", r->hash);
                return 0;
        }
        v->first_bad = r->seq;
        return -1;
}

int cove_audit_verify(const struct cove_catalog_ops *ops, struct cove_catalog *cat,
                      int64_t *checked, int64_t *first_bad, char *why, size_t cap,
                      struct cove_err *err)
{
        struct verify_ctx v = {.expect_seq = 1, .why = why, .cap = cap};
        snprintf(v.prev, sizeof(v.prev), ZERO_HASH);
        if (cap)
                why[0] = '\0';
        if (ops->audit_list(cat, NULL, NULL, NULL, 0, 0, 0, verify_one, &v, err) < 0)
                return -1;
        *checked = v.checked;
        *first_bad = v.first_bad;
        return 0;
}
