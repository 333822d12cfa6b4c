/* Node end of one sandbox's guest channel: request/response calls, process streams with
 * replay buffers, file transfers and watches, multiplexed over one framed byte stream.
 * Every frame from the guest is hostile input: lengths, ids, types and JSON are checked,
 * memory per channel is bounded, and a misbehaving guest only kills its own channel.
 *
 * Threads: API threads call the cove_chan_* functions (they block on the channel's
 * condition variable); the node's I/O thread calls cove_chan_on_readable(). A channel is
 * reference counted: cove_chan_ref/unref; the last unref frees it. */
#ifndef COVE_NODE_CHAN_H
#define COVE_NODE_CHAN_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "node/replay.h"
#include "util/err.h"
#include "util/log.h"

struct cove_chan;

/* Takes ownership of fd. */
struct cove_chan *cove_chan_new(int fd, const char *sandbox_id, const struct cove_log *log,
                                struct cove_err *err);
void cove_chan_ref(struct cove_chan *c);
const char *cove_chan_sandbox(const struct cove_chan *c);

/* Requests of sandbox programs relayed by the guest (ASK frames, docs/guest-protocol.md):
 * validated JSON ({"op", "secret", "reason", "ttl_s"} or {"error"}), at most
 * COVE_CHAN_MAX_ASKS waiting per channel. take moves them out (the caller owns ask);
 * answer sends the ANSWER frame. */
#define COVE_CHAN_MAX_ASKS 4
struct cove_ask {
        uint32_t id;
        json_t *ask;
};
int cove_chan_take_asks(struct cove_chan *c, struct cove_ask *out, int max);
int cove_chan_answer(struct cove_chan *c, uint32_t id, json_t *answer, struct cove_err *err);
void cove_chan_unref(struct cove_chan *c);
int cove_chan_fd(const struct cove_chan *c);

/* Handshake (before the channel is handed to the I/O thread): send HELLO, wait for the
 * guest's HELLO for at most timeout_ms. */
int cove_chan_hello(struct cove_chan *c, const char *token, const char *hostname, int timeout_ms,
                    struct cove_err *err);

/* I/O thread: read and dispatch what is available (bounded work per call).
 * Returns 0, or -1 when the channel is dead (it is then marked closed). */
int cove_chan_on_readable(struct cove_chan *c);
/* 1 when the I/O thread should stop polling for input (a consumer is behind). */
int cove_chan_rx_paused(struct cove_chan *c);
/* Heartbeat (I/O thread, about once a second): how long the guest has been silent, in ms
 * (0 while the node itself holds it back: rx paused, bytes not read yet). After
 * a second of silence it pings the guest (REQ op "ping", never blocking the caller); any
 * frame ends the silence. What silence means (frozen, starved, hung) is the caller's call.
 * touch: start counting from now (after a freeze or a snapshot). */
int64_t cove_chan_heartbeat(struct cove_chan *c, int64_t now_ms);
void cove_chan_touch(struct cove_chan *c, int64_t now_ms);
/* Guest self-freeze (docs/cluster.md, "Leases and fencing"). beat: send a HEARTBEAT (seq) if
 * it cannot block the caller (nobody else writing, room in the socket): 0 sent, 1 skipped,
 * -1 the channel is closed. fence: tell the guest its fence TTL (0: off) with a request;
 * *fenced (may be NULL) says whether it is self-frozen now. thaw: send THAW, then check
 * with a ping that the guest is no longer frozen (0), -1 with err otherwise. */
int cove_chan_beat(struct cove_chan *c, uint64_t seq);
int cove_chan_fence(struct cove_chan *c, int ttl_ms, int *fenced, struct cove_err *err);
int cove_chan_thaw(struct cove_chan *c, struct cove_err *err);
/* Mark dead (guest gone, sandbox stopped): wakes and fails every waiter. */
void cove_chan_close(struct cove_chan *c, const char *why);
int cove_chan_is_closed(struct cove_chan *c);
/* A hot pause (the guest kept frozen): end the host side of every stream as a close would
 * (each running process's readers get an ERROR event with why, watches end) while the
 * channel stays open. uncut, at the thaw: a reader of such a process starts after that
 * event (it follows the output from the thaw on, as after a restore). */
void cove_chan_cut(struct cove_chan *c, const char *why);
void cove_chan_uncut(struct cove_chan *c);
/* Set how a consumer wakes the I/O thread when rx resumes. */
void cove_chan_set_rx_notify(struct cove_chan *c, void (*fn)(void *arg, struct cove_chan *c),
                             void *arg);

/* Plain call: send {"op":…} (req is borrowed) and wait for the RESP. On ok:false, returns -1
 * with err filled from the guest's code/message (kind mapped). *resp is owned by caller. */
int cove_chan_call(struct cove_chan *c, json_t *req, json_t **resp, int timeout_ms,
                   struct cove_err *err);

/* Exec: req is the guest exec request; tag and cmd (JSON array, borrowed) are recorded for
 * the process list. On success *pid is the process id and its event stream has a START. */
int cove_chan_exec(struct cove_chan *c, json_t *req, const char *tag, json_t *cmd, uint32_t *pid,
                   struct cove_err *err);
/* Same, with hold: the caller will take every event of the process in order (exec wait).
 * Instead of dropping output it has not taken, the node stops reading the guest's channel
 * while it lags (only this sandbox waits; memory stays bounded). Release with
 * cove_chan_proc_unhold() when done reading, also on early exit. */
int cove_chan_exec_ex(struct cove_chan *c, json_t *req, const char *tag, json_t *cmd, int hold,
                      uint32_t *pid, struct cove_err *err);
void cove_chan_proc_unhold(struct cove_chan *c, uint32_t pid);
/* Drop a finished process's record (its events are gone; it leaves the process list). */
void cove_chan_proc_forget(struct cove_chan *c, uint32_t pid);
/* Copy the first event of pid with seq > after into *out (caller frees with free()).
 * Returns 1 event, 2 overflow (*lost_through set), 0 timeout, 3 end of stream, -1 error
 * (unknown pid: kind NOT_FOUND). */
int cove_chan_proc_next(struct cove_chan *c, uint32_t pid, uint64_t after, struct cove_ev **out,
                        uint64_t *lost_through, int timeout_ms, struct cove_err *err);
/* The same, also returning 0 (as a timeout) as soon as *cancel is non-zero: whoever sets it
 * then calls cove_chan_wake(c), so a waiter never misses it. cancel may be NULL. */
int cove_chan_proc_wait(struct cove_chan *c, uint32_t pid, uint64_t after, struct cove_ev **out,
                        uint64_t *lost_through, int timeout_ms, const int *cancel,
                        struct cove_err *err);
/* Visit the events of pid after `after` in place, oldest first, under the channel's lock (no
 * copy): fn gets each held event until it returns non-zero, and may cache the event's
 * encoded line (cove_replay_line). Waits like cove_chan_proc_wait for the first; returns 1
 * when fn saw at least one event, else as cove_chan_proc_next. A process held for a wait-mode
 * exec is not released by it (use cove_chan_proc_next there). */
typedef int (*cove_ev_visit_fn)(void *arg, struct cove_ev *ev);
int cove_chan_proc_visit(struct cove_chan *c, uint32_t pid, uint64_t after, cove_ev_visit_fn fn,
                         void *arg, uint64_t *lost_through, int timeout_ms, const int *cancel,
                         struct cove_err *err);
int cove_chan_proc_stdin(struct cove_chan *c, uint32_t pid, const void *data, size_t len, int eof,
                         struct cove_err *err);
/* {"processes":[{pid, tag, cmd, started_at, running, exit_code?}]} */
json_t *cove_chan_proc_list(struct cove_chan *c);
int cove_chan_proc_exists(struct cove_chan *c, uint32_t pid);

/* File read: after a successful start, *size and *mode are the guest's figures; then
 * cove_chan_xfer_read returns bytes (>0), 0 at the end, -1 on error. */
struct cove_xfer;
int cove_chan_read_begin(struct cove_chan *c, const char *path, struct cove_xfer **x,
                         uint64_t *size, uint32_t *mode, struct cove_err *err);
long cove_chan_xfer_read(struct cove_xfer *x, void *buf, size_t cap, int timeout_ms,
                         struct cove_err *err);
/* Before the first xfer_read: wait until the whole file or the first window (1 MiB) has
 * arrived. 1: it is all here, *len is its exact length (answer with a Content-Length);
 * 0: more follows (*len bytes so far: stream without a length); -1 with err. The guest's
 * *size of read_begin is only a bound: a file that shrank ends early (xfer_read returns 0),
 * a pseudo-file (procfs, sysfs) has no size of its own. */
int cove_chan_xfer_prefetch(struct cove_xfer *x, int timeout_ms, uint64_t *len,
                            struct cove_err *err);
/* File write: begin, feed bytes, finish (gets the guest's {entry}). */
/* user (NULL: root) owns what the write creates. */
int cove_chan_write_begin(struct cove_chan *c, const char *path, unsigned mode, const char *user,
                          struct cove_xfer **x, struct cove_err *err);
/* Same, and meta ({key: text}, NULL none) becomes the file's metadata (user.e2b.* xattrs),
 * set before the file appears under its name. */
int cove_chan_write_begin_meta(struct cove_chan *c, const char *path, unsigned mode,
                               const char *user, json_t *meta, struct cove_xfer **x,
                               struct cove_err *err);
int cove_chan_xfer_write(struct cove_xfer *x, const void *data, size_t len, struct cove_err *err);
int cove_chan_write_finish(struct cove_xfer *x, json_t **entry, struct cove_err *err);
/* Also aborts an unfinished transfer: an upload ends with END|ABORT (the guest keeps the old
 * file), a download with CANCEL (the guest stops reading). */
void cove_chan_xfer_free(struct cove_xfer *x);

/* Watch: events as COVE_EV_JSON in a replay buffer. */
struct cove_watch;
int cove_chan_watch(struct cove_chan *c, const char *path, int recursive, struct cove_watch **w,
                    struct cove_err *err);
/* Like cove_chan_proc_next and cove_chan_proc_wait for a watch. */
int cove_chan_watch_next(struct cove_watch *w, uint64_t after, struct cove_ev **out,
                         uint64_t *lost_through, int timeout_ms, struct cove_err *err);
int cove_chan_watch_wait(struct cove_watch *w, uint64_t after, struct cove_ev **out,
                         uint64_t *lost_through, int timeout_ms, const int *cancel,
                         struct cove_err *err);
int cove_chan_watch_visit(struct cove_watch *w, uint64_t after, cove_ev_visit_fn fn, void *arg,
                          uint64_t *lost_through, int timeout_ms, const int *cancel,
                          struct cove_err *err);
void cove_chan_watch_free(struct cove_watch *w); /* unwatches */

/* Wake every waiter of the channel (used by shutdown). */
void cove_chan_wake(struct cove_chan *c);

#endif
