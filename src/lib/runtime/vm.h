/* The vm runtimes (QEMU microvm, Firecracker): what the rest of coved asks them outside the
 * driver ops. docs/vm.md describes the design. */
#ifndef COVE_RUNTIME_VM_H
#define COVE_RUNTIME_VM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "runtime/runtime.h"

extern const struct cove_runtime_ops cove_runtime_vm;

/* 1 with a reason in why when the QEMU vm runtime cannot run here (no QEMU binary, no guest
 * kernel); 0 when it can. */
int cove_vm_unavailable(char *why, size_t cap);
/* The driver for runtime "vm": QEMU (cove_runtime_vm), or Firecracker
 * (cove_runtime_firecracker, runtime/vm_firecracker.h) when COVE_VM_DRIVER=firecracker; and
 * whether it can run here (as cove_vm_unavailable, for that driver). */
const struct cove_runtime_ops *cove_vm_driver(void);
int cove_vm_driver_unavailable(char *why, size_t cap);
/* 1 when /dev/kvm can be opened (hardware virtualisation), 0 otherwise (TCG). */
int cove_vm_kvm_usable(void);

/* Shared by both vm drivers (vm_qemu.c). The guest kernel cache: COVE_VM_KERNEL_DIR or
 * /var/cache/cove/vm (vmlinux, modules/, version); returns buf. */
const char *cove_vm_kernel_dir(char *buf, size_t cap);
/* The initramfs for guest (cove-guest as /init plus the kernel cache's modules), built once
 * into dir/initrd-<key>; its path in out. */
int cove_vm_initrd(const char *dir, const char *guest, char *out, size_t cap, struct cove_err *err);
/* Copy len bytes of in from in_off to out at out_off (copy_file_range: reflinked where the
 * filesystem can; read/write across filesystems). */
int cove_vm_copy_range(int in, off_t in_off, int out, off_t out_off, uint64_t len,
                       struct cove_err *err);
/* A sparse ext4 image at path holding the template rootfs directory (mkfs.ext4 -d). */
int cove_vm_root_image(const char *rootfs, const char *path, struct cove_err *err);

#endif
