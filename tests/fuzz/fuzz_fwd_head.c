/* libFuzzer target: a node's answer to a forwarded request is untrusted input. The head
 * parser must never read outside its input and must report only what the head holds
 * (a status 200-599, a length or chunked but not both, relayed values free of control
 * bytes, an answer MAC of 64 bytes or none); the chunked decoder, fed the rest in random
 * pieces, must never write past its output nor report more data than it consumed. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/forward.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        struct cove_fwd_head h;
        const char *why = NULL;
        int r = cove_fwd_parse_head((const char *)data, size, &h, &why);
        if (r < 0 && !why)
                abort();
        if (r == 0 && size >= COVE_FWD_HEAD_MAX)
                abort();
        if (r == 1) {
                if (h.status < 200 || h.status > 599 || h.head_len > size ||
                    (h.chunked && h.content_length >= 0 && h.status != 204 && h.status != 304) ||
                    (!h.chunked && h.content_length < 0) || h.nkeep > COVE_FWD_HDRS_MAX ||
                    (h.answer[0] && strlen(h.answer) != 64))
                        abort();
                for (int i = 0; i < h.nkeep; i++)
                        for (const char *p = h.keep_val[i]; *p; p++)
                                if (((unsigned char)*p < 0x20 && *p != '\t') || *p == 0x7f)
                                        abort();
        }
        /* the body as chunked, in pieces whose sizes come from the input itself */
        size_t off = r == 1 ? h.head_len : 0;
        struct cove_fwd_chunked c = {0};
        char out[97];
        size_t step = 1;
        while (off < size) {
                size_t n = size - off < step ? size - off : step;
                size_t ol = 0;
                int done = 0;
                long used = cove_fwd_dechunk(&c, (const char *)data + off, n, out, sizeof(out) - 1,
                                             &ol, &done);
                if (used < 0)
                        break;
                if ((size_t)used > n || ol > (size_t)used || ol > sizeof(out) - 1)
                        abort();
                if (used == 0 && !done && ol == 0)
                        abort(); /* no progress without a reason */
                if (done)
                        break;
                off += (size_t)used;
                step = (step * 7 + data[off - (used ? 1 : 0)]) % 300 + 1;
        }
        return 0;
}
