/* libFuzzer target: an image's index.json, manifest and config come from a registry or an
 * archive and are hostile. Each parser must bound and validate everything; what one accepts
 * has well-formed digests and in-range counts. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "control/oci.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        struct cove_err err;
        struct cove_oci_desc d;
        if (cove_oci_index_parse((const char *)data, size, &d, &err) == 0 &&
            !cove_oci_digest_valid(d.digest))
                abort();
        static struct cove_oci_manifest m;
        if (cove_oci_manifest_parse((const char *)data, size, &m, &err) == 0) {
                if (m.nlayers < 0 || m.nlayers > COVE_OCI_LAYERS_MAX ||
                    !cove_oci_digest_valid(m.config.digest))
                        abort();
                for (int i = 0; i < m.nlayers; i++)
                        if (!cove_oci_digest_valid(m.layers[i].digest))
                                abort();
        }
        static struct cove_oci_config c;
        if (cove_oci_config_parse((const char *)data, size, &c, &err) == 0) {
                if (c.ndiff < 0 || c.ndiff > COVE_OCI_LAYERS_MAX || !json_is_object(c.defaults))
                        abort();
                cove_oci_config_clear(&c);
        }
        return 0;
}
