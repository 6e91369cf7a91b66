/* A generated model (td_engine_load_random) is the model its weights make
 * when written as a Hugging Face directory (config.json + model.safetensors,
 * the names and layouts td_model_load reads) and loaded the ordinary way:
 * same logits bit for bit, same greedy tokens with MTP drafting, same
 * acceptance. So the generated td_model has the loader's structure (norms
 * stored as 1 + w, neg_A = -exp(A_log), conv [conv_dim, 1, K], the MTP head)
 * and the forward uses its backend pointers as it uses loaded ones.
 * Small config: the 27B config scaled to hidden 256, 4 layers, vocab 4096, BF16. */
#include <errno.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "engine/engine.h"
#include "util/err.h"

#define CONFIG "tests/data/configs/qwen3.6-27b.config.json"

typedef struct {
    char name[128];
    int ndim;
    int64_t shape[3];
    td_dtype dtype;
    unsigned char *data; /* host copy */
    size_t bytes;
} entry;

typedef struct { entry e[256]; int n; td_backend *b; } st;

static entry *add(st *s, const char *name, int ndim, const int64_t *shape) {
    TD_ASSERT(s->n < 256);
    entry *e = &s->e[s->n++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->ndim = ndim;
    memcpy(e->shape, shape, sizeof(int64_t) * (size_t)ndim);
    return e;
}
static void tensor(st *s, const char *name, const td_tensor *t) {
    entry *e = add(s, name, 2, t->shape);
    CHECK(t->dtype == TD_DTYPE_BF16, "%s: dtype %s", name, td_dtype_name(t->dtype));
    e->dtype = t->dtype;
    e->bytes = td_tensor_data_bytes(t);
    e->data = malloc(e->bytes);
    td_bk_download(s->b, e->data, t->data, e->bytes);
}
/* f32 vector written as w = v - sub (the loader adds 1 back to zero-centred norms); A_log from neg_A */
static void vec(st *s, const char *name, const float *v, int64_t n, float sub, bool a_log, int ndim, const int64_t *shape) {
    int64_t s1[1] = {n};
    entry *e = add(s, name, ndim, ndim == 1 ? s1 : shape);
    e->dtype = TD_DTYPE_F32;
    e->bytes = (size_t)n * 4;
    float *h = malloc(e->bytes);
    td_bk_download(s->b, h, v, e->bytes);
    for (int64_t i = 0; i < n; i++) h[i] = a_log ? logf(-h[i]) : h[i] - sub;
    e->data = (unsigned char *)h;
}

static void layer(st *s, const td_config *c, const char *base, const td_layer_weights *l) {
    char n[256];
#define N(x) (snprintf(n, sizeof n, "%s%s", base, x), n)
    vec(s, N("input_layernorm.weight"), l->input_norm1, c->hidden_size, 1, false, 1, NULL);
    vec(s, N("post_attention_layernorm.weight"), l->post_norm1, c->hidden_size, 1, false, 1, NULL);
    if (l->full_attn) {
        tensor(s, N("self_attn.q_proj.weight"), &l->attn.q_proj);
        tensor(s, N("self_attn.k_proj.weight"), &l->attn.k_proj);
        tensor(s, N("self_attn.v_proj.weight"), &l->attn.v_proj);
        tensor(s, N("self_attn.o_proj.weight"), &l->attn.o_proj);
        vec(s, N("self_attn.q_norm.weight"), l->attn.q_norm1, c->head_dim, 1, false, 1, NULL);
        vec(s, N("self_attn.k_norm.weight"), l->attn.k_norm1, c->head_dim, 1, false, 1, NULL);
    } else {
        int64_t conv = td_cfg_lin_conv_dim(c), cs[3] = {conv, 1, c->conv_kernel};
        tensor(s, N("linear_attn.in_proj_qkv.weight"), &l->lin.in_proj_qkv);
        tensor(s, N("linear_attn.in_proj_z.weight"), &l->lin.in_proj_z);
        tensor(s, N("linear_attn.in_proj_b.weight"), &l->lin.in_proj_b);
        tensor(s, N("linear_attn.in_proj_a.weight"), &l->lin.in_proj_a);
        tensor(s, N("linear_attn.out_proj.weight"), &l->lin.out_proj);
        vec(s, N("linear_attn.conv1d.weight"), l->lin.conv, conv * c->conv_kernel, 0, false, 3, cs);
        vec(s, N("linear_attn.dt_bias"), l->lin.dt_bias, c->lin_nv, 0, false, 1, NULL);
        vec(s, N("linear_attn.A_log"), l->lin.neg_A, c->lin_nv, 0, true, 1, NULL);
        vec(s, N("linear_attn.norm.weight"), l->lin.norm, c->lin_dv, 0, false, 1, NULL);
    }
    tensor(s, N("mlp.gate_proj.weight"), &l->gate_proj);
    tensor(s, N("mlp.up_proj.weight"), &l->up_proj);
    tensor(s, N("mlp.down_proj.weight"), &l->down_proj);
#undef N
}

static int write_dir(const char *dir, const td_model *m, td_backend *b) {
    static st s;
    memset(&s, 0, sizeof s);
    s.b = b;
    const td_config *c = &m->cfg;
    const char *P = "model.language_model.";
    char n[256];
    tensor(&s, (snprintf(n, sizeof n, "%sembed_tokens.weight", P), n), &m->embed);
    tensor(&s, "lm_head.weight", &m->lm_head);
    vec(&s, (snprintf(n, sizeof n, "%snorm.weight", P), n), m->final_norm1, c->hidden_size, 1, false, 1, NULL);
    for (int i = 0; i < c->n_layers; i++) {
        snprintf(n, sizeof n, "%slayers.%d.", P, i);
        layer(&s, c, n, &m->layers[i]);
    }
    tensor(&s, "mtp.fc.weight", &m->mtp.fc);
    vec(&s, "mtp.pre_fc_norm_embedding.weight", m->mtp.pre_fc_norm_embedding1, c->hidden_size, 1, false, 1, NULL);
    vec(&s, "mtp.pre_fc_norm_hidden.weight", m->mtp.pre_fc_norm_hidden1, c->hidden_size, 1, false, 1, NULL);
    vec(&s, "mtp.norm.weight", m->mtp.norm1, c->hidden_size, 1, false, 1, NULL);
    layer(&s, c, "mtp.layers.0.", &m->mtp.layer);
    /* header: every tensor at an offset aligned to 8 */
    size_t cap = 1 << 16, len = 0, off = 0;
    char *hj = malloc(cap);
    len += (size_t)snprintf(hj + len, cap - len, "{");
    for (int i = 0; i < s.n; i++) {
        entry *e = &s.e[i];
        len += (size_t)snprintf(hj + len, cap - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", e->name,
                                e->dtype == TD_DTYPE_F32 ? "F32" : "BF16");
        for (int d = 0; d < e->ndim; d++) len += (size_t)snprintf(hj + len, cap - len, "%s%lld", d ? "," : "", (long long)e->shape[d]);
        size_t pad = (off + e->bytes + 7) / 8 * 8;
        len += (size_t)snprintf(hj + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", off, off + e->bytes);
        off = pad;
    }
    len += (size_t)snprintf(hj + len, cap - len, "}");
    while ((8 + len) % 64) hj[len++] = ' ';
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    uint64_t hl = len;
    fwrite(&hl, 8, 1, f);
    fwrite(hj, 1, len, f);
    static const unsigned char zeros[8];
    for (int i = 0; i < s.n; i++) {
        fwrite(s.e[i].data, 1, s.e[i].bytes, f);
        fwrite(zeros, 1, (8 - s.e[i].bytes % 8) % 8, f);
        free(s.e[i].data);
    }
    fclose(f);
    free(hj);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!(f = fopen(path, "w"))) return -1;
    fprintf(f, "{\"model_type\":\"qwen3_5_text\",\"hidden_size\":%d,\"num_hidden_layers\":%d,\"vocab_size\":%d,\"intermediate_size\":%d,"
               "\"num_attention_heads\":%d,\"num_key_value_heads\":%d,\"head_dim\":%d,\"attn_output_gate\":%s,"
               "\"partial_rotary_factor\":%.17g,\"rope_theta\":%.17g,\"rms_norm_eps\":%.17g,\"linear_num_key_heads\":%d,"
               "\"linear_num_value_heads\":%d,\"linear_key_head_dim\":%d,\"linear_value_head_dim\":%d,\"linear_conv_kernel_dim\":%d,"
               "\"tie_word_embeddings\":false,\"mtp_num_hidden_layers\":1,\"max_position_embeddings\":%d,\"layer_types\":[",
            c->hidden_size, c->n_layers, c->vocab_size, c->intermediate_size, c->n_heads, c->n_kv_heads, c->head_dim,
            c->attn_output_gate ? "true" : "false", (double)c->rot_dim / c->head_dim, c->rope_theta, c->rms_norm_eps, c->lin_nk, c->lin_nv,
            c->lin_dk, c->lin_dv, c->conv_kernel, c->max_position_embeddings);
    for (int i = 0; i < c->n_layers; i++) fprintf(f, "%s\"%s\"", i ? "," : "", c->full_attn[i] ? "full_attention" : "linear_attention");
    fprintf(f, "]}\n");
    fclose(f);
    return 0;
}

static const int32_t prompt[] = {1, 17, 230, 9, 4021, 77, 13, 600, 5, 88, 1200, 41, 7, 3000, 2, 19};
#define NP ((int)(sizeof prompt / sizeof *prompt))
#define NGEN 40
typedef struct { int32_t t[NGEN + 8]; int n; } toks;
static int keep(void *u, int32_t t) {
    toks *k = u;
    if (k->n < NGEN + 8) k->t[k->n++] = t;
    return 0;
}

/* prompt logits [V] into lg, greedy tokens at depth 2 into out; returns the counters */
static td_spec_counters run(td_engine *e, float *lg, toks *out) {
    td_err err = {0};
    td_session *s;
    td_gen_result res = {0};
    out->n = 0;
    if (td_session_new(e, &s, &err)) { CHECK(0, "%s", err.msg); return res.spec; }
    const float *l;
    CHECK(td_session_feed(s, prompt, NP, &l, &err) == 0, "%s", err.msg);
    memcpy(lg, l, sizeof(float) * (size_t)td_engine_cfg(e)->vocab_size);
    td_session_reset(s);
    td_sampling sp;
    td_sampling_default(&sp);
    sp.temperature = 0;
    td_gen_opts go = {.max_tokens = NGEN, .spec_depth = 2, .ignore_eos = true};
    CHECK(td_session_generate(s, prompt, NP, &sp, &go, keep, out, &res, &err) == 0, "%s", err.msg);
    td_session_free(s);
    return res.spec;
}

int main(void) {
    td_err err = {0};
    td_engine_opts o = {.n_threads = 2, .spec_depth = 2, .max_context = 256, .backend = "cpu", .max_seqs = 1};
    td_random_spec rs = {.dtype = TD_DTYPE_BF16, .seed = 3, .mtp_mix = 5.0f, .hidden = 256, .layers = 4, .vocab = 4096};
    td_engine *r = NULL, *l = NULL;
    CHECK(td_engine_load_random(CONFIG, &rs, &o, &r, &err) == 0, "%s", err.msg);
    if (!r) TEST_MAIN_END("test_random_st");
    char dir[] = "/tmp/td_random_st_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
    CHECK(write_dir(dir, td_engine_model(r), td_engine_backend(r)) == 0, "writing %s", dir);
    CHECK(td_engine_load(dir, &o, &l, &err) == 0, "loading the written model: %s", err.msg);
    if (l) {
        int V = td_engine_cfg(r)->vocab_size;
        float *a = malloc(sizeof(float) * (size_t)V), *b = malloc(sizeof(float) * (size_t)V);
        toks ta, tb;
        td_spec_counters ca = run(r, a, &ta), cb = run(l, b, &tb);
        CHECK(memcmp(a, b, sizeof(float) * (size_t)V) == 0, "prompt logits differ between the generated and the loaded model");
        CHECK(ta.n == NGEN && tb.n == ta.n && memcmp(ta.t, tb.t, sizeof(int32_t) * (size_t)ta.n) == 0, "greedy tokens differ");
        CHECK(ca.draft_tokens == cb.draft_tokens && ca.accepted_tokens == cb.accepted_tokens && ca.accepted_tokens < ca.draft_tokens,
              "acceptance: generated %llu/%llu, loaded %llu/%llu", (unsigned long long)ca.accepted_tokens, (unsigned long long)ca.draft_tokens,
              (unsigned long long)cb.accepted_tokens, (unsigned long long)cb.draft_tokens);
        free(a);
        free(b);
    }
    td_engine_free(l);
    td_engine_free(r);
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors", dir); unlink(p);
    snprintf(p, sizeof p, "%s/config.json", dir); unlink(p);
    rmdir(dir);
    TEST_MAIN_END("test_random_st");
}
