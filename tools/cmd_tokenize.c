/* tokpipe tokenize: text lines -> token ids, or ids -> text with --decode. */
#include "tools.h"
#include "tokpipe/tokenizer.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char cmd_tokenize_summary[] = "encode text lines to token ids (or --decode ids to text)";

static void usage(FILE *out)
{
    fprintf(out,
            "usage: tokpipe tokenize --tokenizer FILE [--bos] [--special] [--decode]\n"
            "\n"
            "Reads lines on stdin. Without --decode each line is text (\\n, \\t and \\\\\n"
            "stand for newline, tab and backslash) and one line of space-separated\n"
            "token ids is printed for it. With --decode each line is ids and the\n"
            "text is printed, escaped the same way; the start of a line counts as\n"
            "following BOS, so decoding what tokenize printed gives the text back.\n"
            "\n"
            "  --tokenizer FILE  llama2.c tokenizer.bin, or a GGUF file with an\n"
            "                    embedded vocabulary\n"
            "  --bos             start each encoded line with the BOS id\n"
            "  --special         control-token texts (<s>, <|im_end|>, ...) become those\n"
            "                    tokens, and --decode prints control tokens as their text;\n"
            "                    without it they are plain text and decode to nothing\n"
            "                    (user-defined tokens are always matched whole)\n"
            "  --decode          ids -> text\n");
}

/* Undo the line escapes in place; returns the new length or -1 with *bad
 * set to the offending column. */
static long unescape(char *s, size_t n, size_t *bad)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\') {
            s[o++] = s[i];
            continue;
        }
        char c = i + 1 < n ? s[++i] : '\0';
        if (c == 'n')
            s[o++] = '\n';
        else if (c == 't')
            s[o++] = '\t';
        else if (c == '\\')
            s[o++] = '\\';
        else {
            *bad = i - 1;
            return -1;
        }
    }
    return (long)o;
}

static void put_escaped(const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (b[i] == '\n')
            fputs("\\n", stdout);
        else if (b[i] == '\t')
            fputs("\\t", stdout);
        else if (b[i] == '\\')
            fputs("\\\\", stdout);
        else
            putchar(b[i]);
    }
}

static int encode_line(const tp_tokenizer *tok, char *line, size_t len, long lineno, bool bos,
                       bool special)
{
    size_t bad = 0;
    long n = unescape(line, len, &bad);
    if (n < 0) {
        fprintf(stderr, "tokpipe tokenize: line %ld, column %zu: unknown escape (use \\n, \\t or "
                "\\\\)\n", lineno, bad + 1);
        return 1;
    }
    size_t cap = tp_tokenizer_max_ids((size_t)n), count = 0;
    int *ids = malloc(sizeof *ids * cap);
    if (!ids) {
        fprintf(stderr, "tokpipe tokenize: out of memory\n");
        return 1;
    }
    tp_err err;
    tp_err_clear(&err);
    unsigned flags = (bos ? TP_ENCODE_BOS : 0) | (special ? TP_ENCODE_SPECIAL : 0);
    int rc = tp_tokenizer_encode_ex(tok, line, (size_t)n, flags, ids, cap, &count, &err);
    if (rc)
        fprintf(stderr, "tokpipe tokenize: line %ld: %s\n", lineno, err.msg);
    for (size_t i = 0; !rc && i < count; i++)
        printf(i ? " %d" : "%d", ids[i]);
    if (!rc)
        putchar('\n');
    free(ids);
    return rc ? 1 : 0;
}

static int decode_line(const tp_tokenizer *tok, const char *line, long lineno, bool special)
{
    int vocab = tp_tokenizer_vocab_size(tok);
    int prev = tp_tokenizer_bos_id(tok);
    const char *p = line;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\r')
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        long id = strtol(p, &end, 10);
        if (end == p || errno || id < 0 || id >= vocab || (*end && !strchr(" \t\r", *end))) {
            int w = (int)strcspn(p, " \t\r");
            fprintf(stderr, "tokpipe tokenize: line %ld: '%.*s' is not a token id in [0, %d)\n",
                    lineno, w > 32 ? 32 : w, p, vocab);
            return 1;
        }
        size_t n;
        const uint8_t *b = tp_tokenizer_token_bytes(tok, prev, (int)id, &n);
        int type = tp_tokenizer_token_type(tok, (int)id);
        if (special && (type == TP_TOKEN_CONTROL || type == TP_TOKEN_UNKNOWN))
            b = (const uint8_t *)tp_tokenizer_piece(tok, (int)id, &n);
        put_escaped(b, n);
        prev = (int)id;
        p = end;
    }
    putchar('\n');
    return 0;
}

static int run(const tp_tokenizer *tok, bool bos, bool special, bool decode)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0;
    int rc = 0;
    while (!rc && (len = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        if (len > 0 && line[len - 1] == '\n')
            line[--len] = '\0';
        rc = decode ? decode_line(tok, line, lineno, special)
                    : encode_line(tok, line, (size_t)len, lineno, bos, special);
    }
    free(line);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "tokpipe tokenize: writing stdout: %s\n", strerror(errno));
        rc = 1;
    }
    return rc;
}

int cmd_tokenize(int argc, char **argv)
{
    const char *path = NULL;
    bool bos = false, decode = false, special = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) {
            path = argv[++i];
        } else if (!strcmp(argv[i], "--bos")) {
            bos = true;
        } else if (!strcmp(argv[i], "--special")) {
            special = true;
        } else if (!strcmp(argv[i], "--decode")) {
            decode = true;
        } else {
            fprintf(stderr, "tokpipe tokenize: unknown or incomplete option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "tokpipe tokenize: --tokenizer FILE is required\n");
        usage(stderr);
        return 2;
    }
    tp_tokenizer *tok = NULL;
    tp_err err;
    tp_err_clear(&err);
    if (tp_tokenizer_open(path, 0, &tok, &err)) {
        fprintf(stderr, "tokpipe tokenize: %s\n", err.msg);
        return 1;
    }
    int rc = run(tok, bos, special, decode);
    tp_tokenizer_free(tok);
    return rc;
}
