/* Tool calls: what the splitter, the JSON scanner and the per-family
 * parsers share. Not a public header (include/tokpipe/toolcall.h is). */
#ifndef TOKPIPE_TC_INTERNAL_H
#define TOKPIPE_TC_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "tokpipe/buf.h"
#include "tokpipe/toolcall.h"

#define TC_MAX_JSON_DEPTH 64

/* DeepSeek R1's markers (fullwidth bar, U+2581 for the spaces) */
#define TC_DS_CALLS_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define TC_DS_CALLS_END "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define TC_DS_CALL_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define TC_DS_CALL_END "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define TC_DS_SEP "<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>"


/* What a family parser produces from a region of output. */
typedef struct tc_out {
    tp_buf content;          /* the region's text that is not a call */
    tp_tc_call *calls;
    size_t n_calls, cap_calls;
    bool oom;
} tc_out;

/* Add a call: name (n bytes, plain text), arguments (JSON text, an object;
 * NULL = "{}"). The id is set by the splitter. -1 when out of memory. */
void tc_call_release(tp_tc_call *c);
/* A function name as models write them (no space, control byte, quote or
 * backslash; 1-256 bytes). */
bool tc_valid_name(const char *s, size_t n);
int tc_add_call(tc_out *o, const char *name, size_t name_len, const char *args, size_t args_len);

/* ---- JSON scanning (the model's text is checked, never trusted) ---- */

size_t tc_ws(const char *s, size_t n);   /* bytes of JSON whitespace at s */
/* Bytes of the one complete, valid JSON value at s (no leading space), or 0. */
size_t tc_json_span(const char *s, size_t n);
/* s[0..n) is a valid JSON object: the span of member key's value, or false. */
bool tc_json_member(const char *s, size_t n, const char *key, const char **v, size_t *vn);
/* A valid JSON string span -> its text (malloc, NUL terminated, *len bytes;
 * may hold NUL bytes). NULL when out of memory. */
char *tc_json_string(const char *s, size_t n, size_t *len);
bool tc_starts(const char *s, size_t n, const char *lit);
const char *tc_find(const char *s, size_t n, const char *lit);   /* first occurrence or NULL */

/* A call object {name-key: "NAME", args-key: {...}} (the keys tried in
 * order, NULL-terminated): added to o. false when it is not one. */
bool tc_call_object(tc_out *o, const char *s, size_t n, const char *const *name_keys, const char *const *args_keys);
/* A JSON array of call objects (as tc_call_object) at s: its span, or 0. */
size_t tc_call_array(tc_out *o, const char *s, size_t n, const char *const *name_keys, const char *const *args_keys);
/* The shape Mistral, Firefunction and Command R share: skip bytes, then
 * space, a JSON array of call objects, space, the close marker (NULL: none;
 * missing is fine at the very end), and the rest is content. */
int tc_marker_array(const char *s, size_t n, size_t skip, const char *close, tc_out *o,
                    const char *const *name_keys, const char *const *args_keys);

/* ---- families ---- */

/* Parse a region of output that starts where a call may start (one of the
 * family's markers, or the output's start for families whose calls open
 * it) into o. -1: not well-formed calls (the region stays content). */
typedef int (*tc_parse_fn)(const char *s, size_t n, tc_out *o);

typedef struct tc_family_def {
    const char *name;
    /* A template is of this family when it writes every text of
     * detect_all and (if given) one of detect_any (both NULL-terminated);
     * TP_TC_FAMILIES' order decides between families. */
    const char *const *detect_all, *const *detect_any;
    const char *const *markers;   /* texts that open a call anywhere in the content (NULL-terminated) */
    bool json_at_start;           /* an output that starts with '{' may be a call */
    bool recipient_first;         /* Functionary v3.2: the output starts with a recipient line */
    const char *const *strip;     /* texts dropped from the content (NULL-terminated, may be NULL) */
    tc_parse_fn parse;
    int id_len;                   /* 0: "call_" + 24; else exactly this many [A-Za-z0-9] (Mistral) */
    const char *think_open, *think_close; /* its thinking's markers (NULL: <think> and </think>) */
    bool channels;                /* the output is framed in the family's messages (gpt-oss's
                                   * harmony): its strip texts are dropped even without tools */
    bool exact_space;             /* the grammar keeps its markers' spaces as written (harmony's
                                   * headers: "commentary to=" is one space, never none) */
    const char *trigger;          /* where tool_choice auto's lazy grammar starts (NULL: markers[0]) */
    bool tools_as_functions;      /* its template reads `functions` (the tools as JSON text) and
                                   * `datetime` beside `tools` (Firefunction v2) */
    /* What tp_toolcall_grammar holds a constrained output to (grammar.c:
     * whitespace in these free up to 4 characters, a piece the vocabulary
     * holds as a special token asked for as that token), and the shape the
     * streaming scanner follows (stream.c):
     *   calls_open CALL (calls_sep CALL)* calls_close
     *   CALL = call_open {"<name_key>": "NAME", "<args_key>": ARGS} call_close
     * or, where the name stands outside the JSON (name_key NULL),
     *   CALL = call_open NAME name_close ARGS call_close
     * with NAME one of the offered functions and ARGS the grammar of its
     * parameters schema; the lazy grammar of tool_choice auto starts at the
     * trigger (tp_toolcall_trigger). */
    const char *calls_open, *calls_sep, *calls_close;
    const char *call_open, *call_close, *name_key, *args_key, *name_close;
} tc_family_def;

#define TC_EXTERN_(id, name) extern const tc_family_def tc_##name;
TP_TC_FAMILIES(TC_EXTERN_)
#undef TC_EXTERN_

/* The definition of family f (families.c), NULL for TP_TC_NONE. */
const tc_family_def *tc_family(tp_tc_family f);
/* The family whose markers template source src writes (TP_TC_NONE: none). */
tp_tc_family tc_family_detect(const char *src, size_t len);

/* <|python_tag|> text (Llama 3.x, Functionary v3.1): a JSON call, a
 * builtin's NAME.call(k=v, ...), or code for the python tool. */
int tc_python_tag(const char *s, size_t n, tc_out *o, const char *const *args_keys);

/* ---- streaming (stream.c) ---- */

enum { TC_SCAN_START, TC_SCAN_NEXT, TC_SCAN_DONE };

/* Where the scan of a call region stands: at off, the call numbered k
 * comes next (phase START: the region's calls_open first; NEXT: a
 * calls_sep first; DONE: the text left the family's shape, nothing more
 * streams). */
typedef struct tc_scan {
    size_t off, k;
    int phase;
} tc_scan;

/* The next call as far as the text shows it (offsets into the region). */
typedef struct tc_scan_call {
    size_t index;
    bool named;              /* the name is whole: s[name_off..+name_len) */
    bool name_json;          /* ... as a JSON string (quotes, escapes) */
    size_t name_off, name_len;
    bool has_args;           /* the arguments began: s[args_off..+args_len) so far */
    bool args_done;          /* ... and are one whole JSON value (or the call closed without them) */
    size_t args_off, args_len;
    bool done;               /* the call and its close are whole: st moved past it */
} tc_scan_call;

/* The next call of region s[0..n) in d's shape: true with *c when its name
 * is whole (c->done: st now stands after it). parallel false: one call. */
bool tc_stream_scan(const tc_family_def *d, const char *s, size_t n, bool parallel, tc_scan *st, tc_scan_call *c);

#endif
