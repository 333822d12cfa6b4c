/* The coved process composed (daemon/daemon.h): the front end starts only once the control
 * plane and the node are open and reconciled, and stops before them. */
#include "daemon/daemon.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>

#include "api/e2b.h"
#include "api/forward.h"
#include "api/http.h"
#include "api/routes.h"
#include "control/ports.h"

int coved_daemon_open(struct coved *d, const struct coved_options *o, struct cove_err *err)
{
        if (coved_open(d, o, err) < 0)
                return -1;
        char sock[PATH_MAX];
        snprintf(sock, sizeof(sock), "%s/coved.sock", d->data_dir);
        struct cove_http_config hc = {
            .routes = cove_routes,
            .nroutes = cove_nroutes,
            .auth = cove_api_auth,
            .app = d,
            .log = &d->log,
            .quitting = &d->quitting,
        };
        /* a cluster role serves its own table (api/forward.h): a control replica forwards
         * sandbox traffic to the owning node; a node's listener is its node API, for
         * control replicas only (Cove-Node requests) */
        if (d->role != COVED_ROLE_ALL) {
                struct cove_fwd_options fo = {.connect_timeout_ms = o->forward.connect_timeout_ms,
                                              .head_timeout_ms = o->forward.head_timeout_ms};
                d->fwd = cove_fwd_new(&fo, err);
                if (!d->fwd)
                        goto fail;
                hc.routes =
                    cove_fwd_routes(d->fwd, d->role, cove_routes, cove_nroutes,
                                    cove_e2b_node_routes, cove_e2b_node_nroutes, &hc.nroutes);
                if (!hc.routes) {
                        cove_err_set(err, ENOMEM, "routes");
                        goto fail;
                }
                if (d->role == COVED_ROLE_NODE) {
                        hc.auth = cove_nodeapi_auth;
                        if (o->e2b_api_listen || o->e2b_sandbox_listen) {
                                cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                              "--e2b-api-listen and --e2b-sandbox-listen are "
                                              "served by control replicas, not by a node");
                                goto fail;
                        }
                        /* the envd surface under /e2b on the node API (no listener) */
                        d->e2b = cove_e2b_node_new(d, err);
                        if (!d->e2b)
                                goto fail;
                }
        }
        /* the exposed ports' listener (control/ports.h) before the API listeners; a control
         * replica's relays to the nodes' listeners */
        if ((d->node || d->role == COVED_ROLE_CONTROL) && coved_ports_open(d, &o->ports, err) < 0)
                goto fail;
        d->http = cove_http_start(&hc, o->listen, sock, err);
        if (!d->http)
                goto fail;
        if (d->role != COVED_ROLE_NODE &&
            cove_e2b_start(d, o->e2b_api_listen, o->e2b_sandbox_listen, &d->e2b, err) < 0)
                goto fail;
        if (d->role == COVED_ROLE_ALL)
                cove_info(&d->log, "coved.start",
                          "serving on %s and %s; data dir %s; runtime %s; templates %s",
                          o->listen ? o->listen : "(no tcp)", sock, d->data_dir,
                          cove_node_runtime_name(d->node), d->templates_dir);
        else
                cove_info(&d->log, "coved.start", "serving on %s and %s; role %s%s; data dir %s",
                          o->listen ? o->listen : "(no tcp)", sock,
                          d->role == COVED_ROLE_CONTROL ? "control" : "node ",
                          d->role == COVED_ROLE_NODE ? d->node_name : "", d->data_dir);
        return 0;
fail:
        coved_daemon_close(d);
        return -1;
}

void coved_daemon_close(struct coved *d)
{
        pthread_mutex_lock(&d->mu);
        d->quitting = 1;
        pthread_cond_broadcast(&d->cv);
        pthread_mutex_unlock(&d->mu);
        cove_e2b_stop(d->e2b);
        d->e2b = NULL;
        if (d->http)
                cove_http_stop(d->http);
        d->http = NULL;
        coved_close(d);
        cove_fwd_free(d->fwd);
        d->fwd = NULL;
}
