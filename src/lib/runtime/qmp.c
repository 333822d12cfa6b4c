/* QMP client; see qmp.h. */
#include "runtime/qmp.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "util/util.h"

static int left_ms(int64_t deadline)
{
        int64_t l = (deadline - cove_mono_ns()) / 1000000;
        return l < 0 ? 0 : (int)l;
}

/* Next JSON object from the stream (one per line). */
static int read_msg(struct cove_qmp *q, json_t **out, int64_t deadline, struct cove_err *err)
{
        for (;;) {
                char *nl = memchr(q->buf, '\n', q->len);
                if (nl) {
                        size_t n = (size_t)(nl - q->buf) + 1;
                        json_error_t je;
                        json_t *j = json_loadb(q->buf, n, 0, &je);
                        memmove(q->buf, q->buf + n, q->len - n);
                        q->len -= n;
                        if (!json_is_object(j)) {
                                json_decref(j);
                                return cove_err_setk(err, COVE_E_INTERNAL, 0,
                                                     "qmp: malformed message from QEMU");
                        }
                        *out = j;
                        return 0;
                }
                if (q->len == COVE_QMP_LINE_MAX)
                        return cove_err_setk(err, COVE_E_INTERNAL, 0, "qmp: line too long");
                struct pollfd p = {.fd = q->fd, .events = POLLIN};
                int l = left_ms(deadline);
                int r = poll(&p, 1, l);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r < 0)
                        return cove_err_set(err, errno, "qmp: poll");
                if (r == 0)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, ETIMEDOUT,
                                             "qmp: QEMU did not answer in time");
                ssize_t k = read(q->fd, q->buf + q->len, COVE_QMP_LINE_MAX - q->len);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return cove_err_set(err, errno, "qmp: read");
                if (k == 0)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, EPIPE,
                                             "qmp: QEMU closed its monitor (exited?)");
                q->len += (size_t)k;
        }
}

static void queue_event(struct cove_qmp *q, json_t *j)
{
        if (json_array_size(q->events) >= COVE_QMP_EVENTS_MAX)
                json_array_remove(q->events, 0);
        json_array_append_new(q->events, j);
}

static int send_all(int fd, const char *s, size_t n, int pass_fd)
{
        size_t off = 0;
        while (off < n) {
                ssize_t k = cove_send_with_fd(fd, s + off, n - off, off == 0 ? pass_fd : -1);
                if (k < 0)
                        return -1;
                off += (size_t)k;
        }
        return 0;
}

int cove_qmp_open(struct cove_qmp *q, int fd, int timeout_ms, struct cove_err *err)
{
        memset(q, 0, sizeof(*q));
        q->fd = fd;
        q->buf = malloc(COVE_QMP_LINE_MAX);
        q->events = json_array();
        if (!q->buf || !q->events) {
                cove_qmp_close(q);
                return cove_err_set(err, ENOMEM, "qmp");
        }
        int64_t dl = cove_mono_ns() + (int64_t)timeout_ms * 1000000;
        json_t *g = NULL;
        if (read_msg(q, &g, dl, err) < 0) {
                cove_qmp_close(q);
                return -1;
        }
        int ok = json_object_get(g, "QMP") != NULL;
        json_decref(g);
        if (!ok) {
                cove_qmp_close(q);
                return cove_err_setk(err, COVE_E_INTERNAL, 0, "qmp: no greeting");
        }
        if (cove_qmp_cmd(q, "qmp_capabilities", NULL, -1, NULL, left_ms(dl), err) < 0) {
                cove_qmp_close(q);
                return -1;
        }
        return 0;
}

void cove_qmp_close(struct cove_qmp *q)
{
        if (q->fd >= 0)
                close(q->fd);
        q->fd = -1;
        free(q->buf);
        q->buf = NULL;
        json_decref(q->events);
        q->events = NULL;
}

int cove_qmp_cmd(struct cove_qmp *q, const char *cmd, json_t *args, int pass_fd, json_t **ret,
                 int timeout_ms, struct cove_err *err)
{
        if (ret)
                *ret = NULL;
        if (q->fd < 0) {
                json_decref(args);
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0, "qmp: not connected");
        }
        json_t *m = json_pack("{s:s}", "execute", cmd);
        if (args)
                json_object_set_new(m, "arguments", args);
        char *s = json_dumps(m, JSON_COMPACT);
        json_decref(m);
        if (!s)
                return cove_err_set(err, ENOMEM, "qmp");
        size_t n = strlen(s);
        int r = send_all(q->fd, s, n, pass_fd);
        if (r == 0)
                r = send_all(q->fd, "\n", 1, -1);
        free(s);
        if (r < 0)
                return cove_err_set(err, errno, "qmp: send %s", cmd);
        int64_t dl = cove_mono_ns() + (int64_t)timeout_ms * 1000000;
        for (;;) {
                json_t *j = NULL;
                if (read_msg(q, &j, dl, err) < 0)
                        return cove_err_wrap(err, "qmp %s", cmd);
                if (json_object_get(j, "event")) {
                        queue_event(q, j);
                        continue;
                }
                json_t *e = json_object_get(j, "error");
                if (e) {
                        cove_err_setk(err, COVE_E_INTERNAL, 0, "qmp %s: %.40s: %.200s", cmd,
                                      json_string_value(json_object_get(e, "class")) ?: "error",
                                      json_string_value(json_object_get(e, "desc")) ?: "");
                        json_decref(j);
                        return -1;
                }
                json_t *rv = json_object_get(j, "return");
                if (!rv) {
                        json_decref(j);
                        return cove_err_setk(err, COVE_E_INTERNAL, 0, "qmp %s: odd reply", cmd);
                }
                if (ret)
                        *ret = json_incref(rv);
                json_decref(j);
                return 0;
        }
}

int cove_qmp_wait_event(struct cove_qmp *q, const char *ev, json_t **data, int timeout_ms,
                        struct cove_err *err)
{
        if (data)
                *data = NULL;
        int64_t dl = cove_mono_ns() + (int64_t)timeout_ms * 1000000;
        for (;;) {
                size_t i;
                json_t *j;
                json_array_foreach(q->events, i, j)
                {
                        if (strcmp(json_string_value(json_object_get(j, "event")) ?: "", ev))
                                continue;
                        if (data)
                                *data = json_incref(json_object_get(j, "data"));
                        json_array_remove(q->events, i);
                        return 0;
                }
                if (q->fd < 0)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0, "qmp: not connected");
                if (read_msg(q, &j, dl, err) < 0)
                        return cove_err_wrap(err, "qmp: waiting for %s", ev);
                if (json_object_get(j, "event"))
                        queue_event(q, j);
                else
                        json_decref(j); /* a stray reply */
        }
}

int cove_qmp_wait_migration_to(struct cove_qmp *q, const char *status, int timeout_ms,
                               struct cove_err *err)
{
        int64_t dl = cove_mono_ns() + (int64_t)timeout_ms * 1000000;
        for (;;) {
                json_t *d = NULL;
                if (cove_qmp_wait_event(q, "MIGRATION", &d, left_ms(dl), err) < 0)
                        return -1;
                char st[32];
                snprintf(st, sizeof(st), "%s",
                         json_string_value(json_object_get(d, "status")) ?: "");
                json_decref(d);
                if (!strcmp(st, status))
                        return 0;
                if (!strcmp(st, "failed") || !strcmp(st, "cancelled"))
                        return cove_err_setk(err, COVE_E_INTERNAL, 0, "migration %s", st);
        }
}

int cove_qmp_wait_migration(struct cove_qmp *q, int timeout_ms, struct cove_err *err)
{
        return cove_qmp_wait_migration_to(q, "completed", timeout_ms, err);
}
