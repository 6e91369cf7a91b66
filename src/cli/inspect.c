/* `tandem inspect`: what a model directory holds, by part. */
#include <stdio.h>
#include <string.h>
#include "cli/cli.h"
#include "cli/opts.h"
#include "model/model.h"

static void row(const char *part, int64_t params, size_t bytes) {
    printf("| %-22s | %14lld | %10.2f MiB |\n", part, (long long)params, (double)bytes / (1024.0 * 1024.0));
}

int td_cmd_inspect(int argc, char **argv) {
    const char *dir = TD_DEFAULT_MODEL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (td_cli_is_help(a)) {
            printf("usage: tandem inspect [-m DIR] [-v]\n"
                   "  parameter counts, dtypes and bytes of a model, by part\n"
                   "  -m, --model DIR   model directory (default " TD_DEFAULT_MODEL ")\n"
                   "  -v, --verbose     errors with their source location\n"
                   "  -h, --help        this help\n");
            return 0;
        }
        if (td_cli_is_verbose(a)) td_cli_verbose = true;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (i + 1 >= argc) return td_cli_missing("inspect", a, "a model directory");
            dir = argv[++i];
        } else return td_cli_unknown("inspect", a);
    }
    if (td_cli_check_model_dir("tandem", dir)) return 1;
    td_err err = {0};
    td_model *m;
    if (td_model_load(dir, &m, &err)) { td_cli_error("tandem", &err); return 1; }
    const td_config *c = &m->cfg;
    printf("model: %s (%s), %d layers (%d full attention, %d Gated DeltaNet), hidden %d, vocab %d, MTP layers %d%s\n", dir,
           c->model_type, c->n_layers, c->n_full_attn, c->n_layers - c->n_full_attn, c->hidden_size, c->vocab_size,
           m->has_mtp ? c->mtp_layers : 0, c->tie_word_embeddings ? ", tied embeddings" : "");
    printf("\n| part                   |     parameters |        bytes |\n|---|---|---|\n");
    row("embeddings", m->n_params_embed, m->bytes_embed);
    row("layers + final norm", m->n_params_main, m->bytes_main);
    row("lm_head", m->n_params_head, m->bytes_head);
    row("MTP head", m->n_params_mtp, m->bytes_mtp);
    row("total", m->n_params_embed + m->n_params_main + m->n_params_head + m->n_params_mtp,
        m->bytes_embed + m->bytes_main + m->bytes_head + m->bytes_mtp);
    /* dtypes present in the files */
    int counts[TD_DTYPE_COUNT + 1] = {0};
    size_t bytes[TD_DTYPE_COUNT + 1] = {0};
    for (int i = 0; i < m->weights->n_entries; i++) {
        const td_st_entry *e = &m->weights->entries[i];
        counts[e->dtype]++;
        bytes[e->dtype] += e->nbytes;
    }
    printf("\n| dtype | tensors | bytes |\n|---|---|---|\n");
    for (int t = 0; t <= TD_DTYPE_COUNT; t++)
        if (counts[t]) printf("| %s | %d | %.2f MiB |\n", t == TD_DTYPE_COUNT ? "other" : td_dtype_name((td_dtype)t), counts[t], (double)bytes[t] / (1024.0 * 1024.0));
    /* what the engine never maps into compute: the vision tower and anything else
     * outside the text model and mtp.* */
    int n_unused = 0;
    size_t unused = 0;
    for (int i = 0; i < m->weights->n_entries; i++) {
        const char *n = m->weights->entries[i].name;
        if (strncmp(n, m->prefix, strlen(m->prefix)) && strncmp(n, "mtp.", 4) && strcmp(n, "lm_head.weight")) {
            n_unused++;
            unused += m->weights->entries[i].nbytes;
        }
    }
    printf("\nfiles: %d safetensors, %d tensors; not used (model.visual.* and others): %d tensors, %.2f MiB\n", m->weights->n_files,
           m->weights->n_entries, n_unused, (double)unused / (1024.0 * 1024.0));
    td_model_free(m);
    return 0;
}
