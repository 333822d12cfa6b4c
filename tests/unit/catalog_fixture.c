/* The catalog database of a unit test, on SQLite or PostgreSQL (catalog_fixture.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "catalog_fixture.h"
#include "util/util.h"

static const char *pg_url; /* COVE_TEST_PG_URL: the server's maintenance database */
static int db_counter;

/* pg_url with its database name replaced by db */
static void url_with_db(const char *db, char *out, size_t cap)
{
        const char *auth = strstr(pg_url, "://") + 3;
        const char *slash = strchr(auth, '/');
        const char *q = strchr(auth, '?');
        size_t base = slash ? (size_t)(slash - pg_url) : q ? (size_t)(q - pg_url) : strlen(pg_url);
        snprintf(out, cap, "%.*s/%s%s", (int)base, pg_url, db, q ? q : "");
}

static void pg_admin(const char *sql)
{
        PGconn *conn = PQconnectdb(pg_url);
        if (PQstatus(conn) != CONNECTION_OK)
                fail_msg("connect %s: %s", pg_url, PQerrorMessage(conn));
        PGresult *res = PQexec(conn, sql);
        if (PQresultStatus(res) != PGRES_COMMAND_OK)
                fail_msg("%s: %s", sql, PQerrorMessage(conn));
        PQclear(res);
        PQfinish(conn);
}

int catfx_create(struct catfx *db, const struct cove_catalog_ops *ops, const char *tag)
{
        memset(db, 0, sizeof(*db));
        snprintf(db->dir, sizeof(db->dir), "/tmp/cove-test-%s-XXXXXX", tag);
        if (!mkdtemp(db->dir))
                return -1;
        if (ops == &cove_catalog_pg) {
                db->pg = 1;
                snprintf(db->dbname, sizeof(db->dbname), "cove_%s_%d_%d", tag, (int)getpid(),
                         ++db_counter);
                char sql[128];
                snprintf(sql, sizeof(sql), "CREATE DATABASE %s", db->dbname);
                pg_admin(sql);
                url_with_db(db->dbname, db->path, sizeof(db->path));
        } else {
                snprintf(db->path, sizeof(db->path), "%s/catalog.db", db->dir);
        }
        return 0;
}

void catfx_drop(struct catfx *db)
{
        if (db->pg) {
                char sql[128];
                snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS %s WITH (FORCE)", db->dbname);
                pg_admin(sql);
        }
        cove_rm_rf(db->dir, NULL);
}

int catfx_main(const char *name, int (*run_all)(const char *group),
               const struct cove_catalog_ops **ops)
{
        char group[64];
        snprintf(group, sizeof(group), "%s_sqlite", name);
        *ops = &cove_catalog_sqlite;
        int r = run_all(group);
        pg_url = getenv("COVE_TEST_PG_URL");
        if (pg_url && *pg_url) {
                *ops = &cove_catalog_pg;
                snprintf(group, sizeof(group), "%s_postgres", name);
                r |= run_all(group);
        }
        return r;
}
