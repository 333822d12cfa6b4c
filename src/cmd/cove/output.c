/* Output helpers shared by the verbs: usage and failure messages, JSON printing, RFC 3339
 * parsing and relative times for tables, K=V options, and the stderr progress spinner (only
 * ever drawn on a terminal, never on a pipe). */
#include "cove.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/util.h"

bool cli_global_opt(struct cli *c, int opt, const char *arg)
{
        switch (opt) {
        case CLI_OPT_JSON:
                c->json = true;
                return true;
        case CLI_OPT_URL:
                c->url_opt = arg;
                return true;
        case CLI_OPT_API_KEY:
                c->key_opt = arg;
                return true;
        default:
                return false;
        }
}

int cli_global_args(struct cli *c, int argc, char **argv, const char *verb, void (*help)(void),
                    int *first)
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
                return cli_usage_error(verb, "bad option");
        }
        *first = optind;
        return -1;
}

void cli_getopt_reset(void)
{
        optind = 0; /* glibc: full re-initialisation, including the optstring's '+' */
        opterr = 1;
}

int cli_usage_error(const char *verb, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "cove%s%s: ", verb ? " " : "", verb ? verb : "");
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fprintf(stderr, "\nTry 'cove%s%s --help'.\n", verb ? " " : "", verb ? verb : "");
        return CLI_USAGE;
}

int cli_fail(const struct cove_err *err)
{
        fprintf(stderr, "cove: %s\n", err->msg[0] ? err->msg : "failed");
        return CLI_FAIL;
}

int cli_print_json(const struct cli *c, const json_t *v)
{
        size_t flags = c->out_tty ? JSON_INDENT(2) : JSON_COMPACT;
        char *s = json_dumps(v, flags | JSON_ENCODE_ANY);
        if (!s) {
                fputs("cove: cannot encode JSON\n", stderr);
                return CLI_FAIL;
        }
        puts(s);
        free(s);
        if (fflush(stdout) != 0) {
                fprintf(stderr, "cove: write to stdout: %s\n", strerror(errno));
                return CLI_FAIL;
        }
        return CLI_OK;
}

int64_t cli_parse_time(const char *s)
{
        if (!s)
                return -1;
        int y, mo, d, h, mi, sec, n = 0;
        if (sscanf(s, "%4d-%2d-%2d%*1[Tt ]%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &sec, &n) != 6 ||
            n == 0)
                return -1;
        const char *p = s + n;
        int64_t ms = 0;
        if (*p == '.') {
                int digits = 0;
                for (p++; *p >= '0' && *p <= '9'; p++, digits++)
                        if (digits < 3)
                                ms = ms * 10 + (*p - '0');
                for (; digits < 3; digits++)
                        ms *= 10;
        }
        int64_t off_min = 0;
        if (*p == '+' || *p == '-') {
                int oh = 0, om = 0;
                if (sscanf(p + 1, "%2d:%2d", &oh, &om) < 1)
                        return -1;
                off_min = (*p == '-' ? -1 : 1) * (oh * 60 + om);
        } else if (*p && *p != 'Z' && *p != 'z') {
                return -1;
        }
        struct tm tm = {.tm_year = y - 1900,
                        .tm_mon = mo - 1,
                        .tm_mday = d,
                        .tm_hour = h,
                        .tm_min = mi,
                        .tm_sec = sec};
        time_t t = timegm(&tm);
        if (t == (time_t)-1)
                return -1;
        return (int64_t)t * 1000 + ms - off_min * 60000;
}

void cli_reltime(const char *rfc3339, char *out, size_t cap)
{
        int64_t t = cli_parse_time(rfc3339);
        if (t < 0) {
                snprintf(out, cap, "-");
                return;
        }
        int64_t diff = (t - cove_now_ms()) / 1000;
        bool future = diff > 0;
        long long a = (long long)(diff < 0 ? -diff : diff);
        if (a < 1) {
                snprintf(out, cap, "now");
                return;
        }
        long long v;
        const char *unit;
        if (a < 60) {
                v = a;
                unit = "s";
        } else if (a < 3600) {
                v = a / 60;
                unit = "m";
        } else if (a < 86400) {
                v = a / 3600;
                unit = "h";
        } else {
                v = a / 86400;
                unit = "d";
        }
        if (future)
                snprintf(out, cap, "in %lld%s", v, unit);
        else
                snprintf(out, cap, "%lld%s ago", v, unit);
}

bool cli_kv_add(json_t *obj, const char *kv)
{
        const char *eq = strchr(kv, '=');
        if (!eq || eq == kv)
                return false;
        char *k = strndup(kv, (size_t)(eq - kv));
        if (!k)
                return false;
        int r = json_object_set_new(obj, k, json_string(eq + 1));
        free(k);
        return r == 0;
}

bool cli_parse_uint(const char *s, long long max, long long *out)
{
        if (!s || !*s || *s == '-' || *s == '+')
                return false;
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (errno || *end || v < 0 || v > max)
                return false;
        *out = v;
        return true;
}

void cli_progress_start(struct cli_progress *p, const struct cli *c, const char *label)
{
        *p = (struct cli_progress){
            .enabled = label && c->err_tty,
            .label = label,
            .start_ns = cove_mono_ns(),
        };
}

void cli_progress_tick(struct cli_progress *p)
{
        static const char frames[] = "|/-\\";
        if (!p->enabled)
                return;
        int64_t el = cove_mono_ns() - p->start_ns;
        if (el < 300 * 1000000LL)
                return; /* fast operations stay silent */
        if (p->shown && cove_mono_ns() - p->last_ns < 100 * 1000000LL)
                return;
        p->last_ns = cove_mono_ns();
        fprintf(stderr, "\r%c %s %.1fs\033[K", frames[p->frame++ % 4], p->label, (double)el / 1e9);
        fflush(stderr);
        p->shown = true;
}

void cli_progress_end(struct cli_progress *p)
{
        if (p->shown) {
                fputs("\r\033[K", stderr);
                fflush(stderr);
        }
        p->shown = false;
}
