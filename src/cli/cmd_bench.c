/* `bertqat bench`: forward latency of one quantized checkpoint on this CPU, as its float forward (its float
 * weights with the quantizers detached, in the run's --precision: the path `--paths fp32`, printed under
 * the precision's name, so "bf16" where auto chose bf16), fake quant and the integer engine
 * (layers/bert_int8.h), and of an ONNX file in ONNX Runtime (scripts/onnx_bench.py in a child Python) at
 * the same batch sizes and length; ends with one sentence saying whether int8 pays off here (a speed-up of
 * at least 1.1x over the float forward at every batch size measured). */
#include <errno.h>
#include <jansson.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "autograd/bq.h"
#include "autograd/infer_kernels.h"
#include "autograd/qgemm.h"
#include "layers/bert_int8.h"
#include "src/cli/args.h"
#include "src/cli/cli.h"
#include "src/cli/cmd_common.h"

extern char **environ;

#define MAX_BATCHES 16
#define MAX_ROUNDS 1000
#define PAYS_OFF 1.1 /* int8 speed-up over fp32 that counts as paying off */

enum { P_FP32, P_FAKE, P_INT8, P_ORT, NPATHS };
static const char *const PATH_NAMES[NPATHS] = {"fp32", "fake-quant", "int8", "onnxruntime"};

/* The name path p is printed under in the table and the verdict: the float path (P_FP32) runs in the run's
 * precision prec and is named after it; the others by PATH_NAMES, which are also the words of --paths and
 * the keys of --json. */
static const char *path_label(int p, BqPrecision prec) {
    return p == P_FP32 ? bq_precision_name(prec) : PATH_NAMES[p];
}

/* "1,32" into at most MAX_BATCHES sizes in [1, 4096]. */
static int parse_batches(const char *s, int *out, int *n) {
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 1 || v > 4096 || (*end && *end != ',') || *n == MAX_BATCHES)
            return bq_err(BQ_EINVAL, "--batch-sizes: '%s' is not a comma-separated list of at most %d sizes in "
                          "[1, 4096]", s, MAX_BATCHES);
        out[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (!*n) return bq_err(BQ_EINVAL, "--batch-sizes: empty");
    return BQ_OK;
}

/* "fp32,int8" into a bit mask over P_FP32..P_INT8. */
static int parse_paths(const char *s, unsigned *mask) {
    *mask = 0;
    const char *p = s;
    while (*p) {
        size_t len = strcspn(p, ",");
        int found = 0;
        for (int i = P_FP32; i <= P_INT8; i++)
            if (strlen(PATH_NAMES[i]) == len && strncmp(p, PATH_NAMES[i], len) == 0) *mask |= 1u << i, found = 1;
        if (!found) return bq_err(BQ_EINVAL, "--paths: '%s' is not a comma-separated list of fp32, fake-quant, int8", s);
        p += len;
        if (*p) p++;
    }
    if (!*mask) return bq_err(BQ_EINVAL, "--paths: empty");
    return BQ_OK;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Process CPU time in seconds (all threads). */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *const CLOCK_NAMES[] = {"wall", "cpu", NULL};
static int g_cpu_clock; /* --clock: 0 wall, 1 cpu (an index into CLOCK_NAMES) */

/* OMP_WAIT_POLICY as libgomp read it at start: idle threads spin (active, the default) or sleep
 * (passive), which decides the latency on a machine whose cores other jobs also use. */
static const char *wait_policy(void) {
    const char *w = getenv("OMP_WAIT_POLICY");
    return w && *w ? w : "default (spin, then sleep)";
}

/* One forward of path p (fp32: m->quant detached for the call). Seconds in *dt: wall time, or process
 * CPU time with --clock cpu. */
static int run_path(int p, BqBert *m, BqInt8Engine *e, BqArena *act, const BqBertInput *in, double *dt) {
    struct BqQuantState *qs = m->quant;
    if (p == P_FP32) m->quant = NULL;
    BqCtx ctx = {.act = act, .tape = NULL, .training = 0, .prec = m->prec};
    BqTensor *lg = NULL;
    double t0 = g_cpu_clock ? cpu_now() : bq_now();
    int st = p == P_INT8 ? bq_int8_forward(e, m, &ctx, in, &lg) : bq_bert_forward(m, &ctx, in, &lg, NULL);
    *dt = (g_cpu_clock ? cpu_now() : bq_now()) - t0;
    m->quant = qs;
    bq_arena_rewind(act, 0);
    return st;
}

/* Median milliseconds of fp32, fake quant and (e set) int8 at batch B after one warm-up round; the
 * paths alternate within each round so that a change of machine load affects them alike. */
static int time_batch(BqBert *m, BqInt8Engine *e, BqArena *act, int B, int T, int rounds, unsigned paths,
                      BqRng *rng, double med[NPATHS]) {
    int32_t *ids = bq_malloc(sizeof(int32_t) * (size_t)B * (size_t)T);
    float *mask = bq_malloc(sizeof(float) * (size_t)B * (size_t)T);
    double *t = bq_malloc(sizeof(double) * (size_t)rounds * NPATHS);
    int V = m->cfg.vocab_size, lo = V > 2000 ? 1000 : 0, st = BQ_OK;
    for (int64_t i = 0; i < (int64_t)B * T; i++) {
        ids[i] = i % T == 0 && V > 101 ? 101 : lo + (int32_t)bq_rng_below(rng, (uint64_t)(V - lo));
        mask[i] = 1.0f;
    }
    BqBertInput in = {.B = B, .T = T, .input_ids = ids, .attention_mask = mask};
    for (int r = -1; r < rounds && !st; r++)
        for (int p = P_FP32; p <= P_INT8 && !st; p++) {
            if ((p == P_INT8 && !e) || !(paths >> p & 1)) continue;
            double dt;
            st = run_path(p, m, e, act, &in, &dt);
            if (r >= 0) t[p * rounds + r] = dt;
        }
    for (int p = P_FP32; p <= P_INT8 && !st; p++) {
        if ((p == P_INT8 && !e) || !(paths >> p & 1)) continue;
        qsort(t + p * rounds, (size_t)rounds, sizeof *t, cmp_d);
        med[p] = rounds % 2 ? t[p * rounds + rounds / 2] * 1e3
                            : 0.5 * (t[p * rounds + rounds / 2 - 1] + t[p * rounds + rounds / 2]) * 1e3;
    }
    free(ids);
    free(mask);
    free(t);
    return st;
}

/* Runs `script` (onnx_bench.py, found by bq_cli_script_path) under `python` and reads its JSON into ort[i]
 * (ms per batch bs[i]) and *version. Errors name --onnx or --python. */
static int time_onnx(const char *python, const char *script, const char *onnx, const int *bs, int nb, int T,
                     int threads, int rounds, int vocab, double *ort, char *version, size_t vlen) {
    char batches[256] = "", seq[32], thr[32], rnd[32], voc[32];
    for (int i = 0; i < nb; i++)
        snprintf(batches + strlen(batches), sizeof batches - strlen(batches), "%s%d", i ? "," : "", bs[i]);
    snprintf(seq, sizeof seq, "%d", T);
    snprintf(thr, sizeof thr, "%d", threads);
    snprintf(rnd, sizeof rnd, "%d", rounds);
    snprintf(voc, sizeof voc, "%d", vocab);
    char *argv[] = {(char *)python, (char *)script, "--onnx", (char *)onnx, "--batch-sizes", batches, "--seq", seq,
                    "--threads", thr, "--rounds", rnd, "--vocab", voc, NULL};
    int fd[2];
    if (pipe(fd)) return bq_err(BQ_EIO, "--onnx: pipe: %s", strerror(errno));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&fa, fd[0]);
    pid_t pid;
    int rc = posix_spawnp(&pid, python, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fd[1]);
    if (rc) {
        close(fd[0]);
        return bq_err(BQ_EINVAL, "--python %s: cannot start: %s", python, strerror(rc));
    }
    size_t len = 0, cap = 4096;
    char *out = bq_malloc(cap);
    ssize_t k;
    while ((k = read(fd[0], out + len, cap - len - 1)) != 0) {
        if (k < 0) {
            if (errno == EINTR) continue;
            break;
        }
        len += (size_t)k;
        if (cap - len < 2) out = bq_realloc(out, cap *= 2);
    }
    out[len] = 0;
    close(fd[0]);
    int status = 0, st = BQ_OK;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    json_t *j = NULL;
    if (!WIFEXITED(status) || WEXITSTATUS(status)) {
        st = bq_err(BQ_EIO, "--onnx %s: %s %s failed (exit %d; its message is above)", onnx, python, script,
                    WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        goto cleanup;
    }
    json_error_t je;
    json_t *res;
    if (!(j = json_loads(out, 0, &je)) || !json_is_array(res = json_object_get(j, "results")) ||
        (int)json_array_size(res) != nb) {
        st = bq_err(BQ_EFORMAT, "--onnx %s: unexpected output of %s", onnx, script);
        goto cleanup;
    }
    for (int i = 0; i < nb; i++)
        ort[i] = json_number_value(json_object_get(json_array_get(res, (size_t)i), g_cpu_clock ? "cpu_median_ms" : "median_ms"));
    snprintf(version, vlen, "%s", json_string_value(json_object_get(j, "onnxruntime")) ?
             json_string_value(json_object_get(j, "onnxruntime")) : "?");

cleanup:
    if (j) json_decref(j);
    free(out);
    return st;
}

/* The settings of one bench run, as bench_parse reads them from the command line. */
typedef struct BenchOpts {
    const char *model, *onnx, *batch_arg, *paths_arg, *python;
    int seq, rounds, json;
    int bs[MAX_BATCHES], nb; /* --batch-sizes */
    unsigned paths;          /* --paths: bit p set when path p is timed */
    char python_path[4200], script[4200]; /* with --onnx: who times it in ONNX Runtime */
    BqPrecision prec;
} BenchOpts;

/* What one bench run found: the integer engine (or why there is none), the timings and the verdict. */
typedef struct BenchResult {
    BqInt8Engine *eng;  /* NULL: the integer engine refused the checkpoint, for the reason in reason */
    char reason[1024], cpu[256], ort_version[64], verdict[2048];
    double med[MAX_BATCHES][NPATHS], ort[MAX_BATCHES], prep_ms;
    int T;              /* tokens per example */
    int shown[NPATHS];  /* shown[p]: path p was timed */
    int cmp, pays;      /* int8 was compared against fp32; it pays off at every batch size */
} BenchResult;

/* Parses the command line into o (zeroed by the caller): sets the defaults, parses argv, then
 * --batch-sizes and --paths (--clock sets g_cpu_clock), checks that --onnx exists and looks up
 * its Python and onnx_bench.py, and prints the precision header (the parser resolved it into o->prec,
 * and set the runtime's thread count). *help is set
 * when --help printed the usage, and nothing else is then done. Returns BQ_OK, or the status of the
 * first error (BQ_EINVAL for a bad flag or value, or the lookup's error naming --python). */
static int bench_parse(BenchOpts *o, int argc, char **argv, int *help) {
    o->batch_arg = "1,32", o->paths_arg = "fp32,fake-quant,int8";
    o->rounds = 10;
    const BqArgSpec specs[] = {
        {"model", BQ_ARG_STR, &o->model, "quantized checkpoint (PTQ or QAT)", 1, 0, 0},
        {"onnx", BQ_ARG_STR, &o->onnx, "also time this ONNX file in ONNX Runtime (e.g. the checkpoint's export)", 0, 0, 0},
        {"batch-sizes", BQ_ARG_STR, &o->batch_arg, "comma-separated batch sizes", 0, 0, 0},
        {"paths", BQ_ARG_STR, &o->paths_arg, "comma-separated bertqat forwards to time: fp32 (the float weights, in "
         "--precision), fake-quant, int8", 0, 0, 0},
        {"seq", BQ_ARG_INT, &o->seq, "tokens per example (0: the checkpoint's max_seq_len, else 128)", 0, 0, 8192},
        {"rounds", BQ_ARG_INT, &o->rounds, "timed forwards per path and batch size, after one warm-up", 0, 1, MAX_ROUNDS},
        {"python", BQ_ARG_STR, &o->python, "Python with onnxruntime for --onnx " BQ_CLI_PYTHON_HELP, 0, 0, 0},
        {"clock", BQ_ARG_ENUM, &g_cpu_clock, "wall (latency) or cpu (process CPU time of all threads, spin-waits "
         "included: a measure that a loaded machine disturbs less, meant for --threads 1)", 0, 0, 0, CLOCK_NAMES},
        {"json", BQ_ARG_FLAG, &o->json, "print the results as one JSON object instead of a table", 0, 0, 0},
    };
    BqArgs args = {.cmd = "bench", .usage = "--model CKPT [--onnx FILE] [options]",
                   .summary = "Forward latency (median ms) of a quantized checkpoint as fp32, fake quant and integer "
                              "(int8) on this CPU, and of an ONNX file in ONNX Runtime; says whether int8 pays off.",
                   .specs = specs, .nspecs = (int)(sizeof specs / sizeof *specs),
                   .common = BQ_ARGS_THREADS | BQ_ARGS_PRECISION,
                   .threads_help = "threads, for bertqat and ONNX Runtime alike (0: all cores)"};
    int st = bq_args_parse(&args, argc, argv);
    *help = args.help;
    if (st || args.help) return st;
    if ((st = parse_batches(o->batch_arg, o->bs, &o->nb))) return st;
    if ((st = parse_paths(o->paths_arg, &o->paths))) return st;
    if (o->onnx && !bq_is_file(o->onnx)) return bq_err(BQ_EINVAL, "--onnx %s: no such file", o->onnx);
    if (o->onnx && ((st = bq_cli_python_path(o->python, o->python_path, sizeof o->python_path)) ||
                    (st = bq_cli_script_path("onnx_bench.py", o->script, sizeof o->script))))
        return st;
    o->prec = args.prec;
    bq_args_header(&args);
    return BQ_OK;
}

/* Loads the checkpoint o->model into m and *tok (freed by the caller, also after an error) at
 * o->prec, sets r->T (--seq, else the checkpoint's max_seq_len, else 128) and prepares the integer
 * engine into r->eng, timing that in r->prep_ms; where the engine refuses the checkpoint (BQ_EINVAL)
 * r->eng stays NULL with the reason in r->reason. Returns BQ_OK, BQ_EINVAL for a checkpoint without
 * quantizers or a --seq beyond its positions, or the error of loading or preparing. */
static int bench_load(const BenchOpts *o, BqBert *m, BqTokenizer **tok, BenchResult *r) {
    int st;
    if ((st = bq_cli_model_load(m, tok, o->model, 0, 0, "bench"))) return st;
    m->prec = o->prec;
    if (!m->quant)
        return bq_err(BQ_EINVAL, "--model %s: no quantizers (a fp32 checkpoint); bench compares the fp32, fake-quant "
                      "and int8 forwards of a PTQ or QAT checkpoint", o->model);
    r->T = o->seq > 0 ? o->seq : m->data.max_seq_len > 0 ? m->data.max_seq_len : 128;
    if (r->T > m->cfg.max_position_embeddings)
        return bq_err(BQ_EINVAL, "--seq: %d tokens exceed the model's %d positions", r->T,
                      m->cfg.max_position_embeddings);
    double t0 = bq_now();
    st = bq_int8_prepare(&r->eng, m);
    r->prep_ms = (bq_now() - t0) * 1e3;
    if (st == BQ_EINVAL) {
        snprintf(r->reason, sizeof r->reason, "%s", bq_errmsg());
        bq_err_clear();
        r->eng = NULL;
        st = BQ_OK;
    }
    return st;
}

/* Times every path of o->paths at each batch size into r->med (activations in act, which the caller
 * frees) and, with --onnx, the ONNX file in ONNX Runtime into r->ort and r->ort_version. Returns BQ_OK,
 * or the first error of a forward or of the ONNX Runtime child. */
static int bench_time(const BenchOpts *o, BqBert *m, BqArena *act, BenchResult *r) {
    int st;
    if ((st = bq_arena_init(act, (size_t)64 << 30, "activations"))) return st;
    BqRng rng;
    bq_rng_seed(&rng, 1);
    for (int i = 0; i < o->nb; i++) {
        fprintf(stderr, "[bench] batch %d, seq %d: %d rounds\n", o->bs[i], r->T, o->rounds);
        if ((st = time_batch(m, r->eng, act, o->bs[i], r->T, o->rounds, o->paths, &rng, r->med[i]))) return st;
    }
    if (o->onnx && (st = time_onnx(o->python_path, o->script, o->onnx, o->bs, o->nb, r->T, bq_runtime_threads(),
                                   o->rounds, m->cfg.vocab_size, r->ort, r->ort_version, sizeof r->ort_version)))
        return st;
    return BQ_OK;
}

/* Sets r->shown, r->cmp (int8 against fp32 only when both were timed), r->pays (a speed-up of at least
 * PAYS_OFF at every batch size) and the one-sentence r->verdict from the timings in r. */
static void bench_verdict(const BenchOpts *o, BenchResult *r) {
    for (int p = P_FP32; p <= P_INT8; p++) r->shown[p] = (o->paths >> p & 1) && (p != P_INT8 || r->eng);
    r->shown[P_ORT] = o->onnx != NULL;
    r->cmp = r->shown[P_FP32] && r->shown[P_INT8];
    r->pays = r->cmp;
    for (int i = 0; i < o->nb && r->cmp; i++) r->pays &= r->med[i][P_FP32] / r->med[i][P_INT8] >= PAYS_OFF;
    if (!r->eng) {
        snprintf(r->verdict, sizeof r->verdict, "int8 cannot run on this machine for this checkpoint: %s.", r->reason);
    } else if (!r->cmp) {
        snprintf(r->verdict, sizeof r->verdict, "int8 against fp32: not compared (--paths %s).", o->paths_arg);
    } else {
        int n = snprintf(r->verdict, sizeof r->verdict, "int8 %s on this machine: the integer forward is ",
                         r->pays ? "pays off" : "does not pay off");
        for (int i = 0; i < o->nb; i++)
            n += snprintf(r->verdict + n, sizeof r->verdict - (size_t)n, "%s%.2fx (batch %d)",
                          i ? (i == o->nb - 1 ? " and " : ", ") : "", r->med[i][P_FP32] / r->med[i][P_INT8], o->bs[i]);
        snprintf(r->verdict + n, sizeof r->verdict - (size_t)n, " as fast as %s (it pays off at >= %.1fx at every "
                 "batch size).", path_label(P_FP32, o->prec), PAYS_OFF);
    }
}

/* Prints the run's settings, timings and verdict on stdout as one JSON object (--json). */
static void bench_print_json(const BenchOpts *o, const BenchResult *r) {
    json_t *j = json_object();
    json_object_set_new(j, "model", json_string(o->model));
    json_object_set_new(j, "cpu", json_string(r->cpu));
    json_object_set_new(j, "onednn", json_string(bq_dnnl_describe()));
    json_object_set_new(j, "fused_kernels", json_string(bq_infer_isa()));
    json_object_set_new(j, "vnni_attention_products", json_boolean(bq_infer_vnni()));
    json_object_set_new(j, "blas", json_string(bq_runtime_describe()));
    json_object_set_new(j, "threads", json_integer(bq_runtime_threads()));
    json_object_set_new(j, "precision", json_string(bq_precision_name(o->prec)));
    json_object_set_new(j, "seq", json_integer(r->T));
    json_object_set_new(j, "rounds", json_integer(o->rounds));
    json_object_set_new(j, "clock", json_string(CLOCK_NAMES[g_cpu_clock]));
    json_object_set_new(j, "omp_wait_policy", json_string(wait_policy()));
    json_object_set_new(j, "int8_available", json_boolean(r->eng != NULL));
    if (!r->eng) json_object_set_new(j, "int8_refused", json_string(r->reason));
    if (o->onnx) json_object_set_new(j, "onnx", json_string(o->onnx));
    if (o->onnx) json_object_set_new(j, "onnxruntime", json_string(r->ort_version));
    json_t *rows = json_array();
    for (int i = 0; i < o->nb; i++) {
        json_t *row = json_object();
        json_object_set_new(row, "batch", json_integer(o->bs[i]));
        for (int p = 0; p < NPATHS; p++) {
            if (!r->shown[p]) continue;
            char key[64];
            snprintf(key, sizeof key, "%s_ms", PATH_NAMES[p]);
            json_object_set_new(row, key, json_real(p == P_ORT ? r->ort[i] : r->med[i][p]));
        }
        if (r->cmp) json_object_set_new(row, "fp32_over_int8", json_real(r->med[i][P_FP32] / r->med[i][P_INT8]));
        if (r->shown[P_INT8] && o->onnx)
            json_object_set_new(row, "onnxruntime_over_int8", json_real(r->ort[i] / r->med[i][P_INT8]));
        json_array_append_new(rows, row);
    }
    json_object_set_new(j, "results", rows);
    json_object_set_new(j, "int8_pays_off", json_boolean(r->pays));
    json_object_set_new(j, "verdict", json_string(r->verdict));
    char *s = json_dumps(j, JSON_INDENT(2));
    printf("%s\n", s);
    free(s);
    json_decref(j);
}

/* Prints the run's settings, a table of ms per forward (a row per path timed, a column per batch size,
 * with the int8 speed-up rows) and the verdict on stdout. */
static void bench_print_table(const BenchOpts *o, const BenchResult *r) {
    printf("CPU        %s\n%s\nfused inference kernels: %s\n%s\n%s\n", r->cpu, bq_dnnl_describe(),
           bq_infer_describe(), bq_cpu_bf16_describe(), bq_runtime_describe());
    printf("precision  %s\n", bq_precision_name(o->prec));
    printf("model      %s, seq %d, %d threads, median of %d rounds after a warm-up (%s)\n", o->model, r->T,
           bq_runtime_threads(), o->rounds, g_cpu_clock ? "process CPU time" : "wall time");
    printf("OpenMP     wait policy %s\n", wait_policy());
    if (r->eng)
        printf("int8       %d integer Linears in %d GEMMs (%d calls), %d layers fused, packed in %.0f ms\n",
               bq_int8_linear_count(r->eng), bq_int8_gemm_count(r->eng), bq_int8_piece_count(r->eng),
               bq_int8_fused_layer_count(r->eng), r->prep_ms);
    else
        printf("int8       not available: %s\n", r->reason);
    if (o->onnx) printf("ORT        onnxruntime %s on %s\n", r->ort_version, o->onnx);
    printf("\n%-22s", g_cpu_clock ? "CPU ms per forward" : "ms per forward");
    for (int i = 0; i < o->nb; i++) {
        char h[32];
        snprintf(h, sizeof h, "batch %d", o->bs[i]);
        printf(" %12s", h);
    }
    printf("\n");
    for (int p = 0; p < NPATHS; p++) {
        if (!r->shown[p]) continue;
        printf("%-22s", path_label(p, o->prec));
        for (int i = 0; i < o->nb; i++) printf(" %12.2f", p == P_ORT ? r->ort[i] : r->med[i][p]);
        printf("\n");
    }
    if (r->cmp) {
        char h[32];
        snprintf(h, sizeof h, "%s / int8", path_label(P_FP32, o->prec));
        printf("%-22s", h);
        for (int i = 0; i < o->nb; i++) printf(" %11.2fx", r->med[i][P_FP32] / r->med[i][P_INT8]);
        printf("\n");
    }
    if (r->shown[P_INT8] && o->onnx) {
        printf("%-22s", "onnxruntime / int8");
        for (int i = 0; i < o->nb; i++) printf(" %11.2fx", r->ort[i] / r->med[i][P_INT8]);
        printf("\n");
    }
    printf("\n%s\n", r->verdict);
}

int bq_cmd_bench(int argc, char **argv) {
    BenchOpts o = {0};
    int help = 0;
    int st = bench_parse(&o, argc, argv, &help);
    if (st || help) return st;

    BqTokenizer *tok = NULL;
    BqBert m;
    memset(&m, 0, sizeof m);
    BqArena act = {0};
    BenchResult r = {0};
    if ((st = bench_load(&o, &m, &tok, &r))) goto cleanup;
    if ((st = bench_time(&o, &m, &act, &r))) goto cleanup;
    bench_verdict(&o, &r);
    bq_cpu_model(r.cpu, sizeof r.cpu);
    if (o.json) bench_print_json(&o, &r);
    else bench_print_table(&o, &r);

cleanup:
    bq_int8_free(r.eng);
    if (act.base) bq_arena_free(&act);
    if (tok) bq_tokenizer_free(tok);
    bq_bert_free(&m);
    return st;
}
