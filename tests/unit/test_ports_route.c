/* Unit tests of the port listener's request heads (net/ports_route.c): routes by Host,
 * E2B headers and path; where a token is taken from and that the rewritten head carries
 * none of it; X-Forwarded-* set by the node whatever the client sent; framing refusals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/ports_route.h"

static struct cove_ports_req rq;

static int parse(const char *head, const char *domain)
{
        const char *why = NULL;
        return cove_ports_parse(head, strlen(head), domain, &rq, &why);
}

static char *rewrite(const char *head)
{
        struct cove_bytes o = {0};
        assert_int_equal(cove_ports_rewrite(head, &rq, "10.0.0.9", &o), 0);
        char *s = calloc(1, o.len + 1);
        memcpy(s, o.b, o.len);
        cove_bytes_free(&o);
        return s;
}

static void test_routes(void **state)
{
        (void)state;
        assert_int_equal(
            parse("GET /x HTTP/1.1\r\nHost: 8080-sbx_ab12.Ports.Test:9000\r\n\r\n", "ports.test"),
            0);
        assert_int_equal(rq.mode, COVE_PORTS_HOST);
        assert_string_equal(rq.sandbox, "sbx_ab12");
        assert_int_equal(rq.port, 8080);
        /* without a domain the same Host is no route */
        assert_int_equal(parse("GET /x HTTP/1.1\r\nHost: 8080-sbx_ab12.ports.test\r\n\r\n", NULL),
                         0);
        assert_int_equal(rq.mode, COVE_PORTS_NONE);
        /* a look-alike domain is not the domain */
        assert_int_equal(
            parse("GET / HTTP/1.1\r\nHost: 80-sbx_a.evilports.test\r\n\r\n", "ports.test"), 0);
        assert_int_equal(rq.mode, COVE_PORTS_NONE);
        const char *h = "GET /p/sbx_ab12/3000/a/b?c=d HTTP/1.1\r\nHost: node\r\n\r\n";
        assert_int_equal(parse(h, "ports.test"), 0);
        assert_int_equal(rq.mode, COVE_PORTS_PATH);
        assert_int_equal(rq.port, 3000);
        char *o = rewrite(h);
        assert_non_null(strstr(o, "GET /a/b?c=d HTTP/1.1\r\n"));
        assert_non_null(strstr(o, "X-Forwarded-Prefix: /p/sbx_ab12/3000\r\n"));
        free(o);
        h = "GET /p/sbx_ab12/3000 HTTP/1.1\r\nHost: node\r\n\r\n";
        assert_int_equal(parse(h, NULL), 0);
        o = rewrite(h);
        assert_non_null(strstr(o, "GET / HTTP/1.1\r\n"));
        free(o);
        /* bad ports and ids are no route */
        const char *bad[] = {"/p/sbx/0/", "/p/sbx/65536/", "/p/sbx/080/", "/p/sb%78/80/",
                             "/p//80/",   "/p/sbx/80x/",   "/q/sbx/80/"};
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                char b[256];
                snprintf(b, sizeof(b), "GET %s HTTP/1.1\r\nHost: n\r\n\r\n", bad[i]);
                assert_int_equal(parse(b, NULL), 0);
                assert_int_equal(rq.mode, COVE_PORTS_NONE);
        }
        assert_int_equal(parse("GET / HTTP/1.1\r\nHost: n\r\nE2b-Sandbox-Id: sbx_q\r\n"
                               "E2b-Sandbox-Port: 49999\r\n\r\n",
                               NULL),
                         0);
        assert_int_equal(rq.mode, COVE_PORTS_E2B);
        assert_int_equal(rq.port, 49999);
}

static void test_tokens_never_reach_the_sandbox(void **state)
{
        (void)state;
        const char *h = "GET /p/sbx_a/80/x?cove_token=QQQ&k=v&cove_token=RRR HTTP/1.1\r\n"
                        "Host: n\r\nCookie: a=1; cove_port_token=CCC; b=2\r\n"
                        "X-Cove-Port-Token: HHH\r\nx-forwarded-for: 6.6.6.6\r\n"
                        "Forwarded: for=6.6.6.6\r\n\r\n";
        assert_int_equal(parse(h, NULL), 0);
        assert_int_equal(rq.tsrc, COVE_PORTS_TOK_HEADER); /* the header wins */
        assert_string_equal(rq.token, "HHH");
        char *o = rewrite(h);
        assert_null(strstr(o, "QQQ"));
        assert_null(strstr(o, "RRR"));
        assert_null(strstr(o, "CCC"));
        assert_null(strstr(o, "HHH"));
        assert_null(strstr(o, "6.6.6.6"));
        assert_non_null(strstr(o, "GET /x?k=v HTTP/1.1\r\n"));
        assert_non_null(strstr(o, "Cookie: a=1; b=2\r\n"));
        assert_non_null(strstr(o, "X-Forwarded-For: 10.0.0.9\r\n"));
        assert_non_null(strstr(o, "X-Forwarded-Host: n\r\n"));
        free(o);
        h = "GET /p/sbx_a/80/?cove_token=QQQ HTTP/1.1\r\nHost: n\r\nCookie: "
            "cove_port_token=C\r\n\r\n";
        assert_int_equal(parse(h, NULL), 0);
        assert_int_equal(rq.tsrc, COVE_PORTS_TOK_QUERY);
        o = rewrite(h);
        assert_non_null(strstr(o, "GET / HTTP/1.1\r\n"));
        assert_null(strstr(o, "Cookie"));
        free(o);
        /* a token longer than any is kept as one that matches nothing */
        char big[600];
        snprintf(big, sizeof(big), "GET / HTTP/1.1\r\nHost: n\r\nX-Cove-Port-Token: %0300d\r\n\r\n",
                 1);
        assert_int_equal(parse(big, NULL), 0);
        assert_int_equal(rq.token[0], '!');
}

static void test_refusals(void **state)
{
        (void)state;
        const char *bad[] = {
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n",
            "GET / HTTP/1.1\r\nHo st: a\r\n\r\n",
            "GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n",
            "CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET / HTTP/2.0\r\nHost: a\r\n\r\n",
            "GET / HTTP/1.1\r\n\r\n",
            "GET /\x7f HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\rb\r\n\r\n",
            "GET / HTTP/1.1\nHost: a\r\n\r\n",
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
                assert_int_not_equal(parse(bad[i], "ports.test"), 0);
        assert_int_equal(
            parse("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", NULL), 0);
        assert_true(rq.chunked);
        assert_int_equal(parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\n\r\n", NULL),
                         0);
        assert_int_equal(rq.clen, 12);
        assert_int_equal(cove_ports_head_len((const uint8_t *)"GET / HTTP/1.1\r\n\r\nxyz", 21), 18);
        assert_int_equal(cove_ports_head_len((const uint8_t *)"GET / HTTP/1.1\r\n\r", 17), 0);
}

/* A control replica's relayed head: as sent but for client-sent relay headers, with the
 * replica's lines; the node's rewrite drops them before the sandbox. */
static void test_relay_head(void **state)
{
        (void)state;
        const char *h = "POST /p/sbx_a/80/x?cove_token=QQQ HTTP/1.1\r\nHost: n\r\n"
                        "X-Cove-Relay: forged\r\nx-cove-client: 6.6.6.6\r\n"
                        "Content-Length: 3\r\n\r\n";
        assert_int_equal(parse(h, NULL), 0);
        char v[64];
        assert_int_equal(cove_ports_req_header(h, &rq, "X-Cove-Relay", v, sizeof(v)), 1);
        assert_string_equal(v, "forged");
        assert_int_equal(cove_ports_req_header(h, &rq, "X-Nothing", v, sizeof(v)), 0);
        assert_int_equal(cove_ports_req_header(h, &rq, "X-Cove-Relay", v, 4), -1);
        struct cove_bytes o = {0};
        assert_int_equal(
            cove_ports_relay_head(h, &rq, "X-Cove-Relay: R\r\nX-Cove-Client: 1.2.3.4\r\n", &o), 0);
        char *r = calloc(1, o.len + 1);
        memcpy(r, o.b, o.len);
        cove_bytes_free(&o);
        /* the target and the token stay (the node checks it); the client's relay lines go */
        assert_non_null(strstr(r, "POST /p/sbx_a/80/x?cove_token=QQQ HTTP/1.1\r\n"));
        assert_null(strstr(r, "forged"));
        assert_null(strstr(r, "6.6.6.6"));
        assert_non_null(strstr(r, "Content-Length: 3\r\n"));
        assert_non_null(strstr(r, "X-Cove-Client: 1.2.3.4\r\n\r\n"));
        /* the node: one of each, and its rewrite keeps neither from the sandbox */
        assert_int_equal(parse(r, NULL), 0);
        assert_int_equal(cove_ports_req_header(r, &rq, "X-Cove-Client", v, sizeof(v)), 1);
        assert_string_equal(v, "1.2.3.4");
        char *w = rewrite(r);
        assert_null(strstr(w, "X-Cove-"));
        free(w);
        free(r);
        /* twice is refused */
        h = "GET / HTTP/1.1\r\nHost: n\r\nX-Cove-Relay: a\r\nX-Cove-Relay: b\r\n\r\n";
        assert_int_equal(parse(h, NULL), 0);
        assert_int_equal(cove_ports_req_header(h, &rq, "X-Cove-Relay", v, sizeof(v)), -1);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_routes),
            cmocka_unit_test(test_tokens_never_reach_the_sandbox),
            cmocka_unit_test(test_refusals),
            cmocka_unit_test(test_relay_head),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
