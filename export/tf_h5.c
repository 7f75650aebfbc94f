/* Hugging Face TF checkpoint (tf_model.h5) reader.
 * Layout (Keras legacy HDF5 weights, keras/saving/legacy/hdf5_format.py save_weights_to_hdf5_group):
 * root attribute "layer_names" (string array; split into "layer_names0", "layer_names1", ... when
 * large); group /<layer> with attribute "weight_names" (full variable names starting with the model
 * name, e.g. "tf_bert_for_sequence_classification/bert/encoder/layer_._0/attention/self/query/kernel:0"),
 * each stored as dataset /<layer>/<weight name>.
 * Name mapping follows transformers modeling_tf_pytorch_utils.convert_tf_weight_name_to_pt_weight_name:
 * drop ":0", "a___b" path parts become "b", "_._" becomes "/", drop the first (model name) part,
 * kernel/gamma/embeddings -> weight, beta -> bias, join with "."; kernels are transposed. */
#include "export/tf_h5.h"

#include <errno.h>
#include <hdf5.h>
#include <stdint.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "autograd/bq.h"

char *bq_tf_name_to_pt(const char *tf_name, int *transpose) {
    size_t l = strlen(tf_name);
    char *s = bq_malloc(l + 1), *o = bq_malloc(l + 2);
    memcpy(s, tf_name, l + 1);
    if (l >= 2 && strcmp(s + l - 2, ":0") == 0) s[l - 2] = '\0';
    /* split into parts on "/" and "_._" */
    char *parts[256];
    int np = 0;
    for (char *p = s; *p && np < 256;) {
        char *end = p;
        while (*end && *end != '/' && strncmp(end, "_._", 3) != 0) end++;
        int sep = *end == '/' ? 1 : (*end ? 3 : 0);
        char c = *end;
        *end = '\0';
        if (*p) {
            char *tri = strstr(p, "___"); /* "$1___$2" -> "$2" for inner parts */
            parts[np++] = tri ? tri + 3 : p;
        }
        if (!c) break;
        p = end + sep;
    }
    int first = np > 1 ? 1 : 0;
    *transpose = 0;
    if (np > 0) {
        char *last = parts[np - 1];
        if (strcmp(last, "kernel") == 0) *transpose = 1, parts[np - 1] = "weight";
        else if (strcmp(last, "gamma") == 0 || strcmp(last, "embeddings") == 0) parts[np - 1] = "weight";
        else if (strcmp(last, "beta") == 0) parts[np - 1] = "bias";
    }
    size_t k = 0;
    for (int i = first; i < np; i++) {
        size_t pl = strlen(parts[i]);
        if (k) o[k++] = '.';
        memcpy(o + k, parts[i], pl);
        k += pl;
    }
    o[k] = '\0';
    free(s);
    return o;
}

/* Appends the strings of string-array attribute ATTR of obj to (*v, *n). */
static int read_str_attr(hid_t obj, const char *attr, char ***v, int *n, const char *path) {
    hid_t a = H5Aopen(obj, attr, H5P_DEFAULT);
    if (a < 0) return bq_err(BQ_EFORMAT, "%s: cannot open attribute %s", path, attr);
    hid_t t = H5Aget_type(a), sp = H5Aget_space(a);
    hssize_t cnt = H5Sget_simple_extent_npoints(sp);
    int rc = BQ_OK;
    /* Keras stores an empty list (layers without weights, e.g. dropout) as an empty float array */
    if (cnt == 0 || H5Sget_simple_extent_type(sp) == H5S_NULL) goto cleanup;
    if (H5Tget_class(t) != H5T_STRING || cnt < 0 || cnt > 1000000) {
        rc = bq_err(BQ_EFORMAT, "%s: attribute %s is not a string array", path, attr);
        goto cleanup;
    }
    *v = bq_realloc(*v, sizeof(char *) * (size_t)(*n + cnt + 1));
    if (H5Tis_variable_str(t) > 0) {
        char **buf = bq_calloc((size_t)cnt + 1, sizeof(char *));
        hid_t m = H5Tcopy(H5T_C_S1);
        H5Tset_size(m, H5T_VARIABLE);
        if (H5Aread(a, m, buf) < 0) rc = bq_err(BQ_EFORMAT, "%s: cannot read attribute %s", path, attr);
        else
            for (hssize_t i = 0; i < cnt; i++) (*v)[(*n)++] = bq_strdup(buf[i] ? buf[i] : "");
        if (!rc) H5Dvlen_reclaim(m, sp, H5P_DEFAULT, buf);
        H5Tclose(m);
        free(buf);
    } else {
        size_t sz = H5Tget_size(t);
        char *buf = bq_calloc((size_t)cnt * sz + 1, 1);
        if (H5Aread(a, t, buf) < 0) rc = bq_err(BQ_EFORMAT, "%s: cannot read attribute %s", path, attr);
        else
            for (hssize_t i = 0; i < cnt; i++) {
                char *s = bq_calloc(sz + 1, 1);
                memcpy(s, buf + (size_t)i * sz, sz);
                (*v)[(*n)++] = s;
            }
        free(buf);
    }
cleanup:
    H5Sclose(sp), H5Tclose(t), H5Aclose(a);
    return rc;
}

/* Keras's load_attributes_from_hdf5_group: NAME, or NAME0, NAME1, ... when chunked. */
static int read_names(hid_t obj, const char *name, char ***v, int *n, const char *path) {
    *v = NULL, *n = 0;
    if (H5Aexists(obj, name) > 0) return read_str_attr(obj, name, v, n, path);
    /* chunked form: NAME0, NAME1, ... */
    char b[64];
    int rc = BQ_OK;
    for (int k = 0;; k++) {
        snprintf(b, sizeof b, "%s%d", name, k);
        if (H5Aexists(obj, b) <= 0) break;
        if ((rc = read_str_attr(obj, b, v, n, path))) return rc;
    }
    if (*n == 0 && !*v) return bq_err(BQ_EFORMAT, "%s: missing attribute %s (not a Keras/HF TF weights file)", path, name);
    return rc;
}

static void free_names(char **v, int n) {
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
}

void bq_tf_h5_free(BqTfModel *m) {
    for (int i = 0; i < m->n; i++) free(m->t[i].tf_name), free(m->t[i].pt_name), free(m->t[i].data);
    free(m->t);
    m->t = NULL, m->n = 0;
}

static int read_weight(hid_t g, const char *path, const char *layer, const char *wname, BqTfTensor *t) {
    char full[1024];
    snprintf(full, sizeof full, "%s/%s", layer, wname);
    hid_t ds = H5Dopen2(g, wname, H5P_DEFAULT);
    if (ds < 0) return bq_err(BQ_EFORMAT, "%s: weight %s listed in weight_names but missing", path, full);
    hid_t sp = H5Dget_space(ds), ty = H5Dget_type(ds);
    int nd = H5Sget_simple_extent_ndims(sp), rc = BQ_OK;
    hsize_t d[2] = {1, 1};
    if (nd < 1 || nd > 2 || H5Tget_class(ty) != H5T_FLOAT) {
        rc = bq_err(BQ_EFORMAT, "%s: weight %s: expected a float tensor of rank 1 or 2 (rank %d)", path, full, nd);
        goto cleanup;
    }
    H5Sget_simple_extent_dims(sp, d, NULL);
    /* The shape is the file's claim: an unfiltered dataset stores every element, a compressed one at
     * most deflate's 1032:1 ratio, so a small file cannot make us allocate gigabytes. */
    {
        hid_t dcpl = H5Dget_create_plist(ds);
        int filtered = dcpl >= 0 && H5Pget_nfilters(dcpl) > 0;
        if (dcpl >= 0) H5Pclose(dcpl);
        double need = (double)d[0] * (nd == 2 ? (double)d[1] : 1.0) * (double)H5Tget_size(ty);
        double have = (double)H5Dget_storage_size(ds);
        if (need > (filtered ? 1032.0 * have + 65536.0 : have)) {
            rc = bq_err(BQ_EFORMAT, "%s: weight %s: its shape needs %.0f bytes but the file stores %.0f (truncated or corrupt)",
                        path, full, need, have);
            goto cleanup;
        }
    }
    int transpose = 0;
    t->tf_name = bq_strdup(wname);
    t->pt_name = bq_tf_name_to_pt(wname, &transpose);
    if (transpose && nd != 2) {
        rc = bq_err(BQ_EFORMAT, "%s: kernel %s has rank %d, expected 2", path, full, nd);
        goto cleanup;
    }
    size_t numel = (size_t)d[0] * (nd == 2 ? (size_t)d[1] : 1);
    float *raw = bq_malloc(sizeof(float) * (numel ? numel : 1));
    if (H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw) < 0) {
        free(raw);
        rc = bq_err(BQ_EFORMAT, "%s: cannot read weight %s (corrupt?)", path, full);
        goto cleanup;
    }
    t->ndim = nd;
    if (transpose) { /* TF Dense kernel [in, out] -> PyTorch Linear weight [out, in] */
        size_t in = (size_t)d[0], out = (size_t)d[1];
        t->data = bq_malloc(sizeof(float) * (numel ? numel : 1));
        for (size_t i = 0; i < in; i++)
            for (size_t o = 0; o < out; o++) t->data[o * in + i] = raw[i * out + o];
        free(raw);
        t->shape[0] = (int64_t)out, t->shape[1] = (int64_t)in;
    } else {
        t->data = raw;
        t->shape[0] = (int64_t)d[0], t->shape[1] = nd == 2 ? (int64_t)d[1] : 0;
    }
cleanup:
    H5Tclose(ty), H5Sclose(sp), H5Dclose(ds);
    return rc;
}

int bq_tf_h5_read_direct(BqTfModel *out, const char *path) {
    memset(out, 0, sizeof *out);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    FILE *fp = fopen(path, "rb");
    if (!fp) return bq_err(BQ_EIO, "%s: cannot open", path);
    fclose(fp);
    if (H5Fis_hdf5(path) <= 0) return bq_err(BQ_EFORMAT, "%s: not an HDF5 file", path);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return bq_err(BQ_EFORMAT, "%s: cannot open as HDF5 (corrupt?)", path);
    char **layers = NULL;
    int nl = 0, cap = 0, rc;
    hid_t root = H5Gopen2(f, "/", H5P_DEFAULT);
    rc = read_names(root, "layer_names", &layers, &nl, path);
    H5Gclose(root);
    for (int li = 0; li < nl && !rc; li++) {
        hid_t g = H5Gopen2(f, layers[li], H5P_DEFAULT);
        if (g < 0) {
            rc = bq_err(BQ_EFORMAT, "%s: layer group %s listed in layer_names but missing", path, layers[li]);
            break;
        }
        char **w = NULL;
        int nw = 0;
        rc = read_names(g, "weight_names", &w, &nw, path);
        for (int wi = 0; wi < nw && !rc; wi++) {
            if (out->n == cap) {
                cap = cap ? 2 * cap : 64;
                out->t = bq_realloc(out->t, sizeof *out->t * (size_t)cap);
            }
            memset(&out->t[out->n], 0, sizeof out->t[0]);
            rc = read_weight(g, path, layers[li], w[wi], &out->t[out->n]);
            out->n++;
        }
        free_names(w, nw);
        H5Gclose(g);
    }
    free_names(layers, nl);
    H5Fclose(f);
    if (rc) bq_tf_h5_free(out);
    return rc;
}

/* ---- the read in a child process ----
 * libhdf5 1.10 reads out of bounds on some corrupt attribute messages (found by tests/fuzz/fuzz_tf_h5.c:
 * a heap overflow in H5Aexists). tf_model.h5 comes from strangers, so the read runs in a forked child
 * that sends the weights back through a pipe: a crash inside the library becomes an error naming the
 * file. Stream: status, message length and text, then per weight the two names, rank, shape and the
 * floats; a weight count of -1 ends it. */

static int put(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w <= 0) return -1;
        c += w, n -= (size_t)w;
    }
    return 0;
}

static int get(int fd, void *p, size_t n) {
    char *c = p;
    while (n) {
        ssize_t r = read(fd, c, n);
        if (r <= 0) return -1;
        c += r, n -= (size_t)r;
    }
    return 0;
}

static int put_str(int fd, const char *s) {
    uint32_t l = (uint32_t)strlen(s);
    return put(fd, &l, sizeof l) || put(fd, s, l);
}

static char *get_str(int fd) {
    uint32_t l;
    if (get(fd, &l, sizeof l) || l > (1u << 20)) return NULL;
    char *s = bq_malloc((size_t)l + 1);
    if (get(fd, s, l)) {
        free(s);
        return NULL;
    }
    s[l] = 0;
    return s;
}

static void child_send(int fd, const char *path) {
    BqTfModel m;
    signal(SIGPIPE, SIG_IGN); /* a parent that stopped reading ends the child through write errors */
    int32_t rc = bq_tf_h5_read_direct(&m, path);
    if (put(fd, &rc, sizeof rc) || put_str(fd, rc ? bq_errmsg() : "") || rc) return;
    for (int i = 0; i < m.n; i++) {
        const BqTfTensor *t = &m.t[i];
        int32_t more = 1, nd = t->ndim;
        uint64_t numel = (uint64_t)t->shape[0] * (uint64_t)(nd == 2 ? t->shape[1] : 1);
        if (put(fd, &more, sizeof more) || put_str(fd, t->tf_name) || put_str(fd, t->pt_name) ||
            put(fd, &nd, sizeof nd) || put(fd, t->shape, sizeof t->shape) ||
            put(fd, t->data, (size_t)numel * sizeof(float)))
            return;
    }
    int32_t end = -1;
    put(fd, &end, sizeof end);
    bq_tf_h5_free(&m);
}

/* Receives the child's weights into out; BQ_OK, the child's own error, or -1 when the stream broke. */
static int parent_receive(int fd, BqTfModel *out) {
    int32_t rc;
    if (get(fd, &rc, sizeof rc)) return -1;
    char *msg = get_str(fd);
    if (!msg) return -1;
    if (rc) {
        rc = bq_err(rc, "%s", msg);
        free(msg);
        return rc;
    }
    free(msg);
    int cap = 0;
    for (;;) {
        int32_t more;
        if (get(fd, &more, sizeof more)) return -1;
        if (more == -1) return BQ_OK;
        if (out->n == cap) {
            cap = cap ? 2 * cap : 64;
            out->t = bq_realloc(out->t, sizeof *out->t * (size_t)cap);
        }
        BqTfTensor *t = &out->t[out->n];
        memset(t, 0, sizeof *t);
        out->n++;
        int32_t nd;
        if (!(t->tf_name = get_str(fd)) || !(t->pt_name = get_str(fd)) || get(fd, &nd, sizeof nd) ||
            get(fd, t->shape, sizeof t->shape) || (nd != 1 && nd != 2))
            return -1;
        t->ndim = nd;
        size_t numel = (size_t)t->shape[0] * (size_t)(nd == 2 ? t->shape[1] : 1);
        t->data = bq_malloc(sizeof(float) * (numel ? numel : 1));
        if (get(fd, t->data, numel * sizeof(float))) return -1;
    }
}

int bq_tf_h5_read(BqTfModel *out, const char *path) {
    memset(out, 0, sizeof *out);
    int fds[2];
    if (pipe(fds) != 0) return bq_tf_h5_read_direct(out, path);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]), close(fds[1]);
        return bq_tf_h5_read_direct(out, path);
    }
    if (pid == 0) {
        close(fds[0]);
        child_send(fds[1], path);
        _exit(0);
    }
    close(fds[1]);
    int rc = parent_receive(fds[0], out);
    close(fds[0]);
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
    }
    if (rc != BQ_OK && rc != -1) return rc; /* the child's own error, complete */
    if (rc == -1 || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
        bq_tf_h5_free(out);
        if (WIFSIGNALED(ws))
            return bq_err(BQ_EFORMAT, "%s: the HDF5 library crashed reading this file (signal %d): corrupt or not a tf_model.h5",
                          path, WTERMSIG(ws));
        return bq_err(BQ_EFORMAT, "%s: the HDF5 library failed reading this file (exit %d): corrupt or not a tf_model.h5",
                      path, WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
    }
    return BQ_OK;
}
