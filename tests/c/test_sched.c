/* Scheduler: continuous batching gives each request exactly the output it
 * gets alone (greedy, mixed depths, requests joining mid-flight), prefix
 * reuse across requests, cancellation, and a bounded queue. */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
#include "check.h"
#include "engine/engine.h"
#include "sched/sched.h"
#include "spec/autodepth.h"

typedef struct {
    int32_t out[256];
    int n;
    bool done;
    td_gen_result res;
    char error[256];
    int cancel_after; /* 0 = never */
    bool hold;        /* block the scheduler thread at the first token until release_gate() */
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
} sink;

static bool gate_open;
static void release_gate(pthread_mutex_t *m, pthread_cond_t *c) {
    pthread_mutex_lock(m);
    gate_open = true;
    pthread_cond_broadcast(c);
    pthread_mutex_unlock(m);
}

static int on_token(void *u, const td_token_event *ev) {
    sink *s = u;
    if (s->hold) { /* the request cannot finish before the test says so */
        pthread_mutex_lock(s->mu);
        while (!gate_open) pthread_cond_wait(s->cv, s->mu);
        pthread_mutex_unlock(s->mu);
    }
    if (s->n < 256) s->out[s->n++] = ev->token;
    return s->cancel_after && s->n >= s->cancel_after ? 2 : 0;
}
static void on_done(void *u, const td_gen_result *r, const char *error) {
    sink *s = u;
    pthread_mutex_lock(s->mu);
    s->res = *r;
    if (error) snprintf(s->error, sizeof s->error, "%s", error);
    s->done = true;
    pthread_cond_broadcast(s->cv);
    pthread_mutex_unlock(s->mu);
}

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

static void wait_all(sink *s, int n) {
    pthread_mutex_lock(&mu);
    for (int i = 0; i < n; i++)
        while (!s[i].done) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

static td_request make_req(const int32_t *prompt, int n, int depth, int max_tokens, sink *s) {
    td_request r;
    memset(&r, 0, sizeof r);
    r.prompt = prompt;
    r.n_prompt = n;
    td_sampling_default(&r.sampling);
    r.gen.max_tokens = max_tokens;
    r.gen.spec_depth = depth;
    r.gen.ignore_eos = true;
    r.top_logprobs = 2;
    r.on_token = on_token;
    r.on_done = on_done;
    r.user = s;
    s->mu = &mu;
    s->cv = &cv;
    return r;
}

/* Issue 18: the requests one admission pass takes judge their batch
 * together (td_gen_opts.joining, which the scheduler sets). A cost table
 * where drafting pays in a batch of 2 but not of 5; request A (depth 0)
 * runs, and from its first token's callback (the scheduler thread, between
 * steps, without its lock) four auto requests are submitted, so all four
 * wait for the same admission pass. Each judges a batch of 5 (A, itself,
 * those admitted with it) and none tracks; judged one by one (batches of
 * 2, 3, 4, 5) the first would. */
static td_sched *hook_sched;
static td_request hook_reqs[4];
static int hook_submitted;
static int on_token_then_submit(void *u, const td_token_event *ev) {
    if (!hook_submitted) {
        td_err err = {0};
        for (int i = 0; i < 4; i++) hook_submitted += td_sched_submit(hook_sched, &hook_reqs[i], NULL, &err) == 0;
    }
    return on_token(u, ev);
}

static void joining_judged_together(td_engine *e, int32_t prompts[][300], const int *lens) {
    td_err err = {0};
    td_ad_costs *c = &e->ad.costs;
    td_ad_costs_init(c);
    for (int t = 1; t <= 64; t++) td_ad_costs_cal_fwd(c, t, 1e-3 * (t > 4 ? t / 4.0 : 1.0)); /* flat to 4 rows, then per row */
    td_ad_costs_cal_mtp(c, 1, 0.01e-3);
    e->ad.measure_credit = 0; /* none of the four measures */
    CHECK(td_ad_worth_tracking(c, &e->ad.global[0], 4, 2, TD_AD_TRACK_MARGIN) && !td_ad_worth_tracking(c, &e->ad.global[0], 4, 5, TD_AD_TRACK_MARGIN),
          "the table makes tracking pay in a batch of 2, not of 5");
    td_sched_opts so;
    td_sched_opts_default(&so);
    so.max_num_seqs = 5;
    td_sched *sch;
    if (td_sched_new(e, &so, &sch, &err)) { CHECK(0, "%s", err.msg); return; }
    sink sa, sj[4];
    memset(&sa, 0, sizeof sa);
    memset(sj, 0, sizeof sj);
    for (int i = 0; i < 4; i++) {
        hook_reqs[i] = make_req(prompts[1 + i], lens[1 + i], 4, 8, &sj[i]);
        hook_reqs[i].gen.spec_auto = true;
    }
    hook_sched = sch;
    hook_submitted = 0;
    td_request a = make_req(prompts[0], lens[0], 0, 40, &sa);
    a.on_token = on_token_then_submit;
    CHECK(td_sched_submit(sch, &a, NULL, &err) == 0, "%s", err.msg);
    wait_all(&sa, 1);
    CHECK(hook_submitted == 4, "submitted %d of 4 from the callback", hook_submitted);
    wait_all(sj, hook_submitted);
    int tracked = 0;
    for (int i = 0; i < hook_submitted; i++) {
        CHECK(!sj[i].error[0] && sj[i].n == 8, "joining request %d: n %d error '%s'", i, sj[i].n, sj[i].error);
        tracked += sj[i].res.spec.tracked_steps > 0;
    }
    CHECK(tracked == 0, "%d of 4 requests admitted together tracked (each should judge a batch of 5)", tracked);
    printf("joining: 4 auto requests admitted in one pass next to a running one: %d tracked\n", tracked);
    td_sched_free(sch);
}

int main(void) {
    td_err err = {0};
    td_engine_opts eo = {.n_threads = 2, .spec_depth = 4, .max_context = 2048};
    td_engine *e;
    int rc = td_engine_load("tests/models/spec-partial", &eo, &e, &err);
    CHECK(rc == 0, "%s", err.msg);
    if (rc) TEST_MAIN_END("sched");
    enum { NR = 8 };
    int32_t prompts[NR][300];
    int lens[NR];
    int depths[NR] = {0, 1, 2, 3, 4, 0, 3, 4};
    for (int i = 0; i < NR; i++) {
        lens[i] = 5 + i * 37; /* mixed lengths; chunked prefill shares steps with decoding */
        for (int t = 0; t < lens[i]; t++) prompts[i][t] = (t * (i + 3) + i) % 60;
    }
    /* reference: each alone */
    int32_t ref[NR][128];
    td_session *s;
    td_session_new(e, &s, &err);
    for (int i = 0; i < NR; i++) {
        td_session_reset(s);
        td_gen_opts go = {.max_tokens = 128, .spec_depth = 0, .ignore_eos = true};
        td_sampling sp;
        td_sampling_default(&sp);
        td_gen_result r;
        rc = td_session_generate(s, prompts[i], lens[i], &sp, &go, NULL, NULL, &r, &err);
        CHECK(rc == 0, "%s", err.msg);
        /* the session holds prompt + generated tokens except the last one */
        memcpy(ref[i], td_session_tokens(s) + lens[i], sizeof(int32_t) * 127);
    }
    td_session_free(s);
    td_sched_opts so;
    td_sched_opts_default(&so);
    so.max_num_seqs = 4;
    so.max_batch_tokens = 64;
    td_sched *sch;
    rc = td_sched_new(e, &so, &sch, &err);
    CHECK(rc == 0, "%s", err.msg);
    sink sinks[NR];
    memset(sinks, 0, sizeof sinks);
    for (int i = 0; i < NR; i++) {
        td_request r = make_req(prompts[i], lens[i], depths[i], 128, &sinks[i]);
        rc = td_sched_submit(sch, &r, NULL, &err);
        CHECK(rc == 0, "%s", err.msg);
        if (i == 3) usleep(20000); /* later requests join a running batch */
    }
    wait_all(sinks, NR);
    int same = 0;
    for (int i = 0; i < NR; i++) {
        bool ok = sinks[i].n == 128 && memcmp(sinks[i].out, ref[i], sizeof(int32_t) * 127) == 0 && !sinks[i].error[0];
        CHECK(ok, "request %d (depth %d) differs from its solo run (n=%d, error '%s')", i, depths[i], sinks[i].n, sinks[i].error);
        same += ok;
    }
    printf("continuous batching: %d/%d requests (depths 0-4, prompts 5-264 tokens, 4 at a time) identical to their solo runs\n", same, NR);
    /* prefix reuse: a follow-up extending request 2's conversation */
    int32_t follow[600];
    int fl = lens[2];
    memcpy(follow, prompts[2], sizeof(int32_t) * (size_t)fl);
    memcpy(follow + fl, sinks[2].out, sizeof(int32_t) * 128);
    fl += 128;
    for (int t = 0; t < 10; t++) follow[fl++] = t;
    sink fs;
    memset(&fs, 0, sizeof fs);
    td_request r = make_req(follow, fl, 2, 16, &fs);
    td_sched_submit(sch, &r, NULL, &err);
    wait_all(&fs, 1);
    CHECK(fs.res.n_reused >= lens[2] + 127, "follow-up reused %d tokens", fs.res.n_reused);
    printf("prefix reuse: follow-up of %d tokens reused %d\n", fl, fs.res.n_reused);
    /* cancellation from the callback and from td_sched_cancel */
    sink cs[2];
    memset(cs, 0, sizeof cs);
    r = make_req(prompts[0], lens[0], 3, 200, &cs[0]);
    cs[0].cancel_after = 5;
    td_sched_submit(sch, &r, NULL, &err);
    uint64_t id;
    r = make_req(prompts[1], lens[1], 0, 200, &cs[1]);
    td_sched_submit(sch, &r, &id, &err);
    td_sched_cancel(sch, id);
    wait_all(cs, 2);
    CHECK(cs[0].res.finish == TD_FINISH_CANCEL && cs[0].n >= 5 && cs[0].n < 200, "callback cancel: finish %d n %d", cs[0].res.finish, cs[0].n);
    CHECK(cs[1].res.finish == TD_FINISH_CANCEL && cs[1].n < 200, "td_sched_cancel: finish %d n %d", cs[1].res.finish, cs[1].n);
    td_sched_stats st;
    td_sched_get_stats(sch, &st);
    CHECK(st.running == 0 && st.waiting == 0, "running %d waiting %d after all finished", st.running, st.waiting);
    CHECK(st.prefix_cache_hits > 0 && st.spec.drafts > 0, "stats: hits %llu drafts %llu", (unsigned long long)st.prefix_cache_hits, (unsigned long long)st.spec.drafts);
    td_sched_free(sch);
    /* bounded queue: 1 running + 1 waiting, the third is refused. The first
     * request holds the scheduler thread at its first token until all three
     * are submitted, so it cannot finish early and free its slot (it did
     * under ASan on a loaded CI machine). */
    so.max_num_seqs = 1;
    so.max_queue = 1;
    td_sched_new(e, &so, &sch, &err);
    sink qs[3];
    memset(qs, 0, sizeof qs);
    gate_open = false;
    int refused = 0, accepted = 0;
    for (int i = 0; i < 3; i++) {
        r = make_req(prompts[7], lens[7], 0, 64, &qs[i]);
        qs[i].hold = i == 0;
        rc = td_sched_submit(sch, &r, NULL, &err);
        if (rc == TD_ERR_LIMIT) refused++; else accepted++;
    }
    release_gate(&mu, &cv);
    CHECK(refused == 1 && accepted == 2, "queue bound: %d refused, %d accepted (want 1, 2)", refused, accepted);
    /* context overflow is refused at submit */
    int32_t *big = calloc(3000, sizeof(int32_t));
    r = make_req(big, 3000, 0, 4, &qs[2]);
    rc = td_sched_submit(sch, &r, NULL, &err);
    CHECK(rc == TD_ERR_ARG && strstr(err.msg, "exceeds the available context size"), "overflow: %d %s", rc, err.msg);
    free(big);
    wait_all(qs, accepted);
    td_sched_free(sch);
    joining_judged_together(e, prompts, lens);
    td_engine_free(e);
    TEST_MAIN_END("sched");
}
