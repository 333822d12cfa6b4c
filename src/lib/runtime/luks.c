/* A LUKS-encrypted qcow2 overlay, written directly (runtime/luks.h). Formats: QEMU's
 * docs/interop/qcow2.txt (version 3, "Full disk encryption header pointer" extension) and
 * the LUKS1 on-disk format specification (key slots, anti-forensic split), the way QEMU's
 * crypto/block-luks.c lays them out for qcow2 (its images and ours look alike):
 *   cluster 0        qcow2 header, extensions (backing format, encryption header), backing
 *   cluster 1        refcount table (one entry: cluster 2)
 *   cluster 2        refcount block (16-bit refcounts; clusters 0 .. NCLUSTERS-1 are in use)
 *   cluster 3        L1 table (all zero: nothing written yet, every read goes to the backing)
 *   cluster 4 ..     LUKS1 header: 592 bytes, then 8 key slots' material from sector 8 on,
 *                    504 sectors apart (4000 stripes x 64 bytes, 4 KiB aligned); only slot 0
 *                    is active, the rest stays a hole
 * Data clusters are added by QEMU as the guest writes, encrypted with the master key
 * (aes-256-xts-plain64); qcow2 metadata (L1/L2 tables, refcounts) stays plain. */
#include "runtime/luks.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#define CLUSTER_BITS 16
#define CLUSTER (1u << CLUSTER_BITS)
#define SECTOR 512u
#define KEY_BYTES 64u /* aes-256-xts: two 256-bit keys */
#define STRIPES 4000u
#define SLOTS 8u
#define DIGEST_LEN 20u
#define SALT_LEN 32u
#define SLOT_ACTIVE 0x00AC71F3u
#define SLOT_INACTIVE 0x0000DEADu
#define SPLIT_LEN (KEY_BYTES * STRIPES)                                /* 256000: 500 sectors */
#define SLOT_SECTORS (((SPLIT_LEN + 4095u) / 4096u) * 4096u / SECTOR)  /* 504 */
#define FIRST_SLOT_SECTOR 8u                                           /* 4096 */
#define LUKS_LEN ((FIRST_SLOT_SECTOR + SLOTS * SLOT_SECTORS) * SECTOR) /* 2068480 */
#define LUKS_OFF (4u * CLUSTER)
#define NCLUSTERS (4u + (LUKS_LEN + CLUSTER - 1) / CLUSTER) /* 36 */
#define L2_SPAN ((uint64_t)CLUSTER / 8 * CLUSTER)           /* bytes one L2 table maps */

#define EXT_BACKING_FMT 0xE2792ACAu
#define EXT_CRYPTO_HDR 0x0537BE77u
#define QCOW2_CRYPT_LUKS 2u

static void be16(uint8_t *p, uint16_t v)
{
        p[0] = (uint8_t)(v >> 8);
        p[1] = (uint8_t)v;
}

static void be32(uint8_t *p, uint32_t v)
{
        for (int i = 0; i < 4; i++)
                p[i] = (uint8_t)(v >> (24 - 8 * i));
}

static void be64(uint8_t *p, uint64_t v)
{
        for (int i = 0; i < 8; i++)
                p[i] = (uint8_t)(v >> (56 - 8 * i));
}

/* LUKS1 AF diffuse with sha256: each 32-byte block i of b becomes H(be32(i) || block). */
static int af_diffuse(uint8_t b[KEY_BYTES], EVP_MD_CTX *c, const EVP_MD *sha)
{
        for (uint32_t i = 0; i < KEY_BYTES / 32; i++) {
                uint8_t iv[4], md[32];
                unsigned ml = 0;
                be32(iv, i);
                if (EVP_DigestInit_ex2(c, sha, NULL) != 1 ||
                    EVP_DigestUpdate(c, iv, sizeof(iv)) != 1 ||
                    EVP_DigestUpdate(c, b + 32 * i, 32) != 1 ||
                    EVP_DigestFinal_ex(c, md, &ml) != 1 || ml != 32)
                        return -1;
                memcpy(b + 32 * i, md, 32);
        }
        return 0;
}

/* The anti-forensic split of mk into STRIPES stripes (random, then mk xor the diffused
 * sum of the others). */
static int af_split(const uint8_t mk[KEY_BYTES], uint8_t *out)
{
        uint8_t block[KEY_BYTES] = {0};
        EVP_MD_CTX *c = EVP_MD_CTX_new();
        EVP_MD *sha = EVP_MD_fetch(NULL, "SHA256", NULL); /* once: a fetch per init is slow */
        int ok = c && sha && RAND_bytes(out, (int)(KEY_BYTES * (STRIPES - 1))) == 1;
        for (uint32_t s = 0; ok && s < STRIPES - 1; s++) {
                for (uint32_t j = 0; j < KEY_BYTES; j++)
                        block[j] ^= out[s * KEY_BYTES + j];
                ok = af_diffuse(block, c, sha) == 0;
        }
        for (uint32_t j = 0; ok && j < KEY_BYTES; j++)
                out[(STRIPES - 1) * KEY_BYTES + j] = mk[j] ^ block[j];
        OPENSSL_cleanse(block, sizeof(block));
        EVP_MD_free(sha);
        EVP_MD_CTX_free(c);
        return ok ? 0 : -1;
}

/* aes-256-xts-plain64 over len bytes (whole sectors), sector numbers from 0. */
static int xts_encrypt(const uint8_t key[KEY_BYTES], const uint8_t *in, uint8_t *out, size_t len)
{
        EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
        int ok = c && EVP_EncryptInit_ex(c, EVP_aes_256_xts(), NULL, key, NULL) == 1;
        for (size_t s = 0; ok && s < len / SECTOR; s++) {
                uint8_t iv[16] = {0};
                for (int i = 0; i < 8; i++)
                        iv[i] = (uint8_t)((uint64_t)s >> (8 * i)); /* plain64: le64 sector */
                int n = 0, m = 0;
                ok = EVP_EncryptInit_ex(c, NULL, NULL, NULL, iv) == 1 &&
                     EVP_EncryptUpdate(c, out + s * SECTOR, &n, in + s * SECTOR, SECTOR) == 1 &&
                     EVP_EncryptFinal_ex(c, out + s * SECTOR + n, &m) == 1 && n + m == (int)SECTOR;
        }
        EVP_CIPHER_CTX_free(c);
        return ok ? 0 : -1;
}

static int pbkdf2(const void *pass, size_t pass_len, const uint8_t *salt, unsigned iters,
                  uint8_t *out, size_t out_len)
{
        return PKCS5_PBKDF2_HMAC(pass, (int)pass_len, salt, (int)SALT_LEN, (int)iters, EVP_sha256(),
                                 (int)out_len, out) == 1
                   ? 0
                   : -1;
}

/* The LUKS1 header (592 bytes) and key slot 0's encrypted material (SPLIT_LEN bytes). */
static int luks_build(const void *pass, size_t pass_len, unsigned iters, uint8_t hdr[592],
                      uint8_t *material)
{
        uint8_t mk[KEY_BYTES], slotkey[KEY_BYTES], salts[SALT_LEN * 2], uu[16];
        uint8_t *split = malloc(SPLIT_LEN);
        int rc = -1;
        if (!split || RAND_bytes(mk, sizeof(mk)) != 1 || RAND_bytes(salts, sizeof(salts)) != 1 ||
            RAND_bytes(uu, sizeof(uu)) != 1)
                goto out;
        memset(hdr, 0, 592);
        memcpy(hdr, "LUKS\xba\xbe", 6);
        be16(hdr + 6, 1);
        memcpy(hdr + 8, "aes", 3);
        memcpy(hdr + 40, "xts-plain64", 11);
        memcpy(hdr + 72, "sha256", 6);
        be32(hdr + 104, LUKS_LEN / SECTOR); /* payload offset: after every slot */
        be32(hdr + 108, KEY_BYTES);
        if (pbkdf2(mk, sizeof(mk), salts, iters, hdr + 112, DIGEST_LEN) < 0)
                goto out;
        memcpy(hdr + 132, salts, SALT_LEN);
        be32(hdr + 164, iters);
        uu[6] = (uint8_t)((uu[6] & 0x0f) | 0x40); /* random (v4) UUID */
        uu[8] = (uint8_t)((uu[8] & 0x3f) | 0x80);
        char us[40];
        snprintf(us, sizeof(us),
                 "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", uu[0],
                 uu[1], uu[2], uu[3], uu[4], uu[5], uu[6], uu[7], uu[8], uu[9], uu[10], uu[11],
                 uu[12], uu[13], uu[14], uu[15]);
        memcpy(hdr + 168, us, strlen(us));
        for (uint32_t i = 0; i < SLOTS; i++) {
                uint8_t *s = hdr + 208 + 48 * i;
                be32(s, i == 0 ? SLOT_ACTIVE : SLOT_INACTIVE);
                if (i == 0) {
                        be32(s + 4, iters);
                        memcpy(s + 8, salts + SALT_LEN, SALT_LEN);
                }
                be32(s + 40, FIRST_SLOT_SECTOR + i * SLOT_SECTORS);
                be32(s + 44, STRIPES);
        }
        if (af_split(mk, split) < 0 ||
            pbkdf2(pass, pass_len, salts + SALT_LEN, iters, slotkey, sizeof(slotkey)) < 0 ||
            xts_encrypt(slotkey, split, material, SPLIT_LEN) < 0)
                goto out;
        rc = 0;
out:
        OPENSSL_cleanse(mk, sizeof(mk));
        OPENSSL_cleanse(slotkey, sizeof(slotkey));
        if (split) {
                OPENSSL_cleanse(split, SPLIT_LEN);
                free(split);
        }
        return rc;
}

int64_t cove_qcow2_virtual_size(const char *path, struct cove_err *err)
{
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return cove_err_set(err, errno, "qcow2: open %s", path);
        uint8_t h[32];
        ssize_t k = pread(fd, h, sizeof(h), 0);
        close(fd);
        if (k != (ssize_t)sizeof(h) || memcmp(h, "QFI\xfb", 4))
                return cove_err_set(err, 0, "qcow2: %s is not a qcow2 image", path);
        uint64_t v = 0;
        for (int i = 0; i < 8; i++)
                v = v << 8 | h[24 + i];
        if (v > INT64_MAX)
                return cove_err_set(err, 0, "qcow2: %s: bad size", path);
        return (int64_t)v;
}

int cove_luks_qcow2_create(const char *path, const char *backing, const char *backing_fmt,
                           const void *pass, size_t pass_len, unsigned iters, struct cove_err *err)
{
        if (iters < 1000 || !pass_len)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "luks: want >= 1000 iterations and a passphrase");
        int64_t size = cove_qcow2_virtual_size(backing, err);
        if (size < 0)
                return -1;
        uint64_t l1 = ((uint64_t)size + L2_SPAN - 1) / L2_SPAN;
        size_t blen = strlen(backing), flen = strlen(backing_fmt);
        if (size % SECTOR || l1 > CLUSTER / 8 || blen > 1023 || flen > 16)
                return cove_err_set(err, 0, "luks: backing %s: unsupported size or name", backing);
        uint8_t *c0 = calloc(4, CLUSTER); /* header, refcount table, refcount block, L1 */
        uint8_t *mat = malloc(SPLIT_LEN);
        uint8_t luks[592];
        int fd = -1, rc = -1, made = 0;
        if (!c0 || !mat) {
                cove_err_set(err, ENOMEM, "luks");
                goto out;
        }
        /* header (version 3, 112 bytes: compression type zlib) */
        memcpy(c0, "QFI\xfb", 4);
        be32(c0 + 4, 3);
        be32(c0 + 20, CLUSTER_BITS);
        be64(c0 + 24, (uint64_t)size);
        be32(c0 + 32, QCOW2_CRYPT_LUKS);
        be32(c0 + 36, (uint32_t)l1);
        be64(c0 + 40, 3 * (uint64_t)CLUSTER);
        be64(c0 + 48, CLUSTER);
        be32(c0 + 56, 1);
        be32(c0 + 96, 4); /* 16-bit refcounts */
        be32(c0 + 100, 112);
        size_t o = 112;
        be32(c0 + o, EXT_BACKING_FMT);
        be32(c0 + o + 4, (uint32_t)flen);
        memcpy(c0 + o + 8, backing_fmt, flen);
        o += 8 + ((flen + 7) & ~(size_t)7);
        be32(c0 + o, EXT_CRYPTO_HDR);
        be32(c0 + o + 4, 16);
        be64(c0 + o + 8, LUKS_OFF);
        be64(c0 + o + 16, LUKS_LEN);
        o += 24 + 8; /* and the end-of-extensions marker (zeros) */
        be64(c0 + 8, o);
        be32(c0 + 16, (uint32_t)blen);
        memcpy(c0 + o, backing, blen);
        be64(c0 + CLUSTER, 2 * (uint64_t)CLUSTER);
        for (uint32_t i = 0; i < NCLUSTERS; i++)
                be16(c0 + 2 * CLUSTER + 2 * i, 1);
        if (luks_build(pass, pass_len, iters, luks, mat) < 0) {
                cove_err_set(err, 0, "luks: key material (OpenSSL)");
                goto out;
        }
        unlink(path);
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0) {
                cove_err_set(err, errno, "luks: create %s", path);
                goto out;
        }
        made = 1;
        /* only what is not zero: the L1 table and the unused slots stay holes */
        size_t hlen = o + blen;
        if (pwrite(fd, c0, hlen, 0) != (ssize_t)hlen || pwrite(fd, c0 + CLUSTER, 8, CLUSTER) != 8 ||
            pwrite(fd, c0 + 2 * CLUSTER, 2 * NCLUSTERS, 2 * CLUSTER) != 2 * NCLUSTERS ||
            pwrite(fd, luks, sizeof(luks), LUKS_OFF) != (ssize_t)sizeof(luks) ||
            pwrite(fd, mat, SPLIT_LEN, LUKS_OFF + FIRST_SLOT_SECTOR * SECTOR) !=
                (ssize_t)SPLIT_LEN ||
            ftruncate(fd, (off_t)NCLUSTERS * CLUSTER) < 0) {
                cove_err_set(err, errno ? errno : EIO, "luks: write %s", path);
                goto out;
        }
        if (close(fd) < 0) {
                fd = -1;
                cove_err_set(err, errno, "luks: write %s", path);
                goto out;
        }
        fd = -1;
        rc = 0;
out:
        if (fd >= 0)
                close(fd);
        if (rc < 0 && made)
                unlink(path);
        free(c0);
        free(mat); /* encrypted material: not secret */
        return rc;
}
