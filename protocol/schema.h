/* Message schemas: one table per command, read by the generic codec
 * (codec.c). Internal to protocol/. */
#ifndef TOKPIPE_PROTOCOL_SCHEMA_H
#define TOKPIPE_PROTOCOL_SCHEMA_H

#include <stddef.h>
#include <stdint.h>

#include "tokpipe/protocol.h"

typedef enum {
    FT_U32,
    FT_U64,
    FT_I32,
    FT_I64,
    FT_F64,
    FT_BOOL,
    FT_STR,      /* tp_str */
    FT_STRS,     /* tp_str * + size_t n (owned array) */
    FT_I32S,     /* int32_t * + size_t n (owned array) */
    FT_MATCHED,  /* tp_matched: str | int | nil */
    FT_REASON,   /* int: finish reason name */
    FT_STATE,    /* int: job state name */
    FT_STAGES,   /* unsigned: array of stage names -> bits */
    FT_MAP,      /* nested map, sub-table, base = field address */
    FT_TRIGGERS, /* tp_trigger * + size_t n: array of [matched, count, truncated] */
    FT_BIAS,     /* tp_logit_bias: map of token id (decimal str or int) -> number */
    FT_U64S,     /* uint64_t * + size_t n (owned array) */
    FT_MSGS,     /* tp_chat_msg * + size_t n: array of {role, content, ...} maps */
    FT_CALLS,    /* tp_tool_call * + size_t n: array of {id, name, arguments} maps */
} field_type;

enum {
    FF_REQUIRED = 1u << 0,
    FF_NONEMPTY = 1u << 1,  /* strings (and each string of FT_STRS) */
    FF_JOBID = 1u << 2,     /* string must be a job id (or empty unless FF_NONEMPTY) */
    FF_LO_OPEN = 1u << 3,   /* FT_F64: lo is exclusive */
    FF_LP_TOP_N = 1u << 4,  /* tp_lp_cols.top_n: written whenever the logprob frames are (0 included) */
    FF_ALWAYS = 1u << 5,    /* written even when 0, yet optional to read (a reply's req) */
    FF_FINISHED = 1u << 6,  /* STATUS_REPLY: written exactly when its job finished (nil, 0 included) */
};

typedef struct table table;

typedef struct field {
    const char *key;
    field_type type;
    size_t off;             /* from the table's base */
    unsigned flags;
    int64_t ilo, ihi;       /* integer range (FT_I32/I64/U32/I32S elements) */
    double flo, fhi;        /* FT_F64 range */
    size_t max;             /* strings: bytes; arrays: elements */
    size_t max_elem;        /* FT_STRS: bytes per string */
    uint32_t setbit;        /* nonzero: presence bit in the table's set word */
    const table *sub;       /* FT_MAP */
} field;

struct table {
    const field *fields;    /* terminated by key == NULL */
    long set_off;           /* offset of a uint32_t presence word, -1 none */
};

typedef struct pframe {     /* one payload frame */
    const char *name;
    size_t off;             /* tp_raw in tp_msg */
    unsigned esize;         /* bytes per element */
    unsigned optional;      /* trailing frames may be missing */
} pframe;

typedef struct mdesc {
    tp_family family;
    uint8_t cmd;
    const char *name;
    const table *hdr;       /* base = the tp_msg */
    const pframe *frames;   /* terminated by name == NULL */
    unsigned lenient;       /* unknown keys are ignored (replies, events) */
    int (*check)(tp_msg *m, tp_err *err);  /* cross-field rules after decoding */
} mdesc;

/* The rule of an FT_F64 field, on the value the engine will use: v must be
 * in range, and so must (float)v (the sampler works in float32, where
 * 1e-300 is 0 and 1e300 is infinite). Nonzero with a message otherwise. */
int schema_float_check(const field *f, double v, char *msg, size_t cap);

/* The descriptor of (family, cmd), or NULL. */
const mdesc *schema_find(tp_family family, uint8_t cmd);

/* Magic string of a family ("JOB1", ...). */
const char *schema_magic(tp_family family);

/* Name -> code: job state (-1 unknown), stage bit (-1 unknown). */
int tp_state_parse(const char *s, size_t len);
int tp_stage_parse(const char *s, size_t len);

/* Pre-scan one msgpack value (codec.c / mpscan.c): exactly one value filling
 * len bytes, every declared count within the bytes present and the caps. */
int mp_prescan(const uint8_t *p, size_t len, tp_err *err);

#endif
