/* cli.h — the subcommands of build/tessera. Each takes the arguments after its name
 * (argv[0] is the subcommand name) and returns the process exit status:
 * 0 success, 1 runtime failure, 2 usage error. */
#ifndef TESSERA_CLI_H
#define TESSERA_CLI_H

int cli_generate(int argc, char **argv); /* cli/generate.c: stream a continuation */
int cli_logits(int argc, char **argv);   /* cli/logits.c: dump logits for token ids */
int cli_tokenize(int argc, char **argv); /* cli/tokenize.c: encode/decode text */
int cli_template(int argc, char **argv); /* cli/template.c: render a chat template */
int cli_bench(int argc, char **argv);    /* cli/bench.c: prefill/decode speed vs roofline */
int cli_serve(int argc, char **argv);    /* cli/serve.c: the OpenAI-compatible HTTP server */
int cli_devices(int argc, char **argv);  /* cli/devices.c: CPU and CUDA backends available here */

#endif
