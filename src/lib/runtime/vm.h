/* The vm runtimes (QEMU microvm, Firecracker): what the rest of coved asks them outside the
 * driver ops. docs/vm.md describes the design. */
#ifndef COVE_RUNTIME_VM_H
#define COVE_RUNTIME_VM_H

#include <stddef.h>

#include "runtime/runtime.h"

extern const struct cove_runtime_ops cove_runtime_vm;

/* 1 with a reason in why when the QEMU vm runtime cannot run here (no QEMU binary, no guest
 * kernel); 0 when it can. */
int cove_vm_unavailable(char *why, size_t cap);
/* 1 when /dev/kvm can be opened (hardware virtualisation), 0 otherwise (TCG). */
int cove_vm_kvm_usable(void);

#endif
