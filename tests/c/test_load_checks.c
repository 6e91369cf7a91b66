/* Model files that used to be accepted silently or hang the loader (issue
 * 16): a FIFO in place of any model file (the loader blocked forever), an
 * added-token id of 99,999,999 (a 100M-entry vocabulary), two vocabulary
 * tokens with one id, bos_token_id outside the vocabulary. Each is one
 * error, quickly; an alarm turns a hang into a failure. */
#include <jansson.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "engine/engine.h"
#include "tokenizer/tokenizer.h"

#define MM "tests/golden/mm-a/bf16"
static char g_tmp[64];

static void on_alarm(int sig) {
    (void)sig;
    static const char m[] = "FAIL: the loader hung (alarm)\n";
    if (write(2, m, sizeof m - 1) < 0) _exit(3);
    _exit(2);
}

static void fresh_copy(char *dir, size_t cap, const char *name) {
    snprintf(dir, cap, "%s/%s", g_tmp, name);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", dir, MM, dir);
    CHECK(system(cmd) == 0, "%s", cmd);
}

static void expect_engine_refused(const char *what, const char *dir, const char *need) {
    td_engine_opts o = {.n_threads = 1};
    td_engine *e = NULL;
    td_err err = {0};
    alarm(20);
    int rc = td_engine_load(dir, &o, &e, &err);
    alarm(0);
    CHECK(rc < 0 && !e, "%s: loaded", what);
    CHECK(strstr(err.msg, need) != NULL, "%s: message lacks \"%s\": %s", what, need, err.msg);
    if (e) td_engine_free(e);
}

static void expect_tok_refused(const char *what, const char *dir, const char *need) {
    tokenizer *t = NULL;
    td_err err = {0};
    alarm(20);
    int rc = td_tok_load(dir, &t, &err);
    alarm(0);
    CHECK(rc < 0 && !t, "%s: tokenizer loaded", what);
    CHECK(strstr(err.msg, need) != NULL, "%s: message lacks \"%s\": %s", what, need, err.msg);
    if (t) td_tok_free(t);
}

static void fifo_instead_of(const char *file, bool tokenizer_side) {
    char dir[256], p[512];
    fresh_copy(dir, sizeof dir, "fifo");
    snprintf(p, sizeof p, "%s/%s", dir, file);
    unlink(p);
    CHECK(mkfifo(p, 0600) == 0, "mkfifo %s", p);
    if (tokenizer_side) expect_tok_refused(file, dir, "not a regular file");
    else expect_engine_refused(file, dir, "not a regular file");
}

/* Rewrites tokenizer.json through fn. */
static void edit_tokenizer(const char *dir, void (*fn)(json_t *root)) {
    char p[512];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    json_t *root = json_load_file(p, 0, NULL);
    CHECK(root != NULL, "read %s", p);
    if (!root) return;
    fn(root);
    json_dump_file(root, p, 0);
    json_decref(root);
}
static void huge_added_id(json_t *root) {
    json_t *a = json_array_get(json_object_get(root, "added_tokens"), 0);
    json_object_set_new(a, "id", json_integer(99999999));
}
static void duplicate_id(json_t *root) {
    json_t *v = json_object_get(json_object_get(root, "model"), "vocab");
    json_int_t id = json_integer_value(json_object_get(v, "a"));
    json_object_set_new(v, "zzzz-duplicate", json_integer(id));
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/tandem-loadchk-XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    signal(SIGALRM, on_alarm);
    fifo_instead_of("model-00003-of-00007.safetensors", false);
    fifo_instead_of("model.safetensors.index.json", false);
    fifo_instead_of("config.json", false);
    fifo_instead_of("generation_config.json", false);
    fifo_instead_of("tokenizer.json", true);
    fifo_instead_of("tokenizer_config.json", true);

    char dir[256];
    fresh_copy(dir, sizeof dir, "added");
    edit_tokenizer(dir, huge_added_id);
    expect_tok_refused("added-token id 99,999,999", dir, "added_tokens[0]");
    fresh_copy(dir, sizeof dir, "dup");
    edit_tokenizer(dir, duplicate_id);
    expect_tok_refused("two tokens with one id", dir, "given to two tokens");

    fresh_copy(dir, sizeof dir, "bos");
    {
        char p[512];
        snprintf(p, sizeof p, "%s/config.json", dir);
        json_t *root = json_load_file(p, 0, NULL);
        json_object_set_new(json_object_get(root, "text_config"), "bos_token_id", json_integer(300));
        json_dump_file(root, p, 0);
        json_decref(root);
    }
    expect_engine_refused("bos_token_id 300 of 300", dir, "bos_token_id");

    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", g_tmp);
    TEST_MAIN_END("load_checks");
}
