/* Image layers, unpacked by hand: a layer blob (tar, gzip- or zstd-compressed tar) from a
 * registry or an archive is hostile input. cove_tarx_unpack() streams one into an empty
 * directory, hashing the blob (its digest) and the tar stream (its diff_id) on the way and
 * refusing what could reach outside that directory or the host: absolute paths and `..`,
 * paths through a symlink, hardlinks out of the layer, device nodes; every byte written and
 * every entry is counted against a budget shared by the image's layers. cove_tarx_apply()
 * then lays an unpacked layer over a root filesystem with the OCI whiteout rules, by hard
 * links, so that a layer several templates use is stored once.
 * Everything works below directory fds opened with O_NOFOLLOW: no path is ever resolved
 * through a link the layer made. */
#ifndef COVE_CONTROL_TARX_H
#define COVE_CONTROL_TARX_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

/* What is left for the image being built; both are decremented as a layer is unpacked.
 * Running out fails the layer with COVE_E_LIMIT. */
struct cove_tarx_budget {
        uint64_t bytes_left;   /* decompressed tar bytes */
        uint64_t entries_left; /* tar entries */
};

struct cove_tarx_result {
        char blob_digest[72]; /* "sha256:<hex>" of the bytes read from the blob fd */
        char diff_id[72];     /* "sha256:<hex>" of the uncompressed tar stream */
        uint64_t bytes;       /* uncompressed bytes */
        uint64_t entries;
};

/* Called every few MB with the bytes done so far; non-zero stops the unpack (cancelled). */
typedef int (*cove_tarx_tick_fn)(void *arg, uint64_t bytes);

/* Unpack the blob read from blob_fd (to its end) into the empty directory dirfd, as root:
 * ownership and modes (setuid/setgid bits included) as the layer says; whiteout entries
 * (.wh.NAME, .wh..wh..opq) are kept as empty files for cove_tarx_apply(). Compression is
 * recognised by its magic (gzip, zstd, none). Returns 0 with res filled, or -1 with err:
 * COVE_E_BAD_REQUEST for a malformed or refused entry (the message names it),
 * COVE_E_LIMIT when the budget runs out, COVE_E_CONFLICT when tick cancelled. The caller
 * checks res->blob_digest and res->diff_id against what the manifest and config promise;
 * on failure dirfd holds a partial tree the caller removes. */
int cove_tarx_unpack(int blob_fd, int dirfd, struct cove_tarx_budget *budget,
                     cove_tarx_tick_fn tick, void *tick_arg, struct cove_tarx_result *res,
                     struct cove_err *err);

/* Lay the unpacked layer in layer_fd over the tree in root_fd: whiteouts remove what lower
 * layers put there, directories are created or take the layer's owner and mode, every other
 * entry is hard-linked from the layer (replacing what was there). 0, or -1 with err. */
int cove_tarx_apply(int layer_fd, int root_fd, struct cove_err *err);

/* Remove name below dirfd (recursively, never following a symlink). 0 or -1 with errno. */
int cove_tarx_rm_at(int dirfd, const char *name);

/* The tar parser alone, for fuzzing: walks the tar stream in buf (uncompressed) and
 * validates every header and path without writing anything. 0 or -1 with err. */
int cove_tarx_check(const void *buf, size_t len, struct cove_err *err);

#endif
