/* cove exec: POST /v1/sandboxes/{id}/exec and follow the NDJSON event stream, writing stdout,
 * stderr and pty output as it comes and exiting with the command's status (128+N for signal
 * N). -i forwards our stdin (a thread POSTing to …/stdin, so a slow stdin never stalls the
 * output); -t asks for a PTY, puts the local terminal in raw mode and sends …/resize on
 * SIGWINCH. A broken stream is resumed with GET …/events?after=LAST_SEQ; events are
 * deduplicated by seq so no byte is written twice. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "cove.h"
#include "util/cleanup.h"

static void help(void)
{
        puts("Usage: cove exec [OPTIONS] ID [--] CMD [ARGS...]\n"
             "\n"
             "Run CMD in sandbox ID, streaming its output; exits with CMD's exit status\n"
             "(128+N if it was killed by signal N).\n"
             "\n"
             "  -i, --interactive   forward stdin to the command (EOF closes its stdin)\n"
             "  -t, --tty           run it on a terminal (raw mode, window size follows);\n"
             "                      usually -it\n"
             "  -e, --env K=V       environment variable (repeatable)\n"
             "  -w, --workdir DIR   working directory inside the sandbox\n"
             "  -u, --user USER     user to run as\n"
             "  --timeout S         kill the command after S seconds\n"
             "\n"
             "Ctrl-C (without -t) sends SIGINT to the command; a second one detaches.\n"
             "If the connection to coved drops, the output resumes where it stopped.");
}

/* The terminal state lives in globals because the signal handlers that must restore it can
 * reach nothing else. Written only before handlers are installed and by term_restore(). */
static struct termios g_saved_termios;
static volatile sig_atomic_t g_raw;
static int g_sig_w = -1; /* write end of the self-pipe the forwarding handlers feed */

static void term_restore(void)
{
        if (g_raw) {
                tcsetattr(STDIN_FILENO, TCSADRAIN, &g_saved_termios);
                g_raw = 0;
        }
}

static void on_fatal_signal(int sig)
{
        term_restore(); /* tcsetattr is async-signal-safe */
        signal(sig, SIG_DFL);
        raise(sig);
}

static void on_forward_signal(int sig)
{
        int saved = errno;
        unsigned char b = (unsigned char)sig;
        if (write(g_sig_w, &b, 1) < 0) {
                /* pipe full: the loop already has signals to handle */
        }
        errno = saved;
}

struct exec_st {
        struct cli *c;
        char *sbx;         /* URL-encoded sandbox id */
        struct cli_req *r; /* the current event stream */
        char *line;        /* partial NDJSON line */
        size_t llen, lcap;
        long long last_seq;  /* highest seq written out */
        bool got_event;      /* this connection delivered a new event */
        bool exited, failed; /* saw `exit` / `error` */
        int exit_code;       /* what we exit with once `exited` */
        int out_errno;       /* writing our stdout/stderr failed */
        int last_signal;     /* last local signal forwarded */
        int interrupts;      /* INT/TERM received so far */
        bool tty;            /* a PTY was requested */
        bool fwd_stdin;      /* -i */
        int stop_r, stop_w;  /* closing stop_w tells the stdin thread to quit */
        pthread_mutex_t mu;  /* guards pid for the stdin thread */
        pthread_cond_t cv;
        long long pid; /* 0 until the `start` event */
};

static int write_all(int fd, const void *buf, size_t n)
{
        const char *p = buf;
        while (n > 0) {
                ssize_t w = write(fd, p, n);
                if (w < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                p += w;
                n -= (size_t)w;
        }
        return 0;
}

/* Signal number from an exit event's `signal`: 9, "9", "KILL" or "SIGKILL". */
static int signum_of(json_t *s)
{
        if (json_is_integer(s))
                return (int)json_integer_value(s);
        const char *name = json_string_value(s);
        if (!name || !*name)
                return 0;
        if (strncasecmp(name, "SIG", 3) == 0)
                name += 3;
        long long v;
        if (cli_parse_uint(name, 127, &v))
                return (int)v;
        for (int i = 1; i < NSIG; i++) {
                const char *ab = sigabbrev_np(i);
                if (ab && strcasecmp(ab, name) == 0)
                        return i;
        }
        return 0;
}

static void set_pid(struct exec_st *st, long long pid)
{
        pthread_mutex_lock(&st->mu);
        st->pid = pid;
        pthread_cond_broadcast(&st->cv);
        pthread_mutex_unlock(&st->mu);
}

static void handle_event(struct exec_st *st, const char *line, size_t len)
{
        json_error_t jerr;
        json_t *ev = json_loadb(line, len, 0, &jerr);
        if (!json_is_object(ev)) {
                fprintf(stderr, "cove: ignoring a bad event from coved: %s\r\n", jerr.text);
                json_decref(ev);
                return;
        }
        json_t *jseq = json_object_get(ev, "seq");
        if (json_is_integer(jseq)) {
                long long seq = json_integer_value(jseq);
                if (seq <= st->last_seq) {
                        json_decref(ev); /* replayed after a reconnect: already written */
                        return;
                }
                st->last_seq = seq;
        }
        st->got_event = true;
        const char *type = json_string_value(json_object_get(ev, "type"));
        if (!type)
                type = "";
        if (strcmp(type, "start") == 0) {
                json_t *pid = json_object_get(ev, "pid");
                if (json_is_integer(pid) && json_integer_value(pid) > 0)
                        set_pid(st, json_integer_value(pid));
        } else if (strcmp(type, "stdout") == 0 || strcmp(type, "stderr") == 0 ||
                   strcmp(type, "pty") == 0) {
                const char *b64 = json_string_value(json_object_get(ev, "data_b64"));
                size_t blen = b64 ? strlen(b64) : 0;
                unsigned char *buf = malloc(blen / 4 * 3 + 4);
                long n = buf ? cli_b64_decode(b64 ? b64 : "", blen, buf) : -1;
                if (n > 0 && !st->out_errno) {
                        int fd = strcmp(type, "stderr") == 0 ? STDERR_FILENO : STDOUT_FILENO;
                        int w = write_all(fd, buf, (size_t)n);
                        if (w < 0)
                                st->out_errno = -w;
                } else if (n < 0) {
                        fprintf(stderr, "cove: bad base64 in a %s event (seq %lld)\r\n", type,
                                st->last_seq);
                }
                free(buf);
        } else if (strcmp(type, "exit") == 0) {
                int sig = signum_of(json_object_get(ev, "signal"));
                json_t *code = json_object_get(ev, "exit_code");
                if (sig > 0)
                        st->exit_code = (128 + sig) & 0xff;
                else if (json_is_integer(code))
                        st->exit_code = (int)(json_integer_value(code) & 0xff);
                else
                        st->exit_code = CLI_FAIL;
                st->exited = true;
        } else if (strcmp(type, "error") == 0) {
                json_t *e = json_object_get(ev, "error");
                if (!json_is_object(e))
                        e = ev;
                const char *code = json_string_value(json_object_get(e, "code"));
                const char *msg = json_string_value(json_object_get(e, "message"));
                term_restore();
                fprintf(stderr, "cove: %s%s%s\n", code ? code : "", code && msg ? ": " : "",
                        msg ? msg : (code ? "" : "exec failed"));
                st->failed = true;
        } else if (strstr(type, "overflow") || strstr(type, "lost") || strstr(type, "gap")) {
                /* The replay buffer could not keep everything since our last seq. */
                fprintf(stderr, "\r\ncove: warning: some output was lost (%s)\r\n", type);
        }
        /* Other types are newer than this client: ignore them. */
        json_decref(ev);
}

static size_t on_stream(char *ptr, size_t size, size_t nmemb, void *arg)
{
        struct exec_st *st = arg;
        size_t n = size * nmemb;
        if (cli_req_status(st->r) >= 300)
                return cli_collect_cb(ptr, size, nmemb, st->r);
        if (st->llen + n + 1 > st->lcap) {
                size_t cap = st->lcap ? st->lcap : 65536;
                while (cap < st->llen + n + 1)
                        cap *= 2;
                if (cap > (256u << 20))
                        return 0; /* a line this long is not an event */
                char *l = realloc(st->line, cap);
                if (!l)
                        return 0;
                st->line = l;
                st->lcap = cap;
        }
        memcpy(st->line + st->llen, ptr, n);
        st->llen += n;
        size_t start = 0;
        for (size_t i = st->llen - n; i < st->llen; i++) {
                if (st->line[i] != '\n')
                        continue;
                if (i > start)
                        handle_event(st, st->line + start, i - start);
                start = i + 1;
        }
        memmove(st->line, st->line + start, st->llen - start);
        st->llen -= start;
        return n;
}

/* POST a small JSON body on the side (resize, signal); failures are not fatal. */
static void side_call(struct exec_st *st, const char *what, json_t *body)
{
        long long pid;
        pthread_mutex_lock(&st->mu);
        pid = st->pid;
        pthread_mutex_unlock(&st->mu);
        if (pid > 0) {
                struct cove_err err = {0};
                cleanup_free char *path =
                    cli_fmt("/v1/sandboxes/%s/processes/%lld/%s", st->sbx, pid, what);
                cli_call(st->c, "POST", path, body, NULL, NULL, &err);
        }
        json_decref(body);
}

static void term_size(int *cols, int *rows)
{
        struct winsize ws = {0};
        int fd = isatty(STDIN_FILENO) ? STDIN_FILENO : STDOUT_FILENO;
        if (ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col && ws.ws_row) {
                *cols = ws.ws_col;
                *rows = ws.ws_row;
        } else {
                *cols = 80;
                *rows = 24;
        }
}

static int on_ready(void *arg, struct curl_waitfd *fds, unsigned nfds)
{
        struct exec_st *st = arg;
        if (nfds == 0 || !(fds[0].revents & CURL_WAIT_POLLIN))
                return 0;
        unsigned char sigs[64];
        ssize_t n = read(fds[0].fd, sigs, sizeof(sigs));
        for (ssize_t i = 0; i < n; i++) {
                int sig = sigs[i];
                if (sig == SIGWINCH) {
                        int cols, rows;
                        term_size(&cols, &rows);
                        side_call(st, "resize", json_pack("{sisi}", "cols", cols, "rows", rows));
                        continue;
                }
                st->last_signal = sig;
                pthread_mutex_lock(&st->mu);
                bool started = st->pid > 0;
                pthread_mutex_unlock(&st->mu);
                /* First INT/TERM goes to the command (its exit status then tells what
                 * happened); a second one, or one before the command started, detaches. */
                if (!started || ++st->interrupts >= 2)
                        return 1;
                const char *name = sigabbrev_np(sig);
                side_call(st, "signal", json_pack("{ss}", "signal", name ? name : "TERM"));
        }
        return 0;
}

/* -i: copy our stdin to the process, then close its stdin. Runs on its own thread so the
 * output keeps flowing while a POST waits (the guest may apply backpressure). */
static void *cleanup_stdin_req(struct cli_req *r)
{
        cli_req_free(r);
        return NULL;
}

static void *stdin_thread(void *arg)
{
        struct exec_st *st = arg;
        pthread_mutex_lock(&st->mu);
        while (st->pid == 0) /* the main thread sets -1 when no process will come */
                pthread_cond_wait(&st->cv, &st->mu);
        long long pid = st->pid;
        pthread_mutex_unlock(&st->mu);
        if (pid < 0)
                return NULL;

        cleanup_free char *path = cli_fmt("/v1/sandboxes/%s/processes/%lld/stdin", st->sbx, pid);
        struct cli_req *r = cli_req_new(st->c, "POST", path, "application/octet-stream");
        static char buf[65536]; /* one stdin thread per process */
        bool ok = r != NULL;
        while (ok) {
                struct pollfd pfd[2] = {{.fd = STDIN_FILENO, .events = POLLIN},
                                        {.fd = st->stop_r, .events = POLLIN}};
                if (poll(pfd, 2, -1) < 0) {
                        if (errno == EINTR)
                                continue;
                        break;
                }
                if (pfd[1].revents)
                        return cleanup_stdin_req(r); /* the command is over */
                ssize_t n = read(STDIN_FILENO, buf, sizeof(buf));
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        break;
                /* Retry transport failures (coved restarting); an HTTP error means the
                 * process is gone or closed its stdin: stop quietly. */
                for (int attempt = 0;; attempt++) {
                        curl_easy_setopt(r->h, CURLOPT_POSTFIELDSIZE, (long)n);
                        curl_easy_setopt(r->h, CURLOPT_POSTFIELDS, buf);
                        r->len = 0;
                        CURLcode res = curl_easy_perform(r->h);
                        long status = cli_req_status(r);
                        if (res == CURLE_OK && status >= 200 && status < 300)
                                break;
                        if (res == CURLE_OK || attempt >= 20) {
                                ok = false;
                                break;
                        }
                        struct timespec ts = {0, 250 * 1000000L};
                        nanosleep(&ts, NULL);
                }
        }
        cli_req_free(r);
        if (ok) {
                cleanup_free char *eof = cli_fmt("%s?eof=true", path);
                for (int attempt = 0; attempt < 20; attempt++) {
                        struct cli_req *e = cli_req_new(st->c, "POST", eof, NULL);
                        if (!e)
                                break;
                        CURLcode res = curl_easy_perform(e->h);
                        cli_req_free(e);
                        if (res == CURLE_OK)
                                break;
                        struct timespec ts = {0, 250 * 1000000L};
                        nanosleep(&ts, NULL);
                }
        }
        return NULL;
}

static int install_signals(struct exec_st *st, bool raw, int pipefd[2])
{
        if (pipe2(pipefd, O_CLOEXEC | O_NONBLOCK) < 0)
                return -1;
        g_sig_w = pipefd[1];
        struct sigaction sa = {.sa_handler = on_forward_signal, .sa_flags = SA_RESTART};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        if (st->tty)
                sigaction(SIGWINCH, &sa, NULL);
        if (raw) {
                struct sigaction fa = {.sa_handler = on_fatal_signal};
                sigemptyset(&fa.sa_mask);
                int fatal[] = {SIGHUP, SIGQUIT, SIGPIPE, SIGABRT, SIGSEGV, SIGBUS, SIGFPE};
                for (size_t i = 0; i < COVE_ARRAY_SIZE(fatal); i++)
                        sigaction(fatal[i], &fa, NULL);
        }
        return 0;
}

static int enter_raw(void)
{
        if (tcgetattr(STDIN_FILENO, &g_saved_termios) < 0)
                return -1;
        struct termios raw = g_saved_termios;
        cfmakeraw(&raw);
        if (tcsetattr(STDIN_FILENO, TCSADRAIN, &raw) < 0)
                return -1;
        g_raw = 1;
        return 0;
}

enum { OPT_TIMEOUT = CLI_OPT_VERB_BASE };

int cmd_exec(struct cli *c, int argc, char **argv)
{
        static const struct option opts[] = {
            {"interactive", no_argument, NULL, 'i'},
            {"tty", no_argument, NULL, 't'},
            {"env", required_argument, NULL, 'e'},
            {"workdir", required_argument, NULL, 'w'},
            {"user", required_argument, NULL, 'u'},
            {"timeout", required_argument, NULL, OPT_TIMEOUT},
            CLI_GLOBAL_OPTIONS,
            {0},
        };
        struct exec_st st = {.c = c,
                             .stop_r = -1,
                             .stop_w = -1,
                             .mu = PTHREAD_MUTEX_INITIALIZER,
                             .cv = PTHREAD_COND_INITIALIZER};
        json_t *req = json_object();
        json_t *env = json_object();
        char *body = NULL, *exec_path = NULL;
        int rc = CLI_OK, opt;
        long long v;
        /* '+': options stop at ID, so CMD's own options are never ours. */
        while ((opt = getopt_long(argc, argv, "+hite:w:u:", opts, NULL)) != -1) {
                if (cli_global_opt(c, opt, optarg))
                        continue;
                switch (opt) {
                case 'h':
                        help();
                        goto out;
                case 'i':
                        st.fwd_stdin = true;
                        break;
                case 't':
                        st.tty = true;
                        break;
                case 'e':
                        if (!cli_kv_add(env, optarg)) {
                                rc = cli_usage_error("exec", "expected K=V, got '%s'", optarg);
                                goto out;
                        }
                        break;
                case 'w':
                        json_object_set_new(req, "cwd", json_string(optarg));
                        break;
                case 'u':
                        json_object_set_new(req, "user", json_string(optarg));
                        break;
                case OPT_TIMEOUT:
                        if (!cli_parse_uint(optarg, 1LL << 40, &v)) {
                                rc = cli_usage_error("exec", "bad --timeout '%s'", optarg);
                                goto out;
                        }
                        json_object_set_new(req, "timeout_s", json_integer(v));
                        break;
                default:
                        rc = cli_usage_error("exec", "bad option");
                        goto out;
                }
        }
        if (optind >= argc) {
                rc = cli_usage_error("exec", "missing sandbox ID");
                goto out;
        }
        const char *id = argv[optind++];
        if (optind < argc && strcmp(argv[optind], "--") == 0)
                optind++;
        if (optind >= argc) {
                rc = cli_usage_error("exec", "missing command");
                goto out;
        }
        json_t *cmd = json_array();
        for (int i = optind; i < argc; i++)
                json_array_append_new(cmd, json_string(argv[i]));
        json_object_set_new(req, "cmd", cmd);

        /* Raw mode only when keystrokes go somewhere: -t without -i leaves the terminal be. */
        bool raw = st.tty && st.fwd_stdin && isatty(STDIN_FILENO);
        if (st.tty) {
                int cols, rows;
                term_size(&cols, &rows);
                json_object_set_new(req, "pty", json_pack("{sisi}", "cols", cols, "rows", rows));
                if (!json_object_get(env, "TERM")) {
                        const char *term = getenv("TERM");
                        json_object_set_new(env, "TERM",
                                            json_string(term && *term ? term : "xterm"));
                }
        }
        if (st.fwd_stdin)
                json_object_set_new(req, "stdin", json_true());
        if (json_object_size(env))
                json_object_set(req, "env", env);

        struct cove_err err = {0};
        if (cli_connect(c, &err) < 0) {
                rc = cli_fail(&err);
                goto out;
        }
        st.sbx = cli_urlenc(id);
        body = json_dumps(req, JSON_COMPACT);
        exec_path = cli_fmt("/v1/sandboxes/%s/exec", st.sbx);

        int pipefd[2] = {-1, -1};
        if (install_signals(&st, raw, pipefd) < 0) {
                cove_err_set(&err, errno, "pipe");
                rc = cli_fail(&err);
                goto out;
        }
        struct curl_waitfd wfd = {.fd = pipefd[0], .events = CURL_WAIT_POLLIN};
        struct cli_loop loop = {.fds = &wfd, .nfds = 1, .on_ready = on_ready, .arg = &st};

        pthread_t thr;
        bool thr_started = false;
        int stop[2] = {-1, -1};
        if (st.fwd_stdin) {
                if (pipe2(stop, O_CLOEXEC) < 0) {
                        cove_err_set(&err, errno, "pipe");
                        rc = cli_fail(&err);
                        goto out_pipe;
                }
                st.stop_r = stop[0];
                st.stop_w = stop[1];
                if (pthread_create(&thr, NULL, stdin_thread, &st) != 0) {
                        cove_err_set(&err, errno, "start the stdin thread");
                        rc = cli_fail(&err);
                        goto out_pipe;
                }
                thr_started = true;
        }
        if (raw)
                atexit(term_restore);
        if (raw && enter_raw() < 0) {
                cove_err_set(&err, errno, "put the terminal in raw mode");
                rc = cli_fail(&err);
                goto out_pipe;
        }

        st.r = cli_req_new(c, "POST", exec_path, "application/json");
        curl_easy_setopt(st.r->h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
        curl_easy_setopt(st.r->h, CURLOPT_POSTFIELDS, body);
        int attempt = 0;
        for (;;) {
                st.llen = 0;
                st.got_event = false;
                curl_easy_setopt(st.r->h, CURLOPT_WRITEFUNCTION, on_stream);
                curl_easy_setopt(st.r->h, CURLOPT_WRITEDATA, &st);
                int pr = cli_perform(c, st.r, &loop, &err);
                if (pr == -2) {
                        term_restore();
                        if (st.pid > 0)
                                fprintf(stderr, "cove: detached; process %lld may still run\n",
                                        st.pid);
                        rc = 128 + st.last_signal;
                        break;
                }
                if (st.exited || st.failed) {
                        rc = st.failed ? CLI_FAIL : st.exit_code;
                        break;
                }
                term_restore();
                if (st.out_errno) {
                        if (st.out_errno != EPIPE)
                                fprintf(stderr, "cove: write output: %s\n", strerror(st.out_errno));
                        rc = CLI_FAIL;
                        break;
                }
                if (pr == 0 && st.r->status >= 300) {
                        cli_http_error(c, st.r->status, st.r->body, st.r->len, &err);
                        rc = cli_fail(&err);
                        break;
                }
                if (st.pid == 0) {
                        if (pr == 0)
                                cove_err_set(&err, 0,
                                             "exec: the event stream ended before "
                                             "the process started");
                        rc = cli_fail(&err);
                        break;
                }
                /* The stream broke: resume after the last event we wrote. */
                if (st.got_event)
                        attempt = 0;
                if (++attempt > 30) {
                        if (pr == 0)
                                cove_err_set(&err, 0, "event stream keeps ending");
                        cove_err_wrap(&err,
                                      "lost the output of process %lld (it may still be "
                                      "running)",
                                      st.pid);
                        rc = cli_fail(&err);
                        break;
                }
                if (raw)
                        enter_raw(); /* keep the terminal raw across the reconnect */
                long ms = attempt < 5 ? 50L << attempt : 1000L;
                struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
                nanosleep(&ts, NULL);
                cli_req_free(st.r);
                cleanup_free char *ev_path =
                    cli_fmt("/v1/sandboxes/%s/processes/%lld/events?after=%lld", st.sbx, st.pid,
                            st.last_seq);
                st.r = cli_req_new(c, "GET", ev_path, NULL);
        }
        term_restore();
        cli_req_free(st.r);
out_pipe:
        if (thr_started) {
                /* Wake the stdin thread wherever it waits (pid, poll), then wait for it: it
                 * uses st and c. A POST in flight is bounded by coved answering. */
                if (st.pid == 0)
                        set_pid(&st, -1);
                close(stop[1]);
                pthread_join(thr, NULL);
                close(stop[0]);
        }
        term_restore();
        /* Leave the pipe open: a late signal handler may still write to it. */
out:
        free(body);
        free(exec_path);
        free(st.sbx);
        free(st.line);
        json_decref(req);
        json_decref(env);
        return rc;
}
