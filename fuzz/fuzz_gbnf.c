/* libFuzzer target for the GBNF compiler and, on what compiles, the
 * runtime: any bytes as grammar text, under small limits (so a case costs
 * milliseconds, as the broker's limits bound a real one). A compiled
 * grammar then gets a matcher over a 256-byte vocabulary plus an EOS and
 * two named control tokens (257 <|a|>, 258 [B], for token references), and
 * a walk of masks and accepts driven by the input's own bytes. Checks,
 * beyond the sanitizers: an error always has a message, the printed
 * grammar compiles again, each mask agrees with tp_gmatch_allows, every
 * allowed token is accepted, and EOS is allowed exactly when accepting
 * (or, with token references, whenever accepting). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/grammar.h"

#define N_TOK 259
static tp_gvocab *vocab;   /* built once; the fuzzer's process is its main */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    static uint8_t bytes[256];
    const uint8_t *b[N_TOK];
    size_t l[N_TOK];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (uint8_t)i;
        b[i] = &bytes[i];
        l[i] = 1;
    }
    for (int i = 256; i < N_TOK; i++)
        b[i] = NULL, l[i] = 0;
    int eos = 256;
    const int ids[] = {257, 258};
    const char *names[] = {"<|a|>", "[B]"};
    const size_t lens[] = {5, 3};
    if (tp_gvocab_new(N_TOK, b, l, &eos, 1, &vocab, NULL) || tp_gvocab_name_tokens(vocab, 2, ids, names, lens, NULL))
        abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tp_grammar_limits lim;
    tp_grammar_limits_default(&lim);
    lim.max_bytes = 4096;
    lim.max_rules = 256;
    lim.max_elements = 20000;
    lim.max_repeat = 100;
    lim.max_nesting = 16;
    tp_grammar *g = NULL;
    tp_err err;
    tp_err_clear(&err);
    if (tp_grammar_compile((const char *)data, size, &lim, &g, &err)) {
        if (g || !err.msg[0])
            abort();
        return 0;
    }
    char *txt = tp_grammar_print(g);
    tp_grammar *g2 = NULL;
    tp_grammar_limits again;   /* the wall-clock limit is no property of the text */
    tp_grammar_limits_default(&again);
    again.max_compile_ms = 600000;
    if (!txt || tp_grammar_compile(txt, strlen(txt), &again, &g2, &err)) {
        fprintf(stderr, "printed grammar does not compile: %s\n%s\n", err.msg, txt ? txt : "(null)");
        abort();
    }
    tp_grammar_free(g2);
    free(txt);
    tp_gengine_limits el = {.max_states = 2000, .mask_bytes = 1 << 20};
    tp_gengine *e = NULL;
    tp_gmatch *m = NULL;
    if (tp_gengine_new(g, vocab, &el, &e, &err) == 0 && tp_gmatch_new(e, &m, &err) == 0) {
        uint64_t mask[5];
        /* the input's bytes pick the tokens: the k-th allowed one */
        for (size_t i = 0; i < size && i < 64 && !tp_gmatch_done(m); i++) {
            if (tp_gmatch_mask(m, mask, &err))
                break;
            int n = 0;
            for (int t = 0; t < N_TOK; t++) {
                bool bit = (mask[t / 64] >> (t % 64)) & 1;
                if (bit != tp_gmatch_allows(m, t))
                    abort();
                n += bit;
            }
            bool eos = (mask[4] & 1) != 0;
            if (tp_grammar_n_token_refs(g) ? tp_gmatch_accepting(m) && !eos : eos != tp_gmatch_accepting(m))
                abort();
            if (!n)
                break;
            int k = data[i] % n, t = 0;
            for (;; t++)
                if (((mask[t / 64] >> (t % 64)) & 1) && k-- == 0)
                    break;
            int rc = tp_gmatch_accept(m, t, &err);
            if (rc && rc != TP_ERANGE)
                abort();
            if (rc)
                break;
        }
    }
    tp_gmatch_free(m);
    tp_gengine_free(e);
    tp_grammar_free(g);
    return 0;
}
