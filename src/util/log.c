/* log.c — see log.h. */
#define _POSIX_C_SOURCE 200809L
#include "util/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static enum log_level g_log_level = LOG_LEVEL_WARN;

void log_set_level(enum log_level level) { g_log_level = level; }
enum log_level log_get_level(void) { return g_log_level; }

int log_parse_level(const char *s)
{
    static const char *names[] = { "error", "warn", "info", "debug" };
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

void log_write(enum log_level level, const char *component, const char *fmt, ...)
{
    static const char *tags[] = { "ERROR", "WARN", "INFO", "DEBUG" };
    char line[1024];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s %s: ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000L, tags[level], component);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line) vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    /* one fputs per line keeps lines from different threads whole */
    size_t len = strlen(line);
    if (len + 1 < sizeof line) { line[len] = '\n'; line[len + 1] = 0; }
    fputs(line, stderr);
}
