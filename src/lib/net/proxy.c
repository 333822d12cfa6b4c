/* The egress proxy (gateway thread only); see gateway.h. A connection goes
 * PEEK (read what it announces; nothing forwarded) → CONNECTING → SPLICE (copy both ways
 * through two bounded buffers; EOF on one side becomes shutdown(SHUT_WR) on the other once
 * its buffer is flushed; the connection ends when both directions are shut, or at once on
 * an error) or TLS (intercepted). When the destination can only be allowed by a name whose
 * pin names it, the upstream connect starts during PEEK (early_connect). Interest sets are
 * recomputed after every event (level-triggered epoll). */
#include "net/internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/netfilter_ipv4.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <time.h>

#include "net/sniff.h"

static void mitm_free(struct mitm_conn *m)
{
        if (!m)
                return;
        SSL_free(m->cssl); /* frees its BIOs */
        SSL_free(m->ussl);
        cove_bytes_free(&m->c2u);
        cove_bytes_free(&m->u2c);
        OPENSSL_cleanse(&m->h1, sizeof(m->h1));
        free(m);
        ERR_clear_error();
}

/* A pipe of a closing connection goes back to the pool when it holds no byte (checked by
 * the kernel, not by our count: a pipe never carries one connection's bytes into another). */
static void pipe_put(struct cove_gateway *gw, int p[2])
{
        if (p[0] < 0)
                return;
        int n = -1;
        if (gw->npipes < GW_PIPE_POOL && ioctl(p[0], FIONREAD, &n) == 0 && n == 0) {
                gw->pipes[gw->npipes][0] = p[0];
                gw->pipes[gw->npipes][1] = p[1];
                gw->npipes++;
        } else {
                close(p[0]);
                close(p[1]);
        }
        p[0] = p[1] = -1;
}

static int pipe_get(struct cove_gateway *gw, int p[2])
{
        if (gw->npipes) {
                gw->npipes--;
                p[0] = gw->pipes[gw->npipes][0];
                p[1] = gw->pipes[gw->npipes][1];
                return 0;
        }
        if (pipe2(p, O_NONBLOCK | O_CLOEXEC) < 0) {
                p[0] = p[1] = -1;
                return -1;
        }
        fcntl(p[1], F_SETPIPE_SZ, GW_PIPE);
        return 0;
}

static void proxy_pipes_free(struct cove_gateway *gw)
{
        while (gw->npipes) {
                gw->npipes--;
                close(gw->pipes[gw->npipes][0]);
                close(gw->pipes[gw->npipes][1]);
        }
}

static void pc_free(struct cove_gateway *gw, struct pconn *c, int reset)
{
        if (reset) { /* an abortive close tells both ends at once */
                struct linger l = {1, 0};
                setsockopt(c->cfd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
                if (c->ufd >= 0)
                        setsockopt(c->ufd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
        }
        gw_close(gw, c->cfd);
        gw_close(gw, c->ufd);
        pipe_put(gw, c->pc);
        pipe_put(gw, c->pu);
        if (c->prev)
                c->prev->next = c->next;
        else
                gw->conns = c->next;
        if (c->next)
                c->next->prev = c->prev;
        gw_view_release(&c->v);
        mitm_free(c->m);
        c->m = NULL;
        free(c->c2u.b);
        free(c->u2c.b);
        c->c2u.b = c->u2c.b = NULL;
        /* the rest waits for the end of the epoll batch: an event of the other fd of this
         * connection may still be in it (proxy_reap) */
        c->dead = 1;
        c->next = gw->dead;
        gw->dead = c;
        __atomic_fetch_sub(&gw->st.conns_open, 1, __ATOMIC_RELAXED);
}

void proxy_reap(struct cove_gateway *gw)
{
        while (gw->dead) {
                struct pconn *c = gw->dead;
                gw->dead = c->next;
                free(c);
        }
}

static json_t *detail(const struct pconn *c, const char *reason)
{
        char a[INET_ADDRSTRLEN];
        struct in_addr ia = {.s_addr = c->dst};
        inet_ntop(AF_INET, &ia, a, sizeof(a));
        json_t *d = json_pack("{s:s, s:i, s:s, s:s}", "dst", a, "port", c->dport, "proto",
                              c->proto ? c->proto : "tcp", "rule", c->rule);
        if (c->name[0])
                json_object_set_new(d, c->proto && !strcmp(c->proto, "http") ? "host" : "sni",
                                    json_string(c->name));
        if (c->intercept)
                json_object_set_new(d, "intercept", json_true());
        if (reason)
                json_object_set_new(d, "reason", json_string(reason));
        return d;
}

static void deny(struct cove_gateway *gw, struct pconn *c, const char *reason)
{
        gw_audit(gw, &c->v, "egress", "connect", "deny", detail(c, reason));
        gw_stat_add(gw, &gw->st.conns_denied, 1);
        pc_free(gw, c, 1);
}

static void set_mask(struct cove_gateway *gw, int fd, struct ev *ev, uint32_t *have, uint32_t want)
{
        if (fd >= 0 && *have != want) {
                gw_epoll(gw, EPOLL_CTL_MOD, fd, want, ev);
                *have = want;
        }
}

static void update(struct cove_gateway *gw, struct pconn *c)
{
        uint32_t cm = 0, um = 0;
        if (c->state == PC_PEEK) {
                cm = EPOLLIN; /* an early connect: errors only (early_connect) */
        } else if (c->state == PC_CONNECTING) {
                um = EPOLLOUT;
        } else if (c->state == PC_TLS) {
                struct mitm_conn *m = c->m;
                if (!m->ceof && !m->closing && BIO_ctrl_pending(m->crb) < GW_TLS_BUF)
                        cm |= EPOLLIN;
                if (BIO_ctrl_pending(m->cwb))
                        cm |= EPOLLOUT;
                if (c->ufd >= 0 && !m->ueof && BIO_ctrl_pending(m->urb) < GW_TLS_BUF)
                        um |= EPOLLIN;
                if (c->ufd >= 0 && BIO_ctrl_pending(m->uwb))
                        um |= EPOLLOUT;
        } else if (c->pc[0] >= 0) { /* spliced */
                if (!c->c2u.eof && !c->c2u.len && c->nc < GW_PIPE)
                        cm |= EPOLLIN;
                if (c->nu)
                        cm |= EPOLLOUT;
                if (!c->u2c.eof && c->nu < GW_PIPE)
                        um |= EPOLLIN;
                if (c->nc || c->c2u.len)
                        um |= EPOLLOUT;
        } else {
                if (!c->c2u.eof && c->c2u.off + c->c2u.len < GW_BUF)
                        cm |= EPOLLIN;
                if (c->u2c.len)
                        cm |= EPOLLOUT;
                if (!c->u2c.eof && c->u2c.off + c->u2c.len < GW_BUF)
                        um |= EPOLLIN;
                if (c->c2u.len)
                        um |= EPOLLOUT;
        }
        set_mask(gw, c->cfd, &c->cev, &c->cmask, cm);
        set_mask(gw, c->ufd, &c->uev, &c->umask, um);
}

/* A non-blocking connect to the original destination, registered for want (EPOLLOUT, or 0
 * for errors only); -1 when it failed at once. */
static int up_connect(struct cove_gateway *gw, struct pconn *c, uint32_t want)
{
        c->ufd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (c->ufd < 0)
                return -1;
        int one = 1;
        setsockopt(c->ufd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        struct sockaddr_in a = {
            .sin_family = AF_INET, .sin_port = htons(c->dport), .sin_addr.s_addr = c->dst};
        if (connect(c->ufd, (struct sockaddr *)&a, sizeof(a)) < 0 && errno != EINPROGRESS) {
                close(c->ufd);
                c->ufd = -1;
                return -1;
        }
        c->uev = (struct ev){EV_PROXY_UP, c};
        c->umask = want;
        gw_epoll(gw, EPOLL_CTL_ADD, c->ufd, want, &c->uev);
        return 0;
}

/* The destination is reachable only under a name rule, once the sandbox has announced the
 * name and the name's pin matches the address. If some name this sandbox resolved to this
 * address is allowed on this port, the upstream TCP handshake overlaps the wait for the
 * first bytes: not a byte goes upstream before the decision, and a refusal resets it. Its
 * completion is not waited for (no wake-up of its own): the decision polls it (early_poll);
 * only a failure wakes the thread before that (EPOLLERR/EPOLLHUP are always reported). */
static void early_connect(struct cove_gateway *gw, struct pconn *c)
{
        if (gw_pinned_allowed(gw, &c->v, c->dst, c->dport) && up_connect(gw, c, 0) == 0)
                c->early = 1;
}

/* An early connect at decision time: established (early = 2), failed or already closed by
 * the upstream (which may give up on a slow sandbox meanwhile: dropped, the decision connects
 * again), or still in progress (left as it is: the caller waits for EPOLLOUT). One poll. */
static void early_drop(struct cove_gateway *gw, struct pconn *c);
static void early_poll(struct cove_gateway *gw, struct pconn *c)
{
        if (c->early != 1)
                return;
        struct pollfd pf = {.fd = c->ufd, .events = POLLOUT | POLLRDHUP};
        if (poll(&pf, 1, 0) == 0)
                return;
        if (pf.revents & (POLLERR | POLLHUP | POLLRDHUP))
                early_drop(gw, c);
        else if (pf.revents & POLLOUT)
                c->early = 2;
}

/* An early connect that failed before the decision is dropped quietly: the decision, if it
 * allows, connects again and reports that one. */
static void early_drop(struct cove_gateway *gw, struct pconn *c)
{
        gw_close(gw, c->ufd);
        c->ufd = -1;
        c->umask = 0;
        c->early = 0;
}

static void on_connected(struct cove_gateway *gw, struct pconn *c);

static void start_connect(struct cove_gateway *gw, struct pconn *c)
{
        gw_audit(gw, &c->v, "egress", "connect", "allow", detail(c, NULL));
        gw_stat_add(gw, &gw->st.conns_allowed, 1);
        early_poll(gw, c);
        c->u2c.b = malloc(GW_BUF);
        if (!c->u2c.b || (c->ufd < 0 && up_connect(gw, c, EPOLLOUT) < 0)) {
                pc_free(gw, c, 1);
                return;
        }
        c->state = PC_CONNECTING;
        c->deadline_ms = gw_now_ms() + GW_CONNECT_MS;
        if (c->early == 2) {
                on_connected(gw, c);
                return;
        }
        update(gw, c);
}

static int64_t wall_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- interception (PC_TLS) ---- */

static int h1_injects(void *arg, const struct cove_inject **out, int max)
{
        struct pconn *c = arg;
        return cove_policy_injects_for(c->v.policy, c->name, wall_ms(), out, max);
}

static void h1_done(void *arg, const char *method, const char *target,
                    const struct cove_inject *const *applied, int n)
{
        struct pconn *c = arg;
        (void)target; /* may carry anything: not audited */
        for (int i = 0; i < n; i++) {
                json_t *d = detail(c, NULL);
                json_object_set_new(d, "secret", json_string(applied[i]->name));
                json_object_set_new(d, "method", json_string(method));
                if (applied[i]->lease[0])
                        json_object_set_new(d, "lease", json_string(applied[i]->lease));
                gw_audit(c->gw, &c->v, "egress", "inject", "allow", d);
        }
}

static BIO *mem_bio(void)
{
        BIO *b = BIO_new(BIO_s_mem());
        if (b)
                BIO_set_mem_eof_return(b, -1); /* empty = retry, not EOF */
        return b;
}

/* Both sides' TLS objects; the ClientHello already read goes to the sandbox side. */
static int tls_begin(struct cove_gateway *gw, struct pconn *c)
{
        struct mitm_conn *m = calloc(1, sizeof(*m));
        if (!m)
                return -1;
        c->m = m;
        m->cssl = cove_mitm_client_ssl(gw->mitm, c->name);
        m->ussl = cove_mitm_upstream_ssl(gw->mitm, c->name);
        m->crb = mem_bio();
        m->cwb = mem_bio();
        m->urb = mem_bio();
        m->uwb = mem_bio();
        if (!m->cssl || !m->ussl || !m->crb || !m->cwb || !m->urb || !m->uwb) {
                BIO_free(m->crb);
                BIO_free(m->cwb);
                BIO_free(m->urb);
                BIO_free(m->uwb);
                return -1;
        }
        SSL_set_bio(m->cssl, m->crb, m->cwb);
        SSL_set_bio(m->ussl, m->urb, m->uwb);
        if (c->c2u.len && BIO_write(m->crb, c->c2u.b + c->c2u.off, (int)c->c2u.len) <= 0)
                return -1;
        c->c2u.off = c->c2u.len = 0;
        cove_h1_init(&m->h1, c->name, c->dport, h1_injects, h1_done, c);
        c->state = PC_TLS;
        return 0;
}

/* socket → read BIO: 1 moved, 0 nothing, -1 error; EOF sets *eof */
static int sock_in(int fd, BIO *rb, int *eof, uint64_t *ctr)
{
        if (*eof || fd < 0 || BIO_ctrl_pending(rb) >= GW_TLS_BUF)
                return 0;
        uint8_t buf[16384];
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n == 0) {
                *eof = 1;
                return 1;
        }
        if (n < 0)
                return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
        __atomic_fetch_add(ctr, (uint64_t)n, __ATOMIC_RELAXED);
        return BIO_write(rb, buf, (int)n) == n ? 1 : -1;
}

/* write BIO → socket */
static int sock_out(int fd, BIO *wb)
{
        if (fd < 0)
                return 0;
        int moved = 0;
        for (;;) {
                char *p;
                long n = BIO_get_mem_data(wb, &p);
                if (n <= 0)
                        return moved;
                ssize_t s = send(fd, p, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL);
                if (s < 0)
                        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? moved
                                                                                         : -1;
                uint8_t scratch[16384];
                for (ssize_t left = s; left > 0;) {
                        int k = BIO_read(wb, scratch,
                                         (int)(left < (ssize_t)sizeof(scratch)
                                                   ? left
                                                   : (ssize_t)sizeof(scratch)));
                        if (k <= 0)
                                return -1;
                        left -= k;
                }
                moved = 1;
                if (s < n)
                        return moved;
        }
}

/* SSL_read into a plaintext buffer while it has room: 1 moved, 0 nothing, -1 error;
 * close_notify sets *done */
static int ssl_in(SSL *s, struct cove_bytes *to, int *done)
{
        int moved = 0;
        uint8_t buf[16384];
        while (!*done && to->len < GW_TLS_BUF) {
                int r = SSL_read(s, buf, sizeof(buf));
                if (r > 0) {
                        if (cove_bytes_add(to, buf, (size_t)r) < 0)
                                return -1;
                        moved = 1;
                        continue;
                }
                int e = SSL_get_error(s, r);
                if (e == SSL_ERROR_ZERO_RETURN) {
                        *done = 1;
                        return 1;
                }
                return e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ? moved : -1;
        }
        return moved;
}

static int ssl_out(SSL *s, BIO *wb, struct cove_bytes *from)
{
        if (!from->len || BIO_ctrl_pending(wb) >= GW_TLS_BUF)
                return 0;
        int r = SSL_write(s, from->b, (int)(from->len > 65536 ? 65536 : from->len));
        if (r > 0) {
                cove_bytes_consume(from, (size_t)r);
                return 1;
        }
        int e = SSL_get_error(s, r);
        return e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ? 0 : -1;
}

static int handshake(SSL *s, int *done)
{
        if (*done)
                return 0;
        int r = SSL_do_handshake(s);
        if (r == 1) {
                *done = 1;
                return 1;
        }
        int e = SSL_get_error(s, r);
        return e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ? 0 : -1;
}

/* Refuse the current request: audit, answer the sandbox, drop the upstream, close once
 * the answer is out. */
static void refuse(struct cove_gateway *gw, struct pconn *c, int status, const char *why)
{
        struct mitm_conn *m = c->m;
        json_t *d = detail(c, why);
        json_object_set_new(d, "status", json_integer(status));
        gw_audit(gw, &c->v, "egress", "inject", "deny", d);
        const char *text = status == 421   ? "Misdirected Request"
                           : status == 415 ? "Unsupported Media Type"
                           : status == 431 ? "Request Header Fields Too Large"
                           : status == 501 ? "Not Implemented"
                                           : "Bad Request";
        char resp[768];
        int n = snprintf(resp, sizeof(resp),
                         "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                         "Content-Length: %zu\r\n\r\ncove egress: %s\n",
                         status, text, strlen(why) + 14, why);
        cove_bytes_consume(&m->u2c, m->u2c.len);
        cove_bytes_consume(&m->c2u, m->c2u.len);
        if (n > 0 && (size_t)n < sizeof(resp))
                SSL_write(m->cssl, resp, n);
        SSL_shutdown(m->cssl);
        m->closing = 1;
        if (c->ufd >= 0) {
                struct linger l = {1, 0};
                setsockopt(c->ufd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
                gw_close(gw, c->ufd);
                c->ufd = -1;
                c->umask = 0;
        }
}

static void tls_fail(struct cove_gateway *gw, struct pconn *c, const char *why)
{
        json_t *d = detail(c, why);
        gw_audit(gw, &c->v, "egress", "close", "deny", d);
        pc_free(gw, c, 1);
}

static void tls_pump(struct cove_gateway *gw, struct pconn *c)
{
        struct mitm_conn *m = c->m;
        for (int round = 0; round < 64; round++) {
                int prog = 0, r;
                if ((r = sock_in(c->cfd, m->crb, &m->ceof, &gw->st.bytes_up)) < 0)
                        goto reset;
                prog |= r;
                if ((r = sock_in(c->ufd, m->urb, &m->ueof, &gw->st.bytes_down)) < 0)
                        goto reset;
                prog |= r;
                if (!m->closing) {
                        if ((r = handshake(m->cssl, &m->chs)) < 0) {
                                tls_fail(gw, c,
                                         "TLS handshake with the sandbox failed (does it "
                                         "trust the node CA?)");
                                return;
                        }
                        prog |= r;
                        if ((r = handshake(m->ussl, &m->uhs)) < 0) {
                                long v = SSL_get_verify_result(m->ussl);
                                char why[256];
                                snprintf(why, sizeof(why), "upstream TLS handshake failed%s%s",
                                         v != X509_V_OK ? ": certificate not verified: " : "",
                                         v != X509_V_OK ? X509_verify_cert_error_string(v) : "");
                                tls_fail(gw, c, why);
                                return;
                        }
                        prog |= r;
                }
                if (m->chs && m->uhs && !m->closing) {
                        /* sandbox → upstream, request by request */
                        uint8_t buf[16384];
                        while (!m->cdone && m->c2u.len < GW_TLS_BUF) {
                                int k = SSL_read(m->cssl, buf, sizeof(buf));
                                if (k <= 0) {
                                        int e = SSL_get_error(m->cssl, k);
                                        if (e == SSL_ERROR_ZERO_RETURN)
                                                m->cdone = 1;
                                        else if (e != SSL_ERROR_WANT_READ &&
                                                 e != SSL_ERROR_WANT_WRITE)
                                                goto reset;
                                        break;
                                }
                                const char *why = "";
                                int st = cove_h1_feed(&m->h1, buf, (size_t)k, &m->c2u, &why);
                                OPENSSL_cleanse(buf, (size_t)k);
                                if (st < 0)
                                        goto reset;
                                if (st > 0) {
                                        refuse(gw, c, st, why);
                                        prog = 1;
                                        break;
                                }
                                prog = 1;
                        }
                        if (!m->closing) {
                                if ((r = ssl_out(m->ussl, m->uwb, &m->c2u)) < 0)
                                        goto reset;
                                prog |= r;
                                if ((r = ssl_in(m->ussl, &m->u2c, &m->udone)) < 0)
                                        goto reset;
                                prog |= r;
                                if ((r = ssl_out(m->cssl, m->cwb, &m->u2c)) < 0)
                                        goto reset;
                                prog |= r;
                        }
                }
                if ((r = sock_out(c->cfd, m->cwb)) < 0)
                        goto reset;
                prog |= r;
                if (!m->closing && (r = sock_out(c->ufd, m->uwb)) < 0)
                        goto reset;
                prog |= r;
                if (!prog)
                        break;
        }
        /* endings */
        if (m->closing) {
                if (!BIO_ctrl_pending(m->cwb) || m->ceof)
                        pc_free(gw, c, 0);
                else
                        update(gw, c);
                return;
        }
        int up_over = (m->udone || (m->ueof && !BIO_ctrl_pending(m->urb))) && !m->u2c.len &&
                      !BIO_ctrl_pending(m->cwb);
        int cl_over = m->cdone || (m->ceof && !BIO_ctrl_pending(m->crb));
        if (up_over || cl_over || ((m->ueof) && !m->uhs)) {
                pc_free(gw, c, 0);
                return;
        }
        update(gw, c);
        return;
reset:
        pc_free(gw, c, 1);
}

/* Decide on what the client announced (c2u holds its first bytes). */
static void on_peek(struct cove_gateway *gw, struct pconn *c)
{
        const uint8_t *b = c->c2u.b + c->c2u.off;
        size_t n = c->c2u.len;
        enum cove_sniff_proto p = cove_sniff_proto(b, n);
        int r;
        uint16_t hport = 0;
        if (p == COVE_PROTO_TLS) {
                c->proto = "tls";
                r = cove_sniff_tls_sni(b, n, c->name, sizeof(c->name));
        } else if (p == COVE_PROTO_HTTP) {
                c->proto = "http";
                r = cove_sniff_http_host(b, n, c->name, sizeof(c->name), &hport);
        } else {
                deny(gw, c, "neither TLS nor HTTP, and no address rule allows the destination");
                return;
        }
        if (r == 0) {
                if (n >= COVE_SNIFF_MAX)
                        deny(gw, c, "no name within the first 16 KiB");
                return;
        }
        if (r < 0) {
                c->name[0] = '\0';
                deny(gw, c,
                     p == COVE_PROTO_TLS
                         ? "malformed TLS ClientHello or invalid SNI"
                         : "malformed HTTP request head, several Host headers, invalid Host, "
                           "or an absolute URL that differs from Host");
                return;
        }
        if (!c->name[0]) {
                deny(gw, c,
                     p == COVE_PROTO_TLS ? "TLS ClientHello without SNI"
                                         : "HTTP request without Host");
                return;
        }
        if (hport && hport != c->dport) {
                deny(gw, c, "the Host port differs from the connection's port");
                return;
        }
        const char *rule;
        enum cove_verdict v =
            cove_policy_check(c->v.policy, c->name, ntohl(c->dst), c->dport, &rule);
        snprintf(c->rule, sizeof(c->rule), "%s", rule);
        if (v != COVE_ALLOW) {
                deny(gw, c, v == COVE_DENY ? "denied by the policy" : "not allowed by the policy");
                return;
        }
        /* an address rule allowed it outright; a name rule needs the DNS pin */
        int by_name = strchr(rule, '/') == NULL;
        if (by_name && !gw_pinned(gw, &c->v, c->name, c->dst)) {
                deny(gw, c,
                     "the destination address was not returned by this sandbox's own DNS query "
                     "for that name");
                return;
        }
        const struct cove_inject *inj[1];
        if (p == COVE_PROTO_TLS && gw->mitm &&
            cove_policy_injects_for(c->v.policy, c->name, wall_ms(), inj, 1) > 0)
                c->intercept = 1;
        start_connect(gw, c);
}

/* 0 ok (maybe nothing moved), -1 error */
static int do_read(int fd, struct xbuf *x, uint64_t *ctr)
{
        if (x->eof || x->off + x->len >= GW_BUF)
                return 0;
        ssize_t n = recv(fd, x->b + x->off + x->len, GW_BUF - x->off - x->len, MSG_DONTWAIT);
        if (n == 0) {
                x->eof = 1;
                return 0;
        }
        if (n < 0)
                return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
        x->len += (size_t)n;
        __atomic_fetch_add(ctr, (uint64_t)n, __ATOMIC_RELAXED);
        return 0;
}

static int do_write(int fd, struct xbuf *x)
{
        if (x->len) {
                ssize_t n = send(fd, x->b + x->off, x->len, MSG_DONTWAIT | MSG_NOSIGNAL);
                if (n < 0)
                        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
                x->off += (size_t)n;
                x->len -= (size_t)n;
                if (!x->len)
                        x->off = 0;
        }
        if (x->eof && !x->len && !x->shut) {
                shutdown(fd, SHUT_WR);
                x->shut = 1;
        }
        return 0;
}

/* One direction through its pipe: src → pipe → dst; EOF on src becomes shutdown(SHUT_WR)
 * on dst once the pipe is empty. A read shorter than asked ends the round (the socket is
 * most likely empty: epoll, level-triggered, reports it again if not), which spares the
 * EAGAIN splice a small message would otherwise cost per hop. -1 on an error. */
static int splice_dir(int src, int dst, int p[2], size_t *inpipe, struct xbuf *x, uint64_t *ctr)
{
        for (int round = 0; round < 16; round++) {
                int moved = 0, shortread = 0;
                if (!x->eof && !x->len && *inpipe < GW_PIPE) {
                        size_t want = GW_PIPE - *inpipe;
                        ssize_t n =
                            splice(src, NULL, p[1], NULL, want, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
                        if (n == 0) {
                                x->eof = 1;
                        } else if (n > 0) {
                                *inpipe += (size_t)n;
                                __atomic_fetch_add(ctr, (uint64_t)n, __ATOMIC_RELAXED);
                                moved = 1;
                                shortread = (size_t)n < want;
                        } else if (errno != EAGAIN && errno != EINTR) {
                                return -1;
                        }
                }
                if (*inpipe) {
                        ssize_t n = splice(p[0], NULL, dst, NULL, *inpipe,
                                           SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
                        if (n > 0) {
                                *inpipe -= (size_t)n;
                                moved = 1;
                        } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
                                return -1;
                        }
                }
                if (!moved || (shortread && !*inpipe))
                        break;
        }
        if (x->eof && !*inpipe && !x->len && !x->shut) {
                shutdown(dst, SHUT_WR);
                x->shut = 1;
        }
        return 0;
}

static void splice_begin(struct cove_gateway *gw, struct pconn *c)
{
        if (pipe_get(gw, c->pc) < 0)
                return;
        if (pipe_get(gw, c->pu) < 0)
                pipe_put(gw, c->pc); /* both or neither: the copy fallback */
}

/* Bytes of a connection in PC_SPLICE (pipes, or the copy fallback) after an event. */
static void pump(struct cove_gateway *gw, struct pconn *c, int up, uint32_t events)
{
        if (c->pc[0] >= 0) {
                /* only the directions this event can move (its fd's input on IN, the other
                 * direction's output on OUT): the other fd's readiness comes as an event of
                 * its own (level-triggered). ERR/HUP try both, so a dead socket is found by
                 * whichever splice touches it, and never reported again for nothing. */
                int both = (events & (EPOLLERR | EPOLLHUP)) != 0;
                int c2u = both || (events & (up ? EPOLLOUT : EPOLLIN));
                int u2c = both || (events & (up ? EPOLLIN : EPOLLOUT));
                /* the bytes read while deciding go first, by copy; then the pipes */
                int bad = c->c2u.len && do_write(c->ufd, &c->c2u) < 0;
                bad = bad || (c2u && splice_dir(c->cfd, c->ufd, c->pc, &c->nc, &c->c2u,
                                                &gw->st.bytes_up) < 0);
                bad = bad || (u2c && splice_dir(c->ufd, c->cfd, c->pu, &c->nu, &c->u2c,
                                                &gw->st.bytes_down) < 0);
                if (bad) {
                        pc_free(gw, c, 1);
                        return;
                }
                if (c->c2u.shut && c->u2c.shut) {
                        pc_free(gw, c, 0);
                        return;
                }
                update(gw, c);
                return;
        }
        int bad = 0;
        if (!up) {
                if (events & (EPOLLIN | EPOLLERR | EPOLLHUP))
                        bad |= do_read(c->cfd, &c->c2u, &gw->st.bytes_up) < 0 ||
                               do_write(c->ufd, &c->c2u) < 0;
                if (events & EPOLLOUT)
                        bad |= do_write(c->cfd, &c->u2c) < 0;
        } else {
                if (events & (EPOLLIN | EPOLLERR | EPOLLHUP))
                        bad |= do_read(c->ufd, &c->u2c, &gw->st.bytes_down) < 0 ||
                               do_write(c->cfd, &c->u2c) < 0;
                if (events & EPOLLOUT)
                        bad |= do_write(c->ufd, &c->c2u) < 0;
        }
        if (bad) {
                pc_free(gw, c, 1);
                return;
        }
        if (c->c2u.shut && c->u2c.shut) {
                pc_free(gw, c, 0);
                return;
        }
        update(gw, c);
}

/* The upstream connection is established: intercept, or splice. */
static void on_connected(struct cove_gateway *gw, struct pconn *c)
{
        if (c->intercept) {
                if (tls_begin(gw, c) < 0) {
                        pc_free(gw, c, 1);
                        return;
                }
                tls_pump(gw, c);
                return;
        }
        c->state = PC_SPLICE;
        /* the bytes read while deciding go first (by copy), before the pipes are made */
        if (c->c2u.len && do_write(c->ufd, &c->c2u) < 0) {
                pc_free(gw, c, 1);
                return;
        }
        splice_begin(gw, c);
        if (c->c2u.len || c->c2u.eof) /* the rest (or the EOF) of the peeked bytes */
                pump(gw, c, 1, EPOLLOUT);
        else /* nothing to move yet: both sides' next bytes come as events */
                update(gw, c);
}

void proxy_on_event(struct cove_gateway *gw, struct pconn *c, int up, uint32_t events)
{
        if (c->dead)
                return;
        if (c->state == PC_PEEK) {
                if (up) { /* the early connect failed (it is registered for errors only) */
                        early_drop(gw, c);
                        update(gw, c);
                        return;
                }
                if (do_read(c->cfd, &c->c2u, &gw->st.bytes_up) < 0 || (c->c2u.eof && !c->c2u.len)) {
                        deny(gw, c, "closed before announcing a name");
                        return;
                }
                if (c->c2u.len)
                        on_peek(gw, c);
                else if (c->c2u.eof)
                        deny(gw, c, "closed before announcing a name");
                return;
        }
        if (c->state == PC_CONNECTING) {
                if (!up) {
                        /* interest 0 still reports errors: a reset sandbox side ends it
                         * rather than wake us until the connect times out */
                        if (events & EPOLLERR)
                                pc_free(gw, c, 1);
                        return;
                }
                int e = 0;
                socklen_t el = sizeof(e);
                getsockopt(c->ufd, SOL_SOCKET, SO_ERROR, &e, &el);
                if (e) {
                        pc_free(gw, c, 1);
                        return;
                }
                on_connected(gw, c);
                return;
        }
        if (c->state == PC_TLS) {
                tls_pump(gw, c);
                return;
        }
        pump(gw, c, up, events);
}

void proxy_on_accept(struct cove_gateway *gw)
{
        for (int k = 0; k < 64; k++) {
                struct sockaddr_in src, dst;
                socklen_t sl = sizeof(src), dl = sizeof(dst);
                int fd = accept4(gw->proxy_fd, (struct sockaddr *)&src, &sl,
                                 SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0)
                        return;
                struct sbx_view v;
                if (gw_view(gw, src.sin_addr.s_addr, &v) < 0) {
                        close(fd); /* not from a sandbox link */
                        continue;
                }
                struct pconn *c = calloc(1, sizeof(*c));
                if (c)
                        c->c2u.b = malloc(GW_BUF);
                if (!c || !c->c2u.b || getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, &dst, &dl) < 0) {
                        if (c)
                                free(c->c2u.b);
                        free(c);
                        gw_view_release(&v);
                        close(fd);
                        continue;
                }
                c->cfd = fd; /* TCP_NODELAY inherited from the listener */
                c->ufd = -1;
                c->pc[0] = c->pc[1] = c->pu[0] = c->pu[1] = -1;
                c->gw = gw;
                c->v = v;
                c->dst = dst.sin_addr.s_addr;
                c->dport = ntohs(dst.sin_port);
                c->cev = (struct ev){EV_PROXY_CLIENT, c};
                c->next = gw->conns;
                if (gw->conns)
                        gw->conns->prev = c;
                gw->conns = c;
                __atomic_fetch_add(&gw->st.conns_open, 1, __ATOMIC_RELAXED);
                c->state = PC_PEEK;
                c->cmask = EPOLLIN;
                gw_epoll(gw, EPOLL_CTL_ADD, fd, EPOLLIN, &c->cev);
                c->deadline_ms = gw_now_ms() + GW_PEEK_MS;
                uint32_t h = ntohl(c->dst);
                /* the proxy's own address (the host end of a link) is in the link pool */
                if (gw_internal_addr(gw, h)) {
                        deny(gw, c, "node-internal address (loopback, link pool, multicast)");
                        continue;
                }
                const char *rule;
                enum cove_verdict vd = cove_policy_check_addr(c->v.policy, h, c->dport, &rule);
                snprintf(c->rule, sizeof(c->rule), "%s", rule);
                if (vd == COVE_DENY)
                        deny(gw, c, "denied by the policy");
                else if (vd == COVE_ALLOW)
                        start_connect(gw, c);
                else
                        early_connect(gw, c);
        }
}

void proxy_tick(struct cove_gateway *gw, int64_t now)
{
        struct pconn *next;
        for (struct pconn *c = gw->conns; c; c = next) {
                next = c->next;
                if (c->state == PC_PEEK && c->deadline_ms <= now)
                        deny(gw, c, "no TLS SNI or HTTP Host within 10 s");
                else if (c->state == PC_CONNECTING && c->deadline_ms <= now)
                        pc_free(gw, c, 1);
        }
}

void proxy_recheck(struct cove_gateway *gw)
{
        struct pconn *next;
        for (struct pconn *c = gw->conns; c; c = next) {
                next = c->next;
                pthread_mutex_lock(&gw->mu);
                struct slot *s = &gw->slots[c->v.slot];
                int gone = !s->used || !s->policy || strcmp(s->id, c->v.id) != 0;
                int changed = !gone && s->gen != c->v.gen;
                struct cove_policy *np = changed ? cove_policy_ref(s->policy) : NULL;
                uint64_t gen = s->gen;
                pthread_mutex_unlock(&gw->mu);
                if (gone) {
                        pc_free(gw, c, 1);
                        continue;
                }
                if (!changed)
                        continue;
                cove_policy_unref(c->v.policy);
                c->v.policy = np;
                c->v.gen = gen;
                if (c->state == PC_PEEK)
                        continue; /* decided later, under the new policy */
                const char *rule;
                enum cove_verdict v = cove_policy_check(np, c->name[0] ? c->name : NULL,
                                                        ntohl(c->dst), c->dport, &rule);
                if (v == COVE_ALLOW)
                        continue;
                snprintf(c->rule, sizeof(c->rule), "%s", rule);
                gw_audit(gw, &c->v, "egress", "close", "deny",
                         detail(c, "the new policy does not allow this connection"));
                gw_stat_add(gw, &gw->st.conns_closed_by_policy, 1);
                pc_free(gw, c, 1);
        }
}

void proxy_close_all(struct cove_gateway *gw)
{
        while (gw->conns)
                pc_free(gw, gw->conns, 1);
        proxy_pipes_free(gw);
}
