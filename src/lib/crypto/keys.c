/* Tenant data keys on disk and HKDF subkeys in locked memory (crypto/keys.h). */
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crypto/keys.h"
#include "util/cleanup.h"
#include "util/util.h"

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

static int read_dek(const char *path, uint8_t dek[COVE_KEY_LEN], struct cove_err *err)
{
        cleanup_close int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return cove_err_setk(err, errno == ENOENT ? COVE_E_NOT_FOUND : COVE_E_INTERNAL,
                                     errno, "open data key %s", path);
        struct stat st;
        if (fstat(fd, &st) < 0)
                return cove_err_set(err, errno, "stat data key %s", path);
        if (!S_ISREG(st.st_mode) || st.st_size != COVE_KEY_LEN)
                return cove_err_set(err, 0, "data key %s: not a %d-byte file", path, COVE_KEY_LEN);
        if (st.st_mode & 077)
                return cove_err_set(err, 0, "data key %s: mode %o is readable by others, want 0600",
                                    path, (unsigned)(st.st_mode & 0777));
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

int cove_dek_load(const char *keys_dir, const char *tenant, int create, uint8_t dek[COVE_KEY_LEN],
                  struct cove_err *err)
{
        struct cove_err local = {0};
        if (!err)
                err = &local;
        if (!cove_tenant_name_valid(tenant))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "invalid tenant name");
        char path[4096], tmp[4200];
        if ((size_t)snprintf(path, sizeof(path), "%s/%s.dek", keys_dir, tenant) >= sizeof(path))
                return cove_err_set(err, ENAMETOOLONG, "data key path");
        if (read_dek(path, dek, err) == 0)
                return 0;
        if (!create || err->kind != COVE_E_NOT_FOUND)
                return -1;
        cove_err_clear(err);
        if (cove_mkdir_p(keys_dir, 0700, err) < 0)
                return cove_err_wrap(err, "data key for %s", tenant);
        uint8_t r[8];
        char rh[17];
        if (cove_random(r, sizeof(r), err) < 0)
                return -1;
        cove_hex(r, sizeof(r), rh);
        snprintf(tmp, sizeof(tmp), "%s/.%s.dek.tmp.%s", keys_dir, tenant, rh);
        uint8_t fresh[COVE_KEY_LEN];
        int rc = -1;
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0) {
                cove_err_set(err, errno, "create %s", tmp);
                goto out;
        }
        if (cove_random(fresh, sizeof(fresh), err) < 0)
                goto out_unlink;
        if (write(fd, fresh, sizeof(fresh)) != (ssize_t)sizeof(fresh) || fsync(fd) < 0) {
                cove_err_set(err, errno ? errno : EIO, "write %s", tmp);
                goto out_unlink;
        }
        /* link(2) never replaces: if another process created the key meanwhile, we use its. */
        if (link(tmp, path) < 0 && errno != EEXIST) {
                cove_err_set(err, errno, "install data key %s", path);
                goto out_unlink;
        }
        unlink(tmp);
        int dfd = open(keys_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0 || fsync(dfd) < 0) {
                cove_err_set(err, errno, "fsync %s", keys_dir);
                if (dfd >= 0)
                        close(dfd);
                goto out;
        }
        close(dfd);
        rc = read_dek(path, dek, err);
        goto out;
out_unlink:
        unlink(tmp);
out:
        if (fd >= 0)
                close(fd);
        OPENSSL_cleanse(fresh, sizeof(fresh));
        return rc;
}

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
        size_t sz = (sizeof(struct cove_tenant_keys) + 4095) & ~(size_t)4095;
        struct cove_tenant_keys *k =
            mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (k == MAP_FAILED)
                return cove_err_set(err, errno, "allocate key memory");
        /* Not fatal when RLIMIT_MEMLOCK is tiny (unprivileged tests); recorded in locked. */
        k->locked = mlock(k, sz) == 0;
        madvise(k, sz, MADV_DONTDUMP);
        uint8_t dek[COVE_KEY_LEN];
        int rc = cove_dek_load(keys_dir, tenant, 1, dek, err);
        if (rc == 0)
                rc = cove_hkdf_sha256(dek, sizeof(dek), COVE_KEY_INFO_CHUNK_NAME, k->chunk_name,
                                      COVE_KEY_LEN, err);
        if (rc == 0)
                rc = cove_hkdf_sha256(dek, sizeof(dek), COVE_KEY_INFO_CHUNK_ENC, k->chunk_enc,
                                      COVE_KEY_LEN, err);
        if (rc == 0)
                rc = cove_hkdf_sha256(dek, sizeof(dek), COVE_KEY_INFO_MANIFEST_ENC, k->manifest_enc,
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
        if (!k)
                return;
        size_t sz = (sizeof(struct cove_tenant_keys) + 4095) & ~(size_t)4095;
        OPENSSL_cleanse(k, sizeof(*k));
        munlock(k, sz);
        munmap(k, sz);
}
