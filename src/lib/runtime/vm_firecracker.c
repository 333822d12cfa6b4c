/* Firecracker API requests and availability; see vm_firecracker.h. */
#include "runtime/vm_firecracker.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/vm.h"

static int find_binary(char *out, size_t cap)
{
        const char *env = getenv("COVE_FIRECRACKER");
        if (env && *env) {
                snprintf(out, cap, "%s", env);
                return access(out, X_OK);
        }
        const char *path = getenv("PATH");
        char buf[4096];
        snprintf(buf, sizeof(buf), "%s", path && *path ? path : "/usr/bin:/bin");
        char *save = NULL;
        for (char *d = strtok_r(buf, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
                snprintf(out, cap, "%s/firecracker", d);
                if (access(out, X_OK) == 0)
                        return 0;
        }
        return -1;
}

int cove_fc_unavailable(char *why, size_t cap)
{
        char bin[1024];
        if (find_binary(bin, sizeof(bin)) < 0)
                snprintf(why, cap, "firecracker: no firecracker binary (PATH or COVE_FIRECRACKER)");
        else if (!cove_vm_kvm_usable())
                snprintf(why, cap, "firecracker: needs working KVM (/dev/kvm and vmx/svm)");
        else
                snprintf(why, cap,
                         "firecracker: the driver is not complete in this build (API requests "
                         "only; its guest channel needs vsock)");
        return 1;
}

char *cove_fc_request(const char *method, const char *path, const json_t *body)
{
        if (!method || !path || path[0] != '/' || strpbrk(path, " \r\n") ||
            strpbrk(method, " \r\n"))
                return NULL;
        char *b = body ? json_dumps(body, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (body && !b)
                return NULL;
        size_t bl = b ? strlen(b) : 0;
        char *out = NULL;
        int n;
        if (b)
                n = asprintf(&out,
                             "%s %s HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n"
                             "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                             method, path, bl, b);
        else
                n = asprintf(
                    &out, "%s %s HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n\r\n",
                    method, path);
        free(b);
        return n < 0 ? NULL : out;
}

json_t *cove_fc_boot_source(const char *kernel, const char *initrd, const char *boot_args)
{
        json_t *j = json_pack("{s:s}", "kernel_image_path", kernel);
        if (j && initrd)
                json_object_set_new(j, "initrd_path", json_string(initrd));
        if (j && boot_args)
                json_object_set_new(j, "boot_args", json_string(boot_args));
        return j;
}

json_t *cove_fc_drive(const char *id, const char *path, int root, int read_only)
{
        return json_pack("{s:s, s:s, s:b, s:b}", "drive_id", id, "path_on_host", path,
                         "is_root_device", root, "is_read_only", read_only);
}

json_t *cove_fc_machine(unsigned vcpus, unsigned mem_mib)
{
        return json_pack("{s:I, s:I, s:b}", "vcpu_count", (json_int_t)vcpus, "mem_size_mib",
                         (json_int_t)mem_mib, "smt", 0);
}

json_t *cove_fc_vsock(unsigned cid, const char *uds_path)
{
        return json_pack("{s:I, s:s}", "guest_cid", (json_int_t)cid, "uds_path", uds_path);
}

json_t *cove_fc_action(const char *type)
{
        return json_pack("{s:s}", "action_type", type);
}

json_t *cove_fc_vm_state(int paused)
{
        return json_pack("{s:s}", "state", paused ? "Paused" : "Resumed");
}

json_t *cove_fc_snapshot_create(const char *state_path, const char *mem_path)
{
        return json_pack("{s:s, s:s, s:s}", "snapshot_type", "Full", "snapshot_path", state_path,
                         "mem_file_path", mem_path);
}

json_t *cove_fc_snapshot_load(const char *state_path, const char *mem_path)
{
        return json_pack("{s:s, s:{s:s, s:s}, s:b, s:b}", "snapshot_path", state_path,
                         "mem_backend", "backend_type", "File", "backend_path", mem_path,
                         "enable_diff_snapshots", 0, "resume_vm", 1);
}

int cove_fc_response(const char *buf, size_t len, int *status, char *fault, size_t cap)
{
        if (cap)
                fault[0] = 0;
        const char *end = memmem(buf, len, "\r\n\r\n", 4);
        int st = 0;
        if (!end || len < 12 || memcmp(buf, "HTTP/1.", 7) || sscanf(buf + 9, "%3d", &st) != 1 ||
            st < 100 || st > 599)
                return -1;
        *status = st;
        const char *body = end + 4;
        size_t bl = len - (size_t)(body - buf);
        /* Content-Length must be satisfied: a short read is not a response yet */
        const char *cl = memmem(buf, (size_t)(end - buf), "Content-Length:", 15);
        if (cl) {
                unsigned long want = strtoul(cl + 15, NULL, 10);
                if (want > bl)
                        return -1;
                bl = want;
        }
        if (st >= 400 && bl && cap) {
                json_t *j = json_loadb(body, bl, 0, NULL);
                const char *m = json_string_value(json_object_get(j, "fault_message"));
                snprintf(fault, cap, "%s", m ? m : "(no fault_message)");
                for (char *p = fault; *p; p++)
                        if ((unsigned char)*p < 0x20)
                                *p = ' ';
                json_decref(j);
        }
        return 0;
}

static struct cove_runtime *fc_open(const char *data_dir, struct cove_err *err)
{
        (void)data_dir;
        char why[256];
        cove_fc_unavailable(why, sizeof(why));
        cove_err_setk(err, COVE_E_UNAVAILABLE, 0, "%s", why);
        return NULL;
}

static void fc_close(struct cove_runtime *rt)
{
        (void)rt;
}

const struct cove_runtime_ops cove_runtime_firecracker = {
    .name = "firecracker",
    .open = fc_open,
    .close = fc_close,
};
