/* Small helpers: randomness, ids, time, hex, and crash-safe file writes. */
#ifndef COVE_UTIL_UTIL_H
#define COVE_UTIL_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "util/err.h"

/* Fill buf from the kernel CSPRNG (getrandom, blocking until seeded). */
int cove_random(void *buf, size_t len, struct cove_err *err);
/* "<prefix><20 lowercase base32 chars>" (100 random bits) into out (>= strlen(prefix)+21). */
int cove_id_new(const char *prefix, char *out, size_t cap, struct cove_err *err);
/* Lowercase hex of len bytes into out (2*len+1 bytes). */
void cove_hex(const void *buf, size_t len, char *out);

int64_t cove_now_ms(void);  /* wall clock, unix ms */
int64_t cove_mono_ns(void); /* monotonic ns */
/* RFC 3339 UTC with milliseconds, e.g. 2026-11-30T03:53:45.123Z (out >= 32 bytes). */
void cove_rfc3339(int64_t unix_ms, char *out, size_t cap);
/* An RFC 3339 time ("2026-12-01T10:00:00Z"; fractions and ±hh:mm offsets allowed) → unix
 * ms; -1 when s is not one. */
int64_t cove_rfc3339_parse(const char *s);

/* Write data to dir/name atomically: dir/.name.tmp.XXXX, fsync, rename, fsync dir.
 * Either the old content or the new one survives a crash. */
int cove_write_file_atomic(const char *dir, const char *name, const void *data, size_t len,
                           mode_t mode, struct cove_err *err);
/* Read a whole (small) file, at most max bytes; caller frees *out. */
int cove_read_file(const char *path, size_t max, char **out, size_t *len, struct cove_err *err);
/* mkdir -p with mode for the created components. */
int cove_mkdir_p(const char *path, mode_t mode, struct cove_err *err);
/* rm -rf that never follows symlinks and never descends into another mount (EBUSY). */
int cove_rm_rf(const char *path, struct cove_err *err);

/* File descriptor passing over a unix socket (SCM_RIGHTS). cove_send_with_fd: one sendmsg of
 * buf[0..len) (MSG_NOSIGNAL, EINTR retried) carrying fd when fd >= 0; bytes sent or -1.
 * cove_send_fd: one byte carrying fd; 0 or -1. cove_recv_fd: the fd of one such byte
 * (close-on-exec), -1 on EOF, error or a message without one. */
ssize_t cove_send_with_fd(int sock, const void *buf, size_t len, int fd);
int cove_send_fd(int sock, int fd, char byte);
int cove_recv_fd(int sock);

#endif
