/* Backend selection (store/chunkstore.h): the one place that maps a store URL onto an ops
 * table, so callers never test which backend they have. */
#include <errno.h>
#include <string.h>

#include "store/chunkstore.h"

struct cove_chunkstore *cove_chunkstore_open(const struct cove_chunkstore_cfg *cfg,
                                             struct cove_err *err)
{
        if (!cfg->url || !cfg->url[0])
                return cove_chunkstore_fs_open2(cfg->fs_root, cfg->io, cfg->fs_loose, err);
        if (strncmp(cfg->url, "s3://", 5)) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                              "store URL must be s3://BUCKET[/PREFIX] (or none for the local "
                              "directory)");
                return NULL;
        }
        struct cove_s3_opts o = {
            .url = cfg->url, .endpoint = cfg->s3_endpoint, .timeout_ms = cfg->s3_timeout_ms};
        struct cove_chunkstore *cs = cove_chunkstore_s3_open(&o, err);
        if (!cs || !cfg->cache_dir)
                return cs;
        return cove_chunkstore_cache_open(cs, cfg->cache_dir,
                                          cfg->cache_bytes ? cfg->cache_bytes : (1ull << 30),
                                          cfg->cache_match, err);
}
