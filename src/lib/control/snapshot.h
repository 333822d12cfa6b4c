/* The time machine in the control plane (docs/architecture.md §6): snapshots of sandboxes into
 * the chunk store, and the operations built on them: pause, resume, rewind, fork, rolling
 * snapshots with retention, and what a restart does with sandboxes that have snapshots.
 *
 * Capture order: the runtime copies the writable layer into a temporary image while the
 * sandbox is held (layer_snapshot, the only pause), then, one capture at a time per coved
 * (bounded I/O), the image is opened read-only and captured into the store (chunks, then
 * manifest, durable), then the catalog row is written, then the image is removed. A
 * snapshot is listed only once its row exists, so a crash at any point leaves either no
 * snapshot or a complete one; orphan manifests and temporary images are removed at start.
 *
 * Restore order: a fresh image is created and filled from the store (every chunk verified);
 * only when that is complete does the sandbox switch to it, so a missing or tampered chunk
 * leaves the sandbox as it was.
 *
 * Operations on one sandbox are serialised (a pause waits for a rolling snapshot of it).
 * Errors carry kinds the API maps to statuses; messages name the sandbox and snapshot. */
#ifndef COVE_CONTROL_SNAPSHOT_H
#define COVE_CONTROL_SNAPSHOT_H

#include <jansson.h>

#include "control/coved.h"
#include "store/catalog.h"

/* Remove what a crash left in the node's chunk store (manifests without a catalog row; the
 * node removed its temporary images when it opened the store, node/tm.h), and start the
 * background thread (rolling snapshots, retention thinning, GC). Needs d->cat, d->node and
 * d->ntm. */
int cove_tm_open(struct coved *d, struct cove_err *err);
/* Stop the background thread (the node closes the store). Safe on a never-opened d. */
void cove_tm_close(struct coved *d);
/* Wake the background thread (a sandbox was created or resumed). */
void cove_tm_kick(struct coved *d);
/* Hot pauses (snapshot.c): a sandbox paused with a full snapshot whose instance is kept
 * frozen at it for a while, so a resume is a thaw. Toward the API it is paused like any
 * (no instance that runs, exec, usage, streams end). has: 1 while id is hot-paused. drop
 * (waits for an operation on id): end its hot pause, the frozen instance and its layer
 * go, the sandbox stays paused at its snapshot (a resume restores from the store); 1 when
 * it had one. */
int cove_tm_hot_has(struct coved *d, const char *id);
int cove_tm_hot_drop(struct coved *d, const char *id, const char *why);

json_t *cove_snapshot_json(const struct cove_snapshot_row *s);

/* 0 when the node's data disk has room for what an operation writes (a sandbox, a
 * snapshot, a restore); else -1 with UNAVAILABLE naming the free space. A reserve
 * (COVE_DISK_RESERVE_MB_MIN, or 2% of the disk up to 1 GiB) is kept for the sandboxes
 * already running, which write to their layers without asking: coved's own work never
 * takes the last of the disk from them. */
#define COVE_DISK_RESERVE_MB_MIN 32
int coved_space_check(struct coved *d, const char *what, struct cove_err *err);

/* Take a snapshot of a running sandbox and wait until it is complete. label may be NULL.
 * kind: NULL (full where the node can, files otherwise; rolling ones are files), "files"
 * or "full" (BAD_REQUEST for anything else; CONFLICT when this node or sandbox cannot take
 * that kind). Errors: NOT_FOUND, CONFLICT (not running), UNAVAILABLE (runtime cannot
 * snapshot, store full or failing: the previous snapshots are intact). out may be NULL. */
int cove_snapshot_take(struct coved *d, const char *tenant, const char *sandbox_id,
                       const char *label, const char *kind, int rolling,
                       struct cove_snapshot_row *out, struct cove_err *err);
/* {"snapshots":[…]} of one sandbox, newest first. The sandbox may be deleted (its
 * snapshots outlive it); NOT_FOUND only when neither it nor any snapshot of it exists. */
int cove_snapshot_list_json(struct coved *d, const char *tenant, const char *sandbox_id,
                            json_t **out, struct cove_err *err);
int cove_snapshot_load(struct coved *d, const char *tenant, const char *snap_id,
                       struct cove_snapshot_row *out, struct cove_err *err);
/* Remove the row, then the manifest (chunks go at the next GC). */
int cove_snapshot_remove(struct coved *d, const char *tenant, const char *snap_id,
                         struct cove_err *err);
/* Remove every snapshot of a sandbox (DELETE …?purge=true). */
int cove_snapshot_purge_sandbox(struct coved *d, const char *tenant, const char *sandbox_id,
                                struct cove_err *err);

/* Operations of docs/api.md. Answers are new references. tenant NULL = internal caller
 * (timer), any tenant. */
int cove_sandbox_pause(struct coved *d, const char *tenant, const char *id, json_t **out,
                       struct cove_err *err);
int cove_sandbox_resume(struct coved *d, const char *tenant, const char *id, json_t *body,
                        json_t **out, struct cove_err *err);
int cove_sandbox_rewind(struct coved *d, const char *tenant, const char *id, json_t *body,
                        json_t **out, struct cove_err *err);
int cove_sandbox_fork(struct coved *d, const char *tenant, const char *id, json_t *body,
                      json_t **out, struct cove_err *err);
/* pause with a snapshot kind as cove_snapshot_take takes it (NULL: full where the node
 * can, files otherwise; "files": a files-only snapshot even where full ones work, so the
 * resume is a fresh start). */
int cove_sandbox_pause_kind(struct coved *d, const char *tenant, const char *id, const char *kind,
                            json_t **out, struct cove_err *err);
/* fork, and over (may be NULL) sets the forks' own settings instead of the source's:
 * {metadata?: {}, env?: {}, timeout_s?: N, on_timeout?: "kill"|"pause"} (internal callers:
 * the E2B API's create from a snapshot). */
int cove_sandbox_fork_ext(struct coved *d, const char *tenant, const char *id, json_t *body,
                          json_t *over, json_t **out, struct cove_err *err);
/* End a running or paused sandbox's instance but keep its row (state "stopped") and its
 * snapshots: what forks of them need (the source's template and shape). */
int cove_sandbox_stop_keep(struct coved *d, const char *tenant, const char *id,
                           struct cove_err *err);

/* The files a sandbox changed over its template, as a read-only directory fd of its
 * overlay upper tree (overlay whiteouts included), for fn: of the running ns sandbox
 * `sandbox` now (a consistent clone, as a files snapshot takes), or of snapshot `snap`
 * (restored into a temporary layer); one of the two is NULL. template_out receives the
 * sandbox's template. The temporary image is removed before the return (and swept at start
 * after a crash). 0 with fn's result, or -1 with err. */
typedef int (*coved_tree_fn)(void *arg, int tree_fd, struct cove_err *err);
int coved_sandbox_files(struct coved *d, const char *tenant, const char *sandbox, const char *snap,
                        char template_out[64], coved_tree_fn fn, void *arg, struct cove_err *err);
/* The chunk store snapshots live in (NULL when this node cannot snapshot), for readers of
 * snapshots that do not restore them (control/snapdiff.h). Owned by d. */
struct cove_store;
struct cove_store *cove_tm_store(struct coved *d);

#endif
