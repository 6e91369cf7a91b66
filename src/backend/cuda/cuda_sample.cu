/* CUDA sample op (backend.h `sample`, sample/sampler.h td_sample_call).
 *
 * On the device, with 4 bytes crossing (the id or the flag):
 * - GREEDY, and SAMPLE with a greedy sampler: one kernel applies what
 *   sampler.c's penalize does to each logit (logit_bias first, through a
 *   copy in the sampler's work row; the mask; the repetition, presence and
 *   frequency penalties) and reduces to the argmax, with sampler.c's
 *   choice among equal values and NaNs (below);
 * - DRAFT_ARGMAX: the same kernel, logits + bias over the mask, -1 when the
 *   mask allows nothing;
 * - ACCEPT_DRAFT: p[d] and q[d] (8 bytes) come down and the rejection test
 *   runs on the host RNG (td_sampler_accept_test, the CPU op's arithmetic);
 * - ACCEPT: the token's count is incremented on the device.
 * On the host (phase 1): SAMPLE and PROBS at T > 0, FROM and RESIDUAL read or
 * write whole distributions whose sums sampler.c takes in one sequential
 * order (double), which a parallel reduction would round differently; the op
 * downloads what they read into a pinned buffer, runs td_sampler_run there
 * and uploads the row they write.
 * Bytes crossing inside the op are counted in td_cuda.sample_bytes
 * (td_backend_cuda_sample_bytes), not in td_backend.counters (what core code
 * moves). */
#include "backend/cuda/cuda_internal.cuh"
#include <limits.h>
extern "C" {
#include "sample/sampler.h"
}

static __global__ void count_token_kernel(uint32_t *counts, int32_t tok) { counts[tok]++; }

/* Pinned host buffer of at least n bytes; waits for the stream first (an
 * upload from the old buffer may still be in flight). */
static unsigned char *pinned(td_cuda *cu, size_t n) {
    if (cu->pin_bytes >= n) return cu->pin;
    TD_CU(cudaStreamSynchronize(cu->stream));
    if (cu->pin) TD_CU(cudaFreeHost(cu->pin));
    cu->pin = NULL;
    cu->pin_bytes = 0;
    TD_CU(cudaMallocHost((void **)&cu->pin, n));
    cu->pin_bytes = n;
    return cu->pin;
}

static void d2h(td_cuda *cu, void *dst, const void *src, size_t n) {
    TD_CU(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, cu->stream));
    cu->sample_bytes += n;
}

/* The calls that read whole distributions (SAMPLE and PROBS at T > 0, FROM,
 * RESIDUAL): the rows and arrays they read go to a pinned host buffer,
 * td_sampler_run runs there, the row it writes comes back. */
static int32_t host_sample(td_cuda *cu, td_sampler *s, const td_sample_call *c) {
    size_t V = (size_t)s->vocab, fb = V * sizeof(float), words = (V + 31) / 32;
    /* layout: x | q | out | work | probs | idx | counts | mask | in_prompt */
    unsigned char *p = pinned(cu, 7 * fb + words * 4 + V);
    float *hx = (float *)p, *hq = hx + V, *hout = hq + V, *hwork = hout + V, *hprobs = hwork + V;
    int32_t *hidx = (int32_t *)(hprobs + V);
    uint32_t *hcounts = (uint32_t *)(hidx + V), *hmask = hcounts + V;
    uint8_t *hin = (uint8_t *)(hmask + words);
    td_sampler h = *s; /* the host twin: same parameters, RNG and bias, host arrays */
    h.b = NULL;
    h.work = hwork;
    h.probs = hprobs;
    h.idx = hidx;
    h.counts = hcounts;
    h.in_prompt = hin;
    h.mask = NULL;
    h.dmask = NULL;
    bool penalties = c->kind == TD_SAMPLE_SAMPLE || c->kind == TD_SAMPLE_GREEDY || c->kind == TD_SAMPLE_PROBS;
    if (penalties) {
        d2h(cu, hcounts, s->counts, V * sizeof(uint32_t));
        d2h(cu, hin, s->in_prompt, V);
    }
    if (s->mask) { /* a backend sampler's mask is its device copy (td_sampler_set_mask) */
        d2h(cu, hmask, s->mask, words * sizeof(uint32_t));
        h.mask = hmask;
    }
    td_sample_call hc = *c;
    if (c->x) { d2h(cu, hx, c->x, fb); hc.x = hx; }
    if (c->q) { d2h(cu, hq, c->q, fb); hc.q = hq; }
    if (c->out) {
        if (c->kind == TD_SAMPLE_RESIDUAL) d2h(cu, hout, c->out, fb); /* read, then overwritten */
        hc.out = hout;
    }
    TD_CU(cudaStreamSynchronize(cu->stream));
    int32_t r = td_sampler_run(&h, &hc);
    s->rng = h.rng; /* the draw advanced the RNG: the host state travels with the sampler */
    if (c->out && (c->kind == TD_SAMPLE_PROBS || c->kind == TD_SAMPLE_RESIDUAL)) {
        /* stream-ordered before the next call's downloads into the same buffer */
        TD_CU(cudaMemcpyAsync(c->out, hout, fb, cudaMemcpyHostToDevice, cu->stream));
        cu->sample_bytes += fb;
    }
    return r;
}

/* ---- the argmax of processed logits, on the device ---- */

#define PICK_THREADS 1024

typedef struct pick_args {
    const float *x;          /* logits (or logits + bias in the sampler's work row) */
    const uint32_t *mask;    /* NULL: every token */
    const uint32_t *counts;  /* with penalties */
    const uint8_t *in_prompt;
    float rp, fp, pp;        /* repetition, frequency, presence penalty */
    int penalties;           /* sampler.c has_penalties */
    int mask_drops;          /* 1: a masked token takes no part (argmax_masked, draft argmax);
                                0: it takes part as -inf (penalize) */
    int n;
    int32_t *out;            /* the id, or -1 when no token takes part */
} pick_args;

/* Token i's value as sampler.c penalize computes it (the same operations in
 * the same order; -fmad=false keeps fp * c + pp unfused, as the host). */
static __device__ __forceinline__ float pick_value(const pick_args &a, int i, bool &part) {
    float x = a.x[i];
    part = true;
    if (a.mask && !((a.mask[i >> 5] >> (i & 31)) & 1u)) {
        if (a.mask_drops) { part = false; return x; }
        x = -INFINITY;
    }
    if (a.penalties) {
        uint32_t c = a.counts[i];
        if (a.rp != 1.0f && (c || a.in_prompt[i])) x = x > 0 ? x / a.rp : x * a.rp;
        if (c) x -= a.fp * (float)c + a.pp;
    }
    return x;
}

/* One block. sampler.c scans up from the first token that takes part (f)
 * and moves to a later one only when it is strictly greater: the result is
 * the lowest index of the largest value; a NaN never wins, and a NaN at f
 * keeps f (every comparison with it fails); -1 when nothing takes part. The
 * (value, index) pairs are combined by td_cu_argmax_take, which picks that
 * element in any order; f is the minimum index taking part. */
static __global__ void __launch_bounds__(PICK_THREADS) pick_kernel(pick_args a) {
    __shared__ float sv[PICK_THREADS / 32];
    __shared__ int si[PICK_THREADS / 32], sf[PICK_THREADS / 32];
    float bv = -INFINITY;
    int bi = INT_MAX, f = INT_MAX;
    for (int i = threadIdx.x; i < a.n; i += PICK_THREADS) {
        bool part;
        float v = pick_value(a, i, part);
        if (!part) continue;
        if (i < f) f = i;
        td_cu_argmax_take(bv, bi, v, i);
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_down_sync(0xffffffffu, bv, o);
        int oi = __shfl_down_sync(0xffffffffu, bi, o);
        int of = __shfl_down_sync(0xffffffffu, f, o);
        td_cu_argmax_take(bv, bi, ov, oi);
        if (of < f) f = of;
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) { sv[w] = bv; si[w] = bi; sf[w] = f; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 1; k < PICK_THREADS / 32; k++) {
            td_cu_argmax_take(bv, bi, sv[k], si[k]);
            if (sf[k] < f) f = sf[k];
        }
        int32_t r = -1;
        if (f != INT_MAX) {
            bool part;
            float vf = pick_value(a, f, part);
            r = bi == INT_MAX || vf != vf ? f : bi;
        }
        *a.out = r;
    }
}

/* work[tok] += bias for each entry in order (one thread: a token may repeat). */
static __global__ void bias_kernel(float *work, const td_logit_bias *bias, int n) {
    for (int i = 0; i < n; i++) work[bias[i].token] += bias[i].bias;
}

/* What the device path needs from the sampler's work arrays: the bias list
 * goes through its idx row (4 V bytes), so it must fit there. */
static bool bias_fits(const td_sampler *s) { return (size_t)s->n_bias * sizeof(td_logit_bias) <= (size_t)s->vocab * sizeof(int32_t); }

/* The argmax of the logits x as GREEDY (draft = 0) or DRAFT_ARGMAX (draft = 1) computes it. */
static int32_t device_pick(td_cuda *cu, td_sampler *s, const float *x, int draft) {
    const size_t V = (size_t)s->vocab;
    const bool pen = !draft && td_sampler_has_penalties(s);
    const float *src = x;
    if (s->n_bias) { /* work = x + bias, the entries in order (sampler.c penalize / ref_draft_argmax) */
        TD_CU(cudaMemcpyAsync(s->work, x, V * sizeof(float), cudaMemcpyDeviceToDevice, cu->stream));
        size_t nb = (size_t)s->n_bias * sizeof(td_logit_bias);
        unsigned char *p = pinned(cu, nb);
        TD_CU(cudaStreamSynchronize(cu->stream)); /* an upload from the pinned buffer may be in flight */
        memcpy(p, s->bias, nb);
        TD_CU(cudaMemcpyAsync(s->idx, p, nb, cudaMemcpyHostToDevice, cu->stream));
        cu->sample_bytes += nb;
        TD_CU_KERNEL(bias_kernel, 1, 1, cu->stream, s->work, (const td_logit_bias *)s->idx, s->n_bias);
        TD_CU_LAUNCH("bias_kernel");
        src = s->work;
    }
    pick_args a;
    a.x = src;
    a.mask = s->mask;
    a.counts = s->counts;
    a.in_prompt = s->in_prompt;
    a.rp = s->p.repetition_penalty;
    a.fp = s->p.frequency_penalty;
    a.pp = s->p.presence_penalty;
    a.penalties = pen;
    /* sampler.c ref_greedy: argmax_masked (a masked token takes no part) only without penalties and
       bias; penalize gives it -inf and it takes part. The draft argmax always drops it. */
    a.mask_drops = draft || (!pen && !s->n_bias);
    a.n = s->vocab;
    a.out = (int32_t *)s->probs; /* 4 bytes of the sampler's probs row as the result slot */
    TD_CU_KERNEL(pick_kernel, 1, PICK_THREADS, cu->stream, a);
    TD_CU_LAUNCH("pick_kernel");
    int32_t r;
    d2h(cu, &r, s->probs, sizeof r);
    TD_CU(cudaStreamSynchronize(cu->stream));
    return draft || r >= 0 ? r : 0; /* argmax_masked: 0 when the mask allows nothing */
}

extern "C" int32_t td_cuda_sample(td_backend *b, td_sampler *s, const td_sample_call *c) {
    td_cuda *cu = td_cu(b);
    TD_CU_NOT_CAPTURING(cu, "sample");
    const size_t V = (size_t)s->vocab;
    switch (c->kind) {
    case TD_SAMPLE_ACCEPT: /* the penalties' count of an emitted token */
        if (c->token >= 0 && (size_t)c->token < V) {
            TD_CU_KERNEL(count_token_kernel, 1, 1, cu->stream, s->counts, c->token);
            TD_CU_LAUNCH("count_token_kernel");
        }
        return 0;
    case TD_SAMPLE_SAMPLE: /* sampler.c ref_sample is ref_greedy for a greedy sampler */
    case TD_SAMPLE_GREEDY:
        if ((c->kind == TD_SAMPLE_GREEDY || td_sampler_is_greedy(s)) && bias_fits(s)) return device_pick(cu, s, c->x, 0);
        break;
    case TD_SAMPLE_DRAFT_ARGMAX:
        if (bias_fits(s)) return device_pick(cu, s, c->x, 1);
        break;
    case TD_SAMPLE_ACCEPT_DRAFT: {
        TD_ASSERT(c->token >= 0 && (size_t)c->token < V && "accept_draft: draft id out of range");
        float v[2] = {0.0f, 1.0f}; /* p[d], q[d] (1: a one-hot draft) */
        d2h(cu, &v[0], c->x + c->token, sizeof(float));
        if (c->q) d2h(cu, &v[1], c->q + c->token, sizeof(float));
        TD_CU(cudaStreamSynchronize(cu->stream));
        return td_sampler_accept_test(s, v[0], v[1]);
    }
    default: break;
    }
    return host_sample(cu, s, c);
}
