/* tokpipe chat-template: render a conversation with a chat template and
 * print the prompt, for users checking what a model will be sent. */
#include "tools.h"
#include "tokpipe/chat_template.h"
#include "tokpipe/gguf.h"
#include "tokpipe/stage.h"
#include "genopts.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

const char cmd_chat_template_summary[] = "render a conversation (JSON on stdin) with a chat template";

static void usage(FILE *out)
{
    fprintf(out,
            "usage: tokpipe chat-template (--template FILE | --model FILE.gguf) [options] < conversation.json\n"
            "\n"
            "Prints the prompt the template makes of the conversation, byte for byte,\n"
            "with no newline added. The conversation is OpenAI style: a JSON array\n"
            "[{\"role\": \"user\", \"content\": \"Hi\"}, ...] or an object\n"
            "{\"messages\": [...], ...} whose other members (tools, documents,\n"
            "date_string, ...) become template variables too.\n"
            "\n"
            "  --template FILE         a Jinja chat template file\n"
            "  --model FILE            a GGUF file: its tokenizer.chat_template, and its\n"
            "                          BOS/EOS token texts as bos_token/eos_token\n"
            "  --bos-token T           bos_token (overrides the model's)\n"
            "  --eos-token T           eos_token (overrides the model's)\n"
            "  --no-generation-prompt  add_generation_prompt = false (default true)\n"
            "  --turn-end              print what the template puts after an assistant\n"
            "                          turn (the end-of-turn text) instead\n"
            "  --openai                read the conversation as an OpenAI request's\n"
            "                          {\"messages\", \"tools\"} and print what tokpiped renders\n"
            "                          for it (SUBMIT messages: content null as empty, a\n"
            "                          call's arguments as an object where the template\n"
            "                          serialises them, tools checked)\n");
}

static char *slurp(FILE *f, size_t max, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf)
        return NULL;
    for (;;) {
        if (n + 1 >= cap) {
            if (cap > max) {
                free(buf);
                errno = EFBIG;
                return NULL;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

static int model_info(const char *path, char **tmpl, char **bos, char **eos)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "tokpipe chat-template: %s: %s\n", path, strerror(errno));
        return 1;
    }
    struct stat st;
    if (fstat(fd, &st) || st.st_size == 0) {
        fprintf(stderr, "tokpipe chat-template: %s: empty or unreadable\n", path);
        close(fd);
        return 1;
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        fprintf(stderr, "tokpipe chat-template: %s: mmap: %s\n", path, strerror(errno));
        return 1;
    }
    tp_gguf *g = NULL;
    tp_err e;
    int rc = tp_gguf_parse(map, (size_t)st.st_size, &g, &e);
    if (!rc)
        rc = tp_chat_gguf_info(g, tmpl, bos, eos, &e);
    tp_gguf_free(g);
    munmap(map, (size_t)st.st_size);
    if (rc) {
        fprintf(stderr, "tokpipe chat-template: %s: %s\n", path, e.msg);
        return 1;
    }
    return 0;
}

/* What the tokenize stage renders for SUBMIT messages (+ tools): the same
 * code, so a user sees what the model will be sent. Takes *t. */
static int render_openai(tp_chat_template **t, const char *bos, const char *eos, int gen, const char *in, size_t len)
{
    if (!gen) {
        fprintf(stderr, "tokpipe chat-template: --openai renders with the generation prompt, as tokpiped does\n");
        return 2;
    }
    genopts *g = malloc(sizeof *g);
    tp_tokenize_stage *st = NULL;
    char *out = NULL;
    size_t olen = 0;
    tp_err e;
    int rc = g ? 0 : tp_err_set(&e, TP_ENOMEM, "out of memory");
    if (g)
        genopts_init(g);
    if (!rc)
        rc = genopts_conversation(g, in, len, &e);
    if (!rc && !g->n_messages)
        rc = tp_err_set(&e, TP_EINVAL, "messages: empty conversation");
    if (!rc && !(rc = tp_tokenize_stage_new(NULL, &st, &e))) {
        rc = tp_tokenize_stage_set_chat(st, *t, bos, eos, NULL, &e);
        *t = NULL;   /* the stage's */
    }
    if (!rc)
        rc = tp_tokenize_stage_render(st, g->messages, g->n_messages, g->tools, g->reasoning_effort, &out, &olen, &e);
    if (rc)
        fprintf(stderr, "tokpipe chat-template: %s\n", e.msg);
    else
        fwrite(out, 1, olen, stdout);
    free(out);
    tp_tokenize_stage_free(st);
    if (g)
        genopts_free(g);
    free(g);
    return rc ? 1 : (fflush(stdout) ? 1 : 0);
}

int cmd_chat_template(int argc, char **argv)
{
    const char *tpath = NULL, *mpath = NULL, *bos_arg = NULL, *eos_arg = NULL;
    int gen = 1, turn_end = 0, openai = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        int has_val = i + 1 < argc;
        if (!strcmp(a, "--template") && has_val)
            tpath = argv[++i];
        else if (!strcmp(a, "--model") && has_val)
            mpath = argv[++i];
        else if (!strcmp(a, "--bos-token") && has_val)
            bos_arg = argv[++i];
        else if (!strcmp(a, "--eos-token") && has_val)
            eos_arg = argv[++i];
        else if (!strcmp(a, "--no-generation-prompt"))
            gen = 0;
        else if (!strcmp(a, "--turn-end"))
            turn_end = 1;
        else if (!strcmp(a, "--openai"))
            openai = 1;
        else {
            fprintf(stderr, "tokpipe chat-template: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!tpath == !mpath) {
        fprintf(stderr, "tokpipe chat-template: give exactly one of --template FILE and --model FILE\n");
        return 2;
    }
    char *text = NULL, *bos = NULL, *eos = NULL;
    size_t tlen = 0;
    if (mpath) {
        if (model_info(mpath, &text, &bos, &eos))
            return 1;
        tlen = strlen(text);
    } else {
        FILE *f = fopen(tpath, "rb");
        if (!f || !(text = slurp(f, TP_CHAT_MAX_TEMPLATE, &tlen))) {
            fprintf(stderr, "tokpipe chat-template: %s: %s\n", tpath, strerror(errno));
            if (f)
                fclose(f);
            return 1;
        }
        fclose(f);
    }
    int rc = 1;
    tp_chat_template *t = NULL;
    cJSON *conv = NULL;
    char *input = NULL, *out = NULL;
    tp_err e;
    if (tp_chat_template_new(text, tlen, &t, &e)) {
        fprintf(stderr, "tokpipe chat-template: %s: %s\n", tpath ? tpath : mpath, e.msg);
        goto done;
    }
    const char *b = bos_arg ? bos_arg : bos, *eo = eos_arg ? eos_arg : eos;
    if (turn_end) {
        if (tp_chat_template_turn_end(t, b, eo, &out, &e)) {
            fprintf(stderr, "tokpipe chat-template: %s\n", e.msg);
            goto done;
        }
        fputs(out, stdout);
        rc = 0;
        goto done;
    }
    size_t ilen;
    if (!(input = slurp(stdin, 64u << 20, &ilen))) {
        fprintf(stderr, "tokpipe chat-template: stdin: %s\n", strerror(errno));
        goto done;
    }
    if (openai) {
        rc = render_openai(&t, b, eo, gen, input, ilen);
        goto done;
    }
    /* checked with cJSON for the shape and a clear error; rendered from
     * the text itself (NUL bytes and large integers survive) */
    conv = cJSON_ParseWithLength(input, ilen);
    if (!conv) {
        fprintf(stderr, "tokpipe chat-template: stdin is not JSON (near byte %zu)\n",
                (size_t)(cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - input : 0));
        goto done;
    }
    const cJSON *msgs = cJSON_IsObject(conv) ? cJSON_GetObjectItemCaseSensitive(conv, "messages") : conv;
    if (!cJSON_IsArray(msgs)) {
        fprintf(stderr, "tokpipe chat-template: messages: expected a JSON array of {\"role\", \"content\"} objects\n");
        goto done;
    }
    char *vars = input;
    size_t vlen = ilen;
    if (!cJSON_IsObject(conv)) {   /* a bare conversation: {"messages": [...]} */
        if (!(vars = malloc(ilen + 16))) {
            fprintf(stderr, "tokpipe chat-template: out of memory\n");
            goto done;
        }
        vlen = (size_t)sprintf(vars, "{\"messages\":");
        memcpy(vars + vlen, input, ilen);
        vlen += ilen;
        vars[vlen++] = '}';
        free(input);
        input = vars;
    }
    tp_chat_vars v = {.json = vars, .json_len = vlen, .bos_token = b, .eos_token = eo,
                      .add_generation_prompt = gen != 0};
    size_t olen = 0;
    int r = tp_chat_template_render(t, &v, &out, &olen, &e);
    if (r) {
        fprintf(stderr, "tokpipe chat-template: %s\n", e.msg);
        goto done;
    }
    fwrite(out, 1, olen, stdout);
    rc = fflush(stdout) ? 1 : 0;
done:
    cJSON_Delete(conv);
    free(input);
    free(out);
    free(text);
    free(bos);
    free(eos);
    tp_chat_template_free(t);
    return rc;
}
