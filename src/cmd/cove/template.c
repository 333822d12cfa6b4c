/* cove template: build (from an image, an archive, or a built-in by name), ls, inspect, rm
 * (docs/cli.md "Templates"): thin wrappers over /v1/templates; build waits for the outcome
 * with a spinner on a terminal. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "cove.h"
#include "util/cleanup.h"
#include "util/util.h"

enum {
        O_IMAGE = CLI_OPT_VERB_BASE,
        O_OCI,
        O_DOCKER,
        O_DOCKERFILE,
        O_FROM_SANDBOX,
        O_FROM_SNAPSHOT,
        O_INSECURE,
        O_SECRET,
        O_MAX_SIZE,
        O_TIMEOUT,
        O_NO_WAIT,
        O_EGRESS_ALLOW,
        O_START_CMD,
        O_READY_CMD,
        O_READY_TIMEOUT,
        O_POOL,
};

static void help(void)
{
        puts("Usage: cove template COMMAND [OPTIONS]\n"
             "\n"
             "  build NAME --image REF [--insecure] [--registry-secret S]\n"
             "  build NAME --oci-archive FILE | --docker-archive FILE   (admin: a file on the "
             "node)\n"
             "  build NAME -f Dockerfile [CONTEXT] [--allow PATTERN]...\n"
             "                               build from a Dockerfile without Docker: RUN in a\n"
             "                               sandbox allowed to reach only the --allow hosts\n"
             "  build NAME --from-sandbox ID | --from-snapshot ID\n"
             "                               save a sandbox's files (or a snapshot's) as a "
             "template\n"
             "  build busybox|base           build a built-in template (admin)\n"
             "        [--max-size-mb N] [--timeout S] [--no-wait]\n"
             "                               waits for the build (a spinner on a terminal),\n"
             "                               prints the template (JSON with --json)\n"
             "        [--start-cmd CMD] [--ready-cmd CMD] [--ready-timeout S] [--pool N]\n"
             "                               start CMD in every new sandbox, which is running\n"
             "                               once the ready CMD exits 0; keep N warm\n"
             "  ls                           the built-ins and your templates\n"
             "  inspect NAME                 one template as JSON\n"
             "  rm NAME...                   delete templates (refused while a sandbox uses one)\n"
             "REF names its registry: registry.example.com/team/app:1.2 or …@sha256:….\n"
             "--registry-secret S: a secret (value user:password, hosts listing the registry).");
}

static const char *s_or_dash(json_t *o, const char *k)
{
        const char *s = json_string_value(json_object_get(o, k));
        return s && *s ? s : "-";
}

static void print_one(json_t *t)
{
        char size[32];
        snprintf(size, sizeof size, "%.1f MB",
                 (double)json_integer_value(json_object_get(t, "size_bytes")) / 1e6);
        const char *dg = json_string_value(json_object_get(t, "digest"));
        printf("%-24s %-9s %-10s %s\n", s_or_dash(t, "name"), s_or_dash(t, "state"), size,
               dg ? dg : (json_is_true(json_object_get(t, "builtin")) ? "(built-in)" : "-"));
}

#define CONTEXT_MAX (700 * 1024) /* base64 of it fits the API's 1 MiB body */

static char *b64(const unsigned char *in, size_t n)
{
        static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        char *out = malloc(4 * ((n + 2) / 3) + 1), *o = out;
        if (!out)
                return NULL;
        for (size_t i = 0; i < n; i += 3) {
                unsigned v = (unsigned)in[i] << 16 | (i + 1 < n ? (unsigned)in[i + 1] << 8 : 0) |
                             (i + 2 < n ? in[i + 2] : 0);
                *o++ = t[v >> 18 & 63];
                *o++ = t[v >> 12 & 63];
                *o++ = i + 1 < n ? t[v >> 6 & 63] : '=';
                *o++ = i + 2 < n ? t[v & 63] : '=';
        }
        *o = '\0';
        return out;
}

/* The context directory as a tar (by the host's tar, no shell), at most CONTEXT_MAX. */
static unsigned char *tar_dir(const char *dir, size_t *len, struct cove_err *err)
{
        struct stat st;
        if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
                cove_err_set(err, errno, "context %s: not a directory", dir);
                return NULL;
        }
        int p[2];
        if (pipe(p) < 0) {
                cove_err_set(err, errno, "pipe");
                return NULL;
        }
        pid_t pid = fork();
        if (pid == 0) {
                dup2(p[1], 1);
                close(p[0]);
                close(p[1]);
                execlp("tar", "tar", "-C", dir, "--numeric-owner", "--owner=0", "--group=0", "-cf",
                       "-", ".", (char *)NULL);
                _exit(127);
        }
        close(p[1]);
        unsigned char *buf = malloc(CONTEXT_MAX + 1);
        size_t n = 0;
        ssize_t r = 0;
        while (buf && n <= CONTEXT_MAX && (r = read(p[0], buf + n, CONTEXT_MAX + 1 - n)) > 0)
                n += (size_t)r;
        close(p[0]);
        int status = 0;
        if (pid > 0) {
                if (n > CONTEXT_MAX)
                        kill(pid, SIGKILL);
                waitpid(pid, &status, 0);
        }
        if (!buf || pid < 0 || n > CONTEXT_MAX || !WIFEXITED(status) || WEXITSTATUS(status)) {
                cove_err_set(err, 0, "context %s: %s", dir,
                             n > CONTEXT_MAX ? "larger than 700 KiB as a tar" : "tar failed");
                free(buf);
                return NULL;
        }
        *len = n;
        return buf;
}

static int wait_built(struct cli *c, const char *name, json_t **t, struct cove_err *err)
{
        cleanup_free char *en = cli_urlenc(name);
        cleanup_free char *path = cli_fmt("/v1/templates/%s", en);
        cleanup_free char *label = cli_fmt("building template %s", name);
        cleanup_free char *what = cli_fmt("template %s", name);
        json_t *j = NULL;
        if (cli_call(c, "GET", path, NULL, &j, NULL, err) < 0)
                return -1;
        json_decref(*t);
        *t = j;
        int ret = cli_poll_while(c, path, "state", "building", label, 500, 0, what, t, err);
        if (ret == 0 && !strcmp(s_or_dash(*t, "state"), "failed")) {
                json_t *e = json_object_get(*t, "error");
                ret = cove_err_set(err, 0, "template %s: %s: %s", name, s_or_dash(e, "code"),
                                   s_or_dash(e, "message"));
        }
        return ret;
}

static int build(struct cli *c, int argc, char **argv)
{
        static const struct option opts[] = {
            {"image", required_argument, NULL, O_IMAGE},
            {"oci-archive", required_argument, NULL, O_OCI},
            {"docker-archive", required_argument, NULL, O_DOCKER},
            {"file", required_argument, NULL, 'f'},
            {"from-sandbox", required_argument, NULL, O_FROM_SANDBOX},
            {"from-snapshot", required_argument, NULL, O_FROM_SNAPSHOT},
            {"insecure", no_argument, NULL, O_INSECURE},
            {"registry-secret", required_argument, NULL, O_SECRET},
            {"max-size-mb", required_argument, NULL, O_MAX_SIZE},
            {"timeout", required_argument, NULL, O_TIMEOUT},
            {"no-wait", no_argument, NULL, O_NO_WAIT},
            {"allow", required_argument, NULL, O_EGRESS_ALLOW},
            {"start-cmd", required_argument, NULL, O_START_CMD},
            {"ready-cmd", required_argument, NULL, O_READY_CMD},
            {"ready-timeout", required_argument, NULL, O_READY_TIMEOUT},
            {"pool", required_argument, NULL, O_POOL},
            CLI_GLOBAL_OPTIONS,
            {0},
        };
        json_t *body = json_object(), *from = json_object();
        char *label = NULL;
        json_t *egress = NULL;
        int rc = CLI_OK, opt, nfrom = 0;
        bool nowait = false, dockerfile = false;
        long long v;
        while ((opt = getopt_long(argc, argv, "hf:", opts, NULL)) != -1) {
                if (cli_global_opt(c, opt, optarg))
                        continue;
                switch (opt) {
                case 'h':
                        help();
                        goto out;
                case O_IMAGE:
                case O_OCI:
                case O_DOCKER:
                case O_FROM_SANDBOX:
                case O_FROM_SNAPSHOT:
                        json_object_set_new(from,
                                            opt == O_IMAGE          ? "image"
                                            : opt == O_OCI          ? "oci_archive"
                                            : opt == O_DOCKER       ? "docker_archive"
                                            : opt == O_FROM_SANDBOX ? "sandbox"
                                                                    : "snapshot",
                                            json_string(optarg));
                        nfrom++;
                        break;
                case 'f': {
                        char *text = NULL;
                        size_t tl = 0;
                        struct cove_err e = {0};
                        if (cove_read_file(optarg, 64 * 1024, &text, &tl, &e) < 0) {
                                rc = cli_fail(&e);
                                goto out;
                        }
                        json_object_set_new(from, "dockerfile", json_stringn(text, tl));
                        free(text);
                        dockerfile = true;
                        nfrom++;
                        break;
                }
                case O_EGRESS_ALLOW:
                        if (!egress)
                                egress = json_pack("{s:[]}", "allow");
                        json_array_append_new(json_object_get(egress, "allow"),
                                              json_string(optarg));
                        break;
                case O_INSECURE:
                        json_object_set_new(body, "insecure", json_true());
                        break;
                case O_SECRET:
                        json_object_set_new(body, "registry_auth",
                                            json_pack("{s:s}", "secret", optarg));
                        break;
                case O_MAX_SIZE:
                case O_TIMEOUT:
                        if (!cli_parse_uint(optarg, 1 << 20, &v) || v < 1) {
                                rc = cli_usage_error("template",
                                                     "expected a positive number, "
                                                     "got '%s'",
                                                     optarg);
                                goto out;
                        }
                        json_object_set_new(body, opt == O_MAX_SIZE ? "max_size_mb" : "timeout_s",
                                            json_integer(v));
                        break;
                case O_NO_WAIT:
                        nowait = true;
                        break;
                case O_START_CMD:
                case O_READY_CMD:
                        json_object_set_new(body, opt == O_START_CMD ? "start_cmd" : "ready_cmd",
                                            json_string(optarg));
                        break;
                case O_READY_TIMEOUT:
                case O_POOL:
                        if (!cli_parse_uint(optarg, 3600, &v)) {
                                rc = cli_usage_error("template", "expected a number, got '%s'",
                                                     optarg);
                                goto out;
                        }
                        json_object_set_new(body, opt == O_POOL ? "pool" : "ready_timeout_s",
                                            json_integer(v));
                        break;
                default:
                        rc = cli_usage_error("template", "bad option");
                        goto out;
                }
        }
        if (optind + 1 != argc && !(dockerfile && optind + 2 == argc)) {
                rc = cli_usage_error("template", "build takes one NAME (and, with -f, a CONTEXT "
                                                 "directory)");
                goto out;
        }
        if (dockerfile && optind + 2 == argc) {
                struct cove_err e = {0};
                size_t cl = 0;
                unsigned char *tar = tar_dir(argv[optind + 1], &cl, &e);
                char *enc = tar ? b64(tar, cl) : NULL;
                free(tar);
                if (!enc) {
                        rc = cli_fail(&e);
                        goto out;
                }
                json_object_set_new(from, "context_b64", json_string(enc));
                free(enc);
        }
        if (egress)
                json_object_set(body, "egress", egress);
        if (nfrom > 1) {
                rc = cli_usage_error("template", "give one of --image, --oci-archive, "
                                                 "--docker-archive, --from-sandbox, "
                                                 "--from-snapshot");
                goto out;
        }
        const char *name = argv[optind];
        json_object_set_new(body, "name", json_string(name));
        if (nfrom)
                json_object_set(body, "from", from);
        struct cove_err err = {0};
        json_t *t = NULL;
        label = cli_fmt("building template %s", name);
        if (cli_call(c, "POST", "/v1/templates", body, &t, nfrom ? NULL : label, &err) < 0 ||
            (nfrom && !nowait && wait_built(c, name, &t, &err) < 0)) {
                json_decref(t);
                rc = cli_fail(&err);
                goto out;
        }
        if (c->json || !c->out_tty)
                rc = cli_print_json(c, t);
        else
                print_one(t);
        json_decref(t);
out:
        json_decref(egress);
        free(label);
        json_decref(body);
        json_decref(from);
        return rc;
}

static int ls(struct cli *c)
{
        struct cove_err err = {0};
        json_t *ans = NULL;
        if (cli_call(c, "GET", "/v1/templates", NULL, &ans, NULL, &err) < 0)
                return cli_fail(&err);
        int rc = CLI_OK;
        json_t *list = json_object_get(ans, "templates");
        if (c->json || !c->out_tty) {
                rc = cli_print_json(c, ans);
        } else {
                printf("%-24s %-9s %-10s %s\n", "NAME", "STATE", "SIZE", "DIGEST");
                for (size_t i = 0; i < json_array_size(list); i++)
                        print_one(json_array_get(list, i));
        }
        json_decref(ans);
        return rc;
}

int cmd_template(struct cli *c, int argc, char **argv)
{
        if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
                help();
                return argc < 2 ? CLI_USAGE : CLI_OK;
        }
        const char *sub = argv[1];
        if (!strcmp(sub, "build"))
                return build(c, argc - 1, argv + 1);
        /* ls, inspect, rm take global options (--json…) and names */
        int first, done = cli_global_args(c, argc - 1, argv + 1, "template", help, &first);
        if (done >= 0)
                return done;
        first++;
        int n = argc - first;
        if (!strcmp(sub, "ls")) {
                if (n)
                        return cli_usage_error("template", "ls takes no argument");
                return ls(c);
        }
        if (!strcmp(sub, "inspect") || !strcmp(sub, "rm")) {
                if (n < 1 || (!strcmp(sub, "inspect") && n != 1))
                        return cli_usage_error("template", "%s takes NAME", sub);
                int rc = CLI_OK;
                for (int i = first; i < argc; i++) {
                        cleanup_free char *en = cli_urlenc(argv[i]);
                        cleanup_free char *path = cli_fmt("/v1/templates/%s", en);
                        struct cove_err err = {0};
                        json_t *t = NULL;
                        if (cli_call(c, !strcmp(sub, "rm") ? "DELETE" : "GET", path, NULL, &t, NULL,
                                     &err) < 0) {
                                rc = cli_fail(&err);
                                continue;
                        }
                        if (t)
                                cli_print_json(c, t);
                        else if (c->out_tty && !c->json)
                                printf("removed %s\n", argv[i]);
                        json_decref(t);
                }
                return rc;
        }
        return cli_usage_error("template", "unknown command '%s' (build, ls, inspect, rm)", sub);
}
