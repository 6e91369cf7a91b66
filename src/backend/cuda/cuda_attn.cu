/* CUDA attention: attn_prep (gate split, q/k RMSNorm per head, partial
 * RoPE, paged KV store in f32 / bf16 / fp8 e4m3) and causal GQA attention
 * over the paged KV with the exact two-pass softmax of ops_attn.c and the
 * optional sigmoid output gate.
 *
 * The batch (td_batch) arrays are device memory: the host knows only M and
 * n_seg, so grids are laid out over rows and heads and each block reads its
 * row's segment, position and block table on the device. One block per
 * (row, head): a row's arithmetic is the same whatever else is in the batch
 * (batch invariance).
 *
 * Long contexts in the fast mode (split attention, as flash-decoding): one
 * block per (row, head) walks every position in order, so at a 100k context
 * a decode step's attention runs on nh blocks of a 132-SM GPU, one position
 * after another. In the fast mode (batch_invariant false, its staging
 * buffers made) and for at most ATTN_SPLIT_MAX_ROWS rows (decode, draft and
 * verify forwards; prompt chunks have M x nh blocks already), positions are
 * cut into fixed partitions of P (cu->attn_split_pos, 2048; env
 * TD_CUDA_ATTN_SPLIT for tests, 0 = off): one block per (row, KV head,
 * partition) reads each K and V row of its range once for the KV head's
 * G query heads (GQA: a block per query head would read them G times) and
 * keeps an online softmax per head; its max, sum and weighted values go to
 * the 64 MiB weight staging buffer, and the last block of each (row, KV
 * head) merges the partitions in increasing order (max of maxes, sums and
 * values rescaled by e^(m_z - max)); its counters are the fast mode's
 * 512 KiB (TD_CUDA_ATTN_COUNTER_BYTES, in the plan's TD_CUDA_GEMM_BYTES).
 * The grid's partition count Z = ceil(max_position_embeddings / P) is
 * fixed per model, so graphs capture it; blocks past a row's positions
 * return at once. A row's partitions depend on its own position only, and
 * whether rows split depends on the model and M <= 128 only (rows whose
 * partials do not fit the buffer together go in row chunks), so a row's
 * bits are the same in any batch of up to 128 rows (greedy at depth k =
 * depth 0 in the fast mode); a row of at most P positions, or past Z x P,
 * is computed head by head as the per-row kernel does (its bits), head g
 * on block z = g mod Z. The split rounds differently from the CPU's single pass:
 * the tolerance is test_cuda_fast_ops'.
 *
 * Prompt chunks in the fast mode (M > 128): the tiled kernel below
 * (attention_tile_kernel), which reads each K and V row once per tile of
 * rows and KV head instead of once per row and query head. */
#include "backend/cuda/cuda_internal.cuh"

#define PREP_THREADS 128
#define ATTN_THREADS 128
/* Scores of one (row, head) kept in shared memory up to this many
 * positions (32 KiB); longer contexts recompute them in pass 2, which gives
 * the same values (the same function of the same inputs). */
#define ATTN_SMEM_SCORES 8192
#define ATTN_MAX_DIMS_PER_THREAD (TD_MAX_HEAD_DIM / ATTN_THREADS)
#define ATTN_SPLIT_MAX_ROWS 128 /* = TD_CUDA_ATTN_COUNTER_BYTES / 4 / TD_CUDA_ATTN_MAX_HEADS */

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

/* The 16 lanes of a dot product summed as td_dot_f32's reduce16 does (halves, then quarters, then pairs). */
static __device__ __forceinline__ float sum16(const float l[16]) {
    float s8[8], s4[4];
#pragma unroll
    for (int j = 0; j < 8; j++) s8[j] = l[j] + l[j + 8];
#pragma unroll
    for (int j = 0; j < 4; j++) s4[j] = s8[j] + s8[j + 4];
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

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
    return sum16(acc) * scale;
}

/* Shared memory of one (row, head) block. */
typedef struct attn_smem {
    float qs[TD_MAX_HEAD_DIM];
    float sc[ATTN_SMEM_SCORES];
    float ev[ATTN_THREADS];
    float red[33];
} attn_smem;

/* The row's (m) segment and its positions n = pos + 1. */
static __device__ __forceinline__ const int32_t *row_segment(const attn_args &a, int m, int *n) {
    const int32_t *sg = a.seg + (size_t)a.row_seg[m] * TD_SEG_FIELDS;
    *n = sg[TD_SEG_POS0] + (m - sg[TD_SEG_ROW0]) + 1;
    return sg;
}

/* Positions [lo, hi) of one query head h of row m: pass 1, scores (threads
 * over positions) and their maximum mx; pass 2, in chunks of ATTN_THREADS
 * positions, e = expf(s - mx) into shared memory, then each thread walks the
 * chunk in position order for its dims, so sum and acc accumulate in
 * increasing position as ops_attn.c does (the sum is computed by every
 * thread alike). Block-uniform: every thread calls it with the same range. */
static __device__ void attend_range(const attn_args &a, const int32_t *sg, int m, int h, int lo, int hi, attn_smem &sm, float &mx,
                                    float &sum, float acc[ATTN_MAX_DIMS_PER_THREAD]) {
    int hd = a.hd, kh = h / (a.nh / a.nkv), n = hi - lo;
    bool keep = n <= ATTN_SMEM_SCORES;
    float scale = 1.0f / sqrtf((float)hd);
    size_t qo = (size_t)m * a.nh * hd + (size_t)h * hd;
    for (int i = threadIdx.x; i < hd; i += ATTN_THREADS) sm.qs[i] = a.q[qo + i];
    __syncthreads();
    mx = -INFINITY;
    for (int p = threadIdx.x; p < n; p += ATTN_THREADS) {
        float s = score_at(a, sg, sm.qs, kh, lo + p, scale);
        if (keep) sm.sc[p] = s;
        mx = fmaxf(mx, s);
    }
    mx = td_cu_block_max(mx, sm.red); /* max is exact: any order */
#pragma unroll
    for (int d = 0; d < ATTN_MAX_DIMS_PER_THREAD; d++) acc[d] = 0.0f;
    sum = 0.0f;
    for (int p0 = 0; p0 < n; p0 += ATTN_THREADS) {
        int p = p0 + threadIdx.x;
        if (p < n) sm.ev[threadIdx.x] = expf((keep ? sm.sc[p] : score_at(a, sg, sm.qs, kh, lo + p, scale)) - mx);
        __syncthreads();
        int cn = n - p0 < ATTN_THREADS ? n - p0 : ATTN_THREADS;
        for (int j = 0; j < cn; j++) {
            float e = sm.ev[j];
            sum += e;
            size_t row = td_cu_kv_row(a.block_tables, sg, lo + p0 + j + a.shift);
#pragma unroll
            for (int d = 0; d < ATTN_MAX_DIMS_PER_THREAD; d++) {
                int i = threadIdx.x + d * ATTN_THREADS;
                if (i < hd) acc[d] = acc[d] + e * td_cu_kv_read(a.kv, a.kv.v, a.kv.vs, row, kh, i);
            }
        }
        __syncthreads();
    }
}

/* out = (acc / sum) * sigmoid(gate) for this thread's dims. */
static __device__ __forceinline__ void attend_out(const attn_args &a, int m, int h, float sum, const float acc[ATTN_MAX_DIMS_PER_THREAD]) {
    size_t qo = (size_t)m * a.nh * a.hd + (size_t)h * a.hd;
#pragma unroll
    for (int d = 0; d < ATTN_MAX_DIMS_PER_THREAD; d++) {
        int i = threadIdx.x + d * ATTN_THREADS;
        if (i < a.hd) a.out[qo + i] = (acc[d] / sum) * (a.gate ? td_cu_sigmoid(a.gate[qo + i]) : 1.0f);
    }
}

/* grid (M, nh); block: one query head of one row over positions 0..pos. */
static __global__ void __launch_bounds__(ATTN_THREADS) attention_kernel(attn_args a) {
    __shared__ attn_smem sm;
    int m = blockIdx.x, h = blockIdx.y, n;
    const int32_t *sg = row_segment(a, m, &n);
    float mx, sum, acc[ATTN_MAX_DIMS_PER_THREAD];
    attend_range(a, sg, m, h, 0, n, sm, mx, sum, acc);
    attend_out(a, m, h, sum, acc);
}

/* Split attention: grid (M, nkv, Z); block (m, kh, z) takes partition z of
 * row m for the G = nh / nkv query heads of KV head kh (each K and V row is
 * read once for the group, as FlashInfer's decode does): positions
 * [z P, min(n, (z + 1) P)) in chunks of CH, each chunk's K and V rows
 * loaded into shared memory by all threads (coalesced), the G x CH scores
 * (the 16-lane dot order of score_at), then per head an online softmax
 * (running max m, sum l and values, rescaled by e^(m - m') when the max
 * grows). Each head's max, sum and hd values go to part[((mb nh + h) Z + z)
 * (hd + 2)] (mb: the row within this launch's chunk of rows), and the last of the row's blocks for kh to finish (a counter
 * per (row, KV head), reset by that block for the next launch: one kernel,
 * one graph node, as the per-row kernel) merges each head's partitions in
 * increasing z: max of maxes, sums and values rescaled by e^(m_z - max).
 * A row of one partition, or past Z partitions: the per-row computation
 * for each head of the group, head g on block z = g mod Z (the per-row
 * kernel's bits).
 * Shapes: G (hd + 1) + CH (2 hd + 1) + 2 G x SPLIT_CH floats fit SPLIT_POOL with CH >= 1,
 * and G x ceil(hd / 128) <= SPLIT_ACC (the host checks; else per-row). */
#define SPLIT_POOL 11264 /* floats (44 KiB) of shared memory, also the per-row fallback's attn_smem */
#define SPLIT_CH 16
#define SPLIT_ACC 16
static_assert(sizeof(attn_smem) <= SPLIT_POOL * sizeof(float), "the per-row fallback's shared memory fits the pool");

static __global__ void __launch_bounds__(ATTN_THREADS) attention_split_kernel(attn_args a, int m0, int P, float *part, unsigned *counters) {
    __shared__ float pool[SPLIT_POOL];
    __shared__ bool last;
    /* rows m0 + blockIdx.x of the batch; partials and counters by blockIdx.x (launches in row chunks reuse them in stream order) */
    int mb = blockIdx.x, m = m0 + mb, kh = blockIdx.y, z = blockIdx.z, Z = gridDim.z, n;
    const int G = a.nh / a.nkv, hd = a.hd, tid = threadIdx.x;
    const int32_t *sg = row_segment(a, m, &n);
    int nz = (n + P - 1) / P;
    if (nz == 1 || nz > Z) { /* block-uniform, as every branch below; head g on block z = g mod Z */
        attn_smem &sm = *reinterpret_cast<attn_smem *>(pool);
        for (int g = z; g < G; g += Z) {
            float mx, sum, acc[ATTN_MAX_DIMS_PER_THREAD];
            attend_range(a, sg, m, kh * G + g, 0, n, sm, mx, sum, acc);
            attend_out(a, m, kh * G + g, sum, acc);
            __syncthreads(); /* the next head's q load reuses the pool */
        }
        return;
    }
    if (z >= nz) return;
    const int lo = z * P, hi = n - lo < P ? n : lo + P;
    /* q and K rows at a stride of hd + 1: the score loop's threads read different rows at one column (no bank conflicts) */
    const int hp = hd + 1;
    int ch = (SPLIT_POOL - G * hp - 2 * G * SPLIT_CH) / (hp + hd);
    if (ch > SPLIT_CH) ch = SPLIT_CH;
    float *qs = pool, *ks = qs + G * hp, *vs = ks + ch * hp, *sc = vs + ch * hd, *pr = sc + G * SPLIT_CH;
    const float scale = 1.0f / sqrtf((float)hd);
    const size_t qo = (size_t)m * a.nh * hd + (size_t)kh * G * hd; /* the group's heads are consecutive */
    for (int i = tid; i < G * hd; i += ATTN_THREADS) qs[(i / hd) * hp + i % hd] = a.q[qo + i];
    float mrun[SPLIT_ACC], lrun[SPLIT_ACC], acc[SPLIT_ACC]; /* mrun, lrun: [g]; acc: [g x dims-per-thread + d] */
    const int dpt = (hd + ATTN_THREADS - 1) / ATTN_THREADS;
#pragma unroll
    for (int i = 0; i < SPLIT_ACC; i++) mrun[i] = -INFINITY, lrun[i] = 0.0f, acc[i] = 0.0f;
    for (int c0 = lo; c0 < hi; c0 += ch) {
        const int cn = hi - c0 < ch ? hi - c0 : ch;
        __syncthreads(); /* q loaded; the previous chunk's rows, scores and weights no longer read */
        for (int e = tid; e < cn * hd; e += ATTN_THREADS) {
            int j = e / hd, i = e % hd;
            size_t row = td_cu_kv_row(a.block_tables, sg, c0 + j + a.shift);
            ks[j * hp + i] = td_cu_kv_read(a.kv, a.kv.k, a.kv.ks, row, kh, i);
            vs[e] = td_cu_kv_read(a.kv, a.kv.v, a.kv.vs, row, kh, i);
        }
        __syncthreads();
        for (int e = tid; e < G * cn; e += ATTN_THREADS) { /* score (g, j) in score_at's order */
            int g = e / cn, j = e % cn;
            const float *q = qs + g * hp, *k = ks + j * hp;
            float l16[16];
#pragma unroll
            for (int t = 0; t < 16; t++) l16[t] = 0.0f;
            for (int c = 0; c < hd; c += 16) {
#pragma unroll
                for (int t = 0; t < 16; t++)
                    if (c + t < hd) l16[t] = l16[t] + q[c + t] * k[c + t];
            }
            sc[g * SPLIT_CH + j] = sum16(l16) * scale;
        }
        __syncthreads();
        for (int e = tid; e < G * cn; e += ATTN_THREADS) { /* weights against each head's new max */
            int g = e / cn, j = e % cn;
            float mn = mrun[g];
            for (int t = 0; t < cn; t++) mn = fmaxf(mn, sc[g * SPLIT_CH + t]);
            pr[g * SPLIT_CH + j] = expf(sc[g * SPLIT_CH + j] - mn);
        }
        __syncthreads();
        for (int g = 0; g < G; g++) { /* every thread: the running max, sum and its dims of each head */
            float mn = mrun[g];
            for (int t = 0; t < cn; t++) mn = fmaxf(mn, sc[g * SPLIT_CH + t]);
            float alpha = expf(mrun[g] - mn); /* 0 at the first chunk (m = -inf) */
            float l = lrun[g] * alpha;
            for (int t = 0; t < cn; t++) l += pr[g * SPLIT_CH + t];
            lrun[g] = l;
            mrun[g] = mn;
            for (int d = 0; d < dpt; d++) {
                int i = tid + d * ATTN_THREADS;
                if (i >= hd) break;
                float v = acc[g * dpt + d] * alpha;
                for (int t = 0; t < cn; t++) v += pr[g * SPLIT_CH + t] * vs[t * hd + i];
                acc[g * dpt + d] = v;
            }
        }
    }
    const size_t stride = (size_t)(hd + 2);
    for (int g = 0; g < G; g++) {
        float *o = part + (((size_t)mb * a.nh + kh * G + g) * Z + z) * stride;
        if (tid == 0) o[0] = mrun[g], o[1] = lrun[g];
        for (int d = 0; d < dpt; d++) {
            int i = tid + d * ATTN_THREADS;
            if (i < hd) o[2 + i] = acc[g * dpt + d];
        }
    }
    __threadfence(); /* this block's partials are visible device-wide before the counter moves */
    __syncthreads();
    if (tid == 0) {
        unsigned *c = counters + (size_t)mb * a.nkv + kh;
        last = atomicAdd(c, 1u) == (unsigned)nz - 1;
        if (last) *c = 0; /* every other block of this row and KV head has counted: ready for the next launch */
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int g = 0; g < G; g++) {
        const int h = kh * G + g;
        const float *pz = part + ((size_t)mb * a.nh + h) * (size_t)Z * stride;
        float mx = -INFINITY, sum = 0.0f, out[ATTN_MAX_DIMS_PER_THREAD];
        for (int k = 0; k < nz; k++) mx = fmaxf(mx, __ldcg(pz + (size_t)k * stride)); /* L2: other SMs' writes */
#pragma unroll
        for (int d = 0; d < ATTN_MAX_DIMS_PER_THREAD; d++) out[d] = 0.0f;
        for (int k = 0; k < nz; k++) {
            const float *ok = pz + (size_t)k * stride;
            float f = expf(__ldcg(ok) - mx);
            sum += __ldcg(ok + 1) * f;
#pragma unroll
            for (int d = 0; d < ATTN_MAX_DIMS_PER_THREAD; d++) {
                int i = tid + d * ATTN_THREADS;
                if (i < hd) out[d] += __ldcg(ok + 2 + i) * f;
            }
        }
        attend_out(a, m, h, sum, out);
    }
}

/* Prompt chunks in the fast mode: tiled attention (flash-attention's
 * schedule, on CUDA cores). The per-row kernel reads every K and V row of the
 * context once per (row, query head): a 4096-row chunk at a 50k context
 * reads the cache 4096 x nh times. Here grid (ceil(M / BR), nkv): block
 * (t, kh) takes rows [t BR, t BR + BR) for the G query heads of KV head kh,
 * TILE_Q >= BR G query vectors, and walks the positions in chunks of
 * TILE_BC keys: the chunk's K and V rows go to shared memory once (coalesced,
 * converted from the KV dtype) and serve all of the block's query vectors.
 * A query vector has TILE_QT threads: thread `sub` holds q's dims sub + 4 i
 * in registers and the same dims of its output; a score is the 4 threads'
 * partial dots summed by two xor shuffles (every thread then has all
 * TILE_BC scores), and an online softmax per query vector (running max m,
 * sum l, output rescaled by e^(m - m') when the max grows) takes the chunk.
 * Causal: key p counts for a row of n positions when p < n. The tile's rows
 * are cut into runs of one segment (a prompt chunk is one run; decode rows
 * of other sequences beside it are runs of one row), each run walking the
 * positions up to its last row's. The first chunk always has key 0, so a
 * running max is finite after it and a chunk past a row's positions adds 0.
 * Rounding: f32 throughout, summed in another order than the CPU's two
 * passes (test_cuda_fast_ops: within 1e-5 norm-wise). M > 128 only, so the
 * decode, draft and verify rows keep the split / per-row kernels' bits. */
#define TILE_THREADS 256
#define TILE_QT 4
#define TILE_Q (TILE_THREADS / TILE_QT) /* 64 query vectors */
#define TILE_BC 16
#define TILE_MAX_HD 256
#define TILE_DPT (TILE_MAX_HD / TILE_QT) /* dims per thread */
static_assert(TILE_QT == 4, "the score's all-reduce is two xor shuffles");

/* The run of rows from r0 (before the tile's end t1) in r0's segment: its
 * end *r1, its segment, and *nmax, the positions its last row attends (the
 * run's rows are consecutive positions). Every thread calls it alike. */
static __device__ __forceinline__ const int32_t *tile_run(const attn_args &a, int r0, int t1, int *r1, int *nmax) {
    const int segi = a.row_seg[r0];
    int e = r0 + 1;
    while (e < t1 && a.row_seg[e] == segi) e++;
    const int32_t *sg = a.seg + (size_t)segi * TD_SEG_FIELDS;
    *r1 = e;
    *nmax = sg[TD_SEG_POS0] + (e - 1 - sg[TD_SEG_ROW0]) + 1;
    return sg;
}

static __global__ void __launch_bounds__(TILE_THREADS) attention_tile_kernel(attn_args a, int M, int BR) {
    __shared__ float ks[TILE_BC * TILE_MAX_HD], vs[TILE_BC * TILE_MAX_HD];
    const int G = a.nh / a.nkv, hd = a.hd, kh = blockIdx.y, tid = threadIdx.x;
    const int qi = tid / TILE_QT, sub = tid % TILE_QT;
    const float scale = 1.0f / sqrtf((float)hd);
    const int t0 = (int)blockIdx.x * BR, t1 = M - t0 < BR ? M : t0 + BR;
    for (int r0 = t0; r0 < t1;) { /* block-uniform: every thread walks the same runs */
        int r1, nmax;
        const int32_t *sg = tile_run(a, r0, t1, &r1, &nmax);
        const bool act = qi < (r1 - r0) * G;
        const int m = r0 + qi / G, h = kh * G + qi % G;
        const int n = act ? sg[TD_SEG_POS0] + (m - sg[TD_SEG_ROW0]) + 1 : 0;
        const size_t qo = ((size_t)m * a.nh + h) * hd;
        float qr[TILE_DPT], acc[TILE_DPT];
#pragma unroll
        for (int i = 0; i < TILE_DPT; i++) {
            const int d = sub + TILE_QT * i;
            qr[i] = act && d < hd ? a.q[qo + d] : 0.0f;
            acc[i] = 0.0f;
        }
        float mrun = -INFINITY, lrun = 0.0f;
        for (int c0 = 0; c0 < nmax; c0 += TILE_BC) {
            const int cn = nmax - c0 < TILE_BC ? nmax - c0 : TILE_BC;
            __syncthreads(); /* the previous chunk's (or run's) K and V rows are no longer read */
            for (int e = tid; e < cn * hd; e += TILE_THREADS) {
                const int j = e / hd, i = e % hd;
                const size_t row = td_cu_kv_row(a.block_tables, sg, c0 + j + a.shift);
                ks[e] = td_cu_kv_read(a.kv, a.kv.k, a.kv.ks, row, kh, i);
                vs[e] = td_cu_kv_read(a.kv, a.kv.v, a.kv.vs, row, kh, i);
            }
            __syncthreads();
            float sc[TILE_BC];
            float mn = mrun;
#pragma unroll
            for (int j = 0; j < TILE_BC; j++) {
                float part = 0.0f;
                if (j < cn) {
#pragma unroll
                    for (int i = 0; i < TILE_DPT; i++) {
                        const int d = sub + TILE_QT * i;
                        if (d < hd) part += qr[i] * ks[j * hd + d];
                    }
                }
                /* every lane shuffles (warp-uniform), the 4 threads of a query vector sum alike */
                part += __shfl_xor_sync(0xffffffffu, part, 1, TILE_QT);
                part += __shfl_xor_sync(0xffffffffu, part, 2, TILE_QT);
                sc[j] = j < cn && c0 + j < n ? part * scale : -INFINITY;
                mn = fmaxf(mn, sc[j]);
            }
            if (!act) continue;
            const float alpha = expf(mrun - mn); /* 0 at the first chunk (m = -inf, mn finite: key 0 counts) */
            float l = lrun * alpha;
#pragma unroll
            for (int i = 0; i < TILE_DPT; i++) acc[i] *= alpha;
#pragma unroll
            for (int j = 0; j < TILE_BC; j++) {
                if (j >= cn) break;
                const float p = expf(sc[j] - mn); /* 0 past the row's positions */
                l += p;
#pragma unroll
                for (int i = 0; i < TILE_DPT; i++) {
                    const int d = sub + TILE_QT * i;
                    if (d < hd) acc[i] += p * vs[j * hd + d];
                }
            }
            lrun = l;
            mrun = mn;
        }
        if (act) {
#pragma unroll
            for (int i = 0; i < TILE_DPT; i++) {
                const int d = sub + TILE_QT * i;
                if (d < hd) a.out[qo + d] = (acc[i] / lrun) * (a.gate ? td_cu_sigmoid(a.gate[qo + d]) : 1.0f);
            }
        }
        r0 = r1;
    }
}

/* The same tiling on tensor cores (sm_80 and later): mma.sync m16n8k16 with
 * Q, K, V and the softmax weights rounded to bf16, scores and outputs in
 * f32 (flash-attention 2's schedule). Grid (ceil(M / BR), nkv) with BR =
 * MMA_Q / G; three warps, warp w for query vectors [16 w, 16 w + 16) of the
 * block's MMA_Q; lane (g = lane / 4, t = lane % 4) holds rows g and g + 8 of
 * its warp's 16 (the accumulator layout). Per chunk of MMA_BC = 16 keys: K
 * rows and V transposed go to shared memory in bf16 (rows padded by 8 so a
 * fragment's 8 rows fall in different banks); S = Q K^T (hd / 16 mma per 8
 * keys), scaled and masked (causal: key p for a row of n positions when p <
 * n), the row max over the 4 lanes of a row by xor shuffles, the online
 * softmax (rows' running max and each lane's share of the sum, rescaled by
 * e^(m - m')), and O += P V, P taken straight from S's accumulator layout as
 * the A fragment. Query vectors past the run (and rows of other runs) get
 * n = 1 and zero q: finite, never written. Rounding: bf16 operands (2^-9
 * relative each), so test_cuda_fast_ops bounds it by 1e-2 of the output's
 * max norm-wise against the CPU, well inside the fast mode's logits
 * tolerance; the f32 tile kernel above is the path without tensor cores. */
#define MMA_WARPS 3
#define MMA_THREADS (32 * MMA_WARPS)
#define MMA_Q (16 * MMA_WARPS) /* 48 query vectors */
#define MMA_BC 16
#define MMA_QP (TILE_MAX_HD + 8) /* Q and K rows in shared memory (bf16 elements) */
#define MMA_VP (MMA_BC + 8)      /* V transposed: a row per dim */

static __device__ __forceinline__ uint32_t bf16_pair(float lo, float hi) {
    return (uint32_t)td_cu_f32_to_bf16(lo) | (uint32_t)td_cu_f32_to_bf16(hi) << 16;
}
static __device__ __forceinline__ uint32_t smem_pair(const uint16_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 16; }

static __global__ void __launch_bounds__(MMA_THREADS) attention_mma_kernel(attn_args a, int M, int BR) {
    __shared__ __align__(16) uint16_t qs[MMA_Q * MMA_QP], ks[MMA_BC * MMA_QP], vt[TILE_MAX_HD * MMA_VP];
    __shared__ size_t krow[MMA_BC]; /* the chunk's KV rows, looked up once */
    const int G = a.nh / a.nkv, hd = a.hd, kh = blockIdx.y, tid = threadIdx.x;
    const int hd16 = (hd + 15) & ~15, warp = tid / 32, g = (tid % 32) / 4, t = tid % 4;
    const float scale = 1.0f / sqrtf((float)hd);
    const int t0 = (int)blockIdx.x * BR, t1 = M - t0 < BR ? M : t0 + BR;
    const bool bf16_rows = a.kv.store == TD_KV_BF16 && hd % 8 == 0; /* 16-byte aligned head rows */
    for (int r0 = t0; r0 < t1;) { /* block-uniform: runs of one segment */
        int r1, nmax;
        const int32_t *sg = tile_run(a, r0, t1, &r1, &nmax);
        const int nq = (r1 - r0) * G;
        __syncthreads(); /* the previous run's Q is no longer read */
        for (int e = tid; e < MMA_Q * hd16; e += MMA_THREADS) {
            const int qi = e / hd16, d = e % hd16, m = r0 + qi / G, h = kh * G + qi % G;
            qs[qi * MMA_QP + d] = td_cu_f32_to_bf16(qi < nq && d < hd ? a.q[((size_t)m * a.nh + h) * hd + d] : 0.0f);
        }
        int nrow[2]; /* positions of this lane's rows g and g + 8 (1 for a vector past the run) */
        for (int i = 0; i < 2; i++) {
            const int qi = warp * 16 + g + 8 * i, m = r0 + qi / G;
            nrow[i] = qi < nq ? sg[TD_SEG_POS0] + (m - sg[TD_SEG_ROW0]) + 1 : 1;
        }
        float o[TILE_MAX_HD / 8][4];
#pragma unroll
        for (int nt = 0; nt < TILE_MAX_HD / 8; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
        float mrun[2] = {-INFINITY, -INFINITY}, lrun[2] = {0.0f, 0.0f};
        for (int c0 = 0; c0 < nmax; c0 += MMA_BC) {
            const int cn = nmax - c0 < MMA_BC ? nmax - c0 : MMA_BC;
            __syncthreads(); /* the previous chunk's K and V (and rows) are no longer read */
            if (tid < MMA_BC) krow[tid] = tid < cn ? td_cu_kv_row(a.block_tables, sg, c0 + tid + a.shift) : 0;
            __syncthreads();
            if (bf16_rows) { /* bf16 KV: 8 dims (16 bytes) per load, copied as they are (the same bf16 values) */
                for (int e = tid; e < MMA_BC * (hd16 / 8); e += MMA_THREADS) {
                    const int j = e / (hd16 / 8), d = e % (hd16 / 8) * 8;
                    uint4 kk = {0, 0, 0, 0}, vv = {0, 0, 0, 0};
                    if (j < cn && d < hd) {
                        const size_t off = krow[j] * (size_t)a.kv.kv_dim + (size_t)kh * hd + d;
                        kk = *(const uint4 *)((const uint16_t *)a.kv.k + off);
                        vv = *(const uint4 *)((const uint16_t *)a.kv.v + off);
                    }
                    *(uint4 *)(ks + j * MMA_QP + d) = kk;
                    const unsigned vw[4] = {vv.x, vv.y, vv.z, vv.w};
#pragma unroll
                    for (int q = 0; q < 8; q++) vt[(d + q) * MMA_VP + j] = (uint16_t)(vw[q / 2] >> (16 * (q % 2)));
                }
            } else {
                for (int e = tid; e < MMA_BC * hd16; e += MMA_THREADS) {
                    const int j = e / hd16, d = e % hd16;
                    float kx = 0.0f, vx = 0.0f;
                    if (j < cn && d < hd) {
                        kx = td_cu_kv_read(a.kv, a.kv.k, a.kv.ks, krow[j], kh, d);
                        vx = td_cu_kv_read(a.kv, a.kv.v, a.kv.vs, krow[j], kh, d);
                    }
                    ks[j * MMA_QP + d] = td_cu_f32_to_bf16(kx);
                    vt[d * MMA_VP + j] = td_cu_f32_to_bf16(vx);
                }
            }
            __syncthreads();
            float sc[2][4]; /* [keys 0-7 | 8-15][row g: keys 2t, 2t+1 | row g+8: the same] */
#pragma unroll
            for (int nt = 0; nt < 2; nt++) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
            const uint16_t *qa = qs + (warp * 16 + g) * MMA_QP, *qb = qa + 8 * MMA_QP;
            for (int k0 = 0; k0 < hd16; k0 += 16) {
                const uint32_t af[4] = {smem_pair(qa + k0 + 2 * t), smem_pair(qb + k0 + 2 * t), smem_pair(qa + k0 + 8 + 2 * t),
                                        smem_pair(qb + k0 + 8 + 2 * t)};
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    const uint16_t *kr = ks + (nt * 8 + g) * MMA_QP + k0;
                    const uint32_t bf[2] = {smem_pair(kr + 2 * t), smem_pair(kr + 8 + 2 * t)};
                    td_cu_mma_bf16(sc[nt], af, bf);
                }
            }
            float alpha[2];
#pragma unroll
            for (int i = 0; i < 2; i++) { /* row g (i = 0) and g + 8: scale, mask, max over the row's 4 lanes */
                float mx = mrun[i];
#pragma unroll
                for (int nt = 0; nt < 2; nt++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        const int j = nt * 8 + 2 * t + c;
                        float &v = sc[nt][2 * i + c];
                        v = j < cn && c0 + j < nrow[i] ? v * scale : -INFINITY;
                        mx = fmaxf(mx, v);
                    }
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1, 4));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2, 4));
                alpha[i] = expf(mrun[i] - mx); /* 0 at the first chunk: key 0 counts for every row */
                float l = lrun[i] * alpha[i];
#pragma unroll
                for (int nt = 0; nt < 2; nt++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        float &v = sc[nt][2 * i + c];
                        v = expf(v - mx);
                        l += v;
                    }
                lrun[i] = l; /* this lane's share; the 4 lanes are summed at the end */
                mrun[i] = mx;
            }
            const uint32_t pf[4] = {bf16_pair(sc[0][0], sc[0][1]), bf16_pair(sc[0][2], sc[0][3]), bf16_pair(sc[1][0], sc[1][1]),
                                    bf16_pair(sc[1][2], sc[1][3])};
#pragma unroll
            for (int nt = 0; nt < TILE_MAX_HD / 8; nt++) {
                if (nt * 8 < hd16) { /* a guard, not a break: the unrolled loop keeps o in registers */
                    o[nt][0] *= alpha[0]; o[nt][1] *= alpha[0];
                    o[nt][2] *= alpha[1]; o[nt][3] *= alpha[1];
                    const uint16_t *vr = vt + (nt * 8 + g) * MMA_VP;
                    const uint32_t bf[2] = {smem_pair(vr + 2 * t), smem_pair(vr + 8 + 2 * t)};
                    td_cu_mma_bf16(o[nt], pf, bf);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            lrun[i] += __shfl_xor_sync(0xffffffffu, lrun[i], 1, 4);
            lrun[i] += __shfl_xor_sync(0xffffffffu, lrun[i], 2, 4);
        }
#pragma unroll
        for (int i = 0; i < 2; i++) { /* unrolled: o's indices are constants (registers, not local memory) */
            const int qi = warp * 16 + g + 8 * i;
            if (qi >= nq) continue;
            const int m = r0 + qi / G, h = kh * G + qi % G;
            const size_t qo = ((size_t)m * a.nh + h) * hd;
#pragma unroll
            for (int nt = 0; nt < TILE_MAX_HD / 8; nt++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int d = nt * 8 + 2 * t + c;
                    if (d < hd) a.out[qo + d] = (o[nt][2 * i + c] / lrun[i]) * (a.gate ? td_cu_sigmoid(a.gate[qo + d]) : 1.0f);
                }
        }
        r0 = r1;
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
    td_cuda *cu = td_cu(b);
    const int P = cu->attn_split_pos;
    const int64_t Z = g->max_position_embeddings > 0 && P > 0 ? ((int64_t)g->max_position_embeddings + P - 1) / P : 0;
    const size_t row_bytes = (size_t)a.nh * (size_t)Z * (size_t)(a.hd + 2) * sizeof(float); /* one row's partials */
    const int G = a.nh / a.nkv, dpt = (a.hd + ATTN_THREADS - 1) / ATTN_THREADS;
    const bool fits = G * dpt <= SPLIT_ACC && G * (a.hd + 1) + (2 * a.hd + 1) + 2 * G * SPLIT_CH <= SPLIT_POOL;
    if (!b->batch_invariant && cu->attn_tile == TD_CU_ATTN_TILE_MMA && cu->sm >= 80 && bt->M > ATTN_SPLIT_MAX_ROWS && a.hd <= TILE_MAX_HD &&
        G <= MMA_Q) {
        const int BR = MMA_Q / G; /* rows per block */
        TD_CU_KERNEL(attention_mma_kernel, dim3((unsigned)((bt->M + BR - 1) / BR), (unsigned)a.nkv), MMA_THREADS, cu->stream, a, bt->M,
                     BR);
        TD_CU_LAUNCH("attention_mma_kernel");
        return;
    }
    if (!b->batch_invariant && cu->attn_tile != TD_CU_ATTN_TILE_OFF && bt->M > ATTN_SPLIT_MAX_ROWS && a.hd <= TILE_MAX_HD && G <= TILE_Q) {
        const int BR = TILE_Q / G; /* rows per block */
        TD_CU_KERNEL(attention_tile_kernel, dim3((unsigned)((bt->M + BR - 1) / BR), (unsigned)a.nkv), TILE_THREADS, cu->stream, a, bt->M,
                     BR);
        TD_CU_LAUNCH("attention_tile_kernel");
        return;
    }
    /* whether a row takes the split depends on the model and M <= 128 only (not on how many rows fit the
       buffer: those go in row chunks), so a decode row's bits are the same alone or beside up to 127 others */
    if (!b->batch_invariant && cu->gemm_state == TD_CU_GEMM_ON && bt->M <= ATTN_SPLIT_MAX_ROWS && a.nkv <= TD_CUDA_ATTN_MAX_HEADS &&
        fits && Z > 1 && Z <= 65535 && row_bytes <= cu->gemm_w_cap) {
        float *part = (float *)cu->gemm_w; /* the staging buffer: stream-ordered, free between matmuls */
        const int per = (int)(cu->gemm_w_cap / row_bytes < (size_t)bt->M ? cu->gemm_w_cap / row_bytes : (size_t)bt->M);
        for (int m0 = 0; m0 < bt->M; m0 += per) {
            const int rows = bt->M - m0 < per ? bt->M - m0 : per;
            TD_CU_KERNEL(attention_split_kernel, dim3((unsigned)rows, (unsigned)a.nkv, (unsigned)Z), ATTN_THREADS, cu->stream, a, m0, P,
                         part, (unsigned *)cu->attn_counters);
            TD_CU_LAUNCH("attention_split_kernel");
        }
        return;
    }
    TD_CU_KERNEL(attention_kernel, grid, ATTN_THREADS, cu->stream, a);
    TD_CU_LAUNCH("attention_kernel");
}
