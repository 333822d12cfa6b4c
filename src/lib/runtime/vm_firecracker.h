/* Firecracker (docs/vm.md "Firecracker"): a vm driver that runs each sandbox in a Firecracker
 * microVM driven over its REST API (HTTP/1.1 on a unix socket), with the guest channel over
 * hybrid vsock. It runs only where a firecracker binary (COVE_FIRECRACKER, or PATH) and
 * usable KVM exist; elsewhere open() reports itself unavailable with the reason. coved uses
 * it for runtime "vm" instead of QEMU when COVE_VM_DRIVER=firecracker.
 *
 * This header also exports the pieces its unit tests drive against a fake API server (the
 * development machine has neither firecracker nor usable KVM): request and body builders,
 * the bounded HTTP client, the boot and snapshot-load sequences, the hybrid vsock handshake.
 * Every byte read from the VMM is bounded and validated (a VMM may be compromised by its
 * guest). */
#ifndef COVE_RUNTIME_VM_FIRECRACKER_H
#define COVE_RUNTIME_VM_FIRECRACKER_H

#include <jansson.h>
#include <stddef.h>

#include "runtime/runtime.h"

extern const struct cove_runtime_ops cove_runtime_firecracker;

#define COVE_FC_RESP_MAX 16384    /* bytes of one API response, headers included */
#define COVE_FC_VSOCK_PORT 1024   /* the guest's listening port (cove.chan=vsock:1024) */
#define COVE_FC_VSOCK_LINE_MAX 32 /* "OK <host port>\n" */

/* 0 when the driver can run here; 1 with why filled when not (no binary, no usable KVM, no
 * guest kernel), in that order. */
int cove_fc_unavailable(char *why, size_t cap);

/* One HTTP/1.1 request (Host: localhost, JSON body, Content-Length); malloc'd, NULL on
 * a bad argument. body is borrowed; NULL: no body. */
char *cove_fc_request(const char *method, const char *path, const json_t *body);

/* Bodies of the API calls the driver makes (new references). */
json_t *cove_fc_boot_source(const char *kernel, const char *initrd, const char *boot_args);
json_t *cove_fc_drive(const char *id, const char *path, int root, int read_only);
json_t *cove_fc_machine(unsigned vcpus, unsigned mem_mib);
json_t *cove_fc_vsock(unsigned cid, const char *uds_path);
json_t *cove_fc_action(const char *type); /* "InstanceStart" */
json_t *cove_fc_vm_state(int paused);     /* PATCH /vm */
json_t *cove_fc_snapshot_create(const char *state_path, const char *mem_path);
/* load with the memory file mapped privately (backend File) and resume */
json_t *cove_fc_snapshot_load(const char *state_path, const char *mem_path);

/* Parse a response: 0 with *status; for 4xx/5xx, fault gets "fault_message" (bounded,
 * control characters replaced). -1 when it is not a complete HTTP response (yet). */
int cove_fc_response(const char *buf, size_t len, int *status, char *fault, size_t cap);

/* One API call over the unix socket at sock (a fresh connection per call): send the request,
 * read the answer (at most COVE_FC_RESP_MAX bytes, timeout_ms for the whole exchange). 0 for
 * a 2xx answer; -1 with err otherwise: "firecracker: PUT /path: 400: <fault_message>" for
 * an error answer, COVE_E_UNAVAILABLE when the socket cannot be reached or times out. */
int cove_fc_call(const char *sock, const char *method, const char *path, const json_t *body,
                 int timeout_ms, struct cove_err *err);

/* A cold boot: PUT /boot-source, /drives/rootfs, /machine-config, /vsock, then
 * /actions InstanceStart, stopping at the first failure. Paths are as the VMM sees them
 * (relative ones resolve in its working directory). */
struct cove_fc_boot {
        const char *kernel, *initrd, *boot_args;
        const char *disk;      /* raw ext4 image, the root device, writable */
        const char *vsock_uds; /* hybrid vsock unix socket the VMM creates */
        unsigned vcpus, mem_mib, cid;
};
int cove_fc_boot(const char *sock, const struct cove_fc_boot *b, int timeout_ms,
                 struct cove_err *err);
/* PUT /snapshot/load (memory file mapped privately, resume_vm true). */
int cove_fc_load(const char *sock, const char *state, const char *mem, int timeout_ms,
                 struct cove_err *err);

/* Hybrid vsock (Firecracker's docs/vsock.md): connect to the VMM's vsock unix socket, send
 * "CONNECT <port>\n" and accept only "OK <host port>\n" (digits, at most
 * COVE_FC_VSOCK_LINE_MAX bytes, read one byte at a time so that nothing after the line is
 * consumed). Returns the connected, blocking fd: a byte stream to the guest's listener. -1
 * with err otherwise; COVE_E_UNAVAILABLE (errno ECONNRESET) when the VMM closed the
 * connection before answering (nothing listens on the port yet). */
int cove_fc_vsock_connect(const char *uds, unsigned port, int timeout_ms, struct cove_err *err);
/* 0 when line[0..len) is exactly "OK <1-10 digits, a u32>\n", else -1. */
int cove_fc_vsock_answer(const char *line, size_t len);

#endif
