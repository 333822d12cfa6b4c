/* cgroup v1/v2/hybrid handling for the ns runtime (see cgroup.h).
 * v1: one directory per controller mount (cpu and cpuacct may be co-mounted: deduplicated by
 * mount point). v2: one directory under the unified mount with memory/cpu/pids enabled in
 * the root's and cove/'s subtree_control. Hybrid hosts with v1 controllers use v1. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>
#include <linux/magic.h>

#include "runtime/cgroup.h"
#include "util/cleanup.h"

enum {
        CG_MEMORY = 1 << 0,
        CG_CPU = 1 << 1,
        CG_CPUACCT = 1 << 2,
        CG_PIDS = 1 << 3,
        CG_FREEZER = 1 << 4,
        CG_CPUSET = 1 << 5,
};
#define CG_MAX_HIER 8
#define CG_WORK "work"   /* the workload's group under cove/<id> (limits.guest_reserve_mb) */
#define CG_GUEST "guest" /* v2: PID 1's leaf beside it (no processes in inner groups) */

struct cove_cgroups {
        int v2;                           /* unified hierarchy in use */
        int nhier;                        /* v1: number of distinct mounts used */
        char root[CG_MAX_HIER][PATH_MAX]; /* mount point per hierarchy */
        unsigned ctrls[CG_MAX_HIER];      /* CG_* controllers on that mount */
        /* cove_cgroup_prime(): the mount of hierarchy 0 shows the whole (namespace's) tree,
         * so /proc/self/cgroup's path of coved under it names coved's own group */
        int prime_ok;
};

static const struct {
        const char *name;
        unsigned bit;
} v1_ctrls[] = {
    {"memory", CG_MEMORY}, {"cpu", CG_CPU},         {"cpuacct", CG_CPUACCT},
    {"pids", CG_PIDS},     {"freezer", CG_FREEZER}, {"cpuset", CG_CPUSET},
};

static int write_str(const char *path, const char *s)
{
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0)
                return -1;
        size_t n = strlen(s);
        ssize_t w = write(fd, s, n);
        int saved = errno;
        close(fd);
        errno = saved;
        if (w < 0)
                return -1;
        return (size_t)w == n ? 0 : (errno = EIO, -1);
}

static ssize_t read_str(const char *path, char *buf, size_t cap)
{
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -1;
        ssize_t n = read(fd, buf, cap - 1);
        int saved = errno;
        close(fd);
        errno = saved;
        if (n < 0)
                return -1;
        buf[n] = 0;
        return n;
}

static int has_opt(const char *opts, const char *name)
{
        size_t l = strlen(name);
        for (const char *p = opts; p && *p;) {
                const char *c = strchr(p, ',');
                size_t n = c ? (size_t)(c - p) : strlen(p);
                if (n == l && strncmp(p, name, l) == 0)
                        return 1;
                p = c ? c + 1 : NULL;
        }
        return 0;
}

static int probe_v1(struct cove_cgroups *cg)
{
        cleanup_fclose FILE *f = fopen("/proc/self/mountinfo", "re");
        if (!f)
                return -1;
        char line[4096];
        while (fgets(line, sizeof(line), f)) {
                /* id parent maj:min root mountpoint opts [optional...] - fstype source superopts */
                char *sep = strstr(line, " - ");
                if (!sep)
                        continue;
                char fstype[64], source[256], sopts[1024], mp[PATH_MAX];
                if (sscanf(sep + 3, "%63s %255s %1023s", fstype, source, sopts) != 3)
                        continue;
                if (strcmp(fstype, "cgroup") != 0)
                        continue;
                if (sscanf(line, "%*s %*s %*s %*s %4095s", mp) != 1)
                        continue;
                unsigned bits = 0;
                for (size_t i = 0; i < COVE_ARRAY_SIZE(v1_ctrls); i++)
                        if (has_opt(sopts, v1_ctrls[i].name))
                                bits |= v1_ctrls[i].bit;
                if (!bits)
                        continue;
                int dup = 0;
                for (int i = 0; i < cg->nhier; i++)
                        if ((cg->ctrls[i] & bits) || strcmp(cg->root[i], mp) == 0)
                                dup = 1;
                if (dup || cg->nhier == CG_MAX_HIER)
                        continue;
                snprintf(cg->root[cg->nhier], PATH_MAX, "%s", mp);
                cg->ctrls[cg->nhier++] = bits;
        }
        return 0;
}

static unsigned all_ctrls(const struct cove_cgroups *cg)
{
        unsigned b = 0;
        for (int i = 0; i < cg->nhier; i++)
                b |= cg->ctrls[i];
        return b;
}

/* Whether the cgroup mount at mp has the root of the cgroup tree as its root (mountinfo's
 * 4th field is "/"): then a path from /proc/self/cgroup is a path under mp. */
static int mount_is_tree_root(const char *mp)
{
        cleanup_fclose FILE *f = fopen("/proc/self/mountinfo", "re");
        char line[4096], root[PATH_MAX], at[PATH_MAX];
        while (f && fgets(line, sizeof(line), f))
                if (sscanf(line, "%*s %*s %*s %4095s %4095s", root, at) == 2 && !strcmp(at, mp))
                        return !strcmp(root, "/");
        return 0;
}

struct cove_cgroup_primer {
        char procs[PATH_MAX]; /* mount of the hierarchy; coved's own group is appended */
        int v2;
        char ctrl[16]; /* v1: a controller of that mount, to find its line */
        pthread_t thr;
        pthread_mutex_t mu;
        pthread_cond_t cv; /* CLOCK_MONOTONIC */
        int stop;
};

/* coved's group in the primer's hierarchy, from /proc/self/cgroup: "0::/path" (v2),
 * "N:a,b:/path" (v1). */
static int self_cgroup(const struct cove_cgroup_primer *j, char *out, size_t cap)
{
        cleanup_fclose FILE *f = fopen("/proc/self/cgroup", "re");
        char line[PATH_MAX + 64];
        while (f && fgets(line, sizeof(line), f)) {
                line[strcspn(line, "\n")] = 0;
                char *c1 = strchr(line, ':');
                char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
                if (!c2)
                        continue;
                *c2 = 0;
                int match = j->v2 ? c1 == line + 1 && line[0] == '0' && c2 == c1 + 1
                                  : has_opt(c1 + 1, j->ctrl);
                if (match && c2[1] == '/' && !strstr(c2 + 1, "/..")) {
                        snprintf(out, cap, "%s", c2 + 1);
                        return 0;
                }
        }
        return -1;
}

#define PRIME_EVERY_MS 3 /* well inside a grace period: the lock never goes idle meanwhile */
#define PRIME_MAX_MS 2000

static void *prime_main(void *arg)
{
        struct cove_cgroup_primer *j = arg;
        char pid[16];
        snprintf(pid, sizeof(pid), "%d", (int)getpid());
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        pthread_mutex_lock(&j->mu);
        for (int ms = 0; !j->stop && ms < PRIME_MAX_MS; ms += PRIME_EVERY_MS) {
                pthread_mutex_unlock(&j->mu);
                /* re-read each time: whoever moves coved elsewhere is not undone (a move
                 * racing this one is serialised by the kernel's cgroup_mutex) */
                char rel[PATH_MAX], p[2 * PATH_MAX + 32];
                int ok = self_cgroup(j, rel, sizeof(rel)) == 0;
                if (ok) {
                        snprintf(p, sizeof(p), "%s%s/cgroup.procs", j->procs,
                                 strcmp(rel, "/") ? rel : "");
                        ok = write_str(p, pid) == 0; /* a refusal: no head start, no harm */
                }
                pthread_mutex_lock(&j->mu);
                if (!ok)
                        break;
                ts.tv_nsec += PRIME_EVERY_MS * 1000000L;
                if (ts.tv_nsec >= 1000000000L) {
                        ts.tv_sec++;
                        ts.tv_nsec -= 1000000000L;
                }
                while (!j->stop && pthread_cond_timedwait(&j->cv, &j->mu, &ts) == 0)
                        ;
        }
        pthread_mutex_unlock(&j->mu);
        return NULL;
}

struct cove_cgroup_primer *cove_cgroup_prime(const struct cove_cgroups *cg)
{
        if (!cg->prime_ok)
                return NULL;
        struct cove_cgroup_primer *j = calloc(1, sizeof(*j));
        if (!j)
                return NULL;
        snprintf(j->procs, sizeof(j->procs), "%s", cg->root[0]);
        j->v2 = cg->v2;
        for (size_t i = 0; i < COVE_ARRAY_SIZE(v1_ctrls); i++)
                if (cg->ctrls[0] & v1_ctrls[i].bit) {
                        snprintf(j->ctrl, sizeof(j->ctrl), "%s", v1_ctrls[i].name);
                        break;
                }
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&j->cv, &ca);
        pthread_condattr_destroy(&ca);
        pthread_mutex_init(&j->mu, NULL);
        if (pthread_create(&j->thr, NULL, prime_main, j) != 0) {
                pthread_cond_destroy(&j->cv);
                pthread_mutex_destroy(&j->mu);
                free(j);
                return NULL;
        }
        return j;
}

void cove_cgroup_prime_end(struct cove_cgroup_primer *p)
{
        if (!p)
                return;
        pthread_mutex_lock(&p->mu);
        p->stop = 1;
        pthread_cond_signal(&p->cv);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->thr, NULL);
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        free(p);
}

/* v1 cpuset: a new group starts with no CPUs and no memory nodes (no task can join it) unless
 * its parent has clone_children: cove/ gets the root's and passes them on */
static int cpuset_prepare(const char *root)
{
        static const char *const f[] = {"cpuset.cpus", "cpuset.mems"};
        for (size_t i = 0; i < COVE_ARRAY_SIZE(f); i++) {
                char p[PATH_MAX + 64], v[4096];
                snprintf(p, sizeof(p), "%s/cove/%s", root, f[i]);
                if (read_str(p, v, sizeof(v)) < 0)
                        return -1;
                if (v[0] && v[0] != '\n')
                        continue; /* set already (another coved, an earlier run) */
                char rp[PATH_MAX + 64];
                snprintf(rp, sizeof(rp), "%s/%s", root, f[i]);
                if (read_str(rp, v, sizeof(v)) < 0 || write_str(p, v) < 0)
                        return -1;
        }
        char p[PATH_MAX + 64];
        snprintf(p, sizeof(p), "%s/cove/cgroup.clone_children", root);
        return write_str(p, "1");
}

#define CG_CPUS_MAX 1024

/* "0-3,8,10-11" -> the CPU numbers, ascending; their count */
static int parse_cpulist(const char *s, unsigned *out, int cap)
{
        int n = 0;
        while (*s && *s != '\n' && n < cap) {
                char *e;
                unsigned long a = strtoul(s, &e, 10), b = a;
                if (e == s)
                        return -1;
                if (*e == '-') {
                        s = e + 1;
                        b = strtoul(s, &e, 10);
                        if (e == s || b < a)
                                return -1;
                }
                for (unsigned long c = a; c <= b && n < cap; c++)
                        out[n++] = (unsigned)c;
                s = *e == ',' ? e + 1 : e;
        }
        return n;
}

struct cove_cgroups *cove_cgroups_open(struct cove_err *err)
{
        struct cove_cgroups *cg = calloc(1, sizeof(*cg));
        if (!cg) {
                cove_err_set(err, ENOMEM, "cgroups");
                return NULL;
        }
        struct statfs sf;
        if (statfs("/sys/fs/cgroup", &sf) == 0 && sf.f_type == CGROUP2_SUPER_MAGIC) {
                cg->v2 = 1;
        } else {
                probe_v1(cg);
                unsigned need = CG_MEMORY | CG_PIDS | CG_FREEZER;
                if ((all_ctrls(cg) & need) != need) {
                        /* no usable v1: try a v2 mount with controllers (hybrid the other way) */
                        char buf[256];
                        if (read_str("/sys/fs/cgroup/unified/cgroup.controllers", buf,
                                     sizeof(buf)) > 0 &&
                            strstr(buf, "memory") && strstr(buf, "pids")) {
                                cg->v2 = 1;
                                cg->nhier = 0;
                                snprintf(cg->root[0], PATH_MAX, "/sys/fs/cgroup/unified");
                        } else {
                                cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                              "cgroups: need memory, pids and freezer "
                                              "controllers (v1) or a cgroup2 mount with them");
                                free(cg);
                                return NULL;
                        }
                }
        }
        if (cg->v2) {
                if (!cg->root[0][0])
                        snprintf(cg->root[0], PATH_MAX, "/sys/fs/cgroup");
                cg->nhier = 1;
                cg->ctrls[0] = CG_MEMORY | CG_CPU | CG_CPUACCT | CG_PIDS | CG_FREEZER | CG_CPUSET;
                char p[PATH_MAX + 64];
                snprintf(p, sizeof(p), "%s/cgroup.subtree_control", cg->root[0]);
                /* best effort per controller: cpu may be missing on some hosts */
                write_str(p, "+memory");
                write_str(p, "+pids");
                write_str(p, "+cpu");
                write_str(p, "+cpuset");
                snprintf(p, sizeof(p), "%s/cove", cg->root[0]);
                if (mkdir(p, 0755) < 0 && errno != EEXIST) {
                        cove_err_set(err, errno, "cgroups: mkdir %s", p);
                        free(cg);
                        return NULL;
                }
                snprintf(p, sizeof(p), "%s/cove/cgroup.subtree_control", cg->root[0]);
                write_str(p, "+memory");
                write_str(p, "+pids");
                write_str(p, "+cpu");
                write_str(p, "+cpuset");
                cg->prime_ok = mount_is_tree_root(cg->root[0]);
                return cg;
        }
        for (int i = 0; i < cg->nhier; i++) {
                char p[PATH_MAX + 64];
                snprintf(p, sizeof(p), "%s/cove", cg->root[i]);
                if (mkdir(p, 0755) < 0 && errno != EEXIST) {
                        cove_err_set(err, errno, "cgroups: mkdir %s", p);
                        free(cg);
                        return NULL;
                }
                if ((cg->ctrls[i] & CG_CPUSET) && cpuset_prepare(cg->root[i]) < 0) {
                        cove_err_set(err, errno, "cgroups: cpuset %s/cove", cg->root[i]);
                        free(cg);
                        return NULL;
                }
        }
        cg->prime_ok = mount_is_tree_root(cg->root[0]);
        return cg;
}

void cove_cgroups_free(struct cove_cgroups *cg)
{
        free(cg);
}

const char *cove_cgroups_mode(const struct cove_cgroups *cg)
{
        return cg->v2 ? "v2" : "v1";
}

/* Directory of cove/<id> in the hierarchy holding ctrl (or hierarchy i when ctrl == 0). */
static int grp_path(const struct cove_cgroups *cg, int i, const char *id, const char *file,
                    char *out, size_t cap)
{
        int n = snprintf(out, cap, "%s/cove/%s%s%s", cg->root[i], id, file ? "/" : "",
                         file ? file : "");
        return n < 0 || (size_t)n >= cap ? -1 : 0;
}

static int hier_of(const struct cove_cgroups *cg, unsigned ctrl)
{
        for (int i = 0; i < cg->nhier; i++)
                if (cg->ctrls[i] & ctrl)
                        return i;
        return -1;
}

static int set_knob(const struct cove_cgroups *cg, unsigned ctrl, const char *id, const char *file,
                    const char *val, struct cove_err *err)
{
        int i = hier_of(cg, ctrl);
        if (i < 0)
                return 0; /* controller absent: limit not enforceable, not fatal */
        char p[PATH_MAX + 256];
        if (grp_path(cg, i, id, file, p, sizeof(p)) < 0)
                return cove_err_set(err, ENAMETOOLONG, "cgroup %s", id);
        if (write_str(p, val) < 0)
                return cove_err_set(err, errno, "cgroup: write %s to %s", val, p);
        return 0;
}

/* work's memory limit: memory_mb less the guest's reserve (at most half of it) */
static unsigned long long work_bytes(const struct cove_cgroup_limits *lim)
{
        unsigned r = lim->guest_reserve_mb;
        if (r > lim->memory_mb / 2)
                r = lim->memory_mb / 2;
        return (unsigned long long)(lim->memory_mb - r) << 20;
}

static int check_id(const char *id, struct cove_err *err)
{
        if (!id || !*id || strchr(id, '/') || strcmp(id, ".") == 0 || strcmp(id, "..") == 0 ||
            strlen(id) > 128)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, EINVAL, "cgroup: bad id");
        return 0;
}

/* Pin cove/<id> to `cpus` of the CPUs cove/ has (then the sandbox counts that many: nproc,
 * sysconf and, through lxcfs, /proc/cpuinfo), starting at a place given by the id so that
 * sandboxes spread over the host. Nothing when cpus covers them all. */
static int cpuset_pin(const struct cove_cgroups *cg, const char *id, unsigned cpus,
                      struct cove_err *err)
{
        int h = hier_of(cg, CG_CPUSET);
        if (h < 0 || !cpus)
                return 0;
        char p[PATH_MAX + 256], v[4096];
        snprintf(p, sizeof(p), "%s/cove/%s", cg->root[h],
                 cg->v2 ? "cpuset.cpus.effective" : "cpuset.cpus");
        unsigned *l = calloc(CG_CPUS_MAX, sizeof(*l));
        if (!l)
                return cove_err_set(err, ENOMEM, "cgroup: cpuset");
        int n = read_str(p, v, sizeof(v)) < 0 ? -1 : parse_cpulist(v, l, CG_CPUS_MAX);
        if (n <= 0 || cpus >= (unsigned)n) {
                free(l);
                return 0; /* no cpuset (v2 without the controller) or all of them */
        }
        uint32_t hsh = 2166136261u;
        for (const char *c = id; *c; c++)
                hsh = (hsh ^ (uint8_t)*c) * 16777619u;
        char out[4096];
        size_t o = 0;
        for (unsigned k = 0; k < cpus && o + 16 < sizeof(out); k++)
                o += (size_t)snprintf(out + o, sizeof(out) - o, "%s%u", k ? "," : "",
                                      l[(hsh + k) % (unsigned)n]);
        free(l);
        if (set_knob(cg, CG_CPUSET, id, "cpuset.cpus", out, err) < 0)
                return -1;
        return 0;
}

int cove_cgroup_create(const struct cove_cgroups *cg, const char *id,
                       const struct cove_cgroup_limits *lim, struct cove_err *err)
{
        if (check_id(id, err) < 0)
                return -1;
        char p[PATH_MAX + 256];
        for (int i = 0; i < cg->nhier; i++) {
                grp_path(cg, i, id, NULL, p, sizeof(p));
                if (mkdir(p, 0755) < 0 && errno != EEXIST) {
                        cove_err_set(err, errno, "cgroup: mkdir %s", p);
                        goto fail;
                }
        }
        char v[64], wid[PATH_MAX];
        int mh = hier_of(cg, CG_MEMORY);
        int split = lim->guest_reserve_mb && mh >= 0;
        unsigned long long total = (unsigned long long)lim->memory_mb << 20;
        snprintf(wid, sizeof(wid), "%s/" CG_WORK, id);
        if (split) {
                grp_path(cg, mh, wid, NULL, p, sizeof(p));
                if (mkdir(p, 0755) < 0 && errno != EEXIST) {
                        cove_err_set(err, errno, "cgroup: mkdir %s", p);
                        goto fail;
                }
                if (cg->v2) {
                        char g[PATH_MAX + 8];
                        snprintf(g, sizeof(g), "%s/" CG_GUEST, id);
                        grp_path(cg, mh, g, NULL, p, sizeof(p));
                        if (mkdir(p, 0755) < 0 && errno != EEXIST) {
                                cove_err_set(err, errno, "cgroup: mkdir %s", p);
                                goto fail;
                        }
                }
        }
        if (lim->cpu_view && cpuset_pin(cg, id, lim->cpus, err) < 0)
                goto fail;
        if (cg->v2) {
                if (lim->memory_mb) {
                        snprintf(v, sizeof(v), "%llu", total);
                        if (set_knob(cg, CG_MEMORY, id, "memory.max", v, err) < 0)
                                goto fail;
                        set_knob(cg, CG_MEMORY, id, "memory.swap.max", "0", NULL);
                }
                /* work's limits are set now and apply once cove_cgroup_work_split() turns
                 * the memory controller on for cove/<id>'s children (the files appear then) */
                if (lim->cpus) {
                        snprintf(v, sizeof(v), "%u 100000", lim->cpus * 100000);
                        if (set_knob(cg, CG_CPU, id, "cpu.max", v, err) < 0)
                                goto fail;
                }
                if (lim->pids_max) {
                        snprintf(v, sizeof(v), "%u", lim->pids_max);
                        if (set_knob(cg, CG_PIDS, id, "pids.max", v, err) < 0)
                                goto fail;
                }
                return 0;
        }
        if (lim->memory_mb) {
                snprintf(v, sizeof(v), "%llu", total);
                if (set_knob(cg, CG_MEMORY, id, "memory.limit_in_bytes", v, err) < 0)
                        goto fail;
                /* no escape into swap; the knob exists only with swap accounting */
                set_knob(cg, CG_MEMORY, id, "memory.memsw.limit_in_bytes", v, NULL);
                if (split) {
                        snprintf(v, sizeof(v), "%llu", work_bytes(lim));
                        if (set_knob(cg, CG_MEMORY, wid, "memory.limit_in_bytes", v, err) < 0)
                                goto fail;
                        set_knob(cg, CG_MEMORY, wid, "memory.memsw.limit_in_bytes", v, NULL);
                }
        }
        if (lim->cpus) {
                if (set_knob(cg, CG_CPU, id, "cpu.cfs_period_us", "100000", err) < 0)
                        goto fail;
                snprintf(v, sizeof(v), "%u", lim->cpus * 100000);
                if (set_knob(cg, CG_CPU, id, "cpu.cfs_quota_us", v, err) < 0)
                        goto fail;
        }
        if (lim->pids_max) {
                snprintf(v, sizeof(v), "%u", lim->pids_max);
                if (set_knob(cg, CG_PIDS, id, "pids.max", v, err) < 0)
                        goto fail;
        }
        return 0;
fail:
        cove_cgroup_remove(cg, id, NULL);
        return cove_err_wrap(err, "create cgroup %s", id);
}

int cove_cgroup_attach(const struct cove_cgroups *cg, const char *id, pid_t pid,
                       struct cove_err *err)
{
        char p[PATH_MAX + 256], v[32];
        snprintf(v, sizeof(v), "%d", (int)pid);
        for (int i = 0; i < cg->nhier; i++) {
                grp_path(cg, i, id, "cgroup.procs", p, sizeof(p));
                if (write_str(p, v) < 0)
                        return cove_err_set(err, errno, "cgroup: attach %d to %s", (int)pid, p);
        }
        return 0;
}

static void sleep_ms(long ms)
{
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
}

int cove_cgroup_freeze(const struct cove_cgroups *cg, const char *id, int frozen,
                       struct cove_err *err)
{
        int i = hier_of(cg, CG_FREEZER);
        if (i < 0)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, ENOTSUP, "cgroup: no freezer");
        char p[PATH_MAX + 256], buf[512];
        if (cg->v2) {
                grp_path(cg, i, id, "cgroup.freeze", p, sizeof(p));
                if (write_str(p, frozen ? "1" : "0") < 0)
                        return cove_err_set(err, errno, "cgroup: write %s", p);
                grp_path(cg, i, id, "cgroup.events", p, sizeof(p));
                const char *want = frozen ? "frozen 1" : "frozen 0";
                for (int t = 0; t < 5000; t++) {
                        if (read_str(p, buf, sizeof(buf)) < 0)
                                return cove_err_set(err, errno, "cgroup: read %s", p);
                        if (strstr(buf, want))
                                return 0;
                        sleep_ms(1);
                }
                return cove_err_set(err, ETIMEDOUT, "cgroup: %s %s", frozen ? "freeze" : "thaw",
                                    id);
        }
        grp_path(cg, i, id, "freezer.state", p, sizeof(p));
        const char *want = frozen ? "FROZEN" : "THAWED";
        for (int t = 0; t < 5000; t++) {
                /* v1: FREEZING may need the write repeated when new tasks appeared */
                if (t % 50 == 0 && write_str(p, want) < 0)
                        return cove_err_set(err, errno, "cgroup: write %s", p);
                if (read_str(p, buf, sizeof(buf)) < 0)
                        return cove_err_set(err, errno, "cgroup: read %s", p);
                if (strncmp(buf, want, strlen(want)) == 0)
                        return 0;
                sleep_ms(1);
        }
        return cove_err_set(err, ETIMEDOUT, "cgroup: %s %s", frozen ? "freeze" : "thaw", id);
}

/* Kill what cgroup.procs lists; returns the number of tasks seen, -1 when the group is gone. */
static int kill_listed(const char *procs)
{
        FILE *f = fopen(procs, "re");
        if (!f)
                return -1;
        int n = 0;
        long pid;
        while (fscanf(f, "%ld", &pid) == 1) {
                if (pid > 0)
                        kill((pid_t)pid, SIGKILL);
                n++;
        }
        fclose(f);
        return n;
}

/* kill_listed() of the work and guest groups in the memory hierarchy (the tasks there are
 * listed by the other hierarchies' cove/<id> on v1, by nothing else on v2) */
static int kill_children(const struct cove_cgroups *cg, const char *id)
{
        int mh = hier_of(cg, CG_MEMORY), n = 0;
        if (mh < 0)
                return 0;
        static const char *const subs[] = {CG_WORK, CG_GUEST};
        for (size_t i = 0; i < COVE_ARRAY_SIZE(subs); i++) {
                char sub[PATH_MAX], p[PATH_MAX + 256];
                snprintf(sub, sizeof(sub), "%s/%s", id, subs[i]);
                grp_path(cg, mh, sub, "cgroup.procs", p, sizeof(p));
                int k = kill_listed(p);
                if (k > 0)
                        n += k;
        }
        return n;
}

/* One pass: SIGKILL every listed task (cgroup.kill on v2), then thaw. Kill first, then
 * thaw: frozen tasks die as soon as they run again, and they cannot fork in between because
 * SIGKILL is already pending. */
static void kill_pass(const struct cove_cgroups *cg, const char *id, const char *procs, int fz)
{
        if (cg->v2) {
                char kp[PATH_MAX + 256];
                grp_path(cg, 0, id, "cgroup.kill", kp, sizeof(kp));
                write_str(kp, "1");
        }
        kill_listed(procs);
        kill_children(cg, id);
        if (fz >= 0) {
                char fp[PATH_MAX + 256];
                grp_path(cg, fz, id, cg->v2 ? "cgroup.freeze" : "freezer.state", fp, sizeof(fp));
                write_str(fp, cg->v2 ? "0" : "THAWED");
        }
}

int cove_cgroup_signal_kill(const struct cove_cgroups *cg, const char *id, struct cove_err *err)
{
        if (check_id(id, err) < 0)
                return -1;
        char p[PATH_MAX + 256];
        int k = hier_of(cg, CG_PIDS);
        grp_path(cg, k < 0 ? 0 : k, id, "cgroup.procs", p, sizeof(p));
        if (access(p, F_OK) == 0)
                kill_pass(cg, id, p, hier_of(cg, CG_FREEZER));
        return 0;
}

int cove_cgroup_kill(const struct cove_cgroups *cg, const char *id, struct cove_err *err)
{
        if (check_id(id, err) < 0)
                return -1;
        char p[PATH_MAX + 256];
        int fz = hier_of(cg, CG_FREEZER);
        int k = hier_of(cg, CG_PIDS);
        if (k < 0)
                k = 0;
        grp_path(cg, k, id, "cgroup.procs", p, sizeof(p));
        if (access(p, F_OK) < 0)
                return 0;
        kill_pass(cg, id, p, fz);
        for (int t = 0; t < 5000; t++) {
                int n = kill_listed(p), m = kill_children(cg, id);
                if (n <= 0 && m <= 0)
                        return 0;
                sleep_ms(1);
        }
        return cove_err_set(err, EBUSY, "cgroup %s: tasks survive SIGKILL", id);
}

int cove_cgroup_remove(const struct cove_cgroups *cg, const char *id, struct cove_err *err)
{
        if (check_id(id, err) < 0)
                return -1;
        char p[PATH_MAX + 256];
        int rc = 0;
        for (int i = 0; i < cg->nhier; i++) {
                static const char *const subs[] = {CG_WORK, CG_GUEST};
                for (size_t k = 0; k < COVE_ARRAY_SIZE(subs); k++) {
                        char sub[PATH_MAX];
                        snprintf(sub, sizeof(sub), "%s/%s", id, subs[k]);
                        grp_path(cg, i, sub, NULL, p, sizeof(p));
                        for (int t = 0; t < 1000 && rmdir(p) < 0 && errno == EBUSY; t++)
                                sleep_ms(1);
                }
                grp_path(cg, i, id, NULL, p, sizeof(p));
                int t;
                /* an exiting task may keep the group busy for a moment */
                for (t = 0; t < 1000; t++) {
                        if (rmdir(p) == 0 || errno == ENOENT)
                                break;
                        if (errno != EBUSY) {
                                rc = cove_err_set(err, errno, "cgroup: rmdir %s", p);
                                break;
                        }
                        sleep_ms(1);
                }
                if (t == 1000)
                        rc = cove_err_set(err, EBUSY, "cgroup: rmdir %s", p);
        }
        return rc;
}

static int read_u64(const char *path, uint64_t *v)
{
        char buf[64];
        if (read_str(path, buf, sizeof(buf)) < 0)
                return -1;
        *v = strtoull(buf, NULL, 10);
        return 0;
}

int cove_cgroup_usage(const struct cove_cgroups *cg, const char *id, uint64_t *mem_bytes,
                      uint64_t *cpu_usec, struct cove_err *err)
{
        char p[PATH_MAX + 256];
        *mem_bytes = 0;
        *cpu_usec = 0;
        int m = hier_of(cg, CG_MEMORY), c = hier_of(cg, CG_CPUACCT);
        if (cg->v2) {
                grp_path(cg, 0, id, "memory.current", p, sizeof(p));
                if (read_u64(p, mem_bytes) < 0)
                        return cove_err_set(err, errno, "cgroup: read %s", p);
                char buf[1024];
                grp_path(cg, 0, id, "cpu.stat", p, sizeof(p));
                if (read_str(p, buf, sizeof(buf)) < 0)
                        return cove_err_set(err, errno, "cgroup: read %s", p);
                char *u = strstr(buf, "usage_usec ");
                if (u)
                        *cpu_usec = strtoull(u + 11, NULL, 10);
                return 0;
        }
        if (m >= 0) {
                grp_path(cg, m, id, "memory.usage_in_bytes", p, sizeof(p));
                if (read_u64(p, mem_bytes) < 0)
                        return cove_err_set(err, errno, "cgroup: read %s", p);
        }
        if (c >= 0) {
                uint64_t ns = 0;
                grp_path(cg, c, id, "cpuacct.usage", p, sizeof(p));
                if (read_u64(p, &ns) < 0)
                        return cove_err_set(err, errno, "cgroup: read %s", p);
                *cpu_usec = ns / 1000;
        }
        return 0;
}

int cove_cgroup_exists(const struct cove_cgroups *cg, const char *id)
{
        char p[PATH_MAX + 256];
        for (int i = 0; i < cg->nhier; i++) {
                grp_path(cg, i, id, NULL, p, sizeof(p));
                if (access(p, F_OK) == 0)
                        return 1;
        }
        return 0;
}

int cove_cgroup_work_dir(const struct cove_cgroups *cg, const char *id, char *out, size_t cap)
{
        int mh = hier_of(cg, CG_MEMORY);
        return mh < 0 ? -1 : grp_path(cg, mh, id, NULL, out, cap);
}

int cove_cgroup_work_delegate(const struct cove_cgroups *cg, const char *id, uid_t uid,
                              struct cove_err *err)
{
        int mh = hier_of(cg, CG_MEMORY);
        if (mh < 0 || check_id(id, err) < 0)
                return mh < 0 ? 0 : -1;
        char p[PATH_MAX + 256], wid[PATH_MAX];
        snprintf(wid, sizeof(wid), "%s/" CG_WORK, id);
        grp_path(cg, mh, wid, "cgroup.procs", p, sizeof(p));
        if (chown(p, uid, (gid_t)-1) < 0)
                return cove_err_set(err, errno, "cgroup: delegate %s", p);
        if (!cg->v2) {
                /* the guest's children move themselves through tasks (guest.h) */
                grp_path(cg, mh, wid, "tasks", p, sizeof(p));
                if (chown(p, uid, (gid_t)-1) < 0 && errno != ENOENT)
                        return cove_err_set(err, errno, "cgroup: delegate %s", p);
        } else {
                grp_path(cg, mh, id, "cgroup.procs", p, sizeof(p));
                if (chown(p, uid, (gid_t)-1) < 0)
                        return cove_err_set(err, errno, "cgroup: delegate %s", p);
                /* the guest's self-freeze (guest/fence.c) freezes work with it; best effort:
                 * without it (a kernel before 5.2) the guest stops the processes by signal */
                grp_path(cg, mh, wid, "cgroup.freeze", p, sizeof(p));
                if (chown(p, uid, (gid_t)-1) < 0 && errno != ENOENT)
                        return cove_err_set(err, errno, "cgroup: delegate %s", p);
        }
        return 0;
}

/* v2: PID 1 into cove/<id>/guest */
static int move_guest(const struct cove_cgroups *cg, const char *id, pid_t pid,
                      struct cove_err *err)
{
        char p[PATH_MAX + 256], sub[PATH_MAX], v[32];
        snprintf(sub, sizeof(sub), "%s/" CG_GUEST, id);
        snprintf(v, sizeof(v), "%d", (int)pid);
        grp_path(cg, 0, sub, "cgroup.procs", p, sizeof(p));
        if (write_str(p, v) < 0)
                return cove_err_set(err, errno, "cgroup: move %d to %s", (int)pid, p);
        return 0;
}

/* v2: the memory controller for cove/<id>'s children (cove/<id> holds no task now), and
 * work's limit */
static int enable_work(const struct cove_cgroups *cg, const char *id,
                       const struct cove_cgroup_limits *lim, struct cove_err *err)
{
        char p[PATH_MAX + 256], sub[PATH_MAX], v[32];
        grp_path(cg, 0, id, "cgroup.subtree_control", p, sizeof(p));
        if (write_str(p, "+memory") < 0)
                return 0; /* no memory controller to hand down (not in cove/'s subtree_control):
                           * the workload shares the sandbox's limit with PID 1, as before */
        snprintf(sub, sizeof(sub), "%s/" CG_WORK, id);
        if (lim->memory_mb) {
                snprintf(v, sizeof(v), "%llu", work_bytes(lim));
                if (set_knob(cg, CG_MEMORY, sub, "memory.max", v, err) < 0)
                        return -1;
                set_knob(cg, CG_MEMORY, sub, "memory.swap.max", "0", NULL);
        }
        return 0;
}

int cove_cgroup_work_split(const struct cove_cgroups *cg, const char *id, pid_t pid,
                           const struct cove_cgroup_limits *lim, struct cove_err *err)
{
        if (!cg->v2 || hier_of(cg, CG_MEMORY) < 0)
                return 0;
        if (move_guest(cg, id, pid, err) < 0)
                return -1;
        return enable_work(cg, id, lim, err);
}

int cove_cgroup_work_settle(const struct cove_cgroups *cg, const char *id, pid_t pid,
                            const struct cove_cgroup_limits *lim, struct cove_err *err)
{
        int mh = hier_of(cg, CG_MEMORY);
        if (mh < 0 || check_id(id, err) < 0)
                return mh < 0 ? 0 : -1;
        if (cg->v2 && move_guest(cg, id, pid, err) < 0)
                return -1;
        char procs[PATH_MAX + 256], to[PATH_MAX + 256], wid[PATH_MAX];
        snprintf(wid, sizeof(wid), "%s/" CG_WORK, id);
        grp_path(cg, mh, id, "cgroup.procs", procs, sizeof(procs));
        grp_path(cg, mh, wid, "cgroup.procs", to, sizeof(to));
        /* a task forked meanwhile is born where its parent was: repeat until only PID 1 is
         * left (bounded; the restored tasks are few and a restore runs nothing new yet) */
        for (int round = 0; round < 100; round++) {
                cleanup_fclose FILE *f = fopen(procs, "re");
                if (!f)
                        return cove_err_set(err, errno, "cgroup: read %s", procs);
                long t;
                int moved = 0;
                while (fscanf(f, "%ld", &t) == 1) {
                        if (t <= 0 || t == (long)pid)
                                continue;
                        char v[32];
                        snprintf(v, sizeof(v), "%ld", t);
                        if (write_str(to, v) < 0 && errno != ESRCH)
                                return cove_err_set(err, errno, "cgroup: move %ld to %s", t, to);
                        moved = 1;
                }
                if (!moved)
                        return cg->v2 ? enable_work(cg, id, lim, err) : 0;
        }
        return cove_err_set(err, EAGAIN, "cgroup %s: tasks keep appearing beside PID 1", id);
}

int cove_cgroup_freezer_dir(const struct cove_cgroups *cg, const char *id, char *out, size_t cap)
{
        int i = hier_of(cg, CG_FREEZER);
        return i < 0 ? -1 : grp_path(cg, i, id, NULL, out, cap);
}
