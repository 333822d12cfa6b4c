/* Backend-independent catalog helpers: row ownership, the sandbox and node state
 * vocabularies, and the choice of backend from a --db value. */
#include "store/catalog.h"
#include "store/catalog_schema.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const sandbox_states[] = {"starting", "running", "pausing", "paused",
                                             "resuming", "stopped", "error"};

void cove_sandbox_row_clear(struct cove_sandbox_row *row)
{
        if (!row)
                return;
        free(row->metadata_json);
        free(row->env_json);
        free(row->error);
        free(row->retention_json);
        free(row->recovered_from_json);
        row->recovered_from_json = NULL;
        row->retention_json = NULL;
        row->metadata_json = NULL;
        row->env_json = NULL;
        row->error = NULL;
}

int cove_sandbox_state_valid(const char *state, size_t len)
{
        for (size_t i = 0; i < sizeof(sandbox_states) / sizeof(sandbox_states[0]); i++)
                if (strlen(sandbox_states[i]) == len && memcmp(sandbox_states[i], state, len) == 0)
                        return 1;
        return 0;
}

int cove_observe_valid(const char *sandbox_id, const char *observed, const char *desired,
                       struct cove_err *err)
{
        if (!observed || !cove_sandbox_state_valid(observed, strlen(observed)))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog: observe %s: unknown state", sandbox_id);
        if (desired && strcmp(desired, "paused") != 0 && strcmp(desired, "stopped") != 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog: observe %s: a node may settle a sandbox paused or "
                                     "stopped only",
                                     sandbox_id);
        return 0;
}

int cove_node_state_valid(const char *s)
{
        static const char *const states[] = {"ready", "cordoned", "draining", "lost"};
        for (size_t i = 0; s && i < sizeof(states) / sizeof(states[0]); i++)
                if (strcmp(states[i], s) == 0)
                        return 1;
        return 0;
}

void cove_job_row_clear(struct cove_job_row *row)
{
        if (!row)
                return;
        free(row->result_json);
        row->result_json = NULL;
        free(row->args_json);
        row->args_json = NULL;
}

const struct cove_catalog_ops *cove_catalog_for(const char *dsn)
{
        if (dsn && (strncmp(dsn, "postgres://", 11) == 0 || strncmp(dsn, "postgresql://", 13) == 0))
                return &cove_catalog_pg;
        return &cove_catalog_sqlite;
}

/* postgres://user:secret@host/db → postgres://user:***@host/db; also a password=… query
 * parameter. Anything that is not a URL is copied as is (a file path has no secret). */
void cove_catalog_dsn_redact(const char *dsn, char *out, size_t cap)
{
        if (!cap)
                return;
        out[0] = '\0';
        if (!dsn)
                return;
        const char *scheme = strstr(dsn, "://");
        if (!scheme) {
                snprintf(out, cap, "%s", dsn);
                return;
        }
        const char *auth = scheme + 3;
        const char *end = auth + strcspn(auth, "/?#");
        const char *at = NULL;
        for (const char *p = auth; p < end; p++)
                if (*p == '@')
                        at = p; /* the last '@' ends the userinfo */
        const char *colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
        size_t o = 0;
        const char *p = dsn;
#define EMIT(from, to)                                                                             \
        do {                                                                                       \
                for (const char *q = (from); q < (to) && o + 1 < cap; q++)                         \
                        out[o++] = *q;                                                             \
        } while (0)
        static const char stars[] = "***";
        if (colon) {
                EMIT(p, colon + 1);
                EMIT(stars, stars + 3);
                p = at;
        }
        /* the query part: password=VALUE → password=*** */
        const char *rest = p;
        const char *pw;
        while ((pw = strstr(rest < end ? end : rest, "password=")) != NULL) {
                EMIT(rest, pw + 9);
                EMIT(stars, stars + 3);
                rest = pw + 9 + strcspn(pw + 9, "&#");
        }
        EMIT(rest, rest + strlen(rest));
#undef EMIT
        out[o] = '\0';
}

static int field_ok(const char *f, size_t cap)
{
        return strnlen(f, cap) < cap;
}

int cove__sandbox_check(const struct cove_sandbox_row *s, struct cove_err *err, const char *op)
{
        if (!field_ok(s->id, sizeof(s->id)) || !s->id[0])
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog: %s sandbox: id missing or too long", op);
        if (!field_ok(s->tenant, sizeof(s->tenant)) || !s->tenant[0] ||
            !field_ok(s->state, sizeof(s->state)) ||
            !field_ok(s->template_name, sizeof(s->template_name)) ||
            !field_ok(s->runtime, sizeof(s->runtime)) ||
            !field_ok(s->on_timeout, sizeof(s->on_timeout)) ||
            !field_ok(s->node, sizeof(s->node)) ||
            !field_ok(s->last_snapshot_id, sizeof(s->last_snapshot_id)))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog: %s sandbox %s: a field is missing or too long", op,
                                     s->id);
        /* States are checked here rather than by a CHECK constraint so that adding a state
         * is a code change, not a table rebuild. */
        if (!cove_sandbox_state_valid(s->state, strlen(s->state)))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog: %s sandbox %s: unknown state \"%s\"", op, s->id,
                                     s->state);
        if (strcmp(s->on_timeout, "kill") != 0 && strcmp(s->on_timeout, "pause") != 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog: %s sandbox %s: on_timeout must be kill or pause", op,
                                     s->id);
        return 0;
}

/* Turn "running, paused,bogus" into ",running,paused," keeping only known states. Returns
 * 0 with *any = 1 when no filter applies (NULL or no tokens), 0 otherwise, -1 too long. An
 * all-unknown list yields "" (matches nothing). */
int cove__states_filter(const char *states, char *out, size_t cap, int *any)
{
        *any = 1;
        out[0] = '\0';
        if (!states)
                return 0;
        size_t n = 0;
        int tokens = 0;
        const char *p = states;
        while (*p) {
                while (*p == ' ' || *p == '\t')
                        p++;
                const char *start = p;
                while (*p && *p != ',')
                        p++;
                const char *end = p;
                while (end > start && (end[-1] == ' ' || end[-1] == '\t'))
                        end--;
                if (*p == ',')
                        p++;
                size_t len = (size_t)(end - start);
                if (len == 0)
                        continue;
                tokens++;
                if (!cove_sandbox_state_valid(start, len))
                        continue;
                if (n + len + 2 >= cap)
                        return -1;
                if (n == 0)
                        out[n++] = ',';
                memcpy(out + n, start, len);
                n += len;
                out[n++] = ',';
                out[n] = '\0';
        }
        *any = tokens == 0;
        return 0;
}

int cove__kinds_filter(const char *kinds, char *out, size_t cap)
{
        size_t o = 0;
        if (cap < 2)
                return -1;
        out[o++] = ',';
        for (const char *p = kinds ? kinds : ""; *p;) {
                p += strspn(p, " ,");
                size_t n = strcspn(p, " ,");
                if (!n)
                        break;
                if (o + n + 2 > cap)
                        return -1;
                memcpy(out + o, p, n);
                o += n;
                out[o++] = ',';
                p += n;
        }
        out[o] = '\0';
        return 0;
}
