/* cove diff: what changed between two snapshots (GET /v1/snapshots/{a}/diff/{b}), printed
 * like `git diff --stat`; with -p, or a PATH naming one file, the unified diffs
 * (…/diff/{b}/file) like `git diff`. --json prints the API's answer. */
#include <stdio.h>
#include <string.h>

#include "client.h"
#include "cove.h"
#include "util/cleanup.h"

static void help(void)
{
        puts("Usage: cove diff [-p] SNAP_A SNAP_B [PATH]\n"
             "\n"
             "Show what changed from snapshot SNAP_A to SNAP_B, computed from their manifests\n"
             "(nothing is restored): one line per added (A), changed (M) or removed (D) path\n"
             "with its sizes, like 'git diff --stat'. PATH narrows to a directory; a PATH\n"
             "naming a file prints its unified diff, like 'git diff'.\n"
             "\n"
             "Options:\n"
             "  -p, --patch   also print the unified diff of every changed file\n"
             "  --json        print the API's answer");
}

static void size_str(json_t *v, char *out, size_t cap)
{
        if (json_is_integer(v))
                snprintf(out, cap, "%lld", (long long)json_integer_value(v));
        else
                snprintf(out, cap, "-");
}

static void stat_line(json_t *e, char tag, int width)
{
        char a[32], b[32];
        size_str(json_object_get(e, "size_before"), a, sizeof(a));
        size_str(json_object_get(e, "size_after"), b, sizeof(b));
        const char *path = json_string_value(json_object_get(e, "path"));
        const char *type = json_string_value(json_object_get(e, "type"));
        printf(" %c %-*s | %s", tag, width, path ? path : "?", type ? type : "?");
        if (tag == 'A')
                printf(" %s bytes", b);
        else if (tag == 'D')
                printf(" %s bytes", a);
        else
                printf(" %s -> %s bytes", a, b);
        json_t *mb = json_object_get(e, "mode_before");
        if (json_is_string(mb))
                printf(", mode %s -> %s", json_string_value(mb),
                       json_string_value(json_object_get(e, "mode")));
        json_t *rf = json_object_get(e, "renamed_from");
        if (json_is_string(rf))
                printf(" (renamed from %s)", json_string_value(rf));
        json_t *rt = json_object_get(e, "renamed_to");
        if (json_is_string(rt))
                printf(" (renamed to %s)", json_string_value(rt));
        putchar('\n');
}

/* Print one file's diff; 0, or -1 with err. A bound hit is reported and not an error. */
static int patch(struct cli *c, const char *ea, const char *eb, const char *path, int *is_dir,
                 struct cove_err *err)
{
        cleanup_free char *ep = cli_urlenc(path);
        cleanup_free char *url = cli_fmt("/v1/snapshots/%s/diff/%s/file?path=%s", ea, eb, ep);
        json_t *out = NULL;
        if (cli_call(c, "GET", url, NULL, &out, NULL, err) < 0) {
                if (is_dir && strstr(err->msg, "is a directory")) {
                        *is_dir = 1;
                        return 0;
                }
                if (!strncmp(err->msg, "limit_exceeded", 14)) {
                        printf("diff %s: not shown (%s)\n", path, err->msg);
                        return 0;
                }
                return -1;
        }
        if (c->json)
                cli_print_json(c, out);
        else
                fputs(json_string_value(json_object_get(out, "diff")) ?: "", stdout);
        json_decref(out);
        return 0;
}

int cmd_diff(struct cli *c, int argc, char **argv)
{
        static const struct option opts[] = {
            {"patch", no_argument, NULL, 'p'}, CLI_GLOBAL_OPTIONS, {0}};
        int opt, with_patch = 0;
        while ((opt = getopt_long(argc, argv, "hp", opts, NULL)) != -1) {
                if (cli_global_opt(c, opt, optarg))
                        continue;
                if (opt == 'h') {
                        help();
                        return CLI_OK;
                }
                if (opt == 'p') {
                        with_patch = 1;
                        continue;
                }
                return cli_usage_error("diff", "bad option");
        }
        if (argc - optind < 2 || argc - optind > 3)
                return cli_usage_error("diff", "expected SNAP_A SNAP_B [PATH]");
        cleanup_free char *ea = cli_urlenc(argv[optind]);
        cleanup_free char *eb = cli_urlenc(argv[optind + 1]);
        const char *path = argc - optind == 3 ? argv[optind + 2] : NULL;
        struct cove_err err = {0};
        if (path) { /* a file: its diff; a directory: the stat narrowed to it */
                int is_dir = 0;
                if (patch(c, ea, eb, path, &is_dir, &err) < 0)
                        return cli_fail(&err);
                if (!is_dir)
                        return CLI_OK;
        }
        cleanup_free char *ep = path ? cli_urlenc(path) : NULL;
        cleanup_free char *url =
            cli_fmt("/v1/snapshots/%s/diff/%s%s%s", ea, eb, ep ? "?path=" : "", ep ? ep : "");
        json_t *d = NULL;
        if (cli_call(c, "GET", url, NULL, &d, NULL, &err) < 0)
                return cli_fail(&err);
        if (c->json) {
                int rc = cli_print_json(c, d);
                json_decref(d);
                return rc;
        }
        static const char *lists[] = {"added", "changed", "removed"};
        static const char tags[] = {'A', 'M', 'D'};
        int width = 0;
        size_t k;
        json_t *e;
        for (int l = 0; l < 3; l++)
                json_array_foreach(json_object_get(d, lists[l]), k, e)
                {
                        int n = (int)strlen(json_string_value(json_object_get(e, "path")) ?: "");
                        if (n > width && n < 60)
                                width = n;
                }
        /* in path order, as git prints */
        json_t *all = json_array();
        for (int l = 0; l < 3; l++)
                json_array_foreach(json_object_get(d, lists[l]), k, e)
                {
                        json_object_set_new(e, "_tag", json_integer(tags[l]));
                        json_array_append(all, e);
                }
        size_t n = json_array_size(all);
        for (size_t i = 1; i < n; i++) /* insertion sort: answers are bounded */
                for (size_t j = i; j > 0; j--) {
                        const char *p =
                            json_string_value(json_object_get(json_array_get(all, j - 1), "path"));
                        const char *q =
                            json_string_value(json_object_get(json_array_get(all, j), "path"));
                        if (!p || !q || strcmp(p, q) <= 0)
                                break;
                        json_t *t = json_incref(json_array_get(all, j - 1));
                        json_array_set(all, j - 1, json_array_get(all, j));
                        json_array_set_new(all, j, t);
                }
        json_array_foreach(all, k, e)
            stat_line(e, (char)json_integer_value(json_object_get(e, "_tag")), width);
        printf(" %zu added, %zu changed, %zu removed%s\n",
               json_array_size(json_object_get(d, "added")),
               json_array_size(json_object_get(d, "changed")),
               json_array_size(json_object_get(d, "removed")),
               json_is_true(json_object_get(d, "truncated")) ? " (truncated)" : "");
        int rc = CLI_OK;
        if (with_patch)
                json_array_foreach(all, k, e)
                {
                        const char *t = json_string_value(json_object_get(e, "type"));
                        if (!t || (strcmp(t, "file") && strcmp(t, "symlink")))
                                continue;
                        if (patch(c, ea, eb, json_string_value(json_object_get(e, "path")), NULL,
                                  &err) < 0)
                                rc = cli_fail(&err);
                }
        json_decref(all);
        json_decref(d);
        return rc;
}
