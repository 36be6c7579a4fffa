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
size_t kiln_dist_bucket_bytes(void) { return D.bucket_bytes; }
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
static kiln_status reduce(void *v, int n, MPI_Datatype type, MPI_Op op) {
    if (D.size <= 1 || n <= 0) return KILN_OK;
    double t0 = kiln_time_now();
    int rc = MPI_Allreduce(MPI_IN_PLACE, v, n, type, op, MPI_COMM_WORLD);
    D.stats.wait_s += kiln_time_now() - t0;
    D.stats.other_calls++;
    return rc == MPI_SUCCESS ? KILN_OK : kiln_error(KILN_ERR_IO, "MPI_Allreduce failed (%d)", rc);
}
kiln_status kiln_dist_sum_i64(int64_t *v, int n) { return reduce(v, n, MPI_INT64_T, MPI_SUM); }
kiln_status kiln_dist_max_i64(int64_t *v, int n) { return reduce(v, n, MPI_INT64_T, MPI_MAX); }
kiln_status kiln_dist_sum_f64(double *v, int n) { return reduce(v, n, MPI_DOUBLE, MPI_SUM); }
kiln_status kiln_dist_barrier(void) {
    if (D.size <= 1) return KILN_OK;
    double t0 = kiln_time_now();
    int rc = MPI_Barrier(MPI_COMM_WORLD);
    D.stats.wait_s += kiln_time_now() - t0;
    return rc == MPI_SUCCESS ? KILN_OK : kiln_error(KILN_ERR_IO, "MPI_Barrier failed (%d)", rc);
}


/* ---- gradient buckets ------------------------------------------------------ */
/* Bucket b holds params[hi] down to params[lo] (reverse order: backward
 * finishes the last layers first; kiln_grad_buckets), packed into one float
 * buffer. Buckets are started strictly in index order, so every rank issues
 * the same sequence of collectives whatever order its hooks fire in.
 *   unsharded and --shard optimizer: one all-reduce per bucket, once per
 *   window; each bucket has its buffer; the last also carries the window's
 *   sums (as hi/lo float pairs) and is started only after backward.
 *   --shard gradients: after every micro-batch, each bucket's sum reaches
 *   this rank's piece (blocking: MPI_Reduce_scatter; overlapped: an
 *   in-place MPI_Iallreduce of the send buffer, which Open MPI runs 3x
 *   faster than its MPI_Ireduce_scatter), added into the gradient shard (zero->g); the
 *   full gradients of a bucket are dropped once packed, and at most POOL
 *   buckets are in flight (POOL send buffers), so no full-size gradient or
 *   buffer outlives its micro-batch. The sums travel in an all-reduce of
 *   their own. */
enum { POOL = 4 };

typedef struct {
    kiln_grad_bucket g; /* which parameters (kiln_grad_buckets) */
    int hi, lo;
    int64_t n; /* gradient floats */
    float *buf; /* unsharded: its own; gradients: the pool slot's while in flight */
    int pending; /* parameters not yet final in this backward */
    bool posted;
    MPI_Request req;
} bucket;

typedef struct {
    const kiln_adamw *o;
    kiln_tensor **params; /* copy of o->params at build time (detects a new optimiser) */
    kiln_zero *zero;      /* o->zero: the shard's layout (NULL: unsharded) */
    bool scatter;         /* --shard gradients */
    int n, nb;
    size_t bucket_bytes;
    bucket *b;
    int *bucket_of, *parts;        /* per parameter: its first bucket, and how many hold pieces of it */
    struct pidx { kiln_tensor *p; int i; } *map; /* by address */
    int next; /* first bucket not started */
    int64_t max_n, max_piece;
    float *pool[POOL], *recv[POOL], *acc; /* gradients: send buffers, received pieces, the shard's piece (device copy) */
    int busy[POOL];                       /* the bucket in flight in each slot (-1: none) */
    const float *piece[POOL];             /* where that bucket's piece for this rank arrives */
    int *counts, *displs;                 /* per rank, for the current bucket */
    float *gather;                        /* all-gather buffer (sharded) */
    double buffer_bytes;
    kiln_status failed; /* a bucket that could not be packed (reported after the collectives) */
} layout;

static layout L;

static void layout_free(void) {
    for (int i = 0; !L.scatter && i < L.nb; i++) free(L.b[i].buf);
    for (int i = 0; i < POOL; i++) free(L.pool[i]), free(L.recv[i]);
    free(L.acc);
    free(L.gather);
    free(L.counts);
    free(L.displs);
    free(L.b);
    free(L.bucket_of);
    free(L.parts);
    free(L.map);
    free(L.params);
    L = (layout){0};
}

double kiln_dist_buffer_bytes(void) { return L.buffer_bytes; }

static int cmp_pidx(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)((const struct pidx *)a)->p, y = (uintptr_t)((const struct pidx *)b)->p;
    return (x > y) - (x < y);
}

static float *fbuf(int64_t n) {
    float *p = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (p) L.buffer_bytes += sizeof(float) * (double)(n ? n : 1);
    return p;
}

static kiln_status layout_build(const kiln_adamw *o) {
    size_t bb = o->zero ? o->zero->bucket_bytes : D.bucket_bytes;
    if (L.o == o && L.n == o->n && L.bucket_bytes == bb && L.zero == o->zero &&
        !memcmp(L.params, o->params, sizeof *o->params * (size_t)o->n))
        return KILN_OK;
    layout_free();
    L.o = o, L.n = o->n, L.bucket_bytes = bb, L.zero = o->zero;
    L.scatter = o->zero && o->zero->mode == KILN_SHARD_GRADIENTS;
    L.params = malloc(sizeof *L.params * (size_t)(o->n + 1));
    L.bucket_of = malloc(sizeof(int) * (size_t)(o->n + 1));
    L.parts = calloc((size_t)o->n + 1, sizeof(int));
    L.map = malloc(sizeof *L.map * (size_t)(o->n + 1));
    L.nb = o->zero ? o->zero->nb : kiln_grad_buckets(o->params, o->n, bb, NULL);
    kiln_grad_bucket *gb = o->zero ? NULL : malloc(sizeof *gb * (size_t)L.nb);
    free(L.b);
    L.b = calloc((size_t)L.nb, sizeof *L.b);
    L.counts = malloc(sizeof(int) * (size_t)D.size);
    L.displs = malloc(sizeof(int) * (size_t)D.size);
    if (!L.params || !L.b || !L.bucket_of || !L.parts || !L.map || (!o->zero && !gb) || !L.counts || !L.displs) {
        free(gb);
        goto oom;
    }
    if (gb) kiln_grad_buckets(o->params, o->n, bb, gb);
    memcpy(L.params, o->params, sizeof *o->params * (size_t)o->n);
    for (int k = 0; k < L.nb; k++) {
        const kiln_grad_bucket *g = o->zero ? &o->zero->b[k] : &gb[k];
        L.b[k].g = *g, L.b[k].hi = g->hi, L.b[k].lo = g->lo, L.b[k].n = g->n;
        for (int i = g->hi; g->n && i >= g->lo; i--) {
            if (!L.parts[i]++) L.bucket_of[i] = k;
            L.map[i] = (struct pidx){o->params[i], i};
        }
        if (g->n > L.max_n) L.max_n = g->n;
        for (int r = 0; o->zero && r < D.size; r++) {
            const int64_t *c = o->zero->chunk + (size_t)k * (size_t)(D.size + 1);
            if (c[r + 1] - c[r] > L.max_piece) L.max_piece = c[r + 1] - c[r];
        }
    }
    free(gb);
    if (L.scatter) {
        for (int i = 0; i < POOL; i++) {
            L.busy[i] = -1;
            if (i < L.nb && (!(L.pool[i] = fbuf(L.max_n)) || !(L.recv[i] = fbuf(L.max_piece)))) goto oom;
        }
        if (!(L.acc = fbuf(L.max_piece))) goto oom;
    } else {
        for (int k = 0; k < L.nb; k++) {
            int64_t extra = k == L.nb - 1 ? 2 * MAX_SUMS : 0;
            if (!(L.b[k].buf = fbuf(L.b[k].n + extra))) goto oom;
        }
    }
    if (o->zero && !(L.gather = fbuf(L.max_n))) goto oom;
    qsort(L.map, (size_t)o->n, sizeof *L.map, cmp_pidx);
    D.stats.n_buckets = L.nb;
    return KILN_OK;
oom:
    layout_free();
    return kiln_error(KILN_ERR_OOM, "out of memory for the gradient buckets");
}

/* The bucket's gradients into buf (read through the seam); with
 * --shard gradients each gradient is dropped once read. */
static void pack(bucket *b, float *buf) {
    float *p = buf;
    for (int i = b->hi; b->n && i >= b->lo; i--) {
        kiln_tensor *t = L.o->params[i];
        int64_t off, len = kiln_bucket_part(&b->g, L.o->params, i, &off);
        kiln_status st = KILN_OK;
        if (t->grad) st = kiln_tensor_get(t->grad, sizeof(float) * (size_t)off, p, sizeof(float) * (size_t)len);
        else memset(p, 0, sizeof(float) * (size_t)len);
        if (st && !L.failed) L.failed = st; /* the collective still runs: every rank must reach it */
        if (L.scatter && t->grad && off + len == kiln_tensor_numel(t)) { /* its last piece */
            kiln_tensor_release(t->grad);
            t->grad = NULL;
        }
        p += len;
    }
}

static kiln_status unpack(bucket *b) {
    const float *p = b->buf;
    for (int i = b->hi; b->n && i >= b->lo; i--) {
        kiln_tensor *t = L.o->params[i];
        int64_t off, len = kiln_bucket_part(&b->g, L.o->params, i, &off);
        if (!t->grad && !(t->grad = kiln_tensor_zeros_on(kiln_tensor_buft(t), KILN_F32, t->ndim, t->shape)))
            return kiln_last_status();
        kiln_status st = kiln_tensor_set(t->grad, sizeof(float) * (size_t)off, p, sizeof(float) * (size_t)len);
        if (st) return st;
        p += len;
    }
    return KILN_OK;
}

/* Rank r's piece of bucket k: counts and displacements for MPI. */
static void pieces(int k) {
    const int64_t *c = L.zero->chunk + (size_t)k * (size_t)(D.size + 1);
    for (int r = 0; r < D.size; r++) L.counts[r] = (int)(c[r + 1] - c[r]), L.displs[r] = (int)c[r];
}

/* --shard gradients: bucket k's reduce-scatter is done; its piece goes into
 * the shard (set on the window's first micro-batch, added after). */
static kiln_status finish(int slot) {
    int k = L.busy[slot];
    if (k < 0) return KILN_OK;
    double t0 = kiln_time_now();
    MPI_Wait(&L.b[k].req, MPI_STATUS_IGNORE);
    double dt = kiln_time_now() - t0;
    D.stats.wait_s += dt, D.stats.grad_wait_s += dt;
    L.busy[slot] = -1;
    L.b[k].buf = NULL;
    kiln_zero *z = L.zero;
    const int64_t *c = z->chunk + (size_t)k * (size_t)(D.size + 1);
    int64_t n = c[z->rank + 1] - c[z->rank];
    if (!n) return KILN_OK;
    size_t at = sizeof(float) * (size_t)z->at[k], bytes = sizeof(float) * (size_t)n;
    const float *got = L.piece[slot];
    if (!z->g_micro) return kiln_tensor_set(z->g, at, got, bytes);
    kiln_status st = kiln_tensor_get(z->g, at, L.acc, bytes);
    for (int64_t i = 0; !st && i < n; i++) L.acc[i] += got[i];
    return st ? st : kiln_tensor_set(z->g, at, L.acc, bytes);
}

static kiln_status post(bucket *b, int extra) {
    int k = (int)(b - L.b);
    kiln_status st = KILN_OK;
    if (L.scatter) {
        int slot = k % POOL;
        st = finish(slot); /* the bucket POOL before this one */
        b->buf = L.pool[slot];
        pack(b, b->buf);
        pieces(k);
        if (D.overlap) {
            /* Open MPI 4.1's non-blocking reduce-scatter (libnbc) measured 3x slower than its non-blocking all-reduce
             * on one host (25 MB: 62-71 ms vs 17-24 ms at 4 ranks, 20 vs 12 ms at 2): the all-reduce, in place in
             * the send buffer, and this rank keeps its piece */
            MPI_Iallreduce(MPI_IN_PLACE, b->buf, (int)b->n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &b->req);
            L.piece[slot] = b->buf + L.displs[L.zero->rank];
        } else { /* the blocking collective: Open MPI's tuned ones beat its non-blocking schedules 2-4x on one host */
            double t0 = kiln_time_now();
            MPI_Reduce_scatter(b->buf, L.recv[slot], L.counts, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            double dt = kiln_time_now() - t0;
            D.stats.wait_s += dt, D.stats.grad_wait_s += dt;
            b->req = MPI_REQUEST_NULL;
            L.piece[slot] = L.recv[slot];
        }
        L.busy[slot] = k;
    } else {
        pack(b, b->buf);
        MPI_Iallreduce(MPI_IN_PLACE, b->buf, (int)(b->n + extra), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &b->req);
    }
    b->posted = true;
    D.stats.grad_calls++;
    D.stats.bytes += (double)b->n * sizeof(float);
    return st;
}

/* Drives the posted collectives: Open MPI progresses them only inside MPI calls. */
static void poke(void) {
    for (int k = 0; k < L.next; k++) {
        int done = 0;
        if (L.b[k].posted && L.b[k].req != MPI_REQUEST_NULL) MPI_Test(&L.b[k].req, &done, MPI_STATUS_IGNORE);
    }
}

static void on_grad_ready(kiln_tensor *p, void *user) {
    (void)user;
    double t0 = kiln_time_now();
    struct pidx key = {p, 0}, *hit = bsearch(&key, L.map, (size_t)L.n, sizeof *L.map, cmp_pidx);
    if (!hit) return;
    for (int j = 0; j < L.parts[hit->i]; j++) L.b[L.bucket_of[hit->i] + j].pending--;
    /* unsharded, the last bucket waits for the sums; reduce-scatters need not */
    int last = L.scatter ? L.nb : L.nb - 1;
    while (L.next < last && L.b[L.next].pending <= 0) {
        kiln_status st = post(&L.b[L.next++], 0);
        if (st && !L.failed) L.failed = st;
    }
    poke();
    D.stats.hook_s += kiln_time_now() - t0;
}

static void reset_buckets(void) {
    for (int k = 0; k < L.nb; k++) {
        L.b[k].pending = L.b[k].n ? L.b[k].hi - L.b[k].lo + 1 : 0;
        L.b[k].posted = false;
        L.b[k].req = MPI_REQUEST_NULL;
    }
    L.next = 0;
}

void kiln_dist_grads_arm(kiln_adamw *o) {
    if (D.size <= 1 || layout_build(o)) return; /* on OOM, allreduce_grads reports it */
    reset_buckets();
    kiln_set_grad_ready_hook(on_grad_ready, NULL);
}

static kiln_status take_failure(void) {
    if (!L.failed) return KILN_OK;
    kiln_status st = kiln_error_context(L.failed, "packing the gradient buckets");
    L.failed = KILN_OK;
    return st;
}

/* --shard gradients: the rest of this micro-batch's buckets, then every
 * piece into the shard. */
static kiln_status scatter_all(bool armed) {
    if (!armed || !D.overlap) reset_buckets();
    kiln_status st = KILN_OK;
    while (L.next < L.nb) {
        int k = L.next++;
        kiln_status s2 = post(&L.b[k], 0);
        if (!D.overlap && !s2) s2 = finish(k % POOL); /* one blocking collective after another */
        if (s2 && !st) st = s2;
    }
    for (int i = 0; i < POOL; i++) {
        kiln_status s2 = finish(i);
        if (s2 && !st) st = s2;
    }
    if (!st) st = take_failure();
    L.zero->g_micro++;
    return st;
}

kiln_status kiln_dist_reduce_micro(kiln_adamw *o) {
    bool armed = L.o == o && L.next >= 0;
    kiln_set_grad_ready_hook(NULL, NULL);
    if (D.size <= 1 || !o->zero || o->zero->mode != KILN_SHARD_GRADIENTS) return KILN_OK;
    kiln_status st = layout_build(o);
    if (st) return st;
    st = scatter_all(armed);
    L.next = -1;
    return st;
}

kiln_status kiln_dist_allreduce_grads(kiln_adamw *o, double *sums, int n) {
    bool armed = L.o == o && L.next >= 0;
    kiln_set_grad_ready_hook(NULL, NULL);
    if (D.size <= 1) return KILN_OK;
    if (n > MAX_SUMS) return kiln_error(KILN_ERR_INVALID, "kiln_dist_allreduce_grads: %d sums (at most %d)", n, MAX_SUMS);
    kiln_status st = layout_build(o);
    if (st) return st;
    double t0;
    if (L.scatter) {
        st = scatter_all(armed);
        kiln_status s2 = kiln_dist_sum_f64(sums, n); /* every rank reaches it, also after a failure */
        D.stats.other_calls--;                       /* counted as part of the step's gradient exchange */
        L.next = -1;
        D.stats.steps++;
        return st ? st : s2;
    }
    if (!armed || !D.overlap) reset_buckets();
    bucket *last = &L.b[L.nb - 1];
    float *tail = last->buf + last->n;
    for (int i = 0; i < n; i++) {
        float hi = (float)sums[i];
        tail[2 * i] = hi;
        tail[2 * i + 1] = (float)(sums[i] - (double)hi);
    }
    if (!D.overlap) { /* one blocking all-reduce after another */
        for (int k = 0; k < L.nb; k++) {
            bucket *b = &L.b[k];
            pack(b, b->buf);
            t0 = kiln_time_now();
            MPI_Allreduce(MPI_IN_PLACE, b->buf, (int)(b->n + (k == L.nb - 1 ? 2 * n : 0)), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            double dt = kiln_time_now() - t0;
            D.stats.wait_s += dt, D.stats.grad_wait_s += dt;
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
            double dt = kiln_time_now() - t0;
            D.stats.wait_s += dt, D.stats.grad_wait_s += dt;
            if ((st = unpack(&L.b[k]))) return st;
        }
    }
    if ((st = take_failure())) return st;
    for (int i = 0; i < n; i++) sums[i] = (double)tail[2 * i] + (double)tail[2 * i + 1];
    L.next = -1; /* disarmed until the next kiln_dist_grads_arm */
    D.stats.steps++;
    return KILN_OK;
}

/* ---- sharded parameters back to every rank ---------------------------------- */
kiln_status kiln_dist_gather_params(kiln_adamw *o) {
    if (D.size <= 1 || !o->zero) return KILN_OK;
    kiln_status st = layout_build(o), first = KILN_OK;
    if (st) return st;
    const kiln_zero *z = o->zero;
    for (int k = 0; k < L.nb; k++) {
        bucket *b = &L.b[k];
        const int64_t *c = z->chunk + (size_t)k * (size_t)(D.size + 1);
        /* this rank's piece of the bucket's parameters, in place */
        int64_t lo = c[z->rank], hi = c[z->rank + 1], start = 0;
        for (int i = b->hi; b->n && i >= b->lo; i--) {
            kiln_tensor *p = o->params[i];
            int64_t off, len = kiln_bucket_part(&b->g, o->params, i, &off);
            int64_t a = lo > start ? lo : start, e = hi < start + len ? hi : start + len;
            if (a < e && (st = kiln_tensor_get(p, sizeof(float) * (size_t)(off + a - start), L.gather + a,
                                               sizeof(float) * (size_t)(e - a))) && !first)
                first = st;
            start += len;
        }
        pieces(k);
        double t0 = kiln_time_now();
        MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, L.gather, L.counts, L.displs, MPI_FLOAT, MPI_COMM_WORLD);
        D.stats.wait_s += kiln_time_now() - t0;
        D.stats.gather_calls++;
        start = 0;
        for (int i = b->hi; b->n && i >= b->lo; i--) {
            kiln_tensor *p = o->params[i];
            int64_t off, len = kiln_bucket_part(&b->g, o->params, i, &off);
            if ((st = kiln_tensor_set(p, sizeof(float) * (size_t)off, L.gather + start, sizeof(float) * (size_t)len)) && !first)
                first = st;
            start += len;
        }
    }
    return first ? kiln_error_context(first, "gathering the updated parameters") : KILN_OK;
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
kiln_status kiln_dist_sum_f64(double *v, int n) { (void)v, (void)n; return KILN_OK; }
kiln_status kiln_dist_reduce_micro(kiln_adamw *o) { (void)o; return KILN_OK; }
kiln_status kiln_dist_gather_params(kiln_adamw *o) { (void)o; return KILN_OK; }
double kiln_dist_buffer_bytes(void) { return 0; }
#endif
