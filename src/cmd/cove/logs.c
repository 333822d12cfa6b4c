/* cove logs ID PID: reattach to a process's output (GET …/processes/{pid}/events?after=SEQ):
 * what coved's replay buffer kept, then live until the process exits. A broken stream is
 * resumed after the last event written, so nothing is printed twice. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "cove.h"
#include "util/cleanup.h"

static void help(void)
{
        puts("Usage: cove logs [--after SEQ] [--no-follow] ID PID\n"
             "\n"
             "Print a process's stdout and stderr (to this stdout and stderr) from what\n"
             "coved kept of it, then follow it until it exits. PIDs are listed by\n"
             "'cove inspect' of GET /v1/sandboxes/ID/processes.\n"
             "\n"
             "Options:\n"
             "  --after SEQ    start after event SEQ (events are numbered from 1)\n"
             "  --no-follow    stop at the end of what is kept, even if it still runs\n"
             "  --json         print the events as they come, one JSON object per line");
}

struct st {
        struct cli *c;
        struct cli_req *r;
        char *line;
        size_t len, cap;
        long long last;
        int exited, failed, progress, no_follow, seen;
        int64_t last_ms; /* --no-follow: when the last event came (or the call started) */
};

static void event(struct st *s, const char *p, size_t n)
{
        json_error_t je;
        json_t *ev = json_loadb(p, n, 0, &je);
        long long seq = json_integer_value(json_object_get(ev, "seq"));
        if (!json_is_object(ev) || (seq && seq <= s->last)) {
                json_decref(ev);
                return;
        }
        if (seq)
                s->last = seq;
        s->progress = 1;
        const char *t = json_string_value(json_object_get(ev, "type")) ?: "";
        if (s->c->json) {
                fwrite(p, 1, n, stdout);
                fputc('\n', stdout);
                fflush(stdout);
        } else if (!strcmp(t, "stdout") || !strcmp(t, "stderr") || !strcmp(t, "pty")) {
                const char *b = json_string_value(json_object_get(ev, "data_b64")) ?: "";
                unsigned char *buf = malloc(strlen(b) / 4 * 3 + 4);
                long k = buf ? cli_b64_decode(b, strlen(b), buf) : -1;
                FILE *f = !strcmp(t, "stderr") ? stderr : stdout;
                if (k > 0) {
                        fwrite(buf, 1, (size_t)k, f);
                        fflush(f);
                }
                free(buf);
        } else if (!strcmp(t, "overflow")) {
                fprintf(stderr, "cove: earlier output was not kept (%s)\n",
                        json_string_value(json_object_get(ev, "message")) ?: "overflow");
        } else if (!strcmp(t, "error")) {
                fprintf(stderr, "cove: %s: %s\n",
                        json_string_value(json_object_get(ev, "code")) ?: "error",
                        json_string_value(json_object_get(ev, "message")) ?: "");
                s->failed = 1;
        }
        if (!strcmp(t, "exit") || !strcmp(t, "error"))
                s->exited = 1;
        json_decref(ev);
}

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *arg)
{
        struct st *s = arg;
        size_t n = size * nmemb;
        if (cli_req_status(s->r) >= 300)
                return cli_collect_cb(ptr, size, nmemb, s->r);
        if (s->len + n + 1 > s->cap) {
                size_t cap = s->cap ? s->cap : 65536;
                while (cap < s->len + n + 1)
                        cap *= 2;
                char *l = cap <= (64u << 20) ? realloc(s->line, cap) : NULL;
                if (!l)
                        return 0;
                s->line = l;
                s->cap = cap;
        }
        memcpy(s->line + s->len, ptr, n);
        s->len += n;
        size_t start = 0;
        for (size_t i = s->len - n; i < s->len; i++)
                if (s->line[i] == '\n') {
                        if (i > start)
                                event(s, s->line + start, i - start);
                        start = i + 1;
                }
        memmove(s->line, s->line + start, s->len - start);
        s->len -= start;
        return n;
}

static int64_t now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* --no-follow: stop once nothing new came for 500 ms (what is kept is sent at once; 3 s
 * for the first event, as the answer may take that long on a busy node). */
static int idle_check(void *arg, struct curl_waitfd *fds, unsigned nfds)
{
        (void)fds;
        (void)nfds;
        struct st *s = arg;
        if (!s->no_follow)
                return 0;
        int64_t t = now_ms();
        if (s->progress) {
                s->progress = 0;
                s->seen = 1;
                s->last_ms = t;
        }
        return t - s->last_ms > (s->seen ? 500 : 3000);
}

int cmd_logs(struct cli *c, int argc, char **argv)
{
        enum { O_AFTER = CLI_OPT_VERB_BASE, O_NOFOLLOW };
        static const struct option opts[] = {{"after", required_argument, NULL, O_AFTER},
                                             {"no-follow", no_argument, NULL, O_NOFOLLOW},
                                             CLI_GLOBAL_OPTIONS,
                                             {0}};
        struct st s = {.c = c};
        int opt;
        while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
                if (cli_global_opt(c, opt, optarg))
                        continue;
                if (opt == 'h') {
                        help();
                        return CLI_OK;
                }
                if (opt == O_AFTER) {
                        if (!cli_parse_uint(optarg, (1LL << 53), &s.last))
                                return cli_usage_error("logs", "--after takes a number");
                        continue;
                }
                if (opt == O_NOFOLLOW) {
                        s.no_follow = 1;
                        continue;
                }
                return cli_usage_error("logs", "bad option");
        }
        long long pid;
        if (argc - optind != 2)
                return cli_usage_error("logs", "expected ID PID");
        if (!cli_parse_uint(argv[optind + 1], 1LL << 31, &pid) || pid == 0)
                return cli_usage_error("logs", "PID must be a process number");
        struct cove_err err = {0};
        if (cli_connect(c, &err) < 0)
                return cli_fail(&err);
        cleanup_free char *ei = cli_urlenc(argv[optind]);
        int rc = CLI_OK;
        for (int attempt = 0;; attempt++) {
                cleanup_free char *path =
                    cli_fmt("/v1/sandboxes/%s/processes/%lld/events?after=%lld", ei, pid, s.last);
                s.r = cli_req_new(c, "GET", path, NULL);
                if (!s.r)
                        return CLI_FAIL;
                s.len = 0;
                s.progress = 0;
                s.last_ms = now_ms();
                curl_easy_setopt(s.r->h, CURLOPT_WRITEFUNCTION, on_data);
                curl_easy_setopt(s.r->h, CURLOPT_WRITEDATA, &s);
                struct cli_loop loop = {.on_ready = idle_check, .arg = &s};
                int pr = cli_perform(c, s.r, &loop, &err);
                if (pr == 0 && s.r->status >= 300) {
                        cli_http_error(c, s.r->status, s.r->body, s.r->len, &err);
                        rc = cli_fail(&err);
                } else if (s.exited || pr == -2) {
                        rc = s.failed ? CLI_FAIL : CLI_OK;
                } else if (attempt >= 30) {
                        if (pr == 0)
                                cove_err_set(&err, 0, "the event stream keeps ending");
                        rc = cli_fail(&err);
                } else {
                        if (s.progress)
                                attempt = 0;
                        cli_req_free(s.r);
                        struct timespec ts = {0, (attempt < 4 ? 50L << attempt : 1000L) * 1000000L};
                        nanosleep(&ts, NULL);
                        continue;
                }
                cli_req_free(s.r);
                break;
        }
        free(s.line);
        return rc;
}
