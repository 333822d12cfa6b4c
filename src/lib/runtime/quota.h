/* Writable layers of ns sandboxes with a size limit. This kernel family may lack every disk
 * quota (the 6.18 host has neither CONFIG_QUOTA nor CONFIG_XFS_QUOTA), so the limit is a
 * filesystem of its own: per sandbox a sparse ext4 image of disk_mb, copied (holes kept,
 * ~1 MB of metadata) from a golden image formatted once per size, loop-mounted by the host at
 * <ns_dir>/layers/<id>. A full sandbox gets ENOSPC from its own filesystem (blocks and
 * inodes); the host sees at most disk_mb written. disk_mb == 0 keeps a plain directory. */
#ifndef COVE_RUNTIME_QUOTA_H
#define COVE_RUNTIME_QUOTA_H

#include <stdint.h>
#include <sys/types.h>

#include "util/err.h"

struct cove_layers;

/* Set up <ns_dir>/layers and <ns_dir>/golden. Caller frees with cove_layers_close(). */
struct cove_layers *cove_layers_open(const char *ns_dir, struct cove_err *err);
void cove_layers_close(struct cove_layers *l);
/* Directory holding the layers; layer <id> is mounted at <path>/<id>. */
const char *cove_layers_path(const struct cove_layers *l);

/* Make layers/<id> ready with upper/, work/ and mnt/ owned by owner:group: create the image
 * (first start) or reuse it (after a stop without purge or a crash), and mount it. Forks
 * mkfs.ext4 only the first time a size is used. Returns 1 when the layer was created, 0 when
 * an existing one was reused, -1 on failure (a newly created layer is removed again). */
int cove_layer_prepare(struct cove_layers *l, const char *id, uint64_t limit_mb, uid_t owner,
                       gid_t group, struct cove_err *err);
/* Unmount layers/<id> (lazily: a still-running sandbox keeps its view); keeps the data. */
int cove_layer_release(struct cove_layers *l, const char *id, struct cove_err *err);
/* Unmount and delete layers/<id> and its image; a missing layer is not an error. */
int cove_layer_remove(struct cove_layers *l, const char *id, struct cove_err *err);

#endif
