/* Integration tests of the ns runtime (runtime/ns.c): real namespaces, overlay, cgroups,
 * seccomp and XFS quota. Needs root (skips otherwise). The guest is tests/helpers/ns_probe,
 * a static program that answers one command per line on the channel, so every isolation
 * property is checked from inside the sandbox. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "runtime/runtime.h"
#include "util/util.h"

#define UID_BASE 1800000000u

static char tmp[PATH_MAX], rootfs[PATH_MAX], probe[PATH_MAX], data_dir[PATH_MAX];
static struct cove_runtime *rt;
static int seq;

static void sh(const char *fmt, ...)
{
        char cmd[2048];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(cmd, sizeof(cmd), fmt, ap);
        va_end(ap);
        assert_int_equal(system(cmd), 0);
}

static int group_setup(void **state)
{
        (void)state;
        if (geteuid() != 0)
                return 0;
        char self[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
        assert_true(n > 0);
        self[n] = 0;
        snprintf(probe, sizeof(probe), "%s/ns_probe", dirname(self));
        strcpy(tmp, "/var/tmp/cove-ns-test-XXXXXX");
        assert_non_null(mkdtemp(tmp));
        snprintf(rootfs, sizeof(rootfs), "%s/rootfs", tmp);
        snprintf(data_dir, sizeof(data_dir), "%s/data", tmp);
        /* a busybox template, owned by host root like a real one */
        sh("set -e; r=%s; mkdir -p $r/bin $r/etc $r/proc $r/dev $r/sys $r/tmp $r/root; "
           "chmod 1777 $r/tmp; cp /bin/busybox $r/bin/busybox; "
           "for a in $(/bin/busybox --list); do [ -e $r/bin/$a ] || ln -s busybox $r/bin/$a; done; "
           "echo 'root:x:0:0:root:/root:/bin/sh' > $r/etc/passwd; echo hi > $r/etc/motd",
           rootfs);
        struct cove_err err;
        rt = cove_runtime_ns.open(data_dir, &err);
        if (!rt)
                fail_msg("open: %s", err.msg);
        return 0;
}

static int group_teardown(void **state)
{
        (void)state;
        if (rt)
                cove_runtime_ns.close(rt);
        /* a failed test may leave sandboxes and with them a layer filesystem mounted */
        if (tmp[0])
                sh("grep -o ' %s/[^ ]*' /proc/self/mounts | sort -r | xargs -r umount -l; "
                   "rm -rf %s",
                   tmp, tmp);
        return 0;
}

struct sbx {
        char id[64];
        char state_dir[PATH_MAX];
        struct cove_instance_spec spec;
        struct cove_instance inst;
        FILE *in;
};

static void need_root(void)
{
        if (geteuid() != 0) {
                print_message("[  SKIPPED ] ns runtime tests need root (namespaces, cgroups, "
                              "loop mounts)\n");
                skip();
        }
}

static void spec_init(struct sbx *s)
{
        memset(s, 0, sizeof(*s));
        int k = ++seq;
        snprintf(s->id, sizeof(s->id), "sbx_test%d_%d", (int)getpid(), k);
        snprintf(s->state_dir, sizeof(s->state_dir), "%s/state/%s", tmp, s->id);
        struct cove_err err;
        assert_int_equal(cove_mkdir_p(s->state_dir, 0700, &err), 0);
        s->spec.sandbox_id = s->id;
        s->spec.rootfs = rootfs;
        s->spec.state_dir = s->state_dir;
        s->spec.guest_binary = probe;
        s->spec.uid_base = UID_BASE + (uint32_t)k * 65536;
        s->spec.uid_count = 65536;
        s->inst.chan_fd = -1;
}

static int64_t start(struct sbx *s)
{
        struct cove_err err;
        int64_t t0 = cove_mono_ns();
        if (cove_runtime_ns.start(rt, &s->spec, &s->inst, &err) < 0)
                fail_msg("start: %s", err.msg);
        int64_t dt = cove_mono_ns() - t0;
        s->in = fdopen(dup(s->inst.chan_fd), "r");
        assert_non_null(s->in);
        return dt;
}

static void stop(struct sbx *s)
{
        struct cove_err err;
        if (s->in)
                fclose(s->in);
        s->in = NULL;
        if (cove_runtime_ns.stop(rt, &s->inst, s->id, s->state_dir, 1, &err) < 0)
                fail_msg("stop: %s", err.msg);
}

/* One request/answer on the channel (the answer line without newline, in a static buffer). */
static const char *ask(struct sbx *s, const char *cmd)
{
        static char buf[1024];
        size_t n = strlen(cmd);
        assert_int_equal(write(s->inst.chan_fd, cmd, n), (ssize_t)n);
        assert_int_equal(write(s->inst.chan_fd, "\n", 1), 1);
        if (!fgets(buf, sizeof(buf), s->in))
                fail_msg("no answer to %s", cmd);
        buf[strcspn(buf, "\n")] = 0;
        return buf;
}

static int ask_int(struct sbx *s, const char *cmd)
{
        return atoi(ask(s, cmd));
}

static uid_t host_uid_of(pid_t pid)
{
        char p[64], line[256];
        snprintf(p, sizeof(p), "/proc/%d/status", (int)pid);
        FILE *f = fopen(p, "r");
        assert_non_null(f);
        uid_t u = (uid_t)-1;
        while (fgets(line, sizeof(line), f))
                if (sscanf(line, "Uid:\t%u", &u) == 1)
                        break;
        fclose(f);
        return u;
}

static int oom_adj_of(pid_t pid)
{
        char p[64];
        snprintf(p, sizeof(p), "/proc/%d/oom_score_adj", (int)pid);
        FILE *f = fopen(p, "r");
        assert_non_null(f);
        int v = 0;
        assert_int_equal(fscanf(f, "%d", &v), 1);
        fclose(f);
        return v;
}

/* coved can shield the guest from the OOM killer only with CAP_SYS_RESOURCE (bit 24) */
static int has_sys_resource(void)
{
        FILE *f = fopen("/proc/self/status", "r");
        assert_non_null(f);
        char line[256];
        unsigned long long eff = 0;
        while (fgets(line, sizeof(line), f))
                if (sscanf(line, "CapEff: %llx", &eff) == 1)
                        break;
        fclose(f);
        return (eff >> 24) & 1;
}

static int cgroup_exists(const char *id)
{
        const char *ctrls[] = {"memory", "pids", "freezer", "cpu", "cpuacct", "unified", ""};
        char p[PATH_MAX];
        for (size_t i = 0; i < sizeof(ctrls) / sizeof(ctrls[0]); i++) {
                snprintf(p, sizeof(p), "/sys/fs/cgroup/%s%scove/%s", ctrls[i],
                         ctrls[i][0] ? "/" : "", id);
                if (access(p, F_OK) == 0)
                        return 1;
        }
        return 0;
}

static void identity(void **state)
{
        (void)state;
        need_root();
        struct sbx s;
        spec_init(&s);
        start(&s);
        assert_string_equal(ask(&s, "uid"), "0 0");
        assert_int_equal(host_uid_of(s.inst.pid), s.spec.uid_base);
        assert_string_equal(ask(&s, "host"), s.id);
        assert_int_equal(ask_int(&s, "pid"), 1);
        assert_string_equal(ask(&s, "ifs"), "lo,");
        assert_int_equal(ask_int(&s, "procs"), 1); /* only itself: /proc is private */
        assert_int_equal(ask_int(&s, "fds"), 4);   /* stdio + channel, nothing of the host */
        /* the guest is out of the OOM killer's reach; its children are not and cannot get
         * there (EACCES), as no sandbox process may shield itself against the host's OOM */
        if (has_sys_resource())
                assert_int_equal(oom_adj_of(s.inst.pid), -1000);
        else
                print_message("[  NOTE    ] no CAP_SYS_RESOURCE here: guest not shielded, "
                              "-1000 not checked\n");
        assert_string_equal(ask(&s, "oom 0"), "exit 0");
        assert_string_equal(ask(&s, "oom -1000"), "exit 13");
        assert_string_equal(ask(&s, "oom -1"), "exit 13");
        /* copy-up of a template file and a new file, owned by the sandbox's range on the host */
        assert_int_equal(ask_int(&s, "wr /etc/passwd"), 0);
        assert_int_equal(ask_int(&s, "create /newfile"), 0);
        assert_int_equal(ask_int(&s, "create /tmp/t"), 0);
        char p[PATH_MAX];
        struct stat st;
        snprintf(p, sizeof(p), "%s/ns/layers/%s/upper/newfile", data_dir, s.id);
        assert_int_equal(stat(p, &st), 0);
        assert_int_equal(st.st_uid, s.spec.uid_base);
        snprintf(p, sizeof(p), "%s/ns/layers/%s/upper/etc/passwd", data_dir, s.id);
        assert_int_equal(stat(p, &st), 0);
        assert_int_equal(st.st_uid, s.spec.uid_base);
        snprintf(p, sizeof(p), "%s/etc/passwd", rootfs);
        assert_int_equal(stat(p, &st), 0);
        assert_int_equal(st.st_uid, 0); /* template untouched */
        char *txt = NULL;
        size_t len;
        struct cove_err err;
        assert_int_equal(cove_read_file(p, 4096, &txt, &len, &err), 0);
        assert_non_null(strstr(txt, "root:x:0:0"));
        free(txt);
        stop(&s);
}

static void walls(void **state)
{
        (void)state;
        need_root();
        struct sbx s;
        spec_init(&s);
        start(&s);
        assert_int_not_equal(ask_int(&s, "wr /proc/sys/kernel/hostname"), 0);
        assert_int_not_equal(ask_int(&s, "wr /proc/sys/vm/drop_caches"), 0);
        assert_int_not_equal(ask_int(&s, "wr /proc/sysrq-trigger"), 0);
        assert_int_not_equal(ask_int(&s, "wr /sys/kernel/uevent_helper"), 0);
        assert_int_not_equal(ask_int(&s, "wr /sys/class/net/lo/mtu"), 0);
        assert_int_equal(ask_int(&s, "mount"), EPERM);
        assert_int_equal(ask_int(&s, "keyctl"), EPERM);
        assert_int_equal(ask_int(&s, "bpf"), EPERM);
        assert_int_equal(ask_int(&s, "unshare"), EPERM);
        assert_int_equal(ask_int(&s, "io_uring"), EPERM);
        assert_int_equal(ask_int(&s, "userfaultfd"), EPERM);
        assert_int_equal(ask_int(&s, "clone3"), ENOSYS);
        assert_int_equal(ask_int(&s, "mknod"), EPERM);
        assert_string_equal(ask(&s, "int80"), "sig 31");          /* i386 ABI: SIGSYS */
        assert_int_not_equal(ask_int(&s, "wr /dev/null"), EROFS); /* devices still usable */
        stop(&s);
}

static void disk_limit(void **state)
{
        (void)state;
        need_root();
        struct sbx s;
        spec_init(&s);
        s.spec.disk_mb = 16;
        start(&s);
        assert_int_equal(ask_int(&s, "fill 8 /a"), 0);
        assert_int_equal(ask_int(&s, "fill 32 /b"), ENOSPC);
        assert_int_equal(ask_int(&s, "fill 32 /tmp/c"), ENOSPC);
        assert_int_equal(ask_int(&s, "rm /b"), 0);
        /* a full disk may already refuse the file's creation (copy-up of /tmp, a new inode) */
        int rc = ask_int(&s, "rm /tmp/c");
        assert_true(rc == 0 || rc == ENOENT);
        assert_int_equal(ask_int(&s, "fill 4 /d"), 0); /* space comes back */
        stop(&s);
}

static void memory_limit(void **state)
{
        (void)state;
        need_root();
        struct sbx s;
        spec_init(&s);
        s.spec.memory_mb = 48;
        start(&s);
        assert_string_equal(ask(&s, "mem 16"), "exit 0");
        assert_string_equal(ask(&s, "mem 256"), "sig 9"); /* OOM-killed inside */
        assert_string_equal(ask(&s, "tick"), "tock");     /* init survives */
        assert_int_equal(oom_adj_of(s.inst.pid), has_sys_resource() ? -1000 : 0);
        uint64_t mem = 0, cpu = 0;
        struct cove_err err;
        assert_int_equal(cove_runtime_ns.usage(rt, &s.inst, &mem, &cpu, &err), 0);
        assert_true(mem > 0 && mem <= (48u << 20));
        assert_true(cpu > 0);
        stop(&s);
}

static void pids_limit(void **state)
{
        (void)state;
        need_root();
        struct sbx s;
        spec_init(&s);
        s.spec.pids_max = 32;
        start(&s);
        assert_string_equal(ask(&s, "forkbomb 100"), "exit 0"); /* forks failed */
        assert_string_equal(ask(&s, "tick"), "tock");
        stop(&s);
}

static void freeze_thaw(void **state)
{
        (void)state;
        need_root();
        struct sbx s;
        spec_init(&s);
        start(&s);
        assert_string_equal(ask(&s, "tick"), "tock");
        struct cove_err err;
        assert_int_equal(cove_runtime_ns.freeze(rt, &s.inst, &err), 0);
        assert_int_equal(write(s.inst.chan_fd, "tick\n", 5), 5);
        struct pollfd pfd = {s.inst.chan_fd, POLLIN, 0};
        assert_int_equal(poll(&pfd, 1, 200), 0); /* frozen: no answer */
        assert_int_equal(cove_runtime_ns.thaw(rt, &s.inst, &err), 0);
        char buf[64];
        assert_non_null(fgets(buf, sizeof(buf), s.in));
        assert_string_equal(buf, "tock\n");
        /* stop works on a frozen sandbox too */
        assert_int_equal(cove_runtime_ns.freeze(rt, &s.inst, &err), 0);
        stop(&s);
        assert_false(cgroup_exists(s.id));
}

static void stop_leaves_nothing(void **state)
{
        (void)state;
        need_root();
        struct sbx s;
        spec_init(&s);
        start(&s);
        pid_t init = s.inst.pid;
        assert_true(ask_int(&s, "spawn") > 1);
        assert_true(cgroup_exists(s.id));
        stop(&s);
        assert_int_equal(kill(init, 0), -1);
        assert_false(cgroup_exists(s.id));
        char p[PATH_MAX];
        snprintf(p, sizeof(p), "%s/ns/layers/%s", data_dir, s.id);
        assert_int_equal(access(p, F_OK), -1);
        assert_int_equal(access(s.state_dir, F_OK), -1);
        /* no process of the sandbox's uid range is left */
        sh("! ps -eo uid= | awk '$1 >= %u && $1 < %u' | grep -q .", s.spec.uid_base,
           s.spec.uid_base + 65536);
        sh("! grep -q %s /proc/self/mountinfo", s.id);
        /* second stop is harmless */
        struct cove_err err;
        assert_int_equal(cove_runtime_ns.stop(rt, &s.inst, s.id, s.state_dir, 1, &err), 0);
}

static void exec_failure(void **state)
{
        (void)state;
        need_root();
        struct sbx s;
        spec_init(&s);
        char bad[PATH_MAX];
        snprintf(bad, sizeof(bad), "%s/etc/passwd", rootfs); /* not executable */
        s.spec.guest_binary = bad;
        struct cove_err err;
        assert_int_equal(cove_runtime_ns.start(rt, &s.spec, &s.inst, &err), -1);
        assert_non_null(strstr(err.msg, "exec guest"));
        assert_false(cgroup_exists(s.id));
        char p[PATH_MAX];
        snprintf(p, sizeof(p), "%s/ns/layers/%s", data_dir, s.id);
        assert_int_equal(access(p, F_OK), -1);
}

static int alive(pid_t pid)
{
        char p[64], buf[512];
        snprintf(p, sizeof(p), "/proc/%d/stat", (int)pid);
        FILE *f = fopen(p, "r");
        if (!f)
                return 0;
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = 0;
        char *e = strrchr(buf, ')');
        return e && e[1] == ' ' && e[2] != 'Z' && e[2] != 'X';
}

static void stale_after_parent_killed(void **state)
{
        (void)state;
        need_root();
        struct sbx s;
        spec_init(&s);
        int pfd[2];
        assert_int_equal(pipe(pfd), 0);
        pid_t owner = fork();
        if (owner == 0) {
                /* plays coved: starts the sandbox, then dies with SIGKILL */
                struct cove_err err;
                if (cove_runtime_ns.start(rt, &s.spec, &s.inst, &err) < 0)
                        _exit(1);
                if (write(pfd[1], &s.inst.pid, sizeof(pid_t)) < 0)
                        _exit(1);
                for (;;)
                        pause();
        }
        pid_t init = 0;
        assert_int_equal(read(pfd[0], &init, sizeof(init)), (ssize_t)sizeof(init));
        assert_true(init > 0);
        kill(owner, SIGKILL);
        waitpid(owner, NULL, 0);
        assert_true(cgroup_exists(s.id));
        struct cove_err err;
        assert_int_equal(cove_runtime_ns.cleanup_stale(rt, s.id, s.state_dir, 1, &err), 0);
        assert_false(cgroup_exists(s.id));
        /* gone, or a zombie waiting for whoever adopted it */
        for (int i = 0; i < 1000 && alive(init); i++)
                usleep(1000);
        assert_false(alive(init));
        char p[PATH_MAX];
        snprintf(p, sizeof(p), "%s/ns/layers/%s", data_dir, s.id);
        assert_int_equal(access(p, F_OK), -1);
        close(pfd[0]);
        close(pfd[1]);
}

/* Loop devices whose backing file lies under dir (resolved), and mounts at or under it. */
static int loops_under(const char *dir)
{
        char real[PATH_MAX], p[PATH_MAX], back[PATH_MAX];
        assert_non_null(realpath(dir, real));
        size_t rl = strlen(real);
        int n = 0;
        DIR *d = opendir("/sys/block");
        assert_non_null(d);
        struct dirent *de;
        while ((de = readdir(d))) {
                if (strncmp(de->d_name, "loop", 4) != 0)
                        continue;
                snprintf(p, sizeof(p), "/sys/block/%s/loop/backing_file", de->d_name);
                FILE *f = fopen(p, "r");
                if (!f)
                        continue;
                if (fgets(back, sizeof(back), f) && !strncmp(back, real, rl) &&
                    (back[rl] == '/' || back[rl] == '\n'))
                        n++;
                fclose(f);
        }
        closedir(d);
        return n;
}

static int mounts_under(const char *dir)
{
        char real[PATH_MAX], line[4096], mp[PATH_MAX];
        assert_non_null(realpath(dir, real));
        size_t rl = strlen(real);
        FILE *f = fopen("/proc/self/mountinfo", "r");
        assert_non_null(f);
        int n = 0;
        while (fgets(line, sizeof(line), f))
                if (sscanf(line, "%*s %*s %*s %*s %4095s", mp) == 1 && !strncmp(mp, real, rl) &&
                    (mp[rl] == '/' || mp[rl] == 0))
                        n++;
        fclose(f);
        return n;
}

static struct cove_runtime *open_with_pool(const char *dir, const char *pool)
{
        struct cove_err err;
        setenv("COVE_NS_LAYER_POOL", pool, 1);
        struct cove_runtime *r = cove_runtime_ns.open(dir, &err);
        unsetenv("COVE_NS_LAYER_POOL");
        if (!r)
                fail_msg("open %s: %s", dir, err.msg);
        return r;
}

/* loops_under(dir) once it equals want, or its value after ~5 s: an autoclear loop device is
 * released asynchronously after the last unmount, later under load. */
static int wait_loops(const char *dir, int want)
{
        int n = loops_under(dir);
        for (int i = 0; i < 5000 && n != want; i++) {
                usleep(1000);
                n = loops_under(dir);
        }
        return n;
}

/* Waits (bounded) until want warm layers are ready: their loop devices exist. */
static int wait_pool(const char *dir, int want)
{
        char pool[PATH_MAX];
        snprintf(pool, sizeof(pool), "%s/ns/lfs/pool", dir);
        for (int i = 0; i < 20000; i++) {
                if (loops_under(pool) == want)
                        return 1;
                usleep(1000);
        }
        return 0;
}

/* Number of the loop device whose backing file is path, or -1. */
static int loop_of(const char *path)
{
        char real[PATH_MAX], p[PATH_MAX], back[PATH_MAX];
        assert_non_null(realpath(path, real));
        for (int i = 0; i < 4096; i++) {
                snprintf(p, sizeof(p), "/sys/block/loop%d/loop/backing_file", i);
                FILE *f = fopen(p, "r");
                if (!f)
                        continue;
                int hit = fgets(back, sizeof(back), f) && (back[strcspn(back, "\n")] = 0, 1) &&
                          !strcmp(back, real);
                fclose(f);
                if (hit)
                        return i;
        }
        return -1;
}

static int dir_entries(const char *dir)
{
        char cmd[PATH_MAX + 32];
        snprintf(cmd, sizeof(cmd), "ls -A %s | wc -l", dir);
        FILE *f = popen(cmd, "r");
        assert_non_null(f);
        int n = -1;
        assert_int_equal(fscanf(f, "%d", &n), 1);
        pclose(f);
        return n;
}

/* A new sandbox with a disk limit gets a warm layer that behaves like a cold one; close()
 * leaves no mount and no loop device of the pool. */
static void pool_warm_layers(void **state)
{
        (void)state;
        need_root();
        char dir[PATH_MAX], pool[PATH_MAX], p[PATH_MAX];
        snprintf(dir, sizeof(dir), "%s/data-pool", tmp);
        snprintf(pool, sizeof(pool), "%s/ns/lfs/pool", dir);
        struct cove_runtime *main_rt = rt;
        rt = open_with_pool(dir, "2");
        struct sbx a, b;
        spec_init(&a);
        a.spec.disk_mb = 16;
        start(&a); /* first of its size: built inline, starts the refill */
        assert_true(wait_pool(dir, 2));
        assert_int_equal(dir_entries(pool), 2);
        assert_int_equal(mounts_under(pool), 0); /* warm mounts are detached */
        int warm[2], k = 0;
        for (int i = 0; i < 4096 && k < 2; i++) {
                snprintf(p, sizeof(p), "/sys/block/loop%d/loop/backing_file", i);
                char back[PATH_MAX], real[PATH_MAX];
                FILE *f = fopen(p, "r");
                if (!f)
                        continue;
                assert_non_null(realpath(pool, real));
                if (fgets(back, sizeof(back), f) && !strncmp(back, real, strlen(real)))
                        warm[k++] = i;
                fclose(f);
        }
        assert_int_equal(k, 2);
        spec_init(&b);
        b.spec.disk_mb = 16;
        start(&b);
        snprintf(p, sizeof(p), "%s/ns/lfs/layers/%s.img", dir, b.id);
        int lb = loop_of(p);
        assert_true(lb == warm[0] || lb == warm[1]); /* took a warm layer */
        /* owned by the sandbox, limited, shielded guest: as a cold layer. An image stores
         * sandbox ids: root on disk, the sandbox's root (host uid_base) through its idmap */
        struct stat st;
        snprintf(p, sizeof(p), "%s/ns/layers/%s/upper", dir, b.id);
        assert_int_equal(stat(p, &st), 0);
        assert_int_equal(st.st_uid, 0);
        assert_int_equal(ask_int(&b, "create /newfile"), 0);
        assert_string_equal(ask(&b, "stat /newfile"), "0 0 100644 0");
        assert_string_equal(ask(&b, "uid"), "0 0");
        snprintf(p, sizeof(p), "%s/ns/layers/%s/upper/newfile", dir, b.id);
        assert_int_equal(stat(p, &st), 0);
        assert_int_equal(st.st_uid, 0);
        assert_int_equal(ask_int(&b, "fill 8 /a"), 0);
        assert_int_equal(ask_int(&b, "fill 32 /b"), ENOSPC);
        assert_int_equal(oom_adj_of(b.inst.pid), has_sys_resource() ? -1000 : 0);
        assert_true(wait_pool(dir, 2)); /* refilled */
        stop(&a);
        stop(&b);
        assert_int_equal(wait_loops(pool, 2), 2); /* only the warm ones are left */
        assert_int_equal(wait_loops(dir, 3), 3);  /* and the layer filesystem's */
        cove_runtime_ns.close(rt);
        rt = main_rt;
        assert_int_equal(wait_loops(dir, 0), 0);
        assert_int_equal(mounts_under(dir), 0);
        assert_int_equal(access(pool, F_OK), -1); /* on the layer fs, unmounted by close() */
}

/* coved killed with warm layers and a sandbox: open() reclaims the pool, cleanup_stale() the
 * sandbox's layer; no loop device or mount under the data dir is left. */
static void pool_after_crash(void **state)
{
        (void)state;
        need_root();
        char dir[PATH_MAX], pool[PATH_MAX];
        snprintf(dir, sizeof(dir), "%s/data-crash", tmp);
        snprintf(pool, sizeof(pool), "%s/ns/lfs/pool", dir);
        struct sbx s;
        spec_init(&s);
        s.spec.disk_mb = 16;
        int pfd[2];
        assert_int_equal(pipe(pfd), 0);
        pid_t owner = fork();
        if (owner == 0) {
                /* plays coved: a runtime with a warm pool and a sandbox, then SIGKILL */
                struct cove_err err;
                setenv("COVE_NS_LAYER_POOL", "2", 1);
                struct cove_runtime *r = cove_runtime_ns.open(dir, &err);
                if (!r || cove_runtime_ns.start(r, &s.spec, &s.inst, &err) < 0)
                        _exit(1);
                for (int i = 0; i < 20000 && loops_under(pool) < 2; i++)
                        usleep(1000);
                if (write(pfd[1], "x", 1) < 0)
                        _exit(1);
                for (;;)
                        pause();
        }
        char c;
        assert_int_equal(read(pfd[0], &c, 1), 1);
        assert_int_equal(wait_loops(pool, 2), 2);
        assert_int_equal(wait_loops(dir, 4), 4); /* + the sandbox's layer and the layer fs */
        kill(owner, SIGKILL);
        waitpid(owner, NULL, 0);
        close(pfd[0]);
        close(pfd[1]);

        struct cove_runtime *main_rt = rt;
        rt = open_with_pool(dir, "2");
        assert_int_equal(wait_loops(pool, 0), 0);
        assert_int_equal(dir_entries(pool), 0);
        struct cove_err err;
        assert_int_equal(cove_runtime_ns.cleanup_stale(rt, s.id, s.state_dir, 1, &err), 0);
        /* only the layer filesystem, which the crashed owner left mounted and open() reused */
        assert_int_equal(wait_loops(dir, 1), 1);
        assert_int_equal(mounts_under(dir), 1);
        /* and the restarted driver works with the same size */
        struct sbx t;
        spec_init(&t);
        t.spec.disk_mb = 16;
        start(&t);
        assert_int_equal(ask_int(&t, "fill 32 /b"), ENOSPC);
        stop(&t);
        cove_runtime_ns.close(rt);
        rt = main_rt;
        assert_int_equal(wait_loops(dir, 0), 0);
        assert_int_equal(mounts_under(dir), 0);
}

static int cmp64(const void *a, const void *b)
{
        int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
        return x < y ? -1 : x > y;
}

/* One timed start (and time to the first answer) of a sandbox on runtime r. */
static void timed_start(struct cove_runtime *r, unsigned disk_mb, int64_t *t, int64_t *ready)
{
        struct cove_runtime *main_rt = rt;
        rt = r;
        struct sbx s;
        spec_init(&s);
        s.spec.disk_mb = disk_mb;
        s.spec.memory_mb = 512;
        s.spec.cpus = 1;
        int64_t t0 = cove_mono_ns();
        *t = start(&s);
        assert_string_equal(ask(&s, "tick"), "tock");
        *ready = cove_mono_ns() - t0;
        stop(&s);
        rt = main_rt;
}

static void report(const char *what, int64_t *t, int64_t *ready, int n)
{
        qsort(t, (size_t)n, sizeof(t[0]), cmp64);
        qsort(ready, (size_t)n, sizeof(ready[0]), cmp64);
        print_message("ns start(), %s: p50 %.2f ms, p90 %.2f ms, max %.2f ms; start+first answer "
                      "p50 %.2f ms (n=%d)\n",
                      what, t[n / 2] / 1e6, t[n * 9 / 10] / 1e6, t[n - 1] / 1e6, ready[n / 2] / 1e6,
                      n);
}

/* Figures, not assertions (machines vary; bench/ measures creates properly): the three kinds
 * interleaved so that they share whatever else the host is doing. A few rounds only: every
 * start has to work, warm, cold and without a disk limit. */
static void start_latency(void **state)
{
        (void)state;
        need_root();
        enum { N = 20 };
        static int64_t t[3][N], ready[3][N];
        char dir[PATH_MAX], pool[PATH_MAX];
        snprintf(dir, sizeof(dir), "%s/data-nopool", tmp);
        snprintf(pool, sizeof(pool), "%s/ns/lfs/pool", data_dir);
        struct cove_runtime *cold = open_with_pool(dir, "0");
        int warm = 0;
        timed_start(rt, 1024, &t[1][0], &ready[1][0]); /* first of the size: warms the pool */
        for (int i = 0; i < N; i++) {
                timed_start(rt, 0, &t[0][i], &ready[0][i]);
                warm += loops_under(pool) > 0;
                timed_start(rt, 1024, &t[1][i], &ready[1][i]);
                timed_start(cold, 1024, &t[2][i], &ready[2][i]);
        }
        cove_runtime_ns.close(cold);
        report("no disk limit", t[0], ready[0], N);
        char what[64];
        snprintf(what, sizeof(what), "disk_mb 1024, warm pool (%d/%d ready)", warm, N);
        report(what, t[1], ready[1], N);
        report("disk_mb 1024, pool off", t[2], ready[2], N);
}

static void read_at(int dfd, const char *name, char *buf, size_t cap)
{
        int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC);
        assert_true(fd >= 0);
        ssize_t n = read(fd, buf, cap - 1);
        assert_true(n >= 0);
        buf[n] = 0;
        close(fd);
}

/* Files written in a sandbox (a 100 MB file, a deleted template file, an xattr, a user's file),
 * snapshot, changes; the snapshot shows the state before the changes. Then a restore: a new
 * image filled from the snapshot's tree by a plain `cp -a`, started by a sandbox with another
 * uid range, which sees the files, modes and owners as they were. */
static void snapshot_restore(void **state)
{
        (void)state;
        need_root();
        struct cove_err err;
        struct sbx s;
        spec_init(&s);
        s.spec.disk_mb = 512;
        start(&s);
        assert_int_equal(ask_int(&s, "fill 100 /big"), 0);
        assert_string_equal(ask(&s, "sh echo hello > /root/a && mkdir -p /home/user && "
                                    "echo u > /home/user/f && chmod 640 /home/user/f && "
                                    "chown -R 1000:1000 /home/user && rm /etc/motd"),
                            "exit 0");
        assert_int_equal(ask_int(&s, "setx /root/a user.k v1"), 0);
        const char *dir = cove_runtime_ns.layer_dir(rt);
        assert_non_null(dir);
        char snap[PATH_MAX], img[PATH_MAX], buf[256];
        snprintf(snap, sizeof(snap), "%s/snap-%s.img", dir, s.id);
        snprintf(img, sizeof(img), "%s/restore-%s.img", dir, s.id);
        uint64_t pause = 0;
        if (cove_runtime_ns.layer_snapshot(rt, &s.inst, s.id, snap, &pause, &err) < 0)
                fail_msg("snapshot: %s", err.msg);
        print_message("[  NOTE    ] snapshot pause %.2f ms (100 MB written)\n", pause / 1e6);
        assert_string_equal(ask(&s, "sh echo changed > /root/a && rm /home/user/f && "
                                    "echo new > /etc/motd && rm /big"),
                            "exit 0");
        assert_string_equal(ask(&s, "tick"), "tock"); /* thawed */

        /* the snapshot, read-only: the state at the snapshot, in sandbox ids */
        int tfd = -1;
        struct cove_layer_handle *h = NULL;
        if (cove_runtime_ns.layer_open(rt, snap, 0, 0, NULL, &tfd, &h, &err) < 0)
                fail_msg("layer_open: %s", err.msg);
        struct stat st;
        read_at(tfd, "root/a", buf, sizeof(buf));
        assert_string_equal(buf, "hello\n");
        assert_int_equal(fstatat(tfd, "root/a", &st, AT_SYMLINK_NOFOLLOW), 0);
        assert_int_equal(st.st_uid, 0);
        assert_int_equal(fstatat(tfd, "home/user/f", &st, AT_SYMLINK_NOFOLLOW), 0);
        assert_int_equal(st.st_uid, 1000);
        assert_int_equal(st.st_gid, 1000);
        assert_int_equal(st.st_mode, S_IFREG | 0640);
        assert_int_equal(fstatat(tfd, "etc/motd", &st, AT_SYMLINK_NOFOLLOW), 0);
        assert_true(S_ISCHR(st.st_mode) && st.st_rdev == 0); /* overlay whiteout */
        assert_int_equal(fstatat(tfd, "big", &st, AT_SYMLINK_NOFOLLOW), 0);
        assert_int_equal(st.st_size, 100 << 20);
        char p[PATH_MAX];
        snprintf(p, sizeof(p), "/proc/self/fd/%d/root/a", tfd);
        ssize_t n = getxattr(p, "user.k", buf, sizeof(buf));
        assert_int_equal(n, 2);
        assert_memory_equal(buf, "v1", 2);
        assert_int_equal(mkdirat(tfd, "x", 0755), -1); /* read-only */
        assert_int_equal(errno, EROFS);
        assert_int_equal(mounts_under(dir), 0); /* detached: reachable through the fd only */

        /* restore into a fresh image, then a new sandbox (another uid range) takes it */
        int rfd = -1;
        struct cove_layer_handle *rh = NULL;
        if (cove_runtime_ns.layer_open(rt, img, 1, 512, NULL, &rfd, &rh, &err) < 0)
                fail_msg("layer_open create: %s", err.msg);
        sh("cp -a /proc/%d/fd/%d/. /proc/%d/fd/%d/", (int)getpid(), tfd, (int)getpid(), rfd);
        close(tfd);
        close(rfd);
        cove_runtime_ns.layer_close(rt, h);
        cove_runtime_ns.layer_close(rt, rh);
        assert_int_equal(wait_loops(dir, 0), 0); /* both images let go */
        struct sbx r;
        spec_init(&r);
        r.spec.disk_mb = 512;
        r.spec.layer_image = img;
        int64_t t = start(&r);
        print_message("[  NOTE    ] start() with a layer image: %.2f ms\n", t / 1e6);
        assert_int_not_equal(r.spec.uid_base, s.spec.uid_base);
        assert_int_equal(access(img, F_OK), -1); /* taken over */
        assert_string_equal(ask(&r, "sh grep -qx hello /root/a"), "exit 0");
        assert_string_equal(ask(&r, "stat /root/a"), "0 0 100644 6");
        assert_string_equal(ask(&r, "getx /root/a user.k"), "v1");
        assert_string_equal(ask(&r, "stat /home/user/f"), "1000 1000 100640 2");
        assert_string_equal(ask(&r, "stat /home/user"), "1000 1000 40755 4096");
        assert_string_equal(ask(&r, "stat /etc/motd"), "E2");              /* stays deleted */
        assert_string_equal(ask(&r, "stat /etc/passwd"), "0 0 100644 30"); /* template */
        assert_string_equal(ask(&r, "stat /big"), "0 0 100644 104857600");
        /* the restored sandbox writes as its own range, and snapshots again */
        assert_string_equal(ask(&r, "sh echo more >> /home/user/f && echo x > /root/b"), "exit 0");
        assert_int_equal(host_uid_of(r.inst.pid), r.spec.uid_base);
        char snap2[PATH_MAX];
        snprintf(snap2, sizeof(snap2), "%s/snap2-%s.img", dir, r.id);
        assert_int_equal(cove_runtime_ns.layer_snapshot(rt, &r.inst, r.id, snap2, &pause, &err), 0);
        assert_int_equal(cove_runtime_ns.layer_open(rt, snap2, 0, 0, NULL, &tfd, &h, &err), 0);
        assert_int_equal(fstatat(tfd, "root/b", &st, AT_SYMLINK_NOFOLLOW), 0);
        assert_int_equal(st.st_uid, 0); /* sandbox ids on disk, whatever the range */
        close(tfd);
        cove_runtime_ns.layer_close(rt, h);
        /* errors: no image for a plain layer, a dest that exists, a missing image */
        assert_int_equal(cove_runtime_ns.layer_snapshot(rt, &r.inst, r.id, snap2, &pause, &err),
                         -1);
        assert_int_equal(err.errnum, EEXIST);
        assert_int_equal(cove_runtime_ns.layer_open(rt, img, 0, 0, NULL, &tfd, &h, &err), -1);
        assert_int_equal(err.kind, COVE_E_NOT_FOUND);
        stop(&r);
        stop(&s);
        assert_int_equal(unlink(snap), 0);
        assert_int_equal(unlink(snap2), 0);
        struct sbx plain;
        spec_init(&plain);
        start(&plain);
        assert_int_equal(
            cove_runtime_ns.layer_snapshot(rt, &plain.inst, plain.id, snap, &pause, &err), -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        assert_int_equal(access(snap, F_OK), -1);
        stop(&plain);
        assert_int_equal(wait_loops(dir, 0), 0);
}

/* A restore's layer goes to start() still mounted (spec.layer_handle, as resume, rewind and
 * fork do): the sandbox runs on that very mount, and a start that fails after taking it over,
 * or before, leaves no mount, loop device, layer or image behind. */
static void restore_on_open_layer(void **state)
{
        (void)state;
        need_root();
        struct cove_err err;
        const char *dir = cove_runtime_ns.layer_dir(rt);
        char layers[PATH_MAX], images[PATH_MAX], img[PATH_MAX], p[PATH_MAX];
        snprintf(layers, sizeof(layers), "%s/ns/layers", data_dir);
        snprintf(images, sizeof(images), "%s/ns/lfs/layers", data_dir);
        int mounts0 = mounts_under(layers), loops0 = wait_loops(images, loops_under(images));
        assert_int_equal(wait_loops(dir, 0), 0);

        /* success: the restored file is there, the image moved, one mount */
        snprintf(img, sizeof(img), "%s/open-restore-%d.img", dir, (int)getpid());
        int rfd = -1;
        struct cove_layer_handle *h = NULL;
        if (cove_runtime_ns.layer_open(rt, img, 1, 512, NULL, &rfd, &h, &err) < 0)
                fail_msg("layer_open create: %s", err.msg);
        assert_int_equal(mkdirat(rfd, "root", 0700), 0);
        int fd = openat(rfd, "root/restored", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, "yes\n", 4), 4);
        close(fd);
        close(rfd);
        struct sbx r;
        spec_init(&r);
        r.spec.disk_mb = 512;
        r.spec.layer_image = img;
        r.spec.layer_handle = h;
        int64_t t = start(&r);
        print_message("[  NOTE    ] start() on a restore's open layer: %.2f ms\n", t / 1e6);
        assert_int_equal(access(img, F_OK), -1); /* taken over */
        assert_string_equal(ask(&r, "sh grep -qx yes /root/restored"), "exit 0");
        assert_string_equal(ask(&r, "stat /root/restored"), "0 0 100644 4");
        assert_string_equal(ask(&r, "sh echo more > /root/new"), "exit 0");
        assert_int_equal(mounts_under(layers), mounts0 + 1);
        assert_int_equal(loops_under(images), loops0 + 1); /* the restore's loop device */
        assert_int_equal(loops_under(dir), 0);
        stop(&r);
        assert_int_equal(mounts_under(layers), mounts0);
        assert_int_equal(wait_loops(images, loops0), loops0);

        /* a clone of a closed image (a kept one), opened read-write as it is
         * (COVE_LAYER_OPEN_CLONE), and a start on that mount */
        char orig[PATH_MAX];
        snprintf(orig, sizeof(orig), "%s/open-orig-%d.img", dir, (int)getpid());
        if (cove_runtime_ns.layer_open(rt, orig, 1, 512, NULL, &rfd, &h, &err) < 0)
                fail_msg("layer_open create: %s", err.msg);
        assert_int_equal(mkdirat(rfd, "root", 0700), 0);
        fd = openat(rfd, "root/kept", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, "kept\n", 5), 5);
        close(fd);
        close(rfd);
        cove_runtime_ns.layer_close(rt, h);
        assert_int_equal(wait_loops(dir, 0), 0);
        sh("cp --reflink=auto %s %s", orig, img);
        assert_int_equal(unlink(orig), 0);
        if (cove_runtime_ns.layer_open(rt, img, COVE_LAYER_OPEN_CLONE, 0, NULL, &rfd, &h, &err) < 0)
                fail_msg("layer_open clone: %s", err.msg);
        assert_int_equal(mkdirat(rfd, "tmp", 01777), 0); /* read-write */
        close(rfd);
        struct sbx k;
        spec_init(&k);
        k.spec.disk_mb = 512;
        k.spec.layer_image = img;
        k.spec.layer_handle = h;
        t = start(&k);
        print_message("[  NOTE    ] start() on a clone's open layer: %.2f ms\n", t / 1e6);
        assert_int_equal(access(img, F_OK), -1); /* taken over */
        assert_string_equal(ask(&k, "sh grep -qx kept /root/kept"), "exit 0");
        assert_int_equal(mounts_under(layers), mounts0 + 1);
        assert_int_equal(loops_under(images), loops0 + 1); /* the clone's one loop device */
        assert_int_equal(loops_under(dir), 0);
        stop(&k);
        assert_int_equal(mounts_under(layers), mounts0);
        assert_int_equal(wait_loops(images, loops0), loops0);

        /* the start fails after taking the mount over (no guest binary) */
        if (cove_runtime_ns.layer_open(rt, img, 1, 512, NULL, &rfd, &h, &err) < 0)
                fail_msg("layer_open create: %s", err.msg);
        close(rfd);
        struct sbx f;
        spec_init(&f);
        f.spec.disk_mb = 512;
        f.spec.layer_image = img;
        f.spec.layer_handle = h;
        f.spec.guest_binary = "/nonexistent/cove-guest";
        assert_int_equal(cove_runtime_ns.start(rt, &f.spec, &f.inst, &err), -1);
        unlink(img); /* the caller's part of the contract; gone already here */
        assert_int_equal(mounts_under(layers), mounts0);
        assert_int_equal(wait_loops(images, loops0), loops0);
        assert_int_equal(wait_loops(dir, 0), 0);
        snprintf(p, sizeof(p), "%s/%s", layers, f.id);
        assert_int_equal(access(p, F_OK), -1);
        snprintf(p, sizeof(p), "%s/%s.img", images, f.id);
        assert_int_equal(access(p, F_OK), -1);

        /* ... and before (a bad spec): the mount is released all the same */
        if (cove_runtime_ns.layer_open(rt, img, 1, 512, NULL, &rfd, &h, &err) < 0)
                fail_msg("layer_open create: %s", err.msg);
        close(rfd);
        struct sbx b;
        spec_init(&b);
        b.spec.layer_image = img;
        b.spec.layer_handle = h;
        b.spec.uid_base = 0;
        assert_int_equal(cove_runtime_ns.start(rt, &b.spec, &b.inst, &err), -1);
        assert_int_equal(err.kind, COVE_E_BAD_REQUEST);
        assert_int_equal(unlink(img), 0);
        assert_int_equal(wait_loops(dir, 0), 0);
        assert_int_equal(mounts_under(layers), mounts0);
}

/* The sandbox's /log, appended by LOG_WRITER: fixed-size records "%08d %010d ...........\n"
 * (a number, a checksum of it), each appended with one write and fsync'd before the next. */
#define REC 32
#define LOG_WRITER                                                                                 \
        "i=0; while :; do printf '%08d %010d ...........\\n' $i $((i*2654435761%4294967291)) | "   \
        "dd of=/log oflag=append conv=notrunc,fsync bs=32 iflag=fullblock count=1 2>/dev/null "    \
        "|| exit; i=$((i+1)); done"

static long log_size(struct sbx *s)
{
        long uid, gid, mode, size = -1;
        if (sscanf(ask(s, "stat /log"), "%ld %ld %lo %ld", &uid, &gid, &mode, &size) != 4)
                return -1;
        return size;
}

/* Number of records in buf[0..n) when it is a valid log (every record complete, in order,
 * its checksum right, nothing after the last one), else -1 (the reason printed). */
static long log_records(const char *buf, size_t n)
{
        if (n % REC) {
                print_message("log of %zu bytes: a torn record\n", n);
                return -1;
        }
        for (size_t i = 0; i < n / REC; i++) {
                char want[REC + 1];
                snprintf(want, sizeof(want), "%08zu %010llu ...........\n", i,
                         (unsigned long long)i * 2654435761ULL % 4294967291ULL);
                if (memcmp(buf + i * REC, want, REC)) {
                        print_message("log record %zu: %.*s\n", i, REC, buf + i * REC);
                        return -1;
                }
        }
        return (long)(n / REC);
}

/* A snapshot is a clone of the layer's image without a freeze: the state a power cut would
 * leave, made consistent by a journal replay. Under load (records appended and fsync'd one
 * by one, files created and deleted, a file rewritten in 16 MB streams, a file unlinked while
 * open) every snapshot must be a clean ext4 (e2fsck -fn after the replay) whose log is a
 * valid prefix holding at least every record the sandbox had written when the snapshot
 * began (its syncfs commits them). */
static void snapshot_under_writes(void **state)
{
        (void)state;
        need_root();
        enum { N = 8 };
        struct cove_err err;
        struct sbx s;
        spec_init(&s);
        s.spec.disk_mb = 256;
        start(&s);
        /* (one background job per line: the probe reads lines of up to 511 bytes) */
        static const char *const jobs[] = {
            "sh mkdir /t && { exec 9>/t/held; rm /t/held; exec sleep 3600; } </dev/null "
            ">/dev/null 2>&1 &",
            "sh { " LOG_WRITER "; } </dev/null >/dev/null 2>&1 &",
            "sh { i=0; while :; do echo $i > /t/a$i; rm -f /t/a$((i-50)); i=$((i+1)); done; } "
            "</dev/null >/dev/null 2>&1 &",
            "sh { while :; do dd if=/dev/zero of=/bulk bs=1M count=16 2>/dev/null; done; } "
            "</dev/null >/dev/null 2>&1 &",
        };
        for (size_t j = 0; j < sizeof(jobs) / sizeof(jobs[0]); j++) {
                assert_true(strlen(jobs[j]) < 500);
                assert_string_equal(ask(&s, jobs[j]), "exit 0");
        }
        const char *dir = cove_runtime_ns.layer_dir(rt);
        long seen = 0;
        char *buf = malloc(8 << 20);
        assert_non_null(buf);
        for (int i = 0; i < N; i++) {
                /* the writer moved on since the last snapshot */
                int64_t dl = cove_mono_ns() + 20 * 1000000000LL;
                long before;
                while ((before = log_size(&s)) < (seen + 8) * REC && cove_mono_ns() < dl)
                        usleep(2000);
                assert_true(before >= (seen + 8) * REC);
                char snap[PATH_MAX];
                snprintf(snap, sizeof(snap), "%s/crash-%s-%d.img", dir, s.id, i);
                uint64_t pause = 0;
                if (cove_runtime_ns.layer_snapshot(rt, &s.inst, s.id, snap, &pause, &err) < 0)
                        fail_msg("snapshot %d: %s", i, err.msg);
                sh("e2fsck -fn %s > %s.fsck 2>&1 || { cat %s.fsck; exit 1; }; rm %s.fsck", snap,
                   snap, snap, snap);
                int tfd = -1;
                struct cove_layer_handle *h = NULL;
                if (cove_runtime_ns.layer_open(rt, snap, 0, 0, NULL, &tfd, &h, &err) < 0)
                        fail_msg("layer_open %d: %s", i, err.msg);
                int fd = openat(tfd, "log", O_RDONLY | O_CLOEXEC);
                assert_true(fd >= 0);
                size_t n = 0;
                ssize_t r;
                while ((r = read(fd, buf + n, (8 << 20) - n)) > 0)
                        n += (size_t)r;
                assert_true(r == 0);
                close(fd);
                close(tfd);
                cove_runtime_ns.layer_close(rt, h);
                long recs = log_records(buf, n);
                print_message("[  NOTE    ] snapshot %d under writes: pause %.2f ms, %ld records "
                              "(%ld before it began)\n",
                              i, pause / 1e6, recs, before / REC);
                assert_true(recs >= before / REC);
                seen = recs;
                assert_int_equal(unlink(snap), 0);
        }
        free(buf);
        stop(&s);
        assert_int_equal(wait_loops(dir, 0), 0);
}

/* Figures, not assertions: the pause of rolling snapshots of a sandbox with 100 MB written
 * (a little more written before each, and 200 ms between them as a rolling schedule would
 * leave), and start() of a sandbox from each snapshot (a local resume). */
static void snapshot_pause(void **state)
{
        (void)state;
        need_root();
        enum { N = 20 };
        int64_t pause[N], st[N];
        struct cove_err err;
        struct sbx s;
        spec_init(&s);
        s.spec.disk_mb = 1024;
        start(&s);
        assert_int_equal(ask_int(&s, "fill 100 /big"), 0);
        const char *dir = cove_runtime_ns.layer_dir(rt);
        for (int i = 0; i < N; i++) {
                char cmd[64], snap[PATH_MAX];
                snprintf(cmd, sizeof(cmd), "fill 1 /f%d", i);
                assert_int_equal(ask_int(&s, cmd), 0);
                usleep(200000);
                snprintf(snap, sizeof(snap), "%s/snap-%s-%d.img", dir, s.id, i);
                uint64_t ns = 0;
                if (cove_runtime_ns.layer_snapshot(rt, &s.inst, s.id, snap, &ns, &err) < 0)
                        fail_msg("snapshot: %s", err.msg);
                pause[i] = (int64_t)ns;
                struct sbx r;
                spec_init(&r);
                r.spec.disk_mb = 1024;
                r.spec.layer_image = snap;
                st[i] = start(&r);
                assert_string_equal(ask(&r, "stat /big"), "0 0 100644 104857600");
                stop(&r);
        }
        stop(&s);
        qsort(pause, N, sizeof(pause[0]), cmp64);
        qsort(st, N, sizeof(st[0]), cmp64);
        print_message("layer_snapshot pause, 100 MB written: p50 %.2f ms, p90 %.2f ms, min %.2f "
                      "ms, max %.2f ms (n=%d)\n",
                      pause[N / 2] / 1e6, pause[N * 9 / 10] / 1e6, pause[0] / 1e6,
                      pause[N - 1] / 1e6, N);
        print_message("start() with a layer image: p50 %.2f ms, p90 %.2f ms, max %.2f ms (n=%d)\n",
                      st[N / 2] / 1e6, st[N * 9 / 10] / 1e6, st[N - 1] / 1e6, N);
}

int main(void)
{
        /* these tests count the mounts under the data dir: no lxcfs mount among them (the
         * views are tested by tests/security/test_ns_isolation.py) */
        setenv("COVE_LXCFS", "off", 1);
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(identity),
            cmocka_unit_test(walls),
            cmocka_unit_test(disk_limit),
            cmocka_unit_test(memory_limit),
            cmocka_unit_test(pids_limit),
            cmocka_unit_test(freeze_thaw),
            cmocka_unit_test(stop_leaves_nothing),
            cmocka_unit_test(exec_failure),
            cmocka_unit_test(stale_after_parent_killed),
            cmocka_unit_test(pool_warm_layers),
            cmocka_unit_test(pool_after_crash),
            cmocka_unit_test(snapshot_restore),
            cmocka_unit_test(restore_on_open_layer),
            cmocka_unit_test(snapshot_under_writes),
            cmocka_unit_test(snapshot_pause),
            cmocka_unit_test(start_latency),
        };
        return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
