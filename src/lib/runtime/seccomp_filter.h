/* The ns runtime's seccomp-bpf policy: default allow, deny the kernel attack surface a
 * sandbox never needs with EPERM (clone3 with ENOSYS so libc falls back to clone, whose
 * flags can be checked), and refuse sockets of address families other than unix, inet, inet6
 * and netlink (route and sock_diag only) with EAFNOSUPPORT (EPROTONOSUPPORT for the other
 * netlink protocols). Compiled once with libseccomp into a raw BPF program, so the sandbox
 * child (a fork of a multi-threaded process) only has to call prctl(). */
#ifndef COVE_RUNTIME_SECCOMP_FILTER_H
#define COVE_RUNTIME_SECCOMP_FILTER_H

#include <linux/filter.h>

#include "util/err.h"

/* Build the policy into *prog (caller frees prog->filter with free()). Non-native ABIs
 * (i386 via int 0x80, x32) kill the process. */
int cove_seccomp_build(struct sock_fprog *prog, struct cove_err *err);

/* Install prog on the calling thread, without no_new_privs: the caller must hold
 * CAP_SYS_ADMIN in its user namespace (the sandbox's root does in the sandbox's own), or the
 * kernel refuses (-EACCES: nothing is installed, the caller fails). So setuid binaries in
 * the sandbox (sudo) work, raising to the sandbox's root at most, under the same filter.
 * Async-signal-safe; returns -errno. */
int cove_seccomp_install(const struct sock_fprog *prog);

#endif
