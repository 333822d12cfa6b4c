/* Unit tests of the intercepted HTTP/1.1 request rewriter (net/http1.c) and the policy's
 * secret list and injection lookup (net/policy.c): credentials are injected only into heads
 * whose Host matches the SNI, framing is followed across keep-alive, pipelining and chunked
 * bodies fed one byte at a time, and unsafe requests are refused before anything of them
 * is emitted. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/http1.h"
#include "net/policy.h"

#define PH "cove_ph_0123456789abcdef0123456789abcdef"

static struct cove_inject inj[2];
static int ninj;

static int injects(void *arg, const struct cove_inject **out, int max)
{
        int n = 0;
        for (int i = 0; i < ninj && n < max; i++)
                out[n++] = &inj[i];
        return n;
}

static int napplied_total;
static void done(void *arg, const char *method, const char *target,
                 const struct cove_inject *const *applied, int n)
{
        napplied_total += n;
}

static int setup(void **state)
{
        memset(inj, 0, sizeof(inj));
        snprintf(inj[0].name, sizeof(inj[0].name), "GH");
        snprintf(inj[0].header, sizeof(inj[0].header), "Authorization");
        inj[0].format = strdup("Bearer {value}");
        inj[0].value = strdup("SECRET1");
        snprintf(inj[1].name, sizeof(inj[1].name), "TOK");
        inj[1].placeholder = 1;
        snprintf(inj[1].ph, sizeof(inj[1].ph), "%s", PH);
        inj[1].value = strdup("SECRET2");
        ninj = 2;
        napplied_total = 0;
        return 0;
}

static int teardown(void **state)
{
        for (int i = 0; i < 2; i++) {
                free(inj[i].format);
                free(inj[i].value);
        }
        return 0;
}

/* feed s (in pieces of step bytes); returns the status, out gets the forwarded bytes */
static int feed(const char *s, size_t step, char **out)
{
        struct cove_h1 *h = malloc(sizeof(*h));
        cove_h1_init(h, "api.test", 443, injects, done, NULL);
        struct cove_bytes o = {0};
        const char *why = NULL;
        int r = 0;
        size_t n = strlen(s);
        for (size_t i = 0; i < n && r == 0; i += step)
                r = cove_h1_feed(h, (const uint8_t *)s + i, i + step > n ? n - i : step, &o, &why);
        cove_bytes_add(&o, "", 1);
        *out = strdup((char *)o.b);
        cove_bytes_free(&o);
        free(h);
        return r;
}

static void test_header_and_placeholder_injection(void **state)
{
        char *out;
        assert_int_equal(feed("GET /x?k=" PH " HTTP/1.1\r\nHost: api.test\r\nAuthorization: "
                              "Basic forged\r\nX-Key: " PH "\r\n\r\n",
                              1000, &out),
                         0);
        assert_non_null(strstr(out, "GET /x?k=SECRET2 HTTP/1.1\r\n"));
        assert_non_null(strstr(out, "X-Key: SECRET2\r\n"));
        assert_non_null(strstr(out, "Authorization: Bearer SECRET1\r\n"));
        assert_null(strstr(out, "forged"));
        assert_null(strstr(out, PH));
        assert_int_equal(napplied_total, 2);
        free(out);
}

static void test_pipelined_chunked_byte_by_byte(void **state)
{
        char *out;
        const char *in =
            "POST /a HTTP/1.1\r\nHost: API.test:443\r\nTransfer-Encoding: chunked\r\n\r\n"
            "3;ext=1\r\nabc\r\n0\r\nTrailer: x\r\n\r\n"
            "POST /b HTTP/1.1\r\nHost: api.test\r\nContent-Length: 4\r\n\r\nwxyz"
            "GET /c HTTP/1.1\r\nHost: api.test\r\n\r\n";
        assert_int_equal(feed(in, 1, &out), 0);
        assert_non_null(strstr(out, "3;ext=1\r\nabc\r\n0\r\nTrailer: x\r\n\r\nPOST /b"));
        assert_non_null(strstr(out, "\r\n\r\nwxyzGET /c HTTP/1.1\r\n"));
        /* three heads, the header secret on each */
        int n = 0;
        for (char *p = out; (p = strstr(p, "Authorization: Bearer SECRET1")); p++)
                n++;
        assert_int_equal(n, 3);
        free(out);
}

static void test_refusals(void **state)
{
        static const struct {
                const char *req;
                int status;
        } cases[] = {
            {"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n", 421},
            {"GET https://other.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n", 421},
            {"GET / HTTP/1.1\r\nHost: api.test:8443\r\n\r\n", 421},
            {"GET / HTTP/1.1\r\nHost: api.test\r\nHost: api.test\r\n\r\n", 400},
            {"GET / HTTP/1.1\r\n\r\n", 400},
            {"CONNECT api.test:443 HTTP/1.1\r\nHost: api.test\r\n\r\n", 501},
            {"GET / HTTP/1.1\r\nHost: api.test\r\nUpgrade: h2c\r\n\r\n", 501},
            {"POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
             400},
            {"POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 1\r\nTransfer-Encoding: "
             "chunked\r\n\r\n",
             400},
            {"POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
            {"GET / HTTP/1.1\r\nHost: api.test\r\n X-Folded: y\r\n\r\n", 400},
            {"GET / HTTP/1.1\nHost: api.test\r\n\r\n", 400},
            {"POST / HTTP/1.1\r\nHost: api.test\r\nContent-Encoding: gzip\r\nContent-Length: "
             "3\r\n\r\nabc",
             415},
            /* body-level refusals last */
            {"POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 50\r\n\r\nk=" PH, 400},
            {"POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400},
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                for (size_t step = 1; step <= 4096; step *= 64) {
                        char *out;
                        int r = feed(cases[i].req, step, &out);
                        if (r != cases[i].status)
                                fail_msg("case %zu step %zu: %d, want %d", i, step, r,
                                         cases[i].status);
                        /* a refused head emits nothing (a refused body: its head went) */
                        if (i < sizeof(cases) / sizeof(cases[0]) - 2)
                                assert_string_equal(out, "");
                        free(out);
                }
        }
}

static void test_placeholder_split_across_body_feeds(void **state)
{
        char *out;
        char req[512];
        snprintf(req, sizeof(req),
                 "POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: %zu\r\n\r\nxx%syy",
                 strlen(PH) + 4, PH);
        for (size_t step = 1; step < 64; step += 7) {
                assert_int_equal(feed(req, step, &out), 400);
                assert_null(strstr(out, PH)); /* the placeholder's last byte is never emitted */
                free(out);
        }
}

static void test_policy_secrets_and_lookup(void **state)
{
        json_error_t je;
        json_t *j =
            json_loads("{\"allow\":[\"api.test\"],\"secrets\":[\"GH\",\"GH\",\"TOK\"]}", 0, &je);
        struct cove_err err = {0};
        struct cove_policy *p = cove_policy_parse(j, &err);
        json_decref(j);
        assert_non_null(p);
        assert_int_equal(p->nsecrets, 2);
        json_t *back = cove_policy_json(p);
        assert_int_equal(json_array_size(json_object_get(back, "secrets")), 2);
        json_decref(back);
        struct cove_inject *in = calloc(2, sizeof(*in));
        snprintf(in[0].name, sizeof(in[0].name), "GH");
        cove_rule_parse("*.api.test", &in[0].hosts[0], &err);
        in[0].nhosts = 1;
        in[0].value = strdup("v");
        snprintf(in[1].name, sizeof(in[1].name), "LEASED");
        cove_rule_parse("api.test", &in[1].hosts[0], &err);
        in[1].nhosts = 1;
        in[1].value = strdup("w");
        in[1].expires_ms = 1000;
        cove_policy_set_injects(p, in, 2);
        const struct cove_inject *o[4];
        assert_int_equal(cove_policy_injects_for(p, "x.api.test", 0, o, 4), 1);
        assert_int_equal(cove_policy_injects_for(p, "api.test", 999, o, 4), 1);
        assert_string_equal(o[0]->name, "LEASED");
        assert_int_equal(cove_policy_injects_for(p, "api.test", 1000, o, 4), 0); /* expired */
        assert_int_equal(cove_policy_injects_for(p, "evilapi.test", 0, o, 4), 0);
        cove_policy_unref(p);
        assert_true(cove_secret_name_valid("GITHUB_TOKEN"));
        assert_true(cove_secret_name_valid("_x1"));
        assert_false(cove_secret_name_valid("1x"));
        assert_false(cove_secret_name_valid("a-b"));
        assert_false(cove_secret_name_valid(""));
        assert_false(cove_secret_name_valid("a b"));
}

int main(void)
{
        const struct CMUnitTest tests[] = {
            cmocka_unit_test_setup_teardown(test_header_and_placeholder_injection, setup, teardown),
            cmocka_unit_test_setup_teardown(test_pipelined_chunked_byte_by_byte, setup, teardown),
            cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
            cmocka_unit_test_setup_teardown(test_placeholder_split_across_body_feeds, setup,
                                            teardown),
            cmocka_unit_test(test_policy_secrets_and_lookup),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
