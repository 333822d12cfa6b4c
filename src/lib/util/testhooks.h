/* Test-only hooks of a running coved (docs/storage.md, "Test hooks"): a control file that
 * injects faults into the chunk store's durable-write syscalls and shifts the time
 * machine's clock, so integration tests can fail a snapshot with ENOSPC, crash coved at a
 * chosen write, or test retention over days in seconds. Off unless `coved --test-hooks
 * FILE` is given with COVE_TEST_HOOKS=1 in the environment; a production coved never
 * reads the file.
 *
 * The file is re-read whenever it changes (inode, size or mtime); lines:
 *   clock_offset_s N                    time machine clock = wall clock + N s (may be < 0)
 *   gc_grace_s N                        chunk store GC grace period (read at start only;
 *                                       default 1 h, so a test's GC would delete nothing)
 *   job_hold_ms N                       a cluster node holds each job it ran N ms before
 *                                       reporting it (a window to kill or stop it in)
 *   reap_hold_ms N                      a node's reaper waits N ms before it cleans up
 *                                       after a DELETE (a window to crash coved in)
 *   fault OP ACTION [AFTER [COUNT]]     OP: write fsync rename mkdir unlink any
 *                                       (fsync also covers fdatasync and syncfs);
 *                                       ACTION: ENOSPC, EIO, EROFS or kill (SIGKILL of
 *                                       coved at that call: a crash at a chosen point);
 *                                       calls AFTER+1 .. AFTER+COUNT of OP counted from
 *                                       when the file was read fail (default 0, forever)
 * Unknown lines are an error at open and ignored (with the fault set unchanged) later.
 *
 * The sysio table has no context argument, so this state is process-wide: the one
 * exception to "no globals", set once by coved's main before anything runs. */
#ifndef COVE_UTIL_TESTHOOKS_H
#define COVE_UTIL_TESTHOOKS_H

#include <stdint.h>

#include "util/err.h"
#include "util/sysio.h"

/* Enable the hooks on path (which must be readable and valid now). */
int cove_testhooks_open(const char *path, struct cove_err *err);
/* The faulty syscall table, or NULL (real syscalls) when the hooks are off. */
const struct cove_sysio *cove_testhooks_io(void);
/* The clock offset in ms; 0 when the hooks are off. */
int64_t cove_testhooks_clock_offset_ms(void);
/* The GC grace period set by the file in ms; 0 (the store's default) when not set. */
int64_t cove_testhooks_gc_grace_ms(void);
/* How long a node holds a job between running and reporting it; 0 when off. */
int64_t cove_testhooks_job_hold_ms(void);
/* How long a node's reaper waits before cleaning up a deleted instance; 0 when off. */
int64_t cove_testhooks_reap_hold_ms(void);

#endif
