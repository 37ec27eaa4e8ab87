/* A grammar vocabulary from a tokenizer file (gvocab.h). */
#include "gvocab.h"
#include "timing.h"

#include <stdio.h>

#include "tokpipe/tokenizer.h"

#define MAX_EOG 16

tp_gvocab *bench_gvocab_open(const char *name, const char *path, double *build_s)
{
    tp_tokenizer *tok;
    tp_err e;
    if (tp_tokenizer_open(path, 0, &tok, &e)) {
        printf("%s: skipped (%s)\n", name, e.msg);
        return NULL;
    }
    const int32_t *eog32;
    int n_eog = tp_tokenizer_eog_ids(tok, &eog32), eog[MAX_EOG];
    if (n_eog > MAX_EOG)
        n_eog = MAX_EOG;
    for (int i = 0; i < n_eog; i++)
        eog[i] = eog32[i];
    double t0 = bench_now();
    tp_gvocab *v = NULL;
    int rc = tp_gvocab_from_tokenizer(tok, eog, n_eog, &v, &e);
    if (build_s)
        *build_s = bench_now() - t0;
    tp_tokenizer_free(tok);
    if (rc) {
        printf("%s: skipped (%s)\n", name, e.msg);
        return NULL;
    }
    return v;
}
