/* The vm runtime: each sandbox is a QEMU microvm with its own Linux kernel (docs/vm.md).
 *
 * Guest: Debian's kernel (vmlinux, PVH entry) and modules from scripts/install-deps
 * (COVE_VM_KERNEL_DIR, default /var/cache/cove/vm); an initramfs that this driver writes
 * (newc cpio: cove-guest as /init, the modules, /dev/console) whose init mounts /dev/vda and
 * hands over to cove-guest on the virtio-serial port named "cove" (guest/vminit.c).
 *
 * Templates as snapshots: per (template rootfs, memory, cpus) the driver builds once, under
 * <data_dir>/vm/tpl/<key>/:
 *   root.img    ext4 made from the same rootfs directory the ns runtime uses (mkfs.ext4 -d)
 *   base.qcow2  the template boot's overlay over root.img, frozen after the snapshot
 *   ram         the template VM's RAM (memory-backend-file share=on)
 *   state       its device state, migrated with x-ignore-shared (RAM stays in ram)
 *   ready       written last (atomically): the template is complete
 * The template VM boots until cove-guest announces on the serial console that it waits for
 * its node, then is stopped and migrated. A sandbox is a clone: QEMU maps ram privately
 * (share=off, readonly=on: copy-on-write, the file is never written), gets a new qcow2 overlay
 * over base.qcow2 (disk.qcow2 in its state dir), starts with -incoming defer and restores
 * state over QMP, then cont. The guest wakes in its wait-for-node loop; the node's HELLO
 * gives every clone its own hostname, clock and entropy (guest.c vm_identity).
 *
 * Confinement: QEMU runs as the sandbox's own host uid (uid_base, unprivileged), in cgroup
 * cove/<id> (memory = guest RAM + overhead, cpus, pids), with -sandbox on (seccomp: no
 * spawn, no privilege changes), PR_SET_PDEATHSIG. It opens no path of coved's: every file
 * (kernel, initrd, ram, disks, state) is opened by coved and inherited, and named to QEMU as
 * /proc/self/fd/N; the monitor (QMP), the guest channel and the serial console are
 * socketpairs, so there is no socket path a guest or another sandbox could reach.
 * QEMU death: its end of the channel closes, the node's I/O thread sees EOF and the sandbox
 * is marked failed (node.c on_dead). */
#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/close_range.h>
#include <linux/fs.h>
#include <linux/if_tun.h>
#include <nftables/libnftables.h>

#include "runtime/cgroup.h"
#include "runtime/luks.h"
#include "runtime/qmp.h"
#include "runtime/runtime.h"
#include "runtime/vm.h"
#include "util/cleanup.h"
#include "util/util.h"

#define VM_KERNEL_DIR_DEFAULT "/var/cache/cove/vm"
#define VM_QEMU_DEFAULT "/usr/bin/qemu-system-x86_64"
#define VM_MEM_DEFAULT_MB 256
#define VM_MEM_OVERHEAD_MB 192 /* QEMU itself, on top of the guest's RAM, in the cgroup */
#define VM_READY_MARK "cove-guest: waiting for the node"
#define VM_BOOT_TIMEOUT_MS 120000
#define VM_QMP_TIMEOUT_MS 10000
#define VM_ID_MAX 128
#define VM_MAX_FDS 12
#define VM_DISK_KEY_LEN 32

/* Guest RAM in bytes for a sandbox of mem_mb: 8 KiB short of mem_mb MiB. QEMU 7.2 syncs the
 * migration dirty bitmap of a RAM block whose length is a multiple of 64 pages by swapping
 * whole bitmap words, and under TCG that leaves the vCPUs' TLB entries of pages already
 * dirty writable without the dirty hook: the guest's next writes to those pages are not
 * tracked, and a pre-copy snapshot keeps a stale copy of them (QEMU fixed it in 9.0 by
 * re-arming the TLB after that swap). A length that is not such a multiple takes QEMU's
 * per-page sync, which re-arms the TLB for each page it clears. -m takes 8 KiB steps. */
static uint64_t vm_ram_bytes(unsigned mem_mb)
{
        return ((uint64_t)mem_mb << 20) - 8192;
}

/* A template's RAM as clones map it: a sealed memfd (no write, grow or shrink), loaded from
 * the template's ram file. QEMU 7.2 opens a memory-backend-file read-write unless
 * readonly=on, and readonly=on makes guest RAM a ROM (the clone hangs), so a plain file
 * would have to be writable by every sandbox's QEMU. A write-sealed memfd can still be
 * mapped MAP_PRIVATE writable (share=off, copy-on-write), but no QEMU can change it. */
struct tpl_mem {
        struct tpl_mem *next;
        char dir[PATH_MAX];
        int fd;
        uint32_t build; /* the build's id (struct tpl_rec) */
};

struct cove_runtime {
        char dir[PATH_MAX];  /* <data_dir>/vm */
        char kdir[PATH_MAX]; /* kernel cache */
        char qemu[PATH_MAX];
        char kver[128];
        unsigned long tsc_khz;
        int kvm;
        struct cove_cgroups *cg;
        pthread_mutex_t tpl_mu; /* template and initrd builds, mems */
        struct tpl_mem *mems;
};

struct vm_inst {
        char id[VM_ID_MAX + 1];
        pthread_mutex_t mu; /* qmp */
        struct cove_qmp qmp;
        int cg; /* cgroup created */
        char disk[PATH_MAX + 16];
        char tpl[32];   /* template key (basename of its dir) */
        uint32_t build; /* template build id */
        unsigned mem_mb, cpus;
        char disk_key_id[VM_ID_MAX + 1]; /* "" plain disk, else the id its key is derived for */
};

/* A full snapshot image (one file, stored as one stream in the chunk store):
 *   [0, 4096)            struct vmf_hdr (disk_key_id: "" for a plain overlay, else it is a
 *                         LUKS qcow2 under the disk key of that id: the sandbox that created
 *                         the disk, kept by its forks; images from before it read as "")
 *   [disk_off, +disk_len) the qcow2 overlay (disk.qcow2) as it was while the VM was stopped
 *   [mem_off, +mem_len)   QEMU's migration stream (devices + all RAM; zero pages are flags),
 *                         mem_off 2 MiB aligned so the store's fixed chunks line up */
#define VMF_MAGIC "COVEVMF1"
#define VMF_ALIGN (2u << 20)
struct vmf_hdr {
        char magic[8];
        uint32_t version, mem_mb, cpus;
        uint32_t build; /* the template build's id (its ready file); 0: not recorded */
        uint64_t disk_off, disk_len, mem_off, mem_len;
        char tpl[32];
        char disk_key_id[VM_ID_MAX + 1];
};

/* ---- small helpers ------------------------------------------------------------------ */

static uint64_t fnv64(uint64_t h, const void *p, size_t n)
{
        const unsigned char *b = p;
        for (size_t i = 0; i < n; i++) {
                h ^= b[i];
                h *= 0x100000001b3ULL;
        }
        return h;
}

static int run_tool(const char *const argv[], struct cove_err *err)
{
        pid_t pid = fork();
        if (pid < 0)
                return cove_err_set(err, errno, "fork %s", argv[0]);
        if (pid == 0) {
                int nul = open("/dev/null", O_RDWR);
                if (nul >= 0) {
                        dup2(nul, 0);
                        dup2(nul, 1);
                }
                syscall(SYS_close_range, 3, ~0U, 0);
                execvp(argv[0], (char *const *)argv);
                _exit(127);
        }
        int st;
        while (waitpid(pid, &st, 0) < 0)
                if (errno != EINTR)
                        return cove_err_set(err, errno, "wait %s", argv[0]);
        if (!WIFEXITED(st) || WEXITSTATUS(st))
                return cove_err_setk(err, COVE_E_INTERNAL, 0, "%s failed (status %d)", argv[0],
                                     WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
        return 0;
}

/* A disk key as QEMU reads it (-object secret,file=/proc/self/fd/N,format=raw):
 * the read end of a pipe holding the key in hex (QEMU's LUKS takes its passphrase as UTF-8
 * text), the write end already closed, owned by uid (QEMU opens the fd by path, as the
 * sandbox's uid). So the key is never on a command line, in the environment or in a file. */
static int key_pipe(const uint8_t key[VM_DISK_KEY_LEN], uid_t uid, struct cove_err *err)
{
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0)
                return cove_err_set(err, errno, "vm: key pipe");
        char hex[2 * VM_DISK_KEY_LEN + 1];
        cove_hex(key, VM_DISK_KEY_LEN, hex);
        ssize_t k = write(p[1], hex, 2 * VM_DISK_KEY_LEN);
        int e = errno;
        explicit_bzero(hex, sizeof(hex));
        close(p[1]);
        if (k != 2 * VM_DISK_KEY_LEN || (uid && fchown(p[0], uid, uid) < 0)) {
                e = k == 2 * VM_DISK_KEY_LEN ? errno : e;
                close(p[0]);
                return cove_err_set(err, e, "vm: key pipe");
        }
        return p[0];
}

/* A sandbox id as a disk key id: what derive_for accepts and a path component could be. */
static int disk_key_id_ok(const char *id)
{
        size_t n = strlen(id);
        if (!n || n > VM_ID_MAX)
                return 0;
        for (size_t i = 0; i < n; i++)
                if (!(id[i] == '_' || id[i] == '-' || (id[i] >= '0' && id[i] <= '9') ||
                      (id[i] >= 'a' && id[i] <= 'z') || (id[i] >= 'A' && id[i] <= 'Z')))
                        return 0;
        return 1;
}

static unsigned long host_tsc_khz(void)
{
        FILE *f = fopen("/proc/cpuinfo", "re");
        char line[256];
        unsigned long khz = 0;
        while (f && fgets(line, sizeof(line), f)) {
                double mhz;
                if (sscanf(line, "cpu MHz : %lf", &mhz) == 1) {
                        khz = (unsigned long)(mhz * 1000.0);
                        break;
                }
        }
        if (f)
                fclose(f);
        return khz;
}

/* /dev/kvm alone is not enough: on this kind of host (a VM without nested virtualisation)
 * it opens and creates VMs, but guests hang or QEMU aborts setting MSRs. The CPU must
 * advertise vmx or svm too. COVE_VM_ACCEL=kvm|tcg overrides. */
int cove_vm_kvm_usable(void)
{
        const char *force = getenv("COVE_VM_ACCEL");
        if (force && !strcmp(force, "tcg"))
                return 0;
        int fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
        if (fd < 0)
                return 0;
        close(fd);
        if (force && !strcmp(force, "kvm"))
                return 1;
        FILE *f = fopen("/proc/cpuinfo", "re");
        char line[4096];
        int virt = 0;
        while (f && !virt && fgets(line, sizeof(line), f))
                if (!strncmp(line, "flags", 5))
                        virt = strstr(line, " vmx") || strstr(line, " svm");
        if (f)
                fclose(f);
        return virt;
}

/* ---- initramfs (newc cpio, uncompressed) -------------------------------------------- */

static int cpio_entry(FILE *f, unsigned ino, const char *name, unsigned mode, unsigned rmaj,
                      unsigned rmin, const void *data, size_t len)
{
        size_t nlen = strlen(name) + 1;
        if (fprintf(f, "070701%08X%08X%08X%08X%08X%08X%08zX%08X%08X%08X%08X%08zX%08X", ino, mode, 0,
                    0, 1, 0, len, 0, 0, rmaj, rmin, nlen, 0) < 0)
                return -1;
        fwrite(name, 1, nlen, f);
        size_t hn = 110 + nlen;
        static const char zero[4];
        fwrite(zero, 1, (4 - hn % 4) % 4, f);
        if (len) {
                fwrite(data, 1, len, f);
                fwrite(zero, 1, (4 - len % 4) % 4, f);
        }
        return ferror(f) ? -1 : 0;
}

static int cpio_file(FILE *f, unsigned ino, const char *name, unsigned mode, const char *src,
                     struct cove_err *err)
{
        char *data = NULL;
        size_t len = 0;
        if (cove_read_file(src, 256u << 20, &data, &len, err) < 0)
                return -1;
        int r = cpio_entry(f, ino, name, 0100000 | mode, 0, 0, data, len);
        free(data);
        return r < 0 ? cove_err_set(err, EIO, "initramfs: write %s", name) : 0;
}

/* <dir>/initrd-<key>, keyed by the kernel version and the guest binary. */
static int initrd_path(struct cove_runtime *rt, const char *guest, char *out, size_t cap,
                       struct cove_err *err)
{
        struct stat st;
        if (stat(guest, &st) < 0)
                return cove_err_set(err, errno, "vm: guest binary %s", guest);
        uint64_t h = 0xcbf29ce484222325ULL;
        h = fnv64(h, rt->kver, strlen(rt->kver));
        h = fnv64(h, &st.st_size, sizeof(st.st_size));
        h = fnv64(h, &st.st_mtim, sizeof(st.st_mtim));
        h = fnv64(h, &st.st_ino, sizeof(st.st_ino));
        /* the module list too: install-deps may add modules (vsock) to the same kernel */
        char op[PATH_MAX + 16], *ol = NULL;
        size_t oll = 0;
        snprintf(op, sizeof(op), "%s/modules/order", rt->kdir);
        if (cove_read_file(op, 4096, &ol, &oll, NULL) == 0)
                h = fnv64(h, ol, oll);
        free(ol);
        snprintf(out, cap, "%s/initrd-%016llx", rt->dir, (unsigned long long)h);
        return 0;
}

/* The initramfs: cove-guest as /init plus the modules in load order. */
static int build_initrd(struct cove_runtime *rt, const char *guest, char *out, size_t cap,
                        struct cove_err *err)
{
        if (initrd_path(rt, guest, out, cap, err) < 0)
                return -1;
        if (access(out, R_OK) == 0)
                return 0;
        char tmp[PATH_MAX + 8];
        snprintf(tmp, sizeof(tmp), "%s.tmp", out);
        FILE *f = fopen(tmp, "we");
        if (!f)
                return cove_err_set(err, errno, "vm: create %s", tmp);
        unsigned ino = 1;
        int r = 0;
        r |= cpio_entry(f, ino++, "dev", 040755, 0, 0, NULL, 0);
        r |= cpio_entry(f, ino++, "dev/console", 020600, 5, 1, NULL, 0);
        r |= cpio_entry(f, ino++, "modules", 040755, 0, 0, NULL, 0);
        if (r < 0) {
                cove_err_set(err, EIO, "vm: write initramfs");
                goto fail;
        }
        if (cpio_file(f, ino++, "init", 0755, guest, err) < 0)
                goto fail;
        char order[PATH_MAX];
        snprintf(order, sizeof(order), "%s/modules/order", rt->kdir);
        FILE *o = fopen(order, "re");
        if (!o) {
                cove_err_set(err, errno, "vm: %s (run scripts/install-deps)", order);
                goto fail;
        }
        if (cpio_file(f, ino++, "modules/order", 0644, order, err) < 0) {
                fclose(o);
                goto fail;
        }
        char line[128];
        while (fgets(line, sizeof(line), o)) {
                line[strcspn(line, "\r\n")] = 0;
                if (!line[0] || strchr(line, '/'))
                        continue;
                char src[PATH_MAX], name[160];
                snprintf(src, sizeof(src), "%s/modules/%s", rt->kdir, line);
                snprintf(name, sizeof(name), "modules/%s", line);
                if (cpio_file(f, ino++, name, 0644, src, err) < 0) {
                        fclose(o);
                        goto fail;
                }
        }
        fclose(o);
        if (cpio_entry(f, 0, "TRAILER!!!", 0, 0, 0, NULL, 0) < 0 || fflush(f) < 0 ||
            fsync(fileno(f)) < 0) {
                cove_err_set(err, errno ? errno : EIO, "vm: write initramfs");
                goto fail;
        }
        fclose(f);
        f = NULL;
        chmod(tmp, 0644);
        if (rename(tmp, out) < 0) {
                cove_err_set(err, errno, "vm: rename initramfs");
                goto fail;
        }
        return 0;
fail:
        if (f)
                fclose(f);
        unlink(tmp);
        return -1;
}

int cove_vm_initrd(const char *dir, const char *guest, char *out, size_t cap, struct cove_err *err)
{
        struct cove_runtime *t = calloc(1, sizeof(*t));
        if (!t)
                return cove_err_set(err, ENOMEM, "vm: initramfs");
        snprintf(t->dir, sizeof(t->dir), "%s", dir);
        cove_vm_kernel_dir(t->kdir, sizeof(t->kdir));
        char vp[PATH_MAX + 16], *v = NULL;
        size_t vl = 0;
        snprintf(vp, sizeof(vp), "%s/version", t->kdir);
        int r = cove_read_file(vp, sizeof(t->kver) - 1, &v, &vl, err);
        if (r == 0) {
                snprintf(t->kver, sizeof(t->kver), "%.*s", (int)vl, v);
                r = build_initrd(t, guest, out, cap, err);
        }
        free(v);
        free(t);
        return r;
}

const char *cove_vm_kernel_dir(char *buf, size_t cap)
{
        const char *k = getenv("COVE_VM_KERNEL_DIR");
        snprintf(buf, cap, "%s", k && *k ? k : VM_KERNEL_DIR_DEFAULT);
        return buf;
}

/* ---- launching QEMU ----------------------------------------------------------------- */

struct launch {
        const char *argv[96];
        int argc;
        int fds[VM_MAX_FDS]; /* fds[i] becomes fd 3+i in QEMU */
        int nfds;
        uid_t uid; /* 0: stay root (the template boot runs no sandbox code) */
        const char *log_path;
        const char *cg_id; /* cgroup to join before exec, or NULL */
        struct cove_runtime *rt;
        int tap_fd; /* >= 3: QEMU gets a new netns with tap0 as this fd (see vm_net) */
};

static void arg(struct launch *l, const char *a)
{
        if (l->argc < (int)COVE_ARRAY_SIZE(l->argv) - 1)
                l->argv[l->argc++] = a;
}

/* "/proc/self/fd/<3+i>" for an inherited fd */
static int add_fd(struct launch *l, int fd, char *name, size_t cap)
{
        if (l->nfds >= VM_MAX_FDS)
                return -1;
        l->fds[l->nfds] = fd;
        snprintf(name, cap, "/proc/self/fd/%d", 3 + l->nfds);
        return 3 + l->nfds++;
}

/* Networking (docs/vm.md): QEMU lives in a network namespace of its own. In it, tap0
 * (169.254.100.1/30) faces the guest's eth0 (169.254.100.2/30, configured by the guest's
 * init, the same in every VM: each has its own netns); the egress gateway later moves its
 * per-sandbox veth "eth0" into this netns (cove_link_attach on QEMU's pid), and a
 * masquerade rule on eth0 makes the guest's packets leave with the sandbox address, so
 * the host-side nftables rules apply unchanged. Runs in the forked child (async-signal-safe
 * syscalls only), as root, before the uid drop. */
#define VM_TAP_IP 0xa9fe6401u /* 169.254.100.1 */
static int child_ifup(int s, const char *name, uint32_t ip, uint32_t mask)
{
        struct ifreq ifr;
        memset(&ifr, 0, sizeof(ifr));
        strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
        if (ip) {
                struct sockaddr_in *a = (struct sockaddr_in *)&ifr.ifr_addr;
                a->sin_family = AF_INET;
                a->sin_addr.s_addr = htonl(ip);
                if (ioctl(s, SIOCSIFADDR, &ifr) < 0)
                        return -1;
                a->sin_addr.s_addr = htonl(mask);
                if (ioctl(s, SIOCSIFNETMASK, &ifr) < 0)
                        return -1;
        }
        if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0)
                return -1;
        ifr.ifr_flags |= IFF_UP;
        return ioctl(s, SIOCSIFFLAGS, &ifr);
}

static int child_net(int slot)
{
        if (unshare(CLONE_NEWNET) < 0)
                return -1;
        int t = open("/dev/net/tun", O_RDWR);
        if (t < 0)
                return -1;
        struct ifreq ifr;
        memset(&ifr, 0, sizeof(ifr));
        strcpy(ifr.ifr_name, "tap0");
        ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
        if (ioctl(t, TUNSETIFF, &ifr) < 0 || dup2(t, slot) < 0)
                return -1;
        if (t != slot)
                close(t);
        int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (s < 0 || child_ifup(s, "lo", 0, 0) < 0 ||
            child_ifup(s, "tap0", VM_TAP_IP, 0xfffffffcu) < 0)
                return -1;
        close(s);
        int f = open("/proc/sys/net/ipv4/ip_forward", O_WRONLY);
        if (f < 0 || write(f, "1", 1) != 1)
                return -1;
        close(f);
        return 0;
}

struct nat_job {
        int nsfd;
        int rc;
};

/* In its own thread (setns changes only it): the masquerade rule in QEMU's netns. */
static void *nat_main(void *arg)
{
        struct nat_job *j = arg;
        j->rc = -1;
        if (setns(j->nsfd, CLONE_NEWNET) < 0)
                return NULL;
        struct nft_ctx *ctx = nft_ctx_new(NFT_CTX_DEFAULT);
        if (!ctx)
                return NULL;
        nft_ctx_buffer_output(ctx);
        nft_ctx_buffer_error(ctx);
        j->rc = nft_run_cmd_from_buffer(
            ctx, "add table ip cove_vm\n"
                 "add chain ip cove_vm post { type nat hook postrouting priority 100 ; }\n"
                 "add rule ip cove_vm post oifname \"eth0\" masquerade\n");
        nft_ctx_free(ctx);
        return NULL;
}

static int vm_net_nat(pid_t pid, struct cove_err *err)
{
        char p[64];
        snprintf(p, sizeof(p), "/proc/%d/ns/net", (int)pid);
        struct nat_job j = {.nsfd = open(p, O_RDONLY | O_CLOEXEC), .rc = -1};
        if (j.nsfd < 0)
                return cove_err_set(err, errno, "vm: QEMU's netns");
        pthread_t t;
        int e = pthread_create(&t, NULL, nat_main, &j);
        if (e == 0)
                pthread_join(t, NULL);
        close(j.nsfd);
        if (e || j.rc != 0)
                return cove_err_setk(err, COVE_E_INTERNAL, e,
                                     "vm: masquerade rule in QEMU's netns");
        return 0;
}

static pid_t launch(struct launch *l, struct cove_err *err)
{
        l->argv[l->argc] = NULL;
        int logfd = open(l->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (logfd < 0)
                return cove_err_set(err, errno, "vm: open %s", l->log_path);
        if (l->uid && fchown(logfd, l->uid, l->uid) < 0) {
                close(logfd);
                return cove_err_set(err, errno, "vm: chown %s", l->log_path);
        }
        int sync[2], done[2];
        if (pipe2(sync, O_CLOEXEC) < 0) {
                close(logfd);
                return cove_err_set(err, errno, "vm: pipe");
        }
        /* done: closed by the child's exec (CLOEXEC) or exit, so the parent knows the child's
         * setup (its netns above all) is complete before it looks at the child */
        if (pipe2(done, O_CLOEXEC) < 0) {
                close(logfd);
                close(sync[0]);
                close(sync[1]);
                return cove_err_set(err, errno, "vm: pipe");
        }
        pid_t pid = fork();
        if (pid < 0) {
                cove_err_set(err, errno, "vm: fork");
                close(logfd);
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
                for (int s = 1; s < NSIG; s++)
                        signal(s, SIG_DFL);
                char b;
                if (read(sync[0], &b, 1) != 1)
                        _exit(127);
                int hi[VM_MAX_FDS];
                for (int i = 0; i < l->nfds; i++)
                        if ((hi[i] = fcntl(l->fds[i], F_DUPFD, 64)) < 0)
                                _exit(126);
                int lhi = fcntl(logfd, F_DUPFD, 64);
                int dhi = fcntl(done[1], F_DUPFD_CLOEXEC, 64);
                if (dhi < 0)
                        _exit(126);
                int nul = open("/dev/null", O_RDWR);
                if (lhi < 0 || nul < 0 || dup2(nul, 0) < 0 || dup2(lhi, 1) < 0 || dup2(lhi, 2) < 0)
                        _exit(126);
                for (int i = 0; i < l->nfds; i++)
                        if (dup2(hi[i], 3 + i) < 0)
                                _exit(126);
                if (l->tap_fd >= 3 && child_net(l->tap_fd) < 0)
                        _exit(124);
                syscall(SYS_close_range, l->tap_fd >= 3 ? l->tap_fd + 1 : 3 + l->nfds, ~0U, 0);
                if (l->uid) {
                        if (syscall(SYS_setgroups, 0, NULL) < 0 ||
                            syscall(SYS_setresgid, l->uid, l->uid, l->uid) < 0 ||
                            syscall(SYS_setresuid, l->uid, l->uid, l->uid) < 0)
                                _exit(125);
                        prctl(PR_SET_PDEATHSIG, SIGKILL); /* cleared by the uid change */
                }
                execv(l->argv[0], (char *const *)l->argv);
                _exit(127);
        }
        close(sync[0]);
        close(logfd);
        int r = 0;
        if (l->cg_id && l->rt->cg)
                r = cove_cgroup_attach(l->rt->cg, l->cg_id, pid, err);
        if (r == 0 && write(sync[1], "g", 1) != 1)
                r = cove_err_set(err, errno, "vm: start QEMU");
        close(sync[1]);
        close(done[1]);
        if (r == 0) {
                char b;
                ssize_t k;
                while ((k = read(done[0], &b, 1)) < 0 && errno == EINTR)
                        ;
        }
        close(done[0]);
        if (r == 0 && l->tap_fd >= 3) {
                /* the child must be in a netns of its own now (or have failed) */
                struct stat a, b;
                char p[64];
                snprintf(p, sizeof(p), "/proc/%d/ns/net", (int)pid);
                if (stat(p, &a) < 0 || stat("/proc/self/ns/net", &b) < 0 || a.st_ino == b.st_ino)
                        r = cove_err_setk(err, COVE_E_INTERNAL, 0,
                                          "vm: QEMU did not get a network namespace of its own");
        }
        if (r < 0) {
                kill(pid, SIGKILL);
                while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
                        ;
                return -1;
        }
        return pid;
}

/* Append the end of QEMU's own log (its error messages) to err. */
static void add_log_tail(struct cove_err *err, const char *path)
{
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return;
        char buf[301];
        off_t end = lseek(fd, 0, SEEK_END);
        ssize_t n = pread(fd, buf, sizeof(buf) - 1, end > 300 ? end - 300 : 0);
        close(fd);
        if (n <= 0)
                return;
        buf[n] = 0;
        for (ssize_t i = 0; i < n; i++)
                if ((unsigned char)buf[i] < 0x20)
                        buf[i] = ' ';
        char m[sizeof(err->msg)];
        snprintf(m, sizeof(m), "%s", err->msg);
        snprintf(err->msg, sizeof(err->msg), "%s; QEMU: %s", m, buf);
}

static void reap(pid_t pid, int grace_ms)
{
        for (int t = 0; t < grace_ms; t += 5) {
                pid_t w = waitpid(pid, NULL, WNOHANG);
                if (w == pid || (w < 0 && errno == ECHILD))
                        return;
                struct timespec ts = {0, 5000000};
                nanosleep(&ts, NULL);
        }
        kill(pid, SIGKILL);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
                ;
}

/* The QEMU command line shared by the template boot and its clones: the device set must be
 * identical for the device state to load. */
struct vmcfg {
        unsigned mem_mb, cpus;
        char smp[16], mem[32], memobj[PATH_MAX + 160], kernel[64], initrd[64], append[256];
        char drive[6][PATH_MAX + 96];
        char chan[64], qmp[64], serial[64], net[48], secret[80];
};

static void common_args(struct cove_runtime *rt, struct launch *l, struct vmcfg *c)
{
        arg(l, rt->qemu);
        arg(l, "-M");
        arg(l, "microvm,pit=on,pic=on,rtc=on,memory-backend=mem");
        arg(l, "-accel");
        arg(l, rt->kvm ? "kvm" : "tcg");
        arg(l, "-cpu");
        arg(l, rt->kvm ? "host" : "max");
        snprintf(c->smp, sizeof(c->smp), "%u", c->cpus);
        snprintf(c->mem, sizeof(c->mem), "%lluk",
                 (unsigned long long)(vm_ram_bytes(c->mem_mb) >> 10));
        arg(l, "-smp");
        arg(l, c->smp);
        arg(l, "-m");
        arg(l, c->mem);
        arg(l, "-object");
        arg(l, c->memobj);
        arg(l, "-nodefaults");
        arg(l, "-no-user-config");
        arg(l, "-no-reboot");
        arg(l, "-display");
        arg(l, "none");
        arg(l, "-kernel");
        arg(l, c->kernel);
        arg(l, "-initrd");
        arg(l, c->initrd);
        snprintf(c->append, sizeof(c->append),
                 "console=ttyS0 quiet loglevel=1 panic=-1 tsc_early_khz=%lu tsc=reliable "
                 "no_timer_check random.trust_cpu=off",
                 rt->tsc_khz);
        arg(l, "-append");
        arg(l, c->append);
        for (int i = 0; i < 6 && c->drive[i][0]; i++) {
                arg(l, "-blockdev");
                arg(l, c->drive[i]);
        }
        arg(l, "-device");
        arg(l, "virtio-blk-device,drive=disk");
        arg(l, "-device");
        arg(l, "virtio-rng-device");
        arg(l, "-chardev");
        arg(l, c->chan);
        arg(l, "-device");
        arg(l, "virtio-serial-device");
        arg(l, "-device");
        arg(l, "virtserialport,chardev=chan,name=cove");
        arg(l, "-chardev");
        arg(l, c->qmp);
        arg(l, "-mon");
        arg(l, "chardev=qmp,mode=control");
        arg(l, "-chardev");
        arg(l, c->serial);
        arg(l, "-serial");
        arg(l, "chardev:ser");
        arg(l, "-netdev");
        arg(l, c->net);
        arg(l, "-device");
        arg(l, "virtio-net-device,netdev=net0,mac=52:54:00:c0:5e:01");
}

/* A listening unix socket nobody will connect to (the template's channel: its guest must see
 * no node, so that every clone meets its own). Autobound abstract name, no path. */
static int lonely_listener(void)
{
        int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un {
                sa_family_t f;
        } a = {AF_UNIX};
        if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(s, 1) < 0) {
                if (s >= 0)
                        close(s);
                return -1;
        }
        return s;
}

/* ---- templates ---------------------------------------------------------------------- */

struct tpl {
        char dir[PATH_MAX];
        char root[PATH_MAX + 16], base[PATH_MAX + 16], ram[PATH_MAX + 16], state[PATH_MAX + 16];
        uint32_t build; /* random per build (ready); 0 for a build that did not record one */
};

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
        h = fnv64(h, &rt->kvm, sizeof(rt->kvm));
        uint64_t ram = vm_ram_bytes(mem);
        h = fnv64(h, &ram, sizeof(ram));
        snprintf(t->dir, sizeof(t->dir), "%s/tpl/%016llx", rt->dir, (unsigned long long)h);
        snprintf(t->root, sizeof(t->root), "%s/root.img", t->dir);
        snprintf(t->base, sizeof(t->base), "%s/base.qcow2", t->dir);
        snprintf(t->ram, sizeof(t->ram), "%s/ram", t->dir);
        snprintf(t->state, sizeof(t->state), "%s/state", t->dir);
}

/* A template's ready file, written last: what the build was made from (vm_collect recomputes
 * its key from that to tell a current build from an older one) and a random build id that
 * full snapshots record, so that none is restored over another build with the same key (a
 * rebuild makes a different base.qcow2 under the snapshot's disk overlay). */
#define TPL_READY_MAGIC "cove-vm-template 2\n"
struct tpl_rec {
        char rootfs[PATH_MAX], initrd[PATH_MAX];
        unsigned mem, cpus;
        uint32_t build;
};

static int tpl_ready_write(const char *dir, const struct tpl_rec *r, struct cove_err *err)
{
        char buf[2 * PATH_MAX + 128];
        int n = snprintf(buf, sizeof(buf),
                         TPL_READY_MAGIC "rootfs %s\ninitrd %s\nmem %u\ncpus %u\nbuild %08x\n",
                         r->rootfs, r->initrd, r->mem, r->cpus, r->build);
        if (n < 0 || (size_t)n >= sizeof(buf))
                return cove_err_setk(err, COVE_E_INTERNAL, 0, "vm: template record too long");
        return cove_write_file_atomic(dir, "ready", buf, (size_t)n, 0644, err);
}

/* 0: a complete record; 1: ready exists but is an older format (the rootfs path only) or
 * unreadable as a record; -1: no ready file (an unfinished build). */
static int tpl_ready_read(const char *dir, struct tpl_rec *r)
{
        char p[PATH_MAX + 16];
        snprintf(p, sizeof(p), "%s/ready", dir);
        memset(r, 0, sizeof(*r));
        char *buf = NULL;
        size_t len = 0;
        struct cove_err e;
        if (cove_read_file(p, sizeof(r->rootfs) * 2 + 128, &buf, &len, &e) < 0)
                return access(p, F_OK) == 0 ? 1 : -1;
        int have = 0;
        size_t ml = strlen(TPL_READY_MAGIC);
        if (len > ml && !memcmp(buf, TPL_READY_MAGIC, ml) && !memchr(buf, 0, len)) {
                char *save = NULL;
                for (char *ln = strtok_r(buf + ml, "\n", &save); ln;
                     ln = strtok_r(NULL, "\n", &save)) {
                        unsigned u;
                        if (!strncmp(ln, "rootfs ", 7) && strlen(ln + 7) < sizeof(r->rootfs)) {
                                snprintf(r->rootfs, sizeof(r->rootfs), "%s", ln + 7);
                                have |= 1;
                        } else if (!strncmp(ln, "initrd ", 7) &&
                                   strlen(ln + 7) < sizeof(r->initrd)) {
                                snprintf(r->initrd, sizeof(r->initrd), "%s", ln + 7);
                                have |= 2;
                        } else if (sscanf(ln, "mem %u", &u) == 1) {
                                r->mem = u;
                                have |= 4;
                        } else if (sscanf(ln, "cpus %u", &u) == 1) {
                                r->cpus = u;
                                have |= 8;
                        } else if (sscanf(ln, "build %x", &u) == 1) {
                                r->build = u;
                                have |= 16;
                        }
                }
        }
        free(buf);
        return have == 31 ? 0 : 1;
}

static uint64_t tree_bytes(const char *dir, int depth)
{
        if (depth > 64)
                return 0;
        DIR *d = opendir(dir);
        if (!d)
                return 0;
        uint64_t sum = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
                if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                        continue;
                char p[PATH_MAX];
                if (snprintf(p, sizeof(p), "%s/%s", dir, e->d_name) >= (int)sizeof(p))
                        continue;
                struct stat st;
                if (lstat(p, &st) < 0)
                        continue;
                sum += (uint64_t)st.st_blocks * 512 + 4096;
                if (S_ISDIR(st.st_mode))
                        sum += tree_bytes(p, depth + 1);
        }
        closedir(d);
        return sum;
}

/* Read the template's serial console until cove-guest says it waits for its node. */
static int wait_ready(int ser, char *tail, size_t cap, struct cove_err *err)
{
        size_t len = 0;
        tail[0] = 0;
        int64_t dl = cove_mono_ns() + (int64_t)VM_BOOT_TIMEOUT_MS * 1000000;
        for (;;) {
                int left = (int)((dl - cove_mono_ns()) / 1000000);
                if (left <= 0)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, ETIMEDOUT,
                                             "vm: template boot timed out; console: %s", tail);
                struct pollfd p = {.fd = ser, .events = POLLIN};
                int r = poll(&p, 1, left);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r <= 0)
                        continue;
                if (len + 1 >= cap) { /* keep the last half */
                        memmove(tail, tail + cap / 2, len - cap / 2);
                        len -= cap / 2;
                }
                ssize_t k = read(ser, tail + len, cap - 1 - len);
                if (k <= 0)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                             "vm: template VM exited during boot; console: %s",
                                             tail);
                len += (size_t)k;
                tail[len] = 0;
                for (size_t i = 0; i < len; i++)
                        if (!tail[i])
                                tail[i] = '?';
                if (strstr(tail, VM_READY_MARK))
                        return 0;
        }
}

int cove_vm_root_image(const char *rootfs, const char *path, struct cove_err *err)
{
        /* ext4 of the rootfs, sized for it plus room; sparse */
        uint64_t need = tree_bytes(rootfs, 0);
        uint64_t mb = need * 3 / 2 / (1 << 20) + 512;
        if (mb < 1024)
                mb = 1024;
        char size[32];
        snprintf(size, sizeof(size), "%lluM", (unsigned long long)mb);
        const char *mkfs[] = {"mkfs.ext4",      "-q", "-F",   "-L", "cove-root", "-E",
                              "root_owner=0:0", "-d", rootfs, path, size,        NULL};
        if (run_tool(mkfs, err) < 0)
                return cove_err_wrap(err, "vm: template root disk from %s", rootfs);
        return 0;
}

static int tpl_build(struct cove_runtime *rt, const char *rootfs, unsigned mem, unsigned cpus,
                     const char *initrd, struct tpl *t, struct cove_err *err)
{
        cove_rm_rf(t->dir, NULL);
        if (cove_mkdir_p(t->dir, 0711, err) < 0)
                return -1;
        if (cove_vm_root_image(rootfs, t->root, err) < 0)
                return -1;
        char bk[PATH_MAX + 32];
        snprintf(bk, sizeof(bk), "%s", t->root);
        const char *qi[] = {"qemu-img", "create", "-q",  "-f",    "qcow2", "-b",
                            bk,         "-F",     "raw", t->base, NULL};
        if (run_tool(qi, err) < 0)
                return cove_err_wrap(err, "vm: template overlay");
        chmod(t->root, 0644);
        chmod(t->base, 0644);
        int ramfd = open(t->ram, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (ramfd < 0 || ftruncate(ramfd, (off_t)vm_ram_bytes(mem)) < 0) {
                cove_err_set(err, errno, "vm: template RAM file");
                if (ramfd >= 0)
                        close(ramfd);
                return -1;
        }
        char kpath[PATH_MAX + 16];
        snprintf(kpath, sizeof(kpath), "%s/vmlinux", rt->kdir);
        int kfd = open(kpath, O_RDONLY | O_CLOEXEC);
        int ifd = open(initrd, O_RDONLY | O_CLOEXEC);
        int rootfd = open(t->root, O_RDONLY | O_CLOEXEC);
        int basefd = open(t->base, O_RDWR | O_CLOEXEC);
        int qmp[2] = {-1, -1}, ser[2] = {-1, -1};
        int chan = lonely_listener();
        int r = -1;
        pid_t pid = -1;
        struct cove_qmp q = {.fd = -1};
        if (kfd < 0 || ifd < 0 || rootfd < 0 || basefd < 0 || chan < 0 ||
            socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, qmp) < 0 ||
            socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ser) < 0) {
                cove_err_set(err, errno, "vm: template files (kernel in %s?)", rt->kdir);
                goto out;
        }
        struct launch l = {.rt = rt};
        struct vmcfg *c = calloc(1, sizeof(*c));
        if (!c) {
                cove_err_set(err, ENOMEM, "vm");
                goto out;
        }
        c->mem_mb = mem;
        c->cpus = cpus;
        char p[64];
        add_fd(&l, kfd, c->kernel, sizeof(c->kernel));
        add_fd(&l, ifd, c->initrd, sizeof(c->initrd));
        add_fd(&l, ramfd, p, sizeof(p));
        snprintf(c->memobj, sizeof(c->memobj),
                 "memory-backend-file,id=mem,size=%llu,mem-path=%s,share=on",
                 (unsigned long long)vm_ram_bytes(mem), p);
        add_fd(&l, rootfd, p, sizeof(p));
        snprintf(c->drive[0], sizeof(c->drive[0]),
                 "driver=file,node-name=rootf,filename=%s,read-only=on", p);
        snprintf(c->drive[1], sizeof(c->drive[1]),
                 "driver=raw,node-name=root,file=rootf,read-only=on");
        add_fd(&l, basefd, p, sizeof(p));
        snprintf(c->drive[2], sizeof(c->drive[2]), "driver=file,node-name=basef,filename=%s", p);
        snprintf(c->drive[3], sizeof(c->drive[3]),
                 "driver=qcow2,node-name=disk,file=basef,backing=root");
        int n = add_fd(&l, chan, p, sizeof(p));
        snprintf(c->chan, sizeof(c->chan), "socket,id=chan,fd=%d,server=on,wait=off", n);
        n = add_fd(&l, qmp[1], p, sizeof(p));
        snprintf(c->qmp, sizeof(c->qmp), "socket,id=qmp,fd=%d,server=off", n);
        n = add_fd(&l, ser[1], p, sizeof(p));
        snprintf(c->serial, sizeof(c->serial), "socket,id=ser,fd=%d,server=off", n);
        l.tap_fd = 3 + l.nfds;
        snprintf(c->net, sizeof(c->net), "tap,id=net0,fd=%d", l.tap_fd);
        common_args(rt, &l, c);
        arg(&l, "-sandbox");
        arg(&l, "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny");
        char logp[PATH_MAX + 16];
        snprintf(logp, sizeof(logp), "%s/qemu.log", t->dir);
        l.log_path = logp;
        pid = launch(&l, err);
        free(c);
        close(qmp[1]);
        close(ser[1]);
        qmp[1] = ser[1] = -1;
        if (pid < 0)
                goto out;
        int qfd = qmp[0];
        qmp[0] = -1;
        if (cove_qmp_open(&q, qfd, VM_QMP_TIMEOUT_MS, err) < 0)
                goto out;
        char tail[2048];
        if (wait_ready(ser[0], tail, sizeof(tail), err) < 0)
                goto out;
        json_t *caps = json_pack("{s:[{s:s,s:b},{s:s,s:b}]}", "capabilities", "capability",
                                 "x-ignore-shared", "state", 1, "capability", "events", "state", 1);
        char tmp[PATH_MAX + 16];
        snprintf(tmp, sizeof(tmp), "%s.tmp", t->state);
        int sfd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (sfd < 0) {
                json_decref(caps);
                cove_err_set(err, errno, "vm: template state");
                goto out;
        }
        /* the state goes into a file coved opened, passed over QMP (no exec: URI, so the
         * template QEMU runs with spawn=deny too) */
        if (cove_qmp_cmd(&q, "stop", NULL, -1, NULL, VM_QMP_TIMEOUT_MS, err) < 0 ||
            cove_qmp_cmd(&q, "migrate-set-capabilities", caps, -1, NULL, VM_QMP_TIMEOUT_MS, err) <
                0 ||
            cove_qmp_cmd(&q, "getfd", json_pack("{s:s}", "fdname", "tpl"), sfd, NULL,
                         VM_QMP_TIMEOUT_MS, err) < 0 ||
            cove_qmp_cmd(&q, "migrate", json_pack("{s:s}", "uri", "fd:tpl"), -1, NULL,
                         VM_QMP_TIMEOUT_MS, err) < 0 ||
            cove_qmp_wait_migration(&q, 60000, err) < 0) {
                close(sfd);
                goto out;
        }
        cove_qmp_cmd(&q, "quit", NULL, -1, NULL, VM_QMP_TIMEOUT_MS, NULL);
        reap(pid, 5000);
        pid = -1;
        if (fsync(sfd) < 0 || fsync(ramfd) < 0 || fsync(basefd) < 0) {
                cove_err_set(err, errno, "vm: sync template");
                close(sfd);
                goto out;
        }
        close(sfd);
        chmod(tmp, 0644);
        if (rename(tmp, t->state) < 0) {
                cove_err_set(err, errno, "vm: template state");
                goto out;
        }
        struct tpl_rec rec = {.mem = mem, .cpus = cpus};
        snprintf(rec.rootfs, sizeof(rec.rootfs), "%s", rootfs);
        snprintf(rec.initrd, sizeof(rec.initrd), "%s", initrd);
        do {
                if (cove_random(&rec.build, sizeof(rec.build), err) < 0)
                        goto out;
        } while (!rec.build);
        if (tpl_ready_write(t->dir, &rec, err) < 0)
                goto out;
        r = 0;
out:
        if (q.buf)
                cove_qmp_close(&q);
        if (pid > 0) {
                kill(pid, SIGKILL);
                reap(pid, 0);
        }
        int fds[] = {kfd, ifd, rootfd, basefd, ramfd, chan, qmp[0], qmp[1], ser[0], ser[1]};
        for (size_t i = 0; i < COVE_ARRAY_SIZE(fds); i++)
                if (fds[i] >= 0)
                        close(fds[i]);
        if (r < 0) {
                char lp[PATH_MAX + 16];
                snprintf(lp, sizeof(lp), "%s/qemu.log", t->dir);
                add_log_tail(err, lp);
                cove_rm_rf(t->dir, NULL);
        }
        return r;
}

static int tpl_mem_load(struct cove_runtime *rt, struct tpl *t, struct cove_err *err)
{
        for (struct tpl_mem *m = rt->mems; m; m = m->next)
                if (!strcmp(m->dir, t->dir)) {
                        t->build = m->build;
                        return m->fd;
                }
        int src = open(t->ram, O_RDONLY | O_CLOEXEC);
        if (src < 0)
                return cove_err_set(err, errno, "vm: template RAM %s", t->ram);
        int fd = memfd_create("cove-template-ram", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        struct tpl_mem *m = calloc(1, sizeof(*m));
        struct stat st;
        if (fd < 0 || !m || fstat(src, &st) < 0 || ftruncate(fd, st.st_size) < 0) {
                cove_err_set(err, errno ? errno : ENOMEM, "vm: template RAM memfd");
                goto fail;
        }
        /* only the pages the template guest touched (the file's data extents; the rest are
         * holes): the memfd stays as sparse as the file, RAM-backed only where it has to */
        off_t off = 0;
        while (off < st.st_size) {
                off_t data = lseek(src, off, SEEK_DATA);
                if (data < 0 && errno == ENXIO)
                        break; /* only a hole is left */
                off_t hole = data < 0 ? -1 : lseek(src, data, SEEK_HOLE);
                if (data < 0 || hole < 0) {
                        cove_err_set(err, errno, "vm: scan template RAM");
                        goto fail;
                }
                off = data;
                while (off < hole) {
                        off_t o = off;
                        ssize_t k = lseek(fd, off, SEEK_SET) < 0
                                        ? -1
                                        : sendfile(fd, src, &o, (size_t)(hole - off));
                        if (k <= 0) {
                                cove_err_set(err, k < 0 ? errno : EIO, "vm: load template RAM");
                                goto fail;
                        }
                        off = o;
                }
        }
        if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) < 0) {
                cove_err_set(err, errno, "vm: seal template RAM");
                goto fail;
        }
        posix_fadvise(src, 0, 0, POSIX_FADV_DONTNEED); /* the memfd holds it now */
        close(src);
        snprintf(m->dir, sizeof(m->dir), "%s", t->dir);
        m->fd = fd;
        struct tpl_rec rec;
        m->build = t->build = tpl_ready_read(t->dir, &rec) == 0 ? rec.build : 0;
        m->next = rt->mems;
        rt->mems = m;
        return fd;
fail:
        close(src);
        if (fd >= 0)
                close(fd);
        free(m);
        return -1;
}

/* The template for this shape, built if needed; returns its RAM memfd (the runtime's). */
static int tpl_get(struct cove_runtime *rt, const char *rootfs, const char *guest, unsigned mem,
                   unsigned cpus, struct tpl *t, struct cove_err *err)
{
        pthread_mutex_lock(&rt->tpl_mu);
        char initrd[PATH_MAX];
        int r = build_initrd(rt, guest, initrd, sizeof(initrd), err);
        if (r == 0) {
                tpl_paths(rt, rootfs, mem, cpus, initrd, t);
                char ready[PATH_MAX + 16];
                snprintf(ready, sizeof(ready), "%s/ready", t->dir);
                if (access(ready, F_OK) != 0) {
                        /* a rebuilt template gets a new RAM memfd */
                        for (struct tpl_mem **pp = &rt->mems; *pp; pp = &(*pp)->next)
                                if (!strcmp((*pp)->dir, t->dir)) {
                                        struct tpl_mem *m = *pp;
                                        *pp = m->next;
                                        close(m->fd);
                                        free(m);
                                        break;
                                }
                        r = tpl_build(rt, rootfs, mem, cpus, initrd, t, err);
                }
                if (r == 0)
                        r = tpl_mem_load(rt, t, err);
        }
        pthread_mutex_unlock(&rt->tpl_mu);
        return r;
}

/* ---- driver ops --------------------------------------------------------------------- */

static struct cove_runtime *vm_open(const char *data_dir, struct cove_err *err)
{
        struct cove_runtime *rt = calloc(1, sizeof(*rt));
        if (!rt) {
                cove_err_set(err, ENOMEM, "vm");
                return NULL;
        }
        pthread_mutex_init(&rt->tpl_mu, NULL);
        const char *k = getenv("COVE_VM_KERNEL_DIR");
        snprintf(rt->kdir, sizeof(rt->kdir), "%s", k && *k ? k : VM_KERNEL_DIR_DEFAULT);
        const char *qb = getenv("COVE_QEMU");
        snprintf(rt->qemu, sizeof(rt->qemu), "%s", qb && *qb ? qb : VM_QEMU_DEFAULT);
        snprintf(rt->dir, sizeof(rt->dir), "%s/vm", data_dir);
        char why[256];
        if (cove_vm_unavailable(why, sizeof(why))) {
                cove_err_setk(err, COVE_E_UNAVAILABLE, 0, "%s", why);
                goto fail;
        }
        char vp[PATH_MAX + 16];
        snprintf(vp, sizeof(vp), "%s/version", rt->kdir);
        char *v = NULL;
        size_t vl = 0;
        if (cove_read_file(vp, sizeof(rt->kver) - 1, &v, &vl, err) < 0)
                goto fail;
        snprintf(rt->kver, sizeof(rt->kver), "%.*s", (int)vl, v);
        free(v);
        rt->kvm = cove_vm_kvm_usable();
        rt->tsc_khz = host_tsc_khz();
        char tp[PATH_MAX + 8];
        snprintf(tp, sizeof(tp), "%s/tpl", rt->dir);
        if (cove_mkdir_p(tp, 0711, err) < 0)
                goto fail;
        chmod(rt->dir, 0711);
        struct cove_err e2;
        rt->cg = cove_cgroups_open(&e2); /* limits are best effort where cgroups are unusable */
        return rt;
fail:
        free(rt);
        return NULL;
}

static void vm_close(struct cove_runtime *rt)
{
        if (!rt)
                return;
        if (rt->cg)
                cove_cgroups_free(rt->cg);
        while (rt->mems) {
                struct tpl_mem *m = rt->mems;
                rt->mems = m->next;
                close(m->fd);
                free(m);
        }
        pthread_mutex_destroy(&rt->tpl_mu);
        free(rt);
}

int cove_vm_unavailable(char *why, size_t cap)
{
        const char *k = getenv("COVE_VM_KERNEL_DIR");
        char kd[PATH_MAX];
        snprintf(kd, sizeof(kd), "%s", k && *k ? k : VM_KERNEL_DIR_DEFAULT);
        const char *qb = getenv("COVE_QEMU");
        const char *q = qb && *qb ? qb : VM_QEMU_DEFAULT;
        char p[PATH_MAX + 32];
        if (access(q, X_OK) < 0) {
                snprintf(why, cap,
                         "vm: %s not found (install qemu-system-x86: scripts/install-deps)", q);
                return 1;
        }
        snprintf(p, sizeof(p), "%s/vmlinux", kd);
        if (access(p, R_OK) < 0) {
                snprintf(why, cap,
                         "vm: no guest kernel at %s (run scripts/install-deps, or set "
                         "COVE_VM_KERNEL_DIR)",
                         p);
                return 1;
        }
        snprintf(p, sizeof(p), "%s/modules/order", kd);
        if (access(p, R_OK) < 0) {
                snprintf(why, cap, "vm: no guest modules at %s (run scripts/install-deps)", p);
                return 1;
        }
        why[0] = 0;
        return 0;
}

/* ---- collecting older builds -------------------------------------------------------- */

/* The backing file name recorded in a qcow2 image's header, or -1. */
static int qcow2_backing(const char *path, char *out, size_t cap)
{
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return -1;
        unsigned char h[20];
        int r = -1;
        if (pread(fd, h, sizeof(h), 0) == (ssize_t)sizeof(h) && !memcmp(h, "QFI\xfb", 4)) {
                uint64_t off;
                uint32_t len;
                memcpy(&off, h + 8, 8);
                memcpy(&len, h + 16, 4);
                off = be64toh(off);
                len = be32toh(len);
                if (off && len && len < cap && off < (1u << 20) &&
                    pread(fd, out, len, (off_t)off) == (ssize_t)len) {
                        out[len] = 0;
                        r = 0;
                }
        }
        close(fd);
        return r;
}

/* Template builds that are not current (their ready record, rehashed with today's rootfs and
 * initramfs, names another dir; an unfinished build; an older record format) and that no
 * disk.qcow2 under state_root backs onto; initramfs files other than the current one. A full
 * snapshot taken on a collected build could not be restored anyway (vm_start answers 409 for
 * another template key), and a rebuild under the same key has another build id. */
static int vm_collect(struct cove_runtime *rt, const char *guest, const char *state_root,
                      uint64_t *freed, struct cove_err *err)
{
        char cur[PATH_MAX];
        if (initrd_path(rt, guest, cur, sizeof(cur), err) < 0)
                return -1;
        char tdir[PATH_MAX + 8];
        snprintf(tdir, sizeof(tdir), "%s/tpl", rt->dir);
        size_t tl = strlen(tdir);
        char(*used)[32] = NULL;
        size_t nused = 0;
        DIR *d = opendir(state_root);
        struct dirent *e;
        while (d && (e = readdir(d))) {
                if (e->d_name[0] == '.')
                        continue;
                char p[PATH_MAX], b[PATH_MAX];
                if (snprintf(p, sizeof(p), "%s/%s/disk.qcow2", state_root, e->d_name) >=
                        (int)sizeof(p) ||
                    qcow2_backing(p, b, sizeof(b)) < 0 || strncmp(b, tdir, tl) || b[tl] != '/')
                        continue;
                const char *k = b + tl + 1, *sl = strchr(k, '/');
                if (!sl || sl == k || sl - k >= 32)
                        continue;
                void *nu = realloc(used, (nused + 1) * sizeof(*used));
                if (!nu)
                        break;
                used = nu;
                snprintf(used[nused++], sizeof(*used), "%.*s", (int)(sl - k), k);
        }
        if (d)
                closedir(d);
        int n = 0;
        uint64_t bytes = 0;
        pthread_mutex_lock(&rt->tpl_mu);
        d = opendir(tdir);
        while (d && (e = readdir(d))) {
                if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                        continue;
                int keep = 0;
                for (size_t i = 0; i < nused && !keep; i++)
                        keep = !strcmp(used[i], e->d_name);
                char dir[PATH_MAX];
                if (snprintf(dir, sizeof(dir), "%s/%s", tdir, e->d_name) >= (int)sizeof(dir))
                        continue;
                struct tpl_rec rec;
                if (!keep && tpl_ready_read(dir, &rec) == 0) {
                        struct tpl t = {0};
                        tpl_paths(rt, rec.rootfs, rec.mem, rec.cpus, cur, &t);
                        keep = !strcmp(t.dir, dir);
                }
                if (keep)
                        continue;
                bytes += tree_bytes(dir, 0);
                if (cove_rm_rf(dir, NULL) == 0)
                        n++;
        }
        if (d)
                closedir(d);
        const char *cb = strrchr(cur, '/') + 1;
        d = opendir(rt->dir);
        while (d && (e = readdir(d))) {
                struct stat st;
                if (strncmp(e->d_name, "initrd-", 7) || !strcmp(e->d_name, cb) ||
                    fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                        continue;
                if (unlinkat(dirfd(d), e->d_name, 0) == 0) {
                        bytes += (uint64_t)st.st_blocks * 512;
                        n++;
                }
        }
        if (d)
                closedir(d);
        pthread_mutex_unlock(&rt->tpl_mu);
        free(used);
        if (freed)
                *freed = bytes;
        return n;
}

int cove_vm_copy_range(int in, off_t in_off, int out, off_t out_off, uint64_t len,
                       struct cove_err *err)
{
        off_t end = in_off + (off_t)len;
        while (in_off < end) {
                ssize_t k = copy_file_range(in, &in_off, out, &out_off, (size_t)(end - in_off), 0);
                if (k < 0 && (errno == EXDEV || errno == EINVAL || errno == EOPNOTSUPP)) {
                        char buf[1 << 16];
                        size_t want = (size_t)(end - in_off) < sizeof(buf) ? (size_t)(end - in_off)
                                                                           : sizeof(buf);
                        k = pread(in, buf, want, in_off);
                        if (k > 0 && pwrite(out, buf, (size_t)k, out_off) != k)
                                k = -1;
                        if (k > 0) {
                                in_off += k;
                                out_off += k;
                        }
                }
                if (k <= 0)
                        return cove_err_set(err, k < 0 ? errno : EIO, "vm: copy");
        }
        return 0;
}

/* Copy len bytes at off of fd into a new file path (0600). */
static int copy_range(int fd, off_t off, const char *path, uint64_t len, struct cove_err *err)
{
        int out = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (out < 0)
                return cove_err_set(err, errno, "vm: create %s", path);
        if (cove_vm_copy_range(fd, off, out, 0, len, err) < 0) {
                close(out);
                unlink(path);
                return cove_err_wrap(err, "vm: copy disk image");
        }
        if (close(out) < 0)
                return cove_err_set(err, errno, "vm: write %s", path);
        return 0;
}

static void inst_free(struct vm_inst *vi)
{
        if (!vi)
                return;
        if (vi->qmp.buf)
                cove_qmp_close(&vi->qmp);
        pthread_mutex_destroy(&vi->mu);
        free(vi);
}

static int vm_start(struct cove_runtime *rt, const struct cove_instance_spec *spec,
                    struct cove_instance *inst, struct cove_err *err)
{
        const char *id = spec->sandbox_id;
        if (!id || strlen(id) > VM_ID_MAX || strchr(id, '/'))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, EINVAL, "vm: bad sandbox id");
        struct vmf_hdr fh;
        memset(&fh, 0, sizeof(fh));
        if (spec->full) {
                if (pread(spec->full_fd, &fh, sizeof(fh), 0) != (ssize_t)sizeof(fh) ||
                    memcmp(fh.magic, VMF_MAGIC, 8) || fh.version != 1 || fh.mem_off < 4096 ||
                    fh.disk_off < sizeof(fh) || fh.disk_off + fh.disk_len > fh.mem_off ||
                    !fh.mem_len || memchr(fh.tpl, 0, sizeof(fh.tpl)) == NULL ||
                    memchr(fh.disk_key_id, 0, sizeof(fh.disk_key_id)) == NULL ||
                    (fh.disk_key_id[0] && !disk_key_id_ok(fh.disk_key_id)))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "vm: not a vm full snapshot image");
                if (!fh.disk_key_id[0] != !spec->disk_encrypted)
                        return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                             "vm: the snapshot's disk is %s, the sandbox's is "
                                             "to be %s",
                                             fh.disk_key_id[0] ? "encrypted" : "not encrypted",
                                             spec->disk_encrypted ? "encrypted" : "plain");
                if (fh.mem_mb != (spec->memory_mb ? spec->memory_mb : VM_MEM_DEFAULT_MB) ||
                    fh.cpus != (spec->cpus ? spec->cpus : 1))
                        return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                             "vm: the snapshot is of a %u MB, %u CPU VM", fh.mem_mb,
                                             fh.cpus);
        }
        if (spec->layer_image)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "vm: restoring a files snapshot into a vm sandbox is not "
                                     "supported");
        unsigned mem = spec->memory_mb ? spec->memory_mb : VM_MEM_DEFAULT_MB;
        unsigned cpus = spec->cpus ? spec->cpus : 1;
        if (mem < 64 || mem > 65536 || cpus > 64)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "vm: memory_mb must be 64..65536 and cpus <= 64");
        struct tpl t = {0};
        int memfd = tpl_get(rt, spec->rootfs, spec->guest_binary, mem, cpus, &t, err);
        if (memfd < 0)
                return cove_err_wrap(err, "vm: template of %s", spec->rootfs);
        if (spec->full && (strcmp(strrchr(t.dir, '/') + 1, fh.tpl) ||
                           (fh.build && t.build && fh.build != t.build)))
                return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                     "vm: the snapshot was taken on another build of its template "
                                     "(template, kernel or guest changed since)");
        /* an encrypted disk: its key (by the disk's lineage: a restored disk keeps the id
         * recorded in its image), in hex for a new overlay (luks.c) and as a pipe for QEMU */
        char dkid[VM_ID_MAX + 1] = "", dhex[2 * VM_DISK_KEY_LEN + 1] = "";
        int keyfd = -1;
        if (spec->disk_encrypted) {
                snprintf(dkid, sizeof(dkid), "%s", spec->full ? fh.disk_key_id : id);
                uint8_t dkey[VM_DISK_KEY_LEN];
                int kr = spec->disk_key ? spec->disk_key(spec->disk_key_ctx, dkid, dkey, err)
                                        : cove_err_setk(err, COVE_E_INTERNAL, 0, "no disk key");
                if (kr == 0 && (keyfd = key_pipe(dkey, spec->uid_base, err)) < 0)
                        kr = -1;
                if (kr == 0 && !spec->full)
                        cove_hex(dkey, sizeof(dkey), dhex);
                explicit_bzero(dkey, sizeof(dkey));
                if (kr < 0)
                        return cove_err_wrap(err, "vm: disk key of %s", id);
        }

        struct vm_inst *vi = calloc(1, sizeof(*vi));
        struct vmcfg *c = calloc(1, sizeof(*c));
        if (!vi || !c) {
                free(vi);
                free(c);
                explicit_bzero(dhex, sizeof(dhex));
                if (keyfd >= 0)
                        close(keyfd);
                return cove_err_set(err, ENOMEM, "vm");
        }
        snprintf(vi->id, sizeof(vi->id), "%s", id);
        snprintf(vi->disk_key_id, sizeof(vi->disk_key_id), "%s", dkid);
        pthread_mutex_init(&vi->mu, NULL);
        vi->mem_mb = mem;
        vi->cpus = cpus;
        vi->build = t.build;
        {
                const char *b = strrchr(t.dir, '/');
                snprintf(vi->tpl, sizeof(vi->tpl), "%s", b ? b + 1 : t.dir);
        }
        vi->qmp.fd = -1;
        int kfd = -1, ifd = -1, rootfd = -1, basefd = -1, ramfd = -1, diskfd = -1, statefd = -1;
        int qmp[2] = {-1, -1}, chan[2] = {-1, -1};
        pid_t pid = -1;
        int rc = -1;
        char disk[PATH_MAX + 16];
        snprintf(disk, sizeof(disk), "%s/disk.qcow2", spec->state_dir);
        unlink(disk);
        char bk[PATH_MAX + 16];
        snprintf(bk, sizeof(bk), "%s", t.base);
        const char *qi[] = {"qemu-img", "create", "-q",    "-f", "qcow2", "-b",
                            bk,         "-F",     "qcow2", disk, NULL};
        if (spec->full) {
                if (copy_range(spec->full_fd, (off_t)fh.disk_off, disk, fh.disk_len, err) < 0)
                        goto fail;
        } else if (dkid[0] ? cove_luks_qcow2_create(disk, bk, "qcow2", dhex, strlen(dhex),
                                                    COVE_LUKS_ITERS, err) < 0
                           : run_tool(qi, err) < 0) {
                explicit_bzero(dhex, sizeof(dhex));
                cove_err_wrap(err, "vm: disk overlay");
                goto fail;
        }
        explicit_bzero(dhex, sizeof(dhex));
        snprintf(vi->disk, sizeof(vi->disk), "%s", disk);
        uid_t uid = spec->uid_base;
        if (chown(disk, uid, uid) < 0 || chmod(disk, 0600) < 0) {
                cove_err_set(err, errno, "vm: chown disk");
                goto fail;
        }
        char kpath[PATH_MAX + 16];
        snprintf(kpath, sizeof(kpath), "%s/vmlinux", rt->kdir);
        char initrd[PATH_MAX];
        if (build_initrd(rt, spec->guest_binary, initrd, sizeof(initrd), err) < 0)
                goto fail;
        kfd = open(kpath, O_RDONLY | O_CLOEXEC);
        ifd = open(initrd, O_RDONLY | O_CLOEXEC);
        ramfd = fcntl(memfd, F_DUPFD_CLOEXEC, 3);
        rootfd = open(t.root, O_RDONLY | O_CLOEXEC);
        basefd = open(t.base, O_RDONLY | O_CLOEXEC);
        diskfd = open(disk, O_RDWR | O_CLOEXEC);
        if (spec->full) {
                char self[64];
                snprintf(self, sizeof(self), "/proc/self/fd/%d", spec->full_fd);
                statefd = open(self, O_RDONLY | O_CLOEXEC); /* an offset of its own */
                if (statefd >= 0 && lseek(statefd, (off_t)fh.mem_off, SEEK_SET) < 0) {
                        close(statefd);
                        statefd = -1;
                }
        } else {
                statefd = open(t.state, O_RDONLY | O_CLOEXEC);
        }
        if (kfd < 0 || ifd < 0 || ramfd < 0 || rootfd < 0 || basefd < 0 || diskfd < 0 ||
            statefd < 0 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, qmp) < 0 ||
            socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, chan) < 0) {
                cove_err_set(err, errno, "vm: open instance files");
                goto fail;
        }
        if (rt->cg) {
                struct cove_cgroup_limits lim = {
                    .cpus = spec->cpus, .memory_mb = mem + VM_MEM_OVERHEAD_MB, .pids_max = 256};
                if (cove_cgroup_create(rt->cg, id, &lim, err) < 0)
                        goto fail;
                vi->cg = 1;
        }
        struct launch l = {.rt = rt, .uid = uid, .cg_id = vi->cg ? id : NULL};
        c->mem_mb = mem;
        c->cpus = cpus;
        char p[64];
        add_fd(&l, kfd, c->kernel, sizeof(c->kernel));
        add_fd(&l, ifd, c->initrd, sizeof(c->initrd));
        add_fd(&l, ramfd, p, sizeof(p));
        snprintf(c->memobj, sizeof(c->memobj),
                 "memory-backend-file,id=mem,size=%llu,mem-path=%s,share=off",
                 (unsigned long long)vm_ram_bytes(mem), p);
        add_fd(&l, rootfd, p, sizeof(p));
        snprintf(c->drive[0], sizeof(c->drive[0]),
                 "driver=file,node-name=rootf,filename=%s,read-only=on", p);
        snprintf(c->drive[1], sizeof(c->drive[1]),
                 "driver=raw,node-name=root,file=rootf,read-only=on");
        add_fd(&l, basefd, p, sizeof(p));
        snprintf(c->drive[2], sizeof(c->drive[2]),
                 "driver=file,node-name=basef,filename=%s,read-only=on", p);
        snprintf(c->drive[3], sizeof(c->drive[3]),
                 "driver=qcow2,node-name=base,file=basef,backing=root,read-only=on");
        add_fd(&l, diskfd, p, sizeof(p));
        snprintf(c->drive[4], sizeof(c->drive[4]), "driver=file,node-name=diskf,filename=%s", p);
        snprintf(c->drive[5], sizeof(c->drive[5]),
                 "driver=qcow2,node-name=disk,file=diskf,backing=base%s",
                 dkid[0] ? ",encrypt.format=luks,encrypt.key-secret=dsec" : "");
        if (dkid[0]) {
                add_fd(&l, keyfd, p, sizeof(p));
                snprintf(c->secret, sizeof(c->secret), "secret,id=dsec,file=%s,format=raw", p);
        }
        int n = add_fd(&l, chan[1], p, sizeof(p));
        snprintf(c->chan, sizeof(c->chan), "socket,id=chan,fd=%d,server=off", n);
        n = add_fd(&l, qmp[1], p, sizeof(p));
        snprintf(c->qmp, sizeof(c->qmp), "socket,id=qmp,fd=%d,server=off", n);
        int sn = add_fd(&l, statefd, p, sizeof(p));
        l.tap_fd = 3 + l.nfds;
        snprintf(c->net, sizeof(c->net), "tap,id=net0,fd=%d", l.tap_fd);
        /* COVE_VM_CONSOLE=1: the guest's console goes to qemu.log (debugging) */
        const char *dbg = getenv("COVE_VM_CONSOLE");
        snprintf(c->serial, sizeof(c->serial),
                 dbg && !strcmp(dbg, "1") ? "file,id=ser,path=/proc/self/fd/1" : "null,id=ser");
        common_args(rt, &l, c);
        if (c->secret[0]) {
                arg(&l, "-object");
                arg(&l, c->secret);
        }
        arg(&l, "-S");
        arg(&l, "-incoming");
        arg(&l, "defer");
        arg(&l, "-sandbox");
        arg(&l, "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny");
        char logp[PATH_MAX + 16];
        snprintf(logp, sizeof(logp), "%s/qemu.log", spec->state_dir);
        l.log_path = logp;
        pid = launch(&l, err);
        close(qmp[1]);
        close(chan[1]);
        qmp[1] = chan[1] = -1;
        if (pid < 0)
                goto fail;
        if (vm_net_nat(pid, err) < 0)
                goto fail;
        int qfd = qmp[0];
        qmp[0] = -1;
        if (cove_qmp_open(&vi->qmp, qfd, VM_QMP_TIMEOUT_MS, err) < 0)
                goto fail;
        char uri[32];
        snprintf(uri, sizeof(uri), "fd:%d", sn);
        json_t *caps = json_pack("{s:[{s:s,s:b},{s:s,s:b}]}", "capabilities", "capability",
                                 "x-ignore-shared", "state", 1, "capability", "events", "state", 1);
        if (cove_qmp_cmd(&vi->qmp, "migrate-set-capabilities", caps, -1, NULL, VM_QMP_TIMEOUT_MS,
                         err) < 0 ||
            cove_qmp_cmd(&vi->qmp, "migrate-incoming", json_pack("{s:s}", "uri", uri), -1, NULL,
                         VM_QMP_TIMEOUT_MS, err) < 0 ||
            cove_qmp_wait_migration(&vi->qmp, 120000, err) < 0 ||
            cove_qmp_cmd(&vi->qmp, "cont", NULL, -1, NULL, VM_QMP_TIMEOUT_MS, err) < 0)
                goto fail;
        inst->pid = pid;
        inst->chan_fd = chan[0];
        chan[0] = -1;
        inst->priv = vi;
        vi = NULL;
        pid = -1;
        rc = 0;
fail:
        if (pid > 0) {
                kill(pid, SIGKILL);
                reap(pid, 0);
        }
        if (vi && vi->cg) {
                cove_cgroup_kill(rt->cg, id, NULL);
                cove_cgroup_remove(rt->cg, id, NULL);
        }
        inst_free(vi);
        int fds[] = {kfd,     ifd,    ramfd,  rootfd,  basefd,  diskfd,
                     statefd, qmp[0], qmp[1], chan[0], chan[1], keyfd};
        for (size_t i = 0; i < COVE_ARRAY_SIZE(fds); i++)
                if (fds[i] >= 0)
                        close(fds[i]);
        free(c);
        if (rc < 0) {
                unlink(disk);
                char lp[PATH_MAX + 16];
                snprintf(lp, sizeof(lp), "%s/qemu.log", spec->state_dir);
                add_log_tail(err, lp);
                cove_err_wrap(err, "vm: start %s", id);
        }
        return rc;
}

static int vm_qmp(struct vm_inst *vi, const char *cmd, struct cove_err *err)
{
        pthread_mutex_lock(&vi->mu);
        int r = cove_qmp_cmd(&vi->qmp, cmd, NULL, -1, NULL, VM_QMP_TIMEOUT_MS, err);
        pthread_mutex_unlock(&vi->mu);
        return r;
}

static int vm_freeze(struct cove_runtime *rt, struct cove_instance *inst, struct cove_err *err)
{
        (void)rt;
        if (!inst->priv)
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "vm: instance not running");
        return vm_qmp(inst->priv, "stop", err) < 0 ? cove_err_wrap(err, "vm: pause") : 0;
}

static int vm_thaw(struct cove_runtime *rt, struct cove_instance *inst, struct cove_err *err)
{
        (void)rt;
        if (!inst->priv)
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "vm: instance not running");
        return vm_qmp(inst->priv, "cont", err) < 0 ? cove_err_wrap(err, "vm: resume") : 0;
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

static int vm_stop(struct cove_runtime *rt, struct cove_instance *inst, const char *sandbox_id,
                   const char *state_dir, int purge, struct cove_err *err)
{
        struct vm_inst *vi = inst->priv;
        const char *id = vi ? vi->id : sandbox_id;
        if (!id)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, EINVAL, "vm: stop without id");
        if (inst->pid > 0) {
                /* quit flushes the overlay's qcow2 metadata (a kept disk stays consistent) */
                int quit = vi && vm_qmp(vi, "quit", NULL) == 0;
                reap(inst->pid, quit ? 3000 : 0);
                inst->pid = 0;
        }
        if (inst->chan_fd >= 0) {
                close(inst->chan_fd);
                inst->chan_fd = -1;
        }
        char idc[VM_ID_MAX + 1];
        snprintf(idc, sizeof(idc), "%s", id);
        inst_free(vi);
        inst->priv = NULL;
        if (teardown(rt, idc, state_dir, purge, err) < 0)
                return cove_err_wrap(err, "vm: stop %s", idc);
        return 0;
}

static int vm_cleanup_stale(struct cove_runtime *rt, const char *sandbox_id, const char *state_dir,
                            int purge, struct cove_err *err)
{
        if (!sandbox_id || !*sandbox_id || strchr(sandbox_id, '/'))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, EINVAL, "vm: cleanup: bad id");
        /* a QEMU left by a crashed coved died with it (PDEATHSIG); the cgroup sweep takes any
         * straggler */
        if (teardown(rt, sandbox_id, state_dir, purge, err) < 0)
                return cove_err_wrap(err, "vm: cleanup %s", sandbox_id);
        return 0;
}

static int vm_usage(struct cove_runtime *rt, struct cove_instance *inst, uint64_t *mem_bytes,
                    uint64_t *cpu_usec, struct cove_err *err)
{
        struct vm_inst *vi = inst->priv;
        if (!vi)
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "vm: instance not running");
        if (rt->cg && vi->cg)
                return cove_cgroup_usage(rt->cg, vi->id, mem_bytes, cpu_usec, err);
        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0, "vm: no cgroup for usage figures");
}

/* An unnamed file in dir (gone when closed), or -1 with err. */
static int tmp_in(const char *dir, struct cove_err *err)
{
        int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (fd < 0)
                cove_err_set(err, errno, "vm: scratch file in %s", dir);
        return fd;
}

/* The disk as it is now into the unnamed file dst: a reflink where the filesystem has them
 * (milliseconds, whatever its size), else a copy. Its length in *len. */
static int disk_capture(const char *disk, int dst, uint64_t *len, struct cove_err *err)
{
        int dfd = open(disk, O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (dfd < 0 || fstat(dfd, &st) < 0) {
                cove_err_set(err, errno, "vm: open disk");
                if (dfd >= 0)
                        close(dfd);
                return -1;
        }
        *len = (uint64_t)st.st_size;
        int r = ioctl(dst, FICLONE, dfd) == 0 ? 0 : cove_vm_copy_range(dfd, 0, dst, 0, *len, err);
        close(dfd);
        return r;
}

/* A full snapshot by pre-copy, as a live migration does: QEMU streams the RAM while the guest
 * runs (into an unnamed scratch file), re-sending what the guest dirties, and stops it only
 * for the last dirty pages (downtime-limit). pause-before-switchover holds it stopped at that
 * point, while the disk is captured (a reflink of the overlay: the stop flushed it), so disk
 * and memory are of the same instant; then the device state goes out and the guest
 * continues. The image is assembled from the scratch files after the guest runs again.
 * *pause_ns: how long the guest was stopped. */
static int vm_full_snapshot(struct cove_runtime *rt, struct cove_instance *inst, int out_fd,
                            uint64_t *pause_ns, struct cove_err *err)
{
        (void)rt;
        struct vm_inst *vi = inst->priv;
        if (!vi)
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "vm: instance not running");
        struct vmf_hdr h;
        memset(&h, 0, sizeof(h));
        memcpy(h.magic, VMF_MAGIC, 8);
        h.version = 1;
        h.mem_mb = vi->mem_mb;
        h.cpus = vi->cpus;
        snprintf(h.tpl, sizeof(h.tpl), "%s", vi->tpl);
        h.build = vi->build;
        snprintf(h.disk_key_id, sizeof(h.disk_key_id), "%s", vi->disk_key_id);
        h.disk_off = 4096;
        /* the memory stream's scratch file beside the image (on the checkpoint tmpfs for a
         * sandbox with encrypted storage: its RAM never lands on a disk in the clear), the
         * disk's beside the disk (a reflink) */
        char dir[PATH_MAX + 16], mdir[PATH_MAX + 16], lk[64];
        snprintf(dir, sizeof(dir), "%s", vi->disk);
        char *slash = strrchr(dir, '/');
        if (slash)
                *slash = '\0';
        snprintf(lk, sizeof(lk), "/proc/self/fd/%d", out_fd);
        ssize_t ml = readlink(lk, mdir, sizeof(mdir) - 1);
        mdir[ml > 0 ? ml : 0] = '\0';
        slash = strrchr(mdir, '/');
        if (mdir[0] != '/' || !slash || slash == mdir)
                return cove_err_setk(err, COVE_E_INTERNAL, 0,
                                     "vm: full snapshot of %s: where the image is (%s) is unknown",
                                     vi->id, mdir);
        *slash = '\0';
        int memfd = tmp_in(mdir, err), diskfd = memfd < 0 ? -1 : tmp_in(dir, err);
        if (diskfd < 0) {
                if (memfd >= 0)
                        close(memfd);
                return cove_err_wrap(err, "vm: full snapshot of %s", vi->id);
        }
        pthread_mutex_lock(&vi->mu);
        int64_t t0 = 0;
        int migrating = 0, stopped = 0, r = -1;
        json_t *caps =
            json_pack("{s:[{s:s,s:b},{s:s,s:b},{s:s,s:b}]}", "capabilities", "capability",
                      "x-ignore-shared", "state", 1, "capability", "events", "state", 1,
                      "capability", "pause-before-switchover", "state", 1);
        /* QEMU 7's default bandwidth cap (32 MiB/s) is for a network; here it is a local file */
        json_t *params = json_pack("{s:I, s:I}", "max-bandwidth", (json_int_t)1 << 34,
                                   "downtime-limit", (json_int_t)10);
        if (cove_qmp_cmd(&vi->qmp, "migrate-set-capabilities", caps, -1, NULL, VM_QMP_TIMEOUT_MS,
                         err) < 0 ||
            cove_qmp_cmd(&vi->qmp, "migrate-set-parameters", params, -1, NULL, VM_QMP_TIMEOUT_MS,
                         err) < 0 ||
            cove_qmp_cmd(&vi->qmp, "getfd", json_pack("{s:s}", "fdname", "snap"), memfd, NULL,
                         VM_QMP_TIMEOUT_MS, err) < 0 ||
            cove_qmp_cmd(&vi->qmp, "migrate", json_pack("{s:s}", "uri", "fd:snap"), -1, NULL,
                         VM_QMP_TIMEOUT_MS, err) < 0)
                goto out;
        migrating = 1;
        /* a guest that dirties memory faster than it streams never gets under 10 ms: after a
         * while, accept a longer stop rather than iterate without end */
        int w = cove_qmp_wait_migration_to(&vi->qmp, "pre-switchover", 10000, err);
        if (w < 0 && err && err->errnum == ETIMEDOUT) {
                if (cove_qmp_cmd(&vi->qmp, "migrate-set-parameters",
                                 json_pack("{s:I}", "downtime-limit", (json_int_t)60000), -1, NULL,
                                 VM_QMP_TIMEOUT_MS, err) < 0)
                        goto out;
                w = cove_qmp_wait_migration_to(&vi->qmp, "pre-switchover", 300000, err);
        }
        if (w < 0)
                goto out;
        t0 = cove_mono_ns(); /* the guest is stopped from here (QEMU stopped it and flushed) */
        stopped = 1;
        if (disk_capture(vi->disk, diskfd, &h.disk_len, err) < 0 ||
            cove_qmp_cmd(&vi->qmp, "migrate-continue",
                         json_pack("{s:s}", "state", "pre-switchover"), -1, NULL, VM_QMP_TIMEOUT_MS,
                         err) < 0 ||
            cove_qmp_wait_migration(&vi->qmp, 300000, err) < 0)
                goto out;
        migrating = 0;
        r = 0;
out:
        if (migrating) {
                struct cove_err e2;
                cove_qmp_cmd(&vi->qmp, "migrate_cancel", NULL, -1, NULL, VM_QMP_TIMEOUT_MS, &e2);
                cove_qmp_wait_migration_to(&vi->qmp, "cancelled", 10000, &e2);
        }
        if (stopped) {
                struct cove_err e2;
                /* the MIGRATION completed event comes before QEMU has finished the migration
                 * ("not finalized yet"): cont succeeds a moment later */
                int cr;
                for (int i = 0; (cr = cove_qmp_cmd(&vi->qmp, "cont", NULL, -1, NULL,
                                                   VM_QMP_TIMEOUT_MS, &e2)) < 0 &&
                                i < 1000 && strstr(e2.msg, "not finalized");
                     i++) {
                        struct timespec ts = {0, 2000000};
                        nanosleep(&ts, NULL);
                }
                if (cr < 0 && r == 0)
                        r = cove_err_setk(err, COVE_E_INTERNAL, 0,
                                          "vm: continue after snapshot: %s", e2.msg);
        }
        if (pause_ns)
                *pause_ns = stopped ? (uint64_t)(cove_mono_ns() - t0) : 0;
        pthread_mutex_unlock(&vi->mu);
        /* the image: header, disk, memory stream (the guest runs again meanwhile) */
        struct stat st;
        if (r == 0 && (fstat(memfd, &st) < 0 || st.st_size <= 0))
                r = cove_err_set(err, errno ? errno : EIO, "vm: empty memory stream");
        if (r == 0) {
                h.mem_len = (uint64_t)st.st_size;
                h.mem_off = (h.disk_off + h.disk_len + VMF_ALIGN - 1) / VMF_ALIGN * VMF_ALIGN;
                if (cove_vm_copy_range(diskfd, 0, out_fd, (off_t)h.disk_off, h.disk_len, err) < 0 ||
                    cove_vm_copy_range(memfd, 0, out_fd, (off_t)h.mem_off, h.mem_len, err) < 0)
                        r = -1;
                else if (pwrite(out_fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h))
                        r = cove_err_set(err, errno, "vm: write snapshot header");
        }
        close(memfd);
        close(diskfd);
        return r < 0 ? cove_err_wrap(err, "vm: full snapshot of %s", vi->id) : 0;
}

const struct cove_runtime_ops cove_runtime_vm = {
    .full_snapshot = vm_full_snapshot,
    .collect = vm_collect,
    .name = "vm",
    .open = vm_open,
    .close = vm_close,
    .start = vm_start,
    .freeze = vm_freeze,
    .thaw = vm_thaw,
    .stop = vm_stop,
    .cleanup_stale = vm_cleanup_stale,
    .usage = vm_usage,
};
