/* Template builds and lookups: busybox (a copy of the host's static busybox plus applet
 * links) and base (Debian 12 minbase by debootstrap). Builds go into a private .build-*
 * directory and are renamed into place only when complete; external tools run by
 * fork/exec with a fixed environment, a bounded wait and their output tail kept for errors.
 */
#include "control/template.h"
#include "control/template_internal.h"

#include <ctype.h>
#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "util/cleanup.h"
#include "util/util.h"

#define TPL_PATH_MAX 4096
#define TAIL_MAX 1024
#define BUSYBOX_SRC "/bin/busybox"
#define BUSYBOX_TIMEOUT_S 60
#define DEBOOTSTRAP_TIMEOUT_S (60 * 60)
#define STEP_TIMEOUT_S 300
#define DEFAULT_MIRROR "http://deb.debian.org/debian"
#define BASE_SUITE "bookworm"
#define BASE_INCLUDE "bash,python3,git,curl,ca-certificates,procps,sudo"
/* code-interpreter: base plus a real Jupyter kernel and the usual data libraries, and
 * Node.js for JavaScript cells (docs/code-interpreter.md), installed with apt-get inside
 * the new rootfs (debootstrap --include cannot configure python3-zmq in its first stage) */
static const char *const INTERP_PACKAGES[] = {"python3-ipykernel",
                                              "python3-jupyter-client",
                                              "python3-matplotlib-inline",
                                              "python3-numpy",
                                              "python3-pandas",
                                              "python3-matplotlib",
                                              "nodejs",
                                              NULL};

/* Fixed PATH for tools run at build time: never the caller's. */
static const char *const tool_path[] = {"/usr/local/sbin", "/usr/local/bin", "/usr/sbin",
                                        "/usr/bin",        "/sbin",          "/bin"};
static char *const tool_env[] = {
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LC_ALL=C",
    "DEBIAN_FRONTEND=noninteractive",
    "DEBCONF_NONINTERACTIVE_SEEN=true",
    "HOME=/root",
    NULL,
};

struct build_ctx {
        const char *name;
        const char *rootfs; /* <build dir>/rootfs */
        cove_progress_fn progress;
        void *arg;
        char source[256];       /* filled by the builder for meta.json */
        const char *last_stage; /* to report only changes */
        int last_percent;
};

static void report(struct build_ctx *b, const char *stage, int percent)
{
        if (!b->progress)
                return;
        if (b->last_stage && strcmp(b->last_stage, stage) == 0 && b->last_percent == percent)
                return;
        b->last_stage = stage;
        b->last_percent = percent;
        b->progress(b->arg, stage, percent);
}

static int valid_name(const char *name)
{
        size_t n = name ? strlen(name) : 0;
        if (n == 0 || n >= COVE_TEMPLATE_NAME_MAX ||
            !(islower((unsigned char)name[0]) || isdigit((unsigned char)name[0])))
                return 0;
        for (size_t i = 0; i < n; i++) {
                unsigned char c = (unsigned char)name[i];
                if (!(islower(c) || isdigit(c) || c == '-' || c == '_' || c == '.'))
                        return 0;
        }
        return 1;
}

int cove_template_known(const char *name)
{
        return name && (strcmp(name, "busybox") == 0 || strcmp(name, "base") == 0 ||
                        strcmp(name, "code-interpreter") == 0);
}

static int pathf(char *out, size_t cap, struct cove_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int pathf(char *out, size_t cap, struct cove_err *err, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(out, cap, fmt, ap);
        va_end(ap);
        if (n < 0 || (size_t)n >= cap)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, ENAMETOOLONG, "path too long");
        return 0;
}

/* ---- running host tools ------------------------------------------------------------- */

static int find_tool(const char *name, char *out, size_t cap)
{
        for (size_t i = 0; i < COVE_ARRAY_SIZE(tool_path); i++) {
                if (snprintf(out, cap, "%s/%s", tool_path[i], name) >= (int)cap)
                        continue;
                if (access(out, X_OK) == 0)
                        return 0;
        }
        return -1;
}

typedef void (*line_fn)(void *arg, char *line);

/* Append to a bounded tail buffer (keeps the last TAIL_MAX-1 bytes). */
static void tail_add(char *tail, const char *data, size_t len)
{
        size_t have = strlen(tail);
        if (len >= TAIL_MAX - 1) {
                memcpy(tail, data + len - (TAIL_MAX - 1), TAIL_MAX - 1);
                tail[TAIL_MAX - 1] = '\0';
                return;
        }
        if (have + len >= TAIL_MAX) {
                size_t drop = have + len - (TAIL_MAX - 1);
                memmove(tail, tail + drop, have - drop + 1);
                have -= drop;
        }
        memcpy(tail + have, data, len);
        tail[have + len] = '\0';
}

/* Trim the tail to its last few non-empty lines for an error message. */
static const char *tail_msg(char *tail)
{
        size_t n = strlen(tail);
        while (n > 0 && isspace((unsigned char)tail[n - 1]))
                tail[--n] = '\0';
        const char *p = tail + n;
        int lines = 0;
        while (p > tail && lines < 4) {
                p--;
                if (*p == '\n')
                        lines++;
        }
        if (*p == '\n')
                p++;
        for (char *q = (char *)p; *q; q++)
                if (*q == '\n')
                        *q = ' ';
        return *p ? p : "(no output)";
}

/* Run argv[0] (an absolute path) with tool_env, stdin from /dev/null and stdout+stderr
 * into one pipe that is read line by line (fn may be NULL). The child gets its own process
 * group (killed whole on timeout) and SIGKILL when this thread dies. Returns 0 when it
 * exits 0; otherwise -1 with "<tool>: exited with N: <output tail>". */
static int run_tool_env(char *const argv[], char *const envp[], int timeout_s, line_fn fn,
                        void *arg, cove__tpl_tick_fn tick, void *tick_arg, struct cove_err *err)
{
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0)
                return cove_err_set(err, errno, "%s: pipe", argv[0]);
        pid_t parent = getpid();
        pid_t pid = fork();
        if (pid < 0) {
                int e = errno;
                close(p[0]);
                close(p[1]);
                return cove_err_set(err, e, "%s: fork", argv[0]);
        }
        if (pid == 0) {
                /* async-signal-safe calls only from here on */
                setpgid(0, 0);
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                if (getppid() != parent)
                        _exit(127);
                int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
                if (nul < 0 || dup2(nul, 0) < 0 || dup2(p[1], 1) < 0 || dup2(p[1], 2) < 0)
                        _exit(127);
                sigset_t none;
                sigemptyset(&none);
                sigprocmask(SIG_SETMASK, &none, NULL);
                signal(SIGPIPE, SIG_DFL);
                execve(argv[0], argv, envp);
                _exit(127);
        }
        close(p[1]);

        char tail[TAIL_MAX] = "";
        char line[4096];
        size_t ll = 0;
        int64_t deadline = cove_mono_ns() + (int64_t)timeout_s * 1000000000LL;
        int timed_out = 0, stopped = 0;
        int64_t next_tick = cove_mono_ns() + 1000000000LL;
        struct cove_err tick_err_s;
        struct cove_err *tick_err = &tick_err_s;
        memset(tick_err, 0, sizeof *tick_err);
        for (;;) {
                int64_t left_ms = (deadline - cove_mono_ns()) / 1000000;
                if (left_ms <= 0) {
                        timed_out = 1;
                        break;
                }
                struct pollfd pfd = {.fd = p[0], .events = POLLIN};
                int r = poll(&pfd, 1, left_ms > 1000 ? 1000 : (int)left_ms);
                if (r < 0 && errno != EINTR)
                        break;
                if (tick && cove_mono_ns() >= next_tick) {
                        next_tick = cove_mono_ns() + 1000000000LL;
                        if (tick(tick_arg, tick_err)) {
                                stopped = 1;
                                break;
                        }
                }
                if (r <= 0)
                        continue;
                char buf[4096];
                ssize_t n = read(p[0], buf, sizeof buf);
                if (n < 0 && (errno == EINTR || errno == EAGAIN))
                        continue;
                if (n <= 0)
                        break;
                tail_add(tail, buf, (size_t)n);
                for (ssize_t i = 0; i < n; i++) {
                        if (buf[i] == '\n' || ll == sizeof line - 1) {
                                line[ll] = '\0';
                                if (fn)
                                        fn(arg, line);
                                ll = 0;
                                if (buf[i] == '\n')
                                        continue;
                        }
                        line[ll++] = buf[i];
                }
        }
        close(p[0]);
        if (ll > 0 && fn) {
                line[ll] = '\0';
                fn(arg, line);
        }
        if (timed_out || stopped)
                kill(-pid, SIGKILL);
        int status = 0;
        /* The pipe closed, so the tool is exiting; a child that closed its output but
         * keeps running is bounded by the same deadline. */
        for (;;) {
                pid_t w = waitpid(pid, &status, WNOHANG);
                if (w == pid)
                        break;
                if (w < 0 && errno != EINTR)
                        return cove_err_set(err, errno, "%s: wait", argv[0]);
                if (!timed_out && cove_mono_ns() > deadline) {
                        timed_out = 1;
                        kill(-pid, SIGKILL);
                }
                struct timespec ts = {0, 10 * 1000 * 1000};
                nanosleep(&ts, NULL);
        }
        if (stopped) {
                *err = *tick_err;
                return -1;
        }
        if (timed_out)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "%s: no result within %d s (killed): %s", argv[0], timeout_s,
                                     tail_msg(tail));
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
                return 0;
        if (WIFEXITED(status))
                return cove_err_set(err, 0, "%s: exited with %d: %s", argv[0], WEXITSTATUS(status),
                                    tail_msg(tail));
        return cove_err_set(err, 0, "%s: killed by signal %d: %s", argv[0],
                            WIFSIGNALED(status) ? WTERMSIG(status) : 0, tail_msg(tail));
}

static int run_tool(char *const argv[], int timeout_s, line_fn fn, void *arg, struct cove_err *err)
{
        return run_tool_env(argv, tool_env, timeout_s, fn, arg, NULL, NULL, err);
}

int cove__tpl_run(char *const argv[], char *const envp[], int timeout_s,
                  void (*line)(void *arg, char *line), void *arg, cove__tpl_tick_fn tick,
                  void *tick_arg, struct cove_err *err)
{
        return run_tool_env(argv, envp ? envp : tool_env, timeout_s, line, arg, tick, tick_arg,
                            err);
}

int cove__tpl_find_tool(const char *name, char *out, size_t cap)
{
        return find_tool(name, out, cap);
}

/* ---- filesystem helpers ------------------------------------------------------------- */

static int write_text(const char *root, const char *rel, const char *text, mode_t mode,
                      struct cove_err *err)
{
        char path[TPL_PATH_MAX];
        if (pathf(path, sizeof path, err, "%s/%s", root, rel) < 0)
                return -1;
        cleanup_close int fd =
            open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
        if (fd < 0)
                return cove_err_set(err, errno, "create %s", path);
        size_t len = strlen(text), off = 0;
        while (off < len) {
                ssize_t n = write(fd, text + off, len - off);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return cove_err_set(err, errno, "write %s", path);
                off += (size_t)n;
        }
        if (fchmod(fd, mode) < 0)
                return cove_err_set(err, errno, "chmod %s", path);
        return 0;
}

static int mkdir_mode(const char *root, const char *rel, mode_t mode, struct cove_err *err)
{
        char path[TPL_PATH_MAX];
        if (pathf(path, sizeof path, err, "%s/%s", root, rel) < 0)
                return -1;
        if (cove_mkdir_p(path, 0755, err) < 0)
                return -1;
        if (chmod(path, mode) < 0) /* mkdir's mode is filtered by the umask */
                return cove_err_set(err, errno, "chmod %s", path);
        return 0;
}

/* Sum of regular file and symlink sizes below dirfd, never following links. */
static uint64_t tree_size(int dirfd, int depth)
{
        if (depth > 256)
                return 0;
        DIR *d = fdopendir(dirfd);
        if (!d) {
                close(dirfd);
                return 0;
        }
        uint64_t sum = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
                if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                        continue;
                struct stat st;
                if (fstatat(dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                        continue;
                if (S_ISDIR(st.st_mode)) {
                        int sub = openat(dirfd, de->d_name,
                                         O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                        if (sub >= 0)
                                sum += tree_size(sub, depth + 1);
                } else if (S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)) {
                        sum += (uint64_t)st.st_size;
                }
        }
        closedir(d);
        return sum;
}

/* Unmount anything a killed tool left mounted below dir (debootstrap mounts proc and sys
 * in its target), deepest first, so removal can proceed. Best effort. */
static void unmount_below(const char *dir)
{
        cleanup_fclose FILE *f = fopen("/proc/self/mountinfo", "re");
        if (!f)
                return;
        char *mounts[256];
        int n = 0;
        size_t dl = strlen(dir);
        char line[8192];
        while (n < (int)COVE_ARRAY_SIZE(mounts) && fgets(line, sizeof line, f)) {
                /* id parent major:minor root mountpoint ... */
                char *save = NULL, *tok = strtok_r(line, " ", &save);
                for (int i = 0; tok && i < 4; i++)
                        tok = strtok_r(NULL, " ", &save);
                if (!tok)
                        continue;
                /* undo the \040-style octal escapes of mountinfo */
                char mp[4096];
                size_t o = 0;
                for (const char *s = tok; *s && o < sizeof mp - 1; s++) {
                        if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] && s[3]) {
                                mp[o++] =
                                    (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
                                s += 3;
                        } else {
                                mp[o++] = *s;
                        }
                }
                mp[o] = '\0';
                if (strncmp(mp, dir, dl) == 0 && mp[dl] == '/')
                        mounts[n++] = strdup(mp);
        }
        for (int i = n - 1; i >= 0; i--) {
                if (mounts[i])
                        umount2(mounts[i], MNT_DETACH);
                free(mounts[i]);
        }
}

/* Remove .build-<name>-XXXXXX leftovers of killed builds. Called with the name's lock
 * held, so no live builder of this name owns one. */
static int remove_stale_builds(const char *tdir, const char *name, struct cove_err *err)
{
        char prefix[COVE_TEMPLATE_NAME_MAX + 16];
        snprintf(prefix, sizeof prefix, ".build-%s-", name);
        size_t pl = strlen(prefix);
        cleanup_dir DIR *d = opendir(tdir);
        if (!d)
                return cove_err_set(err, errno, "open %s", tdir);
        struct dirent *de;
        while ((de = readdir(d))) {
                /* exactly the 6 mkdtemp characters after the prefix, so that "base" never
                 * matches a build of a template called "base-x" */
                if (strncmp(de->d_name, prefix, pl) != 0 || strlen(de->d_name + pl) != 6 ||
                    strchr(de->d_name + pl, '-'))
                        continue;
                char path[TPL_PATH_MAX];
                if (pathf(path, sizeof path, err, "%s/%s", tdir, de->d_name) < 0)
                        return -1;
                unmount_below(path);
                if (cove_rm_rf(path, err) < 0)
                        return cove_err_wrap(err, "remove stale build");
        }
        return 0;
}

/* ---- busybox ------------------------------------------------------------------------ */

/* 1 if the ELF file has no program interpreter (static), 0 if dynamic, -1 if not ELF. */
static int elf_is_static(int fd)
{
        Elf64_Ehdr eh;
        if (pread(fd, &eh, sizeof eh, 0) != (ssize_t)sizeof eh ||
            memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
            eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum > 256)
                return -1;
        for (int i = 0; i < eh.e_phnum; i++) {
                Elf64_Phdr ph;
                if (pread(fd, &ph, sizeof ph, (off_t)(eh.e_phoff + (uint64_t)i * sizeof ph)) !=
                    (ssize_t)sizeof ph)
                        return -1;
                if (ph.p_type == PT_INTERP)
                        return 0;
        }
        return 1;
}

static int copy_file(const char *src, const char *dst, mode_t mode, struct cove_err *err)
{
        cleanup_close int in = open(src, O_RDONLY | O_CLOEXEC);
        if (in < 0)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, errno,
                                     "open %s (install the busybox-static package)", src);
        int st = elf_is_static(in);
        if (st != 1)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "%s is %s: install the busybox-static package", src,
                                     st == 0 ? "dynamically linked" : "not a 64-bit ELF file");
        cleanup_close int out =
            open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
        if (out < 0)
                return cove_err_set(err, errno, "create %s", dst);
        char buf[65536];
        for (;;) {
                ssize_t n = read(in, buf, sizeof buf);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return cove_err_set(err, errno, "read %s", src);
                if (n == 0)
                        break;
                for (ssize_t off = 0; off < n;) {
                        ssize_t w = write(out, buf + off, (size_t)(n - off));
                        if (w < 0 && errno == EINTR)
                                continue;
                        if (w < 0)
                                return cove_err_set(err, errno, "write %s", dst);
                        off += w;
                }
        }
        if (fchmod(out, mode) < 0)
                return cove_err_set(err, errno, "chmod %s", dst);
        return 0;
}

struct applet_ctx {
        const char *rootfs;
        int made;
        int failed; /* first errno of a failed link */
};

/* One line of `busybox --list-full`, e.g. "usr/bin/awk": link it to /bin/busybox. */
static void applet_line(void *arg, char *line)
{
        struct applet_ctx *a = arg;
        size_t n = strlen(line);
        if (n == 0 || line[0] == '/' || strstr(line, "..") || strcmp(line, "bin/busybox") == 0)
                return;
        for (size_t i = 0; i < n; i++) {
                unsigned char c = (unsigned char)line[i];
                if (!(isalnum(c) || c == '/' || c == '_' || c == '-' || c == '.' || c == '[' ||
                      c == ']'))
                        return;
        }
        char path[TPL_PATH_MAX];
        if (snprintf(path, sizeof path, "%s/%s", a->rootfs, line) >= (int)sizeof path)
                return;
        char *slash = strrchr(path, '/');
        *slash = '\0';
        if (cove_mkdir_p(path, 0755, NULL) < 0) {
                if (!a->failed)
                        a->failed = errno ? errno : EIO;
                return;
        }
        *slash = '/';
        if (symlink("/bin/busybox", path) < 0) {
                if (errno != EEXIST && !a->failed)
                        a->failed = errno;
                return;
        }
        a->made++;
}

static const char busybox_passwd[] = "root:x:0:0:root:/root:/bin/sh\n"
                                     "user:x:1000:1000:user:/home/user:/bin/sh\n"
                                     "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n";
static const char busybox_group[] = "root:x:0:\n"
                                    "user:x:1000:\n"
                                    "nogroup:x:65534:\n";
static const char resolv_placeholder[] =
    "# Written by cove when a sandbox starts; this is the template's placeholder.\n";
static const char hosts_text[] = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n";

static int build_busybox(struct build_ctx *b, struct cove_err *err)
{
        static const struct {
                const char *rel;
                mode_t mode;
        } dirs[] = {
            {"bin", 0755},  {"sbin", 0755},     {"usr/bin", 0755}, {"usr/sbin", 0755},
            {"etc", 0755},  {"proc", 0555},     {"dev", 0755},     {"sys", 0555},
            {"tmp", 01777}, {"root", 0700},     {"home", 0755},    {"home/user", 0755},
            {"var", 0755},  {"var/tmp", 01777}, {"run", 0755},
        };
        report(b, "copy", 0);
        for (size_t i = 0; i < COVE_ARRAY_SIZE(dirs); i++)
                if (mkdir_mode(b->rootfs, dirs[i].rel, dirs[i].mode, err) < 0)
                        return -1;
        char home[TPL_PATH_MAX], bb[TPL_PATH_MAX];
        if (pathf(home, sizeof home, err, "%s/home/user", b->rootfs) < 0 ||
            pathf(bb, sizeof bb, err, "%s/bin/busybox", b->rootfs) < 0)
                return -1;
        if (chown(home, 1000, 1000) < 0)
                return cove_err_set(err, errno, "chown %s", home);
        if (copy_file(BUSYBOX_SRC, bb, 0755, err) < 0)
                return -1;
        report(b, "copy", 100);

        report(b, "applets", -1);
        struct applet_ctx a = {.rootfs = b->rootfs};
        char *argv[] = {bb, "--list-full", NULL};
        if (run_tool(argv, BUSYBOX_TIMEOUT_S, applet_line, &a, err) < 0)
                return cove_err_wrap(err, "list busybox applets");
        if (a.failed)
                return cove_err_set(err, a.failed, "link busybox applets in %s", b->rootfs);
        if (a.made < 10) /* the list includes sh, ls, cat… at the very least */
                return cove_err_set(err, 0, "%s --list-full listed %d applets", BUSYBOX_SRC,
                                    a.made);
        report(b, "applets", 100);

        report(b, "etc", -1);
        if (write_text(b->rootfs, "etc/passwd", busybox_passwd, 0644, err) < 0 ||
            write_text(b->rootfs, "etc/group", busybox_group, 0644, err) < 0 ||
            write_text(b->rootfs, "etc/hostname", "cove\n", 0644, err) < 0 ||
            write_text(b->rootfs, "etc/hosts", hosts_text, 0644, err) < 0 ||
            write_text(b->rootfs, "etc/resolv.conf", resolv_placeholder, 0644, err) < 0)
                return -1;
        snprintf(b->source, sizeof b->source, "busybox-static %s", BUSYBOX_SRC);
        return 0;
}

/* ---- base (debootstrap) ------------------------------------------------------------- */

static int mirror_ok(const char *uri)
{
        if (strncmp(uri, "http://", 7) != 0 && strncmp(uri, "https://", 8) != 0)
                return 0;
        if (strstr(uri, "security") || strlen(uri) > 200)
                return 0;
        for (const char *p = uri; *p; p++)
                if (isspace((unsigned char)*p) || !isprint((unsigned char)*p))
                        return 0;
        return 1;
}

/* A one-line-style list: "deb [opts] URI SUITE COMPONENTS". */
static int mirror_from_list(const char *path, char *out, size_t cap)
{
        cleanup_fclose FILE *f = fopen(path, "re");
        if (!f)
                return -1;
        char line[1024];
        while (fgets(line, sizeof line, f)) {
                char *save = NULL, *tok = strtok_r(line, " \t\r\n", &save);
                if (!tok || strcmp(tok, "deb") != 0)
                        continue;
                tok = strtok_r(NULL, " \t\r\n", &save);
                if (tok && tok[0] == '[') /* options, possibly several words */
                        while (tok && !strchr(tok, ']'))
                                tok = strtok_r(NULL, " \t\r\n", &save);
                if (tok && strchr(tok, ']'))
                        tok = strtok_r(NULL, " \t\r\n", &save);
                char *suite = tok ? strtok_r(NULL, " \t\r\n", &save) : NULL;
                if (tok && suite && strcmp(suite, BASE_SUITE) == 0 && mirror_ok(tok)) {
                        snprintf(out, cap, "%s", tok);
                        return 0;
                }
        }
        return -1;
}

/* deb822 stanzas: "Types: deb", "URIs: …", "Suites: bookworm …", optional "Enabled: no". */
static int mirror_from_sources(const char *path, char *out, size_t cap)
{
        cleanup_fclose FILE *f = fopen(path, "re");
        if (!f)
                return -1;
        char line[1024], uri[256] = "";
        int deb = 0, suite = 0, enabled = 1, eof = 0;
        while (!eof) {
                eof = !fgets(line, sizeof line, f);
                char *s = line;
                if (!eof)
                        while (isspace((unsigned char)*s))
                                s++;
                if (eof || *s == '\0') { /* end of a stanza */
                        if (deb && suite && enabled && uri[0]) {
                                snprintf(out, cap, "%s", uri);
                                return 0;
                        }
                        deb = suite = 0;
                        enabled = 1;
                        uri[0] = '\0';
                        continue;
                }
                if (*s == '#')
                        continue;
                char *colon = strchr(s, ':');
                if (!colon || colon == s)
                        continue;
                *colon = '\0';
                char *val = colon + 1;
                if (strcasecmp(s, "Types") == 0) {
                        for (char *sv = NULL, *t = strtok_r(val, " \t\r\n", &sv); t;
                             t = strtok_r(NULL, " \t\r\n", &sv))
                                if (strcmp(t, "deb") == 0)
                                        deb = 1;
                } else if (strcasecmp(s, "URIs") == 0) {
                        for (char *sv = NULL, *t = strtok_r(val, " \t\r\n", &sv); t;
                             t = strtok_r(NULL, " \t\r\n", &sv))
                                if (!uri[0] && mirror_ok(t))
                                        snprintf(uri, sizeof uri, "%s", t);
                } else if (strcasecmp(s, "Suites") == 0) {
                        for (char *sv = NULL, *t = strtok_r(val, " \t\r\n", &sv); t;
                             t = strtok_r(NULL, " \t\r\n", &sv))
                                if (strcmp(t, BASE_SUITE) == 0)
                                        suite = 1;
                } else if (strcasecmp(s, "Enabled") == 0) {
                        char *t = strtok_r(val, " \t\r\n", &(char *){NULL});
                        if (t && strcasecmp(t, "no") == 0)
                                enabled = 0;
                }
        }
        return -1;
}

static int name_ends(const char *name, const char *suffix)
{
        size_t n = strlen(name), s = strlen(suffix);
        return n > s && strcmp(name + n - s, suffix) == 0;
}

/* The host's Debian mirror: the machine may reach nothing else. */
static void host_mirror(char *out, size_t cap)
{
        if (mirror_from_list("/etc/apt/sources.list", out, cap) == 0)
                return;
        struct dirent **ents = NULL;
        int n = scandir("/etc/apt/sources.list.d", &ents, NULL, alphasort);
        int found = 0;
        for (int i = 0; i < n; i++) {
                char path[TPL_PATH_MAX];
                snprintf(path, sizeof path, "/etc/apt/sources.list.d/%s", ents[i]->d_name);
                if (!found && name_ends(ents[i]->d_name, ".sources"))
                        found = mirror_from_sources(path, out, cap) == 0;
                else if (!found && name_ends(ents[i]->d_name, ".list"))
                        found = mirror_from_list(path, out, cap) == 0;
                free(ents[i]);
        }
        free(ents);
        if (!found)
                snprintf(out, cap, "%s", DEFAULT_MIRROR);
}

struct dbs_progress {
        struct build_ctx *b;
        int retrieved, extracted, installed; /* "Unpacking X" + "Configuring X" count */
};

static void dbs_line(void *arg, char *line)
{
        struct dbs_progress *d = arg;
        if (strncmp(line, "I: ", 3) != 0)
                return;
        const char *m = line + 3;
        int total = d->retrieved > 0 ? d->retrieved : 1;
        if (strncmp(m, "Retrieving ", 11) == 0) {
                if (strncmp(m, "Retrieving InRelease", 20) != 0 &&
                    strncmp(m, "Retrieving Release", 18) != 0 &&
                    strncmp(m, "Retrieving Packages", 19) != 0)
                        d->retrieved++;
                report(d->b, "download", -1);
        } else if (strncmp(m, "Extracting ", 11) == 0) {
                d->extracted++;
                int pc = d->extracted * 100 / total;
                report(d->b, "extract", pc > 99 ? 99 : pc);
        } else if ((strncmp(m, "Unpacking ", 10) == 0 || strncmp(m, "Configuring ", 12) == 0) &&
                   strstr(m, "...")) {
                if (!strstr(m, " packages") && !strstr(m, " system"))
                        d->installed++;
                int pc = d->installed * 100 / (2 * total);
                report(d->b, "configure", pc > 99 ? 99 : pc);
        } else if (strncmp(m, "Base system installed", 21) == 0) {
                report(d->b, "configure", 100);
        }
}

/* base; extra: more Debian packages (NULL-terminated, or NULL), installed by apt-get in
 * the rootfs after debootstrap, with its own sources.list (the host's mirror) */
/* apt-get update + install of pkgs inside the rootfs (its resolv.conf is still the host's
 * copy from debootstrap; the caller cleans the apt caches afterwards) */
static int apt_install(struct build_ctx *b, const char *chr, const char *const *pkgs,
                       struct cove_err *err)
{
        report(b, "packages", 0);
        char *uargv[] = {
            (char *)chr, (char *)b->rootfs, "/usr/bin/env", "DEBIAN_FRONTEND=noninteractive",
            "LC_ALL=C",  "apt-get",         "-q",           "update",
            NULL};
        if (run_tool(uargv, DEBOOTSTRAP_TIMEOUT_S, NULL, NULL, err) < 0)
                return cove_err_wrap(err, "apt-get update in the new rootfs");
        char *iargv[64] = {(char *)chr,
                           (char *)b->rootfs,
                           "/usr/bin/env",
                           "DEBIAN_FRONTEND=noninteractive",
                           "LC_ALL=C",
                           "apt-get",
                           "-q",
                           "-y",
                           "--no-install-recommends",
                           "install"};
        size_t n = 10;
        for (size_t i = 0; pkgs[i] && n + 1 < COVE_ARRAY_SIZE(iargv); i++)
                iargv[n++] = (char *)pkgs[i];
        iargv[n] = NULL;
        if (run_tool(iargv, DEBOOTSTRAP_TIMEOUT_S, NULL, NULL, err) < 0)
                return cove_err_wrap(err, "apt-get install in the new rootfs");
        report(b, "packages", 100);
        return 0;
}

static int build_base(struct build_ctx *b, const char *const *extra, struct cove_err *err)
{
        char dbs[256], chr[256];
        if (find_tool("debootstrap", dbs, sizeof dbs) < 0)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "debootstrap not found: install the debootstrap package "
                                     "(scripts/install-deps)");
        if (find_tool("chroot", chr, sizeof chr) < 0)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "chroot not found: install coreutils");
        char mirror[256];
        host_mirror(mirror, sizeof mirror);
        snprintf(b->source, sizeof b->source, "debootstrap --variant=minbase %s %s%s", BASE_SUITE,
                 mirror, extra ? " + apt-get install (docs/templates.md)" : "");

        report(b, "download", -1);
        struct dbs_progress dp = {.b = b};
        char *dargv[] = {dbs,        "--variant=minbase", "--include=" BASE_INCLUDE,
                         BASE_SUITE, (char *)b->rootfs,   mirror,
                         NULL};
        int rc = run_tool(dargv, DEBOOTSTRAP_TIMEOUT_S, dbs_line, &dp, err);
        if (rc < 0)
                return cove_err_wrap(err, "debootstrap from %s", mirror);

        report(b, "user", 0);
        char *uargv[] = {chr,
                         (char *)b->rootfs,
                         "useradd",
                         "--create-home",
                         "--uid",
                         "1000",
                         "--user-group",
                         "--shell",
                         "/bin/bash",
                         "--groups",
                         "sudo",
                         "user",
                         NULL};
        if (run_tool(uargv, STEP_TIMEOUT_S, NULL, NULL, err) < 0)
                return cove_err_wrap(err, "add user 'user'");
        report(b, "user", 50);
        if (mkdir_mode(b->rootfs, "etc/sudoers.d", 0755, err) < 0 ||
            write_text(b->rootfs, "etc/sudoers.d/user", "user ALL=(ALL:ALL) NOPASSWD:ALL\n", 0440,
                       err) < 0 ||
            write_text(b->rootfs, "etc/hostname", "cove\n", 0644, err) < 0 ||
            write_text(b->rootfs, "etc/hosts", hosts_text, 0644, err) < 0)
                return -1;
        if (extra && apt_install(b, chr, extra, err) < 0)
                return -1;
        /* resolv.conf: debootstrap copied the host's; the sandbox gets its own at start */
        char rc_path[TPL_PATH_MAX];
        if (pathf(rc_path, sizeof rc_path, err, "%s/etc/resolv.conf", b->rootfs) < 0)
                return -1;
        if (unlink(rc_path) < 0 && errno != ENOENT)
                return cove_err_set(err, errno, "remove %s", rc_path);
        if (write_text(b->rootfs, "etc/resolv.conf", resolv_placeholder, 0644, err) < 0)
                return -1;

        char *cargv[] = {chr, (char *)b->rootfs, "apt-get", "clean", NULL};
        if (run_tool(cargv, STEP_TIMEOUT_S, NULL, NULL, err) < 0)
                return cove_err_wrap(err, "clean apt caches");
        static const char *const drop[] = {"var/lib/apt/lists", "var/cache/apt/pkgcache.bin",
                                           "var/cache/apt/srcpkgcache.bin"};
        for (size_t i = 0; i < COVE_ARRAY_SIZE(drop); i++) {
                char p[TPL_PATH_MAX];
                if (pathf(p, sizeof p, err, "%s/%s", b->rootfs, drop[i]) < 0 ||
                    cove_rm_rf(p, err) < 0)
                        return -1;
        }
        if (mkdir_mode(b->rootfs, "var/lib/apt/lists/partial", 0700, err) < 0)
                return -1;
        report(b, "user", 100);
        return 0;
}

/* ---- code-interpreter: base + kernels + cove's interpreter server ----------------- */

static int build_interp(struct build_ctx *b, struct cove_err *err)
{
        if (build_base(b, INTERP_PACKAGES, err) < 0)
                return -1;
        report(b, "interpreter", 0);
        if (mkdir_mode(b->rootfs, "usr/lib/cove", 0755, err) < 0 ||
            mkdir_mode(b->rootfs, "usr/lib/cove/interp", 0755, err) < 0 ||
            write_text(b->rootfs, "usr/lib/cove/interp/server.py", (const char *)cove_interp_server,
                       0755, err) < 0 ||
            write_text(b->rootfs, "usr/lib/cove/interp/jskernel.js",
                       (const char *)cove_interp_jskernel, 0644, err) < 0)
                return -1;
        report(b, "interpreter", 100);
        return 0;
}

/* ---- metadata, lookup, list --------------------------------------------------------- */

static int write_meta(const char *dir, const struct build_ctx *b, uint64_t size,
                      struct cove_err *err)
{
        char at[40];
        cove_rfc3339(cove_now_ms(), at, sizeof at);
        json_t *j = json_pack("{s:s, s:s, s:I, s:s}", "name", b->name, "built_at", at, "size_bytes",
                              (json_int_t)size, "source", b->source);
        if (!j)
                return cove_err_set(err, ENOMEM, "meta.json for %s", b->name);
        char *text = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
        json_decref(j);
        if (!text)
                return cove_err_set(err, ENOMEM, "meta.json for %s", b->name);
        int rc = cove_write_file_atomic(dir, "meta.json", text, strlen(text), 0644, err);
        free(text);
        return rc;
}

int cove_template_info(const char *templates_dir, const char *name, struct cove_template_info *info,
                       struct cove_err *err)
{
        memset(info, 0, sizeof *info);
        if (!valid_name(name))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "invalid template name");
        snprintf(info->name, sizeof info->name, "%s", name);
        info->known = cove_template_known(name);
        char meta[TPL_PATH_MAX], rootfs[TPL_PATH_MAX];
        if (pathf(meta, sizeof meta, err, "%s/%s/meta.json", templates_dir, name) < 0 ||
            pathf(rootfs, sizeof rootfs, err, "%s/%s/rootfs", templates_dir, name) < 0)
                return -1;
        struct stat st;
        if (stat(rootfs, &st) < 0 || !S_ISDIR(st.st_mode))
                return 0;
        json_error_t je;
        json_t *j = json_load_file(meta, 0, &je);
        if (!j) {
                if (access(meta, F_OK) < 0 && errno == ENOENT)
                        return 0;
                return cove_err_set(err, 0, "template %s: meta.json: %s", name, je.text);
        }
        const char *at = NULL, *src = NULL;
        json_int_t size = 0;
        int bad =
            json_unpack(j, "{s:s, s:I, s?s}", "built_at", &at, "size_bytes", &size, "source", &src);
        if (!bad) {
                info->built = 1;
                snprintf(info->built_at, sizeof info->built_at, "%s", at);
                info->size_bytes = size > 0 ? (uint64_t)size : 0;
                snprintf(info->source, sizeof info->source, "%s", src ? src : "");
        }
        json_decref(j);
        if (bad)
                return cove_err_set(err, 0, "template %s: meta.json lacks built_at/size_bytes",
                                    name);
        return 0;
}

int cove_template_lookup(const char *templates_dir, const char *name, char *rootfs_out, size_t cap,
                         struct cove_err *err)
{
        if (!valid_name(name))
                return 1;
        char meta[TPL_PATH_MAX];
        if (pathf(meta, sizeof meta, err, "%s/%s/meta.json", templates_dir, name) < 0 ||
            pathf(rootfs_out, cap, err, "%s/%s/rootfs", templates_dir, name) < 0)
                return -1;
        struct stat st;
        /* meta.json is written last inside the build dir, and the dir is renamed into place
         * whole: its presence means the rootfs is complete */
        if (stat(meta, &st) < 0 || !S_ISREG(st.st_mode))
                return 1;
        if (stat(rootfs_out, &st) < 0 || !S_ISDIR(st.st_mode))
                return 1;
        return 0;
}

int cove_template_list(const char *templates_dir, cove_template_list_fn fn, void *arg,
                       struct cove_err *err)
{
        static const char *const known[] = {"base", "busybox", "code-interpreter"}; /* sorted */
        struct cove_template_info info;
        for (size_t i = 0; i < COVE_ARRAY_SIZE(known); i++) {
                if (cove_template_info(templates_dir, known[i], &info, err) < 0)
                        return -1;
                int r = fn(arg, &info);
                if (r)
                        return r;
        }
        struct dirent **ents = NULL;
        int n = scandir(templates_dir, &ents, NULL, alphasort);
        if (n < 0)
                return errno == ENOENT ? 0 : cove_err_set(err, errno, "list %s", templates_dir);
        int rc = 0;
        for (int i = 0; i < n; i++) {
                const char *nm = ents[i]->d_name;
                if (rc == 0 && valid_name(nm) && !cove_template_known(nm) &&
                    cove_template_info(templates_dir, nm, &info, NULL) == 0 && info.built)
                        rc = fn(arg, &info);
                free(ents[i]);
        }
        free(ents);
        return rc;
}

/* ---- build -------------------------------------------------------------------------- */

static int lock_name(const char *tdir, const char *name, struct cove_err *err)
{
        char path[TPL_PATH_MAX];
        if (pathf(path, sizeof path, err, "%s/.lock-%s", tdir, name) < 0)
                return -1;
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0)
                return cove_err_set(err, errno, "open lock %s", path);
        while (flock(fd, LOCK_EX) < 0) {
                if (errno != EINTR) {
                        int e = errno;
                        close(fd);
                        return cove_err_set(err, e, "lock %s", path);
                }
        }
        return fd;
}

static int fsync_path(const char *path, struct cove_err *err)
{
        cleanup_close int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return cove_err_set(err, errno, "open %s", path);
        if (fsync(fd) < 0)
                return cove_err_set(err, errno, "fsync %s", path);
        return 0;
}

static int build_locked(const char *tdir, const char *name, cove_progress_fn progress, void *arg,
                        struct cove_err *err)
{
        if (remove_stale_builds(tdir, name, err) < 0)
                return -1;
        char build[TPL_PATH_MAX], rootfs[TPL_PATH_MAX], final[TPL_PATH_MAX];
        if (pathf(build, sizeof build, err, "%s/.build-%s-XXXXXX", tdir, name) < 0 ||
            pathf(final, sizeof final, err, "%s/%s", tdir, name) < 0 ||
            pathf(rootfs, sizeof rootfs, err, "%s/rootfs", build) < 0)
                return -1;
        if (!mkdtemp(build))
                return cove_err_set(err, errno, "create %s", build);
        /* mkdtemp chose the suffix: rootfs must be rebuilt from the final name */
        snprintf(rootfs, sizeof rootfs, "%s/rootfs", build);
        int rfd = -1;
        struct build_ctx b = {.name = name, .rootfs = rootfs, .progress = progress, .arg = arg};
        if (chmod(build, 0755) < 0 || mkdir(rootfs, 0755) < 0 || chmod(rootfs, 0755) < 0) {
                cove_err_set(err, errno, "create %s", rootfs);
                goto fail;
        }
        int built = !strcmp(name, "busybox") ? build_busybox(&b, err)
                    : !strcmp(name, "base")  ? build_base(&b, NULL, err)
                                             : build_interp(&b, err);
        if (built < 0)
                goto fail;

        report(&b, "finish", -1);
        rfd = open(rootfs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (rfd < 0) {
                cove_err_set(err, errno, "open %s", rootfs);
                goto fail;
        }
        /* everything on disk before the rename makes it visible */
        if (syncfs(rfd) < 0) {
                cove_err_set(err, errno, "sync %s", rootfs);
                goto fail;
        }
        uint64_t size = tree_size(dup(rfd), 0);
        close(rfd);
        rfd = -1;
        if (write_meta(build, &b, size, err) < 0)
                goto fail;
        /* a <name>/ without meta.json is debris (not ours: our renames are whole) */
        struct stat st;
        if (lstat(final, &st) == 0 && cove_rm_rf(final, err) < 0)
                goto fail;
        if (rename(build, final) < 0) {
                cove_err_set(err, errno, "rename %s to %s", build, final);
                goto fail;
        }
        if (fsync_path(tdir, err) < 0)
                return -1;
        report(&b, "finish", 100);
        return 0;
fail:
        if (rfd >= 0)
                close(rfd);
        unmount_below(build);
        cove_rm_rf(build, NULL);
        return -1;
}

int cove_template_build(const char *templates_dir, const char *name, cove_progress_fn progress,
                        void *arg, struct cove_err *err)
{
        if (!cove_template_known(name))
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0,
                                     "unknown template '%s' (known: busybox, base, "
                                     "code-interpreter)",
                                     name ? name : "");
        char rootfs[TPL_PATH_MAX];
        int r = cove_template_lookup(templates_dir, name, rootfs, sizeof rootfs, err);
        if (r <= 0)
                return r < 0 ? cove_err_wrap(err, "template %s", name) : 0;
        if (cove_mkdir_p(templates_dir, 0755, err) < 0)
                return cove_err_wrap(err, "template %s", name);
        cleanup_close int lock = lock_name(templates_dir, name, err);
        if (lock < 0)
                return cove_err_wrap(err, "template %s", name);
        /* another process may have built it while we waited for the lock */
        if (cove_template_lookup(templates_dir, name, rootfs, sizeof rootfs, err) == 0)
                return 0;
        if (build_locked(templates_dir, name, progress, arg, err) < 0)
                return cove_err_wrap(err, "build template %s", name);
        return 0;
}

/* ---- shared with template_image.c ------------------------------------------------- */

int cove__tpl_valid_name(const char *name)
{
        return valid_name(name);
}

int cove__tpl_lock(const char *dir, const char *name, struct cove_err *err)
{
        return lock_name(dir, name, err);
}

int cove__tpl_fsync_dir(const char *path, struct cove_err *err)
{
        return fsync_path(path, err);
}

uint64_t cove__tpl_tree_size(int dirfd)
{
        return tree_size(dirfd, 0);
}

int cove__tpl_remove_stale(const char *dir, const char *name, struct cove_err *err)
{
        return remove_stale_builds(dir, name, err);
}
