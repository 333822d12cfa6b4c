/* cove-guest: the in-sandbox daemon (PID 1) and the only end of the guest channel inside a
 * sandbox. It speaks docs/guest-protocol.md over one byte stream: exec with pipes or a PTY,
 * files, inotify watches and usage figures. Also usable as an ordinary process (tests). */
#ifndef COVE_GUEST_GUEST_H
#define COVE_GUEST_GUEST_H

#include <stddef.h>

#include "util/err.h"
#include "util/log.h"

struct cove_guest_opts {
        int channel_fd;             /* connected byte stream to the node; owned by the guest */
        const struct cove_log *log; /* diagnostics (never secrets); NULL: none */
        int vm; /* init of a vm sandbox: HELLO's hostname, time and seed apply to the system */
        /* vm over vsock: the listening socket the channel came from (owned by the guest; a
         * value <= 2, the default 0 included, means none: fds 0-2 are the console). A channel that
         * ends (EOF or reset: the node went, or the VMM restored a snapshot, which resets every
         * vsock connection) is replaced by the next connection accepted on it; processes keep
         * running and the new node shakes hands first. */
        int listen_fd;
};

/* Run the guest until the channel ends. Takes ownership of opts->channel_fd.
 * Blocks SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGPIPE in the calling process (it expects to
 * be the whole program: PID 1, or a forked child in tests). SIGTERM/SIGINT/SIGHUP received
 * by the guest are forwarded to the process groups it started.
 * Returns 0 when the node closed the channel (end of file), -1 with err on a protocol
 * violation, a refused handshake or a system failure. In every case all processes it
 * started are killed (SIGKILL to their process groups) and reaped before it returns. */
int cove_guest_run(const struct cove_guest_opts *opts, struct cove_err *err);

/* ns sandboxes: the sandbox's memory cgroup (rooted at its own group) is mounted here; every
 * process the guest starts moves itself into work/ before it execs, so that an OOM of the
 * workload never picks the guest (runtime/cgroup.h). Absent in vm sandboxes. */
#define COVE_GUEST_CGROUP_DIR "/dev/.cove-cgroup"
#define COVE_GUEST_WORK_PROCS COVE_GUEST_CGROUP_DIR "/work/cgroup.procs"
/* cgroup v1 only: the guest's child moves itself through this file (a thread, itself: no
 * host-wide lock); cgroup.procs where it is absent or not delegated */
#define COVE_GUEST_WORK_TASKS COVE_GUEST_CGROUP_DIR "/work/tasks"

/* In-sandbox requests to the node (docs/guest-protocol.md, "Asks"). */
#define COVE_ASK_SOCKET "cove-guest-ask" /* abstract unix socket name */
#define COVE_ASK_MAX 4096                /* bytes of one request line */
/* Client side (`cove-guest request-credential`): send one JSON line, get the answer line
 * into out. 0 or -1 (out says why). */
int cove_guest_ask(const char *line, char *out, size_t cap, int timeout_ms);
/* vm sandboxes (vminit.c): as PID 1 of the initramfs, load the modules, switch to the root
 * disk, set up /dev, /proc, /sys and open the guest channel: the virtio-serial port
 * (*chan_fd; *listen_fd = -1) or, with cove.chan=vsock:PORT on the kernel command line, a
 * listening AF_VSOCK socket on PORT (*listen_fd; *chan_fd = -1). */
int cove_guest_vm_init(int *chan_fd, int *listen_fd, struct cove_err *err);
/* Wait for the node: until it has connected to the port's host end, or (listen_fd >= 0)
 * accept its connection into *chan_fd. */
int cove_guest_vm_wait_node(int *chan_fd, int listen_fd);
/* The guest channel the kernel command line asks for: 1 with *port for cove.chan=vsock:PORT
 * (1..4294967294), 0 for none or cove.chan=virtio (virtio-serial), -1 for a malformed value.
 * The last cove.chan= wins. */
int cove_guest_vm_chan_port(const char *cmdline, unsigned *port);
/* Mix a seed from the node into the kernel's RNG (credited). */
void cove_guest_vm_seed(const unsigned char *seed, size_t len);
/* Bind a fresh random boot_id over /proc/sys/kernel/random/boot_id (a fork of a running VM,
 * whose kernel generated its boot_id before the snapshot). 0 or -1 with errno. */
int cove_guest_vm_new_boot_id(void);
_Noreturn void cove_guest_vm_poweroff(void);

#endif
