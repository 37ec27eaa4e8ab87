/* The daemon's log: one line on stderr per call (journald adds the time). */
#include <stdarg.h>
#include <stdio.h>

#include "log.h"

void blog(const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "tokpiped: %s\n", line);
}
