/* The Firecracker vm driver (see vm_firecracker.h, docs/vm.md "Firecracker").
 *
 * Layout: <data_dir>/fc/ holds the initramfs (the QEMU driver's, cove_vm_initrd) and
 * tpl/<key>/ per (template rootfs, memory, cpus, guest build): disk.img (raw ext4 of the
 * rootfs, as the template VM left it), state and mem (its Full snapshot), ready (written
 * last). The template VM boots once (as root: it runs only cove-guest) until cove-guest
 * prints that it waits for its node, then is paused and snapshotted.
 *
 * A sandbox: <state_dir>/fc/ owned by the sandbox's uid is Firecracker's working directory;
 * it holds disk.img (a reflink clone, or a sparse copy, of the template's: Firecracker has no
 * qcow2 overlays), api.sock and v.sock (hybrid vsock). The template snapshot recorded the
 * drive and vsock paths relative ("disk.img", "v.sock"), so the same snapshot loads in
 * every sandbox's own directory. The snapshot's state and memory files are opened by coved
 * and inherited (the VMM names them /proc/self/fd/3 and 4, it opens no path of coved's);
 * the memory file is mapped privately (backend File: copy-on-write, never written).
 *
 * Confinement as for QEMU: the sandbox's own uid, PR_SET_PDEATHSIG, cgroup cove/<id>, an
 * empty network namespace (no network device: egress is not wired for Firecracker), and
 * Firecracker's own built-in seccomp filters. Guest channel: hybrid vsock, "CONNECT 1024"
 * on v.sock; the guest (vminit.c, cove.chan=vsock:1024) listens there. */
#include "runtime/vm_firecracker.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/fs.h>

#include "runtime/cgroup.h"
#include "runtime/vm.h"
#include "util/cleanup.h"
#include "util/util.h"

#define FC_MEM_DEFAULT_MB 256
#define FC_MEM_OVERHEAD_MB 64 /* the VMM itself, on top of the guest's RAM, in the cgroup */
#define FC_API_TIMEOUT_MS 10000
#define FC_BOOT_TIMEOUT_MS 60000
#define FC_CHAN_TIMEOUT_MS 10000
#define FC_READY_MARK "cove-guest: waiting for the node"
#define FC_ID_MAX 128
#define FC_CID 3
/* pci=off: virtio-mmio only; reboot=k panic=1: a guest reboot or panic ends the VMM;
 * cove.chan: the guest listens on vsock instead of looking for a virtio-serial port */
#define FC_BOOT_ARGS                                                                               \
        "console=ttyS0 reboot=k panic=1 pci=off quiet loglevel=1 random.trust_cpu=off "            \
        "cove.chan=vsock:1024"

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
        char bin[1024], kd[PATH_MAX], p[PATH_MAX + 32];
        cove_vm_kernel_dir(kd, sizeof(kd));
        if (find_binary(bin, sizeof(bin)) < 0) {
                snprintf(why, cap, "firecracker: no firecracker binary (PATH or COVE_FIRECRACKER)");
                return 1;
        }
        if (!cove_vm_kvm_usable()) {
                snprintf(why, cap,
                         "firecracker: %s found, but it needs working KVM (/dev/kvm and a CPU "
                         "with vmx/svm); this host has none",
                         bin);
                return 1;
        }
        snprintf(p, sizeof(p), "%s/vmlinux", kd);
        if (access(p, R_OK) < 0) {
                snprintf(why, cap, "firecracker: no guest kernel at %s (run scripts/install-deps)",
                         p);
                return 1;
        }
        snprintf(p, sizeof(p), "%s/modules/order", kd);
        if (access(p, R_OK) < 0) {
                snprintf(why, cap, "firecracker: no guest modules at %s (run scripts/install-deps)",
                         p);
                return 1;
        }
        if (cap)
                why[0] = 0;
        return 0;
}

/* ---- API requests and responses ----------------------------------------------------- */

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

/* The value of header name (case-insensitive) in the header block [buf, end), or NULL. */
static const char *header(const char *buf, const char *end, const char *name)
{
        size_t nl = strlen(name);
        for (const char *p = buf; p && p < end;) {
                const char *eol = memmem(p, (size_t)(end - p), "\r\n", 2);
                if (!eol)
                        eol = end;
                if ((size_t)(eol - p) > nl && !strncasecmp(p, name, nl) && p[nl] == ':') {
                        p += nl + 1;
                        while (p < eol && (*p == ' ' || *p == '\t'))
                                p++;
                        return p;
                }
                p = eol + 2;
        }
        return NULL;
}

int cove_fc_response(const char *buf, size_t len, int *status, char *fault, size_t cap)
{
        if (cap)
                fault[0] = 0;
        const char *end = memmem(buf, len, "\r\n\r\n", 4);
        if (!end || len < 12 || memcmp(buf, "HTTP/1.", 7) || (buf[7] != '0' && buf[7] != '1') ||
            buf[8] != ' ')
                return -1;
        int st = 0;
        for (int i = 9; i < 12; i++) {
                if (buf[i] < '0' || buf[i] > '9')
                        return -1;
                st = st * 10 + (buf[i] - '0');
        }
        if (st < 100 || st > 599 || (buf[12] != ' ' && buf[12] != '\r'))
                return -1;
        const char *body = end + 4;
        size_t bl = len - (size_t)(body - buf);
        /* Content-Length must be satisfied: a short read is not a response yet */
        const char *cl = header(buf, end + 2, "Content-Length");
        if (cl) {
                if (*cl < '0' || *cl > '9')
                        return -1;
                char *e;
                unsigned long long want = strtoull(cl, &e, 10);
                if ((*e != '\r' && *e != ' ') || want > COVE_FC_RESP_MAX)
                        return -1;
                if (want > bl)
                        return -1;
                bl = (size_t)want;
        }
        *status = st;
        if (st >= 400 && cap) {
                json_t *j = bl ? json_loadb(body, bl, 0, NULL) : NULL;
                const char *m = json_string_value(json_object_get(j, "fault_message"));
                snprintf(fault, cap, "%s", m ? m : "(no fault_message)");
                for (char *p = fault; *p; p++)
                        if ((unsigned char)*p < 0x20 || (unsigned char)*p == 0x7f)
                                *p = ' ';
                json_decref(j);
        }
        return 0;
}

/* ---- the bounded client --------------------------------------------------------------- */

static int ms_left(int64_t deadline)
{
        int64_t l = (deadline - cove_mono_ns()) / 1000000;
        return l <= 0 ? 0 : l > INT_MAX ? INT_MAX : (int)l;
}

/* poll one fd until ev or the deadline: 1 ready, 0 timed out, -1 error */
static int wait_io(int fd, short ev, int64_t deadline)
{
        for (;;) {
                int left = ms_left(deadline);
                if (left == 0)
                        return 0;
                struct pollfd p = {.fd = fd, .events = ev};
                int r = poll(&p, 1, left);
                if (r < 0 && errno == EINTR)
                        continue;
                return r < 0 ? -1 : r > 0;
        }
}

/* A connected, non-blocking unix stream socket to path. The VMM creates its sockets in a
 * directory it owns, so the last component is opened without following symlinks (a VMM
 * must not point coved at another socket, coved's own API included) and must be a socket;
 * connect() then goes through /proc/self/fd/N, which also lifts sun_path's length limit. */
static int unix_connect(const char *path, struct cove_err *err)
{
        cleanup_close int pfd = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
        struct stat st;
        if (pfd < 0 || fstat(pfd, &st) < 0)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, errno, "socket %s", path);
        if (!S_ISSOCK(st.st_mode))
                return cove_err_setk(err, COVE_E_INTERNAL, ENOTSOCK, "socket %s: not a socket",
                                     path);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        snprintf(a.sun_path, sizeof(a.sun_path), "/proc/self/fd/%d", pfd);
        int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s < 0)
                return cove_err_set(err, errno, "socket");
        if (connect(s, (struct sockaddr *)&a, sizeof(a)) < 0) {
                int e = errno;
                close(s);
                return cove_err_setk(err, COVE_E_UNAVAILABLE, e, "connect %s", path);
        }
        fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
        return s;
}

static int send_all(int fd, const char *p, size_t n, int64_t deadline, struct cove_err *err)
{
        while (n > 0) {
                ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
                if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
                        int w = wait_io(fd, POLLOUT, deadline);
                        if (w <= 0)
                                return cove_err_setk(err, COVE_E_UNAVAILABLE, w ? errno : ETIMEDOUT,
                                                     "send");
                        continue;
                }
                if (k < 0)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, errno, "send");
                p += k;
                n -= (size_t)k;
        }
        return 0;
}

int cove_fc_call(const char *sock, const char *method, const char *path, const json_t *body,
                 int timeout_ms, struct cove_err *err)
{
        cleanup_free char *req = cove_fc_request(method, path, body);
        if (!req)
                return cove_err_setk(err, COVE_E_INTERNAL, EINVAL, "firecracker: bad request %s",
                                     path ? path : "(null)");
        int64_t deadline = cove_mono_ns() + (int64_t)timeout_ms * 1000000;
        cleanup_close int fd = unix_connect(sock, err);
        if (fd < 0 || send_all(fd, req, strlen(req), deadline, err) < 0)
                return cove_err_wrap(err, "firecracker: %s %s", method, path);
        cleanup_free char *buf = malloc(COVE_FC_RESP_MAX + 1);
        if (!buf)
                return cove_err_set(err, ENOMEM, "firecracker");
        size_t len = 0;
        int st = 0;
        char fault[256];
        for (;;) {
                if (len > 0 && cove_fc_response(buf, len, &st, fault, sizeof(fault)) == 0)
                        break;
                if (len == COVE_FC_RESP_MAX)
                        return cove_err_setk(err, COVE_E_INTERNAL, EMSGSIZE,
                                             "firecracker: %s %s: answer over %d bytes or not "
                                             "HTTP",
                                             method, path, COVE_FC_RESP_MAX);
                ssize_t k = read(fd, buf + len, COVE_FC_RESP_MAX - len);
                if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
                        int w = wait_io(fd, POLLIN, deadline);
                        if (w <= 0)
                                return cove_err_setk(err, COVE_E_UNAVAILABLE, w ? errno : ETIMEDOUT,
                                                     "firecracker: %s %s: no answer", method, path);
                        continue;
                }
                if (k <= 0)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, k < 0 ? errno : 0,
                                             "firecracker: %s %s: %s", method, path,
                                             k < 0 ? "read"
                                                   : "connection closed before a whole answer");
                len += (size_t)k;
        }
        if (st < 200 || st > 299)
                return cove_err_setk(err, COVE_E_INTERNAL, 0, "firecracker: %s %s: %d: %s", method,
                                     path, st, fault[0] ? fault : "(no fault_message)");
        return 0;
}

static int call_new(const char *sock, const char *method, const char *path, json_t *body,
                    int timeout_ms, struct cove_err *err)
{
        if (!body)
                return cove_err_set(err, ENOMEM, "firecracker: %s", path);
        int r = cove_fc_call(sock, method, path, body, timeout_ms, err);
        json_decref(body);
        return r;
}

int cove_fc_boot(const char *sock, const struct cove_fc_boot *b, int timeout_ms,
                 struct cove_err *err)
{
        if (call_new(sock, "PUT", "/boot-source",
                     cove_fc_boot_source(b->kernel, b->initrd, b->boot_args), timeout_ms,
                     err) < 0 ||
            call_new(sock, "PUT", "/drives/rootfs", cove_fc_drive("rootfs", b->disk, 1, 0),
                     timeout_ms, err) < 0 ||
            call_new(sock, "PUT", "/machine-config", cove_fc_machine(b->vcpus, b->mem_mib),
                     timeout_ms, err) < 0 ||
            call_new(sock, "PUT", "/vsock", cove_fc_vsock(b->cid, b->vsock_uds), timeout_ms, err) <
                0 ||
            call_new(sock, "PUT", "/actions", cove_fc_action("InstanceStart"), timeout_ms, err) < 0)
                return -1;
        return 0;
}

int cove_fc_load(const char *sock, const char *state, const char *mem, int timeout_ms,
                 struct cove_err *err)
{
        return call_new(sock, "PUT", "/snapshot/load", cove_fc_snapshot_load(state, mem),
                        timeout_ms, err);
}

int cove_fc_vsock_answer(const char *line, size_t len)
{
        /* "OK " 1..10 digits (the host-side port, a u32) "\n", nothing else */
        if (len < 5 || len > COVE_FC_VSOCK_LINE_MAX || memcmp(line, "OK ", 3) ||
            line[len - 1] != '\n')
                return -1;
        unsigned long long v = 0;
        size_t d = 0;
        for (; 3 + d < len - 1; d++) {
                char c = line[3 + d];
                if (c < '0' || c > '9' || d >= 10)
                        return -1;
                v = v * 10 + (unsigned)(c - '0');
        }
        return d == 0 || v > 0xffffffffULL ? -1 : 0;
}

int cove_fc_vsock_connect(const char *uds, unsigned port, int timeout_ms, struct cove_err *err)
{
        int64_t deadline = cove_mono_ns() + (int64_t)timeout_ms * 1000000;
        cleanup_close int fd = unix_connect(uds, err);
        if (fd < 0)
                return cove_err_wrap(err, "firecracker vsock");
        char line[COVE_FC_VSOCK_LINE_MAX + 1];
        int n = snprintf(line, sizeof(line), "CONNECT %u\n", port);
        if (send_all(fd, line, (size_t)n, deadline, err) < 0)
                return cove_err_wrap(err, "firecracker vsock");
        size_t len = 0;
        for (;;) {
                if (len == COVE_FC_VSOCK_LINE_MAX)
                        return cove_err_setk(err, COVE_E_INTERNAL, EMSGSIZE,
                                             "firecracker vsock: answer to CONNECT longer than %d "
                                             "bytes",
                                             COVE_FC_VSOCK_LINE_MAX);
                ssize_t k = read(fd, line + len, 1);
                if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
                        int w = wait_io(fd, POLLIN, deadline);
                        if (w <= 0)
                                return cove_err_setk(err, COVE_E_UNAVAILABLE, w ? errno : ETIMEDOUT,
                                                     "firecracker vsock: no answer to CONNECT %u",
                                                     port);
                        continue;
                }
                if (k < 0 && errno != ECONNRESET)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, errno,
                                             "firecracker vsock: read");
                if (k <= 0)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, ECONNRESET,
                                             "firecracker vsock: connection closed before OK "
                                             "(nothing listens on guest port %u yet)",
                                             port);
                if (line[len++] == '\n')
                        break;
        }
        line[len] = 0;
        if (cove_fc_vsock_answer(line, len) < 0) {
                for (size_t i = 0; i < len; i++)
                        if ((unsigned char)line[i] < 0x20 || (unsigned char)line[i] > 0x7e)
                                line[i] = '?';
                return cove_err_setk(err, COVE_E_INTERNAL, EPROTO,
                                     "firecracker vsock: bad answer to CONNECT %u: \"%s\"", port,
                                     line);
        }
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        int r = fd;
        fd = -1;
        return r;
}

/* ---- the driver --------------------------------------------------------------------- */

struct cove_runtime {
        char dir[PATH_MAX]; /* <data_dir>/fc */
        char kdir[PATH_MAX];
        char bin[PATH_MAX];
        struct cove_cgroups *cg;
        pthread_mutex_t tpl_mu; /* template builds */
};

struct fc_inst {
        char id[FC_ID_MAX + 1];
        char dir[PATH_MAX];      /* <state_dir>/fc: the VMM's working directory */
        char api[PATH_MAX + 16]; /* <dir>/api.sock */
        pthread_mutex_t mu;      /* API calls that must not interleave (snapshot) */
        int cg;
        uid_t uid; /* the VMM's */
        unsigned mem_mb, cpus;
};

/* A full snapshot image (one file, one stream in the chunk store):
 *   [0, 4096)   struct fcf_hdr
 *   disk        disk.img as it was while the VM was paused
 *   state       Firecracker's snapshot state file (devices, vCPUs)
 *   mem         its memory file; every part starts 2 MiB aligned (the store's chunks) */
#define FCF_MAGIC "COVEFCF1"
#define FCF_ALIGN (2u << 20)
struct fcf_hdr {
        char magic[8];
        uint32_t version, mem_mb, cpus, pad;
        uint64_t off[3], len[3]; /* disk, state, mem */
};

static void nap_ms(long ms)
{
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
}

static void reap(pid_t pid, int grace_ms)
{
        for (int t = 0; t < grace_ms; t += 5) {
                pid_t w = waitpid(pid, NULL, WNOHANG);
                if (w == pid || (w < 0 && errno == ECHILD))
                        return;
                nap_ms(5);
        }
        kill(pid, SIGKILL);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
                ;
}

/* len bytes of in at in_off into out at out_off, data extents only (holes stay holes). */
static int copy_sparse(int in, off_t in_off, int out, off_t out_off, uint64_t len,
                       struct cove_err *err)
{
        off_t end = in_off + (off_t)len, pos = in_off;
        while (pos < end) {
                off_t data = lseek(in, pos, SEEK_DATA);
                if (data < 0 && errno == ENXIO)
                        break;
                off_t hole = data < 0 ? -1 : lseek(in, data, SEEK_HOLE);
                if (data < 0 || hole < 0)
                        return cove_err_set(err, errno, "seek");
                if (data >= end)
                        break;
                if (hole > end)
                        hole = end;
                if (cove_vm_copy_range(in, data, out, out_off + (data - in_off),
                                       (uint64_t)(hole - data), err) < 0)
                        return -1;
                pos = hole;
        }
        return 0;
}

/* New file path (0600) with the content of [off, off+len) of in: a reflink clone of the
 * whole file when possible, else the data extents. */
static int copy_out(int in, off_t off, uint64_t len, int whole, const char *path, uid_t uid,
                    struct cove_err *err)
{
        cleanup_close int out = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (out < 0)
                return cove_err_set(err, errno, "create %s", path);
        if (!(whole && ioctl(out, FICLONE, in) == 0) &&
            (ftruncate(out, (off_t)len) < 0 || copy_sparse(in, off, out, 0, len, err) < 0))
                return cove_err_wrap(err, "copy into %s", path);
        if (fchown(out, uid, uid) < 0)
                return cove_err_set(err, errno, "chown %s", path);
        return 0;
}

struct spawn {
        struct cove_runtime *rt;
        const char *cwd; /* the VMM's working directory */
        int fds[2];      /* become fds 3 and 4 */
        int nfds;
        uid_t uid;         /* 0: stay root (template boot) */
        const char *cg_id; /* cgroup to join before exec, or NULL */
        int out_fd;        /* stdout (the guest's serial console); -1: /dev/null */
        int log_fd;        /* stderr */
};

static pid_t spawn(struct spawn *s, struct cove_err *err)
{
        const char *argv[] = {s->rt->bin, "--api-sock", "api.sock", NULL};
        int sync[2], done[2];
        if (pipe2(sync, O_CLOEXEC) < 0)
                return cove_err_set(err, errno, "firecracker: pipe");
        if (pipe2(done, O_CLOEXEC) < 0) {
                close(sync[0]);
                close(sync[1]);
                return cove_err_set(err, errno, "firecracker: pipe");
        }
        pid_t pid = fork();
        if (pid < 0) {
                cove_err_set(err, errno, "firecracker: fork");
                close(sync[0]);
                close(sync[1]);
                close(done[0]);
                close(done[1]);
                return -1;
        }
        if (pid == 0) {
                /* async-signal-safe only (coved is multi-threaded) */
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                sigset_t none;
                sigemptyset(&none);
                sigprocmask(SIG_SETMASK, &none, NULL);
                for (int i = 1; i < NSIG; i++)
                        signal(i, SIG_DFL);
                char b;
                if (read(sync[0], &b, 1) != 1)
                        _exit(127);
                /* everything up high first, so that no dup2 below overwrites a source */
                int hi[2] = {-1, -1};
                for (int i = 0; i < s->nfds; i++)
                        if ((hi[i] = fcntl(s->fds[i], F_DUPFD, 64)) < 0)
                                _exit(126);
                int nul = open("/dev/null", O_RDWR);
                int ohi = fcntl(s->out_fd >= 0 ? s->out_fd : nul, F_DUPFD, 64);
                int lhi = fcntl(s->log_fd, F_DUPFD, 64);
                int dhi = fcntl(done[1], F_DUPFD_CLOEXEC, 64);
                if (nul < 0 || ohi < 0 || lhi < 0 || dhi < 0 || dup2(nul, 0) < 0 ||
                    dup2(ohi, 1) < 0 || dup2(lhi, 2) < 0)
                        _exit(126);
                for (int i = 0; i < s->nfds; i++)
                        if (dup2(hi[i], 3 + i) < 0)
                                _exit(126);
                /* an empty network namespace: the VM has no network device */
                if (unshare(CLONE_NEWNET) < 0 || chdir(s->cwd) < 0)
                        _exit(124);
                int keep = 3 + s->nfds;
                if (dup3(dhi, keep, O_CLOEXEC) < 0)
                        _exit(126);
                syscall(SYS_close_range, keep + 1, ~0U, 0);
                if (s->uid) {
                        if (syscall(SYS_setgroups, 0, NULL) < 0 ||
                            syscall(SYS_setresgid, s->uid, s->uid, s->uid) < 0 ||
                            syscall(SYS_setresuid, s->uid, s->uid, s->uid) < 0)
                                _exit(125);
                        prctl(PR_SET_PDEATHSIG, SIGKILL); /* cleared by the uid change */
                }
                execv(argv[0], (char *const *)argv);
                _exit(127);
        }
        close(sync[0]);
        int r = 0;
        if (s->cg_id && s->rt->cg)
                r = cove_cgroup_attach(s->rt->cg, s->cg_id, pid, err);
        if (r == 0 && write(sync[1], "g", 1) != 1)
                r = cove_err_set(err, errno, "firecracker: start");
        close(sync[1]);
        close(done[1]);
        if (r == 0) {
                /* closed by the exec (CLOEXEC) or the child's exit */
                char b;
                while (read(done[0], &b, 1) < 0 && errno == EINTR)
                        ;
        }
        close(done[0]);
        if (r < 0) {
                kill(pid, SIGKILL);
                while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
                        ;
                return -1;
        }
        return pid;
}

/* Wait (bounded) until the VMM answers on its API socket. It creates the socket shortly
 * after exec and announces it nowhere, so look every 2 ms; a VMM that exits ends the wait
 * (reaped: *pid becomes -1, so that nobody signals a recycled pid). */
static int wait_api(const char *api, pid_t *pidp, struct cove_err *err)
{
        pid_t pid = *pidp;
        int64_t deadline = cove_mono_ns() + (int64_t)FC_API_TIMEOUT_MS * 1000000;
        for (;;) {
                struct cove_err e2;
                int fd = unix_connect(api, &e2);
                if (fd >= 0) {
                        close(fd);
                        return 0;
                }
                int st;
                if (waitpid(pid, &st, WNOHANG) == pid) {
                        *pidp = -1;
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                             "firecracker exited at start (status %d)",
                                             WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
                }
                if (ms_left(deadline) == 0)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, ETIMEDOUT,
                                             "firecracker: no API socket (%s)", e2.msg);
                nap_ms(2);
        }
}

/* Append the end of the VMM's log to err. */
static void add_log_tail(struct cove_err *err, const char *path)
{
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return;
        char buf[201];
        off_t end = lseek(fd, 0, SEEK_END);
        ssize_t n = pread(fd, buf, sizeof(buf) - 1, end > 200 ? end - 200 : 0);
        close(fd);
        if (n <= 0)
                return;
        buf[n] = 0;
        for (ssize_t i = 0; i < n; i++)
                if ((unsigned char)buf[i] < 0x20)
                        buf[i] = ' ';
        char m[sizeof(err->msg)];
        snprintf(m, sizeof(m), "%s", err->msg);
        snprintf(err->msg, sizeof(err->msg), "%s; firecracker: %s", m, buf);
}

/* ---- templates ---------------------------------------------------------------------- */

struct tpl {
        char dir[PATH_MAX];
        char disk[PATH_MAX + 16], state[PATH_MAX + 16], mem[PATH_MAX + 16];
};

static uint64_t fnv64(uint64_t h, const void *p, size_t n)
{
        const unsigned char *b = p;
        for (size_t i = 0; i < n; i++) {
                h ^= b[i];
                h *= 0x100000001b3ULL;
        }
        return h;
}

static void tpl_paths(struct cove_runtime *rt, const char *rootfs, unsigned mem, unsigned cpus,
                      const char *initrd, struct tpl *t)
{
        struct stat st;
        memset(&st, 0, sizeof(st));
        stat(rootfs, &st);
        uint64_t h = 0xcbf29ce484222325ULL;
        h = fnv64(h, rootfs, strlen(rootfs));
        h = fnv64(h, &st.st_ino, sizeof(st.st_ino));
        h = fnv64(h, &st.st_ctim, sizeof(st.st_ctim));
        h = fnv64(h, &mem, sizeof(mem));
        h = fnv64(h, &cpus, sizeof(cpus));
        h = fnv64(h, initrd, strlen(initrd));
        h = fnv64(h, rt->bin, strlen(rt->bin));
        snprintf(t->dir, sizeof(t->dir), "%s/tpl/%016llx", rt->dir, (unsigned long long)h);
        snprintf(t->disk, sizeof(t->disk), "%s/disk.img", t->dir);
        snprintf(t->state, sizeof(t->state), "%s/state", t->dir);
        snprintf(t->mem, sizeof(t->mem), "%s/mem", t->dir);
}

/* Read the template's serial console (the VMM's stdout) until cove-guest says it waits. */
static int wait_ready(int con, struct cove_err *err)
{
        char tail[2048];
        size_t len = 0;
        tail[0] = 0;
        int64_t deadline = cove_mono_ns() + (int64_t)FC_BOOT_TIMEOUT_MS * 1000000;
        for (;;) {
                int w = wait_io(con, POLLIN, deadline);
                if (w <= 0)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, ETIMEDOUT,
                                             "firecracker: template boot timed out; console: %s",
                                             tail);
                if (len + 1 >= sizeof(tail)) { /* keep the last half */
                        memmove(tail, tail + sizeof(tail) / 2, len - sizeof(tail) / 2);
                        len -= sizeof(tail) / 2;
                }
                ssize_t k = read(con, tail + len, sizeof(tail) - 1 - len);
                if (k < 0 && (errno == EINTR || errno == EAGAIN))
                        continue;
                if (k <= 0)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                             "firecracker: template VM exited during boot; "
                                             "console: %s",
                                             tail);
                len += (size_t)k;
                tail[len] = 0;
                for (size_t i = 0; i < len; i++)
                        if (!tail[i])
                                tail[i] = '?';
                if (strstr(tail, FC_READY_MARK))
                        return 0;
        }
}

static int tpl_build(struct cove_runtime *rt, const char *rootfs, unsigned mem, unsigned cpus,
                     const char *initrd, struct tpl *t, struct cove_err *err)
{
        cove_rm_rf(t->dir, NULL);
        if (cove_mkdir_p(t->dir, 0711, err) < 0)
                return -1;
        if (cove_vm_root_image(rootfs, t->disk, err) < 0)
                return -1;
        char kpath[PATH_MAX + 16], api[PATH_MAX + 16], logp[PATH_MAX + 16];
        snprintf(kpath, sizeof(kpath), "%s/vmlinux", rt->kdir);
        snprintf(api, sizeof(api), "%s/api.sock", t->dir);
        snprintf(logp, sizeof(logp), "%s/fc.log", t->dir);
        cleanup_close int kfd = open(kpath, O_RDONLY | O_CLOEXEC);
        cleanup_close int ifd = open(initrd, O_RDONLY | O_CLOEXEC);
        cleanup_close int logfd = open(logp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        int con[2] = {-1, -1};
        if (kfd < 0 || ifd < 0 || logfd < 0 || pipe2(con, O_CLOEXEC) < 0)
                return cove_err_set(err, errno, "firecracker: template files (kernel in %s?)",
                                    rt->kdir);
        struct spawn s = {.rt = rt,
                          .cwd = t->dir,
                          .fds = {kfd, ifd},
                          .nfds = 2,
                          .out_fd = con[1],
                          .log_fd = logfd};
        pid_t pid = spawn(&s, err);
        close(con[1]);
        int r = -1;
        struct cove_fc_boot b = {.kernel = "/proc/self/fd/3",
                                 .initrd = "/proc/self/fd/4",
                                 .boot_args = FC_BOOT_ARGS,
                                 .disk = "disk.img",
                                 .vsock_uds = "v.sock",
                                 .vcpus = cpus,
                                 .mem_mib = mem,
                                 .cid = FC_CID};
        /* relative paths in the snapshot: each sandbox's VMM resolves them in its own dir */
        if (pid < 0 || wait_api(api, &pid, err) < 0 ||
            cove_fc_boot(api, &b, FC_API_TIMEOUT_MS, err) < 0 || wait_ready(con[0], err) < 0 ||
            call_new(api, "PATCH", "/vm", cove_fc_vm_state(1), FC_API_TIMEOUT_MS, err) < 0 ||
            call_new(api, "PUT", "/snapshot/create", cove_fc_snapshot_create("state", "mem"),
                     120000, err) < 0)
                goto out;
        kill(pid, SIGKILL);
        reap(pid, 0);
        pid = -1;
        int fds[3] = {open(t->disk, O_RDONLY | O_CLOEXEC), open(t->state, O_RDONLY | O_CLOEXEC),
                      open(t->mem, O_RDONLY | O_CLOEXEC)};
        int ok = 1;
        for (int i = 0; i < 3; i++) {
                if (fds[i] < 0 || fsync(fds[i]) < 0 || fchmod(fds[i], 0644) < 0)
                        ok = 0;
                if (fds[i] >= 0)
                        close(fds[i]);
        }
        if (!ok) {
                cove_err_set(err, errno, "firecracker: sync template");
                goto out;
        }
        if (cove_write_file_atomic(t->dir, "ready", rootfs, strlen(rootfs), 0644, err) < 0)
                goto out;
        r = 0;
out:
        if (pid > 0) {
                kill(pid, SIGKILL);
                reap(pid, 0);
        }
        close(con[0]);
        if (r < 0) {
                add_log_tail(err, logp);
                cove_err_wrap(err, "firecracker: template of %s", rootfs);
                cove_rm_rf(t->dir, NULL);
        }
        return r;
}

static int tpl_get(struct cove_runtime *rt, const char *rootfs, const char *guest, unsigned mem,
                   unsigned cpus, struct tpl *t, struct cove_err *err)
{
        pthread_mutex_lock(&rt->tpl_mu);
        char initrd[PATH_MAX];
        int r = cove_vm_initrd(rt->dir, guest, initrd, sizeof(initrd), err);
        if (r == 0) {
                tpl_paths(rt, rootfs, mem, cpus, initrd, t);
                char ready[PATH_MAX + 16];
                snprintf(ready, sizeof(ready), "%s/ready", t->dir);
                if (access(ready, F_OK) != 0)
                        r = tpl_build(rt, rootfs, mem, cpus, initrd, t, err);
        }
        pthread_mutex_unlock(&rt->tpl_mu);
        return r;
}

/* ---- driver ops --------------------------------------------------------------------- */

static struct cove_runtime *fc_open(const char *data_dir, struct cove_err *err)
{
        char why[512];
        if (cove_fc_unavailable(why, sizeof(why))) {
                cove_err_setk(err, COVE_E_UNAVAILABLE, 0, "%s", why);
                return NULL;
        }
        struct cove_runtime *rt = calloc(1, sizeof(*rt));
        if (!rt) {
                cove_err_set(err, ENOMEM, "firecracker");
                return NULL;
        }
        pthread_mutex_init(&rt->tpl_mu, NULL);
        find_binary(rt->bin, sizeof(rt->bin));
        cove_vm_kernel_dir(rt->kdir, sizeof(rt->kdir));
        snprintf(rt->dir, sizeof(rt->dir), "%s/fc", data_dir);
        char tp[PATH_MAX + 8];
        snprintf(tp, sizeof(tp), "%s/tpl", rt->dir);
        if (cove_mkdir_p(tp, 0711, err) < 0) {
                pthread_mutex_destroy(&rt->tpl_mu);
                free(rt);
                return NULL;
        }
        struct cove_err e2;
        rt->cg = cove_cgroups_open(&e2); /* limits are best effort where cgroups are unusable */
        return rt;
}

static void fc_close(struct cove_runtime *rt)
{
        if (!rt)
                return;
        if (rt->cg)
                cove_cgroups_free(rt->cg);
        pthread_mutex_destroy(&rt->tpl_mu);
        free(rt);
}

static void inst_free(struct fc_inst *fi)
{
        if (!fi)
                return;
        pthread_mutex_destroy(&fi->mu);
        free(fi);
}

/* Read a full snapshot image's header and check it against the requested shape. */
static int fcf_read(int fd, unsigned mem, unsigned cpus, struct fcf_hdr *h, struct cove_err *err)
{
        struct stat st;
        if (fstat(fd, &st) < 0 || pread(fd, h, sizeof(*h), 0) != (ssize_t)sizeof(*h) ||
            memcmp(h->magic, FCF_MAGIC, 8) || h->version != 1)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "firecracker: not a firecracker full snapshot image");
        uint64_t prev = 4096;
        for (int i = 0; i < 3; i++) {
                if (h->off[i] < prev || h->len[i] > (uint64_t)st.st_size ||
                    h->off[i] > (uint64_t)st.st_size - h->len[i] || (i > 0 && !h->len[i]))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "firecracker: full snapshot image is damaged");
                prev = h->off[i] + h->len[i];
        }
        if (h->mem_mb != mem || h->cpus != cpus)
                return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                     "firecracker: the snapshot is of a %u MB, %u CPU VM",
                                     h->mem_mb, h->cpus);
        return 0;
}

static int fc_start(struct cove_runtime *rt, const struct cove_instance_spec *spec,
                    struct cove_instance *inst, struct cove_err *err)
{
        const char *id = spec->sandbox_id;
        if (!id || strlen(id) > FC_ID_MAX || strchr(id, '/'))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, EINVAL,
                                     "firecracker: bad sandbox id");
        if (spec->layer_image)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "firecracker: restoring a files snapshot into a vm sandbox "
                                     "is not supported");
        unsigned mem = spec->memory_mb ? spec->memory_mb : FC_MEM_DEFAULT_MB;
        unsigned cpus = spec->cpus ? spec->cpus : 1;
        if (mem < 64 || mem > 65536 || cpus > 32)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "firecracker: memory_mb must be 64..65536 and cpus <= 32");
        struct fcf_hdr fh;
        struct tpl t = {0};
        if (spec->full) {
                if (fcf_read(spec->full_fd, mem, cpus, &fh, err) < 0)
                        return -1;
        } else if (tpl_get(rt, spec->rootfs, spec->guest_binary, mem, cpus, &t, err) < 0) {
                return -1;
        }
        struct fc_inst *fi = calloc(1, sizeof(*fi));
        if (!fi)
                return cove_err_set(err, ENOMEM, "firecracker");
        snprintf(fi->id, sizeof(fi->id), "%s", id);
        pthread_mutex_init(&fi->mu, NULL);
        fi->mem_mb = mem;
        fi->cpus = cpus;
        snprintf(fi->dir, sizeof(fi->dir), "%s/fc", spec->state_dir);
        snprintf(fi->api, sizeof(fi->api), "%s/api.sock", fi->dir);
        uid_t uid = spec->uid_base;
        fi->uid = uid;
        int statefd = -1, memfd = -1, logfd = -1, chan = -1, rc = -1;
        pid_t pid = -1;
        char p[PATH_MAX + 32], logp[PATH_MAX + 16];
        snprintf(logp, sizeof(logp), "%s/fc.log", spec->state_dir);
        cove_rm_rf(fi->dir, NULL);
        if (mkdir(fi->dir, 0700) < 0 || chown(fi->dir, uid, uid) < 0) {
                cove_err_set(err, errno, "firecracker: %s", fi->dir);
                goto fail;
        }
        snprintf(p, sizeof(p), "%s/disk.img", fi->dir);
        if (spec->full) {
                /* the image's parts become the VM's disk and a snapshot of its own */
                static const char *const names[] = {"disk.img", "snap.state", "snap.mem"};
                for (int i = 0; i < 3; i++) {
                        snprintf(p, sizeof(p), "%s/%s", fi->dir, names[i]);
                        if (copy_out(spec->full_fd, (off_t)fh.off[i], fh.len[i], 0, p, uid, err) <
                            0)
                                goto fail;
                }
                snprintf(p, sizeof(p), "%s/snap.state", fi->dir);
                statefd = open(p, O_RDONLY | O_CLOEXEC);
                snprintf(p, sizeof(p), "%s/snap.mem", fi->dir);
                memfd = open(p, O_RDONLY | O_CLOEXEC);
        } else {
                cleanup_close int dfd = open(t.disk, O_RDONLY | O_CLOEXEC);
                struct stat st;
                if (dfd < 0 || fstat(dfd, &st) < 0) {
                        cove_err_set(err, errno, "firecracker: %s", t.disk);
                        goto fail;
                }
                if (copy_out(dfd, 0, (uint64_t)st.st_size, 1, p, uid, err) < 0)
                        goto fail;
                statefd = open(t.state, O_RDONLY | O_CLOEXEC);
                memfd = open(t.mem, O_RDONLY | O_CLOEXEC);
        }
        logfd = open(logp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (statefd < 0 || memfd < 0 || logfd < 0) {
                cove_err_set(err, errno, "firecracker: open snapshot files");
                goto fail;
        }
        if (rt->cg) {
                struct cove_cgroup_limits lim = {
                    .cpus = spec->cpus, .memory_mb = mem + FC_MEM_OVERHEAD_MB, .pids_max = 64};
                if (cove_cgroup_create(rt->cg, id, &lim, err) < 0)
                        goto fail;
                fi->cg = 1;
        }
        /* COVE_VM_CONSOLE=1 (debugging): the guest's console goes to fc.log too */
        const char *dbg = getenv("COVE_VM_CONSOLE");
        struct spawn s = {.rt = rt,
                          .cwd = fi->dir,
                          .fds = {statefd, memfd},
                          .nfds = 2,
                          .uid = uid,
                          .cg_id = fi->cg ? id : NULL,
                          .out_fd = dbg && !strcmp(dbg, "1") ? logfd : -1,
                          .log_fd = logfd};
        pid = spawn(&s, err);
        snprintf(p, sizeof(p), "%s/v.sock", fi->dir);
        if (pid < 0 || wait_api(fi->api, &pid, err) < 0 ||
            cove_fc_load(fi->api, "/proc/self/fd/3", "/proc/self/fd/4", 120000, err) < 0)
                goto fail;
        /* the guest waits in accept() in the snapshot, but handles the vsock transport reset
         * that follows a load first: a refused CONNECT is retried (bounded) */
        int64_t dl = cove_mono_ns() + (int64_t)FC_CHAN_TIMEOUT_MS * 1000000;
        while ((chan = cove_fc_vsock_connect(p, COVE_FC_VSOCK_PORT, ms_left(dl), err)) < 0 &&
               err->errnum == ECONNRESET && ms_left(dl) > 0)
                nap_ms(5);
        if (chan < 0)
                goto fail;
        inst->pid = pid;
        inst->chan_fd = chan;
        inst->priv = fi;
        fi = NULL;
        pid = -1;
        rc = 0;
fail:
        if (pid > 0) {
                kill(pid, SIGKILL);
                reap(pid, 0);
        }
        if (fi && fi->cg) {
                cove_cgroup_kill(rt->cg, id, NULL);
                cove_cgroup_remove(rt->cg, id, NULL);
        }
        if (fi)
                cove_rm_rf(fi->dir, NULL);
        inst_free(fi);
        int fds[] = {statefd, memfd, logfd};
        for (size_t i = 0; i < COVE_ARRAY_SIZE(fds); i++)
                if (fds[i] >= 0)
                        close(fds[i]);
        if (rc < 0) {
                add_log_tail(err, logp);
                cove_err_wrap(err, "firecracker: start %s", id);
        }
        return rc;
}

static int fc_pause(struct cove_instance *inst, int paused, struct cove_err *err)
{
        struct fc_inst *fi = inst->priv;
        if (!fi)
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "firecracker: instance not running");
        pthread_mutex_lock(&fi->mu);
        int r = call_new(fi->api, "PATCH", "/vm", cove_fc_vm_state(paused), FC_API_TIMEOUT_MS, err);
        pthread_mutex_unlock(&fi->mu);
        return r;
}

static int fc_freeze(struct cove_runtime *rt, struct cove_instance *inst, struct cove_err *err)
{
        (void)rt;
        return fc_pause(inst, 1, err);
}

static int fc_thaw(struct cove_runtime *rt, struct cove_instance *inst, struct cove_err *err)
{
        (void)rt;
        return fc_pause(inst, 0, err);
}

static int teardown(struct cove_runtime *rt, const char *id, const char *state_dir, int purge,
                    struct cove_err *err)
{
        int rc = 0;
        if (rt->cg) {
                if (cove_cgroup_kill(rt->cg, id, err) < 0)
                        rc = -1;
                if (cove_cgroup_remove(rt->cg, id, rc ? NULL : err) < 0)
                        rc = -1;
        }
        if (purge && state_dir && cove_rm_rf(state_dir, rc ? NULL : err) < 0)
                rc = -1;
        return rc;
}

static int fc_stop(struct cove_runtime *rt, struct cove_instance *inst, const char *sandbox_id,
                   const char *state_dir, int purge, struct cove_err *err)
{
        struct fc_inst *fi = inst->priv;
        const char *id = fi ? fi->id : sandbox_id;
        if (!id)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, EINVAL,
                                     "firecracker: stop without id");
        /* the disk is a raw file written synchronously by the VMM: nothing to flush first */
        if (inst->pid > 0) {
                kill(inst->pid, SIGKILL);
                reap(inst->pid, 0);
                inst->pid = 0;
        }
        if (inst->chan_fd >= 0) {
                close(inst->chan_fd);
                inst->chan_fd = -1;
        }
        char idc[FC_ID_MAX + 1];
        snprintf(idc, sizeof(idc), "%s", id);
        inst_free(fi);
        inst->priv = NULL;
        if (teardown(rt, idc, state_dir, purge, err) < 0)
                return cove_err_wrap(err, "firecracker: stop %s", idc);
        return 0;
}

static int fc_cleanup_stale(struct cove_runtime *rt, const char *sandbox_id, const char *state_dir,
                            int purge, struct cove_err *err)
{
        if (!sandbox_id || !*sandbox_id || strchr(sandbox_id, '/'))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, EINVAL,
                                     "firecracker: cleanup: bad id");
        if (teardown(rt, sandbox_id, state_dir, purge, err) < 0)
                return cove_err_wrap(err, "firecracker: cleanup %s", sandbox_id);
        return 0;
}

static int fc_usage(struct cove_runtime *rt, struct cove_instance *inst, uint64_t *mem_bytes,
                    uint64_t *cpu_usec, struct cove_err *err)
{
        struct fc_inst *fi = inst->priv;
        if (!fi)
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "firecracker: instance not running");
        if (rt->cg && fi->cg)
                return cove_cgroup_usage(rt->cg, fi->id, mem_bytes, cpu_usec, err);
        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                             "firecracker: no cgroup for usage figures");
}

/* Pause, PUT /snapshot/create into the VMM's directory, pack disk + state + memory into
 * out_fd, resume. The snapshot files are removed afterwards. */
static int fc_full_snapshot(struct cove_runtime *rt, struct cove_instance *inst, int out_fd,
                            uint64_t *pause_ns, struct cove_err *err)
{
        (void)rt;
        struct fc_inst *fi = inst->priv;
        if (!fi)
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "firecracker: instance not running");
        struct fcf_hdr h;
        memset(&h, 0, sizeof(h));
        memcpy(h.magic, FCF_MAGIC, 8);
        h.version = 1;
        h.mem_mb = fi->mem_mb;
        h.cpus = fi->cpus;
        char paths[3][PATH_MAX + 16];
        snprintf(paths[0], sizeof(paths[0]), "%s/disk.img", fi->dir);
        snprintf(paths[1], sizeof(paths[1]), "%s/out.state", fi->dir);
        snprintf(paths[2], sizeof(paths[2]), "%s/out.mem", fi->dir);
        pthread_mutex_lock(&fi->mu);
        int64_t t0 = cove_mono_ns();
        int paused = 0, r = -1;
        if (call_new(fi->api, "PATCH", "/vm", cove_fc_vm_state(1), FC_API_TIMEOUT_MS, err) < 0)
                goto out;
        paused = 1;
        if (call_new(fi->api, "PUT", "/snapshot/create",
                     cove_fc_snapshot_create("out.state", "out.mem"), 300000, err) < 0)
                goto out;
        uint64_t off = 4096;
        for (int i = 0; i < 3; i++) {
                /* written by the VMM in its own directory: no symlink (to a host file), no
                 * FIFO (a hang), only a regular file of the sandbox's uid */
                cleanup_close int fd =
                    open(paths[i], O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
                struct stat st;
                if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != fi->uid) {
                        cove_err_set(err, fd < 0 ? errno : EINVAL, "firecracker: %s", paths[i]);
                        goto out;
                }
                h.off[i] = (off + FCF_ALIGN - 1) / FCF_ALIGN * FCF_ALIGN;
                h.len[i] = (uint64_t)st.st_size;
                if (copy_sparse(fd, 0, out_fd, (off_t)h.off[i], h.len[i], err) < 0)
                        goto out;
                off = h.off[i] + h.len[i];
        }
        if (ftruncate(out_fd, (off_t)off) < 0 ||
            pwrite(out_fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h)) {
                cove_err_set(err, errno, "firecracker: write snapshot image");
                goto out;
        }
        r = 0;
out:
        unlink(paths[1]);
        unlink(paths[2]);
        if (paused) {
                struct cove_err e2;
                if (call_new(fi->api, "PATCH", "/vm", cove_fc_vm_state(0), FC_API_TIMEOUT_MS, &e2) <
                        0 &&
                    r == 0)
                        r = cove_err_setk(err, COVE_E_INTERNAL, 0,
                                          "firecracker: resume after snapshot: %s", e2.msg);
        }
        if (pause_ns)
                *pause_ns = (uint64_t)(cove_mono_ns() - t0);
        pthread_mutex_unlock(&fi->mu);
        return r < 0 ? cove_err_wrap(err, "firecracker: full snapshot of %s", fi->id) : 0;
}

/* Named "vm": coved puts it in the QEMU driver's place for runtime "vm"
 * (COVE_VM_DRIVER=firecracker, see cove_vm_driver()); its messages say "firecracker". */
const struct cove_runtime_ops cove_runtime_firecracker = {
    .name = "vm",
    .open = fc_open,
    .close = fc_close,
    .start = fc_start,
    .freeze = fc_freeze,
    .thaw = fc_thaw,
    .stop = fc_stop,
    .cleanup_stale = fc_cleanup_stale,
    .usage = fc_usage,
    .full_snapshot = fc_full_snapshot,
};

static int use_firecracker(void)
{
        const char *d = getenv("COVE_VM_DRIVER");
        return d && !strcmp(d, "firecracker");
}

const struct cove_runtime_ops *cove_vm_driver(void)
{
        return use_firecracker() ? &cove_runtime_firecracker : &cove_runtime_vm;
}

int cove_vm_driver_unavailable(char *why, size_t cap)
{
        return use_firecracker() ? cove_fc_unavailable(why, cap) : cove_vm_unavailable(why, cap);
}
