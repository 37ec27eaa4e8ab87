/* Worker choice: which worker of a stage takes a job. The least loaded one
 * with room, the first registered on a tie. route_prefix.c, beside this
 * file, chooses a forward worker by the prefix it caches. */
#include "choose.h"
#include "registry.h"

static int pick_worker(broker *b, unsigned stage, int (*load)(const bworker *))
{
    int best = -1, best_load = 0;
    for (int i = 0; i < B_MAX_WORKERS; i++) {
        const bworker *w = &b->workers[i];
        if (!registry_usable(b, i) || !(w->stages & stage))
            continue;
        int l = load(w);
        if (l >= (int)w->capacity)
            continue;
        if (best < 0 || l < best_load) {
            best = i;
            best_load = l;
        }
    }
    return best;
}

/* A worker holding a job that lost workers before takes nothing else (a
 * crash there must not be charged to other jobs): it counts as full. */
static int load_tok(const bworker *w) { return w->tok_suspect ? (int)w->capacity : w->tok_inflight; }
static int load_smp(const bworker *w) { return w->n_smp; }
static int load_stp(const bworker *w) { return w->n_stp; }
static int load_dft(const bworker *w) { return w->n_dft; }

int choose_tokenize(broker *b, bool alone)
{
    int wi = pick_worker(b, TP_STAGE_TOKENIZE, load_tok);
    /* a job that lost workers goes to one with nothing else to do */
    return wi >= 0 && alone && b->workers[wi].tok_inflight > 0 ? -1 : wi;
}

bool choose_forward_can_take(broker *b, int i)
{
    const bworker *w = &b->workers[i];
    int cap = (int)w->capacity < b->cfg->max_num_seqs ? (int)w->capacity : b->cfg->max_num_seqs;
    /* one stepping a suspect alone computes nothing else meanwhile */
    return registry_usable(b, i) && (w->stages & TP_STAGE_FORWARD) && w->n_fwd < cap && !w->step_suspect;
}

int choose_forward(broker *b)
{
    int best = -1, best_load = 0;
    for (int i = 0; i < B_MAX_WORKERS; i++) {
        const bworker *w = &b->workers[i];
        if (!choose_forward_can_take(b, i))
            continue;
        if (best < 0 || w->n_fwd < best_load) {
            best = i;
            best_load = w->n_fwd;
        }
    }
    return best;
}

int choose_stop(broker *b)
{
    return pick_worker(b, TP_STAGE_STOP, load_stp);
}

int choose_draft(broker *b)
{
    return pick_worker(b, TP_STAGE_DRAFT, load_dft);
}

/* The sampler of a job on forward worker f: f itself when it samples in
 * process, else the least loaded sample worker. */
int choose_sample(broker *b, int f)
{
    return (b->workers[f].stages & TP_STAGE_SAMPLE) ? f : pick_worker(b, TP_STAGE_SAMPLE, load_smp);
}
