/* What template.c shares with template_image.c (builds from OCI images): running host
 * tools, name checks, per-name locks. Not a public contract: control/template.h is. */
#ifndef COVE_CONTROL_TEMPLATE_INTERNAL_H
#define COVE_CONTROL_TEMPLATE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

/* Called about once a second while a tool runs; non-zero kills the tool's process group and
 * makes the run fail with the error the tick filled. */
typedef int (*cove__tpl_tick_fn)(void *arg, struct cove_err *err);

/* run_tool of template.c with an environment (NULL: the fixed build environment) and a
 * tick. */
int cove__tpl_run(char *const argv[], char *const envp[], int timeout_s,
                  void (*line)(void *arg, char *line), void *arg, cove__tpl_tick_fn tick,
                  void *tick_arg, struct cove_err *err);
int cove__tpl_find_tool(const char *name, char *out, size_t cap);
int cove__tpl_valid_name(const char *name);
/* flock(LOCK_EX) on dir/.lock-<name> (created); the fd, or -1 with err. */
int cove__tpl_lock(const char *dir, const char *name, struct cove_err *err);
int cove__tpl_fsync_dir(const char *path, struct cove_err *err);
uint64_t cove__tpl_tree_size(int dirfd); /* takes dirfd */
/* Remove dir/.build-<name>-XXXXXX leftovers (the name's lock held). */
int cove__tpl_remove_stale(const char *dir, const char *name, struct cove_err *err);

#endif
