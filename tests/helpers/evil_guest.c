/* Hostile stand-in for cove-guest (tests/security/test_hostile_guest.py): run by a coved
 * started with --guest-binary pointing here. It speaks the handshake of
 * docs/guest-protocol.md and behaves well (exec runs the command, output then EXIT; other
 * ops answer plausibly) until it is told to misbehave, deterministically:
 *
 *   exec ["evil", MODE]  with MODE one of
 *     flood     RESP ok (pid 4242), then 64 MiB of OUT frames for unknown pids, 64 MiB for
 *               pid 4242, RESP/EXIT/EVENT/DATA for unknown ids, EXIT 4242; then well again
 *     oversize  a frame header announcing 2 GiB, then nothing (reads until EOF)
 *     garbage   64 KiB of pseudo-random bytes, then reads until EOF
 *     hang      answers nothing and reads nothing ever again
 *     badjson   RESP that is not JSON, then well again
 *     deepjson  RESP of 1 MiB of '[' (parser depth), then well again
 *     badexit   RESP ok, EXIT {"exit_code":99999,"signal":"../x\"y","timed_out":"yes"}
 *     badpid    RESP {"ok":true,"pid":-5}
 *     hello     a second HELLO (protocol violation)
 *   read of a path containing
 *     evil-overdata   RESP ok size 4, then 64 KiB of DATA (more than announced)
 *     evil-dataearly  DATA before the RESP
 *
 * Single-threaded and synchronous: an exec runs to completion before the next frame is read.
 * Only for tests: JSON is scanned, not parsed. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHAN 3
#define FMAX (1u << 20)
enum { F_HELLO = 1, F_REQ, F_RESP, F_DATA, F_OUT, F_EXIT, F_EVENT };

static uint8_t *payload; /* FMAX + 1 */

static void put32(uint8_t *p, uint32_t v)
{
        p[0] = v >> 24;
        p[1] = v >> 16;
        p[2] = v >> 8;
        p[3] = v;
}

static void wr(const void *buf, size_t n)
{
        const uint8_t *p = buf;
        while (n) {
                ssize_t w = write(CHAN, p, n);
                if (w < 0 && errno == EINTR)
                        continue;
                if (w <= 0)
                        _exit(0); /* node closed the channel */
                p += w;
                n -= (size_t)w;
        }
}

static void frame(uint8_t type, uint8_t flags, uint32_t id, const void *data, uint32_t len)
{
        uint8_t h[12] = {0};
        put32(h, len);
        h[4] = type;
        h[5] = flags;
        put32(h + 8, id);
        wr(h, 12);
        if (len)
                wr(data, len);
}

static void frame_str(uint8_t type, uint32_t id, const char *s)
{
        frame(type, 0, id, s, (uint32_t)strlen(s));
}

static int rd(void *buf, size_t n)
{
        uint8_t *p = buf;
        while (n) {
                ssize_t r = read(CHAN, p, n);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r <= 0)
                        return -1;
                p += r;
                n -= (size_t)r;
        }
        return 0;
}

/* next frame into payload (NUL-terminated); -1 on EOF or a bad header */
static int next(uint8_t *type, uint8_t *flags, uint32_t *id, uint32_t *len)
{
        uint8_t h[12];
        if (rd(h, 12) < 0)
                return -1;
        *len = (uint32_t)h[0] << 24 | (uint32_t)h[1] << 16 | (uint32_t)h[2] << 8 | h[3];
        *type = h[4];
        *flags = h[5];
        *id = (uint32_t)h[8] << 24 | (uint32_t)h[9] << 16 | (uint32_t)h[10] << 8 | h[11];
        if (*len > FMAX || rd(payload, *len) < 0)
                return -1;
        payload[*len] = 0;
        return 0;
}

static void drain_forever(void)
{
        char buf[65536];
        while (read(CHAN, buf, sizeof(buf)) > 0) {
        }
        _exit(0);
}

/* Copy the JSON string starting at s (just after the opening quote) into out; returns the
 * position after the closing quote, or NULL. Handles \" \\ \n \t \/ only. */
static const char *jstr(const char *s, char *out, size_t cap)
{
        size_t n = 0;
        while (*s && *s != '"') {
                char c = *s++;
                if (c == '\\') {
                        c = *s++;
                        c = c == 'n' ? '\n' : c == 't' ? '\t' : c;
                        if (!c)
                                return NULL;
                }
                if (n + 1 < cap)
                        out[n++] = c;
        }
        out[n] = 0;
        return *s == '"' ? s + 1 : NULL;
}

static const char *skip_ws(const char *s)
{
        while (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r')
                s++;
        return s;
}

/* value of "key": "…" */
static int get_str(const char *json, const char *key, char *out, size_t cap)
{
        char pat[64];
        snprintf(pat, sizeof(pat), "\"%s\"", key);
        const char *p = strstr(json, pat);
        if (!p)
                return -1;
        p = skip_ws(p + strlen(pat));
        if (*p != ':')
                return -1;
        p = skip_ws(p + 1);
        if (*p != '"')
                return -1;
        return jstr(p + 1, out, cap) ? 0 : -1;
}

#define MAXARGS 64
static char argbuf[MAXARGS][4096];

/* "cmd": ["a", "b"] → argv; returns argc or -1 */
static int get_cmd(const char *json, char **argv)
{
        const char *p = strstr(json, "\"cmd\"");
        if (!p)
                return -1;
        p = skip_ws(p + 5);
        if (*p != ':')
                return -1;
        p = skip_ws(p + 1);
        if (*p != '[')
                return -1;
        p = skip_ws(p + 1);
        int n = 0;
        while (*p == '"' && n < MAXARGS - 1) {
                p = jstr(p + 1, argbuf[n], sizeof(argbuf[n]));
                if (!p)
                        return -1;
                argv[n] = argbuf[n];
                n++;
                p = skip_ws(p);
                if (*p == ',')
                        p = skip_ws(p + 1);
        }
        argv[n] = NULL;
        return n;
}

static void resp(uint32_t id, const char *json)
{
        frame_str(F_RESP, id, json);
}

static void run_exec(uint32_t id, char **argv)
{
        int pfd[2];
        if (pipe(pfd) < 0) {
                resp(id, "{\"ok\":false,\"code\":\"internal\",\"errno\":0,\"message\":\"pipe\"}");
                return;
        }
        pid_t pid = fork();
        if (pid == 0) {
                dup2(pfd[1], 1);
                dup2(pfd[1], 2);
                close(pfd[0]);
                close(pfd[1]);
                close(CHAN);
                execvp(argv[0], argv);
                _exit(127);
        }
        close(pfd[1]);
        char buf[256];
        snprintf(buf, sizeof(buf), "{\"ok\":true,\"pid\":%d}", (int)pid);
        resp(id, buf);
        char out[65536];
        ssize_t r;
        while ((r = read(pfd[0], out, sizeof(out))) > 0)
                frame(F_OUT, 0x02, (uint32_t)pid, out, (uint32_t)r);
        close(pfd[0]);
        int st = 0;
        waitpid(pid, &st, 0);
        if (WIFSIGNALED(st))
                snprintf(buf, sizeof(buf),
                         "{\"exit_code\":null,\"signal\":\"%d\",\"timed_out\":false}",
                         WTERMSIG(st));
        else
                snprintf(buf, sizeof(buf), "{\"exit_code\":%d,\"signal\":null,\"timed_out\":false}",
                         WEXITSTATUS(st));
        frame_str(F_EXIT, (uint32_t)pid, buf);
}

static void evil(uint32_t id, const char *mode)
{
        static uint8_t junk[65536];
        if (!strcmp(mode, "flood")) {
                resp(id, "{\"ok\":true,\"pid\":4242}");
                memset(junk, 'F', sizeof(junk));
                for (uint32_t i = 0; i < 1024; i++)
                        frame(F_OUT, 0x02, 10000 + i, junk, sizeof(junk));
                for (uint32_t i = 0; i < 1024; i++)
                        frame(F_OUT, 0x02, 4242, junk, sizeof(junk));
                for (uint32_t i = 0; i < 1000; i++) {
                        resp(0x500000 + i, "{\"ok\":true}");
                        frame_str(F_EXIT, 20000 + i, "{\"exit_code\":0}");
                        frame_str(F_EVENT, 0x600000 + i, "{\"type\":\"create\",\"path\":\"/x\"}");
                        frame(F_DATA, 0, 0x700000 + i, junk, 1024);
                }
                frame_str(F_EXIT, 4242, "{\"exit_code\":0,\"signal\":null,\"timed_out\":false}");
        } else if (!strcmp(mode, "oversize")) {
                uint8_t h[12] = {0};
                put32(h, 0x80000000u);
                h[4] = F_OUT;
                put32(h + 8, 1);
                wr(h, 12);
                drain_forever();
        } else if (!strcmp(mode, "garbage")) {
                uint32_t x = 0x12345678;
                for (size_t i = 0; i < sizeof(junk); i++) {
                        x = x * 1103515245u + 12345u;
                        junk[i] = (uint8_t)(x >> 16);
                }
                wr(junk, sizeof(junk));
                drain_forever();
        } else if (!strcmp(mode, "hang")) {
                for (;;)
                        pause();
        } else if (!strcmp(mode, "badjson")) {
                resp(id, "{\"ok\":tru, this is not JSON");
        } else if (!strcmp(mode, "deepjson")) {
                memset(payload, '[', FMAX);
                frame(F_RESP, 0, id, payload, FMAX);
        } else if (!strcmp(mode, "badexit")) {
                resp(id, "{\"ok\":true,\"pid\":4343}");
                frame_str(F_EXIT, 4343,
                          "{\"exit_code\":99999,\"signal\":\"../x\\\"y\",\"timed_out\":\"yes\"}");
        } else if (!strcmp(mode, "badpid")) {
                resp(id, "{\"ok\":true,\"pid\":-5}");
        } else if (!strcmp(mode, "hello")) {
                frame_str(F_HELLO, 0, "{\"version\":1,\"ok\":true}");
                drain_forever();
        } else {
                resp(id, "{\"ok\":false,\"code\":\"bad_request\",\"errno\":0,"
                         "\"message\":\"evil: unknown mode\"}");
        }
}

static void on_req(uint32_t id, const char *json)
{
        char op[32] = "", path[4096] = "";
        get_str(json, "op", op, sizeof(op));
        if (!strcmp(op, "exec")) {
                char *argv[MAXARGS];
                int argc = get_cmd(json, argv);
                if (argc == 2 && !strcmp(argv[0], "evil")) {
                        evil(id, argv[1]);
                        return;
                }
                if (argc < 1) {
                        static char sh[4096];
                        if (get_str(json, "shell", sh, sizeof(sh)) < 0) {
                                resp(id, "{\"ok\":false,\"code\":\"bad_request\",\"errno\":0,"
                                         "\"message\":\"exec: no cmd\"}");
                                return;
                        }
                        argv[0] = "/bin/sh";
                        argv[1] = "-c";
                        argv[2] = sh;
                        argv[3] = NULL;
                }
                run_exec(id, argv);
        } else if (!strcmp(op, "read")) {
                get_str(json, "path", path, sizeof(path));
                static uint8_t junk[65536];
                memset(junk, 'D', sizeof(junk));
                if (strstr(path, "evil-overdata")) {
                        resp(id, "{\"ok\":true,\"size\":4,\"mode\":420}");
                        frame(F_DATA, 0, id, junk, sizeof(junk));
                } else if (strstr(path, "evil-dataearly")) {
                        frame(F_DATA, 0, id, junk, 16);
                        resp(id, "{\"ok\":true,\"size\":16,\"mode\":420}");
                        frame(F_DATA, 0x01, id, NULL, 0);
                } else {
                        resp(id, "{\"ok\":false,\"code\":\"not_found\",\"errno\":2,"
                                 "\"message\":\"read: no such file (evil guest)\"}");
                }
        } else if (!strcmp(op, "usage")) {
                resp(id, "{\"ok\":true,\"cpu_usec\":0,\"mem_bytes\":0,\"disk_used_bytes\":0,"
                         "\"disk_total_bytes\":0,\"processes\":1}");
        } else if (!strcmp(op, "write")) {
                /* answered at END (see main loop) */
        } else {
                resp(id, "{\"ok\":false,\"code\":\"bad_request\",\"errno\":0,"
                         "\"message\":\"op not supported by the evil guest\"}");
        }
}

int main(void)
{
        signal(SIGPIPE, SIG_IGN);
        payload = malloc(FMAX + 1);
        if (!payload)
                return 1;
        uint8_t type, flags;
        uint32_t id, len;
        if (next(&type, &flags, &id, &len) < 0 || type != F_HELLO)
                return 1;
        frame_str(F_HELLO, 0, "{\"version\":1,\"ok\":true}");
        while (next(&type, &flags, &id, &len) == 0) {
                if (type == F_REQ)
                        on_req(id, (const char *)payload);
                else if (type == F_DATA && id >= 0x400000 && (flags & 0x01))
                        resp(id, "{\"ok\":false,\"code\":\"bad_request\",\"errno\":0,"
                                 "\"message\":\"write not supported by the evil guest\"}");
        }
        return 0;
}
