/* Issue 5 item 4: on the CPU backend the planner's total (tandem plan
 * --device cpu, the numbers cli/memory.c sizes `tandem serve` with) matches
 * what the engine actually holds (td_engine_memory) within 5%, on the golden
 * models and on a random-weight model of >= 1 GB at the proportions of the
 * Qwen3.6-27B config (scaled down; written under /tmp and removed after). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "engine/engine.h"
#include "model/config.h"
#include "model/forward.h"
#include "plan/plan.h"
#include "spec/gen.h"

static double mib(uint64_t b) { return (double)b / 1048576.0; }

/* Plans, loads, opens max_seqs sessions, runs one generation step on each
 * (generation buffers), then the largest batch the plan assumes (scratch),
 * and compares. */
static void check_model(const char *dir, int S, int depth, int T, int64_t window, int kv_dtype, bool caching) {
    td_err err = {0};
    td_config cfg;
    td_plan_weights w;
    if (td_config_load(dir, &cfg, &err) || td_plan_weights_from_dir(dir, &w, &err)) {
        CHECK(0, "%s: %s", dir, err.msg);
        return;
    }
    td_plan_opts po;
    td_plan_opts_default(&po);
    po.backend = TD_PLAN_CPU;
    po.kv_dtype = (td_kv_dtype)kv_dtype;
    po.device_bytes = 64ull << 30;
    po.gpu_util = 1.0;
    po.cuda_graphs = false;
    po.runtime_bytes = 0;
    po.spec_depth = depth;
    po.max_num_seqs = S;
    po.max_num_batched_tokens = T;
    po.weights_given = true;
    po.weights = w;
    po.has_mtp = w.mtp > 0 && cfg.mtp_layers > 0;
    po.kv_pool_windows = 2;
    po.prefix_checkpoints = 0; /* caching on: checked as an upper bound below */
    po.max_model_len = window;
    td_plan p;
    int rc = td_plan_compute(&cfg, &po, &p, &err);
    CHECK(rc == 0 && p.fits, "%s: plan %d fits %d: %s %s", dir, rc, p.fits, err.msg, p.message);
    if (rc || !p.fits) return;
    /* a device's runtime reserve (serve --device cuda: what the context holds) comes off the pool, byte for byte */
    td_plan_opts pr = po;
    pr.runtime_bytes = 100ull << 20;
    td_plan q;
    CHECK(td_plan_compute(&cfg, &pr, &q, &err) == 0 && q.available_kv_bytes == p.available_kv_bytes - (int64_t)pr.runtime_bytes &&
              q.needed_bytes == p.needed_bytes + pr.runtime_bytes && q.runtime_bytes == p.runtime_bytes + pr.runtime_bytes,
          "%s: a 100 MiB runtime reserve: available %lld -> %lld", dir, (long long)p.available_kv_bytes, (long long)q.available_kv_bytes);
    /* CUDA graphs (serve --device cuda without --enforce-eager): the graph cache's bytes come off the pool */
    td_plan_opts pg = po;
    pg.cuda_graphs = true;
    CHECK(td_plan_compute(&cfg, &pg, &q, &err) == 0 && q.graph_bytes > 0 && q.n_graphs == TD_GRAPH_CACHE_MAX &&
              q.available_kv_bytes == p.available_kv_bytes - (int64_t)q.graph_bytes && q.needed_bytes == p.needed_bytes + q.graph_bytes &&
              p.graph_bytes == 0,
          "%s: CUDA graphs %llu bytes: available %lld -> %lld", dir, (unsigned long long)q.graph_bytes, (long long)p.available_kv_bytes,
          (long long)q.available_kv_bytes);
    /* the CUDA fast mode's GEMM buffers (serve --device cuda without --batch-invariant): runtime, off the pool */
    td_plan_opts pq = po;
    pq.cuda_gemm = true;
    CHECK(td_plan_compute(&cfg, &pq, &q, &err) == 0 && q.available_kv_bytes == p.available_kv_bytes - (int64_t)TD_CUDA_GEMM_BYTES &&
              q.runtime_bytes == p.runtime_bytes + TD_CUDA_GEMM_BYTES && q.needed_bytes == p.needed_bytes + TD_CUDA_GEMM_BYTES,
          "%s: the fast GEMM's %llu MiB: available %lld -> %lld", dir, TD_CUDA_GEMM_BYTES >> 20, (long long)p.available_kv_bytes,
          (long long)q.available_kv_bytes);
    td_engine_opts eo = {.n_threads = 0, .max_context = (int)window, .spec_depth = depth, .max_seqs = S,
                         .kv_cache_bytes = (size_t)p.kv_blocks * p.kv_bytes_per_block, .kv_cache_dtype = kv_dtype,
                         .no_prefix_caching = true, .max_prefill_chunk = T};
    td_engine *e = NULL;
    if (td_engine_load(dir, &eo, &e, &err)) { CHECK(0, "%s: load: %s", dir, err.msg); return; }
    td_session *ss[16] = {0};
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(T + S * (depth + 1)));
    for (int i = 0; i < T + S * (depth + 1); i++) toks[i] = (int32_t)((i * 7 + 3) % cfg.vocab_size);
    td_sampling sp;
    td_sampling_default(&sp);
    td_gen_opts go = {.max_tokens = depth + 2, .spec_depth = depth, .ignore_eos = true};
    for (int i = 0; i < S && !rc; i++) {
        if ((rc = td_session_new(e, &ss[i], &err))) break;
        td_gen_result r;
        if ((rc = td_session_generate(ss[i], toks + i, 4, &sp, &go, NULL, NULL, &r, &err))) break;
        td_session_reset(ss[i]);
    }
    /* the largest batch: every sequence verifying depth+1 rows with logits... */
    td_fwd_item items[16];
    float *lg = malloc(sizeof(float) * (size_t)(depth + 1) * (size_t)cfg.vocab_size * (size_t)S);
    for (int i = 0; i < S && !rc; i++)
        items[i] = (td_fwd_item){.seq = &ss[i]->seq, .tokens = toks + i, .n = depth + 1, .logits_rows = depth + 1,
                                 .logits = lg + (size_t)i * (depth + 1) * cfg.vocab_size};
    if (!rc) rc = td_forward(e->fwd, items, S, &err);
    /* ...and a prefill of max_num_batched_tokens next to them (rows) */
    if (!rc) {
        td_session_reset(ss[0]);
        rc = td_session_feed(ss[0], toks, T + S * (depth + 1), NULL, &err);
    }
    CHECK(rc == 0, "%s: run: %s", dir, err.msg);
    td_memory_info mi;
    td_engine_memory(e, &mi);
    uint64_t plan_w = p.weights_bytes + p.runtime_bytes, got_w = mi.weights_mapped + mi.weights_copied + mi.weights_owned;
    double rel = fabs((double)mi.total - (double)p.total_bytes) / (double)p.total_bytes;
    printf("%-28s S=%d d=%d T=%d window=%lld kv=%s: plan %10.2f MiB, measured %10.2f MiB (%+.2f%%)\n", dir, S, depth, T, (long long)window,
           kv_dtype == 0 ? "f32" : kv_dtype == 1 ? "bf16" : "fp8", mib(p.total_bytes), mib(mi.total),
           100.0 * ((double)mi.total / (double)p.total_bytes - 1.0));
    printf("    weights %.2f / %.2f, KV pool %.2f / %.2f, state %.3f / %.3f, scratch %.3f / %.3f, sessions %.3f / %.3f MiB\n", mib(plan_w),
           mib(got_w), mib(p.kv_pool_bytes), mib(mi.kv_pool), mib(p.linear_state_bytes), mib(mi.deltanet_state), mib(p.scratch_bytes),
           mib(mi.scratch), mib(p.session_bytes), mib(mi.sessions));
    CHECK(rel <= 0.05, "%s: plan %llu vs measured %llu bytes (%.2f%%)", dir, (unsigned long long)p.total_bytes, (unsigned long long)mi.total,
          100 * rel);
    /* the parts the engine sizes with the planner's functions agree exactly */
    CHECK(mi.kv_pool == p.kv_pool_bytes, "%s: KV pool %zu vs plan %llu", dir, mi.kv_pool, (unsigned long long)p.kv_pool_bytes);
    CHECK(mi.deltanet_state == p.linear_state_bytes, "%s: state %zu vs plan %llu", dir, mi.deltanet_state,
          (unsigned long long)p.linear_state_bytes);
    CHECK(mi.scratch == p.scratch_bytes, "%s: scratch %zu vs plan %llu", dir, mi.scratch, (unsigned long long)p.scratch_bytes);
    CHECK(mi.n_sessions == S, "%s: %d sessions", dir, mi.n_sessions);
    for (int i = 0; i < S; i++) td_session_free(ss[i]);
    td_engine_memory(e, &mi);
    CHECK(mi.n_sessions == 0 && mi.deltanet_state == 0, "%s: %d sessions after freeing", dir, mi.n_sessions);
    td_engine_free(e);
    /* prefix caching: checkpoints stay within the plan's bound */
    if (caching) {
        po.prefix_checkpoints = 8 * S;
        rc = td_plan_compute(&cfg, &po, &p, &err);
        eo.no_prefix_caching = false;
        eo.kv_cache_bytes = (size_t)p.kv_blocks * p.kv_bytes_per_block;
        if (!rc && !td_engine_load(dir, &eo, &e, &err)) {
            td_session *s = NULL;
            td_gen_result r;
            for (int k = 0; k < 3 && !rc; k++) {
                if (!(rc = td_session_new(e, &s, &err))) rc = td_session_generate(s, toks + k, 40, &sp, &go, NULL, NULL, &r, &err);
                td_session_free(s);
            }
            td_engine_memory(e, &mi);
            CHECK(rc == 0 && mi.prefix_checkpoints > 0 && mi.prefix_checkpoints <= p.prefix_ckpt_bytes, "%s: checkpoints %zu of %llu: %s", dir,
                  mi.prefix_checkpoints, (unsigned long long)p.prefix_ckpt_bytes, err.msg);
            td_engine_free(e);
        }
    }
    free(lg);
    free(toks);
}

/* ---- random-weight model at the 27B's proportions --------------------- */

typedef struct { char name[128]; int nd; int64_t shape[3]; } tdesc;

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_u64(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}

static int add(tdesc *t, int n, const char *name, int nd, int64_t a, int64_t b, int64_t c) {
    snprintf(t[n].name, sizeof t[n].name, "%s", name);
    t[n].nd = nd; t[n].shape[0] = a; t[n].shape[1] = b; t[n].shape[2] = c;
    return n + 1;
}

/* Qwen3.6-27B: hidden 5120, intermediate 17408 (3.4 H), 24 x 256 q heads,
 * 4 kv heads, DeltaNet 16 k / 48 v heads of 128, every 4th layer full
 * attention, one MTP layer. Scaled: hidden 2048, intermediate 6912, 12 x 256
 * q heads, 2 kv heads, DeltaNet 6 k / 18 v heads of 128, 8 layers (2 full),
 * vocab 32,000: 1.38 GB of bf16. */
static uint64_t write_big_model(const char *dir) {
    const int H = 2048, I = 6912, NH = 12, NKV = 2, HD = 256, NK = 6, NV = 18, DK = 128, DV = 128, K = 4, L = 8, V = 32000;
    mkdir(dir, 0755);
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return 0;
    fprintf(f, "{\"architectures\": [\"Qwen3_5ForConditionalGeneration\"], \"model_type\": \"qwen3_5\", \"tie_word_embeddings\": false,\n"
               " \"text_config\": {\"attn_output_gate\": true, \"dtype\": \"bfloat16\", \"eos_token_id\": 1, \"full_attention_interval\": 4,\n"
               "  \"head_dim\": %d, \"hidden_act\": \"silu\", \"hidden_size\": %d, \"intermediate_size\": %d, \"layer_types\": [",
            HD, H, I);
    for (int l = 0; l < L; l++) fprintf(f, "%s\"%s\"", l ? ", " : "", (l % 4 == 3) ? "full_attention" : "linear_attention");
    fprintf(f, "],\n  \"linear_conv_kernel_dim\": %d, \"linear_key_head_dim\": %d, \"linear_num_key_heads\": %d, \"linear_num_value_heads\": %d,\n"
               "  \"linear_value_head_dim\": %d, \"mamba_ssm_dtype\": \"float32\", \"max_position_embeddings\": 8192, \"model_type\": \"qwen3_5_text\",\n"
               "  \"mtp_num_hidden_layers\": 1, \"mtp_use_dedicated_embeddings\": false, \"num_attention_heads\": %d, \"num_hidden_layers\": %d,\n"
               "  \"num_key_value_heads\": %d, \"partial_rotary_factor\": 0.25, \"rms_norm_eps\": 1e-06,\n"
               "  \"rope_parameters\": {\"mrope_interleaved\": true, \"mrope_section\": [11, 11, 10], \"partial_rotary_factor\": 0.25,\n"
               "   \"rope_theta\": 10000000, \"rope_type\": \"default\"}, \"tie_word_embeddings\": false, \"vocab_size\": %d}}\n",
            K, DK, NK, NV, DV, NH, L, NKV, V);
    fclose(f);
    static tdesc t[256];
    int n = 0;
    char nm[128];
    const int conv = 2 * NK * DK + NV * DV, vd = NV * DV;
    n = add(t, n, "lm_head.weight", 2, V, H, 0);
    n = add(t, n, "model.language_model.embed_tokens.weight", 2, V, H, 0);
    n = add(t, n, "model.language_model.norm.weight", 1, H, 0, 0);
    for (int l = 0; l <= L; l++) { /* l == L: the MTP layer */
        char base[64];
        bool full = l == L || l % 4 == 3;
        if (l < L) snprintf(base, sizeof base, "model.language_model.layers.%d.", l);
        else snprintf(base, sizeof base, "mtp.layers.0.");
#define T2(s, a, b) (snprintf(nm, sizeof nm, "%s%s", base, s), n = add(t, n, nm, 2, a, b, 0))
#define T1(s, a) (snprintf(nm, sizeof nm, "%s%s", base, s), n = add(t, n, nm, 1, a, 0, 0))
        T1("input_layernorm.weight", H);
        T1("post_attention_layernorm.weight", H);
        T2("mlp.gate_proj.weight", I, H);
        T2("mlp.up_proj.weight", I, H);
        T2("mlp.down_proj.weight", H, I);
        if (full) {
            T2("self_attn.q_proj.weight", 2 * NH * HD, H);
            T2("self_attn.k_proj.weight", NKV * HD, H);
            T2("self_attn.v_proj.weight", NKV * HD, H);
            T2("self_attn.o_proj.weight", H, NH * HD);
            T1("self_attn.q_norm.weight", HD);
            T1("self_attn.k_norm.weight", HD);
        } else {
            T2("linear_attn.in_proj_qkv.weight", conv, H);
            T2("linear_attn.in_proj_z.weight", vd, H);
            T2("linear_attn.in_proj_a.weight", NV, H);
            T2("linear_attn.in_proj_b.weight", NV, H);
            T2("linear_attn.out_proj.weight", H, vd);
            snprintf(nm, sizeof nm, "%slinear_attn.conv1d.weight", base);
            n = add(t, n, nm, 3, conv, 1, K);
            T1("linear_attn.A_log", NV);
            T1("linear_attn.dt_bias", NV);
            T1("linear_attn.norm.weight", DV);
        }
#undef T1
#undef T2
    }
    n = add(t, n, "mtp.fc.weight", 2, H, 2 * H, 0);
    n = add(t, n, "mtp.norm.weight", 1, H, 0, 0);
    n = add(t, n, "mtp.pre_fc_norm_embedding.weight", 1, H, 0, 0);
    n = add(t, n, "mtp.pre_fc_norm_hidden.weight", 1, H, 0, 0);
    /* header */
    size_t cap = 64 * 1024, len = 0;
    char *hdr = malloc(cap);
    uint64_t off = 0;
    len += (size_t)snprintf(hdr + len, cap - len, "{");
    for (int i = 0; i < n; i++) {
        uint64_t numel = 1;
        for (int k = 0; k < t[i].nd; k++) numel *= (uint64_t)t[i].shape[k];
        char shp[64] = "";
        for (int k = 0; k < t[i].nd; k++) snprintf(shp + strlen(shp), sizeof shp - strlen(shp), "%s%lld", k ? "," : "", (long long)t[i].shape[k]);
        len += (size_t)snprintf(hdr + len, cap - len, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%s],\"data_offsets\":[%llu,%llu]}", i ? "," : "",
                                t[i].name, shp, (unsigned long long)off, (unsigned long long)(off + 2 * numel));
        off += 2 * numel;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8) hdr[len++] = ' ';
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    f = fopen(path, "wb");
    if (!f) { free(hdr); return 0; }
    uint64_t hl = len;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, len, f);
    free(hdr);
    /* random bf16 in +-0.03 (norm weights too: they are zero-centred) */
    enum { CHUNK = 1 << 22 };
    uint16_t *buf = malloc(CHUNK * sizeof(uint16_t));
    for (uint64_t left = off / 2; left > 0;) {
        size_t m = left < CHUNK ? (size_t)left : CHUNK;
        for (size_t i = 0; i < m; i += 4) {
            uint64_t r = next_u64();
            for (int k = 0; k < 4 && i + (size_t)k < m; k++) {
                float x = ((float)((r >> (16 * k)) & 0xffff) / 65535.0f - 0.5f) * 0.06f;
                uint32_t u;
                memcpy(&u, &x, 4);
                buf[i + (size_t)k] = (uint16_t)(u >> 16);
            }
        }
        fwrite(buf, sizeof(uint16_t), m, f);
        left -= m;
    }
    free(buf);
    bool ok = fclose(f) == 0;
    return ok ? off + 8 + hl : 0;
}

int main(void) {
    const char *models[] = {"tiny-a", "tiny-b", "tiny-c"};
    for (int m = 0; m < 3; m++)
        for (int dt = 0; dt < 2; dt++) {
            char dir[128];
            snprintf(dir, sizeof dir, "tests/golden/%s/%s", models[m], dt ? "bf16" : "f32");
            check_model(dir, 4, 2, 512, 1024, 0, m == 1);
            if (m == 1) check_model(dir, 2, 4, 128, 2048, dt ? 1 : 2, false); /* bf16 / fp8 KV */
        }
    char dir[] = "/tmp/tandem-plan-cpu-XXXXXX";
    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); TEST_MAIN_END("plan_cpu"); }
    clock_t t0 = clock();
    uint64_t bytes = write_big_model(dir);
    printf("random-weight model: %.2f GB written in %.1f s CPU\n", (double)bytes / 1e9, (double)(clock() - t0) / CLOCKS_PER_SEC);
    CHECK(bytes >= 1000000000ull, "random model of %llu bytes", (unsigned long long)bytes);
    if (bytes) check_model(dir, 2, 2, 64, 4096, 0, false);
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
    TEST_MAIN_END("plan_cpu");
}
