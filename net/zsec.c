/* CURVE keys, socket options and the broker's ZAP handler (see zsec.h).
 * ZAP is RFC 27 (rfc.zeromq.org/spec/27): libzmq asks the handler bound at
 * inproc://zeromq.zap.01 about every CURVE handshake, passing the client's
 * 32-byte public key as the credentials frame. */
#include "tokpipe/zsec.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "tokpipe/zwire.h"

#define KEY_BYTES 32
#define MAX_FILE_BYTES (16u << 20)
#define LOG_EVERY_MS 1000

struct tp_zsec_server {
    void *zap;                         /* REP bound at TP_ZSEC_ZAP_ENDPOINT */
    char public_key[TP_ZSEC_KEY_LEN + 1];
    char secret_key[TP_ZSEC_KEY_LEN + 1];
    struct zkey {
        uint8_t k[KEY_BYTES];
        unsigned roles;                /* tp_zsec_role bits */
    } *keys;                           /* sorted by k, each key once */
    size_t n_keys, cap_keys;
    char files[3 * 4200];              /* the key files read, for log lines */
    uint64_t refused, unlogged;
    int64_t last_log_ms;
    tp_zsec_log_fn log;
    void *log_ctx;
};

/* ---- key files ------------------------------------------------------------ */

/* ssh's rule for private keys: nobody else may touch it; a file owned by
 * someone else (root:tokpipe 0640) may share it with its group. */
static int check_mode(const char *path, const struct stat *st, bool secret, tp_err *err)
{
    unsigned mode = (unsigned)st->st_mode & 0777;
    if (secret && ((mode & 0007) || (st->st_uid == geteuid() && (mode & 0070))))
        return tp_err_set(err, TP_EINVAL,
                          "%s: secret key file has mode 0%03o, readable by others: refused (chmod 600 %s)", path,
                          mode, path);
    if (!secret && (mode & 0022))
        return tp_err_set(err, TP_EINVAL,
                          "%s: authorized keys file has mode 0%03o, others could add keys: refused (chmod go-w %s)",
                          path, mode, path);
    return 0;
}

/* The whole file as a NUL-terminated string (caller frees). check:
 * 0 none, 1 secret key rules, 2 authorized keys rules. */
static int slurp(const char *path, int check, char **out, tp_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tp_err_set(err, TP_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st))
        rc = tp_err_set(err, TP_EIO, "%s: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = tp_err_set(err, TP_EINVAL, "%s: not a regular file", path);
    else if (st.st_size > (off_t)MAX_FILE_BYTES)
        rc = tp_err_set(err, TP_ERANGE, "%s: larger than 16 MiB", path);
    else if (check)
        rc = check_mode(path, &st, check == 1, err);
    char *buf = rc ? NULL : malloc((size_t)st.st_size + 1);
    if (!rc && !buf)
        rc = tp_err_set(err, TP_ENOMEM, "%s: out of memory", path);
    size_t len = 0;
    while (!rc && len < (size_t)st.st_size) {
        ssize_t got = read(fd, buf + len, (size_t)st.st_size - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            rc = tp_err_set(err, TP_EIO, "%s: read error", path);
        else
            len += (size_t)got;
    }
    close(fd);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[len] = '\0';
    *out = buf;
    return 0;
}

/* Next key line of text starting at *p (advanced past it): 1 with the key
 * copied to key (NUL-terminated) and its line number in *line, 0 at the
 * end, or an error naming path:line. */
static int next_key(const char *path, const char **p, int *line, char key[TP_ZSEC_KEY_LEN + 1], tp_err *err)
{
    while (**p) {
        const char *s = *p, *nl = strchr(s, '\n');
        size_t n = nl ? (size_t)(nl - s) : strlen(s);
        *p = nl ? nl + 1 : s + n;
        ++*line;
        while (n && (*s == ' ' || *s == '\t'))
            s++, n--;
        while (n && (s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '\t'))
            n--;
        if (!n || *s == '#')
            continue;
        size_t k = strcspn(s, " \t\r\n");
        if (k > n)
            k = n;
        uint8_t bin[KEY_BYTES];
        if (k == TP_ZSEC_KEY_LEN) {
            memcpy(key, s, k);
            key[k] = '\0';
            if (zmq_z85_decode(bin, key))
                return 1;
        }
        return tp_err_set(err, TP_EFORMAT, "%s:%d: not a CURVE key (expected 40 Z85 characters, got '%.*s')",
                          path, *line, (int)(k > 48 ? 48 : k), s);
    }
    return 0;
}

/* ssh's StrictModes for the folder of a secret key: whoever may write the
 * folder may replace the key with one they know. A sticky folder (/tmp)
 * only lets owners replace their own files. */
static int check_key_dir(const char *path, tp_err *err)
{
    char *copy = strdup(path);
    if (!copy)
        return tp_err_set(err, TP_ENOMEM, "%s: out of memory", path);
    const char *d = dirname(copy);
    struct stat st;
    int rc = 0;
    if (stat(d, &st))
        rc = tp_err_set(err, TP_EIO, "%s: %s", d, strerror(errno));
    else if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))
        rc = tp_err_set(err, TP_EINVAL,
                        "%s: the folder of secret key %s has mode 0%03o: others could replace the key: refused "
                        "(chmod go-w %s)", d, path, (unsigned)st.st_mode & 0777, d);
    free(copy);
    return rc;
}

int tp_zsec_read_key(const char *path, bool secret, char out[TP_ZSEC_KEY_LEN + 1], tp_err *err)
{
    char *text;
    int rc = secret ? check_key_dir(path, err) : 0;
    if (rc)
        return rc;
    rc = slurp(path, secret ? 1 : 0, &text, err);
    if (rc)
        return rc;
    const char *p = text;
    int line = 0;
    char extra[TP_ZSEC_KEY_LEN + 1];
    rc = next_key(path, &p, &line, out, err);
    if (rc == 0)
        rc = tp_err_set(err, TP_EFORMAT, "%s: no key in the file", path);
    else if (rc == 1 && (rc = next_key(path, &p, &line, extra, err)) == 1)
        rc = tp_err_set(err, TP_EFORMAT, "%s:%d: a second key: a key file holds one key", path, line);
    free(text);
    return rc < 0 ? rc : 0;
}

int tp_zsec_public_of(const char *secret, char out[TP_ZSEC_KEY_LEN + 1], tp_err *err)
{
    if (zmq_curve_public(out, secret))
        return tp_err_set(err, TP_EINVAL, "cannot derive a public key: %s", zmq_strerror(zmq_errno()));
    return 0;
}

/* ---- keygen ---------------------------------------------------------------- */

static int create_excl(const char *path, mode_t mode, tp_err *err)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0)
        return errno == EEXIST ? tp_err_set(err, TP_EINVAL, "%s exists: not overwriting a key", path)
                               : tp_err_set(err, TP_EIO, "%s: cannot create: %s", path, strerror(errno));
    if (fchmod(fd, mode)) {   /* exact mode whatever the umask */
        close(fd);
        unlink(path);
        return tp_err_set(err, TP_EIO, "%s: chmod: %s", path, strerror(errno));
    }
    return fd;
}

static int write_all(int fd, const char *path, const char *text, tp_err *err)
{
    size_t len = strlen(text), done = 0;
    while (done < len) {
        ssize_t w = write(fd, text + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return tp_err_set(err, TP_EIO, "%s: write: %s", path, strerror(errno));
        done += (size_t)w;
    }
    if (fsync(fd))
        return tp_err_set(err, TP_EIO, "%s: fsync: %s", path, strerror(errno));
    return 0;
}

int tp_zsec_keygen(const char *prefix, tp_err *err)
{
    char kpath[4096], ppath[4096], label[256];
    if (!*prefix || (size_t)snprintf(kpath, sizeof kpath, "%s.key", prefix) >= sizeof kpath)
        return tp_err_set(err, TP_EINVAL, "keygen: bad output prefix '%.100s'", prefix);
    snprintf(ppath, sizeof ppath, "%s.pub", prefix);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", prefix);
    snprintf(label, sizeof label, "%s", basename(tmp));
    const char *exists = access(kpath, F_OK) == 0 ? kpath : access(ppath, F_OK) == 0 ? ppath : NULL;
    if (exists)
        return tp_err_set(err, TP_EINVAL, "%s exists: not overwriting a key", exists);
    char pub[TP_ZSEC_KEY_LEN + 1], sec[TP_ZSEC_KEY_LEN + 1];
    if (zmq_curve_keypair(pub, sec))
        return tp_err_set(err, TP_EIO, "zmq_curve_keypair: %s (is libzmq built with CURVE?)",
                          zmq_strerror(zmq_errno()));
    char ktext[256], ptext[512];
    snprintf(ktext, sizeof ktext, "# tokpipe CURVE secret key (Z85). Keep it private (mode 0600).\n"
                                  "# public key: %s\n%s\n", pub, sec);
    snprintf(ptext, sizeof ptext, "%s %s\n", pub, label);
    int kfd = create_excl(kpath, 0600, err);
    if (kfd < 0)
        return kfd;
    int pfd = create_excl(ppath, 0644, err);
    int rc = pfd < 0 ? pfd : 0;
    if (!rc)
        rc = write_all(kfd, kpath, ktext, err);
    if (!rc)
        rc = write_all(pfd, ppath, ptext, err);
    close(kfd);
    if (pfd >= 0)
        close(pfd);
    if (rc) {
        unlink(kpath);
        if (pfd >= 0)
            unlink(ppath);
    }
    memset(sec, 0, sizeof sec);
    memset(ktext, 0, sizeof ktext);
    return rc;
}

/* ---- client ---------------------------------------------------------------- */

static bool is_tcp(const char *endpoint)
{
    return endpoint && !strncmp(endpoint, "tcp://", 6);
}

static int need_key(const tp_config *cfg, const char *path, const char *key, tp_err *err)
{
    if (path && *path)
        return 0;
    return tp_err_set(err, TP_EINVAL, "%s: %s is empty: it is needed with security.curve: true", cfg->source, key);
}

int tp_zsec_client_load(const tp_config *cfg, tp_zsec_client *out, tp_err *err)
{
    memset(out, 0, sizeof *out);
    if (!cfg->curve)
        return 0;
    int rc;
    if ((rc = need_key(cfg, cfg->server_public_key, "security.server_public_key", err)) ||
        (rc = need_key(cfg, cfg->client_secret_key, "security.client_secret_key", err)) ||
        (rc = tp_zsec_read_key(cfg->server_public_key, false, out->server_public, err)) ||
        (rc = tp_zsec_read_key(cfg->client_secret_key, true, out->secret_key, err)) ||
        (rc = tp_zsec_public_of(out->secret_key, out->public_key, err))) {
        memset(out, 0, sizeof *out);
        return rc;
    }
    out->on = true;
    return 0;
}

int tp_zsec_client_apply(const tp_zsec_client *c, void *sock, const char *endpoint, tp_err *err)
{
    if (!c || !c->on || !is_tcp(endpoint))
        return 0;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, c->server_public, TP_ZSEC_KEY_LEN + 1) ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, c->public_key, TP_ZSEC_KEY_LEN + 1) ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, c->secret_key, TP_ZSEC_KEY_LEN + 1))
        return tp_err_set(err, TP_EIO, "%s: CURVE client options: %s", endpoint, zmq_strerror(zmq_errno()));
    return 0;
}

/* ---- server ---------------------------------------------------------------- */

static int cmp_key(const void *a, const void *b)
{
    return memcmp(a, b, KEY_BYTES);
}

static const char *role_name(unsigned role)
{
    return role == TP_ZSEC_CLIENT ? "client" : role == TP_ZSEC_WORKER ? "worker" : "client and worker";
}

/* Add the keys of one file with the given role bits. A file that holds no
 * key is refused: with it nobody could connect, which is never meant. */
static int load_keys(tp_zsec_server *s, const char *path, unsigned roles, tp_err *err)
{
    char *text;
    int rc = slurp(path, 2, &text, err);
    if (rc)
        return rc;
    const char *p = text;
    int line = 0;
    size_t got = 0;
    char key[TP_ZSEC_KEY_LEN + 1];
    while ((rc = next_key(path, &p, &line, key, err)) == 1) {
        if (s->n_keys == TP_ZSEC_MAX_AUTHORIZED) {
            rc = tp_err_set(err, TP_ERANGE, "%s:%d: more than %d keys", path, line, TP_ZSEC_MAX_AUTHORIZED);
            break;
        }
        if (s->n_keys == s->cap_keys) {
            size_t cap = s->cap_keys ? 2 * s->cap_keys : 16;
            void *nk = realloc(s->keys, cap * sizeof *s->keys);
            if (!nk) {
                rc = tp_err_set(err, TP_ENOMEM, "%s: out of memory", path);
                break;
            }
            s->keys = nk;
            s->cap_keys = cap;
        }
        zmq_z85_decode(s->keys[s->n_keys].k, key);
        s->keys[s->n_keys++].roles = roles;
        got++;
    }
    free(text);
    if (rc < 0)
        return rc;
    if (!got)
        return tp_err_set(err, TP_EINVAL, "%s: holds no key: nobody could connect as a %s (add `cat PREFIX.pub >> %s`)",
                          path, role_name(roles), path);
    size_t used = strlen(s->files);
    snprintf(s->files + used, sizeof s->files - used, "%s%s (%s)", used ? ", " : "", path, role_name(roles));
    return 0;
}

/* Sort, and merge a key listed in several files into one entry with the
 * union of its roles. */
static void index_keys(tp_zsec_server *s)
{
    qsort(s->keys, s->n_keys, sizeof *s->keys, cmp_key);
    size_t w = 0;
    for (size_t r = 0; r < s->n_keys; r++)
        if (w && !cmp_key(&s->keys[w - 1], &s->keys[r]))
            s->keys[w - 1].roles |= s->keys[r].roles;
        else
            s->keys[w++] = s->keys[r];
    s->n_keys = w;
}

static size_t count_role(const tp_zsec_server *s, unsigned role)
{
    size_t n = 0;
    for (size_t i = 0; i < s->n_keys; i++)
        n += (s->keys[i].roles & role) != 0;
    return n;
}

static int load_server_keys(tp_zsec_server *s, const tp_config *cfg, tp_err *err)
{
    int rc;
    if ((rc = need_key(cfg, cfg->server_secret_key, "security.server_secret_key", err)) ||
        (rc = tp_zsec_read_key(cfg->server_secret_key, true, s->secret_key, err)) ||
        (rc = tp_zsec_public_of(s->secret_key, s->public_key, err)))
        return rc;
    if (cfg->server_public_key && *cfg->server_public_key) {
        /* one config serves broker and workers: catch a .pub from another pair */
        char pub[TP_ZSEC_KEY_LEN + 1];
        if ((rc = tp_zsec_read_key(cfg->server_public_key, false, pub, err)))
            return rc;
        if (strcmp(pub, s->public_key))
            return tp_err_set(err, TP_EINVAL, "%s: security.server_public_key %s is not the public key of %s",
                              cfg->source, cfg->server_public_key, cfg->server_secret_key);
    }
    const struct { const char *path; unsigned roles; } files[] = {
        {cfg->client_keys, TP_ZSEC_CLIENT},
        {cfg->worker_keys, TP_ZSEC_WORKER},
        {cfg->authorized_keys, TP_ZSEC_CLIENT | TP_ZSEC_WORKER},
    };
    bool any = false;
    for (size_t i = 0; i < 3; i++)
        if (files[i].path && *files[i].path) {
            any = true;
            if ((rc = load_keys(s, files[i].path, files[i].roles, err)))
                return rc;
        }
    if (!any)
        return tp_err_set(err, TP_EINVAL,
                          "%s: security.client_keys and security.worker_keys are empty (and so is "
                          "security.authorized_keys): they are needed with security.curve: true",
                          cfg->source);
    index_keys(s);
    return 0;
}

/* Say which endpoints CURVE covers: all-ipc with curve on is legal but
 * secures nothing, which an operator should hear about. */
static void log_start(tp_zsec_server *s, const tp_config *cfg)
{
    const char *names[] = {"front", "back", "events", "publish"};
    const char *eps[] = {cfg->ep_front, cfg->ep_back, cfg->ep_events, cfg->ep_publish};
    char list[64] = "", line[sizeof s->files + 200];
    for (int i = 0; i < 4; i++)
        if (is_tcp(eps[i]))
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", *list ? ", " : "", names[i]);
    if (*list)
        snprintf(line, sizeof line, "CURVE on the tcp endpoints (%s): %zu client and %zu worker key%s from %s",
                 list, count_role(s, TP_ZSEC_CLIENT), count_role(s, TP_ZSEC_WORKER),
                 count_role(s, TP_ZSEC_WORKER) == 1 ? "" : "s", s->files);
    else
        snprintf(line, sizeof line, "security.curve is on but every endpoint is ipc: nothing is encrypted "
                                    "(ipc stays plain; see PROTOCOL.md section 7)");
    if (s->log)
        s->log(s->log_ctx, line);
    if (*list && cfg->authorized_keys && *cfg->authorized_keys && s->log) {
        snprintf(line, sizeof line, "warning: the keys in security.authorized_keys (%s) may act as clients AND "
                                    "as workers (receive prompts, publish events): list them in "
                                    "security.client_keys or security.worker_keys instead", cfg->authorized_keys);
        s->log(s->log_ctx, line);
    }
}

int tp_zsec_server_new(void *zctx, const tp_config *cfg, tp_zsec_log_fn log, void *log_ctx,
                       tp_zsec_server **out, tp_err *err)
{
    *out = NULL;
    if (!cfg->curve)
        return 0;
    if (!zmq_has("curve"))
        return tp_err_set(err, TP_EINVAL, "%s: security.curve: this libzmq is built without CURVE", cfg->source);
    tp_zsec_server *s = calloc(1, sizeof *s);
    if (!s)
        return tp_err_set(err, TP_ENOMEM, "zsec: out of memory");
    s->log = log;
    s->log_ctx = log_ctx;
    int rc = load_server_keys(s, cfg, err);
    if (!rc && !(s->zap = zmq_socket(zctx, ZMQ_REP)))
        rc = tp_err_set(err, TP_EIO, "ZAP socket: %s", zmq_strerror(zmq_errno()));
    int zero = 0;
    if (!rc && (zmq_setsockopt(s->zap, ZMQ_LINGER, &zero, sizeof zero) || zmq_bind(s->zap, TP_ZSEC_ZAP_ENDPOINT)))
        rc = tp_err_set(err, TP_EIO, "bind %s: %s", TP_ZSEC_ZAP_ENDPOINT, zmq_strerror(zmq_errno()));
    if (rc) {
        tp_zsec_server_free(s);
        return rc;
    }
    log_start(s, cfg);
    *out = s;
    return 0;
}

int tp_zsec_server_apply(const tp_zsec_server *s, void *sock, const char *endpoint, tp_zsec_role role,
                         tp_err *err)
{
    if (!s || !is_tcp(endpoint))
        return 0;
    int one = 1;
    const char *domain = role == TP_ZSEC_WORKER ? TP_ZSEC_DOMAIN_WORKER : TP_ZSEC_DOMAIN_CLIENT;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one) ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, s->secret_key, TP_ZSEC_KEY_LEN + 1) ||
        zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, domain, strlen(domain)))
        return tp_err_set(err, TP_EIO, "%s: CURVE server options: %s", endpoint, zmq_strerror(zmq_errno()));
    return 0;
}

void *tp_zsec_server_socket(const tp_zsec_server *s)
{
    return s ? s->zap : NULL;
}

uint64_t tp_zsec_server_refused(const tp_zsec_server *s)
{
    return s ? s->refused : 0;
}

size_t tp_zsec_server_n_authorized(const tp_zsec_server *s)
{
    return s ? s->n_keys : 0;
}

static void log_refusal(tp_zsec_server *s, unsigned role, const char *address, const char *mech, const uint8_t *key,
                        size_t klen)
{
    int64_t now = tp_now_ms();
    if (s->last_log_ms && now - s->last_log_ms < LOG_EVERY_MS) {
        s->unlogged++;
        return;
    }
    char z85[TP_ZSEC_KEY_LEN + 1] = "(none)", more[64] = "";
    if (klen == KEY_BYTES)
        zmq_z85_encode(z85, key, KEY_BYTES);
    if (s->unlogged)
        snprintf(more, sizeof more, " (and %llu more in the last second)", (unsigned long long)s->unlogged);
    char line[400 + sizeof s->files];
    snprintf(line, sizeof line, "refused a %s peer from %s on the %s endpoints: key %s is not a %s key in %s; "
             "%llu refused so far%s", mech, address, role_name(role), z85, role_name(role), s->files,
             (unsigned long long)s->refused, more);
    s->last_log_ms = now;
    s->unlogged = 0;
    if (s->log)
        s->log(s->log_ctx, line);
}

/* The ZAP request frames (RFC 27): version, request id, domain, address,
 * identity, mechanism, credentials... */
enum { Z_VERSION, Z_REQID, Z_DOMAIN, Z_ADDRESS, Z_IDENTITY, Z_MECH, Z_CRED, Z_MAX = 8 };

static bool frame_is(const zmq_msg_t *m, const char *s)
{
    return zmq_msg_size((zmq_msg_t *)m) == strlen(s) && !memcmp(zmq_msg_data((zmq_msg_t *)m), s, strlen(s));
}

/* 200 for a CURVE key listed in the socket's role; 400 for everything else
 * on our domains. */
static const char *verdict(tp_zsec_server *s, zmq_msg_t *f, size_t n)
{
    if (n < Z_CRED || !frame_is(&f[Z_VERSION], "1.0"))
        return "500";
    unsigned role = frame_is(&f[Z_DOMAIN], TP_ZSEC_DOMAIN_CLIENT)   ? TP_ZSEC_CLIENT
                    : frame_is(&f[Z_DOMAIN], TP_ZSEC_DOMAIN_WORKER) ? TP_ZSEC_WORKER
                                                                    : 0;
    if (!role)
        return "200";   /* not one of our CURVE sockets (plain ipc) */
    bool ok = false;
    if (n > Z_CRED && frame_is(&f[Z_MECH], "CURVE") && zmq_msg_size(&f[Z_CRED]) == KEY_BYTES) {
        const struct zkey *k = bsearch(zmq_msg_data(&f[Z_CRED]), s->keys, s->n_keys, sizeof *s->keys, cmp_key);
        ok = k && (k->roles & role);
    }
    if (ok)
        return "200";
    s->refused++;
    char addr[64], mech[16];
    snprintf(addr, sizeof addr, "%.*s", (int)zmq_msg_size(&f[Z_ADDRESS]), (char *)zmq_msg_data(&f[Z_ADDRESS]));
    snprintf(mech, sizeof mech, "%.*s", (int)zmq_msg_size(&f[Z_MECH]), (char *)zmq_msg_data(&f[Z_MECH]));
    log_refusal(s, role, addr, mech, n > Z_CRED ? zmq_msg_data(&f[Z_CRED]) : NULL, n > Z_CRED ? zmq_msg_size(&f[Z_CRED]) : 0);
    return "400";
}

static void reply(tp_zsec_server *s, const zmq_msg_t *reqid, const char *code)
{
    const char *text = !strcmp(code, "200") ? "OK" : !strcmp(code, "400") ? "key not authorized" : "bad request";
    zmq_send(s->zap, "1.0", 3, ZMQ_SNDMORE);
    zmq_send(s->zap, reqid ? zmq_msg_data((zmq_msg_t *)reqid) : "", reqid ? zmq_msg_size((zmq_msg_t *)reqid) : 0,
             ZMQ_SNDMORE);
    zmq_send(s->zap, code, 3, ZMQ_SNDMORE);
    zmq_send(s->zap, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(s->zap, "", 0, ZMQ_SNDMORE);   /* user id */
    zmq_send(s->zap, "", 0, 0);             /* metadata */
}

void tp_zsec_server_handle(tp_zsec_server *s)
{
    if (!s)
        return;
    for (;;) {
        zmq_msg_t f[Z_MAX];
        size_t n = 0;
        int more = 1;
        while (more) {
            zmq_msg_t tmp, *m = n < Z_MAX ? &f[n] : &tmp;
            zmq_msg_init(m);
            if (zmq_msg_recv(m, s->zap, n ? 0 : ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(m);
                for (size_t i = 0; i < n && i < Z_MAX; i++)
                    zmq_msg_close(&f[i]);
                return;   /* EAGAIN: nothing (more) waiting */
            }
            more = zmq_msg_more(m);
            if (m == &tmp)
                zmq_msg_close(&tmp);
            else
                n++;
        }
        reply(s, n > Z_REQID ? &f[Z_REQID] : NULL, verdict(s, f, n));
        for (size_t i = 0; i < n; i++)
            zmq_msg_close(&f[i]);
    }
}

void tp_zsec_server_free(tp_zsec_server *s)
{
    if (!s)
        return;
    if (s->zap)
        zmq_close(s->zap);
    free(s->keys);
    memset(s->secret_key, 0, sizeof s->secret_key);
    free(s);
}
