/* Unit tests for request handling that needs no server: route matching, exec request
 * validation (api/routes_exec.c) and the replay buffer (node/replay.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "api/routes.h"
#include "node/replay.h"
#include "util/util.h"

static void route_matching(void **state)
{
        (void)state;
        char *p[COVE_HTTP_MAX_PARAMS];
        int n;
        assert_int_equal(cove_route_match("/v1/sandboxes/{id}/processes/{pid}/events",
                                          "/v1/sandboxes/sbx_a/processes/42/events", p, &n),
                         1);
        assert_int_equal(n, 2);
        assert_string_equal(p[0], "sbx_a");
        assert_string_equal(p[1], "42");
        free(p[0]);
        free(p[1]);
        assert_int_equal(cove_route_match("/v1/sandboxes/{id}", "/v1/sandboxes/x/", p, &n), 1);
        free(p[0]);
        /* an empty segment, an extra segment, a prefix: no match, nothing leaked */
        assert_int_equal(cove_route_match("/v1/sandboxes/{id}", "/v1/sandboxes/", p, &n), 0);
        assert_int_equal(cove_route_match("/v1/sandboxes/{id}", "/v1/sandboxes/a/b", p, &n), 0);
        assert_int_equal(cove_route_match("/v1/sandboxes/{id}/exec", "/v1/sandboxes/a", p, &n), 0);
        assert_int_equal(n, 0);
}

static json_t *build(const char *body, char *why)
{
        json_error_t je;
        json_t *b = json_loads(body, JSON_ALLOW_NUL, &je); /* the server refuses NUL earlier */
        assert_non_null(b);
        json_t *req = NULL, *cmd = NULL;
        int r =
            cove_exec_request_build(b, "{\"A\":\"sandbox\",\"B\":\"keep\"}", &req, &cmd, why, 256);
        json_decref(b);
        json_decref(cmd);
        return r == 0 ? req : NULL;
}

static void exec_validation(void **state)
{
        (void)state;
        char why[256];
        json_t *r = build("{\"cmd\":[\"ls\",\"-l\"],\"env\":{\"A\":\"call\"},\"pty\":{\"cols\":80,"
                          "\"rows\":24},\"timeout_s\":5,\"cwd\":\"/tmp\"}",
                          why);
        assert_non_null(r);
        assert_string_equal(json_string_value(json_object_get(r, "op")), "exec");
        /* the call's env wins over the sandbox's, the rest of the sandbox's stays */
        json_t *env = json_object_get(r, "env");
        assert_string_equal(json_string_value(json_object_get(env, "A")), "call");
        assert_string_equal(json_string_value(json_object_get(env, "B")), "keep");
        assert_int_equal(json_integer_value(json_object_get(json_object_get(r, "pty"), "cols")),
                         80);
        assert_true(json_is_false(json_object_get(r, "stdin")));
        json_decref(r);

        static const char *bad[] = {
            "{}",                                /* neither cmd nor shell */
            "{\"cmd\":[\"a\"],\"shell\":\"b\"}", /* both */
            "{\"cmd\":\"ls\"}",                  /* wrong type */
            "{\"cmd\":[]}",                      /* empty argv */
            "{\"cmd\":[\"\"]}",                  /* empty program */
            "{\"cmd\":[\"a\\u0000b\"]}",         /* NUL inside */
            "{\"cmd\":[1]}",
            "{\"shell\":\"\"}",
            "{\"shell\":\"x\",\"env\":{\"A\":1}}",
            "{\"shell\":\"x\",\"env\":{\"A=B\":\"1\"}}",
            "{\"shell\":\"x\",\"pty\":{\"cols\":0,\"rows\":24}}",
            "{\"shell\":\"x\",\"pty\":{\"cols\":80}}",
            "{\"shell\":\"x\",\"timeout_s\":-1}",
            "{\"shell\":\"x\",\"stdin\":\"yes\"}",
            "{\"shell\":\"x\",\"cwd\":\"\"}",
            "{\"shell\":\"x\",\"user\":7}",
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                why[0] = '\0';
                json_t *x = build(bad[i], why);
                if (x)
                        fail_msg("accepted: %s", bad[i]);
                assert_true(strlen(why) > 10);
        }
}

static void replay_exactly_once_and_overflow(void **state)
{
        (void)state;
        struct cove_replay rb;
        cove_replay_init(&rb, 100, 1000);
        char data[10];
        for (int i = 0; i < 5; i++) {
                memset(data, 'a' + i, sizeof(data));
                assert_int_equal(cove_replay_append(&rb, COVE_EV_STDOUT, data, sizeof(data)),
                                 (uint64_t)i + 1);
        }
        const struct cove_ev *ev;
        uint64_t lost = 0;
        /* every event after 2, once, in order */
        uint64_t after = 2;
        int n = 0;
        while (cove_replay_next(&rb, after, &ev, &lost) == 1) {
                assert_int_equal(ev->seq, after + 1);
                assert_int_equal(ev->data[0], 'a' + (int)ev->seq - 1);
                after = ev->seq;
                n++;
        }
        assert_int_equal(n, 3);
        assert_int_equal(cove_replay_next(&rb, after, &ev, &lost), 0);
        /* 20 more events of 10 bytes: the bound (100 bytes) drops the oldest */
        for (int i = 0; i < 20; i++)
                cove_replay_append(&rb, COVE_EV_STDOUT, data, sizeof(data));
        assert_true(rb.bytes <= 100);
        assert_int_equal(cove_replay_next(&rb, 0, &ev, &lost), 2);
        assert_int_equal(lost, rb.first_seq - 1);
        assert_int_equal(cove_replay_next(&rb, lost, &ev, &lost), 1);
        assert_int_equal(ev->seq, rb.first_seq);
        assert_int_equal(rb.dropped_bytes + rb.bytes, 25 * 10);
        cove_replay_free(&rb);
}

static int encodes;

static char *encode_count(const struct cove_ev *ev, const void *arg, size_t *len)
{
        encodes++;
        char *l = NULL;
        int n = asprintf(&l, "%s%llu\n", (const char *)arg, (unsigned long long)ev->seq);
        if (n < 0)
                return NULL;
        *len = (size_t)n;
        return l;
}

/* An event's line is encoded on its first read only, and freed with the event (ASan's leak
 * check fails a line kept past its event's drop or the buffer's free). */
static void replay_line_encoded_once(void **state)
{
        (void)state;
        struct cove_replay rb;
        cove_replay_init(&rb, 30, 1000);
        for (int i = 0; i < 3; i++)
                cove_replay_append(&rb, COVE_EV_STDOUT, "0123456789", 10);
        const struct cove_ev *ev;
        uint64_t lost;
        encodes = 0;
        for (int round = 0; round < 4; round++)
                for (uint64_t after = 0; cove_replay_next(&rb, after, &ev, &lost) == 1;
                     after = ev->seq) {
                        size_t len = 0;
                        const char *l =
                            cove_replay_line((struct cove_ev *)ev, encode_count, "seq ", &len);
                        char want[32];
                        snprintf(want, sizeof(want), "seq %llu\n", (unsigned long long)ev->seq);
                        assert_non_null(l);
                        assert_int_equal(len, strlen(want));
                        assert_memory_equal(l, want, len);
                }
        assert_int_equal(encodes, 3);
        /* drops free the cached lines of the dropped events */
        for (int i = 0; i < 3; i++)
                cove_replay_append(&rb, COVE_EV_STDOUT, "0123456789", 10);
        assert_int_equal(cove_replay_next(&rb, 0, &ev, &lost), 2);
        assert_int_equal(lost, 3);
        assert_int_equal(cove_replay_next(&rb, 3, &ev, &lost), 1);
        assert_null(ev->line);
        cove_replay_free(&rb);
}

static void rfc3339_parse(void **state)
{
        (void)state;
        assert_int_equal(cove_rfc3339_parse("1970-01-01T00:00:00Z"), 0);
        assert_int_equal(cove_rfc3339_parse("2026-12-01T10:00:00.5Z"), 1796119200500LL);
        assert_int_equal(cove_rfc3339_parse("2026-12-01T11:00:00.123456+01:00"), 1796119200123LL);
        assert_int_equal(cove_rfc3339_parse("2026-12-01T09:30:00-00:30"), 1796119200000LL);
        char out[40];
        cove_rfc3339(1796119200123LL, out, sizeof(out));
        assert_int_equal(cove_rfc3339_parse(out), 1796119200123LL);
        static const char *const bad[] = {"",
                                          "2026-12-01",
                                          "2026-12-01T10:00:00",
                                          "2026-13-01T10:00:00Z",
                                          "2026-12-01T10:00:00.Z",
                                          "2026-12-01T10:00:00Zx",
                                          "2026-12-01T10:00:00+1:00",
                                          "2026-12-01 10:00:00Z",
                                          "x026-12-01T10:00:00Z",
                                          "+2026-12-01T10:00:00Z",
                                          "2026-12-01T24:00:00Z"};
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
                assert_int_equal(cove_rfc3339_parse(bad[i]), -1);
        assert_int_equal(cove_rfc3339_parse(NULL), -1);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(route_matching),
            cmocka_unit_test(rfc3339_parse),
            cmocka_unit_test(exec_validation),
            cmocka_unit_test(replay_exactly_once_and_overflow),
            cmocka_unit_test(replay_line_encoded_once),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
