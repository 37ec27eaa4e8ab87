#include "llamacpp.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool exists(const char *dir, const char *rel)
{
    char p[8192];
    snprintf(p, sizeof p, "%s/%s", dir, rel);
    return access(p, R_OK) == 0;
}

int bench_llamacpp_open(bench_llamacpp *lc)
{
    memset(lc, 0, sizeof *lc);
    const char *off = getenv("TP_LLAMACPP");
    if (off && !strcmp(off, "0")) {
        snprintf(lc->why, sizeof lc->why, "off ($TP_LLAMACPP=0)");
        return -1;
    }
#if !defined(__x86_64__) || !defined(__linux__)
    snprintf(lc->why, sizeof lc->why, "the npm build is for x86-64 Linux");
    return -1;
#endif
    const char *script = getenv("TP_LLAMACPP_SCRIPT");
    script = script ? script : "bench/support/llamacpp_decode.mjs";
    if (!realpath(script, lc->script)) {
        snprintf(lc->why, sizeof lc->why, "no %.600s (run from the repository root)", script);
        return -1;
    }
    if (system("command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1") != 0) {
        snprintf(lc->why, sizeof lc->why, "nodejs/npm not installed (scripts/install-deps.sh)");
        return -1;
    }
    /* node-llama-cpp's engines field; Debian 12's own nodejs is 18 */
    if (system("node -e 'process.exit(+process.versions.node.split(\".\")[0] >= 20 ? 0 : 1)'") != 0) {
        snprintf(lc->why, sizeof lc->why, "node-llama-cpp needs Node.js 20 or later (node --version)");
        return -1;
    }
    const char *build = getenv("TP_BUILD_DIR");
    char npm[1024];
    snprintf(npm, sizeof npm, "%s/npm", build ? build : "build");
    mkdir(npm, 0755);
    char abs[PATH_MAX];
    if (!realpath(npm, abs)) {
        snprintf(lc->why, sizeof lc->why, "cannot make %.600s", npm);
        return -1;
    }
    snprintf(lc->modules, sizeof lc->modules, "%s/node_modules", abs);
    if (!exists(lc->modules, "node-llama-cpp/package.json") ||
        !exists(lc->modules, "@node-llama-cpp/linux-x64/package.json")) {
        /* No install scripts: node-llama-cpp's would try to build llama.cpp
         * from source; the CPU package holds the prebuilt libraries. No
         * optional packages: the GPU builds are hundreds of MB. */
        char cmd[8192];
        snprintf(cmd, sizeof cmd,
                 "npm install --prefix '%s' --no-audit --no-fund --silent --ignore-scripts --omit=optional "
                 "'%s' '%s' >&2",
                 abs, BENCH_LLAMACPP_NPM, BENCH_LLAMACPP_NPM_CPU);
        fprintf(stderr, "llama.cpp baseline: installing %s and %s into %s\n", BENCH_LLAMACPP_NPM,
                BENCH_LLAMACPP_NPM_CPU, abs);
        if (system(cmd) != 0 || !exists(lc->modules, "node-llama-cpp/package.json")) {
            snprintf(lc->why, sizeof lc->why, "npm install %s failed (no registry?)", BENCH_LLAMACPP_NPM);
            return -1;
        }
    }
    return 0;
}

double bench_llamacpp_decode(bench_llamacpp *lc, const char *gguf, int threads, int prompt_len, int tokens)
{
    char cmd[16384], out[4096] = "";
    snprintf(cmd, sizeof cmd, "node '%s' '%s' '%s' %d %d %d 2>&1", lc->script, lc->modules, gguf, threads, prompt_len,
             tokens);
    FILE *p = popen(cmd, "r");
    if (!p) {
        snprintf(lc->why, sizeof lc->why, "cannot run node");
        return -1;
    }
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int rc = pclose(p);
    const char *r = strstr(out, "{\"tok_s\":");
    if (rc != 0 || !r) {
        out[strcspn(out, "\n")] = 0;
        snprintf(lc->why, sizeof lc->why, "llama.cpp run failed: %.400s", out);
        return -1;
    }
    double rate = strtod(r + 9, NULL);
    const char *b = strstr(r, "\"backend\":\"");
    if (b) {
        b += 11;
        size_t len = strcspn(b, "\"");
        snprintf(lc->backend, sizeof lc->backend, "%.*s", (int)(len < 63 ? len : 63), b);
    }
    return rate > 0 ? rate : -1;
}
