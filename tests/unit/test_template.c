/* Unit tests for templates (control/template.c): the busybox build into a temp dir, its
 * rootfs, idempotence, the lock, crash safety of a killed build, lookup and list.
 * The base template (debootstrap, minutes) is exercised by integration tests only. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "control/template.h"
#include "util/util.h"

struct fixture {
        char dir[256];
};

static int setup(void **state)
{
        struct fixture *f = calloc(1, sizeof *f);
        snprintf(f->dir, sizeof f->dir, "/tmp/cove-test-template-XXXXXX");
        if (!mkdtemp(f->dir))
                return -1;
        *state = f;
        return 0;
}

static int teardown(void **state)
{
        struct fixture *f = *state;
        cove_rm_rf(f->dir, NULL);
        free(f);
        return 0;
}

static int count_prefix(const char *dir, const char *prefix)
{
        DIR *d = opendir(dir);
        int n = 0;
        struct dirent *de;
        while (d && (de = readdir(d)))
                if (strncmp(de->d_name, prefix, strlen(prefix)) == 0)
                        n++;
        if (d)
                closedir(d);
        return n;
}

static void lookup_unknown(void **state)
{
        struct fixture *f = *state;
        char rootfs[512];
        struct cove_err err = {0};
        assert_int_equal(cove_template_lookup(f->dir, "nope", rootfs, sizeof rootfs, &err), 1);
        assert_int_equal(cove_template_lookup(f->dir, "busybox", rootfs, sizeof rootfs, &err), 1);
        assert_int_equal(cove_template_lookup(f->dir, "../etc", rootfs, sizeof rootfs, &err), 1);
        assert_int_equal(cove_template_lookup(f->dir, "", rootfs, sizeof rootfs, &err), 1);
        /* unknown names are refused by build with a not-found error, nothing created */
        assert_int_equal(cove_template_build(f->dir, "nope", NULL, NULL, &err), -1);
        assert_int_equal(err.kind, COVE_E_NOT_FOUND);
        assert_non_null(strstr(err.msg, "nope"));
        assert_int_equal(count_prefix(f->dir, "nope"), 0);
        assert_true(cove_template_known("busybox"));
        assert_true(cove_template_known("base"));
        assert_false(cove_template_known("busybox2"));
}

struct stages {
        char seen[16][32];
        int n;
};

static void record(void *arg, const char *stage, int percent)
{
        struct stages *s = arg;
        assert_true(percent >= -1 && percent <= 100);
        if (s->n < 16 && (s->n == 0 || strcmp(s->seen[s->n - 1], stage) != 0))
                snprintf(s->seen[s->n++], sizeof s->seen[0], "%s", stage);
}

static int run_status(char *const argv[], char *out, size_t cap)
{
        int p[2];
        if (pipe(p) < 0)
                return -1;
        pid_t pid = fork();
        if (pid == 0) {
                dup2(p[1], 1);
                close(p[0]);
                execv(argv[0], argv);
                _exit(127);
        }
        close(p[1]);
        size_t n = 0;
        ssize_t r;
        while (n < cap - 1 && (r = read(p[0], out + n, cap - 1 - n)) > 0)
                n += (size_t)r;
        out[n] = '\0';
        close(p[0]);
        int st;
        waitpid(pid, &st, 0);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void build_busybox(void **state)
{
        struct fixture *f = *state;
        if (geteuid() != 0 || access("/bin/busybox", X_OK) != 0) {
                print_message("skip: needs root and busybox-static\n");
                skip();
        }
        struct cove_err err = {0};
        struct stages st = {0};
        int64_t t0 = cove_mono_ns();
        int rc = cove_template_build(f->dir, "busybox", record, &st, &err);
        if (rc != 0)
                print_message("build: %s\n", err.msg);
        assert_int_equal(rc, 0);
        int64_t ms = (cove_mono_ns() - t0) / 1000000;
        print_message("busybox template built in %lld ms\n", (long long)ms);
        assert_true(ms < 5000);
        assert_true(st.n >= 2);
        assert_string_equal(st.seen[st.n - 1], "finish");

        char rootfs[512], path[600];
        assert_int_equal(cove_template_lookup(f->dir, "busybox", rootfs, sizeof rootfs, &err), 0);
        snprintf(path, sizeof path, "%s/busybox/rootfs", f->dir);
        assert_string_equal(rootfs, path);

        /* layout a sandbox expects */
        struct stat sb;
        static const char *const dirs[] = {"bin", "sbin", "usr/bin", "usr/sbin", "etc",      "proc",
                                           "dev", "sys",  "tmp",     "root",     "home/user"};
        for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
                snprintf(path, sizeof path, "%s/%s", rootfs, dirs[i]);
                assert_int_equal(lstat(path, &sb), 0);
                assert_true(S_ISDIR(sb.st_mode));
        }
        snprintf(path, sizeof path, "%s/tmp", rootfs);
        assert_int_equal(stat(path, &sb), 0);
        assert_int_equal(sb.st_mode & 07777, 01777);
        snprintf(path, sizeof path, "%s/home/user", rootfs);
        assert_int_equal(stat(path, &sb), 0);
        assert_int_equal(sb.st_uid, 1000);
        snprintf(path, sizeof path, "%s/bin/sh", rootfs);
        assert_int_equal(lstat(path, &sb), 0);
        assert_true(S_ISLNK(sb.st_mode));

        char *text = NULL;
        size_t len = 0;
        snprintf(path, sizeof path, "%s/etc/passwd", rootfs);
        assert_int_equal(cove_read_file(path, 65536, &text, &len, &err), 0);
        assert_non_null(strstr(text, "root:x:0:0:"));
        assert_non_null(strstr(text, "user:x:1000:1000:user:/home/user:"));
        free(text);

        /* busybox really runs from the rootfs */
        char out[256];
        char *argv[] = {"/usr/sbin/chroot", rootfs, "/bin/sh", "-c", "echo ok; id -u user", NULL};
        assert_int_equal(run_status(argv, out, sizeof out), 0);
        assert_string_equal(out, "ok\n1000\n");

        /* metadata */
        struct cove_template_info info;
        assert_int_equal(cove_template_info(f->dir, "busybox", &info, &err), 0);
        assert_true(info.built);
        assert_true(info.size_bytes > 500 * 1024); /* the static binary alone is ~2 MB */
        assert_int_equal(strlen(info.built_at), 24);
        assert_non_null(strstr(info.source, "busybox"));

        /* rebuilding is a no-op: same built_at, returns at once */
        char before[40];
        snprintf(before, sizeof before, "%s", info.built_at);
        t0 = cove_mono_ns();
        assert_int_equal(cove_template_build(f->dir, "busybox", NULL, NULL, &err), 0);
        assert_true(cove_mono_ns() - t0 < 50 * 1000000LL);
        assert_int_equal(cove_template_info(f->dir, "busybox", &info, &err), 0);
        assert_string_equal(info.built_at, before);
        assert_int_equal(count_prefix(f->dir, ".build-"), 0);
}

/* A builder killed mid-build (SIGKILL from its own progress callback, after busybox was
 * copied) leaves no template, and the next build cleans its debris and succeeds. */
static void die_at_applets(void *arg, const char *stage, int percent)
{
        (void)arg;
        (void)percent;
        if (strcmp(stage, "applets") == 0)
                raise(SIGKILL);
}

static void killed_build_leaves_nothing(void **state)
{
        struct fixture *f = *state;
        if (geteuid() != 0 || access("/bin/busybox", X_OK) != 0) {
                print_message("skip: needs root and busybox-static\n");
                skip();
        }
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                struct cove_err e;
                cove_template_build(f->dir, "busybox", die_at_applets, NULL, &e);
                _exit(0); /* not reached when the callback kills us */
        }
        int st;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);

        char rootfs[512];
        struct cove_err err = {0};
        assert_int_equal(cove_template_lookup(f->dir, "busybox", rootfs, sizeof rootfs, &err), 1);
        assert_int_equal(count_prefix(f->dir, "busybox"), 0);
        assert_int_equal(count_prefix(f->dir, ".build-busybox-"), 1); /* the debris */

        assert_int_equal(cove_template_build(f->dir, "busybox", NULL, NULL, &err), 0);
        assert_int_equal(cove_template_lookup(f->dir, "busybox", rootfs, sizeof rootfs, &err), 0);
        assert_int_equal(count_prefix(f->dir, ".build-"), 0);
}

/* Two processes build at once: the lock makes one build and the other find it built. */
static void concurrent_builds(void **state)
{
        struct fixture *f = *state;
        if (geteuid() != 0 || access("/bin/busybox", X_OK) != 0) {
                print_message("skip: needs root and busybox-static\n");
                skip();
        }
        pid_t pids[3];
        for (int i = 0; i < 3; i++) {
                pids[i] = fork();
                assert_true(pids[i] >= 0);
                if (pids[i] == 0) {
                        struct cove_err e;
                        _exit(cove_template_build(f->dir, "busybox", NULL, NULL, &e) == 0 ? 0 : 1);
                }
        }
        for (int i = 0; i < 3; i++) {
                int st;
                assert_int_equal(waitpid(pids[i], &st, 0), pids[i]);
                assert_true(WIFEXITED(st));
                assert_int_equal(WEXITSTATUS(st), 0);
        }
        char rootfs[512];
        struct cove_err err = {0};
        assert_int_equal(cove_template_lookup(f->dir, "busybox", rootfs, sizeof rootfs, &err), 0);
        assert_int_equal(count_prefix(f->dir, ".build-"), 0);
}

struct listed {
        char names[8][64];
        int built[8];
        int n;
};

static int collect(void *arg, const struct cove_template_info *info)
{
        struct listed *l = arg;
        if (l->n < 8) {
                snprintf(l->names[l->n], 64, "%s", info->name);
                l->built[l->n++] = info->built;
        }
        return 0;
}

static void list_templates(void **state)
{
        struct fixture *f = *state;
        struct cove_err err = {0};
        struct listed l = {0};
        char missing[300];
        snprintf(missing, sizeof missing, "%s/not-there", f->dir);
        assert_int_equal(cove_template_list(missing, collect, &l, &err), 0);
        assert_int_equal(l.n, 3);
        assert_string_equal(l.names[0], "base");
        assert_string_equal(l.names[1], "busybox");
        assert_string_equal(l.names[2], "code-interpreter");
        assert_int_equal(l.built[0] + l.built[1] + l.built[2], 0);

        /* a custom template: any directory with rootfs/ and a valid meta.json */
        char path[400];
        snprintf(path, sizeof path, "%s/custom/rootfs", f->dir);
        assert_int_equal(cove_mkdir_p(path, 0755, &err), 0);
        snprintf(path, sizeof path, "%s/custom", f->dir);
        const char *meta = "{\"name\":\"custom\",\"built_at\":\"2026-01-01T00:00:00.000Z\","
                           "\"size_bytes\":5,\"source\":\"test\"}";
        assert_int_equal(cove_write_file_atomic(path, "meta.json", meta, strlen(meta), 0644, &err),
                         0);
        memset(&l, 0, sizeof l);
        assert_int_equal(cove_template_list(f->dir, collect, &l, &err), 0);
        assert_int_equal(l.n, 4);
        assert_string_equal(l.names[3], "custom");
        assert_int_equal(l.built[3], 1);
        char rootfs[512];
        assert_int_equal(cove_template_lookup(f->dir, "custom", rootfs, sizeof rootfs, &err), 0);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
            cmocka_unit_test_setup_teardown(lookup_unknown, setup, teardown),
            cmocka_unit_test_setup_teardown(build_busybox, setup, teardown),
            cmocka_unit_test_setup_teardown(killed_build_leaves_nothing, setup, teardown),
            cmocka_unit_test_setup_teardown(concurrent_builds, setup, teardown),
            cmocka_unit_test_setup_teardown(list_templates, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
