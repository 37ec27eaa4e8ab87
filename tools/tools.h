/* bin/tokpipe subcommands.
 *
 * A subcommand NAME lives in tools/cmd_NAME.c and defines
 *   int cmd_NAME(int argc, char **argv);   argv[0] is "NAME"; returns the exit code
 *   const char cmd_NAME_summary[];          one line for `tokpipe --help`
 * The Makefile generates cmds.h (one TP_CMD(NAME) per file), so adding a file
 * adds the command. Every subcommand answers --help. */
#ifndef TOKPIPE_TOOLS_H
#define TOKPIPE_TOOLS_H

#define TP_CMD(name) \
    int cmd_##name(int argc, char **argv); \
    extern const char cmd_##name##_summary[];
#include "cmds.h"
#undef TP_CMD

#endif
