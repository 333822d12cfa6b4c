/* The node's runtime drivers (node/drivers.h). */
#include "node/drivers.h"

#include <string.h>

#include "runtime/vm.h"

int cove_node_drivers(const char *runtime, const struct cove_log *log,
                      const struct cove_runtime_ops **def, const struct cove_runtime_ops **alt,
                      struct cove_err *err)
{
        *def = &cove_runtime_ns;
        *alt = cove_vm_driver();
        /* vm is the default where KVM gives it hardware isolation at full speed; under TCG
         * (no /dev/kvm) it works but slower, so ns stays the default there */
        const char *name = runtime ? runtime : cove_vm_kvm_usable() ? "vm" : "ns";
        if (!strcmp(name, "vm")) {
                char why[256];
                if (cove_vm_driver_unavailable(why, sizeof(why))) {
                        if (runtime)
                                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0, "%s", why);
                        cove_warn(log, "coved.start", "KVM works but %s: default runtime ns", why);
                } else {
                        *def = cove_vm_driver();
                        *alt = &cove_runtime_ns;
                }
        }
        return 0;
}
