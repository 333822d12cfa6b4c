/* Local cache of immutable objects in front of a remote chunk store (store/chunkstore.h).
 * A file per object at dir/<name>: "CVK1", the body's length (8 bytes, little endian) and
 * SHA-256, then the body. Written to dir/.tmp/ and renamed, never fsynced: after a crash a
 * file is either whole or fails its check and is fetched again. Recency is the file's
 * mtime (set on every hit); eviction sorts by it, oldest first, down to 90 % of the
 * budget. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/chunkstore.h"
#include "util/cleanup.h"
#include "util/util.h"

#define CACHE_HDR 44 /* magic 4 + length 8 + sha256 32 */
#define CACHE_PATH_MAX 4096

struct cache {
        struct cove_chunkstore base;
        struct cove_chunkstore *inner;
        char dir[CACHE_PATH_MAX - 512];
        char match[64];
        uint64_t budget;
        pthread_mutex_t mu; /* bytes, eviction */
        uint64_t bytes;     /* sum of cached file sizes (approximate across processes) */
};

struct cove_cs_batch; /* the inner backend's */

static int cacheable(struct cache *c, const char *name)
{
        return cove_cs_name_valid(name) && (!c->match[0] || strstr(name, c->match));
}

static void path_of(struct cache *c, const char *name, char *out)
{
        snprintf(out, CACHE_PATH_MAX, "%s/%s", c->dir, name);
}

struct ent {
        int64_t mtime_ns;
        uint64_t size;
        char *path;
};

static int scan(const char *dir, int depth, struct ent **v, size_t *n, size_t *cap, uint64_t *total)
{
        if (depth > 8)
                return 0;
        cleanup_dir DIR *d = opendir(dir);
        if (!d)
                return 0;
        struct dirent *de;
        char p[CACHE_PATH_MAX];
        while ((de = readdir(d))) {
                if (de->d_name[0] == '.')
                        continue;
                if ((size_t)snprintf(p, sizeof(p), "%s/%s", dir, de->d_name) >= sizeof(p))
                        continue;
                struct stat st;
                if (lstat(p, &st) < 0)
                        continue;
                if (S_ISDIR(st.st_mode)) {
                        scan(p, depth + 1, v, n, cap, total);
                        continue;
                }
                if (!S_ISREG(st.st_mode))
                        continue;
                *total += (uint64_t)st.st_size;
                if (!v)
                        continue;
                if (*n == *cap) {
                        size_t nc = *cap ? *cap * 2 : 256;
                        struct ent *ne = realloc(*v, nc * sizeof(*ne));
                        if (!ne)
                                return -1;
                        *v = ne;
                        *cap = nc;
                }
                (*v)[*n].mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
                (*v)[*n].size = (uint64_t)st.st_size;
                if (!((*v)[*n].path = strdup(p)))
                        return -1;
                (*n)++;
        }
        return 0;
}

static int by_mtime(const void *a, const void *b)
{
        const struct ent *x = a, *y = b;
        return x->mtime_ns < y->mtime_ns ? -1 : x->mtime_ns > y->mtime_ns;
}

/* Called with c->mu held when bytes passed the budget. */
static void evict_locked(struct cache *c)
{
        struct ent *v = NULL;
        size_t n = 0, cap = 0;
        uint64_t total = 0;
        scan(c->dir, 0, &v, &n, &cap, &total);
        qsort(v, n, sizeof(*v), by_mtime);
        uint64_t goal = c->budget / 10 * 9;
        for (size_t i = 0; i < n; i++) {
                if (total > goal && unlink(v[i].path) == 0)
                        total -= v[i].size;
                free(v[i].path);
        }
        free(v);
        c->bytes = total;
}

static void cache_store(struct cache *c, const char *name, const void *data, size_t len)
{
        if (!cacheable(c, name) || len + CACHE_HDR > c->budget / 4)
                return;
        char dst[CACHE_PATH_MAX], tmp[CACHE_PATH_MAX];
        path_of(c, name, dst);
        uint8_t r[8];
        char rh[17];
        if (cove_random(r, sizeof(r), NULL) < 0)
                return;
        cove_hex(r, sizeof(r), rh);
        snprintf(tmp, sizeof(tmp), "%s/.tmp/%s", c->dir, rh);
        uint8_t hdr[CACHE_HDR];
        memcpy(hdr, "CVK1", 4);
        uint64_t l = len;
        for (int i = 0; i < 8; i++)
                hdr[4 + i] = (uint8_t)(l >> (8 * i));
        unsigned ml = 0;
        EVP_Digest(data, len, hdr + 12, &ml, EVP_sha256(), NULL);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0)
                return;
        int ok = write(fd, hdr, sizeof(hdr)) == (ssize_t)sizeof(hdr) &&
                 cove_sysio_write_all(cove_sysio_get(NULL), fd, data, len) == 0;
        ok = close(fd) == 0 && ok;
        if (ok) {
                char *slash = strrchr(dst, '/');
                *slash = '\0';
                ok = cove_mkdir_p(dst, 0700, NULL) == 0;
                *slash = '/';
        }
        if (!ok || rename(tmp, dst) < 0) {
                unlink(tmp);
                return;
        }
        pthread_mutex_lock(&c->mu);
        c->bytes += len + CACHE_HDR;
        if (c->bytes > c->budget)
                evict_locked(c);
        pthread_mutex_unlock(&c->mu);
}

/* 1 hit (*out filled), 0 miss. A file that fails its check is removed. */
static int cache_load(struct cache *c, const char *name, size_t max, void **out, size_t *len)
{
        char p[CACHE_PATH_MAX];
        path_of(c, name, p);
        cleanup_close int fd = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return 0;
        struct stat st;
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size < CACHE_HDR)
                goto bad;
        size_t n = (size_t)st.st_size - CACHE_HDR;
        if (n > max)
                return 0; /* the caller's bound: let the backend answer (and refuse) */
        uint8_t hdr[CACHE_HDR];
        uint8_t *buf = malloc(n ? n : 1);
        if (!buf)
                return 0;
        if (pread(fd, hdr, CACHE_HDR, 0) != CACHE_HDR || pread(fd, buf, n, CACHE_HDR) != (ssize_t)n)
                goto badbuf;
        uint64_t l = 0;
        for (int i = 0; i < 8; i++)
                l |= (uint64_t)hdr[4 + i] << (8 * i);
        uint8_t md[32];
        unsigned ml = 0;
        EVP_Digest(buf, n, md, &ml, EVP_sha256(), NULL);
        if (memcmp(hdr, "CVK1", 4) || l != n || CRYPTO_memcmp(md, hdr + 12, 32))
                goto badbuf;
        futimens(fd, NULL); /* recently used */
        *out = buf;
        *len = n;
        return 1;
badbuf:
        free(buf);
bad:
        unlink(p);
        return 0;
}

static int c_put(struct cove_chunkstore *cs, struct cove_cs_batch *b, const char *name,
                 const void *data, size_t len, struct cove_err *err)
{
        struct cache *c = (struct cache *)cs;
        int rc = c->inner->ops->put(c->inner, b, name, data, len, err);
        if (rc == 0) /* 1: the store keeps other bytes than ours; they are what a get sees */
                cache_store(c, name, data, len);
        return rc;
}

static int c_get(struct cove_chunkstore *cs, const char *name, size_t max, void **out, size_t *len,
                 struct cove_err *err)
{
        struct cache *c = (struct cache *)cs;
        int ok = cacheable(c, name);
        if (ok && cache_load(c, name, max, out, len))
                return 0;
        if (c->inner->ops->get(c->inner, name, max, out, len, err) < 0)
                return -1;
        if (ok)
                cache_store(c, name, *out, *len);
        return 0;
}

static int c_has(struct cove_chunkstore *cs, const char *name, struct cove_err *err)
{
        struct cache *c = (struct cache *)cs;
        return c->inner->ops->has(c->inner, name, err);
}

static int c_touch(struct cove_chunkstore *cs, const char *name, struct cove_err *err)
{
        struct cache *c = (struct cache *)cs;
        return c->inner->ops->touch(c->inner, name, err);
}

static int c_del(struct cove_chunkstore *cs, const char *name, int64_t not_after_ms,
                 struct cove_err *err)
{
        struct cache *c = (struct cache *)cs;
        int rc = c->inner->ops->del(c->inner, name, not_after_ms, err);
        if (rc == 1 && cacheable(c, name)) {
                char p[CACHE_PATH_MAX];
                path_of(c, name, p);
                struct stat st;
                if (lstat(p, &st) == 0 && unlink(p) == 0) {
                        pthread_mutex_lock(&c->mu);
                        c->bytes -=
                            c->bytes < (uint64_t)st.st_size ? c->bytes : (uint64_t)st.st_size;
                        pthread_mutex_unlock(&c->mu);
                }
        }
        return rc;
}

static int c_list(struct cove_chunkstore *cs, const char *prefix, cove_cs_list_cb cb, void *arg,
                  struct cove_err *err)
{
        struct cache *c = (struct cache *)cs;
        return c->inner->ops->list(c->inner, prefix, cb, arg, err);
}

static struct cove_cs_batch *c_batch_new(struct cove_chunkstore *cs, struct cove_err *err)
{
        struct cache *c = (struct cache *)cs;
        return c->inner->ops->batch_new(c->inner, err);
}

static int c_batch_commit(struct cove_chunkstore *cs, struct cove_cs_batch *b, struct cove_err *err)
{
        struct cache *c = (struct cache *)cs;
        return c->inner->ops->batch_commit(c->inner, b, err);
}

static void c_batch_free(struct cove_chunkstore *cs, struct cove_cs_batch *b)
{
        struct cache *c = (struct cache *)cs;
        c->inner->ops->batch_free(c->inner, b);
}

static int c_recover(struct cove_chunkstore *cs, struct cove_err *err)
{
        struct cache *c = (struct cache *)cs;
        return c->inner->ops->recover(c->inner, err);
}

static void c_close(struct cove_chunkstore *cs)
{
        struct cache *c = (struct cache *)cs;
        c->inner->ops->close(c->inner);
        pthread_mutex_destroy(&c->mu);
        free(c);
}

static const struct cove_chunkstore_ops cache_ops = {
    .name = "cache",
    .put = c_put,
    .get = c_get,
    .has = c_has,
    .touch = c_touch,
    .del = c_del,
    .list = c_list,
    .batch_new = c_batch_new,
    .batch_commit = c_batch_commit,
    .batch_free = c_batch_free,
    .recover = c_recover,
    .close = c_close,
};

struct cove_chunkstore *cove_chunkstore_cache_open(struct cove_chunkstore *inner, const char *dir,
                                                   uint64_t budget, const char *match,
                                                   struct cove_err *err)
{
        struct cache *c = calloc(1, sizeof(*c));
        char tmp[CACHE_PATH_MAX];
        if (!c) {
                cove_err_set(err, ENOMEM, "chunk cache");
                goto fail;
        }
        if (strlen(dir) >= sizeof(c->dir) || !dir[0] ||
            (match && strlen(match) >= sizeof(c->match))) {
                cove_err_set(err, ENAMETOOLONG, "chunk cache %s", dir);
                goto fail;
        }
        snprintf(c->dir, sizeof(c->dir), "%s", dir);
        snprintf(c->match, sizeof(c->match), "%s", match ? match : "");
        snprintf(tmp, sizeof(tmp), "%s/.tmp", dir);
        /* temp files of an earlier run are garbage */
        if (cove_rm_rf(tmp, NULL) < 0 || cove_mkdir_p(tmp, 0700, err) < 0) {
                cove_err_wrap(err, "chunk cache %s", dir);
                goto fail;
        }
        c->base.ops = &cache_ops;
        c->inner = inner;
        c->budget = budget < (1u << 20) ? (1u << 20) : budget;
        pthread_mutex_init(&c->mu, NULL);
        uint64_t total = 0;
        scan(c->dir, 0, NULL, NULL, NULL, &total);
        c->bytes = total;
        if (c->bytes > c->budget)
                evict_locked(c);
        return &c->base;
fail:
        free(c);
        inner->ops->close(inner);
        return NULL;
}
