/* The config's grammar.* keys as the compiler's and the engine's limits. */
#include "tokpipe/config.h"
#include "tokpipe/grammar.h"

void tp_grammar_limits_from_config(const tp_config *c, tp_grammar_limits *gl, tp_gengine_limits *el)
{
    tp_grammar_limits_default(gl);
    gl->max_bytes = (size_t)c->grammar_max_bytes;
    gl->max_rules = c->grammar_max_rules;
    gl->max_compile_ms = c->grammar_max_compile_ms;
    if (el) {
        tp_gengine_limits_default(el);
        el->max_states = c->grammar_max_states;
        el->mask_bytes = (size_t)c->grammar_mask_cache_mb << 20;
    }
}
