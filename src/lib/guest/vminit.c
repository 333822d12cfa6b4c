/* cove-guest as the init of a vm sandbox's initramfs (docs/vm.md): load the virtio and ext4
 * modules listed in /modules/order, mount the root disk (/dev/vda, the sandbox's qcow2 overlay
 * over the template's ext4 image) and switch to it, set up /dev, /proc, /sys, then wait for
 * the node on the virtio-serial port and hand that fd to the ordinary guest loop. With
 * cove.chan=vsock:PORT on the kernel command line (Firecracker, which has no virtio-serial)
 * the guest listens on that AF_VSOCK port instead and takes the node's connection from it.
 * Everything else (exec, files, PTY) is the same code as in an ns sandbox. */
#include "guest/guest.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <linux/random.h>
#include <linux/vm_sockets.h>

#define VM_PORT_NAME "cove" /* virtserialport name=cove on the QEMU side */
#define VM_ROOT_DEV "/dev/vda"

static void nap_ms(long ms)
{
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
}

/* Wait (bounded) for a device node the kernel creates asynchronously. */
static int wait_path(const char *p, int timeout_ms)
{
        for (int t = 0; t < timeout_ms; t += 2) {
                if (access(p, F_OK) == 0)
                        return 0;
                nap_ms(2);
        }
        return access(p, F_OK);
}

/* The port's /dev node (vport<N>p<M>, numbered by probe order) by its name, waiting for the
 * driver to announce it. */
static int find_port(char *out, size_t cap, int timeout_ms)
{
        for (int t = 0; t < timeout_ms; t += 2) {
                DIR *d = opendir("/sys/class/virtio-ports");
                struct dirent *e;
                while (d && (e = readdir(d))) {
                        if (e->d_name[0] == '.' || strlen(e->d_name) > 32)
                                continue;
                        char p[96], name[32] = "";
                        snprintf(p, sizeof(p), "/sys/class/virtio-ports/%s/name", e->d_name);
                        int fd = open(p, O_RDONLY | O_CLOEXEC);
                        if (fd < 0)
                                continue;
                        ssize_t n = read(fd, name, sizeof(name) - 1);
                        close(fd);
                        name[n > 0 ? n : 0] = 0;
                        name[strcspn(name, "\n")] = 0;
                        snprintf(out, cap, "/dev/%s", e->d_name);
                        if (strcmp(name, VM_PORT_NAME) == 0 && access(out, F_OK) == 0) {
                                closedir(d);
                                return 0;
                        }
                }
                if (d)
                        closedir(d);
                nap_ms(2);
        }
        return -1;
}

int cove_guest_vm_chan_port(const char *cmdline, unsigned *port)
{
        /* the last cove.chan= wins, as for kernel parameters */
        const char *val = NULL;
        size_t vlen = 0;
        for (const char *p = cmdline; p && *p;) {
                p += strspn(p, " \t\n");
                size_t n = strcspn(p, " \t\n");
                if (n >= 10 && !strncmp(p, "cove.chan=", 10)) {
                        val = p + 10;
                        vlen = n - 10;
                }
                p += n;
        }
        *port = 0;
        if (!val || (vlen == 6 && !strncmp(val, "virtio", 6)))
                return 0;
        if (vlen < 7 || vlen > 6 + 10 || strncmp(val, "vsock:", 6))
                return -1;
        unsigned long long v = 0;
        for (size_t i = 6; i < vlen; i++) {
                if (val[i] < '0' || val[i] > '9')
                        return -1;
                v = v * 10 + (unsigned)(val[i] - '0');
        }
        /* VMADDR_PORT_ANY (-1U) is not a port; ports below 1024 are privileged but allowed */
        if (v == 0 || v >= 0xffffffffULL)
                return -1;
        *port = (unsigned)v;
        return 1;
}

/* A listening AF_VSOCK socket on port (any CID), retried (bounded) while the transport
 * driver is still coming up. */
static int vsock_listen(unsigned port, int timeout_ms)
{
        int e = 0;
        for (int t = 0; t < timeout_ms; t += 2) {
                int s = socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
                struct sockaddr_vm a = {
                    .svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_ANY, .svm_port = port};
                if (s >= 0 && bind(s, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(s, 4) == 0)
                        return s;
                e = errno;
                if (s >= 0)
                        close(s);
                nap_ms(2);
        }
        errno = e;
        return -1;
}

static int load_modules(struct cove_err *err)
{
        FILE *f = fopen("/modules/order", "re");
        if (!f)
                return cove_err_set(err, errno, "open /modules/order");
        char line[128];
        int r = 0;
        while (r == 0 && fgets(line, sizeof(line), f)) {
                line[strcspn(line, "\r\n")] = 0;
                if (!line[0] || strchr(line, '/'))
                        continue;
                char path[160];
                snprintf(path, sizeof(path), "/modules/%s", line);
                int fd = open(path, O_RDONLY | O_CLOEXEC);
                if (fd < 0) {
                        r = cove_err_set(err, errno, "open module %s", line);
                        break;
                }
                if (syscall(SYS_finit_module, fd, "", 0) < 0 && errno != EEXIST)
                        r = cove_err_set(err, errno, "load module %s", line);
                close(fd);
                unlink(path); /* the initramfs stays in RAM: give the memory back */
        }
        fclose(f);
        return r;
}

static int mkmount(const char *src, const char *dst, const char *type, unsigned long flags,
                   const char *data, struct cove_err *err)
{
        mkdir(dst, 0755);
        if (mount(src, dst, type, flags, data) < 0)
                return cove_err_set(err, errno, "mount %s on %s", type ? type : src, dst);
        return 0;
}

static int if_up(int s, const char *name, uint32_t ip, uint32_t mask)
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

/* lo, and eth0 when the VM has a network device: 169.254.100.2/30 with the default route
 * via 169.254.100.1, QEMU's tap in its own netns, which forwards and masquerades to the
 * sandbox's egress link (docs/vm.md). The same in every VM. */
static void net_up(void)
{
        int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (s < 0)
                return;
        if_up(s, "lo", 0, 0);
        if (if_nametoindex("eth0") && if_up(s, "eth0", 0xa9fe6402u, 0xfffffffcu) == 0) {
                struct rtentry rt;
                memset(&rt, 0, sizeof(rt));
                struct sockaddr_in *gw = (struct sockaddr_in *)&rt.rt_gateway;
                struct sockaddr_in *dst = (struct sockaddr_in *)&rt.rt_dst;
                struct sockaddr_in *msk = (struct sockaddr_in *)&rt.rt_genmask;
                gw->sin_family = dst->sin_family = msk->sin_family = AF_INET;
                gw->sin_addr.s_addr = htonl(0xa9fe6401u);
                rt.rt_flags = RTF_UP | RTF_GATEWAY;
                ioctl(s, SIOCADDRT, &rt);
        }
        close(s);
}

int cove_guest_vm_init(int *chan_fd, int *listen_fd, struct cove_err *err)
{
        umask(022);
        if (mkmount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755", err) < 0 ||
            mkmount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL, err) < 0 ||
            mkmount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL, err) < 0)
                return -1;
        if (load_modules(err) < 0)
                return -1;
        if (wait_path(VM_ROOT_DEV, 5000) < 0)
                return cove_err_set(err, errno, "root disk %s", VM_ROOT_DEV);
        if (mkmount(VM_ROOT_DEV, "/newroot", "ext4", MS_NOATIME, NULL, err) < 0)
                return -1;
        /* /dev, /proc, /sys move along; then the disk becomes / (switch_root without exec:
         * this process keeps running from the initramfs copy it was loaded from) */
        static const char *const moves[] = {"/dev", "/proc", "/sys"};
        for (size_t i = 0; i < sizeof(moves) / sizeof(moves[0]); i++) {
                char dst[32];
                snprintf(dst, sizeof(dst), "/newroot%s", moves[i]);
                mkdir(dst, 0755);
                if (mount(moves[i], dst, NULL, MS_MOVE, NULL) < 0)
                        return cove_err_set(err, errno, "move %s", moves[i]);
        }
        if (chdir("/newroot") < 0 || mount(".", "/", NULL, MS_MOVE, NULL) < 0 || chroot(".") < 0 ||
            chdir("/") < 0)
                return cove_err_set(err, errno, "switch to the root disk");
        mkdir("/dev/pts", 0755);
        if (mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
                  "newinstance,ptmxmode=0666,mode=0620,gid=5") < 0)
                return cove_err_set(err, errno, "mount devpts");
        unlink("/dev/ptmx");
        if (symlink("pts/ptmx", "/dev/ptmx") < 0)
                return cove_err_set(err, errno, "/dev/ptmx");
        mkdir("/dev/shm", 01777);
        mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
        symlink("/proc/self/fd", "/dev/fd");
        symlink("/proc/self/fd/0", "/dev/stdin");
        symlink("/proc/self/fd/1", "/dev/stdout");
        symlink("/proc/self/fd/2", "/dev/stderr");
        net_up();

        *listen_fd = -1;
        unsigned vport = 0;
        char cmdline[4096];
        int cfd = open("/proc/cmdline", O_RDONLY | O_CLOEXEC);
        ssize_t cn = cfd < 0 ? -1 : read(cfd, cmdline, sizeof(cmdline) - 1);
        if (cfd >= 0)
                close(cfd);
        cmdline[cn > 0 ? cn : 0] = 0;
        int mode = cove_guest_vm_chan_port(cmdline, &vport);
        if (mode < 0)
                return cove_err_set(err, EINVAL,
                                    "kernel command line: bad cove.chan= (want "
                                    "cove.chan=vsock:PORT or cove.chan=virtio)");
        if (mode == 1) {
                int s = vsock_listen(vport, 5000);
                if (s < 0)
                        return cove_err_set(err, errno, "guest channel: listen on vsock port %u",
                                            vport);
                *chan_fd = -1;
                *listen_fd = s;
                return 0;
        }
        char port[300];
        if (find_port(port, sizeof(port), 5000) < 0)
                return cove_err_set(err, ENOENT, "guest channel: no virtio-serial port named %s",
                                    VM_PORT_NAME);
        int fd = open(port, O_RDWR | O_CLOEXEC);
        if (fd < 0)
                return cove_err_set(err, errno, "open %s", port);
        *chan_fd = fd;
        return 0;
}

int cove_guest_vm_wait_node(int *chan_fd, int listen_fd)
{
        if (listen_fd >= 0) {
                /* vsock: the node connects (the hybrid vsock CONNECT on the host); a template
                 * snapshot is taken while the guest waits in accept() */
                int c;
                do
                        c = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
                while (c < 0 && (errno == EINTR || errno == ECONNABORTED));
                if (c < 0)
                        return -1;
                *chan_fd = c;
                return 0;
        }
        int fd = *chan_fd;
        /* The port reports POLLHUP until the node has connected to its end; no event
         * announces the connection that poll() could wait for, so look every 2 ms. A
         * template snapshot is taken while its guest waits here, so every clone starts
         * here and meets its own node connection. */
        for (;;) {
                struct pollfd p = {.fd = fd, .events = POLLIN};
                int n = poll(&p, 1, -1);
                if (n < 0 && errno != EINTR)
                        return -1;
                if (n > 0 && !(p.revents & POLLHUP))
                        return 0;
                nap_ms(2);
        }
}

void cove_guest_vm_seed(const unsigned char *seed, size_t len)
{
        struct {
                struct rand_pool_info info;
                unsigned char buf[64];
        } rp;
        if (len > sizeof(rp.buf))
                len = sizeof(rp.buf);
        memset(&rp, 0, sizeof(rp));
        rp.info.entropy_count = (int)(len * 8);
        rp.info.buf_size = (int)len;
        memcpy(rp.buf, seed, len);
        int fd = open("/dev/urandom", O_WRONLY | O_CLOEXEC);
        if (fd >= 0) {
                if (ioctl(fd, RNDADDENTROPY, &rp) < 0) {
                        /* mixed in without credit at least */
                        ssize_t w = write(fd, seed, len);
                        (void)w;
                }
                /* a ready crng only takes new input at its next scheduled reseed (up to a
                 * minute away): until then clones of one snapshot would produce the same
                 * bytes. Reseed now. */
                ioctl(fd, RNDRESEEDCRNG);
                close(fd);
        }
        explicit_bzero(&rp, sizeof(rp));
}

/* The kernel's boot_id is read-only and made once; a fork gets its own by a bind mount of a
 * fresh one (a version 4 UUID from the just reseeded RNG) over it. The file lives on a small
 * tmpfs that is detached right after, so only the bound file stays reachable. A later fork
 * of this fork replaces the bind. */
#define VM_BOOT_ID "/proc/sys/kernel/random/boot_id"
int cove_guest_vm_new_boot_id(void)
{
        unsigned char u[16];
        if (getrandom(u, sizeof(u), 0) != (ssize_t)sizeof(u))
                return -1;
        u[6] = (unsigned char)((u[6] & 0x0f) | 0x40);
        u[8] = (unsigned char)((u[8] & 0x3f) | 0x80);
        char id[40];
        int n = snprintf(id, sizeof(id),
                         "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n",
                         u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
                         u[12], u[13], u[14], u[15]);
        static const char dir[] = "/dev/.cove-boot-id";
        if (mkdir(dir, 0700) < 0 && errno != EEXIST)
                return -1;
        int r = -1, e = 0;
        if (mount("tmpfs", dir, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=0700") <
            0) {
                e = errno;
                goto out;
        }
        int fd = open("/dev/.cove-boot-id/boot_id", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0444);
        if (fd < 0 || write(fd, id, (size_t)n) != n) {
                e = errno;
                if (fd >= 0)
                        close(fd);
                goto unmount;
        }
        close(fd);
        while (umount2(VM_BOOT_ID, MNT_DETACH) == 0) /* an earlier fork's */
                ;
        if (mount("/dev/.cove-boot-id/boot_id", VM_BOOT_ID, NULL, MS_BIND, NULL) < 0 ||
            mount(NULL, VM_BOOT_ID, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV,
                  NULL) < 0) {
                e = errno;
                goto unmount;
        }
        r = 0;
unmount:
        umount2(dir, MNT_DETACH);
out:
        rmdir(dir);
        explicit_bzero(u, sizeof(u));
        errno = e;
        return r;
}

_Noreturn void cove_guest_vm_poweroff(void)
{
        sync();
        /* Firecracker has no power-off device: a reboot (reboot=k) ends its VMM */
        char cmdline[4096];
        unsigned port;
        int fd = open("/proc/cmdline", O_RDONLY | O_CLOEXEC);
        ssize_t n = fd < 0 ? -1 : read(fd, cmdline, sizeof(cmdline) - 1);
        if (fd >= 0)
                close(fd);
        cmdline[n > 0 ? n : 0] = 0;
        if (cove_guest_vm_chan_port(cmdline, &port) == 1)
                reboot(RB_AUTOBOOT);
        reboot(RB_POWER_OFF);
        for (;;)
                pause();
}
