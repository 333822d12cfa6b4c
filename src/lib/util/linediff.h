/* Line diffs of two texts in the unified format (`diff -u`), for snapshot diffs: Myers'
 * O(ND) algorithm after trimming the common head and tail, bounded in edit distance (past
 * COVE_LINEDIFF_MAX_D the changed middle is shown as removed, then added: still a correct
 * diff, only not a minimal one) and in output size. Pure logic, no I/O. */
#ifndef COVE_UTIL_LINEDIFF_H
#define COVE_UTIL_LINEDIFF_H

#include <stddef.h>

#include "util/err.h"

#define COVE_LINEDIFF_MAX_D 2000 /* edits searched for a minimal script (memory ~ D^2 ints) */

/* The unified diff of a (alen bytes) and b, with headers "--- name_a" and "+++ name_b" and
 * context lines of context, into *out (NUL-terminated, caller frees; "" and *outlen 0 when
 * the texts are equal). A last line without a newline is marked as diff marks it. LIMIT
 * when the diff would exceed max_out bytes (nothing returned); ENOMEM otherwise. */
int cove_linediff(const char *a, size_t alen, const char *b, size_t blen, const char *name_a,
                  const char *name_b, unsigned context, size_t max_out, char **out, size_t *outlen,
                  struct cove_err *err);

#endif
