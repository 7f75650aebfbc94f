/* Data-parallel runs under mpirun (src/dist.h): thin wrappers over MPI_COMM_WORLD collectives with
 * single-process fallbacks. BQ_HAVE_MPI is set by CMakeLists.txt when find_package(MPI) succeeds. */
#include "src/dist.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "autograd/bq.h"
#include "layers/calib.h"
#include "layers/quant.h"

#ifdef BQ_HAVE_MPI
#include <mpi.h>
#endif

static int g_rank = 0, g_size = 1;

int bq_dist_rank(void) { return g_rank; }
int bq_dist_size(void) { return g_size; }

#ifdef BQ_HAVE_MPI

static int g_joined = 0; /* MPI_Init was called */

/* MPI counts are int: larger buffers go in chunks of at most 2^30 elements. */
#define CHUNK ((int64_t)1 << 30)

/* Open MPI sets OMPI_COMM_WORLD_SIZE in every rank it launches; PMI_SIZE and PMIX_RANK cover other
 * launchers (srun, hydra). Without one of them MPI_Init would start a singleton job, which costs time
 * and may fail in sandboxes, for no benefit. */
static int launched_by_mpi(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

int bq_dist_init(int *argc, char ***argv) {
    if (!launched_by_mpi()) return BQ_OK;
    if (MPI_Init(argc, argv) != MPI_SUCCESS) return bq_err(BQ_EIO, "MPI_Init failed");
    g_joined = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    return BQ_OK;
}

void bq_dist_finalize(void) {
    if (g_joined) MPI_Finalize();
    g_joined = 0;
}

const char *bq_dist_describe(void) {
    static char buf[MPI_MAX_LIBRARY_VERSION_STRING + 64];
    char lib[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int len = 0;
    MPI_Get_library_version(lib, &len);
    char *nl = strchr(lib, '\n');
    if (nl) *nl = 0;
    char *comma = strchr(lib, ','); /* "Open MPI v4.1.4, package: ..." → "Open MPI v4.1.4" */
    if (comma) *comma = 0;
    if (g_joined)
        snprintf(buf, sizeof buf, "MPI: %s, rank %d of %d", lib, g_rank, g_size);
    else
        snprintf(buf, sizeof buf, "MPI: %s (data-parallel under mpirun)", lib);
    return buf;
}

static void allreduce(void *buf, int64_t n, MPI_Datatype t, size_t esize, MPI_Op op) {
    if (g_size == 1 || n <= 0) return;
    char *p = buf;
    for (int64_t off = 0; off < n; off += CHUNK) {
        int c = (int)(n - off < CHUNK ? n - off : CHUNK);
        BQ_CHECK(MPI_Allreduce(MPI_IN_PLACE, p + (size_t)off * esize, c, t, op, MPI_COMM_WORLD) == MPI_SUCCESS);
    }
}

void bq_dist_sum_f32(float *buf, int64_t n) { allreduce(buf, n, MPI_FLOAT, sizeof *buf, MPI_SUM); }
void bq_dist_sum_f64(double *buf, int64_t n) { allreduce(buf, n, MPI_DOUBLE, sizeof *buf, MPI_SUM); }
void bq_dist_sum_i64(int64_t *buf, int64_t n) { allreduce(buf, n, MPI_INT64_T, sizeof *buf, MPI_SUM); }
void bq_dist_max_f64(double *buf, int64_t n) { allreduce(buf, n, MPI_DOUBLE, sizeof *buf, MPI_MAX); }
void bq_dist_max_i64(int64_t *buf, int64_t n) { allreduce(buf, n, MPI_INT64_T, sizeof *buf, MPI_MAX); }

void bq_dist_bcast(void *buf, size_t bytes, int root) {
    if (g_size == 1) return;
    char *p = buf;
    for (size_t off = 0; off < bytes; off += (size_t)CHUNK) {
        int c = (int)(bytes - off < (size_t)CHUNK ? bytes - off : (size_t)CHUNK);
        BQ_CHECK(MPI_Bcast(p + off, c, MPI_BYTE, root, MPI_COMM_WORLD) == MPI_SUCCESS);
    }
}

void bq_dist_gather_bytes(const void *buf, size_t bytes, void **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    if (g_size == 1) {
        *out = bq_malloc(bytes ? bytes : 1);
        if (bytes) memcpy(*out, buf, bytes);
        *out_len = bytes;
        return;
    }
    BQ_CHECK(bytes < (size_t)INT_MAX);
    int mine = (int)bytes;
    int *counts = NULL, *displs = NULL;
    char *all = NULL;
    if (g_rank == 0) {
        counts = bq_malloc(sizeof(int) * (size_t)g_size);
        displs = bq_malloc(sizeof(int) * (size_t)g_size);
    }
    BQ_CHECK(MPI_Gather(&mine, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD) == MPI_SUCCESS);
    if (g_rank == 0) {
        size_t total = 0;
        for (int r = 0; r < g_size; r++) {
            BQ_CHECK(total + (size_t)counts[r] < (size_t)INT_MAX);
            displs[r] = (int)total;
            total += (size_t)counts[r];
        }
        all = bq_malloc(total ? total : 1);
        *out_len = total;
    }
    BQ_CHECK(MPI_Gatherv(buf, mine, MPI_BYTE, all, counts, displs, MPI_BYTE, 0, MPI_COMM_WORLD) == MPI_SUCCESS);
    *out = all;
    free(counts);
    free(displs);
}

void bq_dist_allgather_i64(int64_t mine, int64_t *all) {
    all[0] = mine;
    if (g_size == 1) return;
    BQ_CHECK(MPI_Allgather(&mine, 1, MPI_INT64_T, all, 1, MPI_INT64_T, MPI_COMM_WORLD) == MPI_SUCCESS);
}

void bq_dist_allgatherv(const void *buf, const int64_t *bytes, void *out) {
    if (g_size == 1) {
        if (bytes[0]) memcpy(out, buf, (size_t)bytes[0]);
        return;
    }
    int counts[g_size], displs[g_size];
    int64_t total = 0;
    for (int r = 0; r < g_size; r++) {
        BQ_CHECK(total + bytes[r] < INT_MAX);
        counts[r] = (int)bytes[r];
        displs[r] = (int)total;
        total += bytes[r];
    }
    BQ_CHECK(MPI_Allgatherv(buf, counts[g_rank], MPI_BYTE, out, counts, displs, MPI_BYTE, MPI_COMM_WORLD) ==
             MPI_SUCCESS);
}

void bq_dist_barrier(void) {
    if (g_size > 1) MPI_Barrier(MPI_COMM_WORLD);
}

void bq_dist_barrier_idle(void) {
    if (g_size == 1) return;
    MPI_Request req;
    BQ_CHECK(MPI_Ibarrier(MPI_COMM_WORLD, &req) == MPI_SUCCESS);
    const struct timespec nap = {0, 10 * 1000 * 1000};
    for (;;) {
        int done = 0;
        BQ_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS);
        if (done) return;
        nanosleep(&nap, NULL);
    }
}

void bq_dist_abort(int code) {
    fflush(stdout);
    fflush(stderr);
    if (g_joined && g_size > 1) MPI_Abort(MPI_COMM_WORLD, code);
    bq_dist_finalize();
    exit(code);
}

#else /* no MPI in the build: one process */

int bq_dist_init(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    return BQ_OK;
}
void bq_dist_finalize(void) {}
const char *bq_dist_describe(void) {
    return "MPI: not in this build (install libopenmpi-dev and rebuild for data-parallel runs)";
}
void bq_dist_sum_f32(float *buf, int64_t n) { (void)buf, (void)n; }
void bq_dist_sum_f64(double *buf, int64_t n) { (void)buf, (void)n; }
void bq_dist_sum_i64(int64_t *buf, int64_t n) { (void)buf, (void)n; }
void bq_dist_max_f64(double *buf, int64_t n) { (void)buf, (void)n; }
void bq_dist_max_i64(int64_t *buf, int64_t n) { (void)buf, (void)n; }
void bq_dist_bcast(void *buf, size_t bytes, int root) { (void)buf, (void)bytes, (void)root; }
void bq_dist_gather_bytes(const void *buf, size_t bytes, void **out, size_t *out_len) {
    *out = bq_malloc(bytes ? bytes : 1);
    if (bytes) memcpy(*out, buf, bytes);
    *out_len = bytes;
}
void bq_dist_allgather_i64(int64_t mine, int64_t *all) { all[0] = mine; }
void bq_dist_allgatherv(const void *buf, const int64_t *bytes, void *out) {
    if (bytes[0]) memcpy(out, buf, (size_t)bytes[0]);
}
void bq_dist_barrier(void) {}
void bq_dist_barrier_idle(void) {}
void bq_dist_abort(int code) {
    fflush(stdout);
    fflush(stderr);
    exit(code);
}

#endif

extern char **environ;

char **bq_dist_child_env(void) {
    size_t n = 0;
    while (environ[n]) n++;
    char **env = bq_malloc((n + 1) * sizeof *env);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const char *e = environ[i];
        if (!strncmp(e, "OMPI_", 5) || !strncmp(e, "PMIX_", 5) || !strncmp(e, "PMI_", 4)) continue;
        env[k++] = environ[i];
    }
    env[k] = NULL;
    return env;
}

/* ---- quantizer statistics (layers/quant.h, layers/calib.h) ---- */

void bq_dist_reduce_minmax(float *mn, float *mx) {
    double v[2] = {-(double)*mn, (double)*mx}; /* float → double → float is exact */
    bq_dist_max_f64(v, 2);
    *mn = (float)-v[0];
    *mx = (float)v[1];
}

void bq_dist_calib_first_batch(BqQuantState *qs) {
    if (g_size == 1) return;
    for (int i = 0; i < qs->n; i++) {
        BqHistogram *h = qs->q[i].hist;
        if (!h || !h->with_bins) continue;
        double w = g_rank == 0 ? h->width : 0.0;
        int64_t nb = g_rank == 0 ? h->nbins : 0;
        bq_dist_bcast(&w, sizeof w, 0);
        bq_dist_bcast(&nb, sizeof nb, 0);
        /* Rank 0 has seen only batch 0 and the others nothing: they take its bin width and bin count,
         * with empty bins. A quantizer whose batch 0 was all zeros has no width yet (nb == 0): each rank
         * then fixes its own, and bq_dist_calib_merge refuses to mix them. */
        if (g_rank != 0 && nb > 0 && h->nbins == 0) {
            h->width = w;
            h->nbins = nb;
            h->count = bq_calloc((size_t)nb, sizeof(double));
            h->count[0] += (double)h->pending_zeros;
            h->pending_zeros = 0;
        }
    }
}

int bq_dist_calib_merge(BqQuantState *qs) {
    if (g_size == 1) return BQ_OK;
    for (int i = 0; i < qs->n; i++) {
        BqHistogram *h = qs->q[i].hist;
        if (!h) continue;
        bq_dist_max_f64(&h->maxv, 1);
        if (!h->with_bins) continue;
        int64_t nb = h->nbins;
        bq_dist_max_i64(&nb, 1);
        double w = h->width;
        bq_dist_bcast(&w, sizeof w, 0);
        int64_t bad = h->nbins > 0 && w != h->width;
        bq_dist_sum_i64(&bad, 1);
        if (bad)
            return bq_err(BQ_EINVAL, "calibration under mpirun: quantizer %s saw only zeros in the first batch, so "
                          "the ranks' histograms have different bins; calibrate in one process", qs->q[i].name);
        if (nb > h->nbins) {
            h->count = bq_realloc(h->count, (size_t)nb * sizeof(double));
            memset(h->count + h->nbins, 0, (size_t)(nb - h->nbins) * sizeof(double));
            h->nbins = nb;
            h->width = w;
        }
        /* counts are whole numbers below 2^53: the sum is exact in any order */
        bq_dist_sum_f64(h->count, h->nbins);
        bq_dist_sum_i64(&h->pending_zeros, 1);
        if (h->nbins > 0 && h->pending_zeros > 0) {
            h->count[0] += (double)h->pending_zeros;
            h->pending_zeros = 0;
        }
    }
    return BQ_OK;
}

void bq_dist_quant_bcast(BqQuantState *qs) {
    if (g_size == 1 || !qs) return;
    for (int i = 0; i < qs->n; i++) {
        BqQuantizer *q = &qs->q[i];
        bq_dist_bcast(q->amax, sizeof(float) * (size_t)q->nch, 0);
        bq_dist_bcast(q->scale, sizeof(float) * (size_t)q->nch, 0);
        int flags[2] = {q->initialized, q->frozen};
        bq_dist_bcast(flags, sizeof flags, 0);
        q->initialized = flags[0], q->frozen = flags[1];
        float mm[2] = {q->run_min, q->run_max};
        bq_dist_bcast(mm, sizeof mm, 0);
        q->run_min = mm[0], q->run_max = mm[1];
        if (q->ch_min) bq_dist_bcast(q->ch_min, sizeof(float) * (size_t)q->nch, 0);
        if (q->ch_max) bq_dist_bcast(q->ch_max, sizeof(float) * (size_t)q->nch, 0);
    }
}

/* ---- text gathered to rank 0 ---- */

typedef struct Line {
    long long key;
    const char *s;
    size_t n;
} Line;

static int cmp_line(const void *a, const void *b) {
    const Line *x = a, *y = b;
    if (x->key != y->key) return (x->key > y->key) - (x->key < y->key);
    return (x->s > y->s) - (x->s < y->s); /* stable: rank order, then position */
}

void bq_dist_gather_lines(const char *buf, size_t len, FILE *out) {
    void *all = NULL;
    size_t total = 0;
    bq_dist_gather_bytes(buf, len, &all, &total);
    if (g_rank != 0) return;
    const char *p = all, *end = p + total;
    size_t n = 0, cap = 0;
    Line *lines = NULL;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl ? nl + 1 : end;
        if (n == cap) lines = bq_realloc(lines, (cap = cap ? 2 * cap : 1024) * sizeof *lines);
        char *rest = NULL;
        long long key = strtoll(p, &rest, 10);
        if (rest < e && *rest == '\t') rest++; /* the key and its tab are not written */
        lines[n++] = (Line){key, rest, (size_t)(e - rest)};
        p = e;
    }
    qsort(lines, n, sizeof *lines, cmp_line);
    for (size_t i = 0; i < n; i++) fwrite(lines[i].s, 1, lines[i].n, out);
    free(lines);
    free(all);
}
