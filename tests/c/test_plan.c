/* Memory planner (issue 5): the formulas on the 27B config, the reference
 * measurement's verdicts (notes §1), the refusal message, the weight estimate
 * against a real checkpoint, parsing, and `tandem plan --json` end to end. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "plan/plan.h"

static char g_cfg27[4096];
static const double GiB = TD_PLAN_GIB;

static td_config *load_cfg(const char *path) {
    td_err err = {0};
    td_config *c = calloc(1, sizeof *c);
    int rc = c ? td_config_load(path, c, &err) : TD_ERR_NOMEM;
    CHECK(rc == 0, "%s: %s", path, err.msg);
    if (rc) { free(c); return NULL; }
    return c;
}

static void formulas_27b(const td_config *c) {
    /* KV per token: (16 full-attention + 1 MTP) x 2 x 4 heads x 256 x bytes. */
    CHECK(td_plan_kv_bytes_per_token(c, 4, TD_KV_FP8) == 34816, "fp8 %llu", (unsigned long long)td_plan_kv_bytes_per_token(c, 4, TD_KV_FP8));
    CHECK(td_plan_kv_bytes_per_token(c, 1, TD_KV_BF16) == 69632, "bf16 %llu", (unsigned long long)td_plan_kv_bytes_per_token(c, 1, TD_KV_BF16));
    CHECK(td_plan_kv_bytes_per_token(c, 0, TD_KV_FP8) == 32768, "depth 0 has no MTP KV");
    /* DeltaNet state: 48 x (3 x 10240 x 2 + 48 x 128 x 128 x 4). */
    uint64_t st = td_plan_linear_state_slot_bytes(c);
    CHECK(st == 153944064ull, "state %llu", (unsigned long long)st);
    CHECK(fabs((double)st / 1048576.0 - 147.0) < 0.5, "~147 MiB: %.2f", (double)st / 1048576.0);

    /* Weights: NVFP4 at 4.5 bits for quantized linears, BF16 for the rest (§7). */
    td_plan_weights n, f, b;
    td_plan_weights_estimate(c, TD_QUANT_NVFP4, &n);
    td_plan_weights_estimate(c, TD_QUANT_FP8, &f);
    td_plan_weights_estimate(c, TD_QUANT_BF16, &b);
    CHECK(n.embed == 2ull * 248320 * 5120 && n.lm_head == n.embed, "embed %llu", (unsigned long long)n.embed);
    CHECK(n.mtp == b.mtp && n.mtp == 849398784ull, "MTP head BF16 in every format: %llu", (unsigned long long)n.mtp);
    /* bf16 main = 2 bytes x the decoder parameters (24.35e9). */
    CHECK(fabs((double)b.main / 2 - 24.3525e9) < 0.01e9, "bf16 params %.4e", (double)b.main / 2);
    /* 4.5/16 of bf16 for the quantized bulk, a little more for the BF16 bits. */
    double rn = (double)n.main / (double)b.main, rf = (double)f.main / (double)b.main;
    CHECK(rn > 0.28125 && rn < 0.2830, "nvfp4/bf16 %.4f", rn);
    CHECK(rf > 0.5 && rf < 0.502, "fp8/bf16 %.4f", rf);
    double tot = (double)(n.main + n.mtp + n.embed + n.lm_head) / GiB;
    printf("test_plan: 27B estimate, nvfp4 per §7: main %.2f + MTP %.2f + embeddings %.2f + lm_head %.2f = %.2f GiB (measured in §1: 22.15)\n",
           n.main / GiB, n.mtp / GiB, n.embed / GiB, n.lm_head / GiB, tot);
    CHECK(tot > 18.0 && tot < 18.6, "estimate %.2f", tot);

    /* Default options: graphs on, 51 captured sizes at depth 0, 49 at depth 4
     * (multiples of 5), none when eager. */
    td_plan_opts o;
    td_plan_opts_default(&o);
    o.kv_dtype = TD_KV_FP8;
    td_plan p;
    td_err err = {0};
    CHECK(td_plan_compute(c, &o, &p, &err) == 0, "%s", err.msg);
    CHECK(p.n_graphs == 51, "sizes d0 %d", p.n_graphs);
    CHECK(p.auto_len && p.fits && p.max_model_len == p.max_len_at_depth, "auto window %lld", (long long)p.max_model_len);
    o.spec_depth = 4;
    CHECK(td_plan_compute(c, &o, &p, &err) == 0, "%s", err.msg);
    CHECK(p.n_graphs == 49, "sizes d4 %d", p.n_graphs);
    CHECK(p.graph_bytes == 49ull * 65 * 256 * 1024, "graphs %llu", (unsigned long long)p.graph_bytes);
    for (int d = 1; d < TD_PLAN_DEPTHS; d++)
        CHECK(p.max_len_by_depth[d] <= p.max_len_by_depth[d - 1] && p.max_len_by_depth[d] % 16 == 0, "depth %d: %lld", d,
              (long long)p.max_len_by_depth[d]);
    o.cuda_graphs = false;
    CHECK(td_plan_compute(c, &o, &p, &err) == 0 && p.graph_bytes == 0 && p.n_graphs == 0, "eager: no graphs");
    o.max_num_seqs = 1;
    o.cuda_graphs = true;
    CHECK(td_plan_compute(c, &o, &p, &err) == 0 && p.n_graphs == 2, "one sequence at depth 4: 1, 2, 4, 8 -> 5, 10: %d", p.n_graphs);

    /* Invalid options. */
    td_plan_opts_default(&o);
    o.gpu_util = 1.5;
    CHECK(td_plan_compute(c, &o, &p, &err) == TD_ERR_ARG, "util 1.5");
    td_plan_opts_default(&o);
    o.spec_depth = TD_MAX_SPEC_DEPTH + 1;
    CHECK(td_plan_compute(c, &o, &p, &err) == TD_ERR_ARG, "depth 17");
    td_plan_opts_default(&o);
    o.max_model_len = 300000;
    CHECK(td_plan_compute(c, &o, &p, &err) == TD_ERR_ARG, "beyond max_position_embeddings");
}

/* §1 with the measured 22.15 GiB of weights: every verdict reproduces. */
static void reference(const td_config *c) {
    CHECK(td_plan_reference_report(c, stdout) == 0, "verdicts differ from the measurement");
    const td_plan_ref_scenario *sc;
    int n = td_plan_reference_scenarios(&sc);
    CHECK(n >= 10, "scenarios %d", n);
    td_plan_opts o;
    td_plan p;
    td_err err = {0};
    td_plan_reference_opts(c, &sc[0], &o); /* 0.90, eager, 130,000, depth 4 */
    CHECK(td_plan_compute(c, &o, &p, &err) == 0, "%s", err.msg);
    CHECK(fabs(p.weights_bytes / GiB - 22.15) < 0.001, "weights %.3f", p.weights_bytes / GiB);
    double avail = p.available_kv_bytes / GiB, req = p.request_bytes / GiB;
    printf("test_plan: reference 0.90 eager: available %.3f GiB (measured 4.35), 130,000 tokens at depth 4 need %.3f GiB (measured 4.73, %+.1f%%)\n",
           avail, req, 100.0 * (req / 4.73 - 1));
    CHECK(fabs(avail - 4.35) < 0.02, "available %.3f", avail);
    CHECK(fabs(req / 4.73 - 1) < 0.10, "request %.3f within 10%% of 4.73", req);
    CHECK(!p.fits, "refuses");

    /* The refusal message states the four numbers, and each is right. */
    char want[160];
    snprintf(want, sizeof want, "%.2f GiB (KV cache", req);
    CHECK(strstr(p.message, want) != NULL, "needed %s in: %s", want, p.message);
    snprintf(want, sizeof want, "larger than the %.2f GiB available", avail);
    CHECK(strstr(p.message, want) != NULL, "available %s in: %s", want, p.message);
    snprintf(want, sizeof want, "largest window that fits at depth 4 is %lld tokens", (long long)p.max_len_at_depth);
    CHECK(p.max_len_at_depth > 100000 && strstr(p.message, want) != NULL, "window: %s", p.message);
    snprintf(want, sizeof want, "largest depth that fits 130000 tokens is %d", p.max_depth_at_len);
    CHECK(p.max_depth_at_len == 0 && strstr(p.message, want) != NULL, "depth %d: %s", p.max_depth_at_len, p.message);
    snprintf(want, sizeof want, "--gpu-memory-utilization %.3f would make it fit", p.util_needed);
    CHECK(p.util_needed > 0.90 && p.util_needed < 0.95 && strstr(p.message, want) != NULL, "util %.3f: %s", p.util_needed, p.message);
    printf("test_plan: refusal: %s\n", p.message);

    /* ... and they are the boundaries. */
    td_plan q;
    td_plan_opts o2 = o;
    o2.max_model_len = p.max_len_at_depth;
    CHECK(td_plan_compute(c, &o2, &q, &err) == 0 && q.fits, "largest window fits");
    o2.max_model_len = p.max_len_at_depth + 1;
    CHECK(td_plan_compute(c, &o2, &q, &err) == 0 && !q.fits, "one more token does not");
    o2 = o;
    o2.spec_depth = p.max_depth_at_len;
    CHECK(td_plan_compute(c, &o2, &q, &err) == 0 && q.fits, "largest depth fits");
    o2.spec_depth = p.max_depth_at_len + 1;
    CHECK(td_plan_compute(c, &o2, &q, &err) == 0 && !q.fits, "one more depth does not");
    o2 = o;
    o2.gpu_util = p.util_needed;
    CHECK(td_plan_compute(c, &o2, &q, &err) == 0 && q.fits, "utilization %.3f fits", p.util_needed);
    o2.gpu_util = p.util_needed - 0.001;
    CHECK(td_plan_compute(c, &o2, &q, &err) == 0 && !q.fits, "utilization %.3f does not", o2.gpu_util);
    o2 = o;
    o2.max_model_len = 0;
    CHECK(td_plan_compute(c, &o2, &q, &err) == 0 && q.fits && q.max_model_len == p.max_len_at_depth, "auto = largest window");

    /* Nothing fits: weights alone beyond 0.95 of a 24 GiB card. */
    o2 = o;
    o2.device_bytes = 24ull << 30;
    o2.gpu_util = 1.0;
    o2.max_model_len = 130000;
    CHECK(td_plan_compute(c, &o2, &q, &err) == 0 && !q.fits, "24 GiB");
    CHECK(q.max_depth_at_len == -1 && strstr(q.message, "no depth fits 130000 tokens") && strstr(q.message, "no --gpu-memory-utilization"),
          "%s", q.message);
    o2.max_model_len = 0;
    o2.device_bytes = 20ull << 30;
    CHECK(td_plan_compute(c, &o2, &q, &err) == 0 && !q.fits && q.max_model_len == 0 && strstr(q.message, "No window fits"), "%s", q.message);

    /* With CUDA graphs at 0.92: 100k fits at depths 4, 5; 110k and 130k do not. */
    td_plan_ref_scenario s = {0.92, true, 100000, 5, true, ""};
    td_plan_reference_opts(c, &s, &o);
    CHECK(td_plan_compute(c, &o, &p, &err) == 0 && p.fits, "100k depth 5 with graphs");
    printf("test_plan: reference 0.92 graphs: available %.3f GiB, graphs %.3f GiB (%d sizes); largest window per depth:", p.available_kv_bytes / GiB,
           p.graph_bytes / GiB, p.n_graphs);
    for (int d = 0; d < TD_PLAN_DEPTHS; d++) printf(" %lld", (long long)p.max_len_by_depth[d]);
    printf("\n");
    CHECK(p.max_len_by_depth[4] >= 100000 && p.max_len_by_depth[4] < 110000, "depth 4 window %lld", (long long)p.max_len_by_depth[4]);
}

/* The estimate against real (tiny, BF16) checkpoints: exact. */
static void measured_dir(const char *dir) {
    if (access(dir, R_OK) != 0) { printf("test_plan: %s missing, skipped\n", dir); return; }
    td_config *c = load_cfg(dir);
    if (!c) return;
    td_plan_weights m, e;
    td_err err = {0};
    CHECK(td_plan_weights_from_dir(dir, &m, &err) == 0, "%s", err.msg);
    td_plan_weights_estimate(c, TD_QUANT_BF16, &e);
    CHECK(m.main == e.main && m.mtp == e.mtp && m.embed == e.embed && m.lm_head == e.lm_head,
          "measured %llu/%llu/%llu/%llu estimated %llu/%llu/%llu/%llu", (unsigned long long)m.main, (unsigned long long)m.mtp,
          (unsigned long long)m.embed, (unsigned long long)m.lm_head, (unsigned long long)e.main, (unsigned long long)e.mtp,
          (unsigned long long)e.embed, (unsigned long long)e.lm_head);
    td_quant q = TD_QUANT_BF16;
    td_kv_dtype kv = TD_KV_AUTO;
    td_plan_detect_quant(dir, &q, &kv);
    CHECK(q == TD_QUANT_BF16 && kv == TD_KV_AUTO, "no quantization config");
    CHECK(td_plan_weights_from_dir("/nonexistent-dir", &m, &err) != 0, "missing dir");
    free(c);
}

static void parsing(void) {
    CHECK(td_plan_parse_tokens("130000") == 130000, "plain");
    CHECK(td_plan_parse_tokens("130k") == 130000, "k = 1000 (vLLM)");
    CHECK(td_plan_parse_tokens("128K") == 131072, "K = 1024");
    CHECK(td_plan_parse_tokens("1m") == 1000000 && td_plan_parse_tokens("1M") == 1048576, "m / M");
    CHECK(td_plan_parse_tokens("1.5k") == 1500, "fraction");
    CHECK(td_plan_parse_tokens("12x") == -1 && td_plan_parse_tokens("") == -1 && td_plan_parse_tokens("-5") == -1 &&
              td_plan_parse_tokens("0.5") == -1,
          "invalid");
    CHECK(td_plan_parse_bytes("32GiB") == 32ull << 30 && td_plan_parse_bytes("32G") == 32ull << 30, "GiB");
    CHECK(td_plan_parse_bytes("32607MiB") == 32607ull << 20, "MiB");
    CHECK(td_plan_parse_bytes("34GB") == 34000000000ull && td_plan_parse_bytes("1024") == 1024, "GB, bytes");
    CHECK(td_plan_parse_bytes("22.15GiB") == (uint64_t)llround(22.15 * GiB), "fraction");
    CHECK(td_plan_parse_bytes("32 GiB") == 0 && td_plan_parse_bytes("GiB") == 0 && td_plan_parse_bytes("5XB") == 0, "invalid");
}

/* `tandem plan --json` when the binary is built. */
static json_t *run_plan(const char *bin, const char *args, int *status) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s plan %s 2>/dev/null", bin, args);
    FILE *p = popen(cmd, "r");
    if (!p) { *status = -1; return NULL; }
    json_error_t je;
    json_t *j = json_loadf(p, JSON_DISABLE_EOF_CHECK, &je);
    char sink[4096];
    while (fread(sink, 1, sizeof sink, p) > 0) {}
    int rc = pclose(p);
    *status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    return j;
}

static void cli(void) {
    const char *b = getenv("BUILD");
    char bin[512];
    snprintf(bin, sizeof bin, "%s/tandem", b ? b : "build");
    if (access(bin, X_OK) != 0) { printf("test_plan: %s not built, CLI checks skipped\n", bin); return; }
    char args[6000];
    int st;
    snprintf(args, sizeof args,
             "--config %s --json --kv-cache-dtype fp8 --spec-depth 4 --max-model-len 130k --enforce-eager "
             "--gpu-memory-utilization 0.92 --weights 22.15GiB --mtp-weights 1.3GiB",
             g_cfg27);
    json_t *j = run_plan(bin, args, &st);
    CHECK(j && st == 0, "fits at 0.92: exit %d", st);
    if (j) {
        const char *keys[] = {"weights_bytes", "mtp_bytes", "activation_bytes", "graph_bytes", "kv_bytes_per_token", "linear_state_bytes",
                              "request_bytes", "available_kv_bytes", "fits", "max_len_by_depth"};
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) CHECK(json_object_get(j, keys[i]) != NULL, "key %s", keys[i]);
        CHECK(json_integer_value(json_object_get(j, "kv_bytes_per_token")) == 34816, "kv/token");
        CHECK(json_integer_value(json_object_get(j, "linear_state_bytes")) == 5 * 153944064ll, "state x 5");
        CHECK(json_integer_value(json_object_get(j, "max_model_len")) == 130000, "130k = 130000");
        CHECK(json_integer_value(json_object_get(j, "graph_bytes")) == 0, "eager");
        CHECK(json_is_true(json_object_get(j, "fits")), "fits");
        CHECK(json_array_size(json_object_get(j, "max_len_by_depth")) == TD_PLAN_DEPTHS, "depth table");
        double w = (double)json_integer_value(json_object_get(j, "weights_bytes")) / GiB;
        CHECK(fabs(w - 22.15) < 0.001, "weights %.3f", w);
    }
    json_decref(j);
    snprintf(args, sizeof args, "--config %s --json --kv-cache-dtype fp8 --spec-depth 4 --max-model-len 130000 --enforce-eager "
                                "--weights 22.15GiB --mtp-weights 1.3GiB", g_cfg27);
    j = run_plan(bin, args, &st);
    CHECK(j && st == 1, "refuses at 0.90: exit %d", st);
    if (j) {
        CHECK(json_is_false(json_object_get(j, "fits")), "fits false");
        const char *m = json_string_value(json_object_get(j, "message"));
        CHECK(m && strstr(m, "largest window") && strstr(m, "largest depth") && strstr(m, "--gpu-memory-utilization"), "%s", m ? m : "");
    }
    json_decref(j);
    /* Table output and exit codes. */
    snprintf(args, sizeof args, "%s plan --config %s --max-model-len auto > /dev/null 2>&1", bin, g_cfg27);
    int rc = system(args);
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "auto fits: %d", rc);
    snprintf(args, sizeof args, "%s plan --config %s --quant int3 > /dev/null 2>&1", bin, g_cfg27);
    rc = system(args);
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "bad usage: %d", rc);
    snprintf(args, sizeof args, "%s plan > /dev/null 2>&1", bin);
    rc = system(args);
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "no model: %d", rc);
    snprintf(args, sizeof args, "%s plan -m tests/golden/tiny-a/bf16 --json > /dev/null 2>&1", bin);
    if (access("tests/golden/tiny-a/bf16", R_OK) == 0) {
        rc = system(args);
        CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "tiny model dir: %d", rc);
    }
}

int main(void) {
    snprintf(g_cfg27, sizeof g_cfg27, "tests/data/configs/qwen3.6-27b.config.json");
    parsing();
    td_config *c = load_cfg(g_cfg27);
    if (c) {
        formulas_27b(c);
        reference(c);
        free(c);
    }
    measured_dir("tests/golden/tiny-a/bf16");
    measured_dir("tests/golden/tiny-b/bf16");
    measured_dir("tests/golden/tiny-c/bf16");
    cli();
    TEST_MAIN_END("test_plan");
}
