/* cove inspect: GET /v1/sandboxes/{id} and print the sandbox as JSON (indented on a
 * terminal). Several ids print a JSON array; any missing one makes the exit status 1. */
#include <stdio.h>

#include "client.h"
#include "cove.h"
#include "util/cleanup.h"

static void help(void)
{
        puts("Usage: cove inspect ID [ID...]\n"
             "\n"
             "Print a sandbox as JSON (an array when several ids are given).");
}

int cmd_inspect(struct cli *c, int argc, char **argv)
{
        static const struct option opts[] = {CLI_GLOBAL_OPTIONS, {0}};
        int opt;
        while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
                if (cli_global_opt(c, opt, optarg))
                        continue;
                if (opt == 'h') {
                        help();
                        return CLI_OK;
                }
                return cli_usage_error("inspect", "bad option");
        }
        if (optind >= argc)
                return cli_usage_error("inspect", "missing sandbox ID");
        int rc = CLI_OK;
        bool many = argc - optind > 1;
        json_t *all = json_array();
        for (int i = optind; i < argc; i++) {
                struct cove_err err = {0};
                cleanup_free char *id = cli_urlenc(argv[i]);
                cleanup_free char *path = cli_fmt("/v1/sandboxes/%s", id);
                json_t *sbx = NULL;
                if (cli_call(c, "GET", path, NULL, &sbx, NULL, &err) < 0) {
                        rc = cli_fail(&err);
                        continue;
                }
                json_array_append_new(all, sbx);
        }
        if (json_array_size(all) > 0) {
                int prc = cli_print_json(c, many ? all : json_array_get(all, 0));
                if (prc != CLI_OK)
                        rc = prc;
        }
        json_decref(all);
        return rc;
}
