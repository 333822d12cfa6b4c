/* cove timeout: POST /v1/sandboxes/{id}/timeout {timeout_s}: the sandbox now ends SECONDS
 * from now. Prints the new expiry (the sandbox object with --json). */
#include <stdio.h>

#include "client.h"
#include "cove.h"
#include "util/cleanup.h"

static void help(void)
{
        puts("Usage: cove timeout ID SECONDS\n"
             "\n"
             "Set a sandbox to end SECONDS from now (extends or shortens its lifetime).\n"
             "Prints the new expiry time; --json prints the sandbox object.");
}

int cmd_timeout(struct cli *c, int argc, char **argv)
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
                return cli_usage_error("timeout", "bad option");
        }
        if (argc - optind != 2)
                return cli_usage_error("timeout", "expected ID SECONDS");
        long long secs;
        if (!cli_parse_uint(argv[optind + 1], 1LL << 40, &secs))
                return cli_usage_error("timeout", "bad SECONDS '%s'", argv[optind + 1]);

        struct cove_err err = {0};
        cleanup_free char *id = cli_urlenc(argv[optind]);
        cleanup_free char *path = cli_fmt("/v1/sandboxes/%s/timeout", id);
        json_t *req = json_pack("{sI}", "timeout_s", (json_int_t)secs);
        json_t *sbx = NULL;
        int r = cli_call(c, "POST", path, req, &sbx, NULL, &err);
        json_decref(req);
        if (r < 0)
                return cli_fail(&err);
        int rc = CLI_OK;
        if (c->json) {
                rc = cli_print_json(c, sbx);
        } else {
                const char *exp = json_string_value(json_object_get(sbx, "expires_at"));
                char rel[64];
                cli_reltime(exp, rel, sizeof(rel));
                printf("%s expires %s (%s)\n", argv[optind], exp ? exp : "-", rel);
        }
        json_decref(sbx);
        return rc;
}
