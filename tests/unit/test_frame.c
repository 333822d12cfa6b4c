/* Unit tests for the guest channel frame codec (proto/frame.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto/frame.h"

static void roundtrip_split_bytes(void **state)
{
        (void)state;
        uint8_t wire[3 * (COVE_FRAME_HDR + 5)];
        size_t n = 0;
        for (uint32_t i = 0; i < 3; i++) {
                cove_frame_hdr_encode(wire + n, COVE_F_OUT, COVE_FF_STDOUT, 100 + i, 5);
                memcpy(wire + n + COVE_FRAME_HDR, "hello", 5);
                n += COVE_FRAME_HDR + 5;
        }
        struct cove_decoder d;
        struct cove_err err;
        assert_int_equal(cove_decoder_init(&d, 1024, &err), 0);
        uint32_t seen = 0;
        /* feed one byte at a time: frames must come out whole and in order */
        for (size_t i = 0; i < n; i++) {
                size_t avail;
                uint8_t *sp = cove_decoder_space(&d, &avail);
                assert_true(avail >= 1);
                *sp = wire[i];
                cove_decoder_commit(&d, 1);
                struct cove_frame f;
                int r;
                while ((r = cove_decoder_next(&d, &f, &err)) == 1) {
                        assert_int_equal(f.type, COVE_F_OUT);
                        assert_int_equal(f.flags, COVE_FF_STDOUT);
                        assert_int_equal(f.id, 100 + seen);
                        assert_int_equal(f.len, 5);
                        assert_memory_equal(f.payload, "hello", 5);
                        seen++;
                }
                assert_int_equal(r, 0);
        }
        assert_int_equal(seen, 3);
        cove_decoder_free(&d);
}

static void rejects_oversize_and_bad_type(void **state)
{
        (void)state;
        uint8_t hdr[COVE_FRAME_HDR];
        struct cove_frame f;
        struct cove_err err;
        cove_frame_hdr_encode(hdr, COVE_F_DATA, 0, 1, 1025);
        assert_int_equal(cove_frame_hdr_decode(hdr, 1024, &f, &err), -1);
        assert_int_equal(err.kind, COVE_E_BAD_REQUEST);
        assert_non_null(strstr(err.msg, "exceeds"));
        cove_frame_hdr_encode(hdr, 0, 0, 1, 0);
        assert_int_equal(cove_frame_hdr_decode(hdr, 1024, &f, &err), -1);
        cove_frame_hdr_encode(hdr, COVE_F_MAX_TYPE + 1, 0, 1, 0);
        assert_int_equal(cove_frame_hdr_decode(hdr, 1024, &f, &err), -1);
        cove_frame_hdr_encode(hdr, COVE_F_REQ, 0, 1, 0);
        hdr[6] = 1;
        assert_int_equal(cove_frame_hdr_decode(hdr, 1024, &f, &err), -1);
        cove_frame_hdr_encode(hdr, COVE_F_REQ, 0, 7, 1024);
        assert_int_equal(cove_frame_hdr_decode(hdr, 1024, &f, &err), 0);
        assert_int_equal(f.id, 7);
}

static void write_then_decode_over_socket(void **state)
{
        (void)state;
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        struct cove_err err;
        static uint8_t big[200000];
        for (size_t i = 0; i < sizeof(big); i++)
                big[i] = (uint8_t)(i * 7);
        assert_int_equal(
            cove_frame_write(sv[0], COVE_F_DATA, COVE_FF_END, 9, big, sizeof(big), &err), 0);
        struct cove_decoder d;
        assert_int_equal(cove_decoder_init(&d, COVE_FRAME_MAX, &err), 0);
        struct cove_frame f;
        int r = 0;
        while (r == 0) {
                size_t avail;
                uint8_t *sp = cove_decoder_space(&d, &avail);
                ssize_t n = read(sv[1], sp, avail);
                assert_true(n > 0);
                cove_decoder_commit(&d, (size_t)n);
                r = cove_decoder_next(&d, &f, &err);
        }
        assert_int_equal(r, 1);
        assert_int_equal(f.len, sizeof(big));
        assert_int_equal(f.flags, COVE_FF_END);
        assert_memory_equal(f.payload, big, sizeof(big));
        cove_decoder_free(&d);
        close(sv[0]);
        close(sv[1]);
}

static void write_timeout_when_peer_does_not_read(void **state)
{
        (void)state;
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
        struct cove_err err;
        static uint8_t chunk[COVE_FRAME_CHUNK];
        int r = 0;
        for (int i = 0; i < 1000 && r == 0; i++)
                r = cove_frame_write_timeout(sv[0], COVE_F_DATA, 0, 1, chunk, sizeof(chunk), 50,
                                             &err);
        assert_int_equal(r, -1);
        assert_int_equal(err.kind, COVE_E_UNAVAILABLE);
        close(sv[0]);
        close(sv[1]);
}

/* ---- rechannel (node side): a fake guest answers on the other end of a socketpair ---- */

enum fake { FAKE_OK, FAKE_FRAMES_FIRST, FAKE_NO_FD, FAKE_PIPE, FAKE_TWO_FDS, FAKE_SILENT };

static void send_with_fds(int s, const int *fds, int n)
{
        char byte = 'R';
        struct iovec iov = {&byte, 1};
        union {
                char b[CMSG_SPACE(sizeof(int) * 2)];
                struct cmsghdr align;
        } u;
        memset(&u, 0, sizeof(u));
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
        if (n) {
                m.msg_control = u.b;
                m.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n);
                struct cmsghdr *c = CMSG_FIRSTHDR(&m);
                c->cmsg_level = SOL_SOCKET;
                c->cmsg_type = SCM_RIGHTS;
                c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n);
                memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)n);
        }
        assert_int_equal(sendmsg(s, &m, 0), 1);
}

/* returns the fd the node should end up talking to (the fake guest's kept end), or -1 */
static int fake_guest(int s, enum fake how)
{
        uint8_t hdr[COVE_FRAME_HDR];
        if (how == FAKE_FRAMES_FIRST) { /* output of the old session, before the answer */
                struct cove_err err;
                for (int i = 0; i < 3; i++)
                        assert_int_equal(
                            cove_frame_write(s, COVE_F_OUT, COVE_FF_STDOUT, 7, "old", 3, &err), 0);
        }
        assert_int_equal(read(s, hdr, sizeof(hdr)), (ssize_t)sizeof(hdr));
        struct cove_frame f;
        struct cove_err err;
        assert_int_equal(cove_frame_hdr_decode(hdr, COVE_FRAME_MAX, &f, &err), 0);
        assert_int_equal(f.type, COVE_F_HELLO);
        char body[128] = "";
        assert_true(f.len < sizeof(body));
        assert_int_equal(read(s, body, f.len), (ssize_t)f.len);
        assert_non_null(strstr(body, "\"rechannel\":true"));
        int sv[2], pp[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        switch (how) {
        case FAKE_SILENT:
                close(sv[1]);
                return sv[0];
        case FAKE_NO_FD:
                send_with_fds(s, NULL, 0);
                close(sv[1]);
                return sv[0];
        case FAKE_PIPE:
                assert_int_equal(pipe(pp), 0);
                send_with_fds(s, pp, 1);
                close(pp[0]);
                close(pp[1]);
                close(sv[1]);
                return sv[0];
        case FAKE_TWO_FDS: {
                int two[2] = {sv[1], sv[1]};
                send_with_fds(s, two, 2);
                close(sv[1]);
                return sv[0];
        }
        default:
                send_with_fds(s, &sv[1], 1);
                close(sv[1]);
                return sv[0];
        }
}

struct fake_job {
        int s;
        enum fake how;
        int keep;
};

static void *fake_main(void *arg)
{
        struct fake_job *j = arg;
        j->keep = fake_guest(j->s, j->how);
        return NULL;
}

static void rechannel_cases(void **state)
{
        (void)state;
        static const struct {
                enum fake how;
                int ok;
        } cases[] = {{FAKE_OK, 1},   {FAKE_FRAMES_FIRST, 1}, {FAKE_NO_FD, 0},
                     {FAKE_PIPE, 0}, {FAKE_TWO_FDS, 0},      {FAKE_SILENT, 0}};
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                int sp[2];
                assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
                struct fake_job j = {sp[1], cases[i].how, -1};
                pthread_t t;
                assert_int_equal(pthread_create(&t, NULL, fake_main, &j), 0);
                struct cove_err err;
                int nfd =
                    cove_frame_rechannel(sp[0], cases[i].how == FAKE_SILENT ? 200 : 2000, &err);
                pthread_join(t, NULL);
                int keep = j.keep;
                if (cases[i].ok) {
                        assert_true(nfd >= 0);
                        /* the new channel reaches the guest's kept end */
                        assert_int_equal(write(nfd, "ping", 4), 4);
                        char b[4];
                        assert_int_equal(read(keep, b, 4), 4);
                        assert_memory_equal(b, "ping", 4);
                        close(nfd);
                } else {
                        assert_int_equal(nfd, -1);
                        assert_int_equal(err.kind, COVE_E_UNAVAILABLE);
                }
                close(keep);
                close(sp[0]);
                close(sp[1]);
        }
}

int main(void)
{
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(roundtrip_split_bytes),
            cmocka_unit_test(rejects_oversize_and_bad_type),
            cmocka_unit_test(write_then_decode_over_socket),
            cmocka_unit_test(write_timeout_when_peer_does_not_read),
            cmocka_unit_test(rechannel_cases),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
