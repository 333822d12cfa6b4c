/* The node's egress gateway behind the node interface (node/egress.h). */
#include "node/egress.h"

#include <limits.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/gateway.h"
#include "util/util.h"

static int parse_pool(const char *s, uint32_t *net, int *bits)
{
        char buf[32];
        snprintf(buf, sizeof(buf), "%s", s);
        char *slash = strchr(buf, '/');
        if (!slash)
                return -1;
        *slash = '\0';
        *bits = atoi(slash + 1);
        if (cove_gateway_parse_ip(buf, net) < 0 || *bits < 8 || *bits > 28)
                return -1;
        uint32_t m = 0xffffffffu << (32 - *bits);
        return (*net & ~m) ? -1 : 0;
}

int cove_node_egress_open(const struct cove_node_egress_config *o, struct cove_gateway **gw,
                          struct cove_err *why, struct cove_err *err)
{
        *gw = NULL;
        char mitm_dir[PATH_MAX];
        snprintf(mitm_dir, sizeof(mitm_dir), "%s/egress", o->data_dir);
        struct cove_gateway_config gc = {.log = o->log,
                                         .audit = o->audit,
                                         .arg = o->arg,
                                         .mitm_dir = mitm_dir,
                                         .upstream_ca_file = o->ca_file};
        if (o->pool && parse_pool(o->pool, &gc.pool_net, &gc.pool_bits) < 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "--egress-pool %s: want an IPv4 CIDR from /8 to /28", o->pool);
        for (int i = 0; i < o->nupstreams && gc.nupstreams < COVE_GW_MAX_UPSTREAMS; i++)
                if (cove_gateway_parse_ip(o->upstreams[i], &gc.upstreams[gc.nupstreams++]) < 0)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "--dns-upstream %s is not an IPv4 address",
                                             o->upstreams[i]);
        if (!gc.nupstreams)
                gc.nupstreams = cove_gateway_resolv_conf("/etc/resolv.conf", gc.upstreams,
                                                         COVE_GW_MAX_UPSTREAMS);
        gc.upstream_port = o->upstream_port ? (uint16_t)o->upstream_port : 53;
        struct cove_gateway_static st[COVE_GW_MAX_STATIC];
        for (int i = 0; i < o->nstatics && gc.nstatics < COVE_GW_MAX_STATIC; i++)
                if (cove_gateway_parse_static(o->statics[i], &st[gc.nstatics++]) < 0)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "--dns-static %s: want NAME=IPv4", o->statics[i]);
        gc.statics = st;
        /* one table per data dir: a restart after a crash replaces the crashed one's */
        unsigned char md[32];
        unsigned mdl;
        EVP_Digest(o->data_dir, strlen(o->data_dir), md, &mdl, EVP_sha256(), NULL);
        char hex[65], table[32];
        cove_hex(md, 32, hex);
        snprintf(table, sizeof(table), "cove_%.12s", hex);
        gc.table = table;
        *gw = cove_gateway_new(&gc, why);
        return 0;
}

void cove_node_egress_close(struct cove_gateway *gw)
{
        cove_gateway_free(gw);
}

int cove_node_egress_attached(struct cove_gateway *gw, const char *sandbox_id, uint32_t *addr)
{
        return gw && cove_gateway_attached(gw, sandbox_id, addr);
}

int cove_node_egress_attach(struct cove_gateway *gw, struct cove_node *node, const char *sandbox_id,
                            const char *tenant, struct cove_policy *p, uint32_t *addr,
                            uint32_t *resolver, struct cove_err *err)
{
        if (!gw)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "egress is not available on this node (the gateway did not "
                                     "start: see coved's log)");
        pid_t pid = cove_node_pid(node, sandbox_id);
        if (pid <= 0)
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "sandbox %s is not running",
                                     sandbox_id);
        return cove_gateway_attach(gw, sandbox_id, tenant, pid, p, addr, resolver, err);
}

int cove_node_egress_set_policy(struct cove_gateway *gw, const char *sandbox_id,
                                struct cove_policy *p, struct cove_err *err)
{
        if (!gw)
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "sandbox %s has no egress link",
                                     sandbox_id);
        return cove_gateway_set_policy(gw, sandbox_id, p, err);
}

void cove_node_egress_detach(struct cove_gateway *gw, const char *sandbox_id)
{
        if (gw)
                cove_gateway_detach(gw, sandbox_id);
}

const char *cove_node_egress_ca_pem(struct cove_gateway *gw)
{
        return gw ? cove_gateway_ca_pem(gw) : NULL;
}
