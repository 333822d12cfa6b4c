/* Guest self-freeze: when the node has not been heard from for the fence TTL, every process
 * of the sandbox but the guest itself is frozen, and stays so until the node sends THAW. The
 * node may itself be stopped (SIGSTOP, a paused VM), so this cannot wait for it: a thread of
 * its own watches the time on CLOCK_BOOTTIME, which runs whatever the node does, and acts
 * even while the event loop is blocked writing to a node that no longer reads.
 *
 * Signs of the node: a HEARTBEAT frame handled by the event loop, and, seen by the thread
 * itself, the channel's queues moving the node's way (bytes arriving that the event loop has
 * not read yet, or bytes it wrote being taken): a node that holds a busy guest's channel on
 * purpose (a slow consumer) still sends heartbeats that then wait unread. Only the node can
 * make either happen: the channel is a socket no sandbox process holds.
 *
 * Freeze: the sandbox's own freezer where the guest may write it (cgroup v2: work/cgroup.freeze
 * under COVE_GUEST_CGROUP_DIR), and always SIGSTOP to every process of the pid namespace
 * (kill(-1) from PID 1 spares PID 1; SIGSTOP cannot be caught or ignored, and a process that
 * forks meanwhile has the signal passed on to its child by the kernel), repeated on every
 * tick while frozen. A guest that is not PID 1 (tests) stops the process groups it started
 * instead, from its event loop. Thaw: SIGCONT to the same set, then the freezer. */
#include "guest/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "guest/guest.h"

#define FENCE_TTL_MAX_MS 3600000
#define FENCE_FREEZE_FILE COVE_GUEST_CGROUP_DIR "/work/cgroup.freeze"

static int64_t boot_ms(void)
{
        struct timespec ts;
        if (clock_gettime(CLOCK_BOOTTIME, &ts) < 0)
                clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#define LOAD(x) __atomic_load_n(&(x), __ATOMIC_SEQ_CST)
#define STORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_SEQ_CST)

/* best effort: absent (vm, cgroup v1) or not ours to write (EACCES) leaves the signals */
static void cgroup_freeze(int on)
{
        int fd = open(FENCE_FREEZE_FILE, O_WRONLY | O_CLOEXEC);
        if (fd < 0)
                return;
        ssize_t w = write(fd, on ? "1" : "0", 1);
        (void)w;
        close(fd);
}

/* With f->mu held. No allocation, no stdio: the event loop may fork at any moment. */
static void apply_freeze(struct gfence *f)
{
        cgroup_freeze(1);
        if (f->pid1)
                kill(-1, SIGSTOP);
}

static void *watchdog(void *arg)
{
        struct cove_guest *g = arg;
        struct gfence *f = &g->fence;
        int64_t last = boot_ms();
        int pin = -1, pout = -1;
        for (;;) {
                int ttl = LOAD(f->ttl_ms);
                int tick = ttl > 0 ? ttl / 4 : 250; /* off again: idle */
                tick = tick < 10 ? 10 : tick > 250 ? 250 : tick;
                struct pollfd pf = {.fd = f->wake, .events = POLLIN};
                if (poll(&pf, 1, tick) > 0)
                        break;
                int64_t now = boot_ms();
                if (ttl <= 0) {
                        last = now;
                        continue;
                }
                /* the guest itself did not run for a long while (its node froze the whole
                 * sandbox for a snapshot, or the machine was suspended): the node gets a
                 * short grace to be heard from before this counts */
                int over = ttl / 2 > 4 * tick ? ttl / 2 : 4 * tick;
                if (now - last > over) {
                        int64_t grace = ttl / 2 < 1000 ? ttl / 2 : 1000;
                        int64_t floor = now - ttl + grace;
                        if (LOAD(f->beat_ms) < floor)
                                STORE(f->beat_ms, floor);
                }
                last = now;
                int fd = LOAD(f->chan), in = 0, out = 0;
                if (fd >= 0 && ioctl(fd, SIOCINQ, &in) == 0 && ioctl(fd, SIOCOUTQ, &out) == 0) {
                        if ((pin >= 0 && in > pin) || (pout >= 0 && out < pout))
                                STORE(f->beat_ms, now);
                        pin = in;
                        pout = out;
                }
                pthread_mutex_lock(&f->mu);
                if (LOAD(f->fenced)) {
                        apply_freeze(f); /* again: nothing may slip out of it */
                } else if (now - LOAD(f->beat_ms) >= ttl) {
                        STORE(f->fenced, 1);
                        __atomic_add_fetch(&f->freezes, 1, __ATOMIC_SEQ_CST);
                        apply_freeze(f);
                }
                pthread_mutex_unlock(&f->mu);
        }
        return NULL;
}

void g_fence_set_chan(struct cove_guest *g, int fd)
{
        STORE(g->fence.chan, fd);
}

int g_fence_config(struct cove_guest *g, int ttl_ms, struct cove_err *err)
{
        struct gfence *f = &g->fence;
        STORE(f->beat_ms, boot_ms());
        STORE(f->ttl_ms, ttl_ms);
        if (ttl_ms <= 0 || f->started)
                return 0;
        f->pid1 = g->pid1;
        f->chan = g->chan;
        f->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (f->wake < 0)
                return cove_err_set(err, errno, "fence: eventfd");
        pthread_mutex_init(&f->mu, NULL);
        int e = pthread_create(&f->th, NULL, watchdog, g);
        if (e) {
                close(f->wake);
                f->wake = -1;
                STORE(f->ttl_ms, 0);
                return cove_err_set(err, e, "fence: thread");
        }
        f->started = true;
        return 0;
}

void g_fence_beat(struct cove_guest *g)
{
        if (g->fence.started)
                STORE(g->fence.beat_ms, boot_ms());
}

bool g_fenced(struct cove_guest *g)
{
        return g->fence.started && LOAD(g->fence.fenced);
}

void g_fence_turn(struct cove_guest *g)
{
        struct gfence *f = &g->fence;
        if (!f->started || f->pid1)
                return;
        bool on = LOAD(f->fenced);
        if (on == f->applied && !on)
                return;
        /* not PID 1: stop what we started (again each turn while frozen: new children) */
        for (size_t i = 0; i < g->nprocs; i++)
                if (!g->procs[i]->reaped && !g->procs[i]->dead)
                        kill(-g->procs[i]->pid, on ? SIGSTOP : SIGCONT);
        f->applied = on;
}

void g_fence_thaw(struct cove_guest *g)
{
        struct gfence *f = &g->fence;
        if (!f->started)
                return;
        pthread_mutex_lock(&f->mu);
        if (LOAD(f->fenced)) {
                if (f->pid1)
                        kill(-1, SIGCONT); /* clears the stops first, then the freezer goes */
                cgroup_freeze(0);
                STORE(f->fenced, 0);
                if (g->log)
                        cove_info(g->log, "guest.fence", "thawed by the node");
        }
        STORE(f->beat_ms, boot_ms());
        pthread_mutex_unlock(&f->mu);
        g_fence_turn(g);
}

void g_fence_close(struct cove_guest *g)
{
        struct gfence *f = &g->fence;
        if (!f->started)
                return;
        uint64_t one = 1;
        ssize_t w = write(f->wake, &one, sizeof(one));
        (void)w;
        pthread_join(f->th, NULL);
        close(f->wake);
        pthread_mutex_destroy(&f->mu);
        f->started = false;
}

/* {"op":"fence","ttl_ms":N}: the node's fence TTL (0: off). Answers whether the sandbox is
 * frozen now (a pooled guest whose node was stopped while it waited). */
int g_op_fence(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err)
{
        struct cove_err e = {0};
        int64_t ttl = 0;
        if (g_get_int(req, "ttl_ms", true, 0, FENCE_TTL_MAX_MS, &ttl, &e) < 0 ||
            g_fence_config(g, (int)ttl, &e) < 0)
                return g_reply_err(g, id, &e, err);
        return g_reply_ok(g, id, json_pack("{s:b}", "fenced", g_fenced(g)), err);
}
