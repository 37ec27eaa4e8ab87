/* tokpipe stats: the broker's counters. */
#include "tools.h"

#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "evfmt.h"

const char cmd_stats_summary[] = "print the daemon's counters (jobs, finishes per reason, stop triggers, malformed)";

static const char usage_text[] =
    "usage: tokpipe stats [--json] [connection options]\n"
    "\n"
    "Prints the broker's counters: jobs, tokens, events, malformed messages per\n"
    "socket, forward steps with the rows and tokens in them (rows / steps is\n"
    "the mean batch), live workers per stage, finished jobs per finish reason\n"
    "and how often each stop string / stop id finished a job; running and waiting\n"
    "jobs, KV slots in use, and histograms (µs) of queue time, time to first token,\n"
    "inter-token latency and end-to-end time (p50/p90/p99 as bucket upper bounds).\n"
    "  --json   one JSON object instead\n"
    "exit status: 0 ok, 1 daemon unreachable, 2 bad usage.\n\n" TP_CLIENT_ARGS_HELP;

/* "key: value" lines from the JSON rendering, nested objects as a.b. */
static void print_human(cJSON *o, const char *prefix)
{
    for (cJSON *it = o->child; it; it = it->next) {
        if (cJSON_IsObject(it)) {
            char p[128];
            snprintf(p, sizeof p, "%s%s.", prefix, it->string);
            print_human(it, p);
        } else if (cJSON_IsArray(it) && cJSON_IsNumber(it->child)) {
            printf("%s%s:", prefix, it->string);
            for (cJSON *e = it->child; e; e = e->next)
                printf(" %.0f", cJSON_GetNumberValue(e));
            printf("\n");
        } else if (cJSON_IsArray(it)) {
            printf("%s%s:\n", prefix, it->string);
            for (cJSON *e = it->child; e; e = e->next) {
                char *m = cJSON_PrintUnformatted(cJSON_GetObjectItem(e, "matched"));
                printf("  %-24s %.0f%s\n", m ? m : "", cJSON_GetNumberValue(cJSON_GetObjectItem(e, "count")),
                       cJSON_IsTrue(cJSON_GetObjectItem(e, "truncated")) ? " (truncated)" : "");
                free(m);
            }
        } else {
            printf("%s%s: %.0f\n", prefix, it->string, cJSON_GetNumberValue(it));
        }
    }
}

int cmd_stats(int argc, char **argv)
{
    tp_client_cmd c = {.name = "stats", .usage = usage_text, .json_flag = "--json"};
    int rc = tp_client_cmd_parse(&c, argc, argv);
    if (rc >= 0)
        return rc;
    rc = tp_client_cmd_call(&c, TP_CMD_STATS, TP_CMD_STATS_REPLY);
    if (!rc) {
        cJSON *j = evfmt_stats(&c.reply.m);
        if (c.json) {
            evfmt_print_line(stdout, j);
        } else {
            print_human(j, "");
            cJSON_Delete(j);
        }
    }
    return tp_client_cmd_done(&c, rc);
}
