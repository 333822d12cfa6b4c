/* cove cp: copy one file between this machine and a sandbox, streamed both ways.
 * Upload: PUT /v1/sandboxes/{id}/files?path=P&mode=M with the file as the body (the local
 * file's mode; 0644 from stdin). Download: GET …/files?path=P into a temp file next to the
 * destination, renamed into place only once complete, so a failed copy leaves no torn file. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client.h"
#include "cove.h"
#include "util/cleanup.h"

static void help(void)
{
        puts("Usage: cove cp SRC DST\n"
             "\n"
             "Copy a file into or out of a sandbox. Exactly one of SRC and DST is\n"
             "ID:/path in the sandbox; '-' is stdin (as SRC) or stdout (as DST).\n"
             "\n"
             "  cove cp ./data.bin sbx_x:/tmp/data.bin   upload (keeps the file's mode)\n"
             "  cove cp sbx_x:/etc/os-release .           download into a directory\n"
             "  tar c dir | cove cp - sbx_x:/tmp/dir.tar  upload from stdin\n"
             "\n"
             "A sandbox path ending in '/' names a directory: the source's name is kept.\n"
             "Use ./name for a local file whose name contains ':'.");
}

/* "ID:/path" → id and path (true); anything whose part before ':' has a '/' is local. */
static bool split_remote(const char *arg, char **id, const char **path)
{
        const char *colon = strchr(arg, ':');
        if (!colon || colon == arg || memchr(arg, '/', (size_t)(colon - arg)))
                return false;
        *id = strndup(arg, (size_t)(colon - arg));
        *path = colon + 1;
        return *id != NULL;
}

static const char *base_name(const char *p)
{
        const char *s = strrchr(p, '/');
        return s ? s + 1 : p;
}

struct upload {
        int fd;
        int errnum; /* read error on the local side */
};

static size_t read_cb(char *buf, size_t size, size_t nmemb, void *arg)
{
        struct upload *u = arg;
        for (;;) {
                ssize_t n = read(u->fd, buf, size * nmemb);
                if (n >= 0)
                        return (size_t)n;
                if (errno != EINTR) {
                        u->errnum = errno;
                        return CURL_READFUNC_ABORT;
                }
        }
}

static int upload(struct cli *c, const char *src, const char *id, const char *rpath)
{
        struct cove_err err = {0};
        cleanup_close int fd = -1;
        unsigned mode = 0644;
        curl_off_t size = -1;
        if (strcmp(src, "-") == 0) {
                fd = dup(STDIN_FILENO);
        } else {
                fd = open(src, O_RDONLY | O_CLOEXEC);
                struct stat stt;
                if (fd >= 0 && fstat(fd, &stt) == 0) {
                        if (S_ISDIR(stt.st_mode)) {
                                cove_err_set(&err, 0,
                                             "%s is a directory; cove cp copies "
                                             "files (pipe a tar through '-' for trees)",
                                             src);
                                return cli_fail(&err);
                        }
                        mode = stt.st_mode & 07777;
                        if (S_ISREG(stt.st_mode))
                                size = stt.st_size;
                }
        }
        if (fd < 0) {
                cove_err_set(&err, errno, "open %s", src);
                return cli_fail(&err);
        }
        cleanup_free char *dst = NULL;
        size_t rl = strlen(rpath);
        if (rl == 0 || rpath[rl - 1] == '/') {
                if (strcmp(src, "-") == 0)
                        return cli_usage_error("cp", "a directory destination needs a named "
                                                     "source, not '-'");
                dst = cli_fmt("%s%s", rl ? rpath : "/", base_name(src));
        } else {
                dst = cli_fmt("%s", rpath);
        }
        if (cli_connect(c, &err) < 0)
                return cli_fail(&err);
        cleanup_free char *ide = cli_urlenc(id);
        cleanup_free char *pe = cli_urlenc(dst);
        cleanup_free char *path =
            cli_fmt("/v1/sandboxes/%s/files?path=%s&mode=%04o", ide, pe, mode);
        struct cli_req *r = cli_req_new(c, "PUT", path, "application/octet-stream");
        if (!r)
                return CLI_FAIL;
        struct upload u = {.fd = fd};
        curl_easy_setopt(r->h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(r->h, CURLOPT_READFUNCTION, read_cb);
        curl_easy_setopt(r->h, CURLOPT_READDATA, &u);
        if (size >= 0)
                curl_easy_setopt(r->h, CURLOPT_INFILESIZE_LARGE, size);
        cleanup_free char *label = cli_fmt("uploading %s", base_name(dst));
        struct cli_loop loop = {.progress = label};
        int ret = cli_perform(c, r, &loop, &err);
        if (u.errnum)
                ret = cove_err_set(&err, u.errnum, "read %s", src);
        else if (ret == 0 && (r->status < 200 || r->status >= 300))
                ret = cli_http_error(c, r->status, r->body, r->len, &err);
        cli_req_free(r);
        if (ret < 0)
                return cli_fail(&err);
        if (c->json) {
                json_t *j = json_pack("{ss}", "path", dst);
                int prc = cli_print_json(c, j);
                json_decref(j);
                return prc;
        }
        return CLI_OK;
}

struct download {
        struct cli_req *r;
        int fd;
        int errnum; /* write error on the local side */
};

static size_t write_cb(char *ptr, size_t size, size_t nmemb, void *arg)
{
        struct download *d = arg;
        size_t n = size * nmemb;
        if (cli_req_status(d->r) >= 300)
                return cli_collect_cb(ptr, size, nmemb, d->r);
        for (size_t off = 0; off < n;) {
                ssize_t w = write(d->fd, ptr + off, n - off);
                if (w < 0) {
                        if (errno == EINTR)
                                continue;
                        d->errnum = errno;
                        return 0;
                }
                off += (size_t)w;
        }
        return n;
}

static int download(struct cli *c, const char *id, const char *rpath, const char *dst)
{
        struct cove_err err = {0};
        if (!*rpath)
                return cli_usage_error("cp", "missing path after '%s:'", id);
        bool to_stdout = strcmp(dst, "-") == 0;
        cleanup_free char *final = NULL;
        cleanup_free char *tmp = NULL;
        mode_t mode = 0666;
        cleanup_close int fd = -1;
        if (to_stdout) {
                fd = dup(STDOUT_FILENO);
        } else {
                struct stat stt;
                size_t dl = strlen(dst);
                if ((stat(dst, &stt) == 0 && S_ISDIR(stt.st_mode)) || dst[dl - 1] == '/')
                        final =
                            cli_fmt("%s%s%s", dst, dst[dl - 1] == '/' ? "" : "/", base_name(rpath));
                else
                        final = cli_fmt("%s", dst);
                if (stat(final, &stt) == 0 && S_ISREG(stt.st_mode)) {
                        mode = stt.st_mode & 07777; /* overwriting keeps the file's mode */
                } else {
                        mode_t um = umask(0);
                        umask(um);
                        mode = 0666 & ~um;
                }
                cleanup_free char *dcopy = cli_fmt("%s", final);
                cleanup_free char *bcopy = cli_fmt("%s", final);
                tmp = cli_fmt("%s/.%s.cove-XXXXXX", dirname(dcopy), basename(bcopy));
                fd = mkostemp(tmp, O_CLOEXEC);
                if (fd < 0) {
                        cove_err_set(&err, errno, "create a temporary file next to %s", final);
                        return cli_fail(&err);
                }
        }
        if (fd < 0) {
                cove_err_set(&err, errno, "dup stdout");
                return cli_fail(&err);
        }
        int ret = cli_connect(c, &err);
        struct cli_req *r = NULL;
        struct download d = {.fd = fd};
        if (ret == 0) {
                cleanup_free char *ide = cli_urlenc(id);
                cleanup_free char *pe = cli_urlenc(rpath);
                cleanup_free char *path = cli_fmt("/v1/sandboxes/%s/files?path=%s", ide, pe);
                r = cli_req_new(c, "GET", path, NULL);
                d.r = r;
                curl_easy_setopt(r->h, CURLOPT_WRITEFUNCTION, write_cb);
                curl_easy_setopt(r->h, CURLOPT_WRITEDATA, &d);
                cleanup_free char *label = cli_fmt("downloading %s", base_name(rpath));
                struct cli_loop loop = {.progress = to_stdout ? NULL : label};
                ret = cli_perform(c, r, &loop, &err);
                if (d.errnum)
                        ret = cove_err_set(&err, d.errnum, "write %s", to_stdout ? "stdout" : tmp);
                else if (ret == 0 && (r->status < 200 || r->status >= 300))
                        ret = cli_http_error(c, r->status, r->body, r->len, &err);
        }
        cli_req_free(r);
        if (ret == 0 && !to_stdout) {
                if (fchmod(fd, mode) < 0 || fsync(fd) < 0)
                        ret = cove_err_set(&err, errno, "write %s", tmp);
                else if (rename(tmp, final) < 0)
                        ret = cove_err_set(&err, errno, "rename %s to %s", tmp, final);
        }
        if (ret < 0) {
                if (tmp)
                        unlink(tmp);
                return cli_fail(&err);
        }
        return CLI_OK;
}

int cmd_cp(struct cli *c, int argc, char **argv)
{
        static const struct option opts[] = {CLI_GLOBAL_OPTIONS, {0}};
        int opt;
        while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
                if (cli_global_opt(c, opt, optarg))
                        continue;
                if (opt == 'h') {
                        help();
                        return CLI_OK;
                }
                return cli_usage_error("cp", "bad option");
        }
        if (argc - optind != 2)
                return cli_usage_error("cp", "expected SRC DST");
        const char *src = argv[optind], *dst = argv[optind + 1];
        cleanup_free char *sid = NULL;
        cleanup_free char *did = NULL;
        const char *spath = NULL, *dpath = NULL;
        bool sr = split_remote(src, &sid, &spath);
        bool dr = split_remote(dst, &did, &dpath);
        if (sr == dr)
                return cli_usage_error("cp", sr ? "both SRC and DST are in a sandbox"
                                                : "one of SRC and DST must be ID:/path");
        return sr ? download(c, sid, spath, dst) : upload(c, src, did, dpath);
}
