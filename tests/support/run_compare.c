/* daemon == tokpipe run, line for line (run_compare.h). */
#include "run_compare.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void compare_run_lines(const char *what, const char *got, const char *want)
{
    const char *fields[] = {"text", "tokens", "finish_reason", "prompt_tokens", "completion_tokens"};
    const char *g = got, *w = want;
    int line = 0;
    while (*w) {
        const char *ge = strchr(g, '\n'), *we = strchr(w, '\n');
        if (!ge || !we)
            fail_msg("%s: line %d missing\ngenerate:\n%s\nrun:\n%s", what, line, got, want);
        cJSON *jg = cJSON_ParseWithLength(g, (size_t)(ge - g)), *jw = cJSON_ParseWithLength(w, (size_t)(we - w));
        if (!jg || !jw)
            fail_msg("%s: line %d is not JSON:\n%.*s\n%.*s", what, line, (int)(ge - g), g, (int)(we - w), w);
        for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
            char *a = cJSON_PrintUnformatted(cJSON_GetObjectItem(jg, fields[i]));
            char *b = cJSON_PrintUnformatted(cJSON_GetObjectItem(jw, fields[i]));
            if (!a || !b || strcmp(a, b))
                fail_msg("%s: line %d: %s differs\n daemon: %s\n    run: %s", what, line, fields[i],
                         a ? a : "(none)", b ? b : "(none)");
            free(a);
            free(b);
        }
        cJSON_Delete(jg);
        cJSON_Delete(jw);
        g = ge + 1;
        w = we + 1;
        line++;
    }
    assert_true(line > 0);
}

void daemon_equals_run(harness *h, const char *const *groups, size_t n, int timeout_ms, const char *run_model,
                       const char *what)
{
    FILE **p = calloc(n, sizeof *p);
    char **got = calloc(n, sizeof *got);
    assert_true(p && got);
    for (size_t i = 0; i < n; i++) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "%s/tokpipe generate --config %s --json --timeout %d %s", h->bin, h->config,
                 timeout_ms, groups[i]);
        p[i] = popen(cmd, "r");
        assert_non_null(p[i]);
    }
    for (size_t i = 0; i < n; i++) {
        size_t cap = 1 << 16, len = fread(got[i] = calloc(1, cap), 1, cap - 1, p[i]);
        got[i][len] = '\0';
        int st = pclose(p[i]);
        if (st != 0)
            fail_msg("%s: generate group %zu failed (status %d): %s", what, i, st, got[i]);
    }
    assert_int_equal(harness_stop(h), 0);
    for (size_t i = 0; i < n; i++) {
        char cmd[4096], *want = NULL, label[256];
        snprintf(cmd, sizeof cmd, "%s/tokpipe run %s --json %s 2>/dev/null", h->bin, run_model, groups[i]);
        if (harness_sh(cmd, &want) != 0)
            fail_msg("%s: tokpipe run failed for group %zu: %s", what, i, want ? want : "");
        snprintf(label, sizeof label, "%s group %zu", what, i);
        compare_run_lines(label, got[i], want);
        free(want);
        free(got[i]);
    }
    free(got);
    free(p);
}
