/* Shared insides of the gateway thread (gateway.c, dns.c, proxy.c); not a public header. */
#ifndef COVE_NET_INTERNAL_H
#define COVE_NET_INTERNAL_H

#include <netinet/in.h>
#include <pthread.h>

#include <openssl/ssl.h>

#include "net/dnsmsg.h"
#include "net/gateway.h"
#include "net/http1.h"
#include "net/mitm.h"
#include "net/nft.h"

#define GW_PINS_MAX 1024       /* pinned (name, address) pairs per sandbox */
#define GW_PIN_GRACE_MS 120000 /* a pin outlives its TTL by this much (client caches) */
#define GW_PENDING_MAX 1024    /* upstream DNS queries in flight */
#define GW_BUF 65536           /* proxy buffer per direction */
#define GW_PEEK_MS 10000       /* time to announce a name */
#define GW_CONNECT_MS 10000
#define GW_TLS_BUF (256 * 1024) /* intercepted: bound of each BIO and plaintext buffer */
#define GW_PIPE (256 * 1024)    /* spliced: pipe size per direction */
#define GW_PIPE_POOL 32         /* empty pipes kept for the next spliced connections */
/* The gateway thread's nice value. It is on the path of every byte of every sandbox: at the
 * default priority each of its wake-ups (two per proxied request) waits in the run queue
 * behind the node's other work (0.1-0.5 ms each at load 25 on two cores, /proc schedstat).
 * A raised nice, not a real-time class: it still shares the CPU (a flood through the proxy
 * takes at most this one thread), and SCHED_FIFO made the bench's latency worse (it
 * preempts the very clients it serves). The end-to-end gain measured on a shared 2-core box
 * is small and load-dependent (docs/egress.md, "Closer to the wire"). */
#define GW_NICE (-10)

enum ev_kind {
        EV_WAKE = 1,
        EV_DNS_UDP,
        EV_DNS_TCP_LISTEN,
        EV_DNS_TCP,
        EV_UPSTREAM,
        EV_PROXY_LISTEN,
        EV_PROXY_CLIENT,
        EV_PROXY_UP
};

struct ev {
        enum ev_kind kind;
        void *obj;
};

struct pin {
        char name[254];
        uint32_t ip;        /* network order */
        int64_t expires_ms; /* monotonic ms, grace included */
};

struct slot {
        int used;
        int foreign; /* its interface name is taken by someone else: skip */
        char id[64], tenant[64];
        char ifname[16];
        uint32_t host_ip, sb_ip; /* host order */
        struct cove_policy *policy;
        uint64_t gen; /* bumped on policy change and detach */
        struct pin *pins;
        int npins, pin_next;
};

/* What the gateway thread knows of a sandbox for one decision (a copy, taken under mu). */
struct sbx_view {
        int slot;
        uint64_t gen;
        char id[64], tenant[64];
        struct cove_policy *policy; /* referenced */
};

struct pending {
        int used;
        uint16_t up_id;
        int64_t deadline_ms;
        int tries;
        struct sbx_view v;
        struct sockaddr_in cli; /* UDP client; tcp non-NULL for TCP */
        struct dns_tcp *tcp;
        uint8_t qbuf[512]; /* the client's query (question echoed from it) */
        size_t qlen;
        char name[256];
};

struct dns_tcp {
        struct ev ev;
        int fd;
        uint8_t buf[2 + 4096];
        size_t len;
        int busy; /* a query of it is pending upstream */
        struct cove_gateway *gw;
        struct dns_tcp *next, *prev;
};

struct xbuf {
        uint8_t *b;
        size_t off, len;
        int eof;  /* read side saw EOF */
        int shut; /* write side shut down */
};

/* An intercepted connection (proxy.c): TLS terminated on both sides through memory BIOs,
 * so the gateway thread alone moves bytes between sockets and OpenSSL (never blocks). */
struct mitm_conn {
        SSL *cssl, *ussl; /* sandbox side (server role), upstream side (client role) */
        BIO *crb, *cwb, *urb, *uwb;
        int chs, uhs;               /* handshakes done */
        int ceof, ueof;             /* TCP EOF seen */
        int cdone, udone;           /* TLS close_notify seen */
        int closing;                /* a refusal is being flushed to the sandbox; then close */
        struct cove_bytes c2u, u2c; /* plaintext waiting for SSL_write */
        struct cove_h1 h1;
};

struct pconn {
        struct ev cev, uev;
        int cfd, ufd;
        enum { PC_PEEK, PC_CONNECTING, PC_SPLICE, PC_TLS } state;
        struct cove_gateway *gw;
        int dead;      /* closed; freed after the current epoll batch */
        int intercept; /* a bound secret applies: terminate TLS (PC_TLS after connect) */
        /* upstream connect started at accept, before the decision (nothing is sent on it
         * until then; a refusal resets it): 1 in progress, 2 established */
        int early;
        struct mitm_conn *m;
        struct sbx_view v;
        uint32_t dst;   /* network order */
        uint16_t dport; /* host order */
        char name[254];
        const char *proto;
        char rule[COVE_POLICY_PATTERN_MAX];
        struct xbuf c2u, u2c;
        /* PC_SPLICE through pipes (splice(2): bytes never enter user space); -1 when the
         * pipes could not be made (then c2u/u2c copy) */
        int pc[2], pu[2];
        size_t nc, nu;         /* bytes sitting in each pipe */
        uint32_t cmask, umask; /* epoll interest registered */
        int64_t deadline_ms;
        struct pconn *next, *prev;
};

struct cove_gateway {
        struct cove_gateway_config cfg;
        struct cove_gateway_static *statics;
        pthread_mutex_t mu; /* slots (incl. pins), stats */
        struct slot *slots;
        int nslots, hint;
        struct cove_nft *nft;
        struct cove_mitm *mitm; /* TLS interception (NULL: never intercept) */
        char ifprefix[9];       /* "cv" + 6 characters of the table name: link names per coved */
        int dns_udp, dns_tcp, proxy_fd, up_fd, epfd, wake_fd;
        uint16_t dns_port, proxy_port;
        struct ev ev_wake, ev_dns_udp, ev_dns_tcp, ev_up, ev_proxy;
        pthread_t thread;
        int started, quit;
        uint64_t epoch, seen_epoch; /* policy/attach changes (under mu) */
        struct pending pending[GW_PENDING_MAX];
        struct pconn *conns;
        struct pconn *dead;         /* closed connections, freed after each epoll batch */
        int pipes[GW_PIPE_POOL][2]; /* empty pipes (sized GW_PIPE) of closed connections */
        int npipes;
        struct dns_tcp *dtcp;
        struct cove_gateway_stats st;
};

int64_t gw_now_ms(void);
/* Look up the sandbox whose link address is ip (network order): 0 and v filled (policy
 * referenced: release with gw_view_release), -1 when none. */
int gw_view(struct cove_gateway *gw, uint32_t ip, struct sbx_view *v);
void gw_view_release(struct sbx_view *v);
/* Loopback, 0/8, the link pool, multicast, reserved: never reachable. */
int gw_internal_addr(struct cove_gateway *gw, uint32_t ip_host);
void gw_audit(struct cove_gateway *gw, const struct sbx_view *v, const char *kind,
              const char *action, const char *verdict, json_t *detail);
void gw_pin(struct cove_gateway *gw, const struct sbx_view *v, const char *name,
            const uint32_t *ips, int n, uint32_t ttl);
int gw_pinned(struct cove_gateway *gw, const struct sbx_view *v, const char *name, uint32_t ip);
/* 1 when a name this sandbox's own DNS query pinned to ip (network order) is allowed by a
 * name rule of its policy on port: a connection to ip:port may then be allowed once it
 * announces that name (the proxy starts the upstream connect early). */
int gw_pinned_allowed(struct cove_gateway *gw, const struct sbx_view *v, uint32_t ip,
                      uint16_t port);
int gw_epoll(struct cove_gateway *gw, int op, int fd, uint32_t events, struct ev *ev);
/* Unregister fd from the gateway's epoll set, then close it (no-op for fd < 0). */
void gw_close(struct cove_gateway *gw, int fd);
void gw_stat_add(struct cove_gateway *gw, uint64_t *field, uint64_t v);

/* dns.c */
void dns_on_udp(struct cove_gateway *gw);
void dns_on_tcp_accept(struct cove_gateway *gw);
void dns_on_tcp(struct cove_gateway *gw, struct dns_tcp *t, uint32_t events);
void dns_on_upstream(struct cove_gateway *gw);
void dns_tick(struct cove_gateway *gw, int64_t now);
void dns_close_all(struct cove_gateway *gw);

/* proxy.c */
void proxy_on_accept(struct cove_gateway *gw);
void proxy_on_event(struct cove_gateway *gw, struct pconn *c, int up, uint32_t events);
void proxy_tick(struct cove_gateway *gw, int64_t now);
void proxy_recheck(struct cove_gateway *gw);
void proxy_close_all(struct cove_gateway *gw);
void proxy_reap(struct cove_gateway *gw); /* free the connections closed in this batch */

#endif
