/* The HTTP layer, end to end: a real tandem server (td_srv_start on
 * 127.0.0.1, port 0, one libmicrohttpd thread) with the tiny-a model
 * (tests/golden/tiny-a/f32: tokenizer, chat template, engine, scheduler;
 * a 64-token context so a generation ends quickly). Each input is sent as
 * raw bytes on a fresh loopback connection, the write side is shut, and the
 * reply is read until the server closes, 30 ms pass without a byte, or 2 s
 * in all (then the client closes: a generation still running sees a
 * disconnect); an input whose byte sum is 15 modulo 16 (1 in 16)
 * hangs up as soon as it is sent instead, so the server meets a client gone
 * before or during its reply. Then the harness waits for the server to free
 * every job of that connection.
 *
 * What it covers: libmicrohttpd's wire parsing is the system library's
 * (not instrumented, so libFuzzer's guidance comes from tandem code only);
 * tandem's side is all of src/server/http.c (request / upload / completion
 * callbacks, body limit, routing, auth header, method checks), the
 * endpoints (models, metrics, version, health, tokenize, detokenize, chat
 * and completions with real generation on the scheduler thread, streamed
 * and not, client disconnects mid-generation) and everything under them.
 * Pipelined requests in one input work (HTTP/1.1 keep-alive).
 * Only 127.0.0.1 is used. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include "fuzz_util.h"
#include "server/srv_internal.h"

static srv *g_srv;
static tokenizer *g_tok;
static td_engine *g_eng;
static td_sched *g_sched;
static int g_port;
#define IDLE_MS 30
#define N_CTX 64 /* a chat prompt of the tiny model's template is ~20 tokens */
#define JOBS_FREED_S 60.0

/* FUZZ_HTTP_STATS=1: at exit, how inputs ended and the time each kind took
 * (tuning aid: the idle wait bounds the harness's speed). */
enum { END_CLOSED, END_IDLE, END_DEADLINE, END_HANGUP, END_N };
static long g_ends[END_N];
static double g_end_s[END_N], g_jobs_s;

static void stop_all(void) {
    if (!g_srv) return;
    td_srv_drain(g_srv, 2.0);
    td_sched *sc = td_srv_detach_sched(g_srv);
    td_sched_free(sc);
    td_srv_free(g_srv, 2.0);
    td_engine_free(g_eng);
    td_tok_free(g_tok);
    g_srv = NULL;
    if (getenv("FUZZ_HTTP_STATS"))
        fprintf(stderr,
                "fuzz_http: closed by server %ld (%.1f s), idle %ld (%.1f s), deadline %ld (%.1f s), hung up %ld (%.1f s); "
                "waiting for jobs %.1f s\n",
                g_ends[END_CLOSED], g_end_s[END_CLOSED], g_ends[END_IDLE], g_end_s[END_IDLE], g_ends[END_DEADLINE],
                g_end_s[END_DEADLINE], g_ends[END_HANGUP], g_end_s[END_HANGUP], g_jobs_s);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    char d[4096];
    fuzz_path(d, sizeof d, "tests/golden/tiny-a/f32");
    td_err err = {0};
    srv_config cfg = {.host = "127.0.0.1", .port = 0, .served_model_name = "tiny", .model_dir = d, .max_body = 1 << 20,
                      .http_threads = 1, .max_num_seqs = 2, .max_queue = 8, .quiet = true};
    td_sampling_default(&cfg.sampling);
    if (td_srv_start(&cfg, &g_srv, &err)) { fprintf(stderr, "fuzz_http: %s\n", err.msg); abort(); }
    g_port = td_srv_port(g_srv);
    if (td_tok_load(d, &g_tok, &err)) { fprintf(stderr, "fuzz_http: %s\n", err.msg); abort(); }
    td_engine_opts eo = {.n_threads = 1, .max_context = N_CTX, .max_seqs = 2};
    if (td_engine_load(d, &eo, &g_eng, &err)) { fprintf(stderr, "fuzz_http: %s\n", err.msg); abort(); }
    td_sched_opts so;
    td_sched_opts_default(&so);
    so.max_num_seqs = 2;
    so.max_queue = 8;
    if (td_sched_new(g_eng, &so, &g_sched, &err)) { fprintf(stderr, "fuzz_http: %s\n", err.msg); abort(); }
    srv_model m = {.tok = g_tok, .eng = g_eng, .sched = g_sched, .n_ctx = N_CTX};
    if (td_srv_set_model(g_srv, &m, &err)) { fprintf(stderr, "fuzz_http: %s\n", err.msg); abort(); }
    atexit(stop_all);
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FUZZ_ASSERT(fd >= 0, "socket");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    /* A loopback connect can fail for reasons of the host, not the server:
     * a signal (EINTR), or no free local port (EADDRNOTAVAIL, EAGAIN) while
     * other processes churn through connections (seen once in 10 M runs, its
     * errno unrecorded, the input clean on replay). Those are retried for up
     * to 5 s; anything else, or still failing, stops the run with its errno. */
    int rc = -1, e = 0;
    for (int tries = 0; tries < 500; tries++) {
        rc = connect(fd, (struct sockaddr *)&a, sizeof a);
        e = errno;
        if (rc == 0 || (e != EINTR && e != EADDRNOTAVAIL && e != EAGAIN)) break;
        close(fd); /* the socket's state after a failed connect is unspecified */
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        FUZZ_ASSERT(fd >= 0, "socket");
        nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
    }
    FUZZ_ASSERT(rc == 0, "connect to the server: %s", strerror(e));
    double t0 = now_s(), end = t0 + 2.0;
    int how = END_DEADLINE;
    size_t off = 0;
    unsigned sum = 0;
    for (size_t i = 0; i < size; i++) sum += data[i];
    bool wr_open = size > 0, hang_up = size > 1 && (sum & 15) == 15;
    if (!wr_open) shutdown(fd, SHUT_WR);
    char buf[65536];
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN | (off < size && wr_open ? POLLOUT : 0)};
        int left = (int)((end - now_s()) * 1000);
        if (left <= 0) break;
        how = !wr_open && left > IDLE_MS ? END_IDLE : END_DEADLINE;
        /* once everything is sent: stop after IDLE_MS without a byte (a
         * non-streamed generation sends nothing until it is done) */
        if (!wr_open && left > IDLE_MS) left = IDLE_MS;
        if (poll(&p, 1, left) <= 0) break;
        if (p.revents & POLLOUT) {
            ssize_t w = send(fd, data + off, size - off, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w > 0) off += (size_t)w;
            else if (w < 0) wr_open = false;
        }
        if (wr_open && off == size) {
            shutdown(fd, SHUT_WR);
            wr_open = false;
            if (hang_up) {
                how = END_HANGUP;
                break;
            }
        }
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t r = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
            if (r == 0 || (r < 0 && !(p.revents & POLLIN))) {
                how = END_CLOSED;
                break;
            }
        }
    }
    double t1 = now_s();
    g_ends[how]++;
    g_end_s[how] += t1 - t0;
    close(fd);
    /* The connection's jobs are freed on the server's threads, within a
     * millisecond or so on a quiet machine (FUZZ_HTTP_STATS: 58,765 inputs
     * waited 10 s in all). The bound is wall-clock, so it is generous: at
     * 5 s one input (replayed: 80 ms) tripped it in a lane at nice 19 beside
     * a CI run. A job that is never freed still fails here (a leak), or as
     * a libFuzzer timeout first where -timeout is shorter (CI's 20 s). */
    double until = now_s() + JOBS_FREED_S;
    pthread_mutex_lock(&g_srv->jobs_mu);
    while (g_srv->n_open > 0) {
        FUZZ_ASSERT(now_s() < until, "%d jobs still open %.0f s after the client left", g_srv->n_open, JOBS_FREED_S);
        struct timespec ts = td_srv_deadline(10);
        pthread_cond_timedwait(&g_srv->jobs_cv, &g_srv->jobs_mu, &ts); /* gen.c broadcasts as each job is freed */
    }
    pthread_mutex_unlock(&g_srv->jobs_mu);
    g_jobs_s += now_s() - t1;
    return 0;
}
