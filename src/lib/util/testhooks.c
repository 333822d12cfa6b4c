/* Test-only fault and clock hooks (util/testhooks.h): the control file's parser and a
 * syscall table that consults it. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/testhooks.h"

enum { TH_WRITE, TH_FSYNC, TH_RENAME, TH_MKDIR, TH_UNLINK, TH_OPS };
#define TH_ANY (-1)
#define TH_KILL (-1)
#define TH_MAX_FAULTS 16

struct th_fault {
        int op;     /* TH_* or TH_ANY */
        int action; /* errno, or TH_KILL */
        long long after, count;
};

struct th_state {
        pthread_mutex_t mu;
        char path[4096];
        struct stat seen; /* of the file as last read */
        int64_t offset_ms;
        int64_t grace_ms;
        int64_t job_hold_ms;
        int64_t reap_hold_ms;
        struct th_fault f[TH_MAX_FAULTS];
        int nf;
        long long calls[TH_OPS]; /* since the file was read */
};

static struct th_state th = {.mu = PTHREAD_MUTEX_INITIALIZER};
static int th_on;

static int parse(const char *path, struct th_state *out, struct cove_err *err)
{
        FILE *f = fopen(path, "re");
        if (!f)
                return cove_err_set(err, errno, "test hooks %s", path);
        static const char *ops[] = {"write", "fsync", "rename", "mkdir", "unlink"};
        char line[256];
        int ln = 0, rc = 0;
        out->offset_ms = 0;
        out->grace_ms = 0;
        out->job_hold_ms = 0;
        out->reap_hold_ms = 0;
        out->nf = 0;
        while (rc == 0 && fgets(line, sizeof(line), f)) {
                ln++;
                char w[4][32] = {{0}};
                long long a = 0, c = -1;
                int n = sscanf(line, "%31s %31s %31s %lld %lld", w[0], w[1], w[2], &a, &c);
                if (n <= 0 || w[0][0] == '#')
                        continue;
                if (!strcmp(w[0], "clock_offset_s") && n == 2) {
                        char *end;
                        long long s = strtoll(w[1], &end, 10);
                        if (*end || s < -(1LL << 40) || s > (1LL << 40))
                                rc = -1;
                        out->offset_ms = s * 1000;
                        continue;
                }
                if (!strcmp(w[0], "gc_grace_s") && n == 2) {
                        char *end;
                        long long s = strtoll(w[1], &end, 10);
                        if (*end || s < 1 || s > 1000000)
                                rc = -1;
                        out->grace_ms = s * 1000;
                        continue;
                }
                if ((!strcmp(w[0], "job_hold_ms") || !strcmp(w[0], "reap_hold_ms")) && n == 2) {
                        char *end;
                        long long ms = strtoll(w[1], &end, 10);
                        if (*end || ms < 0 || ms > 3600000)
                                rc = -1;
                        *(w[0][0] == 'j' ? &out->job_hold_ms : &out->reap_hold_ms) = ms;
                        continue;
                }
                if (strcmp(w[0], "fault") || n < 3 || out->nf == TH_MAX_FAULTS || a < 0) {
                        rc = -1;
                        continue;
                }
                struct th_fault *x = &out->f[out->nf];
                x->op = -2;
                if (!strcmp(w[1], "any"))
                        x->op = TH_ANY;
                for (int i = 0; i < TH_OPS; i++)
                        if (!strcmp(w[1], ops[i]))
                                x->op = i;
                x->action = !strcmp(w[2], "ENOSPC")  ? ENOSPC
                            : !strcmp(w[2], "EIO")   ? EIO
                            : !strcmp(w[2], "EROFS") ? EROFS
                            : !strcmp(w[2], "kill")  ? TH_KILL
                                                     : 0;
                if (x->op == -2 || x->action == 0) {
                        rc = -1;
                        continue;
                }
                x->after = a;
                x->count = n >= 5 ? c : -1;
                out->nf++;
        }
        fclose(f);
        if (rc < 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, EINVAL,
                                     "test hooks %s line %d: expected \"clock_offset_s N\" or "
                                     "\"fault OP ENOSPC|EIO|EROFS|kill [AFTER [COUNT]]\"",
                                     path, ln);
        return 0;
}

/* Re-read the file if it changed. Called with th.mu held. */
static void refresh(void)
{
        struct stat st;
        if (stat(th.path, &st) < 0)
                return;
        if (st.st_ino == th.seen.st_ino && st.st_size == th.seen.st_size &&
            st.st_mtim.tv_sec == th.seen.st_mtim.tv_sec &&
            st.st_mtim.tv_nsec == th.seen.st_mtim.tv_nsec)
                return;
        struct th_state n;
        memset(&n, 0, sizeof(n));
        if (parse(th.path, &n, NULL) < 0)
                return; /* a half-written file: keep the old set, look again next call */
        th.seen = st;
        th.offset_ms = n.offset_ms;
        th.grace_ms = n.grace_ms;
        th.job_hold_ms = n.job_hold_ms;
        th.reap_hold_ms = n.reap_hold_ms;
        memcpy(th.f, n.f, sizeof(th.f));
        th.nf = n.nf;
        memset(th.calls, 0, sizeof(th.calls));
}

/* 0 to let the call through, else the errno to fail it with. */
static int hit(int op)
{
        pthread_mutex_lock(&th.mu);
        refresh();
        long long k = ++th.calls[op];
        int action = 0;
        for (int i = 0; i < th.nf && !action; i++) {
                const struct th_fault *x = &th.f[i];
                if ((x->op == op || x->op == TH_ANY) && k > x->after &&
                    (x->count < 0 || k <= x->after + x->count))
                        action = x->action;
        }
        pthread_mutex_unlock(&th.mu);
        if (action == TH_KILL)
                kill(getpid(), SIGKILL);
        return action;
}

#define HOOKED(op, call)                                                                           \
        do {                                                                                       \
                int e_ = hit(op);                                                                  \
                if (e_) {                                                                          \
                        errno = e_;                                                                \
                        return -1;                                                                 \
                }                                                                                  \
                return call;                                                                       \
        } while (0)

static int th_open(const char *path, int flags, mode_t mode)
{
        return open(path, flags, mode);
}
static ssize_t th_write(int fd, const void *b, size_t n)
{
        HOOKED(TH_WRITE, write(fd, b, n));
}
static ssize_t th_pwrite(int fd, const void *b, size_t n, off_t off)
{
        HOOKED(TH_WRITE, pwrite(fd, b, n, off));
}
static int th_fsync(int fd)
{
        HOOKED(TH_FSYNC, fsync(fd));
}
static int th_fdatasync(int fd)
{
        HOOKED(TH_FSYNC, fdatasync(fd));
}
static int th_syncfs(int fd)
{
        HOOKED(TH_FSYNC, syncfs(fd));
}
static int th_rename(const char *a, const char *b)
{
        HOOKED(TH_RENAME, rename(a, b));
}
static int th_mkdir(const char *p, mode_t m)
{
        HOOKED(TH_MKDIR, mkdir(p, m));
}
static int th_unlink(const char *p)
{
        HOOKED(TH_UNLINK, unlink(p));
}

static const struct cove_sysio th_io = {
    .open = th_open,
    .write = th_write,
    .pwrite = th_pwrite,
    .fsync = th_fsync,
    .fdatasync = th_fdatasync,
    .syncfs = th_syncfs,
    .rename = th_rename,
    .mkdir = th_mkdir,
    .unlink = th_unlink,
};

int cove_testhooks_open(const char *path, struct cove_err *err)
{
        if (strlen(path) >= sizeof(th.path))
                return cove_err_set(err, ENAMETOOLONG, "test hooks file");
        struct th_state n;
        memset(&n, 0, sizeof(n));
        if (parse(path, &n, err) < 0)
                return -1;
        pthread_mutex_lock(&th.mu);
        snprintf(th.path, sizeof(th.path), "%s", path);
        stat(path, &th.seen);
        th.offset_ms = n.offset_ms;
        th.grace_ms = n.grace_ms;
        th.job_hold_ms = n.job_hold_ms;
        th.reap_hold_ms = n.reap_hold_ms;
        memcpy(th.f, n.f, sizeof(th.f));
        th.nf = n.nf;
        th_on = 1;
        pthread_mutex_unlock(&th.mu);
        return 0;
}

const struct cove_sysio *cove_testhooks_io(void)
{
        return th_on ? &th_io : NULL;
}

int64_t cove_testhooks_clock_offset_ms(void)
{
        if (!th_on)
                return 0;
        pthread_mutex_lock(&th.mu);
        refresh();
        int64_t o = th.offset_ms;
        pthread_mutex_unlock(&th.mu);
        return o;
}

int64_t cove_testhooks_gc_grace_ms(void)
{
        if (!th_on)
                return 0;
        pthread_mutex_lock(&th.mu);
        refresh();
        int64_t g = th.grace_ms;
        pthread_mutex_unlock(&th.mu);
        return g;
}

int64_t cove_testhooks_job_hold_ms(void)
{
        if (!th_on)
                return 0;
        pthread_mutex_lock(&th.mu);
        refresh();
        int64_t v = th.job_hold_ms;
        pthread_mutex_unlock(&th.mu);
        return v;
}

int64_t cove_testhooks_reap_hold_ms(void)
{
        if (!th_on)
                return 0;
        pthread_mutex_lock(&th.mu);
        refresh();
        int64_t v = th.reap_hold_ms;
        pthread_mutex_unlock(&th.mu);
        return v;
}
