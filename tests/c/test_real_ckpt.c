/* Real checkpoints as downloaded (tests/golden/mm-a, defaults-a from
 * tools/reference/make_real_golden.py; the logits are checked in
 * test_golden.c): any tensor rank in a header, text_config.model_type,
 * transformers' config defaults, generation_config.json (eos list, sampling
 * defaults, bad files refused) and the kernels' head-dim limit checked at
 * load instead of aborting in the first forward. */
#include <jansson.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "engine/engine.h"
#include "format/safetensors.h"
#include "golden.h"
#include "model/genconfig.h"

#define MM "tests/golden/mm-a/bf16"
#define DEFAULTS "tests/golden/defaults-a/bf16"

static char g_tmp[64];

/* A copy of src in g_tmp/name (files only: the golden dirs are flat). */
static void copy_dir(const char *src, const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", g_tmp, name);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", out, src, out);
    CHECK(system(cmd) == 0, "%s", cmd);
}

static void write_text(const char *dir, const char *file, const char *text) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    FILE *f = fopen(p, "w");
    CHECK(f != NULL, "open %s", p);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* Edits config.json: sets text_config[key] (or the top level when top) to
 * the JSON text val, or removes the key when val is NULL. */
static void cfg_edit(const char *dir, bool top, const char *key, const char *val) {
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_error_t je;
    json_t *root = json_load_file(p, 0, &je);
    CHECK(root != NULL, "%s: %s", p, je.text);
    if (!root) return;
    json_t *t = top ? root : json_object_get(root, "text_config");
    if (!t) t = root;
    if (val) json_object_set_new(t, key, json_loads(val, JSON_DECODE_ANY, &je));
    else json_object_del(t, key);
    json_dump_file(root, p, JSON_INDENT(1));
    json_decref(root);
}

static int load(const char *dir, td_engine **eng, td_err *err) {
    td_engine_opts o = {.n_threads = 1, .spec_depth = 2};
    memset(err, 0, sizeof *err);
    *eng = NULL;
    return td_engine_load(dir, &o, eng, err);
}

static void expect_refused(const char *what, const char *dir, const char *need) {
    td_engine *eng;
    td_err err;
    int rc = load(dir, &eng, &err);
    CHECK(rc < 0 && eng == NULL, "%s: loaded (rc %d)", what, rc);
    CHECK(strstr(err.msg, need) != NULL, "%s: message lacks \"%s\": %s", what, need, err.msg);
    if (eng) td_engine_free(eng);
}

static void headers(void) {
    td_weights *w = NULL;
    td_err err = {0};
    int rc = td_weights_open_dir(MM, &w, &err);
    CHECK(rc == 0, "open %s: %s", MM, err.msg);
    if (rc) return;
    const td_st_entry *e = td_weights_find(w, "model.visual.patch_embed.proj.weight");
    CHECK(e && e->ndim == 5 && e->shape[0] == 32 && e->shape[1] == 3 && e->shape[2] == 2 && e->shape[3] == 16 &&
              e->shape[4] == 16,
          "5-D Conv3d patch embedding read with its shape");
    if (e) {
        td_tensor t;
        td_st_entry_tensor(e, &t);
        CHECK(t.ndim == 4 && td_tensor_numel(&t) == 32 * 3 * 2 * 16 * 16, "5-D view folds trailing dims (numel %lld)",
              (long long)td_tensor_numel(&t));
    }
    CHECK(w->n_files == 7, "7 shards (%d)", w->n_files);
    td_weights_free(w);

    /* a 6-D tensor of 1 x ... x 2 F32 and a 65-D one */
    char dir[256];
    for (int nd = 6; nd <= 65; nd += 59) {
        snprintf(dir, sizeof dir, "%s/rank%d.safetensors", g_tmp, nd);
        char hdr[1024] = "{\"x\":{\"dtype\":\"F32\",\"shape\":[";
        for (int i = 0; i < nd; i++) strcat(hdr, i ? ",1" : "2");
        strcat(hdr, "],\"data_offsets\":[0,8]}}");
        size_t hl = strlen(hdr);
        FILE *f = fopen(dir, "wb");
        uint64_t le = hl;
        fwrite(&le, 8, 1, f);
        fwrite(hdr, 1, hl, f);
        float z[2] = {1, 2};
        fwrite(z, 4, 2, f);
        fclose(f);
        const char *p = dir;
        rc = td_weights_open_files(&p, 1, &w, &err);
        if (nd == 6) {
            CHECK(rc == 0 && w->entries[0].ndim == 6, "6-D tensor accepted: %s", err.msg);
        } else {
            CHECK(rc < 0 && strstr(err.msg, "65 dims"), "65-D tensor refused: %s", err.msg);
        }
        if (rc == 0) td_weights_free(w);
    }
}

static void generation(void) {
    td_gen_config g;
    td_err err = {0};
    int rc = td_gen_config_load(MM, 300, &g, &err);
    CHECK(rc == 0 && g.found, "mm-a generation_config: %s", err.msg);
    CHECK(g.has_temperature && g.temperature == 0.7f && g.has_top_k && g.top_k == 20 && g.has_top_p && g.top_p == 0.9f && !g.greedy,
          "sampling defaults read");
    CHECK(g.n_eos == 2 && g.eos_token_ids[0] == 299 && g.eos_token_ids[1] == 297, "eos list [299, 297]");
    td_sampling s;
    td_sampling_default(&s);
    int max_new = 0;
    td_gen_config_apply(&g, &s, &max_new);
    CHECK(s.temperature == 0.7f && s.top_k == 20 && s.top_p == 0.9f && max_new == 0, "applied");
    char buf[128];
    td_gen_config_describe(&g, buf, sizeof buf);
    CHECK(!strcmp(buf, "temperature 0.7, top_k 20, top_p 0.9"), "described: %s", buf);

    /* the engine's stop list: config.json's eos (299) plus generation_config's (297) */
    td_engine *eng;
    rc = load(MM, &eng, &err);
    CHECK(rc == 0, "load mm-a: %s", err.msg);
    if (!rc) {
        td_model_info mi;
        td_engine_info(eng, &mi);
        CHECK(mi.n_eos == 2 && mi.eos_token_ids[0] == 299 && mi.eos_token_ids[1] == 297, "eos merged: n %d", mi.n_eos);
        CHECK(mi.n_mtp_layers == 1, "mm-a has its MTP layer from the last shard");
        td_engine_free(eng);
    }

    /* an eos that only generation_config.json names ends greedy generation
     * (the 6th token of the golden greedy run) */
    char dir[256];
    copy_dir(MM, "eos", dir, sizeof dir);
    td_weights *rw;
    const char *rp = "tests/golden/mm-a/reference-bf16.safetensors";
    rc = td_weights_open_files(&rp, 1, &rw, &err);
    CHECK(rc == 0, "%s", err.msg);
    if (rc) return;
    const td_st_entry *pe = td_weights_find(rw, "prompt"), *ge = td_weights_find(rw, "greedy");
    const int32_t *prompt = pe->data, *greedy = ge->data;
    int T = (int)pe->shape[0];
    int stop_at = 5;
    for (int i = 0; i < stop_at; i++)
        if (greedy[i] == greedy[stop_at]) stop_at = i; /* the first occurrence ends it */
    char gc[256];
    snprintf(gc, sizeof gc, "{\"eos_token_id\": [%d], \"do_sample\": false}\n", greedy[stop_at]);
    write_text(dir, "generation_config.json", gc);
    for (int depth = 0; depth <= 2; depth += 2) {
        rc = load(dir, &eng, &err);
        CHECK(rc == 0, "load: %s", err.msg);
        if (rc) break;
        td_session *s2;
        td_session_new(eng, &s2, &err);
        td_sampling sg;
        td_sampling_default(&sg);
        td_gen_opts go = {.max_tokens = 32, .spec_depth = depth};
        td_gen_result res;
        rc = td_session_generate(s2, prompt, T, &sg, &go, NULL, NULL, &res, &err);
        CHECK(rc == 0 && res.finish == TD_FINISH_STOP && res.n_generated == stop_at + 1,
              "depth %d: stops on generation_config's eos after %d tokens (got %d, finish %d)", depth, stop_at + 1,
              res.n_generated, (int)res.finish);
        td_session_free(s2);
        td_engine_free(eng);
    }
    td_weights_free(rw);

    write_text(dir, "generation_config.json", "{\"eos_token_id\": [1, 2,\n");
    expect_refused("unparseable generation_config.json", dir, "generation_config.json");
    write_text(dir, "generation_config.json", "{\"eos_token_id\": [100000]}");
    expect_refused("generation_config eos outside the vocabulary", dir, "eos_token_id");
    write_text(dir, "generation_config.json", "{\"temperature\": -1}");
    expect_refused("negative temperature", dir, "temperature");
    write_text(dir, "generation_config.json", "{\"top_p\": 0}");
    expect_refused("top_p 0", dir, "top_p");
}

static void config_checks(void) {
    char dir[256];
    copy_dir(MM, "cfg", dir, sizeof dir);
    cfg_edit(dir, false, "model_type", "\"qwen3_5_moe_text\"");
    expect_refused("text_config.model_type qwen3_5_moe_text", dir, "qwen3_5_moe_text");
    cfg_edit(dir, false, "model_type", "\"qwen3_5_text\"");

    /* kernel limits: refused at load, never an abort in the first forward */
    cfg_edit(dir, false, "head_dim", "2048");
    expect_refused("head_dim 2048", dir, "head_dim");
    cfg_edit(dir, false, "head_dim", "32");
    cfg_edit(dir, false, "linear_key_head_dim", "1040");
    expect_refused("linear_key_head_dim 1040", dir, "linear_key_head_dim");
    cfg_edit(dir, false, "linear_key_head_dim", "16");
    cfg_edit(dir, false, "linear_value_head_dim", "4096");
    expect_refused("linear_value_head_dim 4096", dir, "linear_value_head_dim");
    cfg_edit(dir, false, "linear_value_head_dim", "24");

    /* the two tie_word_embeddings disagree */
    cfg_edit(dir, true, "tie_word_embeddings", "true");
    expect_refused("tie_word_embeddings disagree", dir, "tie_word_embeddings");
    cfg_edit(dir, true, "tie_word_embeddings", "false");

    /* partial_rotary_factor left out everywhere = 0.25 (the stored one): loads */
    cfg_edit(dir, false, "partial_rotary_factor", NULL);
    {
        char p[512];
        snprintf(p, sizeof p, "%s/config.json", dir);
        json_t *root = json_load_file(p, 0, NULL);
        json_object_del(json_object_get(json_object_get(root, "text_config"), "rope_parameters"), "partial_rotary_factor");
        json_dump_file(root, p, JSON_INDENT(1));
        json_decref(root);
    }
    td_engine *eng;
    td_err err;
    int rc = load(dir, &eng, &err);
    CHECK(rc == 0, "no partial_rotary_factor: %s", err.msg);
    if (!rc) {
        CHECK(eng->model->cfg.rot_dim == 8, "rot_dim = 32 x 0.25 = 8 (got %d)", eng->model->cfg.rot_dim);
        td_engine_free(eng);
    }
    /* a missing size field: the default, and the mismatch names it */
    cfg_edit(dir, false, "hidden_size", NULL);
    expect_refused("hidden_size left out", dir, "hidden_size=4096");

    /* defaults-a: mtp_num_hidden_layers left out, the weights hold one layer */
    rc = load(DEFAULTS, &eng, &err);
    CHECK(rc == 0, "defaults-a: %s", err.msg);
    if (!rc) {
        const td_config *c = &eng->model->cfg;
        CHECK(c->n_heads == 16 && c->n_kv_heads == 4 && c->head_dim == 256 && c->rot_dim == 64 && c->rope_theta == 10000.0 &&
                  c->rms_norm_eps == 1e-6 && c->n_full_attn == 1 && c->full_attn[3] && c->max_position_embeddings == 32768 &&
                  c->conv_kernel == 4 && !c->tie_word_embeddings,
              "transformers' defaults");
        CHECK(eng->model->has_mtp && c->mtp_layers == 1, "MTP layers counted from the weights (%d)", c->mtp_layers);
        td_engine_free(eng);
    }
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/tandem-real-XXXXXX");
    if (!mkdtemp(g_tmp)) { perror("mkdtemp"); return 1; }
    headers();
    generation();
    config_checks();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", g_tmp);
    printf("real checkpoints: mm-a (5-D vision tensors, 7 shards, mtp in a shard) and defaults-a load; eos from generation_config ends generation\n");
    TEST_MAIN_END("real_ckpt");
}
