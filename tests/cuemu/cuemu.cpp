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
