/* Runs a fuzz target (tests/fuzz/fuzz_*.c) once on each committed input: the arguments are files or
 * folders (every regular file in a folder, in name order). Built without libFuzzer, so the corpus
 * replays under gcc in the normal and the sanitizer builds; a crash, a sanitizer report or a BQ_CHECK
 * in the parser fails the ctest. Prints the number of inputs and the slowest one. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "autograd/bq.h"
#include "tests/fuzz/fuzz.h"

static int n_inputs;
static double slowest;
static char slowest_name[512];

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open\n", path);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    BQ_CHECK(buf != NULL);
    if (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "%s: short read\n", path);
        fclose(f);
        free(buf);
        return 1;
    }
    fclose(f);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (s > slowest) slowest = s, snprintf(slowest_name, sizeof slowest_name, "%s", path);
    n_inputs++;
    free(buf);
    return 0;
}

static int run_path(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "%s: not found\n", path);
        return 1;
    }
    if (!S_ISDIR(st.st_mode)) return run_file(path);
    DIR *d = opendir(path);
    if (!d) return 1;
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) cap = cap ? 2 * cap : 64, names = realloc(names, cap * sizeof *names);
        BQ_CHECK(names != NULL);
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, by_name);
    int rc = 0;
    char p[1024];
    for (size_t i = 0; i < n; i++) {
        snprintf(p, sizeof p, "%s/%s", path, names[i]);
        rc |= run_file(p);
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv) {
    int rc = 0;
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    for (int i = 1; i < argc; i++) rc |= run_path(argv[i]);
    fprintf(stderr, "%s: %d inputs replayed, slowest %.3f s (%s)\n", argv[0], n_inputs, slowest, slowest_name);
    if (n_inputs == 0) {
        fprintf(stderr, "no inputs: the corpus is missing\n");
        return 1;
    }
    /* A slow input is a hang that libFuzzer would report (-timeout=1 in scripts/fuzz.sh); the replay
     * allows more because the sanitizer build runs several times slower. */
    if (slowest > 10.0) {
        fprintf(stderr, "%s took %.1f s\n", slowest_name, slowest);
        rc = 1;
    }
    return rc;
}
