/* Data-parallel runs under `mpirun` (Open MPI): the one module that calls MPI. Every function has a
 * single-process behaviour (rank 0 of 1, reductions and broadcasts are no-ops), used when bertqat was
 * built without MPI or was started without a launcher, so the rest of the code has no #ifdef.
 * Usage and the cost model: docs/distributed.md. Reference: MPI 3.1 standard §5 (collectives). */
#ifndef BQ_DIST_H
#define BQ_DIST_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

/* Joins the MPI job when the process was started by an MPI launcher (the environment names a rank);
 * otherwise (or without MPI in the build) stays a single process and calls no MPI function. Call once,
 * before any other bq_dist_*. Returns a BqStatus. */
int bq_dist_init(int *argc, char ***argv);
/* MPI_Finalize when bq_dist_init joined a job. */
void bq_dist_finalize(void);
int bq_dist_rank(void);
int bq_dist_size(void);
/* One line for `bertqat --version`: whether MPI is in the build, its library version, and the job's
 * size when running under a launcher. */
const char *bq_dist_describe(void);

/* In-place element-wise reductions over all ranks (every rank gets the result). Collective: every rank
 * must call them in the same order with the same n. */
void bq_dist_sum_f32(float *buf, int64_t n);
void bq_dist_sum_f64(double *buf, int64_t n);
void bq_dist_sum_i64(int64_t *buf, int64_t n);
void bq_dist_max_f64(double *buf, int64_t n);
void bq_dist_max_i64(int64_t *buf, int64_t n);
/* Root's `bytes` bytes of buf to every rank. */
void bq_dist_bcast(void *buf, size_t bytes, int root);
/* Gathers a variable number of bytes from every rank to rank 0: *out (bq_malloc'd, rank 0 only,
 * NULL elsewhere) holds rank 0's bytes, then rank 1's, ...; *out_len their total. */
void bq_dist_gather_bytes(const void *buf, size_t bytes, void **out, size_t *out_len);
/* Gathers every rank's text to rank 0: whole lines, each "KEY<TAB>rest" with an integer KEY. Rank 0
 * writes the rests to out sorted by KEY (equal keys in rank order, then in their order on the rank).
 * Other ranks write nothing. */
void bq_dist_gather_lines(const char *buf, size_t len, FILE *out);
/* all[r] = rank r's `mine` (all has bq_dist_size() entries). */
void bq_dist_allgather_i64(int64_t mine, int64_t *all);
/* Every rank's bytes[rank] bytes of buf, concatenated in rank order into out (sum of bytes, < 2 GiB). */
void bq_dist_allgatherv(const void *buf, const int64_t *bytes, void *out);
void bq_dist_barrier(void);
/* A barrier that sleeps instead of spinning while it waits (MPI_Ibarrier tested every 10 ms), for ranks
 * that wait while rank 0 alone works (a stage of `pipeline` that runs once): a spinning MPI_Barrier
 * would take a core from rank 0 on a machine with no core to spare. */
void bq_dist_barrier_idle(void);
/* The environment of this process without the variables an MPI launcher sets (OMPI_*, PMIX_*, PMI_*),
 * for a child process that must run as a single process and not try to join this job: a bq_malloc'd,
 * NULL-terminated array of pointers into environ (free the array, not the strings). */
char **bq_dist_child_env(void);
/* Ends every rank of the job with exit status `code` (MPI_Abort), or exit(code) in one process. */
void bq_dist_abort(int code) __attribute__((noreturn));

/* Quantizer statistics across ranks (layers/quant.h, layers/calib.h). Histogram calibration under N
 * ranks: every rank reads every batch and collects the batches k with k mod N = r; after batch 0
 * (rank 0's) bq_dist_calib_first_batch gives every rank rank 0's bin width, so all histograms share
 * their bins, and bq_dist_calib_merge (before bq_quant_calib_finish) takes the max of the running
 * maxima and sums the bin counts: the single-process histogram. */
struct BqQuantState;
void bq_dist_calib_first_batch(struct BqQuantState *qs);
int bq_dist_calib_merge(struct BqQuantState *qs);
/* Rank 0's ranges and observer state of every quantizer to all ranks. */
void bq_dist_quant_bcast(struct BqQuantState *qs);
/* The BqQuantState.reduce_minmax callback: min and max over the ranks. */
void bq_dist_reduce_minmax(float *mn, float *mx);

#endif
