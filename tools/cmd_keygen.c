/* tokpipe keygen: write a CURVE key pair for security.* in tokpipe.yaml. */
#include "tools.h"

#include <stdio.h>
#include <string.h>

#include "tokpipe/zsec.h"

const char cmd_keygen_summary[] = "write a CURVE key pair (PREFIX.key secret 0600, PREFIX.pub public)";

static void usage(FILE *out)
{
    fprintf(out,
            "usage: tokpipe keygen --out PREFIX\n"
            "\n"
            "Write a fresh ZeroMQ CURVE key pair for tokpipe's security settings:\n"
            "PREFIX.key holds the secret key (mode 0600) and PREFIX.pub the public key.\n"
            "Existing files are never overwritten. The broker's pair goes to\n"
            "security.server_secret_key / server_public_key; a client's or worker's\n"
            "secret key to security.client_secret_key, and its PREFIX.pub line is added\n"
            "to the broker's security.client_keys file (a client: producer, subscriber)\n"
            "or security.worker_keys file (a stage worker).\n");
}

int cmd_keygen(int argc, char **argv)
{
    const char *prefix = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            prefix = argv[++i];
            continue;
        }
        fprintf(stderr, "tokpipe keygen: %s '%s'\n", strcmp(argv[i], "--out") ? "unknown option" : "needs a value",
                argv[i]);
        usage(stderr);
        return 2;
    }
    if (!prefix) {
        fprintf(stderr, "tokpipe keygen: --out PREFIX is required\n");
        usage(stderr);
        return 2;
    }
    tp_err e;
    if (tp_zsec_keygen(prefix, &e)) {
        fprintf(stderr, "tokpipe keygen: %s\n", e.msg);
        return 1;
    }
    printf("wrote %s.key (secret, 0600) and %s.pub (public)\n", prefix, prefix);
    return 0;
}
