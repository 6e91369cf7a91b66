/* CUDA Gated DeltaNet: the depthwise causal conv with its rolling window,
 * and the gated delta rule, with the state slots exactly as ops_gdn.c
 * (backend.h td_batch.state): a segment without checkpoints updates slot
 * SLOT in place; a verify segment (CKPT = 1) reads SLOT and writes the state
 * after its token t into slot (SLOT + 1 + t) % NSLOTS.
 *
 * State of one DeltaNet layer in a slot: [conv_len][conv_dim] window, then
 * [nv][dk][dv] recurrent state (row-major per head). Slot s of segment i:
 * state[i] + s * n_lin * layer_floats + lin * layer_floats.
 *
 * Both kernels are sequential over a segment's tokens (the recurrence) and
 * parallel over channels / value columns; each thread's arithmetic is
 * ops_gdn.c's for its channel or column, in the same order (multiply then
 * add, -fmad=false). With chunk > 1 a prompt segment (no checkpoints) runs
 * in chunks of up to GDN_CMAX tokens in the chunked form of kernels.c
 * td_gdn_chunk (each value column's arithmetic in its order; the chunk may be
 * smaller than asked so that its arrays fit in shared memory), the rest of
 * it token by token, as ops_gdn.c: equal to the token-by-token form up to
 * rounding, which is the op's contract for chunk > 1. */
#include "backend/cuda/cuda_internal.cuh"

typedef struct gdn_args {
    const int32_t *seg;
    float *const *state;   /* [n_seg] device pointers (device memory) */
    const float *conv, *dt_bias, *neg_A, *norm;
    const float *qkv;      /* conv: [M, conv_dim] input */
    float *conv_out;       /* conv: output; recur: input [M, conv_dim] */
    const float *z, *b_in, *a_in;
    float *o;
    int lin, n_lin, conv_len, conv_dim, nk, nv, dk, dv;
    size_t layer_floats, conv_floats;
    float eps;
    int chunk;             /* recur: tokens per device chunk (chunk_tokens), 0 = token by token */
} gdn_args;

static __device__ __forceinline__ float *layer_state(const gdn_args &a, int si, int slot) {
    return a.state[si] + (size_t)slot * a.layer_floats * (size_t)a.n_lin + (size_t)a.lin * a.layer_floats;
}
static __device__ __forceinline__ int out_slot(const int32_t *sg, int t) { return (sg[TD_SEG_SLOT] + 1 + t) % sg[TD_SEG_NSLOTS]; }

#define CONV_THREADS 128

/* grid (n_seg, channel blocks); thread = one channel of one segment, over
 * its tokens in order: y = silu(sum_k w[k] * window[k] + w[L] * x), then
 * the window shifts by one (ops_gdn.c conv_task per channel). */
static __global__ void __launch_bounds__(CONV_THREADS) gdn_conv_kernel(gdn_args a) {
    int si = blockIdx.x, ch = blockIdx.y * CONV_THREADS + threadIdx.x;
    if (ch >= a.conv_dim) return; /* no block-wide sync below */
    const int32_t *sg = a.seg + (size_t)si * TD_SEG_FIELDS;
    int C = a.conv_dim, L = a.conv_len, K = L + 1, ck = sg[TD_SEG_CKPT];
    float *state = layer_state(a, si, sg[TD_SEG_SLOT]);
    const float *w = a.conv + (size_t)ch * K;
    for (int t = 0; t < sg[TD_SEG_N]; t++) {
        int m = sg[TD_SEG_ROW0] + t;
        if (ck) { /* token t's window in its own slot, from the previous token's */
            float *dst = layer_state(a, si, out_slot(sg, t));
            for (int k = 0; k < L; k++) dst[(size_t)k * C + ch] = state[(size_t)k * C + ch];
            state = dst;
        }
        float x = a.qkv[(size_t)m * C + ch];
        float acc = 0.0f;
        for (int k = 0; k < L; k++) acc += w[k] * state[(size_t)k * C + ch];
        acc += w[L] * x;
        a.conv_out[(size_t)m * C + ch] = td_cu_silu(acc);
        for (int k = 0; k + 1 < L; k++) state[(size_t)k * C + ch] = state[(size_t)(k + 1) * C + ch];
        if (L > 0) state[(size_t)(L - 1) * C + ch] = x;
    }
}

static gdn_args gdn_args_of(const td_config *g, const td_batch *bt, int lin, const td_gdn_params *w) {
    gdn_args a;
    memset(&a, 0, sizeof a);
    a.seg = bt->seg;
    a.state = bt->state;
    a.conv = w->conv; a.dt_bias = w->dt_bias; a.neg_A = w->neg_A; a.norm = w->norm;
    a.lin = lin;
    a.n_lin = g->n_layers - g->n_full_attn;
    a.conv_len = g->conv_kernel - 1;
    a.conv_dim = td_cfg_lin_conv_dim(g);
    a.nk = g->lin_nk; a.nv = g->lin_nv; a.dk = g->lin_dk; a.dv = g->lin_dv;
    a.conv_floats = (size_t)a.conv_len * a.conv_dim;
    a.layer_floats = td_cfg_deltanet_layer_floats(g);
    a.eps = (float)g->rms_norm_eps;
    return a;
}

extern "C" void td_cuda_gdn_conv(td_backend *b, const td_config *g, const td_batch *bt, int lin, const td_gdn_params *w,
                                 const float *qkv, float *conv_out) {
    if (bt->n_seg <= 0 || bt->M <= 0) return;
    gdn_args a = gdn_args_of(g, bt, lin, w);
    a.qkv = qkv;
    a.conv_out = conv_out;
    dim3 grid((unsigned)bt->n_seg, td_cu_blocks((size_t)a.conv_dim, CONV_THREADS));
    TD_CU_KERNEL(gdn_conv_kernel, grid, CONV_THREADS, td_cu(b)->stream, a);
    TD_CU_LAUNCH("gdn_conv_kernel");
}

/* l2norm in shared memory: v *= 1 / sqrtf(sum v^2 + 1e-6) (ops_gdn.c l2norm) */
static __device__ void l2norm(float *v, int n, float *red) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += v[i] * v[i];
    ss = td_cu_block_sum(ss, red);
    float r = 1.0f / sqrtf(ss + 1e-6f);
    for (int i = threadIdx.x; i < n; i += blockDim.x) v[i] *= r;
    __syncthreads();
}

static __device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* Token m's q and k of head kh into shared q, k (l2-normed; q * 1/sqrt(dk)),
 * as ops_gdn.c gdn_prep. Every thread of the block calls it. */
static __device__ void gdn_qk(const gdn_args &a, int m, int kh, float *q, float *k, float *red) {
    int dk = a.dk, key_dim = a.nk * dk;
    const float *row = a.conv_out + (size_t)m * a.conv_dim;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) {
        q[i] = row[(size_t)kh * dk + i];
        k[i] = row[key_dim + (size_t)kh * dk + i];
    }
    __syncthreads();
    l2norm(q, dk, red);
    l2norm(k, dk, red);
    float qscale = 1.0f / sqrtf((float)dk);
    for (int i = threadIdx.x; i < dk; i += blockDim.x) q[i] *= qscale;
    __syncthreads();
}

/* The gated RMSNorm of token m's outputs (thread e: column e, o its value):
 * norm * (o * rn) * silu(z). Every thread calls it. */
static __device__ void gdn_out(const gdn_args &a, int m, int h, float o, float *red) {
    int e = threadIdx.x, dv = a.dv, vd = a.nv * dv;
    float ss = td_cu_block_sum(e < dv ? o * o : 0.0f, red);
    float rn = 1.0f / sqrtf(ss / (float)dv + a.eps);
    if (e < dv) {
        float zz = a.z[(size_t)m * vd + (size_t)h * dv + e];
        a.o[(size_t)m * vd + (size_t)h * dv + e] = (a.norm[e] * (o * rn)) * td_cu_silu(zz);
    }
}

#define GDN_CMAX 32    /* tokens per device chunk at most (the per-thread arrays below) */
#define GDN_POOL 10400 /* shared floats: the token path's q, k (2 * TD_MAX_HEAD_DIM) or a chunk's arrays */

/* Tokens per device chunk for a requested chunk and dk: the largest power of
 * two <= min(chunk, GDN_CMAX) whose K, Q [C][dk], W1, W2 [C][C] and three
 * [C] rows fit in GDN_POOL (dk 128: 32); 0 (token by token) below 2. */
static int chunk_tokens(int chunk, int dk) {
    int c = GDN_CMAX;
    while (c > 1 && (c > chunk || 2 * c * dk + 2 * c * c + 3 * c > GDN_POOL)) c >>= 1;
    return c >= 2 ? c : 0;
}

/* C tokens from row m0 of one (segment, head) in the chunked form (kernels.c
 * td_gdn_chunk; cum = running sum of the log-decays):
 *   d_t = b_t (v_t - e^{c_t} S0^T k_t - sum_{i<t} W1[t][i] d_i),  W1[t][i] = e^{c_t - c_i} (k_i.k_t)
 *   o_t = e^{c_t} S0^T q_t + sum_{i<=t} W2[t][i] d_i,             W2[t][i] = e^{c_t - c_i} (k_i.q_t)
 *   S   = e^{c_C} S0 + sum_t (e^{c_C - c_t} k_t) d_t^T
 * The block computes K, Q, W1, W2 and the decays once in shared memory;
 * thread e then runs column e (S0's column read once, u = S0^T k_t and
 * qs = S0^T q_t for every t in one pass over i, d and o in registers), each
 * sum in td_gdn_chunk's order. */
/* C tokens, a constant: with REG (blocks of up to 256 threads, so up to 255
 * registers a thread) the loops over t unroll and u, qs, d stay in registers
 * instead of local memory; without (larger blocks: 64 registers) they do not. */
template <int C, bool REG>
static __device__ void gdn_chunk(const gdn_args &a, int h, int kh, int m0, float *S, float *pool, float *red) {
    const int dk = a.dk, dv = a.dv, nv = a.nv, key_dim = a.nk * dk, e = threadIdx.x;
    float *K = pool, *Q = K + (size_t)C * dk, *W1 = Q + (size_t)C * dk, *W2 = W1 + C * C, *cum = W2 + C * C;
    float *beta = cum + C, *gT = beta + C;
    for (int u = 0; u < C; u++) gdn_qk(a, m0 + u, kh, Q + (size_t)u * dk, K + (size_t)u * dk, red);
    if (threadIdx.x == 0) {
        float c = 0.0f;
        for (int u = 0; u < C; u++) {
            int m = m0 + u;
            beta[u] = td_cu_sigmoid(a.b_in[(size_t)m * nv + h]);
            cum[u] = (c += a.neg_A[h] * softplus(a.a_in[(size_t)m * nv + h] + a.dt_bias[h]));
        }
    }
    __syncthreads();
    const bool v4 = dk % 4 == 0; /* K and Q rows 16-byte aligned: read 4 floats per shared load, adding in the same order */
    for (int p = threadIdx.x; p < C * C; p += blockDim.x) {
        int t = p / C, i = p % C;
        if (i > t) continue;
        const float *ki = K + (size_t)i * dk, *kt = K + (size_t)t * dk, *qt = Q + (size_t)t * dk;
        float kk = 0.0f, kq = 0.0f;
        int x = 0;
        if (v4)
            for (; x < dk; x += 4) {
                const float4 a = *(const float4 *)(ki + x), b = *(const float4 *)(kt + x), c = *(const float4 *)(qt + x);
                kk += a.x * b.x; kk += a.y * b.y; kk += a.z * b.z; kk += a.w * b.w;
                kq += a.x * c.x; kq += a.y * c.y; kq += a.z * c.z; kq += a.w * c.w;
            }
        for (; x < dk; x++) {
            kk += ki[x] * kt[x];
            kq += ki[x] * qt[x];
        }
        float r = expf(cum[t] - cum[i]);
        W1[p] = r * kk; /* used for i < t only */
        W2[p] = r * kq;
    }
    for (int t = threadIdx.x; t < C; t += blockDim.x) gT[t] = expf(cum[C - 1] - cum[t]);
    __syncthreads();
    float u[C], qs[C], d[C];
    if (e < dv) {
#pragma unroll(REG ? C : 1)
        for (int t = 0; t < C; t++) u[t] = qs[t] = 0.0f;
        int i = 0;
        if (v4) /* 4 rows of S per pass: each u[t] and qs[t] still adds its terms in increasing i */
            for (; i < dk; i += 4) {
                const float s0 = S[(size_t)i * dv + e], s1 = S[(size_t)(i + 1) * dv + e], s2 = S[(size_t)(i + 2) * dv + e],
                            s3 = S[(size_t)(i + 3) * dv + e];
#pragma unroll(REG ? C : 1)
                for (int t = 0; t < C; t++) {
                    const float4 k = *(const float4 *)(K + (size_t)t * dk + i), q = *(const float4 *)(Q + (size_t)t * dk + i);
                    u[t] += s0 * k.x; u[t] += s1 * k.y; u[t] += s2 * k.z; u[t] += s3 * k.w;
                    qs[t] += s0 * q.x; qs[t] += s1 * q.y; qs[t] += s2 * q.z; qs[t] += s3 * q.w;
                }
            }
        for (; i < dk; i++) {
            float s = S[(size_t)i * dv + e];
#pragma unroll(REG ? C : 1)
            for (int t = 0; t < C; t++) {
                u[t] += s * K[(size_t)t * dk + i];
                qs[t] += s * Q[(size_t)t * dk + i];
            }
        }
    }
#pragma unroll(REG ? C : 1)
    for (int t = 0; t < C; t++) {
        int m = m0 + t;
        float o = 0.0f;
        if (e < dv) {
            float gt = expf(cum[t]);
            float dd = a.conv_out[(size_t)m * a.conv_dim + 2 * (size_t)key_dim + (size_t)h * dv + e] - gt * u[t];
            o = gt * qs[t];
#pragma unroll(REG ? C : 1)
            for (int i = 0; i < t; i++) dd -= W1[t * C + i] * d[i];
            d[t] = dd * beta[t];
#pragma unroll(REG ? C : 1)
            for (int i = 0; i <= t; i++) o += W2[t * C + i] * d[i];
        }
        gdn_out(a, m, h, o, red);
    }
    if (e < dv) {
        float gC = expf(cum[C - 1]);
        int i = 0;
        if (v4) /* 4 rows of S per pass, each summed over t in order */
            for (; i < dk; i += 4) {
                float s0 = S[(size_t)i * dv + e] * gC, s1 = S[(size_t)(i + 1) * dv + e] * gC, s2 = S[(size_t)(i + 2) * dv + e] * gC,
                      s3 = S[(size_t)(i + 3) * dv + e] * gC;
#pragma unroll(REG ? C : 1)
                for (int t = 0; t < C; t++) {
                    const float4 k = *(const float4 *)(K + (size_t)t * dk + i);
                    const float g = gT[t];
                    s0 += (g * k.x) * d[t]; s1 += (g * k.y) * d[t]; s2 += (g * k.z) * d[t]; s3 += (g * k.w) * d[t];
                }
                S[(size_t)i * dv + e] = s0; S[(size_t)(i + 1) * dv + e] = s1;
                S[(size_t)(i + 2) * dv + e] = s2; S[(size_t)(i + 3) * dv + e] = s3;
            }
        for (; i < dk; i++) {
            float s = S[(size_t)i * dv + e] * gC;
#pragma unroll(REG ? C : 1)
            for (int t = 0; t < C; t++) s += (gT[t] * K[(size_t)t * dk + i]) * d[t];
            S[(size_t)i * dv + e] = s;
        }
    }
    __syncthreads(); /* the pool is rewritten by the next chunk or token */
}

/* grid (n_seg * nv): one block per (segment, value head), blockDim = dv
 * rounded up to a warp multiple. A prompt segment with a.chunk runs its
 * whole chunks with gdn_chunk; then per token, in order:
 *   q, k (l2-normed; q * 1/sqrt(dk)) into shared memory; beta = sigmoid(b);
 *   decay = expf(neg_A * softplus(a + dt_bias));
 *   thread e owns column e of S [dk, dv] (in the state slot):
 *     S[:,e] *= decay; mem = S[:,e] . k; d = (v[e] - mem) * beta;
 *     S[:,e] += k d; o = S[:,e] . q        (sums over i in increasing order)
 *   then the gated RMSNorm over the dv outputs: norm * (o * rn) * silu(z).
 * A column's update reads only that column, so no thread waits for another
 * inside the recurrence; the block synchronizes around the shared q / k and
 * the norm's sum. */
/* Tokens [t, n) of one (segment, value head) token by token with the
 * thread's state column in registers (DK = dk, a constant: the loops over i
 * unroll): loaded once, updated per token in the kernel's order (the same
 * multiplies and adds as the loop below, so the same bits), and stored once
 * at the end, or, for a verify segment, after each token into that token's
 * slot. The loop below reads and writes the column in global memory twice a
 * token (a 4096-token prompt: 8192 passes over the state instead of 2).
 * Every thread of the block calls it. */
template <int DK>
static __device__ void gdn_tokens_reg(const gdn_args &a, int si, int h, int kh, const int32_t *sg, float *S, size_t head, int t, float *qv,
                                      float *kv, float *red) {
    const int e = threadIdx.x, dv = a.dv, nv = a.nv, key_dim = a.nk * DK;
    const int n = sg[TD_SEG_N], row0 = sg[TD_SEG_ROW0], ck = sg[TD_SEG_CKPT];
    float s[DK];
    if (e < dv)
#pragma unroll
        for (int i = 0; i < DK; i++) s[i] = S[(size_t)i * dv + e];
    for (; t < n; t++) {
        const int m = row0 + t;
        gdn_qk(a, m, kh, qv, kv, red);
        const float beta = td_cu_sigmoid(a.b_in[(size_t)m * nv + h]);
        const float decay = expf(a.neg_A[h] * softplus(a.a_in[(size_t)m * nv + h] + a.dt_bias[h]));
        float o = 0.0f;
        if (e < dv) {
            float mem = 0.0f;
#pragma unroll
            for (int i = 0; i < DK; i++) {
                s[i] = s[i] * decay;
                mem += s[i] * kv[i];
            }
            const float d = (a.conv_out[(size_t)m * a.conv_dim + 2 * (size_t)key_dim + (size_t)h * dv + e] - mem) * beta;
#pragma unroll
            for (int i = 0; i < DK; i++) {
                s[i] = s[i] + kv[i] * d;
                o += s[i] * qv[i];
            }
            if (ck) { /* token t's state in its own slot */
                float *dst = layer_state(a, si, out_slot(sg, t)) + head;
#pragma unroll
                for (int i = 0; i < DK; i++) dst[(size_t)i * dv + e] = s[i];
            }
        }
        gdn_out(a, m, h, o, red);
        __syncthreads(); /* qv / kv are rewritten by the next token */
    }
    if (!ck && e < dv)
#pragma unroll
        for (int i = 0; i < DK; i++) S[(size_t)i * dv + e] = s[i];
}

template <int MAXT> /* 256 (dv <= 256): up to 255 registers a thread for gdn_chunk's unrolled arrays; 1024 otherwise */
static __global__ void __launch_bounds__(MAXT) gdn_recur_kernel(gdn_args a) {
    __shared__ __align__(16) float pool[GDN_POOL]; /* 16: gdn_chunk reads K and Q rows as float4 */
    __shared__ float red[33];
    float *qv = pool, *kv = pool + TD_MAX_HEAD_DIM;
    int si = blockIdx.x / a.nv, h = blockIdx.x % a.nv, e = threadIdx.x;
    int dk = a.dk, dv = a.dv, nv = a.nv, kh = h / (nv / a.nk), key_dim = a.nk * dk;
    const int32_t *sg = a.seg + (size_t)si * TD_SEG_FIELDS;
    int n = sg[TD_SEG_N], row0 = sg[TD_SEG_ROW0], ck = sg[TD_SEG_CKPT];
    size_t head = a.conv_floats + (size_t)h * dk * dv;
    float *S = layer_state(a, si, sg[TD_SEG_SLOT]) + head;
    int t = 0;
    if (a.chunk > 1 && !ck)
        for (; t + a.chunk <= n; t += a.chunk) switch (a.chunk) { /* chunk_tokens: a power of two in 2..GDN_CMAX */
            case 32: gdn_chunk<32, MAXT <= 256>(a, h, kh, row0 + t, S, pool, red); break;
            case 16: gdn_chunk<16, MAXT <= 256>(a, h, kh, row0 + t, S, pool, red); break;
            case 8: gdn_chunk<8, MAXT <= 256>(a, h, kh, row0 + t, S, pool, red); break;
            case 4: gdn_chunk<4, MAXT <= 256>(a, h, kh, row0 + t, S, pool, red); break;
            default: gdn_chunk<2, MAXT <= 256>(a, h, kh, row0 + t, S, pool, red); break;
            }
    if (MAXT <= 256 && t < n && (dk == 128 || dk == 64 || dk == 32 || dk == 16)) { /* the state column in registers (block-uniform) */
        if (dk == 128) gdn_tokens_reg<128>(a, si, h, kh, sg, S, head, t, qv, kv, red); /* Qwen3.5 / 3.6 */
        else if (dk == 64) gdn_tokens_reg<64>(a, si, h, kh, sg, S, head, t, qv, kv, red);
        else if (dk == 32) gdn_tokens_reg<32>(a, si, h, kh, sg, S, head, t, qv, kv, red); /* the demo model */
        else gdn_tokens_reg<16>(a, si, h, kh, sg, S, head, t, qv, kv, red);                /* tiny-a, test_backend_cuda */
        return;
    }
    for (; t < n; t++) {
        int m = row0 + t;
        const float *row = a.conv_out + (size_t)m * a.conv_dim;
        gdn_qk(a, m, kh, qv, kv, red);
        float beta = td_cu_sigmoid(a.b_in[(size_t)m * nv + h]);
        float decay = expf(a.neg_A[h] * softplus(a.a_in[(size_t)m * nv + h] + a.dt_bias[h]));
        if (ck) { /* token t's state in its own slot, from the previous token's */
            float *dst = layer_state(a, si, out_slot(sg, t)) + head;
            if (e < dv)
                for (int i = 0; i < dk; i++) dst[(size_t)i * dv + e] = S[(size_t)i * dv + e];
            S = dst;
        }
        float o = 0.0f;
        if (e < dv) {
            float mem = 0.0f;
            for (int i = 0; i < dk; i++) {
                float s = S[(size_t)i * dv + e] * decay;
                S[(size_t)i * dv + e] = s;
                mem += s * kv[i];
            }
            float d = (row[2 * (size_t)key_dim + (size_t)h * dv + e] - mem) * beta;
            for (int i = 0; i < dk; i++) {
                float s = S[(size_t)i * dv + e] + kv[i] * d;
                S[(size_t)i * dv + e] = s;
                o += s * qv[i];
            }
        }
        gdn_out(a, m, h, o, red);
        __syncthreads(); /* qv / kv are rewritten by the next token */
    }
}

extern "C" void td_cuda_gdn_recur(td_backend *b, const td_config *g, const td_batch *bt, int lin, const td_gdn_params *w,
                                  const float *conv_out, const float *z, const float *b_in, const float *a_in, float *o,
                                  int chunk) {
    if (bt->n_seg <= 0 || bt->M <= 0) return;
    TD_ASSERT(g->lin_dk > 0 && g->lin_dk <= TD_MAX_HEAD_DIM && g->lin_dv > 0 && g->lin_dv <= 1024);
    TD_ASSERT(g->lin_nk > 0 && g->lin_nv % g->lin_nk == 0);
    gdn_args a = gdn_args_of(g, bt, lin, w);
    a.conv_out = (float *)conv_out;
    a.z = z; a.b_in = b_in; a.a_in = a_in; a.o = o;
    a.chunk = chunk > 1 ? chunk_tokens(chunk, a.dk) : 0;
    unsigned threads = (unsigned)((a.dv + 31) / 32 * 32);
    if (threads <= 256) TD_CU_KERNEL(gdn_recur_kernel<256>, (unsigned)(bt->n_seg * a.nv), threads, td_cu(b)->stream, a);
    else TD_CU_KERNEL(gdn_recur_kernel<1024>, (unsigned)(bt->n_seg * a.nv), threads, td_cu(b)->stream, a);
    TD_CU_LAUNCH("gdn_recur_kernel");
}
