/* Cluster nodes, admin only (docs/api.md "Nodes"): the list, cordon, uncordon, drain. */
#include "api/routes.h"
#include "control/nodes.h"

static int admin_only(struct cove_req *r)
{
        if (r->admin)
                return 0;
        cove_reply_error(r, 403, "unauthorized", "nodes are managed with an admin key");
        return -1;
}

int cove_h_nodes_list(void *app, struct cove_req *r)
{
        if (admin_only(r) < 0)
                return 0;
        json_t *out = NULL;
        struct cove_err err;
        int rc = coved_nodes_list(app, &out, &err);
        return cove_reply_result(r, rc, 200, out, &err);
}

static int node_action(void *app, struct cove_req *r, const char *action, unsigned status)
{
        if (admin_only(r) < 0)
                return 0;
        json_t *out = NULL;
        struct cove_err err;
        int rc = coved_node_admin(app, r->params[0], action, r->key_id, &out, &err);
        return cove_reply_result(r, rc, status, out, &err);
}

int cove_h_node_cordon(void *app, struct cove_req *r)
{
        return node_action(app, r, "cordon", 200);
}

int cove_h_node_uncordon(void *app, struct cove_req *r)
{
        return node_action(app, r, "uncordon", 200);
}

/* 202: the node is draining; its sandboxes move in the background */
int cove_h_node_drain(void *app, struct cove_req *r)
{
        return node_action(app, r, "drain", 202);
}
