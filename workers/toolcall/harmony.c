/* gpt-oss's harmony format (OpenAI's harmony docs; llama.cpp's gpt-oss
 * chat parser). After the generation prompt <|start|>assistant the model
 * writes messages, each a header then <|message|>, the text, and <|end|>:
 *
 *   <|channel|>analysis<|message|>THINKING<|end|>
 *   <|start|>assistant<|channel|>final<|message|>ANSWER          (<|return|>)
 *
 * or, for a call, a recipient in the header (after the channel, as the
 * model writes it, or before it, as the template renders past calls):
 *
 *   <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}   (<|call|>)
 *   <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}
 *
 * <|return|> and <|call|> end generation; <|channel|>, <|message|>,
 * <|start|>, <|constrain|> and <|end|> render as text (the tokenizer makes
 * them user-defined for a harmony vocabulary, as llama.cpp does), so the
 * splitter reads the frame: the analysis channel is the reasoning (the
 * thinking's markers), the final channel's header and the frame's other
 * headers are dropped from the content, a commentary message with a
 * recipient is a call (its name without "functions."), and one without
 * is a preamble to the user: content. */
#include <string.h>

#include "tc_internal.h"

#define CALL_OPEN "<|channel|>commentary to=functions."
#define NAME_CLOSE " <|constrain|>json<|message|>"
#define START "<|start|>assistant"

static const char *const detect_all[] = {"<|channel|>", "<|message|>", START " to=", NULL};
/* a call's header anywhere in the content; " to=functions." where the
 * output opens with the recipient (right after the generation prompt) */
static const char *const markers[] = {START "<|channel|>commentary to=", "<|channel|>commentary to=", START " to=",
                                      " to=functions.", NULL};
static const char *const strip[] = {START, "<|channel|>final<|message|>", "<|channel|>commentary<|message|>",
                                    "<|channel|>analysis<|message|>", "<|end|>", "<|return|>", NULL};

/* The bytes of a header word (a channel, a recipient, a content type). */
static size_t word(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n && s[i] != ' ' && s[i] != '\n' && s[i] != '<' && s[i] != '"')
        i++;
    return i;
}

static size_t spaces(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n && (s[i] == ' ' || s[i] == '\n'))
        i++;
    return i;
}

/* " to=RECIPIENT" at s: its name (past "functions.") and the bytes taken. */
static size_t recipient(const char *s, size_t n, const char **name, size_t *len)
{
    size_t i = spaces(s, n);
    if (!tc_starts(s + i, n - i, "to="))
        return 0;
    i += 3;
    size_t w = word(s + i, n - i);
    if (!w)
        return 0;
    *name = s + i;
    *len = w;
    if (w > 10 && !memcmp(s + i, "functions.", 10)) {
        *name += 10;
        *len -= 10;
    }
    return i + w;
}

/* One call message from s: its header, <|message|>, the JSON arguments. */
static size_t one_call(const char *s, size_t n, tc_out *o)
{
    size_t i = 0, k;
    const char *name = NULL;
    size_t name_len = 0;
    if (tc_starts(s, n, START))
        i += strlen(START);
    if ((k = recipient(s + i, n - i, &name, &name_len)))
        i += k;
    if (tc_starts(s + i, n - i, "<|channel|>")) {
        i += 11;
        i += word(s + i, n - i);
        if (!name && (k = recipient(s + i, n - i, &name, &name_len)))
            i += k;
    }
    if (!name)
        return 0;
    i += spaces(s + i, n - i);
    if (tc_starts(s + i, n - i, "<|constrain|>"))
        i += 13;
    i += word(s + i, n - i); /* json */
    i += spaces(s + i, n - i);
    if (!tc_starts(s + i, n - i, "<|message|>"))
        return 0;
    i += 11;
    i += tc_ws(s + i, n - i);
    size_t v = tc_json_span(s + i, n - i);
    if (!v || s[i] != '{' || tc_add_call(o, name, name_len, s + i, v))
        return 0;
    i += v;
    if (tc_starts(s + i, n - i, "<|call|>"))
        i += 8;
    return i;
}

static int parse(const char *s, size_t n, tc_out *o)
{
    size_t i = 0;
    for (;;) {
        size_t k = one_call(s + i, n - i, o);
        if (!k)
            return o->n_calls ? (tp_buf_add(&o->content, s + i, n - i), 0) : -1;
        i += k;
        size_t w = tc_ws(s + i, n - i);
        if (i + w == n)
            return 0;
        /* another call follows, or the rest is text */
        if (!tc_starts(s + i + w, n - i - w, START) && !tc_starts(s + i + w, n - i - w, "<|channel|>")) {
            tp_buf_add(&o->content, s + i, n - i);
            return 0;
        }
        i += w;
    }
}

const tc_family_def tc_harmony = {
    .name = "harmony", .detect_all = detect_all, .markers = markers, .strip = strip, .parse = parse,
    .think_open = "<|channel|>analysis<|message|>", .think_close = "<|end|>", .trigger = CALL_OPEN,
    .channels = true, .exact_space = true,
    .calls_open = "", .calls_sep = START, .calls_close = "", .call_open = CALL_OPEN, .name_close = NAME_CLOSE,
    .call_close = ""};
