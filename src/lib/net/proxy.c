/* The egress proxy (gateway thread only); see gateway.h. A connection goes
 * PEEK (read what it announces; nothing forwarded) → CONNECTING → SPLICE (copy both ways
 * through two bounded buffers; EOF on one side becomes shutdown(SHUT_WR) on the other once
 * its buffer is flushed; the connection ends when both directions are shut, or at once on
 * an error). Interest sets are recomputed after every event (level-triggered epoll). */
#include "net/internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter_ipv4.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/sniff.h"

static void pc_free(struct cove_gateway *gw, struct pconn *c, int reset)
{
        if (reset) { /* an abortive close tells both ends at once */
                struct linger l = {1, 0};
                setsockopt(c->cfd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
                if (c->ufd >= 0)
                        setsockopt(c->ufd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
        }
        close(c->cfd);
        if (c->ufd >= 0)
                close(c->ufd);
        if (c->prev)
                c->prev->next = c->next;
        else
                gw->conns = c->next;
        if (c->next)
                c->next->prev = c->prev;
        gw_view_release(&c->v);
        free(c->c2u.b);
        free(c->u2c.b);
        free(c);
        __atomic_fetch_sub(&gw->st.conns_open, 1, __ATOMIC_RELAXED);
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
                cm = EPOLLIN;
        } else if (c->state == PC_CONNECTING) {
                um = EPOLLOUT;
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

static void start_connect(struct cove_gateway *gw, struct pconn *c)
{
        gw_audit(gw, &c->v, "egress", "connect", "allow", detail(c, NULL));
        gw_stat_add(gw, &gw->st.conns_allowed, 1);
        c->u2c.b = malloc(GW_BUF);
        c->ufd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (!c->u2c.b || c->ufd < 0) {
                pc_free(gw, c, 1);
                return;
        }
        int one = 1;
        setsockopt(c->ufd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        struct sockaddr_in a = {
            .sin_family = AF_INET, .sin_port = htons(c->dport), .sin_addr.s_addr = c->dst};
        if (connect(c->ufd, (struct sockaddr *)&a, sizeof(a)) < 0 && errno != EINPROGRESS) {
                pc_free(gw, c, 1);
                return;
        }
        c->state = PC_CONNECTING;
        c->deadline_ms = gw_now_ms() + GW_CONNECT_MS;
        c->uev = (struct ev){EV_PROXY_UP, c};
        c->umask = EPOLLOUT;
        gw_epoll(gw, EPOLL_CTL_ADD, c->ufd, EPOLLOUT, &c->uev);
        update(gw, c);
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

void proxy_on_event(struct cove_gateway *gw, struct pconn *c, int up, uint32_t events)
{
        if (c->state == PC_PEEK) {
                if (up)
                        return;
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
                if (!up)
                        return;
                int e = 0;
                socklen_t el = sizeof(e);
                getsockopt(c->ufd, SOL_SOCKET, SO_ERROR, &e, &el);
                if (e) {
                        pc_free(gw, c, 1);
                        return;
                }
                c->state = PC_SPLICE;
                events = EPOLLOUT; /* flush what the client sent while we decided */
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

void proxy_on_accept(struct cove_gateway *gw)
{
        for (int k = 0; k < 64; k++) {
                struct sockaddr_in src, dst, local;
                socklen_t sl = sizeof(src), dl = sizeof(dst), ll = sizeof(local);
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
                if (!c || !c->c2u.b || getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, &dst, &dl) < 0 ||
                    getsockname(fd, (struct sockaddr *)&local, &ll) < 0) {
                        if (c)
                                free(c->c2u.b);
                        free(c);
                        gw_view_release(&v);
                        close(fd);
                        continue;
                }
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
                c->cfd = fd;
                c->ufd = -1;
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
                if ((c->dst == local.sin_addr.s_addr && c->dport == gw->proxy_port) ||
                    gw_internal_addr(gw, h)) {
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
}
