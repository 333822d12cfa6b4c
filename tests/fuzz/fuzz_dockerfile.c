/* libFuzzer target: a Dockerfile comes from the API. The parser must bound everything and
 * either refuse with an error or return steps that start with one FROM. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "control/dockerfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        json_t *steps = NULL;
        struct cove_err err;
        if (cove_dockerfile_parse((const char *)data, size, &steps, &err) == 0) {
                const char *op = json_string_value(json_object_get(json_array_get(steps, 0), "op"));
                if (!op || strcmp(op, "FROM") || json_array_size(steps) > COVE_DOCKERFILE_STEPS_MAX)
                        abort();
                json_decref(steps);
        } else if (steps || !err.msg[0]) {
                abort();
        }
        return 0;
}
