/* Per-tenant key hierarchy, first (file-backed) piece: a random 32-byte data key (DEK) per
 * tenant in <keys_dir>/<tenant>.dek (mode 0600, created atomically on first use) and
 * per-purpose subkeys derived from it with HKDF-SHA256. Key material lives in mlock'ed
 * memory and is wiped with OPENSSL_cleanse when freed. Later (BYOK) the DEK file holds a
 * wrapped DEK and cove_dek_load() unwraps it through a key provider; nothing else changes. */
#ifndef COVE_CRYPTO_KEYS_H
#define COVE_CRYPTO_KEYS_H

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

/* One tenant's subkeys. Allocated in locked memory by cove_tenant_keys_open(). */
struct cove_tenant_keys {
        uint8_t chunk_name[COVE_KEY_LEN];   /* HMAC-SHA256 key: chunk ids */
        uint8_t chunk_enc[COVE_KEY_LEN];    /* AES-256-GCM key: chunk objects */
        uint8_t manifest_enc[COVE_KEY_LEN]; /* AES-256-GCM key: manifests */
        int locked;                         /* 1 if mlock succeeded */
};

/* 1 if name is a valid tenant name (also safe as a file and object-name component). */
int cove_tenant_name_valid(const char *name);

/* Load the tenant's DEK into dek. With create, a missing DEK is generated (getrandom),
 * written to a temp file, fsynced and linked into place without replacing a concurrent
 * creator's key (the loser reads the winner's). Errors: NOT_FOUND (no key, !create),
 * INTERNAL (I/O, a key file of the wrong size or mode). The single place where a key
 * provider (BYOK unwrap) will hook in. */
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

#endif
