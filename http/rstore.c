/* Stored responses (POST /v1/responses with store: true): each one's
 * response object (what GET /v1/responses/{id} answers) and its whole
 * conversation as chat turns (what previous_response_id continues), kept
 * in memory within a count and a byte bound (http.responses_max_count,
 * http.responses_max_bytes), the least recently used going first.
 *
 * A list in recency order, searched linearly: the count bound keeps the
 * search short next to a job's cost (and next to the JSON it copies). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "gw.h"

typedef struct rs_entry {
    struct rs_entry *prev, *next;   /* prev: more recently used */
    char *id, *response, *conversation;
    size_t bytes;
} rs_entry;

struct gw_rstore {
    pthread_mutex_t lock;
    rs_entry *head, *tail;          /* head: the most recently used */
    size_t count, bytes, max_count, max_bytes;
};

gw_rstore *gw_rstore_new(size_t max_count, size_t max_bytes)
{
    gw_rstore *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    pthread_mutex_init(&s->lock, NULL);
    s->max_count = max_count;
    s->max_bytes = max_bytes;
    return s;
}

static void entry_free(rs_entry *e)
{
    free(e->id);
    free(e->response);
    free(e->conversation);
    free(e);
}

static void unlink_entry(gw_rstore *s, rs_entry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        s->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        s->tail = e->prev;
    e->prev = e->next = NULL;
}

static void push_front(gw_rstore *s, rs_entry *e)
{
    e->prev = NULL;
    e->next = s->head;
    if (s->head)
        s->head->prev = e;
    s->head = e;
    if (!s->tail)
        s->tail = e;
}

static void remove_entry(gw_rstore *s, rs_entry *e)
{
    unlink_entry(s, e);
    s->count--;
    s->bytes -= e->bytes;
    entry_free(e);
}

static rs_entry *find(gw_rstore *s, const char *id)
{
    for (rs_entry *e = s->head; e; e = e->next)
        if (!strcmp(e->id, id))
            return e;
    return NULL;
}

void gw_rstore_free(gw_rstore *s)
{
    if (!s)
        return;
    while (s->head)
        remove_entry(s, s->head);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

int gw_rstore_put(gw_rstore *s, const char *id, const char *response, const char *conversation)
{
    size_t bytes = strlen(id) + strlen(response) + strlen(conversation) + sizeof(rs_entry);
    pthread_mutex_lock(&s->lock);
    rs_entry *old = find(s, id);
    if (old)
        remove_entry(s, old);
    if (!s->max_count || bytes > s->max_bytes) {
        pthread_mutex_unlock(&s->lock);
        return 0;
    }
    rs_entry *e = calloc(1, sizeof *e);
    if (e) {
        e->id = strdup(id);
        e->response = strdup(response);
        e->conversation = strdup(conversation);
        e->bytes = bytes;
    }
    if (!e || !e->id || !e->response || !e->conversation) {
        if (e)
            entry_free(e);
        pthread_mutex_unlock(&s->lock);
        return -1;
    }
    while (s->tail && (s->count + 1 > s->max_count || s->bytes + bytes > s->max_bytes))
        remove_entry(s, s->tail);
    push_front(s, e);
    s->count++;
    s->bytes += bytes;
    pthread_mutex_unlock(&s->lock);
    return 0;
}

bool gw_rstore_get(gw_rstore *s, const char *id, char **response, char **conversation)
{
    if (response)
        *response = NULL;
    if (conversation)
        *conversation = NULL;
    pthread_mutex_lock(&s->lock);
    rs_entry *e = find(s, id);
    if (e) {
        unlink_entry(s, e);
        push_front(s, e);
        if (response)
            *response = strdup(e->response);
        if (conversation)
            *conversation = strdup(e->conversation);
    }
    pthread_mutex_unlock(&s->lock);
    return e != NULL;
}

bool gw_rstore_delete(gw_rstore *s, const char *id)
{
    pthread_mutex_lock(&s->lock);
    rs_entry *e = find(s, id);
    if (e)
        remove_entry(s, e);
    pthread_mutex_unlock(&s->lock);
    return e != NULL;
}

void gw_rstore_usage(gw_rstore *s, size_t *count, size_t *bytes)
{
    pthread_mutex_lock(&s->lock);
    *count = s->count;
    *bytes = s->bytes;
    pthread_mutex_unlock(&s->lock);
}
