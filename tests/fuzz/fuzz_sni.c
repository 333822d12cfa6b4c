/* libFuzzer target: what the egress proxy reads from a sandbox before deciding
 * (net/sniff.c): TLS ClientHello SNI and HTTP request heads. */
#include <stddef.h>
#include <stdint.h>

#include "net/sniff.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        char name[256];
        uint16_t port;
        if (size)
                cove_sniff_proto(data, size);
        cove_sniff_tls_sni(data, size, name, sizeof(name));
        cove_sniff_http_host(data, size, name, sizeof(name), &port);
        return 0;
}
