/* String formats as GBNF (JSON string contents, without the quotes). Each is
 * exact for the form it accepts: dates are real calendar days (leap years
 * by the Gregorian rule, years 0001-9999), times RFC 3339 (leap second only
 * as 23:59:60 UTC), uuid 8-4-4-4-12 hex, ipv4 dotted quads without leading
 * zeros, email a dot-atom or quoted local part at a host name or [ipv4]. */
#include "jschema_int.h"
#include "jschema_fmt.h"

#include <string.h>

static const char date_rules[] =
    "fmt-date ::= fmt-year \"-\" ( ( \"01\" | \"03\" | \"05\" | \"07\" | \"08\" | \"10\" | \"12\" ) \"-\" fmt-d31"
    " | ( \"04\" | \"06\" | \"09\" | \"11\" ) \"-\" fmt-d30 | \"02-\" fmt-d28 ) | fmt-leap \"-02-29\"\n"
    "fmt-year ::= [0-9]{3} [1-9] | [0-9]{2} [1-9] \"0\" | [0-9] [1-9] \"00\" | [1-9] \"000\"\n"
    "fmt-leap4 ::= \"0\" [48] | [2468] [048] | [13579] [26]\n"
    "fmt-leap ::= [0-9]{2} fmt-leap4 | fmt-leap4 \"00\"\n"
    "fmt-d28 ::= \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]\n"
    "fmt-d30 ::= fmt-d28 | \"29\" | \"30\"\n"
    "fmt-d31 ::= fmt-d30 | \"31\"\n";

static const char time_rules[] =
    "fmt-time ::= fmt-hms fmt-frac? fmt-off | \"23:59:60\" fmt-frac? ( [Zz] | [+-] \"00:00\" )\n"
    "fmt-hms ::= ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9]\n"
    "fmt-frac ::= \".\" [0-9]{1,9}\n"
    "fmt-off ::= [Zz] | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9]\n";

static const char dt_rules[] = "fmt-date-time ::= fmt-date [Tt] fmt-time\n";

static const char uuid_rules[] =
    "fmt-uuid ::= fmt-hex{8} \"-\" fmt-hex{4} \"-\" fmt-hex{4} \"-\" fmt-hex{4} \"-\" fmt-hex{12}\n"
    "fmt-hex ::= [0-9a-fA-F]\n";

static const char ipv4_rules[] =
    "fmt-ipv4 ::= fmt-octet \".\" fmt-octet \".\" fmt-octet \".\" fmt-octet\n"
    "fmt-octet ::= \"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9]\n";

/* the quotes of a quoted local part are JSON-escaped (\") in the string */
static const char email_rules[] =
    "fmt-email ::= fmt-local \"@\" fmt-domain\n"
    "fmt-local ::= fmt-atext+ ( \".\" fmt-atext+ )* | \"\\\\\\\"\" [ !#-[\\]-~]+ \"\\\\\\\"\"\n"
    "fmt-atext ::= [A-Za-z0-9!#$%&'*+/=?^_`{|}~-]\n"
    "fmt-domain ::= fmt-label ( \".\" fmt-label )* | \"[\" fmt-ipv4 \"]\"\n"
    "fmt-label ::= [A-Za-z0-9] ( [A-Za-z0-9-]* [A-Za-z0-9] )?\n";

static const struct fmt {
    const char *name;
    unsigned needs; /* FMT_* bits of the rule groups it uses */
    size_t lo, hi;
} fmts[] = {
    {"date", FMT_DATE, 10, 10},
    {"time", FMT_TIME, 9, 24},
    {"date-time", FMT_DATE | FMT_TIME | FMT_DT, 20, 35},
    {"uuid", FMT_UUID, 36, 36},
    {"ipv4", FMT_IPV4, 7, 15},
    {"email", FMT_EMAIL | FMT_IPV4, 3, SIZE_MAX},
};

int fmt_lookup(const char *name, unsigned *needs, size_t *lo, size_t *hi)
{
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++)
        if (!strcmp(fmts[i].name, name)) {
            *needs |= fmts[i].needs;
            *lo = fmts[i].lo;
            *hi = fmts[i].hi;
            return 0;
        }
    return -1;
}

void fmt_rules(tp_buf *b, unsigned needs)
{
    if (needs & FMT_DATE) tp_buf_puts(b, date_rules);
    if (needs & FMT_TIME) tp_buf_puts(b, time_rules);
    if (needs & FMT_DT) tp_buf_puts(b, dt_rules);
    if (needs & FMT_UUID) tp_buf_puts(b, uuid_rules);
    if (needs & FMT_IPV4) tp_buf_puts(b, ipv4_rules);
    if (needs & FMT_EMAIL) tp_buf_puts(b, email_rules);
}
