/* `tandem tokenize | detokenize | template`: thin wrappers over
 * src/tokenizer and src/template, used by the golden tests. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "cli/opts.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"

static char *slurp(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    if (!b) return NULL;
    for (;;) {
        size_t r = fread(b + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
        if (n + 1 == cap) {
            char *nb = realloc(b, cap *= 2);
            if (!nb) { free(b); return NULL; }
            b = nb;
        }
    }
    b[n] = 0;
    *len = n;
    return b;
}

static const char *tok_help =
    "usage: tandem %s [-m DIR] [-v] < input\n"
    "  %s\n"
    "  -m, --model DIR   model directory with tokenizer.json (default " TD_DEFAULT_MODEL ")\n"
    "  -v, --verbose     errors with their source location\n"
    "  -h, --help        this help\n";

/* -m DIR, -v and -h are the options of tokenize / detokenize: 0 to go on,
 * else the exit code (help: 0, bad usage: 2). */
static int tok_args(const char *cmd, const char *what, int argc, char **argv, const char **dir) {
    *dir = TD_DEFAULT_MODEL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (td_cli_is_help(a)) { printf(tok_help, cmd, what); return -1; }
        if (td_cli_is_verbose(a)) td_cli_verbose = true;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (i + 1 >= argc) return td_cli_missing(cmd, a, "a model directory");
            *dir = argv[++i];
        } else return td_cli_unknown(cmd, a);
    }
    return 0;
}

int td_cmd_tokenize(int argc, char **argv) {
    const char *dir;
    int r = tok_args("tokenize", "text on stdin -> JSON array of token ids (with the post-processor's special tokens, as tokenizers does)", argc, argv, &dir);
    if (r) return r < 0 ? 0 : r;
    if (td_cli_check_model_dir("tandem tokenize", dir)) return 1;
    td_err err = {0};
    tokenizer *t;
    if (td_tok_load(dir, &t, &err)) { td_cli_error("tandem tokenize", &err); return 1; }
    size_t n;
    char *text = slurp(stdin, &n);
    int32_t *ids = NULL;
    size_t nid = 0;
    if (!text || td_tok_encode(t, text, n, true, &ids, &nid, &err)) {
        fprintf(stderr, "tandem tokenize: %s\n", text ? td_cli_errmsg(&err) : "out of memory");
        free(text);
        td_tok_free(t);
        return 1;
    }
    fputc('[', stdout);
    for (size_t i = 0; i < nid; i++) printf(i ? ", %d" : "%d", ids[i]);
    fputs("]\n", stdout);
    free(ids);
    free(text);
    td_tok_free(t);
    return 0;
}

int td_cmd_detokenize(int argc, char **argv) {
    const char *dir;
    int r = tok_args("detokenize", "JSON array of token ids on stdin -> text", argc, argv, &dir);
    if (r) return r < 0 ? 0 : r;
    if (td_cli_check_model_dir("tandem detokenize", dir)) return 1;
    td_err err = {0};
    json_error_t je;
    json_t *arr = json_loadf(stdin, 0, &je);
    if (!json_is_array(arr)) {
        fprintf(stderr, "tandem detokenize: stdin must be a JSON array of ids (%s)\n", arr ? "not an array" : je.text);
        json_decref(arr);
        return 1;
    }
    tokenizer *t;
    if (td_tok_load(dir, &t, &err)) { td_cli_error("tandem detokenize", &err); json_decref(arr); return 1; }
    size_t n = json_array_size(arr);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    int rc = 1;
    if (ids) {
        for (size_t i = 0; i < n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(arr, i));
        char *out;
        size_t len;
        if (td_tok_decode(t, ids, n, false, &out, &len, &err) == 0) {
            fwrite(out, 1, len, stdout);
            free(out);
            rc = 0;
        } else {
            td_cli_error("tandem detokenize", &err);
        }
    }
    free(ids);
    td_tok_free(t);
    json_decref(arr);
    return rc;
}

static json_t *load_json_file(const char *path, const char *what) {
    json_error_t je;
    json_t *j = !strcmp(path, "-") ? json_loadf(stdin, 0, &je) : json_load_file(path, 0, &je);
    if (!j) fprintf(stderr, "tandem template: %s %s: line %d: %s\n", what, path, je.line, je.text);
    return j;
}

static const char *tpl_help =
    "usage: tandem template [-m DIR] --messages FILE [--tools FILE] [--no-generation-prompt] [--kwargs JSON] [-v]\n"
    "  render the model's chat template (tokenizer_config.json / chat_template.jinja) to stdout\n"
    "  -m, --model DIR          model directory (default " TD_DEFAULT_MODEL ")\n"
    "  --messages FILE          JSON array of messages, or {\"messages\": [...], \"tools\": [...]}; - = stdin (required)\n"
    "  --tools FILE             JSON array of tools (default: none, or the messages file's \"tools\")\n"
    "  --no-generation-prompt   leave out the assistant turn's opening (default: add it)\n"
    "  --kwargs JSON            extra template variables, a JSON object, e.g. '{\"enable_thinking\": false}' (default {})\n"
    "  -v, --verbose            errors with their source location\n"
    "  -h, --help               this help\n";

int td_cmd_template(int argc, char **argv) {
    const char *dir = TD_DEFAULT_MODEL, *mfile = NULL, *tfile = NULL, *kw = NULL;
    bool gen = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (td_cli_is_help(a)) { fputs(tpl_help, stdout); return 0; }
        if (td_cli_is_verbose(a)) { td_cli_verbose = true; continue; }
        if (!strcmp(a, "--no-generation-prompt")) { gen = false; continue; }
        const char **dst = !strcmp(a, "-m") || !strcmp(a, "--model") ? &dir
                           : !strcmp(a, "--messages")                ? &mfile
                           : !strcmp(a, "--tools")                   ? &tfile
                           : !strcmp(a, "--kwargs")                  ? &kw
                                                                     : NULL;
        if (!dst) return td_cli_unknown("template", a);
        if (!v) return td_cli_missing("template", a, !strcmp(a, "--kwargs") ? "a JSON object" : dst == &dir ? "a model directory" : "a JSON file");
        *dst = v;
        i++;
    }
    if (!mfile) { fprintf(stderr, "tandem template: --messages FILE is required (usage: tandem template --help)\n"); return 2; }
    if (td_cli_check_model_dir("tandem template", dir)) return 1;
    td_err err = {0};
    tok_chat_config cfg;
    int rc = 1;
    json_t *msgs = NULL, *tools = NULL, *kwargs = NULL;
    tpl *t = NULL;
    if (td_tok_chat_config_load(dir, &cfg, &err)) { td_cli_error("tandem template", &err); return 1; }
    if (!cfg.chat_template) { fprintf(stderr, "tandem template: no chat template in %s\n", dir); goto out; }
    if (!(msgs = load_json_file(mfile, "messages"))) goto out;
    /* a file holding {"messages": [...], "tools": [...]} is accepted too */
    if (json_is_object(msgs)) {
        json_t *m = json_incref(json_object_get(msgs, "messages"));
        if (!tfile && json_object_get(msgs, "tools")) tools = json_incref(json_object_get(msgs, "tools"));
        json_decref(msgs);
        msgs = m;
    }
    if (tfile && !(tools = load_json_file(tfile, "tools"))) goto out;
    if (kw) {
        json_error_t je;
        kwargs = json_loads(kw, 0, &je);
        if (!json_is_object(kwargs)) { fprintf(stderr, "tandem template: --kwargs must be a JSON object\n"); goto out; }
    }
    if (td_tpl_parse(cfg.chat_template, strlen(cfg.chat_template), &t, &err)) {
        td_cli_error("tandem template", &err);
        goto out;
    }
    tpl_chat_args a = {.messages = msgs, .tools = tools, .kwargs = kwargs, .add_generation_prompt = gen,
                       .bos_token = cfg.bos, .eos_token = cfg.eos, .pad_token = cfg.pad, .unk_token = cfg.unk};
    char *out;
    size_t len;
    if (td_tpl_apply_chat(t, &a, &out, &len, &err)) {
        td_cli_error("tandem template", &err);
        goto out;
    }
    fwrite(out, 1, len, stdout);
    free(out);
    rc = 0;
out:
    td_tpl_free(t);
    json_decref(msgs);
    json_decref(tools);
    json_decref(kwargs);
    td_tok_chat_config_free(&cfg);
    return rc;
}
