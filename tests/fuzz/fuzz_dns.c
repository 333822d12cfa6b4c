/* libFuzzer target: the node resolver's DNS parsers (net/dnsmsg.c) on untrusted bytes — a
 * sandbox's query and an upstream's answer — and an answer built from a parsed query. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "net/dnsmsg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        struct cove_dns_query q;
        if (cove_dns_parse_query(data, size, &q) == 0) {
                uint8_t out[1024];
                uint32_t a[2] = {0x01020304, 0x05060708};
                cove_dns_build_answer(&q, 0, a, 2, 60, out, sizeof(out));
        }
        int rcode, n;
        uint32_t addrs[COVE_DNS_MAX_ADDRS], ttl;
        uint16_t id = size >= 2 ? (uint16_t)(data[0] << 8 | data[1]) : 0;
        cove_dns_parse_answer(data, size, id, "allowed.test", &rcode, addrs, &n, &ttl);
        return 0;
}
