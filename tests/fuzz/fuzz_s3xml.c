/* libFuzzer target: the XML an S3 server answers (ListObjectsV2 pages, Error documents,
 * CopyObject results) is untrusted. The bounded parser must never read outside its input,
 * and every key a listing reports must be NUL-free, non-empty and within its bound; every
 * timestamp it reports must be non-negative. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "store/s3xml.h"

static int entry(const char *key, uint64_t size, int64_t mtime_ms, void *arg, struct cove_err *err)
{
        (void)size;
        (void)arg;
        (void)err;
        size_t n = strlen(key);
        if (n == 0 || n > 1024 || mtime_ms < 0)
                abort();
        return 0;
}

static int any(const char *path, const char *text, size_t len, void *arg, struct cove_err *err)
{
        (void)arg;
        (void)err;
        if (strlen(path) > COVE_XML_MAX_PATH || len > COVE_XML_MAX_TEXT || text[len] != '\0')
                abort();
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        /* an exact-size copy, so reading one byte past the input is caught by ASan */
        char *buf = malloc(size ? size : 1);
        if (!buf)
                return 0;
        memcpy(buf, data, size);
        struct cove_err err;
        cove_xml_walk(buf, size, any, NULL, &err);
        struct cove_s3_list_page pg;
        if (cove_s3_parse_list(buf, size, &pg, entry, NULL, &err) == 0 && pg.truncated &&
            !pg.next_token[0])
                abort();
        char code[64];
        if (cove_s3_parse_error(buf, size, code, &err) == 1 && strlen(code) > 63)
                abort();
        free(buf);
        return 0;
}
