/* Guest channel frame codec: header encode/decode, an incremental bounded decoder and
 * EINTR/partial-write-safe writers. Bytes from a guest are hostile: every length is
 * checked before use and nothing is allocated beyond the decoder's fixed buffer. */
#include "proto/frame.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static void put32(uint8_t *p, uint32_t v)
{
        p[0] = (uint8_t)(v >> 24);
        p[1] = (uint8_t)(v >> 16);
        p[2] = (uint8_t)(v >> 8);
        p[3] = (uint8_t)v;
}

static uint32_t get32(const uint8_t *p)
{
        return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

void cove_frame_hdr_encode(uint8_t hdr[COVE_FRAME_HDR], uint8_t type, uint8_t flags, uint32_t id,
                           uint32_t len)
{
        put32(hdr, len);
        hdr[4] = type;
        hdr[5] = flags;
        hdr[6] = 0;
        hdr[7] = 0;
        put32(hdr + 8, id);
}

int cove_frame_hdr_decode(const uint8_t hdr[COVE_FRAME_HDR], uint32_t max_payload,
                          struct cove_frame *out, struct cove_err *err)
{
        uint32_t len = get32(hdr);
        if (hdr[4] < 1 || hdr[4] > COVE_F_MAX_TYPE)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "frame: unknown type %u", hdr[4]);
        if (hdr[6] || hdr[7])
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "frame: reserved bits set");
        if (len > max_payload)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "frame: payload of %u bytes exceeds the limit of %u", len,
                                     max_payload);
        out->len = len;
        out->type = hdr[4];
        out->flags = hdr[5];
        out->id = get32(hdr + 8);
        out->payload = NULL;
        return 0;
}

int cove_decoder_init(struct cove_decoder *d, uint32_t max_payload, struct cove_err *err)
{
        memset(d, 0, sizeof(*d));
        if (max_payload > COVE_FRAME_MAX)
                max_payload = COVE_FRAME_MAX;
        d->cap = COVE_FRAME_HDR + (size_t)max_payload;
        d->buf = malloc(d->cap);
        if (!d->buf)
                return cove_err_set(err, ENOMEM, "frame decoder");
        d->max_payload = max_payload;
        return 0;
}

void cove_decoder_free(struct cove_decoder *d)
{
        free(d->buf);
        d->buf = NULL;
        d->cap = d->len = d->off = 0;
}

uint8_t *cove_decoder_space(struct cove_decoder *d, size_t *avail)
{
        if (d->off > 0) {
                memmove(d->buf, d->buf + d->off, d->len - d->off);
                d->len -= d->off;
                d->off = 0;
        }
        *avail = d->cap - d->len;
        return d->buf + d->len;
}

void cove_decoder_commit(struct cove_decoder *d, size_t n)
{
        if (n > d->cap - d->len)
                n = d->cap - d->len;
        d->len += n;
}

int cove_decoder_next(struct cove_decoder *d, struct cove_frame *f, struct cove_err *err)
{
        size_t have = d->len - d->off;
        if (have < COVE_FRAME_HDR)
                return 0;
        if (cove_frame_hdr_decode(d->buf + d->off, d->max_payload, f, err) < 0)
                return -1;
        if (have < COVE_FRAME_HDR + (size_t)f->len)
                return 0;
        f->payload = d->buf + d->off + COVE_FRAME_HDR;
        d->off += COVE_FRAME_HDR + f->len;
        if (d->off == d->len)
                d->off = d->len = 0;
        return 1;
}

static long now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static int write_all_iov(int fd, struct iovec *iov, int n, int timeout_ms, struct cove_err *err)
{
        long deadline = timeout_ms >= 0 ? now_ms() + timeout_ms : 0;
        while (n > 0) {
                ssize_t w = writev(fd, iov, n);
                if (w < 0) {
                        if (errno == EINTR)
                                continue;
                        if ((errno == EAGAIN || errno == EWOULDBLOCK) && timeout_ms >= 0) {
                                long left = deadline - now_ms();
                                if (left <= 0)
                                        return cove_err_setk(err, COVE_E_UNAVAILABLE, ETIMEDOUT,
                                                             "frame write: peer does not read");
                                struct pollfd p = {.fd = fd, .events = POLLOUT};
                                if (poll(&p, 1, (int)left) < 0 && errno != EINTR)
                                        return cove_err_set(err, errno, "frame write: poll");
                                continue;
                        }
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, errno, "frame write");
                }
                size_t left = (size_t)w;
                while (n > 0 && left >= iov[0].iov_len) {
                        left -= iov[0].iov_len;
                        iov++;
                        n--;
                }
                if (n > 0) {
                        iov[0].iov_base = (uint8_t *)iov[0].iov_base + left;
                        iov[0].iov_len -= left;
                }
        }
        return 0;
}

static int frame_write(int fd, uint8_t type, uint8_t flags, uint32_t id, const void *payload,
                       uint32_t len, int timeout_ms, struct cove_err *err)
{
        if (len > COVE_FRAME_MAX)
                return cove_err_set(err, EMSGSIZE, "frame write: payload of %u bytes", len);
        uint8_t hdr[COVE_FRAME_HDR];
        cove_frame_hdr_encode(hdr, type, flags, id, len);
        struct iovec iov[2] = {{.iov_base = hdr, .iov_len = sizeof(hdr)},
                               {.iov_base = (void *)payload, .iov_len = len}};
        return write_all_iov(fd, iov, len ? 2 : 1, timeout_ms, err);
}

int cove_frame_write(int fd, uint8_t type, uint8_t flags, uint32_t id, const void *payload,
                     uint32_t len, struct cove_err *err)
{
        return frame_write(fd, type, flags, id, payload, len, -1, err);
}

int cove_frame_write_timeout(int fd, uint8_t type, uint8_t flags, uint32_t id, const void *payload,
                             uint32_t len, int timeout_ms, struct cove_err *err)
{
        return frame_write(fd, type, flags, id, payload, len, timeout_ms < 0 ? 0 : timeout_ms, err);
}

int cove_frame_rechannel(int fd, int timeout_ms, struct cove_err *err)
{
        static const char hello[] = "{\"version\":1,\"rechannel\":true}";
        _Static_assert(COVE_PROTO_VERSION == 1, "rechannel HELLO names the version");
        if (cove_frame_write_timeout(fd, COVE_F_HELLO, 0, 0, hello, sizeof(hello) - 1, timeout_ms,
                                     err) < 0)
                return cove_err_wrap(err, "rechannel");
        /* The restored guest may send frames (output of its processes) before it sees the
         * HELLO; they belong to the old session and are dropped. Its answer is one byte 'R'
         * carrying the new channel (SCM_RIGHTS), the last byte it ever writes here. */
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        static __thread uint8_t buf[64 * 1024];
        for (;;) {
                struct timespec now;
                clock_gettime(CLOCK_MONOTONIC, &now);
                long left = timeout_ms - ((now.tv_sec - t0.tv_sec) * 1000L +
                                          (now.tv_nsec - t0.tv_nsec) / 1000000L);
                struct pollfd p = {.fd = fd, .events = POLLIN};
                int pr = left > 0 ? poll(&p, 1, (int)left) : 0;
                if (pr < 0 && errno == EINTR)
                        continue;
                if (pr <= 0)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, pr == 0 ? ETIMEDOUT : errno,
                                             "rechannel: no answer from the guest");
                struct iovec iov = {buf, sizeof(buf)};
                union {
                        char b[CMSG_SPACE(sizeof(int) * 4)];
                        struct cmsghdr align;
                } u;
                struct msghdr msg = {.msg_iov = &iov,
                                     .msg_iovlen = 1,
                                     .msg_control = u.b,
                                     .msg_controllen = sizeof(u.b)};
                ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
                if (n < 0 && (errno == EINTR || errno == EAGAIN))
                        continue;
                if (n <= 0)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, n < 0 ? errno : EPIPE,
                                             "rechannel: the guest closed the channel");
                int got = -1, extra = 0;
                for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
                        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                                continue;
                        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                        for (size_t i = 0; i < k; i++) {
                                int f;
                                memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                                if (got < 0)
                                        got = f;
                                else {
                                        close(f);
                                        extra = 1;
                                }
                        }
                }
                if (got < 0 && !(msg.msg_flags & MSG_CTRUNC))
                        continue; /* old frames */
                /* the guest is hostile: exactly one fd, after an 'R', a unix stream socket */
                int dom = 0, type = 0;
                socklen_t sl = sizeof(dom);
                if (got < 0 || buf[n - 1] != 'R' || extra || (msg.msg_flags & MSG_CTRUNC) ||
                    getsockopt(got, SOL_SOCKET, SO_DOMAIN, &dom, &sl) < 0 || dom != AF_UNIX ||
                    (sl = sizeof(type), getsockopt(got, SOL_SOCKET, SO_TYPE, &type, &sl) < 0) ||
                    type != SOCK_STREAM) {
                        if (got >= 0)
                                close(got);
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, EPROTO,
                                             "rechannel: the guest did not hand over a channel");
                }
                return got;
        }
}
