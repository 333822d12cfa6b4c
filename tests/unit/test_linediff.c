/* util/linediff.c: unified diffs that apply back (random texts, also past the edit bound
 * where the middle is shown as removed then added), exact output for known cases, no
 * newline at the end, the output bound. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "util/linediff.h"

static char *diff_of(const char *a, const char *b, size_t max)
{
        char *out = NULL;
        size_t n = 0;
        struct cove_err err = {0};
        assert_int_equal(
            cove_linediff(a, strlen(a), b, strlen(b), "a/f", "b/f", 3, max, &out, &n, &err), 0);
        assert_int_equal(strlen(out), n);
        return out;
}

/* Apply a unified diff to a; returns the result (caller frees). Fails the test on a hunk
 * that does not match a. */
static char *apply(const char *a, const char *d)
{
        size_t cap = strlen(a) + strlen(d) + 1, n = 0;
        char *out = malloc(cap);
        const char *ap = a;
        long aline = 1;
        const char *p = d;
        assert_non_null(out);
        p = strchr(p, '\n') + 1; /* --- */
        p = strchr(p, '\n') + 1; /* +++ */
        while (*p) {
                long as, al, bs, bl;
                assert_true(!strncmp(p, "@@ -", 4));
                const char *q = p + 4;
                as = strtol(q, (char **)&q, 10);
                al = *q == ',' ? strtol(q + 1, (char **)&q, 10) : 1;
                bs = strtol(q + 2, (char **)&q, 10);
                bl = *q == ',' ? strtol(q + 1, (char **)&q, 10) : 1;
                (void)bs;
                (void)bl;
                long first = al ? as : as + 1;
                while (aline < first) { /* copy untouched lines */
                        const char *e = strchr(ap, '\n');
                        size_t l = e ? (size_t)(e - ap + 1) : strlen(ap);
                        memcpy(out + n, ap, l);
                        n += l;
                        ap += l;
                        aline++;
                }
                p = strchr(p, '\n') + 1;
                while (*p && *p != '@') {
                        const char *e = strchr(p, '\n');
                        size_t l = (size_t)(e - p); /* without '\n' */
                        int nonl = !strncmp(e + 1, "\\ No newline", 12);
                        if (*p == ' ' || *p == '-') {
                                assert_memory_equal(ap, p + 1, l - 1);
                                ap += l - 1 + (nonl ? 0 : 1);
                                aline++;
                        }
                        if (*p == ' ' || *p == '+') {
                                memcpy(out + n, p + 1, l - 1);
                                n += l - 1;
                                if (!nonl)
                                        out[n++] = '\n';
                        }
                        p = e + 1;
                        if (nonl)
                                p = strchr(p, '\n') + 1;
                }
        }
        size_t rest = strlen(ap);
        memcpy(out + n, ap, rest);
        out[n + rest] = 0;
        return out;
}

static char *random_text(unsigned *seed, int lines, int alphabet)
{
        char *s = malloc((size_t)lines * 4 + 2);
        size_t n = 0;
        for (int i = 0; i < lines; i++) {
                s[n++] = (char)('a' + rand_r(seed) % alphabet);
                if (rand_r(seed) % 3 == 0)
                        s[n++] = (char)('a' + rand_r(seed) % alphabet);
                s[n++] = '\n';
        }
        if (lines && rand_r(seed) % 4 == 0)
                n--; /* no newline at the end */
        s[n] = 0;
        return s;
}

static void test_known(void **state)
{
        (void)state;
        char *d = diff_of("one\ntwo\nthree\n", "one\nTWO\nthree\n", 1 << 20);
        assert_string_equal(d, "--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n");
        free(d);
        d = diff_of("", "new\n", 1 << 20);
        assert_string_equal(d, "--- a/f\n+++ b/f\n@@ -0,0 +1 @@\n+new\n");
        free(d);
        d = diff_of("keep", "keep\n", 1 << 20);
        assert_string_equal(d, "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-keep\n\\ No newline at end of "
                               "file\n+keep\n");
        free(d);
        d = diff_of("same\n", "same\n", 1 << 20);
        assert_string_equal(d, "");
        free(d);
        /* two changes far apart: two hunks with 3 lines of context each */
        d = diff_of("1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\n12\n",
                    "X\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\nY\n", 1 << 20);
        assert_string_equal(d, "--- a/f\n+++ b/f\n@@ -1,4 +1,4 @@\n-1\n+X\n 2\n 3\n 4\n"
                               "@@ -9,4 +9,4 @@\n 9\n 10\n 11\n-12\n+Y\n");
        free(d);
}

static void test_random_diffs_apply(void **state)
{
        (void)state;
        unsigned seed = 12345;
        for (int round = 0; round < 400; round++) {
                char *a = random_text(&seed, rand_r(&seed) % 60, 2 + round % 5);
                char *b = random_text(&seed, rand_r(&seed) % 60, 2 + round % 5);
                char *d = diff_of(a, b, 1 << 20);
                if (strcmp(a, b)) {
                        char *r = apply(a, d);
                        assert_string_equal(r, b);
                        free(r);
                } else {
                        assert_string_equal(d, "");
                }
                free(a);
                free(b);
                free(d);
        }
}

static void test_past_the_edit_bound(void **state)
{
        (void)state;
        /* more than COVE_LINEDIFF_MAX_D differences: still a diff that applies */
        size_t n = 3 * COVE_LINEDIFF_MAX_D;
        char *a = malloc(n * 8 + 1), *b = malloc(n * 8 + 1);
        size_t la = 0, lb = 0;
        for (size_t i = 0; i < n; i++) {
                la += (size_t)sprintf(a + la, "a%zu\n", i);
                lb += (size_t)sprintf(b + lb, "b%zu\n", i);
        }
        char *d = diff_of(a, b, 64u << 20);
        char *r = apply(a, d);
        assert_string_equal(r, b);
        free(r);
        free(d);
        free(a);
        free(b);
}

static void test_output_bound(void **state)
{
        (void)state;
        char *out = (char *)1;
        size_t n = 7;
        struct cove_err err = {0};
        assert_int_equal(cove_linediff("a\n", 2, "b\n", 2, "a/f", "b/f", 3, 10, &out, &n, &err),
                         -1);
        assert_int_equal(err.kind, COVE_E_LIMIT);
        assert_null(out);
        assert_int_equal(n, 0);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_known),
            cmocka_unit_test(test_random_diffs_apply),
            cmocka_unit_test(test_past_the_edit_bound),
            cmocka_unit_test(test_output_bound),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
