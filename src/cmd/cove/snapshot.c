/* cove snapshot | snapshots | pause | resume | rewind | fork: the time machine verbs
 * (docs/api.md "Snapshots"). Each is one API call with a spinner on a terminal while it
 * runs; `snapshots` prints the timeline as a table, --json prints the server's answers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "cove.h"
#include "util/cleanup.h"

enum { OPT_LABEL = CLI_OPT_VERB_BASE, OPT_SNAPSHOT, OPT_COUNT, OPT_KIND };

static const char *str_or_dash(json_t *o, const char *k)
{
        const char *s = json_string_value(json_object_get(o, k));
        return s && *s ? s : "-";
}

static void human_bytes(json_t *v, char *out, size_t cap)
{
        double b = (double)json_integer_value(v);
        const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
        int i = 0;
        while (b >= 1024 && i < 4) {
                b /= 1024;
                i++;
        }
        if (!json_is_integer(v))
                snprintf(out, cap, "-");
        else if (i == 0)
                snprintf(out, cap, "%.0f B", b);
        else
                snprintf(out, cap, "%.1f %s", b, u[i]);
}

static void help(const char *verb)
{
        if (!strcmp(verb, "snapshot"))
                puts("Usage: cove snapshot ID [--label L] [--kind files|full]\n"
                     "\n"
                     "Take a snapshot of a running sandbox and wait until it is complete.\n"
                     "--kind files: its files only (the shortest pause); full: files, memory\n"
                     "and processes, or an error where the node cannot. Default: full where\n"
                     "the node can, else files. Prints the snapshot id; --json prints the\n"
                     "snapshot.");
        else if (!strcmp(verb, "snapshots"))
                puts("Usage: cove snapshots ID\n"
                     "\n"
                     "The sandbox's timeline, newest first: time, id, kind, size, bytes the\n"
                     "snapshot added to the store, pause, label, and whether it was a rolling\n"
                     "snapshot. --json prints {\"snapshots\":[...]}.");
        else if (!strcmp(verb, "pause"))
                puts("Usage: cove pause ID\n"
                     "\n"
                     "Snapshot the sandbox, then stop it (frees its memory and CPU). Prints\n"
                     "the snapshot id; `cove resume ID` brings it back.");
        else if (!strcmp(verb, "resume"))
                puts("Usage: cove resume ID [--snapshot SNAP]\n"
                     "\n"
                     "Start a paused (or stopped) sandbox again from its newest snapshot, or\n"
                     "from SNAP. Same id.");
        else if (!strcmp(verb, "rewind"))
                puts("Usage: cove rewind ID SNAP\n"
                     "\n"
                     "Put the sandbox back to snapshot SNAP. Its current state is snapshotted\n"
                     "first; that id is printed (undo with `cove rewind ID UNDO`).");
        else
                puts("Usage: cove fork ID [--snapshot SNAP] [--count N]\n"
                     "\n"
                     "New sandboxes from a snapshot of ID (default: its current state); prints\n"
                     "their ids, one per line. --count 1..20 (default 1).");
}

static int print_timeline(json_t *list)
{
        enum { NC = 8 };
        static const char *heads[NC] = {"TIME", "ID",    "KIND",  "SIZE",
                                        "NEW",  "PAUSE", "LABEL", "ROLLING"};
        size_t n = json_array_size(list);
        char(*cells)[NC][80] = calloc(n ? n : 1, sizeof(*cells));
        if (!cells)
                return CLI_FAIL;
        int w[NC];
        for (int k = 0; k < NC; k++)
                w[k] = (int)strlen(heads[k]);
        for (size_t i = 0; i < n; i++) {
                json_t *s = json_array_get(list, i);
                const char *t = str_or_dash(s, "created_at");
                char rel[40];
                cli_reltime(t, rel, sizeof(rel));
                /* "2025-01-02T14:32:05.123Z" → "2025-01-02 14:32:05 (3m ago)" */
                snprintf(cells[i][0], 80, "%.10s %.8s (%s)", t, strlen(t) > 11 ? t + 11 : "", rel);
                snprintf(cells[i][1], 80, "%s", str_or_dash(s, "id"));
                snprintf(cells[i][2], 80, "%s", str_or_dash(s, "kind"));
                human_bytes(json_object_get(s, "size_bytes"), cells[i][3], 80);
                human_bytes(json_object_get(s, "new_bytes"), cells[i][4], 80);
                snprintf(cells[i][5], 80, "%.1f ms",
                         json_number_value(json_object_get(s, "pause_ms")));
                snprintf(cells[i][6], 80, "%s", str_or_dash(s, "label"));
                snprintf(cells[i][7], 80, "%s",
                         json_is_true(json_object_get(s, "rolling")) ? "yes" : "no");
                for (int k = 0; k < NC; k++) {
                        int l = (int)strlen(cells[i][k]);
                        if (l > w[k])
                                w[k] = l;
                }
        }
        for (int k = 0; k < NC; k++)
                printf(k < NC - 1 ? "%-*s  " : "%-*s\n", k < NC - 1 ? w[k] : 0, heads[k]);
        for (size_t i = 0; i < n; i++)
                for (int k = 0; k < NC; k++)
                        printf(k < NC - 1 ? "%-*s  " : "%-*s\n", k < NC - 1 ? w[k] : 0,
                               cells[i][k]);
        free(cells);
        return fflush(stdout) == 0 ? CLI_OK : CLI_FAIL;
}

/* One verb: parse, call, print. */
static int run(struct cli *c, int argc, char **argv)
{
        const char *verb = argv[0];
        static const struct option opts[] = {
            {"label", required_argument, NULL, OPT_LABEL},
            {"snapshot", required_argument, NULL, OPT_SNAPSHOT},
            {"count", required_argument, NULL, OPT_COUNT},
            {"kind", required_argument, NULL, OPT_KIND},
            CLI_GLOBAL_OPTIONS,
            {0},
        };
        const char *label = NULL, *snap = NULL, *kind = NULL;
        long long count = 0;
        int opt;
        while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
                if (cli_global_opt(c, opt, optarg))
                        continue;
                switch (opt) {
                case 'h':
                        help(verb);
                        return CLI_OK;
                case OPT_LABEL:
                        if (strcmp(verb, "snapshot"))
                                return cli_usage_error(verb, "--label is for cove snapshot");
                        label = optarg;
                        break;
                case OPT_KIND:
                        if (strcmp(verb, "snapshot"))
                                return cli_usage_error(verb, "--kind is for cove snapshot");
                        if (strcmp(optarg, "files") && strcmp(optarg, "full"))
                                return cli_usage_error(verb, "--kind takes files or full");
                        kind = optarg;
                        break;
                case OPT_SNAPSHOT:
                        if (strcmp(verb, "resume") && strcmp(verb, "fork"))
                                return cli_usage_error(verb, "--snapshot is for resume and fork");
                        snap = optarg;
                        break;
                case OPT_COUNT:
                        if (strcmp(verb, "fork"))
                                return cli_usage_error(verb, "--count is for cove fork");
                        if (!cli_parse_uint(optarg, 20, &count) || count < 1)
                                return cli_usage_error(verb, "--count takes 1 to 20");
                        break;
                default:
                        return cli_usage_error(verb, "bad option");
                }
        }
        int want = !strcmp(verb, "rewind") ? 2 : 1;
        if (argc - optind != want)
                return cli_usage_error(verb, want == 2 ? "expected ID SNAPSHOT" : "expected ID");
        if (want == 2)
                snap = argv[optind + 1];

        cleanup_free char *id = cli_urlenc(argv[optind]);
        const char *method = "POST", *progress = NULL;
        char *path = NULL;
        json_t *body = json_object();
        if (!strcmp(verb, "snapshot")) {
                path = cli_fmt("/v1/sandboxes/%s/snapshots", id);
                if (label)
                        json_object_set_new(body, "label", json_string(label));
                if (kind)
                        json_object_set_new(body, "kind", json_string(kind));
                progress = "taking snapshot";
        } else if (!strcmp(verb, "snapshots")) {
                path = cli_fmt("/v1/sandboxes/%s/snapshots", id);
                method = "GET";
                json_decref(body);
                body = NULL;
        } else {
                path = cli_fmt("/v1/sandboxes/%s/%s", id, verb);
                if (snap)
                        json_object_set_new(body, "snapshot_id", json_string(snap));
                if (count)
                        json_object_set_new(body, "count", json_integer(count));
                progress = !strcmp(verb, "pause")    ? "pausing (snapshot, then stop)"
                           : !strcmp(verb, "resume") ? "resuming (restore, then start)"
                           : !strcmp(verb, "rewind") ? "rewinding (snapshot, restore, restart)"
                                                     : "forking (restore each copy)";
        }
        struct cove_err err = {0};
        json_t *ans = NULL;
        int r = cli_call(c, method, path, body, &ans, progress, &err);
        json_decref(body);
        free(path);
        if (r < 0)
                return cli_fail(&err);
        int rc = CLI_OK;
        if (c->json) {
                rc = cli_print_json(c, ans);
        } else if (!strcmp(verb, "snapshots")) {
                json_t *list = json_object_get(ans, "snapshots");
                rc = c->out_tty ? print_timeline(list) : cli_print_json(c, ans);
        } else if (!strcmp(verb, "snapshot")) {
                printf("%s\n", str_or_dash(ans, "id"));
        } else if (!strcmp(verb, "pause")) {
                printf("%s\n", str_or_dash(json_object_get(ans, "snapshot"), "id"));
        } else if (!strcmp(verb, "resume")) {
                printf("%s %s\n", str_or_dash(ans, "id"), str_or_dash(ans, "state"));
        } else if (!strcmp(verb, "rewind")) {
                const char *undo = str_or_dash(ans, "undo_snapshot_id");
                printf("%s\n", undo);
                if (c->err_tty)
                        fprintf(stderr, "rewound %s to %s; undo with: cove rewind %s %s\n",
                                argv[optind], snap, argv[optind], undo);
        } else {
                json_t *list = json_object_get(ans, "sandboxes");
                for (size_t i = 0; i < json_array_size(list); i++)
                        printf("%s\n", str_or_dash(json_array_get(list, i), "id"));
        }
        json_decref(ans);
        return rc;
}

int cmd_snapshot(struct cli *c, int argc, char **argv)
{
        return run(c, argc, argv);
}

int cmd_snapshots(struct cli *c, int argc, char **argv)
{
        return run(c, argc, argv);
}

int cmd_pause(struct cli *c, int argc, char **argv)
{
        return run(c, argc, argv);
}

int cmd_resume(struct cli *c, int argc, char **argv)
{
        return run(c, argc, argv);
}

int cmd_rewind(struct cli *c, int argc, char **argv)
{
        return run(c, argc, argv);
}

int cmd_fork(struct cli *c, int argc, char **argv)
{
        return run(c, argc, argv);
}
