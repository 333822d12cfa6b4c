/* Which runtime drivers a node runs: the default one and the alternative, for
 * cove_node_config (node/node.h). */
#ifndef COVE_NODE_DRIVERS_H
#define COVE_NODE_DRIVERS_H

#include "runtime/runtime.h"
#include "util/err.h"
#include "util/log.h"

/* runtime: "ns", "vm" or NULL (vm where KVM works, else ns). *def and *alt get the default
 * and the other driver. vm asked for by name that cannot run here: -1 UNAVAILABLE with the
 * reason; vm picked by default that cannot: ns, with a warning in log. */
int cove_node_drivers(const char *runtime, const struct cove_log *log,
                      const struct cove_runtime_ops **def, const struct cove_runtime_ops **alt,
                      struct cove_err *err);

#endif
