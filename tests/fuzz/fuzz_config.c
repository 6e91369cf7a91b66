/* config.json loading (src/model/config.c, td_config_load) on arbitrary
 * bytes, through a memfd. An accepted config must satisfy what the rest of
 * the engine relies on (head dims within the kernels' limit, GQA ratios,
 * layer counts, EOS ids inside the vocabulary). */
#include "fuzz_util.h"
#include "model/config.h"

static fuzz_file g_file;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_file_init(&g_file, "config.json");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_file_set(&g_file, data, size);
    static td_config c;
    td_err err = {0};
    int rc = td_config_load(g_file.path, &c, &err);
    if (rc != TD_OK) {
        FUZZ_ASSERT(rc < 0 && err.msg[0], "rc %d without a message", rc);
        return 0;
    }
    FUZZ_ASSERT(c.n_layers >= 1 && c.n_layers <= TD_MAX_LAYERS, "n_layers %d", c.n_layers);
    FUZZ_ASSERT(c.head_dim >= 1 && c.head_dim <= TD_MAX_HEAD_DIM, "head_dim %d", c.head_dim);
    FUZZ_ASSERT(c.lin_dk >= 1 && c.lin_dk <= TD_MAX_HEAD_DIM && c.lin_dv >= 1 && c.lin_dv <= TD_MAX_HEAD_DIM, "lin dims");
    FUZZ_ASSERT(c.n_kv_heads >= 1 && c.n_heads % c.n_kv_heads == 0, "heads %d/%d", c.n_heads, c.n_kv_heads);
    FUZZ_ASSERT(c.lin_nk >= 1 && c.lin_nv % c.lin_nk == 0, "lin heads");
    FUZZ_ASSERT(c.rot_dim >= 0 && c.rot_dim <= c.head_dim && c.rot_dim % 2 == 0, "rot_dim %d", c.rot_dim);
    int nf = 0;
    for (int i = 0; i < c.n_layers; i++) nf += c.full_attn[i];
    FUZZ_ASSERT(nf == c.n_full_attn, "n_full_attn");
    FUZZ_ASSERT(c.n_eos >= 0 && c.n_eos <= TD_MAX_EOS, "n_eos");
    for (int i = 0; i < c.n_eos; i++) FUZZ_ASSERT(c.eos_token_ids[i] >= 0 && c.eos_token_ids[i] < c.vocab_size, "eos id");
    FUZZ_ASSERT(memchr(c.model_type, 0, sizeof c.model_type) && memchr(c.defaulted, 0, sizeof c.defaulted), "strings terminated");
    FUZZ_ASSERT(c.rms_norm_eps >= 0 && c.rms_norm_eps <= 1 && c.rope_theta >= 1, "eps/theta");
    return 0;
}
