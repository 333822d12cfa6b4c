/* What changed between two snapshots of one tenant, computed from their manifests (no
 * restore): files added, changed and removed, and one file's unified text diff. A files
 * snapshot of an ns sandbox holds its overlay's writable layer, so a path present in one
 * layer and not the other is compared against the sandbox's template (where it is built on
 * this node); a whiteout in a layer is a removal. Unchanged files compare by chunk list:
 * their content is never read. docs/api.md "Snapshot diffs". */
#ifndef COVE_CONTROL_SNAPDIFF_H
#define COVE_CONTROL_SNAPDIFF_H

#include <jansson.h>

#include "control/coved.h"

#define COVE_DIFF_ENTRIES_MAX 100000 /* entries per answer (?limit=) */
#define COVE_DIFF_ENTRIES_DEFAULT 10000
#define COVE_DIFF_FILE_MAX (1u << 20) /* bytes of each version a file diff reads */
#define COVE_DIFF_OUT_MAX (4u << 20)  /* bytes of one file's unified diff */

/* {"from","to","added":[…],"changed":[…],"removed":[…],"truncated":bool,"processes"?}
 * for snapshots a → b of tenant (NULL: an admin, any tenant). prefix (NULL: all) narrows
 * to one path and what is under it. limit: entries over all three lists (0: default).
 * NOT_FOUND for a snapshot that is not the tenant's; CONFLICT for a VM full snapshot (its
 * manifest is one memory stream, not a file list); BAD_REQUEST for a bad prefix. */
int cove_snapshot_diff(struct coved *d, const char *tenant, const char *a, const char *b,
                       const char *prefix, size_t limit, json_t **out, struct cove_err *err);
/* {"path","status":"added"|"changed"|"removed"|"unchanged"|"absent","binary":bool,"diff"}
 * for one file. LIMIT when either version is larger than COVE_DIFF_FILE_MAX or the diff
 * larger than COVE_DIFF_OUT_MAX; BAD_REQUEST when path is a directory in either. */
int cove_snapshot_diff_file(struct coved *d, const char *tenant, const char *a, const char *b,
                            const char *path, json_t **out, struct cove_err *err);

#endif
