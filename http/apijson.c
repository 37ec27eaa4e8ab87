#include "apijson.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *aj_print_free(cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

/* (cJSON takes C strings) */
cJSON *aj_text_of(const char *s, size_t len)
{
    char *z = strndup(s ? s : "", len);
    cJSON *j = z ? cJSON_CreateString(z) : NULL;
    free(z);
    return j;
}

cJSON *aj_new_turn(cJSON *out, const char *role)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddItemToArray(out, m);
    cJSON_AddStringToObject(m, "role", role);
    return m;
}

int aj_known_keys(const cJSON *o, const char *const *allowed, const char *nm, oai_error *e)
{
    for (const cJSON *f = o->child; f; f = f->next) {
        int k = 0;
        while (allowed[k] && strcmp(allowed[k], f->string))
            k++;
        if (!allowed[k])
            return oai_fail(e, 400, nm, "%s.%.40s: unknown field", nm, f->string);
    }
    return 0;
}

const char *aj_call_name(const cJSON *turns, const char *id)
{
    for (const cJSON *m = turns->child; m; m = m->next) {
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        for (const cJSON *c = calls ? calls->child : NULL; c; c = c->next) {
            const cJSON *cid = cJSON_GetObjectItemCaseSensitive(c, "id");
            if (cJSON_IsString(cid) && !strcmp(cid->valuestring, id)) {
                const cJSON *n =
                    cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c, "function"), "name");
                return cJSON_IsString(n) ? n->valuestring : NULL;
            }
        }
    }
    return NULL;
}
