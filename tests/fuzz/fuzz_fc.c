/* libFuzzer target: what the Firecracker driver reads from its VMM (runtime/vm_firecracker.c),
 * which a guest may have compromised: API answers (status line, Content-Length,
 * fault_message) and the hybrid vsock answer line. */
#include <stddef.h>
#include <stdint.h>

#include "runtime/vm_firecracker.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        int status;
        char fault[256];
        cove_fc_response((const char *)data, size, &status, fault, sizeof(fault));
        cove_fc_vsock_answer((const char *)data, size);
        return 0;
}
