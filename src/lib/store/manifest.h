/* Snapshot manifests in memory and their (decrypted) JSON form, docs/storage.md §3.
 * The parser treats its input as hostile: every count, length and path is bounded and
 * checked (relative paths without "."/".." components, each entry's parent an earlier
 * directory, hard links to earlier files, chunk lengths summing to the file size), so a
 * restore driven by a parsed manifest cannot write outside its target. */
#ifndef COVE_STORE_MANIFEST_H
#define COVE_STORE_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

#define COVE_MANIFEST_FORMAT 1
#define COVE_MANIFEST_MAX_BYTES (512u << 20) /* decompressed JSON */
#define COVE_MANIFEST_MAX_ENTRIES (4u << 20)
#define COVE_MANIFEST_MAX_CHUNKS (64u << 20) /* all files together */
#define COVE_PATH_MAX 4095
#define COVE_PATH_DEPTH_MAX 256
#define COVE_XATTRS_MAX 128 /* per entry */
#define COVE_XATTR_NAME_MAX 255
#define COVE_XATTR_VALUE_MAX 65536
#define COVE_CHUNK_MAX_LEN (2u << 20) /* largest chunk of either chunker */
#define COVE_ID_MAX 63                /* snapshot ids: 1..63 of [A-Za-z0-9_-] */

enum cove_ent_type {
        COVE_ENT_FILE = 0,
        COVE_ENT_DIR,
        COVE_ENT_SYMLINK,
        COVE_ENT_CHAR,
        COVE_ENT_BLOCK,
        COVE_ENT_FIFO,
        COVE_ENT_SOCKET,
};

struct cove_mchunk {
        uint8_t id[32]; /* HMAC-SHA256 chunk id; all zero for a hole */
        uint64_t len;   /* plaintext bytes (a hole may be longer than a chunk) */
        int hole;       /* 1: len zero bytes, no object */
};

struct cove_xattr {
        char *name;
        uint8_t *value;
        size_t len;
};

struct cove_mentry {
        char *path; /* "." for the tree root, else "a/b" */
        enum cove_ent_type type;
        uint32_t mode; /* permission bits incl. setuid/setgid/sticky (07777) */
        uint32_t uid, gid;
        int64_t mtime_ns;
        int64_t ctime_ns; /* files: change time, 0 = unknown (only to skip unchanged files) */
        uint64_t ino;     /* files: inode number in the captured filesystem (likewise) */
        uint64_t size;    /* files: bytes */
        uint64_t rdev;    /* char/block devices (overlayfs whiteouts are char 0/0) */
        char *target;     /* symlink target */
        char *link;       /* hard link: path of an earlier file entry with the data */
        struct cove_xattr *xattrs;
        size_t nxattrs;
        size_t chunk_off, nchunks; /* into cove_manifest.chunks */
};

struct cove_manifest {
        char id[COVE_ID_MAX + 1];
        char tenant[COVE_ID_MAX + 1];
        char parent[COVE_ID_MAX + 1]; /* "" if none */
        char kind[16];                /* "files" (a tree) or "memory" (one stream) */
        int64_t created_at;           /* unix ms */
        uint64_t size_bytes;          /* logical bytes of data (files or stream) */
        uint64_t new_bytes;           /* plaintext bytes of chunks this snapshot added */
        struct cove_mentry *entries;
        size_t n, cap;
        struct cove_mchunk *chunks;
        size_t nchunks, chunks_cap;
};

/* 1 if s is a valid snapshot id (also usable as an object-name component). */
int cove_snapshot_id_valid(const char *s);

void cove_manifest_init(struct cove_manifest *m);
void cove_manifest_clear(struct cove_manifest *m); /* frees everything it owns */
/* Append an entry (fields copied, strings duplicated); returns it or NULL (ENOMEM). */
struct cove_mentry *cove_manifest_add(struct cove_manifest *m, const struct cove_mentry *e);
/* Append a chunk to the last entry. */
int cove_manifest_add_chunk(struct cove_manifest *m, const uint8_t id[32], uint64_t len, int hole);
int cove_mentry_add_xattr(struct cove_mentry *e, const char *name, const void *val, size_t len);

/* Serialise to JSON (caller frees *out). */
int cove_manifest_serialize(const struct cove_manifest *m, char **out, size_t *len,
                            struct cove_err *err);
/* Parse and validate decrypted JSON into m (initialised here; clear it in any case).
 * Errors are BAD_REQUEST / LIMIT with what was wrong and where. */
int cove_manifest_parse(const void *buf, size_t len, struct cove_manifest *m, struct cove_err *err);

const char *cove_ent_type_name(enum cove_ent_type t);

#endif
