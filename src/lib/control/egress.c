/* Egress glue between the control plane, the node gateway and the audit log; see egress.h. */
#include "control/egress.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control/audit.h"
#include "control/cluster.h"
#include "control/coved.h"
#include "control/secrets.h"
#include "node/egress.h"
#include "util/util.h"

static void audit_sink(void *arg, const char *tenant, const char *sandbox, const char *kind,
                       const char *action, const char *verdict, json_t *detail)
{
        struct coved *d = arg;
        cove_audit_log(d->audit, tenant, sandbox, kind, action, verdict, detail);
}

int coved_egress_open(struct coved *d, const struct coved_egress_options *o, struct cove_err *err)
{
        d->audit = cove_audit_open(d->cat_ops, d->cat, &d->log, err);
        if (!d->audit)
                return cove_err_wrap(err, "audit log");
        struct cove_node_egress_config gc = {
            .log = &d->log, .data_dir = d->data_dir, .audit = audit_sink, .arg = d};
        if (o) {
                gc.pool = o->pool;
                gc.upstreams = o->upstreams;
                gc.nupstreams = o->nupstreams;
                gc.statics = o->statics;
                gc.nstatics = o->nstatics;
                gc.upstream_port = o->upstream_port;
                gc.ca_file = o->ca_file;
        }
        struct cove_err e2;
        if (cove_node_egress_open(&gc, &d->gw, &e2, err) < 0)
                return -1;
        if (!d->gw)
                cove_warn(&d->log, "egress",
                          "egress gateway unavailable (sandboxes asking for "
                          "egress will be refused): %s",
                          e2.msg);
        return 0;
}

void coved_egress_close(struct coved *d)
{
        cove_node_egress_close(d->gw);
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

/* 1 attached now (a fresh link), 0 the policy of an existing link replaced, -1 error */
static int attach_policy(struct coved *d, const char *tenant, const char *id, struct cove_policy *p,
                         uint32_t *addr, struct cove_err *err)
{
        if (cove_node_egress_attached(d->gw, id, addr))
                return cove_node_egress_set_policy(d->gw, id, p, err);
        uint32_t resolver;
        if (cove_node_egress_attach(d->gw, d->node, id, tenant, p, addr, &resolver, err) < 0)
                return -1;
        if (write_resolv(d, id, resolver, err) < 0) {
                cove_node_egress_detach(d->gw, id);
                return -1;
        }
        return 1;
}

#define CA_BUNDLE "/etc/ssl/certs/ca-certificates.crt"
#define CA_FILE "/etc/ssl/certs/cove-egress-ca.pem"
#define CA_BUNDLE_MAX (8 << 20)

static int put_file(struct cove_chan *c, const char *path, const void *data, size_t n,
                    struct cove_err *err)
{
        struct cove_xfer *x = NULL;
        json_t *entry = NULL;
        int r = cove_chan_write_begin(c, path, 0644, NULL, &x, err);
        if (r == 0 && n)
                r = cove_chan_xfer_write(x, data, n, err);
        if (r == 0)
                r = cove_chan_write_finish(x, &entry, err);
        json_decref(entry);
        cove_chan_xfer_free(x);
        return r;
}

/* The node CA into the sandbox's trust: appended to its CA bundle (once) and as a file of
 * its own (NODE_EXTRA_CA_CERTS). */
static int install_ca(struct coved *d, const char *id, struct cove_err *err)
{
        const char *pem = cove_node_egress_ca_pem(d->gw);
        if (!pem)
                return 0;
        struct cove_chan *c = cove_node_chan(d->node, id);
        if (!c)
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "sandbox %s is not running", id);
        char *bundle = NULL;
        size_t len = 0;
        struct cove_xfer *x = NULL;
        uint64_t size;
        uint32_t mode;
        struct cove_err e2;
        if (cove_chan_read_begin(c, CA_BUNDLE, &x, &size, &mode, &e2) == 0 &&
            size < CA_BUNDLE_MAX) {
                bundle = malloc(size + 1);
                long n = 1;
                while (bundle && len < size && n > 0) {
                        n = cove_chan_xfer_read(x, bundle + len, size - len, 10000, &e2);
                        if (n > 0)
                                len += (size_t)n;
                }
                if (bundle)
                        bundle[len] = '\0';
        }
        cove_chan_xfer_free(x);
        int r = 0;
        if (!bundle || !strstr(bundle, pem)) {
                size_t pl = strlen(pem);
                char *nb = malloc(len + pl + 2);
                if (!nb) {
                        r = cove_err_set(err, ENOMEM, "CA bundle");
                } else {
                        if (len)
                                memcpy(nb, bundle, len);
                        size_t o = len;
                        if (o && nb[o - 1] != '\n')
                                nb[o++] = '\n';
                        memcpy(nb + o, pem, pl);
                        r = put_file(c, CA_BUNDLE, nb, o + pl, err);
                        free(nb);
                }
        }
        free(bundle);
        if (r == 0)
                r = put_file(c, CA_FILE, pem, strlen(pem), err);
        cove_chan_unref(c);
        return r < 0 ? cove_err_wrap(err, "install the egress CA") : 0;
}

/* placeholders and CA variables into the sandbox's default env */
static int set_env(struct coved *d, const char *tenant, const char *id, json_t *ph, int ca,
                   struct cove_err *err)
{
        struct cove_sandbox_row row;
        if (cove_sandbox_load(d, tenant, id, &row, err) < 0)
                return -1;
        json_error_t je;
        json_t *env = json_loads(row.env_json ? row.env_json : "{}", 0, &je);
        if (!json_is_object(env)) {
                json_decref(env);
                env = json_object();
        }
        const char *k;
        json_t *v;
        json_object_foreach(ph, k, v) json_object_set(env, k, v);
        if (ca) {
                json_object_set_new(env, "SSL_CERT_FILE", json_string(CA_BUNDLE));
                json_object_set_new(env, "REQUESTS_CA_BUNDLE", json_string(CA_BUNDLE));
                json_object_set_new(env, "CURL_CA_BUNDLE", json_string(CA_BUNDLE));
                json_object_set_new(env, "NODE_EXTRA_CA_CERTS", json_string(CA_FILE));
        }
        char *text = json_dumps(env, JSON_COMPACT);
        json_decref(env);
        int r = -1;
        if (text) {
                free(row.env_json);
                row.env_json = text;
                r = coved_cluster_sandbox_update(d, &row, err);
                if (r == 1)
                        r = cove_err_setk(err, COVE_E_NOT_FOUND, 0, "sandbox %s not found", id);
        } else {
                cove_err_set(err, ENOMEM, "env");
        }
        cove_sandbox_row_clear(&row);
        return r;
}

/* The stored document: the policy plus the sandbox's placeholders and whether the CA is
 * in its env. 0 found, 1 none, -1 error. */
static int stored_load(struct coved *d, const char *id, json_t **policy, json_t **ph, int *ca,
                       struct cove_err *err)
{
        char *text = NULL;
        int r = d->cat_ops->egress_get(d->cat, id, &text, err);
        if (r != 0)
                return r;
        json_error_t je;
        json_t *j = json_loads(text, 0, &je);
        free(text);
        if (!json_is_object(j)) {
                json_decref(j);
                return cove_err_set(err, 0, "egress policy of %s: stored text is malformed", id);
        }
        *ph = json_incref(json_object_get(j, "placeholders"));
        if (!json_is_object(*ph)) {
                json_decref(*ph);
                *ph = json_object();
        }
        *ca = json_is_true(json_object_get(j, "ca"));
        json_object_del(j, "placeholders");
        json_object_del(j, "ca");
        *policy = j;
        return 0;
}

static int stored_save(struct coved *d, const char *tenant, const char *id,
                       const struct cove_policy *p, json_t *ph, int ca, struct cove_err *err)
{
        json_t *norm = cove_policy_json(p);
        json_object_set(norm, "placeholders", ph);
        json_object_set_new(norm, "ca", json_boolean(ca));
        char *text = json_dumps(norm, JSON_COMPACT);
        json_decref(norm);
        int r = text ? d->cat_ops->egress_put(d->cat, id, tenant, text, err)
                     : cove_err_set(err, ENOMEM, "egress");
        free(text);
        return r;
}

/* Injections built, link attached (or policy replaced), CA and env brought up to date. */
static int apply(struct coved *d, const char *tenant, const char *id, struct cove_policy *p,
                 json_t *ph, int *ca, uint32_t *addr, struct cove_err *err)
{
        int changed = 0;
        if (coved_secrets_injects(d, tenant, id, p, ph, &changed, err) < 0)
                return -1;
        int fresh = attach_policy(d, tenant, id, p, addr, err);
        if (fresh < 0)
                return -1;
        if (p->ninj && (fresh || !*ca) && cove_node_egress_ca_pem(d->gw)) {
                if (install_ca(d, id, err) < 0)
                        return -1;
                changed |= !*ca;
                *ca = 1;
        }
        if (changed && set_env(d, tenant, id, ph, *ca, err) < 0)
                return -1;
        return changed;
}

int coved_egress_attach(struct coved *d, const char *tenant, const char *id, json_t *egress,
                        struct cove_err *err)
{
        struct cove_policy *p = cove_policy_parse(egress, err);
        if (!p)
                return -1;
        json_t *ph = json_object();
        int ca = 0;
        uint32_t addr;
        int r = coved_secrets_check(d, tenant, p, err);
        if (r == 0)
                r = stored_save(d, tenant, id, p, ph, ca, err);
        if (r == 0)
                r = apply(d, tenant, id, p, ph, &ca, &addr, err);
        if (r > 0)
                r = stored_save(d, tenant, id, p, ph, ca, err);
        json_decref(ph);
        cove_policy_unref(p);
        return r < 0 ? -1 : 0;
}

int coved_egress_create_check(struct coved *d, const char *tenant, json_t *egress,
                              struct cove_err *err)
{
        struct cove_policy *p = cove_policy_parse(egress, err);
        if (!p)
                return -1;
        int r = coved_secrets_check(d, tenant, p, err);
        cove_policy_unref(p);
        return r;
}

static json_t *answer(struct cove_policy *p, int attached, uint32_t addr, json_t *ph)
{
        char ip[INET_ADDRSTRLEN] = "";
        struct in_addr a = {.s_addr = htonl(addr)};
        if (attached)
                inet_ntop(AF_INET, &a, ip, sizeof(ip));
        json_t *o = json_pack("{s:o, s:o}", "egress", cove_policy_json(p), "address",
                              attached ? json_string(ip) : json_null());
        if (json_object_size(ph)) /* not secret: the sandbox's env holds them */
                json_object_set(o, "placeholders", ph);
        return o;
}

int coved_egress_put(struct coved *d, const char *tenant, const char *id, json_t *body,
                     json_t **out, struct cove_err *err)
{
        struct cove_sandbox_row row;
        if (cove_sandbox_load(d, tenant, id, &row, err) < 0)
                return -1;
        int running = strcmp(row.state, "running") == 0;
        if (running && !d->node) { /* TODO(cl-fwd): forward to the sandbox's node */
                cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                              "sandbox %s runs on node %s: this control replica does not forward "
                              "egress changes of a running sandbox yet (ask the node)",
                              id, row.node);
                cove_sandbox_row_clear(&row);
                return -1;
        }
        cove_sandbox_row_clear(&row);
        json_t *pj = json_object_get(body, "egress") ? json_object_get(body, "egress") : body;
        struct cove_policy *p = cove_policy_parse(pj, err);
        if (!p)
                return -1;
        if (coved_secrets_check(d, tenant, p, err) < 0) {
                cove_policy_unref(p);
                return -1;
        }
        json_t *old = NULL, *ph = NULL;
        int ca = 0;
        int r = stored_load(d, id, &old, &ph, &ca, err);
        json_decref(old);
        if (r == 1) {
                ph = json_object();
                r = 0;
        }
        uint32_t addr = 0;
        if (r == 0)
                r = stored_save(d, tenant, id, p, ph, ca, err);
        if (r == 0 && running) {
                r = apply(d, tenant, id, p, ph, &ca, &addr, err);
                if (r > 0)
                        r = stored_save(d, tenant, id, p, ph, ca, err);
        }
        if (r == 0) {
                cove_audit_log(d->audit, tenant, id, "control", "egress.update", "",
                               json_pack("{s:o}", "egress", cove_policy_json(p)));
                *out = answer(p, running, addr, ph);
        }
        json_decref(ph);
        cove_policy_unref(p);
        return r < 0 ? -1 : 0;
}

int coved_egress_get(struct coved *d, const char *tenant, const char *id, json_t **out,
                     struct cove_err *err)
{
        struct cove_sandbox_row row;
        if (cove_sandbox_load(d, tenant, id, &row, err) < 0)
                return -1;
        cove_sandbox_row_clear(&row);
        json_t *j = NULL, *ph = NULL;
        int ca;
        int r = stored_load(d, id, &j, &ph, &ca, err);
        if (r < 0)
                return -1;
        if (r == 1)
                ph = json_object();
        struct cove_policy *p = cove_policy_parse(j, err);
        json_decref(j);
        if (!p) {
                json_decref(ph);
                return -1;
        }
        uint32_t addr = 0;
        int att = cove_node_egress_attached(d->gw, id, &addr);
        *out = answer(p, att, addr, ph);
        json_decref(ph);
        cove_policy_unref(p);
        return 0;
}

int coved_egress_refresh(struct coved *d, const char *tenant, const char *id)
{
        struct cove_err e;
        json_t *j = NULL, *ph = NULL;
        int ca = 0;
        int r = stored_load(d, id, &j, &ph, &ca, &e);
        if (r != 0) {
                if (r < 0)
                        cove_warn(&d->log, "egress", "refresh %s: %s", id, e.msg);
                return r < 0 ? -1 : 0;
        }
        struct cove_policy *p = cove_policy_parse(j, &e);
        json_decref(j);
        uint32_t addr;
        if (p && cove_node_pid(d->node, id) > 0) {
                r = apply(d, tenant, id, p, ph, &ca, &addr, &e);
                if (r > 0)
                        r = stored_save(d, tenant, id, p, ph, ca, &e);
        } else if (!p) {
                r = -1;
        }
        if (r < 0)
                cove_warn(&d->log, "egress", "refresh %s: %s", id, e.msg);
        json_decref(ph);
        cove_policy_unref(p);
        return r < 0 ? -1 : 0;
}

int coved_egress_copy(struct coved *d, const char *tenant, const char *from, const char *to)
{
        struct cove_err e;
        json_t *j = NULL, *ph = NULL;
        int ca = 0;
        int r = stored_load(d, from, &j, &ph, &ca, &e);
        json_decref(ph);
        if (r != 0)
                return r < 0 ? -1 : 0;
        struct cove_policy *p = cove_policy_parse(j, &e);
        json_decref(j);
        ph = json_object(); /* a fork gets placeholders of its own, and no leases */
        r = p ? stored_save(d, tenant, to, p, ph, 0, &e) : -1;
        json_decref(ph);
        cove_policy_unref(p);
        if (r == 0)
                return coved_egress_refresh(d, tenant, to);
        cove_warn(&d->log, "egress", "fork %s → %s: %s", from, to, e.msg);
        return -1;
}

void coved_audit_control(struct coved *d, const char *tenant, const char *sandbox,
                         const char *action, json_t *detail)
{
        if (d->audit)
                cove_audit_log(d->audit, tenant, sandbox, "control", action, "", detail);
        else
                json_decref(detail);
}

void coved_egress_on_stop(void *arg, const char *id)
{
        struct coved *d = arg;
        cove_node_egress_detach(d->gw, id);
}

void coved_egress_forget(struct coved *d, const char *id)
{
        struct cove_err e;
        if (d->cat_ops->egress_delete(d->cat, id, &e) < 0)
                cove_warn(&d->log, "egress", "forget policy of %s: %s", id, e.msg);
}
