/* Table-driven command-line flags shared by every subcommand: `--name value` or `--name=value`,
 * typed and range-checked, with --help listing each flag and its default (the destination's value
 * before parsing). Errors name the flag and return BQ_EINVAL. */
#ifndef BQ_ARGS_H
#define BQ_ARGS_H

#include <stdio.h>

#define BQ_ARGS_MAX 128 /* flags per subcommand */

/* BQ_ARG_OUT is a string naming an output the command writes (a checkpoint folder, an ONNX file, ...):
 * once the whole line has parsed, bq_args_parse takes the output's lock (bq_out_lock, autograd/bq.h;
 * under mpirun on rank 0 alone, the one rank that writes), and the lock is held until the command
 * returns to src/cli/main.c, which releases it. The output's folder must exist. BQ_ARG_OUT_MKDIR is the
 * same for a command that creates the output's missing parent folders (finetune, pipeline): they are
 * created with the lock. */
typedef enum BqArgKind { BQ_ARG_STR, BQ_ARG_INT, BQ_ARG_FLOAT, BQ_ARG_FLAG, BQ_ARG_OUT, BQ_ARG_OUT_MKDIR } BqArgKind;

typedef struct BqArgSpec {
    const char *name;  /* without the leading "--" */
    BqArgKind kind;
    void *dst;         /* const char ** (STR, OUT, OUT_MKDIR), int *, double *, int * (flag set to 1) */
    const char *help;
    int required;
    double min, max;   /* inclusive range for INT/FLOAT when min < max */
} BqArgSpec;

typedef struct BqArgs {
    const char *cmd;        /* subcommand name, for messages */
    const char *usage;      /* e.g. "--model DIR --data PATH [options]" */
    const char *summary;    /* one sentence */
    const BqArgSpec *specs;
    int nspecs;
    int max_positional;     /* 0: positional arguments are an error */
    const char *positional_name;
    char **positional;      /* filled by bq_args_parse: argv + 1, whose first npositional entries it
                             * rewrites to the positional arguments in order (nothing to free) */
    int npositional;
    int help;               /* set when --help/-h was given; usage already printed to stdout */
    unsigned char given[BQ_ARGS_MAX]; /* filled by bq_args_parse: given[i] when specs[i] was on the line */
} BqArgs;

/* argv[0] is the subcommand name. Reorders argv[1..] when there are positional arguments. A refused
 * output lock is an error too (BQ_EIO). */
int bq_args_parse(BqArgs *a, int argc, char **argv);
void bq_args_usage(const BqArgs *a, FILE *out);
/* 1 when the flag `name` (without "--") was given on the line bq_args_parse read. */
int bq_args_given(const BqArgs *a, const char *name);
/* The spec named `name` (without "--") in a's table, or NULL. */
const BqArgSpec *bq_args_find(const BqArgs *a, const char *name);
/* The current value of s's destination as the parser reads it back ("%d" for INT; for FLOAT the
 * shortest "%g" form that parses to the same double; the string for STR/OUT, NULL unset), into buf (n
 * bytes); a FLAG gives "" when set and NULL when not.
 * Returns buf, or NULL when there is no value to write. A command that runs another (the pipeline
 * runs each stage as a subcommand) writes the other's flags from its own table with it. */
const char *bq_args_format(const BqArgSpec *s, char *buf, size_t n);

#endif
