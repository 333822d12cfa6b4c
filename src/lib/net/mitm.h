/* TLS interception material of the egress proxy (OpenSSL 3): the per-node CA, leaf
 * certificates minted per host name and cached, and the two SSL_CTXs of an intercepted
 * connection.
 *   - CA: an EC P-256 key and a self-signed certificate under <dir>/ (ca.key 0600,
 *     ca.pem 0644), created once, atomically (written to temp files, fsynced, linked into
 *     place; a concurrent creator's CA wins and is read back).
 *   - Leaves: one EC key made at open; per name a certificate (CN and SAN DNS:name, random
 *     serial, valid from a day ago for 30 days) signed by the CA, cached (at most
 *     COVE_MITM_CACHE names, the oldest replaced).
 *   - Client side (toward the sandbox): TLS 1.2+, ALPN answers only "http/1.1".
 *   - Upstream side: TLS 1.2+, peer verification required against the system store plus
 *     an optional extra CA file, host name checked, ALPN offers only "http/1.1".
 * Not thread-safe: the gateway thread alone mints and uses it. */
#ifndef COVE_NET_MITM_H
#define COVE_NET_MITM_H

#include <openssl/ssl.h>

#include "util/err.h"

#define COVE_MITM_CACHE 1024

struct cove_mitm;

/* dir: where the CA lives (created 0700); extra_ca: a PEM file the upstream may chain to
 * besides the system store (NULL: none). */
struct cove_mitm *cove_mitm_open(const char *dir, const char *extra_ca, struct cove_err *err);
void cove_mitm_free(struct cove_mitm *m);
/* The CA certificate, PEM (owned by m). */
const char *cove_mitm_ca_pem(const struct cove_mitm *m);
/* A server SSL for the sandbox side presenting a leaf for name, or NULL. */
SSL *cove_mitm_client_ssl(struct cove_mitm *m, const char *name);
/* A client SSL for the upstream side: SNI name, verification of name required. */
SSL *cove_mitm_upstream_ssl(struct cove_mitm *m, const char *name);

#endif
