/* libFuzzer target: any bytes as a chat template, parsed and (if it parses)
 * rendered with a fixed conversation. Beyond the sanitizers it checks that
 * a failure always says why and that a rendering respects the output cap. */
#include <cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/chat_template.h"

static cJSON *conv;   /* built once; the fuzzer's process is its main */
static cJSON *extra;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    conv = cJSON_Parse("[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                       "{\"role\":\"user\",\"content\":\"Hi <b>\\u65e5\\u672c</b>\"},"
                       "{\"role\":\"assistant\",\"content\":\"Hello\",\"tool_calls\":[{\"type\":\"function\","
                       "\"function\":{\"name\":\"f\",\"arguments\":{\"x\":1.5,\"y\":[true,null]}}}]},"
                       "{\"role\":\"user\",\"content\":\"\"}]");
    extra = cJSON_Parse("{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}]}");
    if (!conv || !extra)
        abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tp_chat_template *t = NULL;
    tp_err e;
    tp_err_clear(&e);
    if (tp_chat_template_new((const char *)data, size, &t, &e)) {
        if (!e.msg[0])
            abort();
        return 0;
    }
    tp_chat_vars v = {.messages = conv, .extra = extra, .bos_token = "<s>", .eos_token = "</s>",
                      .add_generation_prompt = size & 1, .max_output = 1 << 16};
    char *out = NULL;
    size_t len = 0;
    int rc = tp_chat_template_render(t, &v, &out, &len, &e);
    if (rc && !e.msg[0])
        abort();
    if (!rc && (len > v.max_output || strlen(out) > len))
        abort();
    free(out);
    char *end = NULL;
    if (!tp_chat_template_turn_end(t, "<s>", "</s>", &end, &e))
        free(end);
    tp_chat_template_free(t);
    return 0;
}
