/* Tenants, their API keys, quotas and data keys in the control plane (docs/api.md
 * "Tenants" and "Keys"). Every function answers with errors of the usual kinds; JSON
 * answers are new references. actor is the calling API key id (audit details). */
#ifndef COVE_CONTROL_TENANT_H
#define COVE_CONTROL_TENANT_H

#include <jansson.h>
#include <stddef.h>

#include "control/coved.h"
#include "crypto/keys.h"

/* <data_dir>/keys: key records and the node default KEK (crypto/keys.h). */
void coved_keys_dir(const struct coved *d, char *out, size_t cap);
/* Where key records live, chosen once the catalog is open: with a PostgreSQL catalog (any
 * role) in the catalog's key_records, shared by every process on it, under
 * default_kek_file (required in roles control and node; in role all it defaults to
 * <data>/keys/node.kek, which only that process holds); with SQLite the files in
 * <data>/keys exactly as before (default_kek_file is refused there). */
int coved_keys_open(struct coved *d, const char *default_kek_file, struct cove_err *err);
void coved_keys_close(struct coved *d);
/* The record store over a catalog (for coved_keys_open and `coved migrate`): ctx is a
 * struct coved_keys_cat (control/coved.h). */
extern const struct cove_key_store_ops coved_keys_catalog_ops;
/* The key gate for a tenant: 0 when its data key unwraps (cached within the TTL), else -1
 * with KEY_REVOKED / UNAVAILABLE. Call before anything is changed. */
int coved_key_gate(struct coved *d, const char *tenant, struct cove_err *err);
/* Admission against the tenant's quotas: would adding sandboxes live sandboxes, cpus and
 * memory_mb of running ones and storage_mb of disk exceed one? -1 with COVE_E_LIMIT (which
 * quota, used, limit) if so. Callers serialise with coved_quota_lock. */
int coved_quota_admit(struct coved *d, const char *tenant, int sandboxes, int cpus, int memory_mb,
                      int storage_mb, struct cove_err *err);
void coved_quota_lock(struct coved *d);
/* The at-rest key of sandbox id's writable layer (64 bytes, from the tenant's DEK: label
 * cove/v1/fscrypt/<id>), into out; callers wipe it (OPENSSL_cleanse) after use. Passes the
 * key gate. */
int coved_layer_key(struct coved *d, const char *tenant, const char *sandbox_id, uint8_t *out,
                    struct cove_err *err);
/* The at-rest key of a vm disk (32 bytes, label cove/v1/disk/<disk_id>: disk_id is the
 * sandbox that created the disk's lineage, see cove_instance_spec.disk_key), into out;
 * errors and wiping as coved_layer_key. coved_disk_key_cb is the same as a spec.disk_key
 * callback with a struct coved_disk_key_ctx. */
int coved_disk_key(struct coved *d, const char *tenant, const char *disk_id, uint8_t *out,
                   struct cove_err *err);
struct coved_disk_key_ctx {
        struct coved *d;
        const char *tenant;
};
int coved_disk_key_cb(void *ctx, const char *disk_id, uint8_t key[32], struct cove_err *err);
void coved_quota_unlock(struct coved *d);
/* 1 when tenant holds its own key (BYOK, crypto/keys.h cove_key_tenant_held): its ns
 * sandboxes' writable layers are always encrypted (new ones, and old plain ones from their
 * next resume, rewind or fork on); 0 under the node default key; -1 (UNAVAILABLE) when its
 * key record cannot be read. */
int coved_tenant_byok(struct coved *d, const char *tenant, struct cove_err *err);
/* cove_node_config.layer_key: coved_layer_key() for a tenant's warm pool (arg: the coved). */
int coved_pool_layer_key(void *arg, const char *tenant, const char *sandbox_id, uint8_t *out,
                         struct cove_err *err);

int coved_tenant_create(struct coved *d, const char *actor, json_t *body, json_t **out,
                        struct cove_err *err);
int coved_tenant_list(struct coved *d, json_t **out, struct cove_err *err);
int coved_tenant_get(struct coved *d, const char *id, json_t **out, struct cove_err *err);
int coved_tenant_set_quotas(struct coved *d, const char *actor, const char *id, json_t *body,
                            json_t **out, struct cove_err *err);
/* Refused (CONFLICT) while the tenant has sandboxes; revokes its API keys and data key. */
int coved_tenant_delete(struct coved *d, const char *actor, const char *id, struct cove_err *err);

int coved_apikey_issue(struct coved *d, const char *actor, const char *tenant, json_t *body,
                       json_t **out, struct cove_err *err);
int coved_apikey_list(struct coved *d, const char *tenant, json_t **out, struct cove_err *err);
int coved_apikey_revoke(struct coved *d, const char *actor, const char *tenant, const char *id,
                        struct cove_err *err);

int coved_key_status(struct coved *d, const char *tenant, json_t **out, struct cove_err *err);
int coved_key_list(struct coved *d, json_t **out, struct cove_err *err); /* every tenant */
/* Add a BYOK key (spec in body) or rotate (body's spec optional): rewrap, never re-encrypt. */
int coved_key_rewrap(struct coved *d, const char *actor, const char *tenant, json_t *body,
                     int rotate, json_t **out, struct cove_err *err);
/* Revoke; body {policy: "stop" (default) | "finish"}: stop (and clear the working storage
 * of) the tenant's sandboxes, or let running ones finish (no new snapshots). */
int coved_key_revoke(struct coved *d, const char *actor, const char *tenant, json_t *body,
                     json_t **out, struct cove_err *err);
/* Timer hook: tenants with running sandboxes whose key no longer unwraps (revoked in the
 * KMS) get the stop policy; runs at most every cache TTL. */
void coved_key_sweep(struct coved *d);

#endif
