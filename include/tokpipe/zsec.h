/* ZeroMQ CURVE security for the broker's endpoints (PROTOCOL.md "Security").
 *
 * With `security.curve: true` every tcp:// endpoint the broker binds is a
 * CURVE server (encrypted, and only listed public keys get through: the
 * broker answers ZeroMQ's ZAP requests itself). Keys have roles: those in
 * `security.client_keys` reach only the client endpoints (front, events),
 * those in `security.worker_keys` only the worker endpoints (back,
 * publish); `security.authorized_keys` admits its keys in both roles (the
 * setting from before roles existed). ipc:// endpoints stay plain: the 0700 runtime directory
 * already keeps other users out, and local workers pay no encryption.
 *
 * Keys are Z85 text files written by `tokpipe keygen`: PREFIX.key holds the
 * secret key (0600; a secret key file others may read is refused, as ssh
 * does), PREFIX.pub the public key. '#' lines and blank lines are comments;
 * a key line may be followed by whitespace and a label. A public key is
 * never configured for one's own secret key: it is derived from it. */
#ifndef TOKPIPE_ZSEC_H
#define TOKPIPE_ZSEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokpipe/config.h"
#include "tokpipe/error.h"

#define TP_ZSEC_KEY_LEN 40               /* Z85 characters of one 32-byte key */
#define TP_ZSEC_ZAP_ENDPOINT "inproc://zeromq.zap.01"
/* ZAP domains of the broker's sockets, one per role: a key admitted in one
 * role gets nothing from the other role's endpoints. */
#define TP_ZSEC_DOMAIN_CLIENT "tokpipe-client"   /* front, events */
#define TP_ZSEC_DOMAIN_WORKER "tokpipe-worker"   /* back, publish */
#define TP_ZSEC_MAX_AUTHORIZED 65536      /* keys in one authorized_keys file */

/* Write a fresh key pair: PREFIX.key (secret, mode 0600) and PREFIX.pub
 * (public, 0644). Refuses (TP_EINVAL naming the file) if either exists;
 * never leaves a half-written pair behind. */
int tp_zsec_keygen(const char *prefix, tp_err *err);

/* Read the one key of a key file into out (Z85, NUL-terminated). secret:
 * the file must not be readable by others (by group too when we own it).
 * Errors name the file and the line. */
int tp_zsec_read_key(const char *path, bool secret, char out[TP_ZSEC_KEY_LEN + 1], tp_err *err);

/* The public key of a secret key (both Z85). */
int tp_zsec_public_of(const char *secret, char out[TP_ZSEC_KEY_LEN + 1], tp_err *err);

/* ---- client side (workers, bin/tokpipe commands, tests) ------------------ */

/* A plain value: copy freely, nothing to free. on = security.curve. */
typedef struct tp_zsec_client {
    bool on;
    char server_public[TP_ZSEC_KEY_LEN + 1];
    char public_key[TP_ZSEC_KEY_LEN + 1];
    char secret_key[TP_ZSEC_KEY_LEN + 1];
} tp_zsec_client;

/* Load the client keys the config names (security.server_public_key,
 * security.client_secret_key) when security.curve is on; otherwise *out
 * is plain (on = false). */
int tp_zsec_client_load(const tp_config *cfg, tp_zsec_client *out, tp_err *err);

/* Before zmq_connect(sock, endpoint): with c->on and a tcp endpoint, make
 * sock a CURVE client of the broker. c may be NULL (plain). */
int tp_zsec_client_apply(const tp_zsec_client *c, void *sock, const char *endpoint, tp_err *err);

/* ---- server side (tokpiped) ---------------------------------------------- */

typedef struct tp_zsec_server tp_zsec_server;

/* Called with one line for the log (no newline). */
typedef void (*tp_zsec_log_fn)(void *ctx, const char *line);

/* With security.curve on: read the broker's secret key (checked against
 * security.server_public_key when that is set too) and the authorized keys,
 * and bind the ZAP handler in zctx. Must run before any CURVE socket binds:
 * without a handler libzmq would admit every key. With curve off *out is
 * NULL and nothing is done. Owned by the caller (tp_zsec_server_free, which
 * must run before zmq_ctx_term). */
int tp_zsec_server_new(void *zctx, const tp_config *cfg, tp_zsec_log_fn log, void *log_ctx,
                       tp_zsec_server **out, tp_err *err);

typedef enum tp_zsec_role {
    TP_ZSEC_CLIENT = 1, /* producers and subscribers: front, events */
    TP_ZSEC_WORKER = 2, /* stage workers: back, publish */
} tp_zsec_role;

/* Before zmq_bind(sock, endpoint): with a tcp endpoint make sock a CURVE
 * server admitting the keys of role. s may be NULL (security off: nothing
 * to do). */
int tp_zsec_server_apply(const tp_zsec_server *s, void *sock, const char *endpoint, tp_zsec_role role,
                         tp_err *err);

/* The ZAP socket to poll for ZMQ_POLLIN (NULL for a NULL server). */
void *tp_zsec_server_socket(const tp_zsec_server *s);

/* Answer every ZAP request waiting (never blocks): 200 for a listed key,
 * 400 otherwise (counted, logged at most once a second with a count of the
 * ones not logged). */
void tp_zsec_server_handle(tp_zsec_server *s);

/* Connections refused so far (0 for NULL). */
uint64_t tp_zsec_server_refused(const tp_zsec_server *s);

/* Number of distinct keys loaded (any role). */
size_t tp_zsec_server_n_authorized(const tp_zsec_server *s);

void tp_zsec_server_free(tp_zsec_server *s);

#endif
