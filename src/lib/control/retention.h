/* Retention of rolling snapshots: which to keep as they age. A policy is a list of tiers
 * ordered by age: a snapshot younger than tier i's within_s (and older than tier i-1's) is
 * kept if every_s is 0, else only the oldest of each every_s-long bucket of wall time is
 * kept; past the last tier it goes. Pure functions: the clock is a parameter, so the
 * decision is unit-tested with any "now" (tests/unit/test_retention.c). */
#ifndef COVE_CONTROL_RETENTION_H
#define COVE_CONTROL_RETENTION_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

#define COVE_RETENTION_MAX_TIERS 8

struct cove_retention_tier {
        int64_t within_s; /* applies to snapshots younger than this */
        int64_t every_s;  /* 0: keep all; else one per bucket of this length */
};

struct cove_retention {
        struct cove_retention_tier t[COVE_RETENTION_MAX_TIERS];
        int n;
};

/* All for 1 h, one per 10 min for 24 h, one per hour for 7 days (docs/architecture.md §3). */
void cove_retention_default(struct cove_retention *p);
/* Parse and check a policy: NULL or "null" gives the default; otherwise a JSON array of
 * {"within_s": N, "every_s": M} with strictly increasing within_s (1 s .. 10 years),
 * every_s 0 .. within_s, 1..8 tiers. BAD_REQUEST naming the problem. */
int cove_retention_parse(const char *json, struct cove_retention *p, struct cove_err *err);
/* The policy as compact JSON text (caller frees), or NULL on allocation failure. */
char *cove_retention_dump(const struct cove_retention *p);
/* Decide for n snapshots taken at created_ms[] (any order): keep[i] = 1 or 0. A snapshot
 * from the future (clock skew) is kept. Stable as now grows: a bucket keeps its oldest
 * member, which stays the oldest as newer ones join. */
void cove_retention_thin(const struct cove_retention *p, int64_t now_ms, const int64_t *created_ms,
                         size_t n, int *keep);

#endif
