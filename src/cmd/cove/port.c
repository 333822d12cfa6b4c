/* cove port add|ls|rm: a sandbox's exposed ports (POST/GET /v1/sandboxes/{id}/ports,
 * DELETE /v1/sandboxes/{id}/ports/{port}; docs/ports.md). */
#include <stdio.h>
#include <string.h>

#include "client.h"
#include "cove.h"
#include "util/cleanup.h"

enum { O_PUBLIC = 1000, O_AUTO_RESUME };

static void help(void)
{
        puts("Usage: cove port add ID PORT [--public] [--auto-resume]\n"
             "       cove port ls ID\n"
             "       cove port rm ID PORT\n"
             "\n"
             "Expose a port of a sandbox on the node's port listener (coved --ports-listen), list\n"
             "the exposed ports, or stop exposing one (its token stops working, its open\n"
             "connections end). add prints the URL (with the token of a private port, once:\n"
             "only its hash is kept) and the token on a line of its own.\n"
             "  --public        no token needed\n"
             "  --auto-resume   a request to a paused sandbox resumes it (else 503)");
}

static int parse_port(const char *s, long long *port)
{
        return cli_parse_uint(s, 65535, port) && *port >= 1;
}

int cmd_port(struct cli *c, int argc, char **argv)
{
        static const struct option opts[] = {{"public", no_argument, NULL, O_PUBLIC},
                                             {"auto-resume", no_argument, NULL, O_AUTO_RESUME},
                                             CLI_GLOBAL_OPTIONS,
                                             {0}};
        int opt, pub = 0, ar = 0;
        while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
                if (cli_global_opt(c, opt, optarg))
                        continue;
                if (opt == 'h') {
                        help();
                        return CLI_OK;
                }
                if (opt == O_PUBLIC)
                        pub = 1;
                else if (opt == O_AUTO_RESUME)
                        ar = 1;
                else
                        return cli_usage_error("port", "bad option");
        }
        int n = argc - optind;
        const char *verb = n > 0 ? argv[optind] : "";
        struct cove_err err = {0};
        long long port = 0;
        if (!strcmp(verb, "add") || !strcmp(verb, "rm")) {
                if (n != 3)
                        return cli_usage_error("port", "expected %s ID PORT", verb);
                if (!parse_port(argv[optind + 2], &port))
                        return cli_usage_error("port", "bad PORT '%s' (1-65535)", argv[optind + 2]);
        } else if (!strcmp(verb, "ls")) {
                if (n != 2)
                        return cli_usage_error("port", "expected ls ID");
        } else {
                return cli_usage_error("port", "expected add, ls or rm");
        }
        cleanup_free char *id = cli_urlenc(argv[optind + 1]);
        json_t *out = NULL;
        int rc = CLI_OK;
        if (!strcmp(verb, "add")) {
                cleanup_free char *path = cli_fmt("/v1/sandboxes/%s/ports", id);
                json_t *req = json_pack("{sI sb sb}", "port", (json_int_t)port, "public", pub,
                                        "auto_resume", ar);
                int r = cli_call(c, "POST", path, req, &out, NULL, &err);
                json_decref(req);
                if (r < 0)
                        return cli_fail(&err);
                if (c->json) {
                        rc = cli_print_json(c, out);
                } else {
                        printf("%s\n", json_string_value(json_object_get(out, "url")));
                        const char *tok = json_string_value(json_object_get(out, "token"));
                        if (tok)
                                printf("token %s\n", tok);
                }
        } else if (!strcmp(verb, "rm")) {
                cleanup_free char *path = cli_fmt("/v1/sandboxes/%s/ports/%lld", id, port);
                if (cli_call(c, "DELETE", path, NULL, NULL, NULL, &err) < 0)
                        return cli_fail(&err);
        } else {
                cleanup_free char *path = cli_fmt("/v1/sandboxes/%s/ports", id);
                if (cli_call(c, "GET", path, NULL, &out, NULL, &err) < 0)
                        return cli_fail(&err);
                if (c->json) {
                        rc = cli_print_json(c, out);
                } else {
                        printf("%-6s  %-7s  %-11s  %s\n", "PORT", "ACCESS", "AUTO_RESUME", "URL");
                        size_t i;
                        json_t *p;
                        json_array_foreach(json_object_get(out, "ports"), i, p)
                        {
                                const char *url = json_string_value(json_object_get(p, "url"));
                                printf(
                                    "%-6lld  %-7s  %-11s  %s\n",
                                    (long long)json_integer_value(json_object_get(p, "port")),
                                    json_is_true(json_object_get(p, "public")) ? "public" : "token",
                                    json_is_true(json_object_get(p, "auto_resume")) ? "yes" : "no",
                                    url ? url : "(every port)");
                        }
                }
        }
        json_decref(out);
        return rc;
}
