/* Data parallel over MPI: start-up, the gradient all-reduce in buckets (overlapped
 * with the last backward through the eager grad-ready hook), small
 * collectives, and ending the whole job on a failure. Without KILN_MPI every
 * function is the single-rank identity. Gradients on any device are staged
 * through the host buckets with kiln_tensor_get / _set. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kiln/eager.h"
#include "kiln/train.h"
#ifdef KILN_MPI
#include <mpi.h>
#endif

#define MAX_SUMS 16

/* The process's MPI state: one per process by nature (MPI_COMM_WORLD). */
static struct {
    bool mpi; /* MPI_Init done here */
    int rank, size;
    bool overlap;
    size_t bucket_bytes;
    kiln_dist_stats stats;
} D = {.size = 1, .overlap = true, .bucket_bytes = 25u << 20};

/* Started by a launcher? Returns the world size it announces (0: none). */
static int env_size(void) {
    const char *names[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *v = getenv(names[i]);
        int n = 0;
        if (v && !kiln_parse_int(v, 1, 1 << 20, &n)) return n;
    }
    return getenv("PMIX_RANK") ? 2 : 0; /* PMIx without a size: assume a job */
}

bool kiln_dist_built(void) {
#ifdef KILN_MPI
    return true;
#else
    return false;
#endif
}
int kiln_dist_rank(void) { return D.rank; }
int kiln_dist_size(void) { return D.size; }
void kiln_dist_set_overlap(bool on) { D.overlap = on; }
bool kiln_dist_overlap(void) { return D.overlap; }
void kiln_dist_set_bucket_bytes(size_t bytes) { D.bucket_bytes = bytes ? bytes : 1; }
void kiln_dist_stats_get(kiln_dist_stats *s) { *s = D.stats; }
void kiln_dist_stats_reset(void) {
    int nb = D.stats.n_buckets;
    D.stats = (kiln_dist_stats){.n_buckets = nb};
}

kiln_status kiln_dist_init(int *argc, char ***argv) {
    int n = env_size();
    if (D.size > 1 || n == 0) return KILN_OK;
#ifdef KILN_MPI
    int done = 0;
    MPI_Initialized(&done);
    if (!done && MPI_Init(argc, argv) != MPI_SUCCESS) return kiln_error(KILN_ERR_UNSUPPORTED, "MPI_Init failed");
    D.mpi = !done;
    MPI_Comm_rank(MPI_COMM_WORLD, &D.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &D.size);
    /* ranks on one machine share its cores unless OMP_NUM_THREADS says otherwise */
    MPI_Comm node;
    int local = 1;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, D.rank, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        MPI_Comm_size(node, &local);
        MPI_Comm_free(&node);
    }
    if (!getenv("OMP_NUM_THREADS") && local > 1) {
        int t = kiln_num_threads() / local;
        kiln_set_num_threads(t > 0 ? t : 1);
    }
    return KILN_OK;
#else
    (void)argc, (void)argv;
    if (n <= 1) return KILN_OK;
    return kiln_error(KILN_ERR_UNSUPPORTED,
                      "started by mpirun with %d processes, but this kiln was built without MPI support: each process "
                      "would train alone. Install Open MPI (scripts/deps.sh installs openmpi-bin and libopenmpi-dev), "
                      "then `make clean && make` (the Makefile uses mpicc when it finds it)", n);
#endif
}

void kiln_dist_finalize(void) {
#ifdef KILN_MPI
    int fin = 0;
    if (D.mpi && MPI_Finalized(&fin) == MPI_SUCCESS && !fin) MPI_Finalize();
#endif
    D.mpi = false;
}

_Noreturn void kiln_dist_abort(const char *why) {
    fprintf(stderr, "kiln: rank %d of %d: %s\n", D.rank, D.size, why ? why : "failed");
    fflush(stderr);
#ifdef KILN_MPI
    if (D.size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
#endif
    exit(1);
}

#ifdef KILN_MPI
static kiln_status reduce_i64(int64_t *v, int n, MPI_Op op) {
    if (D.size <= 1 || n <= 0) return KILN_OK;
    double t0 = kiln_time_now();
    int rc = MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_INT64_T, op, MPI_COMM_WORLD);
    D.stats.wait_s += kiln_time_now() - t0;
    D.stats.other_calls++;
    return rc == MPI_SUCCESS ? KILN_OK : kiln_error(KILN_ERR_IO, "MPI_Allreduce failed (%d)", rc);
}
kiln_status kiln_dist_sum_i64(int64_t *v, int n) { return reduce_i64(v, n, MPI_SUM); }
kiln_status kiln_dist_max_i64(int64_t *v, int n) { return reduce_i64(v, n, MPI_MAX); }
kiln_status kiln_dist_barrier(void) {
    if (D.size <= 1) return KILN_OK;
    double t0 = kiln_time_now();
    int rc = MPI_Barrier(MPI_COMM_WORLD);
    D.stats.wait_s += kiln_time_now() - t0;
    return rc == MPI_SUCCESS ? KILN_OK : kiln_error(KILN_ERR_IO, "MPI_Barrier failed (%d)", rc);
}

/* ---- gradient buckets ------------------------------------------------------ */
/* Bucket b holds params[hi] down to params[lo] (reverse order: backward
 * finishes the last layers first), packed into one float buffer. Buckets
 * are started strictly in index order, so every rank issues the same
 * sequence of collectives whatever order its hooks fire in. The last
 * bucket also carries the window's sums (as hi/lo float pairs) and is
 * started only after backward. */
typedef struct {
    int hi, lo;
    int64_t n; /* gradient floats */
    float *buf;
    int pending; /* parameters not yet final in this backward */
    bool posted;
    MPI_Request req;
} bucket;

typedef struct {
    const kiln_adamw *o;
    kiln_tensor **params; /* copy of o->params at build time (detects a new optimiser) */
    int n, nb;
    size_t bucket_bytes;
    bucket *b;
    int *bucket_of;                /* per parameter */
    struct pidx { kiln_tensor *p; int i; } *map; /* by address */
    int next; /* first bucket not started */
    kiln_status failed; /* a bucket that could not be packed (reported after the collectives) */
} layout;

static layout L;

static void layout_free(void) {
    for (int i = 0; i < L.nb; i++) free(L.b[i].buf);
    free(L.b);
    free(L.bucket_of);
    free(L.map);
    free(L.params);
    L = (layout){0};
}

static int cmp_pidx(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)((const struct pidx *)a)->p, y = (uintptr_t)((const struct pidx *)b)->p;
    return (x > y) - (x < y);
}

static kiln_status layout_build(const kiln_adamw *o) {
    if (L.o == o && L.n == o->n && L.bucket_bytes == D.bucket_bytes && !memcmp(L.params, o->params, sizeof *o->params * (size_t)o->n))
        return KILN_OK;
    layout_free();
    L.o = o, L.n = o->n, L.bucket_bytes = D.bucket_bytes;
    L.params = malloc(sizeof *L.params * (size_t)(o->n + 1));
    L.b = calloc((size_t)o->n + 1, sizeof *L.b);
    L.bucket_of = malloc(sizeof(int) * (size_t)(o->n + 1));
    L.map = malloc(sizeof *L.map * (size_t)(o->n + 1));
    if (!L.params || !L.b || !L.bucket_of || !L.map) goto oom;
    memcpy(L.params, o->params, sizeof *o->params * (size_t)o->n);
    int64_t cap = (int64_t)(D.bucket_bytes / sizeof(float));
    for (int i = o->n - 1; i >= 0; i--) {
        bucket *b = &L.b[L.nb ? L.nb - 1 : 0];
        int64_t len = kiln_tensor_numel(o->params[i]);
        if (!L.nb || (b->n > 0 && b->n + len > cap)) {
            b = &L.b[L.nb++];
            b->hi = i;
        }
        b->lo = i;
        b->n += len;
        L.bucket_of[i] = (int)(b - L.b);
        L.map[i] = (struct pidx){o->params[i], i};
    }
    if (!L.nb) L.nb = 1; /* nothing trainable: the sums still travel */
    for (int k = 0; k < L.nb; k++) {
        int64_t extra = k == L.nb - 1 ? 2 * MAX_SUMS : 0;
        if (!(L.b[k].buf = malloc(sizeof(float) * (size_t)(L.b[k].n + extra)))) goto oom;
    }
    qsort(L.map, (size_t)o->n, sizeof *L.map, cmp_pidx);
    D.stats.n_buckets = L.nb;
    return KILN_OK;
oom:
    layout_free();
    return kiln_error(KILN_ERR_OOM, "out of memory for the gradient buckets");
}

/* The bucket's gradients into its host buffer (read through the seam). */
static void pack(bucket *b) {
    float *p = b->buf;
    for (int i = b->hi; b->n && i >= b->lo; i--) {
        kiln_tensor *t = L.o->params[i];
        int64_t len = kiln_tensor_numel(t);
        kiln_status st = KILN_OK;
        if (t->grad) st = kiln_tensor_get(t->grad, 0, p, sizeof(float) * (size_t)len);
        else memset(p, 0, sizeof(float) * (size_t)len);
        if (st && !L.failed) L.failed = st; /* the collective still runs: every rank must reach it */
        p += len;
    }
}

static kiln_status unpack(bucket *b) {
    const float *p = b->buf;
    for (int i = b->hi; b->n && i >= b->lo; i--) {
        kiln_tensor *t = L.o->params[i];
        int64_t len = kiln_tensor_numel(t);
        if (!t->grad && !(t->grad = kiln_tensor_zeros_on(kiln_tensor_buft(t), KILN_F32, t->ndim, t->shape)))
            return kiln_last_status();
        kiln_status st = kiln_tensor_set(t->grad, 0, p, sizeof(float) * (size_t)len);
        if (st) return st;
        p += len;
    }
    return KILN_OK;
}

static void post(bucket *b, int extra) {
    pack(b);
    MPI_Iallreduce(MPI_IN_PLACE, b->buf, (int)(b->n + extra), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &b->req);
    b->posted = true;
    D.stats.grad_calls++;
    D.stats.bytes += (double)b->n * sizeof(float);
}

/* Drives the posted collectives: Open MPI progresses them only inside MPI calls. */
static void poke(void) {
    for (int k = 0; k < L.next; k++) {
        int done = 0;
        if (L.b[k].req != MPI_REQUEST_NULL) MPI_Test(&L.b[k].req, &done, MPI_STATUS_IGNORE);
    }
}

static void on_grad_ready(kiln_tensor *p, void *user) {
    (void)user;
    double t0 = kiln_time_now();
    struct pidx key = {p, 0}, *hit = bsearch(&key, L.map, (size_t)L.n, sizeof *L.map, cmp_pidx);
    if (!hit) return;
    L.b[L.bucket_of[hit->i]].pending--;
    while (L.next < L.nb - 1 && L.b[L.next].pending <= 0) post(&L.b[L.next++], 0);
    poke();
    D.stats.hook_s += kiln_time_now() - t0;
}

void kiln_dist_grads_arm(kiln_adamw *o) {
    if (D.size <= 1 || layout_build(o)) return; /* on OOM, allreduce_grads reports it */
    for (int k = 0; k < L.nb; k++) {
        L.b[k].pending = L.b[k].n ? L.b[k].hi - L.b[k].lo + 1 : 0;
        L.b[k].posted = false;
        L.b[k].req = MPI_REQUEST_NULL;
    }
    L.next = 0;
    kiln_set_grad_ready_hook(on_grad_ready, NULL);
}

kiln_status kiln_dist_allreduce_grads(kiln_adamw *o, double *sums, int n) {
    bool armed = L.o == o && L.next >= 0;
    kiln_set_grad_ready_hook(NULL, NULL);
    if (D.size <= 1) return KILN_OK;
    if (n > MAX_SUMS) return kiln_error(KILN_ERR_INVALID, "kiln_dist_allreduce_grads: %d sums (at most %d)", n, MAX_SUMS);
    kiln_status st = layout_build(o);
    if (st) return st;
    if (!armed || !D.overlap) {
        L.next = 0;
        for (int k = 0; k < L.nb; k++) L.b[k].posted = false, L.b[k].req = MPI_REQUEST_NULL;
    }
    bucket *last = &L.b[L.nb - 1];
    float *tail = last->buf + last->n;
    for (int i = 0; i < n; i++) {
        float hi = (float)sums[i];
        tail[2 * i] = hi;
        tail[2 * i + 1] = (float)(sums[i] - (double)hi);
    }
    double t0;
    if (!D.overlap) { /* one blocking all-reduce after another */
        for (int k = 0; k < L.nb; k++) {
            bucket *b = &L.b[k];
            pack(b);
            t0 = kiln_time_now();
            MPI_Allreduce(MPI_IN_PLACE, b->buf, (int)(b->n + (k == L.nb - 1 ? 2 * n : 0)), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            D.stats.wait_s += kiln_time_now() - t0;
            D.stats.grad_calls++;
            D.stats.bytes += (double)b->n * sizeof(float);
            if ((st = unpack(b))) return st;
        }
    } else {
        while (L.next < L.nb) {
            int k = L.next++;
            post(&L.b[k], k == L.nb - 1 ? 2 * n : 0);
        }
        for (int k = 0; k < L.nb; k++) {
            t0 = kiln_time_now();
            MPI_Wait(&L.b[k].req, MPI_STATUS_IGNORE);
            D.stats.wait_s += kiln_time_now() - t0;
            if ((st = unpack(&L.b[k]))) return st;
        }
    }
    if (L.failed) {
        st = kiln_error_context(L.failed, "packing the gradient buckets");
        L.failed = KILN_OK;
        return st;
    }
    for (int i = 0; i < n; i++) sums[i] = (double)tail[2 * i] + (double)tail[2 * i + 1];
    L.next = -1; /* disarmed until the next kiln_dist_grads_arm */
    D.stats.steps++;
    return KILN_OK;
}
#else
kiln_status kiln_dist_sum_i64(int64_t *v, int n) { (void)v, (void)n; return KILN_OK; }
kiln_status kiln_dist_max_i64(int64_t *v, int n) { (void)v, (void)n; return KILN_OK; }
kiln_status kiln_dist_barrier(void) { return KILN_OK; }
void kiln_dist_grads_arm(kiln_adamw *o) { (void)o; }
kiln_status kiln_dist_allreduce_grads(kiln_adamw *o, double *sums, int n) {
    (void)o, (void)sums, (void)n;
    return KILN_OK;
}
#endif
