/* A standby broker: the ZeroMQ guide's Binary Star (chapter 4, "bstar").
 * A primary and a backup tokpiped publish their state to each other; the
 * backup takes over only when it has lost the primary *and* a client asks
 * it something, and a primary that comes back while the backup is active
 * stands down. Without standby.role every broker is active. */
#ifndef TOKPIPED_STANDBY_H
#define TOKPIPED_STANDBY_H

#include <stdbool.h>
#include <stdint.h>

#include "state.h"

/* The pattern's states and events (bstar.c's names). */
enum { BS_PRIMARY = 1, BS_BACKUP, BS_ACTIVE, BS_PASSIVE };
enum { BS_PEER_PRIMARY = 1, BS_PEER_BACKUP, BS_PEER_ACTIVE, BS_PEER_PASSIVE, BS_CLIENT_REQUEST };

/* The state machine alone (no sockets): a role's state, the time the peer
 * is judged gone at. */
typedef struct bstar {
    int role;                /* TP_STANDBY_PRIMARY or _BACKUP: who stands down from two actives */
    int state;
    int64_t peer_expiry;
    int64_t failover_ms;
} bstar;

/* bs starts in role's state (TP_STANDBY_PRIMARY or _BACKUP); the peer
 * counts as alive for failover_ms from now. */
void bstar_init(bstar *bs, int role, int64_t failover_ms, int64_t now);

/* Apply event at now. A peer's state refreshes its expiry. Returns true
 * when the event is accepted: false refuses a CLIENT_REQUEST (this broker
 * is not, and may not become, the active one). *why, when the state
 * changed or an event was refused for a reason worth a log line, names it
 * (static text), else NULL. */
bool bstar_event(bstar *bs, int event, int64_t now, const char **why);

const char *bstar_state_name(int state);

/* ---- the broker's glue ------------------------------------------------------------- */

/* Bind the state PUB, connect the peer's state SUB (cfg standby.*); no-op
 * without a role. 0 or an error in err. */
int standby_open(broker *b, tp_err *err);
void standby_close(broker *b);

/* The peer's state socket (poll it for POLLIN), or NULL. */
void *standby_socket(broker *b);

/* Read the peer's states; publish ours when due. Call every loop turn. */
void standby_tick(broker *b, int64_t now);

/* A client's job request (SUBMIT, CANCEL, STATUS) arrived: may this
 * broker serve it? (A passive one refuses; a backup whose primary is gone
 * takes over here.) */
bool standby_client_request(broker *b);

/* Does this broker serve now: take workers, publish heartbeats? Active,
 * or a primary that has not heard from its peer within failover_ms. */
bool standby_serving(const broker *b);

#endif
