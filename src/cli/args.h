/* Table-driven command-line flags shared by every subcommand: `--name value` or `--name=value`,
 * typed and range-checked, with --help listing each flag and its default (the destination's value
 * before parsing). Errors name the flag and return BQ_EINVAL.
 *
 * A flag lives in one place: a row of its command's table whose destination is the field the value
 * is for, in the library's own struct where there is one (BqTrainConfig, BqQuantConfig, ...), so no
 * command copies flag values from a CLI struct into a library struct, and the default is whatever the
 * struct's default function (or the command, before parsing) put there. Enum-like flags are parsed
 * here, once, into their enum (BQ_ARG_ENUM); --threads and --precision are declared and applied by the
 * parser itself for the commands that ask for them (BqArgs.common). docs/design.md §11 says how to add
 * a flag. */
#ifndef BQ_ARGS_H
#define BQ_ARGS_H

#include <stdio.h>

#include "autograd/bq.h"

#define BQ_ARGS_MAX 128 /* flags per subcommand, the common ones included */

/* The kinds of flag, with the type of their destination:
 *   BQ_ARG_STR    const char *            any non-empty word
 *   BQ_ARG_INT    int                     an integer, in [min, max] when min < max
 *   BQ_ARG_I64    int64_t                 likewise
 *   BQ_ARG_U64    uint64_t                a non-negative integer, in [min, max] when min < max
 *   BQ_ARG_FLOAT  double                  a finite number, in [min, max] when min < max
 *   BQ_ARG_F32    float                   likewise, stored as float (a library field that is a float)
 *   BQ_ARG_CHARS  char[max]               a non-empty word copied into the fixed buffer of max bytes (a
 *                                         library field that is an array); a longer one is an error
 *   BQ_ARG_FLAG   int                     no value; sets 1
 *   BQ_ARG_OFF    int                     no value; sets 0 (--no-save-best on a field that is 1 by default)
 *   BQ_ARG_ENUM   int or an enum          one of the names `choices` (NULL-terminated); stores the name's
 *                                         index, or values[index] when `values` is set. A name whose value
 *                                         an earlier name already has is an alias: accepted, but left out
 *                                         of --help and of the error, which lists the other names.
 * BQ_ARG_ENUM writes through an int pointer: the destination must be int-sized, as every enum of this
 * code is (values in int range; BQ_ARG_ENUM_DST checks the size at compile time).
 *
 * BQ_ARG_OUT is a string naming an output the command writes (a checkpoint folder, an ONNX file, ...):
 * once the whole line has parsed, bq_args_parse takes the output's lock (bq_out_lock, autograd/bq.h;
 * under mpirun on rank 0 alone, the one rank that writes), and the lock is held until the command
 * returns to src/cli/main.c, which releases it. The output's folder must exist. BQ_ARG_OUT_MKDIR is the
 * same for a command that creates the output's missing parent folders (finetune, pipeline): they are
 * created with the lock. */
typedef enum BqArgKind {
    BQ_ARG_STR,
    BQ_ARG_INT,
    BQ_ARG_FLOAT,
    BQ_ARG_FLAG,
    BQ_ARG_OUT,
    BQ_ARG_OUT_MKDIR,
    BQ_ARG_I64,
    BQ_ARG_U64,
    BQ_ARG_OFF,
    BQ_ARG_ENUM,
    BQ_ARG_F32,
    BQ_ARG_CHARS,
} BqArgKind;

/* The destination of a BQ_ARG_ENUM row, with a compile-time check that *p is int-sized. */
#define BQ_ARG_ENUM_DST(p) ((void *)((p) + 0 * sizeof(char[sizeof *(p) == sizeof(int) ? 1 : -1])))

typedef struct BqArgSpec {
    const char *name;  /* without the leading "--" */
    BqArgKind kind;
    void *dst;         /* see BqArgKind */
    const char *help;
    int required;
    double min, max;   /* inclusive range for INT/I64/U64/FLOAT/F32 when min < max; CHARS: max = buffer bytes */
    const char *const *choices; /* BQ_ARG_ENUM: the names, NULL-terminated */
    const int *values;          /* BQ_ARG_ENUM: the value of each name; NULL: its index */
} BqArgSpec;

/* Flags the parser declares and applies itself, for the commands that set them in BqArgs.common; each
 * is listed by --help after the command's own:
 *   BQ_ARGS_THREADS    --threads N (0: all cores, or $BQ_THREADS): once the line has parsed,
 *                      bq_runtime_set_threads(N), the one call for the process; the command reads
 *                      bq_runtime_threads().
 *   BQ_ARGS_PRECISION  --precision fp32|bf16|auto (not given: $BQ_PRECISION when set, else auto): once
 *                      the line has parsed, resolved on this CPU (bq_precision_resolve, autograd/bq.h)
 *                      into BqArgs.prec, the one resolution of the command; bq_args_header prints it. */
#define BQ_ARGS_THREADS 1u
#define BQ_ARGS_PRECISION 2u

typedef struct BqArgs {
    const char *cmd;        /* subcommand name, for messages */
    const char *usage;      /* e.g. "--model DIR --data PATH [options]" */
    const char *summary;    /* one sentence */
    const BqArgSpec *specs;
    int nspecs;
    int max_positional;     /* 0: positional arguments are an error */
    const char *positional_name;
    unsigned common;        /* BQ_ARGS_THREADS | BQ_ARGS_PRECISION: the parser's own flags this command takes */
    const char *threads_help; /* --help text of --threads; NULL: "threads (0: all cores)" */
    char **positional;      /* filled by bq_args_parse: argv + 1, whose first npositional entries it
                             * rewrites to the positional arguments in order (nothing to free) */
    int npositional;
    int help;               /* set when --help/-h was given; usage already printed to stdout */
    BqPrecision prec;       /* BQ_ARGS_PRECISION: --precision resolved on this CPU */
    const char *prec_why;   /* and why, for the header (bq_precision_resolve's reason) */
    int prec_env;           /* the value came from $BQ_PRECISION, not from the line or the default */
    /* The parser's own state: the common flags' rows and values, and which rows were on the line. */
    BqArgSpec common_specs[2];
    int ncommon;
    int threads, precision;
    unsigned char given[BQ_ARGS_MAX]; /* given[i] when row i (the command's, then the common ones) was on the line */
} BqArgs;

/* argv[0] is the subcommand name. Reorders argv[1..] when there are positional arguments. A refused
 * output lock is an error too (BQ_EIO). */
int bq_args_parse(BqArgs *a, int argc, char **argv);
void bq_args_usage(BqArgs *a, FILE *out);
/* The run header of the common flags on stderr: "[cmd] precision: NAME (why)", and the bf16 GEMM in use
 * when it is bf16; nothing without BQ_ARGS_PRECISION. A command calls it once, when its own checks of
 * the flags have passed, so that a refused flag stays the one line on stderr. */
void bq_args_header(const BqArgs *a);
/* 1 when the flag `name` (without "--") was given on the line bq_args_parse read; the flag must be one
 * of the command's (BQ_CHECK). */
int bq_args_given(const BqArgs *a, const char *name);
/* The name that BQ_ARG_ENUM flag `name` holds now (its default before parsing), or NULL when its value
 * is none of the choices'; the flag must be one of the command's and an enum (BQ_CHECK). */
const char *bq_args_choice(const BqArgs *a, const char *name);
/* The row named `name` (without "--"): the command's or a common flag's; NULL when there is none. */
const BqArgSpec *bq_args_find(const BqArgs *a, const char *name);
/* The current value of s's destination as the parser reads it back ("%d" for INT; for FLOAT the
 * shortest "%g" form that parses to the same double; the string for STR/OUT, NULL unset), into buf (n
 * bytes); a FLAG gives "" when set and NULL when not.
 * Returns buf, or NULL when there is no value to write. A command that runs another (the pipeline
 * runs each stage as a subcommand) writes the other's flags from its own table with it. */
const char *bq_args_format(const BqArgSpec *s, char *buf, size_t n);

#endif
