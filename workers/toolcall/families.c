/* The table of tool-call families (toolcall.h's TP_TC_FAMILIES): each
 * family's definition by its id, and the detector that tries them in the
 * list's order. */
#include "tc_internal.h"

#define TC_ENTRY_(id, name) [TP_TC_##id] = &tc_##name,
static const tc_family_def *const FAMILIES[TP_TC_COUNT] = {TP_TC_FAMILIES(TC_ENTRY_)};
#undef TC_ENTRY_

#define TC_ORDER_(id, name) TP_TC_##id,
static const tp_tc_family ORDER[] = {TP_TC_FAMILIES(TC_ORDER_)};
#undef TC_ORDER_

const tc_family_def *tc_family(tp_tc_family f)
{
    return f > TP_TC_NONE && f < TP_TC_COUNT ? FAMILIES[f] : NULL;
}

static bool writes(const char *src, size_t len, const char *const *all, const char *const *any)
{
    for (; all && *all; all++)
        if (!tc_find(src, len, *all))
            return false;
    if (!any)
        return true;
    for (; *any; any++)
        if (tc_find(src, len, *any))
            return true;
    return false;
}

tp_tc_family tc_family_detect(const char *src, size_t len)
{
    for (size_t i = 0; i < sizeof ORDER / sizeof ORDER[0]; i++) {
        const tc_family_def *d = FAMILIES[ORDER[i]];
        if (d->detect_all && writes(src, len, d->detect_all, d->detect_any))
            return ORDER[i];
    }
    return TP_TC_NONE;
}
