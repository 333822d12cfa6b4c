/* JSON-lines logger. */
#include "util/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *level_name[] = {"debug", "info", "warn", "error"};

/* Escape s into out as JSON string content; returns bytes written (out always terminated). */
static size_t json_escape(char *out, size_t cap, const char *s)
{
        size_t o = 0;
        for (; *s && o + 7 < cap; s++) {
                unsigned char c = (unsigned char)*s;
                if (c == '"' || c == '\\') {
                        out[o++] = '\\';
                        out[o++] = (char)c;
                } else if (c == '\n') {
                        out[o++] = '\\';
                        out[o++] = 'n';
                } else if (c < 0x20 || c == 0x7f) {
                        o += (size_t)snprintf(out + o, cap - o, "\\u%04x", c);
                } else {
                        out[o++] = (char)c;
                }
        }
        out[o] = '\0';
        return o;
}

void cove_logf(const struct cove_log *log, enum cove_log_level level, const char *event,
               const char *fmt, ...)
{
        if (!log || level < log->level)
                return;
        char msg[2048], emsg[4096], eev[128], line[4608];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        json_escape(emsg, sizeof(emsg), msg);
        json_escape(eev, sizeof(eev), event);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        int n = snprintf(line, sizeof(line),
                         "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"level\":\"%s\","
                         "\"event\":\"%s\",\"msg\":\"%s\"}\n",
                         tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                         tm.tm_sec, ts.tv_nsec / 1000000, level_name[level], eev, emsg);
        if (n < 0)
                return;
        if ((size_t)n >= sizeof(line)) {
                n = sizeof(line) - 1;
                line[n - 1] = '\n';
        }
        ssize_t w = write(log->fd, line, (size_t)n);
        (void)w;
}
