/* Durable writes (autograd/bq.h): output locks (bq_out_lock) refuse a second claim of a held output,
 * naming the holder's pid and command (two open file descriptions of the lock file conflict within one
 * process as between two); a release removes the lock file; a lock file without a holder blocks
 * nothing; a missing folder is an error unless the command creates it; a BQ_ARG_OUT flag takes the lock
 * while parsing (src/cli/args.h). Folder replacement (bq_replace_dir) swaps a complete folder in and hands
 * back the old contents. A stream whose writes failed is an error at its close (bq_fclose_written). */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "autograd/bq.h"
#include "src/cli/args.h"
#include "tests/test_util.h"

/* The first line of a small file, "" when it cannot be read. */
static const char *first_line(const char *path) {
    static char buf[128];
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (f) {
        if (!fgets(buf, sizeof buf, f)) buf[0] = 0;
        fclose(f);
    }
    buf[strcspn(buf, "\n")] = 0;
    return buf;
}

static void put_line(const char *path, const char *s) {
    FILE *f = fopen(path, "w");
    BQ_CHECK(f != NULL);
    fprintf(f, "%s\n", s);
    fclose(f);
}

int main(void) {
    char dir[256], out[300], lock[320], who[64], p[400], q[400];
    bq_test_tmpdir(dir, sizeof dir, "out_lock");
    snprintf(out, sizeof out, "%s/ckpt/", dir); /* a trailing slash names the same output */
    snprintf(lock, sizeof lock, "%s/ckpt.lock", dir);
    snprintf(who, sizeof who, "pid %ld, finetune", (long)getpid());
    int mark = bq_out_lock_mark();
    EXPECT(bq_out_lock(out, "--out", "finetune", 0) == BQ_OK && bq_is_file(lock));
    EXPECT(bq_out_lock_mark() == mark + 1);
    EXPECT(bq_out_lock(out, "--out", "calibrate", 0) == BQ_EIO && strstr(bq_errmsg(), who) &&
           strstr(bq_errmsg(), "in use") && strstr(bq_errmsg(), "ckpt.lock"));
    bq_out_unlock_to(mark);
    EXPECT(!bq_is_file(lock) && bq_out_lock_mark() == mark);
    put_line(lock, "1 finetune"); /* left by a process that died */
    EXPECT(bq_out_lock(out, "--out", "export", 0) == BQ_OK);
    snprintf(p, sizeof p, "%ld export", (long)getpid());
    EXPECT(!strcmp(first_line(lock), p));
    bq_out_unlock_to(mark);
    snprintf(out, sizeof out, "%s/new/sub/x.onnx", dir);
    EXPECT(bq_out_lock(out, "--out", "export", 0) == BQ_EIO && strstr(bq_errmsg(), "new/sub/x.onnx.lock"));
    snprintf(p, sizeof p, "%s/new", dir);
    EXPECT(!bq_is_dir(p));
    EXPECT(bq_out_lock(out, "--out", "finetune", 1) == BQ_OK && bq_is_dir(p));
    bq_out_unlock_to(mark);

    const char *o = NULL;
    snprintf(out, sizeof out, "%s/model.onnx", dir);
    BqArgSpec specs[] = {{"out", BQ_ARG_OUT, &o, "an output", 1, 0, 0}};
    BqArgs args = {.cmd = "test", .specs = specs, .nspecs = 1};
    char *argv[] = {"test", "--out", out};
    EXPECT(bq_args_parse(&args, 3, argv) == BQ_OK && bq_out_lock_mark() == mark + 1);
    EXPECT(bq_args_parse(&args, 3, argv) == BQ_EIO && strstr(bq_errmsg(), "--out") && strstr(bq_errmsg(), "in use"));
    bq_out_unlock_to(mark);

    /* replacing: an existing folder is swapped (its contents come back at tmp), an absent one created */
    char a[320], tmp[330], old[330];
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(tmp, sizeof tmp, "%s/a.tmp", dir);
    snprintf(old, sizeof old, "%s/a.old", dir);
    const char *left = "x";
    EXPECT(mkdir(tmp, 0755) == 0);
    snprintf(p, sizeof p, "%s/v", tmp);
    put_line(p, "first");
    EXPECT(bq_replace_dir(tmp, a, old, &left) == BQ_OK && left == NULL && !bq_is_dir(tmp));
    EXPECT(mkdir(tmp, 0755) == 0);
    put_line(p, "second");
    snprintf(q, sizeof q, "%s/v", a);
    EXPECT(bq_replace_dir(tmp, a, old, &left) == BQ_OK && left != NULL && !strcmp(left, tmp));
    EXPECT(!strcmp(first_line(q), "second") && !strcmp(first_line(p), "first"));

    /* /dev/full fails every write with ENOSPC */
    FILE *f = fopen("/dev/full", "w");
    EXPECT(f != NULL);
    if (f) {
        fputs("data", f);
        EXPECT(bq_fclose_written(f, "/dev/full") == BQ_EIO && strstr(bq_errmsg(), "No space left on device"));
    }
    snprintf(p, sizeof p, "%s/ok.txt", dir);
    f = fopen(p, "w");
    EXPECT(f != NULL);
    if (f) {
        fputs("data", f);
        EXPECT(bq_fclose_written(f, p) == BQ_OK);
    }
    bq_test_rmtree(dir);
    printf("test_out_lock: %d failures, %s\n", fails, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
