#include "genopts.h"

#include <cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokpipe/grammar.h"
#include "tokpipe/jschema.h"
#include "tokpipe/protocol.h"
#include "tokpipe/rand.h"
#include "tokpipe/sampler.h"
#include "tokpipe/spec.h"
#include "tokpipe/toolcall.h"

void genopts_init(genopts *o)
{
    memset(o, 0, sizeof *o);
    o->max_tokens = 256;
    o->temperature = 1.0f;
    o->top_p = 1.0f;
    o->repetition_penalty = 1.0f;
    o->penalty_window = TP_SAMPLER_DEFAULT_PENALTY_WINDOW;
    o->typical_p = 1.0f;
    o->seed = tp_random_u64();   /* reported (--json "seed"), so a run can be replayed */
}

/* The value is checked by the wire's own rule for the parameter the flag
 * sets (--top-p -> top_p), so run refuses what SUBMIT would refuse. */
static int parse_float(const char *flag, const char *s, float *out, tp_err *err)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if ((errno && errno != ERANGE) || end == s || *end)
        return tp_err_set(err, TP_EINVAL, "%s: '%s' is not a number", flag, s);
    char key[32];
    size_t n = 0;
    for (const char *p = flag + 2; *p && n + 1 < sizeof key; p++)
        key[n++] = *p == '-' ? '_' : *p;
    key[n] = '\0';
    return tp_proto_param_float(key, v, out, err);
}

static int parse_i64(const char *flag, const char *s, long long lo, long long hi, long long *out,
                     tp_err *err)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end)
        return tp_err_set(err, TP_EINVAL, "%s: '%s' is not an integer", flag, s);
    if (v < lo || v > hi)
        return tp_err_set(err, TP_EINVAL, "%s: %lld is outside [%lld, %lld]", flag, v, lo, hi);
    *out = v;
    return 0;
}

static int parse_i32(const char *flag, const char *s, int32_t *out, tp_err *err)
{
    long long v = 0;
    int rc = parse_i64(flag, s, INT32_MIN, INT32_MAX, &v, err);
    if (rc == 0)
        *out = (int32_t)v;
    return rc;
}

static int parse_seed(const char *s, uint64_t *out, tp_err *err)
{
    char *end;
    errno = 0;
    if (*s == '-')
        return tp_err_set(err, TP_EINVAL, "--seed: '%s' must be a non-negative integer", s);
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end)
        return tp_err_set(err, TP_EINVAL, "--seed: '%s' is not an integer", s);
    *out = v;
    return 0;
}

static int add_message(genopts *o, const char *role, size_t rlen, const char *content, size_t clen,
                       const char *what, tp_err *err)
{
    if (o->n_messages == GENOPTS_MAX_MESSAGES)
        return tp_err_set(err, TP_ERANGE, "%s: at most %d messages", what, GENOPTS_MAX_MESSAGES);
    if (rlen == 0)
        return tp_err_set(err, TP_EINVAL, "%s: empty role (write ROLE=TEXT, e.g. user=Hello)", what);
    o->messages[o->n_messages++] = (tp_chat_msg){.role = {role, rlen}, .content = {content, clen}};
    return 0;
}

static void *own(genopts *o, void *p)
{
    void **n = p ? realloc(o->owned, (o->n_owned + 1) * sizeof *n) : NULL;
    if (!n) {
        free(p);
        return NULL;
    }
    o->owned = n;
    o->owned[o->n_owned++] = p;
    return p;
}

static char *slurp_file(const char *flag, const char *path, size_t *len, tp_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return tp_err_set(err, TP_EIO, "%s: %s: %s", flag, path, strerror(errno)), NULL;
    size_t cap = 1u << 16, n = 0;
    char *buf = malloc(cap + 1);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *nb = cap < TP_PROTO_MAX_PROMPT * 4u ? realloc(buf, cap * 2 + 1) : NULL;
            if (!nb) {
                free(buf);
                fclose(f);
                return tp_err_set(err, TP_ERANGE, "%s: %s: too big", flag, path), NULL;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (!buf)
        return tp_err_set(err, TP_ENOMEM, "out of memory"), NULL;
    buf[n] = 0;
    *len = n;
    return buf;
}

/* content: a string, null (empty: templates such as Qwen3's fail on none)
 * or a list of {"type": "text", "text": ..} parts, joined. */
static int message_content(genopts *o, const cJSON *c, tp_str *out, const char *path, size_t i, tp_err *err)
{
    if (!c || cJSON_IsNull(c)) {
        *out = (tp_str){"", 0};
        return 0;
    }
    if (cJSON_IsString(c)) {
        *out = tp_str_of(c->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(c))
        return tp_err_set(err, TP_EINVAL, "--messages: %s: messages[%zu].content: expected a string, null or text parts",
                          path, i);
    size_t len = 0;
    for (const cJSON *p = c->child; p; p = p->next) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text))
            return tp_err_set(err, TP_EINVAL, "--messages: %s: messages[%zu].content: only {\"type\": \"text\", "
                              "\"text\": ..} parts", path, i);
        len += strlen(text->valuestring);
    }
    char *buf = own(o, malloc(len + 1)), *w = buf;
    if (!buf)
        return tp_err_set(err, TP_ENOMEM, "out of memory");
    for (const cJSON *p = c->child; p; p = p->next) {
        const char *t = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        memcpy(w, t, strlen(t));
        w += strlen(t);
    }
    *out = (tp_str){buf, len};
    return 0;
}

/* tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}]
 * with arguments as OpenAI sends them (a JSON string) or an object. */
static int message_calls(genopts *o, const cJSON *tc, tp_chat_msg *m, const char *path, size_t i, tp_err *err)
{
    if (!tc || cJSON_IsNull(tc))
        return 0;
    int n = cJSON_GetArraySize(tc);
    if (!cJSON_IsArray(tc) || n > TP_PROTO_MAX_TOOL_CALLS)
        return tp_err_set(err, TP_EINVAL, "--messages: %s: messages[%zu].tool_calls: expected a list of at most %d calls",
                          path, i, TP_PROTO_MAX_TOOL_CALLS);
    tp_tool_call *calls = own(o, calloc((size_t)n + 1, sizeof *calls));
    if (!calls)
        return tp_err_set(err, TP_ENOMEM, "out of memory");
    size_t k = 0;
    for (const cJSON *c = tc->child; c; c = c->next, k++) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(c, "id");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (!cJSON_IsString(name) || !name->valuestring[0])
            return tp_err_set(err, TP_EINVAL, "--messages: %s: messages[%zu].tool_calls[%zu].function.name: missing",
                              path, i, k);
        calls[k].id = tp_str_of(cJSON_IsString(id) ? id->valuestring : "");
        calls[k].name = tp_str_of(name->valuestring);
        if (cJSON_IsString(args)) {
            calls[k].arguments = tp_str_of(args->valuestring);
        } else if (cJSON_IsObject(args)) {
            char *t = own(o, cJSON_PrintUnformatted(args));
            if (!t)
                return tp_err_set(err, TP_ENOMEM, "out of memory");
            calls[k].arguments = tp_str_of(t);
        } else {
            calls[k].arguments = tp_str_of("{}");
        }
    }
    m->tool_calls = calls;
    m->n_tool_calls = k;
    return 0;
}

static int parse_messages(genopts *o, cJSON *j, const char *path, tp_err *err);

/* --messages FILE: [{"role": .., "content": .., ...}, ...] or {"messages": [...]} */
static int load_messages(genopts *o, const char *path, tp_err *err)
{
    if (o->messages_json)
        return tp_err_set(err, TP_EINVAL, "--messages: give it once");
    size_t len = 0;
    char *buf = slurp_file("--messages", path, &len, err);
    if (!buf)
        return err->code;
    cJSON *j = cJSON_ParseWithLength(buf, len);
    free(buf);
    if (!j)
        return tp_err_set(err, TP_EINVAL, "--messages: %s is not JSON", path);
    return parse_messages(o, j, path, err);
}

int genopts_conversation(genopts *o, const char *text, size_t len, tp_err *err)
{
    cJSON *j = cJSON_ParseWithLength(text, len);
    if (!j)
        return tp_err_set(err, TP_EINVAL, "the conversation is not JSON");
    int rc = parse_messages(o, j, "stdin", err);
    const char *span;
    size_t n;
    if (!rc && cJSON_IsObject(j) && tp_json_member_span(text, len, "tools", &span, &n)) {
        char *t = own(o, malloc(n + 1));
        if (!t)
            return tp_err_set(err, TP_ENOMEM, "out of memory");
        memcpy(t, span, n);
        t[n] = 0;
        o->tools = (tp_str){t, n};
    }
    return rc;
}

static int parse_messages(genopts *o, cJSON *j, const char *path, tp_err *err)
{
    o->messages_json = j;
    const cJSON *effort = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "reasoning_effort") : NULL;
    if (effort && !cJSON_IsNull(effort)) {
        if (!cJSON_IsString(effort))
            return tp_err_set(err, TP_EINVAL, "--messages: %s: reasoning_effort: expected a string", path);
        o->reasoning_effort = tp_str_of(effort->valuestring); /* lives in messages_json */
    }
    const cJSON *arr = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "messages") : j;
    if (!cJSON_IsArray(arr))
        return tp_err_set(err, TP_EINVAL, "--messages: %s: expected [{\"role\": .., \"content\": ..}, ...]", path);
    size_t i = 0;
    for (const cJSON *m = arr->child; m; m = m->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role))
            return tp_err_set(err, TP_EINVAL, "--messages: %s: messages[%zu].role: missing or not a string", path, i);
        for (const cJSON *k = m->child; k; k = k->next)
            if (strcmp(k->string, "role") && strcmp(k->string, "content") && strcmp(k->string, "name") &&
                strcmp(k->string, "tool_call_id") && strcmp(k->string, "tool_calls"))
                return tp_err_set(err, TP_EINVAL,
                                  "--messages: %s: messages[%zu].%s: unknown key (role, content, name, tool_call_id, "
                                  "tool_calls)",
                                  path, i, k->string);
        tp_str content = {"", 0};
        int rc = message_content(o, cJSON_GetObjectItemCaseSensitive(m, "content"), &content, path, i, err);
        if (!rc)
            rc = add_message(o, role->valuestring, strlen(role->valuestring), content.ptr, content.len, "--messages",
                             err);
        if (rc)
            return rc;
        tp_chat_msg *msg = &o->messages[o->n_messages - 1];
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(m, "name");
        const cJSON *tcid = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
        if (cJSON_IsString(name))
            msg->name = tp_str_of(name->valuestring);
        if (cJSON_IsString(tcid))
            msg->tool_call_id = tp_str_of(tcid->valuestring);
        if ((rc = message_calls(o, cJSON_GetObjectItemCaseSensitive(m, "tool_calls"), msg, path, i, err)))
            return rc;
    }
    return 0;
}

static int load_tools(genopts *o, const char *path, tp_err *err)
{
    if (o->tools.ptr)
        return tp_err_set(err, TP_EINVAL, "--tools: give it once");
    size_t len = 0;
    char *buf = own(o, slurp_file("--tools", path, &len, err));
    if (!buf)
        return err->code ? err->code : tp_err_set(err, TP_ENOMEM, "out of memory");
    cJSON *j = cJSON_ParseWithLength(buf, len);
    bool arr = cJSON_IsArray(j);
    cJSON_Delete(j);
    if (!arr)
        return tp_err_set(err, TP_EINVAL, "--tools: %s: expected a JSON array of OpenAI tools", path);
    o->tools = (tp_str){buf, len};
    return 0;
}

static int parse_tool_choice(genopts *o, const char *v, tp_err *err)
{
    if (!*v)
        return tp_err_set(err, TP_EINVAL, "--tool-choice: empty (none, auto, required or a function name)");
    if (!strcmp(v, "none") || !strcmp(v, "auto") || !strcmp(v, "required")) {
        o->tool_choice = v;
        o->tool_choice_name = NULL;
    } else {
        o->tool_choice = "function";
        o->tool_choice_name = v;
    }
    return 0;
}

void genopts_free(genopts *o)
{
    cJSON_Delete(o->messages_json);
    o->messages_json = NULL;
    free(o->grammar);
    free(o->json_schema);
    o->grammar = o->json_schema = NULL;
    for (size_t i = 0; i < o->n_owned; i++)
        free(o->owned[i]);
    free(o->owned);
    o->owned = NULL;
    o->n_owned = 0;
}

/* --grammar / --json-schema FILE: the whole file, at most what SUBMIT takes */
static int load_text(const char *flag, const char *path, char **out, size_t *len, tp_err *err)
{
    if (*out)
        return tp_err_set(err, TP_EINVAL, "%s: give it once", flag);
    FILE *f = fopen(path, "rb");
    if (!f)
        return tp_err_set(err, TP_EIO, "%s: %s: %s", flag, path, strerror(errno));
    char *buf = malloc(TP_PROTO_MAX_GRAMMAR + 2);
    size_t n = buf ? fread(buf, 1, TP_PROTO_MAX_GRAMMAR + 1, f) : 0;
    fclose(f);
    if (!buf)
        return tp_err_set(err, TP_ENOMEM, "out of memory");
    if (n > TP_PROTO_MAX_GRAMMAR || n == 0) {
        free(buf);
        return tp_err_set(err, TP_ERANGE, "%s: %s: %s", flag, path, n ? "larger than 1 MiB" : "empty");
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

int genopts_gbnf(const genopts *o, char **gbnf, tp_err *err)
{
    *gbnf = NULL;
    int rc = 0;
    tp_err e;
    tp_err_clear(&e);
    const char *flag = "--grammar";
    if (o->json_schema) {
        flag = "--json-schema";
        rc = tp_jschema_to_gbnf(o->json_schema, o->json_schema_len, NULL, gbnf, &e);
    } else if (o->json_mode) {
        flag = "--json-mode";
        rc = tp_jschema_json_mode_gbnf(gbnf, &e);
    } else if (o->grammar) {
        if (!(*gbnf = strndup(o->grammar, o->grammar_len)))
            rc = tp_err_set(&e, TP_ENOMEM, "out of memory");
    } else
        return 0;
    tp_grammar *g = NULL;
    if (!rc)
        rc = tp_grammar_compile(*gbnf, strlen(*gbnf), NULL, &g, &e);
    tp_grammar_free(g);
    if (rc) {
        free(*gbnf);
        *gbnf = NULL;
        return tp_err_set(err, rc, "%s: %s", flag, e.msg);
    }
    return 0;
}

int genopts_check_prompt(const genopts *o, tp_err *err)
{
    if (o->n_messages && o->n_prompts)
        return tp_err_set(err, TP_EINVAL, "give --prompt or --message/--messages, not both");
    if (!o->n_messages && !o->n_prompts)
        return tp_err_set(err, TP_EINVAL, "--prompt (or --message ROLE=TEXT / --messages FILE) is required");
    if ((o->tools.ptr || o->tool_choice) && !o->n_messages)
        return tp_err_set(err, TP_EINVAL, "--tools/--tool-choice: only with --message/--messages");
    if (o->one_call && !o->tools.ptr)
        return tp_err_set(err, TP_EINVAL, "--no-parallel-tool-calls: only with --tools");
    if (o->tool_choice && !o->tools.ptr)
        return tp_err_set(err, TP_EINVAL, "--tool-choice: only with --tools");
    return 0;
}

/* --logit-bias ID=BIAS: an id >= 0 (the vocabulary is checked where it is
 * known), a bias in [-100, 100]; an id given twice is an error, as in
 * SUBMIT. */
static int parse_bias(genopts *o, const char *v, tp_err *err)
{
    const char *eq = strchr(v, '=');
    if (!eq || eq == v)
        return tp_err_set(err, TP_EINVAL, "--logit-bias: '%s' is not ID=BIAS", v);
    char id_s[16];
    size_t il = (size_t)(eq - v);
    if (il >= sizeof id_s)
        return tp_err_set(err, TP_EINVAL, "--logit-bias: '%s': the token id is too long", v);
    memcpy(id_s, v, il);
    id_s[il] = '\0';
    long long id = 0;
    int rc = parse_i64("--logit-bias", id_s, 0, INT32_MAX, &id, err);
    if (rc)
        return rc;
    char *end;
    errno = 0;
    double b = strtod(eq + 1, &end);
    if (errno || end == eq + 1 || *end)
        return tp_err_set(err, TP_EINVAL, "--logit-bias: '%s' is not ID=BIAS with a number", v);
    if (!(b >= -TP_SAMPLER_MAX_BIAS && b <= TP_SAMPLER_MAX_BIAS))
        return tp_err_set(err, TP_EINVAL, "--logit-bias: %s: the bias must be in [-100, 100]", v);
    for (size_t k = 0; k < o->n_bias; k++)
        if (o->bias_ids[k] == (int32_t)id)
            return tp_err_set(err, TP_EINVAL, "--logit-bias: token id %lld given twice", id);
    if (o->n_bias == GENOPTS_MAX_BIAS)
        return tp_err_set(err, TP_ERANGE, "--logit-bias: at most %d entries", GENOPTS_MAX_BIAS);
    o->bias_ids[o->n_bias] = (int32_t)id;
    o->bias_values[o->n_bias++] = (float)b;
    return 0;
}

int genopts_parse_one(genopts *o, int argc, char **argv, int *i, tp_err *err)
{
    const char *a = argv[*i];
    if (!strcmp(a, "--no-parallel-tool-calls")) {
        o->one_call = true;
        return 1;
    }
    if (!strcmp(a, "--speculative") || !strcmp(a, "--draft-max") || !strcmp(a, "--draft-model")) {
        if (*i + 1 >= argc)
            return tp_err_set(err, TP_EINVAL, "%s needs a value", a);
        const char *v = argv[++*i];
        if (!strcmp(a, "--draft-model")) {
            o->draft_model = v;
            return 1;
        }
        if (!strcmp(a, "--speculative")) {
            tp_spec_mode m;
            int rc = tp_spec_mode_parse(v, &m, err);
            if (rc)
                return tp_err_set(err, rc, "--speculative: '%s' is not off, ngram or draft", v);
            o->spec_mode = (int)m;
            o->spec_given = true;
            return 1;
        }
        char *end;
        long n = strtol(v, &end, 10);
        if (!*v || *end || n < 1 || n > TP_SPEC_MAX_DRAFT)
            return tp_err_set(err, TP_EINVAL, "--draft-max: '%s' is not a number in 1..%d", v, TP_SPEC_MAX_DRAFT);
        o->spec_n_max = (int32_t)n;
        return 1;
    }
    if (!strcmp(a, "--tools") || !strcmp(a, "--tool-choice")) {
        if (*i + 1 >= argc)
            return tp_err_set(err, TP_EINVAL, "%s needs a value", a);
        const char *v = argv[++*i];
        int rc = !strcmp(a, "--tools") ? load_tools(o, v, err) : parse_tool_choice(o, v, err);
        return rc < 0 ? rc : 1;
    }
    if (!strcmp(a, "--message") || !strcmp(a, "--messages")) {
        if (*i + 1 >= argc)
            return tp_err_set(err, TP_EINVAL, "%s needs a value", a);
        const char *v = argv[++*i];
        int rc;
        if (!strcmp(a, "--messages")) {
            rc = load_messages(o, v, err);
        } else {
            const char *eq = strchr(v, '=');
            if (!eq)
                return tp_err_set(err, TP_EINVAL, "--message: '%s' is not ROLE=TEXT", v);
            rc = add_message(o, v, (size_t)(eq - v), eq + 1, strlen(eq + 1), "--message", err);
        }
        return rc < 0 ? rc : 1;
    }
    if (!strcmp(a, "--grammar") || !strcmp(a, "--json-schema")) {
        if (*i + 1 >= argc)
            return tp_err_set(err, TP_EINVAL, "%s needs a value", a);
        bool gr = !strcmp(a, "--grammar");
        int rc = load_text(a, argv[++*i], gr ? &o->grammar : &o->json_schema,
                           gr ? &o->grammar_len : &o->json_schema_len, err);
        if (!rc && (!!o->grammar + !!o->json_schema + o->json_mode) > 1)
            rc = tp_err_set(err, TP_EINVAL, "%s: give one of --grammar, --json-schema and --json-mode", a);
        return rc < 0 ? rc : 1;
    }
    if (!strcmp(a, "--json-mode") && (o->grammar || o->json_schema))
        return tp_err_set(err, TP_EINVAL, "--json-mode: give one of --grammar, --json-schema and --json-mode");
    static const char *const bools[] = {"--ignore-eos", "--include-stop", "--json", "--parse-special", "--logprobs",
                                        "--json-mode"};
    bool *const bool_dst[] = {&o->ignore_eos, &o->include_stop, &o->json, &o->parse_special, &o->logprobs,
                              &o->json_mode};
    for (size_t k = 0; k < sizeof bools / sizeof *bools; k++)
        if (!strcmp(a, bools[k])) {
            *bool_dst[k] = true;
            return 1;
        }

    static const char *const valued[] = {
        "--prompt", "--max-tokens", "--min-tokens", "--temperature", "--top-p", "--top-k",
        "--min-p", "--repetition-penalty", "--presence-penalty", "--frequency-penalty",
        "--seed", "--stop", "--stop-id", "--penalty-window", "--top-logprobs", "--logprobs-mode",
        "--logit-bias", "--typical-p", "--truncate-prompt-tokens",
    };
    _Static_assert(sizeof valued / sizeof *valued == GO_TRUNCATE_PROMPT + 1, "valued[] follows genopt_flag");
    size_t k = 0;
    while (k < sizeof valued / sizeof *valued && strcmp(a, valued[k]))
        k++;
    if (k == sizeof valued / sizeof *valued)
        return 0;
    if (*i + 1 >= argc)
        return tp_err_set(err, TP_EINVAL, "%s needs a value", a);
    const char *v = argv[++*i];
    int rc = 0;
    o->given |= 1u << k;
    switch (k) {
    case GO_PROMPT:
        if (o->n_prompts == GENOPTS_MAX_PROMPTS)
            return tp_err_set(err, TP_ERANGE, "--prompt: at most %d prompts", GENOPTS_MAX_PROMPTS);
        o->prompts[o->n_prompts++] = v;
        break;
    case GO_MAX_TOKENS: rc = parse_i32(a, v, &o->max_tokens, err); break;
    case GO_MIN_TOKENS: rc = parse_i32(a, v, &o->min_tokens, err); break;
    case GO_TEMPERATURE: rc = parse_float(a, v, &o->temperature, err); break;
    case GO_TOP_P: rc = parse_float(a, v, &o->top_p, err); break;
    case GO_TOP_K: rc = parse_i32(a, v, &o->top_k, err); break;
    case GO_MIN_P: rc = parse_float(a, v, &o->min_p, err); break;
    case GO_REPETITION_PENALTY: rc = parse_float(a, v, &o->repetition_penalty, err); break;
    case GO_PRESENCE_PENALTY: rc = parse_float(a, v, &o->presence_penalty, err); break;
    case GO_FREQUENCY_PENALTY: rc = parse_float(a, v, &o->frequency_penalty, err); break;
    case GO_SEED: rc = parse_seed(v, &o->seed, err); break;
    case GO_STOP:
        for (size_t k2 = 0; k2 < o->n_stops; k2++)
            if (!strcmp(o->stops[k2], v))
                return 1;   /* a copy: one string, as the limits count them */
        if (o->n_stops == GENOPTS_MAX_STOPS)
            return tp_err_set(err, TP_ERANGE, "--stop: at most %d stop strings", GENOPTS_MAX_STOPS);
        o->stops[o->n_stops++] = v;
        break;
    case GO_STOP_ID:
        if (o->n_stop_ids == GENOPTS_MAX_STOPS)
            return tp_err_set(err, TP_ERANGE, "--stop-id: at most %d stop ids", GENOPTS_MAX_STOPS);
        rc = parse_i32(a, v, &o->stop_ids[o->n_stop_ids++], err);
        break;
    case GO_PENALTY_WINDOW: {
        long long w = 0;
        rc = parse_i64(a, v, 0, TP_SAMPLER_MAX_PENALTY_WINDOW, &w, err);
        o->penalty_window = (int32_t)w;
        break;
    }
    case GO_TOP_LOGPROBS: {
        long long n = 0;
        rc = parse_i64(a, v, 0, TP_SAMPLER_MAX_TOP_LOGPROBS, &n, err);
        o->top_logprobs = (int32_t)n;
        o->logprobs = true;   /* alternatives come with the token's own logprob */
        break;
    }
    case GO_LOGPROBS_MODE:
        if (strcmp(v, "raw") && strcmp(v, "processed"))
            return tp_err_set(err, TP_EINVAL, "--logprobs-mode: '%s' is not raw or processed", v);
        o->lp_processed = !strcmp(v, "processed");
        break;
    case GO_LOGIT_BIAS: rc = parse_bias(o, v, err); break;
    case GO_TYPICAL_P: rc = parse_float(a, v, &o->typical_p, err); break;
    case GO_TRUNCATE_PROMPT: {
        long long n = 0;
        rc = parse_i64(a, v, 1, INT32_MAX, &n, err);
        o->truncate_prompt_tokens = (int32_t)n;
        break;
    }
    }
    return rc < 0 ? rc : 1;
}

void genopts_print_help(FILE *out)
{
    fputs("generation options:\n"
          "  --prompt TEXT            prompt (repeat for several jobs, run as one batch)\n"
          "  --message ROLE=TEXT      a conversation turn instead of --prompt (repeatable, in\n"
          "                           order), rendered with the model's chat template\n"
          "  --messages FILE          the conversation as JSON: [{\"role\":..,\"content\":..}], turns\n"
          "                           may carry tool_calls / tool_call_id / name (OpenAI's shape)\n"
          "  --tools FILE             tools the model may call: an OpenAI tools JSON array\n"
          "  --tool-choice C          none, auto (default with --tools), required, or a function name\n"
          "  --no-parallel-tool-calls one call at most (OpenAI's parallel_tool_calls: false)\n"
          "  --max-tokens N           most tokens to generate (default 256)\n"
          "  --min-tokens N           no EOS, stop id or stop string before N tokens (default 0)\n"
          "  --temperature T          0 = greedy (default 1.0)\n"
          "  --top-p P                nucleus sampling, in (0,1] (default 1 = off)\n"
          "  --top-k K                keep the K most likely tokens (default 0 = off)\n"
          "  --min-p P                drop tokens below P x the top probability (default 0)\n"
          "  --repetition-penalty R   CTRL-style penalty, 1 = off (default)\n"
          "  --presence-penalty X     OpenAI-style, in [-2,2] (default 0)\n"
          "  --frequency-penalty X    OpenAI-style, in [-2,2] (default 0)\n"
          "  --penalty-window N       the penalties look at the last N tokens (default 64)\n"
          "  --typical-p P            locally typical sampling, in (0,1] (default 1 = off)\n"
          "  --logit-bias ID=BIAS     add BIAS in [-100,100] to token ID's logit; -100 bans it (repeatable)\n"
          "  --seed S                 per-job RNG seed (default: random, reported as \"seed\" in --json)\n"
          "  --stop STR               stop string (repeatable)\n"
          "  --stop-id ID             stop token id (repeatable)\n"
          "  --ignore-eos             keep generating past EOS\n"
          "  --include-stop           keep the matched stop string in the text\n"
          "  --parse-special          control-token texts in the prompt (<|im_end|>, <s>, ...)\n"
          "                           become those tokens (default: plain text)\n"
          "  --logprobs               report each token's log-probability (--json: \"logprobs\")\n"
          "  --top-logprobs N         and the N most likely alternatives, N in [0,20] (implies --logprobs)\n"
          "  --logprobs-mode MODE     raw (the model's distribution, default) or processed (after\n"
          "                           penalties, logit bias and temperature)\n"
          "  --truncate-prompt-tokens N  keep only the last N prompt tokens\n"
          "  --grammar FILE           constrain the output to a GBNF grammar (llama.cpp's dialect,\n"
          "                           start rule root)\n"
          "  --json-schema FILE       constrain the output to JSON valid for this JSON Schema\n"
          "  --json-mode              constrain the output to one JSON object\n"
          "  --speculative MODE       off (default), ngram (guess from the job's own tokens) or draft\n"
          "                           (a draft model): the same output, in fewer forward steps\n"
          "  --draft-max N            guesses per verify step, 1-16 (default 8); k adapts below it\n"
          "  --draft-model FILE       the draft model of --speculative draft\n"
          "  --json                   one JSON line per prompt: prompt, text, tokens, finish_reason,\n"
          "                           finish_detail, matched, prompt_tokens, cached_tokens (prompt\n"
          "                           tokens taken from the daemon's prefix cache; run: 0),\n"
          "                           completion_tokens, seed, logprobs (with --logprobs),\n"
          "                           grammar_complete (with a grammar), draft_tokens and\n"
          "                           draft_accepted (guesses verified and accepted)\n",
          out);
}
