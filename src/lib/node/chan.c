/* Node end of a guest channel; see chan.h for the threading model.
 * One mutex per channel guards every table; one condition variable is broadcast on any
 * change (few waiters per channel, so a shared one is simpler than per-object ones). */
#include "node/chan.h"

#include "net/policy.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "proto/frame.h"
#include "util/cleanup.h"
#include "util/util.h"

#define CALL_TIMEOUT_MS 30000
#define WRITE_TIMEOUT_MS 10000
#define FENCE_CALL_MS 10000 /* fence and thaw requests */
#define MAX_PENDING 256
#define MAX_PROCS_KEPT 64 /* finished processes kept for reconnects */
#define MAX_PROCS 1100    /* running + kept */
#define PROC_REPLAY_BYTES (2u << 20)
#define PROC_REPLAY_EVENTS 65536
#define HOLD_PAUSE_BYTES (512u << 10) /* unread output of a held process that pauses rx */
#define HOLD_RESUME_BYTES (128u << 10)
#define WATCH_REPLAY_BYTES (1u << 20)
#define WATCH_REPLAY_EVENTS 20000
#define MAX_WATCHES 64
#define RX_PAUSE_BYTES (8u << 20) /* queued file bytes before the guest is not read (old guest) */
#define RX_RESUME_BYTES (2u << 20)
/* Downloads from a guest that takes windows: each read may have at most READ_WINDOW bytes
 * queued here or on the way, and more is granted as its reader takes them, so a slow or
 * gone reader stalls only its own transfer. At most MAX_READS at once per channel. */
#define READ_WINDOW (1u << 20)
#define MAX_READS 16
#define PING_AFTER_MS 1000 /* silence after which the node pings the guest */
/* Request ids start above every possible pid (< 2^22): a DATA frame's id names either an
 * upload or a process's stdin, and the two must never collide. */
#define REQ_ID_FIRST 0x400000u

enum { PEND_CALL = 1, PEND_EXEC, PEND_READ, PEND_WRITE, PEND_WATCH };

struct chunk {
        struct chunk *next;
        size_t len, off;
        uint8_t data[];
};

struct pending {
        struct pending *next;
        uint32_t id;
        int kind;
        int done;     /* RESP arrived (or the channel died) */
        json_t *resp; /* the guest's RESP object, NULL if it died first */
        /* PEND_READ */
        struct chunk *qh, *qt;
        size_t qbytes;
        uint64_t expect; /* announced size (an upper bound) */
        uint64_t got;
        uint64_t allowed; /* bytes granted (windowed reads) */
        int data_end;     /* END arrived, or the channel died */
        int ended;        /* END arrived */
        /* PEND_EXEC */
        char tag[128];
        json_t *cmd;
        uint32_t pid;
        int stdin_open; /* exec asked for stdin:true */
        int hold;       /* the caller reads every event (exec wait): back-pressure, no drops */
};

struct proc {
        struct proc *next;
        uint32_t pid;
        char tag[128];
        json_t *cmd;
        int64_t started_at;
        int running;
        int stdin_open;     /* started with stdin:true and no EOF sent yet */
        int hold;           /* a reader takes every event: pause the guest rather than drop */
        uint64_t held_seq;  /* last seq that reader took */
        size_t unread;      /* event bytes after held_seq */
        uint64_t cut_seq;   /* the ERROR event a cut (cove_chan_cut) ended its readers with */
        uint64_t floor_seq; /* readers start after it: what came before a cut is not replayed */
        struct cove_replay rb;
};

struct cove_watch {
        struct cove_watch *next;
        struct cove_chan *c;
        uint32_t id;
        struct cove_replay rb;
};

struct cove_xfer {
        struct cove_chan *c;
        struct pending *p;
        int finished;
};

struct cove_chan {
        pthread_mutex_t mu;
        pthread_cond_t cv;
        /* replay readers (process events, watches) wait on their own condition, signalled
         * only when a replay buffer changes: the guest's pongs, answers and flow frames
         * (every frame signals cv) must not wake a thousand idle streams */
        pthread_cond_t ev_cv;
        int ev_dirty;        /* a replay changed while reading: signal ev_cv once after the batch */
        pthread_mutex_t wmu; /* serialises frame writes */
        int refs;
        int fd;
        int closed;
        char why[256];
        char sandbox_id[64];
        const struct cove_log *log;
        struct cove_decoder dec;
        uint32_t next_id;
        struct pending *pend;
        int npend;
        struct proc *procs;
        int nprocs;
        /* bumped whenever a process record is freed: a reader that waited on a record's
         * replay buffer (the lock released) looks the record up again instead of touching
         * memory that may be gone */
        uint64_t procs_gen;
        struct cove_watch *watches;
        int nwatches;
        int rx_paused;
        int flow;           /* the guest takes WINDOW and CANCEL (its HELLO said "window") */
        int64_t last_rx_ms; /* monotonic ms of the last bytes from the guest */
        int64_t ping_ms;    /* when the last unanswered ping went out; 0: none */
        struct cove_ask asks[COVE_CHAN_MAX_ASKS]; /* validated, not yet handed out */
        int nasks;
        void (*rx_notify)(void *arg, struct cove_chan *c);
        void *rx_arg;
};

static void abs_deadline(struct timespec *ts, int timeout_ms)
{
        clock_gettime(CLOCK_MONOTONIC, ts);
        ts->tv_sec += timeout_ms / 1000;
        ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (ts->tv_nsec >= 1000000000L) {
                ts->tv_sec++;
                ts->tv_nsec -= 1000000000L;
        }
}

/* wait on cv until deadline; returns ETIMEDOUT or 0 */
static int wait_until(struct cove_chan *c, const struct timespec *dl)
{
        return pthread_cond_timedwait(&c->cv, &c->mu, dl);
}

struct cove_chan *cove_chan_new(int fd, const char *sandbox_id, const struct cove_log *log,
                                struct cove_err *err)
{
        struct cove_chan *c = calloc(1, sizeof(*c));
        if (!c) {
                close(fd);
                cove_err_set(err, ENOMEM, "guest channel");
                return NULL;
        }
        pthread_mutex_init(&c->mu, NULL);
        pthread_mutex_init(&c->wmu, NULL);
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&c->cv, &ca);
        pthread_cond_init(&c->ev_cv, &ca);
        pthread_condattr_destroy(&ca);
        c->refs = 1;
        c->fd = fd;
        c->log = log;
        c->next_id = REQ_ID_FIRST;
        snprintf(c->sandbox_id, sizeof(c->sandbox_id), "%s", sandbox_id);
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ||
            cove_decoder_init(&c->dec, COVE_FRAME_MAX, err) < 0) {
                cove_err_set(err, errno, "guest channel %s", sandbox_id);
                cove_chan_unref(c);
                return NULL;
        }
        return c;
}

int cove_chan_fd(const struct cove_chan *c)
{
        return c->fd;
}

void cove_chan_ref(struct cove_chan *c)
{
        pthread_mutex_lock(&c->mu);
        c->refs++;
        pthread_mutex_unlock(&c->mu);
}

static void chunks_free(struct pending *p)
{
        while (p->qh) {
                struct chunk *n = p->qh->next;
                free(p->qh);
                p->qh = n;
        }
        p->qt = NULL;
        p->qbytes = 0;
}

static void pending_free(struct pending *p)
{
        chunks_free(p);
        json_decref(p->resp);
        json_decref(p->cmd);
        free(p);
}

static void proc_free(struct proc *p)
{
        cove_replay_free(&p->rb);
        json_decref(p->cmd);
        free(p);
}

void cove_chan_unref(struct cove_chan *c)
{
        pthread_mutex_lock(&c->mu);
        int last = --c->refs == 0;
        pthread_mutex_unlock(&c->mu);
        if (!last)
                return;
        while (c->pend) {
                struct pending *n = c->pend->next;
                pending_free(c->pend);
                c->pend = n;
        }
        while (c->procs) {
                struct proc *n = c->procs->next;
                proc_free(c->procs);
                c->procs = n;
        }
        /* watches hold a ref, so none is left here */
        for (int i = 0; i < c->nasks; i++)
                json_decref(c->asks[i].ask);
        cove_decoder_free(&c->dec);
        if (c->fd >= 0)
                close(c->fd);
        pthread_mutex_destroy(&c->mu);
        pthread_mutex_destroy(&c->wmu);
        pthread_cond_destroy(&c->cv);
        pthread_cond_destroy(&c->ev_cv);
        free(c);
}

void cove_chan_set_rx_notify(struct cove_chan *c, void (*fn)(void *arg, struct cove_chan *c),
                             void *arg)
{
        pthread_mutex_lock(&c->mu);
        c->rx_notify = fn;
        c->rx_arg = arg;
        pthread_mutex_unlock(&c->mu);
}

static void close_locked(struct cove_chan *c, const char *why)
{
        if (c->closed)
                return;
        c->closed = 1;
        snprintf(c->why, sizeof(c->why), "%s", why);
        for (struct pending *p = c->pend; p; p = p->next) {
                p->done = 1;
                p->data_end = 1;
        }
        for (struct proc *p = c->procs; p; p = p->next) {
                if (p->running) {
                        static const char msg[] = "sandbox stopped";
                        cove_replay_append(&p->rb, COVE_EV_ERROR, msg, sizeof(msg) - 1);
                        p->running = 0;
                }
                p->rb.closed = 1;
        }
        for (struct cove_watch *w = c->watches; w; w = w->next)
                w->rb.closed = 1;
        pthread_cond_broadcast(&c->cv);
        pthread_cond_broadcast(&c->ev_cv);
}

void cove_chan_close(struct cove_chan *c, const char *why)
{
        pthread_mutex_lock(&c->mu);
        close_locked(c, why);
        pthread_mutex_unlock(&c->mu);
        /* unblock a writer stuck on a full socket and make the guest see EOF */
        shutdown(c->fd, SHUT_RDWR);
}

void cove_chan_cut(struct cove_chan *c, const char *why)
{
        void (*notify)(void *, struct cove_chan *) = NULL;
        void *narg = NULL;
        pthread_mutex_lock(&c->mu);
        for (struct proc *p = c->procs; p; p = p->next) {
                if (!p->running)
                        continue;
                uint64_t seq =
                    cove_replay_append(&p->rb, COVE_EV_ERROR, why, (uint32_t)strlen(why));
                p->cut_seq = seq ? seq : p->rb.next_seq - 1;
                p->hold = 0; /* its reader ends here: nothing holds the guest back any more */
                p->unread = 0;
        }
        for (struct cove_watch *w = c->watches; w; w = w->next)
                w->rb.closed = 1;
        if (c->rx_paused) {
                c->rx_paused = 0;
                notify = c->rx_notify;
                narg = c->rx_arg;
        }
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        if (notify)
                notify(narg, c);
}

void cove_chan_uncut(struct cove_chan *c)
{
        pthread_mutex_lock(&c->mu);
        for (struct proc *p = c->procs; p; p = p->next)
                if (p->cut_seq > p->floor_seq)
                        p->floor_seq = p->cut_seq;
        pthread_mutex_unlock(&c->mu);
}

int cove_chan_is_closed(struct cove_chan *c)
{
        pthread_mutex_lock(&c->mu);
        int r = c->closed;
        pthread_mutex_unlock(&c->mu);
        return r;
}

void cove_chan_wake(struct cove_chan *c)
{
        pthread_mutex_lock(&c->mu);
        pthread_cond_broadcast(&c->cv);
        pthread_cond_broadcast(&c->ev_cv);
        pthread_mutex_unlock(&c->mu);
}

int cove_chan_rx_paused(struct cove_chan *c)
{
        pthread_mutex_lock(&c->mu);
        int r = c->rx_paused;
        pthread_mutex_unlock(&c->mu);
        return r;
}

static int closed_err(struct cove_chan *c, struct cove_err *err)
{
        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0, "sandbox %s: guest channel closed (%s)",
                             c->sandbox_id, c->why[0] ? c->why : "stopped");
}

static int send_frame(struct cove_chan *c, uint8_t type, uint8_t flags, uint32_t id,
                      const void *payload, uint32_t len, struct cove_err *err)
{
        pthread_mutex_lock(&c->wmu);
        int r =
            cove_frame_write_timeout(c->fd, type, flags, id, payload, len, WRITE_TIMEOUT_MS, err);
        pthread_mutex_unlock(&c->wmu);
        if (r < 0) {
                cove_err_wrap(err, "sandbox %s", c->sandbox_id);
                cove_chan_close(c, "guest does not read its channel");
        }
        return r;
}

static int send_json(struct cove_chan *c, uint8_t type, uint32_t id, json_t *obj,
                     struct cove_err *err)
{
        cleanup_free char *s = json_dumps(obj, JSON_COMPACT);
        if (!s)
                return cove_err_set(err, ENOMEM, "encode request");
        size_t n = strlen(s);
        if (n > COVE_FRAME_MAX)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "request too large (%zu bytes)",
                                     n);
        return send_frame(c, type, 0, id, s, (uint32_t)n, err);
}

/* ---- handshake ------------------------------------------------------------------ */

static struct proc *find_proc(struct cove_chan *c, uint32_t pid);

/* Processes a guest restored from a checkpoint still runs (its HELLO reply's "procs"):
 * they join the process list with a fresh event history (tag "", started now), so their
 * output can be followed again. Hostile input: bounded count, pids and types checked. */
static void adopt_procs(struct cove_chan *c, json_t *procs)
{
        if (!json_is_array(procs))
                return;
        pthread_mutex_lock(&c->mu);
        for (size_t i = 0; i < json_array_size(procs) && c->nprocs < MAX_PROCS; i++) {
                json_t *e = json_array_get(procs, i), *jp = json_object_get(e, "pid");
                json_t *cmd = json_object_get(e, "cmd");
                if (!json_is_integer(jp) || json_integer_value(jp) <= 0 ||
                    json_integer_value(jp) > 0x7fffffff || !json_is_array(cmd) ||
                    json_array_size(cmd) > 64 || find_proc(c, (uint32_t)json_integer_value(jp)))
                        continue;
                int strings = 1;
                for (size_t k = 0; k < json_array_size(cmd); k++)
                        strings &= json_is_string(json_array_get(cmd, k));
                struct proc *p = strings ? calloc(1, sizeof(*p)) : NULL;
                if (!p)
                        continue;
                p->pid = (uint32_t)json_integer_value(jp);
                p->cmd = json_deep_copy(cmd);
                p->started_at = cove_now_ms();
                p->running = 1;
                p->stdin_open = json_is_true(json_object_get(e, "stdin"));
                cove_replay_init(&p->rb, PROC_REPLAY_BYTES, PROC_REPLAY_EVENTS);
                cove_replay_append(&p->rb, COVE_EV_START, NULL, 0);
                p->next = c->procs;
                c->procs = p;
                c->nprocs++;
        }
        pthread_mutex_unlock(&c->mu);
}

int cove_chan_hello(struct cove_chan *c, const char *token, const char *hostname, int timeout_ms,
                    struct cove_err *err)
{
        /* a vm guest may be one of many clones of a snapshot: it takes its wall clock and
         * fresh entropy from here (an ns guest shares the host's and ignores both) */
        uint8_t rnd[32];
        char seed[65];
        if (cove_random(rnd, sizeof(rnd), err) < 0)
                return -1;
        cove_hex(rnd, sizeof(rnd), seed);
        explicit_bzero(rnd, sizeof(rnd));
        struct timespec wall;
        clock_gettime(CLOCK_REALTIME, &wall);
        json_t *h = json_pack("{s:i, s:s, s:s, s:s, s:I}", "version", COVE_PROTO_VERSION, "token",
                              token, "hostname", hostname, "seed", seed, "time_ns",
                              (json_int_t)wall.tv_sec * 1000000000LL + wall.tv_nsec);
        explicit_bzero(seed, sizeof(seed));
        int r = send_json(c, COVE_F_HELLO, 0, h, err);
        json_decref(h);
        if (r < 0)
                return -1;
        struct timespec dl;
        abs_deadline(&dl, timeout_ms);
        int stale = 0;
        for (;;) {
                struct cove_frame f;
                int n = cove_decoder_next(&c->dec, &f, err);
                if (n < 0)
                        return cove_err_wrap(err, "sandbox %s: handshake", c->sandbox_id);
                if (n == 1 && f.type != COVE_F_HELLO &&
                    (f.type == COVE_F_OUT || f.type == COVE_F_EXIT || f.type == COVE_F_EVENT) &&
                    ++stale <= 4096)
                        continue; /* a restored vm's output of its previous session */
                if (n == 1) {
                        if (f.type != COVE_F_HELLO)
                                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                                     "sandbox %s: handshake: guest sent frame "
                                                     "type %u before HELLO",
                                                     c->sandbox_id, f.type);
                        json_error_t je;
                        json_t *j = json_loadb((const char *)f.payload, f.len, 0, &je);
                        int ok =
                            json_is_object(j) && json_is_true(json_object_get(j, "ok")) &&
                            json_integer_value(json_object_get(j, "version")) == COVE_PROTO_VERSION;
                        if (ok) {
                                adopt_procs(c, json_object_get(j, "procs"));
                                c->flow = json_is_true(json_object_get(j, "window"));
                                c->last_rx_ms = cove_mono_ns() / 1000000;
                        }
                        json_decref(j);
                        if (!ok)
                                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                                     "sandbox %s: handshake: guest refused or "
                                                     "speaks another protocol version",
                                                     c->sandbox_id);
                        return 0;
                }
                struct timespec now;
                clock_gettime(CLOCK_MONOTONIC, &now);
                long left =
                    (dl.tv_sec - now.tv_sec) * 1000L + (dl.tv_nsec - now.tv_nsec) / 1000000L;
                if (left <= 0)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, ETIMEDOUT,
                                             "sandbox %s: handshake", c->sandbox_id);
                struct pollfd p = {.fd = c->fd, .events = POLLIN};
                int pr = poll(&p, 1, (int)left);
                if (pr < 0 && errno != EINTR)
                        return cove_err_set(err, errno, "sandbox %s: handshake", c->sandbox_id);
                if (pr <= 0)
                        continue;
                size_t avail;
                uint8_t *sp = cove_decoder_space(&c->dec, &avail);
                ssize_t rd = read(c->fd, sp, avail);
                if (rd == 0)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                             "sandbox %s: handshake: guest exited", c->sandbox_id);
                if (rd < 0) {
                        if (errno == EINTR || errno == EAGAIN)
                                continue;
                        return cove_err_set(err, errno, "sandbox %s: handshake", c->sandbox_id);
                }
                cove_decoder_commit(&c->dec, (size_t)rd);
        }
}

/* ---- I/O thread side -------------------------------------------------------------- */

static struct pending *find_pending(struct cove_chan *c, uint32_t id)
{
        for (struct pending *p = c->pend; p; p = p->next)
                if (p->id == id)
                        return p;
        return NULL;
}

static struct proc *find_proc(struct cove_chan *c, uint32_t pid)
{
        for (struct proc *p = c->procs; p; p = p->next)
                if (p->pid == pid)
                        return p;
        return NULL;
}

static struct cove_watch *find_watch(struct cove_chan *c, uint32_t id)
{
        for (struct cove_watch *w = c->watches; w; w = w->next)
                if (w->id == id)
                        return w;
        return NULL;
}

static void unlink_proc(struct cove_chan *c, struct proc *victim)
{
        for (struct proc **pp = &c->procs; *pp; pp = &(*pp)->next)
                if (*pp == victim) {
                        *pp = victim->next;
                        c->nprocs--;
                        c->procs_gen++;
                        return;
                }
}

/* Keep at most MAX_PROCS_KEPT finished processes: drop the oldest finished ones, but never
 * `keep`, the one that just ended (its followers are about to read its exit). */
static void trim_procs(struct cove_chan *c, const struct proc *keep)
{
        int finished = 0;
        for (struct proc *p = c->procs; p; p = p->next)
                finished += !p->running && p != keep;
        while (finished > MAX_PROCS_KEPT - 1) {
                struct proc *oldest = NULL;
                for (struct proc *p = c->procs; p; p = p->next)
                        if (!p->running && p != keep &&
                            (!oldest || p->started_at <= oldest->started_at))
                                oldest = p;
                if (!oldest)
                        break;
                unlink_proc(c, oldest);
                proc_free(oldest);
                finished--;
        }
}

static void on_exec_ok(struct cove_chan *c, struct pending *pd, json_t *resp)
{
        json_t *jp = json_object_get(resp, "pid");
        if (!json_is_integer(jp) || json_integer_value(jp) <= 0 ||
            json_integer_value(jp) > 0x7fffffff) {
                json_object_set_new(resp, "ok", json_false());
                json_object_set_new(resp, "message", json_string("guest sent an invalid pid"));
                return;
        }
        uint32_t pid = (uint32_t)json_integer_value(jp);
        struct proc *old = find_proc(c, pid);
        if (old) { /* pid reused inside the sandbox: the new process wins */
                unlink_proc(c, old);
                proc_free(old);
        }
        if (c->nprocs >= MAX_PROCS) {
                json_object_set_new(resp, "ok", json_false());
                json_object_set_new(resp, "code", json_string("limit_exceeded"));
                json_object_set_new(resp, "message", json_string("too many processes"));
                return;
        }
        struct proc *p = calloc(1, sizeof(*p));
        if (!p)
                return;
        p->pid = pid;
        memcpy(p->tag, pd->tag, sizeof(p->tag));
        p->cmd = json_incref(pd->cmd);
        p->started_at = cove_now_ms();
        p->running = 1;
        p->stdin_open = pd->stdin_open;
        cove_replay_init(&p->rb, PROC_REPLAY_BYTES, PROC_REPLAY_EVENTS);
        p->hold = pd->hold;
        cove_replay_append(&p->rb, COVE_EV_START, NULL, 0);
        p->next = c->procs;
        c->procs = p;
        c->nprocs++;
        pd->pid = pid;
}

/* An ASK payload as the control plane gets it: {"op":"request-credential", "secret",
 * "reason", "ttl_s"} with every field checked, or {"error": why}. */
static json_t *ask_check(const uint8_t *p, uint32_t len)
{
        json_error_t je;
        json_t *j = json_loadb((const char *)p, len, JSON_REJECT_DUPLICATES, &je);
        const char *why = NULL;
        const char *op = json_string_value(json_object_get(j, "op"));
        const char *secret = json_string_value(json_object_get(j, "secret"));
        json_t *rj = json_object_get(j, "reason"), *tj = json_object_get(j, "ttl_s");
        const char *reason = rj ? json_string_value(rj) : "";
        if (!json_is_object(j))
                why = "a request is one JSON object";
        else if (!op || strcmp(op, "request-credential"))
                why = "unknown request (request-credential)";
        else if (!secret || !cove_secret_name_valid(secret))
                why = "secret must be a secret name ([A-Za-z_][A-Za-z0-9_]*, at most 64)";
        else if (rj && (!json_is_string(rj) || json_string_length(rj) > 1024 ||
                        strlen(reason) != json_string_length(rj)))
                why = "reason must be a string of at most 1024 bytes";
        else if (tj && (!json_is_integer(tj) || json_integer_value(tj) < 1 ||
                        json_integer_value(tj) > 7 * 24 * 3600))
                why = "ttl_s must be an integer from 1 to 604800";
        for (const char *q = reason; !why && q && *q; q++)
                if ((unsigned char)*q < 0x20 || *q == 0x7f)
                        why = "reason must not hold control characters";
        json_t *out =
            why ? json_pack("{s:s}", "error", why)
                : json_pack("{s:s, s:s, s:s, s:I}", "op", op, "secret", secret, "reason", reason,
                            "ttl_s", (json_int_t)(tj ? json_integer_value(tj) : 3600));
        json_decref(j);
        return out;
}

/* Returns -1 on a protocol violation. Called with c->mu held. */
static int dispatch(struct cove_chan *c, const struct cove_frame *f)
{
        switch (f->type) {
        case COVE_F_RESP: {
                struct pending *pd = find_pending(c, f->id);
                if (!pd || pd->done)
                        return 0; /* a caller that gave up; not an error */
                json_error_t je;
                json_t *j = json_loadb((const char *)f->payload, f->len, 0, &je);
                if (!json_is_object(j)) {
                        json_decref(j);
                        j = json_pack("{s:b, s:s, s:s}", "ok", 0, "code", "internal", "message",
                                      "guest sent a malformed reply");
                }
                if (pd->kind == PEND_EXEC && json_is_true(json_object_get(j, "ok")))
                        on_exec_ok(c, pd, j);
                if (pd->kind == PEND_READ) {
                        json_t *sz = json_object_get(j, "size");
                        if (json_is_true(json_object_get(j, "ok")) &&
                            (!json_is_integer(sz) || json_integer_value(sz) < 0))
                                return -1;
                        pd->expect = (uint64_t)json_integer_value(sz);
                        if (!json_is_true(json_object_get(j, "ok")))
                                pd->data_end = 1;
                }
                if (pd->kind == PEND_WATCH && json_is_true(json_object_get(j, "ok"))) {
                        /* the watch object exists already (created before the request) */
                }
                pd->resp = j;
                pd->done = 1;
                return 0;
        }
        case COVE_F_DATA: {
                struct pending *pd = find_pending(c, f->id);
                if (!pd || pd->kind != PEND_READ)
                        return 0;
                if (!pd->done || pd->data_end)
                        return -1; /* data before the reply, or after the end */
                if (pd->got + f->len > pd->expect)
                        return -1; /* more than announced */
                if (c->flow && pd->got + f->len > pd->allowed)
                        return -1; /* more than the window let it send */
                if (f->len) {
                        struct chunk *ch = malloc(sizeof(*ch) + f->len);
                        if (!ch)
                                return -1;
                        ch->next = NULL;
                        ch->len = f->len;
                        ch->off = 0;
                        memcpy(ch->data, f->payload, f->len);
                        if (pd->qt)
                                pd->qt->next = ch;
                        else
                                pd->qh = ch;
                        pd->qt = ch;
                        pd->qbytes += f->len;
                        pd->got += f->len;
                        if (!c->flow && pd->qbytes > RX_PAUSE_BYTES)
                                c->rx_paused = 1;
                }
                if (f->flags & COVE_FF_END)
                        pd->data_end = pd->ended = 1; /* possibly early: it shrank */
                return 0;
        }
        case COVE_F_OUT: {
                struct proc *p = find_proc(c, f->id);
                if (!p || !p->running)
                        return 0;
                uint8_t t;
                switch (f->flags) {
                case COVE_FF_STDOUT:
                        t = COVE_EV_STDOUT;
                        break;
                case COVE_FF_STDERR:
                        t = COVE_EV_STDERR;
                        break;
                case COVE_FF_PTY:
                        t = COVE_EV_PTY;
                        break;
                default:
                        return -1;
                }
                if (f->len) {
                        cove_replay_append(&p->rb, t, f->payload, f->len);
                        c->ev_dirty = 1;
                }
                if (p->hold) {
                        /* stop reading the guest before the replay bound would drop an
                         * event the reader has not taken: at most one more read (about
                         * 1 MiB) lands after the pause, which the 2 MiB bound absorbs */
                        p->unread += f->len;
                        if (p->unread > HOLD_PAUSE_BYTES)
                                c->rx_paused = 1;
                }
                return 0;
        }
        case COVE_F_EXIT: {
                struct proc *p = find_proc(c, f->id);
                if (!p || !p->running)
                        return 0;
                json_error_t je;
                json_t *j = json_loadb((const char *)f->payload, f->len, 0, &je);
                json_t *ec = json_object_get(j, "exit_code");
                json_t *sg = json_object_get(j, "signal");
                json_t *canon = json_object();
                json_object_set_new(canon, "exit_code",
                                    json_is_integer(ec) && json_integer_value(ec) >= 0 &&
                                            json_integer_value(ec) <= 255
                                        ? json_integer(json_integer_value(ec))
                                        : json_null());
                const char *sname = json_string_value(sg);
                int sok = sname && strlen(sname) <= 12;
                for (const char *s = sname; sok && *s; s++)
                        sok = (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9');
                json_object_set_new(canon, "signal", sok ? json_string(sname) : json_null());
                json_object_set_new(canon, "timed_out",
                                    json_boolean(json_is_true(json_object_get(j, "timed_out"))));
                json_decref(j);
                cleanup_free char *s = json_dumps(canon, JSON_COMPACT);
                json_decref(canon);
                if (s)
                        cove_replay_append(&p->rb, COVE_EV_EXIT, s, (uint32_t)strlen(s));
                p->running = 0;
                p->rb.closed = 1;
                c->ev_dirty = 1;
                trim_procs(c, p);
                return 0;
        }
        case COVE_F_EVENT: {
                struct cove_watch *w = find_watch(c, f->id);
                if (!w)
                        return 0;
                json_error_t je;
                json_t *j = json_loadb((const char *)f->payload, f->len, 0, &je);
                const char *type = json_string_value(json_object_get(j, "type"));
                const char *path = json_string_value(json_object_get(j, "path"));
                int ok = type && path && path[0] == '/' && strlen(path) <= 4096 &&
                         (!strcmp(type, "create") || !strcmp(type, "write") ||
                          !strcmp(type, "remove") || !strcmp(type, "rename"));
                if (ok) {
                        json_t *canon = json_pack("{s:s, s:s}", "type", type, "path", path);
                        cleanup_free char *s = json_dumps(canon, JSON_COMPACT);
                        json_decref(canon);
                        if (s)
                                cove_replay_append(&w->rb, COVE_EV_JSON, s, (uint32_t)strlen(s));
                        c->ev_dirty = 1;
                }
                json_decref(j);
                return ok ? 0 : -1;
        }
        case COVE_F_ALIVE: /* the guest's own keepalive (its channel is paused) */
                return f->len == 0 && f->id == 0 ? 0 : -1;
        case COVE_F_ASK: {
                /* a sandbox program's request, relayed: hostile bytes, bounded and checked;
                 * more than COVE_CHAN_MAX_ASKS waiting are dropped (the asker times out) */
                if (f->len > 4096 || c->nasks >= COVE_CHAN_MAX_ASKS)
                        return 0;
                struct cove_ask *a = &c->asks[c->nasks];
                a->id = f->id;
                a->ask = ask_check(f->payload, f->len);
                if (a->ask)
                        c->nasks++;
                return 0;
        }
        default: /* HELLO after the handshake, or a REQ from the guest */
                return -1;
        }
}

int cove_chan_take_asks(struct cove_chan *c, struct cove_ask *out, int max)
{
        pthread_mutex_lock(&c->mu);
        int n = c->nasks < max ? c->nasks : max;
        memcpy(out, c->asks, (size_t)n * sizeof(*out));
        memmove(c->asks, c->asks + n, (size_t)(c->nasks - n) * sizeof(*out));
        c->nasks -= n;
        pthread_mutex_unlock(&c->mu);
        return n;
}

int cove_chan_answer(struct cove_chan *c, uint32_t id, json_t *answer, struct cove_err *err)
{
        char *s = json_dumps(answer, JSON_COMPACT);
        if (!s)
                return cove_err_set(err, ENOMEM, "answer");
        int r = send_frame(c, COVE_F_ANSWER, 0, id, s, (uint32_t)strlen(s), err);
        free(s);
        return r;
}

const char *cove_chan_sandbox(const struct cove_chan *c)
{
        return c->sandbox_id;
}

int cove_chan_on_readable(struct cove_chan *c)
{
        pthread_mutex_lock(&c->mu);
        if (c->closed) {
                pthread_mutex_unlock(&c->mu);
                return -1;
        }
        if (c->rx_paused) {
                pthread_mutex_unlock(&c->mu);
                return 0;
        }
        size_t avail;
        uint8_t *sp = cove_decoder_space(&c->dec, &avail);
        ssize_t n = read(c->fd, sp, avail);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
                close_locked(c, n == 0 ? "guest exited" : "guest channel error");
                pthread_mutex_unlock(&c->mu);
                return -1;
        }
        if (n > 0) {
                cove_decoder_commit(&c->dec, (size_t)n);
                c->last_rx_ms = cove_mono_ns() / 1000000;
                c->ping_ms = 0;
        }
        struct cove_frame f;
        struct cove_err err;
        int r;
        while ((r = cove_decoder_next(&c->dec, &f, &err)) == 1) {
                if (dispatch(c, &f) < 0) {
                        r = -1;
                        snprintf(err.msg, sizeof(err.msg), "protocol violation (frame type %u)",
                                 f.type);
                        break;
                }
        }
        if (r < 0) {
                cove_warn(c->log, "guest.protocol", "sandbox %s: %s; closing its channel",
                          c->sandbox_id, err.msg);
                close_locked(c, "guest broke the protocol");
        }
        pthread_cond_broadcast(&c->cv);
        if (c->ev_dirty) {
                c->ev_dirty = 0;
                pthread_cond_broadcast(&c->ev_cv);
        }
        pthread_mutex_unlock(&c->mu);
        return r < 0 ? -1 : 0;
}

int64_t cove_chan_heartbeat(struct cove_chan *c, int64_t now_ms)
{
        pthread_mutex_lock(&c->mu);
        if (c->closed || c->rx_paused || !c->last_rx_ms) {
                /* not read on purpose (a consumer is behind): the guest may be blocked
                 * writing to us, which is no sign of a hang */
                c->last_rx_ms = now_ms;
                c->ping_ms = 0;
                pthread_mutex_unlock(&c->mu);
                return 0;
        }
        int64_t silent = now_ms - c->last_rx_ms;
        int ping = silent >= PING_AFTER_MS && (!c->ping_ms || now_ms - c->ping_ms >= PING_AFTER_MS);
        uint32_t id = 0;
        if (ping) {
                id = c->next_id++;
                if (c->next_id == 0)
                        c->next_id = REQ_ID_FIRST;
        }
        pthread_mutex_unlock(&c->mu);
        int unread = 0;
        if (silent >= PING_AFTER_MS && ioctl(c->fd, FIONREAD, &unread) == 0 && unread > 0)
                return 0; /* bytes wait for the I/O thread: the guest spoke */
        /* the ping goes out only if it cannot block the I/O thread: nobody else writing, room
         * in the socket; its RESP (or any frame) resets the silence, an old guest's
         * bad_request answer too */
        if (ping && pthread_mutex_trylock(&c->wmu) == 0) {
                struct pollfd pf = {.fd = c->fd, .events = POLLOUT};
                int sent = 0, failed = 0;
                if (poll(&pf, 1, 0) == 1 && (pf.revents & POLLOUT)) {
                        static const char req[] = "{\"op\":\"ping\"}";
                        struct cove_err e2;
                        failed = cove_frame_write_timeout(c->fd, COVE_F_REQ, 0, id, req,
                                                          sizeof(req) - 1, 200, &e2) < 0;
                        sent = !failed;
                }
                pthread_mutex_unlock(&c->wmu);
                if (failed)
                        cove_chan_close(c, "guest does not read its channel");
                pthread_mutex_lock(&c->mu);
                if (sent && c->last_rx_ms + silent == now_ms)
                        c->ping_ms = now_ms;
                pthread_mutex_unlock(&c->mu);
        }
        return silent;
}

int cove_chan_beat(struct cove_chan *c, uint64_t seq)
{
        if (cove_chan_is_closed(c))
                return -1;
        if (pthread_mutex_trylock(&c->wmu) != 0)
                return 1; /* a writer is at it: the guest hears from us anyway soon */
        struct pollfd pf = {.fd = c->fd, .events = POLLOUT};
        int r = 1;
        if (poll(&pf, 1, 0) == 1 && (pf.revents & POLLOUT)) {
                uint8_t be[8];
                for (int i = 0; i < 8; i++)
                        be[i] = (uint8_t)(seq >> (56 - 8 * i));
                struct cove_err e2;
                r = cove_frame_write_timeout(c->fd, COVE_F_HEARTBEAT, 0, 0, be, sizeof(be), 200,
                                             &e2) < 0
                        ? -1
                        : 0;
        }
        pthread_mutex_unlock(&c->wmu);
        if (r < 0)
                cove_chan_close(c, "guest does not read its channel");
        return r;
}

int cove_chan_fence(struct cove_chan *c, int ttl_ms, int *fenced, struct cove_err *err)
{
        json_t *req = json_pack("{s:s, s:i}", "op", "fence", "ttl_ms", ttl_ms);
        json_t *resp = NULL;
        if (!req)
                return cove_err_set(err, ENOMEM, "fence request");
        int r = cove_chan_call(c, req, &resp, FENCE_CALL_MS, err);
        json_decref(req);
        if (r == 0 && fenced)
                *fenced = json_is_true(json_object_get(resp, "fenced"));
        json_decref(resp);
        return r;
}

int cove_chan_thaw(struct cove_chan *c, struct cove_err *err)
{
        if (cove_chan_is_closed(c))
                return closed_err(c, err);
        if (send_frame(c, COVE_F_THAW, 0, 0, NULL, 0, err) < 0)
                return -1;
        /* frames are handled in order: the ping's answer comes after the thaw */
        json_t *req = json_pack("{s:s}", "op", "ping");
        json_t *resp = NULL;
        int r = req ? cove_chan_call(c, req, &resp, FENCE_CALL_MS, err)
                    : cove_err_set(err, ENOMEM, "ping");
        json_decref(req);
        if (r == 0 && json_is_true(json_object_get(resp, "fenced")))
                r = cove_err_setk(err, COVE_E_CONFLICT, 0, "sandbox %s: the guest is still frozen",
                                  c->sandbox_id);
        json_decref(resp);
        return r;
}

void cove_chan_touch(struct cove_chan *c, int64_t now_ms)
{
        pthread_mutex_lock(&c->mu);
        c->last_rx_ms = now_ms;
        c->ping_ms = 0;
        pthread_mutex_unlock(&c->mu);
}

/* ---- API thread side -------------------------------------------------------------- */

static struct pending *pending_new_locked(struct cove_chan *c, int kind, struct cove_err *err)
{
        if (c->closed) {
                closed_err(c, err);
                return NULL;
        }
        if (c->npend >= MAX_PENDING) {
                cove_err_setk(err, COVE_E_LIMIT, 0, "sandbox %s: too many requests in flight",
                              c->sandbox_id);
                return NULL;
        }
        struct pending *p = calloc(1, sizeof(*p));
        if (!p) {
                cove_err_set(err, ENOMEM, "request");
                return NULL;
        }
        p->kind = kind;
        p->id = c->next_id++;
        if (c->next_id == 0)
                c->next_id = REQ_ID_FIRST;
        p->next = c->pend;
        c->pend = p;
        c->npend++;
        return p;
}

static void pending_remove_locked(struct cove_chan *c, struct pending *victim)
{
        for (struct pending **pp = &c->pend; *pp; pp = &(*pp)->next)
                if (*pp == victim) {
                        *pp = victim->next;
                        c->npend--;
                        break;
                }
        pending_free(victim);
}

static enum cove_err_kind kind_of(const char *code)
{
        if (!code)
                return COVE_E_INTERNAL;
        if (!strcmp(code, "bad_request"))
                return COVE_E_BAD_REQUEST;
        if (!strcmp(code, "not_found"))
                return COVE_E_NOT_FOUND;
        if (!strcmp(code, "conflict"))
                return COVE_E_CONFLICT;
        if (!strcmp(code, "limit_exceeded"))
                return COVE_E_LIMIT;
        return COVE_E_INTERNAL;
}

/* Turn a guest's ok:false reply into err; returns -1. The guest's message is untrusted
 * text: it is bounded and only ever shown to the sandbox's own owner. */
static int resp_err(struct cove_chan *c, json_t *resp, struct cove_err *err)
{
        if (!resp)
                return closed_err(c, err);
        const char *msg = json_string_value(json_object_get(resp, "message"));
        enum cove_err_kind k = kind_of(json_string_value(json_object_get(resp, "code")));
        /* EIO in the sandbox is its disk failing under it (the node's data disk ran full):
         * the node is unavailable, not buggy */
        if (k == COVE_E_INTERNAL && json_integer_value(json_object_get(resp, "errno")) == EIO)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "%.300s (the sandbox's disk failed a write: is the node's "
                                     "data disk full?)",
                                     msg ? msg : "guest error");
        return cove_err_setk(err, k, 0, "%.300s", msg ? msg : "guest error");
}

/* Wait for pd->done; returns 0, or -1 on timeout/closed (pd is left in place). */
static int wait_done_locked(struct cove_chan *c, struct pending *pd, int timeout_ms,
                            struct cove_err *err)
{
        struct timespec dl;
        abs_deadline(&dl, timeout_ms);
        while (!pd->done) {
                if (wait_until(c, &dl) == ETIMEDOUT && !pd->done)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, ETIMEDOUT,
                                             "sandbox %s: guest did not answer", c->sandbox_id);
        }
        return 0;
}

static int call_kind(struct cove_chan *c, int kind, json_t *req, json_t **resp, int timeout_ms,
                     const char *tag, json_t *cmd, int hold, uint32_t *pid, struct cove_err *err)
{
        pthread_mutex_lock(&c->mu);
        struct pending *pd = pending_new_locked(c, kind, err);
        if (!pd) {
                pthread_mutex_unlock(&c->mu);
                return -1;
        }
        pd->hold = hold;
        if (tag)
                snprintf(pd->tag, sizeof(pd->tag), "%s", tag);
        if (cmd)
                pd->cmd = json_incref(cmd);
        pd->stdin_open = kind == PEND_EXEC && json_is_true(json_object_get(req, "stdin"));
        uint32_t id = pd->id;
        pthread_mutex_unlock(&c->mu);

        int r = send_json(c, COVE_F_REQ, id, req, err);
        pthread_mutex_lock(&c->mu);
        if (r == 0)
                r = wait_done_locked(c, pd, timeout_ms, err);
        if (r == 0) {
                if (!pd->resp || !json_is_true(json_object_get(pd->resp, "ok")))
                        r = resp_err(c, pd->resp, err);
                else if (resp)
                        *resp = json_incref(pd->resp);
                if (r == 0 && pid)
                        *pid = pd->pid;
        }
        pending_remove_locked(c, pd);
        pthread_mutex_unlock(&c->mu);
        return r;
}

int cove_chan_call(struct cove_chan *c, json_t *req, json_t **resp, int timeout_ms,
                   struct cove_err *err)
{
        return call_kind(c, PEND_CALL, req, resp, timeout_ms > 0 ? timeout_ms : CALL_TIMEOUT_MS,
                         NULL, NULL, 0, NULL, err);
}

int cove_chan_exec(struct cove_chan *c, json_t *req, const char *tag, json_t *cmd, uint32_t *pid,
                   struct cove_err *err)
{
        return cove_chan_exec_ex(c, req, tag, cmd, 0, pid, err);
}

int cove_chan_exec_ex(struct cove_chan *c, json_t *req, const char *tag, json_t *cmd, int hold,
                      uint32_t *pid, struct cove_err *err)
{
        return call_kind(c, PEND_EXEC, req, NULL, CALL_TIMEOUT_MS, tag ? tag : "", cmd, hold, pid,
                         err);
}

static int ev_copy(const struct cove_ev *ev, struct cove_ev **out, struct cove_err *err)
{
        struct cove_ev *e = malloc(sizeof(*e) + ev->len);
        if (!e)
                return cove_err_set(err, ENOMEM, "event");
        memcpy(e, ev, sizeof(*e) + ev->len);
        e->line = NULL; /* the cached line stays with the buffer's event */
        e->line_len = 0;
        *out = e;
        return 1;
}

/* Under c->mu: every event after `after` that is held, oldest first, to fn until it says
 * stop. */
static void replay_visit(struct cove_replay *rb, uint64_t after, cove_ev_visit_fn fn, void *arg)
{
        const struct cove_ev *ev;
        uint64_t lost;
        while (cove_replay_next(rb, after, &ev, &lost) == 1) {
                if (fn(arg, (struct cove_ev *)ev))
                        break;
                after = ev->seq;
        }
}

/* Under c->mu. gen: NULL for a watch (its owner is the waiter), else the process records'
 * generation: when a record was freed during a wait, returns 4 at once (rb may be gone; the
 * caller looks its record up again). */
static int replay_wait(struct cove_chan *c, struct cove_replay *rb, uint64_t after,
                       struct cove_ev **out, cove_ev_visit_fn fn, void *arg, uint64_t *lost,
                       const struct timespec *dl, const int *cancel, const uint64_t *gen,
                       struct cove_err *err)
{
        uint64_t g0 = gen ? *gen : 0;
        for (;;) {
                const struct cove_ev *ev;
                int r = cove_replay_next(rb, after, &ev, lost);
                if (r == 1 && fn) {
                        replay_visit(rb, after, fn, arg);
                        return 1;
                }
                if (r == 1)
                        return ev_copy(ev, out, err);
                if (r == 2)
                        return 2;
                if (rb->closed)
                        return 3;
                /* read under mu: whoever sets it broadcasts under mu (cove_chan_wake) */
                if (cancel && __atomic_load_n(cancel, __ATOMIC_ACQUIRE))
                        return 0;
                int t = pthread_cond_timedwait(&c->ev_cv, &c->mu, dl);
                if (gen && *gen != g0)
                        return 4;
                if (t == ETIMEDOUT)
                        return 0;
        }
}

int cove_chan_proc_next(struct cove_chan *c, uint32_t pid, uint64_t after, struct cove_ev **out,
                        uint64_t *lost_through, int timeout_ms, struct cove_err *err)
{
        return cove_chan_proc_wait(c, pid, after, out, lost_through, timeout_ms, NULL, err);
}

static int proc_wait(struct cove_chan *c, uint32_t pid, uint64_t after, struct cove_ev **out,
                     cove_ev_visit_fn fn, void *arg, uint64_t *lost_through, int timeout_ms,
                     const int *cancel, struct cove_err *err);

int cove_chan_proc_wait(struct cove_chan *c, uint32_t pid, uint64_t after, struct cove_ev **out,
                        uint64_t *lost_through, int timeout_ms, const int *cancel,
                        struct cove_err *err)
{
        return proc_wait(c, pid, after, out, NULL, NULL, lost_through, timeout_ms, cancel, err);
}

int cove_chan_proc_visit(struct cove_chan *c, uint32_t pid, uint64_t after, cove_ev_visit_fn fn,
                         void *arg, uint64_t *lost_through, int timeout_ms, const int *cancel,
                         struct cove_err *err)
{
        return proc_wait(c, pid, after, NULL, fn, arg, lost_through, timeout_ms, cancel, err);
}

static int proc_wait(struct cove_chan *c, uint32_t pid, uint64_t after, struct cove_ev **out,
                     cove_ev_visit_fn fn, void *arg, uint64_t *lost_through, int timeout_ms,
                     const int *cancel, struct cove_err *err)
{
        struct timespec dl;
        abs_deadline(&dl, timeout_ms);
        pthread_mutex_lock(&c->mu);
        int r;
        for (;;) {
                struct proc *p = find_proc(c, pid);
                if (!p) {
                        r = cove_err_setk(err, COVE_E_NOT_FOUND, 0, "process %u not found", pid);
                        break;
                }
                r = replay_wait(c, &p->rb, after < p->floor_seq ? p->floor_seq : after, out, fn,
                                arg, lost_through, &dl, cancel, &c->procs_gen, err);
                /* 4: a record was freed while we waited (maybe this one): look it up again */
                if (r != 4)
                        break;
        }
        void (*notify)(void *, struct cove_chan *) = NULL;
        void *narg = NULL;
        struct proc *p = r == 1 && out ? find_proc(c, pid) : NULL;
        if (p && p->hold && (*out)->seq > p->held_seq) {
                p->held_seq = (*out)->seq;
                p->unread = p->unread > (*out)->len ? p->unread - (*out)->len : 0;
                if (c->rx_paused && p->unread < HOLD_RESUME_BYTES) {
                        c->rx_paused = 0; /* whoever is still behind pauses it again */
                        notify = c->rx_notify;
                        narg = c->rx_arg;
                }
        }
        pthread_mutex_unlock(&c->mu);
        if (notify)
                notify(narg, c);
        return r;
}

void cove_chan_proc_forget(struct cove_chan *c, uint32_t pid)
{
        pthread_mutex_lock(&c->mu);
        struct proc *p = find_proc(c, pid);
        if (p && !p->running) {
                unlink_proc(c, p);
                proc_free(p);
        }
        pthread_mutex_unlock(&c->mu);
}

void cove_chan_proc_unhold(struct cove_chan *c, uint32_t pid)
{
        void (*notify)(void *, struct cove_chan *) = NULL;
        void *narg = NULL;
        pthread_mutex_lock(&c->mu);
        struct proc *p = find_proc(c, pid);
        if (p && p->hold) {
                p->hold = 0;
                p->unread = 0;
                if (c->rx_paused) {
                        c->rx_paused = 0;
                        notify = c->rx_notify;
                        narg = c->rx_arg;
                }
        }
        pthread_mutex_unlock(&c->mu);
        if (notify)
                notify(narg, c);
}

int cove_chan_proc_exists(struct cove_chan *c, uint32_t pid)
{
        pthread_mutex_lock(&c->mu);
        int r = find_proc(c, pid) != NULL;
        pthread_mutex_unlock(&c->mu);
        return r;
}

int cove_chan_proc_stdin(struct cove_chan *c, uint32_t pid, const void *data, size_t len, int eof,
                         struct cove_err *err)
{
        pthread_mutex_lock(&c->mu);
        struct proc *p = find_proc(c, pid);
        int running = p && p->running, open = p && p->stdin_open;
        /* data after EOF, or for a process whose stdin is /dev/null, would be dropped by the
         * guest without a word: tell the client instead */
        if (open && eof)
                p->stdin_open = 0;
        pthread_mutex_unlock(&c->mu);
        if (!p)
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "process %u not found", pid);
        if (!running)
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "process %u has exited", pid);
        if (!open)
                return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                     "stdin of process %u is closed (it was started without "
                                     "\"stdin\": true, or EOF was sent)",
                                     pid);
        const uint8_t *b = data;
        do {
                uint32_t n = len > COVE_FRAME_CHUNK ? COVE_FRAME_CHUNK : (uint32_t)len;
                uint8_t fl = (eof && n == len) ? COVE_FF_END : 0;
                if (send_frame(c, COVE_F_DATA, fl, pid, b, n, err) < 0)
                        return -1;
                b += n;
                len -= n;
        } while (len > 0);
        return 0;
}

json_t *cove_chan_proc_list(struct cove_chan *c)
{
        json_t *arr = json_array();
        pthread_mutex_lock(&c->mu);
        for (struct proc *p = c->procs; p; p = p->next) {
                char ts[40];
                cove_rfc3339(p->started_at, ts, sizeof(ts));
                json_array_append_new(arr, json_pack("{s:i, s:s, s:O, s:s, s:b}", "pid",
                                                     (json_int_t)p->pid, "tag", p->tag, "cmd",
                                                     p->cmd ? p->cmd : json_null(), "started_at",
                                                     ts, "running", p->running));
        }
        pthread_mutex_unlock(&c->mu);
        return json_pack("{s:o}", "processes", arr);
}

/* ---- file transfers ------------------------------------------------------------- */

int cove_chan_read_begin(struct cove_chan *c, const char *path, struct cove_xfer **x,
                         uint64_t *size, uint32_t *mode, struct cove_err *err)
{
        pthread_mutex_lock(&c->mu);
        int reads = 0;
        for (struct pending *p = c->pend; p; p = p->next)
                reads += p->kind == PEND_READ;
        if (reads >= MAX_READS) {
                pthread_mutex_unlock(&c->mu);
                return cove_err_setk(err, COVE_E_LIMIT, 0,
                                     "sandbox %s: %d downloads in progress already", c->sandbox_id,
                                     MAX_READS);
        }
        struct pending *pd = pending_new_locked(c, PEND_READ, err);
        if (!pd) {
                pthread_mutex_unlock(&c->mu);
                return -1;
        }
        uint32_t id = pd->id;
        int flow = c->flow;
        if (flow)
                pd->allowed = READ_WINDOW;
        pthread_mutex_unlock(&c->mu);
        json_t *req = json_pack("{s:s, s:s}", "op", "read", "path", path);
        if (flow)
                json_object_set_new(req, "window", json_integer(READ_WINDOW));
        int r = send_json(c, COVE_F_REQ, id, req, err);
        json_decref(req);
        pthread_mutex_lock(&c->mu);
        if (r == 0)
                r = wait_done_locked(c, pd, CALL_TIMEOUT_MS, err);
        if (r == 0 && (!pd->resp || !json_is_true(json_object_get(pd->resp, "ok"))))
                r = resp_err(c, pd->resp, err);
        if (r < 0) {
                pending_remove_locked(c, pd);
                pthread_mutex_unlock(&c->mu);
                return -1;
        }
        *size = pd->expect;
        json_t *m = json_object_get(pd->resp, "mode");
        *mode = json_is_integer(m) ? (uint32_t)json_integer_value(m) & 07777 : 0644;
        pthread_mutex_unlock(&c->mu);
        struct cove_xfer *xf = calloc(1, sizeof(*xf));
        if (!xf) {
                pthread_mutex_lock(&c->mu);
                pending_remove_locked(c, pd);
                pthread_mutex_unlock(&c->mu);
                return cove_err_set(err, ENOMEM, "read %s", path);
        }
        cove_chan_ref(c);
        xf->c = c;
        xf->p = pd;
        *x = xf;
        return 0;
}

long cove_chan_xfer_read(struct cove_xfer *x, void *buf, size_t cap, int timeout_ms,
                         struct cove_err *err)
{
        struct cove_chan *c = x->c;
        struct pending *pd = x->p;
        struct timespec dl;
        abs_deadline(&dl, timeout_ms);
        void (*notify)(void *, struct cove_chan *) = NULL;
        void *narg = NULL;
        uint32_t grant = 0;
        long r;
        pthread_mutex_lock(&c->mu);
        for (;;) {
                if (pd->qh) {
                        size_t n = 0;
                        while (pd->qh && n < cap) {
                                struct chunk *ch = pd->qh;
                                size_t take = ch->len - ch->off;
                                if (take > cap - n)
                                        take = cap - n;
                                memcpy((uint8_t *)buf + n, ch->data + ch->off, take);
                                n += take;
                                ch->off += take;
                                pd->qbytes -= take;
                                if (ch->off == ch->len) {
                                        pd->qh = ch->next;
                                        if (!pd->qh)
                                                pd->qt = NULL;
                                        free(ch);
                                }
                        }
                        if (!c->flow && c->rx_paused && pd->qbytes < RX_RESUME_BYTES) {
                                c->rx_paused = 0;
                                notify = c->rx_notify;
                                narg = c->rx_arg;
                        }
                        /* half the window free (queued + on the way): grant it again */
                        uint64_t inflight = pd->qbytes + (pd->allowed - pd->got);
                        if (c->flow && !pd->data_end && inflight <= READ_WINDOW / 2) {
                                grant = (uint32_t)(READ_WINDOW - inflight);
                                pd->allowed += grant;
                        }
                        r = (long)n;
                        break;
                }
                if (pd->data_end) {
                        /* an END before the size is a file that shrank: what it had is the
                         * body; a channel that died before END is an error */
                        r = pd->ended ? 0
                                      : cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                                      "sandbox %s: file ended after %llu bytes "
                                                      "(guest channel closed)",
                                                      c->sandbox_id, (unsigned long long)pd->got);
                        break;
                }
                if (wait_until(c, &dl) == ETIMEDOUT && !pd->qh && !pd->data_end) {
                        r = cove_err_setk(err, COVE_E_UNAVAILABLE, ETIMEDOUT,
                                          "sandbox %s: file transfer stalled", c->sandbox_id);
                        break;
                }
        }
        uint32_t id = pd->id;
        pthread_mutex_unlock(&c->mu);
        if (notify)
                notify(narg, c);
        if (grant) {
                uint8_t b[4] = {(uint8_t)(grant >> 24), (uint8_t)(grant >> 16),
                                (uint8_t)(grant >> 8), (uint8_t)grant};
                struct cove_err e2; /* a failure closes the channel: the next read says so */
                send_frame(c, COVE_F_WINDOW, 0, id, b, sizeof(b), &e2);
        }
        return r;
}

int cove_chan_xfer_prefetch(struct cove_xfer *x, int timeout_ms, uint64_t *len,
                            struct cove_err *err)
{
        struct cove_chan *c = x->c;
        struct pending *pd = x->p;
        struct timespec dl;
        abs_deadline(&dl, timeout_ms);
        pthread_mutex_lock(&c->mu);
        int r;
        for (;;) {
                if (pd->data_end) {
                        r = pd->ended ? 1 : -1;
                        if (r < 0)
                                closed_err(c, err);
                        break;
                }
                /* the window is used up (or an old guest sent a full window's worth) */
                if (pd->qbytes >= READ_WINDOW) {
                        r = 0;
                        break;
                }
                if (wait_until(c, &dl) == ETIMEDOUT && !pd->data_end && pd->qbytes < READ_WINDOW) {
                        r = cove_err_setk(err, COVE_E_UNAVAILABLE, ETIMEDOUT,
                                          "sandbox %s: file transfer stalled", c->sandbox_id);
                        break;
                }
        }
        *len = pd->qbytes;
        pthread_mutex_unlock(&c->mu);
        return r;
}

int cove_chan_write_begin(struct cove_chan *c, const char *path, unsigned mode, const char *user,
                          struct cove_xfer **x, struct cove_err *err)
{
        return cove_chan_write_begin_meta(c, path, mode, user, NULL, x, err);
}

int cove_chan_write_begin_meta(struct cove_chan *c, const char *path, unsigned mode,
                               const char *user, json_t *meta, struct cove_xfer **x,
                               struct cove_err *err)
{
        pthread_mutex_lock(&c->mu);
        struct pending *pd = pending_new_locked(c, PEND_WRITE, err);
        pthread_mutex_unlock(&c->mu);
        if (!pd)
                return -1;
        struct cove_xfer *xf = calloc(1, sizeof(*xf));
        if (!xf) {
                pthread_mutex_lock(&c->mu);
                pending_remove_locked(c, pd);
                pthread_mutex_unlock(&c->mu);
                return cove_err_set(err, ENOMEM, "write %s", path);
        }
        cove_chan_ref(c);
        xf->c = c;
        xf->p = pd;
        json_t *req = json_pack("{s:s, s:s, s:i}", "op", "write", "path", path, "mode",
                                (json_int_t)(mode & 07777));
        if (user)
                json_object_set_new(req, "user", json_string(user));
        if (meta)
                json_object_set(req, "metadata", meta);
        int r = send_json(c, COVE_F_REQ, pd->id, req, err);
        json_decref(req);
        if (r < 0) {
                cove_chan_xfer_free(xf);
                return -1;
        }
        *x = xf;
        return 0;
}

int cove_chan_xfer_write(struct cove_xfer *x, const void *data, size_t len, struct cove_err *err)
{
        struct cove_chan *c = x->c;
        pthread_mutex_lock(&c->mu);
        int early = x->p->done; /* the guest already answered: an error */
        pthread_mutex_unlock(&c->mu);
        if (early)
                return 0; /* finish() reports it */
        const uint8_t *b = data;
        while (len > 0) {
                uint32_t n = len > COVE_FRAME_CHUNK ? COVE_FRAME_CHUNK : (uint32_t)len;
                if (send_frame(c, COVE_F_DATA, 0, x->p->id, b, n, err) < 0)
                        return -1;
                b += n;
                len -= n;
        }
        return 0;
}

int cove_chan_write_finish(struct cove_xfer *x, json_t **entry, struct cove_err *err)
{
        struct cove_chan *c = x->c;
        struct pending *pd = x->p;
        x->finished = 1;
        pthread_mutex_lock(&c->mu);
        int early = pd->done;
        pthread_mutex_unlock(&c->mu);
        if (!early && send_frame(c, COVE_F_DATA, COVE_FF_END, pd->id, NULL, 0, err) < 0)
                return -1;
        pthread_mutex_lock(&c->mu);
        int r = wait_done_locked(c, pd, CALL_TIMEOUT_MS * 4, err);
        if (r == 0 && (!pd->resp || !json_is_true(json_object_get(pd->resp, "ok"))))
                r = resp_err(c, pd->resp, err);
        if (r == 0 && entry)
                *entry = json_incref(json_object_get(pd->resp, "entry"));
        pthread_mutex_unlock(&c->mu);
        return r;
}

void cove_chan_xfer_free(struct cove_xfer *x)
{
        if (!x)
                return;
        struct cove_chan *c = x->c;
        pthread_mutex_lock(&c->mu);
        int wake = c->rx_paused;
        if (x->p->kind == PEND_READ && c->rx_paused) {
                c->rx_paused = 0;
        } else {
                wake = 0;
        }
        void (*notify)(void *, struct cove_chan *) = c->rx_notify;
        void *narg = c->rx_arg;
        int abort_write = x->p->kind == PEND_WRITE && !x->finished && !x->p->done;
        /* a download nobody reads any more: the guest stops it (it sends at most what is
         * left of the window meanwhile, which the node drops) */
        int cancel_read =
            x->p->kind == PEND_READ && c->flow && x->p->done && !x->p->data_end && !c->closed;
        uint32_t id = x->p->id;
        pending_remove_locked(c, x->p);
        pthread_mutex_unlock(&c->mu);
        if (abort_write) {
                /* the client went away mid-upload: end the transfer so the guest discards
                 * its temporary file (it answers; nobody waits for that any more) */
                struct cove_err e2;
                send_frame(c, COVE_F_DATA, COVE_FF_END | COVE_FF_ABORT, id, NULL, 0, &e2);
        }
        if (cancel_read) {
                struct cove_err e2;
                send_frame(c, COVE_F_CANCEL, 0, id, NULL, 0, &e2);
        }
        if (wake && notify)
                notify(narg, c);
        cove_chan_unref(c);
        free(x);
}

/* ---- watches --------------------------------------------------------------------- */

int cove_chan_watch(struct cove_chan *c, const char *path, int recursive, struct cove_watch **out,
                    struct cove_err *err)
{
        pthread_mutex_lock(&c->mu);
        if (c->nwatches >= MAX_WATCHES) {
                pthread_mutex_unlock(&c->mu);
                return cove_err_setk(err, COVE_E_LIMIT, 0, "sandbox %s: too many watches",
                                     c->sandbox_id);
        }
        struct pending *pd = pending_new_locked(c, PEND_WATCH, err);
        if (!pd) {
                pthread_mutex_unlock(&c->mu);
                return -1;
        }
        struct cove_watch *w = calloc(1, sizeof(*w));
        if (!w) {
                pending_remove_locked(c, pd);
                pthread_mutex_unlock(&c->mu);
                return cove_err_set(err, ENOMEM, "watch");
        }
        w->c = c;
        w->id = pd->id;
        c->refs++;
        cove_replay_init(&w->rb, WATCH_REPLAY_BYTES, WATCH_REPLAY_EVENTS);
        /* registered before the request so no event can slip in before we listen */
        w->next = c->watches;
        c->watches = w;
        c->nwatches++;
        uint32_t id = pd->id;
        pthread_mutex_unlock(&c->mu);

        json_t *req =
            json_pack("{s:s, s:s, s:b}", "op", "watch", "path", path, "recursive", recursive);
        int r = send_json(c, COVE_F_REQ, id, req, err);
        json_decref(req);
        pthread_mutex_lock(&c->mu);
        if (r == 0)
                r = wait_done_locked(c, pd, CALL_TIMEOUT_MS, err);
        if (r == 0 && (!pd->resp || !json_is_true(json_object_get(pd->resp, "ok"))))
                r = resp_err(c, pd->resp, err);
        pending_remove_locked(c, pd);
        pthread_mutex_unlock(&c->mu);
        if (r < 0) {
                cove_chan_watch_free(w);
                return -1;
        }
        *out = w;
        return 0;
}

int cove_chan_watch_next(struct cove_watch *w, uint64_t after, struct cove_ev **out,
                         uint64_t *lost_through, int timeout_ms, struct cove_err *err)
{
        return cove_chan_watch_wait(w, after, out, lost_through, timeout_ms, NULL, err);
}

int cove_chan_watch_wait(struct cove_watch *w, uint64_t after, struct cove_ev **out,
                         uint64_t *lost_through, int timeout_ms, const int *cancel,
                         struct cove_err *err)
{
        struct timespec dl;
        abs_deadline(&dl, timeout_ms);
        pthread_mutex_lock(&w->c->mu);
        int r =
            replay_wait(w->c, &w->rb, after, out, NULL, NULL, lost_through, &dl, cancel, NULL, err);
        pthread_mutex_unlock(&w->c->mu);
        return r;
}

int cove_chan_watch_visit(struct cove_watch *w, uint64_t after, cove_ev_visit_fn fn, void *arg,
                          uint64_t *lost_through, int timeout_ms, const int *cancel,
                          struct cove_err *err)
{
        struct timespec dl;
        abs_deadline(&dl, timeout_ms);
        pthread_mutex_lock(&w->c->mu);
        int r =
            replay_wait(w->c, &w->rb, after, NULL, fn, arg, lost_through, &dl, cancel, NULL, err);
        pthread_mutex_unlock(&w->c->mu);
        return r;
}

void cove_chan_watch_free(struct cove_watch *w)
{
        if (!w)
                return;
        struct cove_chan *c = w->c;
        pthread_mutex_lock(&c->mu);
        for (struct cove_watch **pp = &c->watches; *pp; pp = &(*pp)->next)
                if (*pp == w) {
                        *pp = w->next;
                        c->nwatches--;
                        break;
                }
        int closed = c->closed;
        pthread_mutex_unlock(&c->mu);
        if (!closed) {
                json_t *req =
                    json_pack("{s:s, s:i}", "op", "unwatch", "watch_id", (json_int_t)w->id);
                struct cove_err e2;
                json_t *resp = NULL;
                if (cove_chan_call(c, req, &resp, 5000, &e2) == 0)
                        json_decref(resp);
                json_decref(req);
        }
        cove_replay_free(&w->rb);
        free(w);
        cove_chan_unref(c);
}
