/* Placeholder until the owning issue lands; replaced by the real subcommand. */
#include "autograd/bq.h"
#include "src/cli.h"
int bq_cmd_export_hf(int argc, char **argv) {
    (void)argc;
    return bq_err(BQ_EINVAL, "%s: not implemented yet", argv[0]);
}
