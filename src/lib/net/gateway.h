/* The node's egress gateway (docs/architecture.md, trust rules 1-3): sandbox links (link.h) under
 * one nftables table (nft.h), the DNS resolver and the egress proxy, all served by one event thread
 * (epoll, non-blocking; many connections per thread).
 *   - A sandbox with a policy gets a veth pair and a /30 of the node pool. Its DNS queries
 *     (any resolver address, UDP or TCP 53) reach the resolver, its TCP connections (any
 *     address, any port) the proxy; nothing else leaves it.
 *   - Resolver: answers only names the policy can allow (NXDOMAIN otherwise, audited),
 *     from static entries or the upstream resolvers; drops answers that point at special
 *     ranges (policy.h) unless an allow address rule names them (rebinding); pins each name
 *     → addresses it returned to *this* sandbox, for the answer's TTL (+ a grace period).
 *   - Proxy: original destination from SO_ORIGINAL_DST; address rules decide at once
 *     (server-speaks-first protocols work); otherwise the TLS SNI or HTTP Host is read
 *     (nothing is forwarded before), the name is checked against the policy (deny first),
 *     the destination must be pinned for that name for this sandbox (no connecting to one
 *     name's address while announcing another: no fronting by address), then bytes are
 *     copied both ways with bounded buffers and correct half-closes.
 *   - A TLS connection to a name that a secret of the sandbox's policy (or lease) is bound
 *     to is intercepted instead (net/mitm.h, net/http1.h): TLS terminated with a leaf of
 *     the node CA, each HTTP/1.1 request checked (Host = SNI) and given the credential,
 *     re-encrypted to the upstream, whose certificate must verify; every injection and
 *     refusal is audited (secret names only).
 *   - Every proxy verdict and every DNS refusal goes to the audit callback.
 *   - A policy can be replaced live: open connections it no longer allows are closed.
 * Node-internal addresses (loopback, 0/8, the link pool, multicast) are never reachable,
 * whatever the policy says. */
#ifndef COVE_NET_GATEWAY_H
#define COVE_NET_GATEWAY_H

#include <jansson.h>
#include <stdint.h>
#include <sys/types.h>

#include "net/policy.h"
#include "util/err.h"
#include "util/log.h"

#define COVE_GW_MAX_UPSTREAMS 4
#define COVE_GW_MAX_STATIC 256

struct cove_gateway;

struct cove_gateway_static {
        char name[254];
        uint32_t ip; /* host order */
};

struct cove_gateway_config {
        const struct cove_log *log;
        const char *table; /* nftables table name (unique per coved data dir) */
        uint32_t pool_net; /* link pool, host order (default 10.200.0.0) */
        int pool_bits;     /* its prefix length (default 16); one /30 per sandbox */
        uint32_t upstreams[COVE_GW_MAX_UPSTREAMS]; /* resolvers, host order */
        int nupstreams;
        uint16_t upstream_port;                    /* 53; tests may use another */
        const struct cove_gateway_static *statics; /* copied */
        int nstatics;
        /* Audit sink, called from the gateway thread (must not block): kind "egress" or
         * "dns", action "connect" / "close" / "query", verdict "allow" / "deny"; detail is
         * handed over (the callee owns the reference). */
        void (*audit)(void *arg, const char *tenant, const char *sandbox, const char *kind,
                      const char *action, const char *verdict, json_t *detail);
        void *arg;
        /* TLS interception (net/mitm.h): the CA's directory (NULL: no interception, bound
         * secrets are never injected) and an extra CA file upstreams may chain to. */
        const char *mitm_dir;
        const char *upstream_ca_file;
};

/* Start the resolver, proxy and rules. NULL with err when this host cannot (no nftables,
 * no netlink permission). */
struct cove_gateway *cove_gateway_new(const struct cove_gateway_config *cfg, struct cove_err *err);
/* Detaches every sandbox, closes every connection, deletes the table. */
void cove_gateway_free(struct cove_gateway *gw);

/* Give the running sandbox (its init is host pid `pid`) a link and the policy (a reference
 * is taken). *resolver gets the address to write into its resolv.conf (host order). */
int cove_gateway_attach(struct cove_gateway *gw, const char *sandbox_id, const char *tenant,
                        pid_t pid, struct cove_policy *policy, uint32_t *sandbox_ip,
                        uint32_t *resolver, struct cove_err *err);
/* Replace the policy; connections it does not allow are closed (asynchronously, before
 * the gateway thread handles anything else). -1 NOT_FOUND when the sandbox is not attached. */
int cove_gateway_set_policy(struct cove_gateway *gw, const char *sandbox_id,
                            struct cove_policy *policy, struct cove_err *err);
/* Remove the link, rules, pins and connections of a sandbox; a no-op when not attached. */
void cove_gateway_detach(struct cove_gateway *gw, const char *sandbox_id);
/* 1 when attached (and *sandbox_ip filled), else 0. */
int cove_gateway_attached(struct cove_gateway *gw, const char *sandbox_id, uint32_t *sandbox_ip);

struct cove_gateway_stats {
        uint64_t conns_allowed, conns_denied, conns_closed_by_policy, conns_open;
        uint64_t dns_answers, dns_refused, bytes_up, bytes_down;
};
void cove_gateway_stats(struct cove_gateway *gw, struct cove_gateway_stats *st);

/* The node CA (PEM) sandboxes must trust for intercepted connections; NULL when
 * interception is off. */
const char *cove_gateway_ca_pem(struct cove_gateway *gw);

/* Parse "IP" and "name=IP" command-line values; 0 or -1. */
int cove_gateway_parse_ip(const char *s, uint32_t *ip);
int cove_gateway_parse_static(const char *s, struct cove_gateway_static *out);
/* nameserver lines (IPv4) of a resolv.conf; returns how many (≤ max). */
int cove_gateway_resolv_conf(const char *path, uint32_t *out, int max);

#endif
