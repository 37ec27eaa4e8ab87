/* tokpipe grammar: compile a JSON schema, JSON mode, a regex or a GBNF file
 * the way the daemon does at SUBMIT, and print the GBNF (or the error). */
#include "tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/grammar.h"
#include "tokpipe/jschema.h"

const char cmd_grammar_summary[] = "compile a JSON schema, JSON mode, regex or GBNF and print the grammar (debugging)";

static const char usage_text[] =
    "usage: tokpipe grammar (--json-schema FILE | --json-mode | --regex RE | --grammar FILE)\n"
    "                       [--max-schema-bytes N] [--max-depth N] [--max-gbnf-bytes N] [--stats]\n"
    "\n"
    "Compiles one constraint exactly as a SUBMIT with json_schema / json_mode /\n"
    "grammar would (then through the grammar engine's compiler, default limits),\n"
    "and prints the GBNF grammar (llama.cpp's dialect, start rule `root`) on\n"
    "stdout. A refused schema, regex or grammar prints the error naming the\n"
    "keyword, the line and column, the offset or the limit on stderr.\n"
    "FILE '-' reads stdin.\n"
    "\n"
    "  --json-schema FILE  a JSON Schema (Draft 2020-12 subset; see README)\n"
    "  --json-mode         any JSON object (response_format json_object)\n"
    "  --regex RE          a regular expression, matched in full (ECMA syntax)\n"
    "  --grammar FILE      a GBNF grammar: checked and printed back\n"
    "  --max-schema-bytes N, --max-depth N, --max-gbnf-bytes N\n"
    "                      the schema compiler's limits (defaults: 262144, 64, 1048576)\n"
    "  --stats             print the GBNF size and the engine's rule count on stderr\n"
    "\n"
    "example:\n"
    "  echo '{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":1}},\"required\":[\"n\"]}' \\\n"
    "    | tokpipe grammar --json-schema -\n"
    "exit status: 0 printed, 2 bad usage or a refused constraint, 1 unreadable file.\n";

static char *slurp(const char *path, size_t *len)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    while (b) {
        if (n + 1 >= cap) {
            char *nb = realloc(b, cap *= 2);
            if (!nb) {
                free(b);
                b = NULL;
                break;
            }
            b = nb;
        }
        size_t k = fread(b + n, 1, cap - n - 1, f);
        if (!k) break;
        n += k;
    }
    if (b && ferror(f)) {
        free(b);
        b = NULL;
    }
    if (f != stdin) fclose(f);
    if (b) b[n] = 0;
    *len = n;
    return b;
}

static int num_arg(const char *flag, const char *v, long long min, long long *out)
{
    char *end;
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || x < min) {
        fprintf(stderr, "tokpipe grammar: %s: expected an integer >= %lld, got '%s'\n", flag, min, v);
        return -1;
    }
    *out = x;
    return 0;
}

int cmd_grammar(int argc, char **argv)
{
    const char *schema = NULL, *regex = NULL, *gfile = NULL;
    int json_mode = 0, modes = 0, stats = 0;
    tp_jschema_opts o;
    tp_jschema_opts_default(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long long v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage_text, stdout);
            return 0;
        } else if (!strcmp(a, "--stats")) {
            stats = 1;
        } else if (!strcmp(a, "--json-mode")) {
            json_mode = 1, modes++;
        } else if (i + 1 < argc && !strcmp(a, "--json-schema")) {
            schema = argv[++i], modes++;
        } else if (i + 1 < argc && !strcmp(a, "--regex")) {
            regex = argv[++i], modes++;
        } else if (i + 1 < argc && !strcmp(a, "--grammar")) {
            gfile = argv[++i], modes++;
        } else if (i + 1 < argc && !strcmp(a, "--max-schema-bytes")) {
            if (num_arg(a, argv[++i], 1, &v)) return 2;
            o.max_schema_bytes = (size_t)v;
        } else if (i + 1 < argc && !strcmp(a, "--max-depth")) {
            if (num_arg(a, argv[++i], 1, &v) || v > 100000) return 2;
            o.max_depth = (int)v;
        } else if (i + 1 < argc && !strcmp(a, "--max-gbnf-bytes")) {
            if (num_arg(a, argv[++i], 64, &v)) return 2;
            o.max_gbnf_bytes = (size_t)v;
        } else {
            fprintf(stderr, "tokpipe grammar: unknown or incomplete argument '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (modes != 1) {
        fprintf(stderr, "tokpipe grammar: give exactly one of --json-schema, --json-mode, --regex, --grammar (see --help)\n");
        return 2;
    }
    tp_err err = {0};
    char *out = NULL, *text = NULL;
    size_t len = 0;
    int rc;
    const char *path = schema ? schema : gfile;
    if (path && !(text = slurp(path, &len))) {
        fprintf(stderr, "tokpipe grammar: cannot read '%s'\n", path);
        return 1;
    }
    if (json_mode) rc = tp_jschema_json_mode_gbnf(&out, &err);
    else if (regex) rc = tp_regex_to_gbnf(regex, strlen(regex), &o, &out, &err);
    else if (schema) rc = tp_jschema_to_gbnf(text, len, &o, &out, &err);
    else {
        rc = 0;
        out = text;
        text = NULL;
    }
    free(text);
    tp_grammar *g = NULL;
    if (!rc && (rc = tp_grammar_compile(out, strlen(out), NULL, &g, &err)))
        free(out);
    if (rc) {
        fprintf(stderr, "tokpipe grammar: %s\n", err.msg);
        return 2;
    }
    if (stats)
        fprintf(stderr, "tokpipe grammar: %zu bytes of GBNF, %d rules in the engine\n", strlen(out),
                tp_grammar_n_rules(g));
    tp_grammar_free(g);
    fputs(out, stdout);
    size_t n = strlen(out);
    if (n && out[n - 1] != '\n') fputc('\n', stdout);
    free(out);
    return 0;
}
