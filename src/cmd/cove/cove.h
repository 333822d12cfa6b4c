/* cove CLI: the context every verb gets, the verb entry points, and the small output helpers
 * (JSON printing, relative times, progress spinner) shared by the verbs. One file per verb;
 * HTTP and JSON plumbing lives in client.{c,h}. */
#ifndef COVE_CLI_COVE_H
#define COVE_CLI_COVE_H

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "util/err.h"

/* Exit codes (docs/contributing.md "Errors"). */
#define CLI_OK 0
#define CLI_FAIL 1
#define CLI_USAGE 2

#define CLI_DEFAULT_DATA_DIR "/var/lib/cove"
#define CLI_DEFAULT_LISTEN "127.0.0.1:7677"

/* Per-invocation state, owned by main() and passed down to every verb. */
struct cli {
        const char *url_opt; /* --url, else COVE_URL */
        const char *key_opt; /* --api-key, else COVE_API_KEY */
        bool json;           /* --json: machine output */
        bool out_tty;        /* stdout is a terminal */
        bool err_tty;        /* stderr is a terminal: progress allowed */
        /* Resolved by cli_connect() (client.c): */
        char *base;         /* "http://host:port" or "http://localhost" for the socket */
        char *sock;         /* unix socket path, NULL for TCP */
        char *key;          /* bearer token, NULL when none was found */
        char key_note[256]; /* why there is no key, appended to `unauthorized` errors */
};

/* A verb: argv[0] is the verb name; returns the process exit code. */
typedef int (*cli_verb_fn)(struct cli *c, int argc, char **argv);

int cmd_up(struct cli *c, int argc, char **argv);
int cmd_create(struct cli *c, int argc, char **argv);
int cmd_ls(struct cli *c, int argc, char **argv);
int cmd_inspect(struct cli *c, int argc, char **argv);
int cmd_exec(struct cli *c, int argc, char **argv);
int cmd_cp(struct cli *c, int argc, char **argv);
int cmd_rm(struct cli *c, int argc, char **argv);
int cmd_timeout(struct cli *c, int argc, char **argv);
int cmd_port(struct cli *c, int argc, char **argv);     /* port.c: exposed ports */
int cmd_snapshot(struct cli *c, int argc, char **argv); /* snapshot.c: the time machine verbs */
int cmd_snapshots(struct cli *c, int argc, char **argv);
int cmd_pause(struct cli *c, int argc, char **argv);
int cmd_resume(struct cli *c, int argc, char **argv);
int cmd_rewind(struct cli *c, int argc, char **argv);
int cmd_fork(struct cli *c, int argc, char **argv);
int cmd_audit(struct cli *c, int argc, char **argv); /* audit.c: audit log and leases */
int cmd_leases(struct cli *c, int argc, char **argv);
int cmd_keys(struct cli *c, int argc, char **argv); /* keys.c: keys and tenants */
int cmd_tenants(struct cli *c, int argc, char **argv);
int cmd_template(struct cli *c, int argc, char **argv); /* template.c: build, ls, inspect, rm */
int cmd_diff(struct cli *c, int argc, char **argv);     /* diff.c */
int cmd_mcp(struct cli *c, int argc, char **argv);      /* mcp.c: MCP server on stdio */
int cmd_secret(struct cli *c, int argc, char **argv);   /* secret.c: secrets and egress */
int cmd_egress(struct cli *c, int argc, char **argv);
int cmd_logs(struct cli *c, int argc, char **argv);  /* logs.c */
int cmd_nodes(struct cli *c, int argc, char **argv); /* nodes.c: cluster nodes (admin) */

/* Options every verb accepts besides its own, for getopt_long tables:
 * `struct option opts[] = { {...verb options...}, CLI_GLOBAL_OPTIONS, {0} };` */
enum { CLI_OPT_JSON = 0x1000, CLI_OPT_URL, CLI_OPT_API_KEY, CLI_OPT_VERB_BASE = 0x1100 };
#define CLI_GLOBAL_OPTIONS                                                                         \
        {"json", no_argument, NULL, CLI_OPT_JSON}, {"url", required_argument, NULL, CLI_OPT_URL},  \
            {"api-key", required_argument, NULL, CLI_OPT_API_KEY},                                 \
        {                                                                                          \
                "help", no_argument, NULL, 'h'                                                     \
        }
/* Handle a global option returned by getopt_long; true if it was one. */
bool cli_global_opt(struct cli *c, int opt, const char *arg);
/* Parse argv (argv[0] the sub-verb) that takes only the global options: -1 with *first the
 * index of the first operand, or the exit code to return (help printed: CLI_OK; a bad
 * option: CLI_USAGE, with the usage error of verb). */
int cli_global_args(struct cli *c, int argc, char **argv, const char *verb, void (*help)(void),
                    int *first);
/* getopt state is process-global: call before parsing a verb's argv. */
void cli_getopt_reset(void);

/* "cove VERB: msg\nTry 'cove VERB --help'." on stderr; returns CLI_USAGE. */
int cli_usage_error(const char *verb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "cove: msg" on stderr; returns CLI_FAIL. */
int cli_fail(const struct cove_err *err);

/* Print a JSON value on stdout: indented on a terminal, one line otherwise. */
int cli_print_json(const struct cli *c, const json_t *v);

/* RFC 3339 → unix ms; -1 if it does not parse. */
int64_t cli_parse_time(const char *s);
/* "5s ago", "3m ago", "in 4m", "2d ago"; "-" for NULL/unparsable. */
void cli_reltime(const char *rfc3339, char *out, size_t cap);

/* Parse "K=V" into obj[K] = V; false if there is no '=' or K is empty. */
bool cli_kv_add(json_t *obj, const char *kv);
/* Strict non-negative integer parse; false on junk or overflow. */
bool cli_parse_uint(const char *s, long long max, long long *out);

/* Progress spinner on stderr: shown only when stderr is a terminal, and only once `delay_ms`
 * has passed since cli_progress_start(). */
struct cli_progress {
        bool enabled; /* stderr is a tty and a label was given */
        bool shown;   /* something was drawn and must be erased */
        const char *label;
        int64_t start_ns; /* monotonic */
        int64_t last_ns;  /* last redraw, to redraw at most every 100 ms */
        unsigned frame;
};
void cli_progress_start(struct cli_progress *p, const struct cli *c, const char *label);
void cli_progress_tick(struct cli_progress *p);
void cli_progress_end(struct cli_progress *p);

#endif
