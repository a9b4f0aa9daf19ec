/* main.c — entry point of build/tessera: dispatches to a subcommand (src/cli/). */
#include "cli/cli.h"
#include "version.h"

#include <stdio.h>
#include <string.h>

struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
};

static int cmd_version(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("tessera %s\n", TESSERA_VERSION);
    return 0;
}

static const struct subcommand commands[] = {
    { "serve", cli_serve, "serve the OpenAI-compatible HTTP API (see docs/api.md)" },
    { "generate", cli_generate, "load a model and stream a continuation of a prompt" },
    { "logits", cli_logits, "write the logits of every position of a token sequence (testing)" },
    { "tokenize", cli_tokenize, "encode text to token ids, or decode ids to text" },
    { "template", cli_template, "render a chat template with a JSON context" },
    { "bench", cli_bench, "measure prefill/decode speed against the memory-bandwidth roofline" },
    { "devices", cli_devices, "list the backends (CPU, CUDA GPUs) this binary can use here" },
    { "version", cmd_version, "print the version" },
};

static void usage(FILE *f)
{
    fprintf(f, "usage: tessera <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\nRun 'tessera <command> --help' for a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) return cmd_version(0, NULL);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "tessera: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
