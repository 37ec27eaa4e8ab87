/* libFuzzer target: every protocol decoder on arbitrary frames.
 *
 * Input layout: byte 0 picks the family (JOB1, WRK1, EVT1); then frames,
 * each a 2-byte little-endian length and that many bytes (cut at the end
 * of the input). Each frame is copied to its own heap block so ASan sees
 * any read past a frame. Property checked: whatever decodes re-encodes
 * (the encoder accepts everything the decoder produced) and decodes again
 * to the same command. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/protocol.h"

#define MAX_IN_FRAMES 20

static void touch(const tp_msg *m)
{
    volatile uint8_t sink = 0;
    const tp_str none = {NULL, 0};
    bool submit = m->family == TP_FAM_JOB && m->cmd == TP_CMD_SUBMIT;
    const tp_str *strs[] = {&m->error, &m->topic, submit ? &m->submit.job_id : &none,
                            submit ? &m->submit.prompt : &none};
    if (submit)
        for (size_t i = 0; i < m->submit.params.n_stop; i++)
            if (m->submit.params.stop[i].len)
                sink ^= (uint8_t)m->submit.params.stop[i].ptr[m->submit.params.stop[i].len - 1];
    for (size_t i = 0; i < sizeof strs / sizeof *strs; i++)
        if (strs[i]->ptr && strs[i]->len)
            sink ^= (uint8_t)strs[i]->ptr[strs[i]->len - 1];
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    tp_family fam = (tp_family)(1 + data[0] % 3);
    tp_frame f[MAX_IN_FRAMES];
    void *blocks[MAX_IN_FRAMES];
    size_t n = 0, pos = 1;
    while (n < MAX_IN_FRAMES && size - pos >= 2) {
        size_t len = (size_t)data[pos] | (size_t)data[pos + 1] << 8;
        pos += 2;
        if (len > size - pos)
            len = size - pos;
        blocks[n] = malloc(len ? len : 1);
        if (!blocks[n])
            break;
        memcpy(blocks[n], data + pos, len);
        f[n] = (tp_frame){blocks[n], len};
        pos += len;
        n++;
    }
    tp_msg m;
    tp_err e;
    if (tp_proto_decode(fam, f, n, &m, &e) == 0) {
        touch(&m);
        tp_wire w;
        if (tp_proto_encode(&m, &w, &e) != 0)
            abort(); /* the decoder produced something the encoder rejects */
        tp_msg again;
        if (tp_proto_decode(fam, w.f, w.n, &again, &e) != 0 || again.cmd != m.cmd)
            abort();
        tp_msg_clear(&again);
        tp_wire_free(&w);
    }
    tp_msg_clear(&m);
    for (size_t i = 0; i < n; i++)
        free(blocks[i]);
    return 0;
}
