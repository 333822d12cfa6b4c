/* Egress policy parsing and matching; see policy.h. Pure code (no I/O), unit-tested in
 * tests/unit/test_policy.c. */
#include "net/policy.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cove_name_normalise(const char *in, char *out, size_t cap)
{
        size_t n = strlen(in);
        if (n && in[n - 1] == '.')
                n--;
        if (n == 0 || n > 253 || n >= cap)
                return -1;
        size_t label = 0;
        for (size_t i = 0; i < n; i++) {
                char c = (char)tolower((unsigned char)in[i]);
                if (c == '.') {
                        if (label == 0 || out[i - 1] == '-')
                                return -1;
                        label = 0;
                } else if (isalnum((unsigned char)c) || c == '-' || c == '_') {
                        if (c == '-' && label == 0)
                                return -1;
                        if (++label > 63)
                                return -1;
                } else {
                        return -1;
                }
                out[i] = c;
        }
        if (label == 0 || out[n - 1] == '-')
                return -1;
        out[n] = '\0';
        return 0;
}

static int parse_port(const char *s, uint16_t *port)
{
        if (!*s || strlen(s) > 5)
                return -1;
        unsigned v = 0;
        for (const char *p = s; *p; p++) {
                if (!isdigit((unsigned char)*p))
                        return -1;
                v = v * 10 + (unsigned)(*p - '0');
        }
        if (v == 0 || v > 65535 || (s[0] == '0'))
                return -1;
        *port = (uint16_t)v;
        return 0;
}

static int parse_ipv4(const char *s, uint32_t *ip)
{
        struct in_addr a;
        if (inet_pton(AF_INET, s, &a) != 1)
                return -1;
        *ip = ntohl(a.s_addr);
        return 0;
}

int cove_rule_parse(const char *pattern, struct cove_rule *r, struct cove_err *err)
{
        memset(r, 0, sizeof(*r));
        size_t len = strlen(pattern);
        if (len == 0 || len >= 262)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "egress pattern \"%.64s\" must be 1 to 261 bytes", pattern);
        char buf[262];
        memcpy(buf, pattern, len + 1);
        /* a port is the part after the last ':' (no IPv6 patterns: sandboxes have no v6) */
        char *colon = strrchr(buf, ':');
        if (colon) {
                *colon = '\0';
                if (parse_port(colon + 1, &r->port) < 0)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "egress pattern \"%.64s\": port must be 1 to 65535",
                                             pattern);
        }
        char *slash = strchr(buf, '/');
        uint32_t ip;
        if (slash || (isdigit((unsigned char)buf[0]) && parse_ipv4(buf, &ip) == 0)) {
                unsigned bits = 32;
                if (slash) {
                        *slash = '\0';
                        const char *b = slash + 1;
                        if (!*b || strlen(b) > 2 || !isdigit((unsigned char)b[0]) ||
                            (b[1] && !isdigit((unsigned char)b[1])))
                                goto bad_cidr;
                        bits = (unsigned)atoi(b);
                        if (bits > 32)
                                goto bad_cidr;
                }
                if (parse_ipv4(buf, &ip) < 0)
                        goto bad_cidr;
                r->type = COVE_RULE_CIDR;
                r->mask = bits ? 0xffffffffu << (32 - bits) : 0;
                if (ip & ~r->mask)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "egress pattern \"%.64s\": address has bits set "
                                             "beyond the /%u prefix",
                                             pattern, bits);
                r->net = ip;
                char a[INET_ADDRSTRLEN];
                struct in_addr ia = {.s_addr = htonl(ip)};
                inet_ntop(AF_INET, &ia, a, sizeof(a));
                snprintf(r->text, sizeof(r->text), "%s/%u", a, bits);
        } else {
                const char *name = buf;
                if (strncmp(buf, "*.", 2) == 0) {
                        r->type = COVE_RULE_WILDCARD;
                        name = buf + 2;
                } else {
                        r->type = COVE_RULE_NAME;
                }
                if (cove_name_normalise(name, r->name, sizeof(r->name)) < 0 || strchr(r->name, '*'))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "egress pattern \"%.64s\" is not a valid name, "
                                             "*.name, address or CIDR (with optional :PORT)",
                                             pattern);
                snprintf(r->text, sizeof(r->text), "%s%s",
                         r->type == COVE_RULE_WILDCARD ? "*." : "", r->name);
        }
        if (r->port) {
                size_t l = strlen(r->text);
                snprintf(r->text + l, sizeof(r->text) - l, ":%u", r->port);
        }
        return 0;
bad_cidr:
        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                             "egress pattern \"%.64s\" is not a valid IPv4 address or CIDR",
                             pattern);
}

static int parse_list(json_t *j, const char *key, struct cove_rule **out, int *n,
                      struct cove_err *err)
{
        json_t *a = json_object_get(j, key);
        *out = NULL;
        *n = 0;
        if (!a || json_is_null(a))
                return 0;
        if (!json_is_array(a))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "egress.%s must be an array of strings", key);
        size_t k = json_array_size(a);
        if (k > COVE_POLICY_MAX_RULES)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "egress.%s has more than %d patterns", key,
                                     COVE_POLICY_MAX_RULES);
        if (k == 0)
                return 0;
        *out = calloc(k, sizeof(**out));
        if (!*out)
                return cove_err_set(err, ENOMEM, "egress policy");
        for (size_t i = 0; i < k; i++) {
                json_t *v = json_array_get(a, i);
                if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "egress.%s[%zu] must be a string", key, i);
                if (cove_rule_parse(json_string_value(v), &(*out)[i], err) < 0)
                        return cove_err_wrap(err, "egress.%s[%zu]", key, i);
                (*n)++;
        }
        return 0;
}

int cove_secret_name_valid(const char *name)
{
        size_t n = strlen(name);
        if (n == 0 || n > COVE_SECRET_NAME_MAX || isdigit((unsigned char)name[0]))
                return 0;
        for (size_t i = 0; i < n; i++)
                if (!isalnum((unsigned char)name[i]) && name[i] != '_')
                        return 0;
        return 1;
}

static int parse_secrets(json_t *j, struct cove_policy *p, struct cove_err *err)
{
        json_t *a = json_object_get(j, "secrets");
        if (!a || json_is_null(a))
                return 0;
        size_t k = json_array_size(a);
        if (!json_is_array(a) || k > COVE_POLICY_MAX_SECRETS)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "egress.secrets must be an array of at most %d secret names",
                                     COVE_POLICY_MAX_SECRETS);
        if (!k)
                return 0;
        p->secrets = calloc(k, sizeof(*p->secrets));
        if (!p->secrets)
                return cove_err_set(err, ENOMEM, "egress policy");
        for (size_t i = 0; i < k; i++) {
                const char *s = json_string_value(json_array_get(a, i));
                if (!s || !cove_secret_name_valid(s))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "egress.secrets[%zu] must be a secret name "
                                             "([A-Za-z_][A-Za-z0-9_]*, at most %d characters)",
                                             i, COVE_SECRET_NAME_MAX);
                int dup = 0;
                for (int m = 0; m < p->nsecrets; m++)
                        dup |= !strcmp(p->secrets[m], s);
                if (!dup)
                        snprintf(p->secrets[p->nsecrets++], sizeof(p->secrets[0]), "%s", s);
        }
        return 0;
}

struct cove_policy *cove_policy_parse(json_t *j, struct cove_err *err)
{
        struct cove_policy *p = calloc(1, sizeof(*p));
        if (!p) {
                cove_err_set(err, ENOMEM, "egress policy");
                return NULL;
        }
        p->refs = 1;
        if (!j || json_is_null(j))
                return p;
        if (!json_is_object(j)) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                              "egress must be an object {\"allow\":[…], \"deny\":[…]}");
                goto fail;
        }
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v)
        {
                if (strcmp(k, "allow") && strcmp(k, "deny") && strcmp(k, "secrets")) {
                        cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                      "egress: unknown field \"%.64s\" (allow, deny, secrets)", k);
                        goto fail;
                }
        }
        if (parse_list(j, "allow", &p->allow, &p->nallow, err) < 0 ||
            parse_list(j, "deny", &p->deny, &p->ndeny, err) < 0 || parse_secrets(j, p, err) < 0)
                goto fail;
        return p;
fail:
        p->refs = 1;
        cove_policy_unref(p);
        return NULL;
}

json_t *cove_policy_json(const struct cove_policy *p)
{
        json_t *a = json_array(), *d = json_array();
        for (int i = 0; p && i < p->nallow; i++)
                json_array_append_new(a, json_string(p->allow[i].text));
        for (int i = 0; p && i < p->ndeny; i++)
                json_array_append_new(d, json_string(p->deny[i].text));
        json_t *o = json_pack("{s:o, s:o}", "allow", a, "deny", d);
        if (p && p->nsecrets) {
                json_t *sa = json_array();
                for (int i = 0; i < p->nsecrets; i++)
                        json_array_append_new(sa, json_string(p->secrets[i]));
                json_object_set_new(o, "secrets", sa);
        }
        return o;
}

void cove_injects_free(struct cove_inject *inj, int n)
{
        for (int i = 0; inj && i < n; i++) {
                if (inj[i].value) {
                        OPENSSL_cleanse(inj[i].value, strlen(inj[i].value));
                        free(inj[i].value);
                }
                free(inj[i].format);
        }
        if (inj)
                OPENSSL_cleanse(inj, (size_t)n * sizeof(*inj));
        free(inj);
}

void cove_policy_set_injects(struct cove_policy *p, struct cove_inject *inj, int n)
{
        cove_injects_free(p->inj, p->ninj);
        p->inj = inj;
        p->ninj = n;
}

struct cove_policy *cove_policy_ref(struct cove_policy *p)
{
        if (p)
                __atomic_add_fetch(&p->refs, 1, __ATOMIC_RELAXED);
        return p;
}

void cove_policy_unref(struct cove_policy *p)
{
        if (!p || __atomic_sub_fetch(&p->refs, 1, __ATOMIC_ACQ_REL) != 0)
                return;
        free(p->allow);
        free(p->deny);
        free(p->secrets);
        cove_injects_free(p->inj, p->ninj);
        free(p);
}

/* name matches a wildcard suffix when it ends with ".suffix" */
static int name_match(const struct cove_rule *r, const char *name)
{
        if (r->type == COVE_RULE_NAME)
                return strcmp(r->name, name) == 0;
        size_t n = strlen(name), s = strlen(r->name);
        return n > s + 1 && name[n - s - 1] == '.' && strcmp(name + n - s, r->name) == 0;
}

static int rule_match(const struct cove_rule *r, const char *name, uint32_t ip, uint16_t port,
                      int any_port)
{
        if (!any_port && r->port && r->port != port)
                return 0;
        if (r->type == COVE_RULE_CIDR)
                return (ip & r->mask) == r->net;
        return name && name_match(r, name);
}

enum cove_verdict cove_policy_check(const struct cove_policy *p, const char *name, uint32_t ip,
                                    uint16_t port, const char **rule)
{
        if (rule)
                *rule = "";
        for (int i = 0; i < p->ndeny; i++)
                if (rule_match(&p->deny[i], name, ip, port, 0)) {
                        if (rule)
                                *rule = p->deny[i].text;
                        return COVE_DENY;
                }
        for (int i = 0; i < p->nallow; i++)
                if (rule_match(&p->allow[i], name, ip, port, 0)) {
                        if (rule)
                                *rule = p->allow[i].text;
                        return COVE_ALLOW;
                }
        return COVE_NOMATCH;
}

enum cove_verdict cove_policy_check_addr(const struct cove_policy *p, uint32_t ip, uint16_t port,
                                         const char **rule)
{
        return cove_policy_check(p, NULL, ip, port, rule);
}

enum cove_verdict cove_policy_check_dns(const struct cove_policy *p, const char *name,
                                        const char **rule)
{
        if (rule)
                *rule = "";
        /* only a deny rule for every port denies the name outright; one for a single port
         * leaves the others possible */
        for (int i = 0; i < p->ndeny; i++)
                if (p->deny[i].type != COVE_RULE_CIDR && !p->deny[i].port &&
                    name_match(&p->deny[i], name)) {
                        if (rule)
                                *rule = p->deny[i].text;
                        return COVE_DENY;
                }
        for (int i = 0; i < p->nallow; i++)
                if (p->allow[i].type != COVE_RULE_CIDR && name_match(&p->allow[i], name)) {
                        if (rule)
                                *rule = p->allow[i].text;
                        return COVE_ALLOW;
                }
        return COVE_NOMATCH;
}

int cove_policy_injects_for(const struct cove_policy *p, const char *name, int64_t now_ms,
                            const struct cove_inject **out, int max)
{
        int n = 0;
        for (int i = 0; p && name && i < p->ninj && n < max; i++) {
                const struct cove_inject *in = &p->inj[i];
                if (in->expires_ms && in->expires_ms <= now_ms)
                        continue;
                for (int h = 0; h < in->nhosts; h++)
                        if (name_match(&in->hosts[h], name)) {
                                out[n++] = in;
                                break;
                        }
        }
        return n;
}

int cove_policy_names_addr(const struct cove_policy *p, uint32_t ip)
{
        for (int i = 0; i < p->ndeny; i++)
                if (p->deny[i].type == COVE_RULE_CIDR && !p->deny[i].port &&
                    (ip & p->deny[i].mask) == p->deny[i].net)
                        return 0;
        for (int i = 0; i < p->nallow; i++)
                if (p->allow[i].type == COVE_RULE_CIDR &&
                    (ip & p->allow[i].mask) == p->allow[i].net)
                        return 1;
        return 0;
}

int cove_addr_is_special(uint32_t ip)
{
        static const struct {
                uint32_t net;
                int bits;
        } r[] = {
            {0x00000000, 8},  /* "this" network */
            {0x0a000000, 8},  /* 10/8 */
            {0x64400000, 10}, /* 100.64/10 CGNAT (also some clouds' metadata) */
            {0x7f000000, 8},  /* loopback */
            {0xa9fe0000, 16}, /* link-local, 169.254.169.254 metadata */
            {0xac100000, 12}, /* 172.16/12 */
            {0xc0000000, 24}, /* 192.0.0/24 IETF */
            {0xc0a80000, 16}, /* 192.168/16 */
            {0xc6120000, 15}, /* 198.18/15 benchmarking */
            {0xe0000000, 4},  /* multicast */
            {0xf0000000, 4},  /* reserved, broadcast */
        };
        for (size_t i = 0; i < sizeof(r) / sizeof(r[0]); i++) {
                uint32_t m = 0xffffffffu << (32 - r[i].bits);
                if ((ip & m) == r[i].net)
                        return 1;
        }
        return 0;
}
