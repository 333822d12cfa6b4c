/* libFuzzer target: a decrypted snapshot manifest is untrusted at restore time (anyone who
 * can write the store and holds the key, or a bug in an older writer). The parser must
 * bound and validate everything; a manifest it accepts must serialise and parse again. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "store/manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        struct cove_manifest m;
        struct cove_err err;
        if (cove_manifest_parse(data, size, &m, &err) == 0) {
                char *json = NULL;
                size_t len = 0;
                if (cove_manifest_serialize(&m, &json, &len, &err) == 0) {
                        struct cove_manifest again;
                        if (cove_manifest_parse(json, len, &again, &err) < 0 || again.n != m.n ||
                            again.nchunks != m.nchunks)
                                abort();
                        cove_manifest_clear(&again);
                        free(json);
                }
        }
        cove_manifest_clear(&m);
        return 0;
}
