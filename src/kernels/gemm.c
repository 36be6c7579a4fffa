/* kiln_gemm: every matrix product of kiln goes through here. An fp32
 * product runs one of five implementations, chosen per problem by
 * measurement (see "The choice" below): oneDNN's matmul primitive, oneDNN's
 * BLAS-style dnnl_sgemm, kiln's own packed GEMM (kiln_k_gemm_f32, one form
 * per instruction set), or OpenBLAS's or BLIS's cblas_sgemm where their
 * OpenMP builds are installed (blas_peers.c). bf16 products run the matmul
 * primitive or kiln's bf16 kernel.
 *
 * Creating a matmul primitive JIT-compiles code (tens to hundreds of µs), so
 * each distinct problem (shape, strides, transposes, alpha, beta, dtype) gets
 * one primitive, created on first use and kept in a mutex-guarded hash map.
 * Data pointers are bound per call by creating the three memory objects on
 * the stack of the call: that costs about a microsecond (measured in
 * bench/gemm.c), far below any GEMM worth calling, and keeps execution free
 * of shared mutable state.
 *
 * Thread safety: oneDNN's default (library) scratchpad is shared by all
 * primitives and ties a primitive to the thread that created it. We use
 * user-managed scratchpads held per thread instead, so any thread may run
 * any cached primitive, concurrently with others.
 *
 * Transposes and leading dimensions are expressed as strides in the memory
 * descriptors; batches as a leading dimension (stride 0 = broadcast, which
 * oneDNN expresses as a batch dimension of 1). Layouts oneDNN does not
 * implement as one batched primitive (e.g. interleaved head views) fall back
 * to a 2-D primitive run once per batch element.
 */
#include <errno.h>
#include <fcntl.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dnnl.h>

#include "kiln/kernels.h"
#include "kiln/simd.h"

#include "blas_peers.h"

size_t kiln_gemm_cache_entries(void); /* for tests; not in the public header */

enum { DT_F32 = 0, DT_BF16 = 1 };

/* Everything that determines the primitive. Built with memset so padding
 * bytes are zero and the key can be hashed and compared as bytes. A oneDNN
 * primitive keeps the thread count it was created with, so that is part of
 * the key too (kiln_set_num_threads then just works). */
typedef struct {
    int32_t dtype, transA, transB, nthreads;
    int64_t M, N, K, lda, ldb, ldc, batch, strideA, strideB, strideC;
    float alpha, beta;
} gemm_key;

typedef struct gemm_entry {
    gemm_key key;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t md_a, md_b, md_c; /* per batch element if loop_batch */
    dnnl_memory_desc_t md_s;             /* scratchpad */
    size_t scratch_bytes;
    bool loop_batch;
    int choice; /* fp32: the implementation (IMPL_*) once chosen, else -1 */
    struct gemm_entry *next;
} gemm_entry;

#define N_BUCKETS 256

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static gemm_entry *g_buckets[N_BUCKETS];
static size_t g_entries;
static dnnl_engine_t g_engine;
static dnnl_stream_t g_stream;

/* Per-thread scratchpad, grown on demand, freed when its thread exits. */
typedef struct {
    void *p;
    size_t bytes;
} scratch_buf;
static pthread_key_t g_scratch_key;
static pthread_once_t g_scratch_once = PTHREAD_ONCE_INIT;
static int g_scratch_key_ok;

static void scratch_free(void *p) {
    scratch_buf *s = p;
    if (s) free(s->p);
    free(s);
}
static void scratch_key_init(void) {
    g_scratch_key_ok = pthread_key_create(&g_scratch_key, scratch_free) == 0;
}

static kiln_status dnnl_to_kiln(dnnl_status_t s) {
    switch (s) {
    case dnnl_out_of_memory: return KILN_ERR_OOM;
    case dnnl_invalid_arguments: return KILN_ERR_INVALID;
    default: return KILN_ERR_UNSUPPORTED;
    }
}

static kiln_status fail(const gemm_key *k, const char *what, dnnl_status_t s) {
    return kiln_error(dnnl_to_kiln(s), "gemm M=%lld N=%lld K=%lld batch=%lld%s%s: %s: oneDNN status %d",
                      (long long)k->M, (long long)k->N, (long long)k->K, (long long)k->batch,
                      k->transA ? " transA" : "", k->transB ? " transB" : "", what, (int)s);
}

static uint64_t hash_key(const gemm_key *k) {
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Caller holds g_lock. */
static kiln_status ensure_engine(const gemm_key *k) {
    if (g_stream) return KILN_OK;
    dnnl_status_t s = dnnl_engine_create(&g_engine, dnnl_cpu, 0);
    if (s != dnnl_success) return fail(k, "engine", s);
    s = dnnl_stream_create(&g_stream, g_engine, dnnl_stream_default_flags);
    if (s != dnnl_success) {
        dnnl_engine_destroy(g_engine);
        g_engine = NULL;
        return fail(k, "stream", s);
    }
    return KILN_OK;
}

/* A rows×cols logical matrix stored with row stride ld, transposed in
 * storage if trans; nb batch elements bs apart (nb = 1 gives 2-D). */
static dnnl_status_t init_md(dnnl_memory_desc_t *md, dnnl_data_type_t dt, int64_t nb, int64_t bs,
                             int64_t rows, int64_t cols, int64_t ld, bool trans) {
    int64_t rs = trans ? 1 : ld, cs = trans ? ld : 1;
    if (nb == 0) {
        dnnl_dims_t dims = {rows, cols}, strides = {rs, cs};
        return dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides);
    }
    /* A broadcast operand is a batch dimension of 1; its stride is then
     * irrelevant, but must be a valid (non-zero) one. */
    if (bs == 0) {
        nb = 1;
        bs = (trans ? cols : rows) * ld;
    }
    dnnl_dims_t dims = {nb, rows, cols}, strides = {bs, rs, cs};
    return dnnl_memory_desc_init_by_strides(md, 3, dims, dt, strides);
}

static dnnl_status_t create_prim(gemm_entry *e, bool batched, dnnl_primitive_desc_t *pd_out) {
    const gemm_key *k = &e->key;
    dnnl_data_type_t in_dt = k->dtype == DT_BF16 ? dnnl_bf16 : dnnl_f32;
    int64_t nb = batched ? k->batch : 0;
    dnnl_status_t s;
    if ((s = init_md(&e->md_a, in_dt, nb, k->strideA, k->M, k->K, k->lda, k->transA)) ||
        (s = init_md(&e->md_b, in_dt, nb, k->strideB, k->K, k->N, k->ldb, k->transB)) ||
        (s = init_md(&e->md_c, dnnl_f32, nb, k->strideC, k->M, k->N, k->ldc, false)))
        return s;
    dnnl_matmul_desc_t desc;
    if ((s = dnnl_matmul_desc_init(&desc, &e->md_a, &e->md_b, NULL, &e->md_c))) return s;

    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    if ((s = dnnl_primitive_attr_create(&attr))) return s;
    s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (!s && k->alpha != 1.0f) s = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &k->alpha);
    if (!s && k->beta != 0.0f) {
        s = dnnl_post_ops_create(&po);
        if (!s) s = dnnl_post_ops_append_sum(po, k->beta);
        if (!s) s = dnnl_primitive_attr_set_post_ops(attr, po);
    }
    if (!s) s = dnnl_primitive_desc_create(pd_out, &desc, attr, g_engine, NULL);
    if (po) dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    if (s) return s;
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(*pd_out, dnnl_query_scratchpad_md, 0);
    e->scratch_bytes = smd ? dnnl_memory_desc_get_size(smd) : 0;
    if (e->scratch_bytes) e->md_s = *smd;
    s = dnnl_primitive_create(&e->prim, *pd_out);
    if (s) {
        dnnl_primitive_desc_destroy(*pd_out);
        *pd_out = NULL;
    }
    return s;
}

/* Caller holds g_lock. */
static kiln_status build_entry(const gemm_key *k, gemm_entry **out) {
    kiln_status st = ensure_engine(k);
    if (st) return st;
    gemm_entry *e = calloc(1, sizeof *e);
    if (!e) return kiln_error(KILN_ERR_OOM, "gemm: out of memory for a cache entry");
    e->key = *k;
    e->choice = -1;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t s = create_prim(e, k->batch > 1, &pd);
    if (s != dnnl_success && k->batch > 1) {
        e->loop_batch = true;
        s = create_prim(e, false, &pd);
    }
    if (s != dnnl_success) {
        free(e);
        return fail(k, "creating the matmul primitive", s);
    }
    const char *impl = NULL;
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    kiln_log(KILN_LOG_DEBUG, "gemm: new %s primitive M=%lld N=%lld K=%lld batch=%lld%s%s: %s%s",
             k->dtype == DT_BF16 ? "bf16" : "f32", (long long)k->M, (long long)k->N,
             (long long)k->K, (long long)k->batch, k->transA ? " transA" : "",
             k->transB ? " transB" : "", impl ? impl : "?",
             e->loop_batch ? " (looped over batch)" : "");
    dnnl_primitive_desc_destroy(pd);
    *out = e;
    return KILN_OK;
}

static kiln_status lookup(const gemm_key *k, gemm_entry **out) {
    uint64_t h = hash_key(k) % N_BUCKETS;
    kiln_status st = KILN_OK;
    pthread_mutex_lock(&g_lock);
    gemm_entry *e = g_buckets[h];
    while (e && memcmp(&e->key, k, sizeof *k) != 0) e = e->next;
    if (!e) {
        /* Built under the lock: creation is rare and two threads building
         * the same primitive would waste a JIT compile. */
        st = build_entry(k, &e);
        if (st == KILN_OK) {
            e->next = g_buckets[h];
            g_buckets[h] = e;
            g_entries++;
        }
    }
    pthread_mutex_unlock(&g_lock);
    *out = e;
    return st;
}

static void *scratch_for(size_t bytes) {
    pthread_once(&g_scratch_once, scratch_key_init);
    if (!g_scratch_key_ok) return NULL;
    scratch_buf *s = pthread_getspecific(g_scratch_key);
    if (s && bytes <= s->bytes) return s->p;
    if (!s) {
        if (!(s = calloc(1, sizeof *s))) return NULL;
        if (pthread_setspecific(g_scratch_key, s)) {
            free(s);
            return NULL;
        }
    }
    size_t n = (bytes + 4095) & ~(size_t)4095;
    void *p = aligned_alloc(64, n);
    if (!p) return NULL;
    free(s->p);
    s->p = p;
    s->bytes = n;
    return p;
}

static kiln_status execute(gemm_entry *e, const void *A, const void *B, float *C) {
    const gemm_key *k = &e->key;
    void *scratch = NULL;
    if (e->scratch_bytes && !(scratch = scratch_for(e->scratch_bytes)))
        return kiln_error(KILN_ERR_OOM, "gemm: cannot allocate %zu bytes of scratchpad", e->scratch_bytes);
    size_t esz = k->dtype == DT_BF16 ? 2 : 4;
    int64_t steps = e->loop_batch ? k->batch : 1;
    dnnl_memory_t ma = NULL, mb = NULL, mc = NULL, ms = NULL;
    dnnl_status_t s;
    for (int64_t b = 0; b < steps; b++) {
        /* The memory objects only wrap pointers; oneDNN never writes A or B. */
        char *pa = (char *)(uintptr_t)A + (size_t)(b * k->strideA) * esz;
        char *pb = (char *)(uintptr_t)B + (size_t)(b * k->strideB) * esz;
        float *pc = C + b * k->strideC;
        if (b == 0) {
            if ((s = dnnl_memory_create(&ma, &e->md_a, g_engine, pa)) ||
                (s = dnnl_memory_create(&mb, &e->md_b, g_engine, pb)) ||
                (s = dnnl_memory_create(&mc, &e->md_c, g_engine, pc)) ||
                (scratch && (s = dnnl_memory_create(&ms, &e->md_s, g_engine, scratch))))
                goto done;
        } else if ((s = dnnl_memory_set_data_handle(ma, pa)) ||
                   (s = dnnl_memory_set_data_handle(mb, pb)) ||
                   (s = dnnl_memory_set_data_handle(mc, pc))) {
            goto done;
        }
        dnnl_exec_arg_t args[4] = {
            {DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}, {DNNL_ARG_SCRATCHPAD, ms}};
        if ((s = dnnl_primitive_execute(e->prim, g_stream, ms ? 4 : 3, args))) goto done;
    }
    s = dnnl_stream_wait(g_stream);
done:
    if (ma) dnnl_memory_destroy(ma);
    if (mb) dnnl_memory_destroy(mb);
    if (mc) dnnl_memory_destroy(mc);
    if (ms) dnnl_memory_destroy(ms);
    return s == dnnl_success ? KILN_OK : fail(k, "executing", s);
}

/* K == 0: the product is empty, C = beta*C. */
static void empty_product(const kiln_gemm_desc *d, float *C) {
    if (d->beta != 0.0f) return;
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t i = 0; i < d->M; i++)
            memset(C + b * d->strideC + i * d->ldc, 0, (size_t)d->N * sizeof(float));
}

/* Checks d, handles the empty products, and finds (or creates) the cache
 * entry of the problem: *out NULL when there is nothing left to compute. */
static kiln_status prepare(int dtype, const kiln_gemm_desc *d, const void *A, const void *B, float *C,
                           gemm_entry **out) {
    *out = NULL;
    if (!d) return kiln_error(KILN_ERR_INVALID, "gemm: NULL descriptor");
    if (d->M < 0 || d->N < 0 || d->K < 0 || d->batch < 0)
        return kiln_error(KILN_ERR_INVALID, "gemm: negative size M=%lld N=%lld K=%lld batch=%lld",
                          (long long)d->M, (long long)d->N, (long long)d->K, (long long)d->batch);
    if (d->beta != 0.0f && d->beta != 1.0f)
        return kiln_error(KILN_ERR_INVALID, "gemm M=%lld N=%lld K=%lld: beta must be 0 or 1, got %g",
                          (long long)d->M, (long long)d->N, (long long)d->K, (double)d->beta);
    if (d->M == 0 || d->N == 0 || d->batch == 0) return KILN_OK;
    int64_t a_cols = d->transA ? d->M : d->K, b_cols = d->transB ? d->K : d->N;
    /* With K == 0, A and B are never read. */
    if ((d->K > 0 && (d->lda < a_cols || d->ldb < b_cols)) || d->ldc < d->N)
        return kiln_error(KILN_ERR_INVALID,
                          "gemm M=%lld N=%lld K=%lld: leading dimension too small (lda=%lld ldb=%lld ldc=%lld)",
                          (long long)d->M, (long long)d->N, (long long)d->K, (long long)d->lda,
                          (long long)d->ldb, (long long)d->ldc);
    if (d->batch > 1 && (d->strideA < 0 || d->strideB < 0 || d->strideC <= 0))
        return kiln_error(KILN_ERR_INVALID,
                          "gemm M=%lld N=%lld K=%lld batch=%lld: bad batch strides A=%lld B=%lld C=%lld",
                          (long long)d->M, (long long)d->N, (long long)d->K, (long long)d->batch,
                          (long long)d->strideA, (long long)d->strideB, (long long)d->strideC);
    if (!C || (d->K > 0 && (!A || !B)))
        return kiln_error(KILN_ERR_INVALID, "gemm M=%lld N=%lld K=%lld: NULL operand",
                          (long long)d->M, (long long)d->N, (long long)d->K);
    if (d->K == 0) {
        empty_product(d, C);
        return KILN_OK;
    }
    gemm_key k;
    memset(&k, 0, sizeof k);
    k.dtype = dtype;
    k.nthreads = omp_get_max_threads();
    k.transA = d->transA;
    k.transB = d->transB;
    k.M = d->M;
    k.N = d->N;
    k.K = d->K;
    k.lda = d->lda;
    k.ldb = d->ldb;
    k.ldc = d->ldc;
    k.batch = d->batch;
    if (d->batch > 1) { /* strides of a single matrix do not matter */
        k.strideA = d->strideA;
        k.strideB = d->strideB;
        k.strideC = d->strideC;
    }
    k.alpha = d->alpha;
    k.beta = d->beta;
    return lookup(&k, out);
}

static kiln_status gemm(int dtype, const kiln_gemm_desc *d, const void *A, const void *B, float *C) {
    gemm_entry *e;
    kiln_status st = prepare(dtype, d, A, B, C, &e);
    return st || !e ? st : execute(e, A, B, C);
}

/* ---- the implementations of an fp32 product -------------------------- */
enum { IMPL_ONEDNN = 0, IMPL_SGEMM = 1, IMPL_KILN = 2, IMPL_OPENBLAS = 3, IMPL_BLIS = 4, IMPL_COUNT = 5 };
static const char *const impl_names[IMPL_COUNT] = {"onednn", "sgemm", "kiln", "openblas", "blis"};

/* the BLAS library behind impl (KILN_BLAS_*), or -1 */
static int impl_peer(int impl) { return impl == IMPL_OPENBLAS ? KILN_BLAS_OPENBLAS : impl == IMPL_BLIS ? KILN_BLAS_BLIS : -1; }

/* whether impl computes problems of this dtype here (bf16: the primitive
 * and kiln's VDPBF16PS/AMX kernel; the BLAS libraries fp32 only, where
 * installed) */
static bool impl_serves(int impl, int dtype) {
    if (impl_peer(impl) >= 0) return dtype == DT_F32 && kiln_blas_peer_version(impl_peer(impl)) != NULL;
    return dtype == DT_F32 || impl != IMPL_SGEMM;
}

static kiln_status run_impl(const gemm_entry *e, int impl, const void *A, const void *B, float *C) {
    const gemm_key *k = &e->key;
    if (impl == IMPL_ONEDNN) return execute((gemm_entry *)e, A, B, C);
    const bool bf = k->dtype == DT_BF16;
    for (int64_t b = 0; b < k->batch; b++) {
        float *c = C + b * k->strideC;
        if (impl_peer(impl) >= 0) {
            if (bf) return kiln_error(KILN_ERR_INVALID, "gemm: %s has no bf16 form", impl_names[impl]);
            kiln_status st = kiln_blas_peer_sgemm(impl_peer(impl), k->transA, k->transB, k->M, k->N, k->K, k->alpha,
                                                  (const float *)A + b * k->strideA, k->lda,
                                                  (const float *)B + b * k->strideB, k->ldb, k->beta, c, k->ldc);
            if (st) return st;
            continue;
        }
        if (impl == IMPL_KILN) {
            bool ok = bf ? kiln_k_gemm_bf16(k->transA, k->transB, k->M, k->N, k->K, k->alpha,
                                            (const uint16_t *)A + b * k->strideA, k->lda,
                                            (const uint16_t *)B + b * k->strideB, k->ldb, k->beta, c, k->ldc)
                         : kiln_k_gemm_f32(k->transA, k->transB, k->M, k->N, k->K, k->alpha,
                                           (const float *)A + b * k->strideA, k->lda, (const float *)B + b * k->strideB,
                                           k->ldb, k->beta, c, k->ldc);
            if (!ok)
                return kiln_error(KILN_ERR_OOM, "kiln gemm M=%lld N=%lld K=%lld: cannot allocate its packing buffers",
                                  (long long)k->M, (long long)k->N, (long long)k->K);
            continue;
        }
        if (bf) return kiln_error(KILN_ERR_INVALID, "gemm: dnnl_sgemm has no bf16 form");
        dnnl_status_t s = dnnl_sgemm(k->transA ? 'T' : 'N', k->transB ? 'T' : 'N', k->M, k->N, k->K, k->alpha,
                                     (const float *)A + b * k->strideA, k->lda, (const float *)B + b * k->strideB,
                                     k->ldb, k->beta, c, k->ldc);
        if (s != dnnl_success)
            return kiln_error(dnnl_to_kiln(s), "dnnl_sgemm M=%lld N=%lld K=%lld: oneDNN status %d", (long long)k->M,
                              (long long)k->N, (long long)k->K, (int)s);
    }
    return KILN_OK;
}

/* ---- The choice ---------------------------------------------------------
 * Which implementation is fastest depends on the CPU, the instruction-set
 * form, the thread count and the shape (bench/gemm: dnnl_sgemm wins most
 * weight-gradient products on a Zen 5, the matmul primitive most forward
 * ones), so it is measured, not ruled: the first time a process meets an
 * fp32 problem (the whole key: shape, transposes, strides, alpha, beta,
 * threads) it times each implementation into scratch (warm-up, then the
 * mean of 2 to 10 interleaved rounds; all again beside busy threads, and
 * none over 1.5x the best there: see measure) and keeps the fastest. The choice is
 * written to kiln's cache directory (kiln_cache_dir()/gemm-choices, one
 * line per problem, tagged with the CPU, the kernels' form and the build)
 * under an exclusive lock, and read back from there first: every process
 * on the machine that shares the cache makes the same choice for the same
 * problem, so runs (resumed or not, eager or compiled, on any rank) compute
 * the same bits. KILN_GEMM=onednn|sgemm|kiln|openblas|blis forces one
 * implementation (openblas or blis where not installed stops the program
 * at the first product, naming it), KILN_GEMM=auto (the default) measures;
 * any other value stops the program naming it. */
static int g_forced = -1; /* KILN_GEMM, or -1: measure */
static char g_forced_text[32];
static pthread_mutex_t g_choice_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_chosen[2][IMPL_COUNT]; /* by dtype */
static int g_measured;

__attribute__((constructor)) static void read_kiln_gemm(void) {
    const char *v = getenv("KILN_GEMM");
    if (!v || !*v || !strcmp(v, "auto")) return;
    for (int i = 0; i < IMPL_COUNT; i++)
        if (!strcmp(v, impl_names[i])) {
            g_forced = i;
            snprintf(g_forced_text, sizeof g_forced_text, "%s", v);
            return;
        }
    fprintf(stderr, "kiln: KILN_GEMM=%s: not a GEMM implementation (auto, onednn, sgemm, kiln, openblas or blis)\n", v);
    exit(2);
}

/* Bumped whenever kiln's own GEMM kernels change how fast they run, so that
 * choices measured against the old ones are measured again: fp32's and
 * bf16's apart (a new bf16 kernel leaves the fp32 choices standing). */
#define KILN_GEMM_REV 14 /* 3: the avx512 form blocks K by 512; 4, 5: reads op(A) in place; 6: avx2 likewise (KC 512, A in place); 7: close calls measured over more rounds; 8: chosen by the mean call; 9: the close ones timed beside busy threads; 10: every one timed so, none over 1.5x the best there chosen; 11: the avx512 form packs an A whose rows alias in L1; 12: K-outer where a panel of B over all of K is narrower than N; 13: a task count that is a multiple of the threads'; 14: a packed op(A) = Aᵀ two slivers a pass */
#define KILN_GEMM_REV_BF16 15 /* 3-5: kiln's bf16 kernel on AMX tiles where present; 6: K blocks of 1024; 7: A read in place; 8: close calls measured over more rounds; 9-11: as fp32's 8-10; 12: as fp32's 11; 13: AMX B tiles packed whole; 14: as fp32's 13; 15: op(A) = Aᵀ packed two slivers a load */

/* what the choices are keyed by besides the problem: this CPU (model name,
 * family, model from /proc/cpuinfo, and the features kiln uses), the
 * kernels' form, whether this is a sanitizer build, and the candidates'
 * versions (kiln's kernels' revision, oneDNN's version): a new oneDNN or a
 * faster kiln kernel is measured afresh; no tabs or newlines */
static void machine_tag(char *out, size_t n, bool bf16) {
    char name[128] = "?", fam[16] = "?", model[16] = "?";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f) && line[0] != '\n') {
            char *colon = strchr(line, ':');
            if (!colon) continue;
            char *v = colon + 1 + strspn(colon + 1, " \t");
            v[strcspn(v, "\n")] = '\0';
            if (!strncmp(line, "model name", 10)) snprintf(name, sizeof name, "%s", v);
            else if (!strncmp(line, "cpu family", 10)) snprintf(fam, sizeof fam, "%s", v);
            else if (!strncmp(line, "model\t", 6)) snprintf(model, sizeof model, "%s", v);
        }
        fclose(f);
    }
    const char *build = "";
#ifdef KILN_ASAN
    build = "/asan";
#endif
    const dnnl_version_t *dv = dnnl_version();
    char peers[128];
    kiln_blas_peers_tag(peers, sizeof peers); /* which BLAS libraries are candidates, and their versions */
    /* bf16: whether kiln's kernel runs on AMX tiles, and its revision */
    snprintf(out, n, "%s/%s/%s/%s/%s%s%s/k%d/dnnl%d.%d.%d%s%s", name, fam, model, kiln_cpu_features_text(),
             kiln_form_name(kiln_form_active()), bf16 && kiln_bf16_amx() ? "/amx" : "", build,
             bf16 ? KILN_GEMM_REV_BF16 : KILN_GEMM_REV, dv->major, dv->minor, dv->patch, bf16 ? "" : "/",
             bf16 ? "" : peers);
    for (char *p = out; *p; p++)
        if (*p == ' ' || *p == '\t' || *p == '\n') *p = '_';
}

static void key_text(const gemm_key *k, char *out, size_t n) {
    snprintf(out, n, "%s t%d %c%c M%lld N%lld K%lld ld%lld,%lld,%lld b%lld s%lld,%lld,%lld a%a c%a",
             k->dtype == DT_BF16 ? "bf16" : "f32", (int)k->nthreads,
             k->transA ? 'T' : 'N', k->transB ? 'T' : 'N', (long long)k->M, (long long)k->N, (long long)k->K,
             (long long)k->lda, (long long)k->ldb, (long long)k->ldc, (long long)k->batch, (long long)k->strideA,
             (long long)k->strideB, (long long)k->strideC, (double)k->alpha, (double)k->beta);
}

/* creates the cache directory's missing components (mode 0700) */
static void mkdir_parents(const char *dir) {
    char p[1024];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return;
    for (char *c = p + 1; *c; c++)
        if (*c == '/') {
            *c = '\0';
            mkdir(p, 0700);
            *c = '/';
        }
    mkdir(p, 0700);
}

#define CHOICES_MAX_BYTES (4u << 20) /* past this the file starts over */

/* What this process has read of the file: a hash table of the lines'
 * "tag\tkey\t" prefixes (64-bit FNV-1a) to their implementation, and how
 * many bytes of the file it covers, so that a miss reads only what other
 * processes appended since (the whole file again if it was started over).
 * Guarded by g_choice_lock. */
typedef struct {
    uint64_t h;
    int impl; /* -1: empty slot */
} seen_slot;
static seen_slot *g_seen;
static size_t g_seen_cap, g_seen_n;
static uint64_t g_seen_bytes;
static dev_t g_seen_dev;
static ino_t g_seen_ino;

static uint64_t fnv(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h | 1; /* never 0 */
}

static void seen_put(uint64_t h, int impl) {
    if (g_seen_n * 2 >= g_seen_cap) { /* grow: keep the load under 1/2 */
        size_t cap = g_seen_cap ? 2 * g_seen_cap : 1024;
        seen_slot *t = malloc(cap * sizeof *t);
        if (!t) return;
        for (size_t i = 0; i < cap; i++) t[i].h = 0, t[i].impl = -1;
        for (size_t i = 0; i < g_seen_cap; i++)
            if (g_seen[i].h) {
                size_t k = g_seen[i].h & (cap - 1);
                while (t[k].h) k = (k + 1) & (cap - 1);
                t[k] = g_seen[i];
            }
        free(g_seen);
        g_seen = t, g_seen_cap = cap;
    }
    size_t k = h & (g_seen_cap - 1);
    while (g_seen[k].h && g_seen[k].h != h) k = (k + 1) & (g_seen_cap - 1);
    if (!g_seen[k].h) g_seen[k].h = h, g_seen[k].impl = impl, g_seen_n++; /* the first line for a key wins */
}

static int seen_get(uint64_t h) {
    if (!g_seen_cap) return -1;
    size_t k = h & (g_seen_cap - 1);
    while (g_seen[k].h && g_seen[k].h != h) k = (k + 1) & (g_seen_cap - 1);
    return g_seen[k].h ? g_seen[k].impl : -1;
}

static void seen_clear(void) {
    for (size_t i = 0; i < g_seen_cap; i++) g_seen[i].h = 0, g_seen[i].impl = -1;
    g_seen_n = 0, g_seen_bytes = 0;
}

/* reads the lines of the open file fd this process has not seen yet */
static void read_new_lines(int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0) return;
    if (st.st_dev != g_seen_dev || st.st_ino != g_seen_ino || (uint64_t)st.st_size < g_seen_bytes) {
        seen_clear(); /* another file (KILN_CACHE_DIR changed) or started over */
        g_seen_dev = st.st_dev, g_seen_ino = st.st_ino;
    }
    if ((uint64_t)st.st_size <= g_seen_bytes || (uint64_t)st.st_size > CHOICES_MAX_BYTES) return;
    size_t n = (size_t)((uint64_t)st.st_size - g_seen_bytes);
    char *text = malloc(n + 1);
    if (!text) return;
    ssize_t got = pread(fd, text, n, (off_t)g_seen_bytes);
    if (got > 0) {
        text[got] = '\0';
        char *end = strrchr(text, '\n'); /* whole lines only */
        if (end) {
            for (char *line = text; line <= end;) {
                char *nl = strchr(line, '\n');
                *nl = '\0';
                /* tag \t key \t impl \t timings */
                char *t1 = strchr(line, '\t'), *t2 = t1 ? strchr(t1 + 1, '\t') : NULL;
                if (t2) {
                    const char *v = t2 + 1;
                    size_t vl = strcspn(v, "\t");
                    for (int i = 0; i < IMPL_COUNT; i++)
                        if (strlen(impl_names[i]) == vl && !strncmp(v, impl_names[i], vl))
                            seen_put(fnv(line, (size_t)(t2 + 1 - line)), i);
                }
                line = nl + 1;
            }
            g_seen_bytes += (uint64_t)(end + 1 - text);
        }
    }
    free(text);
}

/* the implementation recorded for prefix ("tag\tkey\t") in the open file
 * fd, or -1 */
static int recorded_choice(int fd, const char *prefix) {
    uint64_t h = fnv(prefix, strlen(prefix));
    int c = seen_get(h);
    if (c >= 0) return c;
    read_new_lines(fd);
    return seen_get(h);
}

/* the two fastest of us[] (second -1 with one candidate) */
static void two_best(const double us[IMPL_COUNT], int *first, int *second) {
    *first = 0, *second = -1;
    for (int i = 1; i < IMPL_COUNT; i++)
        if (us[i] < us[*first]) *second = *first, *first = i;
        else if (*second < 0 || us[i] < us[*second]) *second = i;
}

/* busy threads beside the loaded timing (see measure) */
typedef struct {
    atomic_int stop;
} spin_ctl;

static void *spin_main(void *arg) {
    spin_ctl *c = arg;
    volatile uint64_t x = 0;
    while (!atomic_load_explicit(&c->stop, memory_order_relaxed)) x++;
    return NULL;
}

/* a candidate slower than this times the best one beside busy threads is
 * not chosen (see measure) */
#define GEMM_LOADED_MAX 1.5

/* The CPUs this process may run on. */
static int cpus_here(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* One call of implementation i into scratch (cleared first where beta
 * accumulates): its seconds; *failed when it failed (the error cleared). */
static double timed_call(const gemm_entry *e, int i, const void *A, const void *B, float *scratch, size_t span,
                         bool *failed) {
    if (e->key.beta != 0.0f) memset(scratch, 0, span * sizeof(float));
    double t0 = kiln_time_now();
    kiln_status st = run_impl(e, i, A, B, scratch);
    double dt = kiln_time_now() - t0;
    if ((*failed = st != KILN_OK)) kiln_clear_error();
    return dt;
}

/* times every implementation on the problem into scratch; us[i] the mean
 * microseconds of its timed calls (1e30 where it is not a candidate or
 * failed); returns the fastest, or -1 when no scratch could be had. A
 * warm-up round, then at least two timed rounds, the implementations
 * interleaved in each; small problems get up to 10 rounds within ~20 ms,
 * and while the two fastest are within 3% of each other (five candidates
 * are often that close) a problem whose round takes under a quarter of a
 * second gets more, up to 8 timed rounds and about a second. One that took
 * over 3x the fastest in the first timed round (and over a millisecond) is
 * not timed again nor chosen (a library without kernels for the CPU).
 *
 * The mean, not the fastest call: a step pays each product's typical time,
 * and on a shared machine the candidates' typical calls differ more than
 * their fastest ones (a kernel that hands out its tasks dynamically loses
 * less when a neighbour takes a core than one that splits the work once).
 * bench/gemm_spread replays this rule on thousands of interleaved calls:
 * on a Zen 3 with neighbours, the fastest-call rule chose a candidate whose
 * mean was 1.5-3.2% behind the best over 3-8 rounds, the mean rule
 * 0.7-2.3% (three shapes, 30 s each). loaded[i]: the mean beside busy
 * threads, -1 where not timed so (below). */
static int measure(const gemm_entry *e, const void *A, const void *B, double us[IMPL_COUNT], double loaded[IMPL_COUNT]) {
    const gemm_key *k = &e->key;
    size_t span = (size_t)((k->batch - 1) * k->strideC + (k->M - 1) * k->ldc + k->N);
    float *scratch = calloc(span, sizeof(float));
    if (!scratch) return -1;
    bool out[IMPL_COUNT] = {false}; /* out of the running: failed, or far slower */
    double sum[IMPL_COUNT] = {0};
    int timed[IMPL_COUNT] = {0};
    for (int i = 0; i < IMPL_COUNT; i++) us[i] = 1e30;
    int rounds = 3;
    const double start = kiln_time_now();
    for (int r = 0; r < rounds; r++) {
        double round_time = 0;
        for (int i = 0; i < IMPL_COUNT; i++) {
            if (!impl_serves(i, k->dtype) || out[i]) continue;
            bool failed;
            const double dt = timed_call(e, i, A, B, scratch, span, &failed);
            round_time += dt;
            if (failed) {
                us[i] = 2e30; /* never chosen */
                out[i] = true;
            } else if (r > 0) {
                sum[i] += dt * 1e6;
                us[i] = sum[i] / ++timed[i];
            }
        }
        if (r == 1) { /* over 3x the fastest in the first timed round (and over a ms): not timed again, not chosen */
            double fastest = 1e30;
            for (int i = 0; i < IMPL_COUNT; i++) fastest = us[i] < fastest ? us[i] : fastest;
            for (int i = 0; i < IMPL_COUNT; i++)
                if (us[i] < 1e29 && us[i] > 3 * fastest && us[i] > 1e3) out[i] = true, us[i] = 1e30;
        }
        if (r == 0) { /* the first round warms up; small problems get more rounds (up to 10 in all) within ~20 ms */
            if (round_time < 0.02 / 3) rounds = round_time > 0 ? (int)(0.02 / round_time) : 10;
            if (rounds > 10) rounds = 10;
            if (rounds < 3) rounds = 3;
        } else if (r == rounds - 1 && rounds < 9 && round_time < 0.25 && kiln_time_now() - start < 1.0) {
            int a, b;
            two_best(us, &a, &b);
            if (b >= 0 && us[b] < 1e29 && us[b] < us[a] * 1.03) rounds++; /* too close to call yet */
        }
    }
    int best = IMPL_ONEDNN;
    for (int i = 1; i < IMPL_COUNT; i++)
        if (us[i] < us[best]) best = i;
    /* Then every candidate still in the running is timed again beside busy
     * threads, enough that one of this product's threads shares its core
     * (one on a machine whose cores all run kiln's threads), for 2 to 6
     * rounds within about half a second. A library that splits the work
     * once, or waits at spinning barriers of its own, takes as long as its
     * slowest thread then, and on a shared host a step pays that (a Zen 3
     * beside one busy process: kiln's kernel alone 12-14% faster in the
     * small model's step than oneDNN's primitive alone, 28-35% faster than
     * the idle choices, which had BLIS and OpenBLAS among them; BLIS 3.4x
     * slower than kiln's kernel on a product where it was the fastest idle;
     * README "What a shared host takes"). The choice is the fastest idle
     * among the candidates whose loaded mean is within 1.5x the best one:
     * replayed on one measurement of the small model's 13 products, that
     * kept the idle total within 0.3% of the idle-only choice and cut the
     * loaded one by 14% (choosing by the worse of the two ratios instead:
     * +4.1% idle, -20% loaded). */
    for (int i = 0; i < IMPL_COUNT; i++) loaded[i] = -1;
    int running = 0;
    for (int i = 0; i < IMPL_COUNT; i++) running += us[i] < 1e29;
    if (running > 1) {
        int nspin = cpus_here() - k->nthreads + 1;
        nspin = nspin < 1 ? 1 : nspin > 16 ? 16 : nspin;
        spin_ctl ctl;
        atomic_init(&ctl.stop, 0);
        pthread_t th[16];
        int started = 0;
        while (started < nspin && pthread_create(&th[started], NULL, spin_main, &ctl) == 0) started++;
        double lsum[IMPL_COUNT] = {0};
        int lcount[IMPL_COUNT] = {0};
        const double lstart = kiln_time_now();
        for (int r = 0; started && r < 6 && (r < 2 || kiln_time_now() - lstart < 0.5); r++)
            for (int i = 0; i < IMPL_COUNT; i++) {
                if (!(us[i] < 1e29)) continue;
                bool failed;
                const double dt = timed_call(e, i, A, B, scratch, span, &failed);
                if (!failed) lsum[i] += dt * 1e6, lcount[i]++; /* failed: it ran idle, keep what was measured */
            }
        atomic_store(&ctl.stop, 1);
        for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
        double lbest = 1e30;
        for (int i = 0; i < IMPL_COUNT; i++)
            if (lcount[i]) loaded[i] = lsum[i] / lcount[i], lbest = loaded[i] < lbest ? loaded[i] : lbest;
        int pick = -1;
        for (int i = 0; i < IMPL_COUNT; i++)
            if (loaded[i] >= 0 && loaded[i] <= lbest * GEMM_LOADED_MAX && (pick < 0 || us[i] < us[pick])) pick = i;
        if (pick >= 0) best = pick;
    }
    free(scratch);
    return best;
}

/* " %.1f" for each implementation's microseconds, appended at *n while
 * the line has room */
static void append_times(char *line, size_t size, int *n, const double t[IMPL_COUNT]) {
    for (int i = 0; i < IMPL_COUNT && *n > 0 && *n < (int)size; i++)
        *n += snprintf(line + *n, size - (size_t)*n, " %.1f", t[i]);
}

static void choose(gemm_entry *e, const void *A, const void *B) {
    pthread_mutex_lock(&g_choice_lock);
    if (e->choice >= 0) {
        pthread_mutex_unlock(&g_choice_lock);
        return;
    }
    if (g_forced >= 0) {
        if (impl_peer(g_forced) >= 0 && !kiln_blas_peer_version(impl_peer(g_forced))) {
            fprintf(stderr, "kiln: KILN_GEMM=%s: %s is no candidate here: %s\n", g_forced_text,
                    g_forced == IMPL_OPENBLAS ? "OpenBLAS" : "BLIS", kiln_blas_peer_absent(impl_peer(g_forced)));
            exit(2);
        }
        /* sgemm, openblas, blis: bf16 on the primitive */
        e->choice = impl_serves(g_forced, e->key.dtype) ? g_forced : IMPL_ONEDNN;
        g_chosen[e->key.dtype][e->choice]++;
        pthread_mutex_unlock(&g_choice_lock);
        return;
    }
    char dir[1024], path[1100], tag[512], key[400], prefix[1000];
    int fd = -1;
    if (kiln_cache_dir(dir, sizeof dir)) {
        mkdir_parents(dir);
        snprintf(path, sizeof path, "%s/gemm-choices", dir);
        fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
        int rc;
        while (fd >= 0 && (rc = flock(fd, LOCK_EX)) != 0 && errno == EINTR) {}
    }
    machine_tag(tag, sizeof tag, e->key.dtype == DT_BF16);
    key_text(&e->key, key, sizeof key);
    snprintf(prefix, sizeof prefix, "%s\t%s\t", tag, key);
    int c = fd >= 0 ? recorded_choice(fd, prefix) : -1;
    if (c >= 0 && !impl_serves(c, e->key.dtype)) c = -1; /* a line written by hand naming what is not here */
    if (c < 0) {
        double us[IMPL_COUNT], loaded[IMPL_COUNT];
        c = measure(e, A, B, us, loaded);
        if (c >= 0) {
            g_measured++;
            char line[1400];
            int n = snprintf(line, sizeof line, "%s%s\tus", prefix, impl_names[c]);
            for (int i = 0; i < IMPL_COUNT; i++) us[i] = us[i] < 1e29 ? us[i] : -1; /* -1: not a candidate here */
            append_times(line, sizeof line, &n, us);
            if (n > 0 && n < (int)sizeof line) n += snprintf(line + n, sizeof line - (size_t)n, "\tloaded");
            append_times(line, sizeof line, &n, loaded); /* -1: not timed beside busy threads */
            if (n > 0 && n < (int)sizeof line - 1) line[n++] = '\n', line[n] = '\0';
            struct stat st;
            if (fd >= 0 && fstat(fd, &st) == 0 && (uint64_t)st.st_size > CHOICES_MAX_BYTES && ftruncate(fd, 0) != 0) {}
            if (fd >= 0 && n > 0 && n < (int)sizeof line && write(fd, line, (size_t)n) != n) {}
            kiln_log(KILN_LOG_DEBUG,
                     "gemm: chose %s for %s (us: onednn %.1f, sgemm %.1f, kiln %.1f, openblas %.1f, blis %.1f; loaded %.1f %.1f "
                     "%.1f %.1f %.1f)",
                     impl_names[c], key, us[0], us[1], us[2], us[3], us[4], loaded[0], loaded[1], loaded[2], loaded[3],
                     loaded[4]);
        } else {
            c = IMPL_ONEDNN; /* no scratch to measure in: not recorded */
        }
    }
    if (fd >= 0) close(fd); /* releases the lock */
    e->choice = c;
    g_chosen[e->key.dtype][c]++;
    pthread_mutex_unlock(&g_choice_lock);
}

kiln_status kiln_gemm_f32_sgemm(const kiln_gemm_desc *d, const float *A, const float *B, float *C) {
    gemm_entry *e;
    kiln_status st = prepare(DT_F32, d, A, B, C, &e);
    return st || !e ? st : run_impl(e, IMPL_SGEMM, A, B, C);
}

/* impl's index, IMPL_COUNT when it names none */
static int impl_index(const char *impl) {
    int i = 0;
    while (i < IMPL_COUNT && strcmp(impl, impl_names[i])) i++;
    return i;
}

bool kiln_gemm_f32_impl_available(const char *impl) {
    int i = impl_index(impl);
    return i < IMPL_COUNT && impl_serves(i, DT_F32);
}

kiln_status kiln_gemm_f32_impl(const char *impl, const kiln_gemm_desc *d, const float *A, const float *B, float *C) {
    const int i = impl_index(impl);
    if (i == IMPL_COUNT)
        return kiln_error(KILN_ERR_INVALID, "gemm: '%s' is not an implementation (onednn, sgemm, kiln, openblas or blis)", impl);
    if (!impl_serves(i, DT_F32)) { /* only a BLAS peer can be missing */
        const char *why = impl_peer(i) >= 0 ? kiln_blas_peer_absent(impl_peer(i)) : NULL;
        return kiln_error(KILN_ERR_UNSUPPORTED, "gemm: %s is no candidate here: %s", impl, why ? why : "unavailable");
    }
    gemm_entry *e;
    kiln_status st = prepare(DT_F32, d, A, B, C, &e);
    return st || !e ? st : run_impl(e, i, A, B, C);
}

kiln_status kiln_gemm_f32(const kiln_gemm_desc *d, const float *A, const float *B, float *C) {
    gemm_entry *e;
    kiln_status st = prepare(DT_F32, d, A, B, C, &e);
    if (st || !e) return st;
    if (e->choice < 0) choose(e, A, B);
    return run_impl(e, e->choice, A, B, C);
}

const char *kiln_gemm_choices(void) {
    static char buf[256];
    pthread_mutex_lock(&g_choice_lock);
    const int *f = g_chosen[DT_F32], *h = g_chosen[DT_BF16];
    int n = g_forced >= 0 ? snprintf(buf, sizeof buf, "KILN_GEMM=%s: %d fp32 products", g_forced_text, f[g_forced])
                          : snprintf(buf, sizeof buf,
                                     "%d fp32 products: onednn %d, sgemm %d, kiln %d, openblas %d, blis %d (%d measured now, the rest from the cache)",
                                     f[0] + f[1] + f[2] + f[3] + f[4], f[0], f[1], f[2], f[3], f[4], g_measured);
    if (h[0] + h[2] && n > 0 && (size_t)n < sizeof buf)
        snprintf(buf + n, sizeof buf - (size_t)n, "; %d bf16 products: onednn %d, kiln %d", h[0] + h[2], h[0], h[2]);
    pthread_mutex_unlock(&g_choice_lock);
    return buf;
}

/* Elements spanned by one operand of d: rows x cols stored with leading
 * dimension ld (transposed: cols x rows), over the batch. 0 on overflow. */
static size_t operand_span(int64_t rows, int64_t cols, int64_t ld, bool trans, int64_t batch, int64_t stride) {
    int64_t outer = trans ? cols : rows, inner = trans ? rows : cols, span, last;
    if (outer <= 0 || inner <= 0) return 0;
    if (__builtin_mul_overflow(outer - 1, ld, &span) || __builtin_add_overflow(span, inner, &span)) return 0;
    if (batch > 1 && (__builtin_mul_overflow(batch - 1, stride, &last) || __builtin_add_overflow(span, last, &span)))
        return 0;
    return (size_t)span;
}

static float *widen_bf16(const uint16_t *x, size_t n) {
    float *y = n <= SIZE_MAX / sizeof(float) ? malloc(n * sizeof(float)) : NULL;
    if (y) kiln_k_bf16_to_f32(x, y, (int64_t)n);
    return y;
}

/* Without a native bf16 matmul (oneDNN has none on AVX2-only CPUs) the
 * operands are widened exactly and multiplied in fp32: the same products of
 * bf16 values, fp32 accumulation, no speed-up. */
kiln_status kiln_gemm_bf16(const kiln_gemm_desc *d, const uint16_t *A, const uint16_t *B, float *C) {
    if (!d || kiln_cpu_has_avx512bf16() || d->M <= 0 || d->N <= 0 || d->K <= 0 || d->batch <= 0) {
        gemm_entry *e;
        kiln_status st = prepare(DT_BF16, d, A, B, C, &e);
        if (st || !e) return st;
        if (e->choice < 0) choose(e, A, B);
        return run_impl(e, e->choice, A, B, C);
    }
    size_t na = operand_span(d->M, d->K, d->lda, d->transA, d->batch, d->strideA);
    size_t nb = operand_span(d->K, d->N, d->ldb, d->transB, d->batch, d->strideB);
    if (!na || !nb) return gemm(DT_BF16, d, A, B, C); /* its checks name the bad size */
    float *a = widen_bf16(A, na), *b = a ? widen_bf16(B, nb) : NULL;
    kiln_status st = a && b ? kiln_gemm_f32(d, a, b, C)
                            : kiln_error(KILN_ERR_OOM, "gemm bf16 (emulated): cannot allocate %zu floats", na + nb);
    free(a);
    free(b);
    return st;
}

kiln_status kiln_sgemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                       const float *A, const float *B, float beta, float *C) {
    kiln_gemm_desc d = {
        .transA = transA, .transB = transB, .M = M, .N = N, .K = K,
        .lda = transA ? M : K, .ldb = transB ? K : N, .ldc = N,
        .batch = 1, .alpha = alpha, .beta = beta,
    };
    return kiln_gemm_f32(&d, A, B, C);
}

static pthread_once_t g_backend_once = PTHREAD_ONCE_INIT;
static char g_backend[1024];

static void init_backend_name(void) {
    const dnnl_version_t *v = dnnl_version();
    const char *ob = kiln_blas_peer_version(KILN_BLAS_OPENBLAS), *bl = kiln_blas_peer_version(KILN_BLAS_BLIS);
    char peers[256], absent[256] = "";
    snprintf(peers, sizeof peers, "%s%s%s%s", ob ? ob : "", ob ? ", " : "", bl ? bl : "", bl ? ", " : "");
    if (!ob || !bl)
        snprintf(absent, sizeof absent, " (%s%s%s%s%s)", ob ? "" : "OpenBLAS: ", ob ? "" : kiln_blas_peer_absent(KILN_BLAS_OPENBLAS),
                 !ob && !bl ? "; " : "", bl ? "" : "BLIS: ", bl ? "" : kiln_blas_peer_absent(KILN_BLAS_BLIS));
    snprintf(g_backend, sizeof g_backend,
             "fp32: by measurement per shape among oneDNN %d.%d.%d matmul, dnnl_sgemm, %skiln (%s)%s; bf16: %s",
             v->major, v->minor, v->patch, peers, kiln_form_name(kiln_form_active()), absent,
             kiln_bf16_amx()             ? "by measurement between oneDNN's bf16 matmul and kiln's AMX (TDPBF16PS) kernel"
             : kiln_cpu_has_avx512bf16() ? "by measurement between oneDNN's bf16 matmul and kiln's VDPBF16PS kernel"
                                       : "operands widened, then the fp32 choice");
}

const char *kiln_gemm_backend(void) {
    pthread_once(&g_backend_once, init_backend_name);
    return g_backend;
}

/* Drops every cached primitive (and the calling thread's scratchpad). The
 * caller must make sure no GEMM runs concurrently. */
void kiln_gemm_cache_clear(void) {
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < N_BUCKETS; i++) {
        gemm_entry *e = g_buckets[i];
        while (e) {
            gemm_entry *next = e->next;
            dnnl_primitive_destroy(e->prim);
            free(e);
            e = next;
        }
        g_buckets[i] = NULL;
    }
    g_entries = 0;
    pthread_mutex_unlock(&g_lock);
    pthread_once(&g_scratch_once, scratch_key_init);
    if (g_scratch_key_ok) {
        scratch_free(pthread_getspecific(g_scratch_key));
        pthread_setspecific(g_scratch_key, NULL);
    }
}

size_t kiln_gemm_cache_entries(void) {
    pthread_mutex_lock(&g_lock);
    size_t n = g_entries;
    pthread_mutex_unlock(&g_lock);
    return n;
}
