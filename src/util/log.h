/* log.h — leveled logging to stderr.
 *
 * LOG_ERR/WARN/INFO/DEBUG(component, fmt, ...) check the level before formatting, so a
 * disabled DEBUG line costs one comparison. One line per event. The level is process
 * state set once at start-up (log_set_level) before any thread starts; it is the only
 * global in util/ and is read-only afterwards.
 */
#ifndef TESSERA_UTIL_LOG_H
#define TESSERA_UTIL_LOG_H

enum log_level { LOG_LEVEL_ERR = 0, LOG_LEVEL_WARN, LOG_LEVEL_INFO, LOG_LEVEL_DEBUG };

void log_set_level(enum log_level level);
enum log_level log_get_level(void);
/* Parses "error", "warn", "info", "debug"; returns -1 if unknown. */
int log_parse_level(const char *s);
void log_write(enum log_level level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define LOG_AT(lvl, comp, ...) \
    do { if ((lvl) <= log_get_level()) log_write((lvl), (comp), __VA_ARGS__); } while (0)
#define LOG_ERR(comp, ...) LOG_AT(LOG_LEVEL_ERR, comp, __VA_ARGS__)
#define LOG_WARN(comp, ...) LOG_AT(LOG_LEVEL_WARN, comp, __VA_ARGS__)
#define LOG_INFO(comp, ...) LOG_AT(LOG_LEVEL_INFO, comp, __VA_ARGS__)
#define LOG_DEBUG(comp, ...) LOG_AT(LOG_LEVEL_DEBUG, comp, __VA_ARGS__)

#endif
