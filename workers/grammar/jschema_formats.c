/* String formats, each one ECMA regex over the decoded string (JSON string
 * contents are written from it, canonically escaped). Each is exact for the
 * form it accepts: dates are real calendar days (leap years by the
 * Gregorian rule, years 0001-9999), times RFC 3339 (leap second only as
 * 23:59:60 UTC), uuid 8-4-4-4-12 hex, ipv4 dotted quads without leading
 * zeros, email a dot-atom or quoted local part at a host name or [ipv4].
 * One definition serves a format alone (regex -> GBNF) and a format that
 * must hold with lengths or a pattern (regex -> DFA, jschema_dfa.c). */
#include "jschema_int.h"
#include "jschema_fmt.h"

#include <string.h>

#define D "[0-9]"
#define YEAR "(" D "{3}[1-9]|" D "{2}[1-9]0|" D "[1-9]00|[1-9]000)"
#define LEAP4 "(0[48]|[2468][048]|[13579][26])"
#define LEAP "(" D "{2}" LEAP4 "|" LEAP4 "00)"
#define D28 "(0[1-9]|1" D "|2[0-8])"
#define D30 "(0[1-9]|[12]" D "|30)"
#define D31 "(0[1-9]|[12]" D "|3[01])"
#define DATE "(" YEAR "-((0[13578]|1[02])-" D31 "|(0[469]|11)-" D30 "|02-" D28 ")|" LEAP "-02-29)"
#define FRAC "(\\." D "{1,9})?"
#define HH "([01]" D "|2[0-3])"
#define TIME "(" HH ":[0-5]" D ":[0-5]" D FRAC "([Zz]|[+-]" HH ":[0-5]" D ")|23:59:60" FRAC "([Zz]|[+-]00:00))"
#define HEX "[0-9a-fA-F]"
#define OCTET "(25[0-5]|2[0-4]" D "|1" D D "|[1-9]" D "|" D ")"
#define IPV4 OCTET "\\." OCTET "\\." OCTET "\\." OCTET
#define ATEXT "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
#define LABEL "[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"

static const struct fmt {
    const char *name;
    const char *re;
    size_t lo, hi; /* lengths in characters */
} fmts[] = {
    {"date", "^" DATE "$", 10, 10},
    {"time", "^" TIME "$", 9, 24},
    {"date-time", "^" DATE "[Tt]" TIME "$", 20, 35},
    {"uuid", "^" HEX "{8}-" HEX "{4}-" HEX "{4}-" HEX "{4}-" HEX "{12}$", 36, 36},
    {"ipv4", "^" IPV4 "$", 7, 15},
    {"email", "^(" ATEXT "+(\\." ATEXT "+)*|\"[ !#-\\[\\]-~]+\")@(" LABEL "(\\." LABEL ")*|\\[" IPV4 "\\])$", 3, SIZE_MAX},
};

int fmt_lookup(const char *name, unsigned *needs, size_t *lo, size_t *hi)
{
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++)
        if (!strcmp(fmts[i].name, name)) {
            *needs |= 1u << i;
            *lo = fmts[i].lo;
            *hi = fmts[i].hi;
            return 0;
        }
    return -1;
}

const char *fmt_regex(const char *name)
{
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++)
        if (!strcmp(fmts[i].name, name)) return fmts[i].re;
    return NULL;
}

int fmt_rules(tp_buf *b, unsigned needs, int max_depth, tp_err *err)
{
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++) {
        if (!(needs & (1u << i))) continue;
        size_t lo, hi;
        tp_buf_printf(b, "fmt-%s ::= ", fmts[i].name);
        int rc = rx_compile_expr(fmts[i].re, strlen(fmts[i].re), true, "char", max_depth, b, &lo, &hi, err);
        if (rc) return rc;
        tp_buf_puts(b, "\n");
    }
    return 0;
}
