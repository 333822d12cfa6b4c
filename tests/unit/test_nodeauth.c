/* cluster/nodeauth.c: node tokens derive per name, a signed request verifies only with its
 * own token, method, path, tenant and body hash, inside the time window; malformed headers
 * are refused; answers are bound to the request's signature; key and token files are
 * checked for shape and mode. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "cluster/nodeauth.h"

static const uint8_t K[32] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16,
                              17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

static void test_tokens(void **st)
{
        (void)st;
        struct cove_err err = {0};
        char a[65], b[65], a2[65];
        assert_int_equal(cove_nodeauth_token(K, "node-a", a, &err), 0);
        assert_int_equal(cove_nodeauth_token(K, "node-b", b, &err), 0);
        assert_int_equal(cove_nodeauth_token(K, "node-a", a2, &err), 0);
        assert_int_equal(strlen(a), 64);
        assert_string_equal(a, a2);
        assert_string_not_equal(a, b);
        uint8_t k2[32];
        memcpy(k2, K, 32);
        k2[0] ^= 1;
        assert_int_equal(cove_nodeauth_token(k2, "node-a", a2, &err), 0);
        assert_string_not_equal(a, a2);
        const char *badn[] = {"",
                              "-x",
                              "A",
                              "a_b",
                              "a.b",
                              "a/b",
                              "0123456789012345678901234567890123456789012345678901234567890123"};
        for (size_t i = 0; i < sizeof(badn) / sizeof(*badn); i++)
                assert_int_equal(cove_nodeauth_token(K, badn[i], a2, &err), -1);
        assert_true(cove_node_name_valid("n1"));
        assert_true(cove_node_name_valid("node-7a"));
}

static void test_sign_verify(void **st)
{
        (void)st;
        struct cove_err err = {0};
        char tok[65], other[65], hdr[COVE_NODEAUTH_HDR_MAX], sig[65];
        cove_nodeauth_token(K, "n1", tok, &err);
        cove_nodeauth_token(K, "n2", other, &err);
        struct cove_nodeauth_req q = {.method = "POST",
                                      .path_query = "/v1/sandboxes/sbx_a/exec?x=1",
                                      .tenant = "acme",
                                      .body_sha256_hex = "ab"};
        int64_t now = 1800000000000;
        assert_int_equal(cove_nodeauth_sign(tok, "n1", &q, now, hdr, sizeof(hdr), sig, &err), 0);
        struct cove_nodeauth_hdr h;
        assert_int_equal(cove_nodeauth_parse(hdr, &h, &err), 0);
        assert_string_equal(h.name, "n1");
        assert_string_equal(h.sig, sig);
        assert_int_equal(cove_nodeauth_verify(tok, &h, &q, now + 1000, &err), 0);
        /* another node's token, the time window both ways */
        assert_int_equal(cove_nodeauth_verify(other, &h, &q, now, &err), -1);
        assert_int_equal(err.kind, COVE_E_UNAUTHORIZED);
        assert_null(strstr(err.msg, tok));
        assert_int_equal(cove_nodeauth_verify(tok, &h, &q, now + COVE_NODEAUTH_SKEW_MS + 1, &err),
                         -1);
        assert_int_equal(cove_nodeauth_verify(tok, &h, &q, now - COVE_NODEAUTH_SKEW_MS - 1, &err),
                         -1);
        /* each signed part */
        struct cove_nodeauth_req q2 = q;
        q2.method = "GET";
        assert_int_equal(cove_nodeauth_verify(tok, &h, &q2, now, &err), -1);
        q2 = q;
        q2.path_query = "/v1/sandboxes/sbx_b/exec?x=1";
        assert_int_equal(cove_nodeauth_verify(tok, &h, &q2, now, &err), -1);
        q2 = q;
        q2.tenant = "evil";
        assert_int_equal(cove_nodeauth_verify(tok, &h, &q2, now, &err), -1);
        q2 = q;
        q2.tenant = NULL;
        assert_int_equal(cove_nodeauth_verify(tok, &h, &q2, now, &err), -1);
        q2 = q;
        q2.body_sha256_hex = "ac";
        assert_int_equal(cove_nodeauth_verify(tok, &h, &q2, now, &err), -1);
        /* a part cannot slide into its neighbour (NUL separators) */
        struct cove_nodeauth_req q3 = {.method = "POS", .path_query = "T/v1", .tenant = ""};
        struct cove_nodeauth_req q4 = {.method = "POST", .path_query = "/v1", .tenant = ""};
        assert_int_equal(cove_nodeauth_sign(tok, "n1", &q3, now, hdr, sizeof(hdr), NULL, &err), 0);
        assert_int_equal(cove_nodeauth_parse(hdr, &h, &err), 0);
        assert_int_equal(cove_nodeauth_verify(tok, &h, &q4, now, &err), -1);
        /* answers */
        char ans[65];
        cove_nodeauth_answer(tok, sig, ans);
        assert_int_equal(cove_nodeauth_answer_check(tok, sig, ans, &err), 0);
        assert_int_equal(cove_nodeauth_answer_check(other, sig, ans, &err), -1);
        ans[3] = ans[3] == 'a' ? 'b' : 'a';
        assert_int_equal(cove_nodeauth_answer_check(tok, sig, ans, &err), -1);
        assert_int_equal(cove_nodeauth_answer_check(tok, sig, NULL, &err), -1);
}

static void test_parse_refuses(void **st)
{
        (void)st;
        struct cove_err err = {0};
        struct cove_nodeauth_hdr h;
        const char *sig = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        char good[300];
        snprintf(good, sizeof(good), "Cove-Node name=n1,ts=5,nonce=0123456789abcdef,sig=%s", sig);
        assert_int_equal(cove_nodeauth_parse(good, &h, &err), 0);
        char bad[10][300];
        snprintf(bad[0], 300, "Bearer x");
        snprintf(bad[1], 300, "Cove-Node name=N1,ts=5,nonce=0123456789abcdef,sig=%s", sig);
        snprintf(bad[2], 300, "Cove-Node name=n1,ts=-5,nonce=0123456789abcdef,sig=%s", sig);
        snprintf(bad[3], 300, "Cove-Node name=n1,ts=5,nonce=0123456789abcdeg,sig=%s", sig);
        snprintf(bad[4], 300, "Cove-Node name=n1,ts=5,nonce=0123456789abcdef,sig=%.63s", sig);
        snprintf(bad[5], 300, "Cove-Node name=n1,ts=5,nonce=0123456789abcdef,sig=%s,x=1", sig);
        snprintf(bad[6], 300, "Cove-Node ts=5,name=n1,nonce=0123456789abcdef,sig=%s", sig);
        snprintf(bad[7], 300, "Cove-Node name=n1,ts=5x,nonce=0123456789abcdef,sig=%s", sig);
        snprintf(bad[8], 300, "Cove-Node name=,ts=5,nonce=0123456789abcdef,sig=%s", sig);
        snprintf(bad[9], 300, "Cove-Node name=n1,ts=5,nonce=0123456789ABCDEF,sig=%s", sig);
        for (int i = 0; i < 10; i++) {
                assert_int_equal(cove_nodeauth_parse(bad[i], &h, &err), -1);
                assert_int_equal(err.kind, COVE_E_UNAUTHORIZED);
        }
        assert_int_equal(cove_nodeauth_parse(NULL, &h, &err), -1);
}

static void write_file(const char *path, const char *data, size_t n, mode_t mode)
{
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        assert_int_equal(fwrite(data, 1, n, f), n);
        fclose(f);
        assert_int_equal(chmod(path, mode), 0);
}

static void test_files(void **st)
{
        (void)st;
        char dir[] = "/tmp/test_nodeauth.XXXXXX";
        assert_non_null(mkdtemp(dir));
        char p[300];
        snprintf(p, sizeof(p), "%s/k", dir);
        struct cove_err err = {0};
        uint8_t key[32];
        char tok[65];
        write_file(p, (const char *)K, 32, 0600);
        assert_int_equal(cove_nodeauth_read_key(p, key, &err), 0);
        assert_memory_equal(key, K, 32);
        write_file(p, "0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20\n", 65,
                   0600);
        assert_int_equal(cove_nodeauth_read_key(p, key, &err), 0);
        assert_memory_equal(key, K, 32);
        chmod(p, 0644);
        assert_int_equal(cove_nodeauth_read_key(p, key, &err), -1);
        assert_non_null(strstr(err.msg, "chmod 600"));
        write_file(p, "short", 5, 0600);
        assert_int_equal(cove_nodeauth_read_key(p, key, &err), -1);
        assert_null(strstr(err.msg, "short"));
        assert_int_equal(cove_nodeauth_read_token(p, tok, &err), -1);
        char want[65];
        cove_nodeauth_token(K, "n1", want, &err);
        write_file(p, want, 64, 0400);
        assert_int_equal(cove_nodeauth_read_token(p, tok, &err), 0);
        assert_string_equal(tok, want);
        snprintf(p + strlen(p), 10, "-none");
        assert_int_equal(cove_nodeauth_read_token(p, tok, &err), -1);
        snprintf(p, sizeof(p), "rm -rf %s", dir);
        assert_int_equal(system(p), 0);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_tokens),
            cmocka_unit_test(test_sign_verify),
            cmocka_unit_test(test_parse_refuses),
            cmocka_unit_test(test_files),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
