#include "tools.h"
#include "tokpipe/version.h"

#include <stdio.h>

const char cmd_version_summary[] = "print the tokpipe version";

int cmd_version(int argc, char **argv)
{
    (void)argv;
    if (argc > 1) {
        printf("usage: tokpipe version\n");
        return 0;
    }
    printf("tokpipe %s\n", TP_VERSION);
    return 0;
}
