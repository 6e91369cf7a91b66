/* `tandem tokenize | detokenize | template`: thin wrappers over
 * src/tokenizer and src/template, used by the golden tests. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
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

static int usage(const char *cmd) {
    if (!strcmp(cmd, "template"))
        fprintf(stderr, "usage: tandem template -m DIR --messages FILE [--tools FILE] [--no-generation-prompt] [--kwargs JSON]\n");
    else
        fprintf(stderr, "usage: tandem %s -m DIR < input\n", cmd);
    return 2;
}

/* -m DIR is the only option of tokenize / detokenize */
static const char *model_dir(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) return argv[i + 1];
    return NULL;
}

int cmd_tokenize(int argc, char **argv) {
    const char *dir = model_dir(argc, argv);
    if (!dir) return usage("tokenize");
    td_err err = {0};
    tokenizer *t;
    if (tok_load(dir, &t, &err)) { fprintf(stderr, "tandem tokenize: %s\n", err.msg); return 1; }
    size_t n;
    char *text = slurp(stdin, &n);
    int32_t *ids = NULL;
    size_t nid = 0;
    if (!text || tok_encode(t, text, n, true, &ids, &nid, &err)) {
        fprintf(stderr, "tandem tokenize: %s\n", text ? err.msg : "out of memory");
        free(text);
        tok_free(t);
        return 1;
    }
    fputc('[', stdout);
    for (size_t i = 0; i < nid; i++) printf(i ? ", %d" : "%d", ids[i]);
    fputs("]\n", stdout);
    free(ids);
    free(text);
    tok_free(t);
    return 0;
}

int cmd_detokenize(int argc, char **argv) {
    const char *dir = model_dir(argc, argv);
    if (!dir) return usage("detokenize");
    td_err err = {0};
    json_error_t je;
    json_t *arr = json_loadf(stdin, 0, &je);
    if (!json_is_array(arr)) {
        fprintf(stderr, "tandem detokenize: stdin must be a JSON array of ids (%s)\n", arr ? "not an array" : je.text);
        json_decref(arr);
        return 1;
    }
    tokenizer *t;
    if (tok_load(dir, &t, &err)) { fprintf(stderr, "tandem detokenize: %s\n", err.msg); json_decref(arr); return 1; }
    size_t n = json_array_size(arr);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    int rc = 1;
    if (ids) {
        for (size_t i = 0; i < n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(arr, i));
        char *out;
        size_t len;
        if (tok_decode(t, ids, n, false, &out, &len, &err) == 0) {
            fwrite(out, 1, len, stdout);
            free(out);
            rc = 0;
        } else {
            fprintf(stderr, "tandem detokenize: %s\n", err.msg);
        }
    }
    free(ids);
    tok_free(t);
    json_decref(arr);
    return rc;
}

static json_t *load_json_file(const char *path, const char *what) {
    json_error_t je;
    json_t *j = !strcmp(path, "-") ? json_loadf(stdin, 0, &je) : json_load_file(path, 0, &je);
    if (!j) fprintf(stderr, "tandem template: %s %s: line %d: %s\n", what, path, je.line, je.text);
    return j;
}

int cmd_template(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"messages", required_argument, 0, 'M'},
        {"tools", required_argument, 0, 'T'}, {"no-generation-prompt", no_argument, 0, 'N'},
        {"kwargs", required_argument, 0, 'K'}, {0, 0, 0, 0}};
    const char *dir = NULL, *mfile = NULL, *tfile = NULL, *kw = NULL;
    bool gen = true;
    optind = 1;
    int o;
    while ((o = getopt_long(argc, argv, "m:", opts, NULL)) != -1) {
        switch (o) {
        case 'm': dir = optarg; break;
        case 'M': mfile = optarg; break;
        case 'T': tfile = optarg; break;
        case 'N': gen = false; break;
        case 'K': kw = optarg; break;
        default: return usage("template");
        }
    }
    if (!dir || !mfile) return usage("template");
    td_err err = {0};
    tok_chat_config cfg;
    int rc = 1;
    json_t *msgs = NULL, *tools = NULL, *kwargs = NULL;
    tpl *t = NULL;
    if (tok_chat_config_load(dir, &cfg, &err)) { fprintf(stderr, "tandem template: %s\n", err.msg); return 1; }
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
    if (tpl_parse(cfg.chat_template, strlen(cfg.chat_template), &t, &err)) {
        fprintf(stderr, "tandem template: %s\n", err.msg);
        goto out;
    }
    tpl_chat_args a = {.messages = msgs, .tools = tools, .kwargs = kwargs, .add_generation_prompt = gen,
                       .bos_token = cfg.bos, .eos_token = cfg.eos, .pad_token = cfg.pad, .unk_token = cfg.unk};
    char *out;
    size_t len;
    if (tpl_apply_chat(t, &a, &out, &len, &err)) {
        fprintf(stderr, "tandem template: %s\n", err.msg);
        goto out;
    }
    fwrite(out, 1, len, stdout);
    free(out);
    rc = 0;
out:
    tpl_free(t);
    json_decref(msgs);
    json_decref(tools);
    json_decref(kwargs);
    tok_chat_config_free(&cfg);
    return rc;
}
