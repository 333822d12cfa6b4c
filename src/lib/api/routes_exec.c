/* Process routes: exec (wait or NDJSON stream), reconnectable event streams, stdin,
 * signals, resize, process list. Event lines: {"seq":N,"type":…} as in docs/api.md. */
#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/routes.h"
#include "control/tbuild.h"
#include "proto/frame.h"
#include "util/cleanup.h"

#define WAIT_OUTPUT_MAX (16u << 20)
#define CMD_MAX_BYTES (256u * 1024)

char *cove_b64(const void *data, size_t len)
{
        char *out = malloc(4 * ((len + 2) / 3) + 1);
        if (!out)
                return NULL;
        EVP_EncodeBlock((unsigned char *)out, data, (int)len);
        return out;
}

struct cove_chan *cove_req_chan(struct coved *d, struct cove_req *r, struct cove_sandbox_row *row)
{
        struct cove_chan *c = NULL;
        struct cove_err err;
        struct cove_sandbox_row tmp;
        if (cove_sandbox_chan(d, r->tenant, r->params[0], &c, row ? row : &tmp, &err) < 0) {
                cove_reply_err(r, &err);
                return NULL;
        }
        if (!row)
                cove_sandbox_row_clear(&tmp);
        return c;
}

static int parse_pid(struct cove_req *r, uint32_t *pid)
{
        char *end;
        unsigned long v = strtoul(r->params[1], &end, 10);
        if (*end || v == 0 || v > 0x7fffffff) {
                cove_reply_error(r, 404, "not_found", "process %.32s not found", r->params[1]);
                return -1;
        }
        *pid = (uint32_t)v;
        return 0;
}

/* One event as a JSON line (with '\n'); NULL on allocation failure. */
static char *event_line(const struct cove_ev *ev, uint32_t pid)
{
        static const char *names[] = {
            [COVE_EV_START] = "start", [COVE_EV_STDOUT] = "stdout", [COVE_EV_STDERR] = "stderr",
            [COVE_EV_PTY] = "pty",     [COVE_EV_EXIT] = "exit",     [COVE_EV_ERROR] = "error"};
        json_t *o = NULL;
        json_error_t je;
        switch (ev->type) {
        case COVE_EV_START:
                o = json_pack("{s:I, s:s, s:I}", "seq", (json_int_t)ev->seq, "type", "start", "pid",
                              (json_int_t)pid);
                break;
        case COVE_EV_STDOUT:
        case COVE_EV_STDERR:
        case COVE_EV_PTY: {
                char *b = cove_b64(ev->data, ev->len);
                if (b)
                        o = json_pack("{s:I, s:s, s:s}", "seq", (json_int_t)ev->seq, "type",
                                      names[ev->type], "data_b64", b);
                free(b);
                break;
        }
        case COVE_EV_EXIT:
        case COVE_EV_JSON:
                o = json_loadb((const char *)ev->data, ev->len, 0, &je);
                if (o) {
                        json_object_set_new(o, "seq", json_integer((json_int_t)ev->seq));
                        if (ev->type == COVE_EV_EXIT)
                                json_object_set_new(o, "type", json_string("exit"));
                }
                break;
        case COVE_EV_ERROR:
                o = json_pack("{s:I, s:s, s:s%}", "seq", (json_int_t)ev->seq, "type", "error",
                              "message", (const char *)ev->data, (size_t)ev->len);
                break;
        }
        if (!o)
                return NULL;
        char *s = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        if (!s)
                return NULL;
        size_t n = strlen(s);
        char *line = realloc(s, n + 2);
        if (!line) {
                free(s);
                return NULL;
        }
        line[n] = '\n';
        line[n + 1] = '\0';
        return line;
}

static char *overflow_line(uint64_t lost)
{
        char *s = NULL;
        if (asprintf(&s,
                     "{\"seq\":%llu,\"type\":\"overflow\",\"message\":\"events up to seq %llu "
                     "were dropped: the replay buffer keeps only the most recent output\"}\n",
                     (unsigned long long)lost, (unsigned long long)lost) < 0)
                return NULL;
        return s;
}

/* A reconnectable NDJSON stream over a process's (or a watch's) replay buffer. */
struct evstream {
        struct coved *d;
        struct cove_chan *c;
        struct cove_watch *w; /* watch streams */
        uint32_t pid;
        uint64_t after;
        char *line; /* the rest of a line that did not fit the last buffer */
        size_t len, off;
        int done;
        int failed;                  /* out of memory: the stream is cut */
        int fd;                      /* the client's socket, looked at while idle */
        struct cove_stream_hup *hup; /* ends the wait when the client goes */
};

static void evstream_wake(void *c)
{
        cove_chan_wake(c);
}

static void evstream_free(void *ctx)
{
        struct evstream *s = ctx;
        cove_stream_hup_release(s->hup);
        free(s->line);
        if (s->w)
                cove_chan_watch_free(s->w);
        if (s->c)
                cove_chan_unref(s->c);
        free(s);
}

static char *encode_ev(const struct cove_ev *ev, const void *pid, size_t *len)
{
        char *l = event_line(ev, *(const uint32_t *)pid);
        if (l)
                *len = strlen(l);
        return l;
}

/* One reader's fill of buf: whole lines while they fit; the rest of a line that does not is
 * kept in s->line for the next calls. */
struct evfill {
        struct evstream *s;
        char *buf;
        size_t max, n;
        int failed;
};

static void evfill_put(struct evfill *f, const char *l, size_t len)
{
        struct evstream *s = f->s;
        size_t k = len < f->max - f->n ? len : f->max - f->n;
        memcpy(f->buf + f->n, l, k);
        f->n += k;
        if (k == len)
                return;
        s->line = malloc(len - k);
        if (!s->line) {
                f->failed = 1;
                return;
        }
        memcpy(s->line, l + k, len - k);
        s->len = len - k;
        s->off = 0;
}

/* Runs under the channel's lock: copies the events' cached lines (encoded once per event,
 * whoever reads them) straight into the answer's buffer. */
static int evfill_ev(void *arg, struct cove_ev *ev)
{
        struct evfill *f = arg;
        struct evstream *s = f->s;
        size_t len;
        const char *l = cove_replay_line(ev, encode_ev, &s->pid, &len);
        if (!l) {
                f->failed = 1;
                return 1;
        }
        evfill_put(f, l, len);
        s->after = ev->seq;
        if (ev->type == COVE_EV_EXIT || ev->type == COVE_EV_ERROR)
                s->done = 1;
        return s->done || f->failed || s->line || f->n == f->max;
}

/* Fills buf with as many whole events as are ready (a replay goes out in few large chunks,
 * not one write per event); when nothing is ready, waits for an event, the client's going or
 * the server's stop (bounded: COVE_STREAM_IDLE_MS). */
static ssize_t evstream_read(void *ctx, uint64_t pos, char *buf, size_t max)
{
        struct evstream *s = ctx;
        struct evfill f = {.s = s, .buf = buf, .max = max};
        if (s->failed)
                return -2;
        if (s->line) { /* the rest of a line a previous call could not fit */
                size_t k = s->len - s->off < max ? s->len - s->off : max;
                memcpy(buf, s->line + s->off, k);
                s->off += k;
                f.n = k;
                if (s->off < s->len)
                        return (ssize_t)k;
                free(s->line);
                s->line = NULL;
                s->len = s->off = 0;
        }
        while (f.n < max && !s->line) {
                if (s->done || s->d->quitting)
                        return f.n ? (ssize_t)f.n : -1; /* END_OF_STREAM */
                uint64_t lost = 0;
                struct cove_err err;
                const int *gone = cove_stream_hup_flag(s->hup);
                int wait = f.n ? 0 : COVE_STREAM_IDLE_MS;
                int r = s->w ? cove_chan_watch_visit(s->w, s->after, evfill_ev, &f, &lost, wait,
                                                     gone, &err)
                             : cove_chan_proc_visit(s->c, s->pid, s->after, evfill_ev, &f, &lost,
                                                    wait, gone, &err);
                if (f.failed) {
                        s->failed = 1; /* deliver what is here; the next call aborts */
                        return f.n ? (ssize_t)f.n : -2;
                }
                if (r == 1)
                        continue;
                if (r == 2) {
                        char *o = overflow_line(lost);
                        if (!o) {
                                s->failed = 1;
                                return f.n ? (ssize_t)f.n : -2;
                        }
                        evfill_put(&f, o, strlen(o));
                        free(o);
                        s->after = lost;
                        continue;
                }
                if (r == 0) {
                        if (!f.n && (cove_stream_hup_gone(s->hup) || cove_sock_closed(s->fd)))
                                return -2; /* client gone: free the thread and the watch */
                        break;
                }
                /* 3: the stream is over (the process's record is gone, or the sandbox) */
                s->done = 1;
        }
        if (f.failed) {
                s->failed = 1;
                return f.n ? (ssize_t)f.n : -2;
        }
        return (ssize_t)f.n;
}

/* The rest of a finished process's events, gathered into one buffer (its cached lines, no
 * per-event work): a reconnect to a process that ended is answered with one write. */
struct evall {
        uint32_t pid;
        char *buf;
        size_t len, cap;
        int done, failed;
};

#define EVALL_MAX (8u << 20) /* more than a replay buffer holds */

static int evall_ev(void *arg, struct cove_ev *ev)
{
        struct evall *a = arg;
        size_t len;
        const char *l = cove_replay_line(ev, encode_ev, &a->pid, &len);
        if (!l || a->len + len > EVALL_MAX) {
                a->failed = 1;
                return 1;
        }
        if (a->len + len > a->cap) {
                size_t ncap = a->cap ? a->cap : 4096;
                while (ncap < a->len + len)
                        ncap *= 2;
                char *nb = realloc(a->buf, ncap);
                if (!nb) {
                        a->failed = 1;
                        return 1;
                }
                a->buf = nb;
                a->cap = ncap;
        }
        memcpy(a->buf + a->len, l, len);
        a->len += len;
        if (ev->type == COVE_EV_EXIT || ev->type == COVE_EV_ERROR)
                a->done = 1;
        return a->done;
}

/* 1 answered from memory (the process ended and every event after `after` is held), 0 not
 * (the caller streams). */
static int events_from_memory(struct cove_req *r, struct cove_chan *c, uint32_t pid, uint64_t after)
{
        struct evall a = {.pid = pid};
        uint64_t lost;
        struct cove_err err;
        int rc = cove_chan_proc_visit(c, pid, after, evall_ev, &a, &lost, 0, NULL, &err);
        if (rc != 1 || !a.done || a.failed) {
                free(a.buf);
                return 0;
        }
        cove_chan_unref(c);
        cove_reply_buffer(r, 200, "application/x-ndjson", a.buf, a.len);
        return 1;
}

int cove_reply_events(struct coved *d, struct cove_req *r, struct cove_chan *c,
                      struct cove_watch *w, uint32_t pid, uint64_t after)
{
        struct evstream *s = calloc(1, sizeof(*s));
        if (!s) {
                if (w)
                        cove_chan_watch_free(w);
                cove_chan_unref(c);
                return cove_reply_error(r, 500, "internal", "out of memory");
        }
        s->d = d;
        s->c = c;
        s->w = w;
        s->pid = pid;
        s->after = after;
        s->fd = cove_req_sockfd(r);
        s->hup = cove_req_hup(r, evstream_wake, c);
        return cove_reply_stream(r, 200, "application/x-ndjson", -1, evstream_read, evstream_free,
                                 s);
}

static int valid_string(json_t *v, size_t max)
{
        return json_is_string(v) && json_string_length(v) <= max &&
               strlen(json_string_value(v)) == json_string_length(v);
}

/* Build the guest exec request from an API body (pure: no I/O, fuzzed). env_json holds the
 * sandbox's default env, overridden by the body's. Returns 0 with *req and *cmd (the command
 * as an argv, for the process list) as new references, or -1 with why filled. */
int cove_exec_request_build(json_t *body, const char *env_json, json_t **out_req, json_t **cmd_desc,
                            char *why_out, size_t cap)
{
        const char *why = NULL;
        json_t *cmd = json_object_get(body, "cmd");
        json_t *shell = json_object_get(body, "shell");
        *cmd_desc = NULL;
        *out_req = NULL;
        if ((cmd && shell) || (!cmd && !shell)) {
                snprintf(why_out, cap, "give exactly one of cmd (array) or shell (string)");
                return -1;
        }
        json_t *req = json_pack("{s:s}", "op", "exec");
        if (cmd) {
                size_t total = 0, i;
                json_t *v;
                int ok =
                    json_is_array(cmd) && json_array_size(cmd) >= 1 && json_array_size(cmd) <= 4096;
                json_array_foreach(cmd, i, v)
                {
                        ok = ok && valid_string(v, CMD_MAX_BYTES) &&
                             (i > 0 || json_string_length(v) > 0);
                        total += ok ? json_string_length(v) : 0;
                }
                if (!ok || total > CMD_MAX_BYTES) {
                        json_decref(req);
                        snprintf(why_out, cap,
                                 "cmd must be a non-empty array of strings without NUL bytes (at "
                                 "most 4096 items, 256 KiB)");
                        return -1;
                }
                json_object_set(req, "cmd", cmd);
                *cmd_desc = json_incref(cmd);
        } else {
                if (!valid_string(shell, CMD_MAX_BYTES) || json_string_length(shell) == 0) {
                        json_decref(req);
                        snprintf(why_out, cap,
                                 "shell must be a non-empty string without NUL bytes");
                        return -1;
                }
                json_object_set(req, "shell", shell);
                *cmd_desc = json_pack("[s, s, O]", "/bin/sh", "-c", shell);
        }
        /* env: the sandbox's defaults, overridden by the call's */
        json_error_t je;
        json_t *env = json_loads(env_json ? env_json : "{}", 0, &je);
        if (!json_is_object(env)) {
                json_decref(env);
                env = json_object();
        }
        json_t *e = json_object_get(body, "env");
        const char *k;
        json_t *v;
        int ok = !e || json_is_null(e) || (json_is_object(e) && json_object_size(e) <= 256);
        if (ok && json_is_object(e))
                json_object_foreach(e, k, v)
                {
                        ok = ok && *k && !strchr(k, '=') && strlen(k) <= 256 &&
                             valid_string(v, 32768);
                        if (ok)
                                json_object_set(env, k, v);
                }
        json_object_set_new(req, "env", env);
        json_t *cwd = json_object_get(body, "cwd"), *user = json_object_get(body, "user");
        json_t *stdin_ = json_object_get(body, "stdin"), *pty = json_object_get(body, "pty");
        json_t *to = json_object_get(body, "timeout_s"), *tag = json_object_get(body, "tag");
        if (!ok)
                why = "env must be an object of string values";
        else if (cwd && !json_is_null(cwd) && !(valid_string(cwd, 4096) && json_string_length(cwd)))
                why = "cwd must be a non-empty path";
        else if (user && !json_is_null(user) &&
                 !(valid_string(user, 64) && json_string_length(user)))
                why = "user must be a user name or number";
        else if (stdin_ && !json_is_boolean(stdin_) && !json_is_null(stdin_))
                why = "stdin must be a boolean";
        else if (to && !json_is_null(to) &&
                 !(json_is_integer(to) && json_integer_value(to) >= 0 &&
                   json_integer_value(to) <= 30 * 24 * 3600))
                why = "timeout_s must be an integer between 0 and 2592000";
        else if (tag && !json_is_null(tag) && !valid_string(tag, 127))
                why = "tag must be a string of at most 127 bytes";
        else if (pty && !json_is_null(pty)) {
                json_t *cols = json_object_get(pty, "cols"), *rows = json_object_get(pty, "rows");
                if (!json_is_object(pty) || !json_is_integer(cols) || !json_is_integer(rows) ||
                    json_integer_value(cols) < 1 || json_integer_value(cols) > 10000 ||
                    json_integer_value(rows) < 1 || json_integer_value(rows) > 10000)
                        why = "pty must be {cols, rows} with integers from 1 to 10000";
                else
                        json_object_set_new(req, "pty",
                                            json_pack("{s:O, s:O}", "cols", cols, "rows", rows));
        }
        if (why) {
                json_decref(req);
                json_decref(*cmd_desc);
                *cmd_desc = NULL;
                snprintf(why_out, cap, "%s", why);
                return -1;
        }
        if (cwd && json_is_string(cwd))
                json_object_set(req, "cwd", cwd);
        if (user && json_is_string(user))
                json_object_set(req, "user", user);
        json_object_set_new(req, "stdin", json_boolean(json_is_true(stdin_)));
        if (json_is_integer(to) && json_integer_value(to) > 0)
                json_object_set(req, "timeout_s", to);
        *out_req = req;
        return 0;
}

struct outbuf {
        char *data;
        size_t len, cap;
        int truncated;
};

static void outbuf_add(struct outbuf *b, const void *p, size_t n)
{
        if (b->len + n > WAIT_OUTPUT_MAX) {
                b->truncated = 1;
                n = WAIT_OUTPUT_MAX - b->len;
        }
        if (b->len + n + 1 > b->cap) {
                size_t nc = b->cap ? b->cap : 4096;
                while (nc < b->len + n + 1)
                        nc *= 2;
                char *nd = realloc(b->data, nc);
                if (!nd) {
                        b->truncated = 1;
                        return;
                }
                b->data = nd;
                b->cap = nc;
        }
        memcpy(b->data + b->len, p, n);
        b->len += n;
        b->data[b->len] = '\0';
}

/* stdout as a string when it is UTF-8 (jansson checks), else base64 in stdout_b64. */
static void set_output(json_t *o, const char *key, struct outbuf *b)
{
        json_t *s = json_stringn(b->data ? b->data : "", b->len);
        if (s) {
                json_object_set_new(o, key, s);
        } else {
                char k64[32];
                snprintf(k64, sizeof(k64), "%s_b64", key);
                char *enc = cove_b64(b->data, b->len);
                json_object_set_new(o, key, json_null());
                json_object_set_new(o, k64, enc ? json_string(enc) : json_null());
                free(enc);
        }
}

static int exec_wait(struct coved *d, struct cove_req *r, struct cove_chan *c, uint32_t pid)
{
        struct outbuf out = {0}, errb = {0};
        uint64_t after = 0;
        json_t *exit = NULL;
        const char *problem = NULL;
        int overflow = 0;
        int fd = cove_req_sockfd(r);
        while (!exit && !problem) {
                struct cove_ev *ev = NULL;
                uint64_t lost;
                struct cove_err err;
                int rc = cove_chan_proc_next(c, pid, after, &ev, &lost, 1000, &err);
                if (rc == 0) {
                        if (d->quitting)
                                problem = "coved is shutting down";
                        else if (cove_sock_closed(fd))
                                problem = "the client went away"; /* the process runs on */
                        continue;
                }
                if (rc == 2) {
                        overflow = 1;
                        after = lost;
                        continue;
                }
                if (rc != 1) {
                        problem = "the process's event stream ended without an exit";
                        break;
                }
                after = ev->seq;
                if (ev->type == COVE_EV_STDOUT || ev->type == COVE_EV_PTY)
                        outbuf_add(&out, ev->data, ev->len);
                else if (ev->type == COVE_EV_STDERR)
                        outbuf_add(&errb, ev->data, ev->len);
                else if (ev->type == COVE_EV_EXIT) {
                        json_error_t je;
                        exit = json_loadb((const char *)ev->data, ev->len, 0, &je);
                } else if (ev->type == COVE_EV_ERROR)
                        problem = "sandbox stopped while the process ran";
                free(ev);
        }
        cove_chan_proc_unhold(c, pid);
        cove_chan_unref(c);
        if (!exit) {
                free(out.data);
                free(errb.data);
                return cove_reply_error(r, 503, "unavailable", "exec pid %u: %s", pid, problem);
        }
        json_t *o = json_pack("{s:I, s:O, s:O}", "pid", (json_int_t)pid, "exit_code",
                              json_object_get(exit, "exit_code"), "signal",
                              json_object_get(exit, "signal"));
        if (json_is_true(json_object_get(exit, "timed_out")))
                json_object_set_new(o, "timed_out", json_true());
        json_decref(exit);
        set_output(o, "stdout", &out);
        set_output(o, "stderr", &errb);
        if (out.truncated || errb.truncated || overflow)
                json_object_set_new(o, "truncated", json_true());
        free(out.data);
        free(errb.data);
        return cove_reply_json(r, 200, o);
}

int cove_h_exec(void *app, struct cove_req *r)
{
        struct coved *d = app;
        json_t *body = cove_req_json(r, 0);
        if (!body)
                return 0;
        json_t *w = json_object_get(body, "wait");
        if (w && !json_is_boolean(w) && !json_is_null(w)) {
                json_decref(body);
                return cove_reply_error(r, 400, "bad_request", "wait must be a boolean");
        }
        struct cove_sandbox_row row;
        struct cove_chan *c = cove_req_chan(d, r, &row);
        if (!c) {
                json_decref(body);
                return 0;
        }
        json_t *cmd_desc = NULL, *req = NULL;
        char why[256];
        int bad = cove_exec_request_build(body, row.env_json, &req, &cmd_desc, why, sizeof(why));
        if (!bad) {
                /* the template image's USER and WORKDIR, where the call names none */
                json_t *tcfg = coved_template_config(d, row.tenant, row.template_name);
                const char *k[] = {"user", "cwd"}, *ck[] = {"user", "workdir"};
                for (int i = 0; tcfg && i < 2; i++) {
                        json_t *v = json_object_get(tcfg, ck[i]);
                        json_t *have = json_object_get(req, k[i]);
                        if (json_is_string(v) && (!have || json_is_null(have)))
                                json_object_set(req, k[i], v);
                }
                json_decref(tcfg);
        }
        cove_sandbox_row_clear(&row);
        if (bad) {
                json_decref(body);
                cove_chan_unref(c);
                return cove_reply_error(r, 400, "bad_request", "%s", why);
        }
        const char *tag = json_string_value(json_object_get(body, "tag"));
        uint32_t pid = 0;
        struct cove_err err;
        int wait = json_is_true(w);
        /* wait mode takes every event: hold the process so nothing is dropped unseen */
        int rc = cove_chan_exec_ex(c, req, tag, cmd_desc, wait, &pid, &err);
        if (rc == 0) {
                json_t *cmd = json_object_get(body, "cmd");
                json_t *a0 = json_is_array(cmd) ? json_array_get(cmd, 0) : cmd;
                coved_audit_control(d, r->tenant, r->params[0], "exec",
                                    json_pack("{s:i, s:s}", "pid", (int)pid, "cmd",
                                              json_is_string(a0) ? json_string_value(a0) : ""));
        }
        json_decref(req);
        json_decref(cmd_desc);
        json_decref(body);
        pthread_mutex_lock(&d->mu);
        d->m.execs++;
        pthread_mutex_unlock(&d->mu);
        if (rc < 0) {
                cove_chan_unref(c);
                if (err.kind == COVE_E_NOT_FOUND) /* the program, not the sandbox */
                        err.kind = COVE_E_BAD_REQUEST;
                if (wait || err.kind != COVE_E_BAD_REQUEST)
                        return cove_reply_err(r, &err);
                /* a stream answers a failed start with one error event */
                json_t *o = json_pack("{s:i, s:s, s:s, s:s}", "seq", 1, "type", "error", "code",
                                      "bad_request", "message", err.msg);
                char *s = json_dumps(o, JSON_COMPACT);
                json_decref(o);
                char line[COVE_ERR_MSG_MAX + 128];
                snprintf(line, sizeof(line), "%s\n", s ? s : "");
                free(s);
                return cove_reply_text(r, 200, "application/x-ndjson", line);
        }
        if (wait)
                return exec_wait(d, r, c, pid);
        return cove_reply_events(d, r, c, NULL, pid, 0);
}

int cove_h_events(void *app, struct cove_req *r)
{
        struct coved *d = app;
        uint32_t pid;
        if (parse_pid(r, &pid) < 0)
                return 0;
        uint64_t after = 0;
        const char *a = cove_req_query(r, "after");
        if (a) {
                char *end;
                errno = 0;
                unsigned long long v = strtoull(a, &end, 10);
                if (*a == '\0' || *end || errno || a[0] == '-')
                        return cove_reply_error(r, 400, "bad_request",
                                                "after must be a sequence number");
                after = v;
        }
        struct cove_chan *c = cove_req_chan(d, r, NULL);
        if (!c)
                return 0;
        if (!cove_chan_proc_exists(c, pid)) {
                cove_chan_unref(c);
                return cove_reply_error(r, 404, "not_found", "process %u not found", pid);
        }
        if (events_from_memory(r, c, pid, after))
                return 0;
        return cove_reply_events(d, r, c, NULL, pid, after);
}

int cove_h_processes(void *app, struct cove_req *r)
{
        struct coved *d = app;
        struct cove_chan *c = cove_req_chan(d, r, NULL);
        if (!c)
                return 0;
        json_t *o = cove_chan_proc_list(c);
        cove_chan_unref(c);
        return cove_reply_json(r, 200, o);
}

int cove_h_stdin(void *app, struct cove_req *r)
{
        struct coved *d = app;
        uint32_t pid;
        if (parse_pid(r, &pid) < 0)
                return 0;
        const char *eof = cove_req_query(r, "eof");
        struct cove_chan *c = cove_req_chan(d, r, NULL);
        if (!c)
                return 0;
        struct cove_err err;
        int rc = cove_chan_proc_stdin(c, pid, r->body ? r->body : "", r->body_len,
                                      eof && !strcmp(eof, "true"), &err);
        cove_chan_unref(c);
        return rc < 0 ? cove_reply_err(r, &err)
                      : cove_reply_json(r, 200,
                                        json_pack("{s:I}", "written", (json_int_t)r->body_len));
}

int cove_simple_call(struct coved *d, struct cove_req *r, json_t *req)
{
        struct cove_chan *c = cove_req_chan(d, r, NULL);
        if (!c) {
                json_decref(req);
                return 0;
        }
        json_t *resp = NULL;
        struct cove_err err;
        int rc = cove_chan_call(c, req, &resp, 0, &err);
        json_decref(req);
        cove_chan_unref(c);
        json_decref(resp);
        return rc < 0 ? cove_reply_err(r, &err)
                      : cove_reply_json(r, 200, json_pack("{s:b}", "ok", 1));
}

int cove_h_signal(void *app, struct cove_req *r)
{
        struct coved *d = app;
        uint32_t pid;
        if (parse_pid(r, &pid) < 0)
                return 0;
        json_t *body = cove_req_json(r, 0);
        if (!body)
                return 0;
        json_t *sg = json_object_get(body, "signal");
        int ok =
            (json_is_string(sg) && json_string_length(sg) >= 1 && json_string_length(sg) <= 10) ||
            (json_is_integer(sg) && json_integer_value(sg) >= 1 && json_integer_value(sg) <= 64);
        for (const char *s = json_string_value(sg); ok && s && *s; s++)
                ok = (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9');
        if (!ok) {
                json_decref(body);
                return cove_reply_error(r, 400, "bad_request",
                                        "signal must be a name like \"TERM\" or a number 1-64");
        }
        json_t *req =
            json_pack("{s:s, s:I, s:O}", "op", "signal", "pid", (json_int_t)pid, "signal", sg);
        json_decref(body);
        return cove_simple_call(d, r, req);
}

int cove_h_resize(void *app, struct cove_req *r)
{
        struct coved *d = app;
        uint32_t pid;
        if (parse_pid(r, &pid) < 0)
                return 0;
        json_t *body = cove_req_json(r, 0);
        if (!body)
                return 0;
        json_t *cols = json_object_get(body, "cols"), *rows = json_object_get(body, "rows");
        if (!json_is_integer(cols) || !json_is_integer(rows) || json_integer_value(cols) < 1 ||
            json_integer_value(cols) > 10000 || json_integer_value(rows) < 1 ||
            json_integer_value(rows) > 10000) {
                json_decref(body);
                return cove_reply_error(r, 400, "bad_request",
                                        "cols and rows must be integers from 1 to 10000");
        }
        json_t *req = json_pack("{s:s, s:I, s:O, s:O}", "op", "resize", "pid", (json_int_t)pid,
                                "cols", cols, "rows", rows);
        json_decref(body);
        return cove_simple_call(d, r, req);
}
