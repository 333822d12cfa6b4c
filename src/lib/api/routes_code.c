/* The code interpreter (docs/code-interpreter.md): cove's API (POST /v1/sandboxes/{id}/code
 * and the contexts routes) and the E2B code interpreter SDK's port 49999, both relayed to
 * cove's interpreter server inside the sandbox (src/interp/server.py, installed by the
 * code-interpreter template), which coved starts on first use as an ordinary sandbox
 * process. The server runs inside the sandbox, so everything it answers is untrusted:
 * answer heads, bodies and every line of a run are bounded, parsed and written out again by
 * this file, never passed through as bytes. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/code.h"
#include "api/routes.h"
#include "control/template.h"
#include "util/cleanup.h"
#include "util/util.h"

#define INTERP_PORT 49999
#define INTERP_SERVER COVE_INTERP_DIR "/server.py"
#define CODE_MAX (1u << 20)        /* a cell's source */
#define HEAD_MAX (16u << 10)       /* the server's answer head */
#define SMALL_MAX (256u << 10)     /* a non-streamed answer */
#define LINE_MAX_BYTES (16u << 20) /* one line of a run (a figure as base64 fits) */
#define CALL_MAX (256ull << 20)    /* all lines of one run */
#define START_WAIT_MS 60000        /* the server's start (python's imports) */
#define IO_MS 30000                /* a non-streamed exchange */
#define DEFAULT_TIMEOUT_S 300
#define MAX_TIMEOUT_S 86400

static const char *const LINE_TYPES[] = {
    "stdout", "stderr", "result", "error", "number_of_executions", "end_of_execution"};
static const char *const LANGS[] = {"python", "javascript", "bash"};

/* ---- talking to the server ---------------------------------------------------------- */

static int write_all(int fd, const char *p, size_t n, struct cove_err *err)
{
        while (n) {
                ssize_t w = write(fd, p, n);
                if (w < 0 && errno == EINTR)
                        continue;
                if (w <= 0)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, errno,
                                             "the code interpreter closed the connection");
                p += w;
                n -= (size_t)w;
        }
        return 0;
}

/* Is the server process started by coved (tag cove-interp) still running? */
static int interp_running(struct cove_chan *c, uint32_t pid)
{
        json_t *l = cove_chan_proc_list(c);
        json_t *ps = json_object_get(l, "processes"), *p;
        size_t i;
        int running = 0;
        json_array_foreach(ps, i, p)
        {
                if (json_integer_value(json_object_get(p, "pid")) == (json_int_t)pid)
                        running = json_is_true(json_object_get(p, "running"));
        }
        json_decref(l);
        return running;
}

/* Write this coved's interpreter files over the sandbox's copies (atomically: the guest
 * writes a temporary file and renames it), so the server started next is the one this
 * coved was built with, not an older one a template built earlier still holds. A sandbox
 * whose files cannot be written (no such directory: not the code-interpreter template)
 * keeps what it has; the start then says what it needs. */
static void interp_install(struct cove_chan *c)
{
        static const struct {
                const char *path;
                const unsigned char *data;
                const size_t *len;
                unsigned mode;
        } files[] = {
            {COVE_INTERP_DIR "/jskernel.js", cove_interp_jskernel, &cove_interp_jskernel_len, 0644},
            {INTERP_SERVER, cove_interp_server, &cove_interp_server_len, 0755},
        };
        for (size_t i = 0; i < COVE_ARRAY_SIZE(files); i++) {
                struct cove_err err = {0};
                struct cove_xfer *x = NULL;
                if (cove_chan_write_begin(c, files[i].path, files[i].mode, NULL, &x, &err) < 0)
                        return;
                int rc = cove_chan_xfer_write(x, files[i].data, *files[i].len, &err);
                if (rc == 0)
                        rc = cove_chan_write_finish(x, NULL, &err);
                cove_chan_xfer_free(x);
                if (rc < 0)
                        return;
        }
}

/* A connection to the sandbox's interpreter server, starting it when nothing listens. */
static int interp_connect(struct coved *d, struct cove_chan *c, const struct cove_sandbox_row *row,
                          int *fd, struct cove_err *err)
{
        if (!d->node)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "the code interpreter runs on the sandbox's node");
        if (cove_node_port_connect(d->node, row->id, row->runtime, INTERP_PORT, 2000, fd, err) == 0)
                return 0;
        if (err->kind != COVE_E_NOT_FOUND)
                return -1;
        /* start it: an ordinary process of the sandbox, in its process list */
        interp_install(c);
        json_t *cmd = json_pack("[s, s]", "/usr/bin/python3", INTERP_SERVER);
        json_t *req = json_pack("{s:s, s:O, s:s, s:s}", "op", "exec", "cmd", cmd, "user", "user",
                                "cwd", "/home/user");
        uint32_t pid = 0;
        int rc = cove_chan_exec_ex(c, req, "cove-interp", cmd, 0, &pid, err);
        json_decref(req);
        json_decref(cmd);
        if (rc < 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "the code interpreter cannot start in sandbox %s (%s): its "
                                     "template needs python3 with ipykernel and %s, as the "
                                     "code-interpreter template has",
                                     row->id, err->msg, INTERP_SERVER);
        int64_t until = cove_mono_ns() + (int64_t)START_WAIT_MS * 1000000;
        for (;;) {
                /* two callers may race to start it: the loser exits (address in use) while
                 * the winner listens, so a connect is tried once more after an exit */
                int exited = !interp_running(c, pid);
                if (cove_node_port_connect(d->node, row->id, row->runtime, INTERP_PORT, 2000, fd,
                                           err) == 0)
                        return 0;
                if (err->kind != COVE_E_NOT_FOUND)
                        return -1;
                if (exited)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "the code interpreter exited at start in sandbox %s "
                                             "(its output: GET /v1/sandboxes/%s/processes/%u/"
                                             "events): its template needs python3 with ipykernel "
                                             "and %s, as the code-interpreter template has",
                                             row->id, row->id, (unsigned)pid, INTERP_SERVER);
                if (cove_mono_ns() > until)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                             "the code interpreter of sandbox %s did not start "
                                             "within %d s",
                                             row->id, START_WAIT_MS / 1000);
                struct timespec ts = {0, 100 * 1000000L};
                nanosleep(&ts, NULL);
        }
}

/* Buffered reads from the server with a deadline per wait. */
struct rd {
        int fd;
        char *buf;
        size_t len, cap, off;
        int eof;
};

/* Read more into r->buf (at most up to cap); 1 read, 0 nothing within ms, -1 EOF/error. */
static int rd_fill(struct rd *r, int ms)
{
        if (r->eof)
                return -1;
        if (r->off && r->off == r->len)
                r->off = r->len = 0;
        if (r->len == r->cap) {
                if (r->off == 0)
                        return -1; /* full: the caller's bound */
                memmove(r->buf, r->buf + r->off, r->len - r->off);
                r->len -= r->off;
                r->off = 0;
        }
        struct pollfd p = {.fd = r->fd, .events = POLLIN};
        int pr = poll(&p, 1, ms);
        if (pr < 0 && errno == EINTR)
                return 0;
        if (pr <= 0)
                return pr == 0 ? 0 : -1;
        ssize_t n = read(r->fd, r->buf + r->len, r->cap - r->len);
        if (n < 0 && errno == EINTR)
                return 0;
        if (n <= 0) {
                r->eof = 1;
                return -1;
        }
        r->len += (size_t)n;
        return 1;
}

/* Send one HTTP/1.0 request (so the answer ends with the connection, unchunked) and read
 * its head: fills *status and leaves the reader at the body. */
static int exchange(int fd, const char *method, const char *path, json_t *body, struct rd *r,
                    int *status, struct cove_err *err)
{
        char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
        size_t blen = text ? strlen(text) : 0;
        char head[512];
        int hn =
            snprintf(head, sizeof(head),
                     "%s %s HTTP/1.0\r\nHost: cove-interp\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     method, path, blen);
        int rc = (hn < 0 || (size_t)hn >= sizeof(head))
                     ? cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "path too long")
                     : write_all(fd, head, (size_t)hn, err);
        if (rc == 0 && blen)
                rc = write_all(fd, text, blen, err);
        free(text);
        if (rc < 0)
                return -1;
        int64_t until = cove_mono_ns() + (int64_t)IO_MS * 1000000;
        size_t body_off = 0;
        int h;
        while ((h = cove_code_head(r->buf, r->len, status, &body_off)) == 0) {
                if (r->len >= HEAD_MAX || cove_mono_ns() > until)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                             "the code interpreter sent no valid answer head");
                if (rd_fill(r, 1000) < 0)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                             "the code interpreter closed the connection before "
                                             "answering");
        }
        if (h < 0)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "the code interpreter's answer is not HTTP");
        r->off = body_off;
        return 0;
}

int cove_code_head(const char *buf, size_t len, int *status, size_t *body_off)
{
        size_t n = len < HEAD_MAX ? len : HEAD_MAX;
        const char *end = memmem(buf, n, "\r\n\r\n", 4);
        size_t pre = n < 9 ? n : 9;
        if (memcmp(buf, "HTTP/1.0 ", pre) && memcmp(buf, "HTTP/1.1 ", pre))
                return -1;
        if (!end)
                return len >= HEAD_MAX ? -1 : 0;
        if (end - buf < 12) /* no room for "HTTP/1.x NNN" before the blank line */
                return -1;
        int st = 0;
        for (int i = 9; i < 12; i++) {
                if (buf[i] < '0' || buf[i] > '9')
                        return -1;
                st = st * 10 + (buf[i] - '0');
        }
        if (st < 100 || st > 599 || (buf[12] != ' ' && buf[12] != '\r'))
                return -1;
        *status = st;
        *body_off = (size_t)(end + 4 - buf);
        return 1;
}

/* The rest of a non-streamed answer (bounded) as JSON; NULL for an empty body. */
static int read_small(struct rd *r, json_t **out, struct cove_err *err)
{
        *out = NULL;
        int64_t until = cove_mono_ns() + (int64_t)IO_MS * 1000000;
        while (!r->eof) {
                if (r->len >= SMALL_MAX && r->off == 0)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                             "the code interpreter's answer is too large");
                if (cove_mono_ns() > until)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                             "the code interpreter did not finish answering");
                if (rd_fill(r, 1000) < 0 && !r->eof)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                             "the code interpreter's answer is too large");
        }
        if (r->len == r->off)
                return 0;
        json_error_t je;
        *out = json_loadb(r->buf + r->off, r->len - r->off, 0, &je);
        if (!*out)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "the code interpreter's answer is not JSON");
        return 0;
}

static int valid_lang(const char *s)
{
        for (size_t i = 0; i < sizeof(LANGS) / sizeof(*LANGS); i++)
                if (s && !strcmp(s, LANGS[i]))
                        return 1;
        return 0;
}

/* A context as the server describes it, checked and copied: {id, language, cwd}. */
static json_t *context_checked(json_t *c)
{
        const char *id = json_string_value(json_object_get(c, "id"));
        const char *lang = json_string_value(json_object_get(c, "language"));
        const char *cwd = json_string_value(json_object_get(c, "cwd"));
        if (!id || !*id || strlen(id) > 64 || strspn(id, "0123456789abcdef") != strlen(id) ||
            !valid_lang(lang) || !cwd || cwd[0] != '/' || strlen(cwd) > 4096)
                return NULL;
        return json_pack("{s:s, s:s, s:s}", "id", id, "language", lang, "cwd", cwd);
}

/* ---- the run stream ----------------------------------------------------------------- */

struct run {
        struct rd r;
        char *out; /* validated lines waiting to be sent */
        size_t out_len, out_off;
        uint64_t total;
        int64_t deadline_ns; /* the call's timeout plus a grace: the server enforces it first */
        int done;
        int saw_end;
        int client_fd; /* the caller's socket, to notice it left while the cell is quiet */
};

static void run_free(void *arg)
{
        struct run *x = arg;
        if (x->r.fd >= 0)
                close(x->r.fd); /* the server sees the caller gone and interrupts the cell */
        free(x->r.buf);
        free(x->out);
        free(x);
}

static void run_append(struct run *x, const char *s);

static void run_emit(struct run *x, json_t *line)
{
        char *s = json_dumps(line, JSON_COMPACT);
        json_decref(line);
        if (!s)
                return;
        run_append(x, s);
        run_append(x, "\n");
        free(s);
}

static void run_fail(struct run *x, const char *name, const char *msg)
{
        run_emit(x, json_pack("{s:s, s:s, s:s, s:s}", "type", "error", "name", name, "value", msg,
                              "traceback", ""));
        run_emit(x, json_pack("{s:s}", "type", "end_of_execution"));
        x->done = 1;
}

char *cove_code_line(const char *p, size_t n, int *end)
{
        *end = 0;
        if (!n || n > LINE_MAX_BYTES)
                return NULL;
        json_error_t je;
        json_t *o = json_loadb(p, n, 0, &je);
        const char *t = json_string_value(json_object_get(o, "type"));
        size_t k = 0, nt = sizeof(LINE_TYPES) / sizeof(*LINE_TYPES);
        int ok = json_is_object(o) && t;
        for (; ok && k < nt; k++)
                if (!strcmp(t, LINE_TYPES[k]))
                        break;
        ok = ok && k < nt;
        if (ok && k <= 1)
                ok = json_is_string(json_object_get(o, "text"));
        if (ok && k == 2)
                ok = !json_object_get(o, "is_main_result") ||
                     json_is_boolean(json_object_get(o, "is_main_result"));
        if (ok && k == 3)
                ok = json_is_string(json_object_get(o, "name")) &&
                     json_is_string(json_object_get(o, "value"));
        if (ok && k == 4)
                ok = json_is_integer(json_object_get(o, "execution_count"));
        char *out = ok ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        if (!out)
                return NULL;
        size_t l = strlen(out);
        char *nl = realloc(out, l + 2);
        if (!nl) {
                free(out);
                return NULL;
        }
        nl[l] = '\n';
        nl[l + 1] = '\0';
        *end = k == 5;
        return nl;
}

static void run_append(struct run *x, const char *s)
{
        size_t n = strlen(s);
        char *nb = realloc(x->out, x->out_len + n);
        if (!nb)
                return;
        x->out = nb;
        memcpy(x->out + x->out_len, s, n);
        x->out_len += n;
}

/* One line from the server: checked and written out again, or the run ends with an error. */
static void run_line(struct run *x, const char *p, size_t n)
{
        if (!n)
                return;
        int end = 0;
        char *line = cove_code_line(p, n, &end);
        if (!line) {
                run_fail(x, "InterpreterError",
                         "the code interpreter sent a line that is not one of its kinds");
                return;
        }
        run_append(x, line);
        free(line);
        if (end) {
                x->saw_end = 1;
                x->done = 1;
        }
}

static ssize_t run_read(void *arg, uint64_t pos, char *buf, size_t max)
{
        (void)pos;
        struct run *x = arg;
        for (;;) {
                if (x->out_off < x->out_len) {
                        size_t n = x->out_len - x->out_off;
                        if (n > max)
                                n = max;
                        memcpy(buf, x->out + x->out_off, n);
                        x->out_off += n;
                        if (x->out_off == x->out_len)
                                x->out_off = x->out_len = 0;
                        return (ssize_t)n;
                }
                if (x->done)
                        return -1;
                /* whole lines already read */
                char *nl;
                while (!x->done && (nl = memchr(x->r.buf + x->r.off, '\n', x->r.len - x->r.off))) {
                        size_t n = (size_t)(nl - (x->r.buf + x->r.off));
                        run_line(x, x->r.buf + x->r.off, n);
                        x->r.off += n + 1;
                }
                if (x->out_len)
                        continue;
                if (x->done)
                        return -1;
                if (x->total > CALL_MAX) {
                        run_fail(x, "OutputLimit", "the run's output passed 256 MiB: cut here");
                        continue;
                }
                if (cove_mono_ns() > x->deadline_ns) {
                        run_fail(x, "TimeoutError",
                                 "the code interpreter did not end the run in time");
                        continue;
                }
                size_t before = x->r.len - x->r.off;
                int f = rd_fill(&x->r, 1000);
                if (f < 0) {
                        if (x->r.eof)
                                run_fail(x, "InterpreterError",
                                         "the code interpreter ended the run without its end "
                                         "line");
                        else
                                run_fail(x, "OutputLimit",
                                         "a line of the run's output passed 16 MiB");
                        continue;
                }
                if (f == 0) {
                        /* a caller that left while the cell prints nothing: end the stream,
                         * which closes the server's connection and interrupts the cell */
                        if (x->client_fd >= 0 && cove_sock_closed(x->client_fd))
                                return -2;
                        return 0; /* nothing yet: called again */
                }
                x->total += (x->r.len - x->r.off) - before;
        }
}

/* ---- the requests ------------------------------------------------------------------- */

/* The body of a run (cove's API or E2B's): code, language or context_id, env, timeout.
 * Returns the request for the server, or NULL with err (BAD_REQUEST). */
static json_t *run_body(json_t *b, int e2b, int *timeout_s, struct cove_err *err)
{
        json_t *code = json_object_get(b, "code");
        if (!json_is_string(code) || json_string_length(code) > CODE_MAX)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "code (a string of at most 1 MiB) is required"),
                       NULL;
        json_t *lang = json_object_get(b, "language"), *cid = json_object_get(b, "context_id");
        if (json_is_null(lang))
                lang = NULL;
        if (json_is_null(cid))
                cid = NULL;
        if ((lang && !json_is_string(lang)) || (cid && !json_is_string(cid)))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "language and context_id are strings"),
                       NULL;
        if (lang && cid)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "give context_id or language, not both"),
                       NULL;
        json_t *env = json_object_get(b, e2b ? "env_vars" : "env");
        if (json_is_null(env))
                env = NULL;
        if (env) {
                const char *k;
                json_t *v;
                int ok = json_is_object(env) && json_object_size(env) <= 256;
                json_object_foreach(env, k, v) ok =
                    ok && json_is_string(v) && strlen(k) <= 256 && json_string_length(v) <= 32768;
                if (!ok)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "%s must be an object of at most 256 strings",
                                             e2b ? "env_vars" : "env"),
                               NULL;
        }
        json_t *to = json_object_get(b, "timeout_s");
        *timeout_s = e2b ? 0 : DEFAULT_TIMEOUT_S;
        if (to && !json_is_null(to)) {
                if (!json_is_integer(to) || json_integer_value(to) < 1 ||
                    json_integer_value(to) > MAX_TIMEOUT_S)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "timeout_s must be an integer from 1 to %d",
                                             MAX_TIMEOUT_S),
                               NULL;
                *timeout_s = (int)json_integer_value(to);
        }
        json_t *q = json_pack("{s:O}", "code", code);
        if (lang)
                json_object_set(q, "language", lang);
        if (cid)
                json_object_set(q, "context_id", cid);
        if (env)
                json_object_set(q, "env_vars", env);
        if (*timeout_s)
                json_object_set_new(q, "timeout_s", json_integer(*timeout_s));
        return q;
}

/* Map the server's error answer to ours. */
static int server_error(int status, json_t *ans, struct cove_err *err)
{
        const char *m = json_string_value(json_object_get(ans, "message"));
        char msg[300];
        snprintf(msg, sizeof(msg), "%.280s", m ? m : "the code interpreter refused the call");
        return cove_err_setk(err,
                             status == 404   ? COVE_E_NOT_FOUND
                             : status == 400 ? COVE_E_BAD_REQUEST
                                             : COVE_E_UNAVAILABLE,
                             0, "%s", msg);
}

int cove_code_run(struct coved *d, struct cove_req *r, struct cove_chan *c,
                  const struct cove_sandbox_row *row, json_t *body, int e2b, struct cove_err *err)
{
        int timeout_s = 0;
        json_t *q = run_body(body, e2b, &timeout_s, err);
        if (!q)
                return -1;
        int fd = -1;
        if (interp_connect(d, c, row, &fd, err) < 0) {
                json_decref(q);
                return -1;
        }
        struct run *x = calloc(1, sizeof(*x));
        char *buf = malloc(LINE_MAX_BYTES + HEAD_MAX);
        if (!x || !buf) {
                free(x);
                free(buf);
                close(fd);
                json_decref(q);
                return cove_err_set(err, ENOMEM, "code run");
        }
        x->r = (struct rd){.fd = fd, .buf = buf, .cap = LINE_MAX_BYTES + HEAD_MAX};
        x->client_fd = cove_req_sockfd(r);
        int status = 0;
        int rc = exchange(fd, "POST", "/execute", q, &x->r, &status, err);
        json_decref(q);
        if (rc == 0 && status != 200) {
                json_t *ans = NULL;
                struct cove_err e2;
                read_small(&x->r, &ans, &e2);
                server_error(status, ans, err);
                json_decref(ans);
                rc = -1;
        }
        if (rc < 0) {
                run_free(x);
                return -1;
        }
        x->deadline_ns =
            timeout_s ? cove_mono_ns() + ((int64_t)timeout_s + 30) * 1000000000LL : INT64_MAX;
        coved_audit_control(
            d, row->tenant, row->id, "code",
            json_pack("{s:s}", "language",
                      json_string_value(json_object_get(body, "language")) ?: "python"));
        cove_reply_stream(r, 200, "application/x-ndjson", -1, run_read, run_free, x);
        return 0;
}

/* One non-streamed call to the server: its status and JSON answer. */
static int small_call(struct coved *d, struct cove_chan *c, const struct cove_sandbox_row *row,
                      const char *method, const char *path, json_t *body, int *status, json_t **ans,
                      struct cove_err *err)
{
        int fd = -1;
        *ans = NULL;
        if (interp_connect(d, c, row, &fd, err) < 0)
                return -1;
        char buf[SMALL_MAX];
        struct rd r = {.fd = fd, .buf = buf, .cap = sizeof(buf)};
        int rc = exchange(fd, method, path, body, &r, status, err);
        if (rc == 0)
                rc = read_small(&r, ans, err);
        close(fd);
        if (rc == 0 && (*status < 200 || *status > 299)) {
                server_error(*status, *ans, err);
                json_decref(*ans);
                *ans = NULL;
                return -1;
        }
        return rc;
}

static int context_id_ok(const char *id)
{
        return id && *id && strlen(id) <= 64 && strspn(id, "0123456789abcdef") == strlen(id);
}

int cove_code_context(struct coved *d, struct cove_chan *c, const struct cove_sandbox_row *row,
                      enum cove_code_op op, const char *cid, json_t *body, json_t **out,
                      struct cove_err *err)
{
        *out = NULL;
        char path[128] = "";
        if (op != COVE_CODE_CREATE && op != COVE_CODE_LIST && !context_id_ok(cid))
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "context %.64s not found",
                                     cid ? cid : "");
        json_t *q = NULL;
        const char *method = "POST";
        switch (op) {
        case COVE_CODE_CREATE: {
                json_t *lang = json_object_get(body, "language"),
                       *cwd = json_object_get(body, "cwd");
                if (json_is_null(lang))
                        lang = NULL;
                if (json_is_null(cwd))
                        cwd = NULL;
                if ((lang && !json_is_string(lang)) ||
                    (cwd && (!json_is_string(cwd) || json_string_value(cwd)[0] != '/' ||
                             json_string_length(cwd) > 4096)))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "language is a string and cwd an absolute path");
                q = json_object();
                if (lang)
                        json_object_set(q, "language", lang);
                if (cwd)
                        json_object_set(q, "cwd", cwd);
                snprintf(path, sizeof(path), "/contexts");
                break;
        }
        case COVE_CODE_LIST:
                method = "GET";
                snprintf(path, sizeof(path), "/contexts");
                break;
        case COVE_CODE_DELETE:
                method = "DELETE";
                snprintf(path, sizeof(path), "/contexts/%s", cid);
                break;
        case COVE_CODE_RESTART:
                snprintf(path, sizeof(path), "/contexts/%s/restart", cid);
                break;
        case COVE_CODE_INTERRUPT:
                snprintf(path, sizeof(path), "/contexts/%s/interrupt", cid);
                break;
        }
        int status = 0;
        json_t *ans = NULL;
        int rc = small_call(d, c, row, method, path, q, &status, &ans, err);
        json_decref(q);
        if (rc < 0)
                return -1;
        if (op == COVE_CODE_CREATE) {
                *out = context_checked(ans);
                json_decref(ans);
                return *out ? 0
                            : cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                            "the code interpreter answered a malformed context");
        }
        if (op == COVE_CODE_LIST) {
                json_t *list = json_array(), *v;
                size_t i;
                int ok = json_is_array(ans) && json_array_size(ans) <= 4096;
                json_array_foreach(ans, i, v)
                {
                        json_t *cc = ok ? context_checked(v) : NULL;
                        if (!cc)
                                ok = 0;
                        else
                                json_array_append_new(list, cc);
                }
                json_decref(ans);
                if (!ok) {
                        json_decref(list);
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                             "the code interpreter answered a malformed list");
                }
                *out = list;
                return 0;
        }
        json_decref(ans);
        return 0;
}

/* ---- cove's routes ------------------------------------------------------------------ */

int cove_h_code_run(void *app, struct cove_req *r)
{
        struct coved *d = app;
        json_t *body = cove_req_json(r, 0);
        if (!body)
                return 0;
        struct cove_sandbox_row row;
        struct cove_chan *c = cove_req_chan(d, r, &row);
        if (!c) {
                json_decref(body);
                return 0;
        }
        struct cove_err err;
        int rc = cove_code_run(d, r, c, &row, body, 0, &err);
        json_decref(body);
        cove_chan_unref(c);
        cove_sandbox_row_clear(&row);
        return rc < 0 ? cove_reply_err(r, &err) : 0;
}

static int context_route(void *app, struct cove_req *r, enum cove_code_op op)
{
        struct coved *d = app;
        json_t *body = NULL;
        if (op == COVE_CODE_CREATE && !(body = cove_req_json(r, 1)))
                return 0;
        struct cove_sandbox_row row;
        struct cove_chan *c = cove_req_chan(d, r, &row);
        if (!c) {
                json_decref(body);
                return 0;
        }
        json_t *out = NULL;
        struct cove_err err;
        int rc = cove_code_context(d, c, &row, op, r->nparams > 1 ? r->params[1] : NULL, body, &out,
                                   &err);
        json_decref(body);
        cove_chan_unref(c);
        cove_sandbox_row_clear(&row);
        if (rc < 0)
                return cove_reply_err(r, &err);
        if (op == COVE_CODE_CREATE)
                return cove_reply_json(r, 201, out);
        if (op == COVE_CODE_LIST)
                return cove_reply_json(r, 200, json_pack("{s:o}", "contexts", out));
        return cove_reply_empty(r, 204);
}

int cove_h_code_ctx_create(void *app, struct cove_req *r)
{
        return context_route(app, r, COVE_CODE_CREATE);
}
int cove_h_code_ctx_list(void *app, struct cove_req *r)
{
        return context_route(app, r, COVE_CODE_LIST);
}
int cove_h_code_ctx_delete(void *app, struct cove_req *r)
{
        return context_route(app, r, COVE_CODE_DELETE);
}
int cove_h_code_ctx_restart(void *app, struct cove_req *r)
{
        return context_route(app, r, COVE_CODE_RESTART);
}
int cove_h_code_ctx_interrupt(void *app, struct cove_req *r)
{
        return context_route(app, r, COVE_CODE_INTERRUPT);
}
