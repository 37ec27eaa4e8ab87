/* Tool calls and reasoning in a chat model's output: which syntax a chat
 * template's model writes its calls in (detected from the template, as
 * llama.cpp detects its chat formats), and a splitter that turns the
 * generated text into content, reasoning (the <think> text) and parsed
 * calls {id, name, arguments} -- streaming, so content can be published as
 * it comes while call text never is.
 *
 * One parser per syntax family lives in workers/toolcall/<family>.c; each
 * also names the marker that opens a call (for a lazy grammar) and the
 * shape tp_toolcall_grammar (workers/toolcall/grammar.c) builds the grammar
 * of "a valid call of one of these functions" from. */
#ifndef TOKPIPE_TOOLCALL_H
#define TOKPIPE_TOOLCALL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokpipe/error.h"
#include "tokpipe/protocol.h"

struct tp_chat_template;

/* The tool-call families, one line each: X(ID, name) makes TP_TC_ID and
 * names its definition, tc_<name> in workers/toolcall/ (the family's own
 * file says how to detect, parse, stream and constrain it). The order is
 * the detector's: a template is of the first family whose markers it
 * writes, so the more specific come first. A new family is its file and
 * a line here. */
#define TP_TC_FAMILIES(X)                                                                                    \
    X(HARMONY, harmony)                 /* gpt-oss: <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...} */ \
    X(DEEPSEEK_R1, deepseek_r1)         /* <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME ... */ \
    X(COMMAND_R7B, command_r7b)         /* <|START_ACTION|>[{"tool_name", "parameters"}]<|END_ACTION|> */  \
    X(FUNCTIONARY_V32, functionary_v32) /* (>>>)NAME\n{...}; >>>all\ntext */                                \
    X(FUNCTIONARY_V31, functionary_v31) /* <function=NAME>{...}</function>; <|python_tag|>code */          \
    X(MISTRAL, mistral)                 /* Mistral Nemo: [TOOL_CALLS][{"name", "arguments", "id"}] */       \
    X(FIREFUNCTION_V2, firefunction_v2) /* functools[{"name", "arguments"}, ...] */                         \
    X(HERMES, hermes)                   /* Hermes 2/3, Qwen 2.5/3: <tool_call>{"name", "arguments"}</tool_call> */ \
    X(LLAMA3, llama3)                   /* Llama 3.1-3.3: {"name", "parameters"}; <|python_tag|> */         \
    X(COMMAND_R_PLUS, command_r_plus)   /* Action: ```json\n[{"tool_name", "parameters"}]\n``` */          \
    X(GENERIC, generic)                 /* {"tool_calls": [{"name", "arguments"}]} | {"response": ...} */

typedef enum tp_tc_family {
    TP_TC_NONE = 0, /* the template has no tool support */
#define TP_TC_ENUM_(id, name) TP_TC_##id,
    TP_TC_FAMILIES(TP_TC_ENUM_)
#undef TP_TC_ENUM_
    TP_TC_COUNT
} tp_tc_family;

/* What a template's model writes. */
typedef struct tp_tc_syntax {
    tp_tc_family family;
    bool thinks;             /* the model may think first (<think>...</think> or Command R7B's) */
    bool think_open;         /* the generation prompt itself opens the thinking */
    bool object_args;        /* the template wants a call's arguments as an object (it applies
                              * tojson to them or reads their members), not OpenAI's string */
    bool null_content;       /* an assistant turn of only calls may have content none (OpenAI's
                              * null; DeepSeek R1's template renders the calls only then); else "" */
} tp_tc_syntax;

/* "hermes", "llama3", ...; "none". */
const char *tp_tc_family_name(tp_tc_family f);

/* The family and thinking of a template, from its source text alone. */
void tp_toolcall_detect(const char *src, size_t len, tp_tc_syntax *out);

/* tp_toolcall_detect on t's source, plus what only rendering tells:
 * think_open (probe conversation's generation prompt), object_args (a
 * probe call rendered with string and with object arguments) and
 * null_content (the probe call's turn with content null renders). bos/eos:
 * the token texts the template sees (may be NULL). Never fails: a probe
 * that does not render leaves the flag false. */
void tp_toolcall_syntax(const struct tp_chat_template *t, const char *bos, const char *eos, tp_tc_syntax *out);

/* The variables a chat template renders a SUBMIT conversation with, as the
 * JSON text tp_chat_vars.json takes: {"messages": [...], "tools": ...} in
 * OpenAI's shape, with what syn says the template wants (a call's
 * arguments as an object, null content for a turn of only calls) and, for
 * Firefunction v2, its `functions` and `datetime`. Every byte of the
 * strings is kept. *out (caller frees). Errors name the call whose
 * arguments are not the object the template needs. */
int tp_toolcall_chat_vars(const tp_tc_syntax *syn, const tp_chat_msg *msgs, size_t n, tp_str tools, char **out,
                          size_t *len, tp_err *err);

/* The text whose generation opens a call, where a lazy grammar (tool_choice
 * auto) starts (tp_glazy: a space stands for the whitespace tc-ws allows):
 * the family's opening marker (Llama 3.x: { "name", generic:
 * {"tool_calls"; Functionary v3.2: the >>> of a segment after the first,
 * so a call the output opens with, its recipient line right after the
 * prompt's >>>, is parsed but not held); NULL for none. */
const char *tp_toolcall_trigger(tp_tc_family f);

/* The pieces of family f's call syntax that a vocabulary may hold as one
 * special token ([TOOL_CALLS], <|START_ACTION|>, DeepSeek R1's markers,
 * <tool_call>...): up to cap of them into out, how many. A control token
 * renders as no text, so whoever splits the output feeds the splitter the
 * piece's text where such a token was generated. */
size_t tp_toolcall_control_pieces(tp_tc_family f, const char **out, size_t cap);

/* The GBNF text (caller frees) of one valid call (parallel: one or more)
 * of the functions in tools_json (an OpenAI tools array; only: that one
 * function, else any), in family f's syntax, each call's arguments valid
 * against its function's parameters schema (tp_jschema_to_gbnf under o's
 * limits, NULL = defaults; o's GBNF limit bounds the whole): what
 * tool_choice required / a named function holds the output to from its
 * first token (from TP_TCG_FIRST); from the end of a thinking the
 * generation prompt opened (TP_TCG_AFTER_THINK: the grammar starts with
 * </think>, so the model thinks freely first; DeepSeek R1); or from the
 * call's marker (TP_TCG_LAZY, tool_choice auto: the grammar starts at
 * tp_toolcall_trigger(f)). The sampler applies the latter two from
 * tp_toolcall_grammar_trigger on (params.grammar_trigger). names:
 * the vocabulary's special tokens (NULL: none); a marker piece it names is
 * written as a token reference (<[TOOL_CALLS]>...). TP_EINVAL naming what
 * cannot be held: a parameters schema the compiler refuses (naming the
 * tool and the keyword), an only that is not offered, lazy for a syntax
 * without a trigger. */
struct tp_jschema_opts;
struct tp_gnames;
typedef enum tp_tcg_from { TP_TCG_FIRST, TP_TCG_AFTER_THINK, TP_TCG_LAZY } tp_tcg_from;
int tp_toolcall_grammar(tp_tc_family f, const char *tools_json, size_t len, const char *only, bool parallel,
                        tp_tcg_from from, const struct tp_gnames *names, const struct tp_jschema_opts *o, char **gbnf,
                        tp_err *err);

/* The text from which such a grammar applies: NULL (TP_TCG_FIRST), the
 * thinking's end, or the call's marker. */
const char *tp_toolcall_grammar_trigger(tp_tc_family f, tp_tcg_from from);

/* Check an OpenAI tools array: [{"type": "function", "function": {"name",
 * "description"?, "parameters"?, "strict"?}}, ...]; names [A-Za-z0-9_.-],
 * 1-64 bytes, distinct. Errors name the element ("tools[1].function.name: ..."). */
int tp_tools_check(const char *json, size_t len, tp_err *err);

/* In the JSON object text obj[0..n) (leading space allowed), the exact
 * text of member key's value (a key written without escapes): *v, *vn point
 * into obj. false when obj is not a valid object or has no such member. */
bool tp_json_member_span(const char *obj, size_t n, const char *key, const char **v, size_t *vn);

/* ---- the splitter ------------------------------------------------------- */

typedef struct tp_tc_call {
    char *id;                /* unique: "call_" + 24 random characters (Mistral: 9, as its template needs) */
    char *name;
    char *arguments;         /* JSON text, exactly as generated ("{}" when the syntax gives none) */
    size_t arguments_len;
} tp_tc_call;

typedef struct tp_tcsplit tp_tcsplit;

typedef struct tp_tcsplit_opts {
    bool tools;              /* parse calls (else call text is content) */
    bool reasoning;          /* split thinking off (else it is content) */
    bool parallel;           /* false: keep only the first call */
    uint64_t id_seed;        /* calls' ids derive from it: give each job fresh randomness */
} tp_tcsplit_opts;

int tp_tcsplit_new(const tp_tc_syntax *syn, const tp_tcsplit_opts *o, tp_tcsplit **out, tp_err *err);
void tp_tcsplit_free(tp_tcsplit *s);

/* Feed the next piece of output text. Afterwards *content / *reasoning
 * (borrowed until the next call) hold what became publishable: content
 * never holds call text, nor a tail that may still open a call (a marker's
 * prefix, held back like a stop string's). TP_ENOMEM. */
int tp_tcsplit_feed(tp_tcsplit *s, const char *text, size_t len, const char **content, size_t *content_len,
                    const char **reasoning, size_t *reasoning_len);

/* A control token renders as no text: the control tokens of tok that are
 * pieces of the syntax ([TOOL_CALLS], <|START_ACTION|>, ...) are read as
 * their text when tp_tcsplit_feed_token is given one. How many. */
struct tp_tokenizer;
int tp_tcsplit_controls(tp_tcsplit *s, const struct tp_tokenizer *tok);

/* tp_tcsplit_feed of text (what the stop check released with token id),
 * and, where id is one of those control tokens, its text in its place:
 * after the held bytes the stop check generated before it and holds back
 * still (tp_stop_held_bytes), once later feeds release them. Text a stop
 * string cuts is never fed, and a marker after it is dropped at finish. */
int tp_tcsplit_feed_token(tp_tcsplit *s, int32_t id, const char *text, size_t len, size_t held,
                          const char **content, size_t *content_len, const char **reasoning, size_t *reasoning_len);

/* End of output, after the last len bytes of text (may be 0): parse what
 * is held; the last deltas as for feed. Held text that is not a
 * well-formed call becomes content. */
int tp_tcsplit_finish(tp_tcsplit *s, const char *text, size_t len, const char **content, size_t *content_len,
                      const char **reasoning, size_t *reasoning_len);
/* finish after the last accepted token id (a control token's text last). */
int tp_tcsplit_finish_token(tp_tcsplit *s, int32_t id, const char *text, size_t len, const char **content,
                            size_t *content_len, const char **reasoning, size_t *reasoning_len);

/* What the last feed or finish released of the calls, in order: each
 * delta names its call (index, id, name; first: the call's first delta),
 * and may carry a fragment of its arguments. The fragments of a call, joined, are its
 * arguments in tp_tcsplit_calls: a call is streamed once its name is whole
 * and its arguments byte by byte as they come, in the family's documented
 * shape (other text is parsed at finish and released then, whole). A call
 * whose name went out stays a call: if the text then breaks the syntax
 * (or stops short), its arguments are what was generated up to there.
 * Borrowed until the next feed, finish or free. */
typedef struct tp_tc_delta {
    size_t index;            /* the call's place in tp_tcsplit_calls */
    const char *id, *name;
    bool first;
    const char *arguments;   /* a fragment (not NUL terminated) */
    size_t arguments_len;
} tp_tc_delta;

size_t tp_tcsplit_deltas(const tp_tcsplit *s, const tp_tc_delta **deltas);

/* After finish: the calls (borrowed, valid until free) and the whole
 * reasoning text. */
size_t tp_tcsplit_calls(const tp_tcsplit *s, const tp_tc_call **calls);
/* After finish: whether every call is whole (its arguments the JSON the
 * family's syntax closed); false when a call that had streamed was kept
 * as it stood because the text broke its syntax or the output stopped
 * inside it (a length finish, a stop string). */
bool tp_tcsplit_calls_whole(const tp_tcsplit *s);
const char *tp_tcsplit_reasoning(const tp_tcsplit *s, size_t *len);

#endif
