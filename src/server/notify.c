/* notify.c — sd_notify wrappers (see notify.h). */
#include "server/notify.h"
#include "util/log.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <systemd/sd-daemon.h>

static void send_state(const char *state)
{
    int rc = sd_notify(0, state);
    if (rc < 0) LOG_WARN("server", "sd_notify failed: %d", rc);
}

void notify_ready(const char *status)
{
    char buf[256];
    snprintf(buf, sizeof buf, "READY=1\nSTATUS=%s", status);
    send_state(buf);
}

void notify_stopping(const char *status)
{
    char buf[256];
    snprintf(buf, sizeof buf, "STOPPING=1\nSTATUS=%s", status);
    send_state(buf);
}

void notify_status(const char *fmt, ...)
{
    char buf[256] = "STATUS=";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + 7, sizeof buf - 7, fmt, ap);
    va_end(ap);
    send_state(buf);
}

double notify_watchdog_interval(void)
{
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) return 0;
    return (double)usec / 2e6;
}

void notify_watchdog(void *ud)
{
    (void)ud;
    sd_notify(0, "WATCHDOG=1");
}
