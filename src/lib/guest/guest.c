/* cove-guest event loop: one thread, one epoll set over the channel, a signalfd (SIGCHLD and
 * the signals PID 1 forwards), process pipes / PTY masters and inotify fds. Handshake,
 * request validation and dispatch, replies, and the usage figures live here. */
#include "guest/guest.h"
#include "guest/internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "util/cleanup.h"
#include "util/util.h"

int64_t g_now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

const char *g_kind_code(enum cove_err_kind k)
{
        switch (k) {
        case COVE_E_BAD_REQUEST:
                return "bad_request";
        case COVE_E_NOT_FOUND:
                return "not_found";
        case COVE_E_CONFLICT:
                return "conflict";
        case COVE_E_LIMIT:
                return "limit_exceeded";
        default:
                return "internal";
        }
}

enum cove_err_kind g_errno_kind(int e)
{
        switch (e) {
        case ENOENT:
        case ESRCH:
                return COVE_E_NOT_FOUND;
        case EEXIST:
        case ENOTEMPTY:
        case EISDIR:
        case ENOTDIR:
        case EBUSY:
        case ETXTBSY:
                return COVE_E_CONFLICT;
        case ENOSPC:
        case EDQUOT:
        case EMFILE:
        case ENFILE:
        case EFBIG:
        case EAGAIN:
                return COVE_E_LIMIT;
        case EINVAL:
        case ENAMETOOLONG:
        case ELOOP:
        case EXDEV:
        case EACCES:
        case EPERM:
        case EROFS:
        case ENOEXEC:
                return COVE_E_BAD_REQUEST;
        default:
                return COVE_E_INTERNAL;
        }
}

int g_epoll_add(struct cove_guest *g, int fd, uint32_t events, struct gsrc *s)
{
        struct epoll_event ev = {.events = events, .data.ptr = s};
        return epoll_ctl(g->epfd, EPOLL_CTL_ADD, fd, &ev);
}

int g_epoll_mod(struct cove_guest *g, int fd, uint32_t events, struct gsrc *s)
{
        struct epoll_event ev = {.events = events, .data.ptr = s};
        return epoll_ctl(g->epfd, EPOLL_CTL_MOD, fd, &ev);
}

int g_send(struct cove_guest *g, uint8_t type, uint8_t flags, uint32_t id, const void *p,
           size_t len, struct cove_err *err)
{
        if (cove_frame_write(g->chan, type, flags, id, p, (uint32_t)len, err) < 0)
                return cove_err_wrap(err, "channel");
        return 0;
}

int g_send_json(struct cove_guest *g, uint8_t type, uint32_t id, json_t *obj, struct cove_err *err)
{
        char *s = json_dumps(obj, JSON_COMPACT);
        json_decref(obj);
        if (!s)
                return cove_err_set(err, ENOMEM, "channel: encode reply");
        size_t n = strlen(s);
        int r;
        if (n > COVE_FRAME_MAX)
                r = cove_err_set(err, EMSGSIZE, "channel: reply of %zu bytes", n);
        else
                r = g_send(g, type, 0, id, s, n, err);
        free(s);
        return r;
}

int g_reply_ok(struct cove_guest *g, uint32_t id, json_t *obj, struct cove_err *err)
{
        if (!obj)
                obj = json_object();
        json_object_set_new(obj, "ok", json_true());
        return g_send_json(g, COVE_F_RESP, id, obj, err);
}

int g_reply_err(struct cove_guest *g, uint32_t id, const struct cove_err *e, struct cove_err *err)
{
        json_t *o = json_pack("{s:b, s:s, s:i, s:s}", "ok", 0, "code", g_kind_code(e->kind),
                              "errno", e->errnum, "message", e->msg);
        if (!o)
                return cove_err_set(err, ENOMEM, "channel: encode error reply");
        return g_send_json(g, COVE_F_RESP, id, o, err);
}

int g_get_str(json_t *req, const char *key, bool required, const char **out, struct cove_err *e)
{
        json_t *v = json_object_get(req, key);
        *out = NULL;
        if (!v || json_is_null(v)) {
                if (required)
                        return cove_err_setk(e, COVE_E_BAD_REQUEST, 0, "missing field \"%s\"", key);
                return 0;
        }
        if (!json_is_string(v))
                return cove_err_setk(e, COVE_E_BAD_REQUEST, 0, "field \"%s\" must be a string",
                                     key);
        *out = json_string_value(v);
        return 0;
}

int g_get_int(json_t *req, const char *key, bool required, int64_t min, int64_t max, int64_t *out,
              struct cove_err *e)
{
        json_t *v = json_object_get(req, key);
        if (!v || json_is_null(v)) {
                if (required)
                        return cove_err_setk(e, COVE_E_BAD_REQUEST, 0, "missing field \"%s\"", key);
                return 0;
        }
        int64_t x;
        if (json_is_integer(v))
                x = json_integer_value(v);
        else if (json_is_real(v) && json_real_value(v) == (double)(int64_t)json_real_value(v))
                x = (int64_t)json_real_value(v);
        else
                return cove_err_setk(e, COVE_E_BAD_REQUEST, 0, "field \"%s\" must be an integer",
                                     key);
        if (x < min || x > max)
                return cove_err_setk(e, COVE_E_BAD_REQUEST, 0,
                                     "field \"%s\" out of range [%lld, %lld]", key, (long long)min,
                                     (long long)max);
        *out = x;
        return 0;
}

int g_get_bool(json_t *req, const char *key, bool *out, struct cove_err *e)
{
        json_t *v = json_object_get(req, key);
        if (!v || json_is_null(v))
                return 0;
        if (!json_is_boolean(v))
                return cove_err_setk(e, COVE_E_BAD_REQUEST, 0, "field \"%s\" must be a boolean",
                                     key);
        *out = json_is_true(v);
        return 0;
}

/* ---- usage ---- */

/* Sums over every process visible in /proc. cpu includes cutime/cstime: the CPU of
 * processes already reaped, which their reaper (often us as PID 1) accumulated. */
static int op_usage(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err)
{
        (void)req;
        long tck = sysconf(_SC_CLK_TCK);
        long page = sysconf(_SC_PAGESIZE);
        if (tck <= 0)
                tck = 100;
        if (page <= 0)
                page = 4096;
        unsigned long long ticks = 0, rss_pages = 0, nproc = 0;
        cleanup_dir DIR *d = opendir("/proc");
        if (d) {
                struct dirent *de;
                while ((de = readdir(d))) {
                        char *end;
                        long pid = strtol(de->d_name, &end, 10);
                        if (*end || pid <= 0)
                                continue;
                        char path[64], buf[1024];
                        snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
                        int fd = open(path, O_RDONLY | O_CLOEXEC);
                        if (fd < 0)
                                continue;
                        ssize_t n = read(fd, buf, sizeof(buf) - 1);
                        close(fd);
                        if (n <= 0)
                                continue;
                        buf[n] = 0;
                        /* comm may hold spaces and parens: fields start after the last ')' */
                        char *p = strrchr(buf, ')');
                        if (!p)
                                continue;
                        unsigned long long ut, st, cut, cst, rss;
                        /* state ppid pgrp session tty tpgid flags minflt cminflt majflt
                         * cmajflt utime stime cutime cstime prio nice threads itreal
                         * starttime vsize rss */
                        if (sscanf(p + 1,
                                   " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %llu "
                                   "%llu %*d %*d %*d %*d %*u %*u %llu",
                                   &ut, &st, &cut, &cst, &rss) != 5)
                                continue;
                        ticks += ut + st + cut + cst;
                        rss_pages += rss;
                        nproc++;
                }
        }
        struct statvfs vfs;
        unsigned long long used = 0, total = 0;
        if (statvfs("/", &vfs) == 0) {
                total = (unsigned long long)vfs.f_blocks * vfs.f_frsize;
                used = (unsigned long long)(vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize;
        }
        json_t *o = json_pack("{s:I, s:I, s:I, s:I, s:I}", "cpu_usec",
                              (json_int_t)(ticks * 1000000ULL / (unsigned long long)tck),
                              "mem_bytes", (json_int_t)(rss_pages * (unsigned long long)page),
                              "disk_used_bytes", (json_int_t)used, "disk_total_bytes",
                              (json_int_t)total, "processes", (json_int_t)nproc);
        return g_reply_ok(g, id, o, err);
}

/* The node's heartbeat: any answer shows the event loop runs. */
static int op_ping(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err)
{
        (void)req;
        return g_reply_ok(g, id,
                          g->fence.started ? json_pack("{s:b}", "fenced", g_fenced(g)) : NULL, err);
}

/* ---- dispatch ---- */

typedef int (*op_fn)(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err);
static const struct {
        const char *name;
        op_fn fn;
} ops[] = {
    {"exec", g_op_exec},     {"signal", g_op_signal}, {"resize", g_op_resize},
    {"read", g_op_read},     {"write", g_op_write},   {"stat", g_op_stat},
    {"list", g_op_list},     {"mkdir", g_op_mkdir},   {"move", g_op_move},
    {"remove", g_op_remove}, {"watch", g_op_watch},   {"unwatch", g_op_unwatch},
    {"usage", op_usage},     {"ping", op_ping},       {"fence", g_op_fence},
};

static int handle_req(struct cove_guest *g, const struct cove_frame *f, struct cove_err *err)
{
        struct cove_err e = {0};
        json_error_t jerr;
        json_t *req = json_loadb((const char *)f->payload, f->len, JSON_REJECT_DUPLICATES, &jerr);
        if (!req || !json_is_object(req)) {
                json_decref(req);
                cove_err_setk(&e, COVE_E_BAD_REQUEST, 0, "request: not a JSON object%s%s",
                              req ? "" : ": ", req ? "" : jerr.text);
                return g_reply_err(g, f->id, &e, err);
        }
        const char *op;
        int r;
        if (g_get_str(req, "op", true, &op, &e) < 0) {
                r = g_reply_err(g, f->id, &e, err);
                goto out;
        }
        for (size_t i = 0; i < COVE_ARRAY_SIZE(ops); i++) {
                if (strcmp(ops[i].name, op) == 0) {
                        r = ops[i].fn(g, f->id, req, err);
                        goto out;
                }
        }
        cove_err_setk(&e, COVE_E_BAD_REQUEST, 0, "unknown op \"%.64s\"", op);
        r = g_reply_err(g, f->id, &e, err);
out:
        json_decref(req);
        return r;
}

/* A vm guest may be a clone of a template snapshot: every clone meets its own node here, and
 * takes from it its hostname, the wall clock and fresh entropy, so no two clones share ids
 * or RNG state. Fields are optional and bounded; bad ones are ignored.
 * boot_id: the kernel makes it at its first read, which in a template clone comes after the
 * reseed below (the template boot never reads it), so each clone has its own. A fork of a
 * running VM (a new hostname for a kernel that already had an identity) may share its
 * parent's: it gets a fresh one bound over the kernel's. A resume or rewind (same hostname)
 * keeps its boot_id. */
static void vm_identity(struct cove_guest *g, json_t *h)
{
        const char *host = json_string_value(json_object_get(h, "hostname"));
        bool renamed = false;
        if (host && strlen(host) <= 64) {
                char cur[65] = "";
                gethostname(cur, sizeof(cur) - 1);
                renamed = strcmp(cur, host) != 0;
                sethostname(host, strlen(host));
        }
        json_t *t = json_object_get(h, "time_ns");
        if (json_is_integer(t) && json_integer_value(t) > 0) {
                json_int_t ns = json_integer_value(t);
                struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
                clock_settime(CLOCK_REALTIME, &ts);
        }
        const char *seed = json_string_value(json_object_get(h, "seed"));
        unsigned char buf[64];
        size_t n = 0;
        while (seed && n < sizeof(buf) && seed[2 * n] && seed[2 * n + 1]) {
                char hx[3] = {seed[2 * n], seed[2 * n + 1], 0};
                char *end;
                long v = strtol(hx, &end, 16);
                if (*end)
                        break;
                buf[n++] = (unsigned char)v;
        }
        if (n >= 16)
                cove_guest_vm_seed(buf, n);
        explicit_bzero(buf, sizeof(buf));
        if (renamed && g->vm_ids > 0 && cove_guest_vm_new_boot_id() < 0 && g->log)
                cove_warn(g->log, "guest.vm", "fork: new boot_id: %s", strerror(errno));
        g->vm_ids++;
}

/* Returns 0, or -1 with err: a refused handshake (after answering it). */
/* The processes still running, for a node that meets this guest again after a restore
 * (rechannel): [{pid, cmd, stdin, pty}], cmd from /proc/<pid>/cmdline (bounded). Empty on a
 * fresh start. */
static json_t *running_procs(struct cove_guest *g)
{
        json_t *a = json_array();
        for (size_t i = 0; i < g->nprocs; i++) {
                const struct gproc *p = g->procs[i];
                if (!p || p->reaped || p->dead)
                        continue;
                char path[64], buf[4096];
                snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)p->pid);
                json_t *cmd = json_array();
                int fd = open(path, O_RDONLY | O_CLOEXEC);
                ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof(buf) - 1);
                if (fd >= 0)
                        close(fd);
                for (ssize_t k = 0; n > 0 && k < n && json_array_size(cmd) < 64;) {
                        buf[n] = 0;
                        json_t *arg = json_string(buf + k); /* NULL when not UTF-8 */
                        json_array_append_new(cmd, arg ? arg : json_string("?"));
                        k += (ssize_t)strlen(buf + k) + 1;
                }
                json_array_append_new(a,
                                      json_pack("{s:i, s:o, s:b, s:b}", "pid", (int)p->pid, "cmd",
                                                cmd, "stdin", p->stdin_open, "pty", p->pty));
        }
        return a;
}

static int handle_hello(struct cove_guest *g, const struct cove_frame *f, struct cove_err *err)
{
        json_t *h = json_loadb((const char *)f->payload, f->len, 0, NULL);
        json_t *v = json_object_get(h, "version");
        json_t *tok = json_object_get(h, "token");
        json_t *host = json_object_get(h, "hostname");
        char msg[160];
        if (!json_is_object(h) || !json_is_integer(v) || (tok && !json_is_string(tok)) ||
            (host && !json_is_string(host)))
                snprintf(msg, sizeof(msg), "hello: malformed (want {version, token, hostname})");
        else if (json_integer_value(v) != COVE_PROTO_VERSION)
                snprintf(msg, sizeof(msg),
                         "hello: protocol version %lld not supported (this "
                         "guest speaks %d)",
                         (long long)json_integer_value(v), COVE_PROTO_VERSION);
        else
                msg[0] = 0;
        if (!msg[0] && g->vm)
                vm_identity(g, h);
        json_decref(h);
        json_t *o = msg[0] ? json_pack("{s:i, s:b, s:s}", "version", COVE_PROTO_VERSION, "ok", 0,
                                       "message", msg)
                           : json_pack("{s:i, s:b, s:o, s:b}", "version", COVE_PROTO_VERSION, "ok",
                                       1, "procs", running_procs(g), "window", 1);
        if (g_send_json(g, COVE_F_HELLO, 0, o, err) < 0)
                return -1;
        if (msg[0])
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "%s", msg);
        return 0;
}

struct loop_state {
        bool hello_done;
};

/* A HELLO after the handshake with {"rechannel":true}: this guest was restored from a
 * checkpoint (CRIU) and its channel is a temporary one the node made on the host. The
 * channel must live in the sandbox's own network namespace (a later checkpoint finds unix
 * sockets only there), so the guest makes a new pair here, sends the node its end over the
 * temporary channel (one byte with SCM_RIGHTS), takes the other as its channel and waits
 * for an ordinary handshake on it. Process state stays as it was. */
static int handle_rechannel(struct cove_guest *g, struct loop_state *ls, const struct cove_frame *f,
                            struct cove_err *err)
{
        json_t *h = json_loadb((const char *)f->payload, f->len, 0, NULL);
        int ok = json_is_object(h) && json_is_true(json_object_get(h, "rechannel")) &&
                 json_integer_value(json_object_get(h, "version")) == COVE_PROTO_VERSION;
        json_decref(h);
        if (!ok)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "channel: second HELLO that is not a rechannel request");
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
                return cove_err_set(err, errno, "rechannel: socketpair");
        int sent = cove_send_fd(g->chan, sv[1], 'R');
        close(sv[1]);
        if (sent < 0) {
                close(sv[0]);
                return cove_err_setk(err, COVE_E_UNAVAILABLE, errno, "rechannel: send");
        }
        /* the temporary channel's last reference goes: epoll forgets it by itself */
        if (dup3(sv[0], g->chan, O_CLOEXEC) < 0) {
                int e = errno;
                close(sv[0]);
                return cove_err_set(err, e, "rechannel: dup3");
        }
        close(sv[0]);
        g_reads_abort(g);
        cove_decoder_free(&g->dec);
        if (cove_decoder_init(&g->dec, COVE_FRAME_MAX, err) < 0)
                return -1;
        if (g_epoll_add(g, g->chan, EPOLLIN, &g->s_chan) < 0)
                return cove_err_set(err, errno, "rechannel: epoll");
        ls->hello_done = false;
        return 0;
}

static int handle_frame(struct cove_guest *g, struct loop_state *ls, const struct cove_frame *f,
                        struct cove_err *err)
{
        if (!ls->hello_done) {
                if (f->type != COVE_F_HELLO)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "channel: frame type %u before the handshake",
                                             f->type);
                if (handle_hello(g, f, err) < 0)
                        return -1;
                ls->hello_done = true;
                return 0;
        }
        switch (f->type) {
        case COVE_F_HELLO:
                /* a vm restored from a full snapshot (resume, rewind, fork) meets a new node
                 * session on the same port: shake hands again and take the new identity.
                 * Processes keep running; the reply lists them, so the new node adopts them.
                 * An ns guest restored by CRIU is asked to move to a new channel first. */
                if (g->vm)
                        return handle_hello(g, f, err);
                return handle_rechannel(g, ls, f, err);
        case COVE_F_REQ:
                if (f->id == 0)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "channel: request with id 0");
                return handle_req(g, f, err);
        case COVE_F_ANSWER:
                g_ask_answer(g, f->id, f->payload, f->len);
                return 0;
        case COVE_F_HEARTBEAT:
                if (f->id != 0 || (f->len != 0 && f->len != 8))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "channel: heartbeat with id %u and %u bytes", f->id,
                                             f->len);
                g_fence_beat(g);
                return 0;
        case COVE_F_THAW:
                if (f->id != 0 || f->len != 0)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "channel: thaw with id %u and %u bytes", f->id,
                                             f->len);
                g_fence_thaw(g);
                return 0;
        case COVE_F_WINDOW:
                return g_read_window(g, f->id, f->payload, f->len, err);
        case COVE_F_CANCEL:
                return g_read_cancel(g, f->id, f->len, err);
        case COVE_F_DATA: {
                bool handled = false;
                if (g_write_data(g, f->id, f->flags, f->payload, f->len, &handled, err) < 0)
                        return -1;
                if (!handled)
                        g_stdin_data(g, f->id, f->flags, f->payload, f->len);
                return 0;
        }
        default:
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "channel: unexpected frame type %u from the node", f->type);
        }
}

/* Handle every whole frame buffered, unless a stdin window pauses the channel. */
static int chan_process(struct cove_guest *g, struct loop_state *ls, struct cove_err *err)
{
        struct cove_frame f;
        int r = 0;
        while (!g->chan_paused && (r = cove_decoder_next(&g->dec, &f, err)) == 1) {
                if (handle_frame(g, ls, &f, err) < 0)
                        return -1;
        }
        if (!g->chan_paused && r < 0)
                return cove_err_wrap(err, "channel");
        if (g->chan_paused)
                g_epoll_mod(g, g->chan, 0, &g->s_chan);
        return 0;
}

/* vm over vsock: the channel ended (the node went, or the VMM restored a snapshot and reset
 * every vsock connection). Wait for the next node on the listener; processes keep running
 * (their output waits in their pipes meanwhile) and the new node shakes hands first. */
static int chan_reaccept(struct cove_guest *g, struct loop_state *ls, struct cove_err *err)
{
        epoll_ctl(g->epfd, EPOLL_CTL_DEL, g->chan, NULL);
        close(g->chan);
        g->chan = -1;
        g_reads_abort(g); /* the next node knows nothing of this session's downloads */
        int fd;
        do
                fd = accept4(g->listen, NULL, NULL, SOCK_CLOEXEC);
        while (fd < 0 && (errno == EINTR || errno == ECONNABORTED));
        if (fd < 0)
                return cove_err_set(err, errno, "channel: accept");
        g->chan = fd;
        g_fence_set_chan(g, fd);
        g->chan_paused = false;
        cove_decoder_free(&g->dec);
        if (cove_decoder_init(&g->dec, COVE_FRAME_MAX, err) < 0)
                return -1;
        if (g_epoll_add(g, g->chan, EPOLLIN, &g->s_chan) < 0)
                return cove_err_set(err, errno, "channel: epoll");
        ls->hello_done = false;
        return 0;
}

/* Returns 1 at end of file, 0, or -1 with err. */
static int chan_read(struct cove_guest *g, struct loop_state *ls, struct cove_err *err)
{
        size_t avail;
        uint8_t *sp = cove_decoder_space(&g->dec, &avail);
        if (avail == 0)
                return cove_err_set(err, ENOBUFS, "channel: decoder full");
        ssize_t n = read(g->chan, sp, avail);
        if (n < 0) {
                if (errno == EINTR || errno == EAGAIN)
                        return 0;
                if (g->listen >= 0 && (errno == ECONNRESET || errno == EPIPE))
                        return 1; /* a reset vsock connection: as the end of it */
                return cove_err_setk(err, COVE_E_UNAVAILABLE, errno, "channel: read");
        }
        if (n == 0)
                return 1;
        cove_decoder_commit(&g->dec, (size_t)n);
        return chan_process(g, ls, err);
}

static int sig_read(struct cove_guest *g, struct cove_err *err)
{
        struct signalfd_siginfo si[16];
        ssize_t n = read(g->sigfd, si, sizeof(si));
        if (n < 0)
                return (errno == EAGAIN || errno == EINTR) ? 0
                                                           : cove_err_set(err, errno, "signalfd");
        bool chld = false;
        for (size_t i = 0; i < (size_t)n / sizeof(si[0]); i++) {
                if (si[i].ssi_signo == SIGCHLD)
                        chld = true;
                else
                        g_forward_signal(g, (int)si[i].ssi_signo);
        }
        return chld ? g_reap(g, err) : 0;
}

static void guest_free(struct cove_guest *g)
{
        g_fence_close(g);
        g_procs_kill_all(g);
        g_writes_abort(g);
        g_reads_abort(g);
        g_watches_free(g);
        g_ask_close(g);
        g_procs_sweep(g);
        cove_decoder_free(&g->dec);
        if (g->epfd >= 0)
                close(g->epfd);
        if (g->sigfd >= 0)
                close(g->sigfd);
        if (g->rootfd >= 0)
                close(g->rootfd);
        if (g->chan >= 0)
                close(g->chan);
        if (g->listen >= 0)
                close(g->listen);
        free(g);
}

int cove_guest_run(const struct cove_guest_opts *opts, struct cove_err *err)
{
        struct cove_guest *g = calloc(1, sizeof(*g));
        if (!g) {
                close(opts->channel_fd);
                if (opts->listen_fd > 2)
                        close(opts->listen_fd);
                return cove_err_set(err, ENOMEM, "guest");
        }
        g->chan = opts->channel_fd;
        g->listen = opts->listen_fd > 2 ? opts->listen_fd : -1;
        g->epfd = g->sigfd = g->rootfd = g->askfd = -1;
        g->fence.chan = g->fence.wake = -1;
        for (int i = 0; i < G_MAX_ASKS; i++)
                g->asks[i].fd = -1;
        g->log = opts->log;
        g->pid1 = getpid() == 1;
        g->vm = opts->vm != 0;
        g->s_chan = (struct gsrc){GS_CHAN, g};
        g->s_sig = (struct gsrc){GS_SIG, g};
        int ret = -1;
        struct loop_state ls = {0};

        /* fds 0-2 must be taken, so that no pipe lands there (dup2 onto itself in a child
         * would keep O_CLOEXEC) */
        int nfd;
        while ((nfd = open("/dev/null", O_RDWR)) >= 0 && nfd <= 2)
                ;
        if (nfd > 2)
                close(nfd);
        /* the channel must block: replies are full blocking writes */
        int fl = fcntl(g->chan, F_GETFL);
        if (fl < 0) {
                cove_err_set(err, errno, "channel fd %d", g->chan);
                goto out;
        }
        if (fl & O_NONBLOCK)
                fcntl(g->chan, F_SETFL, fl & ~O_NONBLOCK);
        fcntl(g->chan, F_SETFD, FD_CLOEXEC);
        if (cove_decoder_init(&g->dec, COVE_FRAME_MAX, err) < 0)
                goto out;
        g->rootfd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (g->rootfd < 0) {
                cove_err_set(err, errno, "open /");
                goto out;
        }
        /* not PID 1 (tests, debugging): still adopt and reap orphaned grandchildren */
        if (!g->pid1)
                prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        signal(SIGPIPE, SIG_IGN);
        sigset_t ss;
        sigemptyset(&ss);
        sigaddset(&ss, SIGCHLD);
        sigaddset(&ss, SIGTERM);
        sigaddset(&ss, SIGINT);
        sigaddset(&ss, SIGHUP);
        sigprocmask(SIG_BLOCK, &ss, NULL);
        g->sigfd = signalfd(-1, &ss, SFD_NONBLOCK | SFD_CLOEXEC);
        g->epfd = epoll_create1(EPOLL_CLOEXEC);
        if (g->sigfd < 0 || g->epfd < 0) {
                cove_err_set(err, errno, "guest: signalfd/epoll");
                goto out;
        }
        if (g_epoll_add(g, g->chan, EPOLLIN, &g->s_chan) < 0 ||
            g_epoll_add(g, g->sigfd, EPOLLIN, &g->s_sig) < 0) {
                cove_err_set(err, errno, "guest: epoll_ctl");
                goto out;
        }
        g_ask_open(g); /* best effort: without it the sandbox cannot ask */
        /* children that exited before we blocked SIGCHLD */
        if (g_reap(g, err) < 0)
                goto out;

        struct epoll_event evs[64];
        int pump = 0;         /* a download can send more without waiting */
        int64_t alive_ms = 0; /* last ALIVE sent */
        for (;;) {
                int64_t now = g_now_ms(), next = -1;
                if (g_proc_timers(g, now, &next, err) < 0)
                        goto out;
                g_ask_timers(g, now, &next);
                /* a paused channel (a stdin window is full) hides the node's pings from us:
                 * say we are alive on our own, once a second */
                if (g->chan_paused) {
                        if (now - alive_ms >= 1000) {
                                if (g_send(g, COVE_F_ALIVE, 0, 0, NULL, 0, err) < 0)
                                        goto out;
                                alive_ms = now;
                        }
                        if (next < 0 || alive_ms + 1000 < next)
                                next = alive_ms + 1000;
                }
                int timeout = -1;
                if (next >= 0)
                        timeout = next <= now ? 0 : (int)(next - now < 60000 ? next - now : 60000);
                if (pump)
                        timeout = 0;
                /* not PID 1 (tests): the loop stops its own processes while frozen */
                g_fence_turn(g);
                if (g->fence.started && !g->fence.pid1 && (timeout < 0 || timeout > 100))
                        timeout = 100;
                int n = epoll_wait(g->epfd, evs, (int)COVE_ARRAY_SIZE(evs), timeout);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        cove_err_set(err, errno, "guest: epoll_wait");
                        goto out;
                }
                for (int i = 0; i < n; i++) {
                        struct gsrc *s = evs[i].data.ptr;
                        int r = 0;
                        switch (s->kind) {
                        case GS_CHAN:
                                if (g->chan_paused) {
                                        /* paused: only a hang-up matters (the node is gone) */
                                        if (evs[i].events & (EPOLLHUP | EPOLLERR)) {
                                                if (g->listen >= 0) {
                                                        r = chan_reaccept(g, &ls, err);
                                                        break;
                                                }
                                                ret = 0;
                                                goto out;
                                        }
                                        break;
                                }
                                r = chan_read(g, &ls, err);
                                if (r == 1 && g->listen >= 0) {
                                        r = chan_reaccept(g, &ls, err);
                                } else if (r == 1) {
                                        ret = 0;
                                        goto out;
                                }
                                break;
                        case GS_SIG:
                                r = sig_read(g, err);
                                break;
                        case GS_OUT:
                        case GS_ERR:
                        case GS_IN:
                                r = g_proc_event(g, s, evs[i].events, err);
                                break;
                        case GS_WATCH:
                                r = g_watch_event(g, s, err);
                                break;
                        case GS_ASK:
                                r = g_ask_accept(g, err);
                                break;
                        }
                        if (r < 0)
                                goto out;
                }
                if (g->chan_paused && !g_stdin_window_full(g)) {
                        g->chan_paused = false;
                        g_epoll_mod(g, g->chan, EPOLLIN, &g->s_chan);
                        if (chan_process(g, &ls, err) < 0)
                                goto out;
                }
                /* downloads go one chunk each per turn, between everything else */
                pump = g_reads_pump(g, err);
                if (pump < 0)
                        goto out;
                g_procs_sweep(g);
                g_watches_sweep(g);
        }
out:
        if (ret < 0 && g->log)
                cove_warn(g->log, "guest.exit", "%s", err ? err->msg : "error");
        guest_free(g);
        return ret;
}
