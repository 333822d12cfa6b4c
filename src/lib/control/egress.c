/* Egress glue between the control plane, the node gateway and the audit log; see egress.h. */
#include "control/egress.h"

#include <arpa/inet.h>
#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control/audit.h"
#include "control/coved.h"
#include "net/gateway.h"
#include "util/util.h"

static void audit_sink(void *arg, const char *tenant, const char *sandbox, const char *kind,
                       const char *action, const char *verdict, json_t *detail)
{
        struct coved *d = arg;
        cove_audit_log(d->audit, tenant, sandbox, kind, action, verdict, detail);
}

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

int coved_egress_open(struct coved *d, const struct coved_egress_options *o, struct cove_err *err)
{
        d->audit = cove_audit_open(d->cat_ops, d->cat, &d->log, err);
        if (!d->audit)
                return cove_err_wrap(err, "audit log");
        struct cove_gateway_config gc = {.log = &d->log, .audit = audit_sink, .arg = d};
        if (o && o->pool && parse_pool(o->pool, &gc.pool_net, &gc.pool_bits) < 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "--egress-pool %s: want an IPv4 CIDR from /8 to /28", o->pool);
        for (int i = 0; o && i < o->nupstreams && gc.nupstreams < COVE_GW_MAX_UPSTREAMS; i++)
                if (cove_gateway_parse_ip(o->upstreams[i], &gc.upstreams[gc.nupstreams++]) < 0)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "--dns-upstream %s is not an IPv4 address",
                                             o->upstreams[i]);
        if (!gc.nupstreams)
                gc.nupstreams = cove_gateway_resolv_conf("/etc/resolv.conf", gc.upstreams,
                                                         COVE_GW_MAX_UPSTREAMS);
        gc.upstream_port = o && o->upstream_port ? (uint16_t)o->upstream_port : 53;
        struct cove_gateway_static st[COVE_GW_MAX_STATIC];
        for (int i = 0; o && i < o->nstatics && gc.nstatics < COVE_GW_MAX_STATIC; i++)
                if (cove_gateway_parse_static(o->statics[i], &st[gc.nstatics++]) < 0)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "--dns-static %s: want NAME=IPv4", o->statics[i]);
        gc.statics = st;
        /* one table per data dir: a restart after a crash replaces the crashed one's */
        unsigned char md[32];
        unsigned mdl;
        EVP_Digest(d->data_dir, strlen(d->data_dir), md, &mdl, EVP_sha256(), NULL);
        char hex[65], table[32];
        cove_hex(md, 32, hex);
        snprintf(table, sizeof(table), "cove_%.12s", hex);
        gc.table = table;
        struct cove_err e2;
        d->gw = cove_gateway_new(&gc, &e2);
        if (!d->gw)
                cove_warn(&d->log, "egress",
                          "egress gateway unavailable (sandboxes asking for "
                          "egress will be refused): %s",
                          e2.msg);
        return 0;
}

void coved_egress_close(struct coved *d)
{
        cove_gateway_free(d->gw);
        d->gw = NULL;
        cove_audit_close(d->audit);
        d->audit = NULL;
}

int coved_egress_validate(json_t *egress, struct cove_err *err)
{
        struct cove_policy *p = cove_policy_parse(egress, err);
        if (!p)
                return -1;
        cove_policy_unref(p);
        return 0;
}

static int write_resolv(struct coved *d, const char *id, uint32_t resolver, struct cove_err *err)
{
        struct cove_chan *c = cove_node_chan(d->node, id);
        if (!c)
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "sandbox %s is not running", id);
        char text[128];
        struct in_addr a = {.s_addr = htonl(resolver)};
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &a, ip, sizeof(ip));
        int n = snprintf(text, sizeof(text),
                         "# written by cove: the node resolver (answers what the egress policy "
                         "allows)\nnameserver %s\n",
                         ip);
        struct cove_xfer *x = NULL;
        json_t *entry = NULL;
        int r = cove_chan_write_begin(c, "/etc/resolv.conf", 0644, NULL, &x, err);
        if (r == 0)
                r = cove_chan_xfer_write(x, text, (size_t)n, err);
        if (r == 0)
                r = cove_chan_write_finish(x, &entry, err);
        json_decref(entry);
        cove_chan_xfer_free(x);
        cove_chan_unref(c);
        return r < 0 ? cove_err_wrap(err, "write /etc/resolv.conf") : 0;
}

static int attach_policy(struct coved *d, const char *tenant, const char *id, struct cove_policy *p,
                         uint32_t *addr, struct cove_err *err)
{
        if (!d->gw)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "egress is not available on this node (the gateway did not "
                                     "start: see coved's log)");
        if (cove_gateway_attached(d->gw, id, addr))
                return cove_gateway_set_policy(d->gw, id, p, err);
        pid_t pid = cove_node_pid(d->node, id);
        if (pid <= 0)
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "sandbox %s is not running", id);
        uint32_t resolver;
        if (cove_gateway_attach(d->gw, id, tenant, pid, p, addr, &resolver, err) < 0)
                return -1;
        if (write_resolv(d, id, resolver, err) < 0) {
                cove_gateway_detach(d->gw, id);
                return -1;
        }
        return 0;
}

int coved_egress_attach(struct coved *d, const char *tenant, const char *id, json_t *egress,
                        struct cove_err *err)
{
        struct cove_policy *p = cove_policy_parse(egress, err);
        if (!p)
                return -1;
        json_t *norm = cove_policy_json(p);
        char *text = json_dumps(norm, JSON_COMPACT);
        json_decref(norm);
        uint32_t addr;
        int r = text ? d->cat_ops->egress_put(d->cat, id, tenant, text, err)
                     : cove_err_set(err, ENOMEM, "egress");
        if (r == 0)
                r = attach_policy(d, tenant, id, p, &addr, err);
        free(text);
        cove_policy_unref(p);
        return r;
}

static json_t *answer(struct cove_policy *p, int attached, uint32_t addr)
{
        char ip[INET_ADDRSTRLEN] = "";
        struct in_addr a = {.s_addr = htonl(addr)};
        if (attached)
                inet_ntop(AF_INET, &a, ip, sizeof(ip));
        return json_pack("{s:o, s:o}", "egress", cove_policy_json(p), "address",
                         attached ? json_string(ip) : json_null());
}

int coved_egress_put(struct coved *d, const char *tenant, const char *id, json_t *body,
                     json_t **out, struct cove_err *err)
{
        struct cove_sandbox_row row;
        if (cove_sandbox_load(d, tenant, id, &row, err) < 0)
                return -1;
        int running = strcmp(row.state, "running") == 0;
        cove_sandbox_row_clear(&row);
        json_t *pj = json_object_get(body, "egress") ? json_object_get(body, "egress") : body;
        struct cove_policy *p = cove_policy_parse(pj, err);
        if (!p)
                return -1;
        json_t *norm = cove_policy_json(p);
        char *text = json_dumps(norm, JSON_COMPACT);
        json_decref(norm);
        uint32_t addr = 0;
        int r = text ? d->cat_ops->egress_put(d->cat, id, tenant, text, err)
                     : cove_err_set(err, ENOMEM, "egress");
        free(text);
        if (r == 0 && running)
                r = attach_policy(d, tenant, id, p, &addr, err);
        if (r == 0) {
                cove_audit_log(d->audit, tenant, id, "control", "egress.update", "",
                               json_pack("{s:o}", "egress", cove_policy_json(p)));
                *out = answer(p, running, addr);
        }
        cove_policy_unref(p);
        return r;
}

int coved_egress_get(struct coved *d, const char *tenant, const char *id, json_t **out,
                     struct cove_err *err)
{
        struct cove_sandbox_row row;
        if (cove_sandbox_load(d, tenant, id, &row, err) < 0)
                return -1;
        cove_sandbox_row_clear(&row);
        char *text = NULL;
        int r = d->cat_ops->egress_get(d->cat, id, &text, err);
        if (r < 0)
                return -1;
        json_error_t je;
        json_t *j = r == 0 ? json_loads(text, 0, &je) : NULL;
        free(text);
        struct cove_policy *p = cove_policy_parse(j, err);
        json_decref(j);
        if (!p)
                return -1;
        uint32_t addr = 0;
        int att = d->gw && cove_gateway_attached(d->gw, id, &addr);
        *out = answer(p, att, addr);
        cove_policy_unref(p);
        return 0;
}

void coved_egress_on_stop(void *arg, const char *id)
{
        struct coved *d = arg;
        if (d->gw)
                cove_gateway_detach(d->gw, id);
}

void coved_egress_forget(struct coved *d, const char *id)
{
        struct cove_err e;
        if (d->cat_ops->egress_delete(d->cat, id, &e) < 0)
                cove_warn(&d->log, "egress", "forget policy of %s: %s", id, e.msg);
}
