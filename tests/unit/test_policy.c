/* Unit tests of the egress policy (net/policy.c), the SNI/Host and DNS parsers
 * (net/sniff.c, net/dnsmsg.c) and the audit hash chain (control/audit.c): a tampered,
 * removed or reordered event is reported at the first broken link. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "control/audit.h"
#include "net/dnsmsg.h"
#include "net/policy.h"
#include "net/sniff.h"
#include "util/util.h"

static struct cove_policy *pol(const char *text)
{
        json_error_t je;
        json_t *j = json_loads(text, 0, &je);
        struct cove_err err = {0};
        struct cove_policy *p = cove_policy_parse(j, &err);
        json_decref(j);
        return p;
}

static uint32_t ip(const char *s)
{
        struct in_addr a;
        inet_pton(AF_INET, s, &a);
        return ntohl(a.s_addr);
}

static void test_patterns_valid_and_invalid(void **st)
{
        const char *ok[] = {"example.com",   "Example.COM:443",  "*.pypi.org", "*.x.io:8080",
                            "10.1.2.0/24",   "10.1.2.0/24:5432", "10.1.2.3",   "10.1.2.3:22",
                            "0.0.0.0/0:443", "a-b.c_d.e"};
        const char *bad[] = {
            "",        "*",           "*.",      "a..b",        "-a.com",       "a-.com",
            "a.com:0", "a.com:65536", "a.com:x", "10.1.2.0/33", "10.1.2.1/24",  "1.2.3/8",
            "a b.com", "*.*.com",     "x.*.com", "a.com:08",    "http://a.com", "a.com/x",
            "[::1]:80"};
        struct cove_rule r;
        struct cove_err err;
        for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
                if (cove_rule_parse(ok[i], &r, &err) != 0)
                        fail_msg("%s refused: %s", ok[i], err.msg);
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
                if (cove_rule_parse(bad[i], &r, &err) == 0)
                        fail_msg("%s accepted", bad[i]);
                else
                        assert_int_equal(err.kind, COVE_E_BAD_REQUEST);
        assert_int_equal(cove_rule_parse("Example.COM:443", &r, &err), 0);
        assert_string_equal(r.text, "example.com:443");
        /* policy shape */
        assert_null(pol("{\"allow\":\"a.com\"}"));
        assert_null(pol("{\"allow\":[1]}"));
        assert_null(pol("{\"allowed\":[]}"));
        assert_null(pol("[\"a.com\"]"));
        struct cove_policy *p = pol("{\"allow\":[\"a.com\"],\"deny\":[]}");
        assert_non_null(p);
        cove_policy_unref(p);
}

static void test_matching_deny_before_allow(void **st)
{
        struct cove_policy *p = pol("{\"allow\":[\"api.github.com:443\", \"*.pypi.org\", "
                                    "\"10.1.2.0/24:5432\", \"*.corp.test\"],"
                                    "\"deny\":[\"evil.pypi.org\", \"10.1.2.7/32\", "
                                    "\"secret.corp.test:443\"]}");
        assert_non_null(p);
        const char *rule;
        uint32_t pub = ip("203.0.113.9");
        assert_int_equal(cove_policy_check(p, "api.github.com", pub, 443, &rule), COVE_ALLOW);
        assert_string_equal(rule, "api.github.com:443");
        assert_int_equal(cove_policy_check(p, "api.github.com", pub, 80, &rule), COVE_NOMATCH);
        assert_int_equal(cove_policy_check(p, "files.pypi.org", pub, 443, &rule), COVE_ALLOW);
        assert_int_equal(cove_policy_check(p, "a.b.pypi.org", pub, 1, &rule), COVE_ALLOW);
        assert_int_equal(cove_policy_check(p, "pypi.org", pub, 443, &rule), COVE_NOMATCH);
        assert_int_equal(cove_policy_check(p, "xpypi.org", pub, 443, &rule), COVE_NOMATCH);
        assert_int_equal(cove_policy_check(p, "evil.pypi.org", pub, 443, &rule), COVE_DENY);
        assert_string_equal(rule, "evil.pypi.org");
        assert_int_equal(cove_policy_check_addr(p, ip("10.1.2.3"), 5432, &rule), COVE_ALLOW);
        assert_string_equal(rule, "10.1.2.0/24:5432");
        assert_int_equal(cove_policy_check_addr(p, ip("10.1.2.3"), 5433, &rule), COVE_NOMATCH);
        assert_int_equal(cove_policy_check_addr(p, ip("10.1.2.7"), 5432, &rule), COVE_DENY);
        /* an address deny wins over a name allow */
        assert_int_equal(cove_policy_check(p, "files.pypi.org", ip("10.1.2.7"), 443, &rule),
                         COVE_DENY);
        /* DNS: a port-scoped deny leaves the name resolvable, an any-port deny does not */
        assert_int_equal(cove_policy_check_dns(p, "secret.corp.test", &rule), COVE_ALLOW);
        assert_int_equal(cove_policy_check(p, "secret.corp.test", pub, 443, &rule), COVE_DENY);
        assert_int_equal(cove_policy_check_dns(p, "evil.pypi.org", &rule), COVE_DENY);
        assert_int_equal(cove_policy_check_dns(p, "other.test", &rule), COVE_NOMATCH);
        assert_true(cove_policy_names_addr(p, ip("10.1.2.200")));
        assert_false(cove_policy_names_addr(p, ip("10.1.2.7")));
        assert_false(cove_policy_names_addr(p, ip("10.1.3.1")));
        cove_policy_unref(p);
        /* empty policy: nothing */
        p = pol("{}");
        assert_int_equal(cove_policy_check(p, "a.com", pub, 443, &rule), COVE_NOMATCH);
        cove_policy_unref(p);
}

static void test_special_ranges(void **st)
{
        const char *special[] = {"127.0.0.1",   "10.9.9.9",        "172.16.0.1", "172.31.255.255",
                                 "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0",
                                 "224.0.0.1",   "255.255.255.255"};
        for (size_t i = 0; i < sizeof(special) / sizeof(special[0]); i++)
                if (!cove_addr_is_special(ip(special[i])))
                        fail_msg("%s not special", special[i]);
        assert_false(cove_addr_is_special(ip("203.0.113.2")));
        assert_false(cove_addr_is_special(ip("8.8.8.8")));
        assert_false(cove_addr_is_special(ip("172.32.0.1")));
}

/* A minimal TLS 1.2 ClientHello with an SNI extension. */
static size_t hello(uint8_t *out, const char *sni)
{
        uint8_t body[512];
        size_t n = 0;
        body[n++] = 3, body[n++] = 3;
        memset(body + n, 7, 32), n += 32;
        body[n++] = 0;                                                 /* session id */
        body[n++] = 0, body[n++] = 2, body[n++] = 0x13, body[n++] = 1; /* suites */
        body[n++] = 1, body[n++] = 0;                                  /* compression */
        size_t sl = strlen(sni);
        size_t ext = 4 + 2 + 3 + sl;
        body[n++] = (uint8_t)(ext >> 8), body[n++] = (uint8_t)ext;
        body[n++] = 0, body[n++] = 0;
        body[n++] = (uint8_t)((sl + 5) >> 8), body[n++] = (uint8_t)(sl + 5);
        body[n++] = (uint8_t)((sl + 3) >> 8), body[n++] = (uint8_t)(sl + 3);
        body[n++] = 0, body[n++] = (uint8_t)(sl >> 8), body[n++] = (uint8_t)sl;
        memcpy(body + n, sni, sl), n += sl;
        size_t hl = n;
        out[0] = 0x16, out[1] = 3, out[2] = 1;
        out[3] = (uint8_t)((hl + 4) >> 8), out[4] = (uint8_t)(hl + 4);
        out[5] = 1, out[6] = 0, out[7] = (uint8_t)(hl >> 8), out[8] = (uint8_t)hl;
        memcpy(out + 9, body, hl);
        return hl + 9;
}

static void test_sniff(void **st)
{
        uint8_t b[600];
        char name[256];
        size_t n = hello(b, "Allowed.Test");
        assert_int_equal(cove_sniff_proto(b, n), COVE_PROTO_TLS);
        assert_int_equal(cove_sniff_tls_sni(b, n, name, sizeof(name)), 1);
        assert_string_equal(name, "allowed.test");
        assert_int_equal(cove_sniff_tls_sni(b, n - 3, name, sizeof(name)), 0); /* partial */
        b[9 + 2 + 32 + 1] = 0xff; /* cipher suites length past the end */
        assert_int_equal(cove_sniff_tls_sni(b, n, name, sizeof(name)), -1);
        uint16_t port;
        const char *req = "GET / HTTP/1.1\r\nUser-Agent: x\r\nhost:  A.test:8080 \r\n\r\n";
        assert_int_equal(cove_sniff_proto((const uint8_t *)req, 3), COVE_PROTO_HTTP);
        assert_int_equal(
            cove_sniff_http_host((const uint8_t *)req, strlen(req), name, sizeof(name), &port), 1);
        assert_string_equal(name, "a.test");
        assert_int_equal(port, 8080);
        assert_int_equal(cove_sniff_http_host((const uint8_t *)req, 20, name, sizeof(name), &port),
                         0);
        const char *two = "GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n";
        assert_int_equal(
            cove_sniff_http_host((const uint8_t *)two, strlen(two), name, sizeof(name), &port), -1);
        const char *abs = "GET http://b.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n";
        assert_int_equal(
            cove_sniff_http_host((const uint8_t *)abs, strlen(abs), name, sizeof(name), &port), -1);
}

static void test_dns_messages(void **st)
{
        uint8_t q[512];
        long ql = cove_dns_build_query(0x1234, "allowed.test", q, sizeof(q));
        assert_true(ql > 0);
        struct cove_dns_query dq;
        assert_int_equal(cove_dns_parse_query(q, (size_t)ql, &dq), 0);
        assert_string_equal(dq.name, "allowed.test");
        assert_int_equal(dq.qtype, COVE_DNS_TYPE_A);
        uint32_t a[2] = {htonl(0xcb007102), htonl(0xcb007103)};
        uint8_t ans[512];
        long al = cove_dns_build_answer(&dq, 0, a, 2, 60, ans, sizeof(ans));
        assert_true(al > 0);
        int rcode, n;
        uint32_t got[COVE_DNS_MAX_ADDRS], ttl;
        assert_int_equal(
            cove_dns_parse_answer(ans, (size_t)al, 0x1234, "allowed.test", &rcode, got, &n, &ttl),
            0);
        assert_int_equal(rcode, 0);
        assert_int_equal(n, 2);
        assert_int_equal(ttl, 60);
        assert_int_equal(got[1], a[1]);
        /* an answer's A records for another name are ignored */
        assert_int_equal(
            cove_dns_parse_answer(ans, (size_t)al, 0x1234, "other.test", &rcode, got, &n, &ttl), 0);
        assert_int_equal(n, 0);
        /* a compression pointer loop is refused */
        uint8_t loop[] = {0x12, 0x34, 0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1};
        assert_int_equal(
            cove_dns_parse_answer(loop, sizeof(loop), 0x1234, "x", &rcode, got, &n, &ttl), -1);
}

/* ---- audit chain ---- */

struct afx {
        char dir[64], path[128];
        struct cove_catalog *c;
};

static int a_setup(void **state)
{
        struct afx *f = calloc(1, sizeof(*f));
        strcpy(f->dir, "/tmp/cove-test-audit-XXXXXX");
        if (!mkdtemp(f->dir))
                return -1;
        snprintf(f->path, sizeof(f->path), "%s/catalog.db", f->dir);
        struct cove_err err;
        f->c = cove_catalog_sqlite.open(f->path, &err);
        *state = f;
        return f->c ? 0 : -1;
}

static int a_teardown(void **state)
{
        struct afx *f = *state;
        if (f->c)
                cove_catalog_sqlite.close(f->c);
        cove_rm_rf(f->dir, NULL);
        free(f);
        return 0;
}

static void raw_sql(const char *path, const char *sql)
{
        sqlite3 *db;
        assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
        char *msg = NULL;
        if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK)
                fail_msg("%s: %s", sql, msg);
        sqlite3_close(db);
}

static void verify(struct afx *f, int64_t want_bad, int64_t *checked)
{
        int64_t bad = -1;
        char why[256];
        struct cove_err err;
        assert_int_equal(
            cove_audit_verify(&cove_catalog_sqlite, f->c, checked, &bad, why, sizeof(why), &err),
            0);
        if (bad != want_bad)
                fail_msg("first broken link %lld, want %lld (%s)", (long long)bad,
                         (long long)want_bad, why);
}

static void test_audit_chain_tamper(void **state)
{
        struct afx *f = *state;
        struct cove_err err;
        struct cove_audit *a = cove_audit_open(&cove_catalog_sqlite, f->c, NULL, &err);
        assert_non_null(a);
        for (int i = 0; i < 20; i++)
                cove_audit_log(a, "default", "sbx_x", "egress", "connect", i % 2 ? "allow" : "deny",
                               json_pack("{s:s, s:i}", "dst", "203.0.113.2", "port", 443 + i));
        cove_audit_close(a);
        /* reopening continues the chain */
        a = cove_audit_open(&cove_catalog_sqlite, f->c, NULL, &err);
        cove_audit_log(a, "default", NULL, "control", "create", "", NULL);
        cove_audit_close(a);
        int64_t checked;
        verify(f, 0, &checked);
        assert_int_equal(checked, 21);
        /* the catalog itself refuses updates and deletes */
        cove_catalog_sqlite.close(f->c);
        f->c = NULL;
        sqlite3 *db;
        sqlite3_open(f->path, &db);
        assert_int_not_equal(
            sqlite3_exec(db, "UPDATE audit_events SET verdict='allow' WHERE seq=6", 0, 0, 0),
            SQLITE_OK);
        assert_int_not_equal(sqlite3_exec(db, "DELETE FROM audit_events WHERE seq=6", 0, 0, 0),
                             SQLITE_OK);
        sqlite3_close(db);
        /* someone with the file drops the triggers and flips one verdict */
        raw_sql(f->path, "DROP TRIGGER audit_events_no_update;"
                         "UPDATE audit_events SET verdict='allow' WHERE seq=7");
        f->c = cove_catalog_sqlite.open(f->path, &err);
        verify(f, 7, &checked);
        assert_int_equal(checked, 6);
        /* restore it: intact again; then a removed event is found too */
        raw_sql(f->path, "UPDATE audit_events SET verdict='deny' WHERE seq=7");
        verify(f, 0, &checked);
        raw_sql(f->path,
                "DROP TRIGGER audit_events_no_delete; DELETE FROM audit_events WHERE seq=12");
        verify(f, 13, &checked);
        /* a re-hashed forgery still breaks the next link */
        raw_sql(f->path,
                "UPDATE audit_events SET hash='"
                "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa' WHERE seq=3");
        verify(f, 3, &checked);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_patterns_valid_and_invalid),
            cmocka_unit_test(test_matching_deny_before_allow),
            cmocka_unit_test(test_special_ranges),
            cmocka_unit_test(test_sniff),
            cmocka_unit_test(test_dns_messages),
            cmocka_unit_test_setup_teardown(test_audit_chain_tamper, a_setup, a_teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
