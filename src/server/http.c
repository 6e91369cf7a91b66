/* HTTP layer of `tandem serve`, on libmicrohttpd.
 *
 * Why libmicrohttpd (Debian libmicrohttpd-dev): a small, long-maintained C
 * library (GNU project) with its own internal polling threads (epoll, a
 * thread pool or thread-per-connection), connection suspend/resume so a
 * streamed response can wait for the scheduler without a thread per
 * client, chunked responses of unknown length for Server-Sent Events, a
 * request-completed callback that tells us when a client went away, and
 * no dependencies beyond libc.
 *
 * Threads: libmicrohttpd's polling threads run the handlers below (I/O,
 * routing, auth, small replies); prompt workers parse, render and tokenize
 * the requests that may be large (generation, /tokenize, /detokenize) with
 * the connection suspended; the scheduler thread runs gen.c's callbacks
 * and resumes suspended connections; a watchdog thread polls the sockets
 * of suspended requests (libmicrohttpd does not watch those) to cancel
 * requests whose client disconnected. All state lives in struct srv.
 *
 * Hardening: at most --max-connections-per-ip connections per address and
 * --idle-timeout seconds without traffic (suspended connections, waiting
 * for the scheduler, are exempt; libmicrohttpd restarts the clock when they
 * resume); request framing is strict (only the chunked transfer-coding; one
 * Content-Length; not both); error messages are made valid UTF-8; a client
 * that half-closes after its request still gets the answer (on_request). */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "server/srv_internal.h"
#include "util/err.h"

double td_srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct timespec td_srv_deadline(long ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += ms % 1000 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    return ts;
}

uint64_t td_srv_next_id(srv *s) { return atomic_fetch_add(&s->next_id, 1) + 1; }

/* ---- replies ------------------------------------------------------------- */

/* Length of the valid UTF-8 character at p (n bytes left); 0: invalid or cut. */
static size_t utf8_char(const unsigned char *p, size_t n) {
    unsigned c = p[0], min, cp;
    size_t len;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) len = 2, min = 0x80;
    else if ((c & 0xf0) == 0xe0) len = 3, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4) len = 4, min = 0x10000;
    else return 0;
    if (n < len) return 0;
    cp = c & (0x3fu >> (len - 1));
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (p[i] & 0x3fu);
    }
    return cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) ? 0 : len;
}

size_t td_srv_utf8_clean(const char *in, char *out, size_t cap) {
    if (!cap) return 0;
    const unsigned char *p = (const unsigned char *)in;
    size_t n = strlen(in), o = 0;
    for (size_t i = 0; i < n;) {
        size_t l = utf8_char(p + i, n - i);
        if (l) {
            if (o + l >= cap) break;
            memcpy(out + o, p + i, l);
            o += l;
            i += l;
        } else {
            if (o + 4 >= cap) break;
            snprintf(out + o, 5, "\\x%02X", p[i]);
            o += 4;
            i++;
        }
    }
    out[o] = 0;
    return o;
}

enum MHD_Result td_srv_reply(srv *s, struct MHD_Connection *c, int status, const char *ctype, const char *body, size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    if (ctype) MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    td_srv_cors_headers(s, c, r);
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    td_metrics_http(&s->metrics, status);
    return rc;
}

enum MHD_Result td_srv_reply_json(srv *s, struct MHD_Connection *c, int status, json_t *body) {
    char *t = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!t) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"code\":500}}";
        return td_srv_reply(s, c, 500, "application/json", oom, sizeof oom - 1);
    }
    enum MHD_Result rc = td_srv_reply(s, c, status, "application/json", t, strlen(t));
    free(t);
    return rc;
}

/* The API of the request being answered on this thread, for the shape of
 * its errors: libmicrohttpd queues every reply inside the access handler,
 * and on_request sets this from the URL on each call, so an error from
 * anywhere below (routing, auth, parsing, the job) takes that API's form. */
static _Thread_local int reply_dialect;

enum MHD_Result td_srv_reply_error(srv *s, struct MHD_Connection *c, const http_err *e) {
    char msg[4 * sizeof e->msg]; /* every byte escaped at worst */
    td_srv_utf8_clean(e->msg, msg, sizeof msg);
    json_t *err = json_pack("{s:s, s:s, s:i}", "message", msg, "type", e->type ? e->type : "invalid_request_error", "code", e->status);
    if (err) json_object_set_new(err, "param", e->param ? json_string(e->param) : json_null());
    if (err && e->n_ctx > 0) {
        json_object_set_new(err, "n_prompt_tokens", json_integer(e->n_prompt));
        json_object_set_new(err, "n_ctx", json_integer(e->n_ctx));
    }
    json_t *o = err ? json_pack("{s:o}", "error", err) : NULL;
    if (reply_dialect == DIALECT_ANTHROPIC) { /* {"type":"error","error":{"type":...,"message":...}} */
        json_decref(o);
        o = td_anth_error_body(e->status, msg);
    }
    char *t = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    const char *body = t ? t : "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"code\":500}}";
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    free(t);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (e->retry_after) MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (e->status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (e->allow) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, e->allow);
    td_srv_cors_headers(s, c, r);
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)e->status, r);
    MHD_destroy_response(r);
    td_metrics_http(&s->metrics, e->status);
    return rc;
}

static enum MHD_Result reply_err(srv *s, struct MHD_Connection *c, int status, const char *type, const char *msg) {
    http_err e;
    td_http_err_set(&e, status, type, "%s", msg);
    return td_srv_reply_error(s, c, &e);
}

static enum MHD_Result reply_405(srv *s, struct MHD_Connection *c, const char *allow) {
    http_err e;
    td_http_err_set(&e, 405, "invalid_request_error", "method not allowed (allowed: %s)", allow);
    e.allow = allow;
    return td_srv_reply_error(s, c, &e);
}

/* ---- scheduler access ------------------------------------------------------ */

void td_srv_cancel(srv *s, uint64_t id) {
    pthread_rwlock_rdlock(&s->sched_lock);
    if (s->sched) td_sched_cancel(s->sched, id);
    pthread_rwlock_unlock(&s->sched_lock);
}

void td_srv_wake(job *j) {
    bool has = !j->req.stream || j->out.len > j->out_sent || j->out_done || j->finished;
    if (j->suspended && has) {
        j->suspended = false;
        MHD_resume_connection(j->conn);
    }
}

void td_srv_track(srv *s, job *j) {
    pthread_mutex_lock(&s->jobs_mu);
    j->next = s->jobs;
    j->prev = NULL;
    if (s->jobs) s->jobs->prev = j;
    s->jobs = j;
    j->listed = true;
    pthread_mutex_unlock(&s->jobs_mu);
}

void td_srv_conn_gone(srv *s, job *j) {
    td_srv_untrack(s, j);
    pthread_mutex_lock(&j->mu);
    j->conn_gone = true;
    j->fd = -1;
    bool cancel = j->submitted && !j->finished && !j->cancel_sent;
    if (cancel) j->cancel_sent = true;
    uint64_t id = j->sched_id;
    pthread_mutex_unlock(&j->mu);
    if (cancel) {
        td_metrics_add(&s->metrics, &s->metrics.cancelled_disconnect, 1);
        td_srv_cancel(s, id);
    }
}

void td_srv_untrack(srv *s, job *j) {
    pthread_mutex_lock(&s->jobs_mu);
    if (j->listed) {
        if (j->prev) j->prev->next = j->next;
        else s->jobs = j->next;
        if (j->next) j->next->prev = j->prev;
        j->listed = false;
    }
    pthread_mutex_unlock(&s->jobs_mu);
}

void td_srv_job_finished(srv *s, job *j) {
    pthread_mutex_lock(&s->jobs_mu);
    if (j->counted_active) {
        j->counted_active = false;
        s->n_active--;
    }
    pthread_cond_broadcast(&s->jobs_cv);
    pthread_mutex_unlock(&s->jobs_mu);
}

/* Polls the sockets of running requests: a peer that is gone is cancelled
 * now, not only at the end. End of input alone is no disconnect: a client
 * may half-close (shutdown(SHUT_WR)) after its request and still read the
 * answer. A peer that closed answers our next write with a reset (POLLERR /
 * POLLHUP): streams write tokens and keep-alive deltas anyway; a suspended
 * non-streamed HTTP/1.1 request gets one interim "100 Continue" (which
 * clients must accept before the final response) as the probe. */
static bool peer_gone(job *j) {
    struct pollfd p = {.fd = j->fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return true;
    if ((p.revents & POLLRDHUP) && !j->req.stream && j->suspended && j->http11 && !j->probed) {
        static const char probe[] = "HTTP/1.1 100 Continue\r\n\r\n";
        j->probed = true; /* libmicrohttpd does not touch a suspended connection */
        ssize_t w = send(j->fd, probe, sizeof probe - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return true;
    }
    return false;
}

static void *watchdog_main(void *arg) {
    srv *s = arg;
    pthread_mutex_lock(&s->jobs_mu);
    while (!s->stopping) {
        struct timespec ts = td_srv_deadline(100);
        pthread_cond_timedwait(&s->jobs_cv, &s->jobs_mu, &ts);
        if (s->stopping) break;
        uint64_t ids[64];
        int n = 0;
        double now = td_srv_now();
        for (job *j = s->jobs; j && n < 64; j = j->next) {
            pthread_mutex_lock(&j->mu);
            td_job_keepalive(j, now);
            if (j->submitted && !j->finished && !j->cancel_sent && j->fd >= 0 && peer_gone(j)) {
                j->cancel_sent = true;
                j->conn_gone = true;
                ids[n++] = j->sched_id;
            }
            pthread_mutex_unlock(&j->mu);
        }
        if (!n) continue;
        pthread_mutex_unlock(&s->jobs_mu);
        for (int i = 0; i < n; i++) td_srv_cancel(s, ids[i]);
        td_metrics_add(&s->metrics, &s->metrics.cancelled_disconnect, (uint64_t)n);
        pthread_mutex_lock(&s->jobs_mu);
    }
    pthread_mutex_unlock(&s->jobs_mu);
    return NULL;
}

/* ---- connections ------------------------------------------------------------ */

typedef struct conn_ctx {
    sbuf body;
    bool too_large, answered, http11;
    bool settled;                   /* the final call returned once with nothing queued (on_request) */
    job *job;
    task *task;                     /* with a prompt worker (connection suspended) */
} conn_ctx;

/* ---- prompt workers ------------------------------------------------------------ */

static void task_free(task *t) {
    if (!t) return;
    free(t->body);
    free(t->reply);
    free(t);
}

/* Bodies up to this size are handled on the HTTP thread (see hand_off);
 * larger ones (long prompts: rendering and tokenizing take real time) go to
 * a prompt worker so they do not stall other streams. */
#define INLINE_BODY_MAX (64u << 10)

static void run_task(srv *s, task *t) {
    if (t->what == TASK_GENERATE) td_ep_generate(s, t);
    else if (t->what == TASK_TOKENIZE) td_ep_tokenize(s, t);
    else if (t->what == TASK_COUNT_TOKENS) td_ep_count_tokens(s, t);
    else td_ep_detokenize(s, t);
    free(t->body);
    t->body = NULL;
    pthread_mutex_lock(&s->tasks_mu);
    t->done = true;
    pthread_mutex_unlock(&s->tasks_mu);
}

static void *worker_main(void *arg) {
    srv *s = arg;
    pthread_mutex_lock(&s->tasks_mu);
    for (;;) {
        while (!s->tasks_head && !s->workers_stop) pthread_cond_wait(&s->tasks_cv, &s->tasks_mu);
        task *t = s->tasks_head;
        if (!t) break; /* stopping, and nothing left */
        s->tasks_head = t->next;
        if (!s->tasks_head) s->tasks_tail = NULL;
        pthread_mutex_unlock(&s->tasks_mu);
        run_task(s, t);
        MHD_resume_connection(t->conn); /* t belongs to the connection again */
        pthread_mutex_lock(&s->tasks_mu);
    }
    pthread_mutex_unlock(&s->tasks_mu);
    return NULL;
}

static enum MHD_Result task_answer(srv *s, struct MHD_Connection *c, conn_ctx *ctx);

/* Suspends the connection and queues its request for a prompt worker. */
static enum MHD_Result hand_off(srv *s, struct MHD_Connection *c, conn_ctx *ctx, int what, int kind, int dialect) {
    task *t = calloc(1, sizeof *t);
    if (!t) return reply_err(s, c, 500, "server_error", "out of memory");
    t->srv = s;
    t->conn = c;
    t->what = what;
    t->kind = kind;
    t->dialect = dialect;
    t->http11 = ctx->http11;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    t->fd = ci ? ci->connect_fd : -1;
    t->body = ctx->body.p ? ctx->body.p : calloc(1, 1);
    t->len = ctx->body.len;
    ctx->body = (sbuf){0};
    if (!t->body) {
        free(t);
        return reply_err(s, c, 500, "server_error", "out of memory");
    }
    if (t->len <= INLINE_BODY_MAX) {
        /* A small request is parsed, rendered and tokenized right here (well
         * under a millisecond: cheaper than the hand-off). Half-closed
         * clients are safe on both paths (see the settled pass in on_request). */
        run_task(s, t);
        ctx->task = t;
        return task_answer(s, c, ctx);
    }
    pthread_mutex_lock(&s->tasks_mu);
    if (s->workers_stop || !s->n_workers) {
        pthread_mutex_unlock(&s->tasks_mu);
        task_free(t);
        return reply_err(s, c, 503, "service_unavailable_error", "the server is shutting down");
    }
    ctx->task = t;
    MHD_suspend_connection(c);
    if (s->tasks_tail) s->tasks_tail->next = t;
    else s->tasks_head = t;
    s->tasks_tail = t;
    pthread_cond_signal(&s->tasks_cv);
    pthread_mutex_unlock(&s->tasks_mu);
    return MHD_YES;
}

/* The worker's answer, back on a polling thread. */
static enum MHD_Result task_answer(srv *s, struct MHD_Connection *c, conn_ctx *ctx) {
    task *t = ctx->task;
    pthread_mutex_lock(&s->tasks_mu);
    bool done = t->done;
    pthread_mutex_unlock(&s->tasks_mu);
    if (!done) return MHD_YES; /* not resumed by the worker (cannot happen) */
    ctx->task = NULL;
    enum MHD_Result rc;
    if (t->job) {
        ctx->job = t->job;
        rc = td_ep_generate_respond(s, c, t->job);
    } else if (t->e.status || !t->reply) {
        if (!t->e.status) td_http_err_set(&t->e, 500, "server_error", "no result");
        rc = td_srv_reply_error(s, c, &t->e);
    } else {
        rc = td_srv_reply(s, c, t->status, "application/json", t->reply, strlen(t->reply));
    }
    task_free(t);
    return rc;
}

/* ---- request framing ------------------------------------------------------------ */

typedef struct framing {
    int n_te, n_cl;
    bool te_other, cl_conflict;
    char cl[32];
} framing;

static enum MHD_Result scan_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    framing *f = cls;
    (void)kind;
    if (!key) return MHD_YES;
    const char *v = value ? value : "";
    while (*v == ' ' || *v == '\t') v++;
    size_t n = strlen(v);
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t')) n--;
    if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) {
        if (f->n_te++ || n != 7 || strncasecmp(v, "chunked", 7)) f->te_other = true;
    } else if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) {
        if (!f->n_cl++) snprintf(f->cl, sizeof f->cl, "%.*s", (int)(n < 31 ? n : 31), v);
        else if (n != strlen(f->cl) || strncmp(v, f->cl, n)) f->cl_conflict = true;
    }
    return MHD_YES;
}

/* 400/501 for framing that libmicrohttpd would misread or wait on forever:
 * a transfer-coding other than one "chunked" (gzip, chunked: it would read
 * the body until the connection closes), Content-Length with
 * Transfer-Encoding, or Content-Length headers that disagree. */
static int check_framing(struct MHD_Connection *c, http_err *e) {
    framing f = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, scan_header, &f);
    if (f.te_other) {
        td_http_err_set(e, 501, "invalid_request_error", "unsupported Transfer-Encoding: only a single 'chunked' is accepted");
        return -1;
    }
    if (f.n_te && f.n_cl) {
        td_http_err_set(e, 400, "invalid_request_error", "both Transfer-Encoding and Content-Length");
        return -1;
    }
    if (f.cl_conflict) {
        td_http_err_set(e, 400, "invalid_request_error", "conflicting Content-Length headers");
        return -1;
    }
    return 0;
}

static bool key_matches(const srv *s, const char *h) {
    size_t a = strlen(h), b = strlen(s->api_key);
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < a; i++) diff |= (unsigned char)h[i] ^ (unsigned char)s->api_key[i % (b ? b : 1)];
    return diff == 0;
}

/* "Authorization: Bearer KEY", or "x-api-key: KEY" as Anthropic clients send it. */
static bool authorized(srv *s, struct MHD_Connection *c) {
    if (!s->api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (h && !strncasecmp(h, "Bearer ", 7)) {
        h += 7;
        while (*h == ' ') h++;
        if (key_matches(s, h)) return true;
    }
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    return x && key_matches(s, x);
}

/* The API routes answer without the /v1 prefix too, like llama.cpp: the
 * path with /v1 put in front (in buf), or url itself. */
static const char *v1_path(const char *url, char *buf, size_t cap) {
    static const char *const bare[] = {"/chat/completions", "/completions", "/models", "/embeddings", "/responses", "/messages",
                                       "/messages/count_tokens", NULL};
    if (!strncmp(url, "/v1/", 4) || strlen(url) + 4 > cap) return url;
    bool api = !strncmp(url, "/responses/", 11);
    for (int i = 0; !api && bare[i]; i++) api = !strcmp(url, bare[i]);
    if (!api) return url;
    snprintf(buf, cap, "/v1%s", url);
    return buf;
}

static bool is(const char *url, const char *a) { return !strcmp(url, a); }

static enum MHD_Result route(srv *s, struct MHD_Connection *c, const char *url, const char *method, conn_ctx *ctx) {
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    if (td_srv_cors_is_preflight(s, c, method)) return td_srv_cors_preflight(s, c); /* any route, before auth */
    if (is(url, "/health") || is(url, "/v1/health")) {
        if (!get) return reply_405(s, c, "GET, HEAD");
        int r = atomic_load(&s->ready);
        if (r == 1) return td_srv_reply(s, c, 200, "text/plain", "", 0);
        return reply_err(s, c, 503, "service_unavailable_error", r == 0 ? "the model is loading" : "the server is shutting down");
    }
    if (!authorized(s, c)) {
        http_err e;
        td_http_err_set(&e, 401, "authentication_error", "Incorrect API key provided.");
        e.param = NULL;
        return td_srv_reply_error(s, c, &e);
    }
    int kind = 0, dialect = DIALECT_CHAT;
    enum { R_NONE, R_GET, R_POST, R_ITEM } want = R_NONE;
    if (is(url, "/v1/models") || is(url, "/metrics") || is(url, "/version")) want = R_GET;
    else if (is(url, "/v1/chat/completions")) want = R_POST, kind = OAI_CHAT;
    else if (is(url, "/v1/responses")) want = R_POST, kind = OAI_CHAT, dialect = DIALECT_RESPONSES;
    else if (is(url, "/v1/messages")) want = R_POST, kind = OAI_CHAT, dialect = DIALECT_ANTHROPIC;
    else if (is(url, "/v1/messages/count_tokens")) want = R_POST, dialect = DIALECT_ANTHROPIC;
    else if (!strncmp(url, "/v1/responses/", 14) && url[14] && !strchr(url + 14, '/')) want = R_ITEM;
    else if (is(url, "/v1/completions")) want = R_POST, kind = OAI_COMPLETION;
    else if (is(url, "/tokenize") || is(url, "/detokenize") || is(url, "/v1/tokenize") || is(url, "/v1/detokenize")) want = R_POST;
    if (want == R_NONE) {
        char m[300];
        snprintf(m, sizeof m, "Not found: %.200s", url);
        return reply_err(s, c, 404, "not_found_error", m);
    }
    if (want == R_GET && !get) return reply_405(s, c, "GET, HEAD");
    if (want == R_POST && !post) return reply_405(s, c, "POST");
    if (want == R_ITEM && !get && strcmp(method, "DELETE")) return reply_405(s, c, "GET, HEAD, DELETE");
    if (is(url, "/metrics")) return td_ep_metrics(s, c);
    if (is(url, "/version")) return td_srv_reply_json(s, c, 200, json_pack("{s:s}", "version", "tandem-0.1"));
    if (atomic_load(&s->ready) != 1)
        return reply_err(s, c, 503, "service_unavailable_error",
                         atomic_load(&s->ready) == 0 ? "the model is loading" : "the server is shutting down");
    if (is(url, "/v1/models")) return td_ep_models(s, c);
    if (want == R_ITEM) return td_ep_response_item(s, c, method, url + 14);
    if (kind) return hand_off(s, c, ctx, TASK_GENERATE, kind, dialect);
    if (dialect == DIALECT_ANTHROPIC) return hand_off(s, c, ctx, TASK_COUNT_TOKENS, 0, dialect);
    return hand_off(s, c, ctx, strstr(url, "/detokenize") ? TASK_DETOKENIZE : TASK_TOKENIZE, 0, 0);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls) {
    srv *s = cls;
    conn_ctx *ctx = *con_cls;
    char v1[320];
    url = v1_path(url, v1, sizeof v1);
    reply_dialect = !strncmp(url, "/v1/messages", 12) ? DIALECT_ANTHROPIC : DIALECT_CHAT;
    if (!ctx) {
        ctx = calloc(1, sizeof *ctx);
        if (!ctx) return MHD_NO;
        *con_cls = ctx;
        ctx->http11 = version && !strcmp(version, MHD_HTTP_VERSION_1_1);
        http_err fe;
        if (check_framing(c, &fe)) {
            ctx->answered = true;
            return td_srv_reply_error(s, c, &fe);
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->cfg.max_body) {
            ctx->answered = true;
            char m[128];
            snprintf(m, sizeof m, "request body over %zu bytes (--max-body)", s->cfg.max_body);
            return reply_err(s, c, 413, "invalid_request_error", m);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!ctx->answered && !ctx->too_large) {
            if (ctx->body.len + *upload_size > s->cfg.max_body) {
                ctx->too_large = true;
                td_sb_free(&ctx->body);
            } else if (td_sb_add(&ctx->body, upload, *upload_size)) {
                return MHD_NO;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (ctx->task) return task_answer(s, c, ctx); /* resumed by its prompt worker */
    if (ctx->job) { /* resumed: a non-streamed generation finished */
        job *j = ctx->job;
        pthread_mutex_lock(&j->mu);
        if (!j->finished) {
            j->suspended = true;
            MHD_suspend_connection(c);
            pthread_mutex_unlock(&j->mu);
            return MHD_YES;
        }
        char *body = j->body;
        int st = j->body_status ? j->body_status : 500;
        j->body = NULL;
        pthread_mutex_unlock(&j->mu);
        enum MHD_Result rc;
        if (body) rc = td_srv_reply(s, c, st, "application/json", body, strlen(body));
        else rc = reply_err(s, c, 500, "server_error", "the request was cancelled");
        free(body);
        return rc;
    }
    if (ctx->answered) return MHD_YES;
    if (!ctx->settled) {
        /* The final call returns once with nothing queued and the connection
         * not suspended; libmicrohttpd calls again on its next loop turn. It
         * keeps a connection's event-loop state (read, write, block) as it
         * was when the connection was suspended (it does not update a
         * suspended one) and, on resume, reads the socket first when that
         * state is still "read", left from receiving the request: a
         * half-closed client's end of input then closes the connection
         * (0.9.75: recv 0 from FULL_REQ_RECEIVED on) before the
         * handler queues the answer. This pass, with the whole request in
         * and no response, leaves the state "block": a connection suspended
         * from here on (prompt worker, non-streamed wait for the scheduler)
         * is handed straight to the handler when resumed. */
        ctx->settled = true;
        return MHD_YES;
    }
    ctx->answered = true;
    if (ctx->too_large) {
        char m[128];
        snprintf(m, sizeof m, "request body over %zu bytes (--max-body)", s->cfg.max_body);
        return reply_err(s, c, 413, "invalid_request_error", m);
    }
    return route(s, c, url, method, ctx);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    srv *s = cls;
    (void)c;
    (void)toe;
    conn_ctx *ctx = *con_cls;
    if (!ctx) return;
    *con_cls = NULL;
    if (ctx->task) { /* closed before the worker's answer was sent (workers are joined first) */
        if (!ctx->job) ctx->job = ctx->task->job;
        else td_job_unref(ctx->task->job);
        task_free(ctx->task);
    }
    job *j = ctx->job;
    if (j) {
        td_srv_conn_gone(s, j);
        if (j->group) td_group_conn_gone(s, j); /* n > 1: the other choices too */
        td_job_unref(j);
    }
    td_sb_free(&ctx->body);
    free(ctx);
}

/* ---- life cycle -------------------------------------------------------------- */

/* libmicrohttpd's own messages (e.g. a client gone mid-stream). */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    srv *s = cls;
    if (s->cfg.quiet) return;
    char m[512];
    vsnprintf(m, sizeof m, fmt, ap);
    size_t n = strlen(m);
    while (n && m[n - 1] == '\n') m[--n] = 0;
    fprintf(stderr, "tandem serve: http: %s\n", m);
}

int td_srv_port(const srv *s) { return s->port; }

static void srv_release(srv *s) {
    if (!s) return;
    td_so_release(s);
    td_tpl_free(s->chat_tpl);
    free(s->host);
    free(s->api_key);
    free(s->model_name);
    free(s->model_dir);
    free(s->bos);
    free(s->eos);
    td_metrics_destroy(&s->metrics);
    pthread_rwlock_destroy(&s->sched_lock);
    pthread_cond_destroy(&s->jobs_cv);
    pthread_mutex_destroy(&s->jobs_mu);
    pthread_cond_destroy(&s->tasks_cv);
    pthread_mutex_destroy(&s->tasks_mu);
    free(s->workers);
    td_api_store_free(s);
    free(s);
}

/* Lets the workers finish what is queued, then joins them. */
static void stop_workers(srv *s) {
    pthread_mutex_lock(&s->tasks_mu);
    s->workers_stop = true;
    pthread_cond_broadcast(&s->tasks_cv);
    pthread_mutex_unlock(&s->tasks_mu);
    for (int i = 0; i < s->n_workers; i++) pthread_join(s->workers[i], NULL);
    s->n_workers = 0;
}

int td_srv_start(const srv_config *cfg, srv **out, td_err *err) {
    *out = NULL;
    srv *s = TD_CALLOC(err, 1, sizeof *s);
    if (!s) return TD_ERR_NOMEM;
    s->cfg = *cfg;
    if (!s->cfg.host) s->cfg.host = "127.0.0.1";
    if (!s->cfg.max_body) s->cfg.max_body = 32u << 20;
    if (s->cfg.http_threads <= 0) s->cfg.http_threads = 4;
    s->host = strdup(s->cfg.host);
    s->api_key = cfg->api_key && *cfg->api_key ? strdup(cfg->api_key) : NULL;
    s->model_name = strdup(cfg->served_model_name ? cfg->served_model_name : "tandem");
    s->model_dir = strdup(cfg->model_dir ? cfg->model_dir : "");
    if (td_metrics_init(&s->metrics) || pthread_rwlock_init(&s->sched_lock, NULL) || pthread_mutex_init(&s->jobs_mu, NULL) ||
        pthread_cond_init(&s->jobs_cv, NULL) || pthread_mutex_init(&s->tasks_mu, NULL) || pthread_cond_init(&s->tasks_cv, NULL)) {
        free(s);
        return TD_FAIL(err, TD_ERR_INTERNAL, "cannot create locks");
    }
    if (!s->host || !s->model_name || !s->model_dir || (cfg->api_key && *cfg->api_key && !s->api_key)) {
        srv_release(s);
        return TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
    }
    s->t_start = td_srv_now();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    s->id_base = ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *ai = NULL;
    int g = getaddrinfo(s->host, port, &hints, &ai);
    if (g || !ai) {
        srv_release(s);
        return TD_FAIL(err, TD_ERR_ARG, "cannot resolve --host %s: %s", cfg->host, gai_strerror(g));
    }
    /* Bind here rather than in libmicrohttpd, to say why it failed
     * (libmicrohttpd only logs "Failed to bind to port 0"). */
    int fd = -1, why = 0;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0) { why = errno; continue; }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (a->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
            why = errno;
            close(fd);
            fd = -1;
        }
    }
    bool v6 = ai->ai_family == AF_INET6;
    freeaddrinfo(ai);
    if (fd < 0) {
        srv_release(s);
        char reason[160];
        if (why == EADDRINUSE) snprintf(reason, sizeof reason, "address already in use (another server on that port? --port N picks another)");
        else if (why == EACCES) snprintf(reason, sizeof reason, "permission denied (ports below 1024 need privileges)");
        else if (why == EADDRNOTAVAIL) snprintf(reason, sizeof reason, "no such address on this machine (--host)");
        else {
            snprintf(reason, sizeof reason, "%s", strerror(why));
            if (reason[0] >= 'A' && reason[0] <= 'Z') reason[0] = (char)(reason[0] - 'A' + 'a');
        }
        return TD_FAIL(err, TD_ERR_IO, "cannot listen on %s%s%s:%d: %s", v6 ? "[" : "", cfg->host, v6 ? "]" : "", cfg->port, reason);
    }
    struct sockaddr_storage bound;
    socklen_t bl = sizeof bound;
    int bound_port = cfg->port;
    if (getsockname(fd, (struct sockaddr *)&bound, &bl) == 0)
        bound_port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port : ((struct sockaddr_in *)&bound)->sin_port);
    /* poll(), level-triggered, not epoll: with epoll (edge-triggered) a
     * client's FIN that arrives while its request is being answered is seen
     * once and missed, and a half-closed keep-alive connection then stays
     * open until --idle-timeout; with poll the server reads the end of input
     * when it waits for the next request and closes at once. The cost is a
     * poll over each thread's connections (at most 1000 in all). */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (v6) flags |= MHD_USE_IPv6;
    s->daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_LISTEN_SOCKET, fd,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)s->cfg.http_threads,
                                 MHD_OPTION_CONNECTION_TIMEOUT, s->cfg.idle_timeout_s, MHD_OPTION_CONNECTION_LIMIT, 1000u,
                                 MHD_OPTION_PER_IP_CONNECTION_LIMIT, s->cfg.max_conn_per_ip, MHD_OPTION_END);
    if (!s->daemon) {
        close(fd);
        srv_release(s);
        return TD_FAIL(err, TD_ERR_IO, "cannot start the HTTP server on %s:%d", cfg->host, bound_port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di && di->port ? di->port : bound_port;
    s->workers = calloc((size_t)s->cfg.http_threads, sizeof *s->workers);
    for (int i = 0; s->workers && i < s->cfg.http_threads; i++) {
        if (pthread_create(&s->workers[i], NULL, worker_main, s)) break;
        s->n_workers++;
    }
    if (!s->n_workers || pthread_create(&s->watchdog, NULL, watchdog_main, s)) {
        stop_workers(s);
        MHD_stop_daemon(s->daemon);
        srv_release(s);
        return TD_FAIL(err, TD_ERR_INTERNAL, "cannot start the server's threads");
    }
    s->watchdog_started = true;
    *out = s;
    return TD_OK;
}

int td_srv_set_model(srv *s, const srv_model *m, td_err *err) {
    s->tok = m->tok;
    s->eng = m->eng;
    s->n_ctx = m->n_ctx;
    td_model_info mi;
    td_engine_info(m->eng, &mi);
    s->vocab = mi.vocab_size;
    const char *t = td_tok_chat_template(m->tok);
    if (t && td_tpl_parse(t, strlen(t), &s->chat_tpl, err)) return err ? err->code : TD_ERR_FORMAT;
    if (td_tok_bos_token(m->tok) && !(s->bos = strdup(td_tok_bos_token(m->tok)))) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
    if (td_tok_eos_token(m->tok) && !(s->eos = strdup(td_tok_eos_token(m->tok)))) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
    int src = td_so_init(s, err); /* structured outputs: the grammar vocabulary */
    if (src) return src;
    pthread_rwlock_wrlock(&s->sched_lock);
    s->sched = m->sched;
    pthread_rwlock_unlock(&s->sched_lock);
    atomic_store(&s->ready, 1);
    return TD_OK;
}

int td_srv_drain(srv *s, double timeout_s) {
    if (atomic_load(&s->ready) == 1) atomic_store(&s->ready, 2);
    double end = td_srv_now() + timeout_s;
    pthread_mutex_lock(&s->jobs_mu);
    while (s->n_active > 0 && td_srv_now() < end) {
        struct timespec ts = td_srv_deadline(50);
        pthread_cond_timedwait(&s->jobs_cv, &s->jobs_mu, &ts);
    }
    int n = s->n_active;
    pthread_mutex_unlock(&s->jobs_mu);
    return n;
}

td_sched *td_srv_detach_sched(srv *s) {
    if (atomic_load(&s->ready) == 1) atomic_store(&s->ready, 2);
    pthread_rwlock_wrlock(&s->sched_lock);
    td_sched *sc = s->sched;
    s->sched = NULL;
    pthread_rwlock_unlock(&s->sched_lock);
    return sc;
}

void td_srv_free(srv *s, double timeout_s) {
    if (!s) return;
    if (atomic_load(&s->ready) == 1) atomic_store(&s->ready, 2);
    double end = td_srv_now() + timeout_s;
    pthread_mutex_lock(&s->jobs_mu);
    while (s->n_open > 0 && td_srv_now() < end) {
        struct timespec ts = td_srv_deadline(50);
        pthread_cond_timedwait(&s->jobs_cv, &s->jobs_mu, &ts);
    }
    s->stopping = true;
    pthread_cond_broadcast(&s->jobs_cv);
    pthread_mutex_unlock(&s->jobs_mu);
    if (s->watchdog_started) pthread_join(s->watchdog, NULL);
    stop_workers(s); /* before the daemon: they resume their connections */
    MHD_stop_daemon(s->daemon);
    srv_release(s);
}
