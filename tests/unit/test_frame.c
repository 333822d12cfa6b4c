/* Unit tests for the guest channel frame codec (proto/frame.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
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

int main(void)
{
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(roundtrip_split_bytes),
            cmocka_unit_test(rejects_oversize_and_bad_type),
            cmocka_unit_test(write_then_decode_over_socket),
            cmocka_unit_test(write_timeout_when_peer_does_not_read),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
