/* Encrypted vm disk overlays: a qcow2 v3 overlay whose data clusters are encrypted with LUKS1
 * (QEMU's `encrypt.format=luks`), written here instead of by `qemu-img create`. QEMU's own
 * creation benchmarks PBKDF2 twice for at least 0.5 s of CPU each, whatever encrypt.iter-time
 * says (~1.8 s of CPU, 4 s on this loaded host per create); our keys are 256 random bits
 * from the tenant's data key, so the PBKDF iterations are set low and fixed instead
 * (docs/vm.md "Encrypted disks"). QEMU opens the result like its own. */
#ifndef COVE_RUNTIME_LUKS_H
#define COVE_RUNTIME_LUKS_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

/* PBKDF2-SHA256 iterations of the key slot and of the master key digest (QEMU's minimum) */
#define COVE_LUKS_ITERS 1000

/* Create path (new, 0600; replaced if it exists) as a qcow2 overlay of backing (a path
 * QEMU resolves, format backing_fmt) with the backing's virtual size, its data encrypted
 * with LUKS1 aes-256-xts-plain64 / sha256 under a fresh random master key held in key slot
 * 0 for passphrase pass. iters: PBKDF2 iterations (>= 1000). On failure nothing is left. */
int cove_luks_qcow2_create(const char *path, const char *backing, const char *backing_fmt,
                           const void *pass, size_t pass_len, unsigned iters, struct cove_err *err);

/* The virtual size of the qcow2 image at path (its header), or -1 with err. */
int64_t cove_qcow2_virtual_size(const char *path, struct cove_err *err);

#endif
