/* Speculative decoding's guesser and controller (tokpipe/spec.h). */
#include "tokpipe/spec.h"

#include <string.h>

const char *tp_spec_mode_name(tp_spec_mode m)
{
    switch (m) {
    case TP_SPEC_OFF: return "off";
    case TP_SPEC_NGRAM: return "ngram";
    case TP_SPEC_DRAFT: return "draft";
    }
    return "?";
}

int tp_spec_mode_parse(const char *name, tp_spec_mode *out, tp_err *err)
{
    const tp_spec_mode all[] = {TP_SPEC_OFF, TP_SPEC_NGRAM, TP_SPEC_DRAFT};
    for (size_t i = 0; name && i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(name, tp_spec_mode_name(all[i]))) {
            *out = all[i];
            return 0;
        }
    return tp_err_set(err, TP_EINVAL, "speculative mode '%s' is not off, ngram or draft", name ? name : "(null)");
}

size_t tp_ngram_guess(const int32_t *ids, size_t n, size_t max_out, int32_t *out)
{
    if (n < TP_SPEC_NGRAM_MIN + 1 || max_out == 0)
        return 0;
    /* e: the last index of an earlier occurrence; its match length is how
     * far ids[.. e] and ids[.. n-1] agree going back. Scanning e down
     * finds the most recent of the longest first. */
    size_t best = 0, best_e = 0;
    for (size_t e = n - 1; e-- > 0;) {
        size_t l = 0;
        while (l < TP_SPEC_NGRAM_MAX && l <= e && ids[e - l] == ids[n - 1 - l])
            l++;
        if (l > best) {
            best = l;
            best_e = e;
            if (l == TP_SPEC_NGRAM_MAX)
                break;
        }
    }
    if (best < TP_SPEC_NGRAM_MIN)
        return 0;
    /* ids[n + t] is guessed as ids[n + t - d], d the distance between the
     * two occurrences; past the known tokens that is a guess itself */
    size_t d = n - 1 - best_e;
    for (size_t t = 0; t < max_out; t++)
        out[t] = t < d ? ids[n + t - d] : out[t - d];
    return max_out;
}

void tp_spec_init(tp_spec *s, int n_max)
{
    memset(s, 0, sizeof *s);
    if (n_max < 0)
        n_max = 0;
    s->n_max = n_max > TP_SPEC_MAX_DRAFT ? TP_SPEC_MAX_DRAFT : n_max;
    s->k = s->n_max < 4 ? s->n_max : 4;
    s->pause = TP_SPEC_PAUSE_MIN;
}

int tp_spec_want(tp_spec *s, int batch_decoding, int room)
{
    if (s->n_max <= 0 || batch_decoding > TP_SPEC_BATCH_MAX || room <= 0)
        return 0;
    if (s->wait > 0) {
        s->wait--;
        return 0;
    }
    return s->k < room ? s->k : room;
}

void tp_spec_result(tp_spec *s, int drafted, int accepted)
{
    if (drafted <= 0)
        return;
    s->drafted += (uint64_t)drafted;
    s->accepted += (uint64_t)accepted;
    s->verifies++;
    if (accepted == drafted) {
        /* all taken: ask for more next time */
        s->k = s->k * 2 < s->n_max ? s->k * 2 : s->n_max;
        s->pause = TP_SPEC_PAUSE_MIN;
    } else if (accepted > 0) {
        s->k = accepted + 1 < s->n_max ? accepted + 1 : s->n_max;
        s->pause = TP_SPEC_PAUSE_MIN;
    } else {
        /* nothing taken: one guess at most, after a pause that doubles
         * while the tries keep failing */
        s->k = 1;
        s->wait = s->pause;
        s->pause = s->pause * 2 < TP_SPEC_PAUSE_MAX ? s->pause * 2 : TP_SPEC_PAUSE_MAX;
    }
}
