/* cuemu: the CUDA subset of cuemu.h on the CPU (see there for what it is
 * and is not). This file: the block scheduler (threads as ucontext fibers,
 * barriers, warp shuffles) and the runtime API (memory, copies, streams).
 *
 * Scheduling: a block's fibers are swept in order (TD_CUEMU_ORDER=reverse:
 * from the last thread down), each running until it blocks at a barrier or
 * returns. When none can run, the barrier they wait at is released: a warp
 * whose live lanes all wait in a shuffle, else the whole block when every
 * live thread waits in __syncthreads. Anything else (some lanes of a warp
 * in a shuffle and others at __syncthreads) is a divergent barrier, which
 * CUDA leaves undefined: cuemu stops the process with a message. Running the
 * same test in both orders catches a read of shared memory that a missing
 * __syncthreads leaves racing with its write: one of the orders reads the
 * stale value. */
#include "cuemu.h"
#include <atomic>
#include <new>
#include <vector>
#include <sys/mman.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace {

enum { RUN, AT_BLOCK, AT_WARP, DONE };

/* Context switch. x86-64: the callee-saved registers, MXCSR and the x87
 * control word pushed on the stack being left, the stack pointer swapped (no
 * system call: swapcontext saves the signal mask with one, and made a test
 * run 10x slower). Elsewhere ucontext. */
#if defined(__x86_64__)
struct ctx_t {
    void *sp;
};
extern "C" void td_cuemu_switch(void **save_sp, void *load_sp);
__asm__(".text\n"
        ".globl td_cuemu_switch\n"
        ".type td_cuemu_switch,@function\n"
        "td_cuemu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size td_cuemu_switch, .-td_cuemu_switch\n");
static inline void ctx_switch(ctx_t *from, ctx_t *to) { td_cuemu_switch(&from->sp, to->sp); }
/* A fresh context that starts in fn on [stack, stack + bytes): the frame
 * td_cuemu_switch pops (zero registers, this thread's MXCSR / control word),
 * then fn as the return address, above it a null one so that fn starts with
 * the stack aligned as after a call. */
static void ctx_make(ctx_t *c, char *stack, size_t bytes, void (*fn)()) {
    uint64_t *top = (uint64_t *)(((uintptr_t)stack + bytes) & ~(uintptr_t)15);
    uint32_t csr;
    uint16_t cw;
    __asm__ volatile("stmxcsr %0" : "=m"(csr));
    __asm__ volatile("fnstcw %0" : "=m"(cw));
    top[-1] = 0;
    top[-2] = (uint64_t)(uintptr_t)fn;
    for (int r = 3; r <= 8; r++) top[-r] = 0; /* rbp rbx r12 r13 r14 r15 */
    top[-9] = (uint64_t)csr | (uint64_t)cw << 32;
    c->sp = top - 9;
}
#else
struct ctx_t {
    ucontext_t uc;
};
static inline void ctx_switch(ctx_t *from, ctx_t *to) {
    if (swapcontext(&from->uc, &to->uc)) abort();
}
static void ctx_make(ctx_t *c, char *stack, size_t bytes, void (*fn)()) {
    if (getcontext(&c->uc)) abort();
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = bytes;
    c->uc.uc_link = nullptr; /* fn never returns */
    makecontext(&c->uc, fn, 0);
}
#endif

struct fiber {
    ctx_t ctx;
    td_cuemu_ids ids;
    int state;
};

struct sched {
    ctx_t main;
    fiber *f = nullptr;
    int n = 0, cur = -1;
    char *stacks = nullptr;
    int n_stacks = 0;
    void (*fn)(void *) = nullptr;
    void *ctx = nullptr;
    uint64_t slot[TD_CUEMU_MAX_THREADS];
    cudaError_t last = cudaSuccess;
};

const size_t STACK_BYTES = 128 << 10;
thread_local sched S;

[[noreturn]] void die(const char *what) {
    fprintf(stderr, "cuemu: %s\n", what);
    abort();
}

void yield(int state) {
    fiber *me = &S.f[S.cur];
    me->state = state;
    ctx_switch(&me->ctx, &S.main);
}

/* A fiber's whole life: the kernel body, then back to the scheduler for good. */
[[noreturn]] void entry() {
    S.fn(S.ctx);
    yield(DONE);
    die("a finished fiber was resumed");
}

void ensure_fibers(int n) {
    if (n <= S.n_stacks) return;
    if (S.stacks) munmap(S.stacks, (size_t)S.n_stacks * STACK_BYTES);
    delete[] S.f;
    S.stacks = (char *)mmap(nullptr, (size_t)n * STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (S.stacks == MAP_FAILED) die("no memory for the fiber stacks");
    S.f = new fiber[n];
    S.n_stacks = n;
}

bool reverse_order() {
    const char *o = getenv("TD_CUEMU_ORDER");
    return o && !strcmp(o, "reverse");
}

/* Releases what the blocked fibers of the block wait for; false if nothing can be. */
bool release(int n) {
    bool any = false;
    int live = 0, at_block = 0;
    for (int w = 0; w * 32 < n; w++) {
        int lanes = 0, waiting = 0;
        for (int t = w * 32; t < n && t < w * 32 + 32; t++) {
            if (S.f[t].state == DONE) continue;
            lanes++;
            waiting += S.f[t].state == AT_WARP;
            at_block += S.f[t].state == AT_BLOCK;
        }
        live += lanes;
        if (lanes && waiting == lanes) {
            for (int t = w * 32; t < n && t < w * 32 + 32; t++)
                if (S.f[t].state == AT_WARP) S.f[t].state = RUN;
            any = true;
        }
    }
    if (!any && live && at_block == live) {
        for (int t = 0; t < n; t++)
            if (S.f[t].state == AT_BLOCK) S.f[t].state = RUN;
        any = true;
    }
    return any;
}

} /* namespace */

const td_cuemu_ids *td_cuemu_self(void) {
    if (S.cur < 0) die("threadIdx / blockIdx read outside a kernel");
    return &S.f[S.cur].ids;
}

void td_cuemu_syncthreads(void) {
    if (S.cur < 0) die("__syncthreads outside a kernel");
    yield(AT_BLOCK);
}

uint64_t td_cuemu_shfl_down_bits(uint64_t v, unsigned delta, int width) {
    if (S.cur < 0) die("warp shuffle outside a kernel");
    if (width < 1 || width > 32 || (width & (width - 1))) die("warp shuffle width not a power of two <= 32");
    const int t = S.cur, lane = t & (width - 1);
    S.slot[t] = v;
    yield(AT_WARP); /* every lane has written its value */
    uint64_t r = lane + (int)delta < width && t + (int)delta < S.n ? S.slot[t + delta] : v;
    yield(AT_WARP); /* every lane has read before any writes the next one */
    return r;
}

uint64_t td_cuemu_shfl_xor_bits(uint64_t v, unsigned mask, int width) {
    if (S.cur < 0) die("warp shuffle outside a kernel");
    if (width < 1 || width > 32 || (width & (width - 1))) die("warp shuffle width not a power of two <= 32");
    if ((int)mask >= width) die("warp shuffle xor mask not below the width");
    const int t = S.cur, o = t ^ (int)mask;
    S.slot[t] = v;
    yield(AT_WARP); /* every lane has written its value */
    uint64_t r = o < S.n ? S.slot[o] : v;
    yield(AT_WARP); /* every lane has read before any writes the next one */
    return r;
}

void td_cuemu_mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    static thread_local uint32_t frag[TD_CUEMU_MAX_THREADS][6]; /* one block runs at a time per launching thread, as S */
    if (S.cur < 0) die("mma outside a kernel");
    const int t = S.cur, w0 = t & ~31;
    if (w0 + 32 > S.n) die("mma: a warp of fewer than 32 threads");
    for (int i = 0; i < 4; i++) frag[t][i] = a[i];
    frag[t][4] = b[0];
    frag[t][5] = b[1];
    yield(AT_WARP); /* every lane has written its fragments */
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, q = l & 3;
        const uint32_t *f = frag[w0 + l];
        for (int i = 0; i < 8; i++) { /* a_i: register i / 2, half i % 2 */
            const uint16_t h = (uint16_t)(f[i / 2] >> (16 * (i % 2)));
            const int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8, col = q * 2 + (i & 1) + (i >= 4 ? 8 : 0);
            A[row][col] = __uint_as_float((uint32_t)h << 16);
        }
        for (int i = 0; i < 4; i++) { /* b_i: register 4 + i / 2 */
            const uint16_t h = (uint16_t)(f[4 + i / 2] >> (16 * (i % 2)));
            B[q * 2 + (i & 1) + (i >= 2 ? 8 : 0)][g] = __uint_as_float((uint32_t)h << 16);
        }
    }
    const int l = t - w0, g = l >> 2, q = l & 3;
    for (int i = 0; i < 4; i++) { /* d_i: row g (i < 2) or g + 8, column 2 q + i % 2 */
        const int row = i < 2 ? g : g + 8, col = q * 2 + (i & 1);
        float acc = d[i];
        for (int k = 0; k < 16; k++) acc += A[row][k] * B[k][col];
        d[i] = acc;
    }
    yield(AT_WARP); /* every lane has read before any writes the next one */
}

void td_cuemu_run(dim3 grid, dim3 block, void (*fn)(void *), void *ctx) {
    const uint64_t nt = (uint64_t)block.x * block.y * block.z, nb = (uint64_t)grid.x * grid.y * grid.z;
    if (S.cur >= 0) die("kernel launch from inside a kernel");
    if (nt == 0 || nt > TD_CUEMU_MAX_THREADS || nb == 0 || grid.y > 65535 || grid.z > 65535) {
        S.last = cudaErrorInvalidConfiguration; /* as a real launch: reported by cudaGetLastError */
        return;
    }
    const int n = (int)nt;
    const bool rev = reverse_order();
    ensure_fibers(n);
    S.fn = fn;
    S.ctx = ctx;
    S.n = n;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                for (int t = 0; t < n; t++) {
                    fiber *f = &S.f[t];
                    f->ids.thread = dim3((unsigned)t % block.x, (unsigned)t / block.x % block.y, (unsigned)t / (block.x * block.y));
                    f->ids.block = dim3(bx, by, bz);
                    f->ids.block_dim = block;
                    f->ids.grid_dim = grid;
                    f->state = RUN;
                    ctx_make(&f->ctx, S.stacks + (size_t)t * STACK_BYTES, STACK_BYTES, entry);
                }
                int live = n;
                while (live) {
                    bool ran = false;
                    for (int i = 0; i < n; i++) {
                        const int t = rev ? n - 1 - i : i;
                        if (S.f[t].state != RUN) continue;
                        S.cur = t;
                        ctx_switch(&S.main, &S.f[t].ctx);
                        S.cur = -1;
                        live -= S.f[t].state == DONE;
                        ran = true;
                    }
                    if (!ran && live && !release(n))
                        die("divergent barrier: some threads of a block wait in a warp shuffle, others at __syncthreads");
                }
            }
}

/* ---- runtime API ---- */

namespace {
std::atomic<size_t> used_bytes{0};
const size_t HEADER = 256; /* cudaMalloc's alignment; holds the size */

size_t total_bytes() {
    const char *m = getenv("TD_CUEMU_MEM_MB");
    long v = m ? atol(m) : 0;
    return (size_t)(v > 0 ? v : 4096) << 20;
}
cudaError_t fail(cudaError_t e) {
    S.last = e;
    return e;
}
/* Streams of this thread capturing in a mode that refuses cudaMalloc / cudaFree. */
thread_local int strict_captures = 0;
} /* namespace */

struct td_cuemu_stream {
    bool capturing = false, invalidated = false;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    std::vector<std::function<void()>> record;
};
struct td_cuemu_graph {
    std::vector<std::function<void()>> ops;
};
struct td_cuemu_graph_exec {
    std::vector<std::function<void()>> ops;
};

namespace {
/* What CUDA does with an operation a capture cannot hold: refuse it and
 * invalidate the capture (its end then fails). */
cudaError_t capture_refuses(cudaStream_t s) {
    s->invalidated = true;
    s->record.clear();
    return fail(cudaErrorStreamCaptureUnsupported);
}
} /* namespace */

cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int dev) { return dev == 0 ? cudaSuccess : fail(cudaErrorInvalidValue); }
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int dev) {
    if (dev != 0) return fail(cudaErrorInvalidValue);
    const char *e = getenv("TD_CUEMU_SM");
    int sm = e && *e ? atoi(e) : 90;
    if (attr == cudaDevAttrComputeCapabilityMajor) *value = sm / 10;
    else if (attr == cudaDevAttrComputeCapabilityMinor) *value = sm % 10;
    else return fail(cudaErrorInvalidValue);
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
    cudaError_t e = S.last;
    S.last = cudaSuccess;
    return e;
}
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    }
    return "unknown error";
}
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b) {
    size_t t = total_bytes(), u = used_bytes.load();
    *total_b = t;
    *free_b = u < t ? t - u : 0;
    return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t n) {
    *p = nullptr;
    if (strict_captures > 0) return fail(cudaErrorStreamCaptureUnsupported); /* not while a stream captures */
    const size_t total = total_bytes();
    if (n > total || used_bytes.fetch_add(n) + n > total) { /* past the device's memory: as a GPU, out of memory */
        if (n <= total) used_bytes.fetch_sub(n);           /* undo the fetch_add (not done when n > total) */
        return fail(cudaErrorMemoryAllocation);
    }
    void *b = nullptr;
    if (posix_memalign(&b, HEADER, HEADER + n)) {
        used_bytes.fetch_sub(n);
        return fail(cudaErrorMemoryAllocation);
    }
    memcpy(b, &n, sizeof n);
    memset((char *)b + HEADER, 0xa5, n); /* as device memory: not zeroed */
    *p = (char *)b + HEADER;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    if (strict_captures > 0) return fail(cudaErrorStreamCaptureUnsupported);
    if (!p) return cudaSuccess;
    char *b = (char *)p - HEADER;
    size_t n;
    memcpy(&n, b, sizeof n);
    used_bytes.fetch_sub(n);
    free(b);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t n) {
    *p = malloc(n ? n : 1);
    return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaFreeHost(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
    (void)kind;
    if (n) memmove(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s) {
    if (td_cuemu_capturing(s)) {
        if (kind != cudaMemcpyDeviceToDevice) return capture_refuses(s); /* host memory in a graph */
        td_cuemu_record(s, [=] { if (n) memmove(dst, src, n); });
        return cudaSuccess;
    }
    return cudaMemcpy(dst, src, n, kind);
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t s) {
    if (width > dpitch || width > spitch) return fail(cudaErrorInvalidValue);
    auto op = [=] {
        for (size_t r = 0; r < height; r++) memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    };
    if (td_cuemu_capturing(s)) {
        if (kind != cudaMemcpyDeviceToDevice) return capture_refuses(s);
        td_cuemu_record(s, op);
        return cudaSuccess;
    }
    op();
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
    if (td_cuemu_capturing(s)) {
        td_cuemu_record(s, [=] { if (n) memset(p, v, n); });
        return cudaSuccess;
    }
    if (n) memset(p, v, n);
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    (void)flags;
    *s = new (std::nothrow) td_cuemu_stream();
    return *s ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (s && s->capturing) strict_captures--;
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (td_cuemu_capturing(s)) return capture_refuses(s);
    return cudaSuccess;
}

/* ---- stream capture and graphs ---- */

bool td_cuemu_capturing(cudaStream_t s) { return s && s->capturing; }
void td_cuemu_record(cudaStream_t s, std::function<void()> op) {
    if (!s->invalidated) s->record.push_back(std::move(op));
}
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
    if (!s || s->capturing) return fail(cudaErrorIllegalState);
    s->capturing = true;
    s->invalidated = false;
    s->mode = mode;
    s->record.clear();
    if (mode != cudaStreamCaptureModeRelaxed) strict_captures++;
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph) {
    *graph = nullptr;
    if (!s || !s->capturing) return fail(cudaErrorIllegalState);
    s->capturing = false;
    if (s->mode != cudaStreamCaptureModeRelaxed) strict_captures--;
    if (s->invalidated) {
        s->record.clear();
        return fail(cudaErrorStreamCaptureInvalidated);
    }
    *graph = new td_cuemu_graph{std::move(s->record)};
    s->record.clear();
    return cudaSuccess;
}
cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t *nodes, size_t *n) {
    if (!g || nodes) return fail(cudaErrorInvalidValue); /* only the count is emulated */
    *n = g->ops.size();
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g, unsigned long long flags) {
    (void)flags;
    if (!g) return fail(cudaErrorInvalidValue);
    *exec = new td_cuemu_graph_exec{g->ops};
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
    if (!exec) return fail(cudaErrorInvalidValue);
    if (td_cuemu_capturing(s)) { /* a graph launched into a capture: its ops join the record */
        for (auto &op : exec->ops) td_cuemu_record(s, op);
        return cudaSuccess;
    }
    for (auto &op : exec->ops) op();
    return S.last; /* a launch error inside the graph */
}
cudaError_t cudaGraphUpload(cudaGraphExec_t exec, cudaStream_t s) {
    if (!exec || td_cuemu_capturing(s)) return fail(cudaErrorInvalidValue);
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    delete exec;
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    delete g;
    return cudaSuccess;
}

/* ---- cuBLAS subset (cuemu.h) ---- */

struct td_cuemu_blas {
    cudaStream_t stream;
    void *ws;
    size_t ws_bytes;
};
cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
    *h = new (std::nothrow) td_cuemu_blas();
    return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *ws, size_t bytes) {
    h->ws = ws;
    h->ws_bytes = bytes;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode) {
    (void)h;
    return mode == CUBLAS_DEFAULT_MATH ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}
static float bf16_val(uint16_t v) { return __uint_as_float((uint32_t)v << 16); }
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt, int ldb, const void *beta,
                            void *C, cudaDataType ct, int ldc, cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    (void)algo;
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (ta != CUBLAS_OP_T || tb != CUBLAS_OP_N || at != CUDA_R_16BF || bt != CUDA_R_16BF || ct != CUDA_R_32F ||
        compute != CUBLAS_COMPUTE_32F || *(const float *)beta != 0.0f)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m < 0 || n < 0 || k < 0 || lda < k || ldb < k || ldc < m) return CUBLAS_STATUS_INVALID_VALUE;
    const float al = *(const float *)alpha;
    const uint16_t *a = (const uint16_t *)A, *b = (const uint16_t *)B;
    float *c = (float *)C;
    /* C[i + j ldc] = alpha sum_l A[l + i lda] B[l + j ldb] (op(A) = A^T: column i of A is row i of op(A)) */
    auto op = [=] {
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                float acc = 0.0f;
                for (int l0 = 0; l0 < k; l0 += 16) {
                    double part = 0.0;
                    for (int l = l0; l < l0 + 16 && l < k; l++)
                        part += (double)bf16_val(a[(size_t)i * lda + l]) * (double)bf16_val(b[(size_t)j * ldb + l]);
                    acc += (float)part;
                }
                c[(size_t)i + (size_t)j * ldc] = al * acc;
            }
    };
    if (td_cuemu_capturing(h->stream)) td_cuemu_record(h->stream, op);
    else op();
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- cuBLASLt subset (cuemu.h) ---- */

struct td_cuemu_lt {
    int sm;
};
struct td_cuemu_lt_desc {
    int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST, ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    const void *a_scale = nullptr, *b_scale = nullptr;
    bool ok = true; /* compute 32F, scale 32F */
};
struct td_cuemu_lt_layout {
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
};
struct td_cuemu_lt_pref {
    uint64_t ws = 0;
};
cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
    *h = new (std::nothrow) td_cuemu_lt{major * 10 + minor};
    return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t scale) {
    *d = new td_cuemu_lt_desc();
    (*d)->ok = compute == CUBLAS_COMPUTE_32F && scale == CUDA_R_32F;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *buf, size_t n) {
    if (!d || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    switch (a) {
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: if (n != 4) return CUBLAS_STATUS_INVALID_VALUE; memcpy(&d->pointer_mode, buf, 4); break;
    case CUBLASLT_MATMUL_DESC_TRANSA: if (n != 4) return CUBLAS_STATUS_INVALID_VALUE; memcpy(&d->ta, buf, 4); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: if (n != 4) return CUBLAS_STATUS_INVALID_VALUE; memcpy(&d->tb, buf, 4); break;
    case CUBLASLT_MATMUL_DESC_A_SCALE_MODE: if (n != 4) return CUBLAS_STATUS_INVALID_VALUE; memcpy(&d->a_mode, buf, 4); break;
    case CUBLASLT_MATMUL_DESC_B_SCALE_MODE: if (n != 4) return CUBLAS_STATUS_INVALID_VALUE; memcpy(&d->b_mode, buf, 4); break;
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: if (n != sizeof(void *)) return CUBLAS_STATUS_INVALID_VALUE; memcpy(&d->a_scale, buf, n); break;
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: if (n != sizeof(void *)) return CUBLAS_STATUS_INVALID_VALUE; memcpy(&d->b_scale, buf, n); break;
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld) {
    *l = new td_cuemu_lt_layout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    *p = new td_cuemu_lt_pref();
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a,
                                                    const void *buf, size_t n) {
    if (a != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES || n != 8) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&p->ws, buf, 8);
    return CUBLAS_STATUS_SUCCESS;
}

namespace {
/* What the emulated library supports, after cuBLAS's table: FP8 with tensor-wide
 * scales (sm >= 89), with outer-vector scales (sm 90 only), with 128x128 / 1x128
 * block scales (sm 90 only); FP4 with VEC16 block scales (sm >= 100); the
 * backend's layouts. */
bool lt_supported(int sm, const td_cuemu_lt_desc *d, const td_cuemu_lt_layout *a, const td_cuemu_lt_layout *b,
                  const td_cuemu_lt_layout *c, const td_cuemu_lt_layout *dl) {
    if (!d->ok || d->ta != CUBLAS_OP_T || d->tb != CUBLAS_OP_N || a->type != b->type || c->type != CUDA_R_32F ||
        dl->type != CUDA_R_32F)
        return false;
    if (a->rows != b->rows || c->rows != a->cols || c->cols != b->cols || dl->rows != c->rows || dl->cols != c->cols)
        return false;
    if (a->ld < (int64_t)a->rows || b->ld < (int64_t)b->rows || c->ld < (int64_t)c->rows) return false;
    if (!d->a_scale || !d->b_scale) return false;
    if (a->type == CUDA_R_8F_E4M3 && d->a_mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F)
        return sm == 90 && d->b_mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F && a->rows % 128 == 0 && b->cols % 4 == 0;
    if (d->a_mode != d->b_mode) return false;
    if (a->type == CUDA_R_8F_E4M3)
        return a->rows % 16 == 0 && ((sm == 90 && d->a_mode == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F) ||
                                     (sm >= 89 && d->a_mode == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F));
    if (a->type == CUDA_R_4F_E2M1) return sm >= 100 && d->a_mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 && a->rows % 32 == 0;
    return false;
}
/* e4m3fn (OCP FP8): 1 sign, 4 exponent (bias 7), 3 mantissa; 0x7f / 0xff NaN. */
double lt_e4m3(uint8_t v) {
    int e = (v >> 3) & 15, m = v & 7;
    if (e == 15 && m == 7) return NAN;
    double a = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return (v & 0x80) ? -a : a;
}
double lt_e2m1(uint8_t nib) {
    static const double mag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
    return (nib & 8) ? -mag[nib & 7] : mag[nib & 7];
}
/* Block scale of (outer index r, 16-block j) for an operand of `blocks` 16-blocks per row: tiles of
   128 outer x 4 blocks (512 bytes) in row-of-tiles order; inside one, outer r's 32-row quarter q = (r % 128) / 32
   and its row in the quarter r % 32 select a 16-byte line (r % 32) and 4-byte group q, j % 4 the byte. */
uint8_t lt_block_scale(const uint8_t *sf, uint64_t r, uint64_t j, uint64_t blocks) {
    uint64_t tiles_across = (blocks + 3) / 4;
    const uint8_t *tile = sf + ((r / 128) * tiles_across + j / 4) * 512;
    return tile[(r % 32) * 16 + ((r % 128) / 32) * 4 + (j % 4)];
}
} /* namespace */

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl,
                                              cublasLtMatmulPreference_t p, int want, cublasLtMatmulHeuristicResult_t *res, int *got) {
    (void)p;
    *got = 0;
    if (!h || want < 1) return CUBLAS_STATUS_INVALID_VALUE;
    if (!lt_supported(h->sm, d, a, b, c, dl)) return CUBLAS_STATUS_NOT_SUPPORTED;
    memset(&res[0], 0, sizeof res[0]);
    res[0].algo.data[0] = 0x7eu; /* "an algorithm" */
    res[0].state = CUBLAS_STATUS_SUCCESS;
    *got = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A, cublasLtMatrixLayout_t al,
                              const void *B, cublasLtMatrixLayout_t bl, const void *beta, const void *C, cublasLtMatrixLayout_t cl,
                              void *D, cublasLtMatrixLayout_t dl, const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes,
                              cudaStream_t st) {
    (void)ws; (void)ws_bytes;
    if (!h || !algo || algo->data[0] != 0x7eu) return CUBLAS_STATUS_INVALID_VALUE;
    if (!lt_supported(h->sm, d, al, bl, cl, dl) || C != D || cl->ld != dl->ld) return CUBLAS_STATUS_NOT_SUPPORTED;
    const bool fp4 = al->type == CUDA_R_4F_E2M1, blk = d->a_mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    const bool outer = d->a_mode == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F; /* else FP8 tensor-wide: sa[0], sb[0] */
    const uint64_t m = al->cols, n = bl->cols, k = al->rows;
    const int64_t lda = al->ld, ldb = bl->ld, ldd = dl->ld;
    const uint8_t *a = (const uint8_t *)A, *b = (const uint8_t *)B;
    const void *sa = d->a_scale, *sb = d->b_scale;
    float *out = (float *)D;
    auto op = [=] {
        /* the scalars are read when the work runs, as a device pointer's would be */
        float al_v = *(const float *)alpha, be_v = *(const float *)beta;
        if (be_v != 0.0f) abort(); /* the backend always passes beta 0 */
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++) {
                float acc = 0.0f;
                if (blk) { /* A's scale of (row block i/128, k block), B's of (k block, column j) */
                    const uint64_t kbk = k / 128, kb4 = (kbk + 3) / 4 * 4;
                    for (uint64_t kb = 0; kb < kbk; kb++) {
                        float part = 0.0f;
                        for (uint64_t l0 = kb * 128; l0 < kb * 128 + 128; l0 += 32) {
                            double run = 0.0;
                            for (uint64_t l = l0; l < l0 + 32; l++) run += lt_e4m3(a[i * (uint64_t)lda + l]) * lt_e4m3(b[j * (uint64_t)ldb + l]);
                            part += (float)run;
                        }
                        acc += part * ((const float *)sa)[(i / 128) * kb4 + kb] * ((const float *)sb)[kb * n + j];
                    }
                    out[i + j * (uint64_t)ldd] = al_v * acc;
                    continue;
                }
                for (uint64_t l0 = 0; l0 < k; l0 += 32) {
                    double part = 0.0;
                    for (uint64_t l = l0; l < l0 + 32 && l < k; l++) {
                        double x, y;
                        if (fp4) {
                            /* element l of column i: byte l/2 of the column, low nibble first */
                            uint8_t ba = a[i * (uint64_t)lda / 2 + l / 2], bb = b[j * (uint64_t)ldb / 2 + l / 2];
                            x = lt_e2m1((uint8_t)((l & 1) ? ba >> 4 : ba & 15)) *
                                lt_e4m3(lt_block_scale((const uint8_t *)sa, i, l / 16, k / 16));
                            y = lt_e2m1((uint8_t)((l & 1) ? bb >> 4 : bb & 15)) *
                                lt_e4m3(lt_block_scale((const uint8_t *)sb, j, l / 16, k / 16));
                        } else {
                            x = lt_e4m3(a[i * (uint64_t)lda + l]);
                            y = lt_e4m3(b[j * (uint64_t)ldb + l]);
                        }
                        part += x * y;
                    }
                    acc += (float)part;
                }
                if (!fp4) {
                    acc = acc * ((const float *)sa)[outer ? i : 0] * ((const float *)sb)[outer ? j : 0];
                }
                out[i + j * (uint64_t)ldd] = al_v * acc;
            }
    };
    if (td_cuemu_capturing(st)) td_cuemu_record(st, op);
    else op();
    return CUBLAS_STATUS_SUCCESS;
}
