/* CRIU runner and the user namespace map rewrite (runtime/criu.h). */
#include "runtime/criu.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/close_range.h>
#include <linux/kcmp.h>
#include <linux/openat2.h>

#include "util/cleanup.h"
#include "util/util.h"

#define ARGS_MAX 48

/* ---- running criu ---- */

struct run {
        char *argv[ARGS_MAX];
        int argc;
        char bufs[ARGS_MAX][PATH_MAX + 64];
};

static void arg(struct run *r, const char *fmt, const char *s)
{
        if (r->argc >= ARGS_MAX - 1)
                return;
        snprintf(r->bufs[r->argc], sizeof(r->bufs[0]), fmt, s);
        r->argv[r->argc] = r->bufs[r->argc];
        r->argc++;
        r->argv[r->argc] = NULL;
}

static void tail_log(const char *log, char *out, size_t cap)
{
        /* the first "Error" line of criu's log that is not noise says what went wrong */
        out[0] = 0;
        FILE *f = fopen(log, "re");
        if (!f)
                return;
        char line[512];
        while (fgets(line, sizeof(line), f)) {
                if (!strstr(line, "Error (") || strstr(line, "RLIMIT_NOFILE") ||
                    strstr(line, "tables") || strstr(line, "cgroupd") || strstr(line, "FAILED"))
                        continue;
                line[strcspn(line, "\n")] = 0;
                snprintf(out, cap, "%s", line);
                break;
        }
        fclose(f);
}

/* fork + exec criu with fd keep_fd (or -1) as fd 3; bounded by timeout_ms. Returns criu's
 * exit status (0 ok) or -1 with err. */
static int run_criu(const struct cove_criu *c, struct run *r, int keep_fd, int timeout_ms,
                    cove_criu_prep_fn prep, void *prep_arg, const char *log, struct cove_err *err)
{
        char *const envp[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                              "CRIU_FAULT=130", NULL};
        int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
        int go[2];
        if (devnull < 0 || pipe2(go, O_CLOEXEC) < 0) {
                if (devnull >= 0)
                        close(devnull);
                return cove_err_set(err, errno, "criu: prepare");
        }
        pid_t pid = fork();
        if (pid < 0) {
                int e = errno;
                close(devnull);
                close(go[0]);
                close(go[1]);
                return cove_err_set(err, e, "criu: fork");
        }
        if (pid == 0) {
                /* async-signal-safe only: coved is multi-threaded */
                setpgid(0, 0);
                /* criu dies with coved: one left running (a restore of a coved killed -9
                 * runs on, or hangs, with nobody to bound it) keeps its copy of the host's
                 * mounts, every sandbox layer mounted then among them, and so their loop
                 * devices. A parent dead before this: no "g" on the pipe (EOF) */
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                char b;
                close(go[1]);
                if (read(go[0], &b, 1) != 1)
                        _exit(126);
                if (dup2(devnull, 0) < 0 || dup2(devnull, 1) < 0 || dup2(devnull, 2) < 0)
                        _exit(126);
                if (keep_fd >= 0 && dup2(keep_fd, 3) < 0)
                        _exit(126);
                syscall(SYS_close_range, keep_fd >= 0 ? 4 : 3, ~0U, CLOSE_RANGE_CLOEXEC);
                execve(c->path, r->argv, envp);
                _exit(127);
        }
        close(go[0]);
        close(devnull);
        setpgid(pid, pid);
        if (prep && prep(prep_arg, pid, err) < 0) {
                close(go[1]);
                kill(pid, SIGKILL);
                while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
                        ;
                return -1;
        }
        if (write(go[1], "g", 1) != 1) {
                /* the child is gone already: its status says why */
        }
        close(go[1]);
        /* bounded: poll the child's pidfd until it exits or the deadline passes */
        int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
        int64_t deadline = cove_mono_ns() + (int64_t)timeout_ms * 1000000;
        int timed_out = 1;
        while (pfd >= 0) {
                int64_t left = (deadline - cove_mono_ns()) / 1000000;
                if (left <= 0)
                        break;
                struct pollfd p = {.fd = pfd, .events = POLLIN};
                if (poll(&p, 1, (int)(left > 1000 ? 1000 : left)) > 0) {
                        timed_out = 0;
                        break;
                }
        }
        if (pfd >= 0)
                close(pfd);
        if (timed_out) {
                kill(-pid, SIGKILL); /* criu and its helpers: SIGTERM does not stop a hung one */
                kill(pid, SIGKILL);
        }
        int st = 0;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
                ;
        if (timed_out)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, ETIMEDOUT,
                                     "criu %s: no answer within %d s (killed)", r->argv[1],
                                     timeout_ms / 1000);
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
                return 0;
        char why[320];
        tail_log(log, why, sizeof(why));
        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0, "criu %s failed (%s %d)%s%s", r->argv[1],
                             WIFEXITED(st) ? "exit" : "signal",
                             WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), why[0] ? ": " : "",
                             why);
}

static int version_of(const char *path, char *out, size_t cap)
{
        char cmd[PATH_MAX + 64];
        snprintf(cmd, sizeof(cmd), "'%s' --version 2>/dev/null", path);
        FILE *p = popen(cmd, "re");
        if (!p)
                return -1;
        char line[128];
        int ok = -1;
        while (fgets(line, sizeof(line), p))
                if (!strncmp(line, "Version: ", 9)) {
                        line[strcspn(line, "\n")] = 0;
                        snprintf(out, cap, "%s", line + 9);
                        ok = 0;
                }
        pclose(p);
        return ok;
}

void cove_criu_detect(struct cove_criu *c)
{
        memset(c, 0, sizeof(*c));
        const char *env = getenv("COVE_CRIU");
        if (env && (!strcmp(env, "off") || !*env)) {
                snprintf(c->why, sizeof(c->why), "criu hidden (COVE_CRIU=off)");
                return;
        }
        static const char *const cands[] = {"/usr/local/sbin/criu", "/usr/local/lib/cove/criu/criu",
                                            "/usr/sbin/criu", "/sbin/criu"};
        if (env) {
                if (env[0] != '/' || access(env, X_OK) < 0) {
                        snprintf(c->why, sizeof(c->why), "COVE_CRIU=%s: not an executable path",
                                 env);
                        return;
                }
                snprintf(c->path, sizeof(c->path), "%s", env);
        } else {
                for (size_t i = 0; i < COVE_ARRAY_SIZE(cands) && !c->path[0]; i++)
                        if (access(cands[i], X_OK) == 0)
                                snprintf(c->path, sizeof(c->path), "%s", cands[i]);
                if (!c->path[0]) {
                        snprintf(c->why, sizeof(c->why), "criu not installed");
                        return;
                }
        }
        if (version_of(c->path, c->version, sizeof(c->version)) < 0 || atoi(c->version) < 4) {
                snprintf(c->why, sizeof(c->why), "%s: version %s, want >= 4", c->path,
                         c->version[0] ? c->version : "unknown");
                c->path[0] = 0;
                return;
        }
        struct run r = {.argc = 0};
        arg(&r, "%s", c->path);
        arg(&r, "%s", "check");
        struct cove_err e;
        if (run_criu(c, &r, -1, 20000, NULL, NULL, "/dev/null", &e) < 0) {
                snprintf(c->why, sizeof(c->why), "criu %s: `criu check` failed", c->version);
                return;
        }
        c->found = 1;
}

/* criu runs it for every action (CRTOOLS_SCRIPT_ACTION); at setup-namespaces the restored
 * root's namespaces exist and nothing restored runs yet. */
static const char action_script[] =
    "#!/bin/sh\n"
    "# written by coved (runtime/criu.c): a restored sandbox's network namespace is empty\n"
    "[ \"$CRTOOLS_SCRIPT_ACTION\" = setup-namespaces ] || exit 0\n"
    "exec nsenter --net=\"/proc/$CRTOOLS_INIT_PID/ns/net\" ip link set lo up\n";

void cove_criu_setup(struct cove_criu *c, const char *dir)
{
        if (!c->found)
                return;
        struct cove_err e;
        if (snprintf(c->action, sizeof(c->action), "%s/criu-action.sh", dir) >=
                (int)sizeof(c->action) ||
            cove_write_file_atomic(dir, "criu-action.sh", action_script, sizeof(action_script) - 1,
                                   0700, &e) < 0) {
                snprintf(c->why, sizeof(c->why), "criu action script in %s: cannot write it", dir);
                c->found = 0;
        }
}

int cove_criu_dump(const struct cove_criu *c, pid_t pid, const char *dir, const char *freezer_dir,
                   uint64_t chan_ino, struct cove_err *err)
{
        if (!c->found)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0, "criu unavailable: %s", c->why);
        struct run *r = calloc(1, sizeof(*r));
        if (!r)
                return cove_err_set(err, ENOMEM, "criu dump");
        char num[32], ext[64], log[PATH_MAX];
        snprintf(num, sizeof(num), "%d", (int)pid);
        snprintf(ext, sizeof(ext), "unix[%llu]", (unsigned long long)chan_ino);
        snprintf(log, sizeof(log), "%s/dump.log", dir);
        arg(r, "%s", c->path);
        arg(r, "%s", "dump");
        arg(r, "-t%s", num);
        arg(r, "-D%s", dir);
        arg(r, "%s", "-odump.log");
        arg(r, "%s", "-v2");
        arg(r, "--external=%s", ext);     /* the guest channel: the node's end is outside */
        arg(r, "%s", "--external=mnt[]"); /* /dev nodes and cove-guest: binds of host files */
        arg(r, "%s", "--manage-cgroups=ignore");
        arg(r, "--freeze-cgroup=%s", freezer_dir);
        /* no network lock: connections are not dumped (--tcp-close) and the namespace's
         * set-up is not either (--empty-ns net), so there is nothing to hold still; a lock
         * is an nftables table criu leaves behind, in the host's namespace too, when a run
         * fails or dies */
        arg(r, "%s", "--network-lock=skip");
        arg(r, "%s", "--empty-ns=net");
        arg(r, "%s", "--tcp-close");
        arg(r, "%s", "--ghost-limit=64M");
        arg(r, "%s", "--leave-running");
        int rc = run_criu(c, r, -1, COVE_CRIU_TIMEOUT_MS, NULL, NULL, log, err);
        free(r);
        return rc;
}

int cove_criu_restore(const struct cove_criu *c, const char *dir, const char *root, int chan_fd,
                      uint64_t chan_ino, cove_criu_prep_fn prep, void *prep_arg, pid_t *pid,
                      struct cove_err *err)
{
        if (!c->found)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0, "criu unavailable: %s", c->why);
        struct run *r = calloc(1, sizeof(*r));
        if (!r)
                return cove_err_set(err, ENOMEM, "criu restore");
        char inh[64], pidf[PATH_MAX], log[PATH_MAX];
        snprintf(inh, sizeof(inh), "fd[3]:socket:[%llu]", (unsigned long long)chan_ino);
        snprintf(pidf, sizeof(pidf), "%s/restore.pid", dir);
        snprintf(log, sizeof(log), "%s/restore.log", dir);
        unlink(pidf);
        arg(r, "%s", c->path);
        arg(r, "%s", "restore");
        arg(r, "-D%s", dir);
        arg(r, "%s", "-orestore.log");
        arg(r, "%s", "-v2");
        arg(r, "--root=%s", root);
        arg(r, "--inherit-fd=%s", inh);
        arg(r, "%s", "--external=mnt[]");
        arg(r, "%s", "--manage-cgroups=ignore");
        arg(r, "%s", "--network-lock=skip"); /* as for the dump */
        arg(r, "%s", "--empty-ns=net");
        arg(r, "%s", "--tcp-close");
        arg(r, "--action-script=%s", c->action);
        arg(r, "--pidfile=%s", pidf);
        arg(r, "%s", "--restore-detached");
        arg(r, "%s", "--restore-sibling");
        int rc = run_criu(c, r, chan_fd, COVE_CRIU_TIMEOUT_MS, prep, prep_arg, log, err);
        free(r);
        if (rc < 0)
                return -1;
        char buf[32] = "";
        cleanup_close int fd = open(pidf, O_RDONLY | O_CLOEXEC);
        ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof(buf) - 1);
        long v = n > 0 ? (buf[n] = 0, strtol(buf, NULL, 10)) : 0;
        if (v <= 1 || v > INT_MAX)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0, "criu restore: no pid file");
        *pid = (pid_t)v;
        return 0;
}

/* ---- what a restore could not re-create safely (cove_criu_restorable) ---- */

#define DEL_SUFFIX " (deleted)"
#define CG_DEPTH_MAX 16

struct rcheck {
        dev_t shm_dev;   /* the kernel's internal shmem mount: memfd, MAP_SHARED|ANON, SysV */
        ino_t mnt_ns;    /* init's mount namespace */
        uint64_t mounts; /* init's mount table at start */
        struct cove_err *err;
};

static int deleted(const char *link)
{
        size_t n = strlen(link), k = sizeof(DEL_SUFFIX) - 1;
        return n >= k && !strcmp(link + n - k, DEL_SUFFIX);
}

static int refuse(struct rcheck *c, pid_t pid, const char *what)
{
        /* no path in the message: the sandbox chose it */
        return cove_err_setk(c->err, COVE_E_UNAVAILABLE, 0,
                             "process %d %s, which a restore would re-create by a path the "
                             "sandbox can point outside it",
                             (int)pid, what);
}

/* a unix socket's bound name must lead to it, inside the process's root, through no symlink:
 * criu binds that name again at restore */
static int check_unix_name(struct rcheck *c, pid_t pid, int pidfd, int fd)
{
        int s = (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
        if (s < 0)
                return errno == EBADF ? 0 : refuse(c, pid, "has a socket coved cannot inspect");
        struct sockaddr_un a;
        socklen_t len = sizeof(a);
        memset(&a, 0, sizeof(a));
        int r = getsockname(s, (struct sockaddr *)&a, &len);
        close(s);
        if (r < 0 || a.sun_family != AF_UNIX || len <= offsetof(struct sockaddr_un, sun_path) ||
            a.sun_path[0] == 0) /* not unix, unbound, or abstract: no path */
                return 0;
        size_t n = len - offsetof(struct sockaddr_un, sun_path);
        char name[sizeof(a.sun_path) + 1];
        memcpy(name, a.sun_path, n < sizeof(a.sun_path) ? n : sizeof(a.sun_path));
        name[n < sizeof(a.sun_path) ? n : sizeof(a.sun_path)] = 0;
        if (name[0] != '/')
                return refuse(c, pid, "has a unix socket bound to a relative name");
        char rp[64];
        snprintf(rp, sizeof(rp), "/proc/%d/root", (int)pid);
        cleanup_close int root = open(rp, O_PATH | O_DIRECTORY | O_CLOEXEC);
        struct open_how how = {.flags = O_PATH | O_NOFOLLOW | O_CLOEXEC,
                               .resolve =
                                   RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS};
        const char *rel = name;
        while (*rel == '/')
                rel++;
        cleanup_close int f =
            root < 0 ? -1 : (int)syscall(SYS_openat2, root, *rel ? rel : ".", &how, sizeof(how));
        struct stat st;
        if (f < 0 || fstat(f, &st) < 0 || !S_ISSOCK(st.st_mode))
                return refuse(c, pid,
                              "has a unix socket whose name is gone or goes through a symlink");
        return 0;
}

static int check_fds(struct rcheck *c, pid_t pid, pid_t tid, int pidfd)
{
        char p[96];
        snprintf(p, sizeof(p), "/proc/%d/task/%d/fd", (int)pid, (int)tid);
        cleanup_dir DIR *d = opendir(p);
        if (!d)
                return errno == ENOENT ? 0 : cove_err_set(c->err, errno, "criu check: %s", p);
        struct dirent *de;
        while ((de = readdir(d))) {
                if (de->d_name[0] == '.')
                        continue;
                char lp[PATH_MAX + 32];
                ssize_t n = readlinkat(dirfd(d), de->d_name, lp, sizeof(lp) - 1);
                if (n < 0)
                        continue; /* closed meanwhile (not in a frozen tree, but harmless) */
                lp[n] = 0;
                if (!strncmp(lp, "socket:[", 8)) {
                        if (check_unix_name(c, pid, pidfd, atoi(de->d_name)) < 0)
                                return -1;
                        continue;
                }
                if (!deleted(lp))
                        continue;
                struct stat st;
                if (fstatat(dirfd(d), de->d_name, &st, 0) == 0 && st.st_dev == c->shm_dev)
                        continue; /* a memfd */
                return refuse(c, pid, "holds a deleted file open");
        }
        return 0;
}

static int check_maps(struct rcheck *c, pid_t pid)
{
        char p[64];
        snprintf(p, sizeof(p), "/proc/%d/maps", (int)pid);
        FILE *f = fopen(p, "re");
        if (!f)
                return errno == ENOENT ? 0 : cove_err_set(c->err, errno, "criu check: %s", p);
        char *line = NULL;
        size_t cap = 0;
        int rc = 0;
        while (rc == 0 && getline(&line, &cap, f) > 0) {
                line[strcspn(line, "\n")] = 0;
                unsigned maj = 0, min = 0;
                if (!deleted(line))
                        continue;
                if (sscanf(line, "%*s %*s %*s %x:%x", &maj, &min) != 2 ||
                    makedev(maj, min) != c->shm_dev)
                        rc = refuse(c, pid, "maps a deleted file");
        }
        free(line);
        fclose(f);
        return rc;
}

static int check_proc(struct rcheck *c, pid_t pid)
{
        char p[96];
        struct stat st;
        snprintf(p, sizeof(p), "/proc/%d/ns/mnt", (int)pid);
        if (stat(p, &st) < 0)
                return errno == ENOENT ? 0 : cove_err_set(c->err, errno, "criu check: %s", p);
        if (st.st_ino != c->mnt_ns)
                return refuse(c, pid, "runs in a mount namespace of its own");
        if (check_maps(c, pid) < 0)
                return -1;
        cleanup_close int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
        if (pidfd < 0)
                return errno == ESRCH ? 0 : cove_err_set(c->err, errno, "criu check: pidfd");
        snprintf(p, sizeof(p), "/proc/%d/task", (int)pid);
        cleanup_dir DIR *d = opendir(p);
        if (!d)
                return errno == ENOENT ? 0 : cove_err_set(c->err, errno, "criu check: %s", p);
        struct dirent *de;
        while ((de = readdir(d))) {
                if (de->d_name[0] == '.')
                        continue;
                pid_t tid = (pid_t)atoi(de->d_name);
                if (tid != pid && syscall(SYS_kcmp, pid, tid, KCMP_FILES, 0, 0) != 0)
                        return refuse(c, pid, "has a thread with a file table of its own");
                if (tid == pid && check_fds(c, pid, tid, pidfd) < 0)
                        return -1;
                for (const char *const *w = (const char *const[]){"cwd", "root", NULL}; *w; w++) {
                        char lp[PATH_MAX + 32], q[96];
                        snprintf(q, sizeof(q), "/proc/%d/task/%d/%s", (int)pid, (int)tid, *w);
                        ssize_t n = readlink(q, lp, sizeof(lp) - 1);
                        if (n >= 0 && (lp[n] = 0, deleted(lp)))
                                return refuse(c, pid,
                                              !strcmp(*w, "cwd") ? "has a deleted working directory"
                                                                 : "has a deleted root directory");
                }
        }
        return 0;
}

static int check_cgroup(struct rcheck *c, int dfd, int depth)
{
        if (depth > CG_DEPTH_MAX)
                return cove_err_setk(c->err, COVE_E_UNAVAILABLE, 0,
                                     "criu check: cgroups nested too deep");
        cleanup_close int pf = openat(dfd, "cgroup.procs", O_RDONLY | O_CLOEXEC);
        FILE *f = pf < 0 ? NULL : fdopen(pf, "re");
        if (!f)
                return cove_err_set(c->err, errno, "criu check: cgroup.procs");
        pf = -1;
        long v;
        int rc = 0;
        while (rc == 0 && fscanf(f, "%ld", &v) == 1)
                if (v > 0 && v <= INT_MAX)
                        rc = check_proc(c, (pid_t)v);
        fclose(f);
        if (rc < 0)
                return -1;
        int d2 = dup(dfd);
        cleanup_dir DIR *d = d2 < 0 ? NULL : fdopendir(d2);
        if (!d) {
                if (d2 >= 0)
                        close(d2);
                return cove_err_set(c->err, errno, "criu check: cgroup dir");
        }
        struct dirent *de;
        while ((de = readdir(d))) {
                if (de->d_name[0] == '.' || de->d_type != DT_DIR)
                        continue;
                cleanup_close int sub =
                    openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                if (sub >= 0 && check_cgroup(c, sub, depth + 1) < 0)
                        return -1;
        }
        return 0;
}

int cove_criu_images_safe(const char *dir, struct cove_err *err)
{
        cleanup_dir DIR *d = opendir(dir);
        if (!d)
                return cove_err_set(err, errno, "criu images %s", dir);
        struct dirent *de;
        while ((de = readdir(d)))
                if (!strncmp(de->d_name, "ghost-file-", 11) ||
                    !strcmp(de->d_name, "remap-fpath.img"))
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                             "the checkpoint holds a deleted file, which a "
                                             "restore would re-create by a path the sandbox "
                                             "can point outside it: not restored (an earlier "
                                             "files snapshot still is)");
        return 0;
}

uint64_t cove_criu_mounts(pid_t pid)
{
        char p[64];
        snprintf(p, sizeof(p), "/proc/%d/mountinfo", (int)pid);
        cleanup_close int fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return 0;
        uint64_t h = 1469598103934665603ULL; /* FNV-1a */
        char buf[8192];
        ssize_t n;
        while ((n = read(fd, buf, sizeof(buf))) > 0)
                for (ssize_t i = 0; i < n; i++)
                        h = (h ^ (uint8_t)buf[i]) * 1099511628211ULL;
        return n < 0 ? 0 : h | 1;
}

int cove_criu_restorable(const char *cgroup_dir, pid_t init, uint64_t mounts, struct cove_err *err)
{
        struct rcheck c = {.mounts = mounts, .err = err};
        struct stat st;
        cleanup_close int m = (int)syscall(SYS_memfd_create, "cove-criu-check", MFD_CLOEXEC);
        if (m < 0 || fstat(m, &st) < 0)
                return cove_err_set(err, errno, "criu check: memfd");
        c.shm_dev = st.st_dev;
        char p[64];
        snprintf(p, sizeof(p), "/proc/%d/ns/mnt", (int)init);
        if (stat(p, &st) < 0)
                return cove_err_set(err, errno, "criu check: %s", p);
        c.mnt_ns = st.st_ino;
        if (!mounts || cove_criu_mounts(init) != mounts)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "the sandbox changed its mounts, which a restore would "
                                     "re-create by paths the sandbox can point outside it");
        cleanup_close int dfd = open(cgroup_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return cove_err_set(err, errno, "criu check: %s", cgroup_dir);
        return check_cgroup(&c, dfd, 0);
}

static int pwrite_all(int fd, const void *buf, size_t n, off_t off)
{
        const char *p = buf;
        while (n) {
                ssize_t w = pwrite(fd, p, n, off);
                if (w < 0 && errno == EINTR)
                        continue;
                if (w <= 0)
                        return -1;
                p += w;
                n -= (size_t)w;
                off += w;
        }
        return 0;
}

/* ---- user namespace map rewrite (userns-N.img: UsernsEntry{repeated UidGidExtent
 * uid_map = 1, gid_map = 2}, UidGidExtent{first = 1, lower_first = 2, count = 3}) ---- */

static int varint(const uint8_t *b, size_t n, size_t *p, uint64_t *v)
{
        *v = 0;
        for (int s = 0; s < 64; s += 7) {
                if (*p >= n)
                        return -1;
                uint8_t c = b[(*p)++];
                *v |= (uint64_t)(c & 0x7f) << s;
                if (!(c & 0x80))
                        return 0;
        }
        return -1;
}

static size_t put_varint(uint8_t *b, uint64_t v)
{
        size_t n = 0;
        do {
                uint8_t c = v & 0x7f;
                v >>= 7;
                b[n++] = c | (v ? 0x80 : 0);
        } while (v);
        return n;
}

int cove_criu_userns_rebase(const char *dir, uint32_t from, uint32_t to, struct cove_err *err)
{
        if (from == to)
                return 0;
        cleanup_dir DIR *d = opendir(dir);
        if (!d)
                return cove_err_set(err, errno, "criu rebase: %s", dir);
        struct dirent *de;
        int done = 0;
        while ((de = readdir(d))) {
                if (strncmp(de->d_name, "userns-", 7))
                        continue;
                uint8_t in[4096], out[4096];
                cleanup_close int fd = openat(dirfd(d), de->d_name, O_RDWR | O_CLOEXEC);
                ssize_t n = fd < 0 ? -1 : pread(fd, in, sizeof(in), 0);
                if (n < 12 || n == (ssize_t)sizeof(in))
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, EBADMSG,
                                             "criu rebase: %s unreadable", de->d_name);
                uint32_t len = (uint32_t)in[8] | (uint32_t)in[9] << 8 | (uint32_t)in[10] << 16 |
                               (uint32_t)in[11] << 24;
                if ((size_t)len + 12 != (size_t)n)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, EBADMSG,
                                             "criu rebase: %s: one entry expected", de->d_name);
                const uint8_t *b = in + 12;
                size_t p = 0, o = 12;
                memcpy(out, in, 8);
                while (p < len) {
                        uint64_t key, sl;
                        if (varint(b, len, &p, &key) < 0 || (key != 0x0a && key != 0x12) ||
                            varint(b, len, &p, &sl) < 0 || sl > len - p)
                                goto bad;
                        uint8_t sub[64];
                        size_t so = 0, end = p + sl;
                        while (p < end) {
                                uint64_t k, val;
                                if (varint(b, end, &p, &k) < 0 || (k & 7) != 0 ||
                                    varint(b, end, &p, &val) < 0 || so + 20 > sizeof(sub))
                                        goto bad;
                                if (k >> 3 == 2 && val >= from && val < (uint64_t)from + 65536)
                                        val = val - from + to;
                                so += put_varint(sub + so, k);
                                so += put_varint(sub + so, val);
                        }
                        if (o + 2 + so > sizeof(out))
                                goto bad;
                        out[o++] = (uint8_t)key;
                        o += put_varint(out + o, so);
                        memcpy(out + o, sub, so);
                        o += so;
                }
                uint32_t nl = (uint32_t)(o - 12);
                out[8] = (uint8_t)nl;
                out[9] = (uint8_t)(nl >> 8);
                out[10] = (uint8_t)(nl >> 16);
                out[11] = (uint8_t)(nl >> 24);
                if (ftruncate(fd, 0) < 0 || pwrite_all(fd, out, o, 0) < 0)
                        return cove_err_set(err, errno, "criu rebase: write %s", de->d_name);
                done = 1;
        }
        if (!done)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, ENOENT,
                                     "criu rebase: no user namespace image");
        return 0;
bad:
        return cove_err_setk(err, COVE_E_UNAVAILABLE, EBADMSG, "criu rebase: malformed image");
}
