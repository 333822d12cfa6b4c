/* Guest channel framing: length-prefixed, typed frames with a request/stream id.
 * Shared by the node (untrusted peer: the guest) and cove-guest. Transport-neutral:
 * it works on any byte stream (socketpair for ns, virtio-serial or vsock for vm).
 * Wire format and message catalogue: docs/guest-protocol.md. */
#ifndef COVE_PROTO_FRAME_H
#define COVE_PROTO_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

#define COVE_PROTO_VERSION 1
#define COVE_FRAME_HDR 12               /* bytes: len u32, type u8, flags u8, rsv u16, id u32 */
#define COVE_FRAME_MAX (1024u * 1024u)  /* max payload bytes; larger is a protocol error */
#define COVE_FRAME_CHUNK (256u * 1024u) /* payload size senders use for bulk data */

enum cove_frame_type {
        COVE_F_HELLO = 1,      /* handshake, JSON, both directions, id 0 */
        COVE_F_REQ = 2,        /* node->guest request, JSON {"op":...}, id = request id (>0) */
        COVE_F_RESP = 3,       /* guest->node reply, JSON, id = request id */
        COVE_F_DATA = 4,       /* bulk bytes: file content (both ways, id = request id) or
                                  stdin (node->guest, id = pid) */
        COVE_F_OUT = 5,        /* guest->node process output, id = pid, flags = stream */
        COVE_F_EXIT = 6,       /* guest->node process ended, JSON, id = pid */
        COVE_F_EVENT = 7,      /* guest->node watch event, JSON, id = watch request id */
        COVE_F_ASK = 8,        /* guest->node request from a sandbox program, JSON, id = ask id */
        COVE_F_ANSWER = 9,     /* node->guest answer to an ASK, JSON, id = ask id */
        COVE_F_WINDOW = 10,    /* node->guest, id = read request id: 4 bytes BE, more file bytes
                                  the node accepts for that read */
        COVE_F_CANCEL = 11,    /* node->guest, id = read request id, no payload: stop that read */
        COVE_F_ALIVE = 12,     /* guest->node, id 0, no payload: keepalive while its channel is
                                  paused (it cannot read the node's ping then) */
        COVE_F_HEARTBEAT = 13, /* node->guest, id 0, no payload or 8 bytes BE (a sequence
                                  number): the node holds its lease (docs/cluster.md, "Leases
                                  and fencing"); a guest with a fence TTL freezes its processes
                                  when none came for that long */
        COVE_F_THAW = 14,      /* node->guest, id 0, no payload: lift the guest's self-freeze */
        COVE_F_MAX_TYPE = 14,
};

/* flags */
#define COVE_FF_END 0x01    /* DATA: last chunk of this transfer / stdin EOF */
#define COVE_FF_STDOUT 0x02 /* OUT: stream */
#define COVE_FF_STDERR 0x04
#define COVE_FF_PTY 0x08
#define COVE_FF_ABORT                                                                              \
        0x10 /* DATA with END (file write): discard the transfer, keep the old file                \
              */

struct cove_frame {
        uint8_t type;
        uint8_t flags;
        uint32_t id;
        uint32_t len;
        uint8_t *payload; /* points into the decoder's buffer; valid until the next call */
};

/* Write the 12-byte header for a frame into hdr. */
void cove_frame_hdr_encode(uint8_t hdr[COVE_FRAME_HDR], uint8_t type, uint8_t flags, uint32_t id,
                           uint32_t len);

/* Parse a header. Returns 0, or -1 with err (kind BAD_REQUEST) when the header is
 * invalid: unknown type, reserved bits set, or len > max_payload. */
int cove_frame_hdr_decode(const uint8_t hdr[COVE_FRAME_HDR], uint32_t max_payload,
                          struct cove_frame *out, struct cove_err *err);

/* Incremental decoder over a byte stream. Feed bytes as they arrive, take frames out.
 * The buffer never grows past COVE_FRAME_HDR + max_payload. */
struct cove_decoder {
        uint8_t *buf;
        size_t cap;
        size_t len; /* bytes buffered */
        size_t off; /* start of the unconsumed region */
        uint32_t max_payload;
};

int cove_decoder_init(struct cove_decoder *d, uint32_t max_payload, struct cove_err *err);
void cove_decoder_free(struct cove_decoder *d);
/* Where to put new bytes and how many fit (compacts first). */
uint8_t *cove_decoder_space(struct cove_decoder *d, size_t *avail);
void cove_decoder_commit(struct cove_decoder *d, size_t n);
/* Returns 1 and fills f when a whole frame is buffered, 0 when more bytes are needed,
 * -1 with err on a protocol violation (the stream is then unusable). */
int cove_decoder_next(struct cove_decoder *d, struct cove_frame *f, struct cove_err *err);

/* Blocking helpers for a connected fd (EINTR-safe). cove_frame_write writes header and
 * payload in one writev; returns 0 or -1 with err. cove_frame_write_timeout does the same on
 * a non-blocking fd, giving up after timeout_ms in total (a peer that does not read). */
int cove_frame_write(int fd, uint8_t type, uint8_t flags, uint32_t id, const void *payload,
                     uint32_t len, struct cove_err *err);
int cove_frame_write_timeout(int fd, uint8_t type, uint8_t flags, uint32_t id, const void *payload,
                             uint32_t len, int timeout_ms, struct cove_err *err);

/* Node side of a rechannel (a guest restored from a checkpoint, see guest.c): send the
 * rechannel HELLO on fd (a temporary channel) and receive the guest's new channel end. Returns
 * the new fd (an AF_UNIX stream socket, close-on-exec) or -1 with err (UNAVAILABLE). fd stays
 * open; the caller closes it and does the ordinary handshake on the new one. */
int cove_frame_rechannel(int fd, int timeout_ms, struct cove_err *err);

#endif
