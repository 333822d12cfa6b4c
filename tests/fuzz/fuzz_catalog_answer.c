/* libFuzzer target: what a control replica answers a node's catalog call
 * (store/catalog_remote.c) is untrusted. The input is taken as the answer to every op in
 * turn; each op must fail or fill rows whose strings end within their fields, whose state
 * is a sandbox state and whose owned texts are set (metadata, env) — never read or write
 * outside them, never leak. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "store/catalog_remote.h"

#define FITS(f) (strnlen((f), sizeof(f)) < sizeof(f))

static int sbx(const struct cove_sandbox_row *r, void *a)
{
        (void)a;
        if (!FITS(r->id) || !FITS(r->tenant) || !FITS(r->node) || !r->metadata_json ||
            !r->env_json || !cove_sandbox_state_valid(r->state, strlen(r->state)))
                abort();
        return 0;
}
static int ten(const struct cove_tenant_row *r, void *a)
{
        (void)a;
        if (!FITS(r->id) || !FITS(r->name))
                abort();
        return 0;
}
static int key(const struct cove_apikey_row *r, void *a)
{
        (void)a;
        if (!FITS(r->id) || !FITS(r->hash_hex))
                abort();
        return 0;
}
static int snap(const struct cove_snapshot_row *r, void *a)
{
        (void)a;
        if (!FITS(r->id) || !FITS(r->label) || !FITS(r->kind))
                abort();
        return 0;
}
static int aud(const struct cove_audit_row *r, void *a)
{
        (void)a;
        if (!FITS(r->hash) || !FITS(r->verdict) || r->seq < 1)
                abort();
        return 0;
}
static int doc(const char *t, const char *k, const char *o, const char *j, void *a)
{
        (void)a;
        if (!t || !k || !o || !j || strlen(t) >= 64 || strlen(k) >= 128)
                abort();
        return 0;
}
static int node(const struct cove_node_row *r, void *a)
{
        (void)a;
        if (!FITS(r->name) || !FITS(r->address))
                abort();
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        struct cove_catalog *c = cove_catalog_remote_canned((const char *)data, size);
        if (!c)
                return 0;
        const struct cove_catalog_ops *R = &cove_catalog_remote;
        struct cove_err err;
        struct cove_sandbox_row s = {0};
        if (R->sandbox_get(c, NULL, "s", &s, &err) == 0) {
                sbx(&s, NULL);
                cove_sandbox_row_clear(&s);
        }
        R->sandbox_list(c, NULL, NULL, sbx, NULL, &err);
        struct cove_tenant_row t;
        if (R->tenant_get(c, "t", &t, &err) == 0)
                ten(&t, NULL);
        R->tenant_list(c, ten, NULL, &err);
        struct cove_apikey_row k;
        if (R->apikey_get(c, "k", &k, &err) == 0)
                key(&k, NULL);
        R->apikey_list(c, "t", key, NULL, &err);
        struct cove_snapshot_row sn;
        if (R->snapshot_get(c, NULL, "x", &sn, &err) == 0)
                snap(&sn, NULL);
        R->snapshot_list(c, NULL, NULL, snap, NULL, &err);
        R->audit_list(c, NULL, NULL, NULL, 0, 0, 0, aud, NULL, &err);
        int64_t seq, e, x;
        char hash[65];
        if (R->audit_last(c, &seq, hash, &err) == 0 && strnlen(hash, 65) >= 65)
                abort();
        char *json = NULL;
        if (R->egress_get(c, "s", &json, &err) == 0 && !json)
                abort();
        free(json);
        json = NULL;
        if (R->doc_get(c, "lease", "t", "k", &json, &err) == 0 && !json)
                abort();
        free(json);
        R->doc_list(c, "lease", NULL, NULL, doc, NULL, &err);
        R->node_list(c, node, NULL, &err);
        struct cove_node_row n = {.name = "n1"};
        R->node_lease_acquire(c, &n, 1000, &e, &x, &err);
        R->node_lease_renew(c, "n1", 1, 1000, &x, &err);
        struct cove_placement_row p;
        if (R->placement_get(c, "s", &p, &err) == 0 && (!FITS(p.node) || !FITS(p.sandbox_id)))
                abort();
        struct cove_job_row j = {0};
        if (R->job_claim(c, "n1", 1, &j, &err) == 0 && (!FITS(j.kind) || !FITS(j.sandbox_id)))
                abort();
        cove_job_row_clear(&j);
        if (R->job_get(c, 1, &j, &err) == 0 && !FITS(j.claimed_by))
                abort();
        cove_job_row_clear(&j);
        int v;
        R->schema_version(c, &v, &err);
        R->sandbox_update(c, &s, &err);
        R->sandbox_update_fenced(c, &s, "n1", 1, 1, &err);
        R->wait_wakeup(c, "n1", 0, &err);
        R->close(c);
        return 0;
}
