/* `bertqat pipeline`: the whole mission with sensible defaults — fp32 fine-tune → calibrate (PTQ)
 * → QAT fine-tune (classification: distilling from the fp32 model unless --no-distill) → ONNX export
 * (fp32 and Q/DQ) → evaluation of every stage on the same test reviews (PTQ and QAT of the cpu scheme on
 * the integer engine and as fake quant) → bench of the QAT model →
 * report (RUN_DIR/report.md with a table, review-by-review agreement, the speed table and training-curve
 * SVGs, and the table on stdout).
 *
 * Each stage runs this same executable as a child process (so each has its own memory, and SIGINT
 * reaches the training child, which saves a resumable checkpoint). Under mpirun (more than one rank; a
 * child of a rank cannot join the job) every rank runs the training, calibration and evaluation stages
 * in process instead, by calling the subcommand's entry function with the same argv, so that they are
 * data-parallel as those commands are under mpirun; the stages that run once (export, the ONNX Runtime
 * scoring, bench, the report, and the evaluations of --task qa, which eval does not shard) run on rank 0
 * alone, as child processes that do not see the launcher's environment, while the other ranks wait.
 * Rank 0 alone reads and writes the stage bookkeeping below and tells the others what to run
 * (docs/distributed.md, "pipeline"). A stage is done when its marker
 * file RUN_DIR/.done-<stage> records the settings it would run with now (stage_run); such stages are
 * skipped unless --force, and a changed setting runs that stage and every later one again. A training
 * stage interrupted with the same settings is resumed with --resume.
 *
 * --task qa runs the same stages for SQuAD v1.1 question answering (src/qa.h): --data is the folder with
 * the training file (train-v1.1.json or train-v1.1-rebuilt.json) and dev-v1.1.json; fp32 fine-tuning
 * creates qa_outputs on the pretrained encoder; every stage is scored by exact match and F1 on the same
 * dev questions (`eval`, and scripts/onnx_eval_qa.py for the exports); there is no bench stage.
 *
 * The ONNX Runtime stages run the helper scripts that bq_cli_script_path finds next to the executable
 * (build tree or install prefix) under the Python of bq_cli_python_path (--python, $BQ_PYTHON, a .venv);
 * both are looked up before the run folder is made (src/cli/cmd_common.h). */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "autograd/bq.h"
#include "autograd/gemm.h"
#include "layers/quant.h"
#include "src/cli/args.h"
#include "src/cli/cli.h"
#include "src/dist.h"
#include "src/cli/cmd_common.h"
#include "src/report.h"

extern char **environ;

typedef struct Pipeline {
    const char *model, *data, *out, *python, *vocab, *bench_batches;
    int budget;      /* --budget: BUDGET_SMALL or BUDGET_FULL */
    BqScheme scheme; /* --scheme */
    char python_path[4200]; /* the Python of the ONNX Runtime stages (bq_cli_python_path); p.python points here */
    char eval_script[4200]; /* onnx_eval.py or onnx_eval_qa.py (bq_cli_script_path), with a Python */
    int force, threads, seed, bench_rounds;
    int grad_accum; /* micro-batches per step of the training stages (passed on when given) */
    int qa;                                /* --task: 0 cls, 1 qa */
    int doc_stride;                        /* --task qa: 128, or half a window's context when that is shorter */
    const char *train_data, *eval_data;    /* the data of the training and evaluation stages */
    char train_path[4096], eval_path[4096]; /* where train_data and eval_data point */
    const char *keep_fp32;  /* --keep-fp32 for the PTQ stage (the QAT stage inherits the list), or NULL */
    double max_drop;        /* with --keep-fp32 auto; < 0: calibrate's default */
    int distill;            /* QAT distils from RUN_DIR/fp32 */
    double distill_alpha, distill_temperature, distill_hidden;
    char ran[64]; /* the first stage that ran in this invocation: every later stage runs as well */
    /* the budget's recipe; < 0 until pipeline_budget fills what the flags left */
    int train_samples, eval_samples, max_seq_len, batch_size, calib_samples;
    double epochs, qat_epochs, lr, qat_lr;
    int qat_ranges;         /* qat --ranges: RANGES_FIXED or RANGES_LEARN */
    double qat_range_lr;    /* qat --range-lr with learn; < 0: the QAT lr */
    char self[4096];
    /* The flag table as parsed (the stages format their arguments from it) and the settings derived
     * from the flags, as a table of the same kind: train-data, eval-data, doc-stride, and threads (the
     * count the parser applied, which --threads 0 leaves to the runtime). */
    BqArgSpec specs[40], derived_specs[4];
    BqArgs args, derived;
} Pipeline;

/* The choices of the pipeline's own enum flags, in the order of their values. */
enum { BUDGET_SMALL, BUDGET_FULL };
static const char *const BUDGET_NAMES[] = {"small", "full", NULL};
static const char *const TASK_NAMES[] = {"cls", "qa", NULL};
enum { RANGES_FIXED, RANGES_LEARN };
static const char *const RANGES_NAMES[] = {"fixed", "learn", NULL};

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static int64_t path_size(const char *p) { /* file, or sum over a directory's regular files */
    struct stat st;
    if (stat(p, &st) != 0) return 0;
    if (!S_ISDIR(st.st_mode)) return (int64_t)st.st_size;
    static const char *parts[] = {"model.h5", "config.json", "vocab.txt"};
    int64_t total = 0;
    char buf[4200];
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        snprintf(buf, sizeof buf, "%s/%s", p, parts[i]);
        if (stat(buf, &st) == 0) total += (int64_t)st.st_size;
    }
    return total;
}

/* Runs argv as a child; stdout to out_path when given. Returns BQ_OK when it exits 0. Under mpirun the
 * child gets the environment without the launcher's variables, so that a bertqat child runs as a single
 * process instead of trying to join the job. */
static int run_child(const char *stage, char **argv, const char *out_path) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    char tmp[4200];
    if (out_path) {
        snprintf(tmp, sizeof tmp, "%s.tmp", out_path);
        posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    }
    fprintf(stderr, "[pipeline] %s:", stage);
    for (char **a = argv; *a; a++) fprintf(stderr, " %s", *a);
    fprintf(stderr, "\n");
    pid_t pid;
    char **env = bq_dist_size() > 1 ? bq_dist_child_env() : NULL;
    int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, env ? env : environ);
    posix_spawn_file_actions_destroy(&fa);
    free(env);
    if (rc != 0) return bq_err(BQ_EIO, "stage %s: cannot start %s: %s", stage, argv[0], strerror(rc));
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) return bq_err(BQ_EIO, "stage %s: waitpid failed: %s", stage, strerror(errno));
    }
    if (WIFSIGNALED(status))
        return bq_err(BQ_EINTR, "stage %s was killed by signal %d; rerun the same command to resume", stage,
                      WTERMSIG(status));
    if (WEXITSTATUS(status) != 0)
        return bq_err(WEXITSTATUS(status) == 6 ? BQ_EINTR : BQ_EIO,
                      "stage %s failed (exit %d, its message is above); rerun the same command to resume", stage,
                      WEXITSTATUS(status));
    if (out_path) return bq_rename_durable(tmp, out_path);
    return BQ_OK;
}

/* argv builder with owned strings */
typedef struct Argv {
    char *v[64];
    int n;
} Argv;

static void av_add(Argv *a, const char *s) {
    BQ_CHECK(a->n < 63);
    a->v[a->n++] = bq_strdup(s);
    a->v[a->n] = NULL;
}

static void av_free(Argv *a) {
    for (int i = 0; i < a->n; i++) free(a->v[i]);
    a->n = 0;
}

/* Under mpirun: the entry function of a stage that every rank runs in process (training, calibration,
 * and the classification evaluation, which shards its examples), or NULL for a stage that runs once, on
 * rank 0 (export, bench, a script, and eval of --task qa, which every rank would compute whole). */
static int (*collective_cmd(const Pipeline *p, const Argv *a))(int, char **) {
    const char *cmd = a->v[1];
    if (strcmp(a->v[0], p->self)) return NULL; /* a Python script */
    if (!strcmp(cmd, "finetune")) return bq_cmd_finetune;
    if (!strcmp(cmd, "calibrate")) return bq_cmd_calibrate;
    if (!strcmp(cmd, "qat")) return bq_cmd_qat;
    if (!strcmp(cmd, "eval") && !p->qa) return bq_cmd_eval;
    return NULL;
}

/* Calls a subcommand's entry function with argv[1..] (argv[1] is its name, as main passes it), stdout to
 * out_path on rank 0 when given (the other ranks print nothing: src/cli/main.c). Every rank calls it. */
static int run_in_process(const char *stage, int (*fn)(int, char **), Argv *a, const char *out_path) {
    char tmp[4200];
    int saved = -1, st = BQ_OK;
    fprintf(stderr, "[pipeline] %s (in process on each of %d MPI ranks):", stage, bq_dist_size());
    for (int i = 1; i < a->n; i++) fprintf(stderr, " %s", a->v[i]);
    fprintf(stderr, "\n");
    fflush(stdout);
    if (out_path && bq_dist_rank() == 0) {
        snprintf(tmp, sizeof tmp, "%s.tmp", out_path);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) return bq_err(BQ_EIO, "stage %s: %s: %s", stage, tmp, strerror(errno));
        saved = dup(STDOUT_FILENO);
        if (saved < 0 || dup2(fd, STDOUT_FILENO) < 0) {
            st = bq_err(BQ_EIO, "stage %s: cannot redirect stdout to %s: %s", stage, tmp, strerror(errno));
            close(fd);
            goto cleanup;
        }
        close(fd);
    }
    bq_err_clear();
    int locks = bq_out_lock_mark();
    if ((st = fn(a->n - 1, a->v + 1))) bq_err_ctx(st, "stage %s", stage);
    bq_out_unlock_to(locks); /* the stage's output lock, as src/cli/main.c releases a command's */

cleanup:
    fflush(stdout);
    if (saved >= 0) {
        dup2(saved, STDOUT_FILENO);
        close(saved);
        if (st) remove(tmp);
        else st = bq_rename_durable(tmp, out_path);
    }
    return st;
}

/* Runs one stage: a child process in a single process; under mpirun in process on every rank or as a
 * child of rank 0 (collective_cmd), then every rank waits for the others, without spinning, so that the
 * next stage finds what rank 0 wrote. A failure on any rank returns here and ends the job in main. */
static int run_stage(const Pipeline *p, const char *stage, Argv *a, const char *out_path) {
    if (bq_dist_size() == 1) return run_child(stage, a->v, out_path);
    int (*fn)(int, char **) = collective_cmd(p, a);
    int st = BQ_OK;
    if (fn) st = run_in_process(stage, fn, a, out_path);
    else if (bq_dist_rank() == 0) st = run_child(stage, a->v, out_path);
    if (st) return st;
    bq_dist_barrier_idle();
    return BQ_OK;
}

/* A stage's settings: {"command": name, "--flag": "value" or true, ...} from argv[from..], where
 * argv[from] is the subcommand or script (its base name is kept). --threads and --resume are left out:
 * they change how fast a stage runs, not what it computes (the thread count is kept in the marker's
 * "argv" and printed by the report). */
static json_t *stage_settings(const Argv *a, int from) {
    json_t *s = json_object();
    const char *cmd = strrchr(a->v[from], '/');
    json_object_set_new(s, "command", json_string(cmd ? cmd + 1 : a->v[from]));
    for (int i = from + 1; i < a->n; i++) {
        if (strncmp(a->v[i], "--", 2)) continue;
        int has_value = i + 1 < a->n && strncmp(a->v[i + 1], "--", 2) != 0;
        if (strcmp(a->v[i], "--threads") && strcmp(a->v[i], "--resume"))
            json_object_set_new(s, a->v[i], has_value ? json_string(a->v[i + 1]) : json_true());
        i += has_value;
    }
    return s;
}

/* "--train-samples 96 -> 80, --cpu-layout added" into buf: the settings that differ between old and new. */
static void settings_diff(json_t *old, json_t *cur, char *buf, size_t n) {
    size_t len = 0;
    buf[0] = '\0';
    const char *k;
    json_t *v;
    json_object_foreach(cur, k, v) {
        json_t *o = json_object_get(old, k);
        if (o && json_equal(o, v)) continue;
        const char *ov = o ? (json_is_string(o) ? json_string_value(o) : "set") : NULL;
        const char *nv = json_is_string(v) ? json_string_value(v) : "set";
        if (len < n)
            len += (size_t)(o ? snprintf(buf + len, n - len, "%s%s %s -> %s", len ? ", " : "", k, ov, nv)
                              : snprintf(buf + len, n - len, "%s%s %s (new)", len ? ", " : "", k, nv));
    }
    json_object_foreach(old, k, v) {
        if (json_object_get(cur, k) || len >= n) continue;
        len += (size_t)snprintf(buf + len, n - len, "%s%s dropped", len ? ", " : "", k);
    }
}

/* Writes a JSON object to path atomically. */
static int write_json(const char *path, json_t *j) {
    char tmp[4400];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    errno = 0;
    if (json_dump_file(j, tmp, JSON_INDENT(1) | JSON_SORT_KEYS)) {
        int st = bq_err(BQ_EIO, "%s: cannot write: %s", tmp, errno ? strerror(errno) : "I/O error");
        remove(tmp);
        return st;
    }
    return bq_rename_durable(tmp, path);
}

/* Stage bookkeeping. When a stage starts, RUN_DIR/.settings-<stage>.json receives its settings
 * (stage_settings); when it succeeds, its marker RUN_DIR/.done-<stage> receives
 * {"settings", "argv", "finished": unix time, "seconds": wall time of that run}. A stage is skipped
 * when its marker holds the settings it would run with now, no earlier stage ran in this invocation
 * and (for an evaluation) its output exists; otherwise its marker is removed and it runs again, and so
 * does every later stage. A training stage without a marker resumes from its training state only when
 * the interrupted run had the same settings and every earlier stage was already done. argv[key_from]
 * is the subcommand or script; out_path, when given, receives the child's stdout. */
static int stage_run(Pipeline *p, const char *stage, Argv *a, int key_from, const char *out_path,
                     const char *resume_state) {
    char marker[4200], started[4200], why[1024] = "";
    snprintf(marker, sizeof marker, "%s/.done-%s", p->out, stage);
    snprintf(started, sizeof started, "%s/.settings-%s.json", p->out, stage);
    json_t *cur = stage_settings(a, key_from), *done = NULL, *prev = NULL, *rec = NULL;
    /* plan[0]: the status of the decision; plan[1]: 0 done already, 1 run, 2 run with --resume. Rank 0
     * decides from the files and tells the other ranks, which touch no bookkeeping file. */
    int st = BQ_OK, plan[2] = {BQ_OK, 1};
    if (bq_dist_rank() == 0) {
        int had_marker = file_exists(marker);
        if (had_marker) {
            done = json_load_file(marker, 0, NULL);
            json_t *old = done ? json_object_get(done, "settings") : NULL;
            if (p->force) snprintf(why, sizeof why, "--force");
            else if (p->ran[0]) snprintf(why, sizeof why, "the earlier stage %s ran again", p->ran);
            else if (!old) snprintf(why, sizeof why, "its marker records no settings");
            else if (!json_equal(old, cur)) settings_diff(old, cur, why, sizeof why);
            else if (out_path && !file_exists(out_path)) snprintf(why, sizeof why, "%.900s is missing", out_path);
            if (!why[0]) {
                fprintf(stderr, "[pipeline] %s: done already with these settings (use --force to redo)\n", stage);
                plan[1] = 0;
            } else {
                fprintf(stderr, "[pipeline] %s: running again (%s)%s\n", stage, why,
                        p->ran[0] || p->force ? "" : "; every later stage runs again too");
                if (remove(marker) != 0) plan[0] = bq_err(BQ_EIO, "%s: cannot remove: %s", marker, strerror(errno));
            }
        }
        if (!plan[0] && plan[1] && resume_state && !had_marker && !p->force && !p->ran[0] &&
            file_exists(resume_state)) {
            prev = json_load_file(started, 0, NULL);
            if (prev && json_equal(prev, cur)) plan[1] = 2;
            else fprintf(stderr, "[pipeline] %s: starting over: the interrupted run had other settings\n", stage);
        }
        if (!plan[0] && plan[1]) plan[0] = write_json(started, cur);
    }
    bq_dist_bcast(plan, sizeof plan, 0);
    if ((st = plan[0])) {
        if (bq_dist_rank() != 0) bq_err(st, "stage %s: rank 0 failed (its message comes from rank 0)", stage);
        goto cleanup;
    }
    if (!plan[1]) goto cleanup;
    if (plan[1] == 2) av_add(a, "--resume");
    double t0 = bq_now();
    if ((st = run_stage(p, stage, a, out_path))) goto cleanup;
    if (!p->ran[0]) snprintf(p->ran, sizeof p->ran, "%s", stage);
    if (bq_dist_rank() != 0) goto cleanup;
    rec = json_object();
    json_object_set(rec, "settings", cur);
    json_t *jargv = json_array();
    for (int i = 0; i < a->n; i++) json_array_append_new(jargv, json_string(a->v[i]));
    json_object_set_new(rec, "argv", jargv);
    json_object_set_new(rec, "finished", json_integer((json_int_t)time(NULL)));
    json_object_set_new(rec, "seconds", json_real(bq_now() - t0));
    if (bq_dist_size() > 1) json_object_set_new(rec, "mpi_ranks", json_integer(bq_dist_size()));
    if ((st = write_json(marker, rec))) goto cleanup;

cleanup:
    json_decref(cur);
    if (done) json_decref(done);
    if (prev) json_decref(prev);
    if (rec) json_decref(rec);
    return st;
}

/* ---- the stages ----
 *
 * The pipeline is the table STAGES below: each stage names the command it runs, its input and output
 * under RUN_DIR, when it applies, and its command line as lists of StageArg. A stage's settings are not
 * written out by hand: an argument's value "@NAME" is the pipeline's own setting NAME, formatted from
 * the pipeline's flag table (bq_args_format) or, for the settings derived from the flags (train-data,
 * eval-data, doc-stride, threads), from the table p->derived, so a stage passes on exactly what the
 * pipeline parsed. */

/* When a stage or an argument applies: every bit set must hold (0: always). */
enum {
    W_CLS = 1 << 0,     /* --task cls */
    W_QA = 1 << 1,      /* --task qa */
    W_CPU = 1 << 2,     /* --scheme cpu */
    W_NOT_CPU = 1 << 3, /* --scheme ort or qdqbert */
    W_PYTHON = 1 << 4,  /* a Python runs the ONNX Runtime stages */
    W_DISTILL = 1 << 5, /* QAT distils from the fp32 stage */
    W_GIVEN = 1 << 6,   /* the pipeline flag "@NAME" of the value was given on the command line */
};

/* One argument of a stage: `flag`, then its value unless the value is NULL (a flag without value). The
 * value is "@NAME" (the pipeline's setting NAME), "$in" (the stage's input), "$out" (its output),
 * "$pred" (its predictions file), "~/PATH" (RUN_DIR/PATH) or a literal. */
typedef struct StageArg {
    const char *flag, *value;
    unsigned when;
} StageArg;

/* A stage: `cmd` is a bertqat subcommand, or "onnx" for the ONNX Runtime evaluation script. in and out
 * are RUN_DIR-relative ("@model": the pretrained model of --model). The marker is RUN_DIR/.done-NAME. */
typedef struct PipeStage {
    const char *name, *cmd, *in, *out;
    unsigned when;
    const char *pred; /* evaluations: predictions into RUN_DIR/pred-PRED.tsv (.json for --task qa) */
    int capture;      /* the command's stdout is its output (eval --json, bench --json) */
    int resume;       /* a training stage, resumable from OUT/training_state.h5 */
    const StageArg *args[4]; /* lists ending with {NULL}; unused entries NULL */
} PipeStage;

static const StageArg A_TRAIN[] = {
    {"--model", "$in", 0}, {"--out", "$out", 0}, {"--data", "@train-data", 0}, {"--train-samples", "@train-samples", 0},
    {"--eval-samples", "@eval-samples", W_CLS}, {"--max-seq-len", "@max-seq-len", 0},
    {"--doc-stride", "@doc-stride", W_QA}, {"--batch-size", "@batch-size", 0}, {"--grad-accum", "@grad-accum", W_GIVEN},
    {"--seed", "@seed", 0}, {"--threads", "@threads", 0}, {"--precision", "@precision", W_GIVEN},
    {"--task", "qa", W_QA}, /* QA trains without validation passes */
    {"--evals-per-epoch", "5", W_CLS}, {NULL, NULL, 0}};
static const StageArg A_FP32[] = {{"--epochs", "@epochs", 0}, {"--lr", "@lr", 0}, {"--logdir", "~/tb/fp32", 0}, {NULL, NULL, 0}};
/* QAT starts from the PTQ checkpoint and keeps its percentile ranges fixed while the weights learn
 * (pytorch-quantization's recipe): on IMDB the moving-average observers started from max calibration
 * lost 4-6 points of validation accuracy against fp32 (docs/training.md, QAT recipe). */
static const StageArg A_QAT[] = {
    {"--epochs", "@qat-epochs", 0}, {"--lr", "@qat-lr", 0}, {"--logdir", "~/tb/qat", 0}, {"--ranges", "@qat-ranges", 0},
    {"--range-lr", "@qat-range-lr", W_GIVEN}, {"--scheme", "@scheme", 0}, {"--teacher", "~/fp32", W_DISTILL},
    {"--distill-alpha", "@distill-alpha", W_DISTILL}, {"--distill-temperature", "@distill-temperature", W_DISTILL},
    {"--distill-hidden", "@distill-hidden", W_DISTILL}, {NULL, NULL, 0}};
static const StageArg A_CALIBRATE[] = {
    {"--model", "$in", 0}, {"--data", "@train-data", 0}, {"--out", "$out", 0}, {"--scheme", "@scheme", 0},
    {"--calibrator", "percentile", 0}, {"--percentile", "99.99", 0}, {"--calib-samples", "@calib-samples", 0},
    {"--max-seq-len", "@max-seq-len", 0}, {"--precision", "@precision", W_GIVEN}, {"--doc-stride", "@doc-stride", W_QA},
    {"--seed", "@seed", 0}, {"--threads", "@threads", 0}, {"--keep-fp32", "@keep-fp32", W_GIVEN},
    {"--max-drop", "@max-drop", W_GIVEN}, {NULL, NULL, 0}};
static const StageArg A_EXPORT[] = {{"--model", "$in", 0}, {"--out", "$out", 0}, {NULL, NULL, 0}};
static const StageArg A_CPU_LAYOUT[] = {{"--cpu-layout", NULL, 0}, {NULL, NULL, 0}};
static const StageArg A_EVAL[] = {
    {"--model", "$in", 0}, {"--threads", "@threads", 0}, {"--precision", "@precision", W_GIVEN}, {NULL, NULL, 0}};
static const StageArg A_FAKE_QUANT[] = {{"--engine", "fake-quant", 0}, {NULL, NULL, 0}};
static const StageArg A_ONNX[] = {{"--onnx", "$in", 0}, {"--tokenizer", "~/fp32", 0}, {"--threads", "@threads", 0}, {NULL, NULL, 0}};
static const StageArg A_EVAL_DATA[] = {
    {"--data", "@eval-data", 0}, {"--split", "test", W_CLS}, {"--samples", "@eval-samples", 0},
    {"--max-seq-len", "@max-seq-len", 0}, {"--doc-stride", "@doc-stride", W_QA}, {"--seed", "@seed", W_CLS},
    {"--predictions", "$pred", 0}, {"--json", NULL, 0}, {NULL, NULL, 0}};
/* bench runs last, so that a change of --bench-rounds or --bench-batch-sizes re-runs only this stage */
static const StageArg A_BENCH[] = {
    {"--model", "$in", 0}, {"--onnx", "~/qat-int8-cpu.onnx", W_PYTHON}, {"--python", "@python", W_PYTHON},
    {"--batch-sizes", "@bench-batch-sizes", 0}, {"--rounds", "@bench-rounds", 0}, {"--threads", "@threads", 0},
    {"--json", NULL, 0}, {NULL, NULL, 0}};

/* The pipeline in order. int8 exports: the CPU layout for ONNX Runtime CPU (integer kernels, exact on
 * CPUs without VNNI), and for the ort/qdqbert schemes also the default layout that the transformer
 * optimizer's QOrdered fusions (CUDA) want. PTQ and QAT are evaluated with eval's default engine (auto:
 * the integer engine where it accepts the checkpoint); for the cpu scheme each is scored once more as
 * fake quant, so the report shows the integer engine against the forward QAT trained, review by
 * review. */
static const PipeStage STAGES[] = {
    {"fp32", "finetune", "@model", "fp32", 0, NULL, 0, 1, {A_TRAIN, A_FP32}},
    {"ptq", "calibrate", "fp32", "ptq", 0, NULL, 0, 0, {A_CALIBRATE}},
    {"qat", "qat", "ptq", "qat", 0, NULL, 0, 1, {A_TRAIN, A_QAT}},
    {"export-fp32", "export", "fp32", "fp32.onnx", 0, NULL, 0, 0, {A_EXPORT}},
    {"export-qat-int8-cpu", "export", "qat", "qat-int8-cpu.onnx", 0, NULL, 0, 0, {A_EXPORT, A_CPU_LAYOUT}},
    {"export-qat-int8", "export", "qat", "qat-int8.onnx", W_NOT_CPU, NULL, 0, 0, {A_EXPORT}},
    {"eval-fp32", "eval", "fp32", "eval-fp32.json", 0, "fp32", 1, 0, {A_EVAL, A_EVAL_DATA}},
    {"eval-ptq", "eval", "ptq", "eval-ptq.json", 0, "ptq", 1, 0, {A_EVAL, A_EVAL_DATA}},
    {"eval-ptq-fake-quant", "eval", "ptq", "eval-ptq-fake-quant.json", W_CPU, "ptq-fake-quant", 1, 0,
     {A_EVAL, A_FAKE_QUANT, A_EVAL_DATA}},
    {"eval-qat", "eval", "qat", "eval-qat.json", 0, "qat", 1, 0, {A_EVAL, A_EVAL_DATA}},
    {"eval-qat-fake-quant", "eval", "qat", "eval-qat-fake-quant.json", W_CPU, "qat-fake-quant", 1, 0,
     {A_EVAL, A_FAKE_QUANT, A_EVAL_DATA}},
    {"eval-onnx-fp32", "onnx", "fp32.onnx", "eval-onnx-fp32.json", W_PYTHON, "onnx-fp32", 1, 0, {A_ONNX, A_EVAL_DATA}},
    {"eval-onnx-int8-cpu", "onnx", "qat-int8-cpu.onnx", "eval-onnx-int8-cpu.json", W_PYTHON, "onnx-int8-cpu", 1, 0,
     {A_ONNX, A_EVAL_DATA}},
    {"eval-onnx-int8", "onnx", "qat-int8.onnx", "eval-onnx-int8.json", W_PYTHON | W_NOT_CPU, "onnx-int8", 1, 0,
     {A_ONNX, A_EVAL_DATA}},
    {"bench", "bench", "qat", "bench.json", W_CLS, NULL, 1, 0, {A_BENCH}},
};
#define NSTAGES ((int)(sizeof STAGES / sizeof STAGES[0]))

/* The conditions that hold for this run (W_* bits, W_GIVEN aside). */
static unsigned pipeline_conditions(const Pipeline *p, int have_python) {
    return (p->qa ? W_QA : W_CLS) | (p->scheme == BQ_SCHEME_CPU ? W_CPU : W_NOT_CPU) | (have_python ? W_PYTHON : 0) |
           (p->distill ? W_DISTILL : 0);
}

/* The predictions file of evaluation `pred`: pred-PRED.tsv, or pred-PRED.json (official SQuAD
 * {id: answer}) for --task qa, into buf (n bytes). */
static const char *pred_name(const Pipeline *p, const char *pred, char *buf, size_t n) {
    snprintf(buf, n, "pred-%s.%s", pred, p->qa ? "json" : "tsv");
    return buf;
}

/* The value of argument v of stage s into buf (n bytes), or NULL when it is a setting with no value. */
static const char *arg_value(const Pipeline *p, const PipeStage *s, const char *v, char *buf, size_t n) {
    char name[96];
    if (v[0] == '@') {
        const BqArgSpec *spec = bq_args_find(&p->derived, v + 1);
        if (!spec) spec = bq_args_find(&p->args, v + 1);
        BQ_CHECK(spec != NULL); /* a StageArg names a setting the pipeline does not have */
        return bq_args_format(spec, buf, n);
    }
    if (!strcmp(v, "$in") && !strcmp(s->in, "@model")) return arg_value(p, s, s->in, buf, n);
    if (!strcmp(v, "$in")) snprintf(buf, n, "%s/%s", p->out, s->in);
    else if (!strcmp(v, "$out")) snprintf(buf, n, "%s/%s", p->out, s->out);
    else if (!strcmp(v, "$pred")) snprintf(buf, n, "%s/%s", p->out, pred_name(p, s->pred, name, sizeof name));
    else if (!strncmp(v, "~/", 2)) snprintf(buf, n, "%s/%s", p->out, v + 2);
    else snprintf(buf, n, "%s", v);
    return buf;
}

/* The command line of stage s under the conditions `cond` into a: this executable and the subcommand,
 * or the Python and the evaluation script, then every argument that applies. */
static void stage_argv(const Pipeline *p, const PipeStage *s, unsigned cond, Argv *a) {
    if (!strcmp(s->cmd, "onnx")) av_add(a, p->python), av_add(a, p->eval_script);
    else av_add(a, p->self), av_add(a, s->cmd);
    for (int l = 0; l < 4 && s->args[l]; l++) {
        for (const StageArg *g = s->args[l]; g->flag; g++) {
            unsigned need = g->when & ~(unsigned)W_GIVEN;
            if ((cond & need) != need) continue;
            if ((g->when & W_GIVEN) && !bq_args_given(&p->args, g->value + 1)) continue;
            char buf[4200];
            const char *v = g->value ? arg_value(p, s, g->value, buf, sizeof buf) : NULL;
            if (g->value && !v) continue;
            av_add(a, g->flag);
            if (v) av_add(a, v);
        }
    }
}

/* Runs stage s through stage_run (skipped when done with the same settings). An evaluation whose
 * predictions file is missing runs again: the predictions are an output as well. */
static int stage_exec(Pipeline *p, const PipeStage *s, unsigned cond) {
    char out[4096], state[4200], marker[4200], pred[4200], name[96];
    snprintf(out, sizeof out, "%s/%s", p->out, s->out);
    snprintf(state, sizeof state, "%s/training_state.h5", out);
    snprintf(marker, sizeof marker, "%s/.done-%s", p->out, s->name);
    if (s->pred) {
        snprintf(pred, sizeof pred, "%s/%s", p->out, pred_name(p, s->pred, name, sizeof name));
        if (bq_dist_rank() == 0 && file_exists(marker) && !file_exists(pred)) {
            fprintf(stderr, "[pipeline] %s: running again (%s is missing)\n", s->name, pred);
            if (remove(marker) != 0) return bq_err(BQ_EIO, "%s: cannot remove: %s", marker, strerror(errno));
        }
    }
    Argv a = {0};
    stage_argv(p, s, cond, &a);
    int st = stage_run(p, s->name, &a, 1, s->capture ? out : NULL, s->resume ? state : NULL);
    av_free(&a);
    return st;
}

/* pred_name for the report's rows: the string lives until the process ends (at most 16 per run). */
static const char *pred_file(const Pipeline *p, const char *name) {
    static char buf[16][96];
    static int k;
    BQ_CHECK(k < 16);
    return pred_name(p, name, buf[k++], sizeof buf[0]);
}

/* Appends row to rows (at most 8) and returns its index, for the same_as of later rows. */
static int row_add(BqReportRow *rows, int *nrows, BqReportRow row) {
    BQ_CHECK(*nrows < 8);
    rows[*nrows] = row;
    return (*nrows)++;
}

/* The recipe of each --budget, for --task cls or qa: the settings a flag left at -1 take these. Only the
 * sample counts, sequence length, batch size and bench rounds differ; every recipe trains 1 fp32 and 1
 * QAT epoch at lr 5e-5 and 2e-5 and calibrates on 128 examples. QA small: about 30 minutes on 2 idle
 * Zen 3 cores for MiniLM (docs/qa.md), batch 16 as the (B, heads, T, T) attention activations grow with
 * T² (MiniLM at batch 32 and T 256 held 6.3 GB); QA full: every question at run_qa.py's 384 tokens and
 * its example's batch size 12. */
typedef struct Recipe {
    int train_samples, eval_samples, max_seq_len, batch_size, bench_rounds;
} Recipe;
static const Recipe RECIPES[2][2] = {/* [qa][budget] */
                                     {{4000, 2000, 128, 32, 5}, {0, 0, 128, 32, 10}},
                                     {{4000, 1000, 256, 16, 5}, {0, 0, 384, 12, 10}}};

/* Fills every budget setting of p still < 0 (not given) from RECIPES[p->qa][p->budget]. */
static void pipeline_budget(Pipeline *p) {
    const Recipe *r = &RECIPES[p->qa][p->budget];
#define FILL(field, value) \
    if (p->field < 0) p->field = (value)
    FILL(train_samples, r->train_samples);
    FILL(eval_samples, r->eval_samples);
    FILL(max_seq_len, r->max_seq_len);
    FILL(batch_size, r->batch_size);
    FILL(bench_rounds, r->bench_rounds);
    FILL(epochs, 1.0);
    FILL(qat_epochs, 1.0);
    FILL(lr, 5e-5);
    FILL(qat_lr, 2e-5);
    FILL(calib_samples, 128);
#undef FILL
}

/* Checks the flags that depend on each other once args is parsed (args, distill_on and distill_off as
 * pipeline_parse filled them): --distill/--no-distill, the distillation and --keep-fp32/--max-drop flags,
 * --qat-ranges/--qat-range-lr, and --precision into *prec; sets p->distill.
 * Returns BQ_OK, or BQ_EINVAL (via bq_err) naming the first flag at fault. */
static int pipeline_check_flags(Pipeline *p, const BqArgs *args, int distill_on, int distill_off,
                                BqPrecision *prec) {
    if (distill_on && distill_off) return bq_err(BQ_EINVAL, "pipeline: --distill and --no-distill exclude each other");
    if (p->qa && (distill_on || p->keep_fp32))
        return bq_err(BQ_EINVAL, "pipeline: --%s applies to --task cls only", distill_on ? "distill" : "keep-fp32");
    /* Classification QAT distils from the fp32 stage unless --no-distill: on the full IMDB recipe (ort
     * scheme, docs/results.md#accuracy-per-scheme-imdb) it ended 0.42 points above the same QAT without a teacher. */
    p->distill = !p->qa && !distill_off;
    static const char *const dflags[3] = {"distill-alpha", "distill-temperature", "distill-hidden"};
    for (int k = 0; k < 3; k++)
        if (!p->distill && bq_args_given(args, dflags[k]))
            return bq_err(BQ_EINVAL, "pipeline: --%s applies only when QAT distils (--task cls without --no-distill)",
                          dflags[k]);
    if (p->distill && !(p->distill_temperature > 0))
        return bq_err(BQ_EINVAL, "pipeline: --distill-temperature must be > 0");
    if (bq_args_given(args, "max-drop") && !(p->keep_fp32 && !strcmp(p->keep_fp32, "auto")))
        return bq_err(BQ_EINVAL, "pipeline: --max-drop applies only with --keep-fp32 auto");
    if (bq_args_given(args, "qat-range-lr") && (p->qat_ranges != RANGES_LEARN || !(p->qat_range_lr > 0)))
        return bq_err(BQ_EINVAL, "pipeline: --qat-range-lr needs --qat-ranges learn and a value > 0");
    *prec = args->prec;
    bq_args_header(args);
    return BQ_OK;
}

/* Parses the command line into p (zeroed by the caller), the budget's settings left at -1 unless given:
 * sets the defaults, parses argv with the table p->specs (kept in p->args for the stages), checks --task
 * and checks the flags that depend on each other (pipeline_check_flags), which also resolves
 * --precision into *prec. *help is set when --help printed the usage, and nothing else is
 * then done. Returns BQ_OK, or the status of the first error (BQ_EINVAL for a bad flag or value). */
static int pipeline_parse(Pipeline *p, int argc, char **argv, BqPrecision *prec, int *help) {
    p->budget = BUDGET_SMALL;
    /* cpu: its int8 export is faster than fp32 on ONNX Runtime CPU (on an AMX Xeon, 2 threads, seq 128:
     * 1.67x at batch 1 and 2.47x at batch 32, where the ort scheme's ran at 0.87x and 0.81x) */
    p->scheme = BQ_SCHEME_CPU;
    p->seed = 42;
    p->grad_accum = 1;
    p->bench_batches = "1,32";
    p->qa = 0;
    p->qat_ranges = RANGES_FIXED;
    p->qat_range_lr = -1;
    p->max_drop = -1;
    p->distill_alpha = 0.5, p->distill_temperature = 2.0, p->distill_hidden = 0.0;
    p->train_samples = p->eval_samples = p->max_seq_len = p->batch_size = p->calib_samples = p->bench_rounds = -1;
    p->epochs = p->qat_epochs = p->lr = p->qat_lr = -1;
    int distill_on = 0, distill_off = 0;
    const BqArgSpec specs[] = {
        {"model", BQ_ARG_STR, &p->model, "pretrained Hugging Face BERT directory", 1, 0, 0},
        {"data", BQ_ARG_STR, &p->data, "IMDB archive or aclImdb folder (or CSV/JSONL); --task qa: the folder with "
         "train-v1.1.json (or train-v1.1-rebuilt.json) and dev-v1.1.json", 1, 0, 0},
        {"task", BQ_ARG_ENUM, &p->qa, "cls (sequence classification) or qa (SQuAD v1.1 question answering: "
         "exact match and F1 per stage, no bench)", 0, 0, 0, TASK_NAMES},
        {"out", BQ_ARG_OUT_MKDIR, &p->out, "run directory (created; stages already done are skipped)", 1, 0, 0},
        {"budget", BQ_ARG_ENUM, &p->budget, "small (a few thousand reviews, seq 128) or full (IMDB recipe)", 0, 0, 0,
         BUDGET_NAMES},
        {"python", BQ_ARG_STR, &p->python, "Python with onnxruntime for the ONNX Runtime stages; none (or a path that "
         "is not executable) skips them " BQ_CLI_PYTHON_HELP, 0, 0, 0},
        {"seed", BQ_ARG_INT, &p->seed, "seed for every stage", 0, 0, 2147483647.0},
        {"force", BQ_ARG_FLAG, &p->force, "redo stages whose outputs exist", 0, 0, 0},
        {"scheme", BQ_ARG_ENUM, BQ_ARG_ENUM_DST(&p->scheme), "quantization scheme of PTQ and QAT: cpu (for ONNX "
         "Runtime CPU), ort (ONNX Runtime QOrdered, CUDA) or qdqbert (TensorRT)", 0, 0, 0, bq_scheme_names},
        /* overrides of the budget's recipe (< 0: the budget's value) */
        {"train-samples", BQ_ARG_INT, &p->train_samples, "training reviews incl. validation (0: all; -1: from --budget)", 0, -1, 1e9},
        {"eval-samples", BQ_ARG_INT, &p->eval_samples, "test reviews evaluated (0: all; -1: from --budget)", 0, -1, 1e9},
        {"max-seq-len", BQ_ARG_INT, &p->max_seq_len, "tokens per review (-1: from --budget)", 0, -1, 8192},
        {"batch-size", BQ_ARG_INT, &p->batch_size, "batch size of the training stages, global under mpirun (each rank "
         "takes its share); with --grad-accum the micro-batch (-1: from --budget)", 0, -1, 65536},
        {"grad-accum", BQ_ARG_INT, &p->grad_accum, "micro-batches per optimizer step of the training stages (1 process "
         "with --batch-size B --grad-accum N computes the steps of N MPI ranks with --batch-size N*B)", 0, 1, 65536},
        {"epochs", BQ_ARG_FLOAT, &p->epochs, "fp32 epochs (-1: from --budget)", 0, -1, 1000},
        {"qat-epochs", BQ_ARG_FLOAT, &p->qat_epochs, "QAT epochs (-1: from --budget)", 0, -1, 1000},
        {"lr", BQ_ARG_FLOAT, &p->lr, "fp32 learning rate (-1: from --budget)", 0, -1, 1},
        {"qat-lr", BQ_ARG_FLOAT, &p->qat_lr, "QAT learning rate (-1: from --budget)", 0, -1, 1},
        {"qat-ranges", BQ_ARG_ENUM, &p->qat_ranges, "QAT ranges: fixed (the PTQ ranges stay) or learn (each scale "
         "trained from its PTQ value, LSQ)", 0, 0, 0, RANGES_NAMES},
        {"qat-range-lr", BQ_ARG_FLOAT, &p->qat_range_lr, "--qat-ranges learn: learning rate of the scales (-1: the QAT "
         "learning rate)", 0, -1, 1},
        {"calib-samples", BQ_ARG_INT, &p->calib_samples, "calibration examples (-1: from --budget)", 0, -1, 1e9},
        {"bench-rounds", BQ_ARG_INT, &p->bench_rounds, "timed forwards per path and batch size of the bench stage (-1: "
         "from --budget: small 5, full 10)", 0, -1, 1000},
        {"bench-batch-sizes", BQ_ARG_STR, &p->bench_batches, "comma-separated batch sizes of the bench stage", 0, 0, 0},
        {"keep-fp32", BQ_ARG_STR, &p->keep_fp32, "NAME,...|auto: modules PTQ leaves in fp32 (calibrate --keep-fp32); "
         "QAT starts from that checkpoint and keeps the list", 0, 0, 0},
        {"max-drop", BQ_ARG_FLOAT, &p->max_drop, "--keep-fp32 auto: accuracy budget in points (-1: calibrate's 0.5)", 0,
         -1, 100},
        {"distill", BQ_ARG_FLAG, &distill_on, "QAT distils from the fp32 stage's model (qat --teacher; the default "
         "of --task cls)", 0, 0, 0},
        {"no-distill", BQ_ARG_FLAG, &distill_off, "QAT without a teacher (cross-entropy only)", 0, 0, 0},
        {"distill-alpha", BQ_ARG_FLOAT, &p->distill_alpha, "distillation: weight of the KL term", 0, 0, 1},
        {"distill-temperature", BQ_ARG_FLOAT, &p->distill_temperature, "distillation: softmax temperature (> 0)", 0, 0,
         1e6},
        {"distill-hidden", BQ_ARG_FLOAT, &p->distill_hidden, "distillation: weight of the hidden-state MSE", 0, 0, 1e6},
    };
    BQ_CHECK(sizeof specs <= sizeof p->specs);
    memcpy(p->specs, specs, sizeof specs);
    BqArgs args = {.cmd = "pipeline", .usage = "--model DIR --data PATH --out RUN_DIR [options]",
                   .summary = "Fine-tune in fp32, calibrate (PTQ, percentile 99.99), QAT fine-tune (classification: "
                              "distilling from the fp32 model), export fp32 and Q/DQ ONNX, evaluate every stage on the "
                              "same test reviews, time the QAT model (bench) and write RUN_DIR/report.md.",
                   .specs = p->specs, .nspecs = (int)(sizeof specs / sizeof specs[0]),
                   .common = BQ_ARGS_THREADS | BQ_ARGS_PRECISION, .threads_help = "threads (0: all CPUs)"};
    p->args = args;
    int st = bq_args_parse(&p->args, argc, argv);
    *help = p->args.help;
    if (st || p->args.help) return st;
    if ((st = pipeline_check_flags(p, &p->args, distill_on, distill_off, prec))) return st;
    return BQ_OK;
}

/* Fills the settings the flags left at -1 from the recipe of --budget (pipeline_budget), checks the
 * resulting settings, that --model holds a config.json and that --data exists, and sets p->doc_stride,
 * p->train_data and p->eval_data (for --task qa the SQuAD files in the --data folder) and the table of
 * these derived settings (p->derived). Returns BQ_OK, BQ_EINVAL for a setting out of range,
 * or BQ_EIO for a missing model or data file. */
static int pipeline_resolve(Pipeline *p) {
    pipeline_budget(p);
    if (!p->bench_batches[0] || strspn(p->bench_batches, "0123456789,") != strlen(p->bench_batches))
        return bq_err(BQ_EINVAL, "pipeline: --bench-batch-sizes '%s' is not a comma-separated list of batch sizes",
                      p->bench_batches);
    if (p->batch_size % bq_dist_size())
        return bq_err(BQ_EINVAL, "pipeline: --batch-size %d: the global batch must be a multiple of the %d MPI ranks",
                      p->batch_size, bq_dist_size());
    if (p->max_seq_len < 8 || p->batch_size < 1 || p->epochs <= 0 || p->qat_epochs <= 0 || p->lr <= 0 || p->qat_lr <= 0 ||
        p->calib_samples < 1 || p->bench_rounds < 1)
        return bq_err(BQ_EINVAL, "pipeline: --max-seq-len >= 8, --batch-size >= 1, --epochs/--qat-epochs/--lr/--qat-lr "
                                 "> 0, --calib-samples >= 1 and --bench-rounds >= 1 are required");
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s/config.json", p->model);
    if (!file_exists(cfg)) return bq_err(BQ_EIO, "pipeline: --model %s: no config.json there", p->model);
    if (!file_exists(p->data)) return bq_err(BQ_EIO, "pipeline: --data %s: no such file or directory", p->data);
    /* a window holds max_seq_len - 3 - (at most 64) question tokens of context; the stride must stay below */
    p->doc_stride = p->max_seq_len - 67 > 2 * 128 ? 128 : (p->max_seq_len - 67) / 2;
    if (p->qa && p->doc_stride < 1)
        return bq_err(BQ_EINVAL, "pipeline: --max-seq-len %d is too short for question answering (>= 70)", p->max_seq_len);
    p->train_data = p->train_path, p->eval_data = p->eval_path;
    snprintf(p->train_path, sizeof p->train_path, "%s", p->data);
    snprintf(p->eval_path, sizeof p->eval_path, "%s", p->data);
    if (p->qa) {
        snprintf(p->train_path, sizeof p->train_path, "%s/train-v1.1.json", p->data);
        if (!file_exists(p->train_path)) snprintf(p->train_path, sizeof p->train_path, "%s/train-v1.1-rebuilt.json", p->data);
        snprintf(p->eval_path, sizeof p->eval_path, "%s/dev-v1.1.json", p->data);
        if (!file_exists(p->train_path) || !file_exists(p->eval_path))
            return bq_err(BQ_EIO, "pipeline: --data %s: --task qa needs a folder with train-v1.1.json (or "
                          "train-v1.1-rebuilt.json) and dev-v1.1.json", p->data);
    }
    const BqArgSpec derived[] = {
        {"train-data", BQ_ARG_STR, &p->train_data, "data of the training and calibration stages", 0, 0, 0},
        {"eval-data", BQ_ARG_STR, &p->eval_data, "data of the evaluation stages", 0, 0, 0},
        {"doc-stride", BQ_ARG_INT, &p->doc_stride, "--task qa: context tokens shared by two windows", 0, 0, 0},
        {"threads", BQ_ARG_INT, &p->threads, "threads of every stage (set by pipeline_start)", 0, 0, 0},
    };
    BQ_CHECK(sizeof derived == sizeof p->derived_specs);
    memcpy(p->derived_specs, derived, sizeof derived);
    p->derived = (BqArgs){.cmd = "pipeline", .specs = p->derived_specs, .nspecs = 4};
    return BQ_OK;
}

/* Finds the Python of the ONNX Runtime stages into p->python (bq_cli_python_path) and, when it is
 * executable (*have_python set), the evaluation script into p->eval_script and, for --task cls, checks
 * that onnx_bench.py is there too. Writes nothing to disk. Returns BQ_OK, or the lookup's error, which
 * names --python, BQ_PYTHON and the venvs, or the folders where the scripts were looked for. */
static int pipeline_find_tools(Pipeline *p, int *have_python) {
    int st;
    /* The ONNX Runtime stages' Python and scripts, found before anything is written (src/cli/cmd_common.h): no
     * Python at all is an error naming where it looked; --python none, or one that is not executable, skips
     * those stages and the report says so; a Python without the scripts is an error naming their folders. */
    if ((st = bq_cli_python_path(p->python, p->python_path, sizeof p->python_path))) return st;
    p->python = p->python_path;
    *have_python = strcmp(p->python, "none") && access(p->python, X_OK) == 0;
    char bench_script[4200];
    if (*have_python && ((st = bq_cli_script_path(p->qa ? "onnx_eval_qa.py" : "onnx_eval.py", p->eval_script,
                                                 sizeof p->eval_script)) ||
                        (!p->qa && (st = bq_cli_script_path("onnx_bench.py", bench_script, sizeof bench_script)))))
        return st; /* the bench stage's own lookup finds the same onnx_bench.py: the same executable runs it */
    return BQ_OK;
}

/* Makes the run folder p->out, exports BQ_PIPELINE_PID so that every stage dies with this process, sets
 * p->self to this executable and p->threads to the runtime's thread count (--threads, applied by the parser), and
 * broadcasts *have_python from rank 0. Returns BQ_OK, or the error of mkdir (BQ_EIO, naming --out),
 * setenv (BQ_ENOMEM) or readlink (BQ_EIO). */
static int pipeline_start(Pipeline *p, int *have_python) {
    int st;
    if ((st = bq_mkdir_p(p->out))) return bq_err_ctx(st, "pipeline: --out");
    /* Every stage started from here dies with this process (src/cli/main.c, follow_pipeline). */
    char pid[32];
    snprintf(pid, sizeof pid, "%ld", (long)getpid());
    if (setenv("BQ_PIPELINE_PID", pid, 1) != 0) return bq_err(BQ_ENOMEM, "pipeline: setenv: %s", strerror(errno));
    ssize_t n = readlink("/proc/self/exe", p->self, sizeof p->self - 1);
    if (n <= 0) return bq_err(BQ_EIO, "pipeline: cannot locate the bertqat executable");
    p->self[n] = '\0';
    p->threads = bq_runtime_threads(); /* the stages' thread count, which the report's runtime line names */
    bq_dist_bcast(have_python, sizeof *have_python, 0); /* rank 0 runs the scripts: its Python decides */
    return BQ_OK;
}

/* Runs the stages of STAGES that apply, in order, each through stage_exec (skipped when done with the
 * same settings). Returns BQ_OK, or the status of the first stage that failed. */
static int pipeline_run_stages(Pipeline *p, int have_python) {
    unsigned cond = pipeline_conditions(p, have_python);
    if (!have_python)
        fprintf(stderr, "[pipeline] --python %s: %s; ONNX Runtime evaluation skipped\n", p->python,
                strcmp(p->python, "none") ? "not an executable" : "none asked for");
    for (int i = 0; i < NSTAGES; i++) {
        if ((cond & STAGES[i].when) != STAGES[i].when) continue;
        int st = stage_exec(p, &STAGES[i], cond);
        if (st) return st;
    }
    return BQ_OK;
}

/* Writes the report's runtime line into runtime (len bytes): the BLAS and thread count (per rank, with
 * the number of MPI ranks, under mpirun) and the precision prec (with the bf16 GEMM in use). */
static void pipeline_runtime(char *runtime, size_t len, BqPrecision prec) {
    snprintf(runtime, len, "%s", bq_runtime_describe());
    if (bq_dist_size() > 1) /* the thread count is per rank */
        snprintf(runtime + strlen(runtime), len - strlen(runtime), " per rank, %d MPI ranks",
                 bq_dist_size());
    snprintf(runtime + strlen(runtime), len - strlen(runtime), "; precision %s%s%s",
             bq_precision_name(prec), prec == BQ_PRECISION_BF16 ? " (" : "",
             prec == BQ_PRECISION_BF16 ? bq_gemm_bf16_describe() : "");
    if (prec == BQ_PRECISION_BF16) snprintf(runtime + strlen(runtime), len - strlen(runtime), ")");
}

/* Writes RUN_DIR/report.md and prints its table (bq_report_write): one row per evaluation of this run
 * (labels naming p->scheme, the ONNX rows with have_python), the size of each row's artifact, the stages as
 * run, the recipe, the runtime line for prec and the wall time since t0. Rank 0 alone calls it. Returns
 * BQ_OK, or the error of bq_report_write. */
static int pipeline_report(const Pipeline *p, BqPrecision prec, int have_python, double t0) {
    BqScheme scheme = p->scheme;
    int cpu_scheme = scheme == BQ_SCHEME_CPU;
    /* Which runtime each export is for: the CPU layout is the ONNX Runtime CPU deployment (integer
     * kernels); the default layout of the ort scheme is what onnxruntime.transformers.optimizer fuses
     * into QOrdered (CUDA) kernels, that of the qdqbert scheme what TensorRT builds int8 engines from.
     * Every export is scored here on ONNX Runtime CPU. */
    const char *default_for = scheme == BQ_SCHEME_QDQBERT ? "TensorRT" : "ONNX Runtime QOrdered (CUDA)";
    char ptq_label[64], qat_label[64], int8_label[128], int8_note[1024];
    snprintf(ptq_label, sizeof ptq_label, "PTQ (%s scheme, percentile 99.99)", bq_scheme_names[p->scheme]);
    snprintf(qat_label, sizeof qat_label, "QAT (%s scheme)", bq_scheme_names[p->scheme]);
    snprintf(int8_label, sizeof int8_label, "ONNX int8 QAT, default layout (for %s; ORT CPU here)", default_for);
    snprintf(int8_note, sizeof int8_note,
             "the layout for %s. ONNX Runtime CPU runs most of its Linears in fp32 behind dequantized weights, and "
             "on x86 CPUs without VNNI its u8×s8 integer kernel saturates 16-bit sums, so on such CPUs its accuracy "
             "can differ from the checkpoint's (README, ONNX export). The CPU layout row is the exact CPU "
             "deployment.", default_for);
    /* rows in table order; same_as indexes this array, so rows are appended with the index of their peer.
     * The fake-quant rows keep their checkpoint's label: the report's engine column tells them apart. */
    BqReportRow rows[8];
    int nrows = 0, r_fp32, r_ptq, r_qat;
#define ROW(label_, json_, artifact_, log_, same_, note_, pred_)                                              \
    row_add(rows, &nrows, (BqReportRow){.label = label_, .eval_json = json_, .artifact = artifact_,            \
                                        .train_log = log_, .same_as = same_, .note = note_, .predictions = pred_})
    r_fp32 = ROW("fp32", "eval-fp32.json", "fp32", "fp32/training_log.jsonl", -1, NULL, pred_file(p, "fp32"));
    r_ptq = ROW(ptq_label, "eval-ptq.json", "ptq", NULL, -1, NULL, pred_file(p, "ptq"));
    if (cpu_scheme) ROW(ptq_label, "eval-ptq-fake-quant.json", "ptq", NULL, r_ptq, NULL, pred_file(p, "ptq-fake-quant"));
    r_qat = ROW(qat_label, "eval-qat.json", "qat", "qat/training_log.jsonl", -1, NULL, pred_file(p, "qat"));
    if (cpu_scheme) ROW(qat_label, "eval-qat-fake-quant.json", "qat", NULL, r_qat, NULL, pred_file(p, "qat-fake-quant"));
    if (have_python) {
        ROW("ONNX fp32 (for ORT CPU)", "eval-onnx-fp32.json", "fp32.onnx", NULL, r_fp32, NULL, pred_file(p, "onnx-fp32"));
        ROW("ONNX int8 QAT, CPU layout (for ORT CPU)", "eval-onnx-int8-cpu.json", "qat-int8-cpu.onnx", NULL, r_qat,
            NULL, pred_file(p, "onnx-int8-cpu"));
        if (!cpu_scheme)
            ROW(int8_label, "eval-onnx-int8.json", "qat-int8.onnx", NULL, r_qat, int8_note, pred_file(p, "onnx-int8"));
    }
#undef ROW
    for (int i = 0; i < nrows; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", p->out, rows[i].artifact);
        rows[i].size_bytes = path_size(path);
    }
    /* the stages of this invocation, in order; the report lists the settings each one ran with */
    const char *stages[NSTAGES];
    int nstages = 0;
    unsigned cond = pipeline_conditions(p, have_python);
    for (int i = 0; i < NSTAGES; i++)
        if ((cond & STAGES[i].when) == STAGES[i].when) stages[nstages++] = STAGES[i].name;
    const char *recipe = p->qa ?
        "fp32 fine-tune of a new qa_outputs head and the encoder on the first training questions (no validation "
        "pass; the last step is kept) → PTQ (percentile 99.99) → QAT from the PTQ model with its ranges fixed → "
        "ONNX export → exact match and F1 of every stage on the same dev questions (official SQuAD v1.1 "
        "scoring); the settings of each stage are listed under \"Stages as run\"" :
        "fp32 fine-tune (10% of the training reviews held out for validation, 5 evaluations per epoch, best "
        "kept) → PTQ (percentile 99.99) → QAT from the PTQ model with its ranges fixed (learned with --qat-ranges "
        "learn) → ONNX export → "
        "evaluation of every stage on the same test reviews → bench of the QAT model; the settings of each "
        "stage are listed under \"Stages as run\"";
    char runtime[800];
    pipeline_runtime(runtime, sizeof runtime, prec);
    BqReportInfo info = {.model = p->model, .data = p->data, .budget = BUDGET_NAMES[p->budget], .seconds = bq_now() - t0,
                         .runtime = runtime, .recipe = recipe, .onnx_skipped = !have_python,
                         .stages = stages, .nstages = nstages, .bench_json = p->qa ? NULL : "bench.json",
                         .qa = p->qa, .fallback_ckpt = p->qa ? NULL : "ptq", .distill_ckpt = p->qa ? NULL : "qat"};
    return bq_report_write(p->out, rows, nrows, &info);
}

int bq_cmd_pipeline(int argc, char **argv) {
    Pipeline *p = bq_calloc(1, sizeof *p); /* the flag tables make it large for the stack */
    BqPrecision prec = BQ_PRECISION_FP32;
    int help = 0, have_python = 0, st;
    if ((st = pipeline_parse(p, argc, argv, &prec, &help)) || help || (st = pipeline_resolve(p)) ||
        (st = pipeline_find_tools(p, &have_python)) || (st = pipeline_start(p, &have_python)))
        goto cleanup;
    double t0 = bq_now();
    if ((st = pipeline_run_stages(p, have_python))) goto cleanup;
    if (bq_dist_rank() == 0) st = pipeline_report(p, prec, have_python, t0); /* the report is rank 0's */

cleanup:
    free(p);
    return st;
}
