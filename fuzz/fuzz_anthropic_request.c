/* libFuzzer target: the gateway's Anthropic Messages decoder (JSON -> the
 * chat job's request, http/anthropic.c). Property: any body either
 * decodes into a conversation the protocol encoder can carry in a SUBMIT
 * (with tools, a tool choice and count_tokens' one token as asked), or is
 * refused with a status and a message. */
#include <stdint.h>
#include <string.h>

#include "../http/gw.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (int count = 0; count <= 1; count++) {
        oai_request r;
        oai_error e;
        if (gw_anthropic_decode(count, (const char *)data, size, &r, &e)) {
            if (!e.status || !e.message[0])
                __builtin_trap();   /* a refusal must say why */
            continue;
        }
        if (r.kind != OAI_CHAT || r.n != 1 || !r.n_messages || r.n_prompts || r.logprobs ||
            !(r.params.set & TP_P_MAX_TOKENS) || (count && (r.stream || r.params.max_tokens != 1)))
            __builtin_trap();
        tp_msg m;
        tp_msg_init(&m, TP_FAM_JOB, TP_CMD_SUBMIT);
        m.submit.job_id = tp_str_of("fuzz-1");
        m.submit.messages = r.messages;
        m.submit.n_messages = r.n_messages;
        m.submit.tools = r.tools;
        if (r.tool_choice)
            m.submit.tool_choice = tp_str_of(r.tool_choice);
        if (r.tool_choice_name)
            m.submit.tool_choice_name = tp_str_of(r.tool_choice_name);
        m.submit.params = r.params;
        tp_wire w;
        tp_err err;
        if (tp_proto_encode(&m, &w, &err) == 0)
            tp_wire_free(&w);
        oai_request_free(&r);
    }
    return 0;
}
