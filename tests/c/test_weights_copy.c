/* Weights copied into transparent huge pages at load (the CPU default;
 * td_engine_opts.mmap_weights keeps them in place):
 * - the CPU backend's weight_load: with copy_weights and huge pages offered by
 *   the kernel, a tensor of 64 KiB or more comes back as a copy on a 2 MiB
 *   boundary with the same bytes, counted in weight_copy_bytes; a smaller one,
 *   or any without copy_weights or without huge pages, is the host pointer;
 *   weight_free unmaps a copy and ignores a pointer used in place; copies
 *   still held at destroy are unmapped (LeakSanitizer in make asan);
 * - the engine on models/demo: default vs --mmap give the same logits bit for
 *   bit and the same greedy tokens at depth 0 and 3; the memory report moves
 *   the copied bytes from weights_mapped to weights_copied (the same total);
 *   the files' pages were released, and a read of them still returns the
 *   file's bytes;
 * - --quantize q8: the int8 copies are made in huge pages (2 MiB-aligned),
 *   and nothing is copied again. */
#include <stdint.h>
#include "check.h"
#include "engine/engine.h"
#include "format/safetensors.h"
#include "golden.h"

/* Whether the kernel hands out huge pages on request, read here from sysfs as the backend does: the
   environment, not a formula (on a kernel without them every weight must stay in place). */
static bool thp_offered(void) {
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return false;
    char line[128] = {0};
    bool ok = fgets(line, sizeof line, f) && (strstr(line, "[always]") || strstr(line, "[madvise]"));
    fclose(f);
    return ok;
}

static void backend_level(bool thp) {
    td_err err = {0};
    td_backend *b;
    CHECK(td_backend_cpu_create(1, &b, &err) == 0, "%s", err.msg);
    const size_t big = (3u << 20) + 100, small = (64u << 10) - 4;
    unsigned char *hb = malloc(big), *hs = malloc(small);
    for (size_t i = 0; i < big; i++) hb[i] = (unsigned char)(i * 2654435761u >> 13);
    for (size_t i = 0; i < small; i++) hs[i] = (unsigned char)(i * 40503u >> 7);
    /* off: in place */
    CHECK(b->ops->weight_load(b, hb, big) == hb && b->counters.weight_copy_bytes == 0, "copy_weights off: a copy was made");
    b->copy_weights = true;
    const unsigned char *db = b->ops->weight_load(b, hb, big), *ds = b->ops->weight_load(b, hs, small);
    CHECK(ds == hs, "a tensor under 64 KiB was copied");
    if (thp) {
        CHECK(db && db != hb, "a 3 MiB tensor was not copied");
        CHECK(db && ((uintptr_t)db & ((2u << 20) - 1)) == 0, "the copy is not on a 2 MiB boundary: %p", (const void *)db);
        CHECK(db && memcmp(db, hb, big) == 0, "the copy's bytes differ");
        CHECK(b->counters.weight_copy_bytes == big, "weight_copy_bytes %llu, copied %zu", (unsigned long long)b->counters.weight_copy_bytes,
              big);
    } else {
        CHECK(db == hb && b->counters.weight_copy_bytes == 0, "no huge pages from the kernel, but a copy was made");
    }
    b->ops->weight_free(b, ds); /* in place: nothing happens */
    b->ops->weight_free(b, db);
    /* one more copy left for destroy to unmap */
    const unsigned char *d2 = b->ops->weight_load(b, hb, big);
    CHECK(d2 && memcmp(d2, hb, big) == 0, "second copy");
    td_backend_free(b);
    free(hb);
    free(hs);
}

static int greedy(td_engine *e, const int32_t *toks, int n, int depth, int32_t *out, int G, td_err *err) {
    td_session *s;
    int rc = td_session_new(e, &s, err);
    if (rc) return rc;
    td_sampling sp;
    td_sampling_default(&sp);
    tok64 v = {.n = 0};
    td_gen_opts go = {.max_tokens = G, .spec_depth = depth, .ignore_eos = true};
    td_gen_result r;
    rc = td_session_generate(s, toks, n, &sp, &go, collect64, &v, &r, err);
    if (!rc && v.n != G) { snprintf(err->msg, sizeof err->msg, "%d tokens of %d", v.n, G); rc = 1; }
    if (!rc) memcpy(out, v.buf, sizeof(int32_t) * (size_t)G);
    td_session_free(s);
    return rc;
}

static void engine_level(bool thp) {
    td_err err = {0};
    td_engine *ec = NULL, *em = NULL;
    td_engine_opts o = {.n_threads = 2, .spec_depth = 3, .max_context = 512};
    CHECK(td_engine_load("models/demo", &o, &ec, &err) == 0, "models/demo: %s", err.msg);
    o.mmap_weights = true;
    CHECK(td_engine_load("models/demo", &o, &em, &err) == 0, "models/demo --mmap: %s", err.msg);
    if (!ec || !em) goto done;
    /* the guard and CUDA backends copy every weight their own way: nothing goes through the CPU's huge pages */
    bool cpu = !strcmp(ec->backend->ops->name, "cpu");
    td_memory_info mc, mm;
    td_engine_memory(ec, &mc);
    td_engine_memory(em, &mm);
    CHECK(mm.weights_copied == 0, "--mmap: %zu bytes copied", mm.weights_copied);
    if (thp && cpu) CHECK(mc.weights_copied > 0, "default: nothing copied into huge pages");
    else CHECK(mc.weights_copied == 0, "no huge pages (or backend %s), but %zu bytes copied", ec->backend->ops->name, mc.weights_copied);
    CHECK(mc.weights_mapped + mc.weights_copied == mm.weights_mapped && mc.total == mm.total,
          "memory report: mapped %zu + copied %zu vs mapped %zu; totals %zu vs %zu", mc.weights_mapped, mc.weights_copied, mm.weights_mapped,
          mc.total, mm.total);
    /* the released file pages read back as the file's bytes (the embedding, copied, compared with the mapping) */
    const td_st_entry *emb = td_weights_find(ec->model->weights, "model.language_model.embed_tokens.weight");
    if (!emb) emb = td_weights_find(ec->model->weights, "model.embed_tokens.weight");
    CHECK(emb != NULL, "no embedding entry in models/demo");
    if (emb && cpu) {
        const td_st_entry *emm = td_weights_find(em->model->weights, emb->name);
        CHECK(emm && emm->nbytes == emb->nbytes && memcmp(emm->data, emb->data, emb->nbytes) == 0, "the released mapping reads back other bytes");
    }
    int V = ec->model->cfg.vocab_size;
    enum { T = 40, G = 24 };
    int32_t toks[T];
    for (int i = 0; i < T; i++) toks[i] = (int32_t)((i * 7919 + 13) % V);
    float *lc = malloc(sizeof(float) * (size_t)T * V), *lm = malloc(sizeof(float) * (size_t)T * V);
    CHECK(prefill_logits(ec, toks, T, lc, &err) == 0 && prefill_logits(em, toks, T, lm, &err) == 0, "prefill: %s", err.msg);
    CHECK(memcmp(lc, lm, sizeof(float) * (size_t)T * V) == 0, "logits differ between copied and mapped weights");
    for (int d = 0; d <= 3; d += 3) {
        int32_t gc[G], gm[G];
        CHECK(greedy(ec, toks, T, d, gc, G, &err) == 0 && greedy(em, toks, T, d, gm, G, &err) == 0, "generate: %s", err.msg);
        CHECK(memcmp(gc, gm, sizeof gc) == 0, "greedy tokens at depth %d differ between copied and mapped weights", d);
    }
    printf("weights_copy: demo %s, huge pages %s: %zu bytes copied, %zu left mapped; logits and greedy (depths 0, 3) equal to --mmap\n",
           ec->backend->ops->name, thp ? "offered" : "not offered", mc.weights_copied, mc.weights_mapped);
    free(lc);
    free(lm);
done:
    td_engine_free(ec);
    td_engine_free(em);
}

/* --quantize q8: the int8 copies are made in huge pages (the engine's own memory), not copied again */
static void q8_level(bool thp) {
    td_err err = {0};
    td_engine *e = NULL;
    td_engine_opts o = {.n_threads = 2, .max_context = 256, .quantize = 1};
    CHECK(td_engine_load("models/demo", &o, &e, &err) == 0, "models/demo q8: %s", err.msg);
    if (!e) return;
    td_memory_info mi;
    td_engine_memory(e, &mi);
    CHECK(mi.weights_copied == 0, "q8: %zu bytes copied again", mi.weights_copied);
    CHECK(thp ? e->model->n_huge_bufs > 0 : e->model->n_huge_bufs == 0, "q8: %d int8 copies in huge pages (huge pages %s)",
          e->model->n_huge_bufs, thp ? "offered" : "not offered");
    int aligned = 0;
    for (int i = 0; i < e->model->n_huge_bufs; i++) aligned += ((uintptr_t)e->model->huge_bufs[i].p & ((2u << 20) - 1)) == 0;
    CHECK(aligned == e->model->n_huge_bufs, "q8: %d of %d huge-page copies on a 2 MiB boundary", aligned, e->model->n_huge_bufs);
    printf("weights_copy: demo q8: %d int8 copies in huge pages, %d on the heap\n", e->model->n_huge_bufs, e->model->n_owned_vecs);
    td_engine_free(e);
}

int main(void) {
    bool thp = thp_offered();
    backend_level(thp);
    engine_level(thp);
    q8_level(thp);
    TEST_MAIN_END("weights_copy");
}
