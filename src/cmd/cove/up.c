/* cove up: exec coved in the foreground with the embedded defaults (--data-dir /var/lib/cove,
 * --listen 127.0.0.1:7677, --templates busybox,base so both templates are built on first
 * start); other arguments pass through. coved is looked up next to this binary (installed
 * layout and build tree alike), then in PATH. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cove.h"
#include "runtime/criu.h"

#define CLI_DEFAULT_E2B_API_LISTEN "127.0.0.1:3000"
#define CLI_DEFAULT_E2B_SANDBOX_LISTEN "127.0.0.1:49983"

static void help(void)
{
        puts("Usage: cove up [--data-dir DIR] [--listen ADDR] [COVED-ARGS...]\n"
             "\n"
             "Run coved in the foreground (Ctrl-C stops it).\n"
             "\n"
             "  --data-dir DIR   state directory (default " CLI_DEFAULT_DATA_DIR ")\n"
             "  --listen ADDR    TCP address (default " CLI_DEFAULT_LISTEN ")\n"
             "The E2B-compatible API listens on " CLI_DEFAULT_E2B_API_LISTEN
             " and its sandbox surface\n"
             "on " CLI_DEFAULT_E2B_SANDBOX_LISTEN
             " (--e2b-api-listen/--e2b-sandbox-listen ADDR|none\n"
             "change that; see docs/e2b.md).\n"
             "Other arguments are passed to coved unchanged.");
}

/* "--name VALUE" or "--name=VALUE" at argv[*i]; advances *i past a separate value. */
static int take_opt(int argc, char **argv, int *i, const char *name, const char **val)
{
        size_t n = strlen(name);
        if (strncmp(argv[*i], name, n) != 0)
                return 0;
        if (argv[*i][n] == '=') {
                *val = argv[*i] + n + 1;
                return 1;
        }
        if (argv[*i][n] != '\0')
                return 0;
        if (*i + 1 >= argc)
                return -1;
        *val = argv[++*i];
        return 1;
}

int cmd_up(struct cli *c, int argc, char **argv)
{
        const char *data_dir = NULL, *listen = CLI_DEFAULT_LISTEN;
        char **args = calloc((size_t)argc + 12, sizeof(char *));
        if (!args)
                return CLI_FAIL;
        int n = 1;
        for (int i = 1; i < argc; i++) {
                if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
                        help();
                        free(args);
                        return CLI_OK;
                }
                int r = take_opt(argc, argv, &i, "--data-dir", &data_dir);
                if (r == 0)
                        r = take_opt(argc, argv, &i, "--listen", &listen);
                if (r < 0) {
                        free(args);
                        return cli_usage_error("up", "option '%s' needs a value", argv[i]);
                }
                if (r == 0)
                        args[n++] = argv[i];
        }
        if (!data_dir)
                data_dir = getenv("COVE_DATA_DIR") && *getenv("COVE_DATA_DIR")
                               ? getenv("COVE_DATA_DIR")
                               : CLI_DEFAULT_DATA_DIR;
        /* Our options go first so that a passed-through duplicate still wins, as it would
         * on coved's own command line. */
        memmove(args + 11, args + 1, (size_t)(n - 1) * sizeof(char *));
        args[1] = "--data-dir";
        args[2] = (char *)data_dir;
        args[3] = "--listen";
        args[4] = (char *)listen;
        args[5] = "--templates";
        args[6] = "busybox,base";
        args[7] = "--e2b-api-listen";
        args[8] = CLI_DEFAULT_E2B_API_LISTEN;
        args[9] = "--e2b-sandbox-listen";
        args[10] = CLI_DEFAULT_E2B_SANDBOX_LISTEN;
        args[n + 10] = NULL;

        /* say at once when pauses will keep no memory: coved logs the same (and the result of
         * its own self-check, a few seconds later), but a JSON line is easy to miss */
        struct cove_criu *criu = calloc(1, sizeof(*criu));
        if (criu) {
                cove_criu_detect(criu);
                if (!criu->found)
                        fprintf(stderr,
                                "cove up: full snapshots unavailable: %s\n"
                                "cove up: pause, snapshots, rewind and fork keep files only (no "
                                "memory, no running processes); scripts/install-deps builds a "
                                "criu that works\n",
                                criu->why);
                free(criu);
        }
        char self[PATH_MAX];
        ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
        if (len > 0) {
                self[len] = '\0';
                char *slash = strrchr(self, '/');
                char cand[PATH_MAX + 32];
                if (slash) {
                        *slash = '\0';
                        snprintf(cand, sizeof(cand), "%s/coved", self);
                        if (access(cand, X_OK) == 0) {
                                args[0] = cand;
                                execv(cand, args);
                                fprintf(stderr, "cove: exec %s: %s\n", cand, strerror(errno));
                                free(args);
                                return CLI_FAIL;
                        }
                }
        }
        args[0] = "coved";
        execvp("coved", args);
        fprintf(stderr, "cove: cannot run coved: %s (looked next to cove and in PATH)\n",
                strerror(errno));
        free(args);
        (void)c;
        return CLI_FAIL;
}
