/* Unit tests for the vm drivers' host-side protocol code: the QMP client (runtime/qmp.c)
 * against a scripted QEMU monitor on a socketpair, and the Firecracker API requests
 * (runtime/vm_firecracker.c) against a recorded exchange.
 *
 * The Firecracker exchange below is a test double at a boundary this machine cannot reach:
 * there is no firecracker binary and no working KVM here, so it was not captured from a
 * live VMM but transcribed from Firecracker's API specification (firecracker.yaml, v1.x)
 * and its getting-started/snapshot documentation: request lines, headers and bodies as the
 * VMM's HTTP server accepts them, and its 204 / 400 {"fault_message"} answers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime/qmp.h"
#include "runtime/vm_firecracker.h"

static const struct {
        const char *method, *path, *want;
} fc_recorded[] = {
    {"PUT", "/boot-source",
     "PUT /boot-source HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n"
     "Content-Type: application/json\r\nContent-Length: 113\r\n\r\n"
     "{\"kernel_image_path\":\"/k/vmlinux\",\"initrd_path\":\"/k/initrd\",\"boot_args\":"
     "\"console=ttyS0 reboot=k panic=1 pci=off\"}"},
    {"PUT", "/drives/rootfs",
     "PUT /drives/rootfs HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n"
     "Content-Type: application/json\r\nContent-Length: 94\r\n\r\n"
     "{\"drive_id\":\"rootfs\",\"path_on_host\":\"/s/disk.ext4\",\"is_root_device\":true,"
     "\"is_read_only\":false}"},
    {"PUT", "/machine-config",
     "PUT /machine-config HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n"
     "Content-Type: application/json\r\nContent-Length: 47\r\n\r\n"
     "{\"vcpu_count\":2,\"mem_size_mib\":512,\"smt\":false}"},
    {"PUT", "/vsock",
     "PUT /vsock HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n"
     "Content-Type: application/json\r\nContent-Length: 38\r\n\r\n"
     "{\"guest_cid\":3,\"uds_path\":\"/s/v.sock\"}"},
    {"PUT", "/actions",
     "PUT /actions HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n"
     "Content-Type: application/json\r\nContent-Length: 31\r\n\r\n"
     "{\"action_type\":\"InstanceStart\"}"},
    {"PATCH", "/vm",
     "PATCH /vm HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n"
     "Content-Type: application/json\r\nContent-Length: 18\r\n\r\n{\"state\":\"Paused\"}"},
    {"PUT", "/snapshot/create",
     "PUT /snapshot/create HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n"
     "Content-Type: application/json\r\nContent-Length: 82\r\n\r\n"
     "{\"snapshot_type\":\"Full\",\"snapshot_path\":\"/s/vm.state\",\"mem_file_path\":"
     "\"/s/vm.mem\"}"},
    {"PUT", "/snapshot/load",
     "PUT /snapshot/load HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n"
     "Content-Type: application/json\r\nContent-Length: 143\r\n\r\n"
     "{\"snapshot_path\":\"/t/vm.state\",\"mem_backend\":{\"backend_type\":\"File\","
     "\"backend_path\":\"/t/vm.mem\"},\"enable_diff_snapshots\":false,\"resume_vm\":true}"},
};

static void fc_requests_match_recording(void **state)
{
        (void)state;
        json_t *bodies[] = {
            cove_fc_boot_source("/k/vmlinux", "/k/initrd",
                                "console=ttyS0 reboot=k panic=1 pci=off"),
            cove_fc_drive("rootfs", "/s/disk.ext4", 1, 0),
            cove_fc_machine(2, 512),
            cove_fc_vsock(3, "/s/v.sock"),
            cove_fc_action("InstanceStart"),
            cove_fc_vm_state(1),
            cove_fc_snapshot_create("/s/vm.state", "/s/vm.mem"),
            cove_fc_snapshot_load("/t/vm.state", "/t/vm.mem"),
        };
        for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
                char *req = cove_fc_request(fc_recorded[i].method, fc_recorded[i].path, bodies[i]);
                assert_non_null(req);
                assert_string_equal(req, fc_recorded[i].want);
                free(req);
                json_decref(bodies[i]);
        }
        /* no header injection through the path or the method */
        assert_null(cove_fc_request("PUT", "/x\r\nEvil: 1", NULL));
        assert_null(cove_fc_request("PUT", "relative", NULL));
        assert_null(cove_fc_request("P T", "/x", NULL));
}

static void fc_responses(void **state)
{
        (void)state;
        int st = 0;
        char fault[64];
        const char ok[] = "HTTP/1.1 204 No Content\r\nServer: Firecracker API\r\n"
                          "Connection: keep-alive\r\n\r\n";
        assert_int_equal(cove_fc_response(ok, strlen(ok), &st, fault, sizeof(fault)), 0);
        assert_int_equal(st, 204);
        assert_string_equal(fault, "");
        const char bad[] = "HTTP/1.1 400 Bad Request\r\nServer: Firecracker API\r\n"
                           "Content-Type: application/json\r\nContent-Length: 73\r\n\r\n"
                           "{\"fault_message\":\"The requested operation is not supported\\n"
                           "after start\"}";
        assert_int_equal(cove_fc_response(bad, strlen(bad), &st, fault, sizeof(fault)), 0);
        assert_int_equal(st, 400);
        assert_string_equal(fault, "The requested operation is not supported after start");
        /* incomplete: headers not finished, or body shorter than Content-Length */
        assert_int_equal(cove_fc_response(bad, 30, &st, fault, sizeof(fault)), -1);
        assert_int_equal(cove_fc_response(bad, strlen(bad) - 5, &st, fault, sizeof(fault)), -1);
        assert_int_equal(cove_fc_response("garbage\r\n\r\n", 11, &st, fault, sizeof(fault)), -1);
}

static void fc_unavailable_says_why(void **state)
{
        (void)state;
        char why[256];
        setenv("COVE_FIRECRACKER", "/nonexistent/firecracker", 1);
        assert_int_equal(cove_fc_unavailable(why, sizeof(why)), 1);
        assert_non_null(strstr(why, "no firecracker binary"));
        struct cove_err err;
        assert_null(cove_runtime_firecracker.open("/tmp", &err));
        assert_int_equal(err.kind, COVE_E_UNAVAILABLE);
        unsetenv("COVE_FIRECRACKER");
}

/* ---- QMP against a scripted monitor ---- */

static void say(int fd, const char *s)
{
        assert_int_equal(write(fd, s, strlen(s)), (ssize_t)strlen(s));
}

static void expect_line(int fd, const char *want)
{
        char buf[512];
        size_t n = 0;
        while (n < sizeof(buf) - 1 && read(fd, buf + n, 1) == 1 && buf[n] != '\n')
                n++;
        buf[n] = 0;
        assert_string_equal(buf, want);
}

static void qmp_commands_events_and_errors(void **state)
{
        (void)state;
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        /* the monitor's side is scripted in order (socket buffers hold it all) */
        say(sv[1], "{\"QMP\": {\"version\": {}, \"capabilities\": []}}\r\n");
        say(sv[1], "{\"return\": {}}\r\n");
        struct cove_qmp q;
        struct cove_err err;
        assert_int_equal(cove_qmp_open(&q, sv[0], 1000, &err), 0);
        expect_line(sv[1], "{\"execute\":\"qmp_capabilities\"}");
        /* an event arrives before the reply: queued, the reply still returned */
        say(sv[1], "{\"event\": \"MIGRATION\", \"data\": {\"status\": \"active\"}}\r\n");
        say(sv[1], "{\"return\": {\"status\": \"running\"}}\r\n");
        json_t *ret = NULL;
        assert_int_equal(cove_qmp_cmd(&q, "query-status", NULL, -1, &ret, 1000, &err), 0);
        assert_string_equal(json_string_value(json_object_get(ret, "status")), "running");
        json_decref(ret);
        expect_line(sv[1], "{\"execute\":\"query-status\"}");
        say(sv[1], "{\"error\": {\"class\": \"GenericError\", \"desc\": \"nope\"}}\r\n");
        assert_int_equal(cove_qmp_cmd(&q, "cont", NULL, -1, NULL, 1000, &err), -1);
        assert_non_null(strstr(err.msg, "GenericError: nope"));
        /* migration: active (queued above), then completed */
        say(sv[1], "{\"event\": \"MIGRATION\", \"data\": {\"status\": \"completed\"}}\r\n");
        assert_int_equal(cove_qmp_wait_migration(&q, 1000, &err), 0);
        say(sv[1], "{\"event\": \"MIGRATION\", \"data\": {\"status\": \"failed\"}}\r\n");
        assert_int_equal(cove_qmp_wait_migration(&q, 1000, &err), -1);
        /* silence: bounded wait; junk: an error, not a crash; EOF: QEMU gone */
        assert_int_equal(cove_qmp_wait_event(&q, "STOP", NULL, 50, &err), -1);
        say(sv[1], "not json\n");
        assert_int_equal(cove_qmp_wait_event(&q, "STOP", NULL, 1000, &err), -1);
        close(sv[1]);
        assert_int_equal(cove_qmp_cmd(&q, "quit", NULL, -1, NULL, 1000, &err), -1);
        cove_qmp_close(&q);
}

static void qmp_line_too_long_is_an_error(void **state)
{
        (void)state;
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        pid_t pid = fork();
        if (pid == 0) {
                close(sv[0]);
                char *big = malloc(COVE_QMP_LINE_MAX + 16);
                memset(big, 'x', COVE_QMP_LINE_MAX + 16);
                ssize_t w = write(sv[1], big, COVE_QMP_LINE_MAX + 16);
                (void)w;
                _exit(0);
        }
        close(sv[1]);
        struct cove_qmp q;
        struct cove_err err;
        assert_int_equal(cove_qmp_open(&q, sv[0], 2000, &err), -1);
        assert_non_null(strstr(err.msg, "too long"));
}

int main(void)
{
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(fc_requests_match_recording),
            cmocka_unit_test(fc_responses),
            cmocka_unit_test(fc_unavailable_says_why),
            cmocka_unit_test(qmp_commands_events_and_errors),
            cmocka_unit_test(qmp_line_too_long_is_an_error),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
