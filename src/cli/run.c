/* `tandem run`: generate from a prompt, stream the text, report speed. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "spec/calibrate.h"
#include "cli/memory.h"
#include "cli/opts.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    tok_stream ts;
    td_err err;
} stream_ctx;

static int on_token(void *u, int32_t t) {
    stream_ctx *c = u;
    const char *text;
    size_t len;
    if (td_tok_stream_push(&c->ts, t, &text, &len, &c->err) == 0 && len) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    return 0;
}

static void print_stats(const td_gen_result *r, int depth, bool autod) {
    const td_spec_counters *s = &r->spec;
    fprintf(stderr, "\nspeculative decoding (depth %s%d): drafts %llu, draft tokens %llu, accepted %llu", autod ? "auto, at most " : "", depth,
            (unsigned long long)s->drafts, (unsigned long long)s->draft_tokens, (unsigned long long)s->accepted_tokens);
    if (s->drafts) fprintf(stderr, " (%.1f%%), mean acceptance length %.2f", 100.0 * (double)s->accepted_tokens / (double)s->draft_tokens,
                           1.0 + (double)s->accepted_tokens / (double)s->drafts);
    fprintf(stderr, "\nchosen depth (decode steps):");
    for (int k = 0; k <= depth && k <= TD_MAX_SPEC_DEPTH; k++) fprintf(stderr, " %d: %llu%s", k, (unsigned long long)s->chosen_depth[k], k < depth ? "," : "");
    if (autod) fprintf(stderr, "; %llu of them exploring, %llu tracking the MTP layer", (unsigned long long)s->explored_steps,
                       (unsigned long long)s->tracked_steps);
    fputc('\n', stderr);
    if (!s->drafts) return;
    fprintf(stderr, "| position | accepted | rate |\n|---|---|---|\n");
    for (int i = 0; i < depth && i < TD_MAX_SPEC_DEPTH; i++)
        fprintf(stderr, "| %d | %llu | %.1f%% |\n", i + 1, (unsigned long long)s->accepted_per_pos[i],
                100.0 * (double)s->accepted_per_pos[i] / (double)s->drafts);
}

/* Renders a one-message chat with the model's template. */
static char *chat_prompt(const char *dir, const char *user, bool thinking) {
    td_err err = {0};
    tok_chat_config cc;
    if (td_tok_chat_config_load(dir, &cc, &err)) { td_cli_error("tandem", &err); return NULL; }
    char *out = NULL;
    size_t len;
    tpl *t = NULL;
    if (!cc.chat_template) {
        fprintf(stderr, "tandem: %s has no chat template\n", dir);
    } else if (td_tpl_parse(cc.chat_template, strlen(cc.chat_template), &t, &err) == 0) {
        json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", user);
        json_t *kw = json_pack("{s:b}", "enable_thinking", thinking);
        tpl_chat_args a = {.messages = msgs, .kwargs = kw, .add_generation_prompt = true, .bos_token = cc.bos, .eos_token = cc.eos,
                           .pad_token = cc.pad, .unk_token = cc.unk};
        if (td_tpl_apply_chat(t, &a, &out, &len, &err)) { td_cli_error("tandem: template", &err); out = NULL; }
        json_decref(msgs);
        json_decref(kw);
        td_tpl_free(t);
    } else {
        td_cli_error("tandem: template", &err);
    }
    td_tok_chat_config_free(&cc);
    return out;
}

int td_cmd_run(int argc, char **argv) {
    common_opts o;
    td_common_opts_init(&o);
    const char *prompt = NULL;
    bool chat = false, stats = false, thinking = false, ignore_eos = false, verbose = false;
    int n_predict = 128;
    bool want_help = false;
    for (int i = 1; i < argc; i++) want_help |= td_cli_is_help(argv[i]);
    if (!want_help && td_cli_generation_defaults(&o, argc, argv, &n_predict)) return 1;
    for (int i = 1; i < argc; i++) {
        int r = td_common_opts_parse(&o, argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(argv[i], "-p") || !strcmp(argv[i], "--prompt")) {
            if (i + 1 >= argc) return td_cli_missing("run", argv[i], "the prompt text");
            prompt = argv[++i];
        } else if (!strcmp(argv[i], "-n") || !strcmp(argv[i], "--max-tokens")) {
            char *end;
            long n = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
            if (i + 1 >= argc || *end || end == argv[i + 1] || n < 1 || n > 1000000000) {
                fprintf(stderr, "tandem: %s must be an integer in [1, 1000000000], got \"%s\"\n", argv[i], i + 1 < argc ? argv[i + 1] : "");
                return 2;
            }
            n_predict = (int)n;
            i++;
        } else if (!strcmp(argv[i], "--chat")) chat = true;
        else if (!strcmp(argv[i], "--think")) thinking = true;
        else if (!strcmp(argv[i], "--stats")) stats = true;
        else if (td_cli_is_verbose(argv[i])) verbose = td_cli_verbose = true;
        else if (!strcmp(argv[i], "--ignore-eos")) ignore_eos = true;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: tandem run [-m DIR] -p TEXT [--chat] [--think] [-n N] [--stats] [--ignore-eos] [-v] [options]\n"
                   "  generate from a prompt, streaming the text to stdout (speed and notes on stderr)\n"
                   "  -p, --prompt TEXT         the prompt (required)\n"
                   "  --chat                    wrap the prompt in the model's chat template as one user message (default: raw)\n"
                   "  --think                   with --chat: enable_thinking = true (default false)\n"
                   "  -n, --max-tokens N        tokens to generate at most, 1..1e9 (default 128, or generation_config's max_new_tokens)\n"
                   "  --stats                   speculative decoding counters and acceptance per draft position\n"
                   "  --ignore-eos              do not stop at end-of-sequence tokens (default: stop)\n"
                   "  -v, --verbose             the KV cache plan, and errors with their source location\n"
                   "  -h, --help                this help\n"
                   "common options:\n%s",
                   td_common_opts_help());
            return 0;
        } else {
            return td_cli_unknown("run", argv[i]);
        }
    }
    if (!prompt) { fprintf(stderr, "tandem run: -p TEXT is required\n"); return 2; }
    if (td_cli_check_model_dir("tandem", o.model)) return 1;
    td_err err = {0};
    tokenizer *tok = NULL;
    if (td_tok_load(o.model, &tok, &err)) { td_cli_error("tandem", &err); return 1; }
    td_engine_opts eo;
    char kv_summary[512] = "";
    int mrc = td_cli_engine_opts(&o, 1, 256, &eo, stderr, kv_summary, sizeof kv_summary);
    if (mrc) { td_tok_free(tok); return 1; }
    td_engine *eng = NULL;
    if (td_engine_load(o.model, &eo, &eng, &err)) { td_cli_error("tandem", &err); td_tok_free(tok); return 1; }
    char graphs[256];
    if (td_engine_capture_graphs(eng, eo.spec_depth, graphs, sizeof graphs, &err)) { td_cli_error("tandem", &err); td_engine_free(eng); td_tok_free(tok); return 1; }
    if (graphs[0] && verbose) fprintf(stderr, "tandem run: %s\n", graphs);
    bool autod = o.spec_auto && eo.spec_depth > 0;
    if (autod && td_engine_calibrate_spec(eng, eo.spec_depth, 1, 3, &err)) { td_cli_error("tandem", &err); td_engine_free(eng); td_tok_free(tok); return 1; }
    td_cli_print_sampling("tandem run", &o); /* after the load: a failed start stays one line */
    if (verbose) fprintf(stderr, "%s\n", kv_summary);
    int rc = 1;
    char *text = chat ? chat_prompt(o.model, prompt, thinking) : strdup(prompt);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    td_session *s = NULL;
    if (!text) goto out;
    if (td_tok_encode(tok, text, strlen(text), !chat, &ids, &n_ids, &err)) { td_cli_error("tandem", &err); goto out; }
    if (td_session_new(eng, &s, &err)) { td_cli_error("tandem", &err); goto out; }
    int32_t stop[2];
    int n_stop = 0;
    if (td_tok_eos_id(tok) >= 0) stop[n_stop++] = td_tok_eos_id(tok);
    td_gen_opts go = {.max_tokens = n_predict, .spec_depth = eo.spec_depth, .spec_auto = autod, .draft_sampling = o.draft_sampling,
                      .ignore_eos = ignore_eos, .stop_ids = ignore_eos ? NULL : stop, .n_stop = ignore_eos ? 0 : n_stop};
    stream_ctx sc = {0};
    td_tok_stream_init(&sc.ts, tok, true);
    td_gen_result res;
    if (td_session_generate(s, ids, (int)n_ids, &o.sampling, &go, on_token, &sc, &res, &err)) {
        fprintf(stderr, "\ntandem: %s\n", td_cli_errmsg(&err));
    } else {
        const char *tail;
        size_t tl;
        if (td_tok_stream_flush(&sc.ts, &tail, &tl, &err) == 0 && tl) fwrite(tail, 1, tl, stdout);
        printf("\n");
        fflush(stdout);
        fprintf(stderr, "prompt: %d tokens, %.1f tokens/s; generation: %d tokens, %.1f tokens/s\n", res.n_prompt,
                res.prefill_seconds > 0 ? (res.n_prompt - res.n_reused) / res.prefill_seconds : 0.0, res.n_generated,
                res.decode_seconds > 0 ? res.n_generated / res.decode_seconds : 0.0);
        /* LENGTH before -n tokens: the session ran out of positions */
        if (res.finish == TD_FINISH_LENGTH && res.n_generated < n_predict) {
            td_model_info mi;
            td_engine_info(eng, &mi);
            fprintf(stderr, "tandem: stopped: the context window (%d tokens) is full after %d prompt + %d generated tokens; "
                            "-c / --max-model-len sets it\n",
                    mi.max_position_embeddings, res.n_prompt, res.n_generated);
        }
        if (stats) print_stats(&res, eo.spec_depth, autod);
        rc = 0;
    }
    td_tok_stream_free(&sc.ts);
out:
    free(ids);
    free(text);
    td_session_free(s);
    td_engine_free(eng);
    td_tok_free(tok);
    return rc;
}
