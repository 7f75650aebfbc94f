/* bertqat command-line entry point: boots the runtime (BLAS kernel, threads), dispatches to a
 * subcommand, and is the only place that prints errors and chooses the exit status. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "autograd/bq.h"
#include "autograd/gemm.h"
#include "autograd/infer_kernels.h"
#include "autograd/qgemm.h"
#include "export/h5sum.h"
#include "src/cli/cli.h"
#include "src/dist.h"

typedef struct Command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
    int parallel; /* runs data-parallel under mpirun (docs/distributed.md); the others refuse it */
} Command;

static const Command COMMANDS[] = {
    {"finetune", bq_cmd_finetune, "fine-tune a BERT checkpoint in fp32 for sequence classification", 1},
    {"eval", bq_cmd_eval, "evaluate a fp32, PTQ or QAT checkpoint (accuracy, F1, confusion matrix)", 1},
    {"predict", bq_cmd_predict, "print label and probability for texts (arguments or stdin)", 0},
    {"calibrate", bq_cmd_calibrate, "post-training quantization: calibrate quantizer ranges", 1},
    {"qat", bq_cmd_qat, "quantization-aware fine-tuning with fake-quantized modules", 1},
    {"export", bq_cmd_export, "export a checkpoint to ONNX (fp32, or Q/DQ for quantized checkpoints)", 0},
    {"export-hf", bq_cmd_export_hf, "write a Hugging Face directory (config.json, model.safetensors)", 0},
    {"sensitivity", bq_cmd_sensitivity, "per-group quantization sensitivity: accuracy and KL against fp32", 1},
    {"info", bq_cmd_info, "describe a checkpoint: config, parameters and every quantizer", 0},
    {"pipeline", bq_cmd_pipeline, "fine-tune, calibrate, QAT, export and evaluate, with a report", 1},
    {"bench", bq_cmd_bench, "latency of fp32, fake-quant and int8 forwards (and ONNX Runtime) on this CPU", 0},
    {"tokenize", bq_cmd_tokenize, "print WordPiece ids or tokens of input lines", 0},
    {"data-stats", bq_cmd_data_stats, "counts per split and label, and token-length percentiles", 0},
};
#define NCOMMANDS (int)(sizeof COMMANDS / sizeof COMMANDS[0])

static void usage(FILE *out) {
    fprintf(out, "usage: bertqat <command> [options]   (bertqat <command> --help for its flags)\n\ncommands:\n");
    for (int i = 0; i < NCOMMANDS; i++) fprintf(out, "  %-11s %s\n", COMMANDS[i].name, COMMANDS[i].summary);
    fprintf(out, "\n  --version   print the version, BLAS kernel and thread count\n");
}

/* Exit after a failed command. Under mpirun every rank must stop: rank 0 prints and aborts the job at
 * once; another rank waits 2 s first, so that when the failure is common to all ranks (a bad input
 * file every rank reads) rank 0's abort ends it before it prints, and the message appears once. */
static FILE *g_err; /* the real stderr of an MPI rank other than 0 */

/* The message of the failed command without a leading "CMD: " (the flag parser and some commands name
 * themselves), which the "bertqat CMD: " prefix of fail already says. */
static const char *fail_message(const char *cmd) {
    const char *msg = bq_errmsg();
    size_t n = strlen(cmd);
    return !strncmp(msg, cmd, n) && !strncmp(msg + n, ": ", 2) ? msg + n + 2 : msg;
}

static int fail(const char *cmd, int code) {
    if (bq_dist_size() > 1) {
        if (bq_dist_rank() != 0) sleep(2);
        if (bq_dist_rank() != 0) {
            fprintf(g_err ? g_err : stderr, "bertqat %s: [MPI rank %d] %s\n", cmd, bq_dist_rank(), fail_message(cmd));
            fflush(g_err ? g_err : stderr);
        } else
            fprintf(stderr, "bertqat %s: %s\n", cmd, fail_message(cmd));
        bq_dist_abort(code);
    }
    fprintf(stderr, "bertqat %s: %s\n", cmd, fail_message(cmd));
    return code;
}

/* A stage of `bertqat pipeline` (which puts its pid in BQ_PIPELINE_PID, src/cli/cmd_pipeline.c) dies with
 * the pipeline: a pipeline killed with SIGKILL cannot stop its stage itself, and the stage would go on
 * writing into the run folder and holding its output lock against the rerun. Returns 0 when this
 * process may run: no pipeline above it, or the pipeline is its parent and alive. */
static int follow_pipeline(void) {
    const char *v = getenv("BQ_PIPELINE_PID");
    if (!v) return 0;
    long want = strtol(v, NULL, 10);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || (long)getppid() == want) return 0;
    /* the pipeline ended before the signal was armed (or the variable came from elsewhere) */
    prctl(PR_SET_PDEATHSIG, 0);
    return bq_err(BQ_EINTR, "started as a stage of bertqat pipeline (BQ_PIPELINE_PID=%ld), which is no longer its "
                  "parent", want);
}

int main(int argc, char **argv) {
    int st = bq_runtime_boot(argc, argv);
    if (st) {
        fprintf(stderr, "bertqat: %s\n", bq_errmsg());
        return 1;
    }
    /* A write beyond the file size limit (RLIMIT_FSIZE) fails with EFBIG and is reported like a full
     * disk, one line naming the file, instead of the default action of SIGXFSZ ending the process
     * without a word. */
    signal(SIGXFSZ, SIG_IGN);
    bq_h5_init();
    if ((st = follow_pipeline())) {
        fprintf(stderr, "bertqat: %s\n", bq_errmsg());
        return 1;
    }
    if ((st = bq_dist_init(&argc, &argv))) {
        fprintf(stderr, "bertqat: %s\n", bq_errmsg());
        return 1;
    }
    /* Under mpirun only rank 0 prints (results, progress, warnings); another rank keeps a copy of its
     * stderr for its own failure message (fail()). BQ_DIST_VERBOSE=1 keeps every rank's stderr. */
    if (bq_dist_rank() != 0 && !getenv("BQ_DIST_VERBOSE")) {
        int fd = dup(2);
        if (fd >= 0) g_err = fdopen(fd, "w");
        if (!g_err || !freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr)) {
            fprintf(g_err ? g_err : stderr, "bertqat: cannot silence the output of MPI rank %d\n", bq_dist_rank());
            bq_dist_abort(1);
        }
    }
    if (argc < 2) {
        usage(stderr);
        bq_dist_finalize();
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        bq_dist_finalize();
        return 0;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("bertqat %s\n%s\n", BQ_VERSION_STRING, bq_runtime_describe());
        printf("%s\n", bq_dnnl_describe());
        printf("fused inference kernels: %s\n", bq_infer_describe());
        printf("%s\n", bq_dist_describe());
        printf("%s\n%s\n", bq_cpu_bf16_describe(), bq_gemm_bf16_describe());
        bq_dist_finalize();
        return 0;
    }
    for (int i = 0; i < NCOMMANDS; i++) {
        if (strcmp(cmd, COMMANDS[i].name) != 0) continue;
        if (bq_dist_size() > 1 && !COMMANDS[i].parallel) {
            /* every rank decides alike: rank 0 prints, all leave with the same status, no abort */
            fprintf(stderr, "bertqat %s: runs in one process, not under mpirun (data-parallel: finetune, qat, "
                    "calibrate, eval, sensitivity, pipeline; docs/distributed.md)\n", cmd);
            bq_dist_finalize();
            return 2;
        }
        bq_err_clear();
        st = COMMANDS[i].run(argc - 1, argv + 1);
        bq_out_unlock_to(0); /* the output locks its flags took (src/cli/args.h) */
        /* Results printed to a file (a pipeline stage's stdout is its JSON) must all have reached it. */
        if (!st && (fflush(stdout) != 0 || ferror(stdout)))
            st = bq_err(BQ_EIO, "<stdout>: write failed: %s", errno ? strerror(errno) : "I/O error");
        /* 2: bad flags or arguments; 5: NaN/Inf during training; 6: interrupted, resumable state saved;
         * 1: anything else (files, data, memory) */
        if (st) return fail(cmd, st == BQ_EINVAL ? 2 : st == BQ_ENUMERIC ? 5 : st == BQ_EINTR ? 6 : 1);
        bq_dist_finalize();
        return 0;
    }
    fprintf(stderr, "bertqat: unknown command '%s' (see bertqat --help)\n", cmd);
    bq_dist_finalize();
    return 2;
}
