/* Structured logs: one JSON object per line ({"ts","level","event","msg"}), written with a
 * single write(2) so lines from several threads never interleave. Secret values must never
 * be passed here: log names, not values. */
#ifndef COVE_UTIL_LOG_H
#define COVE_UTIL_LOG_H

enum cove_log_level { COVE_LOG_DEBUG = 0, COVE_LOG_INFO, COVE_LOG_WARN, COVE_LOG_ERROR };

struct cove_log {
        int fd;                    /* where lines go (stderr by default) */
        enum cove_log_level level; /* lines below this are dropped */
};

void cove_logf(const struct cove_log *log, enum cove_log_level level, const char *event,
               const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#define cove_info(log, ev, ...) cove_logf(log, COVE_LOG_INFO, ev, __VA_ARGS__)
#define cove_warn(log, ev, ...) cove_logf(log, COVE_LOG_WARN, ev, __VA_ARGS__)
#define cove_error(log, ev, ...) cove_logf(log, COVE_LOG_ERROR, ev, __VA_ARGS__)
#define cove_debug(log, ev, ...) cove_logf(log, COVE_LOG_DEBUG, ev, __VA_ARGS__)

#endif
