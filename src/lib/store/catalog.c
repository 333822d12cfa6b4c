/* Backend-independent catalog helpers: row ownership and the sandbox state vocabulary,
 * shared by the SQLite backend and (later) PostgreSQL. */
#include "store/catalog.h"

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
