/* libFuzzer target: every protocol decoder on arbitrary frames.
 *
 * Input layout: byte 0 picks the family (JOB1, WRK1, EVT1); then frames,
 * each a 2-byte little-endian length and that many bytes (cut at the end
 * of the input). Each frame is copied to its own heap block so ASan sees
 * any read past a frame. Property checked: whatever decodes re-encodes
 * (the encoder accepts everything the decoder produced) and decodes again
 * to the same command. */
#include <msgpack.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../protocol/schema.h"
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

/* Objects and container depth of an unpacked value (depth 0 = scalar). */
static void measure(const msgpack_object *o, size_t *objects, int depth, int *max_depth)
{
    ++*objects;
    if (o->type == MSGPACK_OBJECT_ARRAY || o->type == MSGPACK_OBJECT_MAP) {
        if (depth + 1 > *max_depth)
            *max_depth = depth + 1;
        bool map = o->type == MSGPACK_OBJECT_MAP;
        uint32_t n = map ? o->via.map.size : o->via.array.size;
        for (uint32_t i = 0; i < n; i++) {
            if (map) {
                measure(&o->via.map.ptr[i].key, objects, depth + 1, max_depth);
                measure(&o->via.map.ptr[i].val, objects, depth + 1, max_depth);
            } else {
                measure(&o->via.array.ptr[i], objects, depth + 1, max_depth);
            }
        }
    }
}

/* The pre-scan agrees with msgpack-c: it accepts exactly the buffers that
 * hold one complete msgpack value and nothing else, within the caps. Only
 * run on small inputs: msgpack-c itself allocates from declared counts. */
static void prescan_matches_msgpack_c(const uint8_t *p, size_t n)
{
    if (n > 4096)
        return;
    tp_err e;
    int pre = mp_prescan(p, n, &e);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    bool ok = false;
    if (pre == 0) {
        /* the pre-scan bounded every count by the bytes present: safe to unpack */
        ok = msgpack_unpack_next(&u, (const char *)p, n, &off) == MSGPACK_UNPACK_SUCCESS && off == n;
        if (!ok)
            abort(); /* pre-scan accepted what msgpack-c cannot read */
        size_t objects = 0;
        int depth = 0;
        measure(&u.data, &objects, 0, &depth);
        if (objects > TP_PROTO_MAX_OBJECTS || depth > TP_PROTO_MAX_DEPTH)
            abort(); /* pre-scan let a cap through */
    }
    msgpack_unpacked_destroy(&u);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    prescan_matches_msgpack_c(data + 1, size - 1);
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
