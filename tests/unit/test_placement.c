/* Placement decisions (control/placement.h) on node rows: every filter, the ordering by
 * free capacity, deterministic ties, the preferred and avoided node, the starts cap, the
 * best-of-K sample, and the reason given when nothing fits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "control/placement.h"

#define NOW 1000000
#define FEAT_NS                                                                                    \
        "{\"runtimes\":[\"ns\"],\"full\":\"ok\",\"criu\":\"4.1.1\",\"kernel\":\"6.1.0\","          \
        "\"cpu\":\"Xeon\",\"templates\":[\"busybox\",\"base\"]}"

static struct cove_node_row node(const char *name, int64_t cpus, int64_t mem, int64_t disk,
                                 int64_t acpus, int64_t amem, int64_t adisk)
{
        struct cove_node_row r;
        memset(&r, 0, sizeof(r));
        snprintf(r.name, sizeof(r.name), "%s", name);
        snprintf(r.state, sizeof(r.state), "ready");
        r.epoch = 1;
        r.lease_expires_at = NOW + 5000;
        r.last_seen = NOW - 1000;
        r.cpus = cpus;
        r.memory_mb = mem;
        r.disk_mb = disk;
        r.alloc_cpus = acpus;
        r.alloc_memory_mb = amem;
        r.alloc_disk_mb = adisk;
        snprintf(r.features, sizeof(r.features), "%s", FEAT_NS);
        return r;
}

static struct coved_place_want want(void)
{
        struct coved_place_want w = {.runtime = "ns",
                                     .template_name = "busybox",
                                     .cpus = 1,
                                     .memory_mb = 512,
                                     .disk_mb = 1024};
        return w;
}

static int place(const struct cove_node_row *rows, size_t n, const int *starts, int k,
                 const struct coved_place_want *w, char out[64], char *why, size_t cap)
{
        return coved_place_rows(rows, n, starts, NOW, k, 4, 42, w, out, why, cap);
}

static void most_free_capacity_wins(void **state)
{
        struct cove_node_row rows[] = {node("a", 8, 16384, 100000, 6, 4096, 1000),
                                       node("b", 8, 16384, 100000, 2, 4096, 1000),
                                       node("c", 8, 16384, 100000, 2, 14000, 1000)};
        struct coved_place_want w = want();
        char out[64], why[512] = "";
        assert_int_equal(place(rows, 3, NULL, 3, &w, out, why, sizeof(why)), 0);
        assert_string_equal(out, "b"); /* a is short of cpus, c of memory: b's tightest is best */
        rows[1].alloc_disk_mb = 95000; /* now b's disk is its tightest resource, below a's cpus */
        assert_int_equal(place(rows, 3, NULL, 3, &w, out, why, sizeof(why)), 0);
        assert_string_equal(out, "a");
        rows[1].alloc_disk_mb = 99000; /* 1000 MB free: b no longer fits */
        assert_int_equal(place(rows, 3, NULL, 3, &w, out, why, sizeof(why)), 0);
        assert_string_equal(out, "a");
}

static void ties_go_to_the_smaller_name(void **state)
{
        struct cove_node_row rows[] = {node("n2", 4, 8192, 50000, 0, 0, 0),
                                       node("n1", 4, 8192, 50000, 0, 0, 0),
                                       node("n3", 4, 8192, 50000, 0, 0, 0)};
        struct coved_place_want w = want();
        char out[64], why[256];
        for (uint64_t seed = 0; seed < 20; seed++) {
                assert_int_equal(
                    coved_place_rows(rows, 3, NULL, NOW, 3, 4, seed, &w, out, why, sizeof(why)), 0);
                assert_string_equal(out, "n1");
        }
}

static void only_ready_nodes_with_a_live_lease(void **state)
{
        struct cove_node_row rows[] = {
            node("cord", 8, 16384, 100000, 0, 0, 0), node("drain", 8, 16384, 100000, 0, 0, 0),
            node("lost", 8, 16384, 100000, 0, 0, 0), node("stale", 8, 16384, 100000, 0, 0, 0),
            node("z-ok", 1, 1024, 2000, 0, 0, 0)};
        snprintf(rows[0].state, sizeof(rows[0].state), "cordoned");
        snprintf(rows[1].state, sizeof(rows[1].state), "draining");
        snprintf(rows[2].state, sizeof(rows[2].state), "lost");
        rows[3].lease_expires_at = NOW - 1;
        struct coved_place_want w = want();
        char out[64], why[512] = "";
        assert_int_equal(place(rows, 5, NULL, 5, &w, out, why, sizeof(why)), 0);
        assert_string_equal(out, "z-ok"); /* the only eligible one, though the smallest */
        rows[4].lease_expires_at = NOW;   /* expiring now is expired */
        assert_int_equal(place(rows, 5, NULL, 5, &w, out, why, sizeof(why)), 1);
        assert_non_null(strstr(why, "cord: cordoned"));
        assert_non_null(strstr(why, "drain: draining"));
        assert_non_null(strstr(why, "lost: lost"));
        assert_non_null(strstr(why, "stale: lease expired"));
        assert_non_null(strstr(why, "z-ok: lease expired 0 ms ago"));
}

static void never_the_avoided_node(void **state)
{
        struct cove_node_row rows[] = {node("a", 8, 16384, 100000, 0, 0, 0),
                                       node("b", 2, 2048, 5000, 1, 1024, 1000)};
        struct coved_place_want w = want();
        w.avoid = "a";
        char out[64], why[256] = "";
        assert_int_equal(place(rows, 2, NULL, 3, &w, out, why, sizeof(why)), 0);
        assert_string_equal(out, "b");
        w.prefer = "a"; /* preferring it does not override avoiding it */
        assert_int_equal(place(rows, 2, NULL, 3, &w, out, why, sizeof(why)), 0);
        assert_string_equal(out, "b");
        rows[1].alloc_cpus = 2;
        assert_int_equal(place(rows, 2, NULL, 3, &w, out, why, sizeof(why)), 1);
        assert_non_null(strstr(why, "a: the node being left"));
}

static void the_preferred_node_when_it_fits(void **state)
{
        struct cove_node_row rows[] = {node("big", 16, 65536, 500000, 0, 0, 0),
                                       node("holder", 2, 2048, 5000, 1, 1024, 1000)};
        struct coved_place_want w = want();
        w.prefer = "holder";
        char out[64], why[256] = "";
        assert_int_equal(place(rows, 2, NULL, 3, &w, out, why, sizeof(why)), 0);
        assert_string_equal(out, "holder");
        w.memory_mb = 2000; /* it no longer fits: the best other one */
        assert_int_equal(place(rows, 2, NULL, 3, &w, out, why, sizeof(why)), 0);
        assert_string_equal(out, "big");
        w.prefer = "gone"; /* an unknown preferred node changes nothing */
        assert_int_equal(place(rows, 2, NULL, 3, &w, out, why, sizeof(why)), 0);
        assert_string_equal(out, "big");
}

static void runtime_and_template_filter(void **state)
{
        struct cove_node_row rows[] = {node("a", 8, 16384, 100000, 0, 0, 0),
                                       node("b", 4, 8192, 50000, 0, 0, 0)};
        snprintf(rows[1].features, sizeof(rows[1].features), "%s",
                 "{\"runtimes\":[\"ns\",\"vm\"],\"full\":\"ok\",\"templates\":[\"py\"]}");
        struct coved_place_want w = want();
        w.runtime = "vm";
        w.template_name = "py";
        char out[64], why[512] = "";
        assert_int_equal(place(rows, 2, NULL, 3, &w, out, why, sizeof(why)), 0);
        assert_string_equal(out, "b");
        w.template_name = "busybox";
        assert_int_equal(place(rows, 2, NULL, 3, &w, out, why, sizeof(why)), 1);
        assert_non_null(strstr(why, "a: no runtime vm"));
        assert_non_null(strstr(why, "b: template busybox not built there"));
        w.runtime = NULL; /* any runtime */
        assert_int_equal(place(rows, 2, NULL, 3, &w, out, why, sizeof(why)), 0);
        assert_string_equal(out, "a");
}

static void a_node_without_features_takes_nothing(void **state)
{
        struct cove_node_row rows[] = {node("a", 8, 16384, 100000, 0, 0, 0),
                                       node("b", 8, 16384, 100000, 0, 0, 0)};
        snprintf(rows[0].features, sizeof(rows[0].features), "{}");
        snprintf(rows[1].features, sizeof(rows[1].features), "not json");
        struct coved_place_want w = want();
        char out[64], why[512] = "";
        assert_int_equal(place(rows, 2, NULL, 3, &w, out, why, sizeof(why)), 1);
        assert_non_null(strstr(why, "a: no runtime ns"));
        assert_non_null(strstr(why, "b: announced no features"));
}

static void full_snapshots_need_a_compatible_node(void **state)
{
        struct cove_node_row rows[] = {node("a", 8, 16384, 100000, 0, 0, 0),
                                       node("b", 8, 16384, 100000, 1, 0, 0),
                                       node("c", 8, 16384, 100000, 2, 0, 0)};
        /* a: no CRIU; b: another kernel; c: the same as the source */
        snprintf(rows[0].features, sizeof(rows[0].features), "%s",
                 "{\"runtimes\":[\"ns\"],\"full\":\"criu check failed\","
                 "\"templates\":[\"busybox\"]}");
        snprintf(rows[1].features, sizeof(rows[1].features), "%s",
                 "{\"runtimes\":[\"ns\"],\"full\":\"ok\",\"criu\":\"4.1.1\",\"kernel\":\"6.12.0\","
                 "\"cpu\":\"Xeon\",\"templates\":[\"busybox\"]}");
        struct coved_place_want w = want();
        w.need_full = 1;
        w.full_from = FEAT_NS;
        char out[64], why[512] = "";
        assert_int_equal(place(rows, 3, NULL, 3, &w, out, why, sizeof(why)), 0);
        assert_string_equal(out, "c"); /* the busiest of the three, the only compatible one */
        snprintf(rows[2].features, sizeof(rows[2].features), "%s",
                 "{\"runtimes\":[\"ns\"],\"full\":\"ok\",\"criu\":\"4.0\",\"kernel\":\"6.1.0\","
                 "\"cpu\":\"Xeon\",\"templates\":[\"busybox\"]}");
        assert_int_equal(place(rows, 3, NULL, 3, &w, out, why, sizeof(why)), 1);
        assert_non_null(strstr(why, "a: no full snapshots (criu check failed)"));
        assert_non_null(
            strstr(why, "b: full snapshot needs kernel \"6.1.0\", node has \"6.12.0\""));
        assert_non_null(strstr(why, "c: full snapshot needs criu \"4.1.1\", node has \"4.0\""));
        w.full_from = NULL; /* source unknown: any node with full snapshots */
        assert_int_equal(place(rows, 3, NULL, 3, &w, out, why, sizeof(why)), 0);
        assert_string_equal(out, "b");
        w.need_full = 0; /* files only: the emptiest */
        assert_int_equal(place(rows, 3, NULL, 3, &w, out, why, sizeof(why)), 0);
        assert_string_equal(out, "a");
}

static void starts_in_flight_are_capped(void **state)
{
        struct cove_node_row rows[] = {node("a", 8, 16384, 100000, 0, 0, 0),
                                       node("b", 4, 8192, 50000, 0, 0, 0)};
        struct coved_place_want w = want();
        int starts[] = {4, 3};
        char out[64], why[256] = "";
        assert_int_equal(place(rows, 2, starts, 3, &w, out, why, sizeof(why)), 0);
        assert_string_equal(out, "b");
        starts[1] = 4;
        assert_int_equal(place(rows, 2, starts, 3, &w, out, why, sizeof(why)), 1);
        assert_non_null(strstr(why, "a: 4 starts in flight (cap 4)"));
        /* no cap */
        assert_int_equal(coved_place_rows(rows, 2, starts, NOW, 3, 0, 1, &w, out, why, sizeof(why)),
                         0);
        assert_string_equal(out, "a");
}

static void not_enough_room_says_how_much(void **state)
{
        struct cove_node_row rows[] = {node("a", 2, 1024, 4000, 2, 512, 0)};
        struct coved_place_want w = want();
        char out[64], why[256] = "";
        assert_int_equal(place(rows, 1, NULL, 3, &w, out, why, sizeof(why)), 1);
        assert_string_equal(
            why, "no node can take it: a: free 0 cpus, 512 MB memory, 4000 MB disk; needs 1, 512, "
                 "1024");
        assert_int_equal(place(rows, 0, NULL, 3, &w, out, why, sizeof(why)), 1);
        assert_string_equal(why, "no node can take it: no nodes are registered");
}

static void best_of_k_samples_k_nodes(void **state)
{
        struct cove_node_row rows[] = {
            node("a", 8, 16384, 100000, 0, 0, 0), node("b", 8, 16384, 100000, 1, 0, 0),
            node("c", 8, 16384, 100000, 2, 0, 0), node("d", 8, 16384, 100000, 3, 0, 0)};
        snprintf(rows[3].state, sizeof(rows[3].state), "cordoned");
        struct coved_place_want w = want();
        int seen[4] = {0};
        char out[64], why[256];
        for (uint64_t seed = 0; seed < 200; seed++) {
                assert_int_equal(
                    coved_place_rows(rows, 4, NULL, NOW, 1, 4, seed, &w, out, why, sizeof(why)), 0);
                seen[out[0] - 'a']++;
                char again[64];
                coved_place_rows(rows, 4, NULL, NOW, 1, 4, seed, &w, again, why, sizeof(why));
                assert_string_equal(out, again); /* one seed, one answer */
        }
        /* k = 1: any eligible node, never the cordoned one */
        assert_true(seen[0] > 0 && seen[1] > 0 && seen[2] > 0);
        assert_int_equal(seen[3], 0);
        /* k = 2: the emptiest (a) wins unless the sample left it out; c is the worst and is
         * never the best of two */
        memset(seen, 0, sizeof(seen));
        for (uint64_t seed = 0; seed < 200; seed++) {
                coved_place_rows(rows, 4, NULL, NOW, 2, 4, seed, &w, out, why, sizeof(why));
                seen[out[0] - 'a']++;
        }
        assert_true(seen[0] > seen[1] && seen[1] > 0);
        assert_int_equal(seen[2], 0);
        assert_int_equal(seen[3], 0);
}

static void the_reason_is_bounded(void **state)
{
        struct cove_node_row rows[60];
        for (int i = 0; i < 60; i++) {
                char name[16];
                snprintf(name, sizeof(name), "node-%02d", i);
                rows[i] = node(name, 1, 128, 128, 1, 0, 0);
        }
        struct coved_place_want w = want();
        char out[64], why[200];
        memset(why, 'x', sizeof(why));
        assert_int_equal(place(rows, 60, NULL, 3, &w, out, why, sizeof(why)), 1);
        size_t len = strnlen(why, sizeof(why));
        assert_true(len < sizeof(why));
        assert_string_equal(why + len - 3, "…");
}

int main(void)
{
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(most_free_capacity_wins),
            cmocka_unit_test(ties_go_to_the_smaller_name),
            cmocka_unit_test(only_ready_nodes_with_a_live_lease),
            cmocka_unit_test(never_the_avoided_node),
            cmocka_unit_test(the_preferred_node_when_it_fits),
            cmocka_unit_test(runtime_and_template_filter),
            cmocka_unit_test(a_node_without_features_takes_nothing),
            cmocka_unit_test(full_snapshots_need_a_compatible_node),
            cmocka_unit_test(starts_in_flight_are_capped),
            cmocka_unit_test(not_enough_room_says_how_much),
            cmocka_unit_test(best_of_k_samples_k_nodes),
            cmocka_unit_test(the_reason_is_bounded),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
