/* libFuzzer target: request heads on the node's port listener (net/ports_route.c). The
 * first byte picks whether host routes are on. Whatever parses is rewritten, and the
 * rewritten head must parse again, present no token (none survives the rewrite) and keep
 * the body framing; the head a control replica relays must parse again with the same route
 * and framing and only its own relay lines. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/ports_route.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        if (size < 1 || size > COVE_PORTS_HEAD_MAX + 16)
                return 0;
        const char *domain = data[0] & 1 ? "ports.test" : NULL;
        data++;
        size--;
        size_t hl = cove_ports_head_len(data, size);
        if (!hl)
                return 0;
        char *head = malloc(hl + 1);
        memcpy(head, data, hl);
        head[hl] = '\0';
        static struct cove_ports_req rq, rq2;
        const char *why;
        if (cove_ports_parse(head, hl, domain, &rq, &why) == 0 && rq.mode != COVE_PORTS_NONE) {
                struct cove_bytes out = {0};
                if (cove_ports_rewrite(head, &rq, "127.0.0.1", &out) == 0) {
                        char *h2 = malloc(out.len + 1);
                        memcpy(h2, out.b, out.len);
                        h2[out.len] = '\0';
                        /* the node adds up to 4 lines (X-Forwarded-*) */
                        if (out.len <= COVE_PORTS_HEAD_MAX && rq.nh <= COVE_PORTS_HEADERS_MAX - 4) {
                                if (cove_ports_head_len(out.b, out.len) != out.len)
                                        abort();
                                if (cove_ports_parse(h2, out.len, domain, &rq2, &why) != 0)
                                        abort();
                                if (rq2.tsrc != COVE_PORTS_TOK_NONE)
                                        abort();
                                if (rq2.clen != rq.clen || rq2.chunked != rq.chunked ||
                                    rq2.upgrade != rq.upgrade)
                                        abort();
                        }
                        free(h2);
                }
                cove_bytes_free(&out);
                /* a control replica's relay: the head it sends a node parses again, with the
                 * same route and framing and exactly its own relay lines */
                struct cove_bytes rel = {0};
                if (cove_ports_relay_head(head, &rq, "X-Cove-Relay: p\r\nX-Cove-Client: c\r\n",
                                          &rel) == 0 &&
                    rel.len <= COVE_PORTS_HEAD_MAX && rq.nh <= COVE_PORTS_HEADERS_MAX - 2) {
                        char *h3 = malloc(rel.len + 1);
                        memcpy(h3, rel.b, rel.len);
                        h3[rel.len] = '\0';
                        char v[8];
                        if (cove_ports_head_len(rel.b, rel.len) != rel.len ||
                            cove_ports_parse(h3, rel.len, domain, &rq2, &why) != 0 ||
                            rq2.mode != rq.mode || strcmp(rq2.sandbox, rq.sandbox) != 0 ||
                            rq2.port != rq.port || rq2.clen != rq.clen ||
                            rq2.chunked != rq.chunked || rq2.upgrade != rq.upgrade ||
                            cove_ports_req_header(h3, &rq2, "X-Cove-Relay", v, sizeof(v)) != 1 ||
                            strcmp(v, "p") != 0)
                                abort();
                        free(h3);
                }
                cove_bytes_free(&rel);
        }
        free(head);
        return 0;
}
