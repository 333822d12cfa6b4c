/* struct cove_err helpers: set, classify and wrap error messages. */
#include "util/err.h"

#include <stdio.h>
#include <string.h>

static void vset(struct cove_err *err, enum cove_err_kind kind, int errnum, const char *fmt,
                 va_list ap)
{
        if (!err)
                return;
        err->errnum = errnum;
        err->kind = kind;
        int n = vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        if (n < 0)
                n = 0;
        if (errnum && (size_t)n < sizeof(err->msg))
                snprintf(err->msg + n, sizeof(err->msg) - (size_t)n, ": %s", strerror(errnum));
}

int cove_err_set(struct cove_err *err, int errnum, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        vset(err, COVE_E_INTERNAL, errnum, fmt, ap);
        va_end(ap);
        return -1;
}

int cove_err_setk(struct cove_err *err, enum cove_err_kind kind, int errnum, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        vset(err, kind, errnum, fmt, ap);
        va_end(ap);
        return -1;
}

int cove_err_wrap(struct cove_err *err, const char *fmt, ...)
{
        if (!err)
                return -1;
        char prefix[COVE_ERR_MSG_MAX];
        char old[COVE_ERR_MSG_MAX];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(prefix, sizeof(prefix), fmt, ap);
        va_end(ap);
        memcpy(old, err->msg, sizeof(old));
        snprintf(err->msg, sizeof(err->msg), "%s: %s", prefix, old);
        return -1;
}

void cove_err_clear(struct cove_err *err)
{
        if (!err)
                return;
        err->errnum = 0;
        err->kind = COVE_E_INTERNAL;
        err->msg[0] = '\0';
}
