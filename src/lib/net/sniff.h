/* What a sandbox's outbound TCP connection announces before any byte is forwarded: the SNI
 * of a TLS ClientHello, or the Host of an HTTP/1.x request. Parsers of untrusted bytes:
 * bounded, no allocation, fuzzed (tests/fuzz/fuzz_sni.c). */
#ifndef COVE_NET_SNIFF_H
#define COVE_NET_SNIFF_H

#include <stddef.h>
#include <stdint.h>

#define COVE_SNIFF_MAX 16384 /* bytes a connection may send before its name is known */

enum cove_sniff_proto { COVE_PROTO_UNKNOWN = 0, COVE_PROTO_TLS, COVE_PROTO_HTTP };

/* Guess from the first bytes (len >= 1): TLS handshake record, an HTTP method, or unknown. */
enum cove_sniff_proto cove_sniff_proto(const uint8_t *buf, size_t len);

/* ClientHello SNI. 1: complete, name holds the lowercased host name ("" when the hello has
 * no SNI); 0: need more bytes; -1: not a ClientHello or malformed (incl. a name that is not
 * a valid DNS name or does not fit cap). Hellos spread over several records are joined. */
int cove_sniff_tls_sni(const uint8_t *buf, size_t len, char *name, size_t cap);

/* HTTP/1.x request head. 1: complete, host holds the lowercased Host name ("" when absent)
 * and *port its port (0 when the Host has none); 0: need more; -1: malformed, several Host
 * headers, or an absolute-form target whose authority differs from Host. */
int cove_sniff_http_host(const uint8_t *buf, size_t len, char *host, size_t cap, uint16_t *port);

#endif
