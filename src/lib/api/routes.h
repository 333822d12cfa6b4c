/* Handlers shared between the route files of api/. */
#ifndef COVE_API_ROUTES_H
#define COVE_API_ROUTES_H

#include "api/http.h"
#include "control/coved.h"

/* HTTP routes (api/routes.c), served by daemon/daemon.c: app is the struct coved. */
extern const struct cove_route cove_routes[];
extern const size_t cove_nroutes;
int cove_api_auth(void *app, struct cove_req *r, const char *authorization, struct cove_err *err);
/* POST /v1/cluster/catalog/{op}: the catalog for nodes (routes_cluster.c) */
int cove_h_cluster_catalog(void *app, struct cove_req *r);

int cove_h_exec(void *app, struct cove_req *r);
int cove_h_processes(void *app, struct cove_req *r);
int cove_h_events(void *app, struct cove_req *r);
int cove_h_stdin(void *app, struct cove_req *r);
int cove_h_signal(void *app, struct cove_req *r);
int cove_h_resize(void *app, struct cove_req *r);
int cove_h_file_get(void *app, struct cove_req *r);
int cove_h_file_put(void *app, struct cove_req *r);
int cove_up_file_put(void *app, struct cove_req *r, const char *data, size_t len);
int cove_h_fs_list(void *app, struct cove_req *r);
int cove_h_fs_mkdir(void *app, struct cove_req *r);
int cove_h_fs_move(void *app, struct cove_req *r);
int cove_h_fs_remove(void *app, struct cove_req *r);
int cove_h_fs_watch(void *app, struct cove_req *r);
int cove_h_secret_put(void *app, struct cove_req *r);
int cove_h_secret_get(void *app, struct cove_req *r);
int cove_h_secret_list(void *app, struct cove_req *r);
int cove_h_secret_delete(void *app, struct cove_req *r);
int cove_h_lease_create(void *app, struct cove_req *r);
int cove_h_lease_list_sbx(void *app, struct cove_req *r);
int cove_h_lease_list(void *app, struct cove_req *r);
int cove_h_lease_approve(void *app, struct cove_req *r);
int cove_h_lease_deny(void *app, struct cove_req *r);
int cove_h_lease_delete(void *app, struct cove_req *r);
int cove_h_egress_put(void *app, struct cove_req *r);
int cove_h_egress_get(void *app, struct cove_req *r);
int cove_h_audit(void *app, struct cove_req *r);
int cove_h_port_add(void *app, struct cove_req *r);
int cove_h_port_list(void *app, struct cove_req *r);
int cove_h_port_delete(void *app, struct cove_req *r);
int cove_h_audit_verify(void *app, struct cove_req *r);
int cove_h_snapshot_create(void *app, struct cove_req *r);
int cove_h_snapshot_list(void *app, struct cove_req *r);
int cove_h_snapshot_get(void *app, struct cove_req *r);
int cove_h_snapshot_delete(void *app, struct cove_req *r);
int cove_h_pause(void *app, struct cove_req *r);
int cove_h_resume(void *app, struct cove_req *r);
int cove_h_rewind(void *app, struct cove_req *r);
int cove_h_fork(void *app, struct cove_req *r);
int cove_h_snapshot_diff(void *app, struct cove_req *r); /* routes_diff.c */
int cove_h_ui(void *app, struct cove_req *r);            /* routes_ui.c: the console's files */
int cove_h_snapshot_diff_file(void *app, struct cove_req *r);
/* tenants, API keys, data keys (routes_tenants.c) */
int cove_h_templates_list(void *app, struct cove_req *r);
int cove_h_template_post(void *app, struct cove_req *r);
int cove_h_template_get(void *app, struct cove_req *r);
int cove_h_template_delete(void *app, struct cove_req *r);
int cove_h_template_events(void *app, struct cove_req *r);
int cove_h_tenant_create(void *app, struct cove_req *r);
int cove_h_tenant_list(void *app, struct cove_req *r);
int cove_h_tenant_get(void *app, struct cove_req *r);
int cove_h_tenant_delete(void *app, struct cove_req *r);
int cove_h_tenant_quotas(void *app, struct cove_req *r);
int cove_h_apikey_create(void *app, struct cove_req *r);
int cove_h_apikey_list(void *app, struct cove_req *r);
int cove_h_apikey_revoke(void *app, struct cove_req *r);
int cove_h_keys_get(void *app, struct cove_req *r);
int cove_h_keys_add(void *app, struct cove_req *r);
int cove_h_keys_rotate(void *app, struct cove_req *r);
int cove_h_keys_revoke(void *app, struct cove_req *r);
/* cluster nodes (routes_nodes.c) */
int cove_h_nodes_list(void *app, struct cove_req *r);
int cove_h_node_cordon(void *app, struct cove_req *r);
int cove_h_node_uncordon(void *app, struct cove_req *r);
int cove_h_node_drain(void *app, struct cove_req *r);
/* The tenant a call is about: the caller's own, or (admin keys) ?tenant= / body.tenant. A
 * tenant key naming another tenant gets 404 not_found answered here (another tenant looks
 * like one that does not exist) and NULL; whether an admin's tenant exists is the caller's
 * check. */
const char *cove_req_scoped_tenant(struct cove_req *r, json_t *body);

int cove_exec_request_build(json_t *body, const char *env_json, json_t **req, json_t **cmd,
                            char *why, size_t cap);
/* Send req (stolen) to r's sandbox and answer {"ok":true}, or the error. */
int cove_simple_call(struct coved *d, struct cove_req *r, json_t *req);
/* Base64 of len bytes into a new string (caller frees). */
char *cove_b64(const void *data, size_t len);
/* The sandbox channel for r->params[0], answering the error itself when it fails. */
struct cove_chan *cove_req_chan(struct coved *d, struct cove_req *r, struct cove_sandbox_row *row);

int cove_reply_events(struct coved *d, struct cove_req *r, struct cove_chan *c,
                      struct cove_watch *w, uint32_t pid, uint64_t after);
#endif
