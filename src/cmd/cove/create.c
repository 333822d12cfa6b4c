/* cove create: POST /v1/sandboxes, then wait while the sandbox is `starting`, and print its
 * id alone on stdout (so `ID=$(cove create)` works), or the sandbox object with --json. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "client.h"
#include "cove.h"
#include "util/cleanup.h"
#include "util/util.h"

static void help(void)
{
        puts("Usage: cove create [OPTIONS]\n"
             "\n"
             "Create a sandbox and print its id (the sandbox object with --json).\n"
             "\n"
             "  --template T      template to start from (default: base)\n"
             "  --runtime R       ns or vm (default: the node's choice)\n"
             "  --cpus N          CPU limit (may be fractional, e.g. 0.5)\n"
             "  --memory MB       memory limit in MiB\n"
             "  --disk MB         writable disk size in MiB\n"
             "  --timeout S       lifetime in seconds before it ends (server default: 300)\n"
             "  --on-timeout A    kill or pause when the timeout expires\n"
             "  -e, --env K=V     environment variable for every process (repeatable)\n"
             "  -m, --metadata K=V  label (repeatable; filter with 'cove ls --metadata')\n"
             "  --no-wait         return at once even if the sandbox is still starting\n"
             "  --encrypted       encrypt its writable disk at rest (never a warm sandbox)\n"
             "  --json            print the sandbox object");
}

enum {
        OPT_TEMPLATE = CLI_OPT_VERB_BASE,
        OPT_RUNTIME,
        OPT_CPUS,
        OPT_MEMORY,
        OPT_DISK,
        OPT_TIMEOUT,
        OPT_ON_TIMEOUT,
        OPT_NO_WAIT,
        OPT_ENCRYPTED,
};

/* Poll until the sandbox leaves `starting`, so the id we print is usable right away. */
static int wait_started(struct cli *c, json_t **sbx, struct cove_err *err)
{
        cleanup_free char *id = cli_fmt("%s", json_string_value(json_object_get(*sbx, "id")));
        cleanup_free char *path = cli_fmt("/v1/sandboxes/%s", id);
        cleanup_free char *what = cli_fmt("sandbox %s", id);
        int ret = cli_poll_while(c, path, "state", "starting", "starting sandbox", 50, 600, what,
                                 sbx, err);
        if (ret == 0 &&
            strcmp(json_string_value(json_object_get(*sbx, "state")) ?: "", "error") == 0)
                ret = cove_err_set(err, 0,
                                   "sandbox %s failed to start (state error); "
                                   "'cove inspect %s' for details, 'cove rm %s' to remove it",
                                   id, id, id);
        return ret;
}

int cmd_create(struct cli *c, int argc, char **argv)
{
        static const struct option opts[] = {
            {"template", required_argument, NULL, OPT_TEMPLATE},
            {"runtime", required_argument, NULL, OPT_RUNTIME},
            {"cpus", required_argument, NULL, OPT_CPUS},
            {"memory", required_argument, NULL, OPT_MEMORY},
            {"disk", required_argument, NULL, OPT_DISK},
            {"timeout", required_argument, NULL, OPT_TIMEOUT},
            {"on-timeout", required_argument, NULL, OPT_ON_TIMEOUT},
            {"env", required_argument, NULL, 'e'},
            {"metadata", required_argument, NULL, 'm'},
            {"no-wait", no_argument, NULL, OPT_NO_WAIT},
            {"encrypted", no_argument, NULL, OPT_ENCRYPTED},
            CLI_GLOBAL_OPTIONS,
            {0},
        };
        json_t *req = json_object();
        json_t *env = json_object();
        json_t *meta = json_object();
        const char *tmpl = "base";
        bool wait = true;
        int rc = CLI_OK, opt;
        long long v;
        while ((opt = getopt_long(argc, argv, "he:m:", opts, NULL)) != -1) {
                if (cli_global_opt(c, opt, optarg))
                        continue;
                switch (opt) {
                case 'h':
                        help();
                        goto out;
                case OPT_TEMPLATE:
                        tmpl = optarg;
                        break;
                case OPT_RUNTIME:
                        if (strcmp(optarg, "ns") != 0 && strcmp(optarg, "vm") != 0) {
                                rc = cli_usage_error("create", "--runtime must be ns or vm");
                                goto out;
                        }
                        json_object_set_new(req, "runtime", json_string(optarg));
                        break;
                case OPT_CPUS: {
                        char *end;
                        double d = strtod(optarg, &end);
                        if (*end || end == optarg || !(d > 0) || d > 1024) {
                                rc = cli_usage_error("create", "bad --cpus '%s'", optarg);
                                goto out;
                        }
                        json_object_set_new(req, "cpus",
                                            d == (long long)d ? json_integer((long long)d)
                                                              : json_real(d));
                        break;
                }
                case OPT_MEMORY:
                case OPT_DISK:
                case OPT_TIMEOUT:
                        if (!cli_parse_uint(optarg, 1LL << 40, &v)) {
                                rc = cli_usage_error("create", "bad number '%s'", optarg);
                                goto out;
                        }
                        json_object_set_new(req,
                                            opt == OPT_MEMORY ? "memory_mb"
                                            : opt == OPT_DISK ? "disk_mb"
                                                              : "timeout_s",
                                            json_integer(v));
                        break;
                case OPT_ON_TIMEOUT:
                        if (strcmp(optarg, "kill") != 0 && strcmp(optarg, "pause") != 0) {
                                rc =
                                    cli_usage_error("create", "--on-timeout must be kill or pause");
                                goto out;
                        }
                        json_object_set_new(req, "on_timeout", json_string(optarg));
                        break;
                case 'e':
                case 'm':
                        if (!cli_kv_add(opt == 'e' ? env : meta, optarg)) {
                                rc = cli_usage_error("create", "expected K=V, got '%s'", optarg);
                                goto out;
                        }
                        break;
                case OPT_NO_WAIT:
                        wait = false;
                        break;
                case OPT_ENCRYPTED:
                        json_object_set_new(req, "storage_encrypted", json_true());
                        break;
                default:
                        rc = cli_usage_error("create", "bad option");
                        goto out;
                }
        }
        if (optind < argc) {
                rc = cli_usage_error("create", "unexpected argument '%s'", argv[optind]);
                goto out;
        }
        json_object_set_new(req, "template", json_string(tmpl));
        if (json_object_size(env))
                json_object_set(req, "env", env);
        if (json_object_size(meta))
                json_object_set(req, "metadata", meta);

        struct cove_err err = {0};
        json_t *sbx = NULL;
        if (cli_call(c, "POST", "/v1/sandboxes", req, &sbx, "creating sandbox", &err) < 0) {
                rc = cli_fail(&err);
                goto out;
        }
        const char *id = json_string_value(json_object_get(sbx, "id"));
        if (!id) {
                json_decref(sbx);
                cove_err_set(&err, 0, "bad answer from coved: sandbox without an id");
                rc = cli_fail(&err);
                goto out;
        }
        if (wait && wait_started(c, &sbx, &err) < 0) {
                rc = cli_fail(&err);
                json_decref(sbx);
                goto out;
        }
        if (c->json) {
                rc = cli_print_json(c, sbx);
        } else {
                printf("%s\n", json_string_value(json_object_get(sbx, "id")));
                rc = fflush(stdout) == 0 ? CLI_OK : CLI_FAIL;
        }
        json_decref(sbx);
out:
        json_decref(req);
        json_decref(env);
        json_decref(meta);
        return rc;
}
