/* tokpipe stopcheck: run stop cases (JSON lines) through the real stop stage.
 * The case format lives with the code that reads it: tokpipe/stopcheck.h. */
#include "tools.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/stopcheck.h"
#include "tokpipe/tokenizer.h"

const char cmd_stopcheck_summary[] = "check stop strings/ids offline: JSON cases on stdin, results on stdout";

static const char usage_text[] =
    "usage: tokpipe stopcheck [--tokenizer FILE] [--stats] < cases.jsonl\n"
    "\n"
    "Reads one JSON case per line and writes one JSON result per line, in order,\n"
    "running the same stop stage the daemon uses. Blank lines are skipped.\n"
    "\n"
    "case fields:\n"
    "  pieces          candidate tokens in order: \"text\", {\"text\": \"...\"} or\n"
    "                  {\"hex\": \"e4b8\"} (raw bytes), each with an optional \"id\"\n"
    "                  (default 1000 + index)\n"
    "  tokens          instead of pieces, with --tokenizer: real token ids\n"
    "  prompt_last_id  tokens mode: last prompt token (default BOS; decides the\n"
    "                  leading space of the first token)\n"
    "  stop            list of stop strings (tokens mode: one naming a control\n"
    "                  token, like \"</s>\", becomes a stop id)\n"
    "  stop_token_ids  list of ids that finish with stop_token\n"
    "  eos_token_id    id (or list) that finishes with eos (tokens mode default:\n"
    "                  the tokenizer's EOS)\n"
    "  ignore_eos, include_stop_str_in_output   booleans\n"
    "  min_tokens, max_tokens                   integers (default 0, no limit)\n"
    "  trace           true: add \"steps\", per candidate its id, bytes (hex),\n"
    "                  accepted, chunk and the bytes held back (hex) — shows why\n"
    "                  a stop did or did not fire (e.g. a token's leading space)\n"
    "A case that runs out of pieces before finishing is cancelled.\n"
    "\n"
    "result: {\"chunks\": [published text deltas], \"text\": final text,\n"
    "  \"finish_reason\": stop_string|stop_token|eos|length|cancelled,\n"
    "  \"matched\": stop string | id | null, \"completion_tokens\": n}\n"
    "or {\"error\": \"...\"} for a bad line (the next lines still run).\n"
    "\n"
    "example:\n"
    "  echo '{\"pieces\": [\"Hel\", \"lo wor\", \"ld\"], \"stop\": [\"o w\"]}' | tokpipe stopcheck\n"
    "  {\"chunks\":[\"Hell\"],\"text\":\"Hell\",\"finish_reason\":\"stop_string\",\"matched\":\"o w\",...}\n"
    "\n"
    "options:\n"
    "  --tokenizer FILE  llama2.c tokenizer.bin or a GGUF vocabulary (SentencePiece\n"
    "                    or byte-level BPE), enables \"tokens\"\n"
    "  --stats           print the stop counters of all cases as JSON to stderr\n"
    "exit status: 0 if every case ran, 1 if some line was an error, 2 on bad usage.\n";

struct opts {
    const char *tokenizer;
    bool stats;
};

static int parse_args(int argc, char **argv, struct opts *o)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage_text, stdout);
            return 1;
        } else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) {
            o->tokenizer = argv[++i];
        } else if (!strcmp(argv[i], "--stats")) {
            o->stats = true;
        } else {
            fprintf(stderr, "tokpipe stopcheck: unknown argument '%s' (see --help)\n", argv[i]);
            return 2;
        }
    }
    return 0;
}

static bool blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strchr(" \t\r\n", s[i])) return false;
    return true;
}

/* One line in, one line out; returns 1 if the case was an error, -1 when
 * out of memory. */
static int run_line(const char *line, size_t n, const tp_tokenizer *tok, tp_stop_stats *stats)
{
    bool failed;
    char *out = tp_stopcheck_case(line, n, tok, stats, &failed);
    if (!out) return -1;
    puts(out);
    free(out);
    return failed;
}

static int run_all(const tp_tokenizer *tok, tp_stop_stats *stats)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int status = 0;
    while ((n = getline(&line, &cap, stdin)) >= 0) {
        if (blank(line, (size_t)n)) continue;
        int rc = run_line(line, (size_t)n, tok, stats);
        if (rc < 0) {
            fprintf(stderr, "tokpipe stopcheck: out of memory\n");
            status = 1;
            break;
        }
        if (rc) status = 1;
        fflush(stdout);
    }
    free(line);
    return status;
}

int cmd_stopcheck(int argc, char **argv)
{
    struct opts o = {0};
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;
    tp_tokenizer *tok = NULL;
    tp_err err;
    if (o.tokenizer && tp_tokenizer_open(o.tokenizer, 0, &tok, &err)) {
        fprintf(stderr, "tokpipe stopcheck: %s\n", err.msg);
        return 2;
    }
    tp_stop_stats stats = {0};
    int status = run_all(tok, &stats);
    if (o.stats) {
        char *js = tp_stop_stats_json(&stats);
        fprintf(stderr, "%s\n", js ? js : "{\"error\": \"out of memory\"}");
        free(js);
    }
    tp_tokenizer_free(tok);
    return status;
}
