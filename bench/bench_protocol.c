/* make bench: cost of the protocol codec per message (encode, which
 * re-decodes to validate, then decode) for the per-token and per-step
 * messages, against a baseline measured in the same run: the same header
 * values as a positional msgpack array (research §8's proposal), packed and
 * unpacked with msgpack-c and no validation at all. The ratio is the price
 * of string keys + strict checks; the per-step numbers compare it with a
 * ~10 µs ipc hop (DESIGN.md §6). */
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokpipe/protocol.h"
#include "support/timing.h"

#define ITEMS 64
#define VOCAB 512

static volatile uint64_t sink;

/* Encode + decode m once (what a sender and a receiver pay together). */
static void codec_once(const tp_msg *m)
{
    tp_wire w;
    tp_msg d;
    if (tp_proto_encode(m, &w, NULL) || tp_proto_decode(m->family, w.f, w.n, &d, NULL)) {
        fprintf(stderr, "bench_protocol: codec failed\n");
        exit(1);
    }
    sink += d.cmd;
    tp_msg_clear(&d);
    tp_wire_free(&w);
}

/* Baseline: n unsigned values as a msgpack array, packed and unpacked. */
static void array_once(const uint64_t *v, size_t n, const char *text)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, n + (text != NULL));
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint64(&pk, v[i]);
    if (text)
        msgpack_pack_str_with_body(&pk, text, strlen(text));
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    if (msgpack_unpack_next(&u, sb.data, sb.size, &off) != MSGPACK_UNPACK_SUCCESS)
        exit(1);
    sink += u.data.via.array.size;
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
}

typedef struct row {
    const char *name;
    tp_msg m;
    uint64_t base_vals[8];
    size_t base_n;
    const char *base_text;
} row;

static double time_codec(const row *r, int iters)
{
    double t0 = bench_now();
    for (int i = 0; i < iters; i++)
        codec_once(&r->m);
    return (bench_now() - t0) / iters * 1e9;
}

static double time_base(const row *r, int iters)
{
    double t0 = bench_now();
    for (int i = 0; i < iters; i++)
        array_once(r->base_vals, r->base_n, r->base_text);
    return (bench_now() - t0) / iters * 1e9;
}

int main(void)
{
    static uint32_t slots[ITEMS], pos[ITEMS], ntok[ITEMS];
    static uint8_t flags[ITEMS];
    static int32_t tokens[ITEMS], acc[ITEMS], id = 345;
    static float logits[ITEMS * VOCAB];
    for (int i = 0; i < ITEMS; i++)
        slots[i] = (uint32_t)i, pos[i] = 100, ntok[i] = 1, flags[i] = 1, tokens[i] = 7, acc[i] = 7;
    row rows[3];
    memset(rows, 0, sizeof rows);

    rows[0].name = "TOKEN event (per token)";
    tp_msg_init(&rows[0].m, TP_FAM_EVT, TP_CMD_TOKEN);
    rows[0].m.token = (tp_m_token){.job_id = tp_str_of("g-1234-abcdef01-0"), .seq = 17, .index = 16,
                                   .text = tp_str_of(" dragon"), .ids = {&id, 1}};
    rows[0].base_n = 3, rows[0].base_vals[0] = 17, rows[0].base_vals[1] = 16, rows[0].base_text = " dragon";

    rows[1].name = "STEP, 64 decode items";
    tp_msg_init(&rows[1].m, TP_FAM_WRK, TP_CMD_STEP);
    rows[1].m.task = 99;
    rows[1].m.step = (tp_m_step){.step = 5, .n = ITEMS, .n_tokens = ITEMS, .slots = {slots, ITEMS},
                                 .pos = {pos, ITEMS}, .ntok = {ntok, ITEMS}, .flags = {flags, ITEMS},
                                 .tokens = {tokens, ITEMS}, .accepted = {acc, ITEMS}};
    rows[1].base_n = 5, rows[1].base_vals[0] = 99, rows[1].base_vals[1] = 5, rows[1].base_vals[2] = ITEMS;

    rows[2].name = "STEP_RESULT, 64x512 logits";
    tp_msg_init(&rows[2].m, TP_FAM_WRK, TP_CMD_STEP_RESULT);
    rows[2].m.task = 99, rows[2].m.status = 200;
    rows[2].m.step_result = (tp_m_step_result){.step = 5, .n = ITEMS, .vocab = VOCAB, .slots = {slots, ITEMS},
                                               .out = {logits, ITEMS * VOCAB}};
    rows[2].base_n = 6, rows[2].base_vals[0] = 99, rows[2].base_vals[3] = ITEMS, rows[2].base_vals[4] = VOCAB;

    printf("%-28s %14s %18s %8s\n", "message", "codec ns/msg", "array-hdr ns/msg", "ratio");
    for (int k = 0; k < 3; k++) {
        const int iters = 200000;
        time_codec(&rows[k], iters / 10); /* warm up */
        time_base(&rows[k], iters / 10);
        double c = time_codec(&rows[k], iters), b = time_base(&rows[k], iters);
        printf("%-28s %14.0f %18.0f %7.2fx\n", rows[k].name, c, b, c / b);
    }
    printf("(codec = encode with its validating re-decode + decode, payload frames not copied;\n"
           " array-hdr = the same header values as a positional msgpack array, no validation)\n");
    return 0;
}
