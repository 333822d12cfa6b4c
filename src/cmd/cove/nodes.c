/* cove nodes ls|cordon|uncordon|drain: a cluster's nodes (GET /v1/nodes, POST
 * /v1/nodes/{name}/cordon|uncordon|drain; admin; docs/cluster.md "Node loss, drain,
 * cordon"). ls prints an aligned table, on a terminal or not, like cove ls; --json the
 * server's JSON. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "cove.h"
#include "util/cleanup.h"

static void help(void)
{
        puts("Usage: cove nodes ls\n"
             "       cove nodes cordon|uncordon|drain NAME\n"
             "\n"
             "List the cluster's nodes (state, lease, epoch, allocated/capacity, sandboxes), or\n"
             "change one (admin key):\n"
             "  cordon    no new sandboxes are placed on it; what runs there stays\n"
             "  uncordon  ready again (also stops a drain)\n"
             "  drain     no new sandboxes, and each one there is paused and resumed on\n"
             "            another node, one at a time (follow it with cove nodes ls)\n"
             "A coved in one process (role all) has no cluster nodes: ls prints none.\n"
             "  --json    print JSON");
}

#define NCOLS 8

static void res_cell(json_t *n, const char *k, char *out, size_t cap)
{
        snprintf(out, cap, "%lld/%lld",
                 (long long)json_integer_value(json_object_get(json_object_get(n, "allocated"), k)),
                 (long long)json_integer_value(json_object_get(json_object_get(n, "capacity"), k)));
}

static int print_table(json_t *list)
{
        static const char *heads[NCOLS] = {"NAME", "STATE",     "LEASE",   "EPOCH",
                                           "CPUS", "MEMORY_MB", "DISK_MB", "SANDBOXES"};
        size_t n = json_array_size(list);
        char(*cells)[NCOLS][80] = calloc(n ? n : 1, sizeof(*cells));
        if (!cells)
                return CLI_FAIL;
        int w[NCOLS];
        for (int k = 0; k < NCOLS; k++)
                w[k] = (int)strlen(heads[k]);
        for (size_t i = 0; i < n; i++) {
                json_t *o = json_array_get(list, i);
                json_t *lease = json_object_get(o, "lease");
                const char *s;
                snprintf(cells[i][0], 80, "%s",
                         (s = json_string_value(json_object_get(o, "name"))) ? s : "-");
                snprintf(cells[i][1], 80, "%s",
                         (s = json_string_value(json_object_get(o, "state"))) ? s : "-");
                char rel[32];
                cli_reltime(json_string_value(json_object_get(lease, "expires_at")), rel,
                            sizeof(rel));
                snprintf(cells[i][2], 80, "%s (%s)",
                         json_is_true(json_object_get(lease, "live")) ? "live" : "expired", rel);
                snprintf(cells[i][3], 80, "%lld",
                         (long long)json_integer_value(json_object_get(lease, "epoch")));
                res_cell(o, "cpus", cells[i][4], 80);
                res_cell(o, "memory_mb", cells[i][5], 80);
                res_cell(o, "disk_mb", cells[i][6], 80);
                snprintf(cells[i][7], 80, "%lld",
                         (long long)json_integer_value(json_object_get(o, "sandboxes")));
                for (int k = 0; k < NCOLS; k++) {
                        int l = (int)strlen(cells[i][k]);
                        if (l > w[k])
                                w[k] = l;
                }
        }
        for (int k = 0; k < NCOLS; k++)
                printf(k < NCOLS - 1 ? "%-*s  " : "%*s\n", k < NCOLS - 1 ? w[k] : 0, heads[k]);
        for (size_t i = 0; i < n; i++)
                for (int k = 0; k < NCOLS; k++)
                        printf(k < NCOLS - 1 ? "%-*s  " : "%*s\n", k < NCOLS - 1 ? w[k] : 0,
                               cells[i][k]);
        free(cells);
        return fflush(stdout) == 0 ? CLI_OK : CLI_FAIL;
}

int cmd_nodes(struct cli *c, int argc, char **argv)
{
        int first;
        int r = cli_global_args(c, argc, argv, "nodes", help, &first);
        if (r >= 0)
                return r;
        int n = argc - first;
        const char *verb = n > 0 ? argv[first] : "";
        struct cove_err err = {0};
        json_t *out = NULL;
        int rc = CLI_OK;
        if (!strcmp(verb, "ls")) {
                if (n != 1)
                        return cli_usage_error("nodes", "ls takes no argument");
                if (cli_call(c, "GET", "/v1/nodes", NULL, &out, NULL, &err) < 0)
                        return cli_fail(&err);
                json_t *list = json_object_get(out, "nodes");
                if (!json_is_array(list)) {
                        cove_err_set(&err, 0, "bad answer from coved: no \"nodes\" array");
                        rc = cli_fail(&err);
                } else {
                        rc = c->json ? cli_print_json(c, out) : print_table(list);
                }
        } else if (!strcmp(verb, "cordon") || !strcmp(verb, "uncordon") || !strcmp(verb, "drain")) {
                if (n != 2)
                        return cli_usage_error("nodes", "expected %s NAME", verb);
                cleanup_free char *name = cli_urlenc(argv[first + 1]);
                cleanup_free char *path = cli_fmt("/v1/nodes/%s/%s", name, verb);
                if (cli_call(c, "POST", path, NULL, &out, NULL, &err) < 0)
                        return cli_fail(&err);
                if (c->json)
                        rc = cli_print_json(c, out);
                else
                        printf("%s %s\n", argv[first + 1],
                               json_string_value(json_object_get(out, "state")));
        } else {
                return cli_usage_error("nodes", "expected ls, cordon, uncordon or drain");
        }
        json_decref(out);
        return rc;
}
