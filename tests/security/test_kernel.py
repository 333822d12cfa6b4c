"""Privileged kernel interfaces from inside a sandbox: mounts, namespaces, modules, bpf,
keyctl, io_uring, userfaultfd, perf, kexec, reboot, clocks, swap, device nodes, /proc/sys,
/sys, sysrq. Every attempt must fail; the host's values must be unchanged."""
import socket

import pytest

from secutil import sh

# sysprobe line → results that mean "refused". Anything else (OK above all) is an escape.
REFUSED = {"EPERM", "ENOSYS", "EACCES", "EROFS"}
PROBES = [
    "bpf", "keyctl", "add_key", "request_key", "io_uring_setup", "userfaultfd",
    "perf_event_open", "init_module", "finit_module", "delete_module", "kexec_load",
    "kexec_file_load", "reboot", "clock_settime", "settimeofday", "swapon", "syslog", "acct",
    "unshare_user", "unshare_mnt", "unshare_net", "unshare_pid", "unshare_cgroup",
    "clone_newuser", "clone_newns", "clone3_newuser", "setns", "mount_tmpfs", "mount_proc",
    "mount_bind", "mount_remount_proc_sys_rw", "umount_proc_sys", "fsopen", "open_tree",
    "pivot_root", "mknod_block", "mknod_char", "mknodat_char", "open_by_handle_at",
    "name_to_handle_at", "iopl", "ioperm",
]
# other ABIs on x86_64: the filter must kill (SIGSYS = 31) or refuse, never allow
ABI_PROBES = ["x32_unshare", "i386_unshare"]


@pytest.fixture
def probe_results(client, sandbox, helper, upload, host_marker):
    upload(sandbox["id"], helper("sysprobe"), "/tmp/sysprobe")
    r = sh(client, sandbox["id"], f"/tmp/sysprobe {host_marker[0]}")
    assert r["exit_code"] == 0, f"sysprobe failed: {r}"
    res = dict(line.split("=", 1) for line in r["stdout"].splitlines() if "=" in line)
    return res


@pytest.mark.root
@pytest.mark.parametrize("name", PROBES)
def test_privileged_syscall_refused(probe_results, name):
    if name in ("iopl", "ioperm") and name not in probe_results:
        pytest.skip("x86 only")
    assert name in probe_results, f"sysprobe printed no result for {name}: {probe_results}"
    assert probe_results[name] in REFUSED, (
        f"{name} from inside the sandbox gave {probe_results[name]}, expected EPERM/ENOSYS")


@pytest.mark.root
@pytest.mark.parametrize("name", ABI_PROBES)
def test_foreign_abi_does_not_bypass_seccomp(probe_results, name):
    if name not in probe_results:
        pytest.skip("x86_64 only")
    v = probe_results[name]
    assert v.startswith("KILLED:31") or v in REFUSED, f"{name} gave {v}: seccomp bypass"


@pytest.mark.root
def test_chroot_escape_stays_in_sandbox(probe_results):
    # the classic chroot + chdir("..") climb must end at the sandbox root: the host marker
    # file (a /tmp path on the host) is not found there
    assert probe_results.get("chroot_escape") != "OK", "chroot escape reached a host path"


@pytest.mark.root
def test_busybox_mount_unshare_refused(client, sandbox):
    sid = sandbox["id"]
    cmds = {
        "mount_proc": "mkdir -p /tmp/m && mount -t proc proc /tmp/m",
        "mount_tmpfs": "mkdir -p /tmp/m && mount -t tmpfs none /tmp/m",
        "mount_bind": "mkdir -p /tmp/m && mount --bind / /tmp/m",
        "remount_rw_sys": "mount -o remount,rw /sys",
        "umount_proc": "umount -l /proc",
        "unshare_U": "unshare -U -r true",
        "unshare_m": "unshare -m true",
        "nsenter_host": "nsenter -t 1 -m -U true",
        "insmod": "echo x > /tmp/x.ko && insmod /tmp/x.ko",
        "swapon": "dd if=/dev/zero of=/tmp/sw bs=1k count=64 2>/dev/null && mkswap /tmp/sw"
                  " >/dev/null && swapon /tmp/sw",
        "date_set": "date -s 2001.01.01-00:00:00 >/dev/null 2>&1; [ $(date +%Y) = 2001 ]",
        "sysctl_w": "sysctl -w kernel.hostname=pwned",
        "reboot_f": "reboot -f",
    }
    for name, cmd in cmds.items():
        r = sh(client, sid, f"{cmd}; echo rc=$?")
        assert "rc=0" not in r["stdout"], f"{name}: `{cmd}` succeeded inside: {r}"
    # the sandbox is intact afterwards
    assert sh(client, sid, "echo alive")["stdout"] == "alive\n"
    assert "proc /proc" in sh(client, sid, "cat /proc/mounts")["stdout"]


@pytest.mark.root
def test_proc_sys_and_sys_writes_refused(client, sandbox):
    sid = sandbox["id"]
    with open("/proc/sys/kernel/hostname") as f:
        host_hostname = f.read()
    with open("/proc/sys/kernel/domainname") as f:
        host_domain = f.read()
    targets = [
        "/proc/sys/kernel/hostname", "/proc/sys/kernel/domainname",
        "/proc/sys/kernel/core_pattern", "/proc/sys/kernel/modprobe",
        "/proc/sys/vm/drop_caches", "/proc/sys/net/ipv4/ip_forward",
        "/proc/sys/kernel/sysrq", "/proc/sysrq-trigger", "/sys/kernel/uevent_helper",
        "/sys/kernel/mm/transparent_hugepage/enabled", "/sys/power/state",
        "/sys/kernel/profiling", "/proc/1/attr/current",
    ]
    script = "".join(
        f"if [ -e {p} ]; then (echo pwned > {p}) 2>/dev/null && echo WROTE:{p}; fi\n"
        for p in targets)
    # also every writable-looking file under /proc/sys
    script += ("find /proc/sys -type f 2>/dev/null | head -2000 | while read f; do "
               "if (cat \"$f\" > \"$f\") 2>/dev/null; then echo WROTE:$f; fi; done\n")
    r = sh(client, sid, script, timeout=300)
    wrote = [l for l in r["stdout"].splitlines() if l.startswith("WROTE:")]
    assert not wrote, f"writes inside the sandbox succeeded: {wrote[:20]}"
    with open("/proc/sys/kernel/hostname") as f:
        assert f.read() == host_hostname, "host hostname changed"
    with open("/proc/sys/kernel/domainname") as f:
        assert f.read() == host_domain, "host domainname changed"
    assert socket.gethostname() + "\n" == host_hostname


@pytest.mark.root
def test_sethostname_inside_is_private(client, sandbox):
    # root of the sandbox may rename its own UTS namespace; the host's name must not move
    before = open("/proc/sys/kernel/hostname").read()
    sh(client, sandbox["id"], "hostname pwned-host 2>/dev/null; true")
    assert open("/proc/sys/kernel/hostname").read() == before


@pytest.mark.root
def test_device_nodes(client, sandbox):
    sid = sandbox["id"]
    r = sh(client, sid,
           "mknod /tmp/sda b 8 0; echo rc_b=$?; mknod /tmp/mem c 1 1; echo rc_c=$?; "
           "mknod /dev/sda b 8 0; echo rc_d=$?; ls -la /tmp/sda /tmp/mem 2>&1")
    assert "rc_b=0" not in r["stdout"] and "rc_c=0" not in r["stdout"] \
        and "rc_d=0" not in r["stdout"], f"mknod succeeded: {r}"
    # /dev holds only the minimal set; host devices are not reachable
    r = sh(client, sid, "ls /dev")
    allowed = {"fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin",
               "stdout", "tty", "urandom", "zero", "console", "mqueue"}
    extra = set(r["stdout"].split()) - allowed
    assert not extra, f"unexpected entries in the sandbox's /dev: {sorted(extra)}"
    host_devs = ["/dev/mem", "/dev/kmem", "/dev/port", "/dev/sda", "/dev/vda", "/dev/nvme0n1",
                 "/dev/kmsg", "/dev/loop0", "/dev/loop-control", "/dev/fuse", "/dev/kvm",
                 "/dev/net/tun", "/dev/dm-0", "/dev/console"]
    script = "".join(f"(head -c 1 {p} >/dev/null) 2>/dev/null && echo OPENED:{p}\n"
                     for p in host_devs)
    # device numbers of host devices through the /sys tree cannot be opened either
    script += "for d in /sys/dev/block/*; do [ -e \"$d\" ] && echo SYSDEV; break; done\n"
    r = sh(client, sid, script)
    opened = [l for l in r["stdout"].splitlines() if l.startswith("OPENED:")]
    assert not opened, f"host devices readable inside: {opened}"
    # writes to the null device work (sanity), and /dev is read-only for new entries
    r = sh(client, sid, "echo x > /dev/null && echo ok; touch /dev/newfile; echo rc=$?")
    assert r["stdout"].startswith("ok\n") and "rc=0" not in r["stdout"]


@pytest.mark.root
def test_no_new_privs_and_uid_map(client, sandbox):
    r = sh(client, sandbox["id"], "cat /proc/self/uid_map /proc/self/gid_map; "
                                  "grep -E 'NoNewPrivs|Seccomp:' /proc/self/status")
    lines = r["stdout"].splitlines()
    maps = [list(map(int, l.split())) for l in lines if l.strip() and l.split()[0].isdigit()]
    assert len(maps) == 2, r
    for inside, outside, count in maps:
        assert inside == 0 and outside >= 0x10000000, \
            f"sandbox id 0 maps to host id {outside}, below the private range 0x10000000"
        assert count <= 65536
    # no no_new_privs (setuid, sudo, works up to the sandbox's root); the filter holds
    assert "NoNewPrivs:\t0" in r["stdout"] and "Seccomp:\t2" in r["stdout"], r


@pytest.mark.root
def test_cap_bounding_not_host_caps(client, sandbox):
    # capabilities held inside are relative to the sandbox's user namespace; a check that
    # needs init-namespace privilege (e.g. reading the host's kernel log) still fails
    r = sh(client, sandbox["id"], "dmesg >/dev/null 2>&1; echo rc=$?; "
                                  "cat /proc/kmsg >/dev/null 2>&1; echo rc2=$?")
    assert "rc=0" not in r["stdout"] and "rc2=0" not in r["stdout"], r
