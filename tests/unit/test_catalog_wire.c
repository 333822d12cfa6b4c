/* The catalog's rows as JSON (store/catalog_wire.h): every field of every row type survives
 * encode then decode (a field left out of its table comes back zero and fails here); each
 * integer field takes the whole range of its C type and nothing beyond; a refused row leaves
 * the caller's row untouched and the error names the member. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/catalog_wire.h"

#define SET(f, v) snprintf((f), sizeof(f), "%s", (v))
#define HASH "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

/* the row back from its own encoding; texts compared, then the rest byte for byte */
#define ROUNDTRIP(name, T, in, texts)                                                              \
        do {                                                                                       \
                json_t *j_ = cove_wire_##name(&(in));                                              \
                assert_non_null(j_);                                                               \
                T out_;                                                                            \
                memset(&out_, 0, sizeof(out_));                                                    \
                struct cove_err err_ = {0};                                                        \
                if (cove_wire_##name##_from(j_, &out_, &err_) < 0)                                 \
                        fail_msg(#name ": %s", err_.msg);                                          \
                json_decref(j_);                                                                   \
                T *a_ = &(in), *b_ = &out_;                                                        \
                texts;                                                                             \
                assert_memory_equal(a_, b_, sizeof(T));                                            \
        } while (0)
/* a text field: equal strings, then the same pointer so the bytes compare */
#define TEXT_EQ(f)                                                                                 \
        do {                                                                                       \
                assert_string_equal(a_->f, b_->f);                                                 \
                free(b_->f);                                                                       \
                b_->f = a_->f;                                                                     \
        } while (0)

static void every_field_round_trips(void **state)
{
        (void)state;
        struct cove_tenant_row t;
        memset(&t, 0, sizeof(t));
        SET(t.id, "ten_1");
        SET(t.name, "acme");
        t.created_at = 1;
        t.max_sandboxes = 2;
        t.max_cpus = 3;
        t.max_memory_mb = 4;
        t.max_storage_mb = 5;
        t.deleted_at = INT64_MAX;
        ROUNDTRIP(tenant, struct cove_tenant_row, t, );

        struct cove_apikey_row k;
        memset(&k, 0, sizeof(k));
        SET(k.id, "key_1");
        SET(k.tenant, "ten_1");
        SET(k.salt_hex, HASH);
        SET(k.hash_hex, "ff");
        k.admin = 1;
        k.revoked = 1;
        k.created_at = 6;
        ROUNDTRIP(apikey, struct cove_apikey_row, k, );

        struct cove_sandbox_row s;
        memset(&s, 0, sizeof(s));
        SET(s.id, "sbx_1");
        SET(s.tenant, "ten_1");
        SET(s.state, "paused");
        SET(s.template_name, "busybox");
        SET(s.runtime, "vm");
        s.created_at = 7;
        s.expires_at = 8;
        s.cpus = INT32_MAX;
        s.memory_mb = 9;
        s.disk_mb = 10;
        s.timeout_s = 11;
        SET(s.on_timeout, "pause");
        s.uid_base = UINT32_MAX;
        SET(s.node, "n1");
        SET(s.last_snapshot_id, "snap_1");
        s.metadata_json = strdup("{\"a\":\"\xc3\xa9\"}");
        s.env_json = strdup("{\"X\":\"1\"}");
        s.error = strdup("it broke");
        s.snapshot_interval_s = 12;
        s.retention_json = strdup("[]");
        s.storage_encrypted = 1;
        /* recovered_from_json is the control's alone: not on the wire */
        ROUNDTRIP(sandbox, struct cove_sandbox_row, s, TEXT_EQ(metadata_json); TEXT_EQ(env_json);
                  TEXT_EQ(error); TEXT_EQ(retention_json));
        cove_sandbox_row_clear(&s);

        struct cove_snapshot_row n;
        memset(&n, 0, sizeof(n));
        SET(n.id, "snap_1");
        SET(n.tenant, "ten_1");
        SET(n.sandbox_id, "sbx_1");
        SET(n.parent_id, "snap_0");
        SET(n.kind, "full");
        n.created_at = 13;
        SET(n.label, "before");
        n.size_bytes = INT64_MAX;
        n.new_bytes = 14;
        n.pause_us = 15;
        n.rolling = 1;
        ROUNDTRIP(snapshot, struct cove_snapshot_row, n, );

        struct cove_audit_row a;
        memset(&a, 0, sizeof(a));
        a.seq = 16;
        a.at = 17;
        SET(a.tenant, "ten_1");
        SET(a.sandbox, "sbx_1");
        SET(a.kind, "egress");
        SET(a.action, "connect");
        SET(a.verdict, "deny");
        a.detail_json = strdup("{\"host\":\"example.org\"}");
        SET(a.prev_hash, HASH);
        SET(a.hash, HASH);
        ROUNDTRIP(audit, struct cove_audit_row, a, TEXT_EQ(detail_json));
        free(a.detail_json);

        struct cove_node_row d;
        memset(&d, 0, sizeof(d));
        SET(d.name, "n1");
        SET(d.state, "draining");
        d.epoch = 18;
        d.lease_expires_at = 19;
        d.cpus = 20;
        d.memory_mb = 21;
        d.disk_mb = 22;
        d.alloc_cpus = 23;
        d.alloc_memory_mb = 24;
        d.alloc_disk_mb = 25;
        SET(d.address, "https://10.0.0.1:8443");
        d.last_seen = 26;
        SET(d.features, "{\"runtimes\":[\"ns\"]}");
        ROUNDTRIP(node, struct cove_node_row, d, );

        struct cove_placement_row p;
        memset(&p, 0, sizeof(p));
        SET(p.sandbox_id, "sbx_1");
        SET(p.node, "n1");
        p.generation = 27;
        SET(p.desired_state, "running");
        SET(p.observed_state, "paused");
        p.updated_at = 28;
        ROUNDTRIP(placement, struct cove_placement_row, p, );

        struct cove_job_row j;
        memset(&j, 0, sizeof(j));
        j.id = 29;
        SET(j.sandbox_id, "sbx_1");
        SET(j.kind, "resume");
        j.generation = 30;
        SET(j.state, "claimed");
        SET(j.claimed_by, "n1");
        j.claimed_epoch = 31;
        j.result_json = strdup("{\"ok\":true}");
        j.created_at = 32;
        j.updated_at = 33;
        j.args_json = strdup("{\"snapshot\":\"snap_1\"}");
        ROUNDTRIP(job, struct cove_job_row, j, TEXT_EQ(result_json); TEXT_EQ(args_json));
        cove_job_row_clear(&j);
}

/* o with member key set to v (taken); the sandbox decoder's answer, the row untouched on
 * failure */
static int sandbox_with(const char *key, json_t *v, struct cove_sandbox_row *out,
                        struct cove_err *err)
{
        json_t *o = json_pack("{s:s, s:s, s:s}", "id", "sbx_1", "tenant", "t", "state", "running");
        json_object_set_new(o, key, v);
        memset(out, 0x5a, sizeof(*out));
        int rc = cove_wire_sandbox_from(o, out, err);
        json_decref(o);
        return rc;
}

static void integer_fields_take_their_type_range(void **state)
{
        (void)state;
        struct cove_sandbox_row s, untouched;
        memset(&untouched, 0x5a, sizeof(untouched));
        struct cove_err err = {0};
        /* int: up to INT32_MAX; uint32_t: up to UINT32_MAX; never negative */
        assert_int_equal(sandbox_with("cpus", json_integer(INT32_MAX), &s, &err), 0);
        assert_int_equal(s.cpus, INT32_MAX);
        cove_sandbox_row_clear(&s);
        assert_int_equal(sandbox_with("uid_base", json_integer(UINT32_MAX), &s, &err), 0);
        assert_true(s.uid_base == UINT32_MAX);
        cove_sandbox_row_clear(&s);
        const struct {
                const char *key;
                json_int_t v;
        } bad[] = {{"cpus", (json_int_t)INT32_MAX + 1},
                   {"uid_base", (json_int_t)UINT32_MAX + 1},
                   {"created_at", -1},
                   {"timeout_s", -1}};
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                assert_int_equal(sandbox_with(bad[i].key, json_integer(bad[i].v), &s, &err), -1);
                assert_int_equal(err.kind, COVE_E_BAD_REQUEST);
                assert_non_null(strstr(err.msg, bad[i].key));
                assert_memory_equal(&s, &untouched, sizeof(s));
        }
        /* a bool is a JSON boolean, a text a string */
        assert_int_equal(sandbox_with("storage_encrypted", json_integer(1), &s, &err), -1);
        assert_non_null(strstr(err.msg, "storage_encrypted"));
        assert_int_equal(sandbox_with("env_json", json_integer(1), &s, &err), -1);
        assert_non_null(strstr(err.msg, "env_json"));
        assert_memory_equal(&s, &untouched, sizeof(s));
}

static void refused_rows_leave_the_callers_row(void **state)
{
        (void)state;
        struct cove_err err = {0};
        struct cove_sandbox_row s, untouched;
        memset(&untouched, 0x5a, sizeof(untouched));
        /* a decoded text is freed again when a later member is refused (ASan: no leak) */
        json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:i}", "id", "sbx_1", "tenant", "t", "state",
                              "running", "metadata_json", "{}", "retention_json", 5);
        memset(&s, 0x5a, sizeof(s));
        assert_int_equal(cove_wire_sandbox_from(o, &s, &err), -1);
        assert_non_null(strstr(err.msg, "retention_json"));
        assert_memory_equal(&s, &untouched, sizeof(s));
        json_decref(o);
        /* not a sandbox state */
        assert_int_equal(sandbox_with("state", json_string("flying"), &s, &err), -1);
        assert_non_null(strstr(err.msg, "state"));
        assert_memory_equal(&s, &untouched, sizeof(s));
        /* a string one byte too long for its field */
        char id[65];
        memset(id, 'a', 64);
        id[64] = '\0';
        assert_int_equal(sandbox_with("id", json_string(id), &s, &err), -1);
        assert_non_null(strstr(err.msg, "\"id\" is too long"));
        /* an audit event's hashes are 64 hex digits; its detail is freed on refusal */
        struct cove_audit_row a, a0;
        memset(&a0, 0x5a, sizeof(a0));
        memset(&a, 0x5a, sizeof(a));
        o = json_pack("{s:i, s:s, s:s, s:s, s:s}", "seq", 1, "tenant", "t", "prev_hash", HASH,
                      "hash", "00", "detail_json", "{}");
        assert_int_equal(cove_wire_audit_from(o, &a, &err), -1);
        assert_non_null(strstr(err.msg, "hash"));
        assert_memory_equal(&a, &a0, sizeof(a));
        json_decref(o);
        /* not an object; a required member missing */
        o = json_array();
        assert_int_equal(cove_wire_audit_from(o, &a, &err), -1);
        assert_non_null(strstr(err.msg, "is not an object"));
        json_decref(o);
        o = json_pack("{s:s}", "tenant", "t");
        struct cove_job_row j;
        assert_int_equal(cove_wire_job_from(o, &j, &err), -1);
        assert_non_null(strstr(err.msg, "\"id\" is missing"));
        json_decref(o);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(every_field_round_trips),
            cmocka_unit_test(integer_fields_take_their_type_range),
            cmocka_unit_test(refused_rows_leave_the_callers_row),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
