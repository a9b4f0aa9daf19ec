/* notify.h — the service manager's notifications (systemd Type=notify, libsystemd's
 * sd_notify): READY once the server answers, STATUS lines, WATCHDOG pings from the
 * scheduler loop, STOPPING at the drain. Without NOTIFY_SOCKET in the environment every
 * call is a no-op. Any thread.
 */
#ifndef TESSERA_SERVER_NOTIFY_H
#define TESSERA_SERVER_NOTIFY_H

/* "READY=1" with a status line. */
void notify_ready(const char *status);
/* "STOPPING=1" with a status line. */
void notify_stopping(const char *status);
/* "STATUS=..." (printf format). */
void notify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Seconds between watchdog pings when the manager set WatchdogSec= for this process (half
 * of it), else 0. */
double notify_watchdog_interval(void);
/* "WATCHDOG=1"; ud is unused (an engine_tick_fn). */
void notify_watchdog(void *ud);

#endif
