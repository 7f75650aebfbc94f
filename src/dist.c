/* Data-parallel runs under mpirun (src/dist.h): thin wrappers over MPI_COMM_WORLD collectives with
 * single-process fallbacks. BQ_HAVE_MPI is set by CMakeLists.txt when find_package(MPI) succeeds. */
#include "src/dist.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"

#ifdef BQ_HAVE_MPI
#include <mpi.h>
#endif

static int g_rank = 0, g_size = 1, g_joined = 0;

int bq_dist_rank(void) { return g_rank; }
int bq_dist_size(void) { return g_size; }

#ifdef BQ_HAVE_MPI

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

void bq_dist_barrier(void) {
    if (g_size > 1) MPI_Barrier(MPI_COMM_WORLD);
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
void bq_dist_barrier(void) {}
void bq_dist_abort(int code) {
    fflush(stdout);
    fflush(stderr);
    exit(code);
}

#endif
