/* API key creation and verification: salted SHA-256 of a random secret, compared in
 * constant time; the secret itself is never stored, logged or put in an error message. */
#include "control/apikey.h"
#include "util/util.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#define SALT_LEN 32

static int sha256_salted(const uint8_t salt[SALT_LEN], const uint8_t secret[COVE_APIKEY_SECRET_LEN],
                         char out_hex[65], struct cove_err *err)
{
        uint8_t md[EVP_MAX_MD_SIZE];
        unsigned int mdlen = 0;
        EVP_MD_CTX *ctx = EVP_MD_CTX_new();
        int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1 &&
                 EVP_DigestUpdate(ctx, salt, SALT_LEN) == 1 &&
                 EVP_DigestUpdate(ctx, secret, COVE_APIKEY_SECRET_LEN) == 1 &&
                 EVP_DigestFinal_ex(ctx, md, &mdlen) == 1 && mdlen == 32;
        EVP_MD_CTX_free(ctx);
        if (!ok)
                return cove_err_set(err, 0, "api key: SHA-256 failed");
        cove_hex(md, 32, out_hex);
        return 0;
}

/* Decode 2*len lowercase hex chars. Branch-free on the data, so the time taken does not
 * depend on which byte of a presented secret is wrong. 0 ok, -1 malformed. */
static int unhex(const char *in, uint8_t *out, size_t len)
{
        unsigned bad = 0;
        for (size_t i = 0; i < 2 * len; i++) {
                int ch = (unsigned char)in[i];
                /* comparisons compile to flag moves, and & (not &&) avoids short-circuits */
                unsigned is_dig = (unsigned)((ch >= '0') & (ch <= '9'));
                unsigned is_alp = (unsigned)((ch >= 'a') & (ch <= 'f'));
                unsigned v =
                    ((unsigned)(ch - '0') & -is_dig) | ((unsigned)(ch - 'a' + 10) & -is_alp);
                bad |= (is_dig | is_alp) ^ 1;
                if (i & 1)
                        out[i / 2] |= (uint8_t)(v & 15);
                else
                        out[i / 2] = (uint8_t)((v & 15) << 4);
        }
        return bad ? -1 : 0;
}

static int is_b32(char ch)
{
        return (ch >= 'a' && ch <= 'z') || (ch >= '2' && ch <= '7');
}

/* Split "cove_key_XXXXXXXXXXXXXXXXXXXX_<64 hex>" into id and secret bytes. */
static int parse_key(const char *s, char id[COVE_APIKEY_ID_LEN + 1],
                     uint8_t secret[COVE_APIKEY_SECRET_LEN])
{
        if (!s || strnlen(s, COVE_APIKEY_LEN + 1) != COVE_APIKEY_LEN)
                return -1;
        if (memcmp(s, COVE_APIKEY_PREFIX "key_", 9) != 0)
                return -1;
        for (size_t i = 9; i < 5 + COVE_APIKEY_ID_LEN; i++)
                if (!is_b32(s[i]))
                        return -1;
        if (s[5 + COVE_APIKEY_ID_LEN] != '_')
                return -1;
        memcpy(id, s + 5, COVE_APIKEY_ID_LEN);
        id[COVE_APIKEY_ID_LEN] = '\0';
        return unhex(s + 5 + COVE_APIKEY_ID_LEN + 1, secret, COVE_APIKEY_SECRET_LEN);
}

int cove_apikey_create(const struct cove_catalog_ops *ops, struct cove_catalog *c,
                       const char *tenant, int admin, char *key_out, size_t cap,
                       struct cove_err *err)
{
        if (cap > 0)
                key_out[0] = '\0';
        if (cap < COVE_APIKEY_BUF)
                return cove_err_setk(err, COVE_E_INTERNAL, ENOBUFS,
                                     "api key: output buffer of %zu bytes, need %d", cap,
                                     COVE_APIKEY_BUF);
        struct cove_apikey_row row;
        memset(&row, 0, sizeof(row));
        if (!tenant || !*tenant || strlen(tenant) >= sizeof(row.tenant))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "api key: tenant missing or too long");
        uint8_t salt[SALT_LEN], secret[COVE_APIKEY_SECRET_LEN];
        char secret_hex[2 * COVE_APIKEY_SECRET_LEN + 1];
        int r = -1;
        if (cove_id_new("key_", row.id, sizeof(row.id), err) < 0 ||
            cove_random(salt, sizeof(salt), err) < 0 ||
            cove_random(secret, sizeof(secret), err) < 0) {
                cove_err_wrap(err, "api key for tenant %s", tenant);
                goto out;
        }
        strcpy(row.tenant, tenant);
        cove_hex(salt, sizeof(salt), row.salt_hex);
        if (sha256_salted(salt, secret, row.hash_hex, err) < 0)
                goto out;
        row.admin = admin ? 1 : 0;
        row.created_at = cove_now_ms();
        if (ops->apikey_put(c, &row, err) < 0) {
                cove_err_wrap(err, "create api key for tenant %s", tenant);
                goto out;
        }
        cove_hex(secret, sizeof(secret), secret_hex);
        snprintf(key_out, cap, COVE_APIKEY_PREFIX "%s_%s", row.id, secret_hex);
        r = 0;
out:
        OPENSSL_cleanse(secret, sizeof(secret));
        OPENSSL_cleanse(secret_hex, sizeof(secret_hex));
        return r;
}

int cove_apikey_verify(const struct cove_catalog_ops *ops, struct cove_catalog *c,
                       const char *presented, struct cove_apikey_row *out, struct cove_err *err)
{
        char id[COVE_APIKEY_ID_LEN + 1];
        uint8_t secret[COVE_APIKEY_SECRET_LEN];
        uint8_t salt[SALT_LEN];
        char hash_hex[65];
        struct cove_apikey_row row;
        int r = -1;
        if (parse_key(presented, id, secret) < 0) {
                cove_err_setk(err, COVE_E_UNAUTHORIZED, 0, "invalid API key (malformed)");
                goto out;
        }
        int g = ops->apikey_get(c, id, &row, err);
        if (g < 0) {
                cove_err_wrap(err, "verify api key %s", id);
                goto out;
        }
        if (g == 1) {
                /* Unknown id: hash anyway so a miss costs about what a wrong secret does. */
                memset(salt, 0, sizeof(salt));
                sha256_salted(salt, secret, hash_hex, NULL);
                cove_err_setk(err, COVE_E_UNAUTHORIZED, 0, "invalid API key");
                goto out;
        }
        if (strlen(row.salt_hex) != 2 * SALT_LEN || strlen(row.hash_hex) != 64 ||
            unhex(row.salt_hex, salt, SALT_LEN) < 0) {
                cove_err_set(err, 0, "verify api key %s: stored salt or hash is corrupt", id);
                goto out;
        }
        if (sha256_salted(salt, secret, hash_hex, err) < 0)
                goto out;
        if (CRYPTO_memcmp(hash_hex, row.hash_hex, 64) != 0) {
                cove_err_setk(err, COVE_E_UNAUTHORIZED, 0, "invalid API key");
                goto out;
        }
        /* Only a holder of the right secret learns that the key exists but is revoked. */
        if (row.revoked) {
                cove_err_setk(err, COVE_E_UNAUTHORIZED, 0, "API key %s is revoked", id);
                goto out;
        }
        if (out)
                *out = row;
        r = 0;
out:
        OPENSSL_cleanse(secret, sizeof(secret));
        return r;
}

int cove_apikey_revoke(const struct cove_catalog_ops *ops, struct cove_catalog *c,
                       const char *tenant, const char *id, struct cove_err *err)
{
        struct cove_apikey_row row;
        int g = ops->apikey_get(c, id, &row, err);
        if (g < 0)
                return cove_err_wrap(err, "revoke api key %s", id);
        if (g == 1 || (tenant && strcmp(tenant, row.tenant) != 0))
                return 1;
        if (row.revoked)
                return 0;
        row.revoked = 1;
        if (ops->apikey_put(c, &row, err) < 0)
                return cove_err_wrap(err, "revoke api key %s", id);
        return 0;
}

int cove_tenant_ensure_default(const struct cove_catalog_ops *ops, struct cove_catalog *c,
                               struct cove_err *err)
{
        struct cove_tenant_row t;
        int g = ops->tenant_get(c, "default", &t, err);
        if (g < 0)
                return cove_err_wrap(err, "ensure default tenant");
        if (g == 0)
                return 0;
        memset(&t, 0, sizeof(t));
        strcpy(t.id, "default");
        strcpy(t.name, "default");
        t.created_at = cove_now_ms();
        if (ops->tenant_put(c, &t, err) < 0)
                return cove_err_wrap(err, "ensure default tenant");
        return 1;
}
