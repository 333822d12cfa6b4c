/* The node resolver (gateway thread only); see gateway.h. Every answer is built here from
 * the addresses we accept: nothing an upstream sends reaches a sandbox verbatim. Only A
 * queries are resolved; AAAA and other types of an allowed name get an empty answer
 * (sandboxes have no IPv6), names the policy cannot allow get NXDOMAIN and an audit event. */
#include "net/internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/util.h"

#define STATIC_TTL 60
#define UPSTREAM_TIMEOUT_MS 2000
#define UPSTREAM_TRIES 2

static void addr_str(uint32_t ip_net, char *out)
{
        struct in_addr a = {.s_addr = ip_net};
        inet_ntop(AF_INET, &a, out, INET_ADDRSTRLEN);
}

static void tcp_close(struct cove_gateway *gw, struct dns_tcp *t)
{
        for (int i = 0; i < GW_PENDING_MAX; i++)
                if (gw->pending[i].used && gw->pending[i].tcp == t)
                        gw->pending[i].tcp = NULL; /* its answer is dropped */
        gw_close(gw, t->fd);
        if (t->prev)
                t->prev->next = t->next;
        else
                gw->dtcp = t->next;
        if (t->next)
                t->next->prev = t->prev;
        free(t);
}

/* Send an answer to a UDP client or a TCP connection. */
static void reply(struct cove_gateway *gw, const struct sockaddr_in *cli, struct dns_tcp *t,
                  const uint8_t *msg, long len)
{
        if (len < 0)
                return;
        if (!t) {
                /* over UDP, an answer larger than 512 bytes would need EDNS or TC: ours are
                 * at most 12 + question + 16 × 16 bytes */
                sendto(gw->dns_udp, msg, (size_t)len, MSG_DONTWAIT, (const struct sockaddr *)cli,
                       sizeof(*cli));
                return;
        }
        uint8_t out[2 + 1024];
        if (len > 1024)
                return;
        out[0] = (uint8_t)(len >> 8);
        out[1] = (uint8_t)len;
        memcpy(out + 2, msg, (size_t)len);
        ssize_t w = send(t->fd, out, (size_t)len + 2, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (t->busy) {
                t->busy = 0;
                gw_epoll(gw, EPOLL_CTL_MOD, t->fd, EPOLLIN, &t->ev);
        }
        if (w != len + 2)
                tcp_close(gw, t); /* a client that does not read its answers is dropped */
}

static void answer(struct cove_gateway *gw, const struct sockaddr_in *cli, struct dns_tcp *t,
                   const struct cove_dns_query *q, int rcode, const uint32_t *a, int n,
                   uint32_t ttl)
{
        uint8_t out[1024];
        long len = cove_dns_build_answer(q, rcode, a, n, ttl, out, sizeof(out));
        reply(gw, cli, t, out, len);
        gw_stat_add(gw, rcode == COVE_DNS_RCODE_NOERROR ? &gw->st.dns_answers : &gw->st.dns_refused,
                    1);
}

static void refuse(struct cove_gateway *gw, const struct sbx_view *v, const char *name, int qtype,
                   const char *reason, const char *rule)
{
        gw_audit(gw, v, "dns", "query", "deny",
                 json_pack("{s:s, s:i, s:s, s:s}", "name", name, "qtype", qtype, "reason", reason,
                           "rule", rule ? rule : ""));
}

/* Keep the addresses the policy lets this sandbox see; the rest are rebinding attempts. */
static int filter_addrs(struct cove_gateway *gw, const struct sbx_view *v, uint32_t *a, int n,
                        char *dropped, size_t cap)
{
        int k = 0;
        dropped[0] = '\0';
        for (int i = 0; i < n; i++) {
                uint32_t h = ntohl(a[i]);
                int ok = !gw_internal_addr(gw, h) &&
                         (!cove_addr_is_special(h) || cove_policy_names_addr(v->policy, h));
                if (ok) {
                        a[k++] = a[i];
                } else if (!dropped[0]) {
                        addr_str(a[i], dropped);
                }
        }
        (void)cap;
        return k;
}

/* Answer with addresses resolved for q (static or upstream): filter, pin, reply. */
static void resolved(struct cove_gateway *gw, const struct sbx_view *v,
                     const struct sockaddr_in *cli, struct dns_tcp *t,
                     const struct cove_dns_query *q, int rcode, uint32_t *a, int n, uint32_t ttl)
{
        if (rcode != COVE_DNS_RCODE_NOERROR) {
                answer(gw, cli, t, q, rcode, NULL, 0, 0);
                return;
        }
        char dropped[INET_ADDRSTRLEN];
        int had = n;
        n = filter_addrs(gw, v, a, n, dropped, sizeof(dropped));
        if (had && !n) {
                char why[128];
                snprintf(why, sizeof(why),
                         "rebinding: the answer %s is a private, loopback, link-local or "
                         "metadata address the policy does not name",
                         dropped);
                refuse(gw, v, q->name, q->qtype, why, NULL);
                answer(gw, cli, t, q, COVE_DNS_RCODE_NXDOMAIN, NULL, 0, 0);
                return;
        }
        if (ttl < 5)
                ttl = 5;
        if (ttl > 3600)
                ttl = 3600;
        gw_pin(gw, v, q->name, a, n, ttl);
        answer(gw, cli, t, q, COVE_DNS_RCODE_NOERROR, a, n, ttl);
}

static void forward(struct cove_gateway *gw, struct sbx_view *v, const struct sockaddr_in *cli,
                    struct dns_tcp *t, const uint8_t *qbuf, size_t qlen,
                    const struct cove_dns_query *q)
{
        int i;
        for (i = 0; i < GW_PENDING_MAX && gw->pending[i].used; i++)
                ;
        if (i == GW_PENDING_MAX || qlen > sizeof(gw->pending[0].qbuf) || !gw->cfg.nupstreams) {
                answer(gw, cli, t, q, COVE_DNS_RCODE_SERVFAIL, NULL, 0, 0);
                return;
        }
        struct pending *p = &gw->pending[i];
        memset(p, 0, sizeof(*p));
        uint16_t rnd = 0;
        cove_random(&rnd, sizeof(rnd), NULL);
        /* low 10 bits: the slot; high 6 bits random, so a stale answer rarely matches */
        p->up_id = (uint16_t)((rnd & 0xfc00u) | (unsigned)i);
        p->used = 1;
        p->v = *v;
        v->policy = NULL; /* the reference moves into p */
        if (cli)
                p->cli = *cli;
        p->tcp = t;
        if (t) { /* stop reading it (level-triggered) until its answer is out */
                t->busy = 1;
                gw_epoll(gw, EPOLL_CTL_MOD, t->fd, 0, &t->ev);
        }
        memcpy(p->qbuf, qbuf, qlen);
        p->qlen = qlen;
        snprintf(p->name, sizeof(p->name), "%s", q->name);
        p->deadline_ms = gw_now_ms() + UPSTREAM_TIMEOUT_MS;
        uint8_t msg[512];
        long len = cove_dns_build_query(p->up_id, p->name, msg, sizeof(msg));
        struct sockaddr_in up = {.sin_family = AF_INET,
                                 .sin_port = htons(gw->cfg.upstream_port),
                                 .sin_addr.s_addr = htonl(gw->cfg.upstreams[0])};
        if (len > 0)
                sendto(gw->up_fd, msg, (size_t)len, MSG_DONTWAIT, (struct sockaddr *)&up,
                       sizeof(up));
}

static void pending_free(struct pending *p)
{
        gw_view_release(&p->v);
        p->used = 0;
}

static void handle_query(struct cove_gateway *gw, const struct sockaddr_in *cli, struct dns_tcp *t,
                         uint32_t src_net, const uint8_t *buf, size_t len)
{
        struct sbx_view v;
        if (gw_view(gw, src_net, &v) < 0)
                return; /* not a sandbox of ours: no answer at all */
        struct cove_dns_query q;
        if (cove_dns_parse_query(buf, len, &q) < 0) {
                if (len >= 12) { /* FORMERR with the id, no question */
                        uint8_t out[12] = {buf[0], buf[1], 0x80, 0x81};
                        reply(gw, cli, t, out, 12);
                }
                gw_view_release(&v);
                return;
        }
        const char *rule = "";
        enum cove_verdict vd = q.qclass == 1 && q.name[0]
                                   ? cove_policy_check_dns(v.policy, q.name, &rule)
                                   : COVE_NOMATCH;
        if (vd != COVE_ALLOW) {
                refuse(gw, &v, q.name[0] ? q.name : ".", q.qtype,
                       vd == COVE_DENY ? "denied by the policy" : "not allowed by the policy",
                       rule);
                answer(gw, cli, t, &q, COVE_DNS_RCODE_NXDOMAIN, NULL, 0, 0);
                gw_view_release(&v);
                return;
        }
        if (q.qtype != COVE_DNS_TYPE_A) { /* no IPv6, no other types: empty answer */
                answer(gw, cli, t, &q, COVE_DNS_RCODE_NOERROR, NULL, 0, 0);
                gw_view_release(&v);
                return;
        }
        uint32_t a[COVE_DNS_MAX_ADDRS];
        int n = 0;
        for (int i = 0; i < gw->cfg.nstatics && n < COVE_DNS_MAX_ADDRS; i++)
                if (!strcmp(gw->statics[i].name, q.name))
                        a[n++] = htonl(gw->statics[i].ip);
        if (n) {
                resolved(gw, &v, cli, t, &q, COVE_DNS_RCODE_NOERROR, a, n, STATIC_TTL);
                gw_view_release(&v);
                return;
        }
        forward(gw, &v, cli, t, buf, len, &q);
        gw_view_release(&v);
}

void dns_on_udp(struct cove_gateway *gw)
{
        for (int k = 0; k < 64; k++) {
                uint8_t buf[1500];
                struct sockaddr_in cli;
                socklen_t cl = sizeof(cli);
                ssize_t n = recvfrom(gw->dns_udp, buf, sizeof(buf), MSG_DONTWAIT,
                                     (struct sockaddr *)&cli, &cl);
                if (n < 0)
                        return;
                if (cl != sizeof(cli) || cli.sin_family != AF_INET)
                        continue;
                handle_query(gw, &cli, NULL, cli.sin_addr.s_addr, buf, (size_t)n);
        }
}

void dns_on_tcp_accept(struct cove_gateway *gw)
{
        for (int k = 0; k < 64; k++) {
                struct sockaddr_in a;
                socklen_t al = sizeof(a);
                int fd =
                    accept4(gw->dns_tcp, (struct sockaddr *)&a, &al, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0)
                        return;
                struct sbx_view v;
                if (gw_view(gw, a.sin_addr.s_addr, &v) < 0) {
                        close(fd);
                        continue;
                }
                gw_view_release(&v);
                struct dns_tcp *t = calloc(1, sizeof(*t));
                if (!t) {
                        close(fd);
                        continue;
                }
                t->fd = fd;
                t->gw = gw;
                t->ev = (struct ev){EV_DNS_TCP, t};
                t->next = gw->dtcp;
                if (gw->dtcp)
                        gw->dtcp->prev = t;
                gw->dtcp = t;
                gw_epoll(gw, EPOLL_CTL_ADD, fd, EPOLLIN, &t->ev);
        }
}

void dns_on_tcp(struct cove_gateway *gw, struct dns_tcp *t, uint32_t events)
{
        if (t->busy) /* one query at a time per connection; the rest waits in the socket */
                return;
        ssize_t n = recv(t->fd, t->buf + t->len, sizeof(t->buf) - t->len, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN)) {
                tcp_close(gw, t);
                return;
        }
        if (n < 0)
                return;
        t->len += (size_t)n;
        while (t->len >= 2 && !t->busy) {
                size_t ml = (size_t)t->buf[0] << 8 | t->buf[1];
                if (ml < 12 || ml > sizeof(t->buf) - 2) {
                        tcp_close(gw, t);
                        return;
                }
                if (t->len < ml + 2)
                        return;
                struct sockaddr_in a;
                socklen_t al = sizeof(a);
                getpeername(t->fd, (struct sockaddr *)&a, &al);
                uint8_t msg[4096];
                memcpy(msg, t->buf + 2, ml);
                memmove(t->buf, t->buf + 2 + ml, t->len - ml - 2);
                t->len -= ml + 2;
                /* reply() may close t: only touch it again when it is still listed */
                struct dns_tcp *keep = t;
                handle_query(gw, NULL, t, a.sin_addr.s_addr, msg, ml);
                int alive = 0;
                for (struct dns_tcp *x = gw->dtcp; x; x = x->next)
                        alive |= x == keep;
                if (!alive)
                        return;
        }
}

void dns_on_upstream(struct cove_gateway *gw)
{
        for (int k = 0; k < 64; k++) {
                uint8_t buf[4096];
                struct sockaddr_in from;
                socklen_t fl = sizeof(from);
                ssize_t n = recvfrom(gw->up_fd, buf, sizeof(buf), MSG_DONTWAIT,
                                     (struct sockaddr *)&from, &fl);
                if (n < 0)
                        return;
                if (n < 12)
                        continue;
                int ok_src = 0;
                for (int i = 0; i < gw->cfg.nupstreams; i++)
                        ok_src |= from.sin_addr.s_addr == htonl(gw->cfg.upstreams[i]) &&
                                  from.sin_port == htons(gw->cfg.upstream_port);
                uint16_t id = (uint16_t)(buf[0] << 8 | buf[1]);
                struct pending *p = &gw->pending[id & 0x3ff];
                if (!ok_src || !p->used || p->up_id != id)
                        continue;
                int rcode;
                uint32_t a[COVE_DNS_MAX_ADDRS], ttl;
                int na;
                if (cove_dns_parse_answer(buf, (size_t)n, id, p->name, &rcode, a, &na, &ttl) < 0)
                        continue; /* not an answer to our question: keep waiting */
                struct cove_dns_query q;
                if (cove_dns_parse_query(p->qbuf, p->qlen, &q) == 0 && (p->tcp || p->cli.sin_port))
                        resolved(gw, &p->v, p->tcp ? NULL : &p->cli, p->tcp, &q,
                                 rcode == COVE_DNS_RCODE_NXDOMAIN ? rcode
                                 : rcode                          ? COVE_DNS_RCODE_SERVFAIL
                                                                  : COVE_DNS_RCODE_NOERROR,
                                 a, na, ttl);
                pending_free(p);
        }
}

void dns_tick(struct cove_gateway *gw, int64_t now)
{
        for (int i = 0; i < GW_PENDING_MAX; i++) {
                struct pending *p = &gw->pending[i];
                if (!p->used || p->deadline_ms > now)
                        continue;
                if (++p->tries < UPSTREAM_TRIES && gw->cfg.nupstreams) {
                        /* try the next upstream resolver */
                        uint8_t msg[512];
                        long len = cove_dns_build_query(p->up_id, p->name, msg, sizeof(msg));
                        int u = p->tries % gw->cfg.nupstreams;
                        struct sockaddr_in up = {.sin_family = AF_INET,
                                                 .sin_port = htons(gw->cfg.upstream_port),
                                                 .sin_addr.s_addr = htonl(gw->cfg.upstreams[u])};
                        if (len > 0)
                                sendto(gw->up_fd, msg, (size_t)len, MSG_DONTWAIT,
                                       (struct sockaddr *)&up, sizeof(up));
                        p->deadline_ms = now + UPSTREAM_TIMEOUT_MS;
                        continue;
                }
                struct cove_dns_query q;
                if (cove_dns_parse_query(p->qbuf, p->qlen, &q) == 0 && (p->tcp || p->cli.sin_port))
                        answer(gw, p->tcp ? NULL : &p->cli, p->tcp, &q, COVE_DNS_RCODE_SERVFAIL,
                               NULL, 0, 0);
                pending_free(p);
        }
}

void dns_close_all(struct cove_gateway *gw)
{
        for (int i = 0; i < GW_PENDING_MAX; i++)
                if (gw->pending[i].used)
                        pending_free(&gw->pending[i]);
        while (gw->dtcp)
                tcp_close(gw, gw->dtcp);
}
