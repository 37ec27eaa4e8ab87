/* libFuzzer target: the gateway's request body decoder (JSON -> SUBMIT
 * params). Property: any body either decodes into parameters the protocol
 * encoder can carry in a SUBMIT, or is refused with a status and a message. */
#include <stdint.h>
#include <string.h>

#include "../http/oai.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (int kind = OAI_COMPLETIONS; kind <= OAI_CHAT; kind++) {
        oai_request r;
        oai_error e;
        if (oai_decode((oai_kind)kind, (const char *)data, size, &r, &e)) {
            if (!e.status || !e.message[0])
                __builtin_trap();   /* a refusal must say why */
            continue;
        }
        if (r.n < 1 || (kind == OAI_COMPLETIONS && !r.n_prompts))
            __builtin_trap();
        /* logprobs reach the SUBMIT exactly as asked, within OpenAI's caps */
        if (r.params.logprobs != r.logprobs || (r.top_logprobs && !r.logprobs) || r.top_logprobs < 0 ||
            r.top_logprobs > (kind == OAI_CHAT ? OAI_MAX_CHAT_TOP_LOGPROBS : OAI_MAX_LEGACY_LOGPROBS) ||
            (r.logprobs && r.params.top_logprobs != r.top_logprobs))
            __builtin_trap();
        if (kind == OAI_CHAT) {   /* the turns as the gateway sends them */
            if (!r.n_messages)
                __builtin_trap();
            tp_msg m;
            tp_msg_init(&m, TP_FAM_JOB, TP_CMD_SUBMIT);
            m.submit.job_id = tp_str_of("fuzz-1");
            m.submit.messages = r.messages;
            m.submit.n_messages = r.n_messages;
            m.submit.params = r.params;
            tp_wire w;
            tp_err err;
            if (tp_proto_encode(&m, &w, &err) == 0)
                tp_wire_free(&w);
        }
        for (size_t i = 0; i < r.n_prompts; i++) {
            tp_msg m;
            tp_msg_init(&m, TP_FAM_JOB, TP_CMD_SUBMIT);
            m.submit.job_id = tp_str_of("fuzz-1");
            if (r.prompts[i].text)
                m.submit.prompt = (tp_str){r.prompts[i].text, r.prompts[i].text_len};
            else
                m.submit.prompt_ids = (tp_raw){r.prompts[i].ids, r.prompts[i].n_ids};
            m.submit.params = r.params;
            tp_wire w;
            tp_err err;
            if (tp_proto_encode(&m, &w, &err) == 0)   /* range errors are the broker's 400s */
                tp_wire_free(&w);
        }
        oai_request_free(&r);
    }
    return 0;
}
