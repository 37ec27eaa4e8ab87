/* Tokenize stage glue: TOKENIZE {slot, text, add_bos, parse_special} ->
 * TOKENIZED + ids. */
#include <stdlib.h>

#include "tokpipe/stage.h"

struct tp_tokenize_stage {
    const tp_tokenizer *tok;
    int *ids;          /* scratch, grown to the longest prompt seen */
    size_t cap;
};

int tp_tokenize_stage_new(const tp_tokenizer *tok, tp_tokenize_stage **out, tp_err *err)
{
    tp_tokenize_stage *st = calloc(1, sizeof *st);
    if (!st)
        return tp_err_set(err, TP_ENOMEM, "tokenize stage: out of memory");
    st->tok = tok;
    *out = st;
    return 0;
}

void tp_tokenize_stage_free(tp_tokenize_stage *st)
{
    if (!st)
        return;
    free(st->ids);
    free(st);
}

static int reply_error(const tp_msg *m, const tp_stage_io *io, uint32_t status, const char *msg)
{
    tp_msg r;
    tp_msg_init_reply(&r, m, TP_CMD_TOKENIZED, status, msg);
    r.tokenized.slot = m->tokenize.slot;
    return io->reply(io->ctx, &r);
}

int tp_tokenize_stage_handle(tp_tokenize_stage *st, const tp_msg *m, const tp_stage_io *io)
{
    if (m->cmd != TP_CMD_TOKENIZE)
        return TP_ENOTFOUND;
    const tp_m_tokenize *t = &m->tokenize;
    size_t need = tp_tokenizer_max_ids(t->text.len);
    if (need > st->cap) {
        int *n = realloc(st->ids, need * sizeof *n);
        if (!n)
            return reply_error(m, io, TP_ST_INTERNAL, "tokenize: out of memory");
        st->ids = n;
        st->cap = need;
    }
    size_t n_ids = 0;
    tp_err e;
    tp_err_clear(&e);
    unsigned flags = (t->add_bos ? TP_ENCODE_ADD_SPECIAL : 0) | (t->parse_special ? TP_ENCODE_SPECIAL : 0);
    if (tp_tokenizer_encode_ex(st->tok, t->text.ptr, t->text.len, flags, st->ids, st->cap, &n_ids, &e))
        return reply_error(m, io, TP_ST_BAD_REQUEST, e.msg);
    /* e.g. no BOS asked for and only bytes the vocabulary has no token for:
     * there would be nothing to run the model on */
    if (n_ids == 0)
        return reply_error(m, io, TP_ST_BAD_REQUEST, "prompt: encodes to no tokens");
    tp_msg r;
    tp_msg_init_reply(&r, m, TP_CMD_TOKENIZED, TP_ST_OK, NULL);
    r.tokenized.slot = t->slot;
    /* int and int32_t are the same width on every platform we build for */
    r.tokenized.ids = (tp_raw){st->ids, n_ids};
    return io->reply(io->ctx, &r);
}
