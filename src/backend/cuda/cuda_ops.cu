/* CUDA elementwise and row ops: rmsnorm, embed, add, silu_mul, argmax, and
 * single KV rows (kv_store / kv_load). One block per row where a row is
 * reduced, so each row's arithmetic is the same whatever M is (batch
 * invariance); the reductions have a fixed order (cuda_internal.cuh). */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/fill_random.h"

#define ROW_THREADS 256

/* y[m,:] = (x[m,:] * r) * w, r = 1 / sqrtf(mean(x^2) + eps); x, y [M, n], w [n].
 * The sum of squares: thread t sums i = t, t+256, ... in order, then the
 * block tree. */
static __global__ void __launch_bounds__(ROW_THREADS) rmsnorm_kernel(float *y, const float *x, const float *w, int n, float eps) {
    __shared__ float red[33];
    const float *xm = x + (size_t)blockIdx.x * n;
    float *ym = y + (size_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += ROW_THREADS) ss += xm[i] * xm[i];
    ss = td_cu_block_sum(ss, red);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += ROW_THREADS) ym[i] = (xm[i] * r) * w[i];
}

extern "C" void td_cuda_rmsnorm(td_backend *b, float *y, const float *x, const float *w, int M, int n, float eps) {
    if (M <= 0 || n <= 0) return;
    TD_CU_KERNEL(rmsnorm_kernel, M, ROW_THREADS, td_cu(b)->stream, y, x, w, n, eps);
    TD_CU_LAUNCH("rmsnorm_kernel");
}

/* out[m, :] = row tokens[m] of E [V, H] as f32 (F32, BF16, F16: what
 * td_tensor_row_f32 takes). A token outside [0, V) is a broken invariant
 * (the host validates ids): the kernel traps, and the next checked CUDA call
 * aborts. */
static __global__ void embed_kernel(const void *E, int dtype, int64_t V, int64_t H, const int32_t *tokens, float *out) {
    int32_t t = tokens[blockIdx.x];
    if (t < 0 || t >= V) { /* one thread reports and traps: another warp's trap could kill the grid before the printf */
        if (threadIdx.x) return;
        printf("cuda embed: token %d outside [0, %lld)\n", (int)t, (long long)V);
        __trap();
    }
    float *o = out + (size_t)blockIdx.x * H;
    size_t base = (size_t)t * H;
    for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
        float v;
        if (dtype == TD_DTYPE_F32) v = ((const float *)E)[base + i];
        else if (dtype == TD_DTYPE_BF16) v = td_cu_bf16(((const uint16_t *)E)[base + i]);
        else v = td_cu_f16(((const uint16_t *)E)[base + i]);
        o[i] = v;
    }
}

extern "C" void td_cuda_embed(td_backend *b, const td_tensor *E, const int32_t *tokens, int M, float *out) {
    TD_ASSERT(E->ndim == 2 && (E->dtype == TD_DTYPE_F32 || E->dtype == TD_DTYPE_BF16 || E->dtype == TD_DTYPE_F16));
    if (M <= 0) return;
    TD_CU_KERNEL(embed_kernel, M, ROW_THREADS, td_cu(b)->stream, E->data, (int)E->dtype, E->shape[0], E->shape[1], tokens, out);
    TD_CU_LAUNCH("embed_kernel");
}

static __global__ void add_kernel(float *y, const float *x, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) y[i] += x[i];
}

static __global__ void silu_mul_kernel(float *a, const float *u, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        a[i] = td_cu_silu(a[i]) * u[i];
}

static unsigned ew_blocks(size_t n) {
    size_t g = (n + ROW_THREADS - 1) / ROW_THREADS;
    return g < 1 ? 1u : g > 65535 ? 65535u : (unsigned)g;
}

extern "C" void td_cuda_add(td_backend *b, float *y, const float *x, size_t n) {
    if (!n) return;
    TD_CU_KERNEL(add_kernel, ew_blocks(n), ROW_THREADS, td_cu(b)->stream, y, x, n);
    TD_CU_LAUNCH("add_kernel");
}

extern "C" void td_cuda_silu_mul(td_backend *b, float *a, const float *u, size_t n) {
    if (!n) return;
    TD_CU_KERNEL(silu_mul_kernel, ew_blocks(n), ROW_THREADS, td_cu(b)->stream, a, u, n);
    TD_CU_LAUNCH("silu_mul_kernel");
}

/* out[r] = the first maximum of row r, as the CPU's sequential
 * `if (v[i] > v[best]) best = i` from best = 0: NaNs never win, and a NaN
 * at index 0 keeps 0. Each thread scans i = t, t+256, ...; pairs (value,
 * index) are combined by td_cu_argmax_take ("larger value, else lower
 * index"), which picks the same element in any order. */

static __global__ void __launch_bounds__(ROW_THREADS) argmax_kernel(const float *x, int n, int32_t *out) {
    __shared__ float sv[ROW_THREADS / 32];
    __shared__ int si[ROW_THREADS / 32];
    const float *v = x + (size_t)blockIdx.x * n;
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int i = threadIdx.x; i < n; i += ROW_THREADS) td_cu_argmax_take(bv, bi, v[i], i);
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_down_sync(0xffffffffu, bv, o);
        int oi = __shfl_down_sync(0xffffffffu, bi, o);
        td_cu_argmax_take(bv, bi, ov, oi);
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) { sv[w] = bv; si[w] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 1; k < ROW_THREADS / 32; k++) td_cu_argmax_take(bv, bi, sv[k], si[k]);
        /* v[0] NaN: the CPU's comparisons against it all fail; all NaN: 0 too */
        if (bi == INT_MAX || v[0] != v[0]) bi = 0;
        out[blockIdx.x] = bi;
    }
}

extern "C" void td_cuda_argmax(td_backend *b, const float *x, int rows, int n, int32_t *out) {
    if (rows <= 0) return;
    TD_ASSERT(n > 0);
    TD_CU_KERNEL(argmax_kernel, rows, ROW_THREADS, td_cu(b)->stream, x, n, out);
    TD_CU_LAUNCH("argmax_kernel");
}

/* ---- single KV rows (tests and tools: td_kv_write, td_kv_k_head) ---- */

#define KV_THREADS 128

/* block h: head h of k and v at `row`, converted to the KV dtype */
static __global__ void __launch_bounds__(KV_THREADS) kv_store_kernel(td_cu_kv kv, size_t row, const float *k, const float *v) {
    __shared__ float red[33];
    int h = blockIdx.x, hd = kv.head_dim;
    td_cu_kv_write_head(kv, kv.k, kv.ks, row, h, k + (size_t)h * hd, red);
    td_cu_kv_write_head(kv, kv.v, kv.vs, row, h, v + (size_t)h * hd, red);
}

static __global__ void kv_load_kernel(td_cu_kv kv, size_t row, int which, float *out) {
    int h = blockIdx.x, hd = kv.head_dim;
    for (int i = threadIdx.x; i < hd; i += blockDim.x)
        out[(size_t)h * hd + i] = td_cu_kv_read(kv, which ? kv.v : kv.k, which ? kv.vs : kv.ks, row, h, i);
}

static int kv_heads(const td_kv_view *kv) { return kv->head_dim > 0 ? kv->kv_dim / kv->head_dim : 1; }

extern "C" void td_cuda_kv_store(td_backend *b, const td_kv_view *kv, int row, const float *k, const float *v) {
    TD_ASSERT(kv->store != TD_KV_AUTO && kv->head_dim > 0);
    TD_CU_KERNEL(kv_store_kernel, kv_heads(kv), KV_THREADS, td_cu(b)->stream, td_cu_kv_of(kv), (size_t)row, k, v);
    TD_CU_LAUNCH("kv_store_kernel");
}

extern "C" void td_cuda_kv_load(td_backend *b, const td_kv_view *kv, int row, int which, float *out) {
    TD_ASSERT(kv->store != TD_KV_AUTO && kv->head_dim > 0);
    TD_CU_KERNEL(kv_load_kernel, kv_heads(kv), KV_THREADS, td_cu(b)->stream, td_cu_kv_of(kv), (size_t)row, which, out);
    TD_CU_LAUNCH("kv_load_kernel");
}

/* ---- fill_random: backend/fill_random.h, the CPU op's element function ---- */

/* Grid-stride over the elements (NVFP4: over the bytes, two elements each). */
static __global__ void fill_random_kernel(void *dst, int dtype, size_t n, uint64_t key, int constant, float value) {
    size_t stride = (size_t)gridDim.x * blockDim.x, i0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (dtype == TD_DTYPE_NVFP4) {
        for (size_t j = i0; j < n / 2; j += stride)
            ((uint8_t *)dst)[j] = (uint8_t)(td_rand_e2m1(td_rand_value(key, 2 * j, constant, value)) |
                                            td_rand_e2m1(td_rand_value(key, 2 * j + 1, constant, value)) << 4);
        return;
    }
    for (size_t i = i0; i < n; i += stride) {
        float v = td_rand_value(key, i, constant, value);
        if (dtype == TD_DTYPE_F32) ((float *)dst)[i] = v;
        else if (dtype == TD_DTYPE_BF16) ((uint16_t *)dst)[i] = td_rand_bf16(v);
        else if (dtype == TD_DTYPE_Q8) ((int8_t *)dst)[i] = td_rand_q8(v);
        else ((uint8_t *)dst)[i] = td_rand_e4m3(v);
    }
}

extern "C" void td_cuda_fill_random(td_backend *b, void *dst, td_dtype dtype, size_t n, uint64_t seed, td_fill_mode mode, float value) {
    TD_ASSERT((dtype == TD_DTYPE_F32 || dtype == TD_DTYPE_BF16 || dtype == TD_DTYPE_F8_E4M3 || dtype == TD_DTYPE_NVFP4 ||
               dtype == TD_DTYPE_Q8) && "fill_random: F32, BF16, F8_E4M3, NVFP4 or Q8");
    TD_ASSERT((dtype != TD_DTYPE_NVFP4 || n % 2 == 0) && "fill_random: NVFP4 fills whole bytes");
    if (!n) return;
    size_t items = dtype == TD_DTYPE_NVFP4 ? n / 2 : n;
    unsigned blocks = td_cu_blocks(items, 256);
    if (blocks > 65536) blocks = 65536; /* grid-stride beyond that */
    TD_CU_KERNEL(fill_random_kernel, blocks, 256, td_cu(b)->stream, dst, (int)dtype, n, td_rand_key(seed), mode == TD_FILL_CONST, value);
    TD_CU_LAUNCH("fill_random_kernel");
}
