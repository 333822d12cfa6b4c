/* Unit tests for rolling-snapshot retention (control/retention.c): the policy parser and the
 * thinning decision, driven with an injected clock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "control/retention.h"

#define MIN 60000LL
#define HOUR (60 * MIN)
#define DAY (24 * HOUR)

static size_t kept(const int *keep, size_t n)
{
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
                k += keep[i] != 0;
        return k;
}

/* One snapshot a minute for 8 days, thinned at the end with the default policy. */
static void default_policy_counts(void **state)
{
        (void)state;
        struct cove_retention p;
        cove_retention_default(&p);
        const int64_t t0 = 1700000000000LL - (1700000000000LL % HOUR); /* hour-aligned */
        size_t n = 8 * 24 * 60;
        int64_t *t = calloc(n, sizeof(*t));
        int *keep = calloc(n, sizeof(*keep));
        for (size_t i = 0; i < n; i++)
                t[i] = t0 + (int64_t)i * MIN;
        int64_t now = t[n - 1] + 1; /* just after the newest */
        cove_retention_thin(&p, now, t, n, keep);
        size_t last_hour = 0, day = 0, week = 0, older = 0;
        for (size_t i = 0; i < n; i++) {
                int64_t age = now - t[i];
                if (!keep[i])
                        continue;
                if (age < HOUR)
                        last_hour++;
                else if (age < DAY)
                        day++;
                else if (age < 7 * DAY)
                        week++;
                else
                        older++;
        }
        assert_int_equal(last_hour, 60);         /* every one of the last hour */
        assert_true(day >= 138 && day <= 139);   /* one per 10 min for 23 h */
        assert_true(week >= 144 && week <= 145); /* one per hour for 6 days */
        assert_int_equal(older, 0);
        free(t);
        free(keep);
}

/* Thinning repeatedly as the clock advances (as the background thinner does) keeps what one
 * pass at the end would keep, except where a bucket's keeper aged out of the last tier
 * before its younger members: those were deleted earlier, which only ever removes. */
static void stable_as_clock_advances(void **state)
{
        (void)state;
        struct cove_retention p;
        assert_int_equal(cove_retention_parse("[{\"within_s\":60,\"every_s\":0},"
                                              "{\"within_s\":600,\"every_s\":120}]",
                                              &p, NULL),
                         0);
        assert_int_equal(p.n, 2);
        size_t n = 0;
        int64_t t[512];
        int alive[512];
        const int64_t t0 = 1000LL * 1000000;
        for (int64_t now = t0; now < t0 + 900 * 1000; now += 2000) {
                /* a snapshot every 2 s, thinned every 2 s */
                t[n] = now;
                alive[n] = 1;
                n++;
                int64_t tt[512];
                size_t idx[512], m = 0;
                for (size_t i = 0; i < n; i++)
                        if (alive[i]) {
                                idx[m] = i;
                                tt[m++] = t[i];
                        }
                int keep[512];
                cove_retention_thin(&p, now, tt, m, keep);
                for (size_t k = 0; k < m; k++)
                        if (!keep[k])
                                alive[idx[k]] = 0;
        }
        int64_t now = t0 + 900 * 1000 - 2000;
        int one[512];
        cove_retention_thin(&p, now, t, n, one);
        size_t recent = 0, buckets = 0;
        for (size_t i = 0; i < n; i++) {
                if (alive[i])
                        assert_true(one[i]);
                if (alive[i] && now - t[i] < 60000)
                        recent++;
                else if (alive[i])
                        buckets++;
        }
        assert_int_equal(recent, 30);              /* every 2 s for the last minute */
        assert_true(buckets >= 4 && buckets <= 5); /* one per 2 min for minutes 1..10 */
}

static void future_and_unsorted(void **state)
{
        (void)state;
        struct cove_retention p;
        cove_retention_default(&p);
        int64_t now = 100 * DAY;
        int64_t t[] = {now - 8 * DAY, now + 5000, now - 10 * MIN, now - 30 * HOUR};
        int keep[4];
        cove_retention_thin(&p, now, t, 4, keep);
        assert_int_equal(keep[0], 0); /* past the last tier */
        assert_int_equal(keep[1], 1); /* clock skew: kept */
        assert_int_equal(keep[2], 1);
        assert_int_equal(keep[3], 1); /* alone in its hour */
        assert_int_equal(kept(keep, 4), 3);
}

static void parse_rejects(void **state)
{
        (void)state;
        struct cove_retention p;
        struct cove_err err;
        const char *bad[] = {
            "{}",
            "[]",
            "[{\"within_s\":0}]",
            "[{\"within_s\":60,\"every_s\":120}]",
            "[{\"within_s\":600},{\"within_s\":60}]",
            "[{\"within_s\":60,\"every\":1}]",
            "[1,2]",
            "nope",
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                assert_int_equal(cove_retention_parse(bad[i], &p, &err), -1);
                assert_int_equal(err.kind, COVE_E_BAD_REQUEST);
        }
        assert_int_equal(cove_retention_parse(NULL, &p, &err), 0);
        assert_int_equal(p.n, 3);
        assert_int_equal(cove_retention_parse("null", &p, &err), 0);
        assert_int_equal(p.n, 3);
        char *s = cove_retention_dump(&p);
        assert_string_equal(s, "[{\"within_s\":3600,\"every_s\":0},{\"within_s\":86400,"
                               "\"every_s\":600},{\"within_s\":604800,\"every_s\":3600}]");
        free(s);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(default_policy_counts),
            cmocka_unit_test(stable_as_clock_advances),
            cmocka_unit_test(future_and_unsorted),
            cmocka_unit_test(parse_rejects),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
