/* Unit tests for the key hierarchy (crypto/keys.c, crypto/keyprov.c): records hold only a
 * wrapped DEK, legacy .dek files migrate, a wrong or tampered key fails closed, rotation
 * keeps the DEK, revocation is immediate, and the command provider's bounds (timeout,
 * garbage, too much output, exit 3) and the cache TTL bound hold. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "crypto/keys.h"
#include "util/util.h"

struct fx {
        char dir[64];
        char keys[96];
};

static int setup(void **state)
{
        struct fx *f = calloc(1, sizeof(*f));
        strcpy(f->dir, "/tmp/cove-test-keys-XXXXXX");
        if (!mkdtemp(f->dir))
                return -1;
        snprintf(f->keys, sizeof(f->keys), "%s/keys", f->dir);
        cove_keys_cache_clear();
        cove_keys_cache_ttl_set(60000);
        *state = f;
        return 0;
}

static int teardown(void **state)
{
        struct fx *f = *state;
        cove_keys_cache_clear();
        cove_rm_rf(f->dir, NULL);
        free(f);
        return 0;
}

static void write_file(const char *path, const void *data, size_t n, mode_t mode)
{
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, data, n), (ssize_t)n);
        fchmod(fd, mode);
        close(fd);
}

/* 1 if needle occurs in the file at path. */
static int file_has(const char *path, const void *needle, size_t n)
{
        char *buf = NULL;
        size_t len = 0;
        if (cove_read_file(path, 1 << 20, &buf, &len, NULL) < 0)
                return 0;
        int hit = 0;
        for (size_t i = 0; i + n <= len && !hit; i++)
                hit = memcmp(buf + i, needle, n) == 0;
        free(buf);
        return hit;
}

static void create_and_reload(void **state)
{
        struct fx *f = *state;
        uint8_t a[32], b[32];
        struct cove_err err = {0};
        assert_int_equal(cove_dek_load(f->keys, "t1", 0, a, &err), -1);
        assert_int_equal(err.kind, COVE_E_NOT_FOUND);
        assert_int_equal(cove_dek_load(f->keys, "t1", 1, a, &err), 0);
        cove_keys_cache_clear();
        assert_int_equal(cove_dek_load(f->keys, "t1", 0, b, &err), 0);
        assert_memory_equal(a, b, 32);
        char path[256];
        snprintf(path, sizeof(path), "%s/t1.key", f->keys);
        struct stat st;
        assert_int_equal(stat(path, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0600);
        assert_false(file_has(path, a, 32)); /* only wrapped */
        snprintf(path, sizeof(path), "%s/node.kek", f->keys);
        assert_int_equal(stat(path, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0600);
        struct cove_key_status ks;
        assert_int_equal(cove_key_status_get(f->keys, "t1", &ks, &err), 0);
        assert_true(ks.exists);
        assert_string_equal(ks.rec.provider, "local");
        assert_string_equal(ks.rec.state, "active");
        assert_int_equal(ks.rec.version, 1);
        assert_memory_equal(ks.rec.key_id, "node:", 5);
        assert_int_equal(ks.rec.wrapped[0], 0);
        /* subkeys differ per purpose and per sandbox */
        struct cove_tenant_keys *k = NULL;
        assert_int_equal(cove_tenant_keys_open(f->keys, "t1", &k, &err), 0);
        uint8_t d1[32], d2[32], s1[COVE_FSCRYPT_KEY_LEN];
        assert_int_equal(cove_disk_key_derive(k, "sbx_a", d1, &err), 0);
        assert_int_equal(cove_disk_key_derive(k, "sbx_b", d2, &err), 0);
        assert_memory_not_equal(d1, d2, 32);
        assert_int_equal(cove_fscrypt_key_derive(k, "sbx_a", s1, &err), 0);
        assert_memory_not_equal(d1, s1, 32);
        assert_memory_not_equal(k->chunk_enc, k->disk, 32);
        cove_tenant_keys_free(k);
}

static void legacy_dek_migrates(void **state)
{
        struct fx *f = *state;
        struct cove_err err = {0};
        assert_int_equal(cove_mkdir_p(f->keys, 0700, &err), 0);
        uint8_t old[32], got[32];
        for (int i = 0; i < 32; i++)
                old[i] = (uint8_t)(i * 7 + 1);
        char path[256];
        snprintf(path, sizeof(path), "%s/legacy.dek", f->keys);
        write_file(path, old, 32, 0600);
        assert_int_equal(cove_dek_load(f->keys, "legacy", 0, got, &err), 0);
        assert_memory_equal(old, got, 32);
        assert_int_equal(access(path, F_OK), -1); /* plain copy gone */
        cove_keys_cache_clear();
        assert_int_equal(cove_dek_load(f->keys, "legacy", 0, got, &err), 0);
        assert_memory_equal(old, got, 32);
        snprintf(path, sizeof(path), "%s/legacy.key", f->keys);
        assert_false(file_has(path, old, 32));
}

static void tampered_and_wrong_key_fail_closed(void **state)
{
        struct fx *f = *state;
        struct cove_err err = {0};
        uint8_t dek[32];
        assert_int_equal(cove_dek_load(f->keys, "t2", 1, dek, &err), 0);
        struct cove_key_record rec;
        assert_int_equal(cove_key_record_read(f->keys, "t2", &rec, &err), 0);
        rec.wrapped[20] = rec.wrapped[20] == 'A' ? 'B' : 'A';
        assert_int_equal(cove_key_record_write(f->keys, &rec, 0, &err), 0);
        /* the changed record is noticed at once, cache or not */
        assert_int_equal(cove_key_check(f->keys, "t2", 0, &err), -1);
        assert_int_equal(err.kind, COVE_E_KEY_REVOKED);
        assert_null(strstr(err.msg, rec.wrapped));

        /* a record moved to another tenant's name does not open (tenant is bound in) */
        assert_int_equal(cove_dek_load(f->keys, "t3", 1, dek, &err), 0);
        assert_int_equal(cove_key_record_read(f->keys, "t3", &rec, &err), 0);
        snprintf(rec.tenant, sizeof(rec.tenant), "t4");
        assert_int_equal(cove_key_record_write(f->keys, &rec, 1, &err), 0);
        assert_int_equal(cove_key_check(f->keys, "t4", 0, &err), -1);
        assert_int_equal(err.kind, COVE_E_KEY_REVOKED);

        /* a local key file whose content changed: wrong KEK */
        char kf[256];
        snprintf(kf, sizeof(kf), "%s/kek-a", f->dir);
        uint8_t kek[32];
        memset(kek, 0x11, 32);
        write_file(kf, kek, 32, 0600);
        struct cove_key_spec spec = {.provider = "local", .key_file = kf};
        assert_int_equal(cove_key_rewrap(f->keys, "t3", &spec, NULL, &err), 0);
        cove_keys_cache_clear();
        assert_int_equal(cove_key_check(f->keys, "t3", 0, &err), 0);
        memset(kek, 0x22, 32);
        write_file(kf, kek, 32, 0600);
        cove_keys_cache_clear();
        assert_int_equal(cove_key_check(f->keys, "t3", 0, &err), -1);
        assert_int_equal(err.kind, COVE_E_KEY_REVOKED);
        /* a key file others can read is refused */
        chmod(kf, 0644);
        struct cove_key_spec spec2 = {.provider = "local", .key_file = kf};
        assert_int_equal(cove_key_rewrap(f->keys, "t2b", &spec2, NULL, &err), -1);
        assert_non_null(strstr(err.msg, "readable by others"));
}

static void rotation_keeps_dek(void **state)
{
        struct fx *f = *state;
        struct cove_err err = {0};
        uint8_t a[32], b[32];
        assert_int_equal(cove_dek_load(f->keys, "rot", 1, a, &err), 0);
        char kf[256];
        snprintf(kf, sizeof(kf), "%s/kek-hex", f->dir);
        const char *hex = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n";
        write_file(kf, hex, strlen(hex), 0600);
        struct cove_key_status ks;
        struct cove_key_spec spec = {.provider = "local", .key_file = kf};
        assert_int_equal(cove_key_rewrap(f->keys, "rot", &spec, &ks, &err), 0);
        assert_int_equal(ks.rec.version, 2);
        assert_memory_equal(ks.rec.key_id, "local:", 6);
        cove_keys_cache_clear();
        assert_int_equal(cove_dek_load(f->keys, "rot", 0, b, &err), 0);
        assert_memory_equal(a, b, 32);
        /* rotate in place (same provider), then back to the node default */
        assert_int_equal(cove_key_rewrap(f->keys, "rot", NULL, &ks, &err), 0);
        assert_int_equal(ks.rec.version, 3);
        struct cove_key_spec node = {.provider = "local"};
        assert_int_equal(cove_key_rewrap(f->keys, "rot", &node, &ks, &err), 0);
        assert_memory_equal(ks.rec.key_id, "node:", 5);
        cove_keys_cache_clear();
        assert_int_equal(cove_dek_load(f->keys, "rot", 0, b, &err), 0);
        assert_memory_equal(a, b, 32);
        /* the old key file is not needed any more */
        unlink(kf);
        cove_keys_cache_clear();
        assert_int_equal(cove_key_check(f->keys, "rot", 0, &err), 0);
        /* bad specs */
        struct cove_key_spec bad = {.provider = "kms"};
        assert_int_equal(cove_key_rewrap(f->keys, "rot", &bad, NULL, &err), -1);
        assert_int_equal(err.kind, COVE_E_BAD_REQUEST);
        struct cove_key_spec rel = {.provider = "local", .key_file = "relative"};
        assert_int_equal(cove_key_rewrap(f->keys, "rot", &rel, NULL, &err), -1);
        assert_int_equal(err.kind, COVE_E_BAD_REQUEST);
}

static void revoke_is_immediate(void **state)
{
        struct fx *f = *state;
        struct cove_err err = {0};
        uint8_t a[32];
        assert_int_equal(cove_dek_load(f->keys, "rv", 1, a, &err), 0);
        assert_int_equal(cove_key_check(f->keys, "rv", 0, &err), 0); /* cached */
        struct cove_key_status ks;
        assert_int_equal(cove_key_revoke(f->keys, "rv", &ks, &err), 0);
        assert_string_equal(ks.rec.state, "revoked");
        assert_false(ks.cached);
        assert_int_equal(cove_key_check(f->keys, "rv", 1, &err), -1);
        assert_int_equal(err.kind, COVE_E_KEY_REVOKED);
        struct cove_tenant_keys *k = NULL;
        assert_int_equal(cove_tenant_keys_open(f->keys, "rv", &k, &err), -1);
        assert_int_equal(err.kind, COVE_E_KEY_REVOKED);
        assert_int_equal(cove_key_rewrap(f->keys, "rv", NULL, NULL, &err), -1);
        assert_int_equal(err.kind, COVE_E_KEY_REVOKED);
        assert_int_equal(cove_key_revoke(f->keys, "rv", NULL, &err), 1);
        /* a tenant that never had a key is locked too */
        assert_int_equal(cove_key_revoke(f->keys, "never", NULL, &err), 0);
        assert_int_equal(cove_key_check(f->keys, "never", 1, &err), -1);
        assert_int_equal(err.kind, COVE_E_KEY_REVOKED);
}

/* A toy KMS for the protocol: the wrapped form is "a21z" (base64 "kms") + the DEK's base64.
 * Calls are counted in <dir>/calls; <dir>/revoked makes it refuse with exit 3. */
static void kms_cmds(const struct fx *f, char *wrap, char *unwrap, size_t cap)
{
        snprintf(wrap, cap, "read l; printf 'a21z%%s\\n' \"$l\"");
        snprintf(unwrap, cap,
                 "echo x >> %s/calls; [ -e %s/revoked ] && exit 3; read l; "
                 "printf '%%s\\n' \"${l#a21z}\"",
                 f->dir, f->dir);
}

static int calls(const struct fx *f)
{
        char path[256];
        snprintf(path, sizeof(path), "%s/calls", f->dir);
        char *buf = NULL;
        size_t len = 0;
        if (cove_read_file(path, 1 << 20, &buf, &len, NULL) < 0)
                return 0;
        free(buf);
        return (int)(len / 2);
}

static void command_provider_and_cache_bound(void **state)
{
        struct fx *f = *state;
        struct cove_err err = {0};
        char wrap[512], unwrap[512];
        kms_cmds(f, wrap, unwrap, sizeof(wrap));
        uint8_t a[32], b[32];
        assert_int_equal(cove_dek_load(f->keys, "byok", 1, a, &err), 0);
        struct cove_key_spec spec = {
            .provider = "command", .wrap_cmd = wrap, .unwrap_cmd = unwrap, .key_id = "kms:test/1"};
        struct cove_key_status ks;
        assert_int_equal(cove_key_rewrap(f->keys, "byok", &spec, &ks, &err), 0);
        assert_string_equal(ks.rec.key_id, "kms:test/1");
        assert_int_equal(calls(f), 1); /* the round trip */
        cove_keys_cache_ttl_set(300);
        assert_int_equal(cove_dek_load(f->keys, "byok", 0, b, &err), 0);
        assert_memory_equal(a, b, 32);
        int n = calls(f);
        assert_int_equal(n, 2);
        assert_int_equal(cove_key_check(f->keys, "byok", 0, &err), 0); /* cached */
        assert_int_equal(calls(f), n);
        /* revoked in the KMS: still served from the cache within the TTL, refused after */
        char rv[256];
        snprintf(rv, sizeof(rv), "%s/revoked", f->dir);
        write_file(rv, "", 0, 0600);
        int64_t t0 = cove_mono_ns();
        assert_int_equal(cove_key_check(f->keys, "byok", 0, &err), 0);
        int64_t deadline = t0 + 2000000000LL;
        int rc = 0;
        while ((rc = cove_key_check(f->keys, "byok", 0, &err)) == 0 && cove_mono_ns() < deadline) {
                struct timespec ts = {0, 5000000};
                nanosleep(&ts, NULL);
        }
        assert_int_equal(rc, -1);
        assert_int_equal(err.kind, COVE_E_KEY_REVOKED);
        int64_t took_ms = (cove_mono_ns() - t0) / 1000000;
        assert_true(took_ms <= 300 + 100); /* the bound: TTL plus one unwrap */
        unlink(rv);
        assert_int_equal(cove_key_check(f->keys, "byok", 0, &err), 0); /* KMS allows again */
        /* TTL 0: every use unwraps */
        cove_keys_cache_ttl_set(0);
        n = calls(f);
        assert_int_equal(cove_key_check(f->keys, "byok", 0, &err), 0);
        assert_int_equal(cove_key_check(f->keys, "byok", 0, &err), 0);
        assert_int_equal(calls(f), n + 2);
}

static void command_provider_failures(void **state)
{
        struct fx *f = *state;
        struct cove_err err = {0};
        char wrap[512], unwrap[512];
        kms_cmds(f, wrap, unwrap, sizeof(wrap));
        assert_int_equal(cove_key_check(f->keys, "bad", 1, &err), 0);
        struct cove_key_spec spec = {.provider = "command", .wrap_cmd = wrap, .unwrap_cmd = unwrap};
        assert_int_equal(cove_key_rewrap(f->keys, "bad", &spec, NULL, &err), 0);
        struct cove_key_record good;
        assert_int_equal(cove_key_record_read(f->keys, "bad", &good, &err), 0);
        struct {
                const char *unwrap;
                int timeout_ms;
                enum cove_err_kind kind;
                const char *msg;
        } cases[] = {
            {"sleep 30", 300, COVE_E_UNAVAILABLE, "timed out after 300 ms"},
            /* a child that keeps stdout open cannot stretch the wait either */
            {"sleep 30 & echo", 300, COVE_E_UNAVAILABLE, "timed out"},
            {"echo '!!not base64!!'", 0, COVE_E_UNAVAILABLE, "invalid output"},
            {"echo AAAAAAAAAAAAAAAAAAAAAA==", 0, COVE_E_UNAVAILABLE, "invalid output"},
            {"yes AAAA", 0, COVE_E_UNAVAILABLE, "printed too much"},
            {"printf 'AAAA\\nAAAA\\n'", 0, COVE_E_UNAVAILABLE, "invalid output"},
            {"exit 1", 0, COVE_E_UNAVAILABLE, "failed (exit status 1)"},
            {"exit 3", 0, COVE_E_KEY_REVOKED, "revoked or disabled"},
            {"kill -9 $$", 0, COVE_E_UNAVAILABLE, "failed (signal 9)"},
            /* valid base64 of 32 bytes, but not the key: the check value catches it */
            {"echo AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", 0, COVE_E_KEY_REVOKED,
             "does not match"},
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                struct cove_key_record rec = good;
                snprintf(rec.unwrap_cmd, sizeof(rec.unwrap_cmd), "%s", cases[i].unwrap);
                rec.timeout_ms = cases[i].timeout_ms;
                assert_int_equal(cove_key_record_write(f->keys, &rec, 0, &err), 0);
                int64_t t0 = cove_mono_ns();
                memset(&err, 0, sizeof(err));
                assert_int_equal(cove_key_check(f->keys, "bad", 0, &err), -1);
                int64_t ms = (cove_mono_ns() - t0) / 1000000;
                print_message("case %zu (%s): %lld ms: %s\n", i, cases[i].unwrap, (long long)ms,
                              err.msg);
                assert_int_equal(err.kind, cases[i].kind);
                assert_non_null(strstr(err.msg, cases[i].msg));
                assert_true(ms < 3000); /* bounded wait */
        }
        /* a wrap command that fails leaves the record as it was */
        assert_int_equal(cove_key_record_write(f->keys, &good, 0, &err), 0);
        struct cove_key_spec broken = {
            .provider = "command", .wrap_cmd = "echo '%%%'", .unwrap_cmd = unwrap};
        assert_int_equal(cove_key_rewrap(f->keys, "bad", &broken, NULL, &err), -1);
        struct cove_key_record now;
        assert_int_equal(cove_key_record_read(f->keys, "bad", &now, &err), 0);
        assert_string_equal(now.wrapped, good.wrapped);
        assert_int_equal(now.version, good.version);
        struct cove_key_spec nocmd = {.provider = "command", .wrap_cmd = wrap};
        assert_int_equal(cove_key_rewrap(f->keys, "bad", &nocmd, NULL, &err), -1);
        assert_int_equal(err.kind, COVE_E_BAD_REQUEST);
}

static void unwrap_cost(void **state)
{
        struct fx *f = *state;
        struct cove_err err = {0};
        assert_int_equal(cove_key_check(f->keys, "cost", 1, &err), 0);
        int n = 2000;
        int64_t t0 = cove_mono_ns();
        for (int i = 0; i < n; i++)
                assert_int_equal(cove_key_check(f->keys, "cost", 0, &err), 0);
        double cached_us = (double)(cove_mono_ns() - t0) / n / 1000.0;
        cove_keys_cache_ttl_set(0);
        t0 = cove_mono_ns();
        for (int i = 0; i < 200; i++)
                assert_int_equal(cove_key_check(f->keys, "cost", 0, &err), 0);
        double local_us = (double)(cove_mono_ns() - t0) / 200 / 1000.0;
        print_message("key check: cached %.2f us, local unwrap %.2f us\n", cached_us, local_us);
        assert_true(cached_us < 1000.0);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
            cmocka_unit_test_setup_teardown(create_and_reload, setup, teardown),
            cmocka_unit_test_setup_teardown(legacy_dek_migrates, setup, teardown),
            cmocka_unit_test_setup_teardown(tampered_and_wrong_key_fail_closed, setup, teardown),
            cmocka_unit_test_setup_teardown(rotation_keeps_dek, setup, teardown),
            cmocka_unit_test_setup_teardown(revoke_is_immediate, setup, teardown),
            cmocka_unit_test_setup_teardown(command_provider_and_cache_bound, setup, teardown),
            cmocka_unit_test_setup_teardown(command_provider_failures, setup, teardown),
            cmocka_unit_test_setup_teardown(unwrap_cost, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
