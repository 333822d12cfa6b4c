/* Private to src/lib/guest: the guest context shared by the event loop (guest.c), processes
 * (exec.c), files (files.c) and watches (watch.c). Nothing here is exported beyond guest/. */
#ifndef COVE_GUEST_INTERNAL_H
#define COVE_GUEST_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto/frame.h"
#include "util/err.h"
#include "util/log.h"

#define G_MAX_PROCS 1024               /* live processes (incl. those draining output) */
#define G_STDIN_WINDOW (1024u * 1024u) /* buffered stdin per process before the channel pauses */
#define G_MAX_WRITES 64                /* concurrent file uploads */
#define G_MAX_READS 64                 /* concurrent file downloads */
#define G_READ_UNSIZED_MAX (16u << 20) /* bytes read of a file whose size means nothing */
#define G_READ_CREDIT_MAX (64u << 20)  /* WINDOW credit one read may accumulate */
#define G_MAX_WATCHES 64               /* watch requests */
#define G_MAX_WATCH_DIRS 8192          /* inotify watches (directories) over all watch requests */
#define G_LIST_MAX 10000               /* entries in one list answer */
#define G_PATH_MAX 4096                /* bytes in a request path */
#define G_EXIT_GRACE_MS 200 /* after reap, how long to wait for pipes held by grandchildren */
#define G_IO_BUF (64u * 1024u)
#define G_MAX_ASKS 8 /* in-sandbox requests waiting for the node (ask.c) */

/* What an epoll registration points at. Objects are freed only between epoll batches
 * (dead flag, swept after the batch), so a stale event never touches freed memory. */
enum gsrc_kind { GS_CHAN = 1, GS_SIG, GS_OUT, GS_ERR, GS_IN, GS_WATCH, GS_ASK };
struct gsrc {
        enum gsrc_kind kind;
        void *obj;
};

struct gbuf {
        uint8_t *data;
        size_t len, off; /* pending bytes are data[off..len) */
};

struct gproc {
        pid_t pid;           /* also the process group and session id */
        int out_fd;          /* stdout pipe or PTY master; -1 once at EOF */
        int err_fd;          /* stderr pipe; -1 once at EOF (always -1 with a PTY) */
        int in_fd;           /* stdin pipe; -1 when closed (PTY: same as out_fd, not owned) */
        bool pty;            /* out_fd is a PTY master */
        bool stdin_open;     /* the node may still send stdin */
        bool stdin_eof;      /* END received: close (pipe) or send VEOF (PTY) once drained */
        bool in_registered;  /* in_fd is in epoll for EPOLLOUT (pipes) */
        struct gbuf in;      /* stdin not yet written */
        bool reaped;         /* waitpid returned its status */
        int status;          /* wait status once reaped */
        bool timed_out;      /* the timeout killed it */
        int64_t deadline_ms; /* monotonic ms when timeout_s expires; 0: none */
        int64_t grace_ms;    /* monotonic ms after which EXIT is sent even if pipes are open */
        bool dead;           /* EXIT sent; freed after the current epoll batch */
        struct gsrc s_out, s_err, s_in;
};

/* fence.c: the guest's self-freeze (docs/cluster.md, "Leases and fencing"). The watchdog
 * thread runs only once the node set a TTL; it shares these fields with the event loop. */
struct gfence {
        int ttl_ms;      /* atomic; 0: off */
        int64_t beat_ms; /* atomic; CLOCK_BOOTTIME ms of the last sign of the node */
        int fenced;      /* atomic; 1: the sandbox's processes are frozen until a THAW */
        int chan;        /* atomic; the channel fd, to see the node read or write */
        bool pid1;       /* freeze with kill(-1, SIGSTOP) (else the event loop stops its own) */
        bool started;    /* the watchdog thread runs */
        bool applied;    /* event loop (not PID 1): its process groups got SIGSTOP */
        int wake;        /* eventfd that ends the thread */
        pthread_t th;
        pthread_mutex_t mu; /* freeze and thaw actions */
        uint64_t freezes;   /* atomic; times it froze */
};

struct gwrite; /* files.c: an upload in progress */
struct gread;  /* files.c: a download in progress */
struct gwatch; /* watch.c */

struct cove_guest {
        int chan;   /* channel fd (blocking) */
        int listen; /* vm over vsock: listener the next channel is accepted from, or -1 */
        int epfd;
        int sigfd;
        int rootfd;       /* O_PATH "/" for openat2 RESOLVE_IN_ROOT */
        bool pid1;        /* we are PID 1: reap adopted orphans too */
        bool vm;          /* init of a vm sandbox: HELLO sets hostname, clock, entropy */
        unsigned vm_ids;  /* identities this kernel has taken (0 in a template snapshot) */
        bool chan_paused; /* a stdin window is full: stop reading the channel */
        const struct cove_log *log;
        struct cove_decoder dec;
        struct gsrc s_chan, s_sig;
        struct gproc *procs[G_MAX_PROCS];
        size_t nprocs;
        struct gwrite *writes[G_MAX_WRITES];
        struct gread *reads[G_MAX_READS];
        struct gwatch *watches[G_MAX_WATCHES];
        size_t watch_dirs; /* inotify watches over all watches */
        uint8_t iobuf[G_IO_BUF];
        uint8_t chunk[COVE_FRAME_CHUNK]; /* file reads */
        struct gfence fence;
        int askfd; /* ask.c: listening socket of in-sandbox requests (-1: none) */
        struct gsrc s_ask;
        uint32_t ask_seq;
        struct {
                int fd;
                uint32_t id;
                int64_t deadline;
        } asks[G_MAX_ASKS];
};

/* fence.c. config: the node's TTL (0 off; starts the watchdog the first time); beat: a
 * HEARTBEAT came; thaw: a THAW came (no-op when not frozen); turn: the event loop's part of a
 * freeze when the guest is not PID 1; close: end the thread (the processes stay as they
 * are: the guest then kills them all). */
int g_fence_config(struct cove_guest *g, int ttl_ms, struct cove_err *err);
void g_fence_beat(struct cove_guest *g);
void g_fence_thaw(struct cove_guest *g);
bool g_fenced(struct cove_guest *g);
void g_fence_turn(struct cove_guest *g);
void g_fence_set_chan(struct cove_guest *g, int fd);
void g_fence_close(struct cove_guest *g);
int g_op_fence(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err);

/* ask.c: in-sandbox requests to the node (ASK / ANSWER frames) */
#define G_ASK_WAIT_MS 30000
int g_ask_open(struct cove_guest *g);
int g_ask_accept(struct cove_guest *g, struct cove_err *err);
void g_ask_answer(struct cove_guest *g, uint32_t id, const uint8_t *p, size_t len);
void g_ask_timers(struct cove_guest *g, int64_t now, int64_t *next);
void g_ask_close(struct cove_guest *g);

/* guest.c: replies. Each returns 0, or -1 with err when the channel write failed (fatal). */
int g_send(struct cove_guest *g, uint8_t type, uint8_t flags, uint32_t id, const void *p,
           size_t len, struct cove_err *err);
int g_send_json(struct cove_guest *g, uint8_t type, uint32_t id, json_t *obj,
                struct cove_err *err); /* steals obj */
int g_reply_ok(struct cove_guest *g, uint32_t id, json_t *obj,
               struct cove_err *err); /* steals obj (may be NULL); adds "ok":true */
int g_reply_err(struct cove_guest *g, uint32_t id, const struct cove_err *e, struct cove_err *err);
const char *g_kind_code(enum cove_err_kind k);
enum cove_err_kind g_errno_kind(int e);
int g_epoll_add(struct cove_guest *g, int fd, uint32_t events, struct gsrc *s);
int g_epoll_mod(struct cove_guest *g, int fd, uint32_t events, struct gsrc *s);
int64_t g_now_ms(void);

/* Request field helpers: fill e (BAD_REQUEST) and return -1 on a wrong type. */
int g_get_str(json_t *req, const char *key, bool required, const char **out, struct cove_err *e);
int g_get_int(json_t *req, const char *key, bool required, int64_t min, int64_t max, int64_t *out,
              struct cove_err *e);
int g_get_bool(json_t *req, const char *key, bool *out, struct cove_err *e);

/* Users: a tiny /etc/passwd and /etc/group reader (no NSS in a static binary). */
struct guser {
        uid_t uid;
        gid_t gid;
        char name[64];
        char home[G_PATH_MAX];
        char shell[256];
        gid_t groups[64]; /* supplementary groups */
        int ngroups;
};
/* spec: a name or a decimal uid; NULL: the guest's own uid. -1 with e (NOT_FOUND) if unknown. */
int g_user_lookup(const char *spec, struct guser *u, struct cove_err *e);
/* The user (group) name of uid (gid) id in the sandbox, or its decimal form. */
void g_id_name(bool group, unsigned long id, char *out, size_t cap);

/* exec.c */
int g_op_exec(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err);
int g_op_signal(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err);
int g_op_resize(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err);
int g_stdin_data(struct cove_guest *g, uint32_t pid, uint8_t flags, const uint8_t *p, size_t n);
int g_proc_event(struct cove_guest *g, struct gsrc *s, uint32_t events, struct cove_err *err);
int g_reap(struct cove_guest *g, struct cove_err *err);
int g_proc_timers(struct cove_guest *g, int64_t now, int64_t *next, struct cove_err *err);
void g_forward_signal(struct cove_guest *g, int sig);
void g_procs_sweep(struct cove_guest *g);
void g_procs_kill_all(struct cove_guest *g);
bool g_stdin_window_full(struct cove_guest *g);
int g_signal_parse(json_t *v, int *sig);
const char *g_signal_name(int sig, char *buf, size_t cap);

/* files.c */
int g_resolve_path(struct cove_guest *g, const char *in, const char *user, char *out,
                   struct cove_err *e);
/* open(2) of a normalised absolute path, resolved with openat2(RESOLVE_IN_ROOT |
 * RESOLVE_NO_MAGICLINKS) from "/" (plain open when openat2 is missing). fd or -1 (errno). */
int g_open_in_root(struct cove_guest *g, const char *abs, int flags, mode_t mode);
int g_op_read(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err);
int g_op_write(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err);
int g_write_data(struct cove_guest *g, uint32_t id, uint8_t flags, const uint8_t *p, size_t n,
                 bool *handled, struct cove_err *err);
int g_op_stat(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err);
int g_op_list(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err);
int g_op_mkdir(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err);
int g_op_move(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err);
int g_op_remove(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err);
void g_writes_abort(struct cove_guest *g);
/* WINDOW and CANCEL frames of a read (unknown ids are ignored: they race with END); -1 with
 * err on a malformed frame. */
int g_read_window(struct cove_guest *g, uint32_t id, const uint8_t *p, size_t n,
                  struct cove_err *err);
int g_read_cancel(struct cove_guest *g, uint32_t id, size_t n, struct cove_err *err);
/* Send one chunk of each read that may: 1 when some read can send more now, 0, -1 (err). */
int g_reads_pump(struct cove_guest *g, struct cove_err *err);
void g_reads_abort(struct cove_guest *g);

/* watch.c */
int g_op_watch(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err);
/* A write through the files op finished at path (created: it did not exist): the events
 * it makes for every watch that covers path ("create" when new, then "write"). */
int g_watch_notify(struct cove_guest *g, const char *path, bool created, struct cove_err *err);
/* 1 if name is a temporary name of a files-op write (".<name>.cove-<8 hex>"). */
int g_is_write_tmp(const char *name);
int g_op_unwatch(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err);
int g_watch_event(struct cove_guest *g, struct gsrc *s, struct cove_err *err);
void g_watches_sweep(struct cove_guest *g); /* frees unwatched watches (between batches) */
void g_watches_free(struct cove_guest *g);

#endif
