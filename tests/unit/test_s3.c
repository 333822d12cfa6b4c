/* Unit tests for the S3 backend's defences against a hostile or broken store: the XML answer
 * parser (store/s3xml.h), and the backend against a tiny scripted HTTP server in a thread of
 * this test. That server is a TEST DOUBLE at the network boundary: a real radosgw never
 * sends these answers (tests/integration/test_s3_store.py runs the real one), so the
 * malformed XML, lying lengths, slow drips, 5xx bursts and silence are produced here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "store/chunkstore.h"
#include "store/s3xml.h"
#include "util/util.h"

#define SECRET "hostile-test-secret-never-shown-0000000001"

/* ---- XML ---- */

struct seen {
        char last_path[256];
        char last_text[256];
        int n;
};

static int seen_cb(const char *path, const char *text, size_t len, void *arg, struct cove_err *err)
{
        (void)err;
        struct seen *s = arg;
        snprintf(s->last_path, sizeof(s->last_path), "%s", path);
        snprintf(s->last_text, sizeof(s->last_text), "%.*s", (int)len, text);
        s->n++;
        return 0;
}

static int walk(const char *x, struct seen *s)
{
        memset(s, 0, sizeof(*s));
        return cove_xml_walk(x, strlen(x), seen_cb, s, NULL);
}

static int entry_count(const char *key, uint64_t size, int64_t mtime, void *arg,
                       struct cove_err *err)
{
        (void)key;
        (void)size;
        (void)mtime;
        (void)err;
        (*(int *)arg)++;
        return 0;
}

static void xml(void **state)
{
        (void)state;
        struct seen s;
        assert_int_equal(
            walk("<?xml version=\"1.0\"?><a:R xmlns:a=\"u\"><a:K>x&amp;y&#x41;&#66;</a:K>"
                 "<!-- c --><E/><C><![CDATA[<raw>]]></C></a:R>",
                 &s),
            0);
        assert_int_equal(s.n, 4);
        assert_string_equal(s.last_path, "R");
        assert_int_equal(walk("<R><K>x&amp;y&#x41;&#66;</K></R>", &s), 0);
        assert_int_equal(s.n, 2);
        assert_int_equal(walk("<R><K>a&lt;b</K><Z>1</Z></R>", &s), 0);
        /* refusals */
        const char *bad[] = {
            "",                                              /* no root */
            "<R>",                                           /* unclosed */
            "<R></S>",                                       /* mismatched */
            "<R></R><R></R>",                                /* two roots */
            "<R></R>junk",                                   /* text after the root */
            "<!DOCTYPE R [<!ENTITY a \"aaaa\">]><R>&a;</R>", /* no DTD, no entities */
            "<R>&bogus;</R>",                                /* unknown entity */
            "<R>&#0;</R>",                                   /* NUL reference */
            "<R>&#x110000;</R>",                             /* beyond Unicode */
            "<R a=b></R>",                                   /* unquoted attribute */
            "<R a=\"b></R>",                                 /* unterminated attribute */
            "<R><!-- never closed </R>",
            "<R><![CDATA[ never closed </R>",
            "<R>&amp</R>", /* unterminated reference */
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
                struct cove_err err = {0};
                assert_int_equal(cove_xml_walk(bad[i], strlen(bad[i]), NULL, NULL, &err), -1);
                assert_non_null(strstr(err.msg, "malformed XML"));
        }
        /* depth and text bounds */
        char deep[512] = "", tmp[600];
        for (int i = 0; i < COVE_XML_MAX_DEPTH + 1; i++)
                strcat(deep, "<a>");
        assert_int_equal(cove_xml_walk(deep, strlen(deep), NULL, NULL, NULL), -1);
        char *big = malloc(COVE_XML_MAX_TEXT + 64);
        assert_non_null(big);
        if (!big)
                return;
        strcpy(big, "<R>");
        memset(big + 3, 'x', COVE_XML_MAX_TEXT + 1);
        strcpy(big + 3 + COVE_XML_MAX_TEXT + 1, "</R>");
        assert_int_equal(cove_xml_walk(big, strlen(big), NULL, NULL, NULL), -1);
        free(big);
        (void)tmp;
        /* a NUL inside the buffer is refused, not a silent end */
        assert_int_equal(cove_xml_walk("<R>a\0b</R>", 10, NULL, NULL, NULL), -1);

        /* ListObjectsV2 */
        const char *page =
            "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>b</Name>"
            "<IsTruncated>true</IsTruncated><NextContinuationToken>t/c/k "
            "2&amp;</NextContinuationToken>"
            "<Contents><Key>p/t/chunks/aa/x</Key><LastModified>2026-12-01T10:11:31.046Z</"
            "LastModified>"
            "<Size>12</Size></Contents><Contents><Key>p/t/chunks/aa/y</Key>"
            "<LastModified>2026-12-01T10:11:32Z</LastModified><Size>0</Size></Contents>"
            "</ListBucketResult>";
        struct cove_s3_list_page pg;
        int cnt = 0;
        assert_int_equal(cove_s3_parse_list(page, strlen(page), &pg, entry_count, &cnt, NULL), 0);
        assert_int_equal(cnt, 2);
        assert_int_equal(pg.truncated, 1);
        assert_string_equal(pg.next_token, "t/c/k 2&");
        const char *lbad[] = {
            "<Error><Code>x</Code></Error>",
            "<ListBucketResult><Contents><Key>k</Key><Size>1</Size></Contents></ListBucketResult>",
            "<ListBucketResult><Contents><Key>k</Key><Size>-1</Size><LastModified>2026-12-01T10:"
            "11:32Z</LastModified></Contents></ListBucketResult>",
            "<ListBucketResult><Contents><Key>k</Key><Size>1</Size><LastModified>yesterday"
            "</LastModified></Contents></ListBucketResult>",
            "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",
            "<ListBucketResult><IsTruncated>maybe</IsTruncated></ListBucketResult>",
            "<ListBucketResult><Contents><Key></Key><Size>1</Size><LastModified>2026-12-01T10:11:"
            "32Z</LastModified></Contents></ListBucketResult>",
        };
        for (size_t i = 0; i < sizeof(lbad) / sizeof(*lbad); i++)
                assert_int_equal(
                    cove_s3_parse_list(lbad[i], strlen(lbad[i]), &pg, NULL, NULL, NULL), -1);
        char code[64];
        const char *e = "<Error><Code>NoSuchKey</Code><Message>m</Message></Error>";
        assert_int_equal(cove_s3_parse_error(e, strlen(e), code, NULL), 1);
        assert_string_equal(code, "NoSuchKey");
        e = "<Error><Code>Bad\x01Code</Code></Error>"; /* control bytes never reach a message */
        assert_int_equal(cove_s3_parse_error(e, strlen(e), code, NULL), 1);
        assert_string_equal(code, "?");
        e = "<CopyObjectResult><ETag>x</ETag></CopyObjectResult>";
        assert_int_equal(cove_s3_parse_error(e, strlen(e), code, NULL), 0);
        assert_int_equal(cove_s3_parse_iso8601("1970-01-01T00:00:01.5Z"), 1500);
        assert_int_equal(cove_s3_parse_iso8601("1970-01-01T00:00:01+01:00"), -1);
        assert_int_equal(cove_s3_parse_http_date("Thu, 01 Jan 1970 00:00:02 GMT"), 2000);
        assert_int_equal(cove_s3_parse_http_date("Thu, 01 Foo 1970 00:00:02 GMT"), -1);
}

/* ---- the scripted server ---- */

enum mode {
        M_OK_OBJECT,    /* 200 with the object "hello" */
        M_FAIL_THEN_OK, /* 500 for the first fails requests, then as M_OK_OBJECT */
        M_HUGE_LENGTH,  /* 200, Content-Length: 10^12, then a little body */
        M_NO_LENGTH,    /* 200, no Content-Length, an endless body until close */
        M_SHORT_BODY,   /* 200, Content-Length 100, 5 bytes, close */
        M_DRIP,         /* 200, Content-Length 1000, one byte every 100 ms */
        M_SILENT,       /* read the request, never answer */
        M_FORBIDDEN,    /* 403 with an Error body */
        M_BAD_XML,      /* 200 with malformed XML (listing) */
        M_LIST_LOOP,    /* a truncated listing page that never advances */
        M_LIST_ESCAPE,  /* a listing with keys outside the prefix */
        M_LIST_NAMES,   /* a listing with names that are not valid, and one that is */
        M_COPY_ERROR,   /* 200 to a copy, with an <Error> body */
        M_BIG_ERROR,    /* 404 with a 100 MB body */
        M_NAIVE,        /* a store that ignores x-amz-delete-if-unmodified-since */
};

struct srv {
        int lfd, port;
        pthread_t th;
        volatile int mode, fails, quit;
        volatile int requests;
        char last_req[2048];
        pthread_mutex_t mu;
};

static void send_all(int fd, const char *s, size_t n)
{
        while (n) {
                ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
                if (w <= 0)
                        return;
                s += w;
                n -= (size_t)w;
        }
}

static void sends(int fd, const char *s)
{
        send_all(fd, s, strlen(s));
}

static void answer_xml(int fd, const char *status, const char *xml_body)
{
        char h[256];
        snprintf(h, sizeof(h),
                 "HTTP/1.1 %s\r\nContent-Type: application/xml\r\nContent-Length: "
                 "%zu\r\nConnection: close\r\n\r\n",
                 status, strlen(xml_body));
        sends(fd, h);
        sends(fd, xml_body);
}

static void *serve(void *arg)
{
        struct srv *s = arg;
        while (!s->quit) {
                struct pollfd p = {s->lfd, POLLIN, 0};
                if (poll(&p, 1, 100) <= 0)
                        continue;
                int fd = accept(s->lfd, NULL, NULL);
                if (fd < 0)
                        continue;
                char req[2048];
                size_t got = 0;
                req[0] = '\0';
                while (got < sizeof(req) - 1 && !strstr(req, "\r\n\r\n")) {
                        struct pollfd q = {fd, POLLIN, 0};
                        if (poll(&q, 1, 2000) <= 0)
                                break;
                        ssize_t r = recv(fd, req + got, sizeof(req) - 1 - got, 0);
                        if (r <= 0)
                                break;
                        got += (size_t)r;
                        req[got] = '\0';
                }
                req[got] = '\0';
                if (got == 0) { /* a connection closed unused (or a probe): not a request */
                        close(fd);
                        continue;
                }
                pthread_mutex_lock(&s->mu);
                snprintf(s->last_req, sizeof(s->last_req), "%s", req);
                int n = ++s->requests;
                pthread_mutex_unlock(&s->mu);
                int head = !strncmp(req, "HEAD ", 5);
                switch (s->mode) {
                case M_FAIL_THEN_OK:
                        if (n <= s->fails) {
                                answer_xml(fd, "500 Internal Server Error",
                                           "<Error><Code>InternalError</Code></Error>");
                                break;
                        }
                        /* fall through */
                case M_OK_OBJECT:
                        sends(fd, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nETag: \"x\"\r\n"
                                  "Last-Modified: Thu, 01 Jan 1970 00:00:02 GMT\r\n"
                                  "Connection: close\r\n\r\n");
                        if (!head)
                                sends(fd, "hello");
                        break;
                case M_HUGE_LENGTH:
                        sends(fd, "HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n"
                                  "Connection: close\r\n\r\nxxxxxxxxxxxxxxxx");
                        break;
                case M_NO_LENGTH: {
                        sends(fd, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");
                        static char junk[65536];
                        memset(junk, 'j', sizeof(junk));
                        for (int i = 0; i < 64 && !s->quit; i++)
                                send_all(fd, junk, sizeof(junk));
                        break;
                }
                case M_SHORT_BODY:
                        sends(fd, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n"
                                  "Connection: close\r\n\r\nhello");
                        break;
                case M_DRIP:
                        sends(fd, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n"
                                  "Connection: close\r\n\r\n");
                        for (int i = 0; i < 1000 && !s->quit; i++) {
                                if (send(fd, "d", 1, MSG_NOSIGNAL) != 1)
                                        break;
                                usleep(100000);
                        }
                        break;
                case M_SILENT:
                        for (int i = 0; i < 600 && !s->quit; i++) {
                                struct pollfd q = {fd, POLLIN, 0};
                                char b[256];
                                if (poll(&q, 1, 100) > 0 && recv(fd, b, sizeof(b), 0) <= 0)
                                        break; /* the client gave up */
                        }
                        break;
                case M_FORBIDDEN:
                        answer_xml(fd, "403 Forbidden",
                                   "<Error><Code>SignatureDoesNotMatch</Code></Error>");
                        break;
                case M_BAD_XML:
                        answer_xml(fd, "200 OK", "<ListBucketResult><Contents><Key>p/t/a");
                        break;
                case M_LIST_LOOP:
                        answer_xml(fd, "200 OK",
                                   "<ListBucketResult><IsTruncated>true</IsTruncated>"
                                   "<NextContinuationToken>same</NextContinuationToken>"
                                   "</ListBucketResult>");
                        break;
                case M_LIST_ESCAPE:
                        answer_xml(fd, "200 OK",
                                   "<ListBucketResult><Contents><Key>other/t/chunks/x</Key>"
                                   "<Size>1</Size><LastModified>2026-12-01T10:11:32Z</LastModified>"
                                   "</Contents></ListBucketResult>");
                        break;
                case M_LIST_NAMES:
                        answer_xml(fd, "200 OK",
                                   "<ListBucketResult>"
                                   "<Contents><Key>pre/t/chunks/../../x</Key><Size>1</Size>"
                                   "<LastModified>2026-12-01T10:11:32Z</LastModified></Contents>"
                                   "<Contents><Key>pre/t/chunks/aa/.hidden</Key><Size>1</Size>"
                                   "<LastModified>2026-12-01T10:11:32Z</LastModified></Contents>"
                                   "<Contents><Key>pre/t/chunks/aa/ok</Key><Size>3</Size>"
                                   "<LastModified>2026-12-01T10:11:32Z</LastModified></Contents>"
                                   "</ListBucketResult>");
                        break;
                case M_COPY_ERROR:
                        answer_xml(fd, "200 OK", "<Error><Code>InternalError</Code></Error>");
                        break;
                case M_NAIVE:
                        if (!strncmp(req, "PUT ", 4))
                                sends(fd, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n"
                                          "Connection: close\r\n\r\n");
                        else if (!strncmp(req, "DELETE ", 7))
                                sends(fd, "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n");
                        else if (head && strstr(req, ".cove-probe/"))
                                sends(fd, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n"
                                          "Connection: close\r\n\r\n");
                        else
                                sends(fd, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n"
                                          "Last-Modified: Thu, 01 Jan 1970 00:00:02 GMT\r\n"
                                          "Connection: close\r\n\r\n");
                        break;
                case M_BIG_ERROR: {
                        sends(fd, "HTTP/1.1 404 Not Found\r\nContent-Length: 100000000\r\n"
                                  "Connection: close\r\n\r\n");
                        static char junk[65536];
                        memset(junk, 'e', sizeof(junk));
                        for (int i = 0; i < 1600 && !s->quit; i++)
                                send_all(fd, junk, sizeof(junk));
                        break;
                }
                }
                close(fd);
        }
        return NULL;
}

static int srv_setup(void **state)
{
        struct srv *s = calloc(1, sizeof(*s));
        pthread_mutex_init(&s->mu, NULL);
        s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t al = sizeof(a);
        if (bind(s->lfd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(s->lfd, 64) < 0 ||
            getsockname(s->lfd, (struct sockaddr *)&a, &al) < 0)
                return -1;
        s->port = ntohs(a.sin_port);
        pthread_create(&s->th, NULL, serve, s);
        *state = s;
        return 0;
}

static int srv_teardown(void **state)
{
        struct srv *s = *state;
        s->quit = 1;
        pthread_join(s->th, NULL);
        close(s->lfd);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return 0;
}

static struct cove_chunkstore *open_at(struct srv *s, int timeout_ms, int budget_ms)
{
        char ep[64];
        snprintf(ep, sizeof(ep), "http://127.0.0.1:%d", s->port);
        struct cove_s3_opts o = {.url = "s3://hostile/pre",
                                 .endpoint = ep,
                                 .access_key = "AKHOSTILE",
                                 .secret_key = SECRET,
                                 .timeout_ms = timeout_ms,
                                 .connect_timeout_ms = timeout_ms,
                                 .retry_budget_ms = budget_ms,
                                 .no_bucket_check = 1};
        struct cove_err err = {0};
        struct cove_chunkstore *cs = cove_chunkstore_s3_open(&o, &err);
        assert_non_null(cs);
        return cs;
}

static void set_mode(struct srv *s, int mode, int fails)
{
        pthread_mutex_lock(&s->mu);
        s->mode = mode;
        s->fails = fails;
        s->requests = 0;
        pthread_mutex_unlock(&s->mu);
}

/* get "t/chunks/aa/obj" against mode: returns rc, fills err; checks the error shape */
static int get_in(struct srv *s, struct cove_chunkstore *cs, int mode, size_t max,
                  struct cove_err *err)
{
        set_mode(s, mode, 0);
        void *d = NULL;
        size_t n = 0;
        memset(err, 0, sizeof(*err));
        int rc = cs->ops->get(cs, "t/chunks/aa/obj", max, &d, &n, err);
        if (rc == 0)
                free(d);
        else {
                assert_non_null(strstr(err->msg, "t/chunks/aa/obj")); /* names the object */
                assert_null(strstr(err->msg, SECRET));
        }
        return rc;
}

static int64_t ms_since(int64_t t0)
{
        return (cove_mono_ns() - t0) / 1000000;
}

static void hostile_lengths(void **state)
{
        struct srv *s = *state;
        struct cove_chunkstore *cs = open_at(s, 2000, 4000);
        struct cove_err err;
        assert_int_equal(get_in(s, cs, M_OK_OBJECT, 100, &err), 0);
        /* the request is signed with the body's hash and never carries the secret */
        assert_non_null(strstr(s->last_req, "x-amz-content-sha256: e3b0c442"));
        assert_non_null(strstr(s->last_req, "AWS4-HMAC-SHA256 Credential=AKHOSTILE/"));
        assert_null(strstr(s->last_req, SECRET));
        /* a length above the caller's bound is refused from the header, at once */
        int64_t t0 = cove_mono_ns();
        assert_int_equal(get_in(s, cs, M_HUGE_LENGTH, 1 << 20, &err), -1);
        assert_int_equal(err.kind, COVE_E_LIMIT);
        assert_int_equal(s->requests, 1); /* not retried */
        print_message("huge Content-Length refused in %lld ms: %s\n", (long long)ms_since(t0),
                      err.msg);
        /* a body without a length, longer than asked: refused while it comes */
        assert_int_equal(get_in(s, cs, M_NO_LENGTH, 1 << 20, &err), -1);
        assert_int_equal(err.kind, COVE_E_LIMIT);
        /* a body shorter than its Content-Length: an error after the retries */
        assert_int_equal(get_in(s, cs, M_SHORT_BODY, 1 << 20, &err), -1);
        assert_int_equal(err.kind, COVE_E_UNAVAILABLE);
        print_message("short body: %s\n", err.msg);
        /* an error answer is bounded too (not by the object's bound) */
        assert_int_equal(get_in(s, cs, M_BIG_ERROR, 1u << 30, &err), -1);
        assert_int_equal(err.kind, COVE_E_LIMIT);
        cs->ops->close(cs);
}

static void hostile_time(void **state)
{
        struct srv *s = *state;
        struct cove_chunkstore *cs = open_at(s, 1000, 2500);
        struct cove_err err;
        /* 5xx then 200: retried, and the answer is used */
        set_mode(s, M_FAIL_THEN_OK, 2);
        void *d;
        size_t n;
        if (cs->ops->get(cs, "t/chunks/aa/obj", 100, &d, &n, &err) < 0)
                fail_msg("5xx then 200: %s (%d requests)", err.msg, s->requests);
        assert_int_equal(n, 5);
        assert_memory_equal(d, "hello", 5);
        free(d);
        assert_int_equal(s->requests, 3);
        /* 403 is not retried, and says what the store said */
        assert_int_equal(get_in(s, cs, M_FORBIDDEN, 100, &err), -1);
        assert_int_equal(s->requests, 1);
        assert_int_equal(err.kind, COVE_E_UNAUTHORIZED);
        assert_non_null(strstr(err.msg, "SignatureDoesNotMatch"));
        /* a slow drip and a server that never answers both end at the deadline */
        int64_t t0 = cove_mono_ns();
        assert_int_equal(get_in(s, cs, M_DRIP, 1 << 20, &err), -1);
        int64_t ms = ms_since(t0);
        print_message("drip: gave up after %lld ms: %s\n", (long long)ms, err.msg);
        assert_true(ms < 2500 + 3000); /* the budget, plus slack for a loaded machine */
        t0 = cove_mono_ns();
        assert_int_equal(get_in(s, cs, M_SILENT, 1 << 20, &err), -1);
        ms = ms_since(t0);
        print_message("silent: gave up after %lld ms: %s\n", (long long)ms, err.msg);
        assert_true(ms < 2500 + 3000);
        assert_true(s->requests >= 2); /* timeouts are retried within the budget */
        /* a copy that answers 200 with an Error is a failed touch */
        set_mode(s, M_COPY_ERROR, 0);
        assert_int_equal(cs->ops->touch(cs, "t/chunks/aa/obj", &err), -1);
        assert_null(strstr(err.msg, SECRET));
        cs->ops->close(cs);
}

/* GC on a store that deletes whatever the condition says would race writers: refused. */
static void hostile_naive_delete(void **state)
{
        struct srv *s = *state;
        struct cove_chunkstore *cs = open_at(s, 2000, 4000);
        struct cove_err err = {0};
        set_mode(s, M_NAIVE, 0);
        assert_int_equal(cs->ops->del(cs, "t/chunks/aa/obj", cove_now_ms() - 1000, &err), -1);
        assert_int_equal(err.kind, COVE_E_UNAVAILABLE);
        assert_non_null(strstr(err.msg, "x-amz-delete-if-unmodified-since"));
        int n = s->requests;
        assert_int_equal(cs->ops->del(cs, "t/chunks/aa/obj", cove_now_ms() - 1000, &err), -1);
        assert_int_equal(s->requests, n); /* known now: not probed again, nothing deleted */
        /* an unconditional delete (a snapshot's manifest) needs no condition */
        assert_int_equal(cs->ops->del(cs, "t/chunks/aa/obj", INT64_MAX, &err), 1);
        cs->ops->close(cs);
}

static int list_cb(const char *name, uint64_t size, int64_t mtime, void *arg)
{
        (void)size;
        (void)mtime;
        snprintf(arg, 64, "%s", name);
        return 0;
}

static void hostile_listings(void **state)
{
        struct srv *s = *state;
        struct cove_chunkstore *cs = open_at(s, 2000, 4000);
        struct cove_err err = {0};
        char got[64] = "";
        set_mode(s, M_BAD_XML, 0);
        assert_int_equal(cs->ops->list(cs, "t/chunks/", list_cb, got, &err), -1);
        assert_non_null(strstr(err.msg, "malformed XML"));
        set_mode(s, M_LIST_LOOP, 0);
        assert_int_equal(cs->ops->list(cs, "t/chunks/", list_cb, got, &err), -1);
        assert_true(s->requests <= 2); /* noticed, not looped on */
        set_mode(s, M_LIST_ESCAPE, 0);
        assert_int_equal(cs->ops->list(cs, "t/chunks/", list_cb, got, &err), -1);
        assert_non_null(strstr(err.msg, "outside the requested prefix"));
        /* names that are not chunk-store names never reach the caller */
        set_mode(s, M_LIST_NAMES, 0);
        assert_int_equal(cs->ops->list(cs, "t/chunks/", list_cb, got, &err), 0);
        assert_string_equal(got, "t/chunks/aa/ok");
        /* the query is canonical: sorted names, '/' encoded */
        if (!strstr(s->last_req,
                    "GET /hostile/?list-type=2&max-keys=1000&prefix=pre%2Ft%2Fchunks%2F "))
                fail_msg("request: %.200s", s->last_req);
        cs->ops->close(cs);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(xml),
            cmocka_unit_test_setup_teardown(hostile_lengths, srv_setup, srv_teardown),
            cmocka_unit_test_setup_teardown(hostile_time, srv_setup, srv_teardown),
            cmocka_unit_test_setup_teardown(hostile_listings, srv_setup, srv_teardown),
            cmocka_unit_test_setup_teardown(hostile_naive_delete, srv_setup, srv_teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
