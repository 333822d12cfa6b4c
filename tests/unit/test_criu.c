/* Unit tests for runtime/criu.c: detection switches and the user namespace map rewrite. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/criu.h"
#include "util/util.h"

static size_t varint(uint8_t *b, uint64_t v)
{
        size_t n = 0;
        do {
                b[n] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
                v >>= 7;
                n++;
        } while (v);
        return n;
}

/* a userns-N.img as CRIU writes it: 8 magic bytes, u32 size, UsernsEntry */
static size_t userns_img(uint8_t *out, uint32_t base)
{
        static const uint8_t magic[8] = {0x19, 0x43, 0x56, 0x54, 0x06, 0x49, 0x47, 0x55};
        uint8_t ext[32], pb[96];
        size_t e = 0;
        ext[e++] = 0x08;
        e += varint(ext + e, 0);
        ext[e++] = 0x10;
        e += varint(ext + e, base);
        ext[e++] = 0x18;
        e += varint(ext + e, 65536);
        size_t p = 0;
        for (int field = 1; field <= 2; field++) {
                pb[p++] = (uint8_t)(field << 3 | 2);
                pb[p++] = (uint8_t)e;
                memcpy(pb + p, ext, e);
                p += e;
        }
        memcpy(out, magic, 8);
        out[8] = (uint8_t)p;
        out[9] = out[10] = out[11] = 0;
        memcpy(out + 12, pb, p);
        return 12 + p;
}

static char *tmpdir(void)
{
        char *d = strdup("/tmp/cove-criu-test-XXXXXX");
        assert_non_null(mkdtemp(d));
        return d;
}

static void write_img(const char *dir, const uint8_t *b, size_t n)
{
        char p[256];
        snprintf(p, sizeof(p), "%s/userns-14.img", dir);
        int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, b, n), (ssize_t)n);
        close(fd);
}

static size_t read_img(const char *dir, uint8_t *b, size_t cap)
{
        char p[256];
        snprintf(p, sizeof(p), "%s/userns-14.img", dir);
        int fd = open(p, O_RDONLY);
        assert_true(fd >= 0);
        ssize_t n = read(fd, b, cap);
        close(fd);
        assert_true(n > 0);
        return (size_t)n;
}

static void rebase_rewrites_both_maps(void **state)
{
        (void)state;
        char *d = tmpdir();
        uint8_t img[128], want[128], got[256];
        size_t n = userns_img(img, 0x10000000u);
        write_img(d, img, n);
        struct cove_err err;
        assert_int_equal(cove_criu_userns_rebase(d, 0x10000000u, 0x12340000u, &err), 0);
        size_t wn = userns_img(want, 0x12340000u);
        size_t gn = read_img(d, got, sizeof(got));
        assert_int_equal(gn, wn);
        assert_memory_equal(got, want, wn);
        /* same base: nothing to do; back again: the original bytes */
        assert_int_equal(cove_criu_userns_rebase(d, 0x12340000u, 0x12340000u, &err), 0);
        assert_int_equal(cove_criu_userns_rebase(d, 0x12340000u, 0x10000000u, &err), 0);
        gn = read_img(d, got, sizeof(got));
        assert_int_equal(gn, n);
        assert_memory_equal(got, img, n);
        cove_rm_rf(d, &err);
        free(d);
}

static void rebase_rejects_malformed(void **state)
{
        (void)state;
        char *d = tmpdir();
        struct cove_err err;
        /* no image at all */
        assert_int_equal(cove_criu_userns_rebase(d, 1u << 28, 2u << 28, &err), -1);
        uint8_t img[128];
        size_t n = userns_img(img, 0x10000000u);
        /* size field that does not match the file */
        img[8] = (uint8_t)(img[8] + 5);
        write_img(d, img, n);
        assert_int_equal(cove_criu_userns_rebase(d, 0x10000000u, 0x20000000u, &err), -1);
        /* a truncated varint inside an extent */
        n = userns_img(img, 0x10000000u);
        img[8] = (uint8_t)(img[8] - 2);
        write_img(d, img, n - 2);
        assert_int_equal(cove_criu_userns_rebase(d, 0x10000000u, 0x20000000u, &err), -1);
        /* an unexpected field */
        n = userns_img(img, 0x10000000u);
        img[12] = 0x1a;
        write_img(d, img, n);
        assert_int_equal(cove_criu_userns_rebase(d, 0x10000000u, 0x20000000u, &err), -1);
        assert_int_equal(err.kind, COVE_E_UNAVAILABLE);
        cove_rm_rf(d, &err);
        free(d);
}

static void detect_switches(void **state)
{
        (void)state;
        struct cove_criu c;
        setenv("COVE_CRIU", "off", 1);
        cove_criu_detect(&c);
        assert_false(c.found);
        assert_non_null(strstr(c.why, "COVE_CRIU=off"));
        setenv("COVE_CRIU", "/nonexistent/criu", 1);
        cove_criu_detect(&c);
        assert_false(c.found);
        assert_non_null(strstr(c.why, "not an executable"));
        setenv("COVE_CRIU", "/bin/true", 1); /* no "Version: 4…" line */
        cove_criu_detect(&c);
        assert_false(c.found);
        assert_non_null(strstr(c.why, "want >= 4"));
        unsetenv("COVE_CRIU");
        /* and running criu through a switched-off detection refuses cleanly */
        struct cove_err err;
        setenv("COVE_CRIU", "off", 1);
        cove_criu_detect(&c);
        assert_int_equal(cove_criu_dump(&c, 1, "/tmp", "/tmp", 1, &err), -1);
        assert_int_equal(err.kind, COVE_E_UNAVAILABLE);
        unsetenv("COVE_CRIU");
}

int main(void)
{
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(rebase_rewrites_both_maps),
            cmocka_unit_test(rebase_rejects_malformed),
            cmocka_unit_test(detect_switches),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
