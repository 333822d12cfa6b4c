/* Unit tests of the parsers of untrusted template inputs: OCI index/manifest/config
 * (control/oci.c), the tar walker (control/tarx.c, check mode) and the Dockerfile parser
 * (control/dockerfile.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "control/dockerfile.h"
#include "control/oci.h"
#include "control/tarx.h"

#define D64 "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

static void digests(void **state)
{
        (void)state;
        assert_true(cove_oci_digest_valid(D64));
        assert_false(cove_oci_digest_valid("sha256:AAAA"));
        assert_false(cove_oci_digest_valid(
            "sha512:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"));
        assert_false(cove_oci_digest_valid(NULL));
}

static void config_platform_and_defaults(void **state)
{
        (void)state;
        const char *cfg = "{\"architecture\":\"arm64\",\"os\":\"linux\",\"rootfs\":{\"diff_ids\":"
                          "[\"" D64 "\"]},\"config\":{\"User\":\"1000\",\"WorkingDir\":\"/app\","
                          "\"Env\":[\"A=b=c\"],\"Cmd\":[\"sh\"]}}";
        struct cove_oci_config c;
        struct cove_err err;
        assert_int_equal(cove_oci_config_parse(cfg, strlen(cfg), &c, &err), 0);
        assert_string_equal(c.arch, "arm64");
        assert_int_equal(c.ndiff, 1);
        assert_string_equal(
            json_string_value(json_object_get(json_object_get(c.defaults, "env"), "A")), "b=c");
        assert_string_equal(json_string_value(json_object_get(c.defaults, "workdir")), "/app");
        cove_oci_config_clear(&c);
        const char *bad = "{\"architecture\":\"amd64\",\"os\":\"linux\",\"rootfs\":{\"diff_ids\":"
                          "[\"md5:x\"]}}";
        assert_int_equal(cove_oci_config_parse(bad, strlen(bad), &c, &err), -1);
        const char *env = "{\"architecture\":\"amd64\",\"os\":\"linux\",\"rootfs\":{\"diff_ids\":"
                          "[]},\"config\":{\"Env\":[\"=x\"]}}";
        assert_int_equal(cove_oci_config_parse(env, strlen(env), &c, &err), -1);
}

static void manifest_layer_types(void **state)
{
        (void)state;
        char m[1024];
        snprintf(m, sizeof m,
                 "{\"schemaVersion\":2,\"config\":{\"digest\":\"%s\",\"size\":3},\"layers\":[{"
                 "\"mediaType\":\"%s\",\"digest\":\"%s\",\"size\":9}]}",
                 D64, "application/vnd.oci.image.layer.v1.tar+gzip", D64);
        struct cove_oci_manifest *man = calloc(1, sizeof *man);
        struct cove_err err;
        assert_int_equal(cove_oci_manifest_parse(m, strlen(m), man, &err), 0);
        assert_int_equal(man->nlayers, 1);
        snprintf(m, sizeof m,
                 "{\"schemaVersion\":2,\"config\":{\"digest\":\"%s\",\"size\":3},\"layers\":[{"
                 "\"mediaType\":\"%s\",\"digest\":\"%s\",\"size\":9}]}",
                 D64, "application/vnd.oci.image.layer.nondistributable.v1.tar", D64);
        assert_int_equal(cove_oci_manifest_parse(m, strlen(m), man, &err), -1);
        assert_non_null(strstr(err.msg, "layer 1"));
        free(man);
}

/* one ustar header for name, type, size */
static void header(unsigned char *h, const char *name, char type, unsigned size)
{
        memset(h, 0, 512);
        snprintf((char *)h, 100, "%s", name);
        snprintf((char *)h + 100, 8, "%07o", 0644);
        snprintf((char *)h + 108, 8, "%07o", 0);
        snprintf((char *)h + 116, 8, "%07o", 0);
        snprintf((char *)h + 124, 12, "%011o", size);
        snprintf((char *)h + 136, 12, "%011o", 0);
        h[156] = (unsigned char)type;
        memcpy(h + 257,
               "ustar\0"
               "00",
               8);
        memset(h + 148, ' ', 8);
        unsigned sum = 0;
        for (int i = 0; i < 512; i++)
                sum += h[i];
        snprintf((char *)h + 148, 8, "%06o", sum);
}

static void tar_paths(void **state)
{
        (void)state;
        unsigned char t[2048] = {0};
        struct cove_err err;
        header(t, "ok/file", '0', 0);
        assert_int_equal(cove_tarx_check(t, sizeof t, &err), 0);
        header(t, "a/../../x", '0', 0);
        assert_int_equal(cove_tarx_check(t, sizeof t, &err), -1);
        assert_non_null(strstr(err.msg, "\"..\" in the path"));
        header(t, "/etc/x", '0', 0);
        assert_int_equal(cove_tarx_check(t, sizeof t, &err), -1);
        header(t, "dev/mem", '3', 0);
        assert_int_equal(cove_tarx_check(t, sizeof t, &err), -1);
        assert_non_null(strstr(err.msg, "device node"));
        header(t, "x", '0', 0);
        t[0] ^= 1; /* checksum no longer matches */
        assert_int_equal(cove_tarx_check(t, sizeof t, &err), -1);
        header(t, "big", '0', 4000); /* says 4000 bytes, has 1536 */
        assert_int_equal(cove_tarx_check(t, sizeof t, &err), -1);
}

static void dockerfile_lines(void **state)
{
        (void)state;
        const char *df = "# syntax=docker/dockerfile:1\n"
                         "FROM base\n"
                         "RUN apt-get update && \\\n"
                         "    # a comment inside\n"
                         "    apt-get install -y x\n"
                         "ENV A=1 B=\"two words\"\n"
                         "CMD [\"sh\", \"-c\", \"x\"]\n";
        json_t *steps = NULL;
        struct cove_err err;
        assert_int_equal(cove_dockerfile_parse(df, strlen(df), &steps, &err), 0);
        assert_int_equal(json_array_size(steps), 4);
        json_t *run = json_array_get(steps, 1);
        assert_int_equal(json_integer_value(json_object_get(run, "line")), 3);
        assert_string_equal(json_string_value(json_array_get(json_object_get(run, "args"), 0)),
                            "apt-get update &&  apt-get install -y x");
        json_t *env = json_object_get(json_array_get(steps, 2), "args");
        assert_string_equal(json_string_value(json_array_get(env, 3)), "two words");
        assert_false(json_is_true(json_object_get(json_array_get(steps, 3), "shell")));
        json_decref(steps);
        const char *bad = "FROM base\n\nSHELL [\"bash\"]\n";
        assert_int_equal(cove_dockerfile_parse(bad, strlen(bad), &steps, &err), -1);
        assert_non_null(strstr(err.msg, "line 3: SHELL is not supported"));
        const char *sub = "FROM base\nWORKDIR $HOME\n";
        assert_int_equal(cove_dockerfile_parse(sub, strlen(sub), &steps, &err), -1);
        assert_non_null(strstr(err.msg, "line 2"));
}

int main(void)
{
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(digests),
            cmocka_unit_test(config_platform_and_defaults),
            cmocka_unit_test(manifest_layer_types),
            cmocka_unit_test(tar_paths),
            cmocka_unit_test(dockerfile_lines),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
