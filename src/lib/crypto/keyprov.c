/* Key providers (crypto/keys.h): "local" wraps a DEK with AES-256-GCM under a 32-byte key
 * file; "command" hands it to external wrap/unwrap programs (docs/security.md, "command
 * provider protocol"): one base64 line on stdin, one base64 line on stdout, exit 0; exit 3
 * means the KMS refuses (revoked/disabled); anything else, a timeout or output that is not
 * one base64 line of the right size is a clear error. The programs' stderr is discarded
 * (it could echo what they were given). */
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "crypto/keys.h"
#include "util/cleanup.h"
#include "util/util.h"

#define WRAP_AAD "cove/v1/wrap"
#define NONCE_LEN 12
#define TAG_LEN 16
#define LOCAL_WRAPPED_LEN (NONCE_LEN + COVE_KEY_LEN + TAG_LEN)

/* ---- base64 (standard alphabet, padded, one line) ---- */

static int b64_enc(const uint8_t *in, size_t n, char *out, size_t cap)
{
        if (cap < 4 * ((n + 2) / 3) + 1)
                return -1;
        EVP_EncodeBlock((unsigned char *)out, in, (int)n);
        return 0;
}

/* Decode a base64 line (no whitespace inside) into out; returns the length or -1. */
static long b64_dec(const char *in, size_t n, uint8_t *out, size_t cap)
{
        if (n == 0 || n % 4 != 0 || n / 4 * 3 > cap + 2)
                return -1;
        for (size_t i = 0; i < n; i++) {
                char c = in[i];
                int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                         (c >= '0' && c <= '9') || c == '+' || c == '/' || (c == '=' && i >= n - 2);
                if (!ok)
                        return -1;
        }
        if (in[n - 2] == '=' && in[n - 1] != '=')
                return -1;
        uint8_t *tmp = malloc(n / 4 * 3 + 1);
        if (!tmp)
                return -1;
        int got = EVP_DecodeBlock(tmp, (const unsigned char *)in, (int)n);
        long len = -1;
        if (got >= 0) {
                len = got - (in[n - 1] == '=') - (in[n - 2] == '=');
                if ((size_t)len <= cap)
                        memcpy(out, tmp, (size_t)len);
                else
                        len = -1;
        }
        OPENSSL_cleanse(tmp, n / 4 * 3 + 1);
        free(tmp);
        return len;
}

/* ---- local ---- */

/* Read a KEK file: 32 raw bytes, or 64 hex digits (a trailing newline allowed). Refuses a
 * file others can read. */
static int kek_read(const char *path, uint8_t kek[COVE_KEY_LEN], struct cove_err *err)
{
        cleanup_close int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return cove_err_setk(err, errno == ENOENT ? COVE_E_NOT_FOUND : COVE_E_UNAVAILABLE,
                                     errno, "key file %s", path);
        struct stat st;
        if (fstat(fd, &st) < 0)
                return cove_err_set(err, errno, "stat key file %s", path);
        if (!S_ISREG(st.st_mode))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "key file %s: not a regular file",
                                     path);
        if (st.st_mode & 077)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "key file %s: mode %o is readable by others, want 0600", path,
                                     (unsigned)(st.st_mode & 0777));
        uint8_t buf[130];
        size_t got = 0;
        for (;;) {
                ssize_t r = read(fd, buf + got, sizeof(buf) - got);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r < 0)
                        return cove_err_set(err, errno, "read key file %s", path);
                if (r == 0 || (got += (size_t)r) == sizeof(buf))
                        break;
        }
        int rc = 0;
        if (got == COVE_KEY_LEN) {
                memcpy(kek, buf, COVE_KEY_LEN);
        } else if (got == 64 || (got == 65 && buf[64] == '\n')) {
                for (int i = 0; i < 64 && rc == 0; i++) {
                        int c = buf[i], v = c >= '0' && c <= '9'   ? c - '0'
                                            : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                                   : -1;
                        if (v < 0)
                                rc = -1;
                        else if (i & 1)
                                kek[i / 2] |= (uint8_t)v;
                        else
                                kek[i / 2] = (uint8_t)(v << 4);
                }
        } else {
                rc = -1;
        }
        OPENSSL_cleanse(buf, sizeof(buf));
        if (rc < 0) {
                OPENSSL_cleanse(kek, COVE_KEY_LEN);
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "key file %s: want 32 raw bytes or 64 hex digits", path);
        }
        return 0;
}

/* The node default KEK, created (0600, never replacing a concurrent creator's) if absent. */
int cove_kek_file_check(const char *path, struct cove_err *err)
{
        uint8_t kek[COVE_KEY_LEN];
        int r = kek_read(path, kek, err);
        OPENSSL_cleanse(kek, sizeof(kek));
        return r;
}

/* A default KEK given for keys_dir (cove_keys_attach: the same file on every process of a
 * cluster) is only read, never created. */
static int node_kek(const char *keys_dir, uint8_t kek[COVE_KEY_LEN], struct cove_err *err)
{
        char path[PATH_MAX];
        int fixed = cove_keys_default_kek(keys_dir, path, sizeof(path));
        if (kek_read(path, kek, err) == 0)
                return 0;
        if (fixed || err->kind != COVE_E_NOT_FOUND)
                return -1;
        if (cove_mkdir_p(keys_dir, 0700, err) < 0)
                return -1;
        uint8_t fresh[COVE_KEY_LEN], r[8];
        char rh[17], tmp[PATH_MAX + 64];
        if (cove_random(r, sizeof(r), err) < 0 || cove_random(fresh, sizeof(fresh), err) < 0)
                return -1;
        cove_hex(r, sizeof(r), rh);
        snprintf(tmp, sizeof(tmp), "%s/.node.kek.tmp.%s", keys_dir, rh);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        int ok =
            fd >= 0 && write(fd, fresh, sizeof(fresh)) == (ssize_t)sizeof(fresh) && fsync(fd) == 0;
        int e = errno;
        if (fd >= 0)
                close(fd);
        OPENSSL_cleanse(fresh, sizeof(fresh));
        if (ok && link(tmp, path) < 0 && errno != EEXIST) {
                e = errno;
                ok = 0;
        }
        unlink(tmp);
        if (!ok)
                return cove_err_set(err, e, "create node key %s", path);
        cleanup_close int dfd = open(keys_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0 || fsync(dfd) < 0)
                return cove_err_set(err, errno, "fsync %s", keys_dir);
        return kek_read(path, kek, err);
}

static int local_kek(const char *keys_dir, const struct cove_key_record *rec,
                     uint8_t kek[COVE_KEY_LEN], struct cove_err *err)
{
        if (rec->key_file[0])
                return kek_read(rec->key_file, kek, err);
        return node_kek(keys_dir, kek, err);
}

static int local_key_id(const char *keys_dir, const struct cove_key_record *rec, char *out,
                        size_t cap, struct cove_err *err)
{
        uint8_t kek[COVE_KEY_LEN], md[32];
        if (local_kek(keys_dir, rec, kek, err) < 0)
                return -1;
        unsigned int ml = 0;
        EVP_MD_CTX *c = EVP_MD_CTX_new();
        int ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) == 1 &&
                 EVP_DigestUpdate(c, "cove/v1/kek-id", 14) == 1 &&
                 EVP_DigestUpdate(c, kek, sizeof(kek)) == 1 && EVP_DigestFinal_ex(c, md, &ml) == 1;
        EVP_MD_CTX_free(c);
        OPENSSL_cleanse(kek, sizeof(kek));
        if (!ok)
                return cove_err_set(err, 0, "key id: SHA-256 failed");
        char hex[65];
        cove_hex(md, 8, hex);
        snprintf(out, cap, "%s:%s", rec->key_file[0] ? "local" : "node", hex);
        return 0;
}

static int gcm(int enc, const uint8_t key[COVE_KEY_LEN], const uint8_t nonce[NONCE_LEN],
               const char *tenant, const uint8_t *in, uint8_t *out, uint8_t tag[TAG_LEN])
{
        EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
        int n = 0,
            ok = c && EVP_CipherInit_ex(c, EVP_aes_256_gcm(), NULL, key, nonce, enc) == 1 &&
                 EVP_CipherUpdate(c, NULL, &n, (const uint8_t *)WRAP_AAD, (int)sizeof(WRAP_AAD)) ==
                     1 &&
                 EVP_CipherUpdate(c, NULL, &n, (const uint8_t *)tenant, (int)strlen(tenant)) == 1 &&
                 EVP_CipherUpdate(c, out, &n, in, COVE_KEY_LEN) == 1;
        if (ok && !enc)
                ok = EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, TAG_LEN, tag) == 1;
        if (ok)
                ok = EVP_CipherFinal_ex(c, out + n, &n) == 1;
        if (ok && enc)
                ok = EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, TAG_LEN, tag) == 1;
        EVP_CIPHER_CTX_free(c);
        return ok ? 0 : -1;
}

static int local_wrap(const char *keys_dir, const struct cove_key_record *rec,
                      const uint8_t dek[COVE_KEY_LEN], char *wrapped, size_t cap,
                      struct cove_err *err)
{
        uint8_t kek[COVE_KEY_LEN], blob[LOCAL_WRAPPED_LEN];
        if (local_kek(keys_dir, rec, kek, err) < 0)
                return -1;
        int rc = cove_random(blob, NONCE_LEN, err);
        if (rc == 0 && gcm(1, kek, blob, rec->tenant, dek, blob + NONCE_LEN,
                           blob + NONCE_LEN + COVE_KEY_LEN) < 0)
                rc = cove_err_set(err, 0, "wrap data key: AES-GCM failed");
        if (rc == 0 && b64_enc(blob, sizeof(blob), wrapped, cap) < 0)
                rc = cove_err_set(err, ENOBUFS, "wrap data key");
        OPENSSL_cleanse(kek, sizeof(kek));
        return rc;
}

static int local_unwrap(const char *keys_dir, const struct cove_key_record *rec,
                        const char *wrapped, uint8_t dek[COVE_KEY_LEN], struct cove_err *err)
{
        uint8_t kek[COVE_KEY_LEN], blob[LOCAL_WRAPPED_LEN], out[COVE_KEY_LEN];
        if (b64_dec(wrapped, strlen(wrapped), blob, sizeof(blob)) != (long)sizeof(blob))
                return cove_err_setk(err, COVE_E_KEY_REVOKED, 0,
                                     "wrapped data key of tenant %s is malformed", rec->tenant);
        if (local_kek(keys_dir, rec, kek, err) < 0)
                return -1;
        int rc =
            gcm(0, kek, blob, rec->tenant, blob + NONCE_LEN, out, blob + NONCE_LEN + COVE_KEY_LEN);
        OPENSSL_cleanse(kek, sizeof(kek));
        if (rc < 0) {
                OPENSSL_cleanse(out, sizeof(out));
                return cove_err_setk(err, COVE_E_KEY_REVOKED, 0,
                                     "data key of tenant %s does not unwrap with key %s (wrong "
                                     "key or tampered record)",
                                     rec->tenant, rec->key_id);
        }
        memcpy(dek, out, COVE_KEY_LEN);
        OPENSSL_cleanse(out, sizeof(out));
        return 0;
}

const struct cove_key_provider_ops cove_key_provider_local = {
    .name = "local",
    .wrap = local_wrap,
    .unwrap = local_unwrap,
    .key_id = local_key_id,
};

/* ---- command ---- */

static int64_t mono_ms(void)
{
        return cove_mono_ns() / 1000000;
}

/* Run `sh -c cmd` with input on stdin; one line of stdout (without the newline) into out.
 * Bounded: timeout_ms for the whole run, COVE_KEY_CMD_OUT_MAX bytes of output. */
static int run_cmd(const char *what, const struct cove_key_record *rec, const char *cmd,
                   const char *input, char *out, size_t cap, struct cove_err *err)
{
        int timeout = rec->timeout_ms > 0 ? rec->timeout_ms : COVE_KEY_CMD_TIMEOUT_MS;
        /* stdin is a socket: send(MSG_NOSIGNAL) cannot raise SIGPIPE if the program exits
         * without reading, whatever the process's signal dispositions are */
        int in[2] = {-1, -1}, outp[2] = {-1, -1};
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in) < 0 ||
            pipe2(outp, O_CLOEXEC) < 0) {
                int e = errno;
                for (int i = 0; i < 2; i++) {
                        if (in[i] >= 0)
                                close(in[i]);
                        if (outp[i] >= 0)
                                close(outp[i]);
                }
                return cove_err_setk(err, COVE_E_UNAVAILABLE, e, "%s command: pipe", what);
        }
        char env_tenant[COVE_TENANT_MAX + 16], env_op[32], env_kid[160];
        snprintf(env_tenant, sizeof(env_tenant), "COVE_TENANT=%s", rec->tenant);
        snprintf(env_op, sizeof(env_op), "COVE_KEY_OP=%s", what);
        snprintf(env_kid, sizeof(env_kid), "COVE_KEY_ID=%s", rec->key_id);
        const char *path = getenv("PATH");
        char env_path[1024];
        snprintf(env_path, sizeof(env_path), "PATH=%s", path ? path : "/usr/bin:/bin");
        char *envp[] = {env_tenant, env_op, env_kid, env_path, NULL};
        char *argv[] = {"sh", "-c", (char *)cmd, NULL};
        pid_t pid = fork();
        if (pid < 0) {
                int e = errno;
                close(in[0]), close(in[1]), close(outp[0]), close(outp[1]);
                return cove_err_setk(err, COVE_E_UNAVAILABLE, e, "%s command: fork", what);
        }
        if (pid == 0) {
                /* async-signal-safe calls only until exec */
                setpgid(0, 0);
                int nul = open("/dev/null", O_WRONLY);
                if (dup2(in[0], 0) < 0 || dup2(outp[1], 1) < 0 || nul < 0 || dup2(nul, 2) < 0)
                        _exit(127);
                /* nothing of coved (sockets, sandbox channels, loop devices) reaches it */
                syscall(SYS_close_range, 3U, ~0U, 0U);
                sigset_t none;
                sigemptyset(&none);
                struct sigaction dfl = {.sa_handler = SIG_DFL};
                sigaction(SIGPIPE, &dfl, NULL); /* coved ignores it; exec would keep that */
                sigprocmask(SIG_SETMASK, &none, NULL);
                execve("/bin/sh", argv, envp);
                _exit(127);
        }
        setpgid(pid, pid); /* either side may win the race; both set the same group */
        close(in[0]);
        close(outp[1]);
        int64_t deadline = mono_ms() + timeout;
        /* the input is one short line: it fits the pipe buffer, so this never blocks */
        size_t ilen = strlen(input);
        int rc = 0;
        if (send(in[1], input, ilen, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)ilen ||
            send(in[1], "\n", 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) {
                /* a program that exits without reading is judged by its output and status */
        }
        close(in[1]);
        char *buf = calloc(1, COVE_KEY_CMD_OUT_MAX + 1);
        size_t got = 0;
        const char *why = NULL;
        enum cove_err_kind kind = COVE_E_UNAVAILABLE;
        if (!buf)
                why = "out of memory";
        while (!why) {
                int64_t left = deadline - mono_ms();
                if (left <= 0) {
                        why = "timed out";
                        break;
                }
                struct pollfd p = {.fd = outp[0], .events = POLLIN};
                int pr = poll(&p, 1, (int)left);
                if (pr < 0 && errno == EINTR)
                        continue;
                if (pr < 0) {
                        why = "poll failed";
                        break;
                }
                if (pr == 0)
                        continue;
                ssize_t r = read(outp[0], buf + got, COVE_KEY_CMD_OUT_MAX + 1 - got);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r < 0) {
                        why = "read failed";
                        break;
                }
                if (r == 0)
                        break;
                got += (size_t)r;
                if (got > COVE_KEY_CMD_OUT_MAX) {
                        why = "printed too much";
                        break;
                }
        }
        close(outp[0]);
        /* the exit status, within what is left of the deadline */
        int status = -1;
        for (;;) {
                pid_t w = waitpid(pid, &status, WNOHANG);
                if (w == pid)
                        break;
                if (w < 0 && errno != EINTR) {
                        status = -1;
                        break;
                }
                if (why || mono_ms() >= deadline) {
                        if (!why)
                                why = "timed out";
                        kill(-pid, SIGKILL);
                        kill(pid, SIGKILL);
                        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
                        }
                        break;
                }
                struct timespec ts = {0, 1000000};
                nanosleep(&ts, NULL);
        }
        if (!why) {
                if (WIFEXITED(status) && WEXITSTATUS(status) == COVE_KEY_CMD_REVOKED_STATUS) {
                        why = "refused: the key is revoked or disabled in the KMS (exit 3)";
                        kind = COVE_E_KEY_REVOKED;
                } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                        why = "failed";
                }
        }
        if (!why) {
                size_t n = got;
                while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
                        n--;
                buf[n] = '\0';
                if (n == 0 || memchr(buf, '\n', n) || n >= cap)
                        why = "returned invalid output (want one base64 line)";
                else
                        memcpy(out, buf, n + 1);
        }
        if (buf) {
                OPENSSL_cleanse(buf, COVE_KEY_CMD_OUT_MAX + 1);
                free(buf);
        }
        if (why) {
                char st[48] = "";
                if (!strcmp(why, "failed") && WIFEXITED(status))
                        snprintf(st, sizeof(st), " (exit status %d)", WEXITSTATUS(status));
                else if (!strcmp(why, "failed") && WIFSIGNALED(status))
                        snprintf(st, sizeof(st), " (signal %d)", WTERMSIG(status));
                if (!strcmp(why, "timed out"))
                        snprintf(st, sizeof(st), " after %d ms", timeout);
                rc = cove_err_setk(err, kind, 0, "%s command of tenant %s %s%s", what, rec->tenant,
                                   why, st);
        }
        return rc;
}

static int cmd_wrap(const char *keys_dir, const struct cove_key_record *rec,
                    const uint8_t dek[COVE_KEY_LEN], char *wrapped, size_t cap,
                    struct cove_err *err)
{
        (void)keys_dir;
        char in[64], *tmp = malloc(COVE_KEY_WRAPPED_MAX);
        uint8_t *bin = malloc(COVE_KEY_WRAPPED_MAX);
        int rc = -1;
        if (!tmp || !bin) {
                cove_err_set(err, ENOMEM, "wrap");
                goto out;
        }
        b64_enc(dek, COVE_KEY_LEN, in, sizeof(in));
        rc = run_cmd("wrap", rec, rec->wrap_cmd, in, tmp, COVE_KEY_WRAPPED_MAX, err);
        if (rc == 0 &&
            (b64_dec(tmp, strlen(tmp), bin, COVE_KEY_WRAPPED_MAX) <= 0 || strlen(tmp) >= cap))
                rc = cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                   "wrap command of tenant %s returned invalid output (want one "
                                   "base64 line of at most %d chars)",
                                   rec->tenant, COVE_KEY_WRAPPED_MAX - 1);
        if (rc == 0)
                snprintf(wrapped, cap, "%s", tmp);
out:
        OPENSSL_cleanse(in, sizeof(in));
        free(tmp);
        free(bin);
        return rc;
}

static int cmd_unwrap(const char *keys_dir, const struct cove_key_record *rec, const char *wrapped,
                      uint8_t dek[COVE_KEY_LEN], struct cove_err *err)
{
        (void)keys_dir;
        char out[128];
        uint8_t bin[COVE_KEY_LEN + 8];
        int rc = run_cmd("unwrap", rec, rec->unwrap_cmd, wrapped, out, sizeof(out), err);
        if (rc == 0 && b64_dec(out, strlen(out), bin, sizeof(bin)) != COVE_KEY_LEN)
                rc = cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                   "unwrap command of tenant %s returned invalid output (want the "
                                   "base64 of 32 bytes)",
                                   rec->tenant);
        if (rc == 0)
                memcpy(dek, bin, COVE_KEY_LEN);
        OPENSSL_cleanse(out, sizeof(out));
        OPENSSL_cleanse(bin, sizeof(bin));
        return rc;
}

static int cmd_key_id(const char *keys_dir, const struct cove_key_record *rec, char *out,
                      size_t cap, struct cove_err *err)
{
        (void)keys_dir;
        (void)err;
        snprintf(out, cap, "%s", rec->key_id[0] ? rec->key_id : "command");
        return 0;
}

const struct cove_key_provider_ops cove_key_provider_command = {
    .name = "command",
    .wrap = cmd_wrap,
    .unwrap = cmd_unwrap,
    .key_id = cmd_key_id,
};

const struct cove_key_provider_ops *cove_key_provider(const char *name)
{
        if (name && !strcmp(name, "local"))
                return &cove_key_provider_local;
        if (name && !strcmp(name, "command"))
                return &cove_key_provider_command;
        return NULL;
}
