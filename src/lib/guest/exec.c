/* cove-guest processes: exec with pipes or a PTY, stdin streaming with a bounded window,
 * output as OUT frames, reaping, timeouts, signals and resize; plus the tiny passwd/group
 * reader (a static binary has no NSS).
 *
 * EXIT rule: EXIT is sent once the process has been reaped and both its output streams hit
 * end of file, or at the latest G_EXIT_GRACE_MS after the reap: a background grandchild
 * that keeps the pipes (or the PTY) open does not hold the EXIT back. What is already in
 * the pipes at that moment is still sent; later output from the grandchild is dropped. */
#include "guest/internal.h"
#include "guest/guest.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "util/cleanup.h"

#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#define MAX_ARGS 4096
#define MAX_ENV 1024
#define MAX_TIMEOUT_S (365LL * 24 * 3600)

extern char **environ;

/* ---- users ---- */

static int parse_id(const char *s, unsigned long *out)
{
        if (!*s || strlen(s) > 10)
                return -1;
        char *end;
        errno = 0;
        unsigned long v = strtoul(s, &end, 10);
        if (*end || errno || v > 0xfffffffeUL || s[0] == '-' || s[0] == '+')
                return -1;
        *out = v;
        return 0;
}

/* Split a passwd/group line into at most n ':'-separated fields, in place. */
static int split_colon(char *line, char **f, int n)
{
        int i = 0;
        f[i++] = line;
        for (char *p = line; *p && i < n; p++) {
                if (*p == ':') {
                        *p = 0;
                        f[i++] = p + 1;
                }
        }
        return i;
}

static void load_groups(struct guser *u)
{
        u->ngroups = 0;
        u->groups[u->ngroups++] = u->gid;
        cleanup_fclose FILE *f = fopen("/etc/group", "re");
        if (!f)
                return;
        char line[4096];
        while (fgets(line, sizeof(line), f)) {
                line[strcspn(line, "\n")] = 0;
                char *fl[4];
                unsigned long gid;
                if (split_colon(line, fl, 4) != 4 || parse_id(fl[2], &gid) < 0)
                        continue;
                char *save = NULL;
                for (char *m = strtok_r(fl[3], ",", &save); m; m = strtok_r(NULL, ",", &save)) {
                        if (strcmp(m, u->name) == 0 && (gid_t)gid != u->gid &&
                            u->ngroups < (int)COVE_ARRAY_SIZE(u->groups)) {
                                u->groups[u->ngroups++] = (gid_t)gid;
                                break;
                        }
                }
        }
}

int g_user_lookup(const char *spec, struct guser *u, struct cove_err *e)
{
        memset(u, 0, sizeof(*u));
        unsigned long want_uid = 0;
        bool by_uid = true;
        if (!spec)
                want_uid = getuid();
        else if (parse_id(spec, &want_uid) < 0) {
                by_uid = false;
                if (!*spec || strlen(spec) >= sizeof(u->name) || strpbrk(spec, ":\n/"))
                        return cove_err_setk(e, COVE_E_BAD_REQUEST, 0, "user \"%.64s\": invalid",
                                             spec);
        }
        cleanup_fclose FILE *f = fopen("/etc/passwd", "re");
        char line[4096];
        while (f && fgets(line, sizeof(line), f)) {
                line[strcspn(line, "\n")] = 0;
                char *fl[7];
                unsigned long uid, gid;
                if (split_colon(line, fl, 7) != 7 || parse_id(fl[2], &uid) < 0 ||
                    parse_id(fl[3], &gid) < 0)
                        continue;
                if (by_uid ? uid != want_uid : strcmp(fl[0], spec) != 0)
                        continue;
                u->uid = (uid_t)uid;
                u->gid = (gid_t)gid;
                snprintf(u->name, sizeof(u->name), "%s", fl[0]);
                snprintf(u->home, sizeof(u->home), "%s", fl[5][0] == '/' ? fl[5] : "/");
                snprintf(u->shell, sizeof(u->shell), "%s", fl[6]);
                load_groups(u);
                return 0;
        }
        if (!by_uid)
                return cove_err_setk(e, COVE_E_NOT_FOUND, 0, "user \"%s\": no such user", spec);
        /* a numeric uid without a passwd line: run it with gid = uid (or ours) */
        u->uid = (uid_t)want_uid;
        u->gid = spec ? (gid_t)want_uid : getgid();
        snprintf(u->name, sizeof(u->name), "%lu", want_uid);
        if (want_uid == 0)
                snprintf(u->name, sizeof(u->name), "root");
        snprintf(u->home, sizeof(u->home), "%s", want_uid == 0 ? "/root" : "/");
        u->groups[0] = u->gid;
        u->ngroups = 1;
        return 0;
}

/* The name of a uid (/etc/passwd) or gid (/etc/group) of the sandbox; the decimal id when
 * it has none. */
void g_id_name(bool group, unsigned long id, char *out, size_t cap)
{
        snprintf(out, cap, "%lu", id);
        cleanup_fclose FILE *f = fopen(group ? "/etc/group" : "/etc/passwd", "re");
        char line[4096];
        while (f && fgets(line, sizeof(line), f)) {
                line[strcspn(line, "\n")] = 0;
                char *fl[4];
                unsigned long v;
                if (split_colon(line, fl, 4) < 3 || parse_id(fl[2], &v) < 0 || v != id)
                        continue;
                if (fl[0][0] && strlen(fl[0]) < cap)
                        snprintf(out, cap, "%s", fl[0]);
                return;
        }
}

/* ---- signals ---- */

static const struct {
        const char *name;
        int sig;
} sigs[] = {
    {"HUP", SIGHUP},       {"INT", SIGINT},   {"QUIT", SIGQUIT},   {"ILL", SIGILL},
    {"TRAP", SIGTRAP},     {"ABRT", SIGABRT}, {"BUS", SIGBUS},     {"FPE", SIGFPE},
    {"KILL", SIGKILL},     {"USR1", SIGUSR1}, {"SEGV", SIGSEGV},   {"USR2", SIGUSR2},
    {"PIPE", SIGPIPE},     {"ALRM", SIGALRM}, {"TERM", SIGTERM},   {"CHLD", SIGCHLD},
    {"CONT", SIGCONT},     {"STOP", SIGSTOP}, {"TSTP", SIGTSTP},   {"TTIN", SIGTTIN},
    {"TTOU", SIGTTOU},     {"URG", SIGURG},   {"XCPU", SIGXCPU},   {"XFSZ", SIGXFSZ},
    {"VTALRM", SIGVTALRM}, {"PROF", SIGPROF}, {"WINCH", SIGWINCH}, {"IO", SIGIO},
    {"PWR", SIGPWR},       {"SYS", SIGSYS},
};

const char *g_signal_name(int sig, char *buf, size_t cap)
{
        for (size_t i = 0; i < COVE_ARRAY_SIZE(sigs); i++)
                if (sigs[i].sig == sig)
                        return sigs[i].name;
        snprintf(buf, cap, "%d", sig);
        return buf;
}

int g_signal_parse(json_t *v, int *sig)
{
        if (json_is_integer(v)) {
                json_int_t n = json_integer_value(v);
                if (n < 1 || n > SIGRTMAX)
                        return -1;
                *sig = (int)n;
                return 0;
        }
        if (!json_is_string(v))
                return -1;
        const char *s = json_string_value(v);
        unsigned long n;
        if (parse_id(s, &n) == 0) {
                if (n < 1 || n > (unsigned long)SIGRTMAX)
                        return -1;
                *sig = (int)n;
                return 0;
        }
        if (strncmp(s, "SIG", 3) == 0)
                s += 3;
        for (size_t i = 0; i < COVE_ARRAY_SIZE(sigs); i++) {
                if (strcmp(sigs[i].name, s) == 0) {
                        *sig = sigs[i].sig;
                        return 0;
                }
        }
        return -1;
}

/* ---- process table ---- */

static struct gproc *proc_find(struct cove_guest *g, uint32_t pid)
{
        for (size_t i = 0; i < g->nprocs; i++) {
                struct gproc *p = g->procs[i];
                if (!p->dead && (uint32_t)p->pid == pid)
                        return p;
        }
        return NULL;
}

static void close_fd(int *fd)
{
        if (*fd >= 0) {
                close(*fd);
                *fd = -1;
        }
}

static void proc_close_stdin(struct gproc *p)
{
        p->stdin_open = false;
        free(p->in.data);
        p->in = (struct gbuf){0};
        if (!p->pty)
                close_fd(&p->in_fd);
        else
                p->in_fd = -1;
}

static void proc_close_all(struct gproc *p)
{
        proc_close_stdin(p);
        close_fd(&p->out_fd);
        close_fd(&p->err_fd);
}

static int send_exit(struct cove_guest *g, struct gproc *p, struct cove_err *err)
{
        char buf[16];
        json_t *code = WIFEXITED(p->status) ? json_integer(WEXITSTATUS(p->status)) : json_null();
        json_t *sig = WIFSIGNALED(p->status)
                          ? json_string(g_signal_name(WTERMSIG(p->status), buf, sizeof(buf)))
                          : json_null();
        json_t *o = json_pack("{s:o, s:o, s:b}", "exit_code", code, "signal", sig, "timed_out",
                              p->timed_out);
        proc_close_all(p);
        p->dead = true;
        return g_send_json(g, COVE_F_EXIT, (uint32_t)p->pid, o, err);
}

static int maybe_finish(struct cove_guest *g, struct gproc *p, struct cove_err *err)
{
        if (!p->dead && p->reaped && p->out_fd < 0 && p->err_fd < 0)
                return send_exit(g, p, err);
        return 0;
}

/* One read from an output fd. Returns 0 after sending data, 1 at EOF (fd closed), 2 when
 * nothing is there, or -1 (channel failure). */
static int read_output(struct cove_guest *g, struct gproc *p, int *fd, uint8_t flag,
                       struct cove_err *err)
{
        ssize_t n = read(*fd, g->iobuf, sizeof(g->iobuf));
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
                return 2;
        if (n <= 0) { /* EOF, or EIO on a PTY master once every slave is closed */
                if (fd == &p->out_fd && p->pty)
                        p->in_fd = -1, p->stdin_open = false;
                close_fd(fd);
                return 1;
        }
        if (g_send(g, COVE_F_OUT, flag, (uint32_t)p->pid, g->iobuf, (size_t)n, err) < 0)
                return -1;
        return 0;
}

static uint32_t out_events(struct gproc *p)
{
        uint32_t ev = EPOLLIN;
        if (p->pty && p->in.len > p->in.off)
                ev |= EPOLLOUT;
        return ev;
}

/* Write buffered stdin. On EPIPE or a closed PTY, the rest is dropped. */
static void flush_stdin(struct cove_guest *g, struct gproc *p)
{
        if (p->in_fd < 0)
                return;
        while (p->in.off < p->in.len) {
                ssize_t n = write(p->in_fd, p->in.data + p->in.off, p->in.len - p->in.off);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno == EAGAIN)
                                break;
                        proc_close_stdin(p); /* EPIPE: the reader is gone */
                        return;
                }
                p->in.off += (size_t)n;
        }
        bool pending = p->in.off < p->in.len;
        if (!pending) {
                if (p->in.len > 4 * G_IO_BUF) {
                        free(p->in.data);
                        p->in.data = NULL;
                }
                p->in.len = p->in.off = 0;
        }
        if (p->pty) {
                g_epoll_mod(g, p->out_fd, out_events(p), &p->s_out);
        } else if (pending != p->in_registered) {
                if (pending)
                        g_epoll_add(g, p->in_fd, EPOLLOUT, &p->s_in);
                else
                        epoll_ctl(g->epfd, EPOLL_CTL_DEL, p->in_fd, NULL);
                p->in_registered = pending;
        }
        if (!pending && p->stdin_eof && p->in_fd >= 0) {
                if (p->pty) {
                        /* a terminal has no half-close: EOF is VEOF at the start of a line */
                        struct termios t;
                        char eof = tcgetattr(p->out_fd, &t) == 0 ? (char)t.c_cc[VEOF] : 4;
                        ssize_t w = write(p->out_fd, &eof, 1);
                        (void)w;
                        p->in_fd = -1;
                } else {
                        close_fd(&p->in_fd);
                }
                p->stdin_eof = false;
        }
}

bool g_stdin_window_full(struct cove_guest *g)
{
        for (size_t i = 0; i < g->nprocs; i++) {
                struct gproc *p = g->procs[i];
                if (!p->dead && p->in_fd >= 0 && p->in.len - p->in.off > G_STDIN_WINDOW)
                        return true;
        }
        return false;
}

int g_stdin_data(struct cove_guest *g, uint32_t pid, uint8_t flags, const uint8_t *d, size_t n)
{
        struct gproc *p = proc_find(g, pid);
        /* stdin for a process that is gone or whose stdin was closed: dropped (races) */
        if (!p || !p->stdin_open)
                return 0;
        if (n > 0) {
                size_t pending = p->in.len - p->in.off;
                if (p->in.off > 0) {
                        memmove(p->in.data, p->in.data + p->in.off, pending);
                        p->in.len = pending;
                        p->in.off = 0;
                }
                uint8_t *nd = realloc(p->in.data, pending + n);
                if (!nd) {
                        proc_close_stdin(p);
                        return 0;
                }
                p->in.data = nd;
                memcpy(nd + pending, d, n);
                p->in.len = pending + n;
        }
        if (flags & COVE_FF_END) {
                p->stdin_open = false;
                p->stdin_eof = true;
        }
        flush_stdin(g, p);
        /* back-pressure: a process that does not read its stdin pauses the channel once
         * G_STDIN_WINDOW bytes are waiting (memory stays bounded). */
        if (p->in_fd >= 0 && p->in.len - p->in.off > G_STDIN_WINDOW)
                g->chan_paused = true;
        return 0;
}

int g_proc_event(struct cove_guest *g, struct gsrc *s, uint32_t events, struct cove_err *err)
{
        struct gproc *p = s->obj;
        if (p->dead)
                return 0;
        int r = 0;
        switch (s->kind) {
        case GS_OUT:
                if ((events & EPOLLOUT) && p->pty && p->in_fd >= 0)
                        flush_stdin(g, p);
                if (p->out_fd >= 0 && (events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
                        r = read_output(g, p, &p->out_fd, p->pty ? COVE_FF_PTY : COVE_FF_STDOUT,
                                        err);
                break;
        case GS_ERR:
                if (p->err_fd >= 0)
                        r = read_output(g, p, &p->err_fd, COVE_FF_STDERR, err);
                break;
        case GS_IN:
                if (p->in_fd >= 0 && (events & (EPOLLERR | EPOLLHUP)))
                        proc_close_stdin(p);
                else if (p->in_fd >= 0)
                        flush_stdin(g, p);
                break;
        default:
                break;
        }
        if (r < 0)
                return -1;
        return maybe_finish(g, p, err);
}

int g_reap(struct cove_guest *g, struct cove_err *err)
{
        for (;;) {
                int st;
                pid_t pid = waitpid(-1, &st, WNOHANG);
                if (pid <= 0)
                        return 0; /* 0: none left exited; -1: ECHILD */
                for (size_t i = 0; i < g->nprocs; i++) {
                        struct gproc *p = g->procs[i];
                        if (p->dead || p->reaped || p->pid != pid)
                                continue;
                        p->reaped = true;
                        p->status = st;
                        p->grace_ms = g_now_ms() + G_EXIT_GRACE_MS;
                        if (maybe_finish(g, p, err) < 0)
                                return -1;
                        break;
                }
        }
}

/* Grace expired: send what the pipes hold now (bounded), then EXIT. */
static int drain_and_exit(struct cove_guest *g, struct gproc *p, struct cove_err *err)
{
        int r = 0;
        for (int i = 0; i < 16 && p->out_fd >= 0 && r == 0; i++)
                r = read_output(g, p, &p->out_fd, p->pty ? COVE_FF_PTY : COVE_FF_STDOUT, err);
        if (r < 0)
                return -1;
        r = 0;
        for (int i = 0; i < 16 && p->err_fd >= 0 && r == 0; i++)
                r = read_output(g, p, &p->err_fd, COVE_FF_STDERR, err);
        if (r < 0)
                return -1;
        return send_exit(g, p, err);
}

int g_proc_timers(struct cove_guest *g, int64_t now, int64_t *next, struct cove_err *err)
{
        for (size_t i = 0; i < g->nprocs; i++) {
                struct gproc *p = g->procs[i];
                if (p->dead)
                        continue;
                int64_t t = -1;
                if (!p->reaped && p->deadline_ms && !p->timed_out) {
                        if (now >= p->deadline_ms) {
                                p->timed_out = true;
                                kill(-p->pid, SIGKILL);
                                kill(p->pid, SIGKILL);
                        } else {
                                t = p->deadline_ms;
                        }
                }
                if (p->reaped) {
                        if (now >= p->grace_ms) {
                                if (drain_and_exit(g, p, err) < 0)
                                        return -1;
                                continue;
                        }
                        t = p->grace_ms;
                }
                if (t >= 0 && (*next < 0 || t < *next))
                        *next = t;
        }
        return 0;
}

void g_forward_signal(struct cove_guest *g, int sig)
{
        for (size_t i = 0; i < g->nprocs; i++) {
                struct gproc *p = g->procs[i];
                if (!p->dead && !p->reaped)
                        kill(-p->pid, sig);
        }
}

void g_procs_sweep(struct cove_guest *g)
{
        size_t j = 0;
        for (size_t i = 0; i < g->nprocs; i++) {
                struct gproc *p = g->procs[i];
                if (p->dead) {
                        proc_close_all(p);
                        free(p);
                } else {
                        g->procs[j++] = p;
                }
        }
        g->nprocs = j;
}

void g_procs_kill_all(struct cove_guest *g)
{
        for (size_t i = 0; i < g->nprocs; i++) {
                struct gproc *p = g->procs[i];
                if (p->dead)
                        continue;
                kill(-p->pid, SIGKILL);
                if (!p->reaped) {
                        kill(p->pid, SIGKILL);
                        while (waitpid(p->pid, NULL, 0) < 0 && errno == EINTR)
                                ;
                }
                proc_close_all(p);
                p->dead = true;
        }
        while (waitpid(-1, NULL, WNOHANG) > 0)
                ;
}

/* ---- exec ---- */

struct exec_req {
        char **argv;
        char **envp;
        size_t nenv;
        char cwd[G_PATH_MAX];
        struct guser user;
        bool switch_user;
        bool want_stdin;
        bool pty;
        unsigned short cols, rows;
        int64_t timeout_s;
};

static void strv_free(char **v)
{
        if (!v)
                return;
        for (char **p = v; *p; p++)
                free(*p);
        free(v);
}

static void exec_req_free(struct exec_req *x)
{
        strv_free(x->argv);
        strv_free(x->envp);
}

/* Set K=V in x->envp (replacing K). envp has room for MAX_ENV + 8 entries. */
static int env_set(struct exec_req *x, const char *k, const char *v)
{
        size_t kl = strlen(k);
        char *kv = malloc(kl + strlen(v) + 2);
        if (!kv)
                return -1;
        sprintf(kv, "%s=%s", k, v);
        for (size_t i = 0; i < x->nenv; i++) {
                if (strncmp(x->envp[i], k, kl) == 0 && x->envp[i][kl] == '=') {
                        free(x->envp[i]);
                        x->envp[i] = kv;
                        return 0;
                }
        }
        x->envp[x->nenv++] = kv;
        x->envp[x->nenv] = NULL;
        return 0;
}

static int parse_exec(struct cove_guest *g, json_t *req, struct exec_req *x, struct cove_err *e)
{
        json_t *cmd = json_object_get(req, "cmd");
        const char *shell;
        if (g_get_str(req, "shell", false, &shell, e) < 0)
                return -1;
        if (cmd && json_is_null(cmd))
                cmd = NULL;
        if ((cmd != NULL) == (shell != NULL))
                return cove_err_setk(e, COVE_E_BAD_REQUEST, 0,
                                     "exec: give exactly one of \"cmd\" (array) or \"shell\"");
        size_t argc = shell ? 3 : json_array_size(cmd);
        if (cmd && (!json_is_array(cmd) || argc == 0 || argc > MAX_ARGS))
                return cove_err_setk(e, COVE_E_BAD_REQUEST, 0,
                                     "exec: \"cmd\" must be a non-empty array of at most %d "
                                     "strings",
                                     MAX_ARGS);
        x->argv = calloc(argc + 1, sizeof(char *));
        if (!x->argv)
                return cove_err_set(e, ENOMEM, "exec");
        for (size_t i = 0; i < argc; i++) {
                const char *a;
                if (shell)
                        a = i == 0 ? "/bin/sh" : i == 1 ? "-c" : shell;
                else if (!json_is_string(json_array_get(cmd, i)))
                        return cove_err_setk(e, COVE_E_BAD_REQUEST, 0,
                                             "exec: cmd[%zu] must be a string", i);
                else
                        a = json_string_value(json_array_get(cmd, i));
                if (!(x->argv[i] = strdup(a)))
                        return cove_err_set(e, ENOMEM, "exec");
        }
        if (!shell && !x->argv[0][0])
                return cove_err_setk(e, COVE_E_BAD_REQUEST, 0, "exec: cmd[0] is empty");

        /* user */
        json_t *uv = json_object_get(req, "user");
        char ubuf[32];
        const char *uspec = NULL;
        if (json_is_integer(uv)) {
                snprintf(ubuf, sizeof(ubuf), "%lld", (long long)json_integer_value(uv));
                uspec = ubuf;
        } else if (uv && !json_is_null(uv) && g_get_str(req, "user", false, &uspec, e) < 0) {
                return -1;
        }
        if (g_user_lookup(uspec, &x->user, e) < 0)
                return cove_err_wrap(e, "exec");
        x->switch_user = uspec && (x->user.uid != getuid() || x->user.gid != getgid());
        if (x->switch_user && geteuid() != 0)
                return cove_err_setk(e, COVE_E_BAD_REQUEST, EPERM, "exec: user %s", x->user.name);

        /* env: defaults, then the request's */
        json_t *env = json_object_get(req, "env");
        if (env && !json_is_null(env) && (!json_is_object(env) || json_object_size(env) > MAX_ENV))
                return cove_err_setk(e, COVE_E_BAD_REQUEST, 0,
                                     "exec: \"env\" must be an object of at most %d strings",
                                     MAX_ENV);
        x->envp = calloc(MAX_ENV + 8, sizeof(char *));
        if (!x->envp)
                return cove_err_set(e, ENOMEM, "exec");
        const char *path = getenv("PATH");
        if (env_set(x, "PATH", path && *path ? path : DEFAULT_PATH) < 0 ||
            env_set(x, "HOME", x->user.home) < 0 || env_set(x, "USER", x->user.name) < 0 ||
            env_set(x, "LOGNAME", x->user.name) < 0 ||
            (x->user.shell[0] && env_set(x, "SHELL", x->user.shell) < 0))
                return cove_err_set(e, ENOMEM, "exec");
        json_t *pty = json_object_get(req, "pty");
        if (pty && !json_is_null(pty)) {
                int64_t cols = 80, rows = 24;
                if (!json_is_object(pty) || g_get_int(pty, "cols", false, 1, 65535, &cols, e) < 0 ||
                    g_get_int(pty, "rows", false, 1, 65535, &rows, e) < 0)
                        return cove_err_setk(e, COVE_E_BAD_REQUEST, 0,
                                             "exec: \"pty\" must be {cols, rows} within "
                                             "1..65535");
                x->pty = true;
                x->cols = (unsigned short)cols;
                x->rows = (unsigned short)rows;
                if (env_set(x, "TERM", "xterm-256color") < 0)
                        return cove_err_set(e, ENOMEM, "exec");
        }
        const char *k;
        json_t *v;
        json_object_foreach(env, k, v)
        {
                if (!json_is_string(v) || !*k || strchr(k, '='))
                        return cove_err_setk(e, COVE_E_BAD_REQUEST, 0,
                                             "exec: env \"%.64s\": name must be non-empty "
                                             "without '=', value a string",
                                             k);
                if (env_set(x, k, json_string_value(v)) < 0)
                        return cove_err_set(e, ENOMEM, "exec");
        }

        /* cwd: default the user's home, or / when it does not exist */
        const char *cwd;
        if (g_get_str(req, "cwd", false, &cwd, e) < 0)
                return -1;
        if (cwd) {
                if (g_resolve_path(g, cwd, uspec, x->cwd, e) < 0)
                        return cove_err_wrap(e, "exec: cwd");
        } else {
                struct stat st;
                snprintf(x->cwd, sizeof(x->cwd), "%s",
                         stat(x->user.home, &st) == 0 && S_ISDIR(st.st_mode) ? x->user.home : "/");
        }
        if (g_get_bool(req, "stdin", &x->want_stdin, e) < 0)
                return -1;
        x->timeout_s = 0;
        if (g_get_int(req, "timeout_s", false, 0, MAX_TIMEOUT_S, &x->timeout_s, e) < 0)
                return -1;
        return 0;
}

enum { ST_SETUP = 1, ST_USER, ST_CWD, ST_EXEC };
struct child_err {
        int stage;
        int errnum;
};

static void __attribute__((noreturn)) child_fail(int efd, int stage)
{
        struct child_err ce = {stage, errno};
        ssize_t w = write(efd, &ce, sizeof(ce));
        (void)w;
        _exit(127);
}

/* In the child, after fork: never returns. Only async-signal-safe work plus execvp (we are
 * single-threaded, so the heap is consistent). */
static void __attribute__((noreturn))
child_exec(struct exec_req *x, int efd, int in, int out, int errfd, int slave)
{
        sigset_t none;
        sigemptyset(&none);
        for (int s = 1; s < NSIG; s++)
                if (s != SIGKILL && s != SIGSTOP)
                        signal(s, SIG_DFL);
        sigprocmask(SIG_SETMASK, &none, NULL);
        if (setsid() < 0)
                child_fail(efd, ST_SETUP);
        /* the ns runtime shields cove-guest from the OOM killer (-1000); what it runs must stay
         * killable (best effort: without /proc there is no such setting to undo) */
        int oom = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
        if (oom >= 0) {
                if (write(oom, "0\n", 2) != 2)
                        child_fail(efd, ST_SETUP);
                close(oom);
        }
        /* into the workload's memory cgroup (ns runtime), so that an OOM there ends what runs
         * and never the guest; no such directory: a vm, or a sandbox without memory cgroup */
        /* Best effort: one ASan run saw EACCES here on a fresh sandbox's first exec (cause not
         * found yet). The process then stays in the sandbox's own memory cgroup: still under
         * memory_mb, only the guest loses its reserve for it. Failing the exec would be worse. */
        /* v1: "0" into tasks moves this thread, which is the whole (single-threaded) child,
         * without the kernel's global cgroup_threadgroup_rwsem that cgroup.procs takes: its
         * write lock waits for an RCU grace period whenever no other migration ran in the
         * last one, 4-19 ms on a loaded host (docs/performance.md, "The first exec") */
        int cg = open(COVE_GUEST_WORK_TASKS, O_WRONLY | O_CLOEXEC);
        if (cg < 0)
                cg = open(COVE_GUEST_WORK_PROCS, O_WRONLY | O_CLOEXEC);
        if (cg >= 0) {
                if (write(cg, "0", 1) != 1 && errno != EACCES && errno != EPERM)
                        child_fail(efd, ST_SETUP);
                close(cg);
        } else if (errno != ENOENT && errno != EACCES && errno != EPERM) {
                child_fail(efd, ST_SETUP);
        }
        if (slave >= 0) {
                if (ioctl(slave, TIOCSCTTY, 0) < 0)
                        child_fail(efd, ST_SETUP);
                in = out = errfd = slave;
        }
        /* dup2 onto itself would keep O_CLOEXEC: fds 0-2 are always taken in the guest */
        if (dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(errfd, 2) < 0)
                child_fail(efd, ST_SETUP);
        close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
        if (x->switch_user) {
                if (setgroups((size_t)x->user.ngroups, x->user.groups) < 0 ||
                    setgid(x->user.gid) < 0 || setuid(x->user.uid) < 0)
                        child_fail(efd, ST_USER);
        }
        if (chdir(x->cwd) < 0)
                child_fail(efd, ST_CWD);
        environ = x->envp;
        execvp(x->argv[0], x->argv);
        child_fail(efd, ST_EXEC);
}

static int open_pty(struct exec_req *x, int *master, int *slave, struct cove_err *e)
{
        int m = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC | O_NONBLOCK);
        if (m < 0)
                return cove_err_set(e, errno, "exec: open /dev/ptmx");
        int unlock = 0;
        if (ioctl(m, TIOCSPTLCK, &unlock) < 0) {
                close(m);
                return cove_err_set(e, errno, "exec: unlock pty");
        }
        /* TIOCGPTPEER opens the slave without a path lookup in /dev/pts */
        int s = ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
        if (s < 0) {
                unsigned int n;
                char name[64];
                if (ioctl(m, TIOCGPTN, &n) < 0) {
                        close(m);
                        return cove_err_set(e, errno, "exec: pty number");
                }
                snprintf(name, sizeof(name), "/dev/pts/%u", n);
                s = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
                if (s < 0) {
                        int en = errno;
                        close(m);
                        return cove_err_set(e, en, "exec: open %s", name);
                }
        }
        struct winsize ws = {.ws_row = x->rows, .ws_col = x->cols};
        ioctl(m, TIOCSWINSZ, &ws);
        *master = m;
        *slave = s;
        return 0;
}

static int set_nonblock(int fd)
{
        int fl = fcntl(fd, F_GETFL);
        return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Starts the process. 0 with *out filled, or -1 with e (request error). */
static int spawn(struct cove_guest *g, struct exec_req *x, struct gproc *p, struct cove_err *e)
{
        int inp[2] = {-1, -1}, outp[2] = {-1, -1}, errp[2] = {-1, -1}, ep[2] = {-1, -1};
        int master = -1, slave = -1, devnull = -1;
        int ret = -1;
        if (pipe2(ep, O_CLOEXEC) < 0) {
                cove_err_set(e, errno, "exec: pipe");
                goto out;
        }
        if (x->pty) {
                if (open_pty(x, &master, &slave, e) < 0)
                        goto out;
        } else {
                if (pipe2(outp, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0 ||
                    (x->want_stdin ? pipe2(inp, O_CLOEXEC)
                                   : (devnull = open("/dev/null", O_RDONLY | O_CLOEXEC))) < 0) {
                        cove_err_set(e, errno, "exec: pipes");
                        goto out;
                }
                if (set_nonblock(outp[0]) < 0 || set_nonblock(errp[0]) < 0 ||
                    (x->want_stdin && set_nonblock(inp[1]) < 0)) {
                        cove_err_set(e, errno, "exec: pipes");
                        goto out;
                }
        }
        pid_t pid = fork();
        if (pid < 0) {
                cove_err_setk(e, g_errno_kind(errno), errno, "exec: fork");
                goto out;
        }
        if (pid == 0)
                child_exec(x, ep[1], x->want_stdin ? inp[0] : devnull, outp[1], errp[1], slave);
        close(ep[1]);
        ep[1] = -1;
        struct child_err ce;
        ssize_t n;
        while ((n = read(ep[0], &ce, sizeof(ce))) < 0 && errno == EINTR)
                ;
        if (n == (ssize_t)sizeof(ce)) {
                while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
                        ;
                enum cove_err_kind k = ce.errnum == ENOENT ? COVE_E_NOT_FOUND
                                       : ce.stage == ST_EXEC || ce.stage == ST_CWD
                                           ? COVE_E_BAD_REQUEST
                                           : COVE_E_INTERNAL;
                if (ce.stage == ST_EXEC)
                        cove_err_setk(e, k, ce.errnum, "exec: %s", x->argv[0]);
                else if (ce.stage == ST_CWD)
                        cove_err_setk(e, k, ce.errnum, "exec: cwd %s", x->cwd);
                else if (ce.stage == ST_USER)
                        cove_err_setk(e, k, ce.errnum, "exec: switch to user %s", x->user.name);
                else
                        cove_err_setk(e, k, ce.errnum, "exec: set up the process");
                goto out;
        }
        p->pid = pid;
        p->pty = x->pty;
        if (x->pty) {
                p->out_fd = master;
                master = -1;
                p->err_fd = -1;
                p->in_fd = p->out_fd;
                p->stdin_open = x->want_stdin;
                if (!x->want_stdin)
                        p->in_fd = -1;
        } else {
                p->out_fd = outp[0];
                p->err_fd = errp[0];
                outp[0] = errp[0] = -1;
                p->in_fd = inp[1];
                inp[1] = -1;
                p->stdin_open = x->want_stdin;
        }
        ret = 0;
out:
        for (int *fds[] = {inp, outp, errp, ep}, i = 0; i < 4; i++) {
                close_fd(&fds[i][0]);
                close_fd(&fds[i][1]);
        }
        close_fd(&master);
        close_fd(&slave);
        close_fd(&devnull);
        return ret;
}

int g_op_exec(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err)
{
        struct cove_err e = {0};
        struct exec_req x = {0};
        struct gproc *p = NULL;
        int r;
        if (g->nprocs >= G_MAX_PROCS) {
                cove_err_setk(&e, COVE_E_LIMIT, 0, "exec: %d processes already running",
                              G_MAX_PROCS);
                goto fail;
        }
        if (g_fenced(g)) {
                cove_err_setk(&e, COVE_E_CONFLICT, 0,
                              "exec: the sandbox is frozen until its node confirms it still "
                              "holds it (fence)");
                goto fail;
        }
        if (parse_exec(g, req, &x, &e) < 0)
                goto fail;
        p = calloc(1, sizeof(*p));
        if (!p) {
                cove_err_set(&e, ENOMEM, "exec");
                goto fail;
        }
        p->out_fd = p->err_fd = p->in_fd = -1;
        if (spawn(g, &x, p, &e) < 0)
                goto fail;
        p->s_out = (struct gsrc){GS_OUT, p};
        p->s_err = (struct gsrc){GS_ERR, p};
        p->s_in = (struct gsrc){GS_IN, p};
        if (x.timeout_s > 0)
                p->deadline_ms = g_now_ms() + x.timeout_s * 1000;
        g->procs[g->nprocs++] = p;
        exec_req_free(&x);
        /* RESP before any OUT: output is only read once we are back in the loop */
        if (g_reply_ok(g, id, json_pack("{s:i}", "pid", (int)p->pid), err) < 0)
                return -1;
        if (g_epoll_add(g, p->out_fd, EPOLLIN, &p->s_out) < 0 ||
            (p->err_fd >= 0 && g_epoll_add(g, p->err_fd, EPOLLIN, &p->s_err) < 0)) {
                /* cannot watch its output: treat its streams as ended */
                close_fd(&p->out_fd);
                close_fd(&p->err_fd);
        }
        return 0;
fail:
        exec_req_free(&x);
        free(p);
        r = g_reply_err(g, id, &e, err);
        return r;
}

int g_op_signal(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err)
{
        struct cove_err e = {0};
        int64_t pid;
        int sig;
        if (g_get_int(req, "pid", true, 1, INT32_MAX, &pid, &e) < 0)
                return g_reply_err(g, id, &e, err);
        if (g_signal_parse(json_object_get(req, "signal"), &sig) < 0) {
                cove_err_setk(&e, COVE_E_BAD_REQUEST, 0,
                              "signal: \"signal\" must be a name (TERM, KILL, INT, ...) or a "
                              "number");
                return g_reply_err(g, id, &e, err);
        }
        if (sig == SIGCONT && g_fenced(g)) {
                cove_err_setk(&e, COVE_E_CONFLICT, 0,
                              "signal: the sandbox is frozen until its node confirms it still "
                              "holds it (fence)");
                return g_reply_err(g, id, &e, err);
        }
        struct gproc *p = proc_find(g, (uint32_t)pid);
        if (!p) {
                cove_err_setk(&e, COVE_E_NOT_FOUND, ESRCH, "signal: process %lld", (long long)pid);
                return g_reply_err(g, id, &e, err);
        }
        /* the whole process group: `sh -c` wrappers and pipelines end together */
        if (kill(-p->pid, sig) < 0 && kill(p->pid, sig) < 0 && !p->reaped) {
                cove_err_setk(&e, g_errno_kind(errno), errno, "signal: process %d", p->pid);
                return g_reply_err(g, id, &e, err);
        }
        return g_reply_ok(g, id, NULL, err);
}

int g_op_resize(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err)
{
        struct cove_err e = {0};
        int64_t pid, cols, rows;
        if (g_get_int(req, "pid", true, 1, INT32_MAX, &pid, &e) < 0 ||
            g_get_int(req, "cols", true, 1, 65535, &cols, &e) < 0 ||
            g_get_int(req, "rows", true, 1, 65535, &rows, &e) < 0)
                return g_reply_err(g, id, &e, err);
        struct gproc *p = proc_find(g, (uint32_t)pid);
        if (!p) {
                cove_err_setk(&e, COVE_E_NOT_FOUND, ESRCH, "resize: process %lld", (long long)pid);
                return g_reply_err(g, id, &e, err);
        }
        if (!p->pty || p->out_fd < 0) {
                cove_err_setk(&e, COVE_E_CONFLICT, ENOTTY, "resize: process %d", p->pid);
                return g_reply_err(g, id, &e, err);
        }
        struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
        if (ioctl(p->out_fd, TIOCSWINSZ, &ws) < 0) {
                cove_err_set(&e, errno, "resize: process %d", p->pid);
                return g_reply_err(g, id, &e, err);
        }
        return g_reply_ok(g, id, NULL, err);
}
