/* The operator console (docs/console.md): static files under /ui, public (the page asks for
 * an API key and sends it with each API call). The files come from a directory: <the
 * directory of coved's binary>/ui (the build tree), else COVE_UI_DIR (where meson installs
 * them). Only a single path segment of [A-Za-z0-9._-] not starting with '.' is served, opened
 * with O_NOFOLLOW, bounded; each answer carries a Content-Security-Policy that lets the page
 * load nothing from outside this node. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/routes.h"

#ifndef COVE_UI_DIR
#define COVE_UI_DIR "/usr/local/share/cove/ui"
#endif
#define UI_FILE_MAX (4u << 20)

static const char CSP[] = "default-src 'self'; base-uri 'none'; frame-ancestors 'none'; "
                          "form-action 'self'";

static const char *ui_ctype(const char *name)
{
        static const struct {
                const char *ext, *ctype;
        } types[] = {
            {".html", "text/html; charset=utf-8"},
            {".js", "text/javascript; charset=utf-8"},
            {".mjs", "text/javascript; charset=utf-8"},
            {".css", "text/css; charset=utf-8"},
            {".svg", "image/svg+xml"},
        };
        const char *dot = strrchr(name, '.');
        for (size_t i = 0; dot && i < sizeof(types) / sizeof(types[0]); i++)
                if (!strcmp(dot, types[i].ext))
                        return types[i].ctype;
        return NULL;
}

static int ui_name_ok(const char *s)
{
        if (!s[0] || s[0] == '.' || strlen(s) > 64)
                return 0;
        for (; *s; s++)
                if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
                      (*s >= '0' && *s <= '9') || *s == '.' || *s == '_' || *s == '-'))
                        return 0;
        return 1;
}

/* the console's directory: next to the binary (build tree) or the installed one */
static int ui_dir_open(void)
{
        char self[PATH_MAX], dir[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
        if (n > 0) {
                self[n] = '\0';
                snprintf(dir, sizeof(dir), "%s/ui", dirname(self));
                int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                if (fd >= 0)
                        return fd;
        }
        return open(COVE_UI_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

static int ui_answer(struct cove_req *r, unsigned status, const char *ctype, void *data, size_t len,
                     enum MHD_ResponseMemoryMode mode)
{
        struct MHD_Response *resp = MHD_create_response_from_buffer(len, data, mode);
        if (!resp)
                return -1;
        MHD_add_response_header(resp, "Content-Type", ctype);
        MHD_add_response_header(resp, "Content-Security-Policy", CSP);
        MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
        MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
        MHD_add_response_header(resp, "Cache-Control", "no-store");
        enum MHD_Result q = MHD_queue_response(r->conn, status, resp);
        MHD_destroy_response(resp);
        r->answered = 1;
        return q == MHD_YES ? 0 : -1;
}

static int ui_not_found(struct cove_req *r, const char *what)
{
        static char msg[] = "{\"error\":{\"code\":\"not_found\",\"message\":\"no such console "
                            "file\"}}";
        (void)what;
        return ui_answer(r, 404, "application/json", msg, strlen(msg), MHD_RESPMEM_PERSISTENT);
}

int cove_h_ui(void *app, struct cove_req *r)
{
        (void)app;
        const char *name = r->nparams > 0 ? r->params[0] : "index.html";
        const char *ctype = ui_ctype(name);
        if (!ui_name_ok(name) || !ctype)
                return ui_not_found(r, name);
        int dfd = ui_dir_open();
        if (dfd < 0)
                return ui_not_found(r, name);
        int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
        close(dfd);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
            (size_t)st.st_size > UI_FILE_MAX) {
                if (fd >= 0)
                        close(fd);
                return ui_not_found(r, name);
        }
        size_t len = (size_t)st.st_size, got = 0;
        char *buf = malloc(len ? len : 1);
        while (buf && got < len) {
                ssize_t k = read(fd, buf + got, len - got);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0)
                        break;
                got += (size_t)k;
        }
        close(fd);
        if (!buf || got != len) {
                free(buf);
                return cove_reply_error(r, 500, "internal", "console file %s unreadable", name);
        }
        return ui_answer(r, 200, ctype, buf, len, MHD_RESPMEM_MUST_FREE);
}
