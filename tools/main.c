/* bin/tokpipe: client and tools, one subcommand per tools/cmd_*.c. */
#include "tools.h"

#include <stdio.h>
#include <string.h>

struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
};

static const struct command commands[] = {
#define TP_CMD(name) {#name, cmd_##name, cmd_##name##_summary},
#include "cmds.h"
#undef TP_CMD
    {NULL, NULL, NULL},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: tokpipe COMMAND [options]   (tokpipe COMMAND --help for its options)\n\ncommands:\n");
    /* a file tools/cmd_a_b.c is the command a-b */
    for (const struct command *c = commands; c->name; c++) {
        char nm[32];
        snprintf(nm, sizeof nm, "%s", c->name);
        for (char *p = nm; *p; p++)
            if (*p == '_')
                *p = '-';
        fprintf(out, "  %-10s %s\n", nm, c->summary);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    char want[32];
    snprintf(want, sizeof want, "%s", argv[1]);
    for (char *p = want; *p; p++)
        if (*p == '-')
            *p = '_';
    for (const struct command *c = commands; c->name; c++)
        if (!strcmp(want, c->name))
            return c->run(argc - 1, argv + 1);
    fprintf(stderr, "tokpipe: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
