/* The lazy grammar (tokpipe/glazy.h). */
#include "tokpipe/glazy.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define TRIGGER_MAX 64

struct tp_glazy {
    tp_gmatch *m;
    const tp_gvocab *v;
    char trigger[TRIGGER_MAX];
    size_t len;
    int trigger_id;           /* the special token the trigger names, -1 none */
    char keep[TRIGGER_MAX];   /* the last len - 1 bytes of the output */
    size_t n_keep;
    bool active, dead;
};

int tp_glazy_new(tp_gmatch *m, const char *trigger, size_t len, tp_glazy **out, tp_err *err)
{
    if (!len || len > TRIGGER_MAX)
        return tp_err_set(err, TP_EINVAL, "grammar_trigger: %zu bytes, expected 1 to %d", len, TRIGGER_MAX);
    tp_glazy *z = calloc(1, sizeof *z);
    if (!z)
        return tp_err_set(err, TP_ENOMEM, "out of memory");
    z->m = m;
    z->v = tp_gengine_vocab(tp_gmatch_engine(m));
    memcpy(z->trigger, trigger, len);
    z->len = len;
    z->trigger_id = tp_gvocab_find_name((void *)z->v, trigger, len);
    *out = z;
    return 0;
}

void tp_glazy_free(tp_glazy *z)
{
    free(z);
}

tp_gmatch *tp_glazy_active(const tp_glazy *z)
{
    return z->active ? z->m : NULL;
}

static const char *find(const char *s, size_t n, const char *t, size_t k)
{
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(s + i, t, k))
            return s + i;
    return NULL;
}

int tp_glazy_accept(tp_glazy *z, int32_t token, tp_err *err)
{
    if (z->active)
        return tp_gmatch_accept(z->m, token, NULL) == TP_ENOMEM ? tp_err_set(err, TP_ENOMEM, "out of memory") : 0;
    if (z->dead)
        return 0;
    if (token == z->trigger_id) {
        z->active = true;
        if (tp_gmatch_accept(z->m, token, NULL))
            z->active = false, z->dead = true;
        return 0;
    }
    size_t n;
    const uint8_t *b = tp_gvocab_bytes(z->v, token, &n);
    char small[512];
    size_t total = z->n_keep + n;
    char *buf = total <= sizeof small ? small : malloc(total);
    if (!buf)
        return tp_err_set(err, TP_ENOMEM, "out of memory");
    memcpy(buf, z->keep, z->n_keep);
    if (n)
        memcpy(buf + z->n_keep, b, n);
    const char *at = find(buf, total, z->trigger, z->len);
    if (at) {
        z->active = true;
        if (tp_gmatch_accept_bytes(z->m, (const uint8_t *)at, (size_t)(buf + total - at), NULL))
            z->active = false, z->dead = true;
    } else {
        z->n_keep = total < z->len - 1 ? total : z->len - 1;
        memcpy(z->keep, buf + total - z->n_keep, z->n_keep);
    }
    if (buf != small)
        free(buf);
    return 0;
}
