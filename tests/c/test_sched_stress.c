/* The scheduler under churn: waves of requests on a KV pool small enough to
 * preempt, each at its own MTP depth and length, many of them cancelled at
 * random moments in three ways: from their own token callback, from another
 * thread (td_sched_cancel at a random delay), and (the soak's "no idle
 * session" of 2026-12-06) right after being preempted, from another request's
 * token callback, while it waits in the queue. Every choice comes from a
 * fixed-seed generator; the interleavings with the second thread vary run to
 * run, the rest is the same every run.
 *
 * Checks: every request gets exactly one on_done and no error; a request that
 * was not cancelled has all its tokens, equal to its prompt's solo greedy
 * answer (lossless at every depth, under preemption); a cancelled one has a
 * prefix of it; the KV pool is back to empty after every wave. */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
#include "check.h"
#include "golden.h"
#include "engine/engine.h"
#include "sched/sched.h"

enum { NP = 8, MAXT = 48, WAVES = 64, PER_WAVE = 12, NQ = WAVES * PER_WAVE };
enum { KEEP, CANCEL_CALLBACK, CANCEL_THREAD, CANCEL_PREEMPTED };

typedef struct {
    int prompt, depth, max_tokens, mode, cancel_after;
    uint64_t id;
    int32_t out[MAXT];
    int n, n_done;
    td_gen_result res;
    char error[256];
} sink;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static td_sched *g_sched;
static sink g_sinks[NQ];
static int g_first, g_count; /* the wave in flight: g_sinks[g_first .. g_first + g_count) */
static uint64_t g_preempted[64];
static int g_n_preempted;
static int g_preempt_cancels;

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(uint32_t n) { /* xorshift64*, main thread only */
    g_rng ^= g_rng >> 12, g_rng ^= g_rng << 25, g_rng ^= g_rng >> 27;
    return (uint32_t)((g_rng * 0x2545f4914f6cdd1dull) >> 33) % n;
}

/* mu held: the sink of a request id in the wave in flight, or NULL */
static sink *sink_of(uint64_t id) {
    for (int i = g_first; i < g_first + g_count; i++)
        if (g_sinks[i].id == id) return &g_sinks[i];
    return NULL;
}

/* Called by the scheduler with its own lock held: only records the id. */
static void on_log(void *u, const char *line) {
    (void)u;
    static const char tag[] = "preempted request ";
    if (strncmp(line, tag, sizeof tag - 1)) return;
    const uint64_t id = strtoull(line + sizeof tag - 1, NULL, 10);
    pthread_mutex_lock(&mu); /* never held by this test while it calls into the scheduler */
    if (g_n_preempted < 64) g_preempted[g_n_preempted++] = id;
    pthread_mutex_unlock(&mu);
}

static int on_token(void *u, const td_token_event *ev) {
    sink *s = u;
    uint64_t cancel[64];
    int nc = 0;
    pthread_mutex_lock(&mu); /* cancels the requests preempted since that ask for it: they wait in the queue now */
    for (int i = 0; i < g_n_preempted; i++) {
        const sink *p = sink_of(g_preempted[i]);
        if (p && p->mode == CANCEL_PREEMPTED) cancel[nc++] = g_preempted[i];
    }
    g_n_preempted = 0;
    g_preempt_cancels += nc;
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < nc; i++) td_sched_cancel(g_sched, cancel[i]);
    if (s->n < MAXT) s->out[s->n++] = ev->token;
    return s->mode == CANCEL_CALLBACK && s->n >= s->cancel_after ? 2 : 0;
}

static void on_done(void *u, const td_gen_result *r, const char *error) {
    sink *s = u;
    pthread_mutex_lock(&mu);
    s->res = *r;
    if (error) snprintf(s->error, sizeof s->error, "%s", error);
    s->n_done++;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

int main(void) {
    td_err err = {0};
    td_engine_opts eo = {.n_threads = 2, .spec_depth = 4, .max_context = 1024};
    td_engine *e;
    /* 24 blocks = 384 tokens: four requests of up to 170 run it out */
    int rc = load_with_kv_blocks("tests/models/spec-partial", &eo, 24, &e, &err);
    CHECK(rc == 0, "%s", err.msg);
    if (rc) TEST_MAIN_END("sched_stress");

    static int32_t prompts[NP][128], ref[NP][MAXT];
    int plen[NP];
    for (int p = 0; p < NP; p++) {
        plen[p] = 20 + 14 * p; /* 20 .. 118 */
        for (int t = 0; t < plen[p]; t++) prompts[p][t] = (t * (p + 7) + 5 * p + 2) % 58;
        CHECK(solo_greedy(e, prompts[p], plen[p], MAXT, ref[p], &err) == 0, "solo: %s", err.msg);
    }

    td_sched_opts so;
    td_sched_opts_default(&so);
    so.max_num_seqs = 4;
    so.max_batch_tokens = 64;
    so.on_log = on_log;
    rc = td_sched_new(e, &so, &g_sched, &err);
    CHECK(rc == 0, "%s", err.msg);
    if (rc) TEST_MAIN_END("sched_stress");

    int modes[4] = {0}, bad_accounting = 0;
    for (int w = 0; w < WAVES; w++) {
        pthread_mutex_lock(&mu);
        g_first = w * PER_WAVE;
        g_count = 0;
        pthread_mutex_unlock(&mu);
        for (int i = 0; i < PER_WAVE; i++) {
            sink *s = &g_sinks[w * PER_WAVE + i];
            s->prompt = (int)rnd(NP);
            s->depth = (int)rnd(5);
            s->max_tokens = 8 + (int)rnd(MAXT - 7);
            uint32_t m = rnd(20);
            s->mode = m < 9 ? KEEP : m < 12 ? CANCEL_CALLBACK : m < 16 ? CANCEL_THREAD : CANCEL_PREEMPTED;
            s->cancel_after = 1 + (int)rnd((uint32_t)s->max_tokens);
            modes[s->mode]++;
            td_request r;
            memset(&r, 0, sizeof r);
            r.prompt = prompts[s->prompt];
            r.n_prompt = plen[s->prompt];
            td_sampling_default(&r.sampling);
            r.gen.max_tokens = s->max_tokens;
            r.gen.spec_depth = s->depth;
            r.gen.ignore_eos = true;
            r.top_logprobs = -1;
            r.on_token = on_token;
            r.on_done = on_done;
            r.user = s;
            /* not under mu (on_log takes mu inside the scheduler's lock); a request preempted
               before its id is stored here is just not cancelled */
            uint64_t id = 0;
            rc = td_sched_submit(g_sched, &r, &id, &err);
            pthread_mutex_lock(&mu);
            s->id = id;
            g_count++;
            pthread_mutex_unlock(&mu);
            CHECK(rc == 0, "submit: %s", err.msg);
        }
        /* this thread cancels its share at random moments while the wave runs */
        for (int i = 0; i < PER_WAVE; i++) {
            sink *s = &g_sinks[w * PER_WAVE + i];
            if (s->mode != CANCEL_THREAD) continue;
            usleep(rnd(3000));
            td_sched_cancel(g_sched, s->id);
        }
        pthread_mutex_lock(&mu);
        for (int i = 0; i < PER_WAVE; i++)
            while (!g_sinks[w * PER_WAVE + i].n_done) pthread_cond_wait(&cv, &mu);
        pthread_mutex_unlock(&mu);
        td_kv_info ki;
        td_engine_kv_info(e, &ki);
        bad_accounting += ki.free_blocks + ki.checkpoint_blocks != ki.n_blocks;
    }
    td_sched_stats st;
    td_sched_get_stats(g_sched, &st);
    td_sched_free(g_sched);

    int complete = 0, cancelled = 0;
    for (int i = 0; i < NQ; i++) {
        const sink *s = &g_sinks[i];
        CHECK(s->n_done == 1, "request %d: on_done called %d times", i, s->n_done);
        CHECK(!s->error[0], "request %d (mode %d, depth %d, prompt %d): error '%s'", i, s->mode, s->depth, s->prompt, s->error);
        bool cancel = s->res.finish == TD_FINISH_CANCEL;
        CHECK(cancel || s->n == s->max_tokens, "request %d (mode %d): %d of %d tokens, finish %d", i, s->mode, s->n, s->max_tokens, s->res.finish);
        CHECK(cancel || s->mode != CANCEL_CALLBACK, "request %d asked to stop after %d tokens and was not cancelled (n %d)", i, s->cancel_after, s->n);
        CHECK(s->n <= s->max_tokens && memcmp(s->out, ref[s->prompt], sizeof(int32_t) * (size_t)s->n) == 0,
              "request %d (mode %d, depth %d, prompt %d, %d tokens) differs from its solo answer", i, s->mode, s->depth, s->prompt, s->n);
        complete += !cancel;
        cancelled += cancel;
    }
    CHECK(bad_accounting == 0, "the KV pool was not back to empty after %d of %d waves", bad_accounting, WAVES);
    CHECK(st.preemptions > 0, "the pool ran out but nothing was preempted");
    CHECK(g_preempt_cancels > 0, "no request was cancelled while preempted");
    CHECK(st.requests_finished == NQ, "scheduler finished %llu of %d", (unsigned long long)st.requests_finished, NQ);
    printf("sched stress: %d requests in %d waves (modes: %d kept, %d cancel from the callback, %d from a thread, %d when preempted), "
           "%d complete and equal to solo, %d cancelled (prefixes equal), %llu preemptions, %d cancelled while waiting preempted\n",
           NQ, WAVES, modes[0], modes[1], modes[2], modes[3], complete, cancelled, (unsigned long long)st.preemptions, g_preempt_cancels);
    td_engine_free(e);
    TEST_MAIN_END("sched_stress");
}
