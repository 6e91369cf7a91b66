/* logit_bias in the sampler (src/sample/sampler.c): added to the raw logits
 * before every other processor, at greedy and sampled positions; the
 * sampler keeps its own copy (the request's array may go first); entries
 * outside the vocabulary are dropped. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "sample/sampler.h"

int main(void) {
    enum { V = 8 };
    float logits[V] = {0.1f, 3.0f, 0.2f, 2.9f, -1.0f, 0.0f, 0.5f, 1.0f};
    td_sampling p;
    td_sampling_default(&p);
    td_sampler s;
    td_err err = {0};
    CHECK(td_sampler_init(&s, &p, V, NULL, 0, &err) == 0, "%s", err.msg);
    CHECK(td_sampler_greedy(&s, logits) == 1, "argmax without bias");
    td_sampler_free(&s);

    td_logit_bias *b = malloc(3 * sizeof *b);
    b[0] = (td_logit_bias){.token = 1, .bias = -100};
    b[1] = (td_logit_bias){.token = 6, .bias = 2.45f}; /* 0.5 + 2.45 = 2.95 > 2.9 */
    b[2] = (td_logit_bias){.token = 99, .bias = 100};  /* outside the vocabulary: ignored */
    p.logit_bias = b;
    p.n_logit_bias = 3;
    CHECK(td_sampler_init(&s, &p, V, NULL, 0, &err) == 0, "%s", err.msg);
    memset(b, 0, 3 * sizeof *b);
    free(b); /* the sampler holds its own copy */
    CHECK(s.n_bias == 2 && s.p.logit_bias == NULL, "copied %d", s.n_bias);
    CHECK(td_sampler_greedy(&s, logits) == 6, "biased argmax");
    CHECK(td_sampler_sample(&s, logits) == 6, "greedy sample");
    td_sampler_free(&s);

    /* sampled: the distribution is softmax(logits + bias) */
    td_logit_bias one = {.token = 4, .bias = 5.0f};
    p.logit_bias = &one;
    p.n_logit_bias = 1;
    p.temperature = 1.0f;
    CHECK(td_sampler_init(&s, &p, V, NULL, 0, &err) == 0, "%s", err.msg);
    float probs[V], want[V];
    td_sampler_probs(&s, logits, probs);
    double z = 0;
    for (int i = 0; i < V; i++) z += exp(logits[i] + (i == 4 ? 5.0 : 0.0));
    for (int i = 0; i < V; i++) want[i] = (float)(exp(logits[i] + (i == 4 ? 5.0 : 0.0)) / z);
    float worst = 0;
    for (int i = 0; i < V; i++) worst = fmaxf(worst, fabsf(probs[i] - want[i]));
    CHECK(worst < 1e-6f, "probs off by %g", worst);
    /* applied before the repetition penalty (vLLM's order): a penalized biased token */
    td_sampler_free(&s);
    p.temperature = 0;
    p.repetition_penalty = 2.0f;
    one = (td_logit_bias){.token = 0, .bias = 3.0f}; /* 0.1 + 3 = 3.1, then / 2 = 1.55 once generated */
    CHECK(td_sampler_init(&s, &p, V, NULL, 0, &err) == 0, "%s", err.msg);
    CHECK(td_sampler_greedy(&s, logits) == 0, "biased");
    td_sampler_accept(&s, 0);
    CHECK(td_sampler_greedy(&s, logits) == 1, "penalized after the bias");
    td_sampler_free(&s);
    TEST_MAIN_END("test_logit_bias");
}
