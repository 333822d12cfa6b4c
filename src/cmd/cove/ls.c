/* cove ls: GET /v1/sandboxes with state and metadata filters; an aligned table with relative
 * times, on a terminal or not (as docker and kubectl do); the server's JSON
 * (`{"sandboxes":[…]}`) with --json, for scripts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "cove.h"
#include "util/cleanup.h"

static void help(void)
{
        puts("Usage: cove ls [OPTIONS]\n"
             "\n"
             "List sandboxes as a table (also on a pipe); JSON ({\"sandboxes\":[...]}) with\n"
             "--json, for scripts.\n"
             "\n"
             "  --state S1,S2       only these states (starting, running, paused, ...)\n"
             "  -m, --metadata K=V  only sandboxes with this label (repeatable, all must match)\n"
             "  -q, --quiet         print ids only, one per line\n"
             "  --json              print JSON");
}

enum { OPT_STATE = CLI_OPT_VERB_BASE };

static const char *str_or_dash(json_t *o, const char *k)
{
        const char *s = json_string_value(json_object_get(o, k));
        return s && *s ? s : "-";
}

#define NCOLS 6

static int print_table(json_t *list)
{
        static const char *heads[NCOLS] = {"ID",      "STATE",   "TEMPLATE",
                                           "RUNTIME", "CREATED", "EXPIRES"};
        size_t n = json_array_size(list);
        char(*cells)[NCOLS][64] = calloc(n ? n : 1, sizeof(*cells));
        if (!cells)
                return CLI_FAIL;
        int w[NCOLS];
        for (int k = 0; k < NCOLS; k++)
                w[k] = (int)strlen(heads[k]);
        for (size_t i = 0; i < n; i++) {
                json_t *s = json_array_get(list, i);
                snprintf(cells[i][0], 64, "%s", str_or_dash(s, "id"));
                snprintf(cells[i][1], 64, "%s", str_or_dash(s, "state"));
                snprintf(cells[i][2], 64, "%s", str_or_dash(s, "template"));
                snprintf(cells[i][3], 64, "%s", str_or_dash(s, "runtime"));
                cli_reltime(json_string_value(json_object_get(s, "created_at")), cells[i][4], 64);
                cli_reltime(json_string_value(json_object_get(s, "expires_at")), cells[i][5], 64);
                for (int k = 0; k < NCOLS; k++) {
                        int l = (int)strlen(cells[i][k]);
                        if (l > w[k])
                                w[k] = l;
                }
        }
        for (int k = 0; k < NCOLS; k++) {
                if (k < NCOLS - 1)
                        printf("%-*s  ", w[k], heads[k]);
                else
                        printf("%s\n", heads[k]);
        }
        for (size_t i = 0; i < n; i++)
                for (int k = 0; k < NCOLS; k++) {
                        if (k < NCOLS - 1)
                                printf("%-*s  ", w[k], cells[i][k]);
                        else
                                printf("%s\n", cells[i][k]);
                }
        free(cells);
        return fflush(stdout) == 0 ? CLI_OK : CLI_FAIL;
}

int cmd_ls(struct cli *c, int argc, char **argv)
{
        static const struct option opts[] = {
            {"state", required_argument, NULL, OPT_STATE},
            {"metadata", required_argument, NULL, 'm'},
            {"quiet", no_argument, NULL, 'q'},
            CLI_GLOBAL_OPTIONS,
            {0},
        };
        /* Query string built as we go: "?state=...&metadata.K=V...". */
        char *query = cli_fmt("%s", "");
        char *path = NULL;
        bool quiet = false;
        int rc = CLI_OK, opt;
        while ((opt = getopt_long(argc, argv, "hm:q", opts, NULL)) != -1) {
                if (cli_global_opt(c, opt, optarg))
                        continue;
                char *add = NULL;
                switch (opt) {
                case 'h':
                        help();
                        goto out;
                case 'q':
                        quiet = true;
                        break;
                case OPT_STATE: {
                        cleanup_free char *v = cli_urlenc(optarg);
                        add = cli_fmt("state=%s", v);
                        break;
                }
                case 'm': {
                        const char *eq = strchr(optarg, '=');
                        if (!eq || eq == optarg) {
                                rc = cli_usage_error("ls", "expected K=V, got '%s'", optarg);
                                goto out;
                        }
                        cleanup_free char *k = strndup(optarg, (size_t)(eq - optarg));
                        cleanup_free char *ke = cli_urlenc(k ? k : "");
                        cleanup_free char *ve = cli_urlenc(eq + 1);
                        add = cli_fmt("metadata.%s=%s", ke, ve);
                        break;
                }
                default:
                        rc = cli_usage_error("ls", "bad option");
                        goto out;
                }
                if (add) {
                        char *q = cli_fmt("%s%c%s", query, *query ? '&' : '?', add);
                        free(query);
                        free(add);
                        query = q;
                }
        }
        if (optind < argc) {
                rc = cli_usage_error("ls", "unexpected argument '%s'", argv[optind]);
                goto out;
        }
        struct cove_err err = {0};
        json_t *ans = NULL;
        path = cli_fmt("/v1/sandboxes%s", query);
        if (cli_call(c, "GET", path, NULL, &ans, NULL, &err) < 0) {
                rc = cli_fail(&err);
                goto out;
        }
        json_t *list = json_object_get(ans, "sandboxes");
        if (!json_is_array(list)) {
                cove_err_set(&err, 0, "bad answer from coved: no \"sandboxes\" array");
                rc = cli_fail(&err);
        } else if (quiet) {
                for (size_t i = 0; i < json_array_size(list); i++)
                        printf("%s\n", str_or_dash(json_array_get(list, i), "id"));
        } else if (c->json) {
                rc = cli_print_json(c, ans);
        } else {
                rc = print_table(list);
        }
        json_decref(ans);
out:
        free(query);
        free(path);
        return rc;
}
