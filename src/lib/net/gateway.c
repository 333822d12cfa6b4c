/* Egress gateway: sandbox slots, links, rules and the event thread; see gateway.h. The
 * resolver lives in dns.c and the proxy in proxy.c; both run only on the gateway thread,
 * which alone owns connections and pending queries. Slots (policy, pins) are shared with
 * API threads under mu. */
#include "net/internal.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "net/link.h"

int64_t gw_now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int cove_gateway_parse_ip(const char *s, uint32_t *ip)
{
        struct in_addr a;
        if (inet_pton(AF_INET, s, &a) != 1)
                return -1;
        *ip = ntohl(a.s_addr);
        return 0;
}

int cove_gateway_parse_static(const char *s, struct cove_gateway_static *out)
{
        const char *eq = strchr(s, '=');
        if (!eq || eq == s || (size_t)(eq - s) >= sizeof(out->name))
                return -1;
        char name[254];
        memcpy(name, s, (size_t)(eq - s));
        name[eq - s] = '\0';
        if (cove_name_normalise(name, out->name, sizeof(out->name)) < 0)
                return -1;
        return cove_gateway_parse_ip(eq + 1, &out->ip);
}

int cove_gateway_resolv_conf(const char *path, uint32_t *out, int max)
{
        FILE *f = fopen(path, "re");
        if (!f)
                return 0;
        char line[512];
        int n = 0;
        while (n < max && fgets(line, sizeof(line), f)) {
                char a[64];
                if (sscanf(line, " nameserver %63s", a) == 1 &&
                    cove_gateway_parse_ip(a, &out[n]) == 0)
                        n++;
        }
        fclose(f);
        return n;
}

int gw_epoll(struct cove_gateway *gw, int op, int fd, uint32_t events, struct ev *ev)
{
        struct epoll_event e = {.events = events, .data.ptr = ev};
        return epoll_ctl(gw->epfd, op, fd, &e);
}

void gw_close(struct cove_gateway *gw, int fd)
{
        if (fd < 0)
                return;
        /* close() alone leaves the registration while another reference to the file exists
         * (a child forked by another thread holds copies of every fd until its exec): its
         * events would then name a freed connection */
        epoll_ctl(gw->epfd, EPOLL_CTL_DEL, fd, NULL);
        close(fd);
}

void gw_stat_add(struct cove_gateway *gw, uint64_t *field, uint64_t v)
{
        pthread_mutex_lock(&gw->mu);
        *field += v;
        pthread_mutex_unlock(&gw->mu);
}

int gw_internal_addr(struct cove_gateway *gw, uint32_t ip)
{
        uint32_t pm = gw->cfg.pool_bits ? 0xffffffffu << (32 - gw->cfg.pool_bits) : 0;
        return (ip >> 24) == 127 || (ip >> 24) == 0 || (ip & pm) == gw->cfg.pool_net ||
               (ip >> 28) >= 0xe;
}

int gw_view(struct cove_gateway *gw, uint32_t ip_net, struct sbx_view *v)
{
        uint32_t ip = ntohl(ip_net);
        uint32_t off = ip - gw->cfg.pool_net;
        if (ip < gw->cfg.pool_net || off / 4 >= (uint32_t)gw->nslots)
                return -1;
        int i = (int)(off / 4);
        int r = -1;
        pthread_mutex_lock(&gw->mu);
        struct slot *s = &gw->slots[i];
        if (s->used && s->id[0] && s->policy && s->sb_ip == ip) {
                v->slot = i;
                v->gen = s->gen;
                snprintf(v->id, sizeof(v->id), "%s", s->id);
                snprintf(v->tenant, sizeof(v->tenant), "%s", s->tenant);
                v->policy = cove_policy_ref(s->policy);
                r = 0;
        }
        pthread_mutex_unlock(&gw->mu);
        return r;
}

void gw_view_release(struct sbx_view *v)
{
        cove_policy_unref(v->policy);
        v->policy = NULL;
}

void gw_audit(struct cove_gateway *gw, const struct sbx_view *v, const char *kind,
              const char *action, const char *verdict, json_t *detail)
{
        if (gw->cfg.audit)
                gw->cfg.audit(gw->cfg.arg, v->tenant, v->id, kind, action, verdict, detail);
        else
                json_decref(detail);
}

void gw_pin(struct cove_gateway *gw, const struct sbx_view *v, const char *name,
            const uint32_t *ips, int n, uint32_t ttl)
{
        int64_t exp = gw_now_ms() + (int64_t)ttl * 1000 + GW_PIN_GRACE_MS;
        pthread_mutex_lock(&gw->mu);
        struct slot *s = &gw->slots[v->slot];
        if (s->used && s->gen == v->gen && !strcmp(s->id, v->id)) {
                for (int k = 0; k < n; k++) {
                        struct pin *p = NULL;
                        for (int i = 0; i < s->npins && !p; i++)
                                if (s->pins[i].ip == ips[k] && !strcmp(s->pins[i].name, name))
                                        p = &s->pins[i];
                        if (!p) {
                                if (s->npins < GW_PINS_MAX) {
                                        p = &s->pins[s->npins++];
                                } else { /* full: replace round-robin (oldest first) */
                                        p = &s->pins[s->pin_next];
                                        s->pin_next = (s->pin_next + 1) % GW_PINS_MAX;
                                }
                                snprintf(p->name, sizeof(p->name), "%s", name);
                                p->ip = ips[k];
                        }
                        if (exp > p->expires_ms)
                                p->expires_ms = exp;
                }
        }
        pthread_mutex_unlock(&gw->mu);
}

int gw_pinned(struct cove_gateway *gw, const struct sbx_view *v, const char *name, uint32_t ip)
{
        int64_t now = gw_now_ms();
        int r = 0;
        pthread_mutex_lock(&gw->mu);
        struct slot *s = &gw->slots[v->slot];
        if (s->used && !strcmp(s->id, v->id))
                for (int i = 0; i < s->npins && !r; i++)
                        r = s->pins[i].ip == ip && s->pins[i].expires_ms > now &&
                            !strcmp(s->pins[i].name, name);
        pthread_mutex_unlock(&gw->mu);
        return r;
}

int gw_pinned_allowed(struct cove_gateway *gw, const struct sbx_view *v, uint32_t ip, uint16_t port)
{
        enum { MAXN = 8 }; /* names checked per address: enough for an early connect */
        char names[MAXN][254];
        int n = 0;
        int64_t now = gw_now_ms();
        pthread_mutex_lock(&gw->mu);
        struct slot *s = &gw->slots[v->slot];
        if (s->used && !strcmp(s->id, v->id))
                for (int i = 0; i < s->npins && n < MAXN; i++)
                        if (s->pins[i].ip == ip && s->pins[i].expires_ms > now)
                                snprintf(names[n++], sizeof(names[0]), "%s", s->pins[i].name);
        pthread_mutex_unlock(&gw->mu);
        for (int i = 0; i < n; i++) {
                const char *rule;
                if (cove_policy_check(v->policy, names[i], ntohl(ip), port, &rule) == COVE_ALLOW &&
                    !strchr(rule, '/'))
                        return 1;
        }
        return 0;
}

static void wake(struct cove_gateway *gw)
{
        uint64_t one = 1;
        ssize_t w = write(gw->wake_fd, &one, sizeof(one));
        (void)w;
}

static void *gw_main(void *arg)
{
        struct cove_gateway *gw = arg;
        /* this thread's own priority (a nice value applies per thread on Linux): see GW_NICE */
        if (setpriority(PRIO_PROCESS, (id_t)gettid(), GW_NICE) < 0)
                cove_warn(gw->cfg.log, "egress.priority",
                          "egress gateway thread left at the default priority (nice %d refused: "
                          "%s): proxied connections wait longer on a busy node",
                          GW_NICE, strerror(errno));
        struct epoll_event evs[128];
        int64_t last_tick = gw_now_ms();
        while (!__atomic_load_n(&gw->quit, __ATOMIC_ACQUIRE)) {
                int n = epoll_wait(gw->epfd, evs, 128, 250);
                for (int i = 0; i < n; i++) {
                        struct ev *e = evs[i].data.ptr;
                        switch (e->kind) {
                        case EV_WAKE: {
                                uint64_t x;
                                ssize_t r = read(gw->wake_fd, &x, sizeof(x));
                                (void)r;
                                break;
                        }
                        case EV_DNS_UDP:
                                dns_on_udp(gw);
                                break;
                        case EV_DNS_TCP_LISTEN:
                                dns_on_tcp_accept(gw);
                                break;
                        case EV_DNS_TCP:
                                dns_on_tcp(gw, e->obj, evs[i].events);
                                break;
                        case EV_UPSTREAM:
                                dns_on_upstream(gw);
                                break;
                        case EV_PROXY_LISTEN:
                                proxy_on_accept(gw);
                                break;
                        case EV_PROXY_CLIENT:
                        case EV_PROXY_UP:
                                proxy_on_event(gw, e->obj, e->kind == EV_PROXY_UP, evs[i].events);
                                break;
                        }
                }
                proxy_reap(gw);
                pthread_mutex_lock(&gw->mu);
                int changed = gw->epoch != gw->seen_epoch;
                gw->seen_epoch = gw->epoch;
                pthread_mutex_unlock(&gw->mu);
                if (changed)
                        proxy_recheck(gw);
                int64_t now = gw_now_ms();
                if (now - last_tick >= 200) {
                        last_tick = now;
                        dns_tick(gw, now);
                        proxy_tick(gw, now);
                }
                proxy_reap(gw);
        }
        proxy_close_all(gw);
        proxy_reap(gw);
        dns_close_all(gw);
        return NULL;
}

static int listen_on(int type, uint16_t *port, struct cove_err *err)
{
        int fd = socket(AF_INET, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return cove_err_set(err, errno, "socket");
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        /* any address: redirected packets arrive addressed to the host end of their own
         * link; anyone else (host processes) is refused by source address */
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(*port)};
        socklen_t al = sizeof(a);
        if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 ||
            (type == SOCK_STREAM && listen(fd, 4096) < 0) ||
            getsockname(fd, (struct sockaddr *)&a, &al) < 0) {
                int e = errno;
                close(fd);
                return cove_err_set(err, e, "listen");
        }
        *port = ntohs(a.sin_port);
        return fd;
}

struct cove_gateway *cove_gateway_new(const struct cove_gateway_config *cfg, struct cove_err *err)
{
        struct cove_gateway *gw = calloc(1, sizeof(*gw));
        if (!gw) {
                cove_err_set(err, ENOMEM, "gateway");
                return NULL;
        }
        gw->cfg = *cfg;
        gw->cfg.table = NULL; /* the caller's string; only cove_nft_open below reads it */
        size_t tl = strlen(cfg->table);
        snprintf(gw->ifprefix, sizeof(gw->ifprefix), "cv%.6s", cfg->table + (tl > 6 ? tl - 6 : 0));
        gw->dns_udp = gw->dns_tcp = gw->proxy_fd = gw->up_fd = gw->epfd = gw->wake_fd = -1;
        pthread_mutex_init(&gw->mu, NULL);
        if (!gw->cfg.pool_bits) {
                gw->cfg.pool_net = 0x0ac80000; /* 10.200.0.0/16 */
                gw->cfg.pool_bits = 16;
        }
        if (!gw->cfg.upstream_port)
                gw->cfg.upstream_port = 53;
        if (gw->cfg.pool_bits < 8 || gw->cfg.pool_bits > 28) {
                cove_err_set(err, 0, "egress pool must be a /8 to /28");
                goto fail;
        }
        gw->nslots = (int)((1u << (32 - gw->cfg.pool_bits)) / 4);
        if (gw->nslots > 16384)
                gw->nslots = 16384;
        gw->slots = calloc((size_t)gw->nslots, sizeof(*gw->slots));
        gw->statics = calloc((size_t)(cfg->nstatics + 1), sizeof(*gw->statics));
        if (!gw->slots || !gw->statics) {
                cove_err_set(err, ENOMEM, "gateway slots");
                goto fail;
        }
        if (cfg->nstatics)
                memcpy(gw->statics, cfg->statics, (size_t)cfg->nstatics * sizeof(*gw->statics));
        gw->cfg.statics = gw->statics;
        /* one port for UDP and TCP (the redirect rules name one): a free UDP port may be
         * taken for TCP by someone else on a busy host, so try a few */
        for (int tries = 0; gw->dns_tcp < 0; tries++) {
                gw->dns_port = 0;
                if ((gw->dns_udp = listen_on(SOCK_DGRAM, &gw->dns_port, err)) < 0)
                        goto fail;
                uint16_t p = gw->dns_port;
                if ((gw->dns_tcp = listen_on(SOCK_STREAM, &p, err)) >= 0)
                        break;
                close(gw->dns_udp);
                gw->dns_udp = -1;
                if (err->errnum != EADDRINUSE || tries == 31)
                        goto fail;
        }
        if ((gw->proxy_fd = listen_on(SOCK_STREAM, &gw->proxy_port, err)) < 0)
                goto fail;
        int one = 1; /* inherited by every accepted connection: one setsockopt, not one each */
        setsockopt(gw->proxy_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        gw->up_fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        gw->epfd = epoll_create1(EPOLL_CLOEXEC);
        gw->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (gw->up_fd < 0 || gw->epfd < 0 || gw->wake_fd < 0) {
                cove_err_set(err, errno, "gateway sockets");
                goto fail;
        }
        gw->ev_wake = (struct ev){EV_WAKE, NULL};
        gw->ev_dns_udp = (struct ev){EV_DNS_UDP, NULL};
        gw->ev_dns_tcp = (struct ev){EV_DNS_TCP_LISTEN, NULL};
        gw->ev_up = (struct ev){EV_UPSTREAM, NULL};
        gw->ev_proxy = (struct ev){EV_PROXY_LISTEN, NULL};
        gw_epoll(gw, EPOLL_CTL_ADD, gw->wake_fd, EPOLLIN, &gw->ev_wake);
        gw_epoll(gw, EPOLL_CTL_ADD, gw->dns_udp, EPOLLIN, &gw->ev_dns_udp);
        gw_epoll(gw, EPOLL_CTL_ADD, gw->dns_tcp, EPOLLIN, &gw->ev_dns_tcp);
        gw_epoll(gw, EPOLL_CTL_ADD, gw->up_fd, EPOLLIN, &gw->ev_up);
        gw_epoll(gw, EPOLL_CTL_ADD, gw->proxy_fd, EPOLLIN, &gw->ev_proxy);
        if (cfg->mitm_dir) {
                gw->mitm = cove_mitm_open(cfg->mitm_dir, cfg->upstream_ca_file, err);
                if (!gw->mitm)
                        goto fail;
        }
        gw->cfg.mitm_dir = gw->cfg.upstream_ca_file = NULL; /* the caller's strings */
        gw->nft = cove_nft_open(cfg->table, gw->dns_port, gw->proxy_port, err);
        if (!gw->nft)
                goto fail;
        int e = pthread_create(&gw->thread, NULL, gw_main, gw);
        if (e) {
                cove_err_set(err, e, "gateway thread");
                goto fail;
        }
        pthread_setname_np(gw->thread, "cove-egress"); /* top -H, perf -t: find the data path */
        gw->started = 1;
        cove_info(cfg->log, "egress.start",
                  "egress gateway: resolver port %u, proxy port %u, %d upstream resolvers, "
                  "%d static names, nftables table inet %s",
                  gw->dns_port, gw->proxy_port, cfg->nupstreams, cfg->nstatics, cfg->table);
        return gw;
fail:
        cove_gateway_free(gw);
        return NULL;
}

void cove_gateway_free(struct cove_gateway *gw)
{
        if (!gw)
                return;
        if (gw->started) {
                __atomic_store_n(&gw->quit, 1, __ATOMIC_RELEASE);
                wake(gw);
                pthread_join(gw->thread, NULL);
        }
        for (int i = 0; gw->slots && i < gw->nslots; i++) {
                struct slot *s = &gw->slots[i];
                if (!s->used)
                        continue;
                struct cove_err e;
                cove_link_detach(s->ifname, &e);
                cove_policy_unref(s->policy);
                free(s->pins);
        }
        cove_nft_close(gw->nft);
        cove_mitm_free(gw->mitm);
        int fds[] = {gw->dns_udp, gw->dns_tcp, gw->proxy_fd, gw->up_fd, gw->epfd, gw->wake_fd};
        for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
                if (fds[i] >= 0)
                        close(fds[i]);
        free(gw->slots);
        free(gw->statics);
        pthread_mutex_destroy(&gw->mu);
        free(gw);
}

int cove_gateway_attach(struct cove_gateway *gw, const char *sandbox_id, const char *tenant,
                        pid_t pid, struct cove_policy *policy, uint32_t *sandbox_ip,
                        uint32_t *resolver, struct cove_err *err)
{
        struct pin *pins = calloc(GW_PINS_MAX, sizeof(*pins));
        if (!pins)
                return cove_err_set(err, ENOMEM, "egress pins");
        for (int attempt = 0; attempt < 64; attempt++) {
                pthread_mutex_lock(&gw->mu);
                int i = -1;
                for (int k = 0; k < gw->nslots; k++) {
                        int j = (gw->hint + k) % gw->nslots;
                        if (!gw->slots[j].used && !gw->slots[j].foreign) {
                                i = j;
                                break;
                        }
                }
                if (i < 0) {
                        pthread_mutex_unlock(&gw->mu);
                        free(pins);
                        return cove_err_setk(err, COVE_E_LIMIT, 0,
                                             "egress: no free link address in the node pool");
                }
                struct slot *s = &gw->slots[i];
                s->used = 1; /* reserved; s->id stays "" so nobody matches it yet */
                s->id[0] = '\0';
                s->host_ip = gw->cfg.pool_net + (uint32_t)i * 4 + 1;
                s->sb_ip = s->host_ip + 1;
                /* prefix per coved + slot: two coveds on one host (tests, helpers) never share
                 * a link name (at most 8 + 5 characters) */
                snprintf(s->ifname, sizeof(s->ifname), "%s%d", gw->ifprefix, i);
                gw->hint = (i + 1) % gw->nslots;
                char ifname[16];
                snprintf(ifname, sizeof(ifname), "%s", s->ifname);
                uint32_t hip = s->host_ip, sip = s->sb_ip;
                pthread_mutex_unlock(&gw->mu);

                int r = cove_link_attach(ifname, pid, hip, sip, 30, err);
                if (r == 0 && cove_nft_add(gw->nft, ifname, sip, err) < 0) {
                        struct cove_err e2;
                        cove_link_detach(ifname, &e2);
                        r = -1;
                }
                pthread_mutex_lock(&gw->mu);
                if (r < 0) {
                        s->used = 0;
                        if (err->errnum == EEXIST) /* another coved's link: skip that slot */
                                s->foreign = 1;
                        pthread_mutex_unlock(&gw->mu);
                        if (err->errnum == EEXIST)
                                continue;
                        free(pins);
                        return cove_err_wrap(err, "egress link of %s", sandbox_id);
                }
                snprintf(s->id, sizeof(s->id), "%s", sandbox_id);
                snprintf(s->tenant, sizeof(s->tenant), "%s", tenant);
                s->policy = cove_policy_ref(policy);
                s->pins = pins;
                s->npins = s->pin_next = 0;
                s->gen++;
                gw->epoch++;
                pthread_mutex_unlock(&gw->mu);
                *sandbox_ip = sip;
                *resolver = hip;
                return 0;
        }
        free(pins);
        return cove_err_setk(err, COVE_E_LIMIT, 0,
                             "egress: 64 link names in a row are taken by other processes");
}

static struct slot *find_locked(struct cove_gateway *gw, const char *id)
{
        for (int i = 0; i < gw->nslots; i++)
                if (gw->slots[i].used && !strcmp(gw->slots[i].id, id))
                        return &gw->slots[i];
        return NULL;
}

int cove_gateway_set_policy(struct cove_gateway *gw, const char *sandbox_id,
                            struct cove_policy *policy, struct cove_err *err)
{
        pthread_mutex_lock(&gw->mu);
        struct slot *s = find_locked(gw, sandbox_id);
        if (!s) {
                pthread_mutex_unlock(&gw->mu);
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "sandbox %s has no egress link",
                                     sandbox_id);
        }
        struct cove_policy *old = s->policy;
        s->policy = cove_policy_ref(policy);
        s->gen++;
        gw->epoch++;
        pthread_mutex_unlock(&gw->mu);
        cove_policy_unref(old);
        wake(gw);
        return 0;
}

int cove_gateway_attached(struct cove_gateway *gw, const char *sandbox_id, uint32_t *sandbox_ip)
{
        pthread_mutex_lock(&gw->mu);
        struct slot *s = find_locked(gw, sandbox_id);
        if (s && sandbox_ip)
                *sandbox_ip = s->sb_ip;
        pthread_mutex_unlock(&gw->mu);
        return s != NULL;
}

void cove_gateway_detach(struct cove_gateway *gw, const char *sandbox_id)
{
        pthread_mutex_lock(&gw->mu);
        struct slot *s = find_locked(gw, sandbox_id);
        if (!s) {
                pthread_mutex_unlock(&gw->mu);
                return;
        }
        char ifname[16];
        snprintf(ifname, sizeof(ifname), "%s", s->ifname);
        uint32_t sip = s->sb_ip;
        struct cove_policy *old = s->policy;
        struct pin *pins = s->pins;
        s->policy = NULL;
        s->pins = NULL;
        s->id[0] = '\0';
        s->gen++;
        gw->epoch++;
        /* the slot stays reserved until the link and rules are gone */
        pthread_mutex_unlock(&gw->mu);
        wake(gw);
        struct cove_err e;
        if (cove_nft_del(gw->nft, ifname, sip, &e) < 0)
                cove_warn(gw->cfg.log, "egress.detach", "%s: %s", sandbox_id, e.msg);
        if (cove_link_detach(ifname, &e) < 0)
                cove_warn(gw->cfg.log, "egress.detach", "%s: %s", sandbox_id, e.msg);
        cove_policy_unref(old);
        free(pins);
        pthread_mutex_lock(&gw->mu);
        s->used = 0;
        pthread_mutex_unlock(&gw->mu);
}

const char *cove_gateway_ca_pem(struct cove_gateway *gw)
{
        return gw && gw->mitm ? cove_mitm_ca_pem(gw->mitm) : NULL;
}

void cove_gateway_stats(struct cove_gateway *gw, struct cove_gateway_stats *st)
{
        pthread_mutex_lock(&gw->mu);
        *st = gw->st;
        pthread_mutex_unlock(&gw->mu);
}
