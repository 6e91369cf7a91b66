/* Sub-commands of the `tandem` binary; each returns the process exit code. */
#ifndef TANDEM_CLI_H
#define TANDEM_CLI_H
int cmd_run(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_kernels(int argc, char **argv);
#endif
