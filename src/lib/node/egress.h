/* The node's egress (docs/egress.md): the gateway of this node (net/gateway.h: sandbox
 * links, nftables, the DNS resolver, the egress proxy with credential injection), behind
 * the node interface. The control plane hands over policies (net/policy.h, the one policy
 * type both sides share, with the injection table the node must hold) and never reaches the
 * gateway itself. Calls on a NULL gateway (none on this host) do nothing, or say so. */
#ifndef COVE_NODE_EGRESS_H
#define COVE_NODE_EGRESS_H

#include <jansson.h>
#include <stdint.h>

#include "net/policy.h"
#include "node/node.h"
#include "util/err.h"
#include "util/log.h"

struct cove_gateway;

struct cove_node_egress_config {
        const struct cove_log *log;
        const char *data_dir;         /* the CA under <data_dir>/egress; one table per data dir */
        const char *pool;             /* "10.200.0.0/16" (NULL: that) */
        const char *const *upstreams; /* "IP" (NULL/0: the nameservers of /etc/resolv.conf) */
        int nupstreams;
        const char *const *statics; /* "name=IP" */
        int nstatics;
        int upstream_port;   /* 0: 53 */
        const char *ca_file; /* extra CA file upstreams of intercepted connections may chain to */
        /* Audit sink of the gateway thread (net/gateway.h cove_gateway_config.audit). */
        void (*audit)(void *arg, const char *tenant, const char *sandbox, const char *kind,
                      const char *action, const char *verdict, json_t *detail);
        void *arg;
};

/* Start the gateway: 0 with *gw, or 0 with *gw NULL and the reason in *why when this host
 * cannot run one; -1 BAD_REQUEST (err) for an option that does not parse. */
int cove_node_egress_open(const struct cove_node_egress_config *cfg, struct cove_gateway **gw,
                          struct cove_err *why, struct cove_err *err);
void cove_node_egress_close(struct cove_gateway *gw); /* NULL ok */

/* 1 when sandbox_id has a link (and *addr, may be NULL, its address), else 0. */
int cove_node_egress_attached(struct cove_gateway *gw, const char *sandbox_id, uint32_t *addr);
/* Give the running sandbox its link and policy (a reference is taken): *addr its address,
 * *resolver the address for its resolv.conf (host order). CONFLICT when it does not run. */
int cove_node_egress_attach(struct cove_gateway *gw, struct cove_node *node, const char *sandbox_id,
                            const char *tenant, struct cove_policy *p, uint32_t *addr,
                            uint32_t *resolver, struct cove_err *err);
/* Replace the policy of an attached sandbox (NOT_FOUND when it has no link). */
int cove_node_egress_set_policy(struct cove_gateway *gw, const char *sandbox_id,
                                struct cove_policy *p, struct cove_err *err);
/* Remove its link and connections; a no-op when not attached. */
void cove_node_egress_detach(struct cove_gateway *gw, const char *sandbox_id);
/* The node CA (PEM) a sandbox must trust for intercepted connections; NULL when none. */
const char *cove_node_egress_ca_pem(struct cove_gateway *gw);

#endif
