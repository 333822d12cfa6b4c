/* Unit tests for cove-guest (src/lib/guest): the guest loop runs in a forked child on a
 * socketpair (not PID 1, no namespaces, paths in a temp dir) and the test plays the node. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "guest/guest.h"
#include "proto/frame.h"
#include "util/util.h"

struct node {
        int fd;
        pid_t guest;
        struct cove_decoder dec;
        char dir[64];
        uint32_t next_id;
};

struct rx {
        uint8_t type, flags;
        uint32_t id;
        uint32_t len;
        uint8_t *p; /* malloc'd copy, NUL-terminated */
};

static void rx_free(struct rx *r)
{
        free(r->p);
        r->p = NULL;
}

static void start_guest(struct node *n)
{
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        n->guest = fork();
        assert_true(n->guest >= 0);
        if (n->guest == 0) {
                close(sv[0]);
                struct cove_guest_opts o = {.channel_fd = sv[1], .log = NULL};
                struct cove_err err = {0};
                _exit(cove_guest_run(&o, &err) == 0 ? 0 : 1);
        }
        close(sv[1]);
        n->fd = sv[0];
        n->next_id = 1;
        struct cove_err err;
        assert_int_equal(cove_decoder_init(&n->dec, COVE_FRAME_MAX, &err), 0);
}

/* Next frame from the guest within timeout_ms. Returns 1, 0 at EOF; fails on timeout. */
static int recv_frame(struct node *n, struct rx *r, int timeout_ms)
{
        struct cove_err err;
        for (;;) {
                struct cove_frame f;
                int k = cove_decoder_next(&n->dec, &f, &err);
                assert_true(k >= 0);
                if (k == 1) {
                        r->type = f.type;
                        r->flags = f.flags;
                        r->id = f.id;
                        r->len = f.len;
                        r->p = malloc(f.len + 1);
                        memcpy(r->p, f.payload, f.len);
                        r->p[f.len] = 0;
                        return 1;
                }
                struct pollfd pf = {.fd = n->fd, .events = POLLIN};
                int pr = poll(&pf, 1, timeout_ms);
                if (pr == 0)
                        fail_msg("no frame from the guest within %d ms", timeout_ms);
                size_t avail;
                uint8_t *sp = cove_decoder_space(&n->dec, &avail);
                ssize_t got = read(n->fd, sp, avail);
                if (got <= 0)
                        return 0;
                cove_decoder_commit(&n->dec, (size_t)got);
        }
}

static int guest_wait(struct node *n)
{
        int st;
        assert_int_equal(waitpid(n->guest, &st, 0), n->guest);
        assert_true(WIFEXITED(st)); /* never a crash */
        return WEXITSTATUS(st);
}

static void send_json(struct node *n, uint8_t type, uint32_t id, json_t *o)
{
        char *s = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        struct cove_err err;
        assert_int_equal(cove_frame_write(n->fd, type, 0, id, s, (uint32_t)strlen(s), &err), 0);
        free(s);
}

static void handshake(struct node *n)
{
        send_json(
            n, COVE_F_HELLO, 0,
            json_pack("{s:i, s:s, s:s}", "version", 1, "token", "00ff", "hostname", "sbx_test"));
        struct rx r;
        assert_int_equal(recv_frame(n, &r, 10000), 1);
        assert_int_equal(r.type, COVE_F_HELLO);
        json_t *h = json_loads((char *)r.p, 0, NULL);
        assert_non_null(h);
        assert_true(json_is_true(json_object_get(h, "ok")));
        assert_int_equal(json_integer_value(json_object_get(h, "version")), 1);
        json_decref(h);
        rx_free(&r);
}

static int setup(void **state)
{
        struct node *n = calloc(1, sizeof(*n));
        snprintf(n->dir, sizeof(n->dir), "/tmp/cove-guest-test-XXXXXX");
        if (!mkdtemp(n->dir))
                return -1;
        start_guest(n);
        handshake(n);
        *state = n;
        return 0;
}

static int teardown(void **state)
{
        struct node *n = *state;
        close(n->fd);
        int st;
        if (n->guest > 0)
                waitpid(n->guest, &st, 0);
        cove_decoder_free(&n->dec);
        cove_rm_rf(n->dir, NULL);
        free(n);
        return 0;
}

/* Send a request; returns its id. */
static uint32_t req(struct node *n, json_t *o)
{
        uint32_t id = n->next_id++;
        send_json(n, COVE_F_REQ, id, o);
        return id;
}

/* Wait for RESP id (other frames are not expected here). */
static json_t *resp(struct node *n, uint32_t id)
{
        struct rx r;
        assert_int_equal(recv_frame(n, &r, 10000), 1);
        assert_int_equal(r.type, COVE_F_RESP);
        assert_int_equal(r.id, id);
        json_t *o = json_loads((char *)r.p, 0, NULL);
        assert_non_null(o);
        rx_free(&r);
        return o;
}

static json_t *call(struct node *n, json_t *o)
{
        return resp(n, req(n, o));
}

static void assert_ok(json_t *o)
{
        if (!json_is_true(json_object_get(o, "ok")))
                fail_msg("expected ok, got %s", json_string_value(json_object_get(o, "message")));
}

static void assert_err(json_t *o, const char *code)
{
        assert_true(json_is_false(json_object_get(o, "ok")));
        assert_string_equal(json_string_value(json_object_get(o, "code")), code);
        assert_true(json_is_integer(json_object_get(o, "errno")));
        assert_true(json_is_string(json_object_get(o, "message")));
}

struct proc_out {
        char out[65536], err[65536];
        size_t nout, nerr;
        uint8_t out_flags;
        json_t *exit;
};

/* Start a process; returns its pid (asserts RESP ok). */
static int start(struct node *n, json_t *o)
{
        json_t *r = call(n, o);
        assert_ok(r);
        int pid = (int)json_integer_value(json_object_get(r, "pid"));
        assert_true(pid > 0);
        json_decref(r);
        return pid;
}

/* Collect OUT frames of pid until its EXIT. */
static void collect(struct node *n, int pid, struct proc_out *po, int timeout_ms)
{
        memset(po, 0, sizeof(*po));
        for (;;) {
                struct rx r;
                assert_int_equal(recv_frame(n, &r, timeout_ms), 1);
                assert_int_equal(r.id, (uint32_t)pid);
                if (r.type == COVE_F_EXIT) {
                        po->exit = json_loads((char *)r.p, 0, NULL);
                        assert_non_null(po->exit);
                        rx_free(&r);
                        return;
                }
                assert_int_equal(r.type, COVE_F_OUT);
                po->out_flags |= r.flags;
                if (r.flags & COVE_FF_STDERR) {
                        assert_true(po->nerr + r.len < sizeof(po->err));
                        memcpy(po->err + po->nerr, r.p, r.len);
                        po->nerr += r.len;
                } else {
                        assert_true(po->nout + r.len < sizeof(po->out));
                        memcpy(po->out + po->nout, r.p, r.len);
                        po->nout += r.len;
                }
                rx_free(&r);
        }
}

static json_int_t exit_code(struct proc_out *po)
{
        json_t *c = json_object_get(po->exit, "exit_code");
        assert_true(json_is_integer(c));
        return json_integer_value(c);
}

/* ---- handshake and channel ---- */

static void handshake_bad_version(void **state)
{
        (void)state;
        struct node n = {0};
        start_guest(&n);
        send_json(&n, COVE_F_HELLO, 0, json_pack("{s:i, s:s}", "version", 2, "token", "x"));
        struct rx r;
        assert_int_equal(recv_frame(&n, &r, 10000), 1);
        assert_int_equal(r.type, COVE_F_HELLO);
        json_t *h = json_loads((char *)r.p, 0, NULL);
        assert_true(json_is_false(json_object_get(h, "ok")));
        assert_non_null(strstr(json_string_value(json_object_get(h, "message")), "version 2"));
        json_decref(h);
        rx_free(&r);
        assert_int_equal(recv_frame(&n, &r, 10000), 0); /* then it hangs up */
        assert_int_equal(guest_wait(&n), 1);
        close(n.fd);
        cove_decoder_free(&n.dec);
}

static void request_before_handshake(void **state)
{
        (void)state;
        struct node n = {0};
        start_guest(&n);
        send_json(&n, COVE_F_REQ, 1, json_pack("{s:s}", "op", "usage"));
        struct rx r;
        assert_int_equal(recv_frame(&n, &r, 10000), 0);
        assert_int_equal(guest_wait(&n), 1);
        close(n.fd);
        cove_decoder_free(&n.dec);
}

static void garbage_drops_channel(void **state)
{
        struct node *n = *state;
        /* a running process must die with the channel */
        int pid = start(n, json_pack("{s:s, s:[s,s]}", "op", "exec", "cmd", "sleep", "60"));
        uint8_t junk[64];
        memset(junk, 0xee, sizeof(junk));
        assert_int_equal(write(n->fd, junk, sizeof(junk)), (ssize_t)sizeof(junk));
        struct rx r;
        assert_int_equal(recv_frame(n, &r, 10000), 0);
        assert_int_equal(guest_wait(n), 1);
        assert_int_equal(kill(pid, 0), -1); /* killed and reaped */
        assert_int_equal(errno, ESRCH);
        n->guest = -1;
}

/* A frame the protocol does not allow (a heartbeat with a 3-byte payload, a thaw with one)
 * ends the channel as any other violation: the guest exits with an error, its processes
 * killed. */
static void fence_frame_garbage_drops_channel(void **state)
{
        struct node *n = *state;
        struct cove_err err;
        assert_int_equal(cove_frame_write(n->fd, COVE_F_HEARTBEAT, 0, 0, "abc", 3, &err), 0);
        struct rx r;
        assert_int_equal(recv_frame(n, &r, 10000), 0);
        assert_int_equal(guest_wait(n), 1);
        n->guest = -1;
}

static void fence_thaw_garbage_drops_channel(void **state)
{
        struct node *n = *state;
        struct cove_err err;
        assert_int_equal(cove_frame_write(n->fd, COVE_F_THAW, 0, 7, NULL, 0, &err), 0);
        struct rx r;
        assert_int_equal(recv_frame(n, &r, 10000), 0);
        assert_int_equal(guest_wait(n), 1);
        n->guest = -1;
}

static char proc_state(int pid)
{
        char path[64], buf[4096];
        snprintf(path, sizeof(path), "/proc/%d/status", pid);
        FILE *f = fopen(path, "r");
        if (!f)
                return '?';
        char st = '?';
        while (fgets(buf, sizeof(buf), f))
                if (!strncmp(buf, "State:", 6))
                        sscanf(buf + 6, " %c", &st);
        fclose(f);
        return st;
}

static void await_state(int pid, char want, bool eq)
{
        for (int i = 0; i < 600; i++) { /* 30 s */
                char st = proc_state(pid);
                if ((st == want) == eq)
                        return;
                usleep(50000);
        }
        fail_msg("process %d: state %c %s %c", pid, proc_state(pid), eq ? "is not" : "is", want);
}

/* With a fence TTL and no heartbeat, the guest stops what it runs and refuses new execs; a
 * heartbeat alone does not undo that, a THAW does. */
static void fence_freezes_without_heartbeat_until_thaw(void **state)
{
        struct node *n = *state;
        int pid = start(n, json_pack("{s:s, s:[s,s]}", "op", "exec", "cmd", "sleep", "60"));
        json_t *r = call(n, json_pack("{s:s, s:i}", "op", "fence", "ttl_ms", -1));
        assert_err(r, "bad_request");
        json_decref(r);
        r = call(n, json_pack("{s:s, s:i}", "op", "fence", "ttl_ms", 300));
        assert_ok(r);
        assert_false(json_is_true(json_object_get(r, "fenced")));
        json_decref(r);
        await_state(pid, 'T', true);
        r = call(n, json_pack("{s:s, s:[s]}", "op", "exec", "cmd", "true"));
        assert_err(r, "conflict");
        json_decref(r);
        r = call(n, json_pack("{s:s, s:i, s:s}", "op", "signal", "pid", pid, "signal", "CONT"));
        assert_err(r, "conflict");
        json_decref(r);
        struct cove_err err;
        uint8_t seq[8] = {0, 0, 0, 0, 0, 0, 0, 1};
        assert_int_equal(cove_frame_write(n->fd, COVE_F_HEARTBEAT, 0, 0, seq, 8, &err), 0);
        r = call(n, json_pack("{s:s}", "op", "ping"));
        assert_ok(r);
        assert_true(json_is_true(json_object_get(r, "fenced")));
        json_decref(r);
        assert_int_equal(proc_state(pid), 'T');
        assert_int_equal(cove_frame_write(n->fd, COVE_F_THAW, 0, 0, NULL, 0, &err), 0);
        r = call(n, json_pack("{s:s}", "op", "ping"));
        assert_ok(r);
        assert_false(json_is_true(json_object_get(r, "fenced")));
        json_decref(r);
        await_state(pid, 'T', false);
        /* heartbeats keep it running now */
        for (int i = 0; i < 10; i++) {
                assert_int_equal(cove_frame_write(n->fd, COVE_F_HEARTBEAT, 0, 0, NULL, 0, &err), 0);
                usleep(100000);
        }
        assert_true(proc_state(pid) != 'T');
        r = call(n, json_pack("{s:s, s:i, s:s}", "op", "signal", "pid", pid, "signal", "KILL"));
        assert_ok(r);
        json_decref(r);
}

/* A node that is alive but does not read (it holds a busy channel on purpose) blocks the
 * guest's writes; the heartbeats it keeps sending wait unread. The guest must count those
 * arriving bytes as its node, not freeze. */
static void fence_blocked_writes_with_live_node_do_not_freeze(void **state)
{
        struct node *n = *state;
        /* a TTL a loaded machine's scheduling delays stay well under */
        json_t *r = call(n, json_pack("{s:s, s:i}", "op", "fence", "ttl_ms", 1000));
        assert_ok(r);
        json_decref(r);
        int pid = start(n, json_pack("{s:s, s:[s,s,s]}", "op", "exec", "cmd", "sh", "-c",
                                     "head -c 200000000 /dev/zero"));
        struct cove_err err;
        for (int i = 0; i < 80; i++) { /* 4 s: several TTLs, nothing read meanwhile */
                assert_int_equal(cove_frame_write(n->fd, COVE_F_HEARTBEAT, 0, 0, NULL, 0, &err), 0);
                usleep(50000);
        }
        /* drain until the process ends (a frozen guest would stop it: no EXIT comes) */
        for (;;) {
                struct rx x;
                assert_int_equal(recv_frame(n, &x, 20000), 1);
                int done = x.type == COVE_F_EXIT && x.id == (uint32_t)pid;
                rx_free(&x);
                if (done)
                        break;
        }
        r = call(n, json_pack("{s:s}", "op", "ping"));
        assert_ok(r);
        assert_false(json_is_true(json_object_get(r, "fenced")));
        json_decref(r);
}

static void eof_exits_cleanly(void **state)
{
        struct node *n = *state;
        int pid = start(n, json_pack("{s:s, s:[s,s]}", "op", "exec", "cmd", "sleep", "60"));
        shutdown(n->fd, SHUT_WR);
        assert_int_equal(guest_wait(n), 0);
        assert_int_equal(kill(pid, 0), -1);
        n->guest = -1;
}

static void bad_requests(void **state)
{
        struct node *n = *state;
        json_t *r = call(n, json_pack("{s:s}", "op", "frobnicate"));
        assert_err(r, "bad_request");
        assert_non_null(strstr(json_string_value(json_object_get(r, "message")), "frobnicate"));
        json_decref(r);
        r = call(n, json_pack("{s:i}", "op", 7));
        assert_err(r, "bad_request");
        json_decref(r);
        r = call(n, json_pack("{s:s, s:s}", "op", "exec", "cmd", "ls"));
        assert_err(r, "bad_request");
        json_decref(r);
        r = call(n, json_pack("{s:s, s:[s], s:s}", "op", "exec", "cmd", "ls", "shell", "ls"));
        assert_err(r, "bad_request");
        json_decref(r);
        r = call(n, json_pack("{s:s, s:s}", "op", "stat", "path", ""));
        assert_err(r, "bad_request");
        json_decref(r);
        char *longp = malloc(5000);
        memset(longp, 'a', 4999);
        longp[0] = '/';
        longp[4999] = 0;
        r = call(n, json_pack("{s:s, s:s}", "op", "stat", "path", longp));
        assert_err(r, "bad_request");
        json_decref(r);
        free(longp);
        r = call(
            n, json_pack("{s:s, s:s, s:s}", "op", "exec", "shell", "true", "user", "no-such-user"));
        assert_err(r, "not_found");
        json_decref(r);
        /* not JSON at all: still an answer, and the channel keeps working */
        struct cove_err err;
        assert_int_equal(cove_frame_write(n->fd, COVE_F_REQ, 0, 99, "{nope", 5, &err), 0);
        r = resp(n, 99);
        assert_err(r, "bad_request");
        json_decref(r);
        r = call(n, json_pack("{s:s}", "op", "usage"));
        assert_ok(r);
        assert_true(json_integer_value(json_object_get(r, "processes")) >= 1);
        assert_true(json_integer_value(json_object_get(r, "disk_total_bytes")) > 0);
        assert_true(json_integer_value(json_object_get(r, "mem_bytes")) > 0);
        json_decref(r);
}

/* ---- exec ---- */

static void exec_stdout_stderr_exit(void **state)
{
        struct node *n = *state;
        int pid = start(n, json_pack("{s:s, s:s, s:{s:s}, s:s}", "op", "exec", "shell",
                                     "echo out-$FOO; echo err >&2; pwd; exit 3", "env", "FOO",
                                     "bar", "cwd", n->dir));
        struct proc_out po;
        collect(n, pid, &po, 10000);
        char want[128];
        snprintf(want, sizeof(want), "out-bar\n%s\n", n->dir);
        assert_int_equal(po.nout, strlen(want));
        assert_memory_equal(po.out, want, po.nout);
        assert_int_equal(po.nerr, 4);
        assert_memory_equal(po.err, "err\n", 4);
        assert_int_equal(exit_code(&po), 3);
        assert_true(json_is_null(json_object_get(po.exit, "signal")));
        assert_true(json_is_false(json_object_get(po.exit, "timed_out")));
        json_decref(po.exit);
}

static void exec_argv_and_default_env(void **state)
{
        struct node *n = *state;
        int pid = start(n, json_pack("{s:s, s:[s,s,s]}", "op", "exec", "cmd", "sh", "-c",
                                     "echo \"$HOME|$USER|$PATH\""));
        struct proc_out po;
        collect(n, pid, &po, 10000);
        po.out[po.nout] = 0;
        assert_non_null(strstr(po.out, "/bin"));
        assert_true(po.out[0] == '/'); /* HOME is set */
        assert_int_equal(exit_code(&po), 0);
        json_decref(po.exit);
}

static void exec_as_user(void **state)
{
        struct node *n = *state;
        if (geteuid() != 0)
                skip(); /* switching users needs root */
        int pid = start(n, json_pack("{s:s, s:s, s:s}", "op", "exec", "shell", "id -u; id -g",
                                     "user", "12345"));
        struct proc_out po;
        collect(n, pid, &po, 10000);
        po.out[po.nout] = 0;
        assert_string_equal(po.out, "12345\n12345\n");
        json_decref(po.exit);
        pid = start(
            n, json_pack("{s:s, s:s, s:i}", "op", "exec", "shell", "id -u; echo $HOME", "user", 0));
        collect(n, pid, &po, 10000);
        po.out[po.nout] = 0;
        assert_string_equal(po.out, "0\n/root\n");
        json_decref(po.exit);
}

static void exec_killed_by_signal(void **state)
{
        struct node *n = *state;
        int pid = start(n, json_pack("{s:s, s:s}", "op", "exec", "shell", "kill -KILL $$"));
        struct proc_out po;
        collect(n, pid, &po, 10000);
        assert_true(json_is_null(json_object_get(po.exit, "exit_code")));
        assert_string_equal(json_string_value(json_object_get(po.exit, "signal")), "KILL");
        json_decref(po.exit);
}

static void exec_missing_binary(void **state)
{
        struct node *n = *state;
        json_t *r = call(n, json_pack("{s:s, s:[s]}", "op", "exec", "cmd", "nosuch"));
        assert_err(r, "not_found");
        assert_int_equal(json_integer_value(json_object_get(r, "errno")), ENOENT);
        assert_string_equal(json_string_value(json_object_get(r, "message")),
                            "exec: nosuch: No such file or directory");
        json_decref(r);
        /* not executable */
        char path[128];
        snprintf(path, sizeof(path), "%s/plain", n->dir);
        int fd = open(path, O_CREAT | O_WRONLY, 0644);
        assert_true(fd >= 0);
        close(fd);
        r = call(n, json_pack("{s:s, s:[s]}", "op", "exec", "cmd", path));
        assert_err(r, "bad_request");
        assert_int_equal(json_integer_value(json_object_get(r, "errno")), EACCES);
        json_decref(r);
        r = call(n, json_pack("{s:s, s:[s], s:s}", "op", "exec", "cmd", "true", "cwd",
                              "/nonexistent-dir"));
        assert_err(r, "not_found");
        json_decref(r);
}

static void exec_stdin_cat(void **state)
{
        struct node *n = *state;
        int pid = start(n, json_pack("{s:s, s:[s], s:b}", "op", "exec", "cmd", "cat", "stdin", 1));
        struct cove_err err;
        char big[40000];
        for (size_t i = 0; i < sizeof(big); i++)
                big[i] = (char)('a' + i % 26);
        assert_int_equal(
            cove_frame_write(n->fd, COVE_F_DATA, 0, (uint32_t)pid, big, sizeof(big), &err), 0);
        assert_int_equal(
            cove_frame_write(n->fd, COVE_F_DATA, COVE_FF_END, (uint32_t)pid, "tail", 4, &err), 0);
        struct proc_out po;
        collect(n, pid, &po, 10000);
        assert_int_equal(po.nout, sizeof(big) + 4);
        assert_memory_equal(po.out, big, sizeof(big));
        assert_memory_equal(po.out + sizeof(big), "tail", 4);
        assert_int_equal(exit_code(&po), 0);
        json_decref(po.exit);
        /* without stdin:true, stdin is /dev/null: cat ends at once */
        pid = start(n, json_pack("{s:s, s:[s]}", "op", "exec", "cmd", "cat"));
        collect(n, pid, &po, 10000);
        assert_int_equal(po.nout, 0);
        assert_int_equal(exit_code(&po), 0);
        json_decref(po.exit);
}

static void exec_signal_op(void **state)
{
        struct node *n = *state;
        int pid = start(n, json_pack("{s:s, s:[s,s]}", "op", "exec", "cmd", "sleep", "30"));
        json_t *r =
            call(n, json_pack("{s:s, s:i, s:s}", "op", "signal", "pid", pid, "signal", "TERM"));
        assert_ok(r);
        json_decref(r);
        struct proc_out po;
        collect(n, pid, &po, 10000);
        assert_string_equal(json_string_value(json_object_get(po.exit, "signal")), "TERM");
        json_decref(po.exit);
        r = call(n, json_pack("{s:s, s:i, s:s}", "op", "signal", "pid", pid, "signal", "TERM"));
        assert_err(r, "not_found");
        json_decref(r);
        r = call(n, json_pack("{s:s, s:i, s:s}", "op", "signal", "pid", 1, "signal", "NOPE"));
        assert_err(r, "bad_request");
        json_decref(r);
}

static void exec_timeout(void **state)
{
        struct node *n = *state;
        int64_t t0 = cove_mono_ns();
        int pid = start(n, json_pack("{s:s, s:[s,s], s:i}", "op", "exec", "cmd", "sleep", "30",
                                     "timeout_s", 1));
        struct proc_out po;
        collect(n, pid, &po, 10000);
        int64_t ms = (cove_mono_ns() - t0) / 1000000;
        assert_true(ms >= 900 && ms < 5000);
        assert_true(json_is_true(json_object_get(po.exit, "timed_out")));
        assert_string_equal(json_string_value(json_object_get(po.exit, "signal")), "KILL");
        json_decref(po.exit);
}

static void exec_background_grandchild(void **state)
{
        struct node *n = *state;
        /* the grandchild keeps stdout open; EXIT must come anyway, with the output before */
        int64_t t0 = cove_mono_ns();
        int pid = start(
            n, json_pack("{s:s, s:s}", "op", "exec", "shell", "sleep 20 & echo started; exit 5"));
        struct proc_out po;
        collect(n, pid, &po, 10000);
        assert_true((cove_mono_ns() - t0) / 1000000 < 5000);
        assert_int_equal(po.nout, 8);
        assert_memory_equal(po.out, "started\n", 8);
        assert_int_equal(exit_code(&po), 5);
        json_decref(po.exit);
}

static void exec_pty(void **state)
{
        struct node *n = *state;
        if (access("/dev/ptmx", R_OK | W_OK) != 0)
                skip(); /* no pty support in this environment */
        int pid = start(n, json_pack("{s:s, s:s, s:b, s:{s:i, s:i}}", "op", "exec", "shell",
                                     "tty; stty size; echo $TERM; read x; stty size", "stdin", 1,
                                     "pty", "cols", 100, "rows", 30));
        /* wait for the first answers before resizing */
        char got[4096];
        size_t ng = 0;
        while (!strstr(got, "xterm-256color")) {
                struct rx r;
                assert_int_equal(recv_frame(n, &r, 10000), 1);
                assert_int_equal(r.type, COVE_F_OUT);
                assert_int_equal(r.flags, COVE_FF_PTY);
                assert_true(ng + r.len < sizeof(got));
                memcpy(got + ng, r.p, r.len);
                ng += r.len;
                got[ng] = 0;
                rx_free(&r);
        }
        assert_non_null(strstr(got, "/dev/pts/"));
        assert_non_null(strstr(got, "30 100"));
        json_t *r = call(n, json_pack("{s:s, s:i, s:i, s:i}", "op", "resize", "pid", pid, "cols",
                                      120, "rows", 40));
        assert_ok(r);
        json_decref(r);
        struct cove_err err;
        assert_int_equal(cove_frame_write(n->fd, COVE_F_DATA, 0, (uint32_t)pid, "\n", 1, &err), 0);
        struct proc_out po;
        collect(n, pid, &po, 10000);
        po.out[po.nout] = 0;
        assert_non_null(strstr(po.out, "40 120"));
        assert_true(po.out_flags == COVE_FF_PTY);
        assert_int_equal(exit_code(&po), 0);
        json_decref(po.exit);
}

/* ---- files ---- */

static json_t *entry_of(json_t *r)
{
        json_t *e = json_object_get(r, "entry");
        assert_true(json_is_object(e));
        return e;
}

static void write_file(struct node *n, const char *path, const uint8_t *data, size_t len,
                       json_t **out)
{
        uint32_t id =
            req(n, json_pack("{s:s, s:s, s:i}", "op", "write", "path", path, "mode", 0600));
        struct cove_err err;
        size_t off = 0;
        do {
                size_t c = len - off > COVE_FRAME_CHUNK ? COVE_FRAME_CHUNK : len - off;
                uint8_t fl = off + c == len ? COVE_FF_END : 0;
                assert_int_equal(
                    cove_frame_write(n->fd, COVE_F_DATA, fl, id, data + off, (uint32_t)c, &err), 0);
                off += c;
        } while (off < len);
        *out = resp(n, id);
}

static uint8_t *read_file(struct node *n, const char *path, size_t *len, json_t **out)
{
        uint32_t id = req(n, json_pack("{s:s, s:s}", "op", "read", "path", path));
        *out = resp(n, id);
        if (!json_is_true(json_object_get(*out, "ok")))
                return NULL;
        size_t cap = (size_t)json_integer_value(json_object_get(*out, "size")) + 1;
        uint8_t *buf = malloc(cap);
        *len = 0;
        for (;;) {
                struct rx r;
                assert_int_equal(recv_frame(n, &r, 10000), 1);
                assert_int_equal(r.type, COVE_F_DATA);
                assert_int_equal(r.id, id);
                assert_true(r.len <= COVE_FRAME_CHUNK);
                assert_true(*len + r.len <= cap);
                memcpy(buf + *len, r.p, r.len);
                *len += r.len;
                bool end = r.flags & COVE_FF_END;
                rx_free(&r);
                if (end)
                        return buf;
        }
}

static void files_write_read_binary(void **state)
{
        struct node *n = *state;
        size_t len = 1536 * 1024 + 17;
        uint8_t *data = malloc(len);
        cove_random(data, len, NULL);
        char path[128];
        snprintf(path, sizeof(path), "%s/blob.bin", n->dir);
        json_t *r;
        write_file(n, path, data, len, &r);
        assert_ok(r);
        assert_int_equal(json_integer_value(json_object_get(entry_of(r), "size")), len);
        assert_int_equal(json_integer_value(json_object_get(entry_of(r), "mode")), 0600);
        assert_string_equal(json_string_value(json_object_get(entry_of(r), "type")), "file");
        json_decref(r);
        struct stat st;
        assert_int_equal(stat(path, &st), 0);
        assert_int_equal(st.st_size, (off_t)len);
        size_t got;
        uint8_t *back = read_file(n, path, &got, &r);
        assert_non_null(back);
        assert_int_equal(json_integer_value(json_object_get(r, "size")), len);
        assert_int_equal(got, len);
        assert_memory_equal(back, data, len);
        free(back);
        json_decref(r);
        /* overwrite with an empty file: atomic replace, and an empty read still ends */
        write_file(n, path, NULL, 0, &r);
        assert_ok(r);
        json_decref(r);
        back = read_file(n, path, &got, &r);
        assert_non_null(back);
        assert_int_equal(got, 0);
        free(back);
        json_decref(r);
        /* an aborted upload leaves the old content and no temp file */
        uint32_t wid = req(n, json_pack("{s:s, s:s}", "op", "write", "path", path));
        struct cove_err err;
        assert_int_equal(cove_frame_write(n->fd, COVE_F_DATA, 0, wid, "partial", 7, &err), 0);
        assert_int_equal(
            cove_frame_write(n->fd, COVE_F_DATA, COVE_FF_END | COVE_FF_ABORT, wid, NULL, 0, &err),
            0);
        r = resp(n, wid);
        assert_err(r, "conflict");
        json_decref(r);
        assert_int_equal(stat(path, &st), 0);
        assert_int_equal(st.st_size, 0);
        /* no temp files left behind */
        json_t *l = call(n, json_pack("{s:s, s:s}", "op", "list", "path", n->dir));
        assert_ok(l);
        assert_int_equal(json_array_size(json_object_get(l, "entries")), 1);
        json_decref(l);
        free(data);
        /* missing parent: not_found (no implicit mkdir), answered after END */
        snprintf(path, sizeof(path), "%s/nodir/x", n->dir);
        write_file(n, path, (const uint8_t *)"x", 1, &r);
        assert_err(r, "not_found");
        assert_non_null(strstr(json_string_value(json_object_get(r, "message")), path));
        json_decref(r);
        back = read_file(n, path, &got, &r);
        assert_null(back);
        assert_err(r, "not_found");
        json_decref(r);
        back = read_file(n, n->dir, &got, &r);
        assert_null(back);
        assert_err(r, "conflict");
        json_decref(r);
}

static void files_mkdir_list_stat_move_remove(void **state)
{
        struct node *n = *state;
        char p[256], q[256];
        snprintf(p, sizeof(p), "%s/a/b/c", n->dir);
        json_t *r = call(n, json_pack("{s:s, s:s}", "op", "mkdir", "path", p));
        assert_ok(r);
        assert_string_equal(json_string_value(json_object_get(entry_of(r), "type")), "dir");
        assert_string_equal(json_string_value(json_object_get(entry_of(r), "name")), "c");
        json_decref(r);
        r = call(n, json_pack("{s:s, s:s}", "op", "mkdir", "path", p)); /* idempotent */
        assert_ok(r);
        json_decref(r);
        snprintf(q, sizeof(q), "%s/a/f.txt", n->dir);
        write_file(n, q, (const uint8_t *)"hello", 5, &r);
        assert_ok(r);
        json_decref(r);
        snprintf(q, sizeof(q), "%s/a", n->dir);
        assert_int_equal(symlink("/etc", (strcat(q, "/link"), q)), 0);

        /* depth 1: b, f.txt, link; depth 2 adds b/c */
        snprintf(q, sizeof(q), "%s/a", n->dir);
        r = call(n, json_pack("{s:s, s:s, s:i}", "op", "list", "path", q, "depth", 1));
        assert_ok(r);
        json_t *es = json_object_get(r, "entries");
        assert_int_equal(json_array_size(es), 3);
        assert_string_equal(json_string_value(json_object_get(json_array_get(es, 0), "name")), "b");
        assert_string_equal(json_string_value(json_object_get(json_array_get(es, 2), "type")),
                            "symlink");
        json_decref(r);
        r = call(n, json_pack("{s:s, s:s, s:i}", "op", "list", "path", q, "depth", 3));
        assert_ok(r);
        assert_int_equal(json_array_size(json_object_get(r, "entries")), 4);
        json_decref(r);

        snprintf(q, sizeof(q), "%s/a/f.txt", n->dir);
        r = call(n, json_pack("{s:s, s:s}", "op", "stat", "path", q));
        assert_ok(r);
        assert_int_equal(json_integer_value(json_object_get(entry_of(r), "size")), 5);
        assert_string_equal(json_string_value(json_object_get(entry_of(r), "path")), q);
        const char *mt = json_string_value(json_object_get(entry_of(r), "mtime"));
        assert_true(mt && strlen(mt) >= 20 && mt[strlen(mt) - 1] == 'Z');
        json_decref(r);
        /* ".." never climbs above "/" and is resolved lexically */
        snprintf(q, sizeof(q), "%s/a/b/../f.txt", n->dir);
        r = call(n, json_pack("{s:s, s:s}", "op", "stat", "path", q));
        assert_ok(r);
        json_decref(r);

        snprintf(p, sizeof(p), "%s/a/f.txt", n->dir);
        snprintf(q, sizeof(q), "%s/a/b/g.txt", n->dir);
        r = call(n, json_pack("{s:s, s:s, s:s}", "op", "move", "from", p, "to", q));
        assert_ok(r);
        assert_string_equal(json_string_value(json_object_get(entry_of(r), "name")), "g.txt");
        json_decref(r);
        assert_int_equal(access(p, F_OK), -1);
        assert_int_equal(access(q, F_OK), 0);
        r = call(n, json_pack("{s:s, s:s, s:s}", "op", "move", "from", p, "to", q));
        assert_err(r, "not_found");
        json_decref(r);

        snprintf(p, sizeof(p), "%s/a", n->dir);
        r = call(n, json_pack("{s:s, s:s}", "op", "remove", "path", p));
        assert_err(r, "conflict");
        json_decref(r);
        r = call(n, json_pack("{s:s, s:s, s:b}", "op", "remove", "path", p, "recursive", 1));
        assert_ok(r);
        json_decref(r);
        assert_int_equal(access(p, F_OK), -1);
        assert_int_equal(access("/etc/passwd", F_OK), 0); /* the symlink's target survived */
        r = call(n, json_pack("{s:s, s:s}", "op", "stat", "path", p));
        assert_err(r, "not_found");
        json_decref(r);
        r = call(n, json_pack("{s:s, s:s}", "op", "remove", "path", p));
        assert_err(r, "not_found");
        json_decref(r);
        r = call(n, json_pack("{s:s, s:s, s:b}", "op", "remove", "path", "/", "recursive", 1));
        assert_err(r, "bad_request");
        json_decref(r);
}

static void files_magic_links_refused(void **state)
{
        struct node *n = *state;
        /* /proc/self/root is a magic link: RESOLVE_NO_MAGICLINKS refuses to cross it */
        json_t *r =
            call(n, json_pack("{s:s, s:s}", "op", "read", "path", "/proc/self/root/etc/hostname"));
        assert_false(json_is_true(json_object_get(r, "ok")));
        json_decref(r);
}

static void expect_event(struct node *n, uint32_t wid, const char *type, const char *path)
{
        for (int i = 0; i < 50; i++) {
                struct rx r;
                assert_int_equal(recv_frame(n, &r, 10000), 1);
                assert_int_equal(r.type, COVE_F_EVENT);
                assert_int_equal(r.id, wid);
                json_t *e = json_loads((char *)r.p, 0, NULL);
                rx_free(&r);
                bool match = strcmp(json_string_value(json_object_get(e, "type")), type) == 0 &&
                             strcmp(json_string_value(json_object_get(e, "path")), path) == 0;
                json_decref(e);
                if (match)
                        return;
        }
        fail_msg("no %s event for %s", type, path);
}

static void watch_events(void **state)
{
        struct node *n = *state;
        uint32_t wid =
            req(n, json_pack("{s:s, s:s, s:b}", "op", "watch", "path", n->dir, "recursive", 1));
        json_t *r = resp(n, wid);
        assert_ok(r);
        json_decref(r);
        char p[256], q[256];
        snprintf(p, sizeof(p), "%s/f", n->dir);
        int fd = open(p, O_CREAT | O_WRONLY, 0644);
        assert_true(fd >= 0);
        expect_event(n, wid, "create", p);
        assert_int_equal(write(fd, "x", 1), 1);
        close(fd);
        expect_event(n, wid, "write", p);
        snprintf(q, sizeof(q), "%s/sub", n->dir);
        assert_int_equal(mkdir(q, 0755), 0);
        expect_event(n, wid, "create", q);
        /* a subdirectory created after the watch started is watched too */
        snprintf(q, sizeof(q), "%s/sub/inner", n->dir);
        fd = open(q, O_CREAT | O_WRONLY, 0644);
        assert_true(fd >= 0);
        close(fd);
        expect_event(n, wid, "create", q);
        snprintf(q, sizeof(q), "%s/g", n->dir);
        assert_int_equal(rename(p, q), 0);
        expect_event(n, wid, "rename", p);
        expect_event(n, wid, "create", q);
        assert_int_equal(unlink(q), 0);
        expect_event(n, wid, "remove", q);

        r = call(n, json_pack("{s:s, s:i}", "op", "unwatch", "watch_id", wid));
        assert_ok(r);
        json_decref(r);
        fd = open(p, O_CREAT | O_WRONLY, 0644);
        close(fd);
        /* after unwatch no EVENT comes: the next frame is the answer to this request */
        r = call(n, json_pack("{s:s}", "op", "usage"));
        assert_ok(r);
        json_decref(r);
        r = call(n, json_pack("{s:s, s:i}", "op", "unwatch", "watch_id", wid));
        assert_err(r, "not_found");
        json_decref(r);
        r = call(n, json_pack("{s:s, s:s}", "op", "watch", "path", "/nonexistent-dir/x"));
        assert_err(r, "not_found");
        json_decref(r);
}

/* ---- vm guest channel over vsock ---- */

static void vm_chan_cmdline(void **state)
{
        (void)state;
        static const struct {
                const char *cmdline;
                int want;
                unsigned port;
        } cases[] = {
            {"", 0, 0},
            {"console=ttyS0 quiet", 0, 0},
            {"console=ttyS0 cove.chan=virtio", 0, 0},
            {"reboot=k cove.chan=vsock:1024 panic=1", 1, 1024},
            {"cove.chan=vsock:1024\n", 1, 1024},
            {"cove.chan=vsock:1024 cove.chan=vsock:77", 1, 77}, /* the last one wins */
            {"cove.chan=vsock:77 cove.chan=virtio", 0, 0},
            {"cove.chan=vsock:4294967294", 1, 4294967294u},
            {"xcove.chan=vsock:5", 0, 0}, /* not the parameter */
            {"cove.chan=vsock:", -1, 0},
            {"cove.chan=vsock:0", -1, 0},
            {"cove.chan=vsock:4294967295", -1, 0}, /* VMADDR_PORT_ANY */
            {"cove.chan=vsock:99999999999", -1, 0},
            {"cove.chan=vsock:12a", -1, 0},
            {"cove.chan=vsock:-1", -1, 0},
            {"cove.chan=tcp:1024", -1, 0},
            {"cove.chan=", -1, 0},
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                unsigned port = 12345;
                int r = cove_guest_vm_chan_port(cases[i].cmdline, &port);
                if (r != cases[i].want || port != cases[i].port)
                        fail_msg("\"%s\": got %d port %u, want %d port %u", cases[i].cmdline, r,
                                 port, cases[i].want, cases[i].port);
        }
}

/* The guest's vsock listen path, with a unix listener standing in for the AF_VSOCK one: this
 * host has no vsock transport (no vhost-vsock, no vsock_loopback), so the real socket cannot
 * be made here; accept() and the loop around it are the same. A channel that ends is
 * replaced by the next connection (as after a Firecracker snapshot load, which resets every
 * vsock connection): processes keep running and the new node sees them in HELLO. */
static void vm_listener_reaccepts(void **state)
{
        (void)state;
        int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        snprintf(a.sun_path + 1, sizeof(a.sun_path) - 1, "cove-test-vsock-%d", (int)getpid());
        socklen_t al =
            (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(a.sun_path + 1));
        assert_int_equal(bind(l, (struct sockaddr *)&a, al), 0);
        assert_int_equal(listen(l, 4), 0);
        struct node n = {0};
        n.guest = fork();
        assert_true(n.guest >= 0);
        if (n.guest == 0) {
                int fd = -1;
                if (cove_guest_vm_wait_node(&fd, l) < 0)
                        _exit(3);
                struct cove_guest_opts o = {.channel_fd = fd, .listen_fd = l};
                struct cove_err err = {0};
                _exit(cove_guest_run(&o, &err) == 0 ? 0 : 1);
        }
        close(l);
        struct cove_err err;
        int pid = 0;
        for (int round = 0; round < 2; round++) {
                n.fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
                assert_int_equal(connect(n.fd, (struct sockaddr *)&a, al), 0);
                assert_int_equal(cove_decoder_init(&n.dec, COVE_FRAME_MAX, &err), 0);
                n.next_id = 1;
                send_json(&n, COVE_F_HELLO, 0,
                          json_pack("{s:i, s:s}", "version", 1, "token", "00ff"));
                struct rx r;
                assert_int_equal(recv_frame(&n, &r, 10000), 1);
                assert_int_equal(r.type, COVE_F_HELLO);
                json_t *h = json_loads((char *)r.p, 0, NULL);
                rx_free(&r);
                assert_true(json_is_true(json_object_get(h, "ok")));
                json_t *procs = json_object_get(h, "procs");
                if (round == 0) {
                        assert_int_equal(json_array_size(procs), 0);
                        pid = start(
                            &n, json_pack("{s:s, s:[s,s]}", "op", "exec", "cmd", "sleep", "30"));
                } else {
                        /* the new node sees the process the previous one started */
                        assert_int_equal(json_array_size(procs), 1);
                        assert_int_equal(
                            json_integer_value(json_object_get(json_array_get(procs, 0), "pid")),
                            pid);
                        json_t *o = call(&n, json_pack("{s:s, s:i, s:s}", "op", "signal", "pid",
                                                       pid, "signal", "KILL"));
                        assert_ok(o);
                        json_decref(o);
                }
                json_decref(h);
                cove_decoder_free(&n.dec);
                close(n.fd); /* the guest goes back to accept() */
        }
        /* it waits for a third node now; the test ends it */
        kill(n.guest, SIGKILL);
        int st;
        assert_int_equal(waitpid(n.guest, &st, 0), n.guest);
        assert_true(WIFSIGNALED(st));
}

int main(void)
{
        signal(SIGPIPE, SIG_IGN);
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(handshake_bad_version),
            cmocka_unit_test(request_before_handshake),
            cmocka_unit_test(vm_chan_cmdline),
            cmocka_unit_test(vm_listener_reaccepts),
            cmocka_unit_test_setup_teardown(garbage_drops_channel, setup, teardown),
            cmocka_unit_test_setup_teardown(eof_exits_cleanly, setup, teardown),
            cmocka_unit_test_setup_teardown(fence_frame_garbage_drops_channel, setup, teardown),
            cmocka_unit_test_setup_teardown(fence_thaw_garbage_drops_channel, setup, teardown),
            cmocka_unit_test_setup_teardown(fence_freezes_without_heartbeat_until_thaw, setup,
                                            teardown),
            cmocka_unit_test_setup_teardown(fence_blocked_writes_with_live_node_do_not_freeze,
                                            setup, teardown),
            cmocka_unit_test_setup_teardown(bad_requests, setup, teardown),
            cmocka_unit_test_setup_teardown(exec_stdout_stderr_exit, setup, teardown),
            cmocka_unit_test_setup_teardown(exec_argv_and_default_env, setup, teardown),
            cmocka_unit_test_setup_teardown(exec_as_user, setup, teardown),
            cmocka_unit_test_setup_teardown(exec_killed_by_signal, setup, teardown),
            cmocka_unit_test_setup_teardown(exec_missing_binary, setup, teardown),
            cmocka_unit_test_setup_teardown(exec_stdin_cat, setup, teardown),
            cmocka_unit_test_setup_teardown(exec_signal_op, setup, teardown),
            cmocka_unit_test_setup_teardown(exec_timeout, setup, teardown),
            cmocka_unit_test_setup_teardown(exec_background_grandchild, setup, teardown),
            cmocka_unit_test_setup_teardown(exec_pty, setup, teardown),
            cmocka_unit_test_setup_teardown(files_write_read_binary, setup, teardown),
            cmocka_unit_test_setup_teardown(files_mkdir_list_stat_move_remove, setup, teardown),
            cmocka_unit_test_setup_teardown(files_magic_links_refused, setup, teardown),
            cmocka_unit_test_setup_teardown(watch_events, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
