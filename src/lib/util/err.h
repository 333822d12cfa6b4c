/* Error values for library code: a negative return plus a filled struct cove_err.
 * Library code never prints or exits; callers add context with cove_err_wrap(). */
#ifndef COVE_UTIL_ERR_H
#define COVE_UTIL_ERR_H

#include <stdarg.h>

#define COVE_ERR_MSG_MAX 512

/* Error classes map onto API error codes (docs/api.md "Errors") in one place: api/. */
enum cove_err_kind {
        COVE_E_INTERNAL = 0, /* default: a bug or an unexpected system failure */
        COVE_E_BAD_REQUEST,  /* the caller's input is wrong */
        COVE_E_NOT_FOUND,    /* no such object (or not this tenant's) */
        COVE_E_CONFLICT,     /* wrong state for the operation */
        COVE_E_LIMIT,        /* a quota or size bound was hit */
        COVE_E_UNAUTHORIZED, /* missing or wrong credentials */
        COVE_E_UNAVAILABLE,  /* a dependency (runtime, guest, store) is not usable now */
        COVE_E_KEY_REVOKED,  /* the tenant's key is revoked */
};

struct cove_err {
        int errnum;              /* errno value, 0 if none */
        enum cove_err_kind kind; /* class for the API layer */
        char msg[COVE_ERR_MSG_MAX];
};

/* Fill err (if non-NULL) and return -1. errnum 0 means no errno; when non-zero,
 * ": strerror(errnum)" is appended. */
int cove_err_set(struct cove_err *err, int errnum, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Same with an explicit kind. */
int cove_err_setk(struct cove_err *err, enum cove_err_kind kind, int errnum, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Prepend "context: " to an existing message; returns -1. */
int cove_err_wrap(struct cove_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cove_err_clear(struct cove_err *err);

#endif
