/* tp_tokenizer: loading tokenizer.bin (and rejecting broken ones), per-token
 * output bytes, and encode against llama2.c's and llama.cpp's reference ids. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/protocol.h"
#include "tokpipe/tokenizer.h"

/* ---- helpers ---------------------------------------------------------- */

static char *model_path(const char *name)
{
    const char *dir = getenv("TP_MODELS");
    if (!dir)
        dir = "../shared/models";
    static char buf[4096]; /* test-only; one path in use at a time */
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    return buf;
}

static uint8_t *slurp(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *d = malloc(n + 1);
    assert_non_null(d);
    assert_int_equal(fread(d, 1, n, f), (size_t)n);
    fclose(f);
    d[n] = 0;
    *size = (size_t)n;
    return d;
}

static tp_tokenizer *load(const char *name)
{
    tp_tokenizer *t = NULL;
    tp_err err;
    tp_err_clear(&err);
    int rc = tp_tokenizer_load(model_path(name), 0, &t, &err);
    if (rc)
        fail_msg("loading %s: %s", name, err.msg);
    return t;
}

static void assert_bytes(const tp_tokenizer *t, int prev, int id, const char *want)
{
    size_t n;
    const uint8_t *b = tp_tokenizer_token_bytes(t, prev, id, &n);
    if (n != strlen(want) || (n && memcmp(b, want, n)))
        fail_msg("token %d after %d gives %zu bytes '%.*s', want '%s'", id, prev, n, (int)n,
                 (const char *)b, want);
}

/* Expect load_mem of (d, size) to fail with code, with msg containing what. */
static void assert_load_fails(const uint8_t *d, size_t size, int vocab, int code,
                              const char *what)
{
    tp_tokenizer *t = NULL;
    tp_err err;
    tp_err_clear(&err);
    int rc = tp_tokenizer_load_mem(d, size, vocab, &t, &err);
    assert_null(t);
    if (rc != code)
        fail_msg("expected code %d, got %d (%s)", code, rc, err.msg);
    if (!strstr(err.msg, what))
        fail_msg("error '%s' does not mention '%s'", err.msg, what);
}

static void encode_ok(const tp_tokenizer *t, const char *text, size_t len, bool bos, int *ids,
                      size_t cap, size_t *n)
{
    tp_err err;
    tp_err_clear(&err);
    int rc = tp_tokenizer_encode(t, text, len, bos, ids, cap, n, &err);
    if (rc)
        fail_msg("encode '%.*s': %s", (int)len, text, err.msg);
}

static void assert_ids(const int *got, size_t n, const int *want, size_t nw, const char *what)
{
    bool same = n == nw;
    for (size_t i = 0; same && i < n; i++)
        same = got[i] == want[i];
    if (same)
        return;
    char g[2048] = "", w[2048] = "";
    for (size_t i = 0; i < n && strlen(g) < 2000; i++)
        snprintf(g + strlen(g), sizeof g - strlen(g), " %d", got[i]);
    for (size_t i = 0; i < nw && strlen(w) < 2000; i++)
        snprintf(w + strlen(w), sizeof w - strlen(w), " %d", want[i]);
    fail_msg("%s: got [%s ] want [%s ]", what, g, w);
}

/* ---- limits -------------------------------------------------------------- */

/* A prompt of exactly the protocol's byte cap (limits.max_prompt_bytes at
 * its largest) encodes to one id per byte plus BOS: more ids than a
 * SUBMIT's prompt_ids may hold, yet the TOKENIZED reply carrying them must
 * encode, or the tokenize worker dies on it (issue 21). */
static void longest_prompt_fits_one_tokenized_reply(void **state)
{
    (void)state;
    tp_tokenizer *t = load("tok512.bin");
    size_t len = TP_PROTO_MAX_PROMPT;
    char *text = malloc(len);
    assert_non_null(text);
    memset(text, 'a', len);
    assert_true(tp_tokenizer_max_ids(len) <= TP_PROTO_MAX_TOKENIZED);
    size_t cap = tp_tokenizer_max_ids(len), n = 0;
    int *ids = malloc(cap * sizeof *ids);
    assert_non_null(ids);
    encode_ok(t, text, len, true, ids, cap, &n);
    if (n <= TP_PROTO_MAX_IDS)
        fail_msg("premise: %zu ids, expected more than %u", n, TP_PROTO_MAX_IDS);
    tp_msg m, d;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_TOKENIZED);
    m.task = 1, m.status = 200, m.tokenized = (tp_m_tokenized){.slot = 3, .ids = {ids, n}};
    tp_wire w;
    tp_err e;
    tp_err_clear(&e);
    if (tp_proto_encode(&m, &w, &e))
        fail_msg("TOKENIZED of %zu ids: %s", n, e.msg);
    if (tp_proto_decode(TP_FAM_WRK, w.f, w.n, &d, &e))
        fail_msg("TOKENIZED of %zu ids does not decode: %s", n, e.msg);
    assert_int_equal(d.tokenized.ids.n, n);
    tp_msg_clear(&d);
    tp_wire_free(&w);
    free(ids);
    free(text);
    tp_tokenizer_free(t);
}

/* ---- loading ----------------------------------------------------------- */

static void load_tok512_has_llama2c_special_tokens(void **state)
{
    (void)state;
    tp_tokenizer *t = load("tok512.bin");
    assert_int_equal(tp_tokenizer_vocab_size(t), 512);
    assert_int_equal(tp_tokenizer_bos_id(t), 1);
    assert_int_equal(tp_tokenizer_eos_id(t), 2);
    assert_int_equal(tp_tokenizer_unk_id(t), 0);
    size_t n;
    const char *p = tp_tokenizer_piece(t, 1, &n);
    assert_int_equal(n, 5);
    assert_memory_equal(p, "\n<s>\n", 5);
    p = tp_tokenizer_piece(t, 403, &n);
    assert_int_equal(n, 5);
    assert_memory_equal(p, " Once", 5);
    p = tp_tokenizer_piece(t, 13, &n);
    assert_memory_equal(p, "<0x0A>", 6);
    assert_int_equal(tp_tokenizer_token_type(t, 13), TP_TOKEN_BYTE);
    assert_int_equal(tp_tokenizer_token_type(t, 2), TP_TOKEN_CONTROL);
    assert_int_equal(tp_tokenizer_token_type(t, 403), TP_TOKEN_NORMAL);
    assert_null(tp_tokenizer_piece(t, 512, &n));
    assert_int_equal(n, 0);
    tp_tokenizer_free(t);
}

static void load_llama2_tokenizer_infers_32000_tokens(void **state)
{
    (void)state;
    tp_tokenizer *t = load("tokenizer.bin");
    assert_int_equal(tp_tokenizer_vocab_size(t), 32000);
    tp_tokenizer_free(t);
    tp_tokenizer *u = NULL;
    tp_err err;
    assert_int_equal(tp_tokenizer_load(model_path("tokenizer.bin"), 32000, &u, &err), 0);
    tp_tokenizer_free(u);
    tp_tokenizer_free(NULL);
}

static void load_rejects_truncated_file_naming_the_token(void **state)
{
    (void)state;
    size_t size;
    uint8_t *d = slurp(model_path("tok512.bin"), &size);
    assert_load_fails(d, 2, 0, TP_EFORMAT, "too short");
    assert_load_fails(d, 4 + 5, 0, TP_EFORMAT, "token 0: record at offset 4 truncated");
    assert_load_fails(d, 4 + 8 + 2, 0, TP_EFORMAT, "token 0: 5-byte piece at offset 12");
    assert_load_fails(d, size - 1, 0, TP_EFORMAT, "token 511");
    assert_load_fails(d, size - 1, 512, TP_EFORMAT, "token 511");
    free(d);
}

static void load_rejects_bad_lengths(void **state)
{
    (void)state;
    size_t size;
    uint8_t *d = slurp(model_path("tok512.bin"), &size);
    int32_t v = -1; /* token 1's length field: after header (4) + token 0 (8+5) + score (4) */
    memcpy(d + 4 + 13 + 4, &v, 4);
    assert_load_fails(d, size, 0, TP_EFORMAT, "token 1: length -1 at offset 21");
    free(d);
    d = slurp(model_path("tok512.bin"), &size);
    v = 4; /* "<unk>" (5 bytes) no longer fits */
    memcpy(d, &v, 4);
    assert_load_fails(d, size, 0, TP_EFORMAT,
                      "token 0: length 5 at offset 8 is outside [0, max_token_length 4]");
    for (int bad = -1; bad <= 0; bad++) {
        memcpy(d, &bad, 4);
        assert_load_fails(d, size, 0, TP_EFORMAT, "max_token_length");
    }
    v = 1 << 30;
    memcpy(d, &v, 4);
    assert_load_fails(d, size, 0, TP_EFORMAT, "max_token_length 1073741824");
    free(d);
}

static void load_rejects_vocab_size_that_disagrees_with_file(void **state)
{
    (void)state;
    size_t size;
    uint8_t *d = slurp(model_path("tok512.bin"), &size);
    assert_load_fails(d, size, 600, TP_EFORMAT, "token 512");
    assert_load_fails(d, size, 500, TP_EFORMAT, "trailing bytes");
    assert_load_fails(d, size, -3, TP_ERANGE, "vocab_size -3");
    free(d);
    tp_tokenizer *t = NULL;
    tp_err err;
    assert_int_equal(tp_tokenizer_load(model_path("tokenizer.bin"), 512, &t, &err), TP_EFORMAT);
    assert_non_null(strstr(err.msg, "tokenizer.bin"));
}

static void load_names_missing_file(void **state)
{
    (void)state;
    tp_tokenizer *t = NULL;
    tp_err err;
    assert_int_equal(tp_tokenizer_load("/nonexistent/tok.bin", 0, &t, &err), TP_EIO);
    assert_non_null(strstr(err.msg, "/nonexistent/tok.bin"));
    assert_null(t);
}

/* ---- token bytes ------------------------------------------------------- */

static void token_bytes_of_byte_tokens_are_the_raw_byte(void **state)
{
    (void)state;
    tp_tokenizer *t = load("tokenizer.bin");
    for (int v = 0; v < 256; v++) { /* README: ids 3..258 are <0x00>..<0xFF> */
        size_t n;
        const uint8_t *b = tp_tokenizer_token_bytes(t, 5, 3 + v, &n);
        assert_int_equal(n, 1);
        assert_int_equal(b[0], v);
    }
    assert_bytes(t, 1, 3 + ' ', " "); /* a byte token keeps its space after BOS */
    tp_tokenizer_free(t);
}

static void token_bytes_of_control_tokens_are_empty(void **state)
{
    (void)state;
    tp_tokenizer *t = load("tok512.bin");
    for (int id = 0; id < 3; id++)
        assert_bytes(t, 5, id, "");
    tp_tokenizer_free(t);
}

static void token_bytes_drop_leading_space_only_after_bos(void **state)
{
    (void)state;
    tp_tokenizer *t = load("tok512.bin");
    assert_bytes(t, 1, 403, "Once");
    assert_bytes(t, 378, 403, " Once");
    assert_bytes(t, 2, 403, " Once");
    assert_bytes(t, 1, 410, "");
    tp_tokenizer_free(t);
}

/* ---- from_vocab -------------------------------------------------------- */

static void from_vocab_maps_meta_space_and_follows_types(void **state)
{
    (void)state;
    const char *pieces[] = {"<unk>", "<s>", "</s>", "<0x41>", "\xe2\x96\x81hi",
                            "a\xe2\x96\x81\xe2\x96\x81", "<0x42>", "\xe2\x96\x81", "h", "i",
                            "\xe2\x96\x81h"};
    enum { N = sizeof pieces / sizeof *pieces };
    size_t lens[N];
    for (int i = 0; i < N; i++)
        lens[i] = strlen(pieces[i]);
    const int32_t types[N] = {2, 3, 3, 6, 1, 1, 1, 1, 1, 1, 1};
    const float scores[N] = {0, 0, 0, 0, -1, -2, -3, -4, -5, -6, -7};
    tp_tokenizer *t = NULL;
    tp_err err;
    tp_err_clear(&err);
    assert_int_equal(tp_tokenizer_from_vocab(pieces, lens, scores, types, N, 1, 2, &t, &err), 0);
    size_t n;
    const char *p = tp_tokenizer_piece(t, 4, &n);
    assert_int_equal(n, 3);
    assert_memory_equal(p, " hi", 3);
    assert_bytes(t, 1, 4, "hi");
    assert_bytes(t, 0, 5, "a  ");
    assert_bytes(t, 0, 3, "A");
    assert_bytes(t, 0, 6, "<0x42>"); /* typed normal: its text, not a byte */
    assert_bytes(t, 0, 1, "");
    int ids[8];
    encode_ok(t, "hiA", 3, true, ids, 8, &n);
    assert_ids(ids, n, (int[]){1, 4, 3}, 3, "encode with a GGUF-style vocabulary");
    tp_tokenizer_free(t);
}

static void from_vocab_rejects_bad_types_and_ids(void **state)
{
    (void)state;
    const char *pieces[] = {"<unk>", "x", "<0xZZ>"};
    size_t lens[] = {5, 1, 6};
    tp_tokenizer *t = NULL;
    tp_err err;
    assert_int_equal(tp_tokenizer_from_vocab(pieces, lens, NULL, (int32_t[]){2, 1, 6}, 3, -1, -1,
                                             &t, &err), TP_EFORMAT);
    assert_non_null(strstr(err.msg, "token 2 has type byte"));
    assert_int_equal(tp_tokenizer_from_vocab(pieces, lens, NULL, (int32_t[]){2, 9, 1}, 3, -1, -1,
                                             &t, &err), TP_EFORMAT);
    assert_non_null(strstr(err.msg, "token 1 has unknown token type 9"));
    assert_int_equal(tp_tokenizer_from_vocab(pieces, lens, NULL, NULL, 3, 3, -1, &t, &err),
                     TP_ERANGE);
    assert_non_null(strstr(err.msg, "bos id 3"));
    assert_null(t);
}

/* ---- encode ------------------------------------------------------------ */

static void encode_once_upon_a_time_like_run_c(void **state)
{
    (void)state;
    int ids[16];
    size_t n;
    tp_tokenizer *t = load("tok512.bin");
    encode_ok(t, "Once upon a time", 16, true, ids, 16, &n);
    assert_ids(ids, n, (int[]){1, 403, 407, 261, 378}, 5, "tok512.bin");
    tp_tokenizer_free(t);
    t = load("tokenizer.bin");
    encode_ok(t, "Once upon a time", 16, true, ids, 16, &n);
    assert_ids(ids, n, (int[]){1, 9038, 2501, 263, 931}, 5, "tokenizer.bin");
    tp_tokenizer_free(t);
}

static void encode_empty_text_gives_only_bos(void **state)
{
    (void)state;
    int ids[4];
    size_t n;
    tp_tokenizer *t = load("tok512.bin");
    encode_ok(t, "", 0, true, ids, 4, &n);
    assert_ids(ids, n, (int[]){1}, 1, "empty with BOS");
    encode_ok(t, "", 0, false, ids, 4, &n);
    assert_int_equal(n, 0);
    tp_tokenizer_free(t);
}

static void encode_falls_back_to_bytes_for_unknown_characters(void **state)
{
    (void)state;
    int ids[16];
    size_t n;
    tp_tokenizer *t = load("tok512.bin");
    /* tok512 has no 'ü' (C3 BC) nor '\n': byte tokens are 3 + byte */
    encode_ok(t, "\xc3\xbc\n", 3, false, ids, 16, &n);
    assert_ids(ids, n, (int[]){410, 3 + 0xC3, 3 + 0xBC, 3 + '\n'}, 4, "byte fallback");
    tp_tokenizer_free(t);
}

static void encode_reports_too_small_output(void **state)
{
    (void)state;
    int ids[3];
    size_t n;
    tp_err err;
    tp_tokenizer *t = load("tok512.bin");
    assert_int_equal(tp_tokenizer_encode(t, "Once upon a time", 16, true, ids, 3, &n, &err),
                     TP_ERANGE);
    tp_tokenizer_free(t);
}

/* The inputs are separated by "\n__ggml_vocab_test__\n" lines, the .out has
 * one line of ids per input (llama.cpp's test-tokenizer-0 format). */
static void check_llama_cpp_vectors(const tp_tokenizer *t, const char *what)
{
    size_t isz, osz;
    char *inp = (char *)slurp(model_path("llama.cpp-vocab/ggml-vocab-llama-spm.gguf.inp"), &isz);
    char *outp = (char *)slurp(model_path("llama.cpp-vocab/ggml-vocab-llama-spm.gguf.out"), &osz);
    const char *sep = "\n__ggml_vocab_test__\n";
    char *in = inp, *line = outp;
    int cases = 0;
    static int ids[4096];
    for (char *end; (end = strstr(in, sep)); in = end + strlen(sep), cases++) {
        char *nl = strchr(line, '\n');
        assert_non_null(nl);
        *nl = 0;
        int want[4096];
        size_t nw = 0;
        for (char *p = line, *q; nw < 4096; p = q) {
            long v = strtol(p, &q, 10);
            if (q == p)
                break;
            want[nw++] = (int)v;
        }
        size_t n;
        encode_ok(t, in, (size_t)(end - in), false, ids, 4096, &n);
        char msg[256];
        snprintf(msg, sizeof msg, "%s case %d '%.40s'", what, cases, in);
        assert_ids(ids, n, want, nw, msg);
        line = nl + 1;
    }
    assert_int_equal(cases, 46);
    free(inp);
    free(outp);
}

static void encode_matches_llama_cpp_spm_vectors(void **state)
{
    (void)state;
    tp_tokenizer *t = load("tokenizer.bin");
    check_llama_cpp_vectors(t, "tokenizer.bin");
    tp_tokenizer_free(t);
}

/* The same vocabulary spelled as GGUF stores it (U+2581, "<s>", typed). */
static void encode_matches_llama_cpp_vectors_via_gguf_spelling(void **state)
{
    (void)state;
    tp_tokenizer *bin = load("tokenizer.bin");
    int n = tp_tokenizer_vocab_size(bin);
    char **pieces = calloc(n, sizeof *pieces);
    size_t *lens = calloc(n, sizeof *lens);
    float *scores = calloc(n, sizeof *scores);
    int32_t *types = calloc(n, sizeof *types);
    size_t sz;
    uint8_t *raw = slurp(model_path("tokenizer.bin"), &sz);
    size_t off = 4;
    for (int i = 0; i < n; i++) {
        int32_t len;
        memcpy(&scores[i], raw + off, 4);
        memcpy(&len, raw + off + 4, 4);
        off += 8;
        pieces[i] = malloc(3 * len + 8);
        size_t o = 0;
        for (int k = 0; k < len; k++) {
            if (raw[off + k] == ' ') {
                memcpy(pieces[i] + o, "\xe2\x96\x81", 3);
                o += 3;
            } else {
                pieces[i][o++] = (char)raw[off + k];
            }
        }
        off += len;
        lens[i] = o;
        types[i] = i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1;
    }
    strcpy(pieces[1], "<s>");
    lens[1] = 3;
    strcpy(pieces[2], "</s>");
    lens[2] = 4;
    tp_tokenizer *t = NULL;
    tp_err err;
    assert_int_equal(tp_tokenizer_from_vocab((const char *const *)pieces, lens, scores, types,
                                             n, 1, 2, &t, &err), 0);
    check_llama_cpp_vectors(t, "gguf spelling");
    tp_tokenizer_free(t);
    tp_tokenizer_free(bin);
    for (int i = 0; i < n; i++)
        free(pieces[i]);
    free(pieces);
    free(lens);
    free(scores);
    free(types);
    free(raw);
}

/* Decoding the ids of any byte string (after BOS) gives the string back:
 * every byte is either inside a piece or a byte-fallback token. */
static void encode_then_token_bytes_round_trips_random_bytes(void **state)
{
    (void)state;
    const char *files[] = {"tok512.bin", "tokenizer.bin"};
    uint64_t x = 88172645463325252ull;
    for (int f = 0; f < 2; f++) {
        tp_tokenizer *t = load(files[f]);
        for (int iter = 0; iter < 300; iter++) {
            char text[200];
            size_t len = (size_t)(iter % 200);
            for (size_t i = 0; i < len; i++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                /* mostly ASCII letters and spaces, some high bytes */
                int r = (int)(x % 100);
                text[i] = r < 70 ? "abcde fghij klmno prst uvw "[x / 100 % 27]
                                 : (char)(x / 100 % 256);
            }
            int ids[512];
            size_t n;
            encode_ok(t, text, len, true, ids, 512, &n);
            char got[1024];
            size_t glen = 0;
            for (size_t i = 1; i < n; i++) {
                size_t bl;
                const uint8_t *b = tp_tokenizer_token_bytes(t, ids[i - 1], ids[i], &bl);
                memcpy(got + glen, b, bl);
                glen += bl;
            }
            if (glen != len || memcmp(got, text, len))
                fail_msg("%s: round trip of %zu bytes gave %zu bytes", files[f], len, glen);
        }
        tp_tokenizer_free(t);
    }
}

/* ---- oracle: llama2.c's encode() written out plainly ---------------------
 * Linear-scan lookup over normal pieces, byte fallback to <0xNN>, then
 * rescan every adjacent pair and merge the best (first on ties). */

static int oracle_lookup(const tp_tokenizer *t, const char *s, size_t n)
{
    for (int id = 0; id < tp_tokenizer_vocab_size(t); id++) {
        size_t len;
        const char *p = tp_tokenizer_piece(t, id, &len);
        if (tp_tokenizer_token_type(t, id) == TP_TOKEN_NORMAL && len == n && !memcmp(p, s, n))
            return id;
    }
    return -1;
}

static int oracle_byte(const tp_tokenizer *t, unsigned char b)
{
    char want[8];
    snprintf(want, sizeof want, "<0x%02X>", b);
    for (int id = 0; id < tp_tokenizer_vocab_size(t); id++) {
        size_t len;
        const char *p = tp_tokenizer_piece(t, id, &len);
        if (len == 6 && !memcmp(p, want, 6))
            return id;
    }
    return tp_tokenizer_unk_id(t);
}

static size_t oracle_encode(const tp_tokenizer *t, const char *text, size_t len, int *tok)
{
    size_t n = 0;
    char buf[256];
    buf[0] = ' ';
    int sp = oracle_lookup(t, buf, 1);
    tok[n++] = sp >= 0 ? sp : oracle_byte(t, ' ');
    for (size_t i = 0; i < len;) {
        size_t j = i + 1;
        while (j < len && j - i < 4 && ((unsigned char)text[j] & 0xC0) == 0x80)
            j++;
        int id = oracle_lookup(t, text + i, j - i);
        if (id >= 0)
            tok[n++] = id;
        else
            for (size_t k = i; k < j; k++)
                tok[n++] = oracle_byte(t, (unsigned char)text[k]);
        i = j;
    }
    for (;;) {
        float best = -1e10f;
        int best_id = -1;
        size_t best_i = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            size_t a, b;
            const char *pa = tp_tokenizer_piece(t, tok[i], &a);
            const char *pb = tp_tokenizer_piece(t, tok[i + 1], &b);
            if (a + b > sizeof buf)
                continue;
            memcpy(buf, pa, a);
            memcpy(buf + a, pb, b);
            int id = oracle_lookup(t, buf, a + b);
            if (id >= 0 && tp_tokenizer_score(t, id) > best) {
                best = tp_tokenizer_score(t, id);
                best_id = id;
                best_i = i;
            }
        }
        if (best_id < 0)
            return n;
        tok[best_i] = best_id;
        memmove(tok + best_i + 1, tok + best_i + 2, sizeof *tok * (n - best_i - 2));
        n--;
    }
}

static void compare_with_oracle(const tp_tokenizer *t, const char *alphabet, int iters,
                                uint64_t seed)
{
    size_t na = strlen(alphabet);
    for (int iter = 0; iter < iters; iter++) {
        char text[64];
        size_t len = (size_t)(iter % 40);
        for (size_t i = 0; i < len; i++) {
            seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
            text[i] = alphabet[seed % na];
        }
        int got[160], want[160];
        size_t n;
        if (len == 0)
            continue;
        encode_ok(t, text, len, false, got, 160, &n);
        size_t nw = oracle_encode(t, text, len, want);
        char msg[128];
        snprintf(msg, sizeof msg, "text '%.*s'", (int)len, text);
        assert_ids(got, n, want, nw, msg);
    }
}

static void encode_equals_plain_llama2c_merge_loop_on_tok512(void **state)
{
    (void)state;
    tp_tokenizer *t = load("tok512.bin");
    compare_with_oracle(t, "abcdehilmnorstuwy  .,'\n\xc3\xa9", 300, 99);
    tp_tokenizer_free(t);
}

/* Equal scores everywhere: only the leftmost-first rule decides. */
static void encode_breaks_score_ties_leftmost_first(void **state)
{
    (void)state;
    const char *pieces[] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81", "a", "b", "ab", "ba",
                            "aba", "bab", "\xe2\x96\x81" "a", "\xe2\x96\x81" "b", "abab"};
    enum { N = sizeof pieces / sizeof *pieces };
    size_t lens[N];
    float scores[N] = {0};
    for (int i = 0; i < N; i++)
        lens[i] = strlen(pieces[i]);
    tp_tokenizer *t = NULL;
    tp_err err;
    assert_int_equal(tp_tokenizer_from_vocab(pieces, lens, scores, NULL, N, 1, 2, &t, &err), 0);
    int ids[16];
    size_t n;
    encode_ok(t, "bab", 3, false, ids, 16, &n);
    /* " ","b","a","b": " b" is the leftmost pair and wins; then " b"+"a"
     * is not a piece, "ab" is */
    assert_ids(ids, n, (int[]){11, 6}, 2, "bab");
    compare_with_oracle(t, "ab ", 400, 7);
    tp_tokenizer_free(t);
}

/* ---- special tokens ---------------------------------------------------- */

/* A small SentencePiece vocabulary with user-defined and control tokens. */
static tp_tokenizer *special_vocab(int add_bos, int add_eos)
{
    static const char *const pieces[] = {"<unk>", "<s>", "</s>", "a", "b", "c", "z", "\xe2\x96\x81",
                                         "ab", "abc", "<|x|>", "<|im_end|>", "<0x3C>"};
    const int32_t types[] = {2, 3, 3, 1, 1, 1, 1, 1, 4, 4, 3, 1, 6};
    enum { N = sizeof pieces / sizeof pieces[0] };
    size_t lens[N];
    for (int i = 0; i < N; i++)
        lens[i] = strlen(pieces[i]);
    tp_vocab_spec v = {.kind = TP_TOKENIZER_SPM, .n = N, .pieces = pieces, .lens = lens, .types = types,
                       .bos_id = 1, .eos_id = 2, .unk_id = 0, .eot_id = -1, .eom_id = -1,
                       .add_bos = add_bos, .add_eos = add_eos, .add_space_prefix = 0};
    tp_tokenizer *t;
    tp_err e;
    if (tp_tokenizer_new(&v, &t, &e))
        fail_msg("special vocab: %s", e.msg);
    return t;
}

static void user_defined_tokens_are_matched_whole_longest_first(void **state)
{
    (void)state;
    tp_tokenizer *t = special_vocab(-1, -1);
    int ids[32];
    size_t n;
    tp_err e;
    /* "abc" (9) is cut before "ab" (8); a/b/c alone would merge nowhere */
    assert_int_equal(tp_tokenizer_encode_ex(t, "zabcab", 6, 0, ids, 32, &n, &e), 0);
    const int want[] = {6, 9, 8};
    assert_int_equal(n, 3);
    assert_memory_equal(ids, want, sizeof want);
    tp_tokenizer_free(t);
}

static void control_tokens_are_parsed_only_when_asked(void **state)
{
    (void)state;
    tp_tokenizer *t = special_vocab(-1, -1);
    int ids[32];
    size_t n;
    tp_err e;
    assert_int_equal(tp_tokenizer_encode_ex(t, "a<|x|>", 6, TP_ENCODE_SPECIAL, ids, 32, &n, &e), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ids[1], 10);
    assert_int_equal(tp_tokenizer_encode_ex(t, "a<|x|>", 6, 0, ids, 32, &n, &e), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_not_equal(ids[i], 10); /* plain text: '<' by its byte token, ... */
    assert_int_equal(ids[1], 12);
    assert_int_equal(tp_tokenizer_control_id(t, "<|x|>", 5), 10);
    assert_int_equal(tp_tokenizer_control_id(t, "ab", 2), -1); /* user-defined renders its text */
    tp_tokenizer_free(t);
}

static void bos_and_eos_follow_the_vocabulary_flags(void **state)
{
    (void)state;
    int ids[32];
    size_t n;
    tp_err e;
    tp_tokenizer *t = special_vocab(0, 1);
    assert_int_equal(tp_tokenizer_encode_ex(t, "z", 1, TP_ENCODE_ADD_SPECIAL, ids, 32, &n, &e), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 6);
    assert_int_equal(ids[1], 2);
    tp_tokenizer_free(t);
    t = special_vocab(-1, -1); /* SentencePiece default: BOS, no EOS */
    assert_true(tp_tokenizer_add_bos(t));
    assert_false(tp_tokenizer_add_eos(t));
    assert_int_equal(tp_tokenizer_encode_ex(t, "z", 1, TP_ENCODE_ADD_SPECIAL, ids, 32, &n, &e), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 1);
    tp_tokenizer_free(t);
}

static void end_of_turn_texts_join_the_end_of_generation_ids(void **state)
{
    (void)state;
    tp_tokenizer *t = special_vocab(-1, -1);
    const int32_t *eog;
    int n = tp_tokenizer_eog_ids(t, &eog);
    assert_int_equal(n, 2);
    assert_int_equal(eog[0], 2);  /* eos */
    assert_int_equal(eog[1], 11); /* <|im_end|>, a normal token in the file */
    assert_int_equal(tp_tokenizer_token_type(t, 11), TP_TOKEN_CONTROL);
    size_t k;
    tp_tokenizer_token_bytes(t, -1, 11, &k);
    assert_int_equal(k, 0);
    int merged[8];
    const int model_eos[] = {1, 2};
    assert_int_equal(tp_tokenizer_merge_eog(t, model_eos, 2, merged, 8), 3);
    assert_int_equal(merged[2], 11);
    tp_tokenizer_free(t);
}

/* gpt-oss's harmony vocabulary: <|return|> and <|call|> end generation,
 * <|end|> only a message (the answer follows the analysis), and it and the
 * frame's tokens render as their text, as llama.cpp's load_vocab makes
 * them; the same texts in a vocabulary without <|return|> / <|call|>
 * (Phi-3's <|end|>) keep ending generation. */
static void harmony_frame_tokens_render_and_only_return_and_call_end(void **state)
{
    (void)state;
    const char *pieces[] = {"a", "b", "<|return|>", "<|call|>", "<|end|>", "<|channel|>", "<|message|>", "<|start|>",
                            "<|constrain|>"};
    enum { N = sizeof pieces / sizeof pieces[0] };
    size_t lens[N];
    int32_t types[N];
    for (int i = 0; i < N; i++) {
        lens[i] = strlen(pieces[i]);
        types[i] = i < 2 ? TP_TOKEN_NORMAL : TP_TOKEN_CONTROL;
    }
    for (int harmony = 0; harmony < 2; harmony++) {
        /* without harmony: <|return|> and <|call|> are plain tokens */
        tp_vocab_spec v = {.kind = TP_TOKENIZER_BPE, .n = N, .pieces = pieces, .lens = lens,
                           .types = types, .bos_id = -1, .eos_id = 2, .unk_id = -1, .eot_id = -1, .eom_id = -1,
                           .add_bos = 0, .add_eos = 0};
        const char *alt[N];
        memcpy(alt, pieces, sizeof alt);
        if (!harmony)
            alt[3] = "<|calls|>";
        v.pieces = alt;
        size_t alens[N];
        for (int i = 0; i < N; i++)
            alens[i] = strlen(alt[i]);
        v.lens = alens;
        tp_tokenizer *t;
        tp_err e;
        assert_int_equal(tp_tokenizer_new(&v, &t, &e), 0);
        const int32_t *eog;
        int n = tp_tokenizer_eog_ids(t, &eog);
        bool end_ends = false, call_ends = false;
        for (int i = 0; i < n; i++) {
            end_ends |= eog[i] == 4;
            call_ends |= eog[i] == 3;
        }
        assert_int_equal(end_ends, !harmony);
        assert_int_equal(call_ends, harmony);
        size_t k;
        for (int id = 4; id < N; id++) {
            const uint8_t *b = tp_tokenizer_token_bytes(t, -1, id, &k);
            if (harmony && (k != lens[id] || memcmp(b, pieces[id], k)))
                fail_msg("%s renders as %zu bytes", pieces[id], k);
            if (!harmony && id == 4)
                assert_int_equal(k, 0);
        }
        tp_tokenizer_free(t);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(load_tok512_has_llama2c_special_tokens),
        cmocka_unit_test(harmony_frame_tokens_render_and_only_return_and_call_end),
        cmocka_unit_test(longest_prompt_fits_one_tokenized_reply),
        cmocka_unit_test(load_llama2_tokenizer_infers_32000_tokens),
        cmocka_unit_test(load_rejects_truncated_file_naming_the_token),
        cmocka_unit_test(load_rejects_bad_lengths),
        cmocka_unit_test(load_rejects_vocab_size_that_disagrees_with_file),
        cmocka_unit_test(load_names_missing_file),
        cmocka_unit_test(token_bytes_of_byte_tokens_are_the_raw_byte),
        cmocka_unit_test(token_bytes_of_control_tokens_are_empty),
        cmocka_unit_test(token_bytes_drop_leading_space_only_after_bos),
        cmocka_unit_test(from_vocab_maps_meta_space_and_follows_types),
        cmocka_unit_test(from_vocab_rejects_bad_types_and_ids),
        cmocka_unit_test(encode_once_upon_a_time_like_run_c),
        cmocka_unit_test(encode_empty_text_gives_only_bos),
        cmocka_unit_test(encode_falls_back_to_bytes_for_unknown_characters),
        cmocka_unit_test(encode_reports_too_small_output),
        cmocka_unit_test(encode_matches_llama_cpp_spm_vectors),
        cmocka_unit_test(encode_matches_llama_cpp_vectors_via_gguf_spelling),
        cmocka_unit_test(encode_then_token_bytes_round_trips_random_bytes),
        cmocka_unit_test(encode_equals_plain_llama2c_merge_loop_on_tok512),
        cmocka_unit_test(encode_breaks_score_ties_leftmost_first),
        cmocka_unit_test(user_defined_tokens_are_matched_whole_longest_first),
        cmocka_unit_test(control_tokens_are_parsed_only_when_asked),
        cmocka_unit_test(bos_and_eos_follow_the_vocabulary_flags),
        cmocka_unit_test(end_of_turn_texts_join_the_end_of_generation_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
