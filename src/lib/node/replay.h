/* Replay buffer: a bounded, sequence-numbered event log per process (or per watch), so a
 * client that reconnects with ?after=SEQ gets every event exactly once. When the bound is
 * hit the oldest events are dropped and a reader that asks for them is told so (an
 * explicit overflow marker), never silently given a gap. Not thread-safe: the owner
 * (node/chan.c) holds its channel lock around every call. */
#ifndef COVE_NODE_REPLAY_H
#define COVE_NODE_REPLAY_H

#include <stddef.h>
#include <stdint.h>

enum cove_ev_type {
        COVE_EV_START = 1, /* data: none (pid is the owner's) */
        COVE_EV_STDOUT,
        COVE_EV_STDERR,
        COVE_EV_PTY,
        COVE_EV_EXIT,  /* data: JSON from the guest's EXIT frame (validated by the caller) */
        COVE_EV_ERROR, /* data: message text */
        COVE_EV_JSON,  /* data: a JSON object (watch events) */
};

struct cove_ev {
        uint64_t seq;
        uint8_t type;
        uint32_t len;
        /* the event as its reader's wire line, encoded once on first use and freed with the
         * event (cove_replay_line); NULL until then, and in copies handed out */
        char *line;
        size_t line_len;
        uint8_t data[]; /* len bytes */
};

struct cove_replay {
        struct cove_ev **ring; /* circular array of events, oldest at start */
        size_t cap, start, count;
        uint64_t first_seq;     /* seq of ring[start] when count > 0 */
        uint64_t next_seq;      /* seq the next appended event gets (starts at 1) */
        uint64_t dropped_bytes; /* payload bytes dropped so far */
        uint64_t dropped_events;
        size_t bytes;      /* payload bytes held */
        size_t max_bytes;  /* bound on bytes held */
        size_t max_events; /* bound on events held */
        int closed;        /* no event will be appended any more */
};

void cove_replay_init(struct cove_replay *r, size_t max_bytes, size_t max_events);
void cove_replay_free(struct cove_replay *r);
/* Append one event; drops the oldest events to stay within the bounds. Returns its seq,
 * or 0 on allocation failure (the event is then counted as dropped). */
uint64_t cove_replay_append(struct cove_replay *r, uint8_t type, const void *data, uint32_t len);

/* The first event with seq > after. Returns:
 *   1: *ev points to it (owned by the buffer, valid until the next append/free);
 *   2: events after `after` were dropped: *lost_through is the last dropped seq
 *      (the reader reports an overflow marker and continues after it);
 *   0: nothing yet (wait) — or, if r->closed, the stream is over. */
int cove_replay_next(const struct cove_replay *r, uint64_t after, const struct cove_ev **ev,
                     uint64_t *lost_through);

/* Encodes one event as a malloc'd line (*len bytes); NULL on failure. */
typedef char *(*cove_ev_encode_fn)(const struct cove_ev *ev, const void *arg, size_t *len);
/* ev's encoded line, encoding it on the first call only (a replay read by many reconnects is
 * encoded once, not once per reader); NULL if encoding failed. ev must be an event held by a
 * replay buffer (freed with it), not a copy. */
const char *cove_replay_line(struct cove_ev *ev, cove_ev_encode_fn enc, const void *arg,
                             size_t *len);

#endif
