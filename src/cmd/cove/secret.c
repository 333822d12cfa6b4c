/* cove secret set|ls|rm (PUT/GET/DELETE /v1/secrets…) and cove egress show|set
 * (GET/PUT /v1/sandboxes/{id}/egress). A secret's value is read from stdin (without echo
 * on a terminal) or a file, never from argv, where other users could read it in ps. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <unistd.h>

#include "client.h"
#include "cove.h"
#include "util/cleanup.h"

#define VALUE_MAX 8192 /* the API's bound on a secret's value */

static void secret_help(void)
{
        puts("Usage: cove secret set NAME --host PATTERN [--host PATTERN]...\n"
             "                       [--header H [--format F] | --placeholder] [--from-file F]\n"
             "       cove secret ls\n"
             "       cove secret rm NAME...\n"
             "\n"
             "Secrets are injected by the node's egress proxy into requests to their hosts;\n"
             "no sandbox ever sees a value. The value is read from stdin (a prompt without\n"
             "echo on a terminal; one trailing newline is dropped) or from --from-file F,\n"
             "never from the command line.\n"
             "\n"
             "Options of set:\n"
             "  --host PATTERN    a host it is injected for (example.com, *.example.com)\n"
             "  --header H        inject as header H (default Authorization)\n"
             "  --format F        the header's value, {value} standing for the secret\n"
             "                    (default \"Bearer {value}\")\n"
             "  --placeholder     instead, the sandbox gets a placeholder the proxy replaces\n"
             "  --from-file F     read the value from F");
}

/* The value from fd (at most VALUE_MAX + 1 bytes, so too long is detectable). */
static int read_value(int fd, char *buf, size_t cap, size_t *len)
{
        size_t n = 0;
        while (n < cap) {
                ssize_t r = read(fd, buf + n, cap - n);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r < 0)
                        return -1;
                if (r == 0)
                        break;
                n += (size_t)r;
                if (isatty(fd) && buf[n - 1] == '\n')
                        break;
        }
        *len = n;
        return 0;
}

static int secret_set(struct cli *c, int argc, char **argv)
{
        enum { O_HOST = CLI_OPT_VERB_BASE, O_HEADER, O_FORMAT, O_PLACEHOLDER, O_FILE };
        static const struct option opts[] = {{"host", required_argument, NULL, O_HOST},
                                             {"header", required_argument, NULL, O_HEADER},
                                             {"format", required_argument, NULL, O_FORMAT},
                                             {"placeholder", no_argument, NULL, O_PLACEHOLDER},
                                             {"from-file", required_argument, NULL, O_FILE},
                                             CLI_GLOBAL_OPTIONS,
                                             {0}};
        const char *header = NULL, *format = NULL, *file = NULL;
        cleanup_free char *en = NULL, *path = NULL;
        int placeholder = 0, opt;
        json_t *hosts = json_array();
        while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
                if (cli_global_opt(c, opt, optarg))
                        continue;
                switch (opt) {
                case 'h':
                        json_decref(hosts);
                        secret_help();
                        return CLI_OK;
                case O_HOST:
                        json_array_append_new(hosts, json_string(optarg));
                        break;
                case O_HEADER:
                        header = optarg;
                        break;
                case O_FORMAT:
                        format = optarg;
                        break;
                case O_PLACEHOLDER:
                        placeholder = 1;
                        break;
                case O_FILE:
                        file = optarg;
                        break;
                default:
                        json_decref(hosts);
                        return cli_usage_error("secret", "bad option");
                }
        }
        int rc = CLI_USAGE;
        if (argc - optind != 1) {
                rc = cli_usage_error("secret", argc - optind > 1
                                                   ? "one NAME; the value is read from stdin or "
                                                     "--from-file, never from the command line"
                                                   : "missing NAME");
                goto out_hosts;
        }
        if (json_array_size(hosts) == 0) {
                rc = cli_usage_error("secret", "at least one --host is needed");
                goto out_hosts;
        }
        if (placeholder && (header || format)) {
                rc = cli_usage_error("secret", "--placeholder excludes --header and --format");
                goto out_hosts;
        }
        const char *name = argv[optind];
        char value[VALUE_MAX + 2];
        size_t vlen = 0;
        int fd = file ? open(file, O_RDONLY | O_CLOEXEC) : STDIN_FILENO;
        if (fd < 0) {
                fprintf(stderr, "cove: %s: %s\n", file, strerror(errno));
                rc = CLI_FAIL;
                goto out_hosts;
        }
        struct termios saved;
        int tty = !file && isatty(fd) && tcgetattr(fd, &saved) == 0;
        if (tty) {
                struct termios quiet = saved;
                quiet.c_lflag &= ~(tcflag_t)ECHO;
                tcsetattr(fd, TCSAFLUSH, &quiet);
                fprintf(stderr, "value of %s: ", name);
        }
        int r = read_value(fd, value, sizeof(value) - 1, &vlen);
        if (tty) {
                tcsetattr(fd, TCSAFLUSH, &saved);
                fputc('\n', stderr);
        }
        if (file)
                close(fd);
        if (r < 0) {
                fprintf(stderr, "cove: read the value: %s\n", strerror(errno));
                rc = CLI_FAIL;
                goto out_wipe;
        }
        if (vlen && value[vlen - 1] == '\n')
                vlen--;
        if (vlen && value[vlen - 1] == '\r')
                vlen--;
        if (vlen == 0 || vlen > VALUE_MAX) {
                fprintf(stderr, "cove: the value must be 1 to %d bytes, got %s\n", VALUE_MAX,
                        vlen ? "more" : "none");
                rc = CLI_FAIL;
                goto out_wipe;
        }
        json_t *inject = placeholder
                             ? json_pack("{s:b}", "placeholder", 1)
                             : json_pack("{s:s, s:s}", "header", header ? header : "Authorization",
                                         "format", format ? format : "Bearer {value}");
        json_t *body =
            json_pack("{s:s%, s:O, s:o}", "value", value, vlen, "hosts", hosts, "inject", inject);
        struct cove_err err = {0};
        en = cli_urlenc(name);
        path = cli_fmt("/v1/secrets/%s", en);
        json_t *ans = NULL;
        if (!body) {
                cove_err_set(&err, 0, "the value must be UTF-8 text");
                rc = cli_fail(&err);
        } else if (cli_call(c, "PUT", path, body, &ans, NULL, &err) < 0) {
                rc = cli_fail(&err);
        } else {
                rc = c->json ? cli_print_json(c, ans) : (printf("%s\n", name), CLI_OK);
        }
        /* the request body held the value: wipe our copies */
        json_t *v = json_object_get(body, "value");
        if (v)
                json_string_setn(v, "", 0);
        json_decref(body);
        json_decref(ans);
out_wipe:
        explicit_bzero(value, sizeof(value));
out_hosts:
        json_decref(hosts);
        return rc;
}

static int secret_ls(struct cli *c)
{
        struct cove_err err = {0};
        json_t *ans = NULL;
        if (cli_call(c, "GET", "/v1/secrets", NULL, &ans, NULL, &err) < 0)
                return cli_fail(&err);
        int rc = CLI_OK;
        if (c->json) {
                rc = cli_print_json(c, ans);
        } else {
                printf("%-24s  %-40s  %s\n", "NAME", "HOSTS", "INJECT");
                size_t i;
                json_t *s;
                json_array_foreach(json_object_get(ans, "secrets"), i, s)
                {
                        char hosts[256] = "";
                        size_t k;
                        json_t *h;
                        json_array_foreach(json_object_get(s, "hosts"), k, h)
                        {
                                size_t l = strlen(hosts);
                                snprintf(hosts + l, sizeof(hosts) - l, "%s%s", k ? "," : "",
                                         json_string_value(h) ?: "");
                        }
                        json_t *inj = json_object_get(s, "inject");
                        char how[160];
                        if (json_is_true(json_object_get(inj, "placeholder")))
                                snprintf(how, sizeof(how), "placeholder");
                        else
                                snprintf(how, sizeof(how), "%s: %s",
                                         json_string_value(json_object_get(inj, "header")) ?: "?",
                                         json_string_value(json_object_get(inj, "format")) ?: "?");
                        printf("%-24s  %-40s  %s\n",
                               json_string_value(json_object_get(s, "name")) ?: "?", hosts, how);
                }
        }
        json_decref(ans);
        return rc;
}

int cmd_secret(struct cli *c, int argc, char **argv)
{
        if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
                secret_help();
                return argc < 2 ? CLI_USAGE : CLI_OK;
        }
        const char *sub = argv[1];
        if (!strcmp(sub, "set"))
                return secret_set(c, argc - 1, argv + 1);
        int first, done = cli_global_args(c, argc - 1, argv + 1, "secret", secret_help, &first);
        if (done >= 0)
                return done;
        first++;
        int n = argc - first;
        if (!strcmp(sub, "ls") && n == 0)
                return secret_ls(c);
        if (!strcmp(sub, "rm") && n > 0) {
                int rc = CLI_OK;
                for (int i = first; i < argc; i++) {
                        struct cove_err err = {0};
                        cleanup_free char *en = cli_urlenc(argv[i]);
                        cleanup_free char *path = cli_fmt("/v1/secrets/%s", en);
                        if (cli_call(c, "DELETE", path, NULL, NULL, NULL, &err) < 0)
                                rc = cli_fail(&err);
                }
                return rc;
        }
        return cli_usage_error("secret", "expected set NAME …, ls, or rm NAME…");
}

static void egress_help(void)
{
        puts("Usage: cove egress show ID\n"
             "       cove egress set ID [--allow P]... [--deny P]... [--secret NAME]...\n"
             "       cove egress set ID --file POLICY.json\n"
             "\n"
             "Show or replace a sandbox's egress policy (docs/egress.md): deny before allow,\n"
             "nothing matching is denied; patterns: example.com[:PORT], *.example.com,\n"
             "10.1.2.0/24[:PORT]. --secret names secrets the proxy injects for it. 'set'\n"
             "with no pattern at all cuts the sandbox off. --file takes the {allow, deny,\n"
             "secrets} object as JSON ('-' for stdin).");
}

static void print_list(const char *head, json_t *arr)
{
        printf("%s", head);
        size_t i;
        json_t *v;
        if (!json_array_size(arr))
                printf(" -");
        json_array_foreach(arr, i, v) printf(" %s", json_string_value(v) ?: "?");
        putchar('\n');
}

static int egress_print(struct cli *c, json_t *ans)
{
        if (c->json)
                return cli_print_json(c, ans);
        json_t *e = json_object_get(ans, "egress");
        const char *addr = json_string_value(json_object_get(ans, "address"));
        printf("address:  %s\n", addr ? addr : "- (no link)");
        print_list("allow:   ", json_object_get(e, "allow"));
        print_list("deny:    ", json_object_get(e, "deny"));
        print_list("secrets: ", json_object_get(e, "secrets"));
        json_t *ph = json_object_get(ans, "placeholders");
        const char *k;
        json_t *v;
        json_object_foreach(ph, k, v) printf("placeholder %s=%s\n", k, json_string_value(v) ?: "");
        return CLI_OK;
}

int cmd_egress(struct cli *c, int argc, char **argv)
{
        enum { O_ALLOW = CLI_OPT_VERB_BASE, O_DENY, O_SECRET, O_FILE };
        static const struct option opts[] = {{"allow", required_argument, NULL, O_ALLOW},
                                             {"deny", required_argument, NULL, O_DENY},
                                             {"secret", required_argument, NULL, O_SECRET},
                                             {"file", required_argument, NULL, O_FILE},
                                             CLI_GLOBAL_OPTIONS,
                                             {0}};
        json_t *pol = json_pack("{s:[], s:[], s:[]}", "allow", "deny", "secrets");
        const char *file = NULL;
        int opt, lists = 0, rc = CLI_OK;
        while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
                if (cli_global_opt(c, opt, optarg))
                        continue;
                const char *k = opt == O_ALLOW ? "allow" : opt == O_DENY ? "deny" : "secrets";
                switch (opt) {
                case 'h':
                        json_decref(pol);
                        egress_help();
                        return CLI_OK;
                case O_ALLOW:
                case O_DENY:
                case O_SECRET:
                        json_array_append_new(json_object_get(pol, k), json_string(optarg));
                        lists = 1;
                        break;
                case O_FILE:
                        file = optarg;
                        break;
                default:
                        json_decref(pol);
                        return cli_usage_error("egress", "bad option");
                }
        }
        if (argc - optind != 2 || (strcmp(argv[optind], "show") && strcmp(argv[optind], "set"))) {
                json_decref(pol);
                return cli_usage_error("egress", "expected show ID or set ID [patterns]");
        }
        int set = !strcmp(argv[optind], "set");
        cleanup_free char *ei = cli_urlenc(argv[optind + 1]);
        cleanup_free char *path = cli_fmt("/v1/sandboxes/%s/egress", ei);
        struct cove_err err = {0};
        json_t *ans = NULL;
        if (!set && (lists || file)) {
                rc = cli_usage_error("egress", "show takes no patterns");
        } else if (set && file && lists) {
                rc = cli_usage_error("egress", "--file excludes --allow, --deny and --secret");
        } else {
                if (file) {
                        json_error_t je;
                        json_decref(pol);
                        pol = !strcmp(file, "-") ? json_loadf(stdin, 0, &je)
                                                 : json_load_file(file, 0, &je);
                        if (!json_is_object(pol)) {
                                fprintf(stderr, "cove: %s: not a JSON object: %s\n", file,
                                        pol ? "" : je.text);
                                rc = CLI_FAIL;
                        }
                }
                json_t *body = rc == CLI_OK && set ? json_pack("{s:O}", "egress", pol) : NULL;
                if (rc == CLI_OK) {
                        if (cli_call(c, set ? "PUT" : "GET", path, body, &ans, NULL, &err) < 0)
                                rc = cli_fail(&err);
                        else
                                rc = egress_print(c, ans);
                }
                json_decref(body);
        }
        json_decref(ans);
        json_decref(pol);
        return rc;
}
