/* Egress in the control plane: the node's gateway (node/egress.h) and the audit log
 * (control/audit.h) started with coved, policies validated at create, attached to the
 * sandbox's instance, stored in the catalog and replaced live.
 * Sandboxes created without `egress` get no link at all (only their loopback): deny by
 * default. A policy given later (PUT …/egress) attaches a link to the running sandbox. */
#ifndef COVE_CONTROL_EGRESS_H
#define COVE_CONTROL_EGRESS_H

#include <jansson.h>

#include "util/err.h"

struct coved;
struct coved_options;

struct coved_egress_options {
        const char *pool;             /* "10.200.0.0/16" (NULL: that) */
        const char *const *upstreams; /* "IP" (NULL/0: the nameservers of /etc/resolv.conf) */
        int nupstreams;
        const char *const *statics; /* "name=IP" */
        int nstatics;
        int upstream_port;   /* 0: 53 */
        const char *ca_file; /* extra CA file upstreams of intercepted connections may chain
                                to (--egress-ca-file; tests) */
};

/* Start the audit log and (when this host allows) the gateway. A gateway that cannot start
 * is logged, not fatal: creates that ask for egress then answer 503. */
int coved_egress_open(struct coved *d, const struct coved_egress_options *o, struct cove_err *err);
void coved_egress_close(struct coved *d);

/* 0 when egress (a create body's field) is a valid policy, else -1 BAD_REQUEST. */
int coved_egress_validate(json_t *egress, struct cove_err *err);
/* Give the running sandbox its link and policy (create, or a first PUT): stores the policy,
 * writes /etc/resolv.conf inside. */
int coved_egress_attach(struct coved *d, const char *tenant, const char *id, json_t *egress,
                        struct cove_err *err);
/* Create-time check of the body's egress: valid, and every listed secret exists. */
int coved_egress_create_check(struct coved *d, const char *tenant, json_t *egress,
                              struct cove_err *err);
/* Re-apply the stored policy (and leases) to the sandbox when it runs: after a resume,
 * rewind or fork (a new instance: new link, CA re-installed), or a lease change. */
int coved_egress_refresh(struct coved *d, const char *tenant, const char *id);
/* A fork takes the policy of its source, with placeholders of its own and no leases. */
int coved_egress_copy(struct coved *d, const char *tenant, const char *from, const char *to);
/* PUT …/egress: validate, store, apply live (attaching a link if there is none yet).
 * *out: {"egress": policy, "address": …}. */
int coved_egress_put(struct coved *d, const char *tenant, const char *id, json_t *body,
                     json_t **out, struct cove_err *err);
int coved_egress_get(struct coved *d, const char *tenant, const char *id, json_t **out,
                     struct cove_err *err);
/* The node stopped an instance: drop its link and connections. */
void coved_egress_on_stop(void *arg, const char *id);
/* A control signal (create, exec, file.write, pause, snapshot, resume, fork, rewind,
 * delete) into the audit log: kind "control". detail handed over (NULL: {}). */
void coved_audit_control(struct coved *d, const char *tenant, const char *sandbox,
                         const char *action, json_t *detail);
/* The sandbox is deleted: forget its policy. */
void coved_egress_forget(struct coved *d, const char *id);

#endif
