/* libFuzzer target: what the code interpreter server inside a sandbox answers coved (the
 * sandbox is hostile): answer heads, and each line of a run, checked and written out again.
 * A line that passes must come out as one JSON object line that passes again unchanged. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/code.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        int status = 0;
        size_t off = 0;
        if (cove_code_head((const char *)data, size, &status, &off) == 1 &&
            (status < 100 || status > 599 || off > size))
                abort();
        int end = 0;
        char *line = cove_code_line((const char *)data, size, &end);
        if (line) {
                size_t n = strlen(line);
                if (!n || line[n - 1] != '\n' || memchr(line, '\n', n - 1))
                        abort();
                int end2 = 0;
                char *again = cove_code_line(line, n - 1, &end2);
                if (!again || strcmp(again, line) || end2 != end)
                        abort();
                free(again);
                free(line);
        }
        return 0;
}
