/* Unit tests for the vm drivers' host-side protocol code: the QMP client (runtime/qmp.c)
 * against a scripted QEMU monitor on a socketpair, and the Firecracker driver
 * (runtime/vm_firecracker.c): its requests, its HTTP client and boot/snapshot sequences
 * against a fake API server, the hybrid vsock handshake, and availability.
 *
 * Test doubles at a boundary this machine cannot reach: there is no firecracker binary and
 * no usable KVM here (no vmx/svm), so nothing below talks to a real Firecracker.
 * - The API exchange (tests/unit/data/firecracker-api.txt and the table below) was not
 *   captured from a live VMM but transcribed from Firecracker's API specification
 *   (firecracker.yaml, v1.x) and its getting-started/snapshot documentation: request lines,
 *   headers and bodies as the VMM's HTTP server accepts them, and its 204 / 400
 *   {"fault_message"} answers. A fake server (a thread on a unix socket) replays the answers
 *   and the driver's requests are compared with it byte for byte.
 * - The vsock peer is a thread speaking Firecracker's hybrid vsock handshake
 *   ("CONNECT <port>\n" / "OK <host port>\n", docs/vsock.md).
 * - fc_driver_against_fake_vmm runs the whole driver (template boot, clone start, pause,
 *   full snapshot, restore, stop) with this test binary re-executed as a fake `firecracker`
 *   (fake_vmm_main): real processes, uids, cgroups, files and sockets, no VM. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "runtime/qmp.h"
#include "runtime/vm_firecracker.h"
#include "util/util.h"

static const struct {
        const char *method, *path, *want;
} fc_recorded[] = {
    {"PUT", "/boot-source",
     "PUT /boot-source HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n"
     "Content-Type: application/json\r\nContent-Length: 113\r\n\r\n"
     "{\"kernel_image_path\":\"/k/vmlinux\",\"initrd_path\":\"/k/initrd\",\"boot_args\":"
     "\"console=ttyS0 reboot=k panic=1 pci=off\"}"},
    {"PUT", "/drives/rootfs",
     "PUT /drives/rootfs HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n"
     "Content-Type: application/json\r\nContent-Length: 94\r\n\r\n"
     "{\"drive_id\":\"rootfs\",\"path_on_host\":\"/s/disk.ext4\",\"is_root_device\":true,"
     "\"is_read_only\":false}"},
    {"PUT", "/machine-config",
     "PUT /machine-config HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n"
     "Content-Type: application/json\r\nContent-Length: 47\r\n\r\n"
     "{\"vcpu_count\":2,\"mem_size_mib\":512,\"smt\":false}"},
    {"PUT", "/vsock",
     "PUT /vsock HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n"
     "Content-Type: application/json\r\nContent-Length: 38\r\n\r\n"
     "{\"guest_cid\":3,\"uds_path\":\"/s/v.sock\"}"},
    {"PUT", "/actions",
     "PUT /actions HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n"
     "Content-Type: application/json\r\nContent-Length: 31\r\n\r\n"
     "{\"action_type\":\"InstanceStart\"}"},
    {"PATCH", "/vm",
     "PATCH /vm HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n"
     "Content-Type: application/json\r\nContent-Length: 18\r\n\r\n{\"state\":\"Paused\"}"},
    {"PUT", "/snapshot/create",
     "PUT /snapshot/create HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n"
     "Content-Type: application/json\r\nContent-Length: 82\r\n\r\n"
     "{\"snapshot_type\":\"Full\",\"snapshot_path\":\"/s/vm.state\",\"mem_file_path\":"
     "\"/s/vm.mem\"}"},
    {"PUT", "/snapshot/load",
     "PUT /snapshot/load HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n"
     "Content-Type: application/json\r\nContent-Length: 143\r\n\r\n"
     "{\"snapshot_path\":\"/t/vm.state\",\"mem_backend\":{\"backend_type\":\"File\","
     "\"backend_path\":\"/t/vm.mem\"},\"enable_diff_snapshots\":false,\"resume_vm\":true}"},
};

static void fc_requests_match_recording(void **state)
{
        (void)state;
        json_t *bodies[] = {
            cove_fc_boot_source("/k/vmlinux", "/k/initrd",
                                "console=ttyS0 reboot=k panic=1 pci=off"),
            cove_fc_drive("rootfs", "/s/disk.ext4", 1, 0),
            cove_fc_machine(2, 512),
            cove_fc_vsock(3, "/s/v.sock"),
            cove_fc_action("InstanceStart"),
            cove_fc_vm_state(1),
            cove_fc_snapshot_create("/s/vm.state", "/s/vm.mem"),
            cove_fc_snapshot_load("/t/vm.state", "/t/vm.mem"),
        };
        for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
                char *req = cove_fc_request(fc_recorded[i].method, fc_recorded[i].path, bodies[i]);
                assert_non_null(req);
                assert_string_equal(req, fc_recorded[i].want);
                free(req);
                json_decref(bodies[i]);
        }
        /* no header injection through the path or the method */
        assert_null(cove_fc_request("PUT", "/x\r\nEvil: 1", NULL));
        assert_null(cove_fc_request("PUT", "relative", NULL));
        assert_null(cove_fc_request("P T", "/x", NULL));
}

static void fc_responses(void **state)
{
        (void)state;
        int st = 0;
        char fault[64];
        const char ok[] = "HTTP/1.1 204 No Content\r\nServer: Firecracker API\r\n"
                          "Connection: keep-alive\r\n\r\n";
        assert_int_equal(cove_fc_response(ok, strlen(ok), &st, fault, sizeof(fault)), 0);
        assert_int_equal(st, 204);
        assert_string_equal(fault, "");
        const char bad[] = "HTTP/1.1 400 Bad Request\r\nServer: Firecracker API\r\n"
                           "Content-Type: application/json\r\nContent-Length: 73\r\n\r\n"
                           "{\"fault_message\":\"The requested operation is not supported\\n"
                           "after start\"}";
        assert_int_equal(cove_fc_response(bad, strlen(bad), &st, fault, sizeof(fault)), 0);
        assert_int_equal(st, 400);
        assert_string_equal(fault, "The requested operation is not supported after start");
        /* incomplete: headers not finished, or body shorter than Content-Length */
        assert_int_equal(cove_fc_response(bad, 30, &st, fault, sizeof(fault)), -1);
        assert_int_equal(cove_fc_response(bad, strlen(bad) - 5, &st, fault, sizeof(fault)), -1);
        assert_int_equal(cove_fc_response("garbage\r\n\r\n", 11, &st, fault, sizeof(fault)), -1);
}

static void fc_unavailable_says_why(void **state)
{
        (void)state;
        char why[512];
        setenv("COVE_FIRECRACKER", "/nonexistent/firecracker", 1);
        assert_int_equal(cove_fc_unavailable(why, sizeof(why)), 1);
        assert_non_null(strstr(why, "no firecracker binary"));
        struct cove_err err;
        assert_null(cove_runtime_firecracker.open("/tmp", &err));
        assert_int_equal(err.kind, COVE_E_UNAVAILABLE);
        assert_non_null(strstr(err.msg, "no firecracker binary"));
        /* a firecracker executable is found: KVM is then the missing piece (this host has
         * no usable KVM; COVE_VM_ACCEL=tcg makes the probe say so on any host) */
        char dir[] = "/tmp/cove-fc-bin-XXXXXX", bin[64];
        assert_non_null(mkdtemp(dir));
        snprintf(bin, sizeof(bin), "%s/firecracker", dir);
        FILE *f = fopen(bin, "w");
        assert_non_null(f);
        fputs("#!/bin/sh\nexit 1\n", f);
        fclose(f);
        assert_int_equal(chmod(bin, 0755), 0);
        setenv("COVE_FIRECRACKER", bin, 1);
        setenv("COVE_VM_ACCEL", "tcg", 1);
        assert_int_equal(cove_fc_unavailable(why, sizeof(why)), 1);
        assert_non_null(strstr(why, "needs working KVM"));
        assert_non_null(strstr(why, bin));
        assert_null(cove_runtime_firecracker.open("/tmp", &err));
        assert_int_equal(err.kind, COVE_E_UNAVAILABLE);
        assert_non_null(strstr(err.msg, "needs working KVM"));
        /* also found through PATH */
        unsetenv("COVE_FIRECRACKER");
        char *old = getenv("PATH") ? strdup(getenv("PATH")) : NULL;
        setenv("PATH", dir, 1);
        assert_int_equal(cove_fc_unavailable(why, sizeof(why)), 1);
        assert_non_null(strstr(why, "needs working KVM"));
        if (old)
                setenv("PATH", old, 1);
        free(old);
        unsetenv("COVE_VM_ACCEL");
        unlink(bin);
        rmdir(dir);
}

static void put(const char *path, const char *data);

/* ---- a fake peer on a unix socket: the Firecracker API server or the vsock end ---- */

#define FAKE_MAX 16
#define FAKE_HANG ((const char *)1) /* answer nothing, wait for the client to go */

struct fake {
        int lfd;
        char path[108];
        int line_mode;                /* read a "CONNECT ...\n" line, not an HTTP request */
        const char *answer[FAKE_MAX]; /* NULL: close without answering */
        size_t answer_len[FAKE_MAX];  /* 0: strlen */
        size_t n;
        char *got[FAKE_MAX]; /* what each connection sent (NUL-terminated) */
        size_t got_len[FAKE_MAX];
        size_t ngot;
        pthread_t t;
};

/* One whole request: headers and Content-Length bytes of body (or one line). */
static size_t fake_read(struct fake *f, int c, char *buf, size_t cap)
{
        size_t len = 0;
        for (;;) {
                ssize_t k = read(c, buf + len, f->line_mode ? 1 : cap - 1 - len);
                if (k <= 0)
                        break;
                len += (size_t)k;
                buf[len] = 0;
                if (f->line_mode) {
                        if (buf[len - 1] == '\n' || len == cap - 1)
                                break;
                        continue;
                }
                char *end = strstr(buf, "\r\n\r\n");
                if (!end)
                        continue;
                char *cl = strstr(buf, "Content-Length: ");
                size_t want = cl && cl < end ? strtoul(cl + 16, NULL, 10) : 0;
                if (len >= (size_t)(end + 4 - buf) + want || len == cap - 1)
                        break;
        }
        return len;
}

static void *fake_main(void *arg)
{
        struct fake *f = arg;
        for (size_t i = 0; i < f->n; i++) {
                int c = accept(f->lfd, NULL, NULL);
                if (c < 0)
                        break;
                char *buf = calloc(1, 65536);
                size_t len = fake_read(f, c, buf, 65536);
                f->got[f->ngot] = buf;
                f->got_len[f->ngot++] = len;
                const char *a = f->answer[i];
                if (a == FAKE_HANG) {
                        char b[256];
                        while (read(c, b, sizeof(b)) > 0)
                                ;
                } else if (a) {
                        size_t al = f->answer_len[i] ? f->answer_len[i] : strlen(a);
                        ssize_t w = write(c, a, al);
                        (void)w;
                        if (f->line_mode) { /* the peer keeps the stream open after OK */
                                char b[256];
                                while (read(c, b, sizeof(b)) > 0)
                                        ;
                        }
                }
                close(c);
        }
        return NULL;
}

static void fake_start(struct fake *f)
{
        snprintf(f->path, sizeof(f->path), "/tmp/cove-fc-fake-%d-%p.sock", (int)getpid(),
                 (void *)f);
        unlink(f->path);
        f->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        snprintf(a.sun_path, sizeof(a.sun_path), "%s", f->path);
        assert_int_equal(bind(f->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
        assert_int_equal(listen(f->lfd, 8), 0);
        assert_int_equal(pthread_create(&f->t, NULL, fake_main, f), 0);
}

/* Join the thread (it has served its n connections); the caller checks f->got. */
static void fake_end(struct fake *f)
{
        pthread_join(f->t, NULL);
        close(f->lfd);
        unlink(f->path);
}

static void fake_free(struct fake *f)
{
        for (size_t i = 0; i < f->ngot; i++)
                free(f->got[i]);
        f->ngot = 0;
}

/* ---- the recorded API exchange (tests/unit/data/firecracker-api.txt) ---- */

struct exchange {
        char *req, *resp;
};

/* A message of the transcript: header lines joined with CRLF, an empty line, the body. */
static char *transcript_msg(char **lines, size_t n)
{
        size_t cap = 16;
        for (size_t i = 0; i < n; i++)
                cap += strlen(lines[i]) + 2;
        char *m = calloc(1, cap);
        size_t i = 0;
        for (; i < n && lines[i][0]; i++) {
                strcat(m, lines[i]);
                strcat(m, "\r\n");
        }
        strcat(m, "\r\n");
        for (size_t j = i + 1; j < n; j++) {
                if (j > i + 1)
                        strcat(m, "\n");
                strcat(m, lines[j]);
        }
        return m;
}

static size_t load_transcript(const char *name, struct exchange *ex, size_t cap)
{
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", COVE_UNIT_DATA, name);
        FILE *f = fopen(path, "r");
        if (!f)
                fail_msg("cannot open %s", path);
        static char *lines[4096];
        size_t nl = 0;
        char line[4096];
        while (fgets(line, sizeof(line), f) && nl < 4096) {
                line[strcspn(line, "\n")] = 0;
                lines[nl++] = strdup(line);
        }
        fclose(f);
        while (nl && !lines[nl - 1][0]) /* the file's final newline */
                free(lines[--nl]);
        size_t n = 0;
        for (size_t i = 0; i < nl;) {
                int req = !strcmp(lines[i], ">>>"), resp = !strcmp(lines[i], "<<<");
                if (!req && !resp) {
                        assert_true(lines[i][0] == '#'); /* comments only outside messages */
                        i++;
                        continue;
                }
                size_t j = i + 1;
                while (j < nl && strcmp(lines[j], ">>>") && strcmp(lines[j], "<<<"))
                        j++;
                /* a response's trailing empty line is its header end, not a body */
                char *m = transcript_msg(lines + i + 1, j - i - 1);
                if (req) {
                        assert_true(n < cap);
                        ex[n].req = m;
                        ex[n].resp = NULL;
                } else {
                        assert_true(n < cap && ex[n].req && !ex[n].resp);
                        ex[n++].resp = m;
                }
                i = j;
        }
        for (size_t i = 0; i < nl; i++)
                free(lines[i]);
        return n;
}

static void fc_api_sequence_matches_recording(void **state)
{
        (void)state;
        struct exchange ex[FAKE_MAX];
        size_t n = load_transcript("firecracker-api.txt", ex, FAKE_MAX);
        assert_int_equal(n, 9);
        struct fake f = {.n = n};
        for (size_t i = 0; i < n; i++)
                f.answer[i] = ex[i].resp;
        fake_start(&f);
        struct cove_err err;
        /* a template boot as the driver does it (tpl_build), its snapshot, a clone's load */
        struct cove_fc_boot b = {.kernel = "/proc/self/fd/3",
                                 .initrd = "/proc/self/fd/4",
                                 .boot_args = "console=ttyS0 reboot=k panic=1 pci=off quiet "
                                              "loglevel=1 random.trust_cpu=off "
                                              "cove.chan=vsock:1024",
                                 .disk = "disk.img",
                                 .vsock_uds = "v.sock",
                                 .vcpus = 1,
                                 .mem_mib = 256,
                                 .cid = 3};
        assert_int_equal(cove_fc_boot(f.path, &b, 5000, &err), 0);
        json_t *j = cove_fc_vm_state(1);
        assert_int_equal(cove_fc_call(f.path, "PATCH", "/vm", j, 5000, &err), 0);
        json_decref(j);
        j = cove_fc_snapshot_create("state", "mem");
        assert_int_equal(cove_fc_call(f.path, "PUT", "/snapshot/create", j, 5000, &err), 0);
        json_decref(j);
        j = cove_fc_vm_state(0);
        assert_int_equal(cove_fc_call(f.path, "PATCH", "/vm", j, 5000, &err), 0);
        json_decref(j);
        assert_int_equal(cove_fc_load(f.path, "/proc/self/fd/3", "/proc/self/fd/4", 5000, &err), 0);
        fake_end(&f);
        assert_int_equal(f.ngot, n);
        for (size_t i = 0; i < n; i++) {
                assert_string_equal(f.got[i], ex[i].req);
                free(ex[i].req);
                free(ex[i].resp);
        }
        fake_free(&f);
}

static void fc_fault_is_a_clear_error(void **state)
{
        (void)state;
        const char ok[] = "HTTP/1.1 204 No Content\r\nServer: Firecracker API\r\n\r\n";
        const char body[] = "{\"fault_message\":\"Invalid memory size:\\n\\u001b[31m0 MiB\"}";
        char bad[256];
        snprintf(bad, sizeof(bad),
                 "HTTP/1.1 400 Bad Request\r\nServer: Firecracker API\r\nContent-Type: "
                 "application/json\r\nContent-Length: %zu\r\n\r\n%s",
                 strlen(body), body);
        struct fake f = {.n = 3, .answer = {ok, ok, bad}};
        fake_start(&f);
        struct cove_fc_boot b = {.kernel = "k", .disk = "d", .vsock_uds = "v", .vcpus = 1};
        struct cove_err err;
        assert_int_equal(cove_fc_boot(f.path, &b, 2000, &err), -1);
        fake_end(&f);
        /* the sequence stops at the failing call; the fault is named, control characters
         * replaced */
        assert_int_equal(f.ngot, 3);
        assert_non_null(strstr(f.got[2], "PUT /machine-config "));
        assert_non_null(strstr(
            err.msg, "firecracker: PUT /machine-config: 400: Invalid memory size:  [31m0 MiB"));
        for (const char *p = err.msg; *p; p++)
                assert_true((unsigned char)*p >= 0x20);
        fake_free(&f);
}

static void fc_bad_answers(void **state)
{
        (void)state;
        static char big[COVE_FC_RESP_MAX + 100];
        memset(big, 'x', sizeof(big) - 1);
        memcpy(big, "HTTP/1.1 200 OK\r\nX: ", 20);
        static const struct {
                const char *answer, *want;
                int errnum;
        } cases[] = {
            {"SSH-2.0-OpenSSH\r\n\r\n", "closed before a whole answer", 0},
            {big, "answer over", EMSGSIZE},
            {NULL, "closed before a whole answer", 0},
            {FAKE_HANG, "no answer", ETIMEDOUT},
            {"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n{}",
             "closed before a whole answer", 0},
            {"HTTP/1.1 500 Internal Server Error\r\n\r\n", ": 500: (no fault_message)", 0},
            {"HTTP/1.1 400 Bad Request\r\nContent-Length: 7\r\n\r\nnotjson",
             ": 400: (no fault_message)", 0},
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                struct fake f = {.n = 1, .answer = {cases[i].answer}};
                fake_start(&f);
                struct cove_err err;
                int64_t t0 = cove_mono_ns();
                assert_int_equal(cove_fc_call(f.path, "GET", "/", NULL, 300, &err), -1);
                assert_true(cove_mono_ns() - t0 < 3000000000LL);
                fake_end(&f);
                if (!strstr(err.msg, cases[i].want) ||
                    (cases[i].errnum && err.errnum != cases[i].errnum))
                        fail_msg("case %zu: got \"%s\" (errno %d), want \"%s\"", i, err.msg,
                                 err.errnum, cases[i].want);
                fake_free(&f);
        }
        /* nobody listening: unavailable, not a hang */
        struct cove_err err;
        assert_int_equal(cove_fc_call("/nonexistent/api.sock", "GET", "/", NULL, 300, &err), -1);
        assert_int_equal(err.kind, COVE_E_UNAVAILABLE);
        /* a VMM cannot point coved at another socket (coved's own API, say): no symlinks,
         * sockets only */
        struct fake f = {.n = 0};
        fake_start(&f);
        char link[128];
        snprintf(link, sizeof(link), "%s.link", f.path);
        assert_int_equal(symlink(f.path, link), 0);
        assert_int_equal(cove_fc_call(link, "GET", "/", NULL, 300, &err), -1);
        assert_int_equal(cove_fc_vsock_connect(link, 1024, 300, &err), -1);
        unlink(link);
        fake_end(&f);
        put(link, "a file");
        assert_int_equal(cove_fc_call(link, "GET", "/", NULL, 300, &err), -1);
        assert_non_null(strstr(err.msg, "not a socket"));
        unlink(link);
}

static void fc_vsock_handshake(void **state)
{
        (void)state;
        /* good: the fd is returned right after the OK line; what follows is the guest's */
        struct fake f = {.n = 1, .line_mode = 1, .answer = {"OK 1073741824\nhello"}};
        fake_start(&f);
        struct cove_err err;
        int fd = cove_fc_vsock_connect(f.path, 1024, 2000, &err);
        assert_true(fd >= 0);
        char b[16];
        ssize_t k = read(fd, b, sizeof(b));
        assert_int_equal(k, 5);
        assert_memory_equal(b, "hello", 5);
        assert_false(fcntl(fd, F_GETFL) & O_NONBLOCK);
        close(fd);
        fake_end(&f);
        assert_string_equal(f.got[0], "CONNECT 1024\n");
        fake_free(&f);
        static char oversize[200];
        memset(oversize, 'x', sizeof(oversize) - 1);
        static const struct {
                const char *answer, *want;
                int kind, errnum;
        } cases[] = {
            {"NO\n", "bad answer to CONNECT 1024: \"NO?\"", COVE_E_INTERNAL, EPROTO},
            {"OK \n", "bad answer", COVE_E_INTERNAL, EPROTO},
            {"OK 12x\n", "bad answer", COVE_E_INTERNAL, EPROTO},
            {"OK 99999999999\n", "bad answer", COVE_E_INTERNAL, EPROTO},
            {"ok 5\n", "bad answer", COVE_E_INTERNAL, EPROTO},
            {"OK 5 \n", "bad answer", COVE_E_INTERNAL, EPROTO},
            {"OK\t5\n", "bad answer", COVE_E_INTERNAL, EPROTO},
            {oversize, "longer than 32 bytes", COVE_E_INTERNAL, EMSGSIZE},
            {NULL, "connection closed before OK", COVE_E_UNAVAILABLE, ECONNRESET},
            {FAKE_HANG, "no answer to CONNECT", COVE_E_UNAVAILABLE, ETIMEDOUT},
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                struct fake g = {.n = 1, .line_mode = 1, .answer = {cases[i].answer}};
                fake_start(&g);
                fd = cove_fc_vsock_connect(g.path, 1024, 300, &err);
                if (fd >= 0)
                        close(fd);
                fake_end(&g);
                if (fd >= 0 || !strstr(err.msg, cases[i].want) || (int)err.kind != cases[i].kind ||
                    err.errnum != cases[i].errnum)
                        fail_msg("case %zu: fd %d, \"%s\" (kind %d, errno %d)", i, fd, err.msg,
                                 (int)err.kind, err.errnum);
                fake_free(&g);
        }
}

/* ---- the whole driver against a fake firecracker ---- */

/* This binary as `firecracker --api-sock api.sock` (spawned by the driver, as the sandbox's
 * uid, in its directory): serves the API on the socket, logs each request to fake-vmm.log,
 * prints the guest's ready line on "InstanceStart", writes snapshot files on
 * /snapshot/create (recording the vsock and drive paths in them, as the real state file
 * does) and on /snapshot/load checks it can open what it was given, then listens on the
 * recorded vsock path: CONNECT <port> gets "OK <n>" and an echo of what follows, standing
 * in for the guest (or, with FAKE_VMM_GUEST, a real cove-guest on the connection:
 * tests/integration/test_vm.py runs coved's vm runtime on it). FAKE_VMM_FAIL_LOAD=1: the
 * load answers 400 with a fault_message. */
static void fake_vmm_vsock(const char *uds)
{
        int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        snprintf(a.sun_path, sizeof(a.sun_path), "%s", uds);
        unlink(uds);
        if (bind(l, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(l, 4) < 0)
                _exit(5);
        if (fork() != 0) {
                close(l);
                return;
        }
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        for (;;) {
                int c = accept(l, NULL, NULL);
                if (c < 0)
                        _exit(6);
                char line[64];
                size_t n = 0;
                while (n < sizeof(line) - 1 && read(c, line + n, 1) == 1 && line[n] != '\n')
                        n++;
                line[n] = 0;
                if (strncmp(line, "CONNECT ", 8) || write(c, "OK 1073741824\n", 14) != 14) {
                        close(c);
                        continue;
                }
                /* FAKE_VMM_GUEST=<cove-guest>: the real guest daemon serves the connection
                 * (as a host process of this uid: a test double, no VM, no isolation) */
                const char *guest = getenv("FAKE_VMM_GUEST");
                if (guest && *guest) {
                        if (fork() == 0) {
                                if (dup2(c, 3) < 0)
                                        _exit(7);
                                execl(guest, guest, "--channel-fd", "3", (char *)NULL);
                                _exit(8);
                        }
                        close(c);
                        continue;
                }
                char b[4096];
                ssize_t k;
                while ((k = read(c, b, sizeof(b))) > 0)
                        if (write(c, b, (size_t)k) != k)
                                break;
                close(c);
        }
}

static int fake_vmm_main(const char *api)
{
        if (getenv("FAKE_VMM_EXIT")) /* a VMM that dies at start */
                return 3;
        signal(SIGPIPE, SIG_IGN);
        FILE *log = fopen("fake-vmm.log", "a");
        if (!log)
                return 2;
        setvbuf(log, NULL, _IONBF, 0);
        int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        snprintf(a.sun_path, sizeof(a.sun_path), "%s", api);
        if (bind(l, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(l, 4) < 0)
                return 3;
        char uds[108] = "", disk[256] = "";
        struct fake f = {0};
        for (;;) {
                int c = accept(l, NULL, NULL);
                if (c < 0)
                        return 4;
                char *buf = calloc(1, 65536);
                size_t len = fake_read(&f, c, buf, 65536);
                if (len == 0) { /* the driver's probe for the socket */
                        close(c);
                        free(buf);
                        continue;
                }
                char method[16] = "", path[128] = "";
                sscanf(buf, "%15s %127s", method, path);
                char *body = strstr(buf, "\r\n\r\n");
                body = body ? body + 4 : buf + len;
                fprintf(log, "%s %s %s\n", method, path, body);
                json_t *j = json_loads(body, 0, NULL);
                const char *fault = NULL;
                if (!strcmp(path, "/vsock")) {
                        snprintf(uds, sizeof(uds), "%s",
                                 json_string_value(json_object_get(j, "uds_path")));
                } else if (!strcmp(path, "/drives/rootfs")) {
                        snprintf(disk, sizeof(disk), "%s",
                                 json_string_value(json_object_get(j, "path_on_host")));
                        if (access(disk, R_OK | W_OK) < 0)
                                fault = "drive: cannot open path_on_host";
                } else if (!strcmp(path, "/actions")) {
                        printf("%s\n", "cove-guest: waiting for the node");
                        fflush(stdout);
                } else if (!strcmp(path, "/snapshot/create") && getenv("FAKE_VMM_EVIL")) {
                        /* a compromised VMM: its state is a link to a host file, its memory
                         * a FIFO */
                        const char *sp = json_string_value(json_object_get(j, "snapshot_path"));
                        const char *mp = json_string_value(json_object_get(j, "mem_file_path"));
                        unlink(sp);
                        unlink(mp);
                        if (symlink("/etc/hostname", sp) < 0 || mkfifo(mp, 0600) < 0)
                                fault = "cannot be evil";
                } else if (!strcmp(path, "/snapshot/create")) {
                        FILE *st =
                            fopen(json_string_value(json_object_get(j, "snapshot_path")), "w");
                        FILE *m =
                            fopen(json_string_value(json_object_get(j, "mem_file_path")), "w");
                        if (!st || !m)
                                fault = "snapshot: cannot create files";
                        if (st)
                                fprintf(st, "fake-state %s %s\n", uds, disk);
                        if (m)
                                fprintf(m, "fake-mem");
                        if (st)
                                fclose(st);
                        if (m)
                                fclose(m);
                } else if (!strcmp(path, "/snapshot/load")) {
                        const char *sp = json_string_value(json_object_get(j, "snapshot_path"));
                        const char *mp = json_string_value(
                            json_object_get(json_object_get(j, "mem_backend"), "backend_path"));
                        FILE *st = sp ? fopen(sp, "r") : NULL;
                        FILE *m = mp ? fopen(mp, "r") : NULL;
                        char mem[16] = "";
                        if (!st || !m || fscanf(st, "fake-state %107s %255s", uds, disk) != 2 ||
                            !fgets(mem, sizeof(mem), m) || strcmp(mem, "fake-mem"))
                                fault = "Cannot load snapshot: bad state or memory file";
                        else if (access(disk, R_OK | W_OK) < 0)
                                fault = "Cannot load snapshot: drive missing";
                        else if (getenv("FAKE_VMM_FAIL_LOAD"))
                                fault = "Cannot load snapshot: (FAKE_VMM_FAIL_LOAD)";
                        else
                                fake_vmm_vsock(uds);
                        if (st)
                                fclose(st);
                        if (m)
                                fclose(m);
                }
                json_decref(j);
                char out[512];
                if (fault)
                        snprintf(out, sizeof(out),
                                 "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
                                 "Content-Length: %zu\r\n\r\n{\"fault_message\":\"%s\"}",
                                 strlen(fault) + 20, fault);
                else
                        snprintf(out, sizeof(out), "HTTP/1.1 204 No Content\r\n\r\n");
                ssize_t w = write(c, out, strlen(out));
                (void)w;
                close(c);
                free(buf);
        }
}

static char *slurp(const char *path)
{
        char *d = NULL;
        size_t n = 0;
        struct cove_err err;
        if (cove_read_file(path, 1 << 20, &d, &n, &err) < 0)
                return strdup("");
        return d;
}

static void echo_ok(int fd)
{
        assert_int_equal(write(fd, "ping\n", 5), 5);
        char b[8];
        size_t n = 0;
        while (n < 5) {
                struct pollfd p = {.fd = fd, .events = POLLIN};
                assert_int_equal(poll(&p, 1, 5000), 1);
                ssize_t k = read(fd, b + n, sizeof(b) - n);
                assert_true(k > 0);
                n += (size_t)k;
        }
        assert_memory_equal(b, "ping\n", 5);
}

static void put(const char *path, const char *data)
{
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(data, f);
        fclose(f);
}

static void fc_driver_against_fake_vmm(void **state)
{
        (void)state;
        if (geteuid() != 0)
                skip(); /* needs root: the VMM runs as the sandbox's uid, in a cgroup, netns */
        int kvm = open("/dev/kvm", O_RDWR | O_CLOEXEC);
        if (kvm < 0) {
                print_message("skipped: /dev/kvm cannot be opened (the driver's KVM check)\n");
                skip();
        }
        close(kvm);
        char d[] = "/tmp/cove-fc-drv-XXXXXX", p[512], bin[512], kd[512], data[512], sd[512];
        assert_non_null(mkdtemp(d));
        assert_int_equal(chmod(d, 0755), 0);
        /* this binary, where the sandbox uid can execute it, is the fake firecracker */
        char self[512];
        ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
        assert_true(sl > 0);
        self[sl] = 0;
        snprintf(bin, sizeof(bin), "%s/firecracker", d);
        int in = open(self, O_RDONLY), out = open(bin, O_WRONLY | O_CREAT, 0755);
        struct stat st;
        assert_int_equal(fstat(in, &st), 0);
        assert_int_equal(copy_file_range(in, NULL, out, NULL, (size_t)st.st_size, 0), st.st_size);
        close(in);
        close(out);
        /* a kernel cache, a rootfs and a guest binary: only files here (no VM boots) */
        snprintf(kd, sizeof(kd), "%s/k", d);
        snprintf(p, sizeof(p), "%s/modules", kd);
        assert_int_equal(cove_mkdir_p(p, 0755, NULL), 0);
        snprintf(p, sizeof(p), "%s/vmlinux", kd);
        put(p, "not a kernel");
        snprintf(p, sizeof(p), "%s/modules/order", kd);
        put(p, "a.ko\n");
        snprintf(p, sizeof(p), "%s/modules/a.ko", kd);
        put(p, "module");
        snprintf(p, sizeof(p), "%s/version", kd);
        put(p, "fake 1");
        snprintf(p, sizeof(p), "%s/rootfs/etc", d);
        assert_int_equal(cove_mkdir_p(p, 0755, NULL), 0);
        snprintf(p, sizeof(p), "%s/rootfs/etc/hostname", d);
        put(p, "template\n");
        char rootfs[512], guest[512];
        snprintf(rootfs, sizeof(rootfs), "%s/rootfs", d);
        snprintf(guest, sizeof(guest), "%s/guest", d);
        put(guest, "guest binary");
        snprintf(data, sizeof(data), "%s/data", d);
        snprintf(sd, sizeof(sd), "%s/data/sandboxes/sbx_fctest", d);
        assert_int_equal(cove_mkdir_p(sd, 0700, NULL), 0);
        setenv("COVE_FIRECRACKER", bin, 1);
        setenv("COVE_VM_ACCEL", "kvm", 1);
        setenv("COVE_VM_KERNEL_DIR", kd, 1);

        struct cove_err err;
        struct cove_runtime *rt = cove_runtime_firecracker.open(data, &err);
        if (!rt)
                fail_msg("open: %s", err.msg);
        struct cove_instance_spec spec = {.sandbox_id = "sbx_fctest",
                                          .rootfs = rootfs,
                                          .state_dir = sd,
                                          .guest_binary = guest,
                                          .memory_mb = 256,
                                          .uid_base = 1990000000u,
                                          .uid_count = 65536};
        struct cove_instance inst = {.chan_fd = -1};
        if (cove_runtime_firecracker.start(rt, &spec, &inst, &err) < 0)
                fail_msg("start: %s", err.msg);
        assert_true(inst.pid > 0);
        echo_ok(inst.chan_fd); /* the channel reached the "guest" through CONNECT/OK */
        /* the template VMM got the boot sequence and made the snapshot */
        snprintf(p, sizeof(p), "%s/data/fc/tpl", d);
        DIR *dir = opendir(p);
        assert_non_null(dir);
        struct dirent *e;
        char tlog[1024] = "";
        while ((e = readdir(dir)))
                if (e->d_name[0] != '.')
                        snprintf(tlog, sizeof(tlog), "%s/%s/fake-vmm.log", p, e->d_name);
        closedir(dir);
        char *t = slurp(tlog);
        const char *seq[] = {"PUT /boot-source {\"kernel_image_path\":\"/proc/self/fd/3\"",
                             "PUT /drives/rootfs {\"drive_id\":\"rootfs\",\"path_on_host\":"
                             "\"disk.img\"",
                             "PUT /machine-config {\"vcpu_count\":1,\"mem_size_mib\":256",
                             "PUT /vsock {\"guest_cid\":3,\"uds_path\":\"v.sock\"}",
                             "PUT /actions {\"action_type\":\"InstanceStart\"}",
                             "PATCH /vm {\"state\":\"Paused\"}",
                             "PUT /snapshot/create {\"snapshot_type\":\"Full\""};
        const char *at = t;
        for (size_t i = 0; i < sizeof(seq) / sizeof(seq[0]); i++) {
                const char *q = strstr(at, seq[i]);
                if (!q)
                        fail_msg("template VMM log lacks (in order) %s:\n%s", seq[i], t);
                at = q + 1;
        }
        free(t);
        /* the clone: its own uid, its own disk copy, the template snapshot via inherited fds */
        snprintf(p, sizeof(p), "%s/fc/disk.img", sd);
        assert_int_equal(stat(p, &st), 0);
        assert_int_equal(st.st_uid, 1990000000u);
        snprintf(p, sizeof(p), "/proc/%d/status", (int)inst.pid);
        t = slurp(p);
        assert_non_null(strstr(t, "Uid:\t1990000000\t1990000000"));
        free(t);
        assert_int_equal(cove_runtime_firecracker.freeze(rt, &inst, &err), 0);
        assert_int_equal(cove_runtime_firecracker.thaw(rt, &inst, &err), 0);
        snprintf(p, sizeof(p), "%s/fc/fake-vmm.log", sd);
        t = slurp(p);
        assert_non_null(strstr(t, "PUT /snapshot/load {\"snapshot_path\":\"/proc/self/fd/3\","
                                  "\"mem_backend\":{\"backend_type\":\"File\",\"backend_path\":"
                                  "\"/proc/self/fd/4\"}"));
        assert_non_null(strstr(t, "PATCH /vm {\"state\":\"Paused\"}\nPATCH /vm "
                                  "{\"state\":\"Resumed\"}"));
        free(t);
        /* full snapshot: one image (disk, state, memory), then a restore from it */
        snprintf(p, sizeof(p), "%s/snap.img", d);
        int img = open(p, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        uint64_t pause_ns = 0;
        if (cove_runtime_firecracker.full_snapshot(rt, &inst, img, &pause_ns, &err) < 0)
                fail_msg("full_snapshot: %s", err.msg);
        assert_true(pause_ns > 0);
        char magic[8];
        assert_int_equal(pread(img, magic, 8, 0), 8);
        assert_memory_equal(magic, "COVEFCF1", 8);
        snprintf(p, sizeof(p), "%s/fc/out.state", sd);
        assert_int_equal(access(p, F_OK), -1); /* the VMM's files are gone */
        echo_ok(inst.chan_fd);                 /* and it runs on */
        pid_t old = inst.pid;
        assert_int_equal(cove_runtime_firecracker.stop(rt, &inst, "sbx_fctest", sd, 1, &err), 0);
        assert_int_equal(kill(old, 0), -1);
        assert_int_equal(access(sd, F_OK), -1);

        assert_int_equal(cove_mkdir_p(sd, 0700, NULL), 0);
        spec.full = 1;
        spec.full_fd = img;
        struct cove_instance r2 = {.chan_fd = -1};
        setenv("FAKE_VMM_EVIL", "1", 1);
        if (cove_runtime_firecracker.start(rt, &spec, &r2, &err) < 0)
                fail_msg("restore: %s", err.msg);
        unsetenv("FAKE_VMM_EVIL");
        echo_ok(r2.chan_fd);
        snprintf(p, sizeof(p), "%s/fc/snap.mem", sd);
        assert_int_equal(access(p, R_OK), 0);
        /* a VMM that answers a snapshot with a symlink to a host file and a FIFO: refused
         * (no host file copied into a sandbox's snapshot, no hang), and the VM runs on */
        snprintf(p, sizeof(p), "%s/evil.img", d);
        int evil = open(p, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        assert_int_equal(cove_runtime_firecracker.full_snapshot(rt, &r2, evil, &pause_ns, &err),
                         -1);
        assert_non_null(strstr(err.msg, "out.state"));
        close(evil);
        echo_ok(r2.chan_fd);
        assert_int_equal(cove_runtime_firecracker.stop(rt, &r2, "sbx_fctest", sd, 1, &err), 0);

        /* a failing load: a clear error, nothing left (no process, no VMM dir) */
        assert_int_equal(cove_mkdir_p(sd, 0700, NULL), 0);
        setenv("FAKE_VMM_FAIL_LOAD", "1", 1);
        struct cove_instance r3 = {.chan_fd = -1};
        assert_int_equal(cove_runtime_firecracker.start(rt, &spec, &r3, &err), -1);
        unsetenv("FAKE_VMM_FAIL_LOAD");
        assert_non_null(strstr(err.msg, "firecracker: PUT /snapshot/load: 400: Cannot load "
                                        "snapshot: (FAKE_VMM_FAIL_LOAD)"));
        snprintf(p, sizeof(p), "%s/fc", sd);
        assert_int_equal(access(p, F_OK), -1);
        setenv("FAKE_VMM_EXIT", "1", 1);
        assert_int_equal(cove_runtime_firecracker.start(rt, &spec, &r3, &err), -1);
        unsetenv("FAKE_VMM_EXIT");
        assert_non_null(strstr(err.msg, "firecracker exited at start (status 3)"));
        assert_int_equal(access(p, F_OK), -1);
        /* a damaged image is refused before anything starts */
        assert_int_equal(pwrite(img, "XXXX", 4, 0), 4);
        assert_int_equal(cove_runtime_firecracker.start(rt, &spec, &r3, &err), -1);
        assert_non_null(strstr(err.msg, "not a firecracker full snapshot image"));
        close(img);
        cove_runtime_firecracker.close(rt);
        unsetenv("COVE_FIRECRACKER");
        unsetenv("COVE_VM_ACCEL");
        unsetenv("COVE_VM_KERNEL_DIR");
        assert_int_equal(cove_rm_rf(d, &err), 0);
}

/* ---- QMP against a scripted monitor ---- */

static void say(int fd, const char *s)
{
        assert_int_equal(write(fd, s, strlen(s)), (ssize_t)strlen(s));
}

static void expect_line(int fd, const char *want)
{
        char buf[512];
        size_t n = 0;
        while (n < sizeof(buf) - 1 && read(fd, buf + n, 1) == 1 && buf[n] != '\n')
                n++;
        buf[n] = 0;
        assert_string_equal(buf, want);
}

static void qmp_commands_events_and_errors(void **state)
{
        (void)state;
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        /* the monitor's side is scripted in order (socket buffers hold it all) */
        say(sv[1], "{\"QMP\": {\"version\": {}, \"capabilities\": []}}\r\n");
        say(sv[1], "{\"return\": {}}\r\n");
        struct cove_qmp q;
        struct cove_err err;
        assert_int_equal(cove_qmp_open(&q, sv[0], 1000, &err), 0);
        expect_line(sv[1], "{\"execute\":\"qmp_capabilities\"}");
        /* an event arrives before the reply: queued, the reply still returned */
        say(sv[1], "{\"event\": \"MIGRATION\", \"data\": {\"status\": \"active\"}}\r\n");
        say(sv[1], "{\"return\": {\"status\": \"running\"}}\r\n");
        json_t *ret = NULL;
        assert_int_equal(cove_qmp_cmd(&q, "query-status", NULL, -1, &ret, 1000, &err), 0);
        assert_string_equal(json_string_value(json_object_get(ret, "status")), "running");
        json_decref(ret);
        expect_line(sv[1], "{\"execute\":\"query-status\"}");
        say(sv[1], "{\"error\": {\"class\": \"GenericError\", \"desc\": \"nope\"}}\r\n");
        assert_int_equal(cove_qmp_cmd(&q, "cont", NULL, -1, NULL, 1000, &err), -1);
        assert_non_null(strstr(err.msg, "GenericError: nope"));
        /* migration: active (queued above), then completed */
        say(sv[1], "{\"event\": \"MIGRATION\", \"data\": {\"status\": \"completed\"}}\r\n");
        assert_int_equal(cove_qmp_wait_migration(&q, 1000, &err), 0);
        say(sv[1], "{\"event\": \"MIGRATION\", \"data\": {\"status\": \"failed\"}}\r\n");
        assert_int_equal(cove_qmp_wait_migration(&q, 1000, &err), -1);
        /* silence: bounded wait; junk: an error, not a crash; EOF: QEMU gone */
        assert_int_equal(cove_qmp_wait_event(&q, "STOP", NULL, 50, &err), -1);
        say(sv[1], "not json\n");
        assert_int_equal(cove_qmp_wait_event(&q, "STOP", NULL, 1000, &err), -1);
        close(sv[1]);
        assert_int_equal(cove_qmp_cmd(&q, "quit", NULL, -1, NULL, 1000, &err), -1);
        cove_qmp_close(&q);
}

static void qmp_line_too_long_is_an_error(void **state)
{
        (void)state;
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        pid_t pid = fork();
        if (pid == 0) {
                close(sv[0]);
                char *big = malloc(COVE_QMP_LINE_MAX + 16);
                memset(big, 'x', COVE_QMP_LINE_MAX + 16);
                ssize_t w = write(sv[1], big, COVE_QMP_LINE_MAX + 16);
                (void)w;
                _exit(0);
        }
        close(sv[1]);
        struct cove_qmp q;
        struct cove_err err;
        assert_int_equal(cove_qmp_open(&q, sv[0], 2000, &err), -1);
        assert_non_null(strstr(err.msg, "too long"));
}

int main(int argc, char **argv)
{
        if (argc == 3 && !strcmp(argv[1], "--api-sock"))
                return fake_vmm_main(argv[2]);
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(fc_requests_match_recording),
            cmocka_unit_test(fc_responses),
            cmocka_unit_test(fc_unavailable_says_why),
            cmocka_unit_test(fc_api_sequence_matches_recording),
            cmocka_unit_test(fc_fault_is_a_clear_error),
            cmocka_unit_test(fc_bad_answers),
            cmocka_unit_test(fc_vsock_handshake),
            cmocka_unit_test(fc_driver_against_fake_vmm),
            cmocka_unit_test(qmp_commands_events_and_errors),
            cmocka_unit_test(qmp_line_too_long_is_an_error),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
