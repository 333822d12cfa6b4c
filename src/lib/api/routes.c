/* REST routes of docs/api.md (sandboxes, templates, service) and authentication.
 * Processes and files live in routes_exec.c and routes_files.c. */
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "api/code.h"
#include "api/routes.h"
#include "control/apikey.h"
#include "control/template.h"
#include "util/util.h"

int cove_api_auth(void *app, struct cove_req *r, const char *authorization, struct cove_err *err)
{
        struct coved *d = app;
        if (!authorization) {
                /* the unix socket is root-only (0600): local root is admin */
                const union MHD_ConnectionInfo *ci =
                    MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
                if (ci && ci->client_addr && ci->client_addr->sa_family == AF_UNIX) {
                        snprintf(r->tenant, sizeof(r->tenant), "default");
                        snprintf(r->key_id, sizeof(r->key_id), "local");
                        r->admin = 1;
                        return 0;
                }
                return cove_err_setk(err, COVE_E_UNAUTHORIZED, 0,
                                     "missing API key: send Authorization: Bearer <key>");
        }
        if (strncmp(authorization, "Bearer ", 7) != 0)
                return cove_err_setk(err, COVE_E_UNAUTHORIZED, 0,
                                     "Authorization must be \"Bearer <key>\"");
        struct cove_apikey_row k;
        if (cove_apikey_verify(d->cat_ops, d->cat, authorization + 7, &k, err) < 0) {
                if (err->kind != COVE_E_UNAUTHORIZED) {
                        cove_warn(&d->log, "auth", "%s", err->msg);
                        err->kind = COVE_E_UNAVAILABLE;
                }
                return -1;
        }
        snprintf(r->tenant, sizeof(r->tenant), "%s", k.tenant);
        snprintf(r->key_id, sizeof(r->key_id), "%s", k.id);
        r->admin = k.admin;
        return 0;
}

/* "full" when snapshots of running sandboxes keep memory and processes (CRIU self-check
 * passed), "files" when not, "checking" while the start-up self-check runs; the reason is in
 * coved's log (event snapshot.full), not here: /healthz needs no key */
static const char *snapshot_kind(struct coved *d, int *st)
{
        char why[320];
        if (!d->node) { /* a control replica runs no sandbox */
                *st = 0;
                return "none";
        }
        *st = cove_node_full_status(d->node, why, sizeof(why));
        return *st == 1 ? "full" : *st == 0 ? "files" : "checking";
}

static int h_health(void *app, struct cove_req *r)
{
        int st;
        return cove_reply_json(
            r, 200, json_pack("{s:b, s:s}", "ok", 1, "snapshots", snapshot_kind(app, &st)));
}

static int count_state(const struct cove_sandbox_row *row, void *arg)
{
        int *counts = arg;
        static const char *states[] = {"starting", "running", "pausing", "paused",
                                       "resuming", "stopped", "error"};
        for (int i = 0; i < 7; i++)
                if (!strcmp(row->state, states[i]))
                        counts[i]++;
        return 0;
}

static int h_metrics(void *app, struct cove_req *r)
{
        struct coved *d = app;
        int counts[7] = {0};
        struct cove_err err;
        d->cat_ops->sandbox_list(d->cat, NULL, NULL, count_state, counts, &err);
        pthread_mutex_lock(&d->mu);
        struct coved_metrics m = d->m;
        pthread_mutex_unlock(&d->mu);
        static const char *states[] = {"starting", "running", "pausing", "paused",
                                       "resuming", "stopped", "error"};
        int pool_ready;
        uint64_t pool_taken, pool_missed;
        pool_ready = 0;
        pool_taken = pool_missed = 0;
        if (d->node)
                cove_node_pool_stats(d->node, &pool_ready, &pool_taken, &pool_missed);
        int full;
        snapshot_kind(d, &full);
        char buf[4608];
        size_t o = 0;
        o += (size_t)snprintf(buf + o, sizeof(buf) - o,
                              "# HELP cove_sandboxes Sandboxes in the catalog by state.\n"
                              "# TYPE cove_sandboxes gauge\n");
        for (int i = 0; i < 7; i++)
                o += (size_t)snprintf(buf + o, sizeof(buf) - o, "cove_sandboxes{state=\"%s\"} %d\n",
                                      states[i], counts[i]);
        o += (size_t)snprintf(
            buf + o, sizeof(buf) - o,
            "# HELP cove_instances Running instances on this node.\n"
            "# TYPE cove_instances gauge\ncove_instances %d\n"
            "# HELP cove_http_requests_total HTTP requests answered.\n"
            "# TYPE cove_http_requests_total counter\ncove_http_requests_total %llu\n"
            "# HELP cove_sandbox_creates_total Sandboxes created.\n"
            "# TYPE cove_sandbox_creates_total counter\ncove_sandbox_creates_total %llu\n"
            "# HELP cove_sandbox_create_failures_total Sandbox creations that failed.\n"
            "# TYPE cove_sandbox_create_failures_total counter\n"
            "cove_sandbox_create_failures_total %llu\n"
            "# HELP cove_sandbox_create_seconds_sum Total create latency.\n"
            "# TYPE cove_sandbox_create_seconds_sum counter\n"
            "cove_sandbox_create_seconds_sum %.6f\n"
            "# HELP cove_sandbox_deletes_total Sandboxes deleted.\n"
            "# TYPE cove_sandbox_deletes_total counter\ncove_sandbox_deletes_total %llu\n"
            "# HELP cove_execs_total Processes started.\n"
            "# TYPE cove_execs_total counter\ncove_execs_total %llu\n"
            "# HELP cove_timeouts_total Sandboxes stopped by their timeout.\n"
            "# TYPE cove_timeouts_total counter\ncove_timeouts_total %llu\n"
            "# HELP cove_pool_ready Warm sandboxes ready to be taken.\n"
            "# TYPE cove_pool_ready gauge\ncove_pool_ready %d\n"
            "# HELP cove_pool_taken_total Creates served from a warm pool.\n"
            "# TYPE cove_pool_taken_total counter\ncove_pool_taken_total %llu\n"
            "# HELP cove_pool_missed_total Creates of a pooled shape that found it empty.\n"
            "# TYPE cove_pool_missed_total counter\ncove_pool_missed_total %llu\n"
            "# HELP cove_full_snapshots Full snapshots (memory and processes, CRIU) available: "
            "1 yes, 0 no (files only), -1 self-check running.\n"
            "# TYPE cove_full_snapshots gauge\ncove_full_snapshots %d\n"
            "# HELP cove_uptime_seconds Seconds since coved started.\n"
            "# TYPE cove_uptime_seconds gauge\ncove_uptime_seconds %.3f\n",
            d->node ? cove_node_count(d->node) : 0, (unsigned long long)cove_http_requests(d->http),
            (unsigned long long)m.creates, (unsigned long long)m.create_failures,
            (double)m.create_ns_sum / 1e9, (unsigned long long)m.deletes,
            (unsigned long long)m.execs, (unsigned long long)m.timeouts_fired, pool_ready,
            (unsigned long long)pool_taken, (unsigned long long)pool_missed, full,
            (double)(cove_now_ms() - d->started_at) / 1000.0);
        if (o < sizeof(buf))
                snprintf(buf + o, sizeof(buf) - o,
                         "# HELP cove_pool_target Warm sandboxes the pools keep now (grown by "
                         "bursts up to --pool-max).\n"
                         "# TYPE cove_pool_target gauge\ncove_pool_target %d\n",
                         d->node ? cove_node_pool_target(d->node) : 0);
        return cove_reply_text(r, 200, "text/plain; version=0.0.4", buf);
}

static int h_create(void *app, struct cove_req *r)
{
        struct coved *d = app;
        json_t *body = cove_req_json(r, 0);
        if (!body)
                return 0;
        json_t *out = NULL;
        struct cove_err err;
        int rc = cove_sandbox_create(d, r->tenant, body, &out, &err);
        json_decref(body);
        return rc < 0 ? cove_reply_err(r, &err) : cove_reply_json(r, 201, out);
}

static int h_get(void *app, struct cove_req *r)
{
        struct coved *d = app;
        struct cove_sandbox_row row;
        struct cove_err err;
        if (cove_sandbox_load(d, r->tenant, r->params[0], &row, &err) < 0)
                return cove_reply_err(r, &err);
        json_t *o = cove_sandbox_json(&row);
        cove_sandbox_row_clear(&row);
        return cove_reply_json(r, 200, o);
}

/* live figures of a running sandbox's instance (its cgroup): memory now, CPU time so far */
static int h_usage(void *app, struct cove_req *r)
{
        struct coved *d = app;
        struct cove_sandbox_row row;
        struct cove_err err;
        if (cove_sandbox_load(d, r->tenant, r->params[0], &row, &err) < 0)
                return cove_reply_err(r, &err);
        cove_sandbox_row_clear(&row);
        uint64_t mem = 0, cpu = 0;
        if (cove_node_usage(d->node, r->params[0], &mem, &cpu, &err) < 0)
                return cove_reply_err(r, &err);
        return cove_reply_json(
            r, 200,
            json_pack("{s:I,s:I}", "memory_bytes", (json_int_t)mem, "cpu_usec", (json_int_t)cpu));
}

struct list_ctx {
        json_t *arr;
        json_t *meta; /* required metadata key/values */
};

static enum MHD_Result collect_meta(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value)
{
        struct list_ctx *x = cls;
        if (strncmp(key, "metadata.", 9) == 0 && key[9])
                json_object_set_new(x->meta, key + 9, json_string(value ? value : ""));
        return MHD_YES;
}

static int list_one(const struct cove_sandbox_row *row, void *arg)
{
        struct list_ctx *x = arg;
        if (!cove_sandbox_metadata_matches(row, x->meta))
                return 0;
        json_array_append_new(x->arr, cove_sandbox_json(row));
        return 0;
}

static int h_list(void *app, struct cove_req *r)
{
        struct coved *d = app;
        struct list_ctx x = {.arr = json_array(), .meta = json_object()};
        MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, collect_meta, &x);
        const char *state = cove_req_query(r, "state");
        /* an admin lists any tenant's sandboxes with ?tenant=; a tenant key only its own */
        const char *tenant = cove_req_scoped_tenant(r, NULL);
        if (!tenant) {
                json_decref(x.meta);
                json_decref(x.arr);
                return 0;
        }
        struct cove_err err;
        int rc = d->cat_ops->sandbox_list(d->cat, tenant, state && *state ? state : NULL, list_one,
                                          &x, &err);
        json_decref(x.meta);
        if (rc < 0) {
                json_decref(x.arr);
                return cove_reply_err(r, &err);
        }
        return cove_reply_json(r, 200, json_pack("{s:o}", "sandboxes", x.arr));
}

static int h_delete(void *app, struct cove_req *r)
{
        struct coved *d = app;
        const char *purge = cove_req_query(r, "purge");
        struct cove_err err;
        if (cove_sandbox_delete(d, r->tenant, r->params[0], purge && !strcmp(purge, "true"), &err) <
            0)
                return cove_reply_err(r, &err);
        return cove_reply_empty(r, 204);
}

static int h_timeout(void *app, struct cove_req *r)
{
        struct coved *d = app;
        json_t *body = cove_req_json(r, 0);
        if (!body)
                return 0;
        json_t *out = NULL;
        struct cove_err err;
        int rc = cove_sandbox_set_timeout(d, r->tenant, r->params[0], body, &out, &err);
        json_decref(body);
        return rc < 0 ? cove_reply_err(r, &err) : cove_reply_json(r, 200, out);
}

/* COVE_ROUTE_SANDBOX marks sandbox traffic: served by the node that runs the sandbox (in
 * role control forwarded there, api/forward.h). Egress, credential leases and ports of a
 * sandbox are in it because they act on the node's egress gateway, port listener and the
 * sandbox itself; lifecycle, snapshots and everything not about one sandbox stay with the
 * control plane. */
const struct cove_route cove_routes[] = {
    {"GET", "/healthz", h_health, NULL, COVE_ROUTE_PUBLIC},
    {"GET", "/metrics", h_metrics, NULL, COVE_ROUTE_PUBLIC},
    {"POST", "/v1/sandboxes", h_create, NULL, 0},
    {"GET", "/v1/sandboxes", h_list, NULL, 0},
    {"GET", "/v1/sandboxes/{id}", h_get, NULL, 0},
    {"DELETE", "/v1/sandboxes/{id}", h_delete, NULL, 0},
    {"POST", "/v1/sandboxes/{id}/timeout", h_timeout, NULL, 0},
    {"GET", "/v1/sandboxes/{id}/usage", h_usage, NULL, COVE_ROUTE_SANDBOX},
    {"POST", "/v1/sandboxes/{id}/exec", cove_h_exec, NULL, COVE_ROUTE_SANDBOX},
    {"GET", "/v1/sandboxes/{id}/processes", cove_h_processes, NULL, COVE_ROUTE_SANDBOX},
    {"GET", "/v1/sandboxes/{id}/processes/{pid}/events", cove_h_events, NULL, COVE_ROUTE_SANDBOX},
    {"POST", "/v1/sandboxes/{id}/processes/{pid}/stdin", cove_h_stdin, NULL, COVE_ROUTE_SANDBOX},
    {"POST", "/v1/sandboxes/{id}/processes/{pid}/signal", cove_h_signal, NULL, COVE_ROUTE_SANDBOX},
    {"POST", "/v1/sandboxes/{id}/processes/{pid}/resize", cove_h_resize, NULL, COVE_ROUTE_SANDBOX},
    {"GET", "/v1/sandboxes/{id}/files", cove_h_file_get, NULL, COVE_ROUTE_SANDBOX},
    {"PUT", "/v1/sandboxes/{id}/files", cove_h_file_put, cove_up_file_put, COVE_ROUTE_SANDBOX},
    {"GET", "/v1/sandboxes/{id}/fs", cove_h_fs_list, NULL, COVE_ROUTE_SANDBOX},
    {"POST", "/v1/sandboxes/{id}/fs/mkdir", cove_h_fs_mkdir, NULL, COVE_ROUTE_SANDBOX},
    {"POST", "/v1/sandboxes/{id}/fs/move", cove_h_fs_move, NULL, COVE_ROUTE_SANDBOX},
    {"POST", "/v1/sandboxes/{id}/fs/remove", cove_h_fs_remove, NULL, COVE_ROUTE_SANDBOX},
    {"GET", "/v1/sandboxes/{id}/fs/watch", cove_h_fs_watch, NULL, COVE_ROUTE_SANDBOX},
    {"POST", "/v1/sandboxes/{id}/snapshots", cove_h_snapshot_create, NULL, 0},
    {"GET", "/v1/sandboxes/{id}/snapshots", cove_h_snapshot_list, NULL, 0},
    {"POST", "/v1/sandboxes/{id}/pause", cove_h_pause, NULL, 0},
    {"POST", "/v1/sandboxes/{id}/resume", cove_h_resume, NULL, 0},
    {"POST", "/v1/sandboxes/{id}/rewind", cove_h_rewind, NULL, 0},
    {"POST", "/v1/sandboxes/{id}/fork", cove_h_fork, NULL, 0},
    {"GET", "/v1/snapshots/{sid}", cove_h_snapshot_get, NULL, 0},
    {"DELETE", "/v1/snapshots/{sid}", cove_h_snapshot_delete, NULL, 0},
    {"GET", "/v1/snapshots/{sid}/diff/{to}", cove_h_snapshot_diff, NULL, 0},
    {"GET", "/v1/snapshots/{sid}/diff/{to}/file", cove_h_snapshot_diff_file, NULL, 0},
    {"PUT", "/v1/sandboxes/{id}/egress", cove_h_egress_put, NULL, COVE_ROUTE_SANDBOX},
    {"GET", "/v1/sandboxes/{id}/egress", cove_h_egress_get, NULL, COVE_ROUTE_SANDBOX},
    {"PUT", "/v1/secrets/{name}", cove_h_secret_put, NULL, 0},
    {"GET", "/v1/secrets", cove_h_secret_list, NULL, 0},
    {"GET", "/v1/secrets/{name}", cove_h_secret_get, NULL, 0},
    {"DELETE", "/v1/secrets/{name}", cove_h_secret_delete, NULL, 0},
    {"POST", "/v1/sandboxes/{id}/leases", cove_h_lease_create, NULL, COVE_ROUTE_SANDBOX},
    {"GET", "/v1/sandboxes/{id}/leases", cove_h_lease_list_sbx, NULL, COVE_ROUTE_SANDBOX},
    {"GET", "/v1/leases", cove_h_lease_list, NULL, 0},
    {"POST", "/v1/leases/{lid}/approve", cove_h_lease_approve, NULL, 0},
    {"POST", "/v1/leases/{lid}/deny", cove_h_lease_deny, NULL, 0},
    {"DELETE", "/v1/leases/{lid}", cove_h_lease_delete, NULL, 0},
    {"POST", "/v1/sandboxes/{id}/ports", cove_h_port_add, NULL, COVE_ROUTE_SANDBOX},
    {"GET", "/v1/sandboxes/{id}/ports", cove_h_port_list, NULL, COVE_ROUTE_SANDBOX},
    {"DELETE", "/v1/sandboxes/{id}/ports/{port}", cove_h_port_delete, NULL, COVE_ROUTE_SANDBOX},
    {"POST", "/v1/sandboxes/{id}/code", cove_h_code_run, NULL, COVE_ROUTE_SANDBOX},
    {"POST", "/v1/sandboxes/{id}/code/contexts", cove_h_code_ctx_create, NULL, COVE_ROUTE_SANDBOX},
    {"GET", "/v1/sandboxes/{id}/code/contexts", cove_h_code_ctx_list, NULL, COVE_ROUTE_SANDBOX},
    {"DELETE", "/v1/sandboxes/{id}/code/contexts/{cid}", cove_h_code_ctx_delete, NULL,
     COVE_ROUTE_SANDBOX},
    {"POST", "/v1/sandboxes/{id}/code/contexts/{cid}/restart", cove_h_code_ctx_restart, NULL,
     COVE_ROUTE_SANDBOX},
    {"DELETE", "/v1/sandboxes/{id}/code/contexts/{cid}/execution", cove_h_code_ctx_interrupt, NULL,
     COVE_ROUTE_SANDBOX},
    {"GET", "/v1/audit", cove_h_audit, NULL, 0},
    {"GET", "/v1/audit/verify", cove_h_audit_verify, NULL, 0},
    /* nodes' catalog calls, role control only (Cove-Node authenticated in the handler) */
    {"POST", "/v1/cluster/catalog/{op}", cove_h_cluster_catalog, NULL, COVE_ROUTE_PUBLIC},
    {"GET", "/v1/templates", cove_h_templates_list, NULL, 0},
    {"POST", "/v1/templates", cove_h_template_post, NULL, 0},
    {"GET", "/v1/templates/{name}", cove_h_template_get, NULL, 0},
    {"DELETE", "/v1/templates/{name}", cove_h_template_delete, NULL, 0},
    {"GET", "/v1/templates/{name}/build/events", cove_h_template_events, NULL, 0},
    {"POST", "/v1/tenants", cove_h_tenant_create, NULL, 0},
    {"GET", "/v1/tenants", cove_h_tenant_list, NULL, 0},
    {"GET", "/v1/tenants/{tid}", cove_h_tenant_get, NULL, 0},
    {"DELETE", "/v1/tenants/{tid}", cove_h_tenant_delete, NULL, 0},
    {"PUT", "/v1/tenants/{tid}/quotas", cove_h_tenant_quotas, NULL, 0},
    {"POST", "/v1/tenants/{tid}/api-keys", cove_h_apikey_create, NULL, 0},
    {"GET", "/v1/tenants/{tid}/api-keys", cove_h_apikey_list, NULL, 0},
    {"DELETE", "/v1/tenants/{tid}/api-keys/{kid}", cove_h_apikey_revoke, NULL, 0},
    {"GET", "/v1/keys", cove_h_keys_get, NULL, 0},
    {"POST", "/v1/keys", cove_h_keys_add, NULL, 0},
    {"POST", "/v1/keys/rotate", cove_h_keys_rotate, NULL, 0},
    {"POST", "/v1/keys/revoke", cove_h_keys_revoke, NULL, 0},
    {"GET", "/v1/nodes", cove_h_nodes_list, NULL, 0},
    {"POST", "/v1/nodes/{name}/cordon", cove_h_node_cordon, NULL, 0},
    {"POST", "/v1/nodes/{name}/uncordon", cove_h_node_uncordon, NULL, 0},
    {"POST", "/v1/nodes/{name}/drain", cove_h_node_drain, NULL, 0},
    {"GET", "/ui", cove_h_ui, NULL, COVE_ROUTE_PUBLIC},
    {"GET", "/ui/{file}", cove_h_ui, NULL, COVE_ROUTE_PUBLIC},
};
const size_t cove_nroutes = sizeof(cove_routes) / sizeof(cove_routes[0]);
