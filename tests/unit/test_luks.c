/* Unit tests for runtime/luks.c: the encrypted qcow2 overlay we write ourselves must be one
 * QEMU opens like its own. Checked with the real QEMU tools (qemu-img, qemu-io from
 * qemu-utils; skipped with the reason when absent): the image passes `qemu-img check` with
 * the right passphrase and not with a wrong one, data written through it reads back, reads
 * of unwritten areas come from the backing, and the written data is not in the file in
 * clear. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/luks.h"
#include "util/util.h"

static char dir[] = "/tmp/cove-test-luks-XXXXXX";

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
        char cmd[4096];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(cmd, sizeof(cmd), fmt, ap);
        va_end(ap);
        int st = system(cmd);
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int tools(void)
{
        return access("/usr/bin/qemu-img", X_OK) == 0 && access("/usr/bin/qemu-io", X_OK) == 0;
}

static int setup(void **state)
{
        (void)state;
        if (!mkdtemp(dir))
                return -1;
        return 0;
}

static int teardown(void **state)
{
        (void)state;
        char cmd[PATH_MAX + 16];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        return system(cmd) == 0 ? 0 : -1;
}

/* "<dir>/pass-<name>" holding pass (how the test hands qemu-img a secret) */
static void pass_file(const char *name, const char *pass)
{
        char p[PATH_MAX];
        snprintf(p, sizeof(p), "%s/pass-%s", dir, name);
        FILE *f = fopen(p, "w");
        assert_non_null(f);
        fputs(pass, f);
        fclose(f);
}

static int opens(const char *img, const char *pass_name)
{
        return sh("qemu-img check -q --object secret,id=k,file=%s/pass-%s --image-opts "
                  "driver=qcow2,file.filename=%s,encrypt.key-secret=k >/dev/null 2>&1",
                  dir, pass_name, img);
}

static void qemu_opens_reads_and_writes_it(void **state)
{
        (void)state;
        if (!tools()) {
                print_message("skipped: qemu-img/qemu-io not installed (qemu-utils)\n");
                skip();
        }
        char base[PATH_MAX], ov[PATH_MAX];
        snprintf(base, sizeof(base), "%s/base.qcow2", dir);
        snprintf(ov, sizeof(ov), "%s/ov.qcow2", dir);
        /* a backing with a known pattern at 0..64K */
        assert_int_equal(sh("qemu-img create -q -f qcow2 %s 1G && "
                            "qemu-io -f qcow2 -c 'write -P 0x11 0 64k' %s >/dev/null",
                            base, base),
                         0);
        struct cove_err err;
        int64_t sz = cove_qcow2_virtual_size(base, &err);
        assert_int_equal(sz, 1LL << 30);
        const char pass[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        int64_t t0 = cove_mono_ns();
        assert_int_equal(
            cove_luks_qcow2_create(ov, base, "qcow2", pass, strlen(pass), COVE_LUKS_ITERS, &err),
            0);
        print_message("cove_luks_qcow2_create: %.1f ms\n", (double)(cove_mono_ns() - t0) / 1e6);
        struct stat st;
        assert_int_equal(stat(ov, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0600);
        pass_file("good", pass);
        pass_file("bad", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdeX");
        assert_int_equal(opens(ov, "good"), 0);
        assert_int_not_equal(opens(ov, "bad"), 0);
        /* QEMU's view: encrypted, LUKS, our iteration counts, the backing */
        assert_int_equal(sh("qemu-img info %s | grep -q 'encrypted: yes' && "
                            "qemu-img info %s | grep -q 'format: luks' && "
                            "qemu-img info %s | grep -q 'iters: %d' && "
                            "qemu-img info %s | grep -q 'backing file: %s'",
                            ov, ov, ov, COVE_LUKS_ITERS, ov, base),
                         0);
        /* write through it, read back; unwritten areas come from the backing */
        char io[PATH_MAX * 2];
        snprintf(io, sizeof(io),
                 "qemu-io --object secret,id=k,file=%s/pass-good --image-opts "
                 "driver=qcow2,file.filename=%s,encrypt.key-secret=k",
                 dir, ov);
        assert_int_equal(sh("%s -c 'write -P 0x5a 1M 256k' >/dev/null", io), 0);
        assert_int_equal(sh("out=$(%s -c 'read -P 0x5a 1M 256k' -c 'read -P 0x11 0 64k' "
                            "-c 'read -P 0 2M 64k' 2>&1) && "
                            "! echo \"$out\" | grep -q 'verification failed' && "
                            "test $(echo \"$out\" | grep -c '^read ') -eq 3",
                            io),
                         0);
        /* (the check itself can fail: a wrong pattern is noticed) */
        assert_int_not_equal(sh("out=$(%s -c 'read -P 0x5b 1M 4k' 2>&1) && "
                                "! echo \"$out\" | grep -q 'verification failed'",
                                io),
                             0);
        assert_int_equal(sh("qemu-img check -q --object secret,id=k,file=%s/pass-good "
                            "--image-opts driver=qcow2,file.filename=%s,encrypt.key-secret=k",
                            dir, ov),
                         0);
        /* and the file holds no run of the plaintext pattern */
        char *data = NULL;
        size_t len = 0;
        assert_int_equal(cove_read_file(ov, 64u << 20, &data, &len, &err), 0);
        char run[512];
        memset(run, 0x5a, sizeof(run));
        assert_null(memmem(data, len, run, sizeof(run)));
        free(data);
}

static void bad_input(void **state)
{
        (void)state;
        struct cove_err err;
        char p[PATH_MAX], ov[PATH_MAX];
        snprintf(p, sizeof(p), "%s/not-qcow2", dir);
        snprintf(ov, sizeof(ov), "%s/ov2.qcow2", dir);
        FILE *f = fopen(p, "w");
        assert_non_null(f);
        fputs("plain text, not an image\n", f);
        fclose(f);
        assert_int_equal(cove_qcow2_virtual_size(p, &err), -1);
        assert_non_null(strstr(err.msg, "not a qcow2 image"));
        assert_int_equal(cove_luks_qcow2_create(ov, p, "qcow2", "k", 1, COVE_LUKS_ITERS, &err), -1);
        assert_int_equal(access(ov, F_OK), -1);
        assert_int_equal(cove_luks_qcow2_create(ov, p, "qcow2", "k", 1, 10, &err), -1);
        assert_int_equal(err.kind, COVE_E_BAD_REQUEST);
        assert_int_equal(cove_qcow2_virtual_size("/nonexistent/x", &err), -1);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(qemu_opens_reads_and_writes_it),
            cmocka_unit_test(bad_input),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
