/* Tenant key records, the unwrapped-DEK cache and subkeys in locked memory (crypto/keys.h).
 * Providers are in keyprov.c. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crypto/keys.h"
#include "util/cleanup.h"
#include "util/util.h"

#define RECORD_MAX (64 * 1024)

int cove_tenant_name_valid(const char *name)
{
        size_t n = name ? strlen(name) : 0;
        if (n == 0 || n > COVE_TENANT_MAX)
                return 0;
        for (size_t i = 0; i < n; i++) {
                char c = name[i];
                if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '_' || c == '-'))
                        return 0;
        }
        return 1;
}

/* ---- locked memory ---- */

static void *locked_alloc(size_t n, int *locked)
{
        size_t sz = (n + 4095) & ~(size_t)4095;
        void *p = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
                return NULL;
        /* Not fatal when RLIMIT_MEMLOCK is tiny (unprivileged tests); recorded in locked. */
        int l = mlock(p, sz) == 0;
        if (locked)
                *locked = l;
        madvise(p, sz, MADV_DONTDUMP);
        return p;
}

static void locked_free(void *p, size_t n)
{
        if (!p)
                return;
        size_t sz = (n + 4095) & ~(size_t)4095;
        OPENSSL_cleanse(p, n);
        munlock(p, sz);
        munmap(p, sz);
}

/* ---- records ---- */

static int rec_path(const char *keys_dir, const char *tenant, const char *ext, char *out,
                    size_t cap, struct cove_err *err)
{
        if (!cove_tenant_name_valid(tenant))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "invalid tenant name");
        if ((size_t)snprintf(out, cap, "%s/%s.%s", keys_dir, tenant, ext) >= cap)
                return cove_err_set(err, ENAMETOOLONG, "key record path");
        return 0;
}

static int copy_str(json_t *o, const char *k, char *dst, size_t cap, int required)
{
        json_t *v = json_object_get(o, k);
        if (!v || json_is_null(v)) {
                dst[0] = '\0';
                return required ? -1 : 0;
        }
        if (!json_is_string(v) || json_string_length(v) >= cap)
                return -1;
        snprintf(dst, cap, "%s", json_string_value(v));
        return 0;
}

/* ---- where records live: files (default) or a record store (cove_keys_attach) ---- */

struct kstore {
        struct kstore *next;
        char dir[PATH_MAX];
        const struct cove_key_store_ops *ops; /* NULL: files in dir */
        void *ctx;
        char default_kek[PATH_MAX]; /* "": <dir>/node.kek */
};

static pthread_mutex_t store_mu = PTHREAD_MUTEX_INITIALIZER;
static struct kstore *stores;

/* The store attached to keys_dir (copied out: attach/detach may run meanwhile). */
static int store_of(const char *keys_dir, struct kstore *out)
{
        int found = 0;
        pthread_mutex_lock(&store_mu);
        for (struct kstore *k = stores; k; k = k->next)
                if (!strcmp(k->dir, keys_dir)) {
                        *out = *k;
                        found = 1;
                        break;
                }
        pthread_mutex_unlock(&store_mu);
        return found;
}

int cove_keys_attach(const char *keys_dir, const struct cove_key_store_ops *ops, void *ctx,
                     const char *default_kek_file, struct cove_err *err)
{
        if (!keys_dir || strlen(keys_dir) >= PATH_MAX ||
            (default_kek_file && strlen(default_kek_file) >= PATH_MAX))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "key store: path too long");
        if (default_kek_file && *default_kek_file && cove_kek_file_check(default_kek_file, err) < 0)
                return cove_err_wrap(err, "default key-encryption key");
        struct kstore *k = calloc(1, sizeof(*k));
        if (!k)
                return cove_err_set(err, ENOMEM, "key store");
        snprintf(k->dir, sizeof(k->dir), "%s", keys_dir);
        k->ops = ops;
        k->ctx = ctx;
        snprintf(k->default_kek, sizeof(k->default_kek), "%s",
                 default_kek_file ? default_kek_file : "");
        cove_keys_detach(keys_dir);
        pthread_mutex_lock(&store_mu);
        k->next = stores;
        stores = k;
        pthread_mutex_unlock(&store_mu);
        return 0;
}

void cove_keys_detach(const char *keys_dir)
{
        pthread_mutex_lock(&store_mu);
        for (struct kstore **pp = &stores; *pp; pp = &(*pp)->next)
                if (!strcmp((*pp)->dir, keys_dir)) {
                        struct kstore *k = *pp;
                        *pp = k->next;
                        free(k);
                        break;
                }
        pthread_mutex_unlock(&store_mu);
}

int cove_keys_default_kek(const char *keys_dir, char *path, size_t cap)
{
        struct kstore k;
        if (store_of(keys_dir, &k) && k.default_kek[0]) {
                snprintf(path, cap, "%s", k.default_kek);
                return 1;
        }
        snprintf(path, cap, "%s/node.kek", keys_dir);
        return 0;
}

int cove_keys_shared(const char *keys_dir)
{
        struct kstore k;
        return store_of(keys_dir, &k) && k.ops;
}

/* Fields of a record from its JSON; what names it in the error. */
static int rec_parse(json_t *o, const char *tenant, struct cove_key_record *rec, const char *what,
                     struct cove_err *err)
{
        memset(rec, 0, sizeof(*rec));
        json_t *ver = json_object_get(o, "version"), *fmt = json_object_get(o, "format");
        int bad = !json_is_object(o) || !json_is_integer(fmt) || json_integer_value(fmt) != 1 ||
                  copy_str(o, "tenant", rec->tenant, sizeof(rec->tenant), 1) ||
                  copy_str(o, "provider", rec->provider, sizeof(rec->provider), 1) ||
                  copy_str(o, "key_id", rec->key_id, sizeof(rec->key_id), 0) ||
                  copy_str(o, "state", rec->state, sizeof(rec->state), 1) ||
                  copy_str(o, "wrapped", rec->wrapped, sizeof(rec->wrapped), 1) ||
                  copy_str(o, "check", rec->check, sizeof(rec->check), 1) ||
                  copy_str(o, "key_file", rec->key_file, sizeof(rec->key_file), 0) ||
                  copy_str(o, "wrap_cmd", rec->wrap_cmd, sizeof(rec->wrap_cmd), 0) ||
                  copy_str(o, "unwrap_cmd", rec->unwrap_cmd, sizeof(rec->unwrap_cmd), 0) ||
                  !json_is_integer(ver) || strcmp(rec->tenant, tenant) != 0 ||
                  !cove_key_provider(rec->provider) ||
                  (strcmp(rec->state, "active") && strcmp(rec->state, "revoked"));
        if (!bad) {
                rec->version = (int)json_integer_value(ver);
                rec->timeout_ms = (int)json_integer_value(json_object_get(o, "timeout_ms"));
                rec->created_at = json_integer_value(json_object_get(o, "created_at"));
                rec->rotated_at = json_integer_value(json_object_get(o, "rotated_at"));
                rec->revoked_at = json_integer_value(json_object_get(o, "revoked_at"));
        }
        if (bad) {
                OPENSSL_cleanse(rec->wrapped, sizeof(rec->wrapped));
                return cove_err_set(err, 0, "key record %s is malformed or names another tenant",
                                    what);
        }
        return 0;
}

static int file_record_read(const char *keys_dir, const char *tenant, struct cove_key_record *rec,
                            struct cove_err *err)
{
        char path[PATH_MAX];
        if (rec_path(keys_dir, tenant, "key", path, sizeof(path), err) < 0)
                return -1;
        cleanup_close int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0 && errno == ENOENT)
                return 1;
        struct stat st;
        if (fd < 0 || fstat(fd, &st) < 0)
                return cove_err_set(err, errno, "key record %s", path);
        if (!S_ISREG(st.st_mode) || (st.st_mode & 077) || st.st_size > RECORD_MAX)
                return cove_err_set(
                    err, 0, "key record %s: want a regular file of mode 0600 under 64 KiB", path);
        json_error_t je;
        json_t *o = json_loadfd(fd, 0, &je);
        int rc = rec_parse(o, tenant, rec, path, err);
        json_decref(o);
        return rc;
}

/* From the attached record store: 0, 1 none, -1. */
static int store_record_read(const struct kstore *k, const char *tenant,
                             struct cove_key_record *rec, struct cove_err *err)
{
        if (!cove_tenant_name_valid(tenant))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "invalid tenant name");
        char *txt = NULL;
        int64_t gen = 0;
        int r = k->ops->get(k->ctx, tenant, &txt, &gen, err);
        if (r != 0)
                return r < 0 ? cove_err_wrap(err, "key record of tenant %s", tenant) : 1;
        size_t len = strlen(txt);
        json_error_t je;
        json_t *o = len <= RECORD_MAX ? json_loads(txt, 0, &je) : NULL;
        OPENSSL_cleanse(txt, len);
        free(txt);
        char what[COVE_TENANT_MAX + 32];
        snprintf(what, sizeof(what), "of tenant %s (catalog)", tenant);
        r = rec_parse(o, tenant, rec, what, err);
        json_decref(o);
        if (r == 0)
                rec->gen = gen;
        return r;
}

int cove_key_record_read(const char *keys_dir, const char *tenant, struct cove_key_record *rec,
                         struct cove_err *err)
{
        struct kstore k;
        if (store_of(keys_dir, &k) && k.ops)
                return store_record_read(&k, tenant, rec, err);
        return file_record_read(keys_dir, tenant, rec, err);
}

int cove_key_tenant_held(const char *keys_dir, const char *tenant, struct cove_err *err)
{
        struct cove_key_record rec;
        int r = cove_key_record_read(keys_dir, tenant, &rec, err);
        if (r != 0)
                return r < 0 ? -1 : 0;
        return strcmp(rec.provider, "local") != 0 || rec.key_file[0] != '\0';
}

static json_t *rec_json(const struct cove_key_record *r)
{
        json_t *o =
            json_pack("{s:i, s:s, s:s, s:s, s:i, s:s, s:s, s:s, s:I, s:I, s:I}", "format", 1,
                      "tenant", r->tenant, "provider", r->provider, "key_id", r->key_id, "version",
                      r->version, "state", r->state, "wrapped", r->wrapped, "check", r->check,
                      "created_at", (json_int_t)r->created_at, "rotated_at",
                      (json_int_t)r->rotated_at, "revoked_at", (json_int_t)r->revoked_at);
        if (o && r->key_file[0])
                json_object_set_new(o, "key_file", json_string(r->key_file));
        if (o && !strcmp(r->provider, "command")) {
                json_object_set_new(o, "wrap_cmd", json_string(r->wrap_cmd));
                json_object_set_new(o, "unwrap_cmd", json_string(r->unwrap_cmd));
                json_object_set_new(o, "timeout_ms", json_integer(r->timeout_ms));
        }
        return o;
}

/* Into the record store: create = insert only, else a compare-and-set on rec->gen; either
 * refused with CONFLICT when another writer got there first. */
static int store_record_write(const struct kstore *k, const struct cove_key_record *rec, int create,
                              struct cove_err *err)
{
        if (!cove_tenant_name_valid(rec->tenant))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "invalid tenant name");
        json_t *o = rec_json(rec);
        char *txt = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        json_decref(o);
        if (!txt)
                return cove_err_set(err, ENOMEM, "key record of %s", rec->tenant);
        int64_t gen = 0;
        int rc = k->ops->put(k->ctx, rec->tenant, txt, create ? 0 : rec->gen, &gen, err);
        OPENSSL_cleanse(txt, strlen(txt));
        free(txt);
        if (rc < 0)
                return cove_err_wrap(err, "key record of tenant %s", rec->tenant);
        return 0;
}

int cove_key_record_write(const char *keys_dir, const struct cove_key_record *rec, int create,
                          struct cove_err *err)
{
        struct kstore k;
        if (store_of(keys_dir, &k) && k.ops)
                return store_record_write(&k, rec, create, err);
        char path[PATH_MAX], name[COVE_TENANT_MAX + 8];
        if (rec_path(keys_dir, rec->tenant, "key", path, sizeof(path), err) < 0)
                return -1;
        if (cove_mkdir_p(keys_dir, 0700, err) < 0)
                return -1;
        json_t *o = rec_json(rec);
        char *txt = o ? json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
        json_decref(o);
        if (!txt)
                return cove_err_set(err, ENOMEM, "key record of %s", rec->tenant);
        size_t len = strlen(txt);
        int rc;
        if (!create) {
                snprintf(name, sizeof(name), "%s.key", rec->tenant);
                rc = cove_write_file_atomic(keys_dir, name, txt, len, 0600, err);
        } else {
                /* a temp name, then link(2), which never replaces a concurrent creator's */
                uint8_t r[8];
                char rh[17];
                cove_random(r, sizeof(r), NULL);
                cove_hex(r, sizeof(r), rh);
                snprintf(name, sizeof(name), ".new.%s", rh);
                rc = cove_write_file_atomic(keys_dir, name, txt, len, 0600, err);
                if (rc == 0) {
                        char tmp[PATH_MAX + 32];
                        snprintf(tmp, sizeof(tmp), "%s/%s", keys_dir, name);
                        if (link(tmp, path) < 0)
                                rc = cove_err_setk(
                                    err, errno == EEXIST ? COVE_E_CONFLICT : COVE_E_INTERNAL, errno,
                                    "install key record %s", path);
                        unlink(tmp);
                        cleanup_close int dfd = open(keys_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                        if (rc == 0 && (dfd < 0 || fsync(dfd) < 0))
                                rc = cove_err_set(err, errno, "fsync %s", keys_dir);
                }
        }
        OPENSSL_cleanse(txt, len);
        free(txt);
        return rc;
}

static int check_value(const uint8_t dek[COVE_KEY_LEN], char out[33])
{
        uint8_t md[32];
        unsigned int ml = 0;
        if (!HMAC(EVP_sha256(), dek, COVE_KEY_LEN, (const uint8_t *)COVE_KEY_INFO_CHECK,
                  strlen(COVE_KEY_INFO_CHECK), md, &ml))
                return -1;
        cove_hex(md, 16, out);
        return 0;
}

/* Wrap dek into rec (provider, key_file/cmds already set): key_id, wrapped, check, and a
 * round trip through the provider proves the new record opens. */
static int rec_wrap(const char *keys_dir, struct cove_key_record *rec,
                    const uint8_t dek[COVE_KEY_LEN], struct cove_err *err)
{
        const struct cove_key_provider_ops *p = cove_key_provider(rec->provider);
        if (!p)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "unknown key provider \"%s\" (local, command)", rec->provider);
        uint8_t back[COVE_KEY_LEN];
        char kid[sizeof(rec->key_id)];
        int rc = p->key_id(keys_dir, rec, kid, sizeof(kid), err);
        if (rc == 0)
                memcpy(rec->key_id, kid, sizeof(kid));
        if (rc == 0)
                rc = p->wrap(keys_dir, rec, dek, rec->wrapped, sizeof(rec->wrapped), err);
        if (rc == 0 && check_value(dek, rec->check) < 0)
                rc = cove_err_set(err, 0, "key check value: HMAC failed");
        if (rc == 0)
                rc = p->unwrap(keys_dir, rec, rec->wrapped, back, err);
        if (rc == 0 && CRYPTO_memcmp(back, dek, COVE_KEY_LEN) != 0)
                rc = cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                   "key provider %s: unwrap of what it just wrapped gave another "
                                   "key; record left unchanged",
                                   rec->provider);
        OPENSSL_cleanse(back, sizeof(back));
        return rc;
}

/* A new record under the node default KEK for dek. */
static int rec_new(const char *keys_dir, const char *tenant, const uint8_t dek[COVE_KEY_LEN],
                   struct cove_err *err)
{
        struct cove_key_record rec;
        memset(&rec, 0, sizeof(rec));
        snprintf(rec.tenant, sizeof(rec.tenant), "%s", tenant);
        snprintf(rec.provider, sizeof(rec.provider), "local");
        snprintf(rec.state, sizeof(rec.state), "active");
        rec.version = 1;
        rec.created_at = cove_now_ms();
        int rc = rec_wrap(keys_dir, &rec, dek, err);
        if (rc == 0)
                rc = cove_key_record_write(keys_dir, &rec, 1, err);
        if (rc < 0 && err->kind == COVE_E_CONFLICT) {
                cove_err_clear(err);
                rc = 0; /* another creator won: its record counts */
        }
        OPENSSL_cleanse(rec.wrapped, sizeof(rec.wrapped));
        return rc;
}

/* A plain 32-byte <tenant>.dek of an older data dir: 0 read, 1 absent, -1 error. */
static int legacy_dek(const char *path, uint8_t dek[COVE_KEY_LEN], struct cove_err *err)
{
        cleanup_close int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0 && errno == ENOENT)
                return 1;
        struct stat st;
        if (fd < 0 || fstat(fd, &st) < 0)
                return cove_err_set(err, errno, "data key %s", path);
        if (!S_ISREG(st.st_mode) || st.st_size != COVE_KEY_LEN || (st.st_mode & 077))
                return cove_err_set(err, 0, "data key %s: not a 0600 file of %d bytes", path,
                                    COVE_KEY_LEN);
        size_t got = 0;
        while (got < COVE_KEY_LEN) {
                ssize_t r = read(fd, dek + got, COVE_KEY_LEN - got);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r <= 0)
                        return cove_err_set(err, r < 0 ? errno : EIO, "read data key %s", path);
                got += (size_t)r;
        }
        return 0;
}

/* Make sure a record exists: migrate a legacy .dek, or (create) make a fresh DEK. 0 made or
 * there, 1 none and !create, -1 error. */
static int rec_ensure(const char *keys_dir, const char *tenant, int create, struct cove_err *err)
{
        if (cove_keys_shared(keys_dir)) {
                /* a record this node kept in files before its records were shared */
                int how = 0;
                int r = cove_key_import(keys_dir, keys_dir, tenant, &how, err);
                if (r <= 0)
                        return r;
        }
        char legacy[PATH_MAX];
        if (rec_path(keys_dir, tenant, "dek", legacy, sizeof(legacy), err) < 0)
                return -1;
        uint8_t dek[COVE_KEY_LEN];
        int l = legacy_dek(legacy, dek, err);
        if (l < 0)
                return -1;
        if (l == 1 && !create)
                return 1;
        int rc = l == 0 ? 0 : cove_random(dek, sizeof(dek), err);
        if (rc == 0)
                rc = rec_new(keys_dir, tenant, dek, err);
        OPENSSL_cleanse(dek, sizeof(dek));
        if (rc == 0 && l == 0) {
                /* the record holds it wrapped now: the plain copy goes */
                if (unlink(legacy) < 0 && errno != ENOENT)
                        return cove_err_set(err, errno, "remove migrated %s", legacy);
                cleanup_close int dfd = open(keys_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                if (dfd < 0 || fsync(dfd) < 0)
                        return cove_err_set(err, errno, "fsync %s", keys_dir);
        }
        return rc;
}

int cove_key_import(const char *from_dir, const char *to_dir, const char *tenant, int *how,
                    struct cove_err *err)
{
        *how = 0;
        struct cove_key_record rec, cur;
        int r = file_record_read(from_dir, tenant, &rec, err);
        if (r != 0)
                return r;
        int node_default = !strcmp(rec.provider, "local") && !rec.key_file[0];
        uint8_t *dek = node_default ? locked_alloc(COVE_KEY_LEN, NULL) : NULL;
        int rc = node_default && !dek ? cove_err_set(err, errno, "allocate key memory") : 0;
        if (rc == 0 && node_default) {
                /* under the default KEK of from_dir: its node.kek, or the one configured for
                 * it; the record's check value says which opens it */
                char cand[2][PATH_MAX];
                snprintf(cand[0], sizeof(cand[0]), "%s/node.kek", from_dir);
                int nc = 1 + cove_keys_default_kek(from_dir, cand[1], sizeof(cand[1]));
                rc = -1;
                for (int i = 0; i < nc && rc < 0; i++) {
                        struct cove_key_record tmp = rec;
                        char chk[33];
                        snprintf(tmp.key_file, sizeof(tmp.key_file), "%s", cand[i]);
                        cove_err_clear(err);
                        rc = cove_key_provider_local.unwrap(from_dir, &tmp, tmp.wrapped, dek, err);
                        if (rc == 0 &&
                            (check_value(dek, chk) < 0 || CRYPTO_memcmp(chk, rec.check, 32)))
                                rc = cove_err_setk(err, COVE_E_KEY_REVOKED, 0,
                                                   "the default key of %s does not open it",
                                                   from_dir);
                        OPENSSL_cleanse(tmp.wrapped, sizeof(tmp.wrapped));
                }
                if (rc == 0) /* wrapped again under to_dir's default KEK */
                        rc = rec_wrap(to_dir, &rec, dek, err);
                if (rc == 0)
                        *how = 1;
        }
        rec.gen = 0;
        if (rc == 0)
                rc = cove_key_record_write(to_dir, &rec, 1, err);
        if (rc < 0 && err->kind == COVE_E_CONFLICT) {
                /* there already: the same data key (a re-run, a concurrent import) is fine */
                cove_err_clear(err);
                rc = cove_key_record_read(to_dir, tenant, &cur, err) == 0 ? 0 : -1;
                if (rc == 0 && strcmp(cur.check, rec.check))
                        rc = cove_err_setk(err, COVE_E_CONFLICT, 0,
                                           "tenant %s already has another data key there", tenant);
                if (rc == 0)
                        *how = 2;
                OPENSSL_cleanse(cur.wrapped, sizeof(cur.wrapped));
        }
        OPENSSL_cleanse(rec.wrapped, sizeof(rec.wrapped));
        locked_free(dek, COVE_KEY_LEN);
        if (rc < 0)
                return cove_err_wrap(err, "import key record of tenant %s", tenant);
        return 0;
}

/* ---- the cache ---- */

struct kent {
        struct kent *next;
        char dir[PATH_MAX];
        char tenant[COVE_TENANT_MAX + 1];
        uint8_t *dek;    /* locked page */
        int64_t at_ms;   /* monotonic ms of the unwrap */
        int64_t at_wall; /* unix ms of the unwrap */
        dev_t dev;       /* the record the DEK came from */
        ino_t ino;
        struct timespec mtime, ctime; /* ctime: a chmod/chown/link change counts too */
        off_t size;
        int64_t gen; /* record store: the record's generation (files: 0) */
};

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t write_mu = PTHREAD_MUTEX_INITIALIZER; /* rewrap, revoke */
static struct kent *cache;
static int64_t cache_ttl_ms = 60000;

void cove_keys_cache_ttl_set(int64_t ttl_ms)
{
        pthread_mutex_lock(&cache_mu);
        cache_ttl_ms = ttl_ms < 0 ? 0 : ttl_ms;
        pthread_mutex_unlock(&cache_mu);
}

int64_t cove_keys_cache_ttl(void)
{
        pthread_mutex_lock(&cache_mu);
        int64_t t = cache_ttl_ms;
        pthread_mutex_unlock(&cache_mu);
        return t;
}

static void kent_free(struct kent *e)
{
        locked_free(e->dek, COVE_KEY_LEN);
        free(e);
}

/* Unlink (dir, tenant)'s entry; caller holds cache_mu. */
static void cache_drop_locked(const char *dir, const char *tenant)
{
        for (struct kent **pp = &cache; *pp; pp = &(*pp)->next) {
                if (!strcmp((*pp)->dir, dir) && !strcmp((*pp)->tenant, tenant)) {
                        struct kent *e = *pp;
                        *pp = e->next;
                        kent_free(e);
                        return;
                }
        }
}

void cove_keys_cache_clear(void)
{
        pthread_mutex_lock(&cache_mu);
        while (cache) {
                struct kent *e = cache;
                cache = e->next;
                kent_free(e);
        }
        pthread_mutex_unlock(&cache_mu);
}

/* What identifies one version of a record: the file's identity (files) or the record
 * store's generation, bumped by every write from any process (catalog). */
struct stamp {
        struct stat st;
        int64_t gen;
};

static int same_stamp(const struct kent *e, const struct stamp *s)
{
        const struct stat *st = &s->st;
        return e->gen == s->gen && e->dev == st->st_dev && e->ino == st->st_ino &&
               e->size == st->st_size && e->mtime.tv_sec == st->st_mtim.tv_sec &&
               e->mtime.tv_nsec == st->st_mtim.tv_nsec && e->ctime.tv_sec == st->st_ctim.tv_sec &&
               e->ctime.tv_nsec == st->st_ctim.tv_nsec;
}

/* The record's current stamp: 0 there (rec filled when loaded is set: the record store
 * answers the whole record at once), 1 none, -1 error. */
static int rec_stamp(const char *keys_dir, const char *tenant, struct stamp *s,
                     struct cove_key_record *rec, int *loaded, struct cove_err *err)
{
        memset(s, 0, sizeof(*s));
        *loaded = 0;
        struct kstore k;
        if (store_of(keys_dir, &k) && k.ops) {
                int r = store_record_read(&k, tenant, rec, err);
                if (r == 0) {
                        s->gen = rec->gen;
                        *loaded = 1;
                }
                return r;
        }
        char path[PATH_MAX];
        if (rec_path(keys_dir, tenant, "key", path, sizeof(path), err) < 0)
                return -1;
        if (stat(path, &s->st) == 0)
                return 0;
        if (errno != ENOENT)
                return cove_err_set(err, errno, "key record %s", path);
        return 1;
}

/* The core: the tenant's DEK into dek (may be NULL: only check), from the cache when its
 * entry is fresh and its record unchanged, else unwrapped through the provider. */
static int get_dek(const char *keys_dir, const char *tenant, int create, uint8_t *dek,
                   struct cove_err *err)
{
        if (!cove_tenant_name_valid(tenant))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "invalid tenant name");
        for (int attempt = 0; attempt < 3; attempt++) {
                struct stamp sp;
                struct cove_key_record rec;
                int loaded = 0;
                int hr = rec_stamp(keys_dir, tenant, &sp, &rec, &loaded, err);
                if (hr < 0)
                        return -1;
                int have = hr == 0;
                pthread_mutex_lock(&cache_mu);
                int64_t ttl = cache_ttl_ms, now = cove_mono_ns() / 1000000;
                for (struct kent *e = cache; e; e = e->next) {
                        if (strcmp(e->dir, keys_dir) || strcmp(e->tenant, tenant))
                                continue;
                        if (have && same_stamp(e, &sp) && now - e->at_ms < ttl) {
                                if (dek)
                                        memcpy(dek, e->dek, COVE_KEY_LEN);
                                pthread_mutex_unlock(&cache_mu);
                                if (loaded)
                                        OPENSSL_cleanse(rec.wrapped, sizeof(rec.wrapped));
                                return 0;
                        }
                        cache_drop_locked(keys_dir, tenant); /* stale: re-unwrap below */
                        break;
                }
                pthread_mutex_unlock(&cache_mu);
                if (!have) {
                        int r = rec_ensure(keys_dir, tenant, create, err);
                        if (r < 0)
                                return cove_err_wrap(err, "data key of tenant %s", tenant);
                        if (r == 1)
                                return cove_err_setk(err, COVE_E_NOT_FOUND, 0,
                                                     "tenant %s has no data key", tenant);
                        continue;
                }
                if (!loaded) {
                        int r = cove_key_record_read(keys_dir, tenant, &rec, err);
                        if (r == 1)
                                continue; /* removed meanwhile */
                        if (r < 0)
                                return -1;
                }
                if (!strcmp(rec.state, "revoked")) {
                        OPENSSL_cleanse(rec.wrapped, sizeof(rec.wrapped));
                        char when[40];
                        cove_rfc3339(rec.revoked_at, when, sizeof(when));
                        return cove_err_setk(err, COVE_E_KEY_REVOKED, 0,
                                             "the key of tenant %s was revoked at %s", tenant,
                                             when);
                }
                uint8_t *tmp = locked_alloc(COVE_KEY_LEN, NULL);
                if (!tmp) {
                        OPENSSL_cleanse(rec.wrapped, sizeof(rec.wrapped));
                        return cove_err_set(err, errno, "allocate key memory");
                }
                char chk[33];
                int r =
                    cove_key_provider(rec.provider)->unwrap(keys_dir, &rec, rec.wrapped, tmp, err);
                if (r == 0 && (check_value(tmp, chk) < 0 || CRYPTO_memcmp(chk, rec.check, 32)))
                        r = cove_err_setk(err, COVE_E_KEY_REVOKED, 0,
                                          "data key of tenant %s: the provider returned a key "
                                          "that does not match the record (wrong key or "
                                          "tampered record)",
                                          tenant);
                OPENSSL_cleanse(rec.wrapped, sizeof(rec.wrapped));
                if (r < 0) {
                        locked_free(tmp, COVE_KEY_LEN);
                        return -1;
                }
                if (dek)
                        memcpy(dek, tmp, COVE_KEY_LEN);
                struct kent *e = ttl > 0 ? calloc(1, sizeof(*e)) : NULL;
                if (!e) {
                        locked_free(tmp, COVE_KEY_LEN);
                        return 0;
                }
                snprintf(e->dir, sizeof(e->dir), "%s", keys_dir);
                snprintf(e->tenant, sizeof(e->tenant), "%s", tenant);
                e->dek = tmp;
                e->at_ms = cove_mono_ns() / 1000000;
                e->at_wall = cove_now_ms();
                e->dev = sp.st.st_dev;
                e->ino = sp.st.st_ino;
                e->mtime = sp.st.st_mtim;
                e->ctime = sp.st.st_ctim;
                e->size = sp.st.st_size;
                e->gen = sp.gen;
                pthread_mutex_lock(&cache_mu);
                cache_drop_locked(keys_dir, tenant);
                e->next = cache;
                cache = e;
                pthread_mutex_unlock(&cache_mu);
                return 0;
        }
        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                             "key record of tenant %s keeps changing; try again", tenant);
}

int cove_key_check(const char *keys_dir, const char *tenant, int create, struct cove_err *err)
{
        struct cove_err local = {0};
        return get_dek(keys_dir, tenant, create, NULL, err ? err : &local);
}

int cove_dek_load(const char *keys_dir, const char *tenant, int create, uint8_t dek[COVE_KEY_LEN],
                  struct cove_err *err)
{
        struct cove_err local = {0};
        return get_dek(keys_dir, tenant, create, dek, err ? err : &local);
}

/* ---- key operations ---- */

static void status_fill(const char *keys_dir, const struct cove_key_record *rec,
                        struct cove_key_status *out)
{
        memset(out, 0, sizeof(*out));
        out->rec = *rec;
        memset(out->rec.wrapped, 0, sizeof(out->rec.wrapped));
        memset(out->rec.check, 0, sizeof(out->rec.check));
        out->exists = 1;
        pthread_mutex_lock(&cache_mu);
        out->cache_ttl_ms = cache_ttl_ms;
        for (struct kent *e = cache; e; e = e->next)
                if (!strcmp(e->dir, keys_dir) && !strcmp(e->tenant, rec->tenant)) {
                        out->cached = 1;
                        out->cached_at = e->at_wall;
                }
        pthread_mutex_unlock(&cache_mu);
}

int cove_key_status_get(const char *keys_dir, const char *tenant, struct cove_key_status *out,
                        struct cove_err *err)
{
        struct cove_key_record rec;
        int r = cove_key_record_read(keys_dir, tenant, &rec, err);
        if (r < 0)
                return -1;
        if (r == 1) {
                memset(out, 0, sizeof(*out));
                snprintf(out->rec.tenant, sizeof(out->rec.tenant), "%s", tenant);
                out->cache_ttl_ms = cove_keys_cache_ttl();
                return 0;
        }
        status_fill(keys_dir, &rec, out);
        OPENSSL_cleanse(rec.wrapped, sizeof(rec.wrapped));
        return 0;
}

static int spec_apply(const struct cove_key_spec *s, struct cove_key_record *rec,
                      struct cove_err *err)
{
        if (!s->provider || !cove_key_provider(s->provider))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "provider must be \"local\" or \"command\"");
        char provider[16];
        snprintf(provider, sizeof(provider), "%s", s->provider);
        snprintf(rec->provider, sizeof(rec->provider), "%s", provider);
        rec->key_file[0] = rec->wrap_cmd[0] = rec->unwrap_cmd[0] = rec->key_id[0] = '\0';
        rec->timeout_ms = 0;
        if (!strcmp(provider, "local")) {
                if (s->wrap_cmd || s->unwrap_cmd)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "wrap_cmd/unwrap_cmd belong to provider command");
                if (s->key_file && *s->key_file) {
                        if (s->key_file[0] != '/' || strlen(s->key_file) >= sizeof(rec->key_file))
                                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                                     "key_file must be an absolute path");
                        snprintf(rec->key_file, sizeof(rec->key_file), "%s", s->key_file);
                }
                return 0;
        }
        if (s->key_file)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "key_file belongs to provider local");
        if (!s->wrap_cmd || !*s->wrap_cmd || !s->unwrap_cmd || !*s->unwrap_cmd ||
            strlen(s->wrap_cmd) >= COVE_KEY_CMD_MAX || strlen(s->unwrap_cmd) >= COVE_KEY_CMD_MAX)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "provider command needs wrap_cmd and unwrap_cmd (each under "
                                     "%d bytes)",
                                     COVE_KEY_CMD_MAX);
        if (s->timeout_ms < 0 || s->timeout_ms > 600000)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "timeout_ms must be between 0 and 600000");
        snprintf(rec->wrap_cmd, sizeof(rec->wrap_cmd), "%s", s->wrap_cmd);
        snprintf(rec->unwrap_cmd, sizeof(rec->unwrap_cmd), "%s", s->unwrap_cmd);
        if (s->key_id && strlen(s->key_id) >= sizeof(rec->key_id))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "key_id is too long");
        snprintf(rec->key_id, sizeof(rec->key_id), "%s", s->key_id ? s->key_id : "");
        rec->timeout_ms = s->timeout_ms;
        return 0;
}

int cove_key_rewrap(const char *keys_dir, const char *tenant, const struct cove_key_spec *spec,
                    struct cove_key_status *out, struct cove_err *err)
{
        pthread_mutex_lock(&write_mu);
        uint8_t *dek = locked_alloc(COVE_KEY_LEN, NULL);
        struct cove_key_record rec;
        int rc = dek ? 0 : cove_err_set(err, errno, "allocate key memory");
        if (rc == 0)
                rc = get_dek(keys_dir, tenant, 1, dek, err);
        if (rc == 0)
                rc = cove_key_record_read(keys_dir, tenant, &rec, err) == 0 ? 0 : -1;
        if (rc == 0 && !strcmp(rec.state, "revoked"))
                rc = cove_err_setk(err, COVE_E_KEY_REVOKED, 0, "the key of tenant %s is revoked",
                                   tenant);
        if (rc == 0 && spec)
                rc = spec_apply(spec, &rec, err);
        if (rc == 0)
                rc = rec_wrap(keys_dir, &rec, dek, err);
        if (rc == 0) {
                rec.version++;
                rec.rotated_at = cove_now_ms();
                rc = cove_key_record_write(keys_dir, &rec, 0, err);
        }
        if (rc == 0) {
                pthread_mutex_lock(&cache_mu);
                cache_drop_locked(keys_dir, tenant);
                pthread_mutex_unlock(&cache_mu);
                if (out)
                        status_fill(keys_dir, &rec, out);
        }
        OPENSSL_cleanse(rec.wrapped, sizeof(rec.wrapped));
        locked_free(dek, COVE_KEY_LEN);
        pthread_mutex_unlock(&write_mu);
        if (rc < 0)
                return cove_err_wrap(err, "rewrap key of tenant %s", tenant);
        return 0;
}

int cove_key_revoke(const char *keys_dir, const char *tenant, struct cove_key_status *out,
                    struct cove_err *err)
{
        pthread_mutex_lock(&write_mu);
        struct cove_key_record rec;
        int r = cove_key_record_read(keys_dir, tenant, &rec, err);
        if (r == 1) {
                /* never used: give it a key (so the state has a home), then revoke that */
                r = rec_ensure(keys_dir, tenant, 1, err);
                if (r == 0)
                        r = cove_key_record_read(keys_dir, tenant, &rec, err);
        }
        int rc = r == 0 ? 0 : -1;
        /* another process may write the shared record meanwhile (CONFLICT): read it again;
         * a revocation is never given up for a concurrent rotation */
        for (int tries = 0; rc == 0; tries++) {
                if (!strcmp(rec.state, "revoked")) {
                        rc = 1;
                        break;
                }
                snprintf(rec.state, sizeof(rec.state), "revoked");
                rec.revoked_at = cove_now_ms();
                rc = cove_key_record_write(keys_dir, &rec, 0, err);
                if (rc == 0 || err->kind != COVE_E_CONFLICT || tries >= 8)
                        break;
                OPENSSL_cleanse(rec.wrapped, sizeof(rec.wrapped));
                cove_err_clear(err);
                rc = cove_key_record_read(keys_dir, tenant, &rec, err) == 0 ? 0 : -1;
        }
        pthread_mutex_lock(&cache_mu);
        cache_drop_locked(keys_dir, tenant); /* at once, whatever happened above */
        pthread_mutex_unlock(&cache_mu);
        if (rc >= 0 && out)
                status_fill(keys_dir, &rec, out);
        OPENSSL_cleanse(rec.wrapped, sizeof(rec.wrapped));
        pthread_mutex_unlock(&write_mu);
        if (rc < 0)
                return cove_err_wrap(err, "revoke key of tenant %s", tenant);
        return rc;
}

/* ---- subkeys ---- */

int cove_hkdf_sha256(const uint8_t *ikm, size_t ikm_len, const char *info, uint8_t *out,
                     size_t out_len, struct cove_err *err)
{
        EVP_PKEY_CTX *pctx = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, NULL);
        size_t len = out_len;
        int ok =
            pctx && EVP_PKEY_derive_init(pctx) > 0 &&
            EVP_PKEY_CTX_set_hkdf_md(pctx, EVP_sha256()) > 0 &&
            EVP_PKEY_CTX_set1_hkdf_key(pctx, ikm, (int)ikm_len) > 0 &&
            EVP_PKEY_CTX_add1_hkdf_info(pctx, (const unsigned char *)info, (int)strlen(info)) > 0 &&
            EVP_PKEY_derive(pctx, out, &len) > 0 && len == out_len;
        EVP_PKEY_CTX_free(pctx);
        if (!ok)
                return cove_err_set(err, 0, "HKDF-SHA256 (%s) failed", info);
        return 0;
}

int cove_tenant_keys_open(const char *keys_dir, const char *tenant, struct cove_tenant_keys **out,
                          struct cove_err *err)
{
        int locked = 0;
        struct cove_tenant_keys *k = locked_alloc(sizeof(*k), &locked);
        if (!k)
                return cove_err_set(err, errno, "allocate key memory");
        k->locked = locked;
        uint8_t dek[COVE_KEY_LEN];
        int rc = cove_dek_load(keys_dir, tenant, 1, dek, err);
        static const struct {
                const char *info;
                size_t off;
        } sub[] = {
            {COVE_KEY_INFO_CHUNK_NAME, offsetof(struct cove_tenant_keys, chunk_name)},
            {COVE_KEY_INFO_CHUNK_ENC, offsetof(struct cove_tenant_keys, chunk_enc)},
            {COVE_KEY_INFO_MANIFEST_ENC, offsetof(struct cove_tenant_keys, manifest_enc)},
            {COVE_KEY_INFO_DISK, offsetof(struct cove_tenant_keys, disk)},
            {COVE_KEY_INFO_FSCRYPT, offsetof(struct cove_tenant_keys, fscrypt)},
        };
        for (size_t i = 0; rc == 0 && i < sizeof(sub) / sizeof(sub[0]); i++)
                rc = cove_hkdf_sha256(dek, sizeof(dek), sub[i].info, (uint8_t *)k + sub[i].off,
                                      COVE_KEY_LEN, err);
        OPENSSL_cleanse(dek, sizeof(dek));
        if (rc < 0) {
                cove_tenant_keys_free(k);
                return cove_err_wrap(err, "keys of tenant %s", tenant);
        }
        *out = k;
        return 0;
}

void cove_tenant_keys_free(struct cove_tenant_keys *k)
{
        locked_free(k, sizeof(*k));
}

static int derive_for(const uint8_t base[COVE_KEY_LEN], const char *label, const char *sandbox_id,
                      uint8_t *out, size_t len, struct cove_err *err)
{
        if (!sandbox_id || !*sandbox_id || strlen(sandbox_id) > 128)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "%s key: bad sandbox id", label);
        char info[192];
        snprintf(info, sizeof(info), "%s/%s", label, sandbox_id);
        return cove_hkdf_sha256(base, COVE_KEY_LEN, info, out, len, err);
}

int cove_disk_key_derive(const struct cove_tenant_keys *k, const char *sandbox_id,
                         uint8_t out[COVE_KEY_LEN], struct cove_err *err)
{
        return derive_for(k->disk, COVE_KEY_INFO_DISK, sandbox_id, out, COVE_KEY_LEN, err);
}

int cove_fscrypt_key_derive(const struct cove_tenant_keys *k, const char *sandbox_id,
                            uint8_t out[COVE_FSCRYPT_KEY_LEN], struct cove_err *err)
{
        return derive_for(k->fscrypt, COVE_KEY_INFO_FSCRYPT, sandbox_id, out, COVE_FSCRYPT_KEY_LEN,
                          err);
}
