/* Unit tests for the chunk store pieces below snapshots: the backend contract (put/get/has/
 * touch/del/list, batches) on the fs backend and, when COVE_TEST_S3_ENDPOINT (+ AWS_ACCESS_KEY_ID
 * and AWS_SECRET_ACCESS_KEY) names a real S3 server, on the S3 backend too (tests/integration/
 * test_s3_store.py starts a radosgw and runs this); fs recover; the local chunk cache;
 * content-defined chunking, tenant keys, and the manifest parser's refusals of hostile input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>

#include "crypto/keys.h"
#include "store/cdc.h"
#include "store/chunkstore.h"
#include "store/manifest.h"
#include "util/util.h"

struct fx {
        char dir[64];
        char root[128];
        struct cove_chunkstore *cs;
};

static int setup(void **state)
{
        struct fx *f = calloc(1, sizeof(*f));
        strcpy(f->dir, "/tmp/cove-test-cs-XXXXXX");
        if (!mkdtemp(f->dir))
                return -1;
        snprintf(f->root, sizeof(f->root), "%s/store", f->dir);
        struct cove_err err = {0};
        f->cs = cove_chunkstore_fs_open(f->root, NULL, &err);
        if (!f->cs)
                return -1;
        *state = f;
        return 0;
}

static int teardown(void **state)
{
        struct fx *f = *state;
        f->cs->ops->close(f->cs);
        cove_rm_rf(f->dir, NULL);
        free(f);
        return 0;
}

static int count_cb(const char *name, uint64_t size, int64_t mtime, void *arg)
{
        (void)name;
        (void)size;
        (void)mtime;
        (*(int *)arg)++;
        return 0;
}

/* The backend contract of store/chunkstore.h, for any backend. */
static void contract(struct cove_chunkstore *cs)
{
        const struct cove_chunkstore_ops *o = cs->ops;
        struct cove_err err = {0};
        assert_int_equal(o->put(cs, NULL, "t/chunks/ab/cdef", "hello", 5, &err), 0);
        assert_int_equal(o->put(cs, NULL, "t/chunks/ab/cdef", "other", 5, &err), 1); /* kept */
        void *d;
        size_t n;
        assert_int_equal(o->get(cs, "t/chunks/ab/cdef", 100, &d, &n, &err), 0);
        assert_int_equal(n, 5);
        assert_memory_equal(d, "hello", 5);
        free(d);
        assert_int_equal(o->get(cs, "t/chunks/ab/cdef", 4, &d, &n, &err), -1); /* bounded */
        assert_int_equal(err.kind, COVE_E_LIMIT);
        assert_int_equal(o->get(cs, "t/chunks/ab/none", 100, &d, &n, &err), -1);
        assert_int_equal(err.kind, COVE_E_NOT_FOUND);
        assert_int_equal(o->put(cs, NULL, "t/chunks/ab/empty", "", 0, &err), 0);
        assert_int_equal(o->get(cs, "t/chunks/ab/empty", 100, &d, &n, &err), 0);
        assert_int_equal(n, 0);
        free(d);
        assert_int_equal(o->has(cs, "t/chunks/ab/cdef", &err), 1);
        assert_int_equal(o->has(cs, "t/chunks/ab/none", &err), 0);
        assert_int_equal(o->touch(cs, "t/chunks/ab/none", &err), 0);
        /* bad names never reach the store */
        const char *bad[] = {"", "/abs", "a//b", "../x", "a/../b", "a/.hidden", "a/b/", "a b"};
        for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
                assert_int_equal(o->put(cs, NULL, bad[i], "x", 1, &err), -1);
        /* del with a cutoff: a recent object stays, an old one goes */
        int64_t now = cove_now_ms();
        assert_int_equal(o->del(cs, "t/chunks/ab/cdef", now - 60000, &err), 0);
        assert_int_equal(o->has(cs, "t/chunks/ab/cdef", &err), 1);
        assert_int_equal(o->touch(cs, "t/chunks/ab/cdef", &err), 1);
        assert_int_equal(o->del(cs, "t/chunks/ab/cdef", now + 60000, &err), 1);
        assert_int_equal(o->has(cs, "t/chunks/ab/cdef", &err), 0);
        assert_int_equal(o->del(cs, "t/chunks/ab/cdef", INT64_MAX, &err), 0); /* gone */
        assert_int_equal(o->del(cs, "t/chunks/ab/empty", INT64_MAX, &err), 1);
        /* batches: every put durable and visible after commit */
        struct cove_cs_batch *b = o->batch_new(cs, &err);
        char name[64];
        for (int i = 0; i < 300; i++) { /* crosses the fs auto-flush at 256 */
                snprintf(name, sizeof(name), "t/chunks/%02x/obj%d", i % 7, i);
                assert_int_equal(o->put(cs, b, name, name, strlen(name), &err), 0);
        }
        assert_int_equal(o->batch_commit(cs, b, &err), 0);
        o->batch_free(cs, b);
        int cnt = 0;
        assert_int_equal(o->list(cs, "t/chunks/", count_cb, &cnt, &err), 0);
        assert_int_equal(cnt, 300);
        assert_int_equal(o->get(cs, "t/chunks/03/obj10", 100, &d, &n, &err), 0);
        assert_int_equal(n, strlen("t/chunks/03/obj10"));
        free(d);
        cnt = 0; /* a prefix lists only its own objects */
        assert_int_equal(o->list(cs, "t/manifests/", count_cb, &cnt, &err), 0);
        assert_int_equal(cnt, 0);
        assert_int_equal(o->list(cs, "../", count_cb, &cnt, &err), -1);
}

static void fs_objects(void **state)
{
        struct fx *f = *state;
        struct cove_err err = {0};
        contract(f->cs); /* batches in packs */
        /* and the loose format (one file per object: data dirs from before packs) */
        f->cs->ops->close(f->cs);
        cove_rm_rf(f->root, NULL);
        f->cs = cove_chunkstore_fs_open2(f->root, NULL, 1, &err);
        assert_non_null(f->cs);
        const struct cove_chunkstore_ops *o = f->cs->ops;
        contract(f->cs);
        /* fs batches: invisible until commit; free drops temps */
        struct cove_cs_batch *b = o->batch_new(f->cs, &err);
        assert_int_equal(o->put(f->cs, b, "t/chunks/zz/never", "x", 1, &err), 0);
        assert_int_equal(o->has(f->cs, "t/chunks/zz/never", &err), 0);
        o->batch_free(f->cs, b);
        assert_int_equal(o->has(f->cs, "t/chunks/zz/never", &err), 0);
        /* recover: temp files go, an object moved aside by an interrupted GC comes back */
        char p[512], q[512];
        snprintf(p, sizeof(p), "%s/t/chunks/00/.tmp.1234.obj0", f->root);
        assert_int_equal(cove_write_file_atomic(f->root, "x", "y", 1, 0600, &err), 0);
        FILE *fp = fopen(p, "w");
        fputs("partial", fp);
        fclose(fp);
        snprintf(p, sizeof(p), "%s/t/chunks/00/obj0", f->root);
        snprintf(q, sizeof(q), "%s/t/chunks/00/.gc.obj0", f->root);
        assert_int_equal(rename(p, q), 0);
        assert_int_equal(o->recover(f->cs, &err), 0);
        assert_int_equal(access(p, F_OK), 0);
        assert_int_equal(access(q, F_OK), -1);
        snprintf(p, sizeof(p), "%s/t/chunks/00/.tmp.1234.obj0", f->root);
        assert_int_equal(access(p, F_OK), -1);
}

/* ---- packs of the fs backend ---- */

static int count_suffix(const char *dir, const char *suffix)
{
        int n = 0;
        DIR *d = opendir(dir);
        if (!d)
                return 0;
        struct dirent *de;
        size_t sl = strlen(suffix);
        while ((de = readdir(d))) {
                size_t l = strlen(de->d_name);
                if (l >= sl && !strcmp(de->d_name + l - sl, suffix))
                        n++;
        }
        closedir(d);
        return n;
}

static void put_batch(struct cove_chunkstore *cs, const char *tenant, int from, int to, size_t size)
{
        struct cove_err err = {0};
        struct cove_cs_batch *b = cs->ops->batch_new(cs, &err);
        assert_non_null(b);
        char *buf = malloc(size), name[96];
        for (int i = from; i < to; i++) {
                snprintf(name, sizeof(name), "%s/chunks/%02x/obj%d", tenant, i % 5, i);
                memset(buf, i & 0xff, size);
                snprintf(buf, size, "%s", name);
                assert_int_equal(cs->ops->put(cs, b, name, buf, size, &err), 0);
        }
        free(buf);
        assert_int_equal(cs->ops->batch_commit(cs, b, &err), 0);
        cs->ops->batch_free(cs, b);
}

static int get_ok(struct cove_chunkstore *cs, const char *tenant, int i, size_t size)
{
        char name[96];
        snprintf(name, sizeof(name), "%s/chunks/%02x/obj%d", tenant, i % 5, i);
        void *d = NULL;
        size_t n = 0;
        struct cove_err err = {0};
        if (cs->ops->get(cs, name, 1 << 24, &d, &n, &err) < 0)
                return 0;
        int ok = n == size && !strcmp(d, name) && ((uint8_t *)d)[size - 1] == (uint8_t)(i & 0xff);
        free(d);
        return ok;
}

static void set_mtime(const char *dir, time_t secs_ago)
{
        DIR *d = opendir(dir);
        struct dirent *de;
        while (d && (de = readdir(d))) {
                char p[512];
                snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
                struct timespec ts[2] = {{time(NULL) - secs_ago, 0}, {time(NULL) - secs_ago, 0}};
                if (de->d_name[0] != '.')
                        utimensat(AT_FDCWD, p, ts, 0);
        }
        if (d)
                closedir(d);
}

/* Batched objects land in few pack files, one tenant per pack; a new handle reads them;
 * deletes survive a reopen; a pack goes when its last object does; recover removes a
 * writer's temp pack; a damaged pack index means missing objects, never a crash. */
static void fs_packs(void **state)
{
        struct fx *f = *state;
        struct cove_chunkstore *cs = f->cs;
        const struct cove_chunkstore_ops *o = cs->ops;
        struct cove_err err = {0};
        char pa[256], pb[256];
        snprintf(pa, sizeof(pa), "%s/.packs/alice", f->root);
        snprintf(pb, sizeof(pb), "%s/.packs/bob", f->root);
        /* 1100 objects of 64 KiB: more than one pack (64 MiB each), far fewer files */
        put_batch(cs, "alice", 0, 1100, 65536);
        put_batch(cs, "bob", 0, 10, 1000);
        int na = count_suffix(pa, ".pack");
        assert_true(na >= 2 && na <= 3);
        assert_int_equal(count_suffix(pb, ".pack"), 1);
        char loose[256];
        snprintf(loose, sizeof(loose), "%s/alice/chunks/00", f->root);
        assert_int_equal(access(loose, F_OK), -1); /* nothing loose */
        for (int i = 0; i < 1100; i += 97)
                assert_true(get_ok(cs, "alice", i, 65536));
        int cnt = 0;
        assert_int_equal(o->list(cs, "alice/chunks/", count_cb, &cnt, &err), 0);
        assert_int_equal(cnt, 1100);
        cnt = 0;
        assert_int_equal(o->list(cs, "bob/", count_cb, &cnt, &err), 0);
        assert_int_equal(cnt, 10);
        /* put of a packed name: kept, 1 */
        assert_int_equal(o->put(cs, NULL, "bob/chunks/00/obj0", "x", 1, &err), 1);
        /* a second handle (another process) sees them; a pack added later too */
        struct cove_chunkstore *cs2 = cove_chunkstore_fs_open(f->root, NULL, &err);
        assert_non_null(cs2);
        assert_true(get_ok(cs2, "bob", 3, 1000));
        put_batch(cs, "bob", 10, 20, 1000);
        assert_true(get_ok(cs2, "bob", 15, 1000));
        assert_int_equal(cs2->ops->has(cs2, "bob/chunks/00/obj15", &err), 1);
        /* del with a cutoff: a young pack keeps its objects; an old one loses them */
        assert_int_equal(o->del(cs, "bob/chunks/00/obj0", cove_now_ms() - 60000, &err), 0);
        set_mtime(pb, 7200);
        assert_int_equal(o->del(cs, "bob/chunks/00/obj0", cove_now_ms() - 60000, &err), 1);
        assert_int_equal(o->has(cs, "bob/chunks/00/obj0", &err), 0);
        assert_int_equal(o->del(cs, "bob/chunks/00/obj0", INT64_MAX, &err), 0);
        /* a touch makes the pack young again: GC waits */
        assert_int_equal(o->touch(cs, "bob/chunks/01/obj1", &err), 1);
        assert_int_equal(o->del(cs, "bob/chunks/01/obj1", cove_now_ms() - 60000, &err), 0);
        /* another process deleted it after our index was loaded: touch says gone */
        set_mtime(pb, 7200);
        assert_int_equal(cs2->ops->del(cs2, "bob/chunks/01/obj1", cove_now_ms() - 60000, &err), 1);
        assert_int_equal(o->touch(cs, "bob/chunks/01/obj1", &err), 0);
        cs2->ops->close(cs2);
        /* deletes survive a reopen */
        o->close(cs);
        cs = f->cs = cove_chunkstore_fs_open(f->root, NULL, &err);
        o = cs->ops;
        assert_int_equal(o->has(cs, "bob/chunks/00/obj0", &err), 0);
        assert_int_equal(o->has(cs, "bob/chunks/01/obj1", &err), 0);
        assert_true(get_ok(cs, "bob", 2, 1000));
        /* the first bob pack goes with its last object, the second stays */
        for (int i = 2; i < 10; i++) {
                char name[64];
                snprintf(name, sizeof(name), "bob/chunks/%02x/obj%d", i % 5, i);
                assert_int_equal(o->del(cs, name, INT64_MAX, &err), 1);
        }
        assert_int_equal(count_suffix(pb, ".pack"), 1);
        assert_int_equal(count_suffix(pb, ".dead"), 0);
        assert_true(get_ok(cs, "bob", 12, 1000));
        /* recover: a writer's temp pack goes */
        char tmp[300];
        snprintf(tmp, sizeof(tmp), "%s/.tmp.0123456789abcdef.pack", pb);
        FILE *fp = fopen(tmp, "w");
        fputs("partial", fp);
        fclose(fp);
        assert_int_equal(o->recover(cs, &err), 0);
        assert_int_equal(access(tmp, F_OK), -1);
        /* a damaged index: that pack's objects are missing, the store still opens */
        DIR *d = opendir(pa);
        struct dirent *de;
        char victim[600] = "";
        while ((de = readdir(d)))
                if (strstr(de->d_name, ".pack") && de->d_name[0] != '.')
                        snprintf(victim, sizeof(victim), "%s/%s", pa, de->d_name);
        closedir(d);
        int fd = open(victim, O_RDWR);
        struct stat st;
        fstat(fd, &st);
        assert_int_equal(pwrite(fd, "\xff", 1, st.st_size - 30), 1); /* in the index */
        close(fd);
        o->close(cs);
        cs = f->cs = cove_chunkstore_fs_open(f->root, NULL, &err);
        assert_non_null(cs);
        cnt = 0;
        assert_int_equal(cs->ops->list(cs, "alice/chunks/", count_cb, &cnt, &err), 0);
        assert_true(cnt > 0 && cnt < 1100);
        /* a truncated pack too */
        assert_int_equal(truncate(victim, 5), 0);
        cs->ops->close(cs);
        cs = f->cs = cove_chunkstore_fs_open(f->root, NULL, &err);
        assert_non_null(cs);
}

/* A failed write or sync of a pack fails the batch's commit and leaves no temp file. */
static int fail_sync;
static int failing_fdatasync(int fd)
{
        if (fail_sync) {
                errno = EIO;
                return -1;
        }
        return fdatasync(fd);
}

static void fs_pack_faults(void **state)
{
        struct fx *f = *state;
        struct cove_err err = {0};
        f->cs->ops->close(f->cs);
        struct cove_sysio io = cove_sysio_default;
        io.fdatasync = failing_fdatasync;
        f->cs = cove_chunkstore_fs_open(f->root, &io, &err);
        struct cove_chunkstore *cs = f->cs;
        struct cove_cs_batch *b = cs->ops->batch_new(cs, &err);
        for (int i = 0; i < 20; i++) {
                char name[64];
                snprintf(name, sizeof(name), "t/chunks/00/f%d", i);
                assert_int_equal(cs->ops->put(cs, b, name, name, strlen(name), &err), 0);
        }
        fail_sync = 1;
        assert_int_equal(cs->ops->batch_commit(cs, b, &err), -1);
        fail_sync = 0;
        assert_int_equal(err.errnum, EIO);
        cs->ops->batch_free(cs, b);
        assert_int_equal(cs->ops->has(cs, "t/chunks/00/f3", &err), 0);
        char pd[256];
        snprintf(pd, sizeof(pd), "%s/.packs/t", f->root);
        assert_int_equal(count_suffix(pd, ".pack"), 0);
        /* a full pack sealed in the background fails: the later puts or the commit say so */
        b = cs->ops->batch_new(cs, &err);
        char *buf = calloc(1, 65536);
        fail_sync = 1;
        int failed = 0;
        for (int i = 0; i < 1100 && !failed; i++) {
                char name[64];
                snprintf(name, sizeof(name), "t/chunks/01/g%d", i);
                snprintf(buf, 65536, "%s", name);
                failed = cs->ops->put(cs, b, name, buf, 65536, &err) < 0;
        }
        if (!failed)
                failed = cs->ops->batch_commit(cs, b, &err) < 0;
        fail_sync = 0;
        free(buf);
        assert_true(failed);
        assert_int_equal(err.errnum, EIO);
        assert_int_equal(cs->ops->batch_commit(cs, b, &err), -1); /* sticky */
        cs->ops->batch_free(cs, b);
        assert_int_equal(cs->ops->has(cs, "t/chunks/01/g3", &err), 0);
        assert_int_equal(count_suffix(pd, ".pack"), 0);
        assert_int_equal(cs->ops->recover(cs, &err), 0);
        DIR *d = opendir(pd);
        struct dirent *de;
        int temps = 0;
        while (d && (de = readdir(d)))
                temps +=
                    de->d_name[0] == '.' && strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
        if (d)
                closedir(d);
        assert_int_equal(temps, 0);
}

/* ---- S3 backend against a real server (skipped without one) ---- */

static struct cove_chunkstore *s3_open_test(void (*hook)(const char *, void *), void *arg)
{
        const char *ep = getenv("COVE_TEST_S3_ENDPOINT");
        if (!ep || !*ep)
                return NULL;
        uint8_t r[6];
        char hex[13], url[64];
        struct cove_err err = {0};
        assert_int_equal(cove_random(r, sizeof(r), &err), 0);
        cove_hex(r, sizeof(r), hex);
        snprintf(url, sizeof(url), "s3://cove-unit-%s/some/prefix", hex);
        struct cove_s3_opts o = {.url = url,
                                 .endpoint = ep,
                                 .timeout_ms = 20000,
                                 .list_page_keys = 7, /* 300 objects: 43 pages */
                                 .before_delete = hook,
                                 .hook_arg = arg};
        struct cove_chunkstore *cs = cove_chunkstore_s3_open(&o, &err);
        if (!cs)
                fail_msg("S3 open: %s", err.msg);
        return cs;
}

#define S3_OR_SKIP(cs)                                                                             \
        do {                                                                                       \
                if (!(cs)) {                                                                       \
                        print_message("skipped: COVE_TEST_S3_ENDPOINT not set (no S3 server)\n");  \
                        skip();                                                                    \
                }                                                                                  \
        } while (0)

static void s3_objects(void **state)
{
        (void)state;
        struct cove_chunkstore *cs = s3_open_test(NULL, NULL);
        S3_OR_SKIP(cs);
        contract(cs);
        cs->ops->close(cs);
}

/* GC's delete against a writer's touch() in between its check and its delete: the delete
 * must be refused by the server, and the object kept. S3 cannot backdate an object, so the
 * test waits (bounded) until the object is older than a cutoff in the past. */
static void touch_hook(const char *name, void *arg)
{
        struct cove_chunkstore **cs = arg;
        struct cove_err err = {0};
        if (*cs)
                assert_int_equal((*cs)->ops->touch(*cs, name, &err), 1);
}

static void s3_gc_race(void **state)
{
        (void)state;
        struct cove_chunkstore *writer = NULL;
        struct cove_chunkstore *cs = s3_open_test(touch_hook, &writer);
        S3_OR_SKIP(cs);
        struct cove_err err = {0};
        const struct cove_chunkstore_ops *o = cs->ops;
        int64_t t0 = cove_now_ms();
        assert_int_equal(o->put(cs, NULL, "t/chunks/aa/raced", "x", 1, &err), 0);
        assert_int_equal(o->put(cs, NULL, "t/chunks/aa/plain", "y", 1, &err), 0);
        int64_t cutoff = t0 + 2500;
        while (cove_now_ms() < cutoff + 1500)
                usleep(50000);
        /* no touch in between: old enough, deleted */
        assert_int_equal(o->del(cs, "t/chunks/aa/plain", cutoff, &err), 1);
        assert_int_equal(o->has(cs, "t/chunks/aa/plain", &err), 0);
        /* a touch lands between the HEAD (old) and the DELETE: kept */
        writer = cs;
        assert_int_equal(o->del(cs, "t/chunks/aa/raced", cutoff, &err), 0);
        writer = NULL;
        assert_int_equal(o->has(cs, "t/chunks/aa/raced", &err), 1);
        cs->ops->close(cs);
}

struct racer {
        struct cove_chunkstore *cs;
        char body[32];
        int rc;
        pthread_barrier_t *go;
};

static void *race_put(void *arg)
{
        struct racer *r = arg;
        struct cove_err err = {0};
        pthread_barrier_wait(r->go);
        r->rc = r->cs->ops->put(r->cs, NULL, "t/chunks/bb/same", r->body, strlen(r->body), &err);
        return NULL;
}

/* Eight writers of one chunk at once: all succeed, exactly one wrote it, and the object is
 * one writer's bytes whole. */
static void s3_put_race(void **state)
{
        (void)state;
        struct cove_chunkstore *cs = s3_open_test(NULL, NULL);
        S3_OR_SKIP(cs);
        pthread_barrier_t go;
        pthread_barrier_init(&go, NULL, 8);
        struct racer r[8];
        pthread_t th[8];
        for (int i = 0; i < 8; i++) {
                r[i] = (struct racer){.cs = cs, .go = &go, .rc = -9};
                snprintf(r[i].body, sizeof(r[i].body), "writer %d's sealed chunk", i);
                pthread_create(&th[i], NULL, race_put, &r[i]);
        }
        int wrote = 0, kept = 0;
        for (int i = 0; i < 8; i++) {
                pthread_join(th[i], NULL);
                wrote += r[i].rc == 0;
                kept += r[i].rc == 1;
        }
        pthread_barrier_destroy(&go);
        assert_int_equal(wrote, 1);
        assert_int_equal(kept, 7);
        void *d;
        size_t n;
        struct cove_err err = {0};
        assert_int_equal(cs->ops->get(cs, "t/chunks/bb/same", 100, &d, &n, &err), 0);
        int match = 0;
        for (int i = 0; i < 8; i++)
                match += r[i].rc == 0 && n == strlen(r[i].body) && !memcmp(d, r[i].body, n);
        assert_int_equal(match, 1);
        free(d);
        int cnt = 0;
        assert_int_equal(cs->ops->list(cs, "t/chunks/bb/", count_cb, &cnt, &err), 0);
        assert_int_equal(cnt, 1);
        cs->ops->close(cs);
}

/* ---- the local chunk cache, over an fs backend ---- */

static void cache(void **state)
{
        struct fx *f = *state;
        struct cove_err err = {0};
        char cdir[256], inner_root[256], p[512];
        snprintf(cdir, sizeof(cdir), "%s/cache", f->dir);
        snprintf(inner_root, sizeof(inner_root), "%s/remote", f->dir);
        struct cove_chunkstore *inner = cove_chunkstore_fs_open(inner_root, NULL, &err);
        assert_non_null(inner);
        struct cove_chunkstore *cs =
            cove_chunkstore_cache_open(inner, cdir, 1u << 20, "/chunks/", &err);
        assert_non_null(cs);
        const struct cove_chunkstore_ops *o = cs->ops;
        contract(cs);
        /* a put keeps a copy: the object is served locally even once the remote lost it */
        assert_int_equal(o->put(cs, NULL, "t/chunks/cc/one", "payload", 7, &err), 0);
        assert_int_equal(inner->ops->del(inner, "t/chunks/cc/one", INT64_MAX, &err), 1);
        void *d;
        size_t n;
        assert_int_equal(o->get(cs, "t/chunks/cc/one", 100, &d, &n, &err), 0);
        assert_int_equal(n, 7);
        assert_memory_equal(d, "payload", 7);
        free(d);
        assert_int_equal(o->has(cs, "t/chunks/cc/one", &err), 0); /* the store decides */
        /* a damaged copy is never served: it is dropped and the remote asked */
        snprintf(p, sizeof(p), "%s/t/chunks/cc/one", cdir);
        int fd = open(p, O_WRONLY);
        assert_true(fd >= 0);
        assert_int_equal(pwrite(fd, "X", 1, 50), 1);
        close(fd);
        assert_int_equal(o->get(cs, "t/chunks/cc/one", 100, &d, &n, &err), -1);
        assert_int_equal(err.kind, COVE_E_NOT_FOUND);
        assert_int_equal(access(p, F_OK), -1);
        /* a get fills the cache: later gets need no remote */
        assert_int_equal(inner->ops->put(inner, NULL, "t/chunks/cc/two", "second", 6, NULL), 0);
        assert_int_equal(o->get(cs, "t/chunks/cc/two", 100, &d, &n, &err), 0);
        free(d);
        assert_int_equal(inner->ops->del(inner, "t/chunks/cc/two", INT64_MAX, &err), 1);
        assert_int_equal(o->get(cs, "t/chunks/cc/two", 100, &d, &n, &err), 0);
        free(d);
        /* manifests (not matching) are never cached */
        assert_int_equal(o->put(cs, NULL, "t/manifests/m1", "m", 1, &err), 0);
        snprintf(p, sizeof(p), "%s/t/manifests/m1", cdir);
        assert_int_equal(access(p, F_OK), -1);
        /* the budget holds (1 MiB), and the least recently used go first */
        static uint8_t blob[60000];
        char name[64];
        memset(blob, 7, sizeof(blob));
        assert_int_equal(o->put(cs, NULL, "t/chunks/dd/keep", blob, sizeof(blob), &err), 0);
        for (int i = 0; i < 40; i++) {
                snprintf(name, sizeof(name), "t/chunks/dd/o%d", i);
                blob[0] = (uint8_t)i;
                assert_int_equal(o->put(cs, NULL, name, blob, sizeof(blob), &err), 0);
                /* "keep" is used all the time; its recency must keep it */
                struct timespec ts = {0, 2000000};
                nanosleep(&ts, NULL);
                assert_int_equal(o->get(cs, "t/chunks/dd/keep", sizeof(blob), &d, &n, &err), 0);
                free(d);
        }
        uint64_t total = 0;
        int files = 0;
        char sub[512];
        snprintf(sub, sizeof(sub), "%s/t/chunks/dd", cdir);
        DIR *dd = opendir(sub);
        assert_non_null(dd);
        struct dirent *de;
        while ((de = readdir(dd))) {
                struct stat st;
                snprintf(p, sizeof(p), "%s/%s", sub, de->d_name);
                if (de->d_name[0] != '.' && stat(p, &st) == 0) {
                        total += (uint64_t)st.st_size;
                        files++;
                }
        }
        closedir(dd);
        print_message("cache: %d files, %llu bytes under a 1 MiB budget\n", files,
                      (unsigned long long)total);
        assert_true(total <= (1u << 20));
        assert_true(files < 41);
        snprintf(p, sizeof(p), "%s/t/chunks/dd/keep", cdir);
        assert_int_equal(access(p, F_OK), 0);
        snprintf(p, sizeof(p), "%s/t/chunks/dd/o0", cdir);
        assert_int_equal(access(p, F_OK), -1);
        cs->ops->close(cs);
}

static void cdc(void **state)
{
        (void)state;
        struct cove_cdc c;
        assert_int_equal(cove_cdc_init(&c, 100, 50, 1000, 1), -1);
        assert_int_equal(cove_cdc_init(&c, COVE_CDC_MIN, COVE_CDC_AVG, COVE_CDC_MAX, 42), 0);
        size_t len = 32u << 20;
        uint8_t *buf = malloc(len + 1);
        uint64_t s = 1;
        for (size_t i = 0; i < len; i++) {
                s = s * 6364136223846793005ULL + 1442695040888963407ULL;
                buf[i + 1] = (uint8_t)(s >> 56);
        }
        /* cut a; then the same data with one byte inserted at the front */
        size_t cuts_a[1024], na = 0, off = 0;
        while (off < len) {
                size_t n = cove_cdc_cut(&c, buf + 1 + off, len - off);
                assert_true(n >= 1);
                if (off + n < len) {
                        assert_true(n >= COVE_CDC_MIN && n <= COVE_CDC_MAX);
                }
                off += n;
                if (na < 1024)
                        cuts_a[na++] = off;
        }
        double avg = (double)len / (double)na;
        print_message("cdc: %zu chunks, average %.0f bytes\n", na, avg);
        assert_true(avg > 40000 && avg < 100000);
        buf[0] = 0x5a;
        size_t same = 0, ib = 0;
        off = 0;
        while (off < len + 1) {
                off += cove_cdc_cut(&c, buf + off, len + 1 - off);
                while (ib < na && cuts_a[ib] + 1 < off)
                        ib++;
                if (ib < na && cuts_a[ib] + 1 == off)
                        same++;
        }
        print_message("cdc: %zu of %zu boundaries survive a 1-byte insert\n", same, na);
        assert_true(same + 3 >= na);
        /* another seed cuts elsewhere */
        struct cove_cdc c2;
        cove_cdc_init(&c2, COVE_CDC_MIN, COVE_CDC_AVG, COVE_CDC_MAX, 43);
        assert_true(cove_cdc_cut(&c2, buf + 1, len) != cuts_a[0] ||
                    cove_cdc_cut(&c2, buf + 1 + cuts_a[0], len - cuts_a[0]) !=
                        cuts_a[1] - cuts_a[0]);
        assert_true(cove_is_zero(buf + len, 0));
        memset(buf, 0, 4096);
        assert_true(cove_is_zero(buf + 3, 4000));
        buf[3000] = 1;
        assert_false(cove_is_zero(buf + 3, 4000));
        free(buf);
}

static void keys(void **state)
{
        struct fx *f = *state;
        char kd[256], p[300];
        snprintf(kd, sizeof(kd), "%s/keys", f->dir);
        struct cove_err err = {0};
        uint8_t a[32], b[32], c[32];
        assert_int_equal(cove_dek_load(kd, "alice", 0, a, &err), -1);
        assert_int_equal(err.kind, COVE_E_NOT_FOUND);
        assert_int_equal(cove_dek_load(kd, "alice", 1, a, &err), 0);
        assert_int_equal(cove_dek_load(kd, "alice", 1, b, &err), 0);
        assert_memory_equal(a, b, 32);
        assert_int_equal(cove_dek_load(kd, "bob", 1, c, &err), 0);
        assert_memory_not_equal(a, c, 32);
        /* the DEK is stored only wrapped, in a 0600 record (crypto/keys.h) */
        snprintf(p, sizeof(p), "%s/alice.key", kd);
        struct stat st;
        assert_int_equal(stat(p, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0600);
        assert_int_equal(cove_dek_load(kd, "../etc", 1, a, &err), -1);
        assert_int_equal(cove_dek_load(kd, "", 1, a, &err), -1);
        /* a record readable by others is refused (noticed at once, cache or not) */
        chmod(p, 0644);
        assert_int_equal(cove_dek_load(kd, "alice", 1, b, &err), -1);
        chmod(p, 0600);
        assert_int_equal(cove_dek_load(kd, "alice", 1, b, &err), 0);
        assert_memory_equal(a, b, 32);
        /* a legacy plain key file readable by others or of the wrong size is refused */
        snprintf(p, sizeof(p), "%s/dave.dek", kd);
        int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0600);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, a, 31), 31);
        close(fd);
        assert_int_equal(cove_dek_load(kd, "dave", 1, a, &err), -1);
        assert_int_equal(truncate(p, 32), 0);
        chmod(p, 0644);
        assert_int_equal(cove_dek_load(kd, "dave", 1, a, &err), -1);
        chmod(p, 0600);
        assert_int_equal(cove_dek_load(kd, "dave", 1, a, &err), 0);
        struct cove_tenant_keys *k1, *k2;
        assert_int_equal(cove_tenant_keys_open(kd, "bob", &k1, &err), 0);
        assert_int_equal(cove_tenant_keys_open(kd, "carol", &k2, &err), 0);
        assert_memory_not_equal(k1->chunk_name, k1->chunk_enc, 32);
        assert_memory_not_equal(k1->chunk_enc, k1->manifest_enc, 32);
        assert_memory_not_equal(k1->chunk_name, k2->chunk_name, 32);
        /* HKDF-SHA256 RFC 5869 test case 3 (empty salt and info) */
        uint8_t ikm[22], okm[42];
        memset(ikm, 0x0b, sizeof(ikm));
        assert_int_equal(cove_hkdf_sha256(ikm, sizeof(ikm), "", okm, sizeof(okm), &err), 0);
        const uint8_t want[8] = {0x8d, 0xa4, 0xe7, 0x75, 0xa5, 0x63, 0xc1, 0x8f};
        assert_memory_equal(okm, want, 8);
        cove_tenant_keys_free(k1);
        cove_tenant_keys_free(k2);
}

static int parses(const char *entries)
{
        char buf[8192];
        snprintf(
            buf, sizeof(buf),
            "{\"format\":1,\"snapshot\":\"s1\",\"tenant\":\"t\",\"parent\":null,\"kind\":\"files\","
            "\"created_at\":1,\"size_bytes\":0,\"new_bytes\":0,\"entries\":[%s]}",
            entries);
        struct cove_manifest m;
        struct cove_err err = {0};
        int rc = cove_manifest_parse(buf, strlen(buf), &m, &err);
        cove_manifest_clear(&m);
        return rc;
}

#define ROOT "{\"path\":\".\",\"type\":\"dir\",\"mode\":493,\"uid\":0,\"gid\":0,\"mtime_ns\":0}"
#define ENT(p, t)                                                                                  \
        "{\"path\":\"" p "\",\"type\":\"" t "\",\"mode\":420,\"uid\":0,\"gid\":0,\"mtime_ns\":0"
#define ID "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\""

static void manifest_parser(void **state)
{
        (void)state;
        assert_int_equal(parses(ROOT), 0);
        assert_int_equal(parses(ROOT "," ENT("d", "dir") "}," ENT(
                             "d/f", "file") ",\"size\":5,\"chunks\":[[" ID ",3],[null,2]]}"),
                         0);
        assert_int_equal(parses(ROOT
                                "," ENT("f", "file") ",\"size\":1,\"chunks\":[[" ID
                                                     ",1]]}," ENT("g", "file") ",\"link\":\"f\"}"),
                         0);
        /* refusals */
        assert_int_equal(parses(""), -1);                              /* no root */
        assert_int_equal(parses(ENT("x", "dir") "}"), -1);             /* root first */
        assert_int_equal(parses(ROOT "," ENT("../x", "dir") "}"), -1); /* traversal */
        assert_int_equal(parses(ROOT "," ENT("/x", "dir") "}"), -1);   /* absolute */
        assert_int_equal(parses(ROOT "," ENT("a//b", "dir") "}"), -1); /* empty comp */
        assert_int_equal(parses(ROOT "," ENT("a/./b", "dir") "}"), -1);
        assert_int_equal(parses(ROOT "," ENT("a/b", "dir") "}"), -1); /* no parent */
        assert_int_equal(parses(ROOT "," ENT("l", "symlink") ",\"target\":\"/\"}," ENT(
                             "l/x", "file") ",\"size\":0,\"chunks\":[]}"),
                         -1); /* through a symlink */
        assert_int_equal(parses(ROOT "," ENT("d", "dir") "}," ENT("d", "dir") "}"),
                         -1); /* duplicate */
        assert_int_equal(parses(ROOT "," ENT("f", "file") ",\"size\":5,\"chunks\":[[" ID ",3]]}"),
                         -1); /* sum */
        assert_int_equal(
            parses(ROOT "," ENT("f", "file") ",\"size\":3000000,\"chunks\":[[" ID ",3000000]]}"),
            -1); /* too long */
        assert_int_equal(parses(ROOT "," ENT("f", "file") ",\"size\":1,\"chunks\":[[\"zz\",1]]}"),
                         -1);
        assert_int_equal(parses(ROOT "," ENT("g", "file") ",\"link\":\"f\"}"),
                         -1); /* link forward */
        assert_int_equal(parses(ROOT "," ENT("f", "weird") "}"), -1);
        assert_int_equal(parses(ROOT "," ENT("f", "file") ",\"size\":-1,\"chunks\":[]}"), -1);
        assert_int_equal(parses(ROOT "," ENT("s", "symlink") "}"), -1); /* no target */
        assert_int_equal(parses(ROOT "," ENT("f", "fifo") ",\"xattrs\":[[\"user.a\",\"abc\"]]}"),
                         -1);                                               /* odd hex */
        assert_int_equal(parses(ROOT "," ENT("a\\u0000b", "dir") "}"), -1); /* NUL in path */
        const char *junk = "{\"format\":2}";
        struct cove_manifest m;
        assert_int_equal(cove_manifest_parse(junk, strlen(junk), &m, NULL), -1);
        cove_manifest_clear(&m);
        assert_int_equal(cove_manifest_parse("[", 1, &m, NULL), -1);
        cove_manifest_clear(&m);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
            cmocka_unit_test_setup_teardown(fs_objects, setup, teardown),
            cmocka_unit_test_setup_teardown(fs_packs, setup, teardown),
            cmocka_unit_test_setup_teardown(fs_pack_faults, setup, teardown),
            cmocka_unit_test_setup_teardown(cache, setup, teardown),
            cmocka_unit_test(s3_objects),
            cmocka_unit_test(s3_gc_race),
            cmocka_unit_test(s3_put_race),
            cmocka_unit_test(cdc),
            cmocka_unit_test_setup_teardown(keys, setup, teardown),
            cmocka_unit_test(manifest_parser),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
