/* tandem: one binary, sub-commands. */
#include <stdio.h>
#include <string.h>
#include "cli/cli.h"

static const struct { const char *name; int (*fn)(int, char **); const char *help; } commands[] = {
    {"run", td_cmd_run, "generate from a prompt, streaming the text"},
    {"serve", td_cmd_serve, "OpenAI-compatible HTTP server"},
    {"inspect", td_cmd_inspect, "parameter counts, dtypes and bytes of a model"},
    {"tokenize", td_cmd_tokenize, "text on stdin -> JSON ids"},
    {"detokenize", td_cmd_detokenize, "JSON ids on stdin -> text"},
    {"template", td_cmd_template, "render the chat template"},
    {"plan", td_cmd_plan, "memory plan: weights, KV cache, whether a window and depth fit"},
    {"bench", td_cmd_bench, "tokens/s per task and MTP depth, acceptance, sanity flags, speedup model"},
    {"kernels", td_cmd_kernels, "kernel speed: bandwidth probe, matmul GB/s per ISA and M, decode/verify/prefill of a model"},
};

static int usage(FILE *f) {
    fprintf(f, "usage: tandem COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) fprintf(f, "  %-11s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n`tandem COMMAND --help` (or -h) for its options, each with its default; without -m DIR a command uses\n"
               "the demo model in models/demo. -v / --verbose: errors with their source location.\n");
    return f == stderr ? 2 : 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage(stderr);
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) return usage(stdout);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "tandem: unknown command \"%s\" (commands: run serve bench plan kernels inspect tokenize detokenize template; tandem --help)\n", argv[1]);
    return 2;
}
