/* Numbers that more than one layer reads: the defaults and bounds of job
 * parameters and grammars that the config's keys also set (config/ reads
 * them here, below the stages that enforce them). Each is documented with
 * its key in config/tokpipe.yaml. */
#ifndef TOKPIPE_LIMITS_H
#define TOKPIPE_LIMITS_H

/* Penalties' look-back (generation.penalty_window, limits.max_penalty_window). */
#define TP_SAMPLER_DEFAULT_PENALTY_WINDOW 64 /* llama.cpp's repeat_last_n */
#define TP_SAMPLER_MAX_PENALTY_WINDOW (1 << 20)

/* Defaults of tp_grammar_limits and tp_gengine_limits (the grammar.* keys). */
#define TP_GRAMMAR_DEFAULT_MAX_BYTES (256u * 1024)  /* GBNF text */
#define TP_GRAMMAR_DEFAULT_MAX_RULES 4096           /* rules after lowering */
#define TP_GRAMMAR_DEFAULT_MAX_NESTING 64           /* parentheses */
#define TP_GRAMMAR_DEFAULT_MAX_ELEMENTS (1u << 20)  /* lowered elements (repetition expands) */
#define TP_GRAMMAR_DEFAULT_MAX_REPEAT 10000         /* m and n of {m,n} */
#define TP_GRAMMAR_DEFAULT_COMPILE_MS 200           /* compile wall time */
#define TP_GRAMMAR_DEFAULT_MAX_STATES 65536         /* DFA states per engine */
#define TP_GRAMMAR_DEFAULT_MASK_MB 64               /* mask cache per engine */

#endif
