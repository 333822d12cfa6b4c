/* Key gate cost (docs/security.md "Keys"): what create/resume/fork/snapshot pay to check
 * the tenant's key, with a cached unwrap and without (TTL 0: every use unwraps), for the
 * local provider (node KEK file) and the command provider (tests/security/kms.sh: two
 * processes, openssl). Also the full cove_tenant_keys_open (gate + 5 HKDF subkeys).
 * Last, chunk sealing alone: the AES-256-GCM steps of store/snapshot.c seal() (fresh output
 * buffer, random nonce, init with the key, AD, encrypt, tag) on 64 KiB chunks, one thread.
 * Usage: keys_bench [--kms PATH_TO_kms.sh] [--n N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/rand.h>

#include "crypto/keys.h"
#include "util/util.h"

static double per_op_us(const char *dir, const char *tenant, int n, int open_keys)
{
        struct cove_err err = {0};
        int64_t t0 = cove_mono_ns();
        for (int i = 0; i < n; i++) {
                int rc;
                if (open_keys) {
                        struct cove_tenant_keys *k = NULL;
                        rc = cove_tenant_keys_open(dir, tenant, &k, &err);
                        cove_tenant_keys_free(k);
                } else {
                        rc = cove_key_check(dir, tenant, 1, &err);
                }
                if (rc < 0) {
                        fprintf(stderr, "keys_bench: %s\n", err.msg);
                        exit(1);
                }
        }
        return (double)(cove_mono_ns() - t0) / n / 1000.0;
}

static void row(const char *what, const char *dir, const char *tenant, int n)
{
        cove_keys_cache_ttl_set(60000);
        per_op_us(dir, tenant, 1, 0); /* warm the cache */
        double hot = per_op_us(dir, tenant, n, 0);
        double hot_open = per_op_us(dir, tenant, n, 1);
        cove_keys_cache_ttl_set(0);
        int m = strstr(what, "command") ? (n < 20 ? n : 20) : n / 10;
        double cold = per_op_us(dir, tenant, m, 0);
        printf("| %-30s | %10.2f | %12.2f | %14.1f |\n", what, hot, hot_open, cold);
}

/* GB/s of sealing `total` bytes in chunks of `chunk` bytes (the store's steps, one thread). */
static double seal_gbs(size_t chunk, size_t total)
{
        uint8_t key[32], hdr[20] = "CVC1", *plain = malloc(chunk);
        RAND_bytes(key, sizeof(key));
        for (size_t i = 0; i < chunk; i++)
                plain[i] = (uint8_t)(i * 131 + 7);
        EVP_CIPHER_CTX *cx = EVP_CIPHER_CTX_new();
        int64_t t0 = cove_mono_ns();
        for (size_t done = 0; done < total; done += chunk) {
                uint8_t *o = malloc(20 + chunk + 16);
                int l1 = 0, l2 = 0;
                RAND_bytes(hdr + 8, 12);
                if (EVP_EncryptInit_ex(cx, EVP_aes_256_gcm(), NULL, key, hdr + 8) != 1 ||
                    EVP_EncryptUpdate(cx, NULL, &l1, hdr, 20) != 1 ||
                    EVP_EncryptUpdate(cx, o + 20, &l1, plain, (int)chunk) != 1 ||
                    EVP_EncryptFinal_ex(cx, o + 20 + l1, &l2) != 1 ||
                    EVP_CIPHER_CTX_ctrl(cx, EVP_CTRL_GCM_GET_TAG, 16, o + 20 + chunk) != 1) {
                        fprintf(stderr, "keys_bench: seal failed\n");
                        exit(1);
                }
                free(o);
        }
        double s = (double)(cove_mono_ns() - t0) / 1e9;
        EVP_CIPHER_CTX_free(cx);
        free(plain);
        return (double)total / s / 1e9;
}

int main(int argc, char **argv)
{
        const char *kms = NULL;
        int n = 2000;
        for (int i = 1; i < argc; i++) {
                if (!strcmp(argv[i], "--kms") && i + 1 < argc)
                        kms = argv[++i];
                else if (!strcmp(argv[i], "--n") && i + 1 < argc)
                        n = atoi(argv[++i]);
                else {
                        fprintf(stderr, "usage: keys_bench [--kms kms.sh] [--n N]\n");
                        return 2;
                }
        }
        if (n < 10)
                n = 10;
        char dir[] = "/tmp/cove-keys-bench-XXXXXX";
        if (!mkdtemp(dir))
                return 1;
        char keys[128];
        snprintf(keys, sizeof(keys), "%s/keys", dir);
        struct cove_err err = {0};
        printf("| provider                       | cached (us) | cached+subkeys (us) | no cache "
               "(us) |\n"
               "|---|---|---|---|\n");
        row("local (node KEK)", keys, "bench", n);
        if (kms) {
                char kdir[256], kek[300], wrap[600], unwrap[600];
                snprintf(kdir, sizeof(kdir), "%s/kms", dir);
                mkdir(kdir, 0700);
                snprintf(kek, sizeof(kek), "%s/kek", kdir);
                FILE *f = fopen(kek, "w");
                if (!f)
                        return 1;
                fputs("bench-passphrase-0123456789abcdef", f);
                fclose(f);
                chmod(kek, 0600);
                snprintf(wrap, sizeof(wrap), "%s wrap %s", kms, kdir);
                snprintf(unwrap, sizeof(unwrap), "%s unwrap %s", kms, kdir);
                struct cove_key_spec spec = {
                    .provider = "command", .wrap_cmd = wrap, .unwrap_cmd = unwrap};
                cove_keys_cache_ttl_set(60000);
                if (cove_key_rewrap(keys, "byok", &spec, NULL, &err) < 0) {
                        fprintf(stderr, "keys_bench: %s\n", err.msg);
                        return 1;
                }
                row("command (kms.sh, openssl)", keys, "byok", n);
        }
        cove_keys_cache_clear();
        cove_rm_rf(dir, NULL);
        printf("\nchunk sealing (AES-256-GCM as in store seal(), 1 thread, 1 GiB): "
               "16 KiB chunks %.2f GB/s, 64 KiB %.2f GB/s, 1 MiB %.2f GB/s\n",
               seal_gbs(16 << 10, 1u << 30), seal_gbs(64 << 10, 1u << 30),
               seal_gbs(1 << 20, 1u << 30));
        return 0;
}
