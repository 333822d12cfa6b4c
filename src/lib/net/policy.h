/* Egress policy of one sandbox: allow and deny lists of patterns, checked deny before allow.
 * Patterns (lowercase is applied, anything else is refused with COVE_E_BAD_REQUEST):
 *   example.com          that name, any port        example.com:443      that name, port 443
 *   *.example.com        any name under it (not example.com itself), optionally :PORT
 *   10.1.2.0/24          addresses in that range    10.1.2.0/24:5432     … on port 5432
 *   10.1.2.3[:PORT]      one address
 * Name rules match the name a connection announces (TLS SNI, HTTP Host) or a DNS query;
 * address rules match the connection's original destination. A policy is immutable once
 * parsed and shared by reference (cove_policy_ref/unref are thread-safe). */
#ifndef COVE_NET_POLICY_H
#define COVE_NET_POLICY_H

#include <jansson.h>
#include <stdint.h>

#include "util/err.h"

#define COVE_POLICY_MAX_RULES 256
#define COVE_POLICY_PATTERN_MAX 272

enum cove_rule_type { COVE_RULE_NAME, COVE_RULE_WILDCARD, COVE_RULE_CIDR };

struct cove_rule {
        enum cove_rule_type type;
        char name[254];                     /* NAME: the name; WILDCARD: the suffix after "*." */
        uint32_t net, mask;                 /* CIDR, host byte order */
        uint16_t port;                      /* 0: any port */
        char text[COVE_POLICY_PATTERN_MAX]; /* the pattern as normalised, for audit */
};

#define COVE_POLICY_MAX_SECRETS 32
#define COVE_SECRET_NAME_MAX 64 /* names: [A-Za-z_][A-Za-z0-9_]{0,63}, also env names */
#define COVE_SECRET_HOSTS_MAX 32
#define COVE_PLACEHOLDER_LEN 40 /* "cove_ph_" + 32 hex */

/* One credential the proxy may inject for this sandbox (control/secrets.h builds them). The
 * value lives only here, in the gateway's memory, and is wiped when the policy goes. */
struct cove_inject {
        char name[COVE_SECRET_NAME_MAX + 1];
        struct cove_rule hosts[COVE_SECRET_HOSTS_MAX]; /* names and wildcards only */
        int nhosts;
        int placeholder; /* 1: replace the placeholder in the request head; 0: set header */
        char header[65]; /* header mode: the header set (any client copy removed) */
        char *format;    /* header mode: the header value, "{value}" replaced */
        char ph[COVE_PLACEHOLDER_LEN + 1]; /* this sandbox's placeholder token */
        char *value;                       /* the secret (NUL-terminated, no CR/LF/NUL inside) */
        int64_t expires_ms; /* unix ms; 0 = while the policy lists it (a lease: its end) */
        char lease[64];     /* the lease id when injected by a lease, else "" */
};

struct cove_policy {
        int refs;
        int nallow, ndeny;
        struct cove_rule *allow, *deny;
        char (*secrets)[COVE_SECRET_NAME_MAX + 1]; /* names listed by "secrets" */
        int nsecrets;
        struct cove_inject *inj; /* set once before sharing (cove_policy_set_injects) */
        int ninj;
};

enum cove_verdict { COVE_NOMATCH = 0, COVE_ALLOW, COVE_DENY };

/* Parse {"allow":[…], "deny":[…], "secrets":[names]} (any may be absent; other keys refused).
 * NULL or JSON null gives an empty policy (nothing allowed). Returns a policy with one
 * reference, or NULL with err (COVE_E_BAD_REQUEST naming the bad pattern). */
struct cove_policy *cove_policy_parse(json_t *j, struct cove_err *err);
/* Normalised JSON form {"allow":[…],"deny":[…]} (new reference). */
json_t *cove_policy_json(const struct cove_policy *p);
struct cove_policy *cove_policy_ref(struct cove_policy *p);
void cove_policy_unref(struct cove_policy *p);

/* Parse one pattern into r; 0 or -1 with err. */
int cove_rule_parse(const char *pattern, struct cove_rule *r, struct cove_err *err);
/* Lowercase and validate a DNS name (no trailing dot kept); 0 ok, -1 invalid. */
int cove_name_normalise(const char *in, char *out, size_t cap);

/* Verdict for a connection to `name` (may be NULL: address only) at ip:port (host order).
 * Deny rules first (names and addresses), then allow rules. *rule (may be NULL) points at
 * the deciding rule's text, or "" when nothing matched (which callers treat as deny). */
enum cove_verdict cove_policy_check(const struct cove_policy *p, const char *name, uint32_t ip,
                                    uint16_t port, const char **rule);
/* Address-only verdict from address rules alone (no name known yet): ALLOW when an allow
 * address rule matches and no deny address rule does. */
enum cove_verdict cove_policy_check_addr(const struct cove_policy *p, uint32_t ip, uint16_t port,
                                         const char **rule);
/* Could a connection to `name` be allowed on some port? (the DNS resolver's question) */
enum cove_verdict cove_policy_check_dns(const struct cove_policy *p, const char *name,
                                        const char **rule);
/* Does an allow address rule contain ip (any port)? Private answers need one. */
int cove_policy_names_addr(const struct cove_policy *p, uint32_t ip);

/* 1 when name is a valid secret name. */
int cove_secret_name_valid(const char *name);
/* Hand the policy its injections (before it is shared; takes ownership of inj). */
void cove_policy_set_injects(struct cove_policy *p, struct cove_inject *inj, int n);
/* Injections that apply to a TLS connection announcing `name` at unix time now_ms: fills
 * out (up to max) with pointers into p; returns how many. */
int cove_policy_injects_for(const struct cove_policy *p, const char *name, int64_t now_ms,
                            const struct cove_inject **out, int max);
/* Wipe and free an injection array. */
void cove_injects_free(struct cove_inject *inj, int n);

/* Loopback, private, link-local, CGNAT, metadata, multicast, reserved: never a DNS answer
 * unless the policy names the address. */
int cove_addr_is_special(uint32_t ip);

#endif
