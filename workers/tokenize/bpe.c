/* Byte-level BPE: pre-tokenizer regexes (PCRE2), GPT-2 byte alphabet and
 * merges by rank (see bpe.h).
 *
 * The rule sets follow the regexes llama.cpp applies per tokenizer.ggml.pre
 * (llama-vocab.cpp), written for PCRE2. Where llama.cpp's regex engines see
 * the text differently from a plain Unicode regex, the pattern says so
 * instead of the engine: "\s" is spelt as the Unicode White_Space set
 * (WS below, what llama.cpp's own tables call whitespace, U+0085
 * included), and in the rules llama.cpp runs through std::wregex on code
 * points, non-ASCII whitespace never matches an explicit character range
 * (llama.cpp replaces it by U+000B before matching). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokpipe/bpe.h"
#include "tokpipe/utf8.h"
#include "tokpipe/heap.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define BPE_MAX_RULES 6
#define BPE_MAX_MERGE_LINE 4096

/* Unicode White_Space, for use inside a character class. */
#define WS "\\t-\\r\\x{85}\\p{Z}"

#define RE_GPT2                                                                                 \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|[" WS "]+(?![^" WS \
    "])|[" WS "]+"
#define RE_CONTRACTIONS_CI "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_LLAMA3_TAIL(digits)                                                                  \
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}" digits "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|[" WS \
    "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+"
/* o200k (gpt-4o, gpt-oss; llama.cpp's LLAMA_VOCAB_PRE_TYPE_GPT4O): words
 * as an optional non-letter, upper/title-case letters then lower-case
 * ones (or the other way round), a contraction in either case; digits by
 * three; punctuation runs with their newlines or slashes. */
#define RE_O200K_UP "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define RE_O200K_LO "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
#define RE_O200K                                                                                        \
    "[^\\r\\n\\p{L}\\p{N}]?" RE_O200K_UP "*" RE_O200K_LO "+" RE_CONTRACTIONS_CI "?"                      \
    "|[^\\r\\n\\p{L}\\p{N}]?" RE_O200K_UP "+" RE_O200K_LO "*" RE_CONTRACTIONS_CI "?"                     \
    "|\\p{N}{1,3}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n/]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+"
/* CJK ideographs, U+0800..U+4E00 and Hangul, minus whitespace. */
#define RE_CJK "(?:(?![" WS "])[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}])+"

struct rules {
    const char *name;
    const char *re[BPE_MAX_RULES];
};

static const struct rules RULES[] = {
    {"gpt2", {RE_GPT2}},
    {"gpt-4o", {RE_O200K}},
    {"llama3", {RE_CONTRACTIONS_CI RE_LLAMA3_TAIL("{1,3}")}},
    {"qwen2", {RE_CONTRACTIONS_CI RE_LLAMA3_TAIL("")}},
    /* Qwen 3.5 (its tokenizer.json): qwen2's, with combining marks
     * (\p{M}) joining the letters of a word and kept out of the
     * punctuation run */
    {"qwen35",
     {RE_CONTRACTIONS_CI "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^" WS
                         "\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+"}},
    {"deepseek-llm",
     {"[\\r\\n]",
      /* DeepSeek's own letter class (its tokenizer.json): the cased letters */
      "[" WS "]?[\\x{41}-\\x{5A}\\x{61}-\\x{7A}\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+",
      /* U+3000 is whitespace, so the published range U+3000-U+3002 starts
       * at U+3001 here */
      "[" WS "]?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3001}-\\x{3002}]+", "[" WS "]+\\z", RE_CJK, "\\p{N}+"}},
    /* DeepSeek V3 / R1 (their tokenizer.json: three Isolated splits, then
     * ByteLevel without its own regex): digits in runs of up to three,
     * kana and the CJK block U+4E00-U+9FA5 on their own, then the rest */
    {"deepseek-v3",
     {"\\p{N}{1,3}", "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
      "| ?[\\p{P}\\p{S}]+[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+"}},
    {"deepseek-coder",
     {"[\\r\\n]", "[" WS "]?\\p{L}+", "[" WS "]?\\p{P}+", RE_CJK, "\\p{N}"}},
    {"falcon", {"[\\p{P}$+<=>^~|`]+", RE_GPT2, "[0-9][0-9][0-9]"}},
    {"starcoder", {"\\p{N}", RE_GPT2}},
    {"default", {"[\\p{P}$+<=>^~|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}},
};

/* tokenizer.ggml.pre values -> rule set (llama.cpp's list). */
static const struct {
    const char *pre;
    const char *rules;
    bool ignore_merges;
} PRE_NAMES[] = {
    {"default", "default", false},      {"llama3", "llama3", true},
    {"llama-v3", "llama3", true},       {"llama-bpe", "llama3", true},
    {"falcon3", "llama3", true},        {"dbrx", "llama3", false},
    {"smaug-bpe", "llama3", false},     {"chatglm-bpe", "llama3", false},
    {"deepseek-llm", "deepseek-llm", false}, {"deepseek-coder", "deepseek-coder", false},
    {"deepseek-v3", "deepseek-v3", false},
    {"falcon", "falcon", false},        {"mpt", "gpt2", false},
    {"starcoder", "starcoder", false},  {"gpt-2", "gpt2", false},
    {"phi-2", "gpt2", false},           {"jina-es", "gpt2", false},
    {"jina-de", "gpt2", false},         {"gigachat", "gpt2", false},
    {"jina-v1-en", "gpt2", false},      {"jina-v2-es", "gpt2", false},
    {"jina-v2-de", "gpt2", false},      {"jina-v2-code", "gpt2", false},
    {"roberta-bpe", "gpt2", false},     {"olmo", "gpt2", false},
    {"jais", "gpt2", false},            {"refact", "starcoder", false},
    {"command-r", "starcoder", false},  {"smollm", "starcoder", false},
    {"codeshell", "starcoder", false},  {"exaone", "starcoder", false},
    {"minerva-7b", "starcoder", false}, {"qwen2", "qwen2", false},
    {"qwen35", "qwen35", false},
    {"stablelm2", "qwen2", false},      {"megrez", "qwen2", false},
    {"gpt-4o", "gpt-4o", false},        {"llama4", "gpt-4o", false},
};

struct tp_pretok {
    const char *name;
    int n;
    pcre2_code *re[BPE_MAX_RULES];
};

void tp_pretok_free(tp_pretok *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->n; i++)
        pcre2_code_free(p->re[i]);
    free(p);
}

const char *tp_pretok_name(const tp_pretok *p) { return p->name; }

static int compile_rules(tp_pretok *p, const struct rules *r, tp_err *err)
{
    for (int i = 0; i < BPE_MAX_RULES && r->re[i]; i++) {
        int code;
        PCRE2_SIZE at;
        p->re[i] = pcre2_compile((PCRE2_SPTR)r->re[i], PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                 &code, &at, NULL);
        if (!p->re[i]) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(code, msg, sizeof msg);
            return tp_err_set(err, TP_ESTATE, "pre-tokenizer %s: rule %d: %s at %zu", r->name,
                              i + 1, (const char *)msg, (size_t)at);
        }
        p->n = i + 1;
        /* JIT is a speed-up only: without it (no JIT on this CPU or
         * PCRE2 built without) the interpreter gives the same matches. */
        (void)pcre2_jit_compile(p->re[i], PCRE2_JIT_COMPLETE);
    }
    return 0;
}

int tp_pretok_new(const char *name, size_t len, tp_pretok **out, bool *ignore_merges, tp_err *err)
{
    *out = NULL;
    const struct rules *r = NULL;
    bool ign = false;
    for (size_t i = 0; !r && i < sizeof PRE_NAMES / sizeof PRE_NAMES[0]; i++) {
        if (strlen(PRE_NAMES[i].pre) != len || memcmp(PRE_NAMES[i].pre, name, len))
            continue;
        ign = PRE_NAMES[i].ignore_merges;
        for (size_t k = 0; k < sizeof RULES / sizeof RULES[0]; k++)
            if (!strcmp(RULES[k].name, PRE_NAMES[i].rules))
                r = &RULES[k];
    }
    if (!r)
        return tp_err_set(err, TP_EFORMAT,
                          "tokenizer.ggml.pre '%.*s' is not a known pre-tokenizer (known: gpt-2, "
                          "llama-bpe, qwen2, qwen35, deepseek-llm, deepseek-coder, deepseek-v3, falcon, starcoder, gpt-4o, "
                          "default and their llama.cpp aliases)",
                          (int)(len > 64 ? 64 : len), name);
    tp_pretok *p = calloc(1, sizeof *p);
    if (!p)
        return tp_err_set(err, TP_ENOMEM, "pre-tokenizer: out of memory");
    p->name = r->name;
    int rc = compile_rules(p, r, err);
    if (rc) {
        tp_pretok_free(p);
        return rc;
    }
    if (ignore_merges)
        *ignore_merges = ign;
    *out = p;
    return 0;
}

/* Offset of the first invalid UTF-8 sequence, or len if there is none. */
static size_t utf8_invalid_at(const char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        if ((uint8_t)s[i] < 0x80) {
            i++;
            continue;
        }
        utf8proc_int32_t cp;
        size_t left = len - i;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i,
                                              (utf8proc_ssize_t)(left > 4 ? 4 : left), &cp);
        if (k <= 0)
            return i;
        i += (size_t)k;
    }
    return len;
}

struct spans {
    size_t *end;
    size_t n, cap;
};

static int span_push(struct spans *s, size_t end, tp_err *err)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        size_t *e = realloc(s->end, cap * sizeof *e);
        if (!e)
            return tp_err_set(err, TP_ENOMEM, "pre-tokenizer: out of memory");
        s->end = e;
        s->cap = cap;
    }
    s->end[s->n++] = end;
    return 0;
}

static size_t utf8_char_len(const char *s, size_t left)
{
    uint8_t c = (uint8_t)s[0];
    size_t k = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    return k < left ? k : left;
}

/* Split the piece [from, to) of text with one rule: matches and the gaps
 * between them each become a piece. */
static int split_one(const pcre2_code *re, pcre2_match_data *md, const char *text, size_t from,
                     size_t to, struct spans *out, tp_err *err)
{
    const PCRE2_SPTR subj = (PCRE2_SPTR)(text + from);
    size_t n = to - from, pos = 0, last = 0;
    int rc = 0;
    while (!rc && pos < n) {
        int m = pcre2_match(re, subj, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (m == PCRE2_ERROR_JIT_STACKLIMIT)
            m = pcre2_match(re, subj, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
        if (m == PCRE2_ERROR_NOMATCH)
            break;
        if (m < 0)
            return tp_err_set(err, TP_ESTATE, "pre-tokenizer: regex match failed (%d)", m);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t s = ov[0], e = ov[1];
        if (e == s) { /* none of the rules can match empty; step on regardless */
            pos = s + utf8_char_len(text + from + s, n - s);
            continue;
        }
        if (s > last)
            rc = span_push(out, from + s, err);
        if (!rc)
            rc = span_push(out, from + e, err);
        last = pos = e;
    }
    if (!rc && last < n)
        rc = span_push(out, to, err);
    return rc;
}

int tp_pretok_split(const tp_pretok *p, const char *text, size_t len, size_t **ends, size_t *n,
                    tp_err *err)
{
    *ends = NULL;
    *n = 0;
    size_t bad = utf8_invalid_at(text, len);
    if (bad < len)
        return tp_err_set(err, TP_EINVAL, "text is not valid UTF-8 at byte %zu", bad);
    struct spans cur = {0}, next = {0};
    int rc = len ? span_push(&cur, len, err) : 0;
    pcre2_match_data *md = NULL;
    for (int r = 0; !rc && r < p->n && len; r++) {
        md = pcre2_match_data_create_from_pattern(p->re[r], NULL);
        if (!md) {
            rc = tp_err_set(err, TP_ENOMEM, "pre-tokenizer: out of memory");
            break;
        }
        next.n = 0;
        size_t from = 0;
        for (size_t i = 0; !rc && i < cur.n; i++) {
            rc = split_one(p->re[r], md, text, from, cur.end[i], &next, err);
            from = cur.end[i];
        }
        pcre2_match_data_free(md);
        md = NULL;
        struct spans t = cur;
        cur = next;
        next = t;
    }
    free(next.end);
    if (rc) {
        free(cur.end);
        return rc;
    }
    *ends = cur.end;
    *n = cur.n;
    return 0;
}

/* ---- the GPT-2 byte alphabet ---------------------------------------------
 * Printable Latin-1 bytes stand for themselves; the other 68 bytes, in
 * order, get U+0100 onwards, so every byte is a visible character. */

static bool byte_is_self(int b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* The bytes without a visible self, in order: 0x00-0x20 (33), 0x7F-0xA0
 * (34) and 0xAD, standing for U+0100-U+0143. */
static uint32_t byte_to_cp(int b)
{
    if (byte_is_self(b))
        return (uint32_t)b;
    return 256u + (uint32_t)(b <= 0x20 ? b : b <= 0xA0 ? 33 + (b - 0x7F) : 67);
}

/* The byte code point cp stands for, or -1 outside the alphabet. */
static int cp_to_byte(int32_t cp)
{
    if (cp < 0 || cp > 0x143)
        return -1;
    if (cp < 256)
        return byte_is_self(cp) ? cp : -1;
    int k = cp - 256;
    return k < 33 ? k : k < 67 ? 0x7F + (k - 33) : 0xAD;
}

size_t tp_bpe_unmap(const char *piece, size_t len, uint8_t *dst)
{
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        utf8proc_int32_t cp = -1;
        size_t left = len - i;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)piece + i,
                                              (utf8proc_ssize_t)(left > 4 ? 4 : left), &cp);
        if (k <= 0) { /* not UTF-8: copy the byte as it is */
            dst[o++] = (uint8_t)piece[i++];
            continue;
        }
        int b = cp_to_byte(cp);
        if (b >= 0) {
            dst[o++] = (uint8_t)b;
        } else {
            memcpy(dst + o, piece + i, (size_t)k);
            o += (size_t)k;
        }
        i += (size_t)k;
    }
    return o;
}

/* ---- vocabulary and merges -------------------------------------------- */

struct table { /* open addressing: string -> value */
    const char *blob;
    const uint32_t *off, *len;
    int32_t *slots;
    uint32_t mask;
};

struct tp_bpe {
    tp_pretok *pre;
    bool ignore_merges;
    char *tok_blob, *merge_blob;
    uint32_t *tok_off, *tok_len, *merge_off, *merge_len;
    struct table toks, merges;
    char enc[256][2]; /* byte -> its alphabet character (UTF-8, 1 or 2 bytes) */
    uint8_t enc_len[256];
};

static uint32_t fnv(const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

static int table_find(const struct table *t, const char *s, size_t n)
{
    for (uint32_t i = fnv(s, n) & t->mask;; i = (i + 1) & t->mask) {
        int32_t v = t->slots[i];
        if (v < 0)
            return -1;
        if (t->len[v] == n && !memcmp(t->blob + t->off[v], s, n))
            return v;
    }
}

/* Insert value v (its string is blob[off[v]..]); a later equal string
 * replaces an earlier one when last_wins (llama.cpp's token_to_id map),
 * else the first stays (merge ranks: the first line is the rank). */
static void table_put(struct table *t, int32_t v, bool last_wins)
{
    const char *s = t->blob + t->off[v];
    size_t n = t->len[v];
    uint32_t i = fnv(s, n) & t->mask;
    for (;; i = (i + 1) & t->mask) {
        int32_t w = t->slots[i];
        if (w < 0)
            break;
        if (t->len[w] == n && !memcmp(t->blob + t->off[w], s, n)) {
            if (last_wins)
                t->slots[i] = v;
            return;
        }
    }
    t->slots[i] = v;
}

static int table_init(struct table *t, const char *blob, const uint32_t *off, const uint32_t *len,
                      size_t n, tp_err *err)
{
    uint32_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    t->blob = blob;
    t->off = off;
    t->len = len;
    t->mask = cap - 1;
    t->slots = malloc(sizeof *t->slots * cap);
    if (!t->slots)
        return tp_err_set(err, TP_ENOMEM, "bpe: out of memory for %zu entries", n);
    memset(t->slots, 0xff, sizeof *t->slots * cap);
    return 0;
}

void tp_bpe_free(tp_bpe *b)
{
    if (!b)
        return;
    tp_pretok_free(b->pre);
    free(b->tok_blob);
    free(b->merge_blob);
    free(b->tok_off);
    free(b->tok_len);
    free(b->merge_off);
    free(b->merge_len);
    free(b->toks.slots);
    free(b->merges.slots);
    free(b);
}

const tp_pretok *tp_bpe_pretok(const tp_bpe *b) { return b->pre; }

/* Copy n strings into one blob with offsets and lengths. */
static int pack(const char *const *s, const size_t *lens, size_t n, char **blob, uint32_t **off,
                uint32_t **len, tp_err *err)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        total += lens[i];
        if (total > UINT32_MAX)
            return tp_err_set(err, TP_ERANGE, "bpe: more than 4 GiB of token text");
    }
    *blob = malloc(total ? total : 1);
    *off = malloc(sizeof **off * (n ? n : 1));
    *len = malloc(sizeof **len * (n ? n : 1));
    if (!*blob || !*off || !*len)
        return tp_err_set(err, TP_ENOMEM, "bpe: out of memory for %zu strings", n);
    size_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(*blob + pos, s[i], lens[i]);
        (*off)[i] = (uint32_t)pos;
        (*len)[i] = (uint32_t)lens[i];
        pos += lens[i];
    }
    return 0;
}

int tp_bpe_new(const char *const *pieces, const size_t *lens, int n, const char *const *merges,
               const size_t *merge_lens, size_t n_merges, const char *pre, size_t pre_len,
               tp_bpe **out, tp_err *err)
{
    *out = NULL;
    if (n < 1 || (n_merges && (!merges || !merge_lens)))
        return tp_err_set(err, TP_EINVAL, "bpe: empty vocabulary or NULL merges");
    for (size_t r = 0; r < n_merges; r++) {
        const char *sp = merge_lens[r] > 1 ? memchr(merges[r] + 1, ' ', merge_lens[r] - 1) : NULL;
        if (!sp || merge_lens[r] > BPE_MAX_MERGE_LINE)
            return tp_err_set(err, TP_EFORMAT,
                              "tokenizer.ggml.merges[%zu] '%.*s' is not two pieces separated by "
                              "a space (or longer than %d bytes)",
                              r, (int)(merge_lens[r] > 40 ? 40 : merge_lens[r]), merges[r],
                              BPE_MAX_MERGE_LINE);
    }
    tp_bpe *b = calloc(1, sizeof *b);
    if (!b)
        return tp_err_set(err, TP_ENOMEM, "bpe: out of memory");
    int rc = tp_pretok_new(pre, pre_len, &b->pre, &b->ignore_merges, err);
    if (!rc)
        rc = pack(pieces, lens, (size_t)n, &b->tok_blob, &b->tok_off, &b->tok_len, err);
    if (!rc)
        rc = pack(merges, merge_lens, n_merges, &b->merge_blob, &b->merge_off, &b->merge_len, err);
    if (!rc)
        rc = table_init(&b->toks, b->tok_blob, b->tok_off, b->tok_len, (size_t)n, err);
    if (!rc)
        rc = table_init(&b->merges, b->merge_blob, b->merge_off, b->merge_len, n_merges, err);
    for (int i = 0; !rc && i < n; i++)
        if (b->tok_len[i])
            table_put(&b->toks, i, true);
    for (size_t r = 0; !rc && r < n_merges; r++)
        table_put(&b->merges, (int32_t)r, false);
    for (int c = 0; c < 256; c++) {
        char u[4];
        b->enc_len[c] = (uint8_t)tp_utf8_put(byte_to_cp(c), u); /* all below U+0800: 1 or 2 bytes */
        memcpy(b->enc[c], u, b->enc_len[c]);
    }
    if (rc) {
        tp_bpe_free(b);
        return rc;
    }
    *out = b;
    return 0;
}

/* ---- merging one word ----------------------------------------------------
 * Symbols are spans of the word in the byte alphabet, linked as a list; the
 * heap holds candidate pairs ordered by merge rank, then leftmost. A pair
 * is stale once either side has changed (lengths or adjacency). */

struct sym {
    uint32_t start, len;
    int prev, next;
};

struct cand {
    int rank, left, right;
    uint32_t llen, rlen;
};

struct work {
    const tp_bpe *b;
    char *w;                 /* the word in the byte alphabet */
    struct sym *sym;
    struct cand *heap;
    size_t nheap;
    char *key;               /* scratch "left right" */
};

static bool cand_before(const struct cand *a, const struct cand *b, void *unused)
{
    (void)unused;
    return a->rank != b->rank ? a->rank < b->rank : a->left < b->left;
}

TP_HEAP_DEFINE(static, cands, struct cand, cand_before, void *)

static void try_merge(struct work *k, int l, int r)
{
    if (l < 0 || r < 0)
        return;
    const struct sym *a = &k->sym[l], *c = &k->sym[r];
    if (a->len + 1 + c->len > BPE_MAX_MERGE_LINE)
        return;
    memcpy(k->key, k->w + a->start, a->len);
    k->key[a->len] = ' ';
    memcpy(k->key + a->len + 1, k->w + c->start, c->len);
    int rank = table_find(&k->b->merges, k->key, a->len + 1 + c->len);
    if (rank >= 0)
        cands_push(k->heap, &k->nheap, (struct cand){rank, l, r, a->len, c->len}, NULL);
}

static int emit(int id, int *out, size_t cap, size_t *n_out, tp_err *err)
{
    if (*n_out >= cap)
        return tp_err_set(err, TP_ERANGE, "encode: more than %zu tokens", cap);
    out[(*n_out)++] = id;
    return 0;
}

static int encode_word(struct work *k, size_t wlen, int *out, size_t cap, size_t *n_out, tp_err *err)
{
    const tp_bpe *b = k->b;
    if (b->ignore_merges) {
        int id = table_find(&b->toks, k->w, wlen);
        if (id >= 0)
            return emit(id, out, cap, n_out, err);
    }
    int ns = 0;
    for (size_t i = 0; i < wlen; ns++) {
        size_t cl = utf8_char_len(k->w + i, wlen - i);
        k->sym[ns] = (struct sym){(uint32_t)i, (uint32_t)cl, ns - 1, -1};
        if (ns)
            k->sym[ns - 1].next = ns;
        i += cl;
    }
    k->nheap = 0;
    for (int i = 0; i + 1 < ns; i++)
        try_merge(k, i, i + 1);
    while (k->nheap) {
        struct cand c = cands_pop(k->heap, &k->nheap, NULL);
        struct sym *l = &k->sym[c.left], *r = &k->sym[c.right];
        if (l->next != c.right || l->len != c.llen || r->len != c.rlen)
            continue;
        l->len += r->len;
        l->next = r->next;
        if (r->next >= 0)
            k->sym[r->next].prev = c.left;
        r->len = 0;
        r->prev = r->next = -1;
        try_merge(k, l->prev, c.left);
        try_merge(k, c.left, l->next);
    }
    int rc = 0;
    for (int s = ns ? 0 : -1; !rc && s >= 0; s = k->sym[s].next) {
        int id = table_find(&b->toks, k->w + k->sym[s].start, k->sym[s].len);
        if (id >= 0) {
            rc = emit(id, out, cap, n_out, err);
            continue;
        }
        for (uint32_t j = 0; !rc && j < k->sym[s].len; j++) {
            int bid = table_find(&b->toks, k->w + k->sym[s].start + j, 1);
            if (bid >= 0)
                rc = emit(bid, out, cap, n_out, err);
        }
    }
    return rc;
}

int tp_bpe_encode(const tp_bpe *b, const char *text, size_t len, int *out, size_t cap,
                  size_t *n_out, tp_err *err)
{
    if (!len)
        return 0;
    size_t *ends = NULL, nw = 0;
    int rc = tp_pretok_split(b->pre, text, len, &ends, &nw, err);
    if (rc)
        return rc;
    size_t longest = 0, from = 0;
    for (size_t i = 0; i < nw; i++) {
        if (ends[i] - from > longest)
            longest = ends[i] - from;
        from = ends[i];
    }
    /* every byte becomes at most 2 alphabet bytes and one symbol; each
     * merge pushes at most 2 candidates */
    struct work k = {.b = b};
    k.w = malloc(2 * longest + 1);
    k.sym = malloc(sizeof *k.sym * (longest + 1));
    k.heap = malloc(sizeof *k.heap * (3 * longest + 1));
    k.key = malloc(BPE_MAX_MERGE_LINE + 1);
    if (!k.w || !k.sym || !k.heap || !k.key)
        rc = tp_err_set(err, TP_ENOMEM, "encode: out of memory for a %zu-byte word", longest);
    from = 0;
    for (size_t i = 0; !rc && i < nw; i++) {
        size_t wl = 0;
        for (size_t j = from; j < ends[i]; j++) {
            uint8_t c = (uint8_t)text[j];
            memcpy(k.w + wl, b->enc[c], b->enc_len[c]);
            wl += b->enc_len[c];
        }
        rc = encode_word(&k, wl, out, cap, n_out, err);
        from = ends[i];
    }
    free(k.w);
    free(k.sym);
    free(k.heap);
    free(k.key);
    free(ends);
    return rc;
}
