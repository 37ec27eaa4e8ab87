/* JSON pieces the API translators share (anthropic.c, responses.c): each
 * turns its API's request into an OpenAI chat request for oai.c and
 * oai.c's answer back, with cJSON. */
#ifndef TOKPIPE_HTTP_APIJSON_H
#define TOKPIPE_HTTP_APIJSON_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "oai.h"

/* o printed compact, then deleted (NULL for NULL or out of memory). */
char *aj_print_free(cJSON *o);

/* len bytes of s (NULL: none) as a JSON string; NULL out of memory. */
cJSON *aj_text_of(const char *s, size_t len);

/* A new {"role": role} object appended to the array out. */
cJSON *aj_new_turn(cJSON *out, const char *role);

/* 0 when every field of the object o is one of allowed (NULL ended), else
 * a 400 naming nm.field. */
int aj_known_keys(const cJSON *o, const char *const *allowed, const char *nm, oai_error *e);

/* The function name of the earlier tool call id among the chat turns
 * already translated (their "tool_calls"), or NULL. */
const char *aj_call_name(const cJSON *turns, const char *id);

#endif
