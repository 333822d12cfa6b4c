/* Unit tests for API keys (control/apikey.c) over the SQLite catalog: create/verify, every
 * rejection path is COVE_E_UNAUTHORIZED without echoing the key, revocation sticks, and the
 * secret is stored nowhere. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "control/apikey.h"
#include "util/util.h"

static const struct cove_catalog_ops *ops = &cove_catalog_sqlite;

struct fx {
        char dir[64];
        char path[128];
        struct cove_catalog *c;
};

static int setup(void **state)
{
        struct fx *f = calloc(1, sizeof(*f));
        strcpy(f->dir, "/tmp/cove-test-key-XXXXXX");
        if (!mkdtemp(f->dir))
                return -1;
        snprintf(f->path, sizeof(f->path), "%s/catalog.db", f->dir);
        struct cove_err err = {0};
        f->c = ops->open(f->path, &err);
        if (!f->c)
                return -1;
        if (cove_tenant_ensure_default(ops, f->c, &err) != 1)
                return -1;
        *state = f;
        return 0;
}

static int teardown(void **state)
{
        struct fx *f = *state;
        if (f->c)
                ops->close(f->c);
        cove_rm_rf(f->dir, NULL);
        free(f);
        return 0;
}

static void create_key(struct fx *f, const char *tenant, int admin, char key[COVE_APIKEY_BUF])
{
        struct cove_err err = {0};
        if (cove_apikey_create(ops, f->c, tenant, admin, key, COVE_APIKEY_BUF, &err) != 0)
                fail_msg("create: %s", err.msg);
}

/* Verification must fail as unauthorized and the message must not echo the key. */
static void assert_unauthorized(struct fx *f, const char *presented)
{
        struct cove_err err = {0};
        struct cove_apikey_row row;
        memset(&row, 0x5a, sizeof(row));
        assert_int_equal(cove_apikey_verify(ops, f->c, presented, &row, &err), -1);
        assert_int_equal(err.kind, COVE_E_UNAUTHORIZED);
        assert_true(err.msg[0] != '\0');
        if (presented && strlen(presented) > 30) {
                assert_null(strstr(err.msg, presented));
                assert_null(strstr(err.msg, presented + 30)); /* the secret part */
        }
        assert_int_equal(row.id[0], 0x5a); /* out untouched on failure */
}

static void create_then_verify(void **state)
{
        struct fx *f = *state;
        char key[COVE_APIKEY_BUF];
        create_key(f, "default", 1, key);
        assert_int_equal(strlen(key), COVE_APIKEY_LEN);
        assert_memory_equal(key, "cove_key_", 9);
        assert_int_equal(key[29], '_');

        struct cove_apikey_row row;
        struct cove_err err = {0};
        assert_int_equal(cove_apikey_verify(ops, f->c, key, &row, &err), 0);
        assert_string_equal(row.tenant, "default");
        assert_int_equal(row.admin, 1);
        assert_int_equal(row.revoked, 0);
        assert_memory_equal(row.id, key + 5, 24);
        assert_int_equal(strlen(row.id), 24);

        /* two keys differ in id and secret; a non-admin key says so */
        char key2[COVE_APIKEY_BUF];
        create_key(f, "default", 0, key2);
        assert_memory_not_equal(key, key2, 29);
        assert_memory_not_equal(key + 30, key2 + 30, 64);
        assert_int_equal(cove_apikey_verify(ops, f->c, key2, &row, &err), 0);
        assert_int_equal(row.admin, 0);
        int64_t n = 0;
        assert_int_equal(ops->apikey_count(f->c, &n, &err), 0);
        assert_int_equal(n, 2);
}

static void wrong_secret_unknown_id(void **state)
{
        struct fx *f = *state;
        char key[COVE_APIKEY_BUF], bad[COVE_APIKEY_BUF];
        create_key(f, "default", 0, key);
        /* flip each position of the secret in turn: every one must matter */
        for (int i = 30; i < COVE_APIKEY_LEN; i++) {
                strcpy(bad, key);
                bad[i] = bad[i] == '0' ? '1' : '0';
                assert_unauthorized(f, bad);
        }
        /* unknown id with a well-formed secret */
        strcpy(bad, key);
        bad[9] = bad[9] == 'a' ? 'b' : 'a';
        assert_unauthorized(f, bad);
        struct cove_err err = {0};
        assert_int_equal(cove_apikey_verify(ops, f->c, key, NULL, &err), 0);
}

static void malformed_strings(void **state)
{
        struct fx *f = *state;
        char key[COVE_APIKEY_BUF], bad[COVE_APIKEY_BUF + 8];
        create_key(f, "default", 0, key);
        assert_unauthorized(f, NULL);
        assert_unauthorized(f, "");
        assert_unauthorized(f, "cove_");
        assert_unauthorized(f, "Bearer x");
        snprintf(bad, sizeof(bad), "%sa", key); /* one char too long */
        assert_unauthorized(f, bad);
        snprintf(bad, sizeof(bad), "%.*s", COVE_APIKEY_LEN - 1, key); /* one too short */
        assert_unauthorized(f, bad);
        strcpy(bad, key);
        bad[0] = 'C'; /* prefix */
        assert_unauthorized(f, bad);
        strcpy(bad, key);
        bad[29] = '-'; /* separator */
        assert_unauthorized(f, bad);
        strcpy(bad, key);
        bad[12] = '1'; /* not base32 */
        assert_unauthorized(f, bad);
        const char subst[] = {'A', 'g', 'z', '-', '_', ' ', '\xff', '/', ':', '`', 'G', '@'};
        for (size_t j = 0; j < sizeof(subst); j++) {
                strcpy(bad, key);
                bad[40] = subst[j]; /* not lowercase hex */
                assert_unauthorized(f, bad);
        }
        strcpy(bad, key);
        for (int i = 30; i < COVE_APIKEY_LEN; i++)
                if (bad[i] >= 'a' && bad[i] <= 'f')
                        bad[i] = (char)(bad[i] - 'a' + 'A'); /* uppercase hex is not canonical */
        if (strcmp(bad, key) != 0)
                assert_unauthorized(f, bad);
        /* embedded NUL: the verifier sees a short string */
        memcpy(bad, key, COVE_APIKEY_BUF);
        bad[50] = '\0';
        assert_unauthorized(f, bad);
}

static void revoked_is_unauthorized_forever(void **state)
{
        struct fx *f = *state;
        struct cove_err err = {0};
        struct cove_tenant_row t = {.id = "other", .name = "other", .created_at = 1};
        assert_int_equal(ops->tenant_put(f->c, &t, &err), 0);
        char key[COVE_APIKEY_BUF], id[32];
        create_key(f, "default", 1, key);
        snprintf(id, sizeof(id), "%.24s", key + 5);

        assert_int_equal(cove_apikey_revoke(ops, f->c, "other", id, &err), 1); /* not theirs */
        assert_int_equal(cove_apikey_verify(ops, f->c, key, NULL, &err), 0);
        assert_int_equal(cove_apikey_revoke(ops, f->c, "default", "key_nope", &err), 1);
        assert_int_equal(cove_apikey_revoke(ops, f->c, "default", id, &err), 0);
        assert_unauthorized(f, key);
        /* the holder of the right secret is told why */
        assert_int_equal(cove_apikey_verify(ops, f->c, key, NULL, &err), -1);
        assert_non_null(strstr(err.msg, "revoked"));
        assert_null(strstr(err.msg, key + 30));
        assert_int_equal(cove_apikey_revoke(ops, f->c, NULL, id, &err), 0);

        /* the catalog never un-revokes, nor lets a put swap the hash or tenant */
        struct cove_apikey_row row;
        assert_int_equal(ops->apikey_get(f->c, id, &row, &err), 0);
        assert_int_equal(row.revoked, 1);
        row.revoked = 0;
        assert_int_equal(ops->apikey_put(f->c, &row, &err), 0);
        assert_unauthorized(f, key);
        strcpy(row.tenant, "other");
        assert_int_equal(ops->apikey_put(f->c, &row, &err), -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        assert_int_equal(ops->apikey_get(f->c, id, &row, &err), 0);
        assert_string_equal(row.tenant, "default");
        assert_int_equal(row.revoked, 1);

        /* survives reopen */
        ops->close(f->c);
        f->c = ops->open(f->path, &err);
        assert_non_null(f->c);
        assert_unauthorized(f, key);
}

static int file_contains(const char *path, const void *needle, size_t n)
{
        char *buf = NULL;
        size_t len = 0;
        if (cove_read_file(path, 64 << 20, &buf, &len, NULL) < 0)
                return 0; /* absent file holds nothing */
        int found = memmem(buf, len, needle, n) != NULL;
        free(buf);
        return found;
}

static void secret_is_never_stored(void **state)
{
        struct fx *f = *state;
        char key[COVE_APIKEY_BUF], id[32];
        create_key(f, "default", 0, key);
        snprintf(id, sizeof(id), "%.24s", key + 5);
        const char *secret_hex = key + 30;
        uint8_t secret[32], salt[32];
        for (int i = 0; i < 32; i++)
                sscanf(secret_hex + 2 * i, "%2hhx", &secret[i]);

        struct cove_apikey_row row;
        struct cove_err err = {0};
        assert_int_equal(ops->apikey_get(f->c, id, &row, &err), 0);
        assert_null(strstr(row.salt_hex, secret_hex));
        assert_null(strstr(row.hash_hex, secret_hex));
        assert_null(memmem(&row, sizeof(row), secret, sizeof(secret)));
        assert_null(memmem(&row, sizeof(row), secret_hex, 64));

        /* the stored hash is SHA-256(salt || secret), independently recomputed */
        for (int i = 0; i < 32; i++)
                sscanf(row.salt_hex + 2 * i, "%2hhx", &salt[i]);
        uint8_t buf[64], md[32];
        memcpy(buf, salt, 32);
        memcpy(buf + 32, secret, 32);
        unsigned int mdlen = 0;
        assert_int_equal(EVP_Digest(buf, 64, md, &mdlen, EVP_sha256(), NULL), 1);
        char md_hex[65];
        cove_hex(md, 32, md_hex);
        assert_string_equal(row.hash_hex, md_hex);

        /* nor anywhere in the database files (main, WAL), hex or raw */
        const char *suffix[] = {"", "-wal", "-shm"};
        char p[160];
        int present = 0;
        for (int s = 0; s < 3; s++) {
                snprintf(p, sizeof(p), "%s%s", f->path, suffix[s]);
                assert_false(file_contains(p, secret_hex, 64));
                assert_false(file_contains(p, secret, 32));
                present += file_contains(p, row.hash_hex, 64); /* the search itself works */
        }
        assert_true(present > 0);
}

static void tenants_default_and_missing(void **state)
{
        struct fx *f = *state;
        struct cove_err err = {0};
        assert_int_equal(cove_tenant_ensure_default(ops, f->c, &err), 0); /* setup made it */
        struct cove_tenant_row t;
        assert_int_equal(ops->tenant_get(f->c, "default", &t, &err), 0);
        assert_string_equal(t.name, "default");
        char key[COVE_APIKEY_BUF];
        assert_int_equal(cove_apikey_create(ops, f->c, "nobody", 0, key, sizeof(key), &err), -1);
        assert_int_equal(err.kind, COVE_E_NOT_FOUND);
        assert_string_equal(key, "");
        int64_t n = -1;
        assert_int_equal(ops->apikey_count(f->c, &n, &err), 0);
        assert_int_equal(n, 0);
        assert_int_equal(cove_apikey_create(ops, f->c, "default", 0, key, 64, &err), -1);
}

static void verify_cost(void **state)
{
        struct fx *f = *state;
        char key[COVE_APIKEY_BUF];
        create_key(f, "default", 0, key);
        enum { N = 5000 };
        int64_t t0 = cove_mono_ns();
        for (int i = 0; i < N; i++)
                if (cove_apikey_verify(ops, f->c, key, NULL, NULL) != 0)
                        fail();
        double us = (double)(cove_mono_ns() - t0) / N / 1000;
        print_message("api key verify: %.1f us\n", us);
        assert_true(us < 1000.0);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
            cmocka_unit_test_setup_teardown(create_then_verify, setup, teardown),
            cmocka_unit_test_setup_teardown(wrong_secret_unknown_id, setup, teardown),
            cmocka_unit_test_setup_teardown(malformed_strings, setup, teardown),
            cmocka_unit_test_setup_teardown(revoked_is_unauthorized_forever, setup, teardown),
            cmocka_unit_test_setup_teardown(secret_is_never_stored, setup, teardown),
            cmocka_unit_test_setup_teardown(tenants_default_and_missing, setup, teardown),
            cmocka_unit_test_setup_teardown(verify_cost, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
