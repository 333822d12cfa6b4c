/* Instances, uid ranges and the channel I/O thread; see node.h. */
#include "node/node.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/statvfs.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "proto/frame.h"
#include "util/cleanup.h"
#include "util/testhooks.h"
#include "util/util.h"

#define HELLO_TIMEOUT_MS 10000
/* Heartbeat: a guest silent this long (ms) although pinged, none of whose threads is
 * runnable or in uninterruptible sleep, in a cgroup that is not frozen, and none of whose
 * bytes wait unread on its channel (a node too loaded to read them in time), is hung. A guest
 * starved by load stays runnable ('R') and one waiting on a slow disk sleeps in 'D', so
 * neither is taken for hung however long it takes; the figure only bounds how long a truly
 * stuck guest (stopped, deadlocked) holds requests. A vm's init is its VMM, whose threads
 * sleep while its guest kernel is stuck as well as idle: the same rule, a longer grace. */
#define HUNG_NS_MS 5000
#define HUNG_VM_MS 15000
#define HEARTBEAT_TICK_MS 500
#define STALL_MS 2000 /* a heartbeat round this late: the node itself was stopped */
/* restorer threads next to the spawner: a fork of FORK_MAX (control/snapshot.c) restores up to
 * this many at once */
#define SPAWN_RESTORERS 8
#define LOW_SPACE_MB 16 /* free MB on the data disk under which pooled instances are suspect */

struct inst {
        struct inst *next;
        char id[64];
        struct cove_instance ri;
        const struct cove_runtime_ops *ops; /* its driver */
        struct cove_runtime *rt;
        struct cove_chan *chan;
        uint32_t uid_base;
        int stopping;      /* cove_node_stop owns it now: no on_dead callback */
        struct pool *pool; /* non-NULL while it waits, idle, in a warm pool */
        int busy;          /* layer snapshots in progress: stop waits for them */
        int warming;       /* pooled, but not ready to be taken yet (warm_up running) */
        int frozen;        /* cove_node_freeze() froze it (or a full dump left it frozen) */
        int held;          /* hot-paused (cove_node_hold): not running to anyone asking */
        int fence_ttl_ms;  /* the fence TTL its guest was told (0: none) */
};

/* A warm pool: instances started ahead of time for one template and shape, so a create
 * only has to take one (docs/architecture.md §3). Each pooled instance is a complete sandbox with
 * its final id, uid range and limits; taking it hands all of that to the new sandbox. */
struct pool {
        struct pool *next;
        char owner[64]; /* "": plain instances; else keyed for this owner (cfg.layer_key) */
        int dropped;    /* cove_node_pool_drop(): target 0, never taken from again */
        char runtime[16];
        char rootfs[PATH_MAX];
        unsigned cpus, memory_mb, disk_mb;
        int target;             /* instances to keep ready: base .. max */
        int base;               /* the size asked for (cove_node_pool_add) */
        int max;                /* target grows up to this with the bursts (>= base) */
        int burst;              /* takes and misses since it was last full */
        int64_t last_use_ns;    /* the last take or miss (0: none yet) */
        int64_t defer_since_ns; /* its refill waits for a gap in creates since (0: not) */
        int starting;           /* being started by the refill thread */
        int64_t retry_at_ns;    /* after a failed start: back off until then */
        uint64_t taken, missed;
};

struct cove_node {
        struct cove_node_config cfg;
        char data_dir[PATH_MAX];
        char guest[PATH_MAX];
        struct cove_runtime *rt;
        struct cove_runtime *rt_alt; /* NULL when cfg.rt_alt_ops is absent or cannot run */
        char alt_why[256];           /* why rt_alt is NULL */
        pthread_mutex_t mu;          /* instances, uid slots */
        pthread_cond_t stop_cv;      /* an instance being stopped left the list (with mu) */
        struct inst *insts;
        int ninsts;
        uint8_t slots[COVE_UID_SLOTS];
        int uid_lock_fd; /* host-wide slot locks: byte s of the lock file (OFD locks), or -1 */
        int epfd;
        int wake_fd;
        int quit;
        pthread_t io;
        pthread_mutex_t io_mu; /* held by the I/O thread while it touches channels */
        /* The spawner thread starts instances: a runtime may tie an instance's life to
         * the thread that created it (PR_SET_PDEATHSIG fires when that *thread* exits), and
         * API threads come and go with their connections. */
        pthread_t spawner;
        /* and restorers: long-lived threads like it that take only restores from a checkpoint
         * (spec->mem_image), so a fork of many restores them at once instead of one by one
         * behind each other (a criu restore mostly waits: on its helpers' execs, on the
         * kernel's cgroup attach); plain starts, the pools' refills among them, stay on the
         * spawner */
        pthread_t restorer[SPAWN_RESTORERS];
        int nrestorers;
        pthread_mutex_t sp_mu;
        pthread_cond_t sp_cv;
        struct spawn_job *sp_head;
        /* warm pools, guarded by mu; the refill thread waits on pool_cv */
        struct pool *pools;
        pthread_cond_t pool_cv;
        pthread_t refill;
        int refill_started;
        pthread_t fullcheck; /* the runtime's full-snapshot self-check, once at start */
        int fullcheck_started;
        int fullcheck_done;     /* with mu; full_cv is broadcast when it is set */
        pthread_cond_t full_cv; /* CLOCK_MONOTONIC */
        int pool_quit;
        int64_t last_create_ns; /* the last create (pool take, miss or cold start), with mu */
        /* the reaper: instances cove_node_kill() killed, still to be stopped (with mu) */
        struct reap_job *reap_head;
        pthread_cond_t reap_cv;
        pthread_t reaper;
        int reaper_started;
        int reap_quit;
        /* the data disk ran (nearly) full since the pooled instances started: their layers
         * may have hit write errors (quota.h), so none of them is handed out; the refill
         * thread replaces them once there is room again. With mu. */
        int space_tainted;
        /* guest self-freeze (cove_node_fence_config), with mu */
        int fence_ttl_ms;  /* 0: off (role all) */
        int beat_ms;       /* heartbeat interval */
        int beat_paused;   /* cove_node_heartbeat_pause(): the lease is not confirmed */
        uint64_t beat_seq; /* I/O thread only */
};

struct spawn_job {
        struct spawn_job *next;
        const struct cove_runtime_ops *ops;
        struct cove_runtime *rt;
        const struct cove_instance_spec *spec;
        struct cove_instance *inst;
        struct cove_err *err;
        int urgent;  /* an API request waits for it (not a pool refill): queued first */
        int restore; /* spec->mem_image: a restorer may take it too */
        int64_t queued_ns;
        int done, rc;
};

struct reap_job {
        struct reap_job *next;
        struct inst *in; /* stopping, killed, still listed */
        int purge;
};

/* The first queued job a thread may run (restores_only: a restorer), unlinked; or NULL. With
 * sp_mu. */
static struct spawn_job *spawn_take(struct cove_node *n, int restores_only)
{
        for (struct spawn_job **p = &n->sp_head; *p; p = &(*p)->next)
                if (!restores_only || (*p)->restore) {
                        struct spawn_job *j = *p;
                        *p = j->next;
                        return j;
                }
        return NULL;
}

static void *spawn_loop(struct cove_node *n, int restores_only)
{
        pthread_mutex_lock(&n->sp_mu);
        for (;;) {
                struct spawn_job *j;
                while (!(j = spawn_take(n, restores_only)) && !n->quit)
                        pthread_cond_wait(&n->sp_cv, &n->sp_mu);
                if (!j)
                        break;
                pthread_mutex_unlock(&n->sp_mu);
                int rc = j->ops->start(j->rt, j->spec, j->inst, j->err);
                pthread_mutex_lock(&n->sp_mu);
                j->rc = rc;
                j->done = 1;
                pthread_cond_broadcast(&n->sp_cv);
        }
        pthread_mutex_unlock(&n->sp_mu);
        return NULL;
}

static void *spawner_main(void *arg)
{
        return spawn_loop(arg, 0);
}

static void *restorer_main(void *arg)
{
        return spawn_loop(arg, 1);
}

static void spawners_stop(struct cove_node *n)
{
        pthread_mutex_lock(&n->sp_mu);
        n->quit = 1;
        pthread_cond_broadcast(&n->sp_cv);
        pthread_mutex_unlock(&n->sp_mu);
        pthread_join(n->spawner, NULL);
        for (int i = 0; i < n->nrestorers; i++)
                pthread_join(n->restorer[i], NULL);
        n->nrestorers = 0;
}

/* A refill queued this long is no longer passed by creates, so creates that never pause
 * cannot keep a pool empty for good */
#define SPAWN_REFILL_WAIT_MAX_NS (1000 * 1000000LL)

static int spawn(struct cove_node *n, const struct cove_runtime_ops *ops, struct cove_runtime *rt,
                 const struct cove_instance_spec *spec, struct cove_instance *inst, int urgent,
                 struct cove_err *err)
{
        struct spawn_job j = {.ops = ops,
                              .rt = rt,
                              .spec = spec,
                              .inst = inst,
                              .err = err,
                              .urgent = urgent,
                              .restore = spec->mem_image != NULL};
        j.queued_ns = cove_mono_ns();
        pthread_mutex_lock(&n->sp_mu);
        /* a create that found no warm instance does not queue behind the pools' refills:
         * it goes after the other urgent jobs, ahead of every refill queued for less than
         * SPAWN_REFILL_WAIT_MAX_NS */
        struct spawn_job **tail = &n->sp_head;
        while (*tail && (!urgent || (*tail)->urgent ||
                         j.queued_ns - (*tail)->queued_ns >= SPAWN_REFILL_WAIT_MAX_NS))
                tail = &(*tail)->next;
        j.next = *tail;
        *tail = &j;
        pthread_cond_broadcast(&n->sp_cv);
        while (!j.done)
                pthread_cond_wait(&n->sp_cv, &n->sp_mu);
        pthread_mutex_unlock(&n->sp_mu);
        return j.rc;
}

static void rx_notify(void *arg, struct cove_chan *c)
{
        struct cove_node *n = arg;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        epoll_ctl(n->epfd, EPOLL_CTL_MOD, cove_chan_fd(c), &ev);
}

static struct inst *find_locked(struct cove_node *n, const char *id)
{
        for (struct inst *i = n->insts; i; i = i->next)
                if (!strcmp(i->id, id))
                        return i;
        return NULL;
}

/* The driver with checkpoints (ns: CRIU), default or alternative, or NULL. */
static const struct cove_runtime_ops *ckpt_ops(const struct cove_node *n, struct cove_runtime **rt)
{
        if (n->cfg.rt_ops->full_status) {
                *rt = n->rt;
                return n->cfg.rt_ops;
        }
        if (n->rt_alt && n->cfg.rt_alt_ops && n->cfg.rt_alt_ops->full_status) {
                *rt = n->rt_alt;
                return n->cfg.rt_alt_ops;
        }
        *rt = NULL;
        return NULL;
}

static void *fullcheck_main(void *arg)
{
        struct cove_node *n = arg;
        struct cove_runtime *rt;
        const struct cove_runtime_ops *o = ckpt_ops(n, &rt);
        o->full_selfcheck(rt, n->guest);
        char why[320];
        int st = o->full_status(rt, why, sizeof(why));
        if (st == 1)
                cove_info(n->cfg.log, "snapshot.full", "full snapshots available: %s", why);
        else
                cove_warn(n->cfg.log, "snapshot.full",
                          "full snapshots unavailable (snapshots are kind files): %s", why);
        pthread_mutex_lock(&n->mu);
        n->fullcheck_done = 1;
        pthread_cond_broadcast(&n->full_cv);
        pthread_mutex_unlock(&n->mu);
        return NULL;
}

/* 1 when a thread of pid is runnable or in uninterruptible sleep (starved by load, busy,
 * waiting on a disk), or its cgroup is frozen (v1 freezer or v2 cgroup.freeze, also one a
 * host admin froze): silence from such a guest is no sign of a hang. */
static int cgroup_frozen(pid_t pid)
{
        char path[PATH_MAX], buf[4096];
        snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
        cleanup_free char *cg = NULL;
        size_t len;
        if (cove_read_file(path, 16384, &cg, &len, NULL) < 0)
                return 0;
        int frozen = 0;
        char *save = NULL;
        for (char *line = strtok_r(cg, "\n", &save); line && !frozen;
             line = strtok_r(NULL, "\n", &save)) {
                char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
                if (!c2 || strstr(c2 + 1, ".."))
                        continue;
                *c2 = 0;
                const char *ctrls = c1 + 1, *cgpath = c2 + 1;
                const char *files[3] = {NULL, NULL, NULL};
                char p1[PATH_MAX], p2[PATH_MAX];
                if (!strcmp(ctrls, "freezer") || strstr(ctrls, ",freezer") ||
                    !strncmp(ctrls, "freezer,", 8)) {
                        snprintf(p1, sizeof(p1), "/sys/fs/cgroup/freezer%s/freezer.state", cgpath);
                        files[0] = p1;
                } else if (!*ctrls) {
                        snprintf(p1, sizeof(p1), "/sys/fs/cgroup%s/cgroup.events", cgpath);
                        snprintf(p2, sizeof(p2), "/sys/fs/cgroup/unified%s/cgroup.events", cgpath);
                        files[0] = p1;
                        files[1] = p2;
                }
                for (int i = 0; files[i] && !frozen; i++) {
                        int fd = open(files[i], O_RDONLY | O_CLOEXEC);
                        if (fd < 0)
                                continue;
                        ssize_t k = read(fd, buf, sizeof(buf) - 1);
                        close(fd);
                        if (k <= 0)
                                continue;
                        buf[k] = 0;
                        frozen = strstr(buf, "FROZEN") || strstr(buf, "FREEZING") ||
                                 strstr(buf, "frozen 1");
                }
        }
        return frozen;
}

static int guest_active(pid_t pid)
{
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
        cleanup_dir DIR *d = opendir(path);
        if (!d)
                return 0; /* gone: its channel ends by itself */
        struct dirent *de;
        while ((de = readdir(d))) {
                if (de->d_name[0] < '0' || de->d_name[0] > '9')
                        continue;
                char sp[128], buf[512];
                snprintf(sp, sizeof(sp), "/proc/%d/task/%.20s/stat", (int)pid, de->d_name);
                int fd = open(sp, O_RDONLY | O_CLOEXEC);
                if (fd < 0)
                        continue;
                ssize_t k = read(fd, buf, sizeof(buf) - 1);
                close(fd);
                if (k <= 0)
                        continue;
                buf[k] = 0;
                const char *rp = strrchr(buf, ')'); /* comm may hold anything */
                if (rp && rp[1] == ' ' && (rp[2] == 'R' || rp[2] == 'D'))
                        return 1;
        }
        return cgroup_frozen(pid);
}

struct dead_inst {
        char id[64];
        char why[160];
        int pooled;
};

/* One heartbeat round over every instance (I/O thread, io_mu held). Hung guests get their
 * channel closed and are added to dead[] (at most cap). gap_ms: the time since the previous
 * round; a gap far past the tick means the node itself did not run (SIGSTOP, a starved
 * host), so nobody pinged the guests: their silence is counted anew instead of judged. */
static void heartbeat(struct cove_node *n, int64_t gap_ms, struct dead_inst *dead, int *ndead,
                      int cap)
{
        int64_t now = cove_mono_ns() / 1000000;
        int stalled = gap_ms > STALL_MS;
        if (stalled)
                cove_info(n->cfg.log, "node.io",
                          "the node did not run for %lld ms: guest silence is counted anew",
                          (long long)gap_ms);
        pthread_mutex_lock(&n->mu);
        int k = 0;
        for (struct inst *in = n->insts; in; in = in->next)
                k++;
        struct hb {
                struct cove_chan *c;
                pid_t pid;
                int limit;
                int pooled;
                char id[64];
        } *hb = calloc((size_t)(k ? k : 1), sizeof(*hb));
        int m = 0;
        for (struct inst *in = n->insts; in && hb; in = in->next) {
                if (in->stopping)
                        continue;
                if (in->busy || in->frozen || stalled) { /* a snapshot or a freeze holds it
                                                           still, or nobody watched */
                        cove_chan_touch(in->chan, now);
                        continue;
                }
                cove_chan_ref(in->chan);
                hb[m].c = in->chan;
                hb[m].pid = in->ri.pid;
                hb[m].limit = strcmp(in->ops->name, "vm") ? HUNG_NS_MS : HUNG_VM_MS;
                hb[m].pooled = in->pool != NULL;
                snprintf(hb[m].id, sizeof(hb[m].id), "%s", in->id);
                m++;
        }
        pthread_mutex_unlock(&n->mu);
        for (int i = 0; i < m; i++) {
                int64_t silent = cove_chan_heartbeat(hb[i].c, now);
                int unread = 0; /* bytes from the guest this thread has not read yet */
                if (silent >= hb[i].limit && hb[i].pid > 0 &&
                    (ioctl(cove_chan_fd(hb[i].c), FIONREAD, &unread) < 0 || unread == 0) &&
                    !guest_active(hb[i].pid) && *ndead < cap && !cove_chan_is_closed(hb[i].c)) {
                        struct dead_inst *d = &dead[(*ndead)++];
                        snprintf(d->id, sizeof(d->id), "%s", hb[i].id);
                        snprintf(d->why, sizeof(d->why),
                                 "guest stopped answering its channel (no answer to the "
                                 "heartbeat for %lld s)",
                                 (long long)(silent / 1000));
                        d->pooled = hb[i].pooled;
                        epoll_ctl(n->epfd, EPOLL_CTL_DEL, cove_chan_fd(hb[i].c), NULL);
                        cove_chan_close(hb[i].c, d->why);
                }
                cove_chan_unref(hb[i].c);
        }
        free(hb);
}

/* Send every guest a heartbeat (I/O thread, io_mu held), unless the fence is off or the
 * lease is not confirmed. Never blocks: a channel with no room now gets the next one. */
static void beat_round(struct cove_node *n)
{
        pthread_mutex_lock(&n->mu);
        int k = 0;
        for (struct inst *in = n->insts; in; in = in->next)
                k++;
        struct cove_chan **cs = NULL;
        int m = 0;
        if (n->fence_ttl_ms > 0 && !n->beat_paused && k > 0)
                cs = calloc((size_t)k, sizeof(*cs));
        for (struct inst *in = n->insts; in && cs; in = in->next) {
                if (in->stopping)
                        continue;
                cove_chan_ref(in->chan);
                cs[m++] = in->chan;
        }
        pthread_mutex_unlock(&n->mu);
        n->beat_seq++;
        for (int i = 0; i < m; i++) {
                cove_chan_beat(cs[i], n->beat_seq);
                cove_chan_unref(cs[i]);
        }
        free(cs);
}

/* The guest heartbeat interval in ms, 0 when the fence is off (read without mu: the I/O
 * thread asks at every wake-up) */
static int beat_every(struct cove_node *n)
{
        return __atomic_load_n(&n->fence_ttl_ms, __ATOMIC_RELAXED) > 0
                   ? __atomic_load_n(&n->beat_ms, __ATOMIC_RELAXED)
                   : 0;
}

static int space_low(struct cove_node *n)
{
        struct statvfs vf;
        return statvfs(n->data_dir, &vf) == 0 &&
               ((uint64_t)vf.f_bavail * vf.f_frsize >> 20) < LOW_SPACE_MB;
}

static void *io_main(void *arg)
{
        struct cove_node *n = arg;
        struct epoll_event evs[64];
        int64_t last_hb = 0, last_beat = 0;
        while (!n->quit) {
                int every = beat_every(n);
                int k =
                    epoll_wait(n->epfd, evs, 64,
                               every > 0 && every < HEARTBEAT_TICK_MS ? every : HEARTBEAT_TICK_MS);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        cove_error(n->cfg.log, "node.io", "epoll_wait: %s", strerror(errno));
                        break;
                }
                /* on_dead stops the instance, which takes io_mu: call it after unlocking */
                struct dead_inst dead[64];
                int ndead = 0;
                struct {
                        struct cove_chan *c;
                        struct cove_ask a;
                } asked[16];
                int nasked = 0;
                pthread_mutex_lock(&n->io_mu);
                for (int i = 0; i < k; i++) {
                        struct cove_chan *c = evs[i].data.ptr;
                        if (!c)
                                continue; /* wake_fd */
                        int r = cove_chan_on_readable(c);
                        if (r == 0 && nasked < 16) {
                                struct cove_ask a[COVE_CHAN_MAX_ASKS];
                                int na = cove_chan_take_asks(c, a, COVE_CHAN_MAX_ASKS);
                                for (int j = 0; j < na; j++) {
                                        if (nasked < 16) {
                                                cove_chan_ref(c);
                                                asked[nasked].c = c;
                                                asked[nasked++].a = a[j];
                                        } else {
                                                json_decref(a[j].ask);
                                        }
                                }
                        }
                        if (r == 0 && cove_chan_rx_paused(c)) {
                                struct epoll_event ev = {.events = 0, .data.ptr = c};
                                epoll_ctl(n->epfd, EPOLL_CTL_MOD, cove_chan_fd(c), &ev);
                                /* a consumer may have drained in between: re-check */
                                if (!cove_chan_rx_paused(c))
                                        rx_notify(n, c);
                        }
                        if (r < 0) {
                                epoll_ctl(n->epfd, EPOLL_CTL_DEL, cove_chan_fd(c), NULL);
                                pthread_mutex_lock(&n->mu);
                                for (struct inst *in = n->insts; in; in = in->next)
                                        if (in->chan == c && !in->stopping && ndead < 64) {
                                                dead[ndead].pooled = in->pool != NULL;
                                                snprintf(dead[ndead].why, sizeof(dead[0].why),
                                                         "guest exited");
                                                snprintf(dead[ndead++].id, sizeof(dead[0].id), "%s",
                                                         in->id);
                                        }
                                pthread_mutex_unlock(&n->mu);
                        }
                }
                int64_t now = cove_mono_ns() / 1000000;
                if (every > 0 && now - last_beat >= every) {
                        last_beat = now;
                        beat_round(n);
                }
                if (now - last_hb >= HEARTBEAT_TICK_MS) {
                        heartbeat(n, last_hb ? now - last_hb : 0, dead, &ndead, 64);
                        last_hb = now;
                        if (space_low(n)) {
                                pthread_mutex_lock(&n->mu);
                                n->space_tainted = 1;
                                pthread_mutex_unlock(&n->mu);
                        }
                }
                pthread_mutex_unlock(&n->io_mu);
                for (int i = 0; i < nasked; i++) {
                        json_t *ans = n->cfg.on_ask
                                          ? n->cfg.on_ask(n->cfg.arg, cove_chan_sandbox(asked[i].c),
                                                          asked[i].a.ask)
                                          : json_pack("{s:b, s:s}", "ok", 0, "message",
                                                      "this node takes no requests");
                        struct cove_err e;
                        if (ans)
                                cove_chan_answer(asked[i].c, asked[i].a.id, ans, &e);
                        json_decref(ans);
                        json_decref(asked[i].a.ask);
                        cove_chan_unref(asked[i].c);
                }
                for (int i = 0; i < ndead; i++) {
                        if (dead[i].pooled) { /* nobody owns it yet: just clear it away */
                                struct cove_err e;
                                cove_warn(n->cfg.log, "pool", "pooled sandbox %s died: %s",
                                          dead[i].id, dead[i].why);
                                if (cove_node_stop(n, dead[i].id, 1, &e) < 0)
                                        cove_warn(n->cfg.log, "pool", "%s", e.msg);
                        } else if (n->cfg.on_dead) {
                                n->cfg.on_dead(n->cfg.arg, dead[i].id, dead[i].why);
                        }
                }
        }
        return NULL;
}

/* A driver's leftovers of older builds (runtime.h collect), before any instance starts. */
static void collect_old(struct cove_node *n, const struct cove_runtime_ops *o,
                        struct cove_runtime *rt)
{
        if (!o || !rt || !o->collect)
                return;
        char root[PATH_MAX];
        snprintf(root, sizeof(root), "%s/sandboxes", n->data_dir);
        uint64_t bytes = 0;
        struct cove_err e;
        int k = o->collect(rt, n->guest, root, &bytes, &e);
        if (k < 0)
                cove_warn(n->cfg.log, "runtime.collect", "%s: %s", o->name, e.msg);
        else if (k > 0)
                cove_info(n->cfg.log, "runtime.collect",
                          "%s: removed %d item(s) of older builds nothing uses (%llu MB)", o->name,
                          k, (unsigned long long)(bytes >> 20));
}

struct cove_node *cove_node_new(const struct cove_node_config *cfg, struct cove_err *err)
{
        struct cove_node *n = calloc(1, sizeof(*n));
        if (!n) {
                cove_err_set(err, ENOMEM, "node");
                return NULL;
        }
        n->cfg = *cfg;
        snprintf(n->data_dir, sizeof(n->data_dir), "%s", cfg->data_dir);
        snprintf(n->guest, sizeof(n->guest), "%s", cfg->guest_binary);
        n->cfg.data_dir = n->data_dir;
        n->cfg.guest_binary = n->guest;
        pthread_mutex_init(&n->mu, NULL);
        pthread_cond_init(&n->stop_cv, NULL);
        pthread_cond_init(&n->reap_cv, NULL);
        {
                pthread_condattr_t ca;
                pthread_condattr_init(&ca);
                pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
                pthread_cond_init(&n->pool_cv, &ca);
                pthread_cond_init(&n->full_cv, &ca);
                pthread_condattr_destroy(&ca);
        }
        pthread_mutex_init(&n->io_mu, NULL);
        n->epfd = -1;
        n->wake_fd = -1;
        n->uid_lock_fd = -1;
        const char *lk = cfg->uid_lock_file ? cfg->uid_lock_file : COVE_UID_LOCK_FILE;
        if (*lk) {
                char ldir[PATH_MAX];
                snprintf(ldir, sizeof(ldir), "%s", lk);
                char *sl = strrchr(ldir, '/');
                if (sl && sl != ldir) {
                        *sl = 0;
                        struct cove_err e2; /* a failure shows in the open below */
                        cove_mkdir_p(ldir, 0700, &e2);
                }
                n->uid_lock_fd = open(lk, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
                if (n->uid_lock_fd < 0 && geteuid() == 0) {
                        cove_err_set(err, errno, "uid range locks: open %s", lk);
                        goto fail;
                }
                /* not root (a vm-only node, tests): it cannot reach the host's lock; its
                 * ranges are its own alone, as before */
                if (n->uid_lock_fd < 0)
                        cove_warn(cfg->log, "node.uid",
                                  "%s: %s: uid ranges are not reserved host-wide", lk,
                                  strerror(errno));
        }
        n->cfg.uid_lock_file = NULL;
        char dir[PATH_MAX];
        snprintf(dir, sizeof(dir), "%s/sandboxes", n->data_dir);
        if (cove_mkdir_p(dir, 0711, err) < 0)
                goto fail;
        n->rt = cfg->rt_ops->open(n->data_dir, err);
        if (!n->rt) {
                cove_err_wrap(err, "runtime %s", cfg->rt_ops->name);
                goto fail;
        }
        collect_old(n, cfg->rt_ops, n->rt);
        if (cfg->rt_alt_ops) {
                struct cove_err e2;
                n->rt_alt = cfg->rt_alt_ops->open(n->data_dir, &e2);
                if (!n->rt_alt) {
                        snprintf(n->alt_why, sizeof(n->alt_why), "%s", e2.msg);
                        cove_info(cfg->log, "node", "runtime %s unavailable: %s",
                                  cfg->rt_alt_ops->name, e2.msg);
                } else {
                        collect_old(n, cfg->rt_alt_ops, n->rt_alt);
                }
        }
        n->epfd = epoll_create1(EPOLL_CLOEXEC);
        n->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (n->epfd < 0 || n->wake_fd < 0) {
                cove_err_set(err, errno, "node: epoll");
                goto fail;
        }
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
        epoll_ctl(n->epfd, EPOLL_CTL_ADD, n->wake_fd, &ev);
        pthread_mutex_init(&n->sp_mu, NULL);
        pthread_cond_init(&n->sp_cv, NULL);
        int e = pthread_create(&n->spawner, NULL, spawner_main, n);
        if (e) {
                cove_err_set(err, e, "node: spawner thread");
                goto fail;
        }
        /* best effort: with fewer (none), the spawner takes the restores too */
        while (n->nrestorers < SPAWN_RESTORERS &&
               pthread_create(&n->restorer[n->nrestorers], NULL, restorer_main, n) == 0)
                n->nrestorers++;
        e = pthread_create(&n->io, NULL, io_main, n);
        if (e) {
                cove_err_set(err, e, "node: I/O thread");
                spawners_stop(n);
                goto fail;
        }
        if (cfg->rt_ops->host_view) {
                char why[256];
                if (cfg->rt_ops->host_view(n->rt, why, sizeof(why)))
                        cove_info(cfg->log, "runtime.view", "%s", why);
                else
                        cove_warn(cfg->log, "runtime.view", "%s", why);
        }
        pthread_mutex_lock(&n->mu);
        struct cove_runtime *crt;
        const struct cove_runtime_ops *co = ckpt_ops(n, &crt);
        if (co && co->full_selfcheck && pthread_create(&n->fullcheck, NULL, fullcheck_main, n) == 0)
                n->fullcheck_started = 1;
        pthread_mutex_unlock(&n->mu);
        return n;
fail:
        if (n->rt_alt)
                cfg->rt_alt_ops->close(n->rt_alt);
        if (n->rt)
                cfg->rt_ops->close(n->rt);
        if (n->epfd >= 0)
                close(n->epfd);
        if (n->wake_fd >= 0)
                close(n->wake_fd);
        if (n->uid_lock_fd >= 0)
                close(n->uid_lock_fd);
        free(n);
        return NULL;
}

const char *cove_node_runtime_name(const struct cove_node *n)
{
        return n->cfg.rt_ops->name;
}

/* The driver for a runtime name (NULL: default), or NULL with err. */
static int pick(const struct cove_node *n, const char *runtime, const struct cove_runtime_ops **ops,
                struct cove_runtime **rt, struct cove_err *err)
{
        if (!runtime || !*runtime || !strcmp(runtime, n->cfg.rt_ops->name)) {
                *ops = n->cfg.rt_ops;
                *rt = n->rt;
                return 0;
        }
        if (n->cfg.rt_alt_ops && !strcmp(runtime, n->cfg.rt_alt_ops->name)) {
                if (!n->rt_alt)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                             "runtime \"%s\" is not available on this node: %s",
                                             runtime, n->alt_why);
                *ops = n->cfg.rt_alt_ops;
                *rt = n->rt_alt;
                return 0;
        }
        return cove_err_setk(
            err, strcmp(runtime, "vm") ? COVE_E_BAD_REQUEST : COVE_E_UNAVAILABLE, 0,
            "runtime \"%.32s\" is not available on this node (available: %s%s%s)", runtime,
            n->cfg.rt_ops->name, n->rt_alt ? ", " : "", n->rt_alt ? n->cfg.rt_alt_ops->name : "");
}

int cove_node_runtime_check(const struct cove_node *n, const char *runtime, struct cove_err *err)
{
        const struct cove_runtime_ops *ops;
        struct cove_runtime *rt;
        return pick(n, runtime, &ops, &rt, err);
}

/* Clear what an instance of id may have left, whichever driver ran it. */
static int cleanup_any(struct cove_node *n, const char *id, const char *sd, int purge,
                       struct cove_err *err)
{
        int r = n->cfg.rt_ops->cleanup_stale(n->rt, id, sd, purge, err);
        if (n->rt_alt) {
                struct cove_err e2;
                if (n->cfg.rt_alt_ops->cleanup_stale(n->rt_alt, id, sd, purge, r < 0 ? &e2 : err) <
                    0)
                        r = -1;
        }
        return r;
}

/* Host-wide: slot s is ours while we hold an OFD write lock on byte s of the lock file, so
 * two coveds of one host never hand out the same range; the kernel drops the locks of a
 * process that dies, and a restart takes its own ranges again (or learns that another coved
 * took one meanwhile). Within this process slots[] says which are ours (an OFD lock does not
 * conflict with itself). With mu held. */
static int slot_lock(struct cove_node *n, uint32_t s, int lock)
{
        if (n->uid_lock_fd < 0)
                return 0;
        struct flock fl = {.l_type = lock ? F_WRLCK : F_UNLCK,
                           .l_whence = SEEK_SET,
                           .l_start = (off_t)s,
                           .l_len = 1};
        int r;
        do
                r = fcntl(n->uid_lock_fd, F_OFD_SETLK, &fl);
        while (r < 0 && errno == EINTR);
        return r;
}

int cove_node_uid_reserve(struct cove_node *n, uint32_t *base, struct cove_err *err)
{
        pthread_mutex_lock(&n->mu);
        int r = 0;
        if (*base) {
                uint32_t s = (*base - COVE_UID_FIRST) / COVE_UID_RANGE;
                if (*base < COVE_UID_FIRST || s >= COVE_UID_SLOTS ||
                    (*base - COVE_UID_FIRST) % COVE_UID_RANGE)
                        r = cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "uid base %u invalid", *base);
                else if (n->slots[s])
                        r = cove_err_setk(err, COVE_E_CONFLICT, 0, "uid base %u in use", *base);
                else if (slot_lock(n, s, 1) < 0)
                        r = cove_err_setk(err, COVE_E_CONFLICT, errno,
                                          "uid base %u is held by another coved on this host",
                                          *base);
                else
                        n->slots[s] = 1;
        } else {
                r = cove_err_setk(err, COVE_E_LIMIT, 0,
                                  "no free uid range: %u sandboxes are alive on this host",
                                  COVE_UID_SLOTS);
                /* random start: a freed range is not handed out again at once */
                uint32_t start;
                if (cove_random(&start, sizeof(start), NULL) < 0)
                        start = 0;
                for (uint32_t k = 0; k < COVE_UID_SLOTS; k++) {
                        uint32_t s = (start + k) % COVE_UID_SLOTS;
                        if (!n->slots[s] && slot_lock(n, s, 1) == 0) {
                                n->slots[s] = 1;
                                *base = COVE_UID_FIRST + s * COVE_UID_RANGE;
                                r = 0;
                                break;
                        }
                }
        }
        pthread_mutex_unlock(&n->mu);
        return r;
}

void cove_node_uid_release(struct cove_node *n, uint32_t base)
{
        if (base < COVE_UID_FIRST)
                return;
        uint32_t s = (base - COVE_UID_FIRST) / COVE_UID_RANGE;
        pthread_mutex_lock(&n->mu);
        if (s < COVE_UID_SLOTS && n->slots[s]) {
                n->slots[s] = 0;
                slot_lock(n, s, 0);
        }
        pthread_mutex_unlock(&n->mu);
}

static void state_dir_of(struct cove_node *n, const char *id, char *out, size_t cap)
{
        snprintf(out, cap, "%s/sandboxes/%s", n->data_dir, id);
}

static const struct cove_runtime_ops *layer_ops(struct cove_node *n, struct cove_runtime **rt);

/* spec->layer_handle is the starting driver's to take over; when the start ends before
 * reaching it, or the driver is not the one with layer images, it is released here. */
static void drop_layer_handle(struct cove_node *n, struct cove_instance_spec *spec)
{
        if (spec->layer_handle) {
                cove_node_layer_close(n, spec->layer_handle);
                spec->layer_handle = NULL;
        }
}

static int fence_tell(struct cove_node *n, struct inst *in, struct cove_err *err);
static int fence_ttl(struct cove_node *n);

static int start_instance(struct cove_node *n, struct cove_instance_spec *spec, struct pool *pool,
                          struct cove_err *err)
{
        char sd[PATH_MAX];
        state_dir_of(n, spec->sandbox_id, sd, sizeof(sd));
        if (cove_mkdir_p(sd, 0700, err) < 0) {
                drop_layer_handle(n, spec);
                return -1;
        }
        spec->state_dir = sd;
        spec->guest_binary = n->guest;
        if (!spec->uid_count)
                spec->uid_count = COVE_UID_RANGE;
        const struct cove_runtime_ops *ops;
        struct cove_runtime *rt, *lrt;
        if (pick(n, spec->runtime, &ops, &rt, err) < 0) {
                drop_layer_handle(n, spec);
                return -1;
        }
        if (layer_ops(n, &lrt) != ops || lrt != rt)
                drop_layer_handle(n, spec); /* another driver's mount: it gets the path only */
        struct inst *in = calloc(1, sizeof(*in));
        if (!in) {
                drop_layer_handle(n, spec);
                return cove_err_set(err, ENOMEM, "instance");
        }
        snprintf(in->id, sizeof(in->id), "%s", spec->sandbox_id);
        in->uid_base = spec->uid_base;
        in->ri.chan_fd = -1;
        in->ops = ops;
        in->rt = rt;
        if (spawn(n, ops, rt, spec, &in->ri, pool == NULL, err) < 0) {
                free(in);
                return cove_err_wrap(err, "start sandbox %s", spec->sandbox_id);
        }
        int fd = in->ri.chan_fd;
        in->ri.chan_fd = -1;
        if (in->ri.rechannel) {
                /* restored from a checkpoint: move the guest to a channel of its own netns */
                int nfd = cove_frame_rechannel(fd, HELLO_TIMEOUT_MS, err);
                close(fd);
                fd = nfd;
                if (fd < 0) {
                        cove_err_wrap(err, "start sandbox %s", spec->sandbox_id);
                        struct cove_err e2;
                        n->cfg.rt_ops->stop(n->rt, &in->ri, spec->sandbox_id, sd, 0, &e2);
                        free(in);
                        return -1;
                }
        }
        in->chan = cove_chan_new(fd, spec->sandbox_id, n->cfg.log, err);
        uint8_t tok[16];
        char token[33];
        if (!in->chan || cove_random(tok, sizeof(tok), err) < 0)
                goto fail;
        cove_hex(tok, sizeof(tok), token);
        if (cove_chan_hello(in->chan, token, spec->sandbox_id, HELLO_TIMEOUT_MS, err) < 0)
                goto fail;
        cove_chan_set_rx_notify(in->chan, rx_notify, n);
        pthread_mutex_lock(&n->mu);
        in->pool = pool;
        in->warming = pool != NULL;
        in->next = n->insts;
        n->insts = in;
        n->ninsts++;
        pthread_mutex_unlock(&n->mu);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = in->chan};
        if (epoll_ctl(n->epfd, EPOLL_CTL_ADD, cove_chan_fd(in->chan), &ev) < 0) {
                cove_err_set(err, errno, "start sandbox %s: watch channel", spec->sandbox_id);
                struct cove_err e2;
                cove_node_stop(n, spec->sandbox_id, 0, &e2);
                return -1;
        }
        /* the fence TTL before anything runs there (its answer comes through the I/O thread) */
        if (fence_tell(n, in, err) < 0) {
                cove_err_wrap(err, "start sandbox %s: fence", spec->sandbox_id);
                struct cove_err e2;
                cove_node_stop(n, spec->sandbox_id, 0, &e2);
                return -1;
        }
        return 0;
fail:
        cove_err_wrap(err, "start sandbox %s", spec->sandbox_id);
        if (in->chan)
                cove_chan_unref(in->chan);
        {
                struct cove_err e2;
                in->ops->stop(in->rt, &in->ri, spec->sandbox_id, sd, 0, &e2);
        }
        free(in);
        return -1;
}

void cove_node_fence_config(struct cove_node *n, int ttl_ms, int heartbeat_ms)
{
        if (ttl_ms < 0)
                ttl_ms = 0;
        if (heartbeat_ms <= 0 || (ttl_ms > 0 && heartbeat_ms > ttl_ms))
                heartbeat_ms = ttl_ms > 0 ? (ttl_ms / 4 > 10 ? ttl_ms / 4 : 10) : 0;
        if (heartbeat_ms > 0 && heartbeat_ms < 10)
                heartbeat_ms = 10;
        pthread_mutex_lock(&n->mu);
        __atomic_store_n(&n->beat_ms, heartbeat_ms, __ATOMIC_RELAXED);
        __atomic_store_n(&n->fence_ttl_ms, ttl_ms, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&n->mu);
        uint64_t one = 1; /* the I/O thread picks up the new interval now */
        ssize_t w = write(n->wake_fd, &one, sizeof(one));
        (void)w;
}

void cove_node_heartbeat_pause(struct cove_node *n, int paused)
{
        pthread_mutex_lock(&n->mu);
        n->beat_paused = paused != 0;
        pthread_mutex_unlock(&n->mu);
}

static int fence_ttl(struct cove_node *n)
{
        return __atomic_load_n(&n->fence_ttl_ms, __ATOMIC_RELAXED);
}

/* Tell a new or just taken instance's guest the fence TTL, before anything runs in it. A
 * pooled guest may have frozen (its node was stopped while it waited): it never ran anything
 * for anyone, so it is thawed. */
static int fence_tell(struct cove_node *n, struct inst *in, struct cove_err *err)
{
        int ttl = fence_ttl(n);
        if (ttl == in->fence_ttl_ms && ttl == 0)
                return 0;
        int fenced = 0;
        if (cove_chan_fence(in->chan, ttl, &fenced, err) < 0)
                return -1;
        in->fence_ttl_ms = ttl;
        if (fenced && cove_chan_thaw(in->chan, err) < 0)
                return -1;
        return 0;
}

int cove_node_thaw_fenced(struct cove_node *n, const char *sandbox_id, struct cove_err *err)
{
        pthread_mutex_lock(&n->mu);
        int k = 0, m = 0;
        for (struct inst *in = n->insts; in; in = in->next)
                k++;
        struct cove_chan **cs = calloc((size_t)(k ? k : 1), sizeof(*cs));
        for (struct inst *in = n->insts; in && cs; in = in->next) {
                if (in->stopping || (sandbox_id && strcmp(in->id, sandbox_id)))
                        continue;
                cove_chan_ref(in->chan);
                cs[m++] = in->chan;
        }
        pthread_mutex_unlock(&n->mu);
        if (!cs)
                return cove_err_set(err, ENOMEM, "thaw");
        int r = 0;
        if (sandbox_id && m == 0)
                r = cove_err_setk(err, COVE_E_CONFLICT, 0, "sandbox %s has no running instance",
                                  sandbox_id);
        for (int i = 0; i < m; i++) {
                struct cove_err e2;
                if (cove_chan_thaw(cs[i], r < 0 ? &e2 : err) < 0)
                        r = -1;
                cove_chan_unref(cs[i]);
        }
        free(cs);
        return r;
}

int cove_node_start(struct cove_node *n, struct cove_instance_spec *spec, struct cove_err *err)
{
        pthread_mutex_lock(&n->mu);
        n->last_create_ns = cove_mono_ns(); /* the refills wait for a gap after it */
        pthread_mutex_unlock(&n->mu);
        return start_instance(n, spec, NULL, err);
}

static int pool_idle_locked(struct cove_node *n, const struct pool *p)
{
        int k = 0;
        for (struct inst *in = n->insts; in; in = in->next)
                k += in->pool == p && !in->stopping;
        return k;
}

/* Run one short program in a new pooled instance and forget it: the first exec in a fresh
 * overlay pays for cold dentries and page tables (several ms here); a warmed instance
 * answers its owner's first exec like any later one. Best effort. */
static void warm_up(struct cove_node *n, const char *id)
{
        struct cove_chan *c = NULL;
        pthread_mutex_lock(&n->mu);
        struct inst *in = find_locked(n, id);
        if (in && !in->stopping) {
                c = in->chan;
                cove_chan_ref(c);
        }
        pthread_mutex_unlock(&n->mu);
        if (!c)
                return;
        /* argv "true": a PATH search like most first commands, through the shell's dirs */
        json_t *req =
            json_pack("{s:s, s:[s], s:{}, s:b}", "op", "exec", "cmd", "true", "env", "stdin", 0);
        uint32_t pid = 0;
        struct cove_err err;
        if (req && cove_chan_exec(c, req, "", NULL, &pid, &err) == 0) {
                uint64_t after = 0;
                for (int i = 0; i < 100; i++) {
                        struct cove_ev *ev = NULL;
                        uint64_t lost;
                        int r = cove_chan_proc_next(c, pid, after, &ev, &lost, 100, &err);
                        if (r == 1) {
                                after = ev->seq;
                                int done = ev->type == COVE_EV_EXIT || ev->type == COVE_EV_ERROR;
                                free(ev);
                                if (done)
                                        break;
                        } else if (r == 2) {
                                after = lost;
                        } else if (r != 0) {
                                break;
                        }
                }
                cove_chan_proc_forget(c, pid);
        }
        json_decref(req);
        cove_chan_unref(c);
}

/* The refill of a pool with instances left waits until no create came for this long... */
#define REFILL_GAP_NS (15 * 1000000LL)
/* ... but never longer than this in all, so creates arriving back to back do not starve it */
#define REFILL_DEFER_MAX_NS (1000 * 1000000LL)

static int64_t pool_idle_ns(const struct cove_node *n)
{
        return (n->cfg.pool_idle_ms > 0 ? n->cfg.pool_idle_ms : 60000) * 1000000LL;
}

/* The ids of up to k idle, ready instances of p (malloc'd, *nids of them; NULL when none):
 * the ones a shrink stops. Taken out of the pool (marked stopping by the stop that follows
 * with mu let go: in->pool NULL meanwhile would hand them to nobody, so they stay pooled
 * but warming, which no take picks). */
static char (*pool_extra_locked(struct cove_node *n, struct pool *p, int k, size_t *nids))[64]
{
        char(*ids)[64] = calloc((size_t)k, sizeof(*ids));
        size_t m = 0;
        for (struct inst *in = n->insts; ids && in && (int)m < k; in = in->next) {
                if (in->pool != p || in->stopping || in->warming)
                        continue;
                in->warming = 1;
                snprintf(ids[m++], 64, "%s", in->id);
        }
        if (!m) {
                free(ids);
                ids = NULL;
        }
        *nids = m;
        return ids;
}

static void *refill_main(void *arg)
{
        struct cove_node *n = arg;
        pthread_mutex_lock(&n->mu);
        while (!n->pool_quit) {
                if (n->space_tainted) {
                        /* replace the pooled instances once the disk has room again */
                        pthread_mutex_unlock(&n->mu);
                        int low = space_low(n);
                        pthread_mutex_lock(&n->mu);
                        char(*ids)[64] = NULL;
                        size_t nids = 0;
                        if (!low) {
                                for (struct inst *in = n->insts; in; in = in->next)
                                        nids += in->pool && !in->stopping;
                                ids = nids ? calloc(nids, sizeof(*ids)) : NULL;
                                size_t k = 0;
                                for (struct inst *in = n->insts; ids && in; in = in->next)
                                        if (in->pool && !in->stopping && k < nids)
                                                snprintf(ids[k++], 64, "%s", in->id);
                                nids = ids ? k : 0;
                        }
                        pthread_mutex_unlock(&n->mu);
                        for (size_t i = 0; i < nids; i++) {
                                struct cove_err e2;
                                cove_node_stop(n, ids[i], 1, &e2);
                        }
                        free(ids);
                        pthread_mutex_lock(&n->mu);
                        /* cleared only now: until then no pooled instance is taken, so none
                         * of those stopped above can have become a sandbox's meanwhile */
                        if (!low)
                                n->space_tainted = 0;
                        if (low) {
                                struct timespec ts;
                                clock_gettime(CLOCK_MONOTONIC, &ts);
                                ts.tv_sec += 1;
                                pthread_cond_timedwait(&n->pool_cv, &n->mu, &ts);
                                continue;
                        }
                }
                struct pool *want = NULL;
                int64_t now = cove_mono_ns();
                int64_t wake = now + 5000000000LL; /* the next retry, gap or shrink */
                char(*extra)[64] = NULL;
                size_t nextra = 0;
                for (struct pool *p = n->pools; p; p = p->next) {
                        if (want || extra)
                                break;
                        int idle = pool_idle_locked(n, p);
                        if (!p->dropped && p->target > p->base) {
                                /* grown: back to its base once no create took from it for
                                 * pool_idle_ms, the extra idle instances stopped */
                                int64_t at = p->last_use_ns + pool_idle_ns(n);
                                if (at <= now) {
                                        p->target = p->base;
                                        p->burst = 0;
                                } else if (at < wake) {
                                        wake = at;
                                }
                        }
                        if (!p->dropped && p->max > p->base && idle > p->target) {
                                extra = pool_extra_locked(n, p, idle - p->target, &nextra);
                                continue;
                        }
                        if (idle >= p->target)
                                p->burst = 0; /* full: the next burst counts from here */
                        if (idle + p->starting >= p->target)
                                continue;
                        if (p->retry_at_ns > now) {
                                if (p->retry_at_ns < wake)
                                        wake = p->retry_at_ns;
                                continue;
                        }
                        /* a pool grown past its base (max > base) that still holds at
                         * least its base waits for a gap in the creates, so its refill does
                         * not compete with the burst; bounded (REFILL_DEFER_MAX_NS). Below its
                         * base (so also empty), and a fixed-size pool always, it refills at
                         * once: in back-to-back creates the wait cost the refill its pace
                         * (more cold creates, docs/performance.md) */
                        int64_t gap_at = n->last_create_ns + REFILL_GAP_NS;
                        if (p->max > p->base && idle >= p->base && idle > 0 && gap_at > now) {
                                if (!p->defer_since_ns)
                                        p->defer_since_ns = now;
                                int64_t until = p->defer_since_ns + REFILL_DEFER_MAX_NS;
                                if (until > now) {
                                        int64_t at = gap_at < until ? gap_at : until;
                                        if (at < wake)
                                                wake = at;
                                        continue;
                                }
                        }
                        p->defer_since_ns = 0;
                        want = p;
                }
                if (extra) {
                        pthread_mutex_unlock(&n->mu);
                        for (size_t i = 0; i < nextra; i++) {
                                struct cove_err e2;
                                cove_node_stop(n, extra[i], 1, &e2);
                        }
                        free(extra);
                        pthread_mutex_lock(&n->mu);
                        continue;
                }
                if (!want) {
                        struct timespec ts;
                        clock_gettime(CLOCK_MONOTONIC, &ts);
                        int64_t wait_ns = wake - now;
                        ts.tv_sec += wait_ns / 1000000000LL;
                        ts.tv_nsec += wait_ns % 1000000000LL;
                        if (ts.tv_nsec >= 1000000000L) {
                                ts.tv_sec++;
                                ts.tv_nsec -= 1000000000L;
                        }
                        pthread_cond_timedwait(&n->pool_cv, &n->mu, &ts);
                        continue;
                }
                want->starting++;
                pthread_mutex_unlock(&n->mu);
                struct cove_err err;
                char id[64];
                uint32_t uid = 0;
                int r = cove_id_new("sbx_", id, sizeof(id), &err);
                if (r == 0)
                        r = cove_node_uid_reserve(n, &uid, &err);
                /* an owner's pool: encrypted layers under the owner's key for this id, as a
                 * create for that owner would make them (the key only leaves here into the
                 * kernel's keyring of the layer's filesystem) */
                uint8_t key[COVE_RUNTIME_LAYER_KEY_LEN];
                int keyed = want->owner[0] != '\0';
                int got_uid = r == 0;
                if (r == 0 && keyed)
                        r = n->cfg.layer_key
                                ? n->cfg.layer_key(n->cfg.arg, want->owner, id, key, &err)
                                : cove_err_setk(&err, COVE_E_UNAVAILABLE, 0, "no layer keys");
                if (r < 0 && got_uid) {
                        cove_node_uid_release(n, uid);
                } else if (r == 0) {
                        struct cove_instance_spec spec = {
                            .sandbox_id = id,
                            .runtime = want->runtime,
                            .rootfs = want->rootfs,
                            .cpus = want->cpus,
                            .memory_mb = want->memory_mb,
                            .disk_mb = want->disk_mb,
                            .uid_base = uid,
                            .uid_count = COVE_UID_RANGE,
                            .layer_key = keyed ? key : NULL,
                        };
                        r = start_instance(n, &spec, want, &err);
                        explicit_bzero(key, sizeof(key));
                        if (r == 0) {
                                warm_up(n, id);
                                pthread_mutex_lock(&n->mu);
                                struct inst *in = find_locked(n, id);
                                /* its pool was dropped while it started: it is never
                                 * ready, and goes now (unless the drop stops it already) */
                                int dropped = want->dropped && in && !in->stopping;
                                if (in && !want->dropped)
                                        in->warming = 0;
                                pthread_mutex_unlock(&n->mu);
                                if (dropped) {
                                        struct cove_err e2;
                                        cove_node_stop(n, id, 1, &e2);
                                }
                        }
                        if (r < 0) {
                                struct cove_err e2;
                                char sd[PATH_MAX];
                                state_dir_of(n, id, sd, sizeof(sd));
                                cleanup_any(n, id, sd, 1, &e2);
                                cove_rm_rf(sd, &e2);
                                cove_node_uid_release(n, uid);
                        }
                }
                pthread_mutex_lock(&n->mu);
                want->starting--;
                if (r < 0 && keyed &&
                    (err.kind == COVE_E_KEY_REVOKED || err.kind == COVE_E_NOT_FOUND)) {
                        want->dropped = 1; /* the owner's key is gone: no retries */
                        want->target = 0;
                        cove_warn(n->cfg.log, "pool", "warm pool of %s dropped: %s", want->owner,
                                  err.msg);
                } else if (r < 0) {
                        want->retry_at_ns = cove_mono_ns() + 2000000000LL;
                        cove_warn(n->cfg.log, "pool",
                                  "warm pool refill failed (retrying in 2 s): %s", err.msg);
                }
        }
        pthread_mutex_unlock(&n->mu);
        return NULL;
}

static struct pool *pool_find_locked(struct cove_node *n, const char *runtime, const char *rootfs,
                                     unsigned cpus, unsigned memory_mb, unsigned disk_mb,
                                     const char *owner)
{
        for (struct pool *p = n->pools; p; p = p->next)
                if (!strcmp(p->runtime, runtime) && !strcmp(p->rootfs, rootfs) && p->cpus == cpus &&
                    p->memory_mb == memory_mb && p->disk_mb == disk_mb && !strcmp(p->owner, owner))
                        return p;
        return NULL;
}

int cove_node_pool_add(struct cove_node *n, const char *runtime, const char *rootfs, unsigned cpus,
                       unsigned memory_mb, unsigned disk_mb, int size, const char *owner,
                       struct cove_err *err)
{
        return cove_node_pool_add_max(n, runtime, rootfs, cpus, memory_mb, disk_mb, size, size,
                                      owner, err);
}

int cove_node_pool_add_max(struct cove_node *n, const char *runtime, const char *rootfs,
                           unsigned cpus, unsigned memory_mb, unsigned disk_mb, int size, int max,
                           const char *owner, struct cove_err *err)
{
        if (size <= 0)
                return 0;
        if (max < size)
                max = size;
        if (cove_node_runtime_check(n, runtime, err) < 0)
                return -1;
        if (!runtime || !*runtime)
                runtime = n->cfg.rt_ops->name;
        if (!owner)
                owner = "";
        if (strlen(owner) >= sizeof(((struct pool *)0)->owner) || (*owner && !n->cfg.layer_key))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "warm pool: bad owner");
        pthread_mutex_lock(&n->mu);
        /* an owner's pool again (after a drop, or a second create that missed): revived */
        struct pool *p = pool_find_locked(n, runtime, rootfs, cpus, memory_mb, disk_mb, owner);
        int owned = 0;
        for (struct pool *q = n->pools; q; q = q->next)
                owned += q->owner[0] != '\0';
        if (!p && *owner && owned >= COVE_NODE_OWNER_POOLS_MAX) {
                pthread_mutex_unlock(&n->mu);
                return cove_err_setk(err, COVE_E_LIMIT, 0,
                                     "warm pool: %d keyed pools exist already", owned);
        }
        if (p) {
                p->target = size;
                p->base = size;
                p->max = max;
                p->burst = 0;
                p->dropped = 0;
                p->retry_at_ns = 0;
                pthread_cond_broadcast(&n->pool_cv);
                pthread_mutex_unlock(&n->mu);
                return 0;
        }
        p = calloc(1, sizeof(*p));
        if (!p) {
                pthread_mutex_unlock(&n->mu);
                return cove_err_set(err, ENOMEM, "warm pool");
        }
        snprintf(p->owner, sizeof(p->owner), "%s", owner);
        snprintf(p->runtime, sizeof(p->runtime), "%s", runtime);
        snprintf(p->rootfs, sizeof(p->rootfs), "%s", rootfs);
        p->cpus = cpus;
        p->memory_mb = memory_mb;
        p->disk_mb = disk_mb;
        p->target = size;
        p->base = size;
        p->max = max;
        p->next = n->pools;
        n->pools = p;
        int start = !n->refill_started;
        n->refill_started = 1;
        pthread_cond_broadcast(&n->pool_cv);
        pthread_mutex_unlock(&n->mu);
        if (start) {
                int e = pthread_create(&n->refill, NULL, refill_main, n);
                if (e) {
                        pthread_mutex_lock(&n->mu);
                        n->refill_started = 0;
                        pthread_mutex_unlock(&n->mu);
                        return cove_err_set(err, e, "warm pool thread");
                }
        }
        return 0;
}

int cove_node_pool_take(struct cove_node *n, const char *runtime, const char *rootfs, unsigned cpus,
                        unsigned memory_mb, unsigned disk_mb, const char *owner, char *id,
                        size_t cap, uint32_t *uid_base)
{
        int r = 1;
        struct inst *taken = NULL;
        if (!runtime || !*runtime)
                runtime = n->cfg.rt_ops->name;
        pthread_mutex_lock(&n->mu);
        struct pool *p =
            pool_find_locked(n, runtime, rootfs, cpus, memory_mb, disk_mb, owner ? owner : "");
        if (p && p->dropped)
                p = NULL;
        n->last_create_ns = cove_mono_ns(); /* the refills wait for a gap after it */
        if (p) {
                /* a burst larger than the pool: it grows to that (up to max) for the next */
                p->last_use_ns = n->last_create_ns;
                p->burst++;
                if (p->burst > p->target && p->target < p->max)
                        p->target = p->burst < p->max ? p->burst : p->max;
        }
        if (p && n->space_tainted) {
                p->missed++; /* a cold start instead of a layer that may have hit errors */
                pthread_cond_broadcast(&n->pool_cv);
                p = NULL;
        }
        if (p) {
                for (struct inst *in = n->insts; in && r; in = in->next) {
                        if (in->pool != p || in->stopping || in->warming ||
                            cove_chan_is_closed(in->chan))
                                continue;
                        in->pool = NULL;
                        snprintf(id, cap, "%s", in->id);
                        *uid_base = in->uid_base;
                        taken = in;
                        cove_chan_ref(in->chan);
                        r = 0;
                }
                if (r)
                        p->missed++;
                else
                        p->taken++;
                pthread_cond_broadcast(&n->pool_cv);
        }
        pthread_mutex_unlock(&n->mu);
        if (taken) {
                /* the caller's now: nobody else touches it. A guest that cannot be told the
                 * fence (or thawed) is not handed out: start one cold. */
                struct cove_err e2;
                int bad = fence_tell(n, taken, &e2) < 0;
                cove_chan_unref(taken->chan);
                if (bad) {
                        cove_warn(n->cfg.log, "node.pool", "pooled %s: %s", id, e2.msg);
                        cove_node_stop(n, id, 1, &e2); /* releases its uid range too */
                        return 1;
                }
        }
        return r;
}

/* Drop the pools of owner (non-NULL), or of rootfs (non-NULL, any owner). */
static int pool_drop_matching(struct cove_node *n, const char *owner, const char *rootfs)
{
        /* the pools stay listed (the refill thread may be starting one of their instances
         * right now; it stops that one itself when it sees dropped), empty and never taken */
        char(*ids)[64] = NULL;
        size_t nids = 0, cap = 0;
        pthread_mutex_lock(&n->mu);
        for (struct pool *p = n->pools; p; p = p->next) {
                const char *want = owner ? owner : rootfs, *have = owner ? p->owner : p->rootfs;
                if (!want || strcmp(have, want) != 0)
                        continue;
                p->dropped = 1;
                p->target = 0;
                for (struct inst *in = n->insts; in; in = in->next) {
                        if (in->pool != p || in->stopping)
                                continue;
                        if (nids == cap) {
                                size_t nc = cap ? 2 * cap : 8;
                                void *nb = realloc(ids, nc * sizeof(*ids));
                                if (!nb)
                                        break;
                                ids = nb;
                                cap = nc;
                        }
                        snprintf(ids[nids++], 64, "%s", in->id);
                }
        }
        pthread_mutex_unlock(&n->mu);
        for (size_t i = 0; i < nids; i++) {
                struct cove_err e;
                if (cove_node_stop(n, ids[i], 1, &e) < 0)
                        cove_warn(n->cfg.log, "pool", "%s", e.msg);
        }
        free(ids);
        return (int)nids;
}

int cove_node_pool_drop(struct cove_node *n, const char *owner)
{
        if (!owner || !*owner)
                return 0;
        return pool_drop_matching(n, owner, NULL);
}

int cove_node_pool_drop_rootfs(struct cove_node *n, const char *rootfs)
{
        if (!rootfs || !*rootfs)
                return 0;
        return pool_drop_matching(n, NULL, rootfs);
}

/* Mark sandbox_id's running instance busy (a stop waits for busy to drop to 0) for a
 * runtime call made without n->mu; NULL with COVE_E_CONFLICT when it has none. */
static struct inst *busy_begin(struct cove_node *n, const char *sandbox_id, struct cove_err *err)
{
        pthread_mutex_lock(&n->mu);
        struct inst *in = find_locked(n, sandbox_id);
        /* stopping excludes it: a stop may free it once mu is released */
        if (!in || in->stopping || in->pool) {
                pthread_mutex_unlock(&n->mu);
                cove_err_setk(err, COVE_E_CONFLICT, 0, "sandbox %s has no running instance",
                              sandbox_id);
                return NULL;
        }
        in->busy++;
        pthread_mutex_unlock(&n->mu);
        return in;
}

static void busy_end(struct cove_node *n, struct inst *in)
{
        pthread_mutex_lock(&n->mu);
        in->busy--;
        cove_chan_touch(in->chan, cove_mono_ns() / 1000000); /* silence while held is no hang */
        pthread_cond_broadcast(&n->stop_cv);
        pthread_mutex_unlock(&n->mu);
}

/* A runtime without the operation: busy_end and COVE_E_UNAVAILABLE. */
static int busy_unsupported(struct cove_node *n, struct inst *in, const char *what,
                            struct cove_err *err)
{
        const char *name = in->ops->name;
        busy_end(n, in);
        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0, "runtime %s cannot %s", name, what);
}

int cove_node_layer_snapshot(struct cove_node *n, const char *sandbox_id, const char *dest_image,
                             uint64_t *pause_ns, struct cove_err *err)
{
        struct inst *in = busy_begin(n, sandbox_id, err);
        if (!in)
                return -1;
        if (!in->ops->layer_snapshot)
                return busy_unsupported(n, in, "snapshot sandboxes", err);
        int r = in->ops->layer_snapshot(in->rt, &in->ri, sandbox_id, dest_image, pause_ns, err);
        busy_end(n, in);
        return r;
}

int cove_node_full_status(struct cove_node *n, char *why, size_t cap)
{
        struct cove_runtime *rt;
        const struct cove_runtime_ops *o = ckpt_ops(n, &rt);
        if (!o) {
                snprintf(why, cap, "no runtime here takes checkpoints (CRIU)");
                return 0;
        }
        return o->full_status(rt, why, cap);
}

int cove_node_full_wait(struct cove_node *n, int timeout_ms, char *why, size_t cap)
{
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        dl.tv_sec += timeout_ms / 1000;
        dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) {
                dl.tv_sec++;
                dl.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&n->mu);
        while (n->fullcheck_started && !n->fullcheck_done &&
               pthread_cond_timedwait(&n->full_cv, &n->mu, &dl) == 0)
                ;
        pthread_mutex_unlock(&n->mu);
        return cove_node_full_status(n, why, cap);
}

int cove_node_full_dump(struct cove_node *n, const char *sandbox_id, const char *dest_image,
                        const char *dest_mem, int leave_frozen, uint64_t *pause_ns,
                        struct cove_err *err)
{
        char why[320];
        if (cove_node_full_status(n, why, sizeof(why)) != 1)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "this node cannot take full snapshots of ns sandboxes");
        struct inst *in = busy_begin(n, sandbox_id, err);
        if (!in)
                return -1;
        if (!in->ops->full_dump)
                return busy_unsupported(n, in, "take checkpoints", err);
        int r = in->ops->full_dump(in->rt, &in->ri, sandbox_id, dest_image, dest_mem, leave_frozen,
                                   pause_ns, err);
        if (r == 0 && leave_frozen) {
                pthread_mutex_lock(&n->mu);
                in->frozen = 1; /* until cove_node_freeze(0) or the stop */
                pthread_mutex_unlock(&n->mu);
        }
        busy_end(n, in);
        return r;
}

int cove_node_full_snapshot(struct cove_node *n, const char *sandbox_id, int out_fd,
                            uint64_t *pause_ns, struct cove_err *err)
{
        struct inst *in = busy_begin(n, sandbox_id, err);
        if (!in)
                return -1;
        if (!in->ops->full_snapshot)
                return busy_unsupported(n, in, "take full snapshots", err);
        int r = in->ops->full_snapshot(in->rt, &in->ri, out_fd, pause_ns, err);
        busy_end(n, in);
        return r;
}

int cove_node_has_full(struct cove_node *n, const char *sandbox_id)
{
        pthread_mutex_lock(&n->mu);
        struct inst *in = find_locked(n, sandbox_id);
        int r = in && !in->stopping && !in->pool && in->ops->full_snapshot;
        pthread_mutex_unlock(&n->mu);
        return r;
}

/* Layer images belong to the driver that has them (ns), default or not. */
static const struct cove_runtime_ops *layer_ops(struct cove_node *n, struct cove_runtime **rt)
{
        if (n->cfg.rt_ops->layer_open) {
                *rt = n->rt;
                return n->cfg.rt_ops;
        }
        if (n->rt_alt && n->cfg.rt_alt_ops->layer_open) {
                *rt = n->rt_alt;
                return n->cfg.rt_alt_ops;
        }
        *rt = NULL;
        return n->cfg.rt_ops;
}

const char *cove_node_layer_dir(struct cove_node *n)
{
        struct cove_runtime *rt;
        const struct cove_runtime_ops *o = layer_ops(n, &rt);
        return o->layer_dir && rt ? o->layer_dir(rt) : NULL;
}

int cove_node_layer_open(struct cove_node *n, const char *image, int create, unsigned disk_mb,
                         const uint8_t *key, int *tree_fd, struct cove_layer_handle **h,
                         struct cove_err *err)
{
        struct cove_runtime *rt;
        const struct cove_runtime_ops *o = layer_ops(n, &rt);
        if (!o->layer_open || !rt)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0, "runtime %s has no layer images",
                                     o->name);
        return o->layer_open(rt, image, create, disk_mb, key, tree_fd, h, err);
}

void cove_node_layer_close(struct cove_node *n, struct cove_layer_handle *h)
{
        struct cove_runtime *rt;
        const struct cove_runtime_ops *o = layer_ops(n, &rt);
        if (h && o->layer_close && rt)
                o->layer_close(rt, h);
}

void cove_node_pool_stats(struct cove_node *n, int *ready, uint64_t *taken, uint64_t *missed)
{
        *ready = 0;
        *taken = *missed = 0;
        pthread_mutex_lock(&n->mu);
        /* ready = takeable now: not those still warming up */
        for (struct inst *in = n->insts; in; in = in->next)
                *ready += in->pool && !in->stopping && !in->warming;
        for (struct pool *p = n->pools; p; p = p->next) {
                *taken += p->taken;
                *missed += p->missed;
        }
        pthread_mutex_unlock(&n->mu);
}

int cove_node_pool_target(struct cove_node *n)
{
        int t = 0;
        pthread_mutex_lock(&n->mu);
        for (struct pool *p = n->pools; p; p = p->next)
                t += p->dropped ? 0 : p->target;
        pthread_mutex_unlock(&n->mu);
        return t;
}

struct cove_chan *cove_node_chan(struct cove_node *n, const char *sandbox_id)
{
        pthread_mutex_lock(&n->mu);
        struct inst *in = find_locked(n, sandbox_id);
        struct cove_chan *c = NULL;
        if (in && !in->stopping && !in->pool && !in->held) {
                c = in->chan;
                cove_chan_ref(c);
        }
        pthread_mutex_unlock(&n->mu);
        return c;
}

int cove_node_freeze(struct cove_node *n, const char *sandbox_id, int freeze, struct cove_err *err)
{
        pthread_mutex_lock(&n->mu);
        struct inst *in = find_locked(n, sandbox_id);
        int r;
        if (!in)
                r = cove_err_setk(err, COVE_E_CONFLICT, 0, "sandbox %s has no running instance",
                                  sandbox_id);
        else
                r = freeze ? in->ops->freeze(in->rt, &in->ri, err)
                           : in->ops->thaw(in->rt, &in->ri, err);
        if (in && (r == 0 || freeze)) {
                /* also a freeze that failed half-way may hold some of it still */
                in->frozen = freeze;
                cove_chan_touch(in->chan, cove_mono_ns() / 1000000);
        }
        /* thawed: the guest hears from us at once (its own clock ran while it was frozen) */
        struct cove_chan *beat = NULL;
        if (in && r == 0 && !freeze && fence_ttl(n) > 0 && !n->beat_paused) {
                beat = in->chan;
                cove_chan_ref(beat);
        }
        pthread_mutex_unlock(&n->mu);
        if (beat) {
                cove_chan_beat(beat, 0);
                cove_chan_unref(beat);
        }
        return r;
}

int cove_node_usage(struct cove_node *n, const char *sandbox_id, uint64_t *mem, uint64_t *cpu,
                    struct cove_err *err)
{
        pthread_mutex_lock(&n->mu);
        struct inst *in = find_locked(n, sandbox_id);
        int r;
        if (!in || in->held) /* a hot pause's frozen instance runs for nobody */
                r = cove_err_setk(err, COVE_E_CONFLICT, 0, "sandbox %s has no running instance",
                                  sandbox_id);
        else if (!in->ops->usage)
                r = cove_err_setk(err, COVE_E_UNAVAILABLE, 0, "runtime has no usage figures");
        else
                r = in->ops->usage(in->rt, &in->ri, mem, cpu, err);
        pthread_mutex_unlock(&n->mu);
        return r;
}

/* Take in's channel out of the I/O loop, so no callback runs on it, and close it: nothing
 * reaches the guest any more. */
static void unwatch(struct cove_node *n, struct inst *in, const char *why)
{
        pthread_mutex_lock(&n->io_mu);
        epoll_ctl(n->epfd, EPOLL_CTL_DEL, cove_chan_fd(in->chan), NULL);
        pthread_mutex_unlock(&n->io_mu);
        cove_chan_close(in->chan, why);
}

/* The rest of a stop, for an instance marked stopping and unwatched: the driver's stop, the
 * instance out of the list (waking a stopper that waits), its uid range, on_stop; with
 * purge its state dir last (the sign, after a crash, that something is left to clean). */
static int stop_finish(struct cove_node *n, struct inst *in, int purge, struct cove_err *err)
{
        char id[64], sd[PATH_MAX];
        snprintf(id, sizeof(id), "%s", in->id);
        state_dir_of(n, id, sd, sizeof(sd));
        int r = in->ops->stop(in->rt, &in->ri, id, sd, purge, err);
        pthread_mutex_lock(&n->mu);
        for (struct inst **pp = &n->insts; *pp; pp = &(*pp)->next)
                if (*pp == in) {
                        *pp = in->next;
                        n->ninsts--;
                        break;
                }
        pthread_cond_broadcast(&n->stop_cv);
        pthread_mutex_unlock(&n->mu);
        cove_node_uid_release(n, in->uid_base);
        cove_chan_unref(in->chan);
        free(in);
        if (n->cfg.on_stop)
                n->cfg.on_stop(n->cfg.arg, id);
        if (r == 0 && purge)
                r = cove_rm_rf(sd, err);
        return r;
}

int cove_node_stop(struct cove_node *n, const char *sandbox_id, int purge, struct cove_err *err)
{
        char sd[PATH_MAX];
        state_dir_of(n, sandbox_id, sd, sizeof(sd));
        pthread_mutex_lock(&n->mu);
        /* one stopper per instance (DELETE, timer, on_dead and shutdown may race): a second
         * one waits until the first is done, then finds nothing and cleans what is left */
        struct inst *in;
        while ((in = find_locked(n, sandbox_id)) && in->stopping)
                pthread_cond_wait(&n->stop_cv, &n->mu);
        if (in) {
                in->stopping = 1;
                while (in->busy) /* a layer snapshot holds the instance */
                        pthread_cond_wait(&n->stop_cv, &n->mu);
        }
        pthread_mutex_unlock(&n->mu);
        int r;
        if (!in) {
                r = cleanup_any(n, sandbox_id, sd, purge, err);
                if (r == 0 && purge)
                        r = cove_rm_rf(sd, err);
        } else {
                unwatch(n, in, "sandbox stopped");
                r = stop_finish(n, in, purge, err);
        }
        return r < 0 ? cove_err_wrap(err, "stop sandbox %s", sandbox_id) : 0;
}

/* The reaper runs at normal priority: its unmounts and rmdirs hold kernel locks (the mount
 * namespace's, cgroup_mutex) that the next create needs, and a starved holder would stall
 * that create (no priority inheritance for those). */
static void *reaper_main(void *arg)
{
        struct cove_node *n = arg;
        pthread_mutex_lock(&n->mu);
        for (;;) {
                while (!n->reap_head && !n->reap_quit)
                        pthread_cond_wait(&n->reap_cv, &n->mu);
                struct reap_job *j = n->reap_head;
                if (!j)
                        break;
                n->reap_head = j->next;
                pthread_mutex_unlock(&n->mu);
                int64_t hold = cove_testhooks_reap_hold_ms();
                if (hold > 0) { /* a window in which a test crashes coved (testhooks.h) */
                        cove_info(n->cfg.log, "node.reap", "test hook: holding %s for %lld ms",
                                  j->in->id, (long long)hold);
                        int64_t until = cove_mono_ns() + hold * 1000000;
                        while (cove_mono_ns() < until && cove_testhooks_reap_hold_ms() > 0 &&
                               !__atomic_load_n(&n->pool_quit, __ATOMIC_RELAXED))
                                usleep(20000);
                }
                struct cove_err e;
                char id[64];
                snprintf(id, sizeof(id), "%s", j->in->id);
                if (stop_finish(n, j->in, j->purge, &e) < 0)
                        cove_warn(n->cfg.log, "node.reap", "stop sandbox %s: %s", id, e.msg);
                free(j);
                pthread_mutex_lock(&n->mu);
        }
        pthread_mutex_unlock(&n->mu);
        return NULL;
}

int cove_node_kill(struct cove_node *n, const char *sandbox_id, int purge, struct cove_err *err)
{
        pthread_mutex_lock(&n->mu);
        struct inst *in;
        while ((in = find_locked(n, sandbox_id)) && in->stopping)
                pthread_cond_wait(&n->stop_cv, &n->mu);
        if (in && in->ops->kill && !n->reaper_started && !n->reap_quit) {
                if (pthread_create(&n->reaper, NULL, reaper_main, n) == 0)
                        n->reaper_started = 1;
        }
        /* nothing to kill, no reaper, or cove_node_free() stopped it: everything now */
        struct reap_job *j = in && in->ops->kill && n->reaper_started && !n->reap_quit
                                 ? calloc(1, sizeof(*j))
                                 : NULL;
        if (!j) {
                pthread_mutex_unlock(&n->mu);
                return cove_node_stop(n, sandbox_id, purge, err);
        }
        in->stopping = 1;
        while (in->busy)
                pthread_cond_wait(&n->stop_cv, &n->mu);
        pthread_mutex_unlock(&n->mu);
        unwatch(n, in, "sandbox deleted");
        struct cove_err e2;
        if (in->ops->kill(in->rt, &in->ri, sandbox_id, &e2) < 0) {
                /* the reaper's stop() kills again, and waits */
                cove_warn(n->cfg.log, "node.kill", "%s", e2.msg);
                free(j);
                int r = stop_finish(n, in, purge, err);
                return r < 0 ? cove_err_wrap(err, "stop sandbox %s", sandbox_id) : 0;
        }
        j->in = in;
        j->purge = purge;
        pthread_mutex_lock(&n->mu);
        struct reap_job **tail = &n->reap_head;
        while (*tail)
                tail = &(*tail)->next;
        *tail = j;
        pthread_cond_signal(&n->reap_cv);
        pthread_mutex_unlock(&n->mu);
        return 0;
}

pid_t cove_node_pid(struct cove_node *n, const char *sandbox_id)
{
        pthread_mutex_lock(&n->mu);
        struct inst *in = find_locked(n, sandbox_id);
        pid_t pid = in && !in->stopping && !in->pool && !in->held ? in->ri.pid : 0;
        pthread_mutex_unlock(&n->mu);
        return pid;
}

int cove_node_hold(struct cove_node *n, const char *sandbox_id, int held)
{
        pthread_mutex_lock(&n->mu);
        struct inst *in = find_locked(n, sandbox_id);
        struct cove_chan *c = NULL;
        int was = in ? in->held : 0;
        if (in) {
                in->held = held;
                c = in->chan;
                cove_chan_ref(c);
        }
        pthread_mutex_unlock(&n->mu);
        if (!in)
                return -1;
        /* its streams end with the pause, as a stop ends them; after the thaw, readers
         * follow what comes next */
        if (held && !was)
                cove_chan_cut(c, "sandbox paused");
        else if (!held && was)
                cove_chan_uncut(c);
        cove_chan_unref(c);
        return 0;
}

int cove_node_count(struct cove_node *n)
{
        pthread_mutex_lock(&n->mu);
        int k = n->ninsts;
        pthread_mutex_unlock(&n->mu);
        return k;
}

void cove_node_free(struct cove_node *n)
{
        if (!n)
                return;
        pthread_mutex_lock(&n->mu);
        n->pool_quit = 1;
        pthread_cond_broadcast(&n->pool_cv);
        int refill = n->refill_started;
        pthread_mutex_unlock(&n->mu);
        if (refill)
                pthread_join(n->refill, NULL);
        if (n->fullcheck_started)
                pthread_join(n->fullcheck, NULL);
        for (;;) {
                char id[64];
                int purge = 0;
                pthread_mutex_lock(&n->mu);
                struct inst *in = n->insts;
                if (in) {
                        snprintf(id, sizeof(id), "%s", in->id);
                        purge = in->pool != NULL; /* an idle pooled sandbox belongs to no one */
                }
                pthread_mutex_unlock(&n->mu);
                if (!in)
                        break;
                struct cove_err e;
                if (cove_node_stop(n, id, purge, &e) < 0)
                        cove_warn(n->cfg.log, "node.stop", "%s", e.msg);
        }
        /* every instance is gone, so the reaper has nothing left (cove_node_stop waits for
         * an instance it is stopping) */
        pthread_mutex_lock(&n->mu);
        n->reap_quit = 1;
        pthread_cond_broadcast(&n->reap_cv);
        int reaper = n->reaper_started;
        pthread_mutex_unlock(&n->mu);
        if (reaper)
                pthread_join(n->reaper, NULL);
        spawners_stop(n);
        uint64_t one = 1;
        ssize_t w = write(n->wake_fd, &one, sizeof(one));
        (void)w;
        pthread_join(n->io, NULL);
        if (n->rt_alt)
                n->cfg.rt_alt_ops->close(n->rt_alt);
        n->cfg.rt_ops->close(n->rt);
        close(n->epfd);
        close(n->wake_fd);
        if (n->uid_lock_fd >= 0)
                close(n->uid_lock_fd); /* drops every slot lock still held */
        while (n->pools) {
                struct pool *p = n->pools->next;
                free(n->pools);
                n->pools = p;
        }
        free(n);
}
