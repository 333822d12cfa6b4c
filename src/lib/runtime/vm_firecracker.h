/* Firecracker (docs/vm.md): the REST API requests a Firecracker vm driver sends over the
 * VMM's unix socket, and whether the driver can run on this host. The driver itself is
 * not complete: it needs a firecracker binary and working KVM (neither exists on the
 * development machine) and a vsock guest channel (Firecracker has no virtio-serial), so
 * cove_runtime_firecracker.open() always reports itself unavailable, with the reason. */
#ifndef COVE_RUNTIME_VM_FIRECRACKER_H
#define COVE_RUNTIME_VM_FIRECRACKER_H

#include <jansson.h>
#include <stddef.h>

#include "runtime/runtime.h"

extern const struct cove_runtime_ops cove_runtime_firecracker;

/* 1 with why filled when the driver cannot run here (always, in this build). */
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
 * control characters replaced). -1 when it is not a complete HTTP response. */
int cove_fc_response(const char *buf, size_t len, int *status, char *fault, size_t cap);

#endif
