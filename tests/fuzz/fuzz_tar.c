/* libFuzzer target: image layers are hostile tar streams. The header parser (ustar, GNU
 * long names, PAX records, base-256 numbers) and path checks must never read out of bounds
 * or loop; cove_tarx_check() walks a stream without writing anything. */
#include <stdint.h>
#include <stdlib.h>

#include "control/tarx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        struct cove_err err;
        cove_tarx_check(data, size, &err);
        return 0;
}
