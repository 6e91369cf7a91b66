/* CUDA attention: attn_prep (gate split, q/k RMSNorm per head, partial
 * RoPE, paged KV store in f32 / bf16 / fp8 e4m3) and causal GQA attention
 * over the paged KV with the exact two-pass softmax of ops_attn.c and the
 * optional sigmoid output gate.
 *
 * The batch (td_batch) arrays are device memory: the host knows only M and
 * n_seg, so grids are laid out over rows and heads and each block reads its
 * row's segment, position and block table on the device. One block per
 * (row, head): a row's arithmetic is the same whatever else is in the batch
 * (batch invariance). */
#include "backend/cuda/cuda_internal.cuh"

#define PREP_THREADS 128
#define ATTN_THREADS 128
/* Scores of one (row, head) kept in shared memory up to this many
 * positions (32 KiB); longer contexts recompute them in pass 2, which gives
 * the same values (the same function of the same inputs). */
#define ATTN_SMEM_SCORES 8192
#define ATTN_MAX_DIMS_PER_THREAD (TD_MAX_HEAD_DIM / ATTN_THREADS)

typedef struct prep_args {
    const int32_t *row_seg, *seg, *block_tables;
    const float *qg, *v, *qn, *kn, *inv_freq;
    float *k, *q, *gate;
    td_cu_kv kv;
    int nh, nkv, hd, rot, gated, shift;
    float eps;
} prep_args;

/* v[0..n) = (v * r) * w with r = 1/sqrtf(mean(v^2) + eps), in shared memory. */
static __device__ void head_rmsnorm(float *v, const float *w, int n, float eps, float *red) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += v[i] * v[i];
    ss = td_cu_block_sum(ss, red);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) v[i] = (v[i] * r) * w[i];
    __syncthreads();
}

/* Rotate-half RoPE on the first rot dims (ops_attn.c rope): thread i owns
 * the pair (i, i + rot/2), so it reads both before writing either. */
static __device__ void rope(float *v, int pos, const float *inv_freq, int rot) {
    int half = rot / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float ang = (float)pos * inv_freq[i];
        float cs = cosf(ang), sn = sinf(ang);
        float x1 = v[i], x2 = v[i + half];
        v[i] = x1 * cs - x2 * sn;
        v[i + half] = x2 * cs + x1 * sn;
    }
    __syncthreads();
}

/* grid (M, nh + nkv): blocks y < nh prepare q head y (and split its gate);
 * the others norm + rope k head y - nh in place and store it and v's head
 * at KV slot pos + shift. qg [M, nh*hd*(gated?2:1)] per head [q | gate]. */
static __global__ void __launch_bounds__(PREP_THREADS) attn_prep_kernel(prep_args a) {
    __shared__ float buf[TD_MAX_HEAD_DIM];
    __shared__ float red[33];
    int m = blockIdx.x, hy = blockIdx.y, hd = a.hd;
    const int32_t *sg = a.seg + (size_t)a.row_seg[m] * TD_SEG_FIELDS;
    int pos = sg[TD_SEG_POS0] + (m - sg[TD_SEG_ROW0]);
    int per = a.gated ? 2 : 1, ad = a.nh * hd, kvd = a.nkv * hd;
    if (hy < a.nh) {
        const float *src = a.qg + (size_t)m * ad * per + (size_t)hy * hd * per;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) {
            buf[i] = src[i];
            if (a.gated) a.gate[(size_t)m * ad + (size_t)hy * hd + i] = src[hd + i];
        }
        __syncthreads();
        head_rmsnorm(buf, a.qn, hd, a.eps, red);
        rope(buf, pos, a.inv_freq, a.rot);
        for (int i = threadIdx.x; i < hd; i += blockDim.x) a.q[(size_t)m * ad + (size_t)hy * hd + i] = buf[i];
    } else {
        int h = hy - a.nh;
        float *kd = a.k + (size_t)m * kvd + (size_t)h * hd;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) buf[i] = kd[i];
        __syncthreads();
        head_rmsnorm(buf, a.kn, hd, a.eps, red);
        rope(buf, pos, a.inv_freq, a.rot);
        for (int i = threadIdx.x; i < hd; i += blockDim.x) kd[i] = buf[i];
        size_t row = td_cu_kv_row(a.block_tables, sg, pos + a.shift);
        td_cu_kv_write_head(a.kv, a.kv.k, a.kv.ks, row, h, buf, red);
        td_cu_kv_write_head(a.kv, a.kv.v, a.kv.vs, row, h, a.v + (size_t)m * kvd + (size_t)h * hd, red);
    }
}

extern "C" void td_cuda_attn_prep(td_backend *b, const td_config *g, const td_batch *bt, const float *qg, float *k,
                                  const float *v, const float *qn, const float *kn, const float *inv_freq, float *q,
                                  float *gate, const td_kv_view *kv, int shift) {
    if (bt->M <= 0) return;
    TD_ASSERT(g->head_dim > 0 && g->head_dim <= TD_MAX_HEAD_DIM && kv->store != TD_KV_AUTO);
    TD_ASSERT(!g->attn_output_gate || gate);
    prep_args a;
    memset(&a, 0, sizeof a);
    a.row_seg = bt->row_seg; a.seg = bt->seg; a.block_tables = bt->block_tables;
    a.qg = qg; a.v = v; a.qn = qn; a.kn = kn; a.inv_freq = inv_freq;
    a.k = k; a.q = q; a.gate = gate;
    a.kv = td_cu_kv_of(kv);
    a.nh = g->n_heads; a.nkv = g->n_kv_heads; a.hd = g->head_dim; a.rot = g->rot_dim;
    a.gated = g->attn_output_gate ? 1 : 0; a.shift = shift; a.eps = (float)g->rms_norm_eps;
    dim3 grid((unsigned)bt->M, (unsigned)(a.nh + a.nkv));
    TD_CU_KERNEL(attn_prep_kernel, grid, PREP_THREADS, td_cu(b)->stream, a);
    TD_CU_LAUNCH("attn_prep_kernel");
}

typedef struct attn_args {
    const int32_t *row_seg, *seg, *block_tables;
    const float *q, *gate;
    float *out;
    td_cu_kv kv;
    int nh, nkv, hd, shift;
} attn_args;

/* Score of position p: td_dot_f32(q, K[p]) * scale in its order (16 lanes:
 * lane j sums i = j, j+16, ... with a multiply then an add, then reduce16),
 * for one thread. q in shared memory. */
static __device__ __forceinline__ float score_at(const attn_args &a, const int32_t *sg, const float *qs, int kh, int p, float scale) {
    size_t row = td_cu_kv_row(a.block_tables, sg, p + a.shift);
    float acc[16];
#pragma unroll
    for (int j = 0; j < 16; j++) acc[j] = 0.0f;
    for (int c = 0; c < a.hd; c += 16) {
#pragma unroll
        for (int j = 0; j < 16; j++)
            if (c + j < a.hd) acc[j] = acc[j] + qs[c + j] * td_cu_kv_read(a.kv, a.kv.k, a.kv.ks, row, kh, c + j);
    }
    float s8[8], s4[4];
#pragma unroll
    for (int j = 0; j < 8; j++) s8[j] = acc[j] + acc[j + 8];
#pragma unroll
    for (int j = 0; j < 4; j++) s4[j] = s8[j] + s8[j + 4];
    return ((s4[0] + s4[2]) + (s4[1] + s4[3])) * scale;
}

/* grid (M, nh); block: one query head of one row over positions 0..pos.
 * Pass 1: scores (threads over positions) and their maximum. Pass 2, in
 * chunks of ATTN_THREADS positions: e = expf(s - max) into shared memory,
 * then each thread walks the chunk in position order for its dims, so sum
 * and acc accumulate in increasing position as ops_attn.c does (the sum is
 * computed by every thread alike). out = (acc / sum) * sigmoid(gate). */
static __global__ void __launch_bounds__(ATTN_THREADS) attention_kernel(attn_args a) {
    __shared__ float qs[TD_MAX_HEAD_DIM];
    __shared__ float sc[ATTN_SMEM_SCORES];
    __shared__ float ev[ATTN_THREADS];
    __shared__ float red[33];
    int m = blockIdx.x, h = blockIdx.y, hd = a.hd, group = a.nh / a.nkv, kh = h / group;
    const int32_t *sg = a.seg + (size_t)a.row_seg[m] * TD_SEG_FIELDS;
    int pos = sg[TD_SEG_POS0] + (m - sg[TD_SEG_ROW0]), n = pos + 1;
    bool keep = n <= ATTN_SMEM_SCORES;
    float scale = 1.0f / sqrtf((float)hd);
    size_t qo = (size_t)m * a.nh * hd + (size_t)h * hd;
    for (int i = threadIdx.x; i < hd; i += ATTN_THREADS) qs[i] = a.q[qo + i];
    __syncthreads();
    float mx = -INFINITY;
    for (int p = threadIdx.x; p < n; p += ATTN_THREADS) {
        float s = score_at(a, sg, qs, kh, p, scale);
        if (keep) sc[p] = s;
        mx = fmaxf(mx, s);
    }
    mx = td_cu_block_max(mx, red); /* max is exact: any order */
    float acc[ATTN_MAX_DIMS_PER_THREAD];
#pragma unroll
    for (int d = 0; d < ATTN_MAX_DIMS_PER_THREAD; d++) acc[d] = 0.0f;
    float sum = 0.0f;
    for (int p0 = 0; p0 < n; p0 += ATTN_THREADS) {
        int p = p0 + threadIdx.x;
        if (p < n) ev[threadIdx.x] = expf((keep ? sc[p] : score_at(a, sg, qs, kh, p, scale)) - mx);
        __syncthreads();
        int cn = n - p0 < ATTN_THREADS ? n - p0 : ATTN_THREADS;
        for (int j = 0; j < cn; j++) {
            float e = ev[j];
            sum += e;
            size_t row = td_cu_kv_row(a.block_tables, sg, p0 + j + a.shift);
#pragma unroll
            for (int d = 0; d < ATTN_MAX_DIMS_PER_THREAD; d++) {
                int i = threadIdx.x + d * ATTN_THREADS;
                if (i < hd) acc[d] = acc[d] + e * td_cu_kv_read(a.kv, a.kv.v, a.kv.vs, row, kh, i);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int d = 0; d < ATTN_MAX_DIMS_PER_THREAD; d++) {
        int i = threadIdx.x + d * ATTN_THREADS;
        if (i < hd) a.out[qo + i] = (acc[d] / sum) * (a.gate ? td_cu_sigmoid(a.gate[qo + i]) : 1.0f);
    }
}

extern "C" void td_cuda_attention(td_backend *b, const td_config *g, const td_batch *bt, const float *q, const float *gate,
                                  const td_kv_view *kv, int shift, float *out) {
    if (bt->M <= 0) return;
    TD_ASSERT(g->head_dim > 0 && g->head_dim <= TD_MAX_HEAD_DIM && g->n_kv_heads > 0 && g->n_heads % g->n_kv_heads == 0);
    TD_ASSERT(kv->store != TD_KV_AUTO && kv->head_dim == g->head_dim);
    attn_args a;
    memset(&a, 0, sizeof a);
    a.row_seg = bt->row_seg; a.seg = bt->seg; a.block_tables = bt->block_tables;
    a.q = q; a.gate = gate; a.out = out;
    a.kv = td_cu_kv_of(kv);
    a.nh = g->n_heads; a.nkv = g->n_kv_heads; a.hd = g->head_dim; a.shift = shift;
    dim3 grid((unsigned)bt->M, (unsigned)a.nh);
    TD_CU_KERNEL(attention_kernel, grid, ATTN_THREADS, td_cu(b)->stream, a);
    TD_CU_LAUNCH("attention_kernel");
}
