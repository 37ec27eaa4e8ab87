/* tokenizer.bin or GGUF vocabulary -> tp_tokenizer (see tokload.h). */
#include "tokload.h"

int tools_tokenizer_open(const char *path, tp_tokenizer **out, tp_err *err)
{
    return tp_tokenizer_open(path, 0, out, err);
}
