/* cove rm: DELETE /v1/sandboxes/{id} for each id (`?purge=true` with --purge). Quiet on
 * success; every failure is reported and makes the exit status 1. */
#include <stdio.h>

#include "client.h"
#include "cove.h"
#include "util/cleanup.h"

static void help(void)
{
        puts("Usage: cove rm [--purge] ID [ID...]\n"
             "\n"
             "Destroy sandboxes. Their snapshots are kept until retention expires them,\n"
             "unless --purge deletes them now.\n"
             "\n"
             "  --purge   also delete the sandboxes' snapshots");
}

enum { OPT_PURGE = CLI_OPT_VERB_BASE };

int cmd_rm(struct cli *c, int argc, char **argv)
{
        static const struct option opts[] = {
            {"purge", no_argument, NULL, OPT_PURGE},
            CLI_GLOBAL_OPTIONS,
            {0},
        };
        bool purge = false;
        int opt;
        while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
                if (cli_global_opt(c, opt, optarg))
                        continue;
                switch (opt) {
                case 'h':
                        help();
                        return CLI_OK;
                case OPT_PURGE:
                        purge = true;
                        break;
                default:
                        return cli_usage_error("rm", "bad option");
                }
        }
        if (optind >= argc)
                return cli_usage_error("rm", "missing sandbox ID");
        int rc = CLI_OK;
        for (int i = optind; i < argc; i++) {
                struct cove_err err = {0};
                cleanup_free char *id = cli_urlenc(argv[i]);
                cleanup_free char *path =
                    cli_fmt("/v1/sandboxes/%s%s", id, purge ? "?purge=true" : "");
                if (cli_call(c, "DELETE", path, NULL, NULL, "removing sandbox", &err) < 0)
                        rc = cli_fail(&err);
        }
        return rc;
}
