/* The catalog database a unit test runs on (tests/unit/test_catalog.c, test_nodes.c): a
 * SQLite file in a directory of its own, or, on PostgreSQL, a database of its own on the
 * server COVE_TEST_PG_URL names (created by catfx_create, dropped by catfx_drop). A test
 * file runs all its tests on SQLite, then again on PostgreSQL when that variable is set
 * (catfx_main). Failures end the test (cmocka fail_msg). */
#ifndef COVE_TEST_CATALOG_FIXTURE_H
#define COVE_TEST_CATALOG_FIXTURE_H

#include "store/catalog.h"

struct catfx {
        char dir[64];
        char path[512]; /* sqlite: file path; pg: URL of this test's own database */
        char dbname[64];
        int pg;
};

/* A fresh database for ops (sqlite or pg) under /tmp/cove-test-<tag>-…; -1 when no
 * directory could be made. */
int catfx_create(struct catfx *db, const struct cove_catalog_ops *ops, const char *tag);
/* Drops the database (pg) and removes the directory. */
void catfx_drop(struct catfx *db);
/* Runs run_all("<name>_sqlite") with *ops the SQLite catalog, then, when COVE_TEST_PG_URL
 * is set, run_all("<name>_postgres") with *ops PostgreSQL's; ORs their results. */
int catfx_main(const char *name, int (*run_all)(const char *group),
               const struct cove_catalog_ops **ops);

#endif
