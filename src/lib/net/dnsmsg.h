/* DNS wire format, only as much as the node resolver needs: read a sandbox's query, read
 * an upstream answer's A records (following its CNAME chain), and write answers built from
 * scratch (nothing an upstream sent is relayed as is). Parsers of untrusted bytes: bounded
 * (names ≤ 255, ≤ 64 compression jumps, every read checked), fuzzed (tests/fuzz/fuzz_dns.c). */
#ifndef COVE_NET_DNSMSG_H
#define COVE_NET_DNSMSG_H

#include <stddef.h>
#include <stdint.h>

#define COVE_DNS_MAX_ADDRS 16
#define COVE_DNS_TYPE_A 1
#define COVE_DNS_TYPE_AAAA 28
#define COVE_DNS_RCODE_NOERROR 0
#define COVE_DNS_RCODE_FORMERR 1
#define COVE_DNS_RCODE_SERVFAIL 2
#define COVE_DNS_RCODE_NXDOMAIN 3
#define COVE_DNS_RCODE_NOTIMP 4
#define COVE_DNS_RCODE_REFUSED 5

struct cove_dns_query {
        uint16_t id;
        uint16_t flags; /* as received (RD is echoed) */
        char name[256]; /* lowercased, no trailing dot; "" for the root */
        uint16_t qtype, qclass;
        size_t qlen;      /* bytes of the question section (echoed in answers) */
        const uint8_t *q; /* the question section inside the caller's buffer */
};

/* 0 ok; -1 not a well-formed single-question standard query (or a name that is not a
 * valid host name). */
int cove_dns_parse_query(const uint8_t *buf, size_t len, struct cove_dns_query *q);

/* Upstream answer to our query `id` for `name`: rcode, the A records of name (after CNAMEs)
 * in addrs (network order, at most COVE_DNS_MAX_ADDRS) and the smallest TTL. 0 ok, -1 bad. */
int cove_dns_parse_answer(const uint8_t *buf, size_t len, uint16_t id, const char *name, int *rcode,
                          uint32_t *addrs, int *naddrs, uint32_t *ttl);

/* Write an answer to q with rcode and A records (network order, all with ttl) into out.
 * Returns its length, or -1 when cap is too small. */
long cove_dns_build_answer(const struct cove_dns_query *q, int rcode, const uint32_t *addrs,
                           int naddrs, uint32_t ttl, uint8_t *out, size_t cap);
/* Write a recursive A query for name with id. Returns its length or -1. */
long cove_dns_build_query(uint16_t id, const char *name, uint8_t *out, size_t cap);

#endif
