/* cove audit: the audit log (GET /v1/audit) as a table or JSON, optionally followed, and
 * `cove audit verify` (GET /v1/audit/verify). cove leases: credential leases (list, grant,
 * approve, deny, revoke). docs/cli.md. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "client.h"
#include "cove.h"
#include "util/cleanup.h"

static void audit_help(void)
{
        puts("Usage: cove audit [--sandbox ID] [--kind KIND] [--after SEQ] [--limit N]\n"
             "                  [--tenant T] [--follow] [--json]\n"
             "       cove audit verify\n"
             "\n"
             "Show audit events (egress verdicts, DNS refusals, credential injections, leases,\n"
             "control signals), oldest first. --follow keeps printing new events. --json\n"
             "prints one JSON object per event. --tenant (admin keys): another tenant's\n"
             "events. 'verify' recomputes the hash chain and\n"
             "reports the first broken link (exit status 1 when broken).");
}

static void summary(json_t *d, char *out, size_t cap)
{
        const char *keys[] = {"secret", "sni",   "host",     "dst", "port", "rule",
                              "reason", "lease", "snapshot", "cmd", "path", NULL};
        size_t o = 0;
        out[0] = '\0';
        for (int i = 0; keys[i] && o + 1 < cap; i++) {
                json_t *v = json_object_get(d, keys[i]);
                if (json_is_string(v) && *json_string_value(v))
                        o += (size_t)snprintf(out + o, cap - o, "%s%s=%s", o ? " " : "", keys[i],
                                              json_string_value(v));
                else if (json_is_integer(v))
                        o += (size_t)snprintf(out + o, cap - o, "%s%s=%lld", o ? " " : "", keys[i],
                                              (long long)json_integer_value(v));
        }
        if (!o) {
                cleanup_free char *s = json_dumps(d, JSON_COMPACT | JSON_SORT_KEYS);
                snprintf(out, cap, "%s", s ? s : "");
        }
}

static int print_events(struct cli *c, json_t *events, int *header)
{
        size_t i;
        json_t *e;
        json_array_foreach(events, i, e)
        {
                if (c->json) {
                        cleanup_free char *s = json_dumps(e, JSON_COMPACT);
                        printf("%s\n", s ? s : "{}");
                        continue;
                }
                if (!*header) {
                        printf("%-7s %-24s %-28s %-8s %-13s %-7s %s\n", "SEQ", "TIME", "SANDBOX",
                               "KIND", "ACTION", "VERDICT", "DETAIL");
                        *header = 1;
                }
                char det[512];
                summary(json_object_get(e, "detail"), det, sizeof(det));
                const char *sb = json_string_value(json_object_get(e, "sandbox"));
                const char *vd = json_string_value(json_object_get(e, "verdict"));
                printf("%-7lld %-24s %-28s %-8s %-13s %-7s %s\n",
                       (long long)json_integer_value(json_object_get(e, "seq")),
                       json_string_value(json_object_get(e, "at"))
                           ? json_string_value(json_object_get(e, "at"))
                           : "-",
                       sb && *sb ? sb : "-", json_string_value(json_object_get(e, "kind")),
                       json_string_value(json_object_get(e, "action")), vd && *vd ? vd : "-", det);
        }
        fflush(stdout);
        return 0;
}

static int verify(struct cli *c)
{
        struct cove_err err = {0};
        json_t *r = NULL;
        if (cli_call(c, "GET", "/v1/audit/verify", NULL, &r, NULL, &err) < 0)
                return cli_fail(&err);
        int ok = json_is_true(json_object_get(r, "ok"));
        if (c->json) {
                cli_print_json(c, r);
        } else if (ok) {
                printf("audit chain intact: %lld events checked\n",
                       (long long)json_integer_value(json_object_get(r, "checked")));
        } else {
                printf("audit chain BROKEN at event %lld: %s\n",
                       (long long)json_integer_value(json_object_get(r, "first_broken_seq")),
                       json_string_value(json_object_get(r, "reason"))
                           ? json_string_value(json_object_get(r, "reason"))
                           : "");
        }
        json_decref(r);
        return ok ? CLI_OK : CLI_FAIL;
}

int cmd_audit(struct cli *c, int argc, char **argv)
{
        enum { O_SANDBOX = CLI_OPT_VERB_BASE, O_KIND, O_AFTER, O_LIMIT, O_FOLLOW, O_TENANT };
        static const struct option opts[] = {{"sandbox", required_argument, NULL, O_SANDBOX},
                                             {"kind", required_argument, NULL, O_KIND},
                                             {"after", required_argument, NULL, O_AFTER},
                                             {"limit", required_argument, NULL, O_LIMIT},
                                             {"follow", no_argument, NULL, O_FOLLOW},
                                             {"tenant", required_argument, NULL, O_TENANT},
                                             CLI_GLOBAL_OPTIONS,
                                             {0}};
        const char *sandbox = NULL, *kind = NULL, *tenant = NULL;
        long long after = 0, limit = 1000;
        int follow = 0, opt;
        while ((opt = getopt_long(argc, argv, "hf", opts, NULL)) != -1) {
                if (cli_global_opt(c, opt, optarg))
                        continue;
                switch (opt) {
                case 'h':
                        audit_help();
                        return CLI_OK;
                case O_SANDBOX:
                        sandbox = optarg;
                        break;
                case O_KIND:
                        kind = optarg;
                        break;
                case O_TENANT:
                        tenant = optarg;
                        break;
                case O_AFTER:
                        if (!cli_parse_uint(optarg, 1LL << 62, &after))
                                return cli_usage_error("audit", "bad --after '%s'", optarg);
                        break;
                case O_LIMIT:
                        if (!cli_parse_uint(optarg, 10000, &limit) || limit < 1)
                                return cli_usage_error("audit", "--limit is 1 to 10000");
                        break;
                case 'f':
                case O_FOLLOW:
                        follow = 1;
                        break;
                default:
                        return cli_usage_error("audit", "bad option");
                }
        }
        if (argc - optind == 1 && !strcmp(argv[optind], "verify"))
                return verify(c);
        if (argc - optind != 0)
                return cli_usage_error("audit", "unexpected argument '%s'", argv[optind]);
        cleanup_free char *sq = sandbox ? cli_urlenc(sandbox) : NULL;
        cleanup_free char *kq = kind ? cli_urlenc(kind) : NULL;
        cleanup_free char *tq = tenant ? cli_urlenc(tenant) : NULL;
        int header = 0;
        for (;;) {
                cleanup_free char *path =
                    cli_fmt("/v1/audit?after=%lld&limit=%lld%s%s%s%s%s%s", after, limit,
                            sq ? "&sandbox=" : "", sq ? sq : "", kq ? "&kind=" : "", kq ? kq : "",
                            tq ? "&tenant=" : "", tq ? tq : "");
                struct cove_err err = {0};
                json_t *r = NULL;
                if (cli_call(c, "GET", path, NULL, &r, NULL, &err) < 0)
                        return cli_fail(&err);
                json_t *ev = json_object_get(r, "events");
                print_events(c, ev, &header);
                after = (long long)json_integer_value(json_object_get(r, "next_after"));
                size_t n = json_array_size(ev);
                json_decref(r);
                if (!follow && (long long)n < limit)
                        return CLI_OK;
                if (follow && (long long)n < limit)
                        sleep(1); /* polling: the API has no push for the audit log */
        }
}

static void leases_help(void)
{
        puts("Usage: cove leases [--sandbox ID]\n"
             "       cove leases grant SANDBOX SECRET --ttl SECONDS\n"
             "       cove leases approve LEASE [--ttl SECONDS]\n"
             "       cove leases deny LEASE\n"
             "       cove leases revoke LEASE\n"
             "\n"
             "Credential leases: a secret injected for one sandbox until the lease ends.\n"
             "Sandboxes ask with 'cove-guest request-credential NAME --reason TEXT'; such\n"
             "requests show as pending until approved or denied.");
}

static int print_leases(struct cli *c, json_t *leases)
{
        if (c->json)
                return cli_print_json(c, leases);
        printf("%-30s %-28s %-16s %-8s %-24s %s\n", "LEASE", "SANDBOX", "SECRET", "STATE",
               "EXPIRES", "REASON");
        size_t i;
        json_t *l;
        json_array_foreach(leases, i, l)
        {
                const char *exp = json_string_value(json_object_get(l, "expires_at"));
                const char *why = json_string_value(json_object_get(l, "reason"));
                printf("%-30s %-28s %-16s %-8s %-24s %s\n",
                       json_string_value(json_object_get(l, "id")),
                       json_string_value(json_object_get(l, "sandbox")),
                       json_string_value(json_object_get(l, "secret")),
                       json_string_value(json_object_get(l, "state")), exp ? exp : "-",
                       why ? why : "");
        }
        return CLI_OK;
}

int cmd_leases(struct cli *c, int argc, char **argv)
{
        enum { O_SANDBOX = CLI_OPT_VERB_BASE, O_TTL };
        static const struct option opts[] = {{"sandbox", required_argument, NULL, O_SANDBOX},
                                             {"ttl", required_argument, NULL, O_TTL},
                                             CLI_GLOBAL_OPTIONS,
                                             {0}};
        const char *sandbox = NULL;
        long long ttl = 0;
        int opt;
        while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
                if (cli_global_opt(c, opt, optarg))
                        continue;
                switch (opt) {
                case 'h':
                        leases_help();
                        return CLI_OK;
                case O_SANDBOX:
                        sandbox = optarg;
                        break;
                case O_TTL:
                        if (!cli_parse_uint(optarg, 7 * 24 * 3600, &ttl) || ttl < 1)
                                return cli_usage_error("leases", "--ttl is 1 to 604800 seconds");
                        break;
                default:
                        return cli_usage_error("leases", "bad option");
                }
        }
        int n = argc - optind;
        const char *sub = n ? argv[optind] : NULL;
        struct cove_err err = {0};
        json_t *r = NULL, *body = NULL;
        cleanup_free char *path = NULL;
        const char *method = "POST";
        if (!sub) {
                cleanup_free char *sq = sandbox ? cli_urlenc(sandbox) : NULL;
                path = sq ? cli_fmt("/v1/sandboxes/%s/leases", sq) : cli_fmt("/v1/leases");
                if (cli_call(c, "GET", path, NULL, &r, NULL, &err) < 0)
                        return cli_fail(&err);
                int rc = print_leases(c, json_object_get(r, "leases"));
                json_decref(r);
                return rc;
        }
        if (!strcmp(sub, "grant")) {
                if (n != 3 || !ttl)
                        return cli_usage_error("leases", "grant SANDBOX SECRET --ttl SECONDS");
                cleanup_free char *sq = cli_urlenc(argv[optind + 1]);
                path = cli_fmt("/v1/sandboxes/%s/leases", sq);
                body =
                    json_pack("{s:s, s:I}", "secret", argv[optind + 2], "ttl_s", (json_int_t)ttl);
        } else if (!strcmp(sub, "approve") || !strcmp(sub, "deny") || !strcmp(sub, "revoke")) {
                if (n != 2)
                        return cli_usage_error("leases", "%s LEASE", sub);
                cleanup_free char *lq = cli_urlenc(argv[optind + 1]);
                if (!strcmp(sub, "revoke")) {
                        method = "DELETE";
                        path = cli_fmt("/v1/leases/%s", lq);
                } else {
                        path = cli_fmt("/v1/leases/%s/%s", lq, sub);
                        body = json_object();
                        if (ttl && !strcmp(sub, "approve"))
                                json_object_set_new(body, "ttl_s", json_integer(ttl));
                }
        } else {
                return cli_usage_error("leases", "unknown subcommand '%s'", sub);
        }
        int rr = cli_call(c, method, path, body, &r, NULL, &err);
        json_decref(body);
        if (rr < 0)
                return cli_fail(&err);
        if (c->json && r)
                cli_print_json(c, r);
        else if (r)
                printf("%s %s\n", json_string_value(json_object_get(r, "id")),
                       json_string_value(json_object_get(r, "state")));
        else
                printf("%s revoked\n", argv[optind + 1]);
        json_decref(r);
        return CLI_OK;
}
