/* Control/node authentication: node tokens derived from the cluster key, signed requests
 * and answers (cluster/nodeauth.h). */
#include "cluster/nodeauth.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "util/cleanup.h"
#include "util/util.h"

int cove_node_name_valid(const char *name)
{
        size_t n = name ? strlen(name) : 0;
        if (n < 1 || n > COVE_NODE_NAME_MAX || name[0] == '-')
                return 0;
        for (size_t i = 0; i < n; i++)
                if (!(islower((unsigned char)name[i]) || isdigit((unsigned char)name[i]) ||
                      name[i] == '-'))
                        return 0;
        return 1;
}

/* HMAC-SHA256 over parts joined by NULs (a NUL between two parts), as hex. The parts are
 * bounded by their callers (header values, paths of a request line). */
static void hmac_parts(const uint8_t *key, size_t key_len, const char *const *parts, size_t n,
                       char out[65])
{
        size_t total = 0;
        for (size_t i = 0; i < n; i++)
                total += strlen(parts[i] ? parts[i] : "") + 1;
        uint8_t *buf = malloc(total), mac[32];
        unsigned mac_len = 0;
        memset(out, 0, 65); /* on failure: never matches a real signature (hex digits) */
        if (!buf)
                return;
        size_t off = 0;
        for (size_t i = 0; i < n; i++) {
                const char *p = parts[i] ? parts[i] : "";
                size_t l = strlen(p);
                memcpy(buf + off, p, l);
                off += l;
                if (i + 1 < n)
                        buf[off++] = 0;
        }
        if (HMAC(EVP_sha256(), key, (int)key_len, buf, off, mac, &mac_len))
                cove_hex(mac, sizeof(mac), out);
        OPENSSL_cleanse(mac, sizeof(mac));
        free(buf);
}

int cove_nodeauth_token(const uint8_t key[COVE_NODEAUTH_KEY_LEN], const char *name,
                        char token[COVE_NODEAUTH_TOKEN_HEX], struct cove_err *err)
{
        if (!cove_node_name_valid(name))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "node name must be 1 to %d of a-z 0-9 - (not starting "
                                     "with -)",
                                     COVE_NODE_NAME_MAX);
        const char *parts[] = {"cove-node-token", name};
        hmac_parts(key, COVE_NODEAUTH_KEY_LEN, parts, 2, token);
        return 0;
}

static int hexval(int c)
{
        return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Whole file; refuses one readable by group or others. */
static int read_secret_file(const char *path, const char *what, char **out, size_t *len,
                            struct cove_err *err)
{
        struct stat st;
        if (stat(path, &st) < 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "%s %s: cannot read it", what,
                                     path);
        if (st.st_mode & 077)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "%s %s is readable by group or others (chmod 600 it)", what,
                                     path);
        if (cove_read_file(path, 4096, out, len, NULL) < 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "%s %s: cannot read it", what,
                                     path);
        return 0;
}

static void strip(char *s, size_t *len)
{
        while (*len && isspace((unsigned char)s[*len - 1]))
                s[--*len] = '\0';
}

static int unhex(const char *s, size_t n, uint8_t *out)
{
        for (size_t i = 0; i < n; i++) {
                int a = hexval(tolower((unsigned char)s[2 * i]));
                int b = hexval(tolower((unsigned char)s[2 * i + 1]));
                if (a < 0 || b < 0)
                        return -1;
                out[i] = (uint8_t)(a << 4 | b);
        }
        return 0;
}

int cove_nodeauth_read_key(const char *path, uint8_t key[COVE_NODEAUTH_KEY_LEN],
                           struct cove_err *err)
{
        char *buf = NULL;
        size_t len = 0;
        if (read_secret_file(path, "cluster key file", &buf, &len, err) < 0)
                return -1;
        int ok = 0;
        if (len == COVE_NODEAUTH_KEY_LEN) { /* raw bytes: whitespace is key material */
                memcpy(key, buf, COVE_NODEAUTH_KEY_LEN);
                ok = 1;
        } else {
                strip(buf, &len);
                ok =
                    len == 2 * COVE_NODEAUTH_KEY_LEN && unhex(buf, COVE_NODEAUTH_KEY_LEN, key) == 0;
        }
        OPENSSL_cleanse(buf, len);
        free(buf);
        if (!ok)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "cluster key file %s must hold 32 bytes or 64 hex digits",
                                     path);
        return 0;
}

int cove_nodeauth_read_token(const char *path, char token[COVE_NODEAUTH_TOKEN_HEX],
                             struct cove_err *err)
{
        char *buf = NULL;
        size_t len = 0;
        if (read_secret_file(path, "node token file", &buf, &len, err) < 0)
                return -1;
        strip(buf, &len);
        uint8_t raw[32];
        int ok = len == 64 && unhex(buf, 32, raw) == 0;
        if (ok)
                cove_hex(raw, 32, token);
        OPENSSL_cleanse(raw, sizeof(raw));
        OPENSSL_cleanse(buf, len);
        free(buf);
        if (!ok)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "node token file %s must hold 64 hex digits (written by "
                                     "`coved node-token`)",
                                     path);
        return 0;
}

static void req_sig(const char *token, const struct cove_nodeauth_req *q, int64_t ts,
                    const char *nonce, char out[65])
{
        char tsb[24];
        snprintf(tsb, sizeof(tsb), "%" PRId64, ts);
        const char *parts[] = {"cove-node-req",
                               q->method,
                               q->path_query,
                               tsb,
                               nonce,
                               q->tenant ? q->tenant : "",
                               q->body_sha256_hex ? q->body_sha256_hex : ""};
        hmac_parts((const uint8_t *)token, strlen(token), parts, 7, out);
}

int cove_nodeauth_sign(const char *token, const char *name, const struct cove_nodeauth_req *q,
                       int64_t now_ms, char *out, size_t cap, char sig[65], struct cove_err *err)
{
        if (!cove_node_name_valid(name))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "invalid node name");
        uint8_t nb[8];
        if (cove_random(nb, sizeof(nb), err) < 0)
                return -1;
        char nonce[17], s[65];
        cove_hex(nb, sizeof(nb), nonce);
        req_sig(token, q, now_ms, nonce, s);
        int n = snprintf(out, cap, "Cove-Node name=%s,ts=%" PRId64 ",nonce=%s,sig=%s", name, now_ms,
                         nonce, s);
        if (n < 0 || (size_t)n >= cap)
                return cove_err_setk(err, COVE_E_INTERNAL, 0, "node auth header too long");
        if (sig)
                memcpy(sig, s, 65);
        return 0;
}

static int bad_hdr(struct cove_err *err)
{
        return cove_err_setk(err, COVE_E_UNAUTHORIZED, 0,
                             "node authentication: malformed Cove-Node authorization");
}

/* Copy the value of "key=" at *p up to ',' or the end into out; hex_only checks it. */
static int take(const char **p, const char *key, char *out, size_t cap, int hex_only)
{
        size_t kl = strlen(key);
        if (strncmp(*p, key, kl) != 0 || (*p)[kl] != '=')
                return -1;
        const char *v = *p + kl + 1, *end = strchr(v, ',');
        size_t n = end ? (size_t)(end - v) : strlen(v);
        if (n == 0 || n >= cap)
                return -1;
        for (size_t i = 0; i < n; i++)
                if (hex_only ? hexval(v[i]) < 0 : !(isalnum((unsigned char)v[i]) || v[i] == '-'))
                        return -1;
        memcpy(out, v, n);
        out[n] = '\0';
        *p = end ? end + 1 : v + n;
        return 0;
}

int cove_nodeauth_parse(const char *a, struct cove_nodeauth_hdr *h, struct cove_err *err)
{
        memset(h, 0, sizeof(*h));
        if (!a || strncmp(a, "Cove-Node ", 10) != 0 || strlen(a) >= COVE_NODEAUTH_HDR_MAX)
                return bad_hdr(err);
        const char *p = a + 10;
        char ts[20];
        if (take(&p, "name", h->name, sizeof(h->name), 0) < 0 ||
            take(&p, "ts", ts, sizeof(ts), 0) < 0 || take(&p, "nonce", h->nonce, 17, 1) < 0 ||
            take(&p, "sig", h->sig, 65, 1) < 0 || *p || strlen(h->nonce) != 16 ||
            strlen(h->sig) != 64 || !cove_node_name_valid(h->name))
                return bad_hdr(err);
        char *end = NULL;
        long long v = strtoll(ts, &end, 10);
        if (!end || *end || v <= 0)
                return bad_hdr(err);
        h->ts = v;
        return 0;
}

int cove_nodeauth_verify(const char *token, const struct cove_nodeauth_hdr *h,
                         const struct cove_nodeauth_req *q, int64_t now_ms, struct cove_err *err)
{
        int64_t skew = now_ms - h->ts;
        if (skew > COVE_NODEAUTH_SKEW_MS || skew < -COVE_NODEAUTH_SKEW_MS)
                return cove_err_setk(err, COVE_E_UNAUTHORIZED, 0,
                                     "node authentication: request time is %" PRId64
                                     " ms off this clock (at most %d allowed)",
                                     skew, COVE_NODEAUTH_SKEW_MS);
        char want[65];
        req_sig(token, q, h->ts, h->nonce, want);
        int ok = CRYPTO_memcmp(want, h->sig, 64) == 0;
        OPENSSL_cleanse(want, sizeof(want));
        if (!ok)
                return cove_err_setk(err, COVE_E_UNAUTHORIZED, 0,
                                     "node authentication: bad signature for node %s", h->name);
        return 0;
}

void cove_nodeauth_answer(const char *token, const char *sig, char out[65])
{
        const char *parts[] = {"cove-node-ans", sig};
        hmac_parts((const uint8_t *)token, strlen(token), parts, 2, out);
}

int cove_nodeauth_answer_check(const char *token, const char *sig, const char *answer,
                               struct cove_err *err)
{
        char want[65];
        cove_nodeauth_answer(token, sig, want);
        int ok = answer && strlen(answer) == 64 && CRYPTO_memcmp(want, answer, 64) == 0;
        if (!ok)
                return cove_err_setk(err, COVE_E_UNAUTHORIZED, 0,
                                     "node authentication: the answer is not signed by the "
                                     "node's token");
        return 0;
}
