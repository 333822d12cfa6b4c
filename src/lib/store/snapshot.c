/* Snapshot writer/reader over the chunk store (store/snapshot.h): chunking, keyed chunk
 * names, zstd + AES-256-GCM objects, manifests, tree capture/restore, the in-flight
 * registry and mark-and-sweep GC. Object formats are specified in docs/storage.md. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <linux/openat2.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>
#include <zstd.h>

#include "crypto/keys.h"
#include "store/cdc.h"
#include "store/manifest.h"
#include "store/snapshot.h"
#include "util/cleanup.h"
#include "util/util.h"

#define OBJ_HDR 20 /* magic[4] version flags reserved[2] nonce[12] */
#define OBJ_TAG 16
#define OBJ_VERSION 1
#define OBJ_FLAG_ZSTD 1
#define CHUNK_MAGIC "CVC1"
#define MANIFEST_MAGIC "CVM1"
#define MANIFEST_OBJ_MAX ((size_t)COVE_MANIFEST_MAX_BYTES + 4096)
#define CHUNK_OBJ_MAX ((size_t)COVE_CHUNK_MAX_LEN + 4096) /* zstd never grows it: flag 0 */
#define READ_BUF (4u << 20)
#define SEG_SHIFT 16 /* chunk-id table segments of 65536 ids */
#define MAX_THREADS 8
#define QCAP 16

/* ---- a set of 32-byte ids with reference counts (open addressing, never shrinks) ---- */

struct idslot {
        uint8_t id[32];
        uint32_t refs; /* 0: empty slot */
};

struct idset {
        struct idslot *s;
        size_t cap, n; /* cap: power of two */
};

static uint64_t id_hash(const uint8_t *id)
{
        uint64_t h;
        memcpy(&h, id, 8); /* ids are HMAC outputs: uniformly distributed already */
        return h;
}

static struct idslot *idset_find(const struct idset *s, const uint8_t *id)
{
        if (!s->cap)
                return NULL;
        for (size_t i = id_hash(id) & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
                if (!s->s[i].refs)
                        return NULL;
                if (!memcmp(s->s[i].id, id, 32))
                        return &s->s[i];
        }
}

/* Add one reference; returns 1 if id was new, 0 if present, -1 on ENOMEM. */
static int idset_add(struct idset *s, const uint8_t *id)
{
        struct idslot *f = idset_find(s, id);
        if (f) {
                f->refs++;
                return 0;
        }
        if ((s->n + 1) * 2 > s->cap) {
                size_t nc = s->cap ? s->cap * 2 : 1024;
                struct idslot *ns = calloc(nc, sizeof(*ns));
                if (!ns)
                        return -1;
                for (size_t i = 0; i < s->cap; i++) {
                        if (!s->s[i].refs)
                                continue;
                        size_t j = id_hash(s->s[i].id) & (nc - 1);
                        while (ns[j].refs)
                                j = (j + 1) & (nc - 1);
                        ns[j] = s->s[i];
                }
                free(s->s);
                s->s = ns;
                s->cap = nc;
        }
        size_t i = id_hash(id) & (s->cap - 1);
        while (s->s[i].refs)
                i = (i + 1) & (s->cap - 1);
        memcpy(s->s[i].id, id, 32);
        s->s[i].refs = 1;
        s->n++;
        return 1;
}

static void idset_free(struct idset *s)
{
        free(s->s);
        memset(s, 0, sizeof(*s));
}

/* ---- store ---- */

struct tenant {
        struct tenant *next;
        char name[COVE_TENANT_MAX + 1];
        struct cove_tenant_keys *keys;
        uint64_t gear_seed;
};

struct cove_store {
        struct cove_chunkstore *cs;
        int threads;
        int64_t grace_ms;
        int level;
        pthread_mutex_t mu; /* tenants, inflight */
        struct tenant *tenants;
        char *keys_dir;
        /* The in-flight registry: every chunk id a running capture references (new or
         * deduplicated), counted per capture. GC skips these. refs only grow while any
         * capture runs; the set is reset when the last one ends. */
        struct idset inflight;
        int writers;
};

struct cove_chunkstore *cove_store_backend(struct cove_store *st)
{
        return st->cs;
}

int cove_store_recover(struct cove_store *st, struct cove_err *err)
{
        if (st->cs->ops->recover(st->cs, err) < 0)
                return cove_err_wrap(err, "recover chunk store");
        return 0;
}

int cove_store_open_backend(struct cove_chunkstore *cs, const struct cove_store_opts *o,
                            struct cove_store **out, struct cove_err *err)
{
        struct cove_store *st = calloc(1, sizeof(*st));
        if (!st) {
                cs->ops->close(cs);
                return cove_err_set(err, ENOMEM, "open store");
        }
        st->cs = cs;
        st->keys_dir = o->keys_dir ? strdup(o->keys_dir) : NULL;
        if (o->keys_dir && !st->keys_dir) {
                free(st);
                cs->ops->close(cs);
                return cove_err_set(err, ENOMEM, "open store");
        }
        st->threads = o->threads;
        if (st->threads <= 0) {
                /* twice the CPUs: a worker also waits (on its pack write, dirty-page
                 * throttling, the store); 2 CPUs, 512 MiB incompressible, load 5:
                 * 209 MB/s with 2 workers, 278 with 3, 331 with 4, 317 with 6 */
                long n = sysconf(_SC_NPROCESSORS_ONLN) * 2;
                st->threads = n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (int)n;
        }
        if (st->threads > MAX_THREADS)
                st->threads = MAX_THREADS;
        st->grace_ms = o->gc_grace_ms > 0 ? o->gc_grace_ms : 3600 * 1000;
        st->level = o->zstd_level ? o->zstd_level : 1;
        pthread_mutex_init(&st->mu, NULL);
        *out = st;
        if (!o->no_recover && cove_store_recover(st, err) < 0) {
                cove_store_close(st);
                *out = NULL;
                return -1;
        }
        return 0;
}

int cove_store_open(const struct cove_store_opts *o, struct cove_store **out, struct cove_err *err)
{
        if ((!o->root && !o->backend) || !o->keys_dir)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "store: root and keys_dir required");
        struct cove_chunkstore_cfg cfg = {0};
        if (o->backend)
                cfg = *o->backend;
        if (!cfg.fs_root)
                cfg.fs_root = o->root;
        if (!cfg.io)
                cfg.io = o->io;
        if (o->fs_loose)
                cfg.fs_loose = 1;
        cfg.cache_match = "/chunks/"; /* chunks are immutable and content-named; manifests
                                         are not cached (a deleted one must be gone) */
        struct cove_chunkstore *cs = cove_chunkstore_open(&cfg, err);
        if (!cs)
                return -1;
        return cove_store_open_backend(cs, o, out, err);
}

void cove_store_close(struct cove_store *st)
{
        if (!st)
                return;
        for (struct tenant *t = st->tenants; t;) {
                struct tenant *nx = t->next;
                cove_tenant_keys_free(t->keys);
                free(t);
                t = nx;
        }
        idset_free(&st->inflight);
        free(st->keys_dir);
        pthread_mutex_destroy(&st->mu);
        st->cs->ops->close(st->cs);
        free(st);
}

static struct tenant *tenant_get(struct cove_store *st, const char *name, struct cove_err *err)
{
        if (!cove_tenant_name_valid(name)) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "invalid tenant name");
                return NULL;
        }
        /* every use passes the key gate (crypto/keys.h): a revoked key stops captures,
         * restores and reads at once even though the subkeys below stay cached */
        if (!st->keys_dir) {
                cove_err_set(err, 0, "store opened without a keys directory");
                return NULL;
        }
        if (cove_key_check(st->keys_dir, name, 1, err) < 0)
                return NULL;
        pthread_mutex_lock(&st->mu);
        struct tenant *t;
        for (t = st->tenants; t; t = t->next)
                if (!strcmp(t->name, name))
                        break;
        if (!t) {
                if (!st->keys_dir) {
                        cove_err_set(err, 0, "store opened without a keys directory");
                        goto out;
                }
                t = calloc(1, sizeof(*t));
                if (!t) {
                        cove_err_set(err, ENOMEM, "tenant keys");
                        goto out;
                }
                if (cove_tenant_keys_open(st->keys_dir, name, &t->keys, err) < 0) {
                        free(t);
                        t = NULL;
                        goto out;
                }
                snprintf(t->name, sizeof(t->name), "%s", name);
                uint8_t md[32];
                unsigned int ml = 0;
                HMAC(EVP_sha256(), t->keys->chunk_name, COVE_KEY_LEN,
                     (const unsigned char *)"cdc-gear", 8, md, &ml);
                memcpy(&t->gear_seed, md, 8);
                t->next = st->tenants;
                st->tenants = t;
        }
out:
        pthread_mutex_unlock(&st->mu);
        return t;
}

/* ---- names ---- */

static void chunk_obj_name(const char *tenant, const uint8_t id[32], char *out, size_t cap)
{
        char hex[65];
        cove_hex(id, 32, hex);
        snprintf(out, cap, "%s/chunks/%.2s/%s", tenant, hex, hex + 2);
}

static void manifest_obj_name(const char *tenant, const char *id, char *out, size_t cap)
{
        snprintf(out, cap, "%s/manifests/%s", tenant, id);
}

/* ---- per-thread crypto/compression state ---- */

struct worker {
        ZSTD_CCtx *zc;
        ZSTD_DCtx *zd;
        EVP_CIPHER_CTX *cx;
        EVP_MAC_CTX *mac; /* HMAC-SHA256 keyed for mac_t, set up on first use */
        const struct tenant *mac_t;
        uint8_t *zbuf; /* compression output */
        size_t zcap;
        uint64_t ns_hash, ns_compress, ns_encrypt, ns_write, ns_read;
};

static int worker_init(struct worker *w)
{
        memset(w, 0, sizeof(*w));
        w->zc = ZSTD_createCCtx();
        w->zd = ZSTD_createDCtx();
        w->cx = EVP_CIPHER_CTX_new();
        return w->zc && w->zd && w->cx ? 0 : -1;
}

static void worker_fini(struct worker *w)
{
        ZSTD_freeCCtx(w->zc);
        ZSTD_freeDCtx(w->zd);
        EVP_CIPHER_CTX_free(w->cx);
        EVP_MAC_CTX_free(w->mac); /* cleanses its copy of the key */
        free(w->zbuf);
}

static void chunk_id(const struct tenant *t, const void *data, size_t len, uint8_t id[32])
{
        unsigned int ml = 0;
        HMAC(EVP_sha256(), t->keys->chunk_name, COVE_KEY_LEN, data, len, id, &ml);
}

/* chunk_id() with the worker's keyed HMAC context: the one-shot HMAC() looks the MAC and
 * the digest up and keys them again for every chunk (perf: ~3% of a capture's CPU). Same
 * bytes out; falls back to HMAC() if the context cannot be set up. */
static void chunk_id_w(struct worker *w, const struct tenant *t, const void *data, size_t len,
                       uint8_t id[32])
{
        if (!w->mac) {
                EVP_MAC *m = EVP_MAC_fetch(NULL, "HMAC", NULL);
                w->mac = m ? EVP_MAC_CTX_new(m) : NULL;
                EVP_MAC_free(m);
                w->mac_t = NULL;
        }
        int ok = w->mac != NULL;
        if (ok && w->mac_t != t) {
                char digest[] = "SHA256";
                OSSL_PARAM ps[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0),
                                   OSSL_PARAM_construct_end()};
                ok = EVP_MAC_init(w->mac, t->keys->chunk_name, COVE_KEY_LEN, ps) == 1;
                w->mac_t = ok ? t : NULL;
        }
        size_t ol = 0;
        if (ok && EVP_MAC_init(w->mac, NULL, 0, NULL) == 1 &&
            EVP_MAC_update(w->mac, data, len) == 1 && EVP_MAC_final(w->mac, id, &ol, 32) == 1 &&
            ol == 32)
                return;
        w->mac_t = NULL;
        chunk_id(t, data, len, id);
}

/* Seal plain into a new object: header || AES-256-GCM(zstd?(plain)) || tag, with
 * AD = header || ad. */
#define SAMPLE_LEN 4096 /* compressibility probe of seal() */

static int seal(struct worker *w, const uint8_t key[32], const char *magic, const void *ad,
                size_t adlen, const uint8_t *plain, size_t len, int level, uint8_t **out,
                size_t *outlen, struct cove_err *err)
{
        int64_t t0 = cove_mono_ns();
        size_t bound = ZSTD_compressBound(len);
        if (bound > w->zcap) {
                uint8_t *nb = realloc(w->zbuf, bound);
                if (!nb)
                        return cove_err_set(err, ENOMEM, "compress");
                w->zbuf = nb;
                w->zcap = bound;
        }
        /* Incompressible data (media, archives, random) is most of what zstd -1 spends its
         * time on: try a 4 KiB sample from the middle first and store the chunk as it is
         * when the sample does not shrink by 1/32 (btrfs decides the same way). */
        size_t z = len;
        if (len >= 4 * SAMPLE_LEN) {
                size_t sz = ZSTD_compressCCtx(w->zc, w->zbuf, w->zcap,
                                              plain + len / 2 - SAMPLE_LEN / 2, SAMPLE_LEN, level);
                if (!ZSTD_isError(sz) && sz < SAMPLE_LEN - SAMPLE_LEN / 32)
                        z = ZSTD_compressCCtx(w->zc, w->zbuf, w->zcap, plain, len, level);
        } else {
                z = ZSTD_compressCCtx(w->zc, w->zbuf, w->zcap, plain, len, level);
        }
        const uint8_t *body = plain;
        size_t blen = len;
        uint8_t flags = 0;
        if (!ZSTD_isError(z) && z < len) {
                body = w->zbuf;
                blen = z;
                flags = OBJ_FLAG_ZSTD;
        }
        int64_t t1 = cove_mono_ns();
        w->ns_compress += (uint64_t)(t1 - t0);
        uint8_t *o = malloc(OBJ_HDR + blen + OBJ_TAG);
        if (!o)
                return cove_err_set(err, ENOMEM, "encrypt");
        memcpy(o, magic, 4);
        o[4] = OBJ_VERSION;
        o[5] = flags;
        o[6] = o[7] = 0;
        if (RAND_bytes(o + 8, 12) != 1) {
                free(o);
                return cove_err_set(err, 0, "encrypt: no randomness for a nonce");
        }
        int l1 = 0, l2 = 0;
        int ok = EVP_EncryptInit_ex(w->cx, EVP_aes_256_gcm(), NULL, key, o + 8) == 1 &&
                 EVP_EncryptUpdate(w->cx, NULL, &l1, o, OBJ_HDR) == 1 &&
                 EVP_EncryptUpdate(w->cx, NULL, &l1, ad, (int)adlen) == 1 &&
                 EVP_EncryptUpdate(w->cx, o + OBJ_HDR, &l1, body, (int)blen) == 1 &&
                 EVP_EncryptFinal_ex(w->cx, o + OBJ_HDR + l1, &l2) == 1 &&
                 EVP_CIPHER_CTX_ctrl(w->cx, EVP_CTRL_GCM_GET_TAG, OBJ_TAG, o + OBJ_HDR + blen) == 1;
        w->ns_encrypt += (uint64_t)(cove_mono_ns() - t1);
        if (!ok || (size_t)(l1 + l2) != blen) {
                free(o);
                return cove_err_set(err, 0, "encrypt failed");
        }
        *out = o;
        *outlen = OBJ_HDR + blen + OBJ_TAG;
        return 0;
}

/* Open an object: check the header, verify the tag (AD = header || ad), decompress into
 * exactly `expect` bytes (0: the frame's declared size, at most max). */
static int unseal(struct worker *w, const uint8_t key[32], const char *magic, const void *ad,
                  size_t adlen, const uint8_t *obj, size_t olen, size_t expect, size_t max,
                  uint8_t **out, size_t *outlen, struct cove_err *err)
{
        if (olen < OBJ_HDR + OBJ_TAG || memcmp(obj, magic, 4) != 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "not a cove object (truncated?)");
        if (obj[4] != OBJ_VERSION || (obj[5] & ~OBJ_FLAG_ZSTD) || obj[6] || obj[7])
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "unsupported object version %u flags %u", obj[4], obj[5]);
        size_t blen = olen - OBJ_HDR - OBJ_TAG;
        uint8_t *body = malloc(blen ? blen : 1);
        if (!body)
                return cove_err_set(err, ENOMEM, "decrypt");
        int64_t t0 = cove_mono_ns();
        int l1 = 0, l2 = 0;
        uint8_t tag[OBJ_TAG];
        memcpy(tag, obj + OBJ_HDR + blen, OBJ_TAG);
        int ok = EVP_DecryptInit_ex(w->cx, EVP_aes_256_gcm(), NULL, key, obj + 8) == 1 &&
                 EVP_DecryptUpdate(w->cx, NULL, &l1, obj, OBJ_HDR) == 1 &&
                 EVP_DecryptUpdate(w->cx, NULL, &l1, ad, (int)adlen) == 1 &&
                 EVP_DecryptUpdate(w->cx, body, &l1, obj + OBJ_HDR, (int)blen) == 1 &&
                 EVP_CIPHER_CTX_ctrl(w->cx, EVP_CTRL_GCM_SET_TAG, OBJ_TAG, tag) == 1 &&
                 EVP_DecryptFinal_ex(w->cx, body + l1, &l2) == 1;
        w->ns_encrypt += (uint64_t)(cove_mono_ns() - t0);
        if (!ok) {
                OPENSSL_cleanse(body, blen);
                free(body);
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "authentication failed (tampered, swapped or wrong key)");
        }
        if (!(obj[5] & OBJ_FLAG_ZSTD)) {
                if ((expect && blen != expect) || blen > max) {
                        free(body);
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "size %zu, expected %zu",
                                             blen, expect);
                }
                *out = body;
                *outlen = blen;
                return 0;
        }
        int64_t t1 = cove_mono_ns();
        unsigned long long fcs = ZSTD_getFrameContentSize(body, blen);
        size_t want = expect ? expect : (size_t)fcs;
        if (fcs == ZSTD_CONTENTSIZE_UNKNOWN || fcs == ZSTD_CONTENTSIZE_ERROR || fcs != want ||
            want > max) {
                free(body);
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "bad compressed size");
        }
        uint8_t *plain = malloc(want ? want : 1);
        if (!plain) {
                free(body);
                return cove_err_set(err, ENOMEM, "decompress");
        }
        size_t d = ZSTD_decompressDCtx(w->zd, plain, want, body, blen);
        free(body);
        w->ns_compress += (uint64_t)(cove_mono_ns() - t1);
        if (ZSTD_isError(d) || d != want) {
                free(plain);
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "decompression failed");
        }
        *out = plain;
        *outlen = want;
        return 0;
}

/* Fetch, decrypt, decompress and verify one chunk; *out has exactly len bytes. */
static int chunk_read(struct cove_store *st, struct worker *w, const struct tenant *t,
                      const uint8_t id[32], size_t len, uint8_t **out, struct cove_err *err)
{
        char name[256], hex[65];
        cove_hex(id, 32, hex);
        chunk_obj_name(t->name, id, name, sizeof(name));
        void *obj = NULL;
        size_t olen = 0;
        int64_t t0 = cove_mono_ns();
        if (st->cs->ops->get(st->cs, name, CHUNK_OBJ_MAX, &obj, &olen, err) < 0) {
                if (err && err->kind == COVE_E_NOT_FOUND)
                        return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "chunk %s: missing", hex);
                return cove_err_wrap(err, "chunk %s", hex);
        }
        w->ns_read += (uint64_t)(cove_mono_ns() - t0);
        uint8_t *plain = NULL;
        size_t plen = 0;
        int rc = unseal(w, t->keys->chunk_enc, CHUNK_MAGIC, id, 32, obj, olen, len,
                        COVE_CHUNK_MAX_LEN, &plain, &plen, err);
        free(obj);
        if (rc < 0)
                return cove_err_wrap(err, "chunk %s", hex);
        int64_t t1 = cove_mono_ns();
        uint8_t check[32];
        chunk_id(t, plain, plen, check);
        w->ns_hash += (uint64_t)(cove_mono_ns() - t1);
        if (CRYPTO_memcmp(check, id, 32) != 0) {
                free(plain);
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "chunk %s: content does not match its id", hex);
        }
        *out = plain;
        return 0;
}

/* ---- a small worker pool with a bounded queue ---- */

/* A capture's read buffer. The chunks cut from it go to the workers as pointers into it,
 * each job holding a reference, so chunk bytes are not copied on their way to the hash
 * and the seal; the last reference frees it. */
struct rbuf {
        uint32_t refs; /* atomic */
        uint8_t *data; /* READ_BUF bytes, right after the struct */
};

static struct rbuf *rbuf_new(void)
{
        struct rbuf *b = malloc(sizeof(*b) + READ_BUF);
        if (b) {
                b->refs = 1;
                b->data = (uint8_t *)(b + 1);
        }
        return b;
}

static void rbuf_put(struct rbuf *b)
{
        if (b && __atomic_sub_fetch(&b->refs, 1, __ATOMIC_ACQ_REL) == 0)
                free(b);
}

struct job {
        size_t k;            /* chunk index in the manifest */
        const uint8_t *data; /* capture: the plaintext, inside rb */
        struct rbuf *rb;     /* capture: one reference, dropped when the job is done */
        size_t len;
        int fd; /* restore: target (-1 verify only) */
        uint64_t off;
};

struct pool {
        pthread_mutex_t mu;
        pthread_cond_t cv_put, cv_get, cv_idle;
        struct job q[QCAP];
        size_t head, n, busy;
        int stop;
        int nth;
        pthread_t th[MAX_THREADS];
        struct worker ws[MAX_THREADS]; /* ws[0] is the caller's when nth == 0 */
        void (*fn)(void *ctx, struct worker *w, struct job *j);
        void *ctx;
};

struct pool_arg {
        struct pool *p;
        int i;
};

static void *pool_main(void *a)
{
        struct pool *p = ((struct pool_arg *)a)->p;
        struct worker *w = &p->ws[((struct pool_arg *)a)->i];
        free(a);
        pthread_mutex_lock(&p->mu);
        for (;;) {
                while (!p->n && !p->stop)
                        pthread_cond_wait(&p->cv_get, &p->mu);
                if (!p->n && p->stop)
                        break;
                struct job j = p->q[p->head];
                p->head = (p->head + 1) % QCAP;
                p->n--;
                p->busy++;
                pthread_cond_signal(&p->cv_put);
                pthread_mutex_unlock(&p->mu);
                p->fn(p->ctx, w, &j);
                pthread_mutex_lock(&p->mu);
                p->busy--;
                if (!p->n && !p->busy)
                        pthread_cond_broadcast(&p->cv_idle);
        }
        pthread_mutex_unlock(&p->mu);
        return NULL;
}

/* threads <= 1: no threads, jobs run in pool_submit on the caller's thread. */
static int pool_start(struct pool *p, int threads,
                      void (*fn)(void *, struct worker *, struct job *), void *ctx,
                      struct cove_err *err)
{
        memset(p, 0, sizeof(*p));
        pthread_mutex_init(&p->mu, NULL);
        pthread_cond_init(&p->cv_put, NULL);
        pthread_cond_init(&p->cv_get, NULL);
        pthread_cond_init(&p->cv_idle, NULL);
        p->fn = fn;
        p->ctx = ctx;
        int nw = threads <= 1 ? 1 : threads;
        for (int i = 0; i < nw; i++)
                if (worker_init(&p->ws[i]) < 0)
                        return cove_err_set(err, ENOMEM, "worker state");
        if (threads <= 1)
                return 0;
        for (int i = 0; i < threads; i++) {
                struct pool_arg *a = malloc(sizeof(*a));
                if (!a)
                        return cove_err_set(err, ENOMEM, "worker threads");
                a->p = p;
                a->i = i;
                int e = pthread_create(&p->th[i], NULL, pool_main, a);
                if (e) {
                        free(a);
                        return cove_err_set(err, e, "start worker thread");
                }
                p->nth++;
        }
        return 0;
}

static void pool_submit(struct pool *p, struct job *j)
{
        if (!p->nth) {
                p->fn(p->ctx, &p->ws[0], j);
                return;
        }
        pthread_mutex_lock(&p->mu);
        while (p->n == QCAP)
                pthread_cond_wait(&p->cv_put, &p->mu);
        p->q[(p->head + p->n) % QCAP] = *j;
        p->n++;
        pthread_cond_signal(&p->cv_get);
        pthread_mutex_unlock(&p->mu);
}

static void pool_wait(struct pool *p)
{
        pthread_mutex_lock(&p->mu);
        while (p->n || p->busy)
                pthread_cond_wait(&p->cv_idle, &p->mu);
        pthread_mutex_unlock(&p->mu);
}

/* Stop the threads and add their stage times to s. */
static void pool_stop(struct pool *p, struct cove_snapshot_stats *s)
{
        pthread_mutex_lock(&p->mu);
        p->stop = 1;
        pthread_cond_broadcast(&p->cv_get);
        pthread_mutex_unlock(&p->mu);
        for (int i = 0; i < p->nth; i++)
                pthread_join(p->th[i], NULL);
        for (int i = 0; i < MAX_THREADS; i++) {
                struct worker *w = &p->ws[i];
                s->ns_hash += w->ns_hash;
                s->ns_compress += w->ns_compress;
                s->ns_encrypt += w->ns_encrypt;
                s->ns_write += w->ns_write;
                s->ns_read += w->ns_read;
                worker_fini(w);
        }
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv_put);
        pthread_cond_destroy(&p->cv_get);
        pthread_cond_destroy(&p->cv_idle);
}

/* ---- capture ---- */

struct capture {
        struct cove_store *st;
        struct tenant *t;
        const char *snap_id;
        struct cove_cs_batch *batch;
        struct cove_manifest m;
        struct cove_cdc cdc;
        uint8_t *segs[COVE_MANIFEST_MAX_CHUNKS >> SEG_SHIFT]; /* chunk ids by manifest index */
        pthread_mutex_t mu;                                   /* seen, failed/err */
        struct idset seen;         /* ids this capture references (also held in st->inflight) */
        struct cove_manifest prev; /* the parent's manifest, when it could be read */
        json_t *prev_idx;          /* path -> index into prev.entries of its files */
        int failed;
        struct cove_err err; /* first failure */
        struct pool pool;
        json_t *links; /* "dev:ino" -> first path, for files with nlink > 1 */
        int root_mnt_set;
        uint64_t root_mnt;
        struct rbuf *rb; /* bytes [base, base + have) not yet cut; before: jobs' chunks */
        size_t base;
        uint64_t new_bytes, stored_bytes, new_chunks; /* atomics */
        struct cove_snapshot_stats stats;
};

static void cap_fail(struct capture *c, const struct cove_err *e)
{
        pthread_mutex_lock(&c->mu);
        if (!c->failed) {
                c->failed = 1;
                c->err = *e;
        }
        pthread_mutex_unlock(&c->mu);
}

static int cap_failed(struct capture *c)
{
        return __atomic_load_n(&c->failed, __ATOMIC_RELAXED);
}

static uint8_t *cap_idslot(struct capture *c, size_t k)
{
        return c->segs[k >> SEG_SHIFT] + (k & ((1u << SEG_SHIFT) - 1)) * 32;
}

/* Worker: name the chunk, dedup against this capture and the store, else seal and put. */
static void cap_job(void *ctx, struct worker *w, struct job *j)
{
        struct capture *c = ctx;
        struct cove_store *st = c->st;
        struct cove_err e = {0};
        uint8_t id[32];
        if (cap_failed(c))
                goto out;
        int64_t t0 = cove_mono_ns();
        chunk_id_w(w, c->t, j->data, j->len, id);
        w->ns_hash += (uint64_t)(cove_mono_ns() - t0);
        memcpy(cap_idslot(c, j->k), id, 32);
        pthread_mutex_lock(&c->mu);
        int fresh = idset_add(&c->seen, id);
        pthread_mutex_unlock(&c->mu);
        if (fresh < 0) {
                cove_err_set(&e, ENOMEM, "chunk registry");
                cap_fail(c, &e);
                goto out;
        }
        if (!fresh)
                goto out; /* another job of this capture handles it */
        /* Register before looking at the store: see cove_store_gc() for the race. */
        pthread_mutex_lock(&st->mu);
        int r = idset_add(&st->inflight, id);
        pthread_mutex_unlock(&st->mu);
        if (r < 0) {
                cove_err_set(&e, ENOMEM, "chunk registry");
                cap_fail(c, &e);
                goto out;
        }
        char name[256];
        chunk_obj_name(c->t->name, id, name, sizeof(name));
        int64_t t1 = cove_mono_ns();
        int have = st->cs->ops->touch(st->cs, name, &e);
        w->ns_write += (uint64_t)(cove_mono_ns() - t1);
        if (have < 0) {
                cap_fail(c, &e);
                goto out;
        }
        if (have)
                goto out;
        uint8_t *obj = NULL;
        size_t olen = 0;
        if (seal(w, c->t->keys->chunk_enc, CHUNK_MAGIC, id, 32, j->data, j->len, st->level, &obj,
                 &olen, &e) < 0) {
                cap_fail(c, &e);
                goto out;
        }
        int64_t t2 = cove_mono_ns();
        int pr = st->cs->ops->put(st->cs, c->batch, name, obj, olen, &e);
        w->ns_write += (uint64_t)(cove_mono_ns() - t2);
        free(obj);
        if (pr < 0) {
                char hex[65];
                cove_hex(id, 32, hex);
                cove_err_wrap(&e, "write chunk %.16s…", hex);
                cap_fail(c, &e);
                goto out;
        }
        if (pr == 0) {
                __atomic_add_fetch(&c->new_bytes, j->len, __ATOMIC_RELAXED);
                __atomic_add_fetch(&c->stored_bytes, olen, __ATOMIC_RELAXED);
                __atomic_add_fetch(&c->new_chunks, 1, __ATOMIC_RELAXED);
        }
out:
        rbuf_put(j->rb);
}

static int cap_emit_hole(struct capture *c, uint64_t len, struct cove_err *err)
{
        struct cove_manifest *m = &c->m;
        struct cove_mentry *e = &m->entries[m->n - 1];
        c->stats.holes++;
        if (e->nchunks && m->chunks[m->nchunks - 1].hole) {
                m->chunks[m->nchunks - 1].len += len;
                return 0;
        }
        return cove_manifest_add_chunk(m, NULL, len, 1) < 0 ? cove_err_set(err, ENOMEM, "manifest")
                                                            : 0;
}

/* Record one chunk of the current entry (p, inside c->rb): zero → hole (merged with a
 * preceding hole), else hand it to the pool with a reference to c->rb. */
static int cap_emit(struct capture *c, const uint8_t *p, size_t len, struct cove_err *err)
{
        int64_t t0 = cove_mono_ns();
        int zero = cove_is_zero(p, len);
        c->stats.ns_chunk += (uint64_t)(cove_mono_ns() - t0);
        struct cove_manifest *m = &c->m;
        struct cove_mentry *e = &m->entries[m->n - 1];
        (void)e;
        if (zero)
                return cap_emit_hole(c, len, err);
        size_t k = m->nchunks;
        if (k >= COVE_MANIFEST_MAX_CHUNKS)
                return cove_err_setk(err, COVE_E_LIMIT, 0, "more than %u chunks",
                                     COVE_MANIFEST_MAX_CHUNKS);
        if (!c->segs[k >> SEG_SHIFT]) {
                c->segs[k >> SEG_SHIFT] = malloc((size_t)32 << SEG_SHIFT);
                if (!c->segs[k >> SEG_SHIFT])
                        return cove_err_set(err, ENOMEM, "chunk table");
        }
        if (cove_manifest_add_chunk(m, NULL, len, 0) < 0)
                return cove_err_set(err, ENOMEM, "manifest");
        c->stats.chunks++;
        struct job j = {.k = k, .data = p, .rb = c->rb, .len = len, .fd = -1};
        __atomic_add_fetch(&c->rb->refs, 1, __ATOMIC_RELAXED);
        pool_submit(&c->pool, &j);
        return 0;
}

/* Read [off, off+len) of fd and chunk it (CDC, or fixed when fixed != 0). Returns bytes
 * actually read (the file may shrink under us) or -1. */
static int64_t cap_region(struct capture *c, int fd, uint64_t off, uint64_t len, size_t fixed,
                          struct cove_err *err)
{
        size_t have = 0;
        uint64_t pos = off, left = len, total = 0;
        size_t need = fixed ? fixed : c->cdc.max;
        for (;;) {
                int eof = 0;
                /* Room for at least one more chunk after what is pending: bytes before base
                 * may still be read by workers, so they are only overwritten once no job
                 * refers to the buffer; else the pending bytes move to a new one. */
                if (left > 0 && READ_BUF - c->base - have < need) {
                        if (__atomic_load_n(&c->rb->refs, __ATOMIC_ACQUIRE) == 1) {
                                memmove(c->rb->data, c->rb->data + c->base, have);
                        } else {
                                struct rbuf *nb = rbuf_new();
                                if (!nb)
                                        return cove_err_set(err, ENOMEM, "capture buffer");
                                memcpy(nb->data, c->rb->data + c->base, have);
                                rbuf_put(c->rb);
                                c->rb = nb;
                        }
                        c->base = 0;
                }
                uint8_t *buf = c->rb->data + c->base;
                int64_t t0 = cove_mono_ns();
                while (c->base + have < READ_BUF && left > 0) {
                        size_t want = READ_BUF - c->base - have;
                        if (want > left)
                                want = (size_t)left;
                        ssize_t r = pread(fd, buf + have, want, (off_t)pos);
                        if (r < 0 && errno == EINTR)
                                continue;
                        if (r < 0)
                                return cove_err_set(err, errno, "read");
                        if (r == 0) {
                                left = 0;
                                break;
                        }
                        have += (size_t)r;
                        pos += (uint64_t)r;
                        left -= (uint64_t)r;
                }
                c->stats.ns_read += (uint64_t)(cove_mono_ns() - t0);
                eof = left == 0;
                size_t start = 0;
                while (have - start >= need || (eof && have > start)) {
                        if (cap_failed(c)) {
                                c->base += start; /* what was handed out stays untouched */
                                return -1;
                        }
                        int64_t t1 = cove_mono_ns();
                        size_t cut = fixed ? (have - start < fixed ? have - start : fixed)
                                           : cove_cdc_cut(&c->cdc, buf + start, have - start);
                        c->stats.ns_chunk += (uint64_t)(cove_mono_ns() - t1);
                        if (cap_emit(c, buf + start, cut, err) < 0) {
                                c->base += start;
                                return -1;
                        }
                        start += cut;
                        total += cut;
                }
                c->base += start;
                have -= start;
                if (eof && have == 0)
                        break;
        }
        return (int64_t)total;
}

/* Chunk a regular file's data, holes found with SEEK_DATA/SEEK_HOLE. */
static int cap_file_data(struct capture *c, int fd, uint64_t size, struct cove_mentry *e,
                         struct cove_err *err)
{
        uint64_t off = 0, got = 0;
        while (off < size) {
                off_t d = lseek(fd, (off_t)off, SEEK_DATA);
                uint64_t data = d < 0 ? size : (uint64_t)d;
                if (d < 0 && errno != ENXIO)
                        data = off; /* no SEEK_DATA: treat all as data */
                if (data > size)
                        data = size;
                if (data > off) {
                        if (cap_emit_hole(c, data - off, err) < 0)
                                return -1;
                        got += data - off;
                        off = data;
                        continue;
                }
                off_t h = lseek(fd, (off_t)off, SEEK_HOLE);
                uint64_t end = h < 0 ? size : (uint64_t)h;
                if (end > size || end <= off)
                        end = size;
                int64_t n = cap_region(c, fd, off, end - off, 0, err);
                if (n < 0)
                        return -1;
                got += (uint64_t)n;
                if ((uint64_t)n < end - off)
                        break; /* shrank while we read */
                off = end;
        }
        struct cove_mentry *cur = &c->m.entries[c->m.n - 1];
        (void)e;
        cur->size = got;
        c->stats.size_bytes += got;
        return 0;
}

/* The last entry is a file that did not change since the parent snapshot (same size,
 * mtime, ctime and inode number: ctime cannot be set from user space, and a restored or
 * forked tree has new ones): take its chunk list from the parent instead of reading and
 * hashing it again. Each chunk is registered as in flight and touched first, exactly like
 * a deduplicated one (see cove_store_gc); if one is gone, what was added is taken back and
 * 0 returned, and the caller reads the file. 1: reused. */
static int cap_reuse(struct capture *c, const struct stat *st, int64_t ctime_ns,
                     struct cove_err *err)
{
        struct cove_store *s = c->st;
        struct cove_manifest *m = &c->m;
        json_t *v = c->prev_idx ? json_object_get(c->prev_idx, m->entries[m->n - 1].path) : NULL;
        if (!v)
                return 0;
        const struct cove_mentry *pe = &c->prev.entries[json_integer_value(v)];
        if (pe->ctime_ns != ctime_ns || pe->ino != (uint64_t)st->st_ino ||
            pe->size != (uint64_t)st->st_size || pe->mtime_ns != m->entries[m->n - 1].mtime_ns)
                return 0;
        size_t off0 = m->nchunks;
        uint64_t chunks0 = c->stats.chunks, holes0 = c->stats.holes;
        for (size_t j = 0; j < pe->nchunks; j++) {
                const struct cove_mchunk *pc = &c->prev.chunks[pe->chunk_off + j];
                if (pc->hole) {
                        if (cap_emit_hole(c, pc->len, err) < 0)
                                return -1;
                        continue;
                }
                pthread_mutex_lock(&s->mu);
                int r = idset_add(&s->inflight, pc->id);
                pthread_mutex_unlock(&s->mu);
                if (r < 0)
                        return cove_err_set(err, ENOMEM, "chunk registry");
                char name[256];
                chunk_obj_name(c->t->name, pc->id, name, sizeof(name));
                int have = s->cs->ops->touch(s->cs, name, err);
                if (have < 0)
                        return -1;
                if (!have) { /* collected meanwhile: read the file after all */
                        m->nchunks = off0;
                        m->entries[m->n - 1].nchunks = 0;
                        c->stats.chunks = chunks0;
                        c->stats.holes = holes0;
                        return 0;
                }
                pthread_mutex_lock(&c->mu);
                r = idset_add(&c->seen, pc->id);
                pthread_mutex_unlock(&c->mu);
                size_t k = m->nchunks;
                if (r < 0)
                        return cove_err_set(err, ENOMEM, "chunk registry");
                if (k >= COVE_MANIFEST_MAX_CHUNKS)
                        return cove_err_setk(err, COVE_E_LIMIT, 0, "more than %u chunks",
                                             COVE_MANIFEST_MAX_CHUNKS);
                if (!c->segs[k >> SEG_SHIFT] &&
                    !(c->segs[k >> SEG_SHIFT] = malloc((size_t)32 << SEG_SHIFT)))
                        return cove_err_set(err, ENOMEM, "chunk table");
                if (cove_manifest_add_chunk(m, NULL, pc->len, 0) < 0)
                        return cove_err_set(err, ENOMEM, "manifest");
                memcpy(cap_idslot(c, k), pc->id, 32);
                c->stats.chunks++;
        }
        m->entries[m->n - 1].size = pe->size;
        c->stats.size_bytes += pe->size;
        c->stats.reused_bytes += pe->size;
        return 1;
}

static int load_manifest(struct cove_store *st, const struct tenant *t, const char *snap_id,
                         struct cove_manifest *m, struct cove_err *err);

/* Index the parent's files for cap_reuse(); a parent that cannot be read (deleted, from an
 * older format, damaged) only means every file is read. */
static void cap_load_prev(struct capture *c, const char *parent)
{
        struct cove_err e = {0};
        if (load_manifest(c->st, c->t, parent, &c->prev, &e) < 0)
                return;
        if (strcmp(c->prev.kind, "files") || !(c->prev_idx = json_object()))
                return;
        for (size_t i = 0; i < c->prev.n; i++) {
                const struct cove_mentry *pe = &c->prev.entries[i];
                /* nocheck: paths are bytes, not necessarily UTF-8 */
                if (pe->type == COVE_ENT_FILE && !pe->link && pe->ctime_ns > 0 &&
                    json_object_set_new_nocheck(c->prev_idx, pe->path,
                                                json_integer((json_int_t)i)) < 0)
                        break; /* out of memory: the rest is read */
        }
}

/* xattrs of an entry: through fd when given, else the path (l* calls, no following). */
static int cap_xattrs(struct cove_mentry *e, int fd, const char *path, int follow,
                      struct cove_err *err)
{
        char list[65536];
        ssize_t n = fd >= 0  ? flistxattr(fd, list, sizeof(list))
                    : follow ? listxattr(path, list, sizeof(list))
                             : llistxattr(path, list, sizeof(list));
        if (n < 0) {
                if (errno == ENOTSUP || errno == EPERM || errno == ENOENT)
                        return 0;
                return cove_err_set(err, errno, "list xattrs of %s", e->path);
        }
        uint8_t *val = malloc(COVE_XATTR_VALUE_MAX);
        if (!val)
                return cove_err_set(err, ENOMEM, "xattrs");
        int rc = 0;
        for (ssize_t i = 0; i < n; i += (ssize_t)strlen(list + i) + 1) {
                const char *name = list + i;
                if (e->nxattrs >= COVE_XATTRS_MAX || strlen(name) > COVE_XATTR_NAME_MAX) {
                        rc = cove_err_setk(err, COVE_E_LIMIT, 0, "%s: too many or too long xattrs",
                                           e->path);
                        break;
                }
                ssize_t vl = fd >= 0  ? fgetxattr(fd, name, val, COVE_XATTR_VALUE_MAX)
                             : follow ? getxattr(path, name, val, COVE_XATTR_VALUE_MAX)
                                      : lgetxattr(path, name, val, COVE_XATTR_VALUE_MAX);
                if (vl < 0) {
                        if (errno == ENODATA)
                                continue; /* removed meanwhile */
                        rc = cove_err_set(err, errno, "read xattr %s of %s", name, e->path);
                        break;
                }
                if (cove_mentry_add_xattr(e, name, val, (size_t)vl) < 0) {
                        rc = cove_err_set(err, ENOMEM, "xattrs");
                        break;
                }
        }
        free(val);
        return rc;
}

static int cmp_str(const void *a, const void *b)
{
        return strcmp(*(char *const *)a, *(char *const *)b);
}

static enum cove_ent_type type_of(mode_t m)
{
        switch (m & S_IFMT) {
        case S_IFDIR:
                return COVE_ENT_DIR;
        case S_IFLNK:
                return COVE_ENT_SYMLINK;
        case S_IFCHR:
                return COVE_ENT_CHAR;
        case S_IFBLK:
                return COVE_ENT_BLOCK;
        case S_IFIFO:
                return COVE_ENT_FIFO;
        case S_IFSOCK:
                return COVE_ENT_SOCKET;
        default:
                return COVE_ENT_FILE;
        }
}

static int cap_dir(struct capture *c, int dfd, const char *rel, int depth, struct cove_err *err);

static int cap_one(struct capture *c, int dfd, const char *name, const char *path, int depth,
                   struct cove_err *err)
{
        struct statx sx;
        if (statx(dfd, name, AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT,
                  STATX_BASIC_STATS | STATX_MNT_ID, &sx) < 0) {
                if (errno == ENOENT)
                        return 0; /* deleted while we walked */
                return cove_err_set(err, errno, "stat %s", path);
        }
        if (c->m.n >= COVE_MANIFEST_MAX_ENTRIES)
                return cove_err_setk(err, COVE_E_LIMIT, 0, "more than %u entries",
                                     COVE_MANIFEST_MAX_ENTRIES);
        struct cove_mentry e = {0};
        e.path = (char *)path;
        e.type = type_of(sx.stx_mode);
        e.mode = sx.stx_mode & 07777;
        e.uid = sx.stx_uid;
        e.gid = sx.stx_gid;
        e.mtime_ns = (int64_t)sx.stx_mtime.tv_sec * 1000000000LL + sx.stx_mtime.tv_nsec;
        int other_mount =
            (sx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT &&
             sx.stx_attributes & STATX_ATTR_MOUNT_ROOT) ||
            (c->root_mnt_set && (sx.stx_mask & STATX_MNT_ID) && sx.stx_mnt_id != c->root_mnt);
        char proc[64 + COVE_PATH_MAX];
        snprintf(proc, sizeof(proc), "/proc/self/fd/%d/%s", dfd, name);
        char target[COVE_PATH_MAX + 1];
        switch (e.type) {
        case COVE_ENT_FILE: {
                if (!S_ISREG(sx.stx_mode))
                        return 0;
                if (other_mount) {
                        if (!cove_manifest_add(&c->m, &e))
                                return cove_err_set(err, ENOMEM, "manifest");
                        return cap_emit_hole(c, 0, err) * 0; /* empty placeholder */
                }
                int fd =
                    openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NOATIME);
                if (fd < 0 && errno == EPERM)
                        fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
                if (fd < 0) {
                        if (errno == ENOENT)
                                return 0;
                        return cove_err_set(err, errno, "open %s", path);
                }
                struct stat st;
                if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
                        close(fd);
                        return 0; /* replaced meanwhile */
                }
                if (st.st_nlink > 1) {
                        char key[64];
                        snprintf(key, sizeof(key), "%ju:%ju", (uintmax_t)st.st_dev,
                                 (uintmax_t)st.st_ino);
                        json_t *first = json_object_get(c->links, key);
                        if (first) {
                                e.link = (char *)json_string_value(first);
                                close(fd);
                                return cove_manifest_add(&c->m, &e)
                                           ? 0
                                           : cove_err_set(err, ENOMEM, "manifest");
                        }
                        json_object_set_new(c->links, key, json_string_nocheck(path));
                }
                e.ctime_ns = (int64_t)sx.stx_ctime.tv_sec * 1000000000LL + sx.stx_ctime.tv_nsec;
                e.ino = (uint64_t)st.st_ino;
                if (st.st_ino != sx.stx_ino || e.ctime_ns <= 0)
                        e.ctime_ns = 0; /* replaced between statx and open: no reuse */
                struct cove_mentry *ne = cove_manifest_add(&c->m, &e);
                int rc = ne ? 0 : cove_err_set(err, ENOMEM, "manifest");
                if (rc == 0)
                        rc = cap_xattrs(ne, fd, NULL, 0, err);
                int reused = 0;
                if (rc == 0 && e.ctime_ns)
                        rc = reused = cap_reuse(c, &st, e.ctime_ns, err);
                if (rc == 1)
                        rc = 0;
                if (rc == 0 && !reused)
                        rc = cap_file_data(c, fd, (uint64_t)st.st_size, ne, err);
                if (rc < 0 && !cap_failed(c))
                        cove_err_wrap(err, "%s", path);
                close(fd);
                c->stats.entries++;
                return rc;
        }
        case COVE_ENT_SYMLINK: {
                ssize_t n = readlinkat(dfd, name, target, sizeof(target));
                if (n < 0)
                        return errno == ENOENT ? 0 : cove_err_set(err, errno, "readlink %s", path);
                if ((size_t)n >= sizeof(target))
                        return cove_err_setk(err, COVE_E_LIMIT, 0, "%s: symlink target too long",
                                             path);
                target[n] = '\0';
                e.target = target;
                break;
        }
        case COVE_ENT_CHAR:
        case COVE_ENT_BLOCK:
                e.rdev = makedev(sx.stx_rdev_major, sx.stx_rdev_minor);
                break;
        default:
                break;
        }
        struct cove_mentry *ne = cove_manifest_add(&c->m, &e);
        if (!ne)
                return cove_err_set(err, ENOMEM, "manifest");
        c->stats.entries++;
        if (cap_xattrs(ne, -1, proc, 0, err) < 0)
                return -1;
        if (e.type != COVE_ENT_DIR || other_mount)
                return 0;
        if (depth + 1 >= COVE_PATH_DEPTH_MAX)
                return cove_err_setk(err, COVE_E_LIMIT, 0, "%s: nested too deep", path);
        int sub = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0)
                return errno == ENOENT ? 0 : cove_err_set(err, errno, "open %s", path);
        int rc = cap_dir(c, sub, path, depth + 1, err);
        close(sub);
        return rc;
}

/* Walk one directory (takes no ownership of dfd): children sorted by name, depth first. */
static int cap_dir(struct capture *c, int dfd, const char *rel, int depth, struct cove_err *err)
{
        int dup_fd = fcntl(dfd, F_DUPFD_CLOEXEC, 0);
        if (dup_fd < 0)
                return cove_err_set(err, errno, "open %s", rel);
        DIR *d = fdopendir(dup_fd);
        if (!d) {
                close(dup_fd);
                return cove_err_set(err, errno, "open %s", rel);
        }
        rewinddir(d); /* the dup shares its offset with dfd: a second walk starts at 0 */
        char **names = NULL;
        size_t n = 0, cap = 0;
        int rc = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
                if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
                        continue;
                if (n == cap) {
                        cap = cap ? cap * 2 : 32;
                        char **nn = realloc(names, cap * sizeof(*nn));
                        if (!nn) {
                                rc = cove_err_set(err, ENOMEM, "list %s", rel);
                                break;
                        }
                        names = nn;
                }
                if (!(names[n] = strdup(de->d_name))) {
                        rc = cove_err_set(err, ENOMEM, "list %s", rel);
                        break;
                }
                n++;
        }
        closedir(d);
        if (rc == 0 && n)
                qsort(names, n, sizeof(*names), cmp_str);
        char path[COVE_PATH_MAX + 2];
        for (size_t i = 0; rc == 0 && i < n; i++) {
                int l = strcmp(rel, ".") ? snprintf(path, sizeof(path), "%s/%s", rel, names[i])
                                         : snprintf(path, sizeof(path), "%s", names[i]);
                if (l < 0 || (size_t)l > COVE_PATH_MAX) {
                        rc = cove_err_setk(err, COVE_E_LIMIT, ENAMETOOLONG, "path below %s", rel);
                        break;
                }
                rc = cap_one(c, dfd, names[i], path, depth, err);
                if (rc == 0 && cap_failed(c))
                        rc = -1;
        }
        for (size_t i = 0; i < n; i++)
                free(names[i]);
        free(names);
        return rc;
}

static int seal_manifest(struct cove_store *st, struct worker *w, const struct tenant *t,
                         const struct cove_manifest *m, uint8_t **obj, size_t *olen,
                         struct cove_err *err)
{
        char *json = NULL;
        size_t jl = 0;
        if (cove_manifest_serialize(m, &json, &jl, err) < 0)
                return -1;
        char ad[2 * COVE_ID_MAX + 2];
        snprintf(ad, sizeof(ad), "%s/%s", t->name, m->id);
        int rc = seal(w, t->keys->manifest_enc, MANIFEST_MAGIC, ad, strlen(ad), (uint8_t *)json, jl,
                      st->level, obj, olen, err);
        OPENSSL_cleanse(json, jl);
        free(json);
        return rc;
}

static int load_manifest(struct cove_store *st, const struct tenant *t, const char *snap_id,
                         struct cove_manifest *m, struct cove_err *err)
{
        cove_manifest_init(m);
        char name[256];
        manifest_obj_name(t->name, snap_id, name, sizeof(name));
        void *obj = NULL;
        size_t olen = 0;
        if (st->cs->ops->get(st->cs, name, MANIFEST_OBJ_MAX, &obj, &olen, err) < 0) {
                if (err && err->kind == COVE_E_NOT_FOUND)
                        return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "no such snapshot");
                return cove_err_wrap(err, "read manifest");
        }
        struct worker w;
        if (worker_init(&w) < 0) {
                worker_fini(&w);
                free(obj);
                return cove_err_set(err, ENOMEM, "read manifest");
        }
        char ad[2 * COVE_ID_MAX + 2];
        snprintf(ad, sizeof(ad), "%s/%s", t->name, snap_id);
        uint8_t *plain = NULL;
        size_t plen = 0;
        int rc = unseal(&w, t->keys->manifest_enc, MANIFEST_MAGIC, ad, strlen(ad), obj, olen, 0,
                        COVE_MANIFEST_MAX_BYTES, &plain, &plen, err);
        worker_fini(&w);
        free(obj);
        if (rc < 0)
                return cove_err_wrap(err, "manifest");
        rc = cove_manifest_parse(plain, plen, m, err);
        OPENSSL_cleanse(plain, plen);
        free(plain);
        if (rc == 0 && (strcmp(m->id, snap_id) || strcmp(m->tenant, t->name)))
                rc = cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "manifest names another snapshot");
        if (rc < 0)
                cove_manifest_clear(m);
        return rc;
}

static int check_ids(const char *tenant, const char *snap_id, const char *parent,
                     struct cove_err *err)
{
        if (!cove_tenant_name_valid(tenant))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "invalid tenant name");
        if (!cove_snapshot_id_valid(snap_id))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "invalid snapshot id");
        if (parent && !cove_snapshot_id_valid(parent))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "invalid parent snapshot id");
        return 0;
}

static int capture_begin(struct capture *c, struct cove_store *st, const char *tenant,
                         const char *snap_id, const char *parent, const char *kind,
                         struct cove_err *err)
{
        memset(c, 0, sizeof(*c));
        pthread_mutex_init(&c->mu, NULL);
        cove_manifest_init(&c->m);
        cove_manifest_init(&c->prev);
        c->st = st;
        c->snap_id = snap_id;
        if (check_ids(tenant, snap_id, parent, err) < 0)
                return -1;
        if (!(c->t = tenant_get(st, tenant, err)))
                return -1;
        char name[256];
        manifest_obj_name(tenant, snap_id, name, sizeof(name));
        int has = st->cs->ops->has(st->cs, name, err);
        if (has < 0)
                return -1;
        if (has)
                return cove_err_setk(err, COVE_E_CONFLICT, EEXIST, "snapshot exists");
        snprintf(c->m.id, sizeof(c->m.id), "%s", snap_id);
        snprintf(c->m.tenant, sizeof(c->m.tenant), "%s", tenant);
        snprintf(c->m.parent, sizeof(c->m.parent), "%s", parent ? parent : "");
        snprintf(c->m.kind, sizeof(c->m.kind), "%s", kind);
        c->m.created_at = cove_now_ms();
        cove_cdc_init(&c->cdc, COVE_CDC_MIN, COVE_CDC_AVG, COVE_CDC_MAX, c->t->gear_seed);
        c->links = json_object();
        c->rb = rbuf_new();
        if (!c->links || !c->rb)
                return cove_err_set(err, ENOMEM, "capture");
        if (!(c->batch = st->cs->ops->batch_new(st->cs, err)))
                return -1;
        pthread_mutex_lock(&st->mu);
        st->writers++;
        pthread_mutex_unlock(&st->mu);
        if (pool_start(&c->pool, st->threads, cap_job, c, err) < 0)
                return -1;
        return 0;
}

/* Drain the workers; when rc == 0 make the chunks durable and write the manifest last.
 * Always releases everything. */
static int capture_end(struct capture *c, int rc, struct cove_snapshot_stats *out,
                       struct cove_err *err)
{
        struct cove_store *st = c->st;
        int64_t t0 = cove_mono_ns();
        if (c->pool.fn) {
                pool_wait(&c->pool);
                pool_stop(&c->pool, &c->stats);
        }
        if (rc == 0 && c->failed) {
                if (err)
                        *err = c->err;
                rc = -1;
        }
        if (rc == 0) {
                int64_t t1 = cove_mono_ns();
                rc = st->cs->ops->batch_commit(st->cs, c->batch, err);
                c->stats.ns_write += (uint64_t)(cove_mono_ns() - t1);
        }
        if (rc == 0) {
                for (size_t k = 0; k < c->m.nchunks; k++)
                        if (!c->m.chunks[k].hole)
                                memcpy(c->m.chunks[k].id, cap_idslot(c, k), 32);
                c->m.size_bytes = c->stats.size_bytes;
                c->m.new_bytes = c->new_bytes;
                struct worker w;
                uint8_t *obj = NULL;
                size_t olen = 0;
                if (worker_init(&w) < 0)
                        rc = cove_err_set(err, ENOMEM, "manifest");
                else
                        rc = seal_manifest(st, &w, c->t, &c->m, &obj, &olen, err);
                worker_fini(&w);
                if (rc == 0) {
                        char name[256];
                        manifest_obj_name(c->t->name, c->snap_id, name, sizeof(name));
                        int64_t t1 = cove_mono_ns();
                        int pr = st->cs->ops->put(st->cs, NULL, name, obj, olen, err);
                        c->stats.ns_write += (uint64_t)(cove_mono_ns() - t1);
                        if (pr == 1)
                                rc = cove_err_setk(err, COVE_E_CONFLICT, EEXIST, "snapshot exists");
                        else if (pr < 0)
                                rc = cove_err_wrap(err, "write manifest");
                        c->stored_bytes += olen;
                }
                free(obj);
        }
        if (c->t) {
                pthread_mutex_lock(&st->mu);
                if (c->batch && --st->writers == 0)
                        idset_free(&st->inflight);
                pthread_mutex_unlock(&st->mu);
        }
        if (c->batch)
                st->cs->ops->batch_free(st->cs, c->batch);
        if (rc == 0 && out) {
                *out = c->stats;
                out->new_bytes = c->new_bytes;
                out->stored_bytes = c->stored_bytes;
                out->new_chunks = c->new_chunks;
                out->entries = c->m.n;
                out->ns_total += (uint64_t)(cove_mono_ns() - t0);
        }
        for (size_t i = 0; i < COVE_ARRAY_SIZE(c->segs); i++)
                free(c->segs[i]);
        idset_free(&c->seen);
        rbuf_put(c->rb);
        json_decref(c->links);
        json_decref(c->prev_idx);
        cove_manifest_clear(&c->prev);
        cove_manifest_clear(&c->m);
        pthread_mutex_destroy(&c->mu);
        return rc;
}

int cove_snapshot_capture_tree(struct cove_store *st, const char *tenant, const char *snap_id,
                               const char *parent_id, int dirfd, struct cove_snapshot_stats *out,
                               struct cove_err *err)
{
        int64_t t0 = cove_mono_ns();
        struct capture *c = calloc(1, sizeof(*c));
        if (!c)
                return cove_err_set(err, ENOMEM, "snapshot %s", snap_id ? snap_id : "?");
        int rc = capture_begin(c, st, tenant, snap_id, parent_id, "files", err);
        if (rc == 0 && parent_id)
                cap_load_prev(c, parent_id);
        if (rc == 0) {
                struct statx sx;
                if (statx(dirfd, "", AT_EMPTY_PATH, STATX_BASIC_STATS | STATX_MNT_ID, &sx) < 0 ||
                    !S_ISDIR(sx.stx_mode)) {
                        rc = cove_err_setk(err, COVE_E_BAD_REQUEST, errno,
                                           "capture root is not a directory");
                } else {
                        c->root_mnt_set = !!(sx.stx_mask & STATX_MNT_ID);
                        c->root_mnt = sx.stx_mnt_id;
                        struct cove_mentry e = {.path = ".",
                                                .type = COVE_ENT_DIR,
                                                .mode = sx.stx_mode & 07777,
                                                .uid = sx.stx_uid,
                                                .gid = sx.stx_gid};
                        e.mtime_ns =
                            (int64_t)sx.stx_mtime.tv_sec * 1000000000LL + sx.stx_mtime.tv_nsec;
                        struct cove_mentry *ne = cove_manifest_add(&c->m, &e);
                        char proc[64];
                        snprintf(proc, sizeof(proc), "/proc/self/fd/%d", dirfd);
                        if (!ne)
                                rc = cove_err_set(err, ENOMEM, "manifest");
                        else
                                rc = cap_xattrs(ne, -1, proc, 1, err);
                        if (rc == 0)
                                rc = cap_dir(c, dirfd, ".", 0, err);
                        if (rc < 0 && c->failed && err)
                                *err = c->err;
                }
        }
        struct cove_snapshot_stats s = {0};
        rc = capture_end(c, rc, &s, err);
        free(c);
        if (rc < 0)
                return cove_err_wrap(err, "snapshot %s", snap_id ? snap_id : "?");
        s.ns_total = (uint64_t)(cove_mono_ns() - t0);
        if (out)
                *out = s;
        return 0;
}

int cove_snapshot_capture_stream(struct cove_store *st, const char *tenant, const char *snap_id,
                                 const char *parent_id, int fd, struct cove_snapshot_stats *out,
                                 struct cove_err *err)
{
        int64_t t0 = cove_mono_ns();
        struct capture *c = calloc(1, sizeof(*c));
        if (!c)
                return cove_err_set(err, ENOMEM, "snapshot %s", snap_id ? snap_id : "?");
        int rc = capture_begin(c, st, tenant, snap_id, parent_id, "memory", err);
        if (rc == 0) {
                struct cove_mentry e = {.path = ".", .type = COVE_ENT_FILE, .mode = 0600};
                e.mtime_ns = cove_now_ms() * 1000000LL;
                if (!cove_manifest_add(&c->m, &e)) {
                        rc = cove_err_set(err, ENOMEM, "manifest");
                } else {
                        off_t start = lseek(fd, 0, SEEK_CUR);
                        int64_t n = cap_region(c, fd, start < 0 ? 0 : (uint64_t)start, INT64_MAX,
                                               COVE_FIXED_CHUNK, err);
                        if (n < 0) {
                                rc = -1;
                                if (c->failed && err)
                                        *err = c->err;
                        } else {
                                c->m.entries[0].size = (uint64_t)n;
                                c->stats.size_bytes = (uint64_t)n;
                        }
                }
        }
        struct cove_snapshot_stats s = {0};
        rc = capture_end(c, rc, &s, err);
        free(c);
        if (rc < 0)
                return cove_err_wrap(err, "snapshot %s", snap_id ? snap_id : "?");
        s.ns_total = (uint64_t)(cove_mono_ns() - t0);
        if (out)
                *out = s;
        return 0;
}

/* ---- restore ---- */

struct restore {
        struct cove_store *st;
        struct tenant *t;
        struct cove_manifest m;
        struct pool pool;
        pthread_mutex_t mu;
        int failed;
        struct cove_err err;
        uint64_t bytes;
};

static void rs_job(void *ctx, struct worker *w, struct job *j)
{
        struct restore *r = ctx;
        struct cove_err e = {0};
        if (__atomic_load_n(&r->failed, __ATOMIC_RELAXED))
                return;
        uint8_t *plain = NULL;
        const struct cove_mchunk *ch = &r->m.chunks[j->k];
        if (chunk_read(r->st, w, r->t, ch->id, (size_t)ch->len, &plain, &e) == 0) {
                if (j->fd >= 0) {
                        int64_t t0 = cove_mono_ns();
                        size_t done = 0;
                        while (done < ch->len) {
                                ssize_t n = pwrite(j->fd, plain + done, (size_t)ch->len - done,
                                                   (off_t)(j->off + done));
                                if (n < 0 && errno == EINTR)
                                        continue;
                                if (n <= 0) {
                                        cove_err_set(&e, n < 0 ? errno : EIO, "write");
                                        break;
                                }
                                done += (size_t)n;
                        }
                        w->ns_write += (uint64_t)(cove_mono_ns() - t0);
                }
                free(plain);
                __atomic_add_fetch(&r->bytes, ch->len, __ATOMIC_RELAXED);
        }
        if (e.msg[0]) {
                pthread_mutex_lock(&r->mu);
                if (!r->failed) {
                        r->failed = 1;
                        r->err = e;
                }
                pthread_mutex_unlock(&r->mu);
        }
}

static int restore_begin(struct restore *r, struct cove_store *st, const char *tenant,
                         const char *snap_id, const char *kind, struct cove_err *err)
{
        memset(r, 0, sizeof(*r));
        pthread_mutex_init(&r->mu, NULL);
        r->st = st;
        if (check_ids(tenant, snap_id, NULL, err) < 0)
                return -1;
        if (!(r->t = tenant_get(st, tenant, err)))
                return -1;
        if (load_manifest(st, r->t, snap_id, &r->m, err) < 0)
                return -1;
        if (kind && strcmp(r->m.kind, kind))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "is a %s snapshot, not %s",
                                     r->m.kind, kind);
        return pool_start(&r->pool, st->threads, rs_job, r, err);
}

static void restore_end(struct restore *r, struct cove_snapshot_stats *out)
{
        struct cove_snapshot_stats s = {0};
        if (r->pool.fn) {
                pool_wait(&r->pool);
                pool_stop(&r->pool, &s);
        }
        if (out) {
                *out = s;
                out->size_bytes = r->m.size_bytes;
                out->entries = r->m.n;
                out->chunks = r->m.nchunks;
        }
        cove_manifest_clear(&r->m);
        pthread_mutex_destroy(&r->mu);
}

/* Write an entry's chunks into fd through the pool; waits for them. */
static int rs_data(struct restore *r, const struct cove_mentry *e, int fd, struct cove_err *err)
{
        uint64_t off = 0;
        for (size_t i = 0; i < e->nchunks; i++) {
                const struct cove_mchunk *ch = &r->m.chunks[e->chunk_off + i];
                if (!ch->hole) {
                        struct job j = {.k = e->chunk_off + i, .fd = fd, .off = off};
                        pool_submit(&r->pool, &j);
                }
                off += ch->len;
                if (__atomic_load_n(&r->failed, __ATOMIC_RELAXED))
                        break;
        }
        pool_wait(&r->pool);
        if (r->failed) {
                if (err)
                        *err = r->err;
                return -1;
        }
        if (fd >= 0 && ftruncate(fd, (off_t)e->size) < 0)
                return cove_err_set(err, errno, "truncate");
        return 0;
}

static int open_beneath(int root, const char *path, int flags)
{
        if (!strcmp(path, "."))
                return openat(root, ".", flags | O_CLOEXEC);
        struct open_how how = {.flags = (uint64_t)(flags | O_CLOEXEC | O_NOFOLLOW),
                               .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
                                          RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV};
        return (int)syscall(SYS_openat2, root, path, &how, sizeof(how));
}

static int rs_xattrs(const struct cove_mentry *e, int fd, const char *path, int follow,
                     struct cove_err *err)
{
        int root = geteuid() == 0;
        for (size_t i = 0; i < e->nxattrs; i++) {
                const struct cove_xattr *x = &e->xattrs[i];
                int rc = fd >= 0  ? fsetxattr(fd, x->name, x->value, x->len, 0)
                         : follow ? setxattr(path, x->name, x->value, x->len, 0)
                                  : lsetxattr(path, x->name, x->value, x->len, 0);
                if (rc == 0)
                        continue;
                /* Without root, trusted.* and security.* cannot be set: skipped. */
                if (!root && errno == EPERM &&
                    (!strncmp(x->name, "trusted.", 8) || !strncmp(x->name, "security.", 9)))
                        continue;
                return cove_err_set(err, errno, "set xattr %s", x->name);
        }
        return 0;
}

static void ts_of(const struct cove_mentry *e, struct timespec ts[2])
{
        ts[0].tv_sec = ts[1].tv_sec = (time_t)(e->mtime_ns / 1000000000LL);
        ts[0].tv_nsec = ts[1].tv_nsec = (long)(e->mtime_ns % 1000000000LL);
        if (ts[0].tv_nsec < 0) {
                ts[0].tv_sec--;
                ts[1].tv_sec--;
                ts[0].tv_nsec = ts[1].tv_nsec += 1000000000L;
        }
}

static int rs_entry(struct restore *r, int root, const struct cove_mentry *e, int *pfd,
                    char *pcache, struct cove_err *err)
{
        char parent[COVE_PATH_MAX + 1];
        const char *slash = strrchr(e->path, '/');
        const char *base = slash ? slash + 1 : e->path;
        if (slash)
                snprintf(parent, sizeof(parent), "%.*s", (int)(slash - e->path), e->path);
        else
                strcpy(parent, ".");
        if (*pfd < 0 || strcmp(parent, pcache)) {
                if (*pfd >= 0)
                        close(*pfd);
                *pfd = open_beneath(root, parent, O_RDONLY | O_DIRECTORY);
                if (*pfd < 0)
                        return cove_err_set(err, errno, "open directory %s", parent);
                strcpy(pcache, parent);
        }
        int d = *pfd, is_root = geteuid() == 0;
        struct timespec ts[2];
        ts_of(e, ts);
        char proc[64 + 256];
        snprintf(proc, sizeof(proc), "/proc/self/fd/%d/%s", d, base);
        switch (e->type) {
        case COVE_ENT_FILE: {
                if (e->link) {
                        const char *ls = strrchr(e->link, '/');
                        char lp[COVE_PATH_MAX + 1];
                        if (ls)
                                snprintf(lp, sizeof(lp), "%.*s", (int)(ls - e->link), e->link);
                        else
                                strcpy(lp, ".");
                        cleanup_close int lfd = open_beneath(root, lp, O_RDONLY | O_DIRECTORY);
                        if (lfd < 0 || linkat(lfd, ls ? ls + 1 : e->link, d, base, 0) < 0)
                                return cove_err_set(err, errno, "link to %s", e->link);
                        return 0;
                }
                cleanup_close int fd =
                    openat(d, base, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
                if (fd < 0)
                        return cove_err_set(err, errno, "create");
                if (rs_data(r, e, fd, err) < 0)
                        return -1;
                if (rs_xattrs(e, fd, NULL, 0, err) < 0)
                        return -1;
                if (is_root && fchown(fd, e->uid, e->gid) < 0)
                        return cove_err_set(err, errno, "chown");
                if (fchmod(fd, e->mode) < 0 || futimens(fd, ts) < 0)
                        return cove_err_set(err, errno, "set mode and times");
                return 0;
        }
        case COVE_ENT_DIR:
                if (mkdirat(d, base, 0700) < 0)
                        return cove_err_set(err, errno, "mkdir");
                break; /* mode and times once its children exist */
        case COVE_ENT_SYMLINK:
                if (symlinkat(e->target, d, base) < 0)
                        return cove_err_set(err, errno, "symlink");
                break;
        case COVE_ENT_CHAR:
        case COVE_ENT_BLOCK:
        case COVE_ENT_FIFO:
        case COVE_ENT_SOCKET: {
                mode_t t = e->type == COVE_ENT_CHAR    ? S_IFCHR
                           : e->type == COVE_ENT_BLOCK ? S_IFBLK
                           : e->type == COVE_ENT_FIFO  ? S_IFIFO
                                                       : S_IFSOCK;
                if (mknodat(d, base, t | 0600, (dev_t)e->rdev) < 0)
                        return cove_err_set(err, errno, "mknod %s", cove_ent_type_name(e->type));
                break;
        }
        }
        if (rs_xattrs(e, -1, proc, 0, err) < 0)
                return -1;
        if (is_root && fchownat(d, base, e->uid, e->gid, AT_SYMLINK_NOFOLLOW) < 0)
                return cove_err_set(err, errno, "chown");
        if (e->type == COVE_ENT_DIR)
                return 0;
        if (e->type != COVE_ENT_SYMLINK && fchmodat(d, base, e->mode, 0) < 0)
                return cove_err_set(err, errno, "chmod");
        if (utimensat(d, base, ts, AT_SYMLINK_NOFOLLOW) < 0)
                return cove_err_set(err, errno, "set times");
        return 0;
}

int cove_snapshot_restore_tree(struct cove_store *st, const char *tenant, const char *snap_id,
                               int dirfd, struct cove_snapshot_stats *out, struct cove_err *err)
{
        int64_t t0 = cove_mono_ns();
        struct restore r;
        int rc = restore_begin(&r, st, tenant, snap_id, "files", err);
        int pfd = -1;
        char pcache[COVE_PATH_MAX + 1] = "";
        if (rc == 0) {
                int dd = fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
                DIR *dir = dd >= 0 ? fdopendir(dd) : NULL;
                if (!dir) {
                        if (dd >= 0)
                                close(dd);
                        rc = cove_err_set(err, errno, "open restore target");
                } else {
                        struct dirent *de;
                        while ((de = readdir(dir)))
                                if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
                                        rc = cove_err_setk(err, COVE_E_CONFLICT, ENOTEMPTY,
                                                           "restore target is not empty");
                        closedir(dir);
                }
        }
        size_t i = 1;
        for (; rc == 0 && i < r.m.n; i++) {
                if (rs_entry(&r, dirfd, &r.m.entries[i], &pfd, pcache, err) < 0) {
                        cove_err_wrap(err, "%s", r.m.entries[i].path);
                        rc = -1;
                }
        }
        if (pfd >= 0)
                close(pfd);
        /* Directories last, deepest first: their mode may forbid creating children and
         * creating children changes their mtime. */
        for (size_t k = r.m.n; rc == 0 && k-- > 0;) {
                const struct cove_mentry *e = &r.m.entries[k];
                if (e->type != COVE_ENT_DIR)
                        continue;
                cleanup_close int fd = open_beneath(dirfd, e->path, O_RDONLY | O_DIRECTORY);
                struct timespec ts[2];
                ts_of(e, ts);
                if (fd < 0)
                        rc = cove_err_set(err, errno, "%s: open", e->path);
                else if (k == 0 && (rs_xattrs(e, fd, NULL, 0, err) < 0 ||
                                    (geteuid() == 0 && fchown(fd, e->uid, e->gid) < 0)))
                        rc = cove_err_wrap(err, "%s", e->path);
                else if (fchmod(fd, e->mode) < 0 || futimens(fd, ts) < 0)
                        rc = cove_err_set(err, errno, "%s: set mode and times", e->path);
        }
        restore_end(&r, out);
        if (rc < 0)
                return cove_err_wrap(err, "snapshot %s", snap_id ? snap_id : "?");
        if (out)
                out->ns_total = (uint64_t)(cove_mono_ns() - t0);
        return 0;
}

int cove_snapshot_restore_stream(struct cove_store *st, const char *tenant, const char *snap_id,
                                 int fd, struct cove_snapshot_stats *out, struct cove_err *err)
{
        int64_t t0 = cove_mono_ns();
        struct restore r;
        int rc = restore_begin(&r, st, tenant, snap_id, "memory", err);
        if (rc == 0)
                rc = rs_data(&r, &r.m.entries[0], fd, err);
        restore_end(&r, out);
        if (rc < 0)
                return cove_err_wrap(err, "snapshot %s", snap_id ? snap_id : "?");
        if (out)
                out->ns_total = (uint64_t)(cove_mono_ns() - t0);
        return 0;
}

int cove_snapshot_verify(struct cove_store *st, const char *tenant, const char *snap_id,
                         struct cove_err *err)
{
        struct restore r;
        int rc = restore_begin(&r, st, tenant, snap_id, NULL, err);
        for (size_t i = 0; rc == 0 && i < r.m.n; i++) {
                const struct cove_mentry *e = &r.m.entries[i];
                if (e->type == COVE_ENT_FILE && e->nchunks && rs_data(&r, e, -1, err) < 0)
                        rc = cove_err_wrap(err, "%s", e->path);
        }
        restore_end(&r, NULL);
        if (rc < 0)
                return cove_err_wrap(err, "snapshot %s", snap_id ? snap_id : "?");
        return 0;
}

int cove_snapshot_info(struct cove_store *st, const char *tenant, const char *snap_id,
                       struct cove_snapshot_info *out, struct cove_err *err)
{
        if (check_ids(tenant, snap_id, NULL, err) < 0)
                return -1;
        struct tenant *t = tenant_get(st, tenant, err);
        struct cove_manifest m;
        if (!t || load_manifest(st, t, snap_id, &m, err) < 0)
                return cove_err_wrap(err, "snapshot %s", snap_id);
        memset(out, 0, sizeof(*out));
        snprintf(out->parent, sizeof(out->parent), "%s", m.parent);
        snprintf(out->kind, sizeof(out->kind), "%s", m.kind);
        out->created_at = m.created_at;
        out->size_bytes = m.size_bytes;
        out->new_bytes = m.new_bytes;
        out->entries = m.n;
        out->chunks = m.nchunks;
        cove_manifest_clear(&m);
        return 0;
}

int cove_snapshot_delete(struct cove_store *st, const char *tenant, const char *snap_id,
                         struct cove_err *err)
{
        if (check_ids(tenant, snap_id, NULL, err) < 0)
                return -1;
        char name[256];
        manifest_obj_name(tenant, snap_id, name, sizeof(name));
        int rc = st->cs->ops->del(st->cs, name, INT64_MAX, err);
        if (rc == 0)
                cove_err_setk(err, COVE_E_NOT_FOUND, 0, "no such snapshot");
        if (rc <= 0)
                return cove_err_wrap(err, "snapshot %s", snap_id);
        return 0;
}

struct strv {
        char **v;
        size_t n, cap;
        int64_t *mtime;
        uint64_t *size;
};

static int strv_cb(const char *name, uint64_t size, int64_t mtime_ms, void *arg)
{
        struct strv *s = arg;
        if (s->n == s->cap) {
                size_t nc = s->cap ? s->cap * 2 : 64;
                char **nv = realloc(s->v, nc * sizeof(*nv));
                int64_t *nm = nv ? realloc(s->mtime, nc * sizeof(*nm)) : NULL;
                uint64_t *ns = nm ? realloc(s->size, nc * sizeof(*ns)) : NULL;
                if (nv)
                        s->v = nv;
                if (nm)
                        s->mtime = nm;
                if (!ns)
                        return -1;
                s->size = ns;
                s->cap = nc;
        }
        if (!(s->v[s->n] = strdup(name)))
                return -1;
        s->mtime[s->n] = mtime_ms;
        s->size[s->n] = size;
        s->n++;
        return 0;
}

static void strv_free(struct strv *s)
{
        for (size_t i = 0; i < s->n; i++)
                free(s->v[i]);
        free(s->v);
        free(s->mtime);
        free(s->size);
}

static int list_objects(struct cove_store *st, const char *prefix, struct strv *s,
                        struct cove_err *err)
{
        memset(s, 0, sizeof(*s));
        if (st->cs->ops->list(st->cs, prefix, strv_cb, s, err) < 0) {
                strv_free(s);
                return -1;
        }
        return 0;
}

static int list_manifests(struct cove_store *st, const char *tenant, int64_t before_ms, char ***ids,
                          size_t *n, struct cove_err *err);

int cove_snapshot_list(struct cove_store *st, const char *tenant, char ***ids, size_t *n,
                       struct cove_err *err)
{
        return list_manifests(st, tenant, INT64_MAX, ids, n, err);
}

int cove_snapshot_list_settled(struct cove_store *st, const char *tenant, char ***ids, size_t *n,
                               struct cove_err *err)
{
        return list_manifests(st, tenant, cove_now_ms() - st->grace_ms, ids, n, err);
}

static int list_manifests(struct cove_store *st, const char *tenant, int64_t before_ms, char ***ids,
                          size_t *n, struct cove_err *err)
{
        if (!cove_tenant_name_valid(tenant))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "invalid tenant name");
        char prefix[128];
        snprintf(prefix, sizeof(prefix), "%s/manifests/", tenant);
        struct strv s;
        if (list_objects(st, prefix, &s, err) < 0)
                return -1;
        size_t pl = strlen(prefix), k = 0;
        for (size_t i = 0; i < s.n; i++) {
                if (!cove_snapshot_id_valid(s.v[i] + pl) || s.mtime[i] >= before_ms) {
                        free(s.v[i]);
                        continue;
                }
                memmove(s.v[i], s.v[i] + pl, strlen(s.v[i] + pl) + 1);
                s.v[k++] = s.v[i];
        }
        s.n = k;
        if (s.n)
                qsort(s.v, s.n, sizeof(*s.v), cmp_str);
        free(s.mtime);
        free(s.size);
        *ids = s.v;
        *n = s.n;
        return 0;
}

void cove_snapshot_list_free(char **ids, size_t n)
{
        for (size_t i = 0; i < n; i++)
                free(ids[i]);
        free(ids);
}

static int mark_manifest(struct cove_store *st, struct tenant *t, const char *id,
                         struct idset *marked, struct cove_err *err)
{
        struct cove_manifest m;
        if (load_manifest(st, t, id, &m, err) < 0)
                return cove_err_wrap(err, "snapshot %s", id);
        int rc = 0;
        for (size_t k = 0; rc == 0 && k < m.nchunks; k++)
                if (!m.chunks[k].hole && idset_add(marked, m.chunks[k].id) < 0)
                        rc = cove_err_set(err, ENOMEM, "gc mark");
        cove_manifest_clear(&m);
        return rc;
}

static int hexval(char c)
{
        return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* The race GC must not lose: a capture that deduplicates against an existing chunk writes
 * nothing, so that chunk's only protection is what the capture does before its manifest
 * exists. Two mechanisms cover it:
 *  - in this process, captures register every chunk id they reference in st->inflight
 *    (under st->mu) *before* touching or writing the object; GC checks the registry and
 *    deletes under the same lock. Either the capture registered first (GC skips the
 *    chunk), or GC deleted first and the capture's touch() then finds nothing and writes
 *    the chunk again;
 *  - other processes (other nodes on a shared store) are covered by the grace period:
 *    a capture touch()es every chunk it deduplicates against, new chunks are new, and del()
 *    refuses objects touched after the cutoff, re-checking after moving the object aside
 *    so a touch racing with the delete is never lost. Manifests younger than the grace
 *    period are marked too (their catalog row may not exist yet). This is safe as long as
 *    no capture takes longer than the grace period (default 1 h).
 */
int cove_store_gc(struct cove_store *st, const char *tenant, const char *const *keep_ids, size_t n,
                  struct cove_gc_stats *out, struct cove_err *err)
{
        struct cove_gc_stats gs = {0};
        struct tenant *t = tenant_get(st, tenant, err);
        if (!t)
                return cove_err_wrap(err, "gc");
        int64_t cutoff = cove_now_ms() - st->grace_ms;
        struct idset marked = {0};
        struct strv man = {0}, ch = {0};
        int rc = 0;
        for (size_t i = 0; rc == 0 && i < n; i++) {
                if (!cove_snapshot_id_valid(keep_ids[i]))
                        rc = cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "gc: invalid snapshot id");
                else
                        rc = mark_manifest(st, t, keep_ids[i], &marked, err);
                gs.kept++;
        }
        char prefix[128];
        snprintf(prefix, sizeof(prefix), "%s/manifests/", tenant);
        if (rc == 0)
                rc = list_objects(st, prefix, &man, err);
        for (size_t i = 0; rc == 0 && i < man.n; i++) {
                const char *id = man.v[i] + strlen(prefix);
                if (man.mtime[i] < cutoff || !cove_snapshot_id_valid(id))
                        continue;
                int listed = 0;
                for (size_t k = 0; k < n && !listed; k++)
                        listed = !strcmp(keep_ids[k], id);
                if (!listed) {
                        rc = mark_manifest(st, t, id, &marked, err);
                        gs.kept++;
                }
        }
        snprintf(prefix, sizeof(prefix), "%s/chunks/", tenant);
        if (rc == 0)
                rc = list_objects(st, prefix, &ch, err);
        gs.marked = marked.n;
        size_t pl = strlen(prefix);
        for (size_t i = 0; rc == 0 && i < ch.n; i++) {
                const char *nm = ch.v[i] + pl; /* "ab/cdef…" */
                uint8_t id[32];
                char hex[64];
                if (strlen(nm) != 65 || nm[2] != '/')
                        continue; /* not a chunk name of ours */
                memcpy(hex, nm, 2);
                memcpy(hex + 2, nm + 3, 62);
                int ok = 1;
                for (int k = 0; k < 32 && ok; k++) {
                        int hi = hexval(hex[2 * k]), lo = hexval(hex[2 * k + 1]);
                        ok = hi >= 0 && lo >= 0;
                        id[k] = (uint8_t)(hi * 16 + lo);
                }
                if (!ok || idset_find(&marked, id))
                        continue;
                if (ch.mtime[i] >= cutoff) {
                        gs.young++;
                        continue;
                }
                pthread_mutex_lock(&st->mu);
                if (idset_find(&st->inflight, id)) {
                        pthread_mutex_unlock(&st->mu);
                        gs.inflight++;
                        continue;
                }
                int d = st->cs->ops->del(st->cs, ch.v[i], cutoff, err);
                pthread_mutex_unlock(&st->mu);
                if (d < 0)
                        rc = -1;
                else if (d == 1) {
                        gs.swept++;
                        gs.swept_bytes += ch.size[i];
                } else {
                        gs.young++;
                }
        }
        idset_free(&marked);
        strv_free(&man);
        strv_free(&ch);
        if (out)
                *out = gs;
        if (rc < 0)
                return cove_err_wrap(err, "gc of tenant %s", tenant);
        return 0;
}

/* ---- reading a snapshot without restoring it (snapshot diffs) ---- */

int cove_snapshot_manifest(struct cove_store *st, const char *tenant, const char *snap_id,
                           struct cove_manifest *m, struct cove_err *err)
{
        cove_manifest_init(m);
        if (check_ids(tenant, snap_id, NULL, err) < 0)
                return -1;
        struct tenant *t = tenant_get(st, tenant, err);
        if (!t || load_manifest(st, t, snap_id, m, err) < 0)
                return cove_err_wrap(err, "snapshot %s", snap_id);
        return 0;
}

int cove_snapshot_read_entry(struct cove_store *st, const char *tenant,
                             const struct cove_manifest *m, const struct cove_mentry *e, size_t max,
                             uint8_t **out, size_t *len, struct cove_err *err)
{
        *out = NULL;
        *len = 0;
        if (e->type != COVE_ENT_FILE || e->link)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "%s is not a regular file",
                                     e->path);
        if (e->size > max)
                return cove_err_setk(err, COVE_E_LIMIT, 0, "%s is %llu bytes, more than %zu",
                                     e->path, (unsigned long long)e->size, max);
        struct tenant *t = tenant_get(st, tenant, err);
        if (!t)
                return -1;
        uint8_t *buf = calloc(1, e->size ? (size_t)e->size : 1);
        struct worker w;
        if (!buf || worker_init(&w) < 0) {
                if (buf)
                        worker_fini(&w);
                free(buf);
                return cove_err_set(err, ENOMEM, "read %s", e->path);
        }
        uint64_t off = 0;
        int rc = 0;
        for (size_t i = 0; i < e->nchunks && rc == 0; i++) {
                const struct cove_mchunk *ch = &m->chunks[e->chunk_off + i];
                if (ch->len > e->size - off) {
                        rc = cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "%s: chunks overrun",
                                           e->path);
                        break;
                }
                if (!ch->hole) {
                        uint8_t *plain = NULL;
                        rc = chunk_read(st, &w, t, ch->id, (size_t)ch->len, &plain, err);
                        if (rc == 0) {
                                memcpy(buf + off, plain, (size_t)ch->len);
                                free(plain);
                        }
                }
                off += ch->len;
        }
        worker_fini(&w);
        if (rc < 0) {
                free(buf);
                return cove_err_wrap(err, "read %s", e->path);
        }
        *out = buf;
        *len = (size_t)e->size;
        return 0;
}
