/* libmicrohttpd front end; see http.h. */
#include "api/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "util/cleanup.h"
#include "util/util.h"

struct cove_http {
        struct cove_http_config cfg;
        struct MHD_Daemon *tcp;
        struct MHD_Daemon *unx;
        char unix_path[108];
        uint64_t requests; /* finished requests (atomic) */
        /* idle streams' client sockets (cove_req_hup): one thread waits on all of them */
        pthread_mutex_t hmu;
        int epfd, evfd; /* evfd: stop the thread */
        pthread_t hup_thread;
        int hup_started;
        int stopping;
        uint64_t hup_ids;
        struct cove_stream_hup *hups;
};

struct cove_stream_hup {
        struct cove_http *h;
        uint64_t id; /* epoll's data: never a pointer that may be freed meanwhile */
        int fd;
        int gone;
        int refs; /* the request's and the stream's */
        int watched;
        void (*wake)(void *);
        void *arg;
        struct cove_stream_hup *next;
};

/* under h->hmu */
static void hup_fire(struct cove_stream_hup *e)
{
        if (__atomic_exchange_n(&e->gone, 1, __ATOMIC_ACQ_REL))
                return;
        if (e->wake)
                e->wake(e->arg);
}

static void *hup_main(void *arg)
{
        struct cove_http *h = arg;
        struct epoll_event ev[64];
        for (;;) {
                int n = epoll_wait(h->epfd, ev, 64, -1);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        break;
                pthread_mutex_lock(&h->hmu);
                int stop = h->stopping;
                for (int i = 0; i < n; i++)
                        for (struct cove_stream_hup *e = h->hups; e && ev[i].data.u64; e = e->next)
                                if (e->id == ev[i].data.u64) {
                                        hup_fire(e);
                                        break;
                                }
                pthread_mutex_unlock(&h->hmu);
                if (stop)
                        break;
        }
        return NULL;
}

struct cove_stream_hup *cove_req_hup(struct cove_req *r, void (*wake)(void *), void *arg)
{
        struct cove_http *h = r->http;
        int fd = cove_req_sockfd(r);
        if (!h || !h->hup_started || r->hup || fd < 0)
                return NULL;
        struct cove_stream_hup *e = calloc(1, sizeof(*e));
        if (!e)
                return NULL;
        e->h = h;
        e->fd = fd;
        e->refs = 2;
        e->wake = wake;
        e->arg = arg;
        pthread_mutex_lock(&h->hmu);
        e->id = ++h->hup_ids;
        e->next = h->hups;
        h->hups = e;
        /* EPOLLRDHUP: the client closed (or half-closed) its side; ERR and HUP come anyway.
         * Not EPOLLIN: a pipelined next request is no reason to wake. */
        struct epoll_event ev = {.events = EPOLLRDHUP | EPOLLONESHOT, .data.u64 = e->id};
        if (h->stopping)
                e->gone = 1;
        else if (epoll_ctl(h->epfd, EPOLL_CTL_ADD, fd, &ev) == 0)
                e->watched = 1;
        pthread_mutex_unlock(&h->hmu);
        r->hup = e;
        return e;
}

const int *cove_stream_hup_flag(const struct cove_stream_hup *e)
{
        static const int never = 0;
        return e ? &e->gone : &never;
}

int cove_stream_hup_gone(const struct cove_stream_hup *e)
{
        return e && __atomic_load_n(&e->gone, __ATOMIC_ACQUIRE);
}

void cove_stream_hup_release(struct cove_stream_hup *e)
{
        if (!e)
                return;
        struct cove_http *h = e->h;
        pthread_mutex_lock(&h->hmu);
        /* the first release comes while libmicrohttpd still holds the socket open (the
         * request's end or the answer's release, both before it closes the fd) */
        if (e->watched) {
                epoll_ctl(h->epfd, EPOLL_CTL_DEL, e->fd, NULL);
                e->watched = 0;
        }
        e->wake = NULL; /* the stream's context may be going away */
        int last = --e->refs == 0;
        if (last)
                for (struct cove_stream_hup **pp = &h->hups; *pp; pp = &(*pp)->next)
                        if (*pp == e) {
                                *pp = e->next;
                                break;
                        }
        pthread_mutex_unlock(&h->hmu);
        if (last)
                free(e);
}

uint64_t cove_http_requests(struct cove_http *h)
{
        return h ? __atomic_load_n(&h->requests, __ATOMIC_RELAXED) : 0;
}

int cove_route_match(const char *pattern, const char *path, char **params, int *nparams)
{
        *nparams = 0;
        const char *p = pattern, *s = path;
        while (*p && *s) {
                if (*p == '{') {
                        const char *pe = strchr(p, '}');
                        if (!pe)
                                goto no;
                        const char *se = strchr(s, '/');
                        if (!se)
                                se = s + strlen(s);
                        if (se == s || *nparams >= COVE_HTTP_MAX_PARAMS)
                                goto no;
                        params[*nparams] = strndup(s, (size_t)(se - s));
                        if (!params[*nparams])
                                goto no;
                        (*nparams)++;
                        p = pe + 1;
                        s = se;
                        continue;
                }
                if (*p != *s)
                        goto no;
                p++;
                s++;
        }
        if (*p == '\0' && (*s == '\0' || (s[0] == '/' && s[1] == '\0')))
                return 1;
no:
        for (int i = 0; i < *nparams; i++)
                free(params[i]);
        *nparams = 0;
        return 0;
}

const char *cove_req_query(struct cove_req *r, const char *key)
{
        return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, key);
}

const char *cove_req_header(struct cove_req *r, const char *name)
{
        return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

int cove_req_sockfd(struct cove_req *r)
{
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        return ci ? ci->connect_fd : -1;
}

int cove_sock_closed(int fd)
{
        if (fd < 0)
                return 0;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 0) <= 0)
                return 0;
        if (p.revents & (POLLERR | POLLHUP | POLLNVAL))
                return 1;
        /* readable: pipelined bytes of a next request, or EOF (the client closed) */
        char c;
        ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static int queue(struct cove_req *r, unsigned status, struct MHD_Response *resp)
{
        if (!resp)
                return -1;
        MHD_add_response_header(resp, "Cache-Control", "no-store");
        if (r->answer_hdr_name)
                MHD_add_response_header(resp, r->answer_hdr_name, r->answer_hdr_value);
        if (r->in_body && !r->late && !r->answered) {
                r->late = resp;
                r->late_status = status;
                r->answered = 1;
                return 0;
        }
        enum MHD_Result q = MHD_queue_response(r->conn, status, resp);
        MHD_destroy_response(resp);
        r->answered = 1;
        return q == MHD_YES ? 0 : -1;
}

int cove_reply_text(struct cove_req *r, unsigned status, const char *ctype, const char *text)
{
        size_t n = strlen(text);
        struct MHD_Response *resp =
            MHD_create_response_from_buffer(n, (void *)text, MHD_RESPMEM_MUST_COPY);
        if (resp && ctype)
                MHD_add_response_header(resp, "Content-Type", ctype);
        return queue(r, status, resp);
}

int cove_reply_buffer(struct cove_req *r, unsigned status, const char *ctype, char *data,
                      size_t len)
{
        struct MHD_Response *resp =
            MHD_create_response_from_buffer(len, data, MHD_RESPMEM_MUST_FREE);
        if (!resp) {
                free(data);
                return -1;
        }
        if (ctype)
                MHD_add_response_header(resp, "Content-Type", ctype);
        return queue(r, status, resp);
}

int cove_reply_json(struct cove_req *r, unsigned status, json_t *obj)
{
        char *s = json_dumps(obj, JSON_COMPACT);
        json_decref(obj);
        if (!s)
                return cove_reply_text(r, 500, "application/json",
                                       "{\"error\":{\"code\":\"internal\",\"message\":\"encode "
                                       "failed\"}}");
        size_t n = strlen(s);
        s[n] = '\0';
        struct MHD_Response *resp = MHD_create_response_from_buffer(n, s, MHD_RESPMEM_MUST_FREE);
        if (!resp) {
                free(s);
                return -1;
        }
        MHD_add_response_header(resp, "Content-Type", "application/json");
        return queue(r, status, resp);
}

int cove_reply_error(struct cove_req *r, unsigned status, const char *code, const char *fmt, ...)
{
        char msg[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        if (r->flat_errors)
                return cove_reply_json(
                    r, status, json_pack("{s:i, s:s}", "code", (int)status, "message", msg));
        return cove_reply_json(r, status,
                               json_pack("{s:{s:s, s:s}}", "error", "code", code, "message", msg));
}

int cove_reply_err(struct cove_req *r, const struct cove_err *err)
{
        static const struct {
                unsigned status;
                const char *code;
        } map[] = {
            [COVE_E_INTERNAL] = {500, "internal"},
            [COVE_E_BAD_REQUEST] = {400, "bad_request"},
            [COVE_E_NOT_FOUND] = {404, "not_found"},
            [COVE_E_CONFLICT] = {409, "conflict"},
            [COVE_E_LIMIT] = {429, "limit_exceeded"},
            [COVE_E_UNAUTHORIZED] = {401, "unauthorized"},
            [COVE_E_UNAVAILABLE] = {503, "unavailable"},
            [COVE_E_KEY_REVOKED] = {403, "key_revoked"},
        };
        unsigned k = (unsigned)err->kind;
        if (k >= COVE_ARRAY_SIZE(map))
                k = COVE_E_INTERNAL;
        /* the node's own disk (errnum is only ever a host-side errno: a guest's answers carry
         * none): full, or failing after it filled up. Not a bug, and the caller should know
         * it is the node, not the request. */
        if (err->errnum == ENOSPC || err->errnum == EDQUOT)
                return cove_reply_error(r, 503, "unavailable",
                                        "no space left on the node's data disk (free space "
                                        "there or delete snapshots, then retry): %s",
                                        err->msg);
        if (k == COVE_E_INTERNAL && (err->errnum == EIO || err->errnum == EROFS))
                return cove_reply_error(
                    r, 503, "unavailable",
                    "I/O error on the node's disk (was its data disk full?): %s", err->msg);
        return cove_reply_error(r, map[k].status, map[k].code, "%s",
                                err->msg[0] ? err->msg : "error");
}

int cove_reply_empty(struct cove_req *r, unsigned status)
{
        struct MHD_Response *resp =
            MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        return queue(r, status, resp);
}

int cove_reply_result(struct cove_req *r, int rc, unsigned status, json_t *out,
                      const struct cove_err *err)
{
        if (rc < 0)
                return cove_reply_err(r, err);
        return out ? cove_reply_json(r, status, out) : cove_reply_empty(r, status);
}

int cove_reply_stream(struct cove_req *r, unsigned status, const char *ctype, int64_t size,
                      cove_stream_read_fn read, cove_stream_free_fn free_fn, void *ctx)
{
        struct MHD_Response *resp = MHD_create_response_from_callback(
            size < 0 ? MHD_SIZE_UNKNOWN : (uint64_t)size, 64 * 1024,
            (MHD_ContentReaderCallback)read, ctx, (MHD_ContentReaderFreeCallback)free_fn);
        if (!resp) {
                if (free_fn)
                        free_fn(ctx);
                return -1;
        }
        if (ctype)
                MHD_add_response_header(resp, "Content-Type", ctype);
        if (size < 0)
                MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
        return queue(r, status, resp);
}

int cove_reply_stream_hdrs(struct cove_req *r, unsigned status, const char *const *hdrs,
                           size_t nhdrs, int64_t size, cove_stream_read_fn read,
                           cove_stream_free_fn free_fn, void *ctx)
{
        struct MHD_Response *resp = MHD_create_response_from_callback(
            size < 0 ? MHD_SIZE_UNKNOWN : (uint64_t)size, 64 * 1024,
            (MHD_ContentReaderCallback)read, ctx, (MHD_ContentReaderFreeCallback)free_fn);
        if (!resp) {
                if (free_fn)
                        free_fn(ctx);
                return -1;
        }
        for (size_t i = 0; i < nhdrs; i++)
                MHD_add_response_header(resp, hdrs[2 * i], hdrs[2 * i + 1]);
        return queue(r, status, resp);
}

struct target_buf {
        char *out;
        size_t cap, len;
        int n, overflow;
};

static void target_put(struct target_buf *t, const char *s, int keep_slash)
{
        static const char hex[] = "0123456789ABCDEF";
        for (; *s; s++) {
                unsigned char c = (unsigned char)*s;
                int plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                            (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' ||
                            c == '~' || (keep_slash && c == '/');
                if (t->len + 4 > t->cap) {
                        t->overflow = 1;
                        return;
                }
                if (plain) {
                        t->out[t->len++] = (char)c;
                } else {
                        t->out[t->len++] = '%';
                        t->out[t->len++] = hex[c >> 4];
                        t->out[t->len++] = hex[c & 15];
                }
        }
        t->out[t->len] = '\0';
}

static void target_raw(struct target_buf *t, char c)
{
        if (t->len + 2 > t->cap) {
                t->overflow = 1;
                return;
        }
        t->out[t->len++] = c;
        t->out[t->len] = '\0';
}

static enum MHD_Result target_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                  const char *value)
{
        struct target_buf *t = cls;
        target_raw(t, t->n++ ? '&' : '?');
        target_put(t, key, 0);
        if (value) {
                target_raw(t, '=');
                target_put(t, value, 0);
        }
        return t->overflow ? MHD_NO : MHD_YES;
}

int cove_req_target(struct cove_req *r, char *out, size_t cap)
{
        struct target_buf t = {.out = out, .cap = cap};
        if (cap == 0)
                return -1;
        out[0] = '\0';
        target_put(&t, r->url ? r->url : "/", 1);
        if (!t.overflow)
                MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, target_arg, &t);
        return t.overflow ? -1 : 0;
}

json_t *cove_req_json(struct cove_req *r, int allow_empty)
{
        if (!r->body || r->body_len == 0) {
                if (allow_empty)
                        return json_object();
                cove_reply_error(r, 400, "bad_request", "request body must be a JSON object");
                return NULL;
        }
        json_error_t je;
        json_t *j = json_loadb(r->body, r->body_len, JSON_REJECT_DUPLICATES, &je);
        if (!j) {
                cove_reply_error(r, 400, "bad_request", "malformed JSON at line %d column %d: %s",
                                 je.line, je.column, je.text);
                return NULL;
        }
        if (!json_is_object(j)) {
                json_decref(j);
                cove_reply_error(r, 400, "bad_request", "request body must be a JSON object");
                return NULL;
        }
        return j;
}

static void req_free(struct cove_http *h, struct cove_req *r)
{
        if (r->cleanup)
                r->cleanup(h->cfg.app, r);
        for (int i = 0; i < r->nparams; i++)
                free(r->params[i]);
        free(r->body);
        if (r->late)
                MHD_destroy_response(r->late);
        cove_stream_hup_release(r->hup);
        free(r);
}

static void completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
        struct cove_http *h = cls;
        struct cove_req *r = *con_cls;
        if (!r)
                return;
        *con_cls = NULL;
        __atomic_add_fetch(&h->requests, 1, __ATOMIC_RELAXED);
        req_free(h, r);
}

/* Query values are handed to handlers as C strings: one with a NUL byte inside (%00) would
 * be silently cut short ("/tmp/%00x" read as "/tmp/"), so such a request is refused. */
static enum MHD_Result nul_in_value(void *cls, enum MHD_ValueKind kind, const char *key,
                                    size_t key_size, const char *value, size_t value_size)
{
        int *bad = cls;
        if (strlen(key) != key_size || (value && strlen(value) != value_size)) {
                *bad = 1;
                return MHD_NO;
        }
        return MHD_YES;
}

static enum MHD_Result answer_now(struct cove_req *r, unsigned status, const char *code,
                                  const char *msg)
{
        cove_reply_error(r, status, code, "%s", msg);
        return MHD_YES;
}

static enum MHD_Result access_cb(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_data_size, void **con_cls)
{
        struct cove_http *h = cls;
        struct cove_req *r = *con_cls;
        if (!r) {
                r = calloc(1, sizeof(*r));
                if (!r)
                        return MHD_NO;
                r->conn = conn;
                r->http = h;
                r->flat_errors = h->cfg.flat_errors;
                r->method = method;
                r->url = url;
                r->t0_ns = cove_mono_ns();
                *con_cls = r;
                int path_matched = 0;
                for (size_t i = 0; i < h->cfg.nroutes; i++) {
                        const struct cove_route *rt = &h->cfg.routes[i];
                        char *params[COVE_HTTP_MAX_PARAMS];
                        int np;
                        if (!cove_route_match(rt->pattern, url, params, &np))
                                continue;
                        if (strcmp(rt->method, method) != 0) {
                                for (int k = 0; k < np; k++)
                                        free(params[k]);
                                path_matched = 1;
                                continue;
                        }
                        r->route = rt;
                        memcpy(r->params, params, sizeof(params));
                        r->nparams = np;
                        break;
                }
                int nul = 0;
                MHD_get_connection_values_n(conn, MHD_GET_ARGUMENT_KIND, nul_in_value, &nul);
                if (nul)
                        return answer_now(r, 400, "bad_request",
                                          "query parameters must not contain NUL bytes");
                if (!r->route && h->cfg.fallback)
                        r->route = h->cfg.fallback;
                if (!r->route)
                        return path_matched ? answer_now(r, 405, "bad_request",
                                                         "method not allowed on this path")
                                            : answer_now(r, 404, "not_found", "no such endpoint");
                if (!(r->route->flags & COVE_ROUTE_PUBLIC)) {
                        struct cove_err err;
                        cove_err_clear(&err);
                        const char *auth = cove_req_header(r, "Authorization");
                        if (h->cfg.auth(h->cfg.app, r, auth, &err) < 0) {
                                cove_reply_err(r, &err);
                                return MHD_YES;
                        }
                }
                const char *cl = cove_req_header(r, "Content-Length");
                if (!r->route->upload && cl && strtoull(cl, NULL, 10) > COVE_HTTP_JSON_MAX)
                        return answer_now(r, 413, "limit_exceeded",
                                          "request body larger than 1 MiB");
                return MHD_YES;
        }
        if (r->answered) {
                /* answered early (error): discard whatever body still comes, then send an
                 * answer given while it was arriving */
                if (*upload_data_size == 0 && r->late) {
                        struct MHD_Response *late = r->late;
                        r->late = NULL;
                        MHD_queue_response(r->conn, r->late_status, late);
                        MHD_destroy_response(late);
                }
                *upload_data_size = 0;
                return MHD_YES;
        }
        if (*upload_data_size > 0) {
                size_t n = *upload_data_size;
                *upload_data_size = 0;
                if (r->route->upload) {
                        r->in_body = 1;
                        if (!r->upload_failed && r->route->upload(h->cfg.app, r, upload_data, n))
                                r->upload_failed = 1;
                        r->in_body = 0;
                        return MHD_YES;
                }
                if (r->too_big || r->body_len + n > COVE_HTTP_JSON_MAX) {
                        r->too_big = 1;
                        return MHD_YES;
                }
                char *nb = realloc(r->body, r->body_len + n + 1);
                if (!nb)
                        return MHD_NO;
                r->body = nb;
                memcpy(r->body + r->body_len, upload_data, n);
                r->body_len += n;
                r->body[r->body_len] = '\0';
                return MHD_YES;
        }
        if (r->too_big)
                return answer_now(r, 413, "limit_exceeded", "request body larger than 1 MiB");
        r->started = 1;
        r->route->handler(h->cfg.app, r);
        if (!r->answered)
                cove_reply_error(r, 500, "internal", "handler gave no answer");
        return MHD_YES;
}

static int listen_tcp(const char *addr, struct cove_err *err)
{
        char host[256];
        const char *colon = strrchr(addr, ':');
        if (!colon || (size_t)(colon - addr) >= sizeof(host))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "listen address %s: expected HOST:PORT", addr);
        memcpy(host, addr, (size_t)(colon - addr));
        host[colon - addr] = '\0';
        char *end;
        long port = strtol(colon + 1, &end, 10);
        if (*end || port < 0 || port > 65535)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "listen address %s: bad port",
                                     addr);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "listen address %s: expected an IPv4 address", addr);
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return cove_err_set(err, errno, "socket");
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 1024) < 0) {
                int e = errno;
                close(fd);
                return cove_err_set(err, e, "listen on %s", addr);
        }
        return fd;
}

static int listen_unix(const char *path, struct cove_err *err)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        if (strlen(path) >= sizeof(sa.sun_path))
                return cove_err_set(err, ENAMETOOLONG, "unix socket %s", path);
        strcpy(sa.sun_path, path);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return cove_err_set(err, errno, "socket");
        unlink(path);
        mode_t old = umask(0177);
        int r = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
        umask(old);
        if (r < 0 || listen(fd, 1024) < 0) {
                int e = errno;
                close(fd);
                return cove_err_set(err, e, "listen on %s", path);
        }
        return fd;
}

/* Each connection's memory pool: the request's head, the read buffer and a streaming answer's
 * 64 KiB write buffer. libmicrohttpd zeroes the whole pool after every request on a keep-alive
 * connection, so its size is paid per request (at 256 KiB that memset was 17% of coved's CPU
 * under the reconnect bench). */
#define COVE_HTTP_CONN_POOL (128u * 1024)

static struct MHD_Daemon *daemon_on(struct cove_http *h, int fd)
{
        return MHD_start_daemon(
            MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                MHD_USE_ITC,
            0, NULL, NULL, access_cb, h, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_NOTIFY_COMPLETED,
            completed, h, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)0,
            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)COVE_HTTP_CONN_POOL,
            MHD_OPTION_CONNECTION_LIMIT, (unsigned)4096, MHD_OPTION_THREAD_STACK_SIZE,
            (size_t)(512 * 1024), MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1, MHD_OPTION_END);
}

struct cove_http *cove_http_start(const struct cove_http_config *cfg, const char *tcp_addr,
                                  const char *unix_path, struct cove_err *err)
{
        struct cove_http *h = calloc(1, sizeof(*h));
        if (!h) {
                cove_err_set(err, ENOMEM, "http");
                return NULL;
        }
        h->cfg = *cfg;
        h->epfd = h->evfd = -1;
        pthread_mutex_init(&h->hmu, NULL);
        h->epfd = epoll_create1(EPOLL_CLOEXEC);
        h->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        struct epoll_event sev = {.events = EPOLLIN, .data.u64 = 0};
        if (h->epfd < 0 || h->evfd < 0 || epoll_ctl(h->epfd, EPOLL_CTL_ADD, h->evfd, &sev) < 0 ||
            pthread_create(&h->hup_thread, NULL, hup_main, h) != 0) {
                cove_err_set(err, errno, "http: idle stream watcher");
                goto fail;
        }
        h->hup_started = 1;
        if (tcp_addr) {
                int fd = listen_tcp(tcp_addr, err);
                if (fd < 0)
                        goto fail;
                h->tcp = daemon_on(h, fd);
                if (!h->tcp) {
                        close(fd);
                        cove_err_set(err, errno, "http: start on %s", tcp_addr);
                        goto fail;
                }
        }
        if (unix_path) {
                int fd = listen_unix(unix_path, err);
                if (fd < 0)
                        goto fail;
                h->unx = daemon_on(h, fd);
                if (!h->unx) {
                        close(fd);
                        cove_err_set(err, errno, "http: start on %s", unix_path);
                        goto fail;
                }
                snprintf(h->unix_path, sizeof(h->unix_path), "%s", unix_path);
        }
        return h;
fail:
        cove_http_stop(h);
        return NULL;
}

void cove_http_stop(struct cove_http *h)
{
        if (!h)
                return;
        if (h->hup_started) {
                /* every idle stream stops waiting (its reader sees the flag), then the
                 * connection threads can be joined */
                pthread_mutex_lock(&h->hmu);
                h->stopping = 1;
                for (struct cove_stream_hup *e = h->hups; e; e = e->next)
                        hup_fire(e);
                pthread_mutex_unlock(&h->hmu);
                uint64_t one = 1;
                if (write(h->evfd, &one, sizeof(one)) < 0) {
                        /* cannot fail: a fresh eventfd's counter is far from its bound */
                }
                pthread_join(h->hup_thread, NULL);
                h->hup_started = 0;
        }
        if (h->tcp)
                MHD_stop_daemon(h->tcp);
        if (h->unx)
                MHD_stop_daemon(h->unx);
        if (h->unix_path[0])
                unlink(h->unix_path);
        /* streams released by the connections' ends */
        while (h->hups) {
                struct cove_stream_hup *e = h->hups;
                h->hups = e->next;
                free(e);
        }
        if (h->epfd >= 0)
                close(h->epfd);
        if (h->evfd >= 0)
                close(h->evfd);
        pthread_mutex_destroy(&h->hmu);
        free(h);
}
