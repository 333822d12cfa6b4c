/* The audit log (docs/architecture.md, trust rule 5): append-only, hash-chained events in the
 * catalog. Each event: seq, at, tenant, sandbox, kind, action, verdict, detail (a JSON object),
 * prev_hash and hash = hex SHA-256(prev_hash || "\n" || canonical event), where the
 * canonical event is the compact, key-sorted JSON object of the other fields (detail as
 * its stored text). Changing, removing or reordering any stored event breaks the chain
 * from there on, which cove_audit_verify() reports.
 * Writers never block: cove_audit_log() queues the event and one writer thread appends
 * queued events in batches (so the egress proxy never waits for a disk). Names of
 * secrets may appear in details, never values. */
#ifndef COVE_CONTROL_AUDIT_H
#define COVE_CONTROL_AUDIT_H

#include <jansson.h>
#include <stdint.h>

#include "store/catalog.h"
#include "util/err.h"
#include "util/log.h"

#define COVE_AUDIT_QUEUE_MAX 65536 /* queued events beyond this are dropped and counted */

struct cove_audit;

/* Read the chain's head and start the writer thread. */
struct cove_audit *cove_audit_open(const struct cove_catalog_ops *ops, struct cove_catalog *cat,
                                   const struct cove_log *log, struct cove_err *err);
/* Write what is queued, stop the writer. */
void cove_audit_close(struct cove_audit *a);

/* Queue one event (at = now). detail is handed over (may be NULL: {}). Thread-safe. */
void cove_audit_log(struct cove_audit *a, const char *tenant, const char *sandbox, const char *kind,
                    const char *action, const char *verdict, json_t *detail);
/* Wait until every event queued before the call is stored (or dropped). */
void cove_audit_flush(struct cove_audit *a);
/* Events dropped because the queue was full or the catalog refused them. */
uint64_t cove_audit_dropped(struct cove_audit *a);

/* hash of row given prev_hash (row->hash is ignored): 65 bytes of hex into out. */
void cove_audit_hash(const struct cove_audit_row *row, const char *prev_hash, char out[65]);
/* The event as the API shows it (new reference). */
json_t *cove_audit_json(const struct cove_audit_row *row);

/* Recompute the whole chain. 0 with *checked events and *first_bad = 0 when intact, or
 * the seq of the first event whose link is broken (why says how); -1 on a catalog error. */
int cove_audit_verify(const struct cove_catalog_ops *ops, struct cove_catalog *cat,
                      int64_t *checked, int64_t *first_bad, char *why, size_t cap,
                      struct cove_err *err);

#endif
