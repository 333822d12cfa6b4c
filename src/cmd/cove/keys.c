/* cove keys / cove tenants: tenant data keys (BYOK) and tenant administration
 * (docs/cli.md "Tenants and keys"): thin wrappers over /v1/keys and /v1/tenants. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "cove.h"
#include "util/cleanup.h"

enum {
        O_TENANT = CLI_OPT_VERB_BASE,
        O_PROVIDER,
        O_KEY_FILE,
        O_WRAP,
        O_UNWRAP,
        O_KEY_ID,
        O_TIMEOUT,
        O_POLICY,
        O_ID,
        O_NAME,
        O_SANDBOXES,
        O_CPUS,
        O_MEMORY,
        O_STORAGE,
        O_ADMIN,
};

static void keys_help(void)
{
        puts("Usage: cove keys COMMAND [OPTIONS]\n"
             "\n"
             "A tenant's data key is stored wrapped by its key-encryption key (KEK).\n"
             "  status [--tenant T]        the key's provider, key id, version, state\n"
             "  list                       every tenant's key (admin)\n"
             "  add [--tenant T] --provider local [--key-file FILE]\n"
             "  add [--tenant T] --provider command --wrap-cmd CMD --unwrap-cmd CMD\n"
             "      [--key-id ID] [--timeout-ms N]\n"
             "                             rewrap the data key under a new KEK (admin); no\n"
             "                             data is re-encrypted. No --key-file: the node key\n"
             "  rotate [--tenant T] [same options as add]\n"
             "                             rewrap again (under the same or a new KEK; admin)\n"
             "  revoke [--tenant T] [--policy stop|finish]\n"
             "                             nothing of the tenant starts, resumes or reads from\n"
             "                             then on; stop (default) stops its sandboxes, finish\n"
             "                             lets running ones end (no new snapshots)\n"
             "--tenant: another tenant than the key's own (admin keys only).");
}

static void print_key(const json_t *k)
{
        const char *kid = json_string_value(json_object_get(k, "key_id"));
        printf("%-26s %-8s %-8s v%-3lld %s\n", json_string_value(json_object_get(k, "tenant")),
               json_string_value(json_object_get(k, "state")),
               json_string_value(json_object_get(k, "provider")),
               (long long)json_integer_value(json_object_get(k, "version")), kid ? kid : "-");
}

static int show(struct cli *c, json_t *out)
{
        int rc = CLI_OK;
        if (c->json) {
                rc = cli_print_json(c, out);
        } else if (json_is_array(json_object_get(out, "keys"))) {
                printf("%-26s %-8s %-8s %-4s %s\n", "TENANT", "STATE", "PROVIDER", "VER", "KEY_ID");
                size_t i;
                json_t *k;
                json_array_foreach(json_object_get(out, "keys"), i, k) print_key(k);
        } else {
                print_key(out);
                json_t *sb = json_object_get(out, "sandboxes_stopped");
                if (sb)
                        printf("policy %s: %lld sandboxes stopped\n",
                               json_string_value(json_object_get(out, "policy")),
                               (long long)json_integer_value(sb));
        }
        json_decref(out);
        return rc;
}

int cmd_keys(struct cli *c, int argc, char **argv)
{
        static const struct option opts[] = {{"tenant", required_argument, NULL, O_TENANT},
                                             {"provider", required_argument, NULL, O_PROVIDER},
                                             {"key-file", required_argument, NULL, O_KEY_FILE},
                                             {"wrap-cmd", required_argument, NULL, O_WRAP},
                                             {"unwrap-cmd", required_argument, NULL, O_UNWRAP},
                                             {"key-id", required_argument, NULL, O_KEY_ID},
                                             {"timeout-ms", required_argument, NULL, O_TIMEOUT},
                                             {"policy", required_argument, NULL, O_POLICY},
                                             CLI_GLOBAL_OPTIONS,
                                             {0}};
        const char *tenant = NULL, *policy = NULL;
        json_t *spec = json_object();
        int opt;
        long long to;
        while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
                if (cli_global_opt(c, opt, optarg))
                        continue;
                switch (opt) {
                case 'h':
                        keys_help();
                        json_decref(spec);
                        return CLI_OK;
                case O_TENANT:
                        tenant = optarg;
                        break;
                case O_PROVIDER:
                        json_object_set_new(spec, "provider", json_string(optarg));
                        break;
                case O_KEY_FILE: {
                        char abs[PATH_MAX];
                        /* the server wants an absolute path (it reads the file on the node) */
                        json_object_set_new(spec, "key_file",
                                            json_string(realpath(optarg, abs) ? abs : optarg));
                        break;
                }
                case O_WRAP:
                        json_object_set_new(spec, "wrap_cmd", json_string(optarg));
                        break;
                case O_UNWRAP:
                        json_object_set_new(spec, "unwrap_cmd", json_string(optarg));
                        break;
                case O_KEY_ID:
                        json_object_set_new(spec, "key_id", json_string(optarg));
                        break;
                case O_TIMEOUT:
                        if (!cli_parse_uint(optarg, 600000, &to)) {
                                json_decref(spec);
                                return cli_usage_error("keys", "bad --timeout-ms '%s'", optarg);
                        }
                        json_object_set_new(spec, "timeout_ms", json_integer(to));
                        break;
                case O_POLICY:
                        policy = optarg;
                        break;
                default:
                        json_decref(spec);
                        return cli_usage_error("keys", "bad option");
                }
        }
        if (argc - optind != 1) {
                json_decref(spec);
                return cli_usage_error("keys", "expected one of status, list, add, rotate, "
                                               "revoke");
        }
        const char *sub = argv[optind];
        const char *method = "POST", *path = NULL;
        json_t *body = NULL;
        cleanup_free char *q = NULL;
        if (!strcmp(sub, "status") || !strcmp(sub, "list")) {
                method = "GET";
                if (!strcmp(sub, "list"))
                        q = cli_fmt("/v1/keys?all=true");
                else if (tenant) {
                        cleanup_free char *t = cli_urlenc(tenant);
                        q = cli_fmt("/v1/keys?tenant=%s", t);
                } else
                        q = cli_fmt("/v1/keys");
                path = q;
        } else if (!strcmp(sub, "add") || !strcmp(sub, "rotate")) {
                if (!strcmp(sub, "add") && !json_object_get(spec, "provider")) {
                        json_decref(spec);
                        return cli_usage_error("keys", "add needs --provider local|command");
                }
                path = !strcmp(sub, "add") ? "/v1/keys" : "/v1/keys/rotate";
                body = json_incref(spec);
        } else if (!strcmp(sub, "revoke")) {
                path = "/v1/keys/revoke";
                body = json_object();
                if (policy)
                        json_object_set_new(body, "policy", json_string(policy));
                if (!tenant) {
                        /* the server wants the tenant named: ours, as the key status says */
                        struct cove_err e0 = {0};
                        json_t *st = NULL;
                        if (cli_call(c, "GET", "/v1/keys", NULL, &st, NULL, &e0) < 0) {
                                json_decref(spec);
                                json_decref(body);
                                return cli_fail(&e0);
                        }
                        json_object_set(body, "tenant", json_object_get(st, "tenant"));
                        json_decref(st);
                }
        } else {
                json_decref(spec);
                return cli_usage_error("keys", "unknown command '%s'", sub);
        }
        json_decref(spec);
        if (body && tenant)
                json_object_set_new(body, "tenant", json_string(tenant));
        struct cove_err err = {0};
        json_t *out = NULL;
        int r = cli_call(c, method, path, body, &out, NULL, &err);
        json_decref(body);
        if (r < 0)
                return cli_fail(&err);
        return show(c, out);
}

static void tenants_help(void)
{
        puts("Usage: cove tenants COMMAND [OPTIONS]   (admin key)\n"
             "\n"
             "  ls                                 tenants with quotas and usage\n"
             "  create [--id ID] [--name NAME] [QUOTAS]   prints the new tenant's id\n"
             "  quota ID QUOTAS                    set quotas (0 = unlimited)\n"
             "  rm ID                              delete (no sandboxes left; revokes its keys)\n"
             "  key ID [--admin]                   issue an API key: printed once, keep it\n"
             "  keys ID                            list its API keys (ids only)\n"
             "  revoke-key ID KEY_ID               revoke one API key\n"
             "QUOTAS: --sandboxes N --cpus N --memory MB --storage MB");
}

int cmd_tenants(struct cli *c, int argc, char **argv)
{
        static const struct option opts[] = {{"id", required_argument, NULL, O_ID},
                                             {"name", required_argument, NULL, O_NAME},
                                             {"sandboxes", required_argument, NULL, O_SANDBOXES},
                                             {"cpus", required_argument, NULL, O_CPUS},
                                             {"memory", required_argument, NULL, O_MEMORY},
                                             {"storage", required_argument, NULL, O_STORAGE},
                                             {"admin", no_argument, NULL, O_ADMIN},
                                             CLI_GLOBAL_OPTIONS,
                                             {0}};
        json_t *quotas = json_object(), *body = json_object();
        int opt, admin = 0;
        long long v;
        while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
                if (cli_global_opt(c, opt, optarg))
                        continue;
                const char *qn = opt == O_SANDBOXES ? "sandboxes"
                                 : opt == O_CPUS    ? "cpus"
                                 : opt == O_MEMORY  ? "memory_mb"
                                 : opt == O_STORAGE ? "storage_mb"
                                                    : NULL;
                if (qn) {
                        if (!cli_parse_uint(optarg, 1LL << 40, &v)) {
                                json_decref(quotas);
                                json_decref(body);
                                return cli_usage_error("tenants", "bad quota '%s'", optarg);
                        }
                        json_object_set_new(quotas, qn, json_integer(v));
                        continue;
                }
                switch (opt) {
                case 'h':
                        tenants_help();
                        json_decref(quotas);
                        json_decref(body);
                        return CLI_OK;
                case O_ID:
                        json_object_set_new(body, "id", json_string(optarg));
                        break;
                case O_NAME:
                        json_object_set_new(body, "name", json_string(optarg));
                        break;
                case O_ADMIN:
                        admin = 1;
                        break;
                default:
                        json_decref(quotas);
                        json_decref(body);
                        return cli_usage_error("tenants", "bad option");
                }
        }
        if (json_object_size(quotas))
                json_object_set(body, "quotas", quotas);
        json_decref(quotas);
        int n = argc - optind;
        const char *sub = n > 0 ? argv[optind] : "";
        cleanup_free char *id = n > 1 ? cli_urlenc(argv[optind + 1]) : NULL;
        cleanup_free char *kid = n > 2 ? cli_urlenc(argv[optind + 2]) : NULL;
        cleanup_free char *path = NULL;
        const char *method = "GET";
        int want = 1;
        if (!strcmp(sub, "ls")) {
                path = cli_fmt("/v1/tenants");
        } else if (!strcmp(sub, "create")) {
                method = "POST";
                path = cli_fmt("/v1/tenants");
        } else if (!strcmp(sub, "quota")) {
                method = "PUT", want = 2;
                path = id ? cli_fmt("/v1/tenants/%s/quotas", id) : NULL;
        } else if (!strcmp(sub, "rm")) {
                method = "DELETE", want = 2;
                path = id ? cli_fmt("/v1/tenants/%s", id) : NULL;
        } else if (!strcmp(sub, "key")) {
                method = "POST", want = 2;
                json_object_set_new(body, "admin", json_boolean(admin));
                path = id ? cli_fmt("/v1/tenants/%s/api-keys", id) : NULL;
        } else if (!strcmp(sub, "keys")) {
                want = 2;
                path = id ? cli_fmt("/v1/tenants/%s/api-keys", id) : NULL;
        } else if (!strcmp(sub, "revoke-key")) {
                method = "DELETE", want = 3;
                path = kid ? cli_fmt("/v1/tenants/%s/api-keys/%s", id, kid) : NULL;
        } else {
                json_decref(body);
                return cli_usage_error("tenants", "expected ls, create, quota, rm, key, keys or "
                                                  "revoke-key");
        }
        if (n != want || !path) {
                json_decref(body);
                return cli_usage_error("tenants", "wrong number of arguments for %s", sub);
        }
        struct cove_err err = {0};
        json_t *out = NULL;
        int r = cli_call(c, method, path,
                         strcmp(method, "GET") && strcmp(method, "DELETE") ? body : NULL, &out,
                         NULL, &err);
        json_decref(body);
        if (r < 0)
                return cli_fail(&err);
        int rc = CLI_OK;
        if (c->json && out) {
                rc = cli_print_json(c, out);
        } else if (!strcmp(sub, "create")) {
                printf("%s\n", json_string_value(json_object_get(out, "id")));
        } else if (!strcmp(sub, "key")) {
                printf("%s\n", json_string_value(json_object_get(out, "key")));
        } else if (!strcmp(sub, "ls") || !strcmp(sub, "quota")) {
                json_t *arr = json_object_get(out, "tenants");
                if (!arr) {
                        arr = json_array();
                        json_array_append(arr, out);
                } else {
                        json_incref(arr);
                }
                printf("%-26s %-20s %-18s %s\n", "ID", "NAME", "SANDBOXES", "CPUS MEM_MB DISK_MB");
                size_t i;
                json_t *t;
                json_array_foreach(arr, i, t)
                {
                        json_t *u = json_object_get(t, "usage"), *q = json_object_get(t, "quotas");
                        char sb[32];
                        snprintf(sb, sizeof(sb), "%lld/%lld",
                                 (long long)json_integer_value(json_object_get(u, "sandboxes")),
                                 (long long)json_integer_value(json_object_get(q, "sandboxes")));
                        printf("%-26s %-20.20s %-18s %lld/%lld %lld/%lld %lld/%lld\n",
                               json_string_value(json_object_get(t, "id")),
                               json_string_value(json_object_get(t, "name")), sb,
                               (long long)json_integer_value(json_object_get(u, "cpus")),
                               (long long)json_integer_value(json_object_get(q, "cpus")),
                               (long long)json_integer_value(json_object_get(u, "memory_mb")),
                               (long long)json_integer_value(json_object_get(q, "memory_mb")),
                               (long long)json_integer_value(json_object_get(u, "storage_mb")),
                               (long long)json_integer_value(json_object_get(q, "storage_mb")));
                }
                json_decref(arr);
        } else if (!strcmp(sub, "keys")) {
                size_t i;
                json_t *k;
                json_array_foreach(json_object_get(out, "api_keys"), i, k)
                {
                        printf("%s %s%s %s\n", json_string_value(json_object_get(k, "id")),
                               json_is_true(json_object_get(k, "revoked")) ? "revoked" : "active",
                               json_is_true(json_object_get(k, "admin")) ? ",admin" : "",
                               json_string_value(json_object_get(k, "created_at")));
                }
        }
        json_decref(out);
        return rc;
}
