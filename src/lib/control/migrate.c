/* coved migrate: a single-node data dir into a cluster's catalog and store (migrate.h). */
#include "control/migrate.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "control/tenant.h"
#include "crypto/keys.h"
#include "store/catalog.h"
#include "store/chunkstore.h"
#include "util/cleanup.h"
#include "util/util.h"

#define OBJECT_MAX ((size_t)1 << 30) /* the largest object the store writes is far smaller */
#define AUDIT_BATCH 1000
#define UPLOADERS 8

/* A POSIX record lock on <data_dir>/coved.lock: held by the process (not by children it
 * forks, which a crash may leave behind), released when it exits, even by SIGKILL. coved
 * takes it for writing; a migration for reading (it creates nothing in the data dir). */
int coved_data_dir_lock(const char *data_dir, int coved, struct cove_err *err)
{
        char path[PATH_MAX + 16];
        snprintf(path, sizeof(path), "%s/coved.lock", data_dir);
        int fd = coved ? open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600)
                       : open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0 && !coved && errno == ENOENT)
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "%s: none", path);
        if (fd < 0)
                return cove_err_set(err, errno, "lock %s", path);
        struct flock fl = {.l_type = coved ? F_WRLCK : F_RDLCK, .l_whence = SEEK_SET};
        if (fcntl(fd, F_SETLK, &fl) < 0) {
                int e = errno;
                close(fd);
                if (e == EAGAIN || e == EACCES)
                        return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                             "data dir %s is in use by a running %s: stop it "
                                             "first",
                                             data_dir, coved ? "coved or migration" : "coved");
                return cove_err_set(err, e, "lock %s", path);
        }
        return fd;
}

struct mig {
        const struct coved_migrate_options *o;
        struct coved_migrate_stats *st;
        const struct cove_catalog_ops *src_ops, *dst_ops;
        struct cove_catalog *src, *dst;
        struct cove_chunkstore *src_cs, *dst_cs;
        char keys_from[PATH_MAX + 8], keys_to[PATH_MAX + 24];
        struct cove_err *err;
        int failed;
        const char *doc_kind; /* mig_docs → doc_cb */
};

static void say(struct mig *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(struct mig *m, const char *fmt, ...)
{
        if (!m->o->say)
                return;
        char line[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(line, sizeof(line), fmt, ap);
        va_end(ap);
        m->o->say(m->o->arg, line);
}

/* ---- the source catalog, read from a private copy ---- */

static int copy_file(const char *from, const char *to, struct cove_err *err)
{
        cleanup_close int in = open(from, O_RDONLY | O_CLOEXEC);
        if (in < 0)
                return errno == ENOENT ? 1 : cove_err_set(err, errno, "read %s", from);
        cleanup_close int out = open(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (out < 0)
                return cove_err_set(err, errno, "create %s", to);
        char buf[1 << 16];
        for (;;) {
                ssize_t n = read(in, buf, sizeof(buf));
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return cove_err_set(err, errno, "read %s", from);
                if (n == 0)
                        return 0;
                for (ssize_t o = 0; o < n;) {
                        ssize_t w = write(out, buf + o, (size_t)(n - o));
                        if (w < 0 && errno == EINTR)
                                continue;
                        if (w < 0)
                                return cove_err_set(err, errno, "write %s", to);
                        o += w;
                }
        }
}

/* ---- key records ---- */

static int mig_keys(struct mig *m)
{
        cleanup_dir DIR *dh = opendir(m->keys_from);
        if (!dh)
                return errno == ENOENT ? 0 : cove_err_set(m->err, errno, "%s", m->keys_from);
        struct dirent *de;
        while ((de = readdir(dh))) {
                size_t n = strlen(de->d_name);
                char tenant[COVE_TENANT_MAX + 1];
                if (n > 4 && !strcmp(de->d_name + n - 4, ".dek") && n - 4 <= COVE_TENANT_MAX) {
                        snprintf(tenant, sizeof(tenant), "%.*s", (int)(n - 4), de->d_name);
                        char rec[PATH_MAX];
                        snprintf(rec, sizeof(rec), "%s/%s.key", m->keys_from, tenant);
                        if (access(rec, F_OK) != 0)
                                return cove_err_setk(m->err, COVE_E_BAD_REQUEST, 0,
                                                     "tenant %s still has a plain data key "
                                                     "(%s) from an older coved: start coved "
                                                     "on the data dir once (it wraps it), stop "
                                                     "it, then migrate",
                                                     tenant, de->d_name);
                        continue;
                }
                if (n <= 4 || strcmp(de->d_name + n - 4, ".key") || n - 4 > COVE_TENANT_MAX)
                        continue;
                snprintf(tenant, sizeof(tenant), "%.*s", (int)(n - 4), de->d_name);
                if (!cove_tenant_name_valid(tenant))
                        continue;
                int how = 0;
                int r = cove_key_import(m->keys_from, m->keys_to, tenant, &how, m->err);
                if (r < 0)
                        return -1;
                if (r == 1)
                        continue;
                if (how == 2) {
                        m->st->keys.already++;
                } else {
                        m->st->keys.copied++;
                        m->st->keys_rewrapped += how == 1;
                }
        }
        return 0;
}

/* ---- the store's objects ---- */

struct names {
        char **v;
        size_t n, cap;
};

static int names_cb(const char *name, uint64_t size, int64_t mtime_ms, void *arg)
{
        (void)size;
        (void)mtime_ms;
        struct names *l = arg;
        if (l->n == l->cap) {
                size_t nc = l->cap ? 2 * l->cap : 256;
                char **nv = realloc(l->v, nc * sizeof(*nv));
                if (!nv)
                        return -1;
                l->v = nv;
                l->cap = nc;
        }
        return (l->v[l->n] = strdup(name)) ? (int)(l->n++, 0) : -1;
}

static void names_free(struct names *l)
{
        for (size_t i = 0; i < l->n; i++)
                free(l->v[i]);
        free(l->v);
}

/* chunks first, then manifests: a manifest never names a chunk the store lacks */
static int chunks_first(const void *a, const void *b)
{
        const char *x = *(char *const *)a, *y = *(char *const *)b;
        int cx = strstr(x, "/chunks/") != NULL, cy = strstr(y, "/chunks/") != NULL;
        return cx != cy ? cy - cx : strcmp(x, y);
}

static void sha256(const void *p, size_t n, uint8_t out[32])
{
        unsigned int l = 0;
        EVP_Digest(p, n, out, &l, EVP_sha256(), NULL);
}

struct upload {
        struct mig *m;
        char **names;
        size_t n, next; /* next: taken with __atomic */
        pthread_mutex_t mu;
        int failed;
        struct cove_err err; /* the first failure */
};

static int put_verified(struct mig *m, const char *name, struct cove_err *err);

static void *upload_main(void *arg)
{
        struct upload *u = arg;
        for (;;) {
                size_t i = __atomic_fetch_add(&u->next, 1, __ATOMIC_RELAXED);
                if (i >= u->n || __atomic_load_n(&u->failed, __ATOMIC_RELAXED))
                        return NULL;
                struct cove_err e = {0};
                if (put_verified(u->m, u->names[i], &e) < 0) {
                        pthread_mutex_lock(&u->mu);
                        if (!u->failed)
                                u->err = e;
                        u->failed = 1;
                        pthread_mutex_unlock(&u->mu);
                }
        }
}

/* Upload names[0..n) with a few requests in flight (an S3 request is mostly waiting). */
static int upload_all(struct mig *m, char **names, size_t n)
{
        struct upload u = {.m = m, .names = names, .n = n};
        pthread_mutex_init(&u.mu, NULL);
        pthread_t th[UPLOADERS];
        int started = 0;
        for (; started < UPLOADERS && (size_t)started < n; started++)
                if (pthread_create(&th[started], NULL, upload_main, &u) != 0)
                        break;
        if (started == 0 && n)
                upload_main(&u);
        for (int i = 0; i < started; i++)
                pthread_join(th[i], NULL);
        pthread_mutex_destroy(&u.mu);
        if (u.failed) {
                *m->err = u.err;
                return -1;
        }
        return 0;
}

static int put_verified(struct mig *m, const char *name, struct cove_err *err)
{
        void *data = NULL, *back = NULL;
        size_t len = 0, blen = 0;
        uint8_t h1[32], h2[32];
        if (m->src_cs->ops->get(m->src_cs, name, OBJECT_MAX, &data, &len, err) < 0)
                return cove_err_wrap(err, "read local object %s", name);
        sha256(data, len, h1);
        int r = m->dst_cs->ops->put(m->dst_cs, NULL, name, data, len, err);
        free(data);
        if (r < 0)
                return cove_err_wrap(err, "upload %s", name);
        /* read it back: what the store holds under the name must be these bytes */
        if (m->dst_cs->ops->get(m->dst_cs, name, OBJECT_MAX, &back, &blen, err) < 0)
                return cove_err_wrap(err, "read back %s", name);
        sha256(back, blen, h2);
        free(back);
        if (blen != len || CRYPTO_memcmp(h1, h2, 32))
                return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                     "object %s in the cluster's store differs from the local "
                                     "one (another data dir's, or damaged): nothing of it was "
                                     "replaced",
                                     name);
        if (r == 1) {
                __atomic_fetch_add(&m->st->objects.already, 1, __ATOMIC_RELAXED);
        } else {
                __atomic_fetch_add(&m->st->objects.copied, 1, __ATOMIC_RELAXED);
                __atomic_fetch_add(&m->st->bytes_uploaded, len, __ATOMIC_RELAXED);
        }
        return 0;
}

static int mig_objects(struct mig *m, const char *store_dir)
{
        cleanup_dir DIR *dh = opendir(store_dir);
        if (!dh)
                return errno == ENOENT ? 0 : cove_err_set(m->err, errno, "%s", store_dir);
        struct dirent *de;
        while ((de = readdir(dh))) {
                if (!cove_tenant_name_valid(de->d_name))
                        continue;
                char prefix[COVE_TENANT_MAX + 2];
                snprintf(prefix, sizeof(prefix), "%s/", de->d_name);
                struct names l = {0};
                if (m->src_cs->ops->list(m->src_cs, prefix, names_cb, &l, m->err) < 0) {
                        names_free(&l);
                        return cove_err_wrap(m->err, "list local store %s", prefix);
                }
                if (l.n)
                        qsort(l.v, l.n, sizeof(*l.v), chunks_first);
                /* every chunk has landed before the first manifest goes */
                size_t nchunks = 0;
                while (nchunks < l.n && strstr(l.v[nchunks], "/chunks/"))
                        nchunks++;
                int rc = upload_all(m, l.v, nchunks);
                if (rc == 0)
                        rc = upload_all(m, l.v + nchunks, l.n - nchunks);
                names_free(&l);
                if (rc < 0)
                        return -1;
                say(m, "store: tenant %s: %llu objects so far", de->d_name,
                    (unsigned long long)(m->st->objects.copied + m->st->objects.already));
        }
        return 0;
}

/* ---- catalog rows ---- */

static void count(struct coved_migrate_count *c, int r)
{
        if (r == 1)
                c->already++;
        else
                c->copied++;
}

/* insert-like put: CONFLICT means the row is there (a re-run) */
static int conflict_is_there(struct mig *m, int r)
{
        if (r == 0)
                return 0;
        if (m->err->kind == COVE_E_CONFLICT) {
                cove_err_clear(m->err);
                return 1;
        }
        return -1;
}

struct idl {
        char (*v)[64];
        size_t n, cap;
};

static int idl_add(struct idl *l, const char *id)
{
        for (size_t i = 0; i < l->n; i++)
                if (!strcmp(l->v[i], id))
                        return 0;
        if (l->n == l->cap) {
                size_t nc = l->cap ? 2 * l->cap : 32;
                void *nv = realloc(l->v, nc * sizeof(*l->v));
                if (!nv)
                        return -1;
                l->v = nv;
                l->cap = nc;
        }
        snprintf(l->v[l->n++], 64, "%s", id);
        return 0;
}

static int tenant_id_cb(const struct cove_tenant_row *t, void *arg)
{
        return idl_add(arg, t->id);
}

static int sbx_tenant_cb(const struct cove_sandbox_row *s, void *arg)
{
        return idl_add(arg, s->tenant);
}

static int snap_tenant_cb(const struct cove_snapshot_row *s, void *arg)
{
        return idl_add(arg, s->tenant);
}

struct key_ctx {
        struct mig *m;
        struct idl ids;
};

static int key_id_cb(const struct cove_apikey_row *k, void *arg)
{
        return idl_add(&((struct key_ctx *)arg)->ids, k->id);
}

static int mig_tenants_and_keys(struct mig *m, struct idl *tenants)
{
        if (m->src_ops->tenant_list(m->src, tenant_id_cb, tenants, m->err) < 0 ||
            m->src_ops->sandbox_list(m->src, NULL, NULL, sbx_tenant_cb, tenants, m->err) < 0 ||
            m->src_ops->snapshot_list(m->src, NULL, NULL, snap_tenant_cb, tenants, m->err) < 0)
                return -1;
        for (size_t i = 0; i < tenants->n; i++) {
                struct cove_tenant_row t, have;
                int r = m->src_ops->tenant_get(m->src, tenants->v[i], &t, m->err);
                if (r < 0)
                        return -1;
                if (r == 1)
                        continue;
                r = m->dst_ops->tenant_get(m->dst, t.id, &have, m->err);
                if (r < 0)
                        return -1;
                int same = r == 0 && !strcmp(have.name, t.name) &&
                           have.created_at == t.created_at && have.deleted_at == t.deleted_at &&
                           have.max_sandboxes == t.max_sandboxes && have.max_cpus == t.max_cpus &&
                           have.max_memory_mb == t.max_memory_mb &&
                           have.max_storage_mb == t.max_storage_mb;
                if (!same && m->dst_ops->tenant_put(m->dst, &t, m->err) < 0)
                        return -1;
                count(&m->st->tenants, same);
        }
        for (size_t i = 0; i < tenants->n; i++) {
                struct key_ctx kc = {m, {0}};
                if (m->src_ops->apikey_list(m->src, tenants->v[i], key_id_cb, &kc, m->err) < 0) {
                        free(kc.ids.v);
                        return -1;
                }
                int rc = 0;
                for (size_t k = 0; rc == 0 && k < kc.ids.n; k++) {
                        struct cove_apikey_row row, have;
                        int r = m->src_ops->apikey_get(m->src, kc.ids.v[k], &row, m->err);
                        if (r != 0) {
                                rc = r < 0 ? -1 : 0;
                                continue;
                        }
                        r = m->dst_ops->apikey_get(m->dst, row.id, &have, m->err);
                        int same = r == 0 && !strcmp(have.hash_hex, row.hash_hex) &&
                                   have.admin == row.admin && have.revoked == row.revoked;
                        if (r < 0 || (!same && m->dst_ops->apikey_put(m->dst, &row, m->err) < 0))
                                rc = -1;
                        else
                                count(&m->st->api_keys, same);
                        OPENSSL_cleanse(&row, sizeof(row));
                        OPENSSL_cleanse(&have, sizeof(have));
                }
                free(kc.ids.v);
                if (rc < 0)
                        return -1;
        }
        return 0;
}

static const char *const live_states[] = {"starting", "running", "pausing", "resuming"};

static int sbx_cb(const struct cove_sandbox_row *s, void *arg)
{
        struct mig *m = arg;
        struct cove_sandbox_row row = *s; /* strings borrowed from the source row */
        int live = 0;
        for (size_t i = 0; i < COVE_ARRAY_SIZE(live_states); i++)
                live |= !strcmp(s->state, live_states[i]);
        if (live) {
                struct cove_snapshot_row snap;
                int have =
                    s->last_snapshot_id[0] &&
                    m->src_ops->snapshot_get(m->src, NULL, s->last_snapshot_id, &snap, m->err) == 0;
                cove_err_clear(m->err);
                snprintf(row.state, sizeof(row.state), "%s", have ? "paused" : "stopped");
                row.error = have ? (char *)"paused by the migration to a cluster: it resumes "
                                           "from its last snapshot"
                                 : (char *)"stopped by the migration to a cluster: it had no "
                                           "snapshot to resume from";
                if (!have)
                        row.last_snapshot_id[0] = '\0';
        }
        struct cove_sandbox_row have;
        memset(&have, 0, sizeof(have));
        int r = m->dst_ops->sandbox_get(m->dst, NULL, s->id, &have, m->err);
        cove_sandbox_row_clear(&have);
        if (r < 0)
                goto fail;
        if (r == 0) {
                m->st->sandboxes.already++;
        } else if (m->dst_ops->sandbox_insert(m->dst, &row, m->err) < 0) {
                goto fail;
        } else {
                m->st->sandboxes.copied++;
                m->st->paused += live && !strcmp(row.state, "paused");
                m->st->stopped += live && !strcmp(row.state, "stopped");
        }
        char *pol = NULL, *had = NULL;
        r = m->src_ops->egress_get(m->src, s->id, &pol, m->err);
        if (r < 0)
                goto fail;
        if (r == 0) {
                int h = m->dst_ops->egress_get(m->dst, s->id, &had, m->err);
                int same = h == 0 && !strcmp(had, pol);
                if (h < 0 ||
                    (!same && m->dst_ops->egress_put(m->dst, s->id, s->tenant, pol, m->err) < 0)) {
                        free(pol);
                        free(had);
                        goto fail;
                }
                count(&m->st->policies, same);
        }
        free(pol);
        free(had);
        return 0;
fail:
        cove_err_wrap(m->err, "sandbox %s", s->id);
        m->failed = 1;
        return -1;
}

static int snap_cb(const struct cove_snapshot_row *s, void *arg)
{
        struct mig *m = arg;
        /* its manifest is in the cluster's store before its row is (listed = restorable) */
        char man[160];
        snprintf(man, sizeof(man), "%s/manifests/%s", s->tenant, s->id);
        int h = m->dst_cs->ops->has(m->dst_cs, man, m->err);
        if (h <= 0) {
                if (h == 0)
                        cove_err_setk(m->err, COVE_E_NOT_FOUND, 0,
                                      "snapshot %s: its manifest is not in the local store "
                                      "(nothing to restore it from): not copied",
                                      s->id);
                m->failed = 1;
                return -1;
        }
        int r = conflict_is_there(m, m->dst_ops->snapshot_insert(m->dst, s, m->err));
        if (r < 0) {
                cove_err_wrap(m->err, "snapshot %s", s->id);
                m->failed = 1;
                return -1;
        }
        count(&m->st->snapshots, r);
        return 0;
}

static const char *const doc_kinds[] = {"secret", "lease", "port"};

static int doc_cb(const char *tenant, const char *key, const char *owner, const char *json,
                  void *arg)
{
        struct mig *m = arg;
        const char *kind = m->doc_kind;
        char *had = NULL;
        int h = m->dst_ops->doc_get(m->dst, kind, tenant, key, &had, m->err);
        int same = h == 0 && !strcmp(had, json);
        free(had);
        if (h < 0 ||
            (!same && m->dst_ops->doc_put(m->dst, kind, tenant, key, owner, json, m->err) < 0)) {
                m->failed = 1;
                return -1;
        }
        count(&m->st->docs, same);
        return 0;
}

static int mig_docs(struct mig *m)
{
        for (size_t i = 0; i < COVE_ARRAY_SIZE(doc_kinds); i++) {
                m->doc_kind = doc_kinds[i];
                if (m->src_ops->doc_list(m->src, doc_kinds[i], NULL, NULL, doc_cb, m, m->err) < 0 ||
                    m->failed)
                        return cove_err_wrap(m->err, "egress documents (%s)", doc_kinds[i]);
        }
        return 0;
}

struct audit_rows {
        struct cove_audit_row *v;
        size_t n, cap;
};

static int audit_cb(const struct cove_audit_row *r, void *arg)
{
        struct audit_rows *l = arg;
        if (l->n == l->cap) {
                size_t nc = l->cap ? 2 * l->cap : 1024;
                void *nv = realloc(l->v, nc * sizeof(*l->v));
                if (!nv)
                        return -1;
                l->v = nv;
                l->cap = nc;
        }
        l->v[l->n] = *r;
        if (!(l->v[l->n].detail_json = strdup(r->detail_json ? r->detail_json : "{}")))
                return -1;
        l->n++;
        return 0;
}

static int head_cb(const struct cove_audit_row *r, void *arg)
{
        snprintf(arg, 65, "%s", r->hash);
        return -1; /* one */
}

/* The events as they are (seq, hashes): onto an empty log, or after the prefix of them
 * an earlier run copied. A cluster log that is not such a prefix is refused: one chain
 * cannot hold two histories with their hashes unchanged. */
static int mig_audit(struct mig *m)
{
        struct audit_rows l = {0};
        int rc = m->src_ops->audit_list(m->src, NULL, NULL, NULL, 0, 0, 0, audit_cb, &l, m->err);
        int64_t last = 0;
        char hash[65] = "";
        if (rc == 0) {
                int r = m->dst_ops->audit_last(m->dst, &last, hash, m->err);
                rc = r < 0 ? -1 : 0;
                if (r == 1)
                        last = 0;
        }
        if (rc == 0 && last > 0) {
                char want[65] = "";
                for (size_t i = 0; i < l.n; i++)
                        if (l.v[i].seq == last)
                                snprintf(want, sizeof(want), "%s", l.v[i].hash);
                if (!want[0] || strcmp(want, hash)) {
                        /* the cluster's newest is not ours: was ours written before it? */
                        rc = cove_err_setk(m->err, COVE_E_CONFLICT, 0,
                                           "the cluster's audit log already holds %lld events "
                                           "that are not this data dir's: migrate into a new "
                                           "cluster database (the chain keeps its hashes)",
                                           (long long)last);
                } else {
                        /* check the first one too: a chain is only ours if it starts as ours */
                        char first[65] = "";
                        int r = m->dst_ops->audit_list(m->dst, NULL, NULL, NULL, 0, 0, 1, head_cb,
                                                       first, m->err);
                        if (r < 0 || (l.n && strcmp(first, l.v[0].hash)))
                                rc = r < 0 ? -1
                                           : cove_err_setk(m->err, COVE_E_CONFLICT, 0,
                                                           "the cluster's audit log starts with "
                                                           "another history");
                }
        }
        size_t from = 0;
        while (from < l.n && l.v[from].seq <= last)
                from++;
        m->st->audit.already = from;
        for (size_t i = from; rc == 0 && i < l.n; i += AUDIT_BATCH) {
                size_t k = l.n - i < AUDIT_BATCH ? l.n - i : AUDIT_BATCH;
                rc = m->dst_ops->audit_append(m->dst, l.v + i, k, m->err);
                if (rc == 0)
                        m->st->audit.copied += k;
        }
        for (size_t i = 0; i < l.n; i++)
                free(l.v[i].detail_json);
        free(l.v);
        return rc < 0 ? cove_err_wrap(m->err, "audit events") : 0;
}

/* ---- the whole run ---- */

int coved_migrate(const struct coved_migrate_options *o, struct coved_migrate_stats *st,
                  struct cove_err *err)
{
        memset(st, 0, sizeof(*st));
        if (!o->data_dir || !o->db || !o->store_url || !o->s3_endpoint)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "migrate needs --data-dir, --db postgres://…, --store "
                                     "s3://BUCKET and --s3-endpoint URL");
        if (cove_catalog_for(o->db) != &cove_catalog_pg)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "--db must be a postgres:// URL (the cluster's catalog)");
        struct mig m = {.o = o, .st = st, .err = err};
        char dir[PATH_MAX], cat_path[PATH_MAX + 16], tmp[] = "/tmp/cove-migrate-XXXXXX";
        if (!realpath(o->data_dir, dir))
                return cove_err_set(err, errno, "data dir %s", o->data_dir);
        snprintf(cat_path, sizeof(cat_path), "%s/catalog.db", dir);
        if (access(cat_path, R_OK) != 0)
                return cove_err_set(err, errno, "%s (not a coved data dir?)", cat_path);
        /* no lock file: no coved of this version ever ran there (an older one holds none) */
        int lock = coved_data_dir_lock(dir, 0, err);
        if (lock < 0 && err->kind != COVE_E_NOT_FOUND)
                return -1;
        cove_err_clear(err);
        int rc = 0, tmp_made = 0, attached = 0;
        if (!mkdtemp(tmp)) {
                rc = cove_err_set(err, errno, "temp dir");
                goto out;
        }
        tmp_made = 1;
        /* the catalog from a copy (opening it may migrate its schema or write its WAL) */
        static const char *const parts[] = {"catalog.db", "catalog.db-wal"};
        for (size_t i = 0; rc == 0 && i < COVE_ARRAY_SIZE(parts); i++) {
                char from[PATH_MAX + 32], to[64];
                snprintf(from, sizeof(from), "%s/%s", dir, parts[i]);
                snprintf(to, sizeof(to), "%s/%s", tmp, parts[i]);
                rc = copy_file(from, to, err) < 0 ? -1 : 0;
        }
        char copy[64];
        snprintf(copy, sizeof(copy), "%s/catalog.db", tmp);
        if (rc == 0) {
                m.src_ops = &cove_catalog_sqlite;
                if (!(m.src = m.src_ops->open(copy, err)))
                        rc = cove_err_wrap(err, "catalog %s", cat_path);
        }
        char shown[512];
        cove_catalog_dsn_redact(o->db, shown, sizeof(shown));
        if (rc == 0) {
                m.dst_ops = &cove_catalog_pg;
                if (!(m.dst = m.dst_ops->open(o->db, err)))
                        rc = cove_err_wrap(err, "cluster catalog %s", shown);
        }
        char store_dir[PATH_MAX + 8];
        snprintf(store_dir, sizeof(store_dir), "%s/store", dir);
        struct stat sb;
        if (rc == 0) {
                if (stat(store_dir, &sb) == 0) {
                        m.src_cs = cove_chunkstore_fs_open(store_dir, NULL, err);
                        if (!m.src_cs)
                                rc = -1;
                }
                struct cove_s3_opts so = {.url = o->store_url,
                                          .endpoint = o->s3_endpoint,
                                          .timeout_ms =
                                              o->s3_timeout_s > 0 ? o->s3_timeout_s * 1000 : 0};
                if (rc == 0 && !(m.dst_cs = cove_chunkstore_s3_open(&so, err)))
                        rc = cove_err_wrap(err, "cluster store %s", o->store_url);
        }
        /* key records: read from the files, written to the cluster's catalog */
        snprintf(m.keys_from, sizeof(m.keys_from), "%s/keys", dir);
        snprintf(m.keys_to, sizeof(m.keys_to), "%s/keys/.cluster", dir);
        char kek[PATH_MAX + 16];
        snprintf(kek, sizeof(kek), "%s/node.kek", m.keys_from);
        struct coved_keys_cat kc = {m.dst_ops, m.dst};
        if (rc == 0) {
                const char *k = o->default_kek_file ? o->default_kek_file : kek;
                if (!o->default_kek_file && access(kek, F_OK) != 0)
                        k = NULL; /* no tenant ever used the node key: none to re-wrap */
                rc = cove_keys_attach(m.keys_to, &coved_keys_catalog_ops, &kc, k ? k : "", err);
                attached = rc == 0;
        }
        if (rc == 0) {
                say(&m, "from %s to %s and %s", dir, shown, o->store_url);
                rc = mig_keys(&m);
        }
        if (rc == 0) {
                say(&m,
                    "keys: %llu copied (%llu wrapped again under the default key), %llu "
                    "already there",
                    (unsigned long long)st->keys.copied, (unsigned long long)st->keys_rewrapped,
                    (unsigned long long)st->keys.already);
                if (m.src_cs)
                        rc = mig_objects(&m, store_dir);
        }
        struct idl tenants = {0};
        if (rc == 0)
                rc = mig_tenants_and_keys(&m, &tenants);
        free(tenants.v);
        if (rc == 0 &&
            (m.src_ops->sandbox_list(m.src, NULL, NULL, sbx_cb, &m, err) < 0 || m.failed))
                rc = -1;
        if (rc == 0 &&
            (m.src_ops->snapshot_list(m.src, NULL, NULL, snap_cb, &m, err) < 0 || m.failed))
                rc = -1;
        if (rc == 0)
                rc = mig_docs(&m);
        if (rc == 0)
                rc = mig_audit(&m);
out:
        if (attached)
                cove_keys_detach(m.keys_to);
        cove_keys_cache_clear();
        if (m.dst_cs)
                m.dst_cs->ops->close(m.dst_cs);
        if (m.src_cs)
                m.src_cs->ops->close(m.src_cs);
        if (m.dst)
                m.dst_ops->close(m.dst);
        if (m.src)
                m.src_ops->close(m.src);
        if (tmp_made) {
                char p[96];
                static const char *const junk[] = {"catalog.db", "catalog.db-wal", "catalog.db-shm",
                                                   "catalog.db-journal"};
                for (size_t i = 0; i < COVE_ARRAY_SIZE(junk); i++) {
                        snprintf(p, sizeof(p), "%s/%s", tmp, junk[i]);
                        unlink(p);
                }
                rmdir(tmp);
        }
        if (lock >= 0)
                close(lock);
        return rc < 0 ? cove_err_wrap(err, "migrate %s", dir) : 0;
}
