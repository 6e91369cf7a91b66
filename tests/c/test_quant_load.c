/* Quantized checkpoints: tests/golden/tiny-a (f32) rewritten here with its
 * big linear weights in FP8 e4m3 (128x128 block scales, per-channel and
 * per-tensor scales) and NVFP4 (ModelOpt and compressed-tensors layouts),
 * next to a copy whose weights are those quantized values dequantized to
 * F32. Both load; the quantized model's logits must match the dequantized
 * model's: bit for bit where the kernel's in-register weight is exactly the
 * dequantized f32 value (fp8 with block or channel scales), within 1e-5 of
 * max |logit| otherwise (per-tensor fp8 and NVFP4 apply their global scale
 * after the sum). Norms, embeddings, conv and lm_head stay float. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "backend/cpu/kernels.h"
#include "check.h"
#include "engine/engine.h"
#include "format/safetensors.h"
#include "model/forward.h"
#include "tandem.h"

#define SRC "tests/golden/tiny-a/f32"
enum { Q_F8B, Q_F8CH, Q_F8T, Q_FP4MO, Q_FP4CT, Q_COUNT };
static const char *qnames[Q_COUNT] = {"fp8-block", "fp8-channel", "fp8-tensor", "nvfp4-modelopt", "nvfp4-ct"};

typedef struct { char name[256]; const char *dtype; int ndim; int64_t shape[4]; void *data; size_t nbytes; } wt;
typedef struct { wt *t; int n, cap; } wlist;

static void add_shape(wlist *l, const char *name, const char *dtype, int ndim, const int64_t *shape, const void *data, size_t nbytes);
static void add(wlist *l, const char *name, const char *dtype, int ndim, int64_t s0, int64_t s1, const void *data, size_t nbytes) {
    int64_t sh[4] = {s0, s1, 0, 0};
    add_shape(l, name, dtype, ndim, sh, data, nbytes);
}
static void add_shape(wlist *l, const char *name, const char *dtype, int ndim, const int64_t *shape, const void *data, size_t nbytes) {
    if (l->n == l->cap) { l->cap = l->cap ? 2 * l->cap : 64; l->t = realloc(l->t, (size_t)l->cap * sizeof *l->t); }
    wt *t = &l->t[l->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype; t->ndim = ndim; memcpy(t->shape, shape, sizeof t->shape);
    t->data = malloc(nbytes ? nbytes : 1); memcpy(t->data, data, nbytes); t->nbytes = nbytes;
}
static void free_list(wlist *l) { for (int i = 0; i < l->n; i++) free(l->t[i].data); free(l->t); }

static int write_st(const char *path, const wlist *l) {
    char *h = malloc(65536);
    size_t off = 0, hl = 0;
    hl += (size_t)sprintf(h + hl, "{");
    for (int i = 0; i < l->n; i++) {
        const wt *t = &l->t[i];
        hl += (size_t)sprintf(h + hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", t->name, t->dtype);
        for (int d = 0; d < t->ndim; d++) hl += (size_t)sprintf(h + hl, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        hl += (size_t)sprintf(h + hl, "],\"data_offsets\":[%zu,%zu]}", off, off + t->nbytes);
        off += (t->nbytes + 63) / 64 * 64;
    }
    hl += (size_t)sprintf(h + hl, "}");
    while ((8 + hl) % 64) h[hl++] = ' ';
    FILE *f = fopen(path, "wb");
    if (!f) { free(h); return -1; }
    uint64_t n = hl;
    fwrite(&n, 8, 1, f);
    fwrite(h, 1, hl, f);
    static const char zero[64];
    for (int i = 0; i < l->n; i++) {
        fwrite(l->t[i].data, 1, l->t[i].nbytes, f);
        fwrite(zero, 1, (l->t[i].nbytes + 63) / 64 * 64 - l->t[i].nbytes, f);
    }
    fclose(f);
    free(h);
    return 0;
}

static uint8_t fp8_nearest(float v) { /* round to the nearest finite e4m3 */
    uint8_t best = 0;
    float bd = INFINITY;
    for (int b = 0; b < 256; b++) {
        if ((b & 0x7f) == 0x7f) continue;
        float d = fabsf(td_fp8_e4m3_to_f32((uint8_t)b) - v);
        if (d < bd) { bd = d; best = (uint8_t)b; }
    }
    return best;
}
static const float e2m1[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.f, -.5f, -1, -1.5f, -2, -3, -4, -6};
static int e2m1_nearest(float v) {
    int best = 0;
    float bd = INFINITY;
    for (int i = 0; i < 16; i++) if (fabsf(e2m1[i] - v) < bd) { bd = fabsf(e2m1[i] - v); best = i; }
    return best;
}

static bool is_linear(const td_st_entry *e) {
    size_t n = strlen(e->name);
    return e->ndim == 2 && strncmp(e->name, "mtp.", 4) && n > 12 && !strcmp(e->name + n - 12, "_proj.weight");
}

/* Quantizes one [R, C] f32 weight into q (the quantized tensors) and d (its
 * dequantized f32 twin). */
static void quantize(int mode, const td_st_entry *e, wlist *q, wlist *d) {
    int64_t R = e->shape[0], C = e->shape[1];
    const float *w = e->data;
    float *deq = malloc(sizeof(float) * (size_t)(R * C));
    char base[256];
    snprintf(base, sizeof base, "%.*s", (int)(strlen(e->name) - 6), e->name);
    char nm[300];
    if (mode <= Q_F8T) {
        int64_t bn = mode == Q_F8B ? 128 : mode == Q_F8CH ? 1 : R, bk = mode == Q_F8B ? 128 : C;
        int64_t sr = (R + bn - 1) / bn, sc = (C + bk - 1) / bk;
        float *s = malloc(sizeof(float) * (size_t)(sr * sc));
        uint8_t *b = malloc((size_t)(R * C));
        for (int64_t i = 0; i < sr; i++)
            for (int64_t j = 0; j < sc; j++) {
                float mx = 0;
                for (int64_t r = i * bn; r < R && r < (i + 1) * bn; r++)
                    for (int64_t c = j * bk; c < C && c < (j + 1) * bk; c++) mx = fmaxf(mx, fabsf(w[r * C + c]));
                s[i * sc + j] = mx > 0 ? mx / 448.0f : 1.0f;
            }
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++) {
                float sv = s[(r / bn) * sc + c / bk];
                b[r * C + c] = fp8_nearest(w[r * C + c] / sv);
                deq[r * C + c] = td_fp8_e4m3_to_f32(b[r * C + c]) * sv;
            }
        add(q, e->name, "F8_E4M3", 2, R, C, b, (size_t)(R * C));
        if (mode == Q_F8B) snprintf(nm, sizeof nm, "%sweight_scale_inv", base), add(q, nm, "F32", 2, sr, sc, s, sizeof(float) * (size_t)(sr * sc));
        else if (mode == Q_F8CH) snprintf(nm, sizeof nm, "%sweight_scale", base), add(q, nm, "F32", 2, R, 1, s, sizeof(float) * (size_t)R);
        else snprintf(nm, sizeof nm, "%sweight_scale", base), add(q, nm, "F32", 0, 0, 0, s, sizeof(float));
        free(s); free(b);
    } else {
        float amax = 0;
        for (int64_t i = 0; i < R * C; i++) amax = fmaxf(amax, fabsf(w[i]));
        /* global: ModelOpt weight_scale_2 = amax / (6 * 448); compressed-tensors stores its inverse */
        float g = amax > 0 ? amax / (6.0f * 448.0f) : 1.0f;
        float gstore = mode == Q_FP4MO ? g : 1.0f / g, gmul = mode == Q_FP4MO ? gstore : 1.0f / gstore;
        uint8_t *p = calloc((size_t)(R * C / 2), 1), *s = malloc((size_t)(R * C / 16));
        for (int64_t r = 0; r < R; r++)
            for (int64_t blk = 0; blk < C / 16; blk++) {
                float mx = 0;
                for (int k = 0; k < 16; k++) mx = fmaxf(mx, fabsf(w[r * C + blk * 16 + k]));
                uint8_t sb = fp8_nearest(mx / 6.0f / gmul);
                if (td_fp8_e4m3_to_f32(sb) == 0) sb = 0x08; /* smallest subnormal... any nonzero */
                s[r * (C / 16) + blk] = sb;
                float sv = td_fp8_e4m3_to_f32(sb);
                for (int k = 0; k < 16; k++) {
                    int64_t i = r * C + blk * 16 + k;
                    int nib = e2m1_nearest(w[i] / (sv * gmul));
                    p[i / 2] |= (uint8_t)(nib << ((i & 1) * 4));
                    deq[i] = (float)((double)e2m1[nib] * sv * gmul);
                }
            }
        snprintf(nm, sizeof nm, mode == Q_FP4MO ? "%sweight" : "%sweight_packed", base);
        add(q, nm, "U8", 2, R, C / 2, p, (size_t)(R * C / 2));
        snprintf(nm, sizeof nm, "%sweight_scale", base);
        add(q, nm, "F8_E4M3", 2, R, C / 16, s, (size_t)(R * C / 16));
        snprintf(nm, sizeof nm, mode == Q_FP4MO ? "%sweight_scale_2" : "%sweight_global_scale", base);
        add(q, nm, "F32", 1, 1, 0, &gstore, sizeof(float));
        free(p); free(s);
    }
    add(d, e->name, "F32", 2, R, C, deq, sizeof(float) * (size_t)(R * C));
    free(deq);
}

static int copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    if (!a || !b) { if (a) fclose(a); if (b) fclose(b); return -1; }
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0) fwrite(buf, 1, n, b);
    fclose(a); fclose(b);
    return 0;
}

static float *prefill_logits(const char *dir, const int32_t *toks, int T, int *V, td_err *err) {
    td_engine_opts o = {.n_threads = 2, .max_context = 256};
    td_engine *eng;
    if (td_engine_load(dir, &o, &eng, err)) return NULL;
    *V = eng->model->cfg.vocab_size;
    float *lg = malloc(sizeof(float) * (size_t)T * (size_t)*V);
    td_session *s;
    td_session_new(eng, &s, err);
    td_fwd_item it = {.seq = &s->seq, .tokens = toks, .n = T, .logits_rows = T, .logits = lg};
    int rc = td_forward(eng->fwd, &it, 1, err);
    td_session_free(s);
    td_engine_free(eng);
    if (rc) { free(lg); return NULL; }
    return lg;
}

int main(void) {
    td_err err = {0};
    td_weights *src;
    const char *p = SRC "/model.safetensors";
    CHECK(td_weights_open_files(&p, 1, &src, &err) == 0, "%s", err.msg);
    if (check_failed) TEST_MAIN_END("quant_load");
    char tmpl[] = "/tmp/tandem-quant-XXXXXX";
    char *root = mkdtemp(tmpl);
    CHECK(root != NULL, "mkdtemp");
    int32_t toks[24];
    for (int i = 0; i < 24; i++) toks[i] = (int32_t)((i * 37 + 11) % 250);
    for (int mode = 0; mode < Q_COUNT; mode++) {
        wlist q = {0}, d = {0};
        int nq = 0;
        for (int i = 0; i < src->n_entries; i++) {
            const td_st_entry *e = &src->entries[i];
            if (is_linear(e) && e->dtype == TD_DTYPE_F32 && e->shape[1] % 16 == 0) { quantize(mode, e, &q, &d); nq++; }
            else { add_shape(&q, e->name, e->dtype_str, e->ndim, e->shape, e->data, e->nbytes); add_shape(&d, e->name, e->dtype_str, e->ndim, e->shape, e->data, e->nbytes); }
        }
        char qd[300], dd[300], f[1024];
        snprintf(qd, sizeof qd, "%s/%s-q", root, qnames[mode]);
        snprintf(dd, sizeof dd, "%s/%s-deq", root, qnames[mode]);
        mkdir(qd, 0755); mkdir(dd, 0755);
        snprintf(f, sizeof f, "%s/model.safetensors", qd); write_st(f, &q);
        snprintf(f, sizeof f, "%s/config.json", qd); copy_file(SRC "/config.json", f);
        snprintf(f, sizeof f, "%s/model.safetensors", dd); write_st(f, &d);
        snprintf(f, sizeof f, "%s/config.json", dd); copy_file(SRC "/config.json", f);
        int V = 0, V2 = 0;
        float *lq = prefill_logits(qd, toks, 24, &V, &err);
        CHECK(lq != NULL, "%s: quantized model: %s", qnames[mode], err.msg);
        float *ld = prefill_logits(dd, toks, 24, &V2, &err);
        CHECK(ld != NULL, "%s: dequantized model: %s", qnames[mode], err.msg);
        if (lq && ld) {
            double mx = 0, md = 0;
            for (int64_t i = 0; i < 24LL * V; i++) { mx = fmax(mx, fabs(ld[i])); md = fmax(md, fabs((double)lq[i] - ld[i])); }
            bool exact = mode == Q_F8B || mode == Q_F8CH;
            if (exact) CHECK(memcmp(lq, ld, sizeof(float) * 24 * (size_t)V) == 0, "%s: logits differ from the dequantized model (max %.3g)", qnames[mode], md);
            else CHECK(md <= 1e-5 * mx, "%s: logits off the dequantized model by %.3g (max |logit| %.3g)", qnames[mode], md, mx);
            printf("quant_load: %s: %d linear weights quantized; max |logit diff| %.3g of max |logit| %.3g\n", qnames[mode], nq, md, mx);
        }
        free(lq); free(ld);
        free_list(&q); free_list(&d);
        CHECK(nq > 0, "%s: nothing quantized", qnames[mode]);
        snprintf(f, sizeof f, "rm -rf '%s' '%s'", qd, dd);
        if (system(f)) {}
    }
    /* refused: nvfp4 without its global scale */
    rmdir(root);
    td_weights_free(src);
    TEST_MAIN_END("quant_load");
}
