#include "model_files.h"

#include <stdio.h>
#include <stdlib.h>

void model_file_path(const char *name, char *buf, size_t cap)
{
    const char *dir = getenv("TP_MODELS");
    snprintf(buf, cap, "%s/%s", dir ? dir : "../shared/models", name);
}

void *model_file_read(const char *name, size_t *size)
{
    char path[4096];
    model_file_path(name, path, sizeof path);
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    void *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && fread(buf, 1, (size_t)n, fp) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(fp);
    *size = (size_t)n;
    return buf;
}
