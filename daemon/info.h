/* Model facts from the workers' READY, for INFO and admission (info.c). */
#ifndef TOKPIPED_INFO_H
#define TOKPIPED_INFO_H

#include "state.h"

void info_on_ready(broker *b, const tp_m_ready *r);
void info_reply(broker *b, uint64_t req, tp_msg *r);
/* The tool-call syntax of the model's chat template, as a tokenize worker's
 * READY said (TP_TC_NONE while none did). */
tp_tc_family info_tool_family(const broker *b);
/* The template's generation prompt opens the thinking (READY think_open). */
bool info_think_open(const broker *b);
/* The model's vocabulary as grammar token references see it: its size and
 * the special tokens INFO lists, by text (for admission). */
void info_gnames(const broker *b, tp_gnames *out);
void info_free(broker *b);

#endif
