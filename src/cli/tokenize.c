/* tokenize.c — placeholder until the owning module lands; replaced in this same change. */
#include "cli/cli.h"
#include <stdio.h>
int cli_tokenize(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "tokenize: not built yet\n"); return 1; }
