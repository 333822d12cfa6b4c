/* Per-tenant key hierarchy (docs/security.md "Keys"): a random 32-byte data key (DEK) per
 * tenant, stored only wrapped by the tenant's key-encryption key (KEK) in a key record
 * <keys_dir>/<tenant>.key, and per-purpose subkeys derived from the DEK with HKDF-SHA256.
 *
 * KEKs live behind key providers (struct cove_key_provider_ops): "local" (a 32-byte key
 * file; the node default KEK <keys_dir>/node.kek when the tenant brought none) and
 * "command" (external wrap/unwrap programs, docs/security.md "command provider protocol").
 * Unwrapped DEKs exist only in this process's memory (mlock'ed, MADV_DONTDUMP, wiped with
 * OPENSSL_cleanse), in a cache with a bound: an entry is re-unwrapped through its provider
 * once it is older than the cache TTL (cove_keys_cache_ttl_set), so a revocation inside an
 * external KMS takes effect within the TTL; a revocation through cove (cove_key_revoke)
 * takes effect at once, and a record changed by another process is noticed on the next
 * check (its inode, size, mtime and ctime are compared on every use).
 *
 * Every path that needs a tenant's key goes through cove_key_check() (directly, or through
 * cove_dek_load()/cove_tenant_keys_open(), which call it): the one place where revocation
 * is enforced. Errors: COVE_E_KEY_REVOKED (revoked, or the provider refused: wrong KEK,
 * tampered record, a KMS that reports the key disabled), COVE_E_UNAVAILABLE (the provider
 * failed: timeout, crash, garbage output), COVE_E_INTERNAL (I/O, corrupt record). */
#ifndef COVE_CRYPTO_KEYS_H
#define COVE_CRYPTO_KEYS_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

#define COVE_KEY_LEN 32
#define COVE_TENANT_MAX 63 /* tenant names: 1..63 of [A-Za-z0-9_-] */

/* HKDF "info" labels of the subkeys (docs/storage.md). */
#define COVE_KEY_INFO_CHUNK_NAME "cove/v1/chunk-name"
#define COVE_KEY_INFO_CHUNK_ENC "cove/v1/chunk-enc"
#define COVE_KEY_INFO_MANIFEST_ENC "cove/v1/manifest-enc"
#define COVE_KEY_INFO_SECRETS "cove/v1/secrets" /* AES-256-GCM key: egress secrets */
#define COVE_KEY_INFO_DISK "cove/v1/disk"       /* vm disks (LUKS), per sandbox below */
#define COVE_KEY_INFO_FSCRYPT "cove/v1/fscrypt" /* ns writable layers, per sandbox below */
#define COVE_KEY_INFO_CHECK "cove/v1/key-check" /* record's check value (not a key) */

/* One tenant's subkeys. Allocated in locked memory by cove_tenant_keys_open(). */
struct cove_tenant_keys {
        uint8_t chunk_name[COVE_KEY_LEN];   /* HMAC-SHA256 key: chunk ids */
        uint8_t chunk_enc[COVE_KEY_LEN];    /* AES-256-GCM key: chunk objects */
        uint8_t manifest_enc[COVE_KEY_LEN]; /* AES-256-GCM key: manifests */
        uint8_t disk[COVE_KEY_LEN];         /* base of per-sandbox disk keys */
        uint8_t fscrypt[COVE_KEY_LEN];      /* base of per-sandbox fscrypt keys */
        int locked;                         /* 1 if mlock succeeded */
};

/* 1 if name is a valid tenant name (also safe as a file and object-name component). */
int cove_tenant_name_valid(const char *name);

/* Load the tenant's DEK into dek (through the cache and cove_key_check). With create, a
 * tenant without a key record gets a fresh DEK wrapped under the node default KEK (record
 * linked into place without replacing a concurrent creator's). A legacy plain
 * <tenant>.dek file is migrated on first use (wrapped, recorded, then removed). Errors:
 * NOT_FOUND (no key, !create), KEY_REVOKED, UNAVAILABLE, INTERNAL (see above). */
int cove_dek_load(const char *keys_dir, const char *tenant, int create, uint8_t dek[COVE_KEY_LEN],
                  struct cove_err *err);

/* HKDF-SHA256 (RFC 5869, empty salt) of ikm with the given info label into out. */
int cove_hkdf_sha256(const uint8_t *ikm, size_t ikm_len, const char *info, uint8_t *out,
                     size_t out_len, struct cove_err *err);

/* Load (creating if needed) the tenant's DEK and derive its subkeys. The DEK itself is
 * wiped before return. Caller frees with cove_tenant_keys_free(). */
int cove_tenant_keys_open(const char *keys_dir, const char *tenant, struct cove_tenant_keys **out,
                          struct cove_err *err);
void cove_tenant_keys_free(struct cove_tenant_keys *k); /* wipes, munlocks, frees; NULL ok */

/* The key of one sandbox's disk: HKDF(k->disk, "cove/v1/disk/" + sandbox_id). For vm
 * disks (LUKS passphrase material). */
int cove_disk_key_derive(const struct cove_tenant_keys *k, const char *sandbox_id,
                         uint8_t out[COVE_KEY_LEN], struct cove_err *err);
/* The fscrypt master key of one sandbox's ns writable layer (64 bytes: fscrypt v2 wants
 * at least that much for AES-256-XTS): HKDF(k->fscrypt, "cove/v1/fscrypt/" + id). */
#define COVE_FSCRYPT_KEY_LEN 64
int cove_fscrypt_key_derive(const struct cove_tenant_keys *k, const char *sandbox_id,
                            uint8_t out[COVE_FSCRYPT_KEY_LEN], struct cove_err *err);

/* ---- key records and providers ---- */

#define COVE_KEY_CMD_MAX 1024     /* wrap/unwrap command lines */
#define COVE_KEY_WRAPPED_MAX 4096 /* base64 of a wrapped DEK */
#define COVE_KEY_CMD_TIMEOUT_MS 10000
#define COVE_KEY_CMD_OUT_MAX 8192     /* bytes a provider command may print */
#define COVE_KEY_CMD_REVOKED_STATUS 3 /* exit status: "the KMS refuses: key revoked/disabled" */

/* A tenant's key record (<keys_dir>/<tenant>.key, JSON, 0600, replaced atomically). */
struct cove_key_record {
        char tenant[COVE_TENANT_MAX + 1];
        char provider[16]; /* "local" or "command" */
        char key_id[128];  /* which KEK: "node:<fp>", "local:<fp>", or the command's id */
        int version;       /* 1 at creation, +1 per rewrap (add, rotate) */
        char state[16];    /* "active" or "revoked" */
        char wrapped[COVE_KEY_WRAPPED_MAX]; /* base64 of the provider's wrapped DEK */
        char check[33];          /* hex of HMAC(DEK, COVE_KEY_INFO_CHECK)[0..16): unwrap verified */
        char key_file[PATH_MAX]; /* local: the KEK file; "" = node default */
        char wrap_cmd[COVE_KEY_CMD_MAX]; /* command: run with /bin/sh -c */
        char unwrap_cmd[COVE_KEY_CMD_MAX];
        int timeout_ms;                             /* command: bounded wait (0: default) */
        int64_t created_at, rotated_at, revoked_at; /* unix ms; 0 = never */
        int64_t gen; /* record store: generation read (not part of the record); files: 0 */
};

/* A provider wraps and unwraps a DEK under the KEK the record names. wrapped is base64
 * text (NUL-terminated, < cap). Both fail closed: no partial output on error. */
struct cove_key_provider_ops {
        const char *name;
        int (*wrap)(const char *keys_dir, const struct cove_key_record *rec,
                    const uint8_t dek[COVE_KEY_LEN], char *wrapped, size_t cap,
                    struct cove_err *err);
        int (*unwrap)(const char *keys_dir, const struct cove_key_record *rec, const char *wrapped,
                      uint8_t dek[COVE_KEY_LEN], struct cove_err *err);
        /* The record's key_id for this KEK (called when a record is (re)wrapped). */
        int (*key_id)(const char *keys_dir, const struct cove_key_record *rec, char *out,
                      size_t cap, struct cove_err *err);
};
extern const struct cove_key_provider_ops cove_key_provider_local;
extern const struct cove_key_provider_ops cove_key_provider_command;
const struct cove_key_provider_ops *cove_key_provider(const char *name); /* NULL: unknown */

/* What a new KEK is: provider "local" (key_file; NULL/"" = node default) or "command"
 * (wrap_cmd, unwrap_cmd; key_id optional, default "command"). */
struct cove_key_spec {
        const char *provider;
        const char *key_file;
        const char *wrap_cmd;
        const char *unwrap_cmd;
        const char *key_id;
        int timeout_ms;
};

/* Status as the API shows it (no key material, no command lines' output). */
struct cove_key_status {
        struct cove_key_record rec; /* wrapped and check are cleared */
        int exists;                 /* 0: no record yet (the tenant never used a key) */
        int cached;                 /* an unwrapped DEK is in this process's cache */
        int64_t cached_at;          /* unix ms of that unwrap */
        int64_t cache_ttl_ms;
};

/* Rewrap the tenant's DEK under a new KEK (add a BYOK key, or rotate: spec NULL keeps the
 * provider and its settings, re-wrapping under its current key version). The DEK is
 * unwrapped with the current record, wrapped with the new KEK, unwrapped again with it to
 * prove the round trip, and only then the record is replaced (version + 1): data is never
 * re-encrypted. A tenant without a record first gets one (node default). */
int cove_key_rewrap(const char *keys_dir, const char *tenant, const struct cove_key_spec *spec,
                    struct cove_key_status *out, struct cove_err *err);
/* Mark the tenant's key revoked (record replaced atomically; irreversible through cove) and
 * drop its cached DEK. 0 revoked now, 1 was already revoked, -1 error (NOT_FOUND: no record:
 * a record is created revoked, so a tenant that never stored data is locked too). */
int cove_key_revoke(const char *keys_dir, const char *tenant, struct cove_key_status *out,
                    struct cove_err *err);
/* The record's status (no unwrap). 0 (out->exists says whether there is a record). */
int cove_key_status_get(const char *keys_dir, const char *tenant, struct cove_key_status *out,
                        struct cove_err *err);
/* The gate: 0 when the tenant's DEK is unwrapped and cached within the TTL (unwrapping
 * now if needed, creating the record when create), else -1 (KEY_REVOKED, NOT_FOUND, …). */
int cove_key_check(const char *keys_dir, const char *tenant, int create, struct cove_err *err);

/* Cache bound: an unwrapped DEK is used for at most ttl_ms after its unwrap, then unwrapped
 * again through its provider (0: no caching, every use unwraps). Default 60000. */
void cove_keys_cache_ttl_set(int64_t ttl_ms);
int64_t cove_keys_cache_ttl(void);
/* Wipe every cached DEK (tests, shutdown). */
void cove_keys_cache_clear(void);

/* 1 when the tenant's data key is wrapped by a key of its own (BYOK: provider "command",
 * or "local" with a key file), 0 under the node default KEK or without a record, -1 when
 * the record cannot be read. A revoked own key still answers 1. */
int cove_key_tenant_held(const char *keys_dir, const char *tenant, struct cove_err *err);

/* ---- where records live ----
 * By default a record is the file <keys_dir>/<tenant>.key and the node default KEK is
 * <keys_dir>/node.kek (created on first use). A cluster shares records through a record
 * store (the catalog: control/tenant.c) attached to keys_dir: every process reads and
 * writes the same records, a write is a compare-and-set on the record's generation (so a
 * revocation is never lost to a concurrent rotation), and every use of a cached DEK
 * compares the generation, so a revocation through any process is seen by all of them at
 * their next use. default_kek_file (NULL/"": <keys_dir>/node.kek) is then the same 32-byte
 * file on every process: it is read, never created. A record that still exists only as a
 * file in keys_dir is imported into the store on first use (wrapped again under the
 * default KEK when it was under node.kek). */
struct cove_key_store_ops {
        /* 0 with *json (malloc'd record JSON, caller wipes and frees) and *gen; 1 none. */
        int (*get)(void *ctx, const char *tenant, char **json, int64_t *gen, struct cove_err *err);
        /* expect_gen 0: insert only; else replace the record at that generation. CONFLICT
         * when the record exists (insert) or moved on (replace). Fills *gen. */
        int (*put)(void *ctx, const char *tenant, const char *json, int64_t expect_gen,
                   int64_t *gen, struct cove_err *err);
};
/* ops NULL: files, with only the default KEK overridden. Replaces an earlier attach. */
int cove_keys_attach(const char *keys_dir, const struct cove_key_store_ops *ops, void *ctx,
                     const char *default_kek_file, struct cove_err *err);
void cove_keys_detach(const char *keys_dir);
/* The default KEK's path for keys_dir into path: 1 configured by attach, 0 node.kek. */
int cove_keys_default_kek(const char *keys_dir, char *path, size_t cap);
/* 1 when keys_dir's records are in a record store. */
int cove_keys_shared(const char *keys_dir);
/* 0 when path is a usable KEK file (0600, 32 raw bytes or 64 hex digits). */
int cove_kek_file_check(const char *path, struct cove_err *err);
/* Copy the file record of tenant from from_dir into to_dir's records (attach a store to
 * to_dir first). A record under from_dir's default KEK is unwrapped with it (its
 * node.kek, or the default configured for from_dir) and wrapped again under to_dir's;
 * BYOK records (a key file, a command) are copied as they are. Idempotent: a record with
 * the same data key already there is left alone. 0 (*how: 0 copied, 1 re-wrapped, 2
 * already there), 1 no file record, -1 (CONFLICT: another data key is there). */
int cove_key_import(const char *from_dir, const char *to_dir, const char *tenant, int *how,
                    struct cove_err *err);

/* Record I/O (exposed for tests and tools). parse: 0 ok, -1 malformed (INTERNAL). */
int cove_key_record_read(const char *keys_dir, const char *tenant, struct cove_key_record *rec,
                         struct cove_err *err); /* 1: no record */
int cove_key_record_write(const char *keys_dir, const struct cove_key_record *rec, int create,
                          struct cove_err *err); /* create: never replaces (CONFLICT) */

#endif
