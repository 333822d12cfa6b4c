/* CRIU runner, image packing and the user namespace map rewrite (runtime/criu.h). */
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
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/close_range.h>

#include "util/cleanup.h"
#include "util/util.h"

#define PACK_MAGIC "CVCRIU01"
#define PACK_MAX_FILES 4096
#define PACK_NAME_MAX 200
#define PACK_ALIGN (2u * 1024 * 1024)
#define PACK_ALIGN_MIN (256u * 1024)
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
        arg(r, "--external=%s", ext);  /* the guest channel: the node's end is outside */
        arg(r, "%s", "--external=mnt[]"); /* /dev nodes and cove-guest: binds of host files */
        arg(r, "%s", "--manage-cgroups=ignore");
        arg(r, "--freeze-cgroup=%s", freezer_dir);
        arg(r, "%s", "--network-lock=nftables");
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
        arg(r, "%s", "--network-lock=nftables");
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

/* ---- packing ---- */

static void put64(uint8_t *p, uint64_t v)
{
        for (int i = 0; i < 8; i++)
                p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64(const uint8_t *p)
{
        uint64_t v = 0;
        for (int i = 7; i >= 0; i--)
                v = v << 8 | p[i];
        return v;
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

static int pread_all(int fd, void *buf, size_t n, off_t off)
{
        char *p = buf;
        while (n) {
                ssize_t r = pread(fd, p, n, off);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r <= 0)
                        return -1;
                p += r;
                n -= (size_t)r;
                off += r;
        }
        return 0;
}

static int copy_range(int in, off_t in_off, int out, off_t out_off, uint64_t n)
{
        static __thread char buf[1 << 16];
        while (n) {
                size_t k = n < sizeof(buf) ? (size_t)n : sizeof(buf);
                if (pread_all(in, buf, k, in_off) < 0 || pwrite_all(out, buf, k, out_off) < 0)
                        return -1;
                in_off += (off_t)k;
                out_off += (off_t)k;
                n -= k;
        }
        return 0;
}

static int name_ok(const char *n)
{
        size_t l = strlen(n);
        if (!l || l > PACK_NAME_MAX || n[0] == '.')
                return 0;
        for (const char *p = n; *p; p++)
                if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                      (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' || *p == '.'))
                        return 0;
        return 1;
}

struct pent {
        char name[PACK_NAME_MAX + 1];
        uint64_t size, off;
};

static int by_size(const void *a, const void *b)
{
        const struct pent *x = a, *y = b;
        return (x->size > y->size) - (x->size < y->size);
}

int cove_criu_pack(const char *dir, int out_fd, uint64_t *size, struct cove_err *err)
{
        cleanup_dir DIR *d = opendir(dir);
        if (!d)
                return cove_err_set(err, errno, "criu pack: open %s", dir);
        struct pent *v = calloc(PACK_MAX_FILES, sizeof(*v));
        if (!v)
                return cove_err_set(err, ENOMEM, "criu pack");
        size_t n = 0;
        struct dirent *de;
        int rc = -1;
        while ((de = readdir(d))) {
                size_t l = strlen(de->d_name);
                if (!name_ok(de->d_name) || (l > 4 && !strcmp(de->d_name + l - 4, ".log")) ||
                    !strcmp(de->d_name, "restore.pid") || !strncmp(de->d_name, "stats-", 6))
                        continue;
                struct stat st;
                if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
                        cove_err_set(err, errno, "criu pack: stat %s", de->d_name);
                        goto out;
                }
                if (!S_ISREG(st.st_mode))
                        continue;
                if (n == PACK_MAX_FILES) {
                        cove_err_set(err, E2BIG, "criu pack: too many images");
                        goto out;
                }
                snprintf(v[n].name, sizeof(v[n].name), "%s", de->d_name);
                v[n++].size = (uint64_t)st.st_size;
        }
        qsort(v, n, sizeof(*v), by_size); /* small files first, unaligned */
        uint64_t hdr = 8 + 8;
        for (size_t i = 0; i < n; i++)
                hdr += 2 + strlen(v[i].name) + 16;
        uint64_t off = hdr;
        for (size_t i = 0; i < n; i++) {
                if (v[i].size >= PACK_ALIGN_MIN)
                        off = (off + PACK_ALIGN - 1) / PACK_ALIGN * PACK_ALIGN;
                v[i].off = off;
                off += v[i].size;
        }
        uint8_t *h = calloc(1, hdr);
        if (!h) {
                cove_err_set(err, ENOMEM, "criu pack");
                goto out;
        }
        memcpy(h, PACK_MAGIC, 8);
        put64(h + 8, n);
        size_t p = 16;
        for (size_t i = 0; i < n; i++) {
                size_t l = strlen(v[i].name);
                h[p] = (uint8_t)(l & 0xff);
                h[p + 1] = (uint8_t)(l >> 8);
                memcpy(h + p + 2, v[i].name, l);
                put64(h + p + 2 + l, v[i].off);
                put64(h + p + 2 + l + 8, v[i].size);
                p += 2 + l + 16;
        }
        if (ftruncate(out_fd, 0) < 0 || pwrite_all(out_fd, h, hdr, 0) < 0) {
                free(h);
                cove_err_set(err, errno, "criu pack: write");
                goto out;
        }
        free(h);
        for (size_t i = 0; i < n; i++) {
                cleanup_close int in = openat(dirfd(d), v[i].name, O_RDONLY | O_CLOEXEC);
                if (in < 0 || copy_range(in, 0, out_fd, (off_t)v[i].off, v[i].size) < 0) {
                        cove_err_set(err, errno ? errno : EIO, "criu pack: %s", v[i].name);
                        goto out;
                }
        }
        if (ftruncate(out_fd, (off_t)off) < 0) {
                cove_err_set(err, errno, "criu pack: truncate");
                goto out;
        }
        if (size)
                *size = off;
        rc = 0;
out:
        free(v);
        return rc;
}

int cove_criu_unpack(int in_fd, const char *dir, struct cove_err *err)
{
        struct stat st;
        if (fstat(in_fd, &st) < 0)
                return cove_err_set(err, errno, "criu unpack");
        uint64_t total = (uint64_t)st.st_size;
        uint8_t h16[16];
        if (total < 16 || pread_all(in_fd, h16, 16, 0) < 0 || memcmp(h16, PACK_MAGIC, 8))
                return cove_err_setk(err, COVE_E_UNAVAILABLE, EBADMSG,
                                     "criu unpack: not a packed checkpoint");
        uint64_t n = get64(h16 + 8);
        if (n > PACK_MAX_FILES)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, EBADMSG, "criu unpack: bad header");
        cleanup_close int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return cove_err_set(err, errno, "criu unpack: open %s", dir);
        uint64_t p = 16;
        for (uint64_t i = 0; i < n; i++) {
                uint8_t lb[2];
                if (p + 2 > total || pread_all(in_fd, lb, 2, (off_t)p) < 0)
                        goto bad;
                size_t l = (size_t)lb[0] | (size_t)lb[1] << 8;
                char name[PACK_NAME_MAX + 1];
                uint8_t os[16];
                if (l == 0 || l > PACK_NAME_MAX || p + 2 + l + 16 > total ||
                    pread_all(in_fd, name, l, (off_t)(p + 2)) < 0 ||
                    pread_all(in_fd, os, 16, (off_t)(p + 2 + l)) < 0)
                        goto bad;
                name[l] = 0;
                uint64_t off = get64(os), size = get64(os + 8);
                if (!name_ok(name) || strlen(name) != l || off > total || size > total - off)
                        goto bad;
                cleanup_close int out =
                    openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
                if (out < 0 || copy_range(in_fd, (off_t)off, out, 0, size) < 0)
                        return cove_err_set(err, errno ? errno : EIO, "criu unpack: %s", name);
                p += 2 + l + 16;
        }
        return 0;
bad:
        return cove_err_setk(err, COVE_E_UNAVAILABLE, EBADMSG, "criu unpack: bad entry");
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
                        size_t sp = 0, so = 0, end = p + sl;
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
                        (void)sp;
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
