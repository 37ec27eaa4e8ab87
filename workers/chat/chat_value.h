/* Chat templates: values and the string builder (internal). */
#ifndef TOKPIPE_CHAT_VALUE_H
#define TOKPIPE_CHAT_VALUE_H

#include "chat_internal.h"
#include "tokpipe/buf.h"
#include "tokpipe/utf8.h"

/* Strings are built in tp_buf buffers with a limit (the output limit):
 * err TP_ERANGE past it, TP_ENOMEM out of memory, both sticky. */

void cv_fmt_float(double x, char *out, size_t cap);

/* Python str() / repr() / json.dumps(ensure_ascii=False, indent); non-zero
 * when v has no such form in the subset. indent < 0: one line. */
int cv_str(tp_buf *b, const tp_chat_val *v);
int cv_repr(tp_buf *b, const tp_chat_val *v);
int cv_json(tp_buf *b, const tp_chat_val *v, int indent, int level);

int cv_is_num(const tp_chat_val *v);
double cv_num_d(const tp_chat_val *v);
int64_t cv_num_i(const tp_chat_val *v);
int cv_eq(const tp_chat_val *a, const tp_chat_val *b);
int cv_order(const tp_chat_val *a, const tp_chat_val *b, int *res);
int cv_truthy(const tp_chat_val *v);
const char *cv_type_name(const tp_chat_val *v);
const tp_chat_val *cv_dict_get(const tp_chat_val *d, const tp_chat_val *key);
const tp_chat_val *cv_dict_gets(const tp_chat_val *d, const char *key, size_t n);

int tp_chat_parse(tp_chat_tok *toks, size_t n, tp_chat_arena *arena, tp_chat_node ***body, size_t *n_body,
                  tp_err *err);

int tp_chat_known_filter(const char *name);
int tp_chat_known_test(const char *name);

#endif
