/* serve.c — `tessera serve`: parses the options (config/options.h: defaults, YAML file,
 * flags) and runs the server (server/server.h). Exit status: 0 after a clean shutdown,
 * 1 if the server could not start, 2 for a configuration error. */
#include "cli/cli.h"
#include "config/options.h"
#include "server/server.h"
#include "util/err.h"
#include "util/log.h"

#include <stdio.h>

int cli_serve(int argc, char **argv)
{
    struct server_options o;
    char err[ERR_BUF];
    int rc = opts_parse(argc, argv, &o, err, sizeof err);
    if (rc == 1) {
        opts_free(&o);
        return 0;
    }
    if (rc) {
        fprintf(stderr, "tessera serve: %s\n", err);
        opts_free(&o);
        return 2;
    }
    int level = log_parse_level(o.log_level);
    log_set_level(level < 0 ? LOG_LEVEL_INFO : (enum log_level)level);
    int status = server_run(&o);
    opts_free(&o);
    return status;
}
