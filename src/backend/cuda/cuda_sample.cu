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
 * - ACCEPT: the token's count is incremented on the device;
 * - SAMPLE and PROBS at T > 0, FROM, RESIDUAL (8 bytes: token and flag):
 *   dist_kernel, sampler.c's processors, normalization and draw on the
 *   device with the host RNG's next uniform (below, "distributions").
 * On the host, as in phase 1, only what the device path does not take: a
 *   top-p that needs more than 1024 tokens of a flat distribution without
 *   top-k, and a logit_bias list larger than the idx row; the op downloads
 *   what they read into a pinned buffer, runs td_sampler_run there and
 *   uploads the row they write.
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

/* work = x + bias, the entries in order (sampler.c penalize / ref_draft_argmax), the list
 * staged in the idx row; returns the row the processors read (x without a bias). */
static const float *with_bias(td_cuda *cu, td_sampler *s, const float *x) {
    if (!s->n_bias) return x;
    TD_CU(cudaMemcpyAsync(s->work, x, (size_t)s->vocab * sizeof(float), cudaMemcpyDeviceToDevice, cu->stream));
    size_t nb = (size_t)s->n_bias * sizeof(td_logit_bias);
    unsigned char *p = pinned(cu, nb);
    TD_CU(cudaStreamSynchronize(cu->stream)); /* an upload from the pinned buffer may be in flight */
    memcpy(p, s->bias, nb);
    TD_CU(cudaMemcpyAsync(s->idx, p, nb, cudaMemcpyHostToDevice, cu->stream));
    cu->sample_bytes += nb;
    TD_CU_KERNEL(bias_kernel, 1, 1, cu->stream, s->work, (const td_logit_bias *)s->idx, s->n_bias);
    TD_CU_LAUNCH("bias_kernel");
    return s->work;
}

/* The argmax of the logits x as GREEDY (draft = 0) or DRAFT_ARGMAX (draft = 1) computes it. */
static int32_t device_pick(td_cuda *cu, td_sampler *s, const float *x, int draft) {
    const bool pen = !draft && td_sampler_has_penalties(s);
    const float *src = with_bias(cu, s, x);
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

/* ---- distributions on the device (T > 0): PROBS, SAMPLE, FROM, RESIDUAL ----
 * One block of DIST_THREADS computes what sampler.c ref_probs / ref_from /
 * ref_residual compute, in their operation order, so only the result (the
 * token and a flag, 8 bytes) crosses; the uniform of the draw comes from the
 * sampler's host RNG (peeked: committed only when the draw took it, as the
 * CPU consumes it). Sums are doubles as the CPU's, but added in a fixed tree
 * instead of one running sum, so a probability can differ from the CPU's in
 * its last bit and a draw only when u falls within ~1e-16 of a boundary.
 * Top-k / top-p keep the CPU's total order (probability descending, id
 * ascending) as a 64-bit key per token: the k-th largest key is found by
 * radix select (8 passes of 8 bits, counts only: deterministic); top-p sorts
 * the top min(top_k, DIST_SORT) keys in shared memory (bitonic) and runs the
 * CPU's cumulative loop over them on one thread, exactly. When top-p would
 * need more than DIST_SORT tokens (a flat distribution without top-k), the
 * kernel says so (flag 2) and the call runs on the host as before. */

#define DIST_THREADS 1024
#define DIST_SORT 1024
enum { DIST_PROBS, DIST_SAMPLE, DIST_FROM, DIST_RESIDUAL };
enum { DIST_TOOK_U = 1, DIST_NEEDS_HOST = 2 };

typedef struct dist_args {
    pick_args pk;          /* the logits as penalize leaves them (mask -> -inf) */
    int mode, top_k;       /* DIST_*; top_k 0 = off */
    float inv_t, top_p, min_p;
    float *out;            /* PROBS / SAMPLE: the distribution written; FROM: the row read; RESIDUAL: p, overwritten */
    const float *q;        /* RESIDUAL: the draft distribution, NULL = one-hot at d */
    int32_t d;
    double u;              /* the draw's uniform */
    int32_t *res;          /* [2]: token, DIST_* flags */
} dist_args;

static __device__ __forceinline__ uint64_t dist_key(float p, int i) {
    return (uint64_t)__float_as_uint(p) << 32 | (uint64_t)(0xffffffffu - (uint32_t)i);
}

/* Sum of one double per thread over the block (fixed tree, as td_cu_block_sum). */
static __device__ double block_sum_d(double v, double *red) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    if (w == 0) {
        double t = lane < nw ? red[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) t += __shfl_down_sync(0xffffffffu, t, o);
        if (lane == 0) red[32] = t;
    }
    __syncthreads();
    return red[32];
}

/* The k-th largest key (1 <= k <= n) of the row p. */
static __device__ uint64_t select_kth(const float *p, int n, int k, unsigned *hist, uint64_t *sh_prefix, int *sh_rem) {
    uint64_t prefix = 0, pmask = 0;
    int rem = k;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            uint64_t key = dist_key(p[i], i);
            if ((key & pmask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned acc = 0;
            int b = 255;
            for (; b > 0; b--) {
                if (acc + hist[b] >= (unsigned)rem) break;
                acc += hist[b];
            }
            *sh_rem = rem - (int)acc;
            *sh_prefix = prefix | (uint64_t)b << shift;
        }
        __syncthreads();
        prefix = *sh_prefix;
        rem = *sh_rem;
        pmask |= 255ull << shift;
        __syncthreads(); /* hist is cleared again next pass */
    }
    return prefix;
}

/* ref_from on row p with uniform u: the first positive entry where the
 * running sum passes u, else the last positive one (0 when none). Thread t
 * sums its contiguous chunk; thread 0 walks the chunk sums, then the chunk
 * that holds u. Returns the token on thread 0. */
static __device__ int32_t draw(const float *p, int n, double u, double *part, int *lastp) {
    int per = (n + DIST_THREADS - 1) / DIST_THREADS, i0 = threadIdx.x * per, i1 = i0 + per < n ? i0 + per : n;
    double sum = 0;
    int last = -1;
    for (int i = i0; i < i1; i++)
        if (p[i] > 0.0f) { sum += p[i]; last = i; }
    part[threadIdx.x] = sum;
    lastp[threadIdx.x] = last;
    __syncthreads();
    int32_t tok = 0;
    if (threadIdx.x == 0) {
        double cum = 0;
        int t = 0, lastall = -1;
        for (; t < DIST_THREADS; t++) {
            if (lastp[t] >= 0) lastall = lastp[t];
            if (u < cum + part[t]) break;
            cum += part[t];
        }
        if (t < DIST_THREADS) {
            tok = lastall; /* the chunk's own scan below decides */
            int j0 = t * per, j1 = j0 + per < n ? j0 + per : n;
            for (int i = j0; i < j1; i++) {
                if (p[i] <= 0.0f) continue;
                cum += p[i];
                tok = i;
                if (u < cum) break;
            }
        } else tok = lastall < 0 ? 0 : lastall;
    }
    return tok;
}

static __global__ void __launch_bounds__(DIST_THREADS) dist_kernel(dist_args a) {
    __shared__ double redd[33], part[DIST_THREADS];
    __shared__ float red[33];
    __shared__ int lastp[DIST_THREADS];
    __shared__ unsigned hist[256], cnt;
    __shared__ uint64_t skey[DIST_SORT], sh_prefix, sh_thr;
    __shared__ int sh_rem, sh_flag;
    const int n = a.pk.n, tid = threadIdx.x;
    float *out = a.out;
    int flags = 0;
    if (a.mode == DIST_PROBS || a.mode == DIST_SAMPLE) {
        float mx = -INFINITY;
        for (int i = tid; i < n; i += DIST_THREADS) {
            bool part_;
            float v = pick_value(a.pk, i, part_) * a.inv_t; /* penalize, then x *= inv_t */
            out[i] = v;                                        /* out may be the logits row: the same element */
            if (v > mx) mx = v;
        }
        mx = td_cu_block_max(mx, red);
        double s = 0;
        for (int i = tid; i < n; i += DIST_THREADS) {
            float e = expf(out[i] - mx);
            out[i] = e;
            s += e;
        }
        double sum = block_sum_d(s, redd);
        for (int i = tid; i < n; i += DIST_THREADS) out[i] = (float)(out[i] / sum);
        __syncthreads();
        const int keepk = a.top_k > 0 && a.top_k < n ? a.top_k : n;
        if (keepk < n || a.top_p < 1.0f) {
            uint64_t thr = keepk < n ? select_kth(out, n, keepk, hist, &sh_prefix, &sh_rem) : 0;
            if (a.top_p < 1.0f) {
                const int c = keepk < DIST_SORT ? keepk : DIST_SORT;
                uint64_t thr_c = c == keepk && keepk < n ? thr : c < n ? select_kth(out, n, c, hist, &sh_prefix, &sh_rem) : 0;
                skey[tid] = 0; /* below every key: a key's low word is >= 1 */
                if (tid == 0) cnt = 0;
                __syncthreads();
                for (int i = tid; i < n; i += DIST_THREADS) {
                    uint64_t k = dist_key(out[i], i);
                    if (k >= thr_c) skey[atomicAdd(&cnt, 1u)] = k;
                }
                __syncthreads();
                for (int k = 2; k <= DIST_SORT; k <<= 1) /* bitonic, descending */
                    for (int j = k >> 1; j > 0; j >>= 1) {
                        int ij = tid ^ j;
                        if (ij > tid) {
                            uint64_t x = skey[tid], y = skey[ij];
                            bool desc = (tid & k) == 0;
                            if (desc ? x < y : x > y) { skey[tid] = y; skey[ij] = x; }
                        }
                        __syncthreads();
                    }
                double kept_part = 0;
                if (keepk > DIST_SORT)
                    for (int i = tid; i < n; i += DIST_THREADS)
                        if (dist_key(out[i], i) >= thr) kept_part += out[i];
                double kept_big = block_sum_d(kept_part, redd);
                if (tid == 0) {
                    double kept = 0.0;
                    if (keepk <= DIST_SORT)
                        for (int i = 0; i < keepk; i++) kept += __uint_as_float((uint32_t)(skey[i] >> 32));
                    else kept = kept_big;
                    double cum = 0.0;
                    int m = 0;
                    bool found = false;
                    for (; m < c; m++) { /* sampler.c: the smallest prefix whose mass reaches top_p of the kept mass */
                        cum += __uint_as_float((uint32_t)(skey[m] >> 32));
                        if (cum >= a.top_p * kept) { m++; found = true; break; }
                    }
                    sh_flag = !found && c < keepk ? DIST_NEEDS_HOST : 0;
                    int keep = m < 1 ? 1 : m;
                    sh_thr = skey[keep - 1];
                }
                __syncthreads();
                thr = sh_thr;
                flags = sh_flag;
            }
            if (flags & DIST_NEEDS_HOST) {
                if (tid == 0) { a.res[0] = 0; a.res[1] = flags; }
                return;
            }
            for (int i = tid; i < n; i += DIST_THREADS)
                if (dist_key(out[i], i) < thr) out[i] = 0.0f;
            __syncthreads();
        }
        if (a.min_p > 0.0f) {
            float pmax = 0.0f;
            for (int i = tid; i < n; i += DIST_THREADS) if (out[i] > pmax) pmax = out[i];
            pmax = td_cu_block_max(pmax, red);
            for (int i = tid; i < n; i += DIST_THREADS) if (out[i] < a.min_p * pmax) out[i] = 0.0f;
        }
        s = 0;
        for (int i = tid; i < n; i += DIST_THREADS) s += out[i];
        sum = block_sum_d(s, redd);
        for (int i = tid; i < n; i += DIST_THREADS) out[i] = (float)(out[i] / sum);
        __syncthreads();
        if (a.mode == DIST_PROBS) {
            if (tid == 0) { a.res[0] = 0; a.res[1] = 0; }
            return;
        }
    } else if (a.mode == DIST_RESIDUAL) {
        double s = 0;
        for (int i = tid; i < n; i += DIST_THREADS) {
            float r = a.q ? out[i] - a.q[i] : (i == a.d ? 0.0f : out[i]);
            out[i] = r > 0 ? r : 0.0f;
            s += out[i];
        }
        double sum = block_sum_d(s, redd);
        if (sum <= 0) { /* p == q: the rejection had probability 0; no draw */
            if (tid == 0) { a.res[0] = a.d; a.res[1] = 0; }
            return;
        }
        for (int i = tid; i < n; i += DIST_THREADS) out[i] = (float)(out[i] / sum);
        __syncthreads();
    }
    int32_t tok = draw(out, n, a.u, part, lastp);
    if (tid == 0) { a.res[0] = tok; a.res[1] = flags | DIST_TOOK_U; }
}

/* The call on the device when it can be (true, *tok set): SAMPLE and PROBS
 * at T > 0, FROM, RESIDUAL. False: the caller runs it on the host. */
static bool device_dist(td_cuda *cu, td_sampler *s, const td_sample_call *c, int32_t *tok) {
    const size_t V = (size_t)s->vocab;
    if (!bias_fits(s) || V < 2 || V > INT32_MAX / 2) return false;
    if ((c->kind == TD_SAMPLE_SAMPLE || c->kind == TD_SAMPLE_PROBS) && td_sampler_is_greedy(s)) return false;
    dist_args a;
    memset(&a, 0, sizeof a);
    const float *xin = c->x;
    switch (c->kind) {
    case TD_SAMPLE_SAMPLE: a.mode = DIST_SAMPLE; a.out = s->probs; break;
    case TD_SAMPLE_PROBS:
        a.mode = DIST_PROBS;
        a.out = c->out;
        if (c->out == c->x) { /* in place: keep the logits (the host redoes the call when top-p needs it) */
            TD_CU(cudaMemcpyAsync(s->probs, c->x, V * sizeof(float), cudaMemcpyDeviceToDevice, cu->stream));
            xin = s->probs;
        }
        break;
    case TD_SAMPLE_FROM: a.mode = DIST_FROM; a.out = (float *)c->x; break; /* read only */
    case TD_SAMPLE_RESIDUAL:
        TD_ASSERT(c->token >= 0 && (size_t)c->token < V && "residual: draft id out of range");
        a.mode = DIST_RESIDUAL; a.out = c->out; a.q = c->q; a.d = c->token;
        break;
    default: return false;
    }
    if (a.mode == DIST_PROBS || a.mode == DIST_SAMPLE) {
        const float *src = with_bias(cu, s, xin);
        a.pk.x = src;
        a.pk.mask = s->mask;
        a.pk.counts = s->counts;
        a.pk.in_prompt = s->in_prompt;
        a.pk.rp = s->p.repetition_penalty;
        a.pk.fp = s->p.frequency_penalty;
        a.pk.pp = s->p.presence_penalty;
        a.pk.penalties = td_sampler_has_penalties(s);
        a.pk.mask_drops = 0; /* penalize: a masked token is -inf and takes part */
        a.inv_t = 1.0f / (s->p.temperature > 0 ? s->p.temperature : 1.0f);
        a.top_k = s->p.top_k;
        a.top_p = s->p.top_p;
        a.min_p = s->p.min_p;
    }
    a.pk.n = (int)V;
    td_rng peek = s->rng;
    a.u = td_rng_uniform(&peek);
    /* the result pair: the first 8 bytes of the idx row (a staged bias list there has been
       read by bias_kernel, earlier on the stream) */
    a.res = (int32_t *)s->idx;
    TD_CU_KERNEL(dist_kernel, 1, DIST_THREADS, cu->stream, a);
    TD_CU_LAUNCH("dist_kernel");
    int32_t r[2];
    d2h(cu, r, a.res, sizeof r);
    TD_CU(cudaStreamSynchronize(cu->stream));
    if (r[1] & DIST_NEEDS_HOST) { /* nothing consumed: the host computes the call from the logits */
        td_sample_call hc = *c;
        hc.x = xin;
        *tok = host_sample(cu, s, &hc);
        return true;
    }
    if (r[1] & DIST_TOOK_U) s->rng = peek;
    *tok = r[0];
    return true;
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
    int32_t tok;
    if (device_dist(cu, s, c, &tok)) return tok;
    return host_sample(cu, s, c);
}
