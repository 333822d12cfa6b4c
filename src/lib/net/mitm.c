/* TLS interception material; see mitm.h. */
#include "net/mitm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/util.h"

struct leaf {
        char name[254];
        X509 *cert;
};

struct cove_mitm {
        EVP_PKEY *ca_key, *leaf_key;
        X509 *ca;
        char *ca_pem;
        SSL_CTX *srv, *cli;
        struct leaf *cache;
        int ncache, next;
};

static EVP_PKEY *ec_key(void)
{
        return EVP_EC_gen("P-256");
}

static int set_serial(X509 *x)
{
        unsigned char b[16];
        if (RAND_bytes(b, sizeof(b)) != 1)
                return -1;
        b[0] &= 0x7f;
        BIGNUM *bn = BN_bin2bn(b, sizeof(b), NULL);
        int ok = bn && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)) != NULL;
        BN_free(bn);
        return ok ? 0 : -1;
}

static int add_ext(X509 *cert, X509 *issuer, int nid, const char *value)
{
        X509V3_CTX ctx;
        X509V3_set_ctx_nodb(&ctx);
        X509V3_set_ctx(&ctx, issuer, cert, NULL, NULL, 0);
        X509_EXTENSION *ex = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
        if (!ex)
                return -1;
        int ok = X509_add_ext(cert, ex, -1);
        X509_EXTENSION_free(ex);
        return ok ? 0 : -1;
}

static X509 *make_ca(EVP_PKEY *key)
{
        X509 *x = X509_new();
        X509_NAME *n = X509_NAME_new();
        int ok = x && n && X509_set_version(x, 2) && set_serial(x) == 0 &&
                 X509_gmtime_adj(X509_getm_notBefore(x), -86400) &&
                 X509_gmtime_adj(X509_getm_notAfter(x), 10L * 365 * 86400) &&
                 X509_NAME_add_entry_by_txt(n, "O", MBSTRING_ASC, (const unsigned char *)"cove", -1,
                                            -1, 0) &&
                 X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC,
                                            (const unsigned char *)"cove egress CA", -1, -1, 0) &&
                 X509_set_subject_name(x, n) && X509_set_issuer_name(x, n) &&
                 X509_set_pubkey(x, key) &&
                 add_ext(x, x, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") == 0 &&
                 add_ext(x, x, NID_key_usage, "critical,keyCertSign,cRLSign") == 0 &&
                 add_ext(x, x, NID_subject_key_identifier, "hash") == 0 &&
                 X509_sign(x, key, EVP_sha256()) > 0;
        X509_NAME_free(n);
        if (!ok) {
                X509_free(x);
                return NULL;
        }
        return x;
}

static char *pem_of(int (*wr)(BIO *, void *), void *obj)
{
        BIO *b = BIO_new(BIO_s_mem());
        char *out = NULL;
        if (b && wr(b, obj)) {
                char *p;
                long n = BIO_get_mem_data(b, &p);
                out = malloc((size_t)n + 1);
                if (out) {
                        memcpy(out, p, (size_t)n);
                        out[n] = '\0';
                }
        }
        BIO_free(b);
        return out;
}

static int wr_cert(BIO *b, void *x)
{
        return PEM_write_bio_X509(b, x);
}

static int wr_key(BIO *b, void *k)
{
        return PEM_write_bio_PrivateKey(b, k, NULL, NULL, 0, NULL, NULL);
}

/* Create <dir>/ca (ca.key, ca.pem) unless it exists; a concurrent creator may win. */
static int create_ca(const char *dir, struct cove_err *err)
{
        char tmp[PATH_MAX], fin[PATH_MAX], rnd[17];
        unsigned char rb[8];
        if (cove_random(rb, sizeof(rb), err) < 0)
                return -1;
        cove_hex(rb, sizeof(rb), rnd);
        snprintf(tmp, sizeof(tmp), "%s/.ca.tmp.%s", dir, rnd);
        snprintf(fin, sizeof(fin), "%s/ca", dir);
        if (mkdir(tmp, 0700) < 0)
                return cove_err_set(err, errno, "mkdir %s", tmp);
        EVP_PKEY *k = ec_key();
        X509 *x = k ? make_ca(k) : NULL;
        char *kp = k ? pem_of(wr_key, k) : NULL, *cp = x ? pem_of(wr_cert, x) : NULL;
        int r = kp && cp ? 0 : cove_err_set(err, 0, "egress CA: OpenSSL could not make it");
        if (r == 0)
                r = cove_write_file_atomic(tmp, "ca.key", kp, strlen(kp), 0600, err);
        if (r == 0)
                r = cove_write_file_atomic(tmp, "ca.pem", cp, strlen(cp), 0644, err);
        if (kp) {
                OPENSSL_cleanse(kp, strlen(kp));
                free(kp);
        }
        free(cp);
        X509_free(x);
        EVP_PKEY_free(k);
        if (r == 0 && rename(tmp, fin) < 0 && errno != EEXIST && errno != ENOTEMPTY)
                r = cove_err_set(err, errno, "rename %s", tmp);
        struct cove_err e2;
        cove_rm_rf(tmp, &e2); /* gone after a successful rename; the loser's copy otherwise */
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
                fsync(dfd);
                close(dfd);
        }
        return r;
}

static int load_ca(struct cove_mitm *m, const char *dir, struct cove_err *err)
{
        char p[PATH_MAX];
        snprintf(p, sizeof(p), "%s/ca/ca.pem", dir);
        if (access(p, F_OK) < 0 && create_ca(dir, err) < 0)
                return -1;
        char *cp = NULL, *kp = NULL;
        size_t cl, kl;
        if (cove_read_file(p, 1 << 16, &cp, &cl, err) < 0)
                return -1;
        snprintf(p, sizeof(p), "%s/ca/ca.key", dir);
        struct stat st;
        if (stat(p, &st) < 0 || (st.st_mode & 077)) {
                free(cp);
                return cove_err_set(err, 0, "%s: missing or readable by others (want 0600)", p);
        }
        if (cove_read_file(p, 1 << 16, &kp, &kl, err) < 0) {
                free(cp);
                return -1;
        }
        BIO *cb = BIO_new_mem_buf(cp, (int)cl), *kb = BIO_new_mem_buf(kp, (int)kl);
        m->ca = cb ? PEM_read_bio_X509(cb, NULL, NULL, NULL) : NULL;
        m->ca_key = kb ? PEM_read_bio_PrivateKey(kb, NULL, NULL, NULL) : NULL;
        BIO_free(cb);
        BIO_free(kb);
        OPENSSL_cleanse(kp, kl);
        free(kp);
        m->ca_pem = cp;
        if (!m->ca || !m->ca_key || X509_check_private_key(m->ca, m->ca_key) != 1)
                return cove_err_set(err, 0, "%s/ca: unreadable or mismatched CA", dir);
        return 0;
}

static int alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                       const unsigned char *in, unsigned int inlen, void *arg)
{
        (void)ssl;
        (void)arg;
        static const unsigned char want[] = "http/1.1";
        for (unsigned i = 0; i < inlen;) {
                unsigned l = in[i];
                if (i + 1 + l > inlen)
                        break;
                if (l == 8 && !memcmp(in + i + 1, want, 8)) {
                        *out = in + i + 1;
                        *outlen = 8;
                        return SSL_TLSEXT_ERR_OK;
                }
                i += 1 + l;
        }
        return SSL_TLSEXT_ERR_NOACK; /* no ALPN: HTTP/1.1 is the default */
}

struct cove_mitm *cove_mitm_open(const char *dir, const char *extra_ca, struct cove_err *err)
{
        struct cove_mitm *m = calloc(1, sizeof(*m));
        if (!m) {
                cove_err_set(err, ENOMEM, "mitm");
                return NULL;
        }
        m->cache = calloc(COVE_MITM_CACHE, sizeof(*m->cache));
        if (!m->cache || cove_mkdir_p(dir, 0700, err) < 0 || load_ca(m, dir, err) < 0)
                goto fail;
        m->leaf_key = ec_key();
        m->srv = SSL_CTX_new(TLS_server_method());
        m->cli = SSL_CTX_new(TLS_client_method());
        if (!m->leaf_key || !m->srv || !m->cli) {
                cove_err_set(err, 0, "egress TLS contexts");
                goto fail;
        }
        SSL_CTX_set_min_proto_version(m->srv, TLS1_2_VERSION);
        SSL_CTX_set_min_proto_version(m->cli, TLS1_2_VERSION);
        SSL_CTX_set_alpn_select_cb(m->srv, alpn_select, NULL);
        SSL_CTX_set_options(m->srv, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
        SSL_CTX_set_options(m->cli, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
        SSL_CTX_set_mode(m->srv,
                         SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
        SSL_CTX_set_mode(m->cli,
                         SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
        SSL_CTX_set_verify(m->cli, SSL_VERIFY_PEER, NULL);
        if (SSL_CTX_set_default_verify_paths(m->cli) != 1 ||
            (extra_ca && *extra_ca && SSL_CTX_load_verify_locations(m->cli, extra_ca, NULL) != 1)) {
                cove_err_set(err, 0, "egress upstream trust store%s%s",
                             extra_ca ? ": cannot load " : "", extra_ca ? extra_ca : "");
                goto fail;
        }
        static const unsigned char alpn[] = "\x08http/1.1";
        SSL_CTX_set_alpn_protos(m->cli, alpn, sizeof(alpn) - 1);
        return m;
fail:
        ERR_clear_error();
        cove_mitm_free(m);
        return NULL;
}

void cove_mitm_free(struct cove_mitm *m)
{
        if (!m)
                return;
        for (int i = 0; m->cache && i < m->ncache; i++)
                X509_free(m->cache[i].cert);
        free(m->cache);
        SSL_CTX_free(m->srv);
        SSL_CTX_free(m->cli);
        X509_free(m->ca);
        EVP_PKEY_free(m->ca_key);
        EVP_PKEY_free(m->leaf_key);
        free(m->ca_pem);
        free(m);
}

const char *cove_mitm_ca_pem(const struct cove_mitm *m)
{
        return m->ca_pem;
}

static X509 *mint(struct cove_mitm *m, const char *name)
{
        X509 *x = X509_new();
        X509_NAME *n = X509_NAME_new();
        char san[300];
        snprintf(san, sizeof(san), "DNS:%s", name);
        int ok = x && n && X509_set_version(x, 2) && set_serial(x) == 0 &&
                 X509_gmtime_adj(X509_getm_notBefore(x), -86400) &&
                 X509_gmtime_adj(X509_getm_notAfter(x), 30L * 86400) &&
                 X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, (const unsigned char *)name, -1,
                                            -1, 0) &&
                 X509_set_subject_name(x, n) &&
                 X509_set_issuer_name(x, X509_get_subject_name(m->ca)) &&
                 X509_set_pubkey(x, m->leaf_key) &&
                 add_ext(x, m->ca, NID_basic_constraints, "critical,CA:FALSE") == 0 &&
                 add_ext(x, m->ca, NID_key_usage, "critical,digitalSignature") == 0 &&
                 add_ext(x, m->ca, NID_ext_key_usage, "serverAuth") == 0 &&
                 add_ext(x, m->ca, NID_subject_alt_name, san) == 0 &&
                 X509_sign(x, m->ca_key, EVP_sha256()) > 0;
        X509_NAME_free(n);
        if (!ok) {
                X509_free(x);
                return NULL;
        }
        return x;
}

static X509 *leaf(struct cove_mitm *m, const char *name)
{
        for (int i = 0; i < m->ncache; i++)
                if (!strcmp(m->cache[i].name, name))
                        return m->cache[i].cert;
        X509 *x = mint(m, name);
        if (!x)
                return NULL;
        struct leaf *l;
        if (m->ncache < COVE_MITM_CACHE) {
                l = &m->cache[m->ncache++];
        } else {
                l = &m->cache[m->next];
                m->next = (m->next + 1) % COVE_MITM_CACHE;
                X509_free(l->cert);
        }
        snprintf(l->name, sizeof(l->name), "%s", name);
        l->cert = x;
        return x;
}

SSL *cove_mitm_client_ssl(struct cove_mitm *m, const char *name)
{
        X509 *x = leaf(m, name);
        SSL *s = x ? SSL_new(m->srv) : NULL;
        if (s && (SSL_use_certificate(s, x) != 1 || SSL_use_PrivateKey(s, m->leaf_key) != 1 ||
                  SSL_add1_chain_cert(s, m->ca) != 1)) {
                SSL_free(s);
                s = NULL;
        }
        if (s)
                SSL_set_accept_state(s);
        ERR_clear_error();
        return s;
}

SSL *cove_mitm_upstream_ssl(struct cove_mitm *m, const char *name)
{
        SSL *s = SSL_new(m->cli);
        if (s && (SSL_set_tlsext_host_name(s, name) != 1 || SSL_set1_host(s, name) != 1)) {
                SSL_free(s);
                s = NULL;
        }
        if (s)
                SSL_set_connect_state(s);
        ERR_clear_error();
        return s;
}
