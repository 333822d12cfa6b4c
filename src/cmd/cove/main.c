/* cove: the command-line client of coved. Parses the global options, then hands the rest of
 * argv to one verb (one file per verb, kvmtool/crun style). Exit codes: 0 ok, 1 failure,
 * 2 usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>

#include "client.h"
#include "cove.h"

#ifndef COVE_VERSION
#define COVE_VERSION "dev"
#endif

struct verb {
        const char *name;
        cli_verb_fn fn;
        const char *summary;
};

static const struct verb verbs[] = {
    {"up", cmd_up, "run coved in the foreground"},
    {"create", cmd_create, "create a sandbox and print its id"},
    {"ls", cmd_ls, "list sandboxes"},
    {"inspect", cmd_inspect, "show a sandbox as JSON"},
    {"exec", cmd_exec, "run a command in a sandbox (-it for a terminal)"},
    {"cp", cmd_cp, "copy a file into or out of a sandbox"},
    {"rm", cmd_rm, "destroy sandboxes"},
    {"timeout", cmd_timeout, "set a sandbox's remaining lifetime"},
    {"snapshot", cmd_snapshot, "take a snapshot of a sandbox"},
    {"snapshots", cmd_snapshots, "show a sandbox's snapshot timeline"},
    {"pause", cmd_pause, "snapshot a sandbox, then stop it"},
    {"resume", cmd_resume, "start a paused sandbox from a snapshot"},
    {"rewind", cmd_rewind, "put a sandbox back to a snapshot (undoable)"},
    {"fork", cmd_fork, "new sandboxes from a snapshot"},
    {"port", cmd_port, "expose a sandbox's port: add, ls, rm"},
    {"diff", cmd_diff, "what changed between two snapshots"},
    {"mcp", cmd_mcp, "serve the Model Context Protocol on stdio"},
    {"logs", cmd_logs, "reattach to a process's output"},
    {"secret", cmd_secret, "secrets the egress proxy injects: set, ls, rm"},
    {"egress", cmd_egress, "a sandbox's egress policy: show, set"},
    {"audit", cmd_audit, "show (--follow) or verify the audit log"},
    {"leases", cmd_leases, "credential leases: list, grant, approve, deny, revoke"},
    {"keys", cmd_keys, "tenant data keys: status, list, add, rotate, revoke"},
    {"tenants", cmd_tenants, "tenants, their quotas and API keys (admin)"},
    {"template", cmd_template, "build templates from images; ls, inspect, rm"},
    {"nodes", cmd_nodes, "cluster nodes: ls, cordon, uncordon, drain (admin)"},
};

static void usage(FILE *f)
{
        fputs("Usage: cove [--url URL] [--api-key KEY] [--json] COMMAND [ARGS...]\n"
              "\n"
              "Commands:\n",
              f);
        for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++)
                fprintf(f, "  %-9s %s\n", verbs[i].name, verbs[i].summary);
        fputs("  version   print the client version\n"
              "\n"
              "Global options (also accepted after COMMAND):\n"
              "  --url URL       coved endpoint: http(s)://HOST:PORT or unix:/path/coved.sock\n"
              "                  (default: $COVE_URL, else $COVE_DATA_DIR/coved.sock)\n"
              "  --api-key KEY   API key (default: $COVE_API_KEY, else the admin key in\n"
              "                  $COVE_DATA_DIR/admin.key when using the local socket)\n"
              "  --json          machine-readable output\n"
              "  -h, --help      help; 'cove COMMAND --help' for a command\n"
              "\n"
              "Exit status: 0 ok, 1 failure, 2 usage error; 'cove exec' exits with the\n"
              "command's status. See docs/cli.md.\n",
              f);
}

int main(int argc, char **argv)
{
        struct cli c = {
            .out_tty = isatty(STDOUT_FILENO) == 1,
            .err_tty = isatty(STDERR_FILENO) == 1,
        };
        static const struct option opts[] = {
            CLI_GLOBAL_OPTIONS,
            {"version", no_argument, NULL, 'V'},
            {0},
        };
        cli_getopt_reset();
        int opt;
        while ((opt = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
                if (cli_global_opt(&c, opt, optarg))
                        continue;
                switch (opt) {
                case 'h':
                        usage(stdout);
                        return CLI_OK;
                case 'V':
                        printf("cove %s\n", COVE_VERSION);
                        return CLI_OK;
                default:
                        fputs("Try 'cove --help'.\n", stderr);
                        return CLI_USAGE;
                }
        }
        if (optind >= argc) {
                usage(stderr);
                return CLI_USAGE;
        }
        const char *name = argv[optind];
        if (strcmp(name, "version") == 0) {
                if (c.json)
                        printf("{\"version\":\"%s\"}\n", COVE_VERSION);
                else
                        printf("cove %s\n", COVE_VERSION);
                return CLI_OK;
        }
        if (strcmp(name, "help") == 0) {
                if (optind + 1 < argc) {
                        for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++) {
                                if (strcmp(verbs[i].name, argv[optind + 1]) == 0) {
                                        char *hargv[] = {argv[optind + 1], "--help", NULL};
                                        cli_getopt_reset();
                                        return verbs[i].fn(&c, 2, hargv);
                                }
                        }
                }
                usage(stdout);
                return CLI_OK;
        }
        for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++) {
                if (strcmp(verbs[i].name, name) != 0)
                        continue;
                if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
                        fputs("cove: cannot initialise libcurl\n", stderr);
                        return CLI_FAIL;
                }
                int vargc = argc - optind;
                char **vargv = argv + optind;
                cli_getopt_reset();
                int rc = verbs[i].fn(&c, vargc, vargv);
                fflush(stdout);
                cli_disconnect(&c);
                curl_global_cleanup();
                return rc;
        }
        return cli_usage_error(NULL, "unknown command '%s'", name);
}
