/* OpenBLAS and BLIS as candidates of kiln_gemm_f32's measured choice
 * (src/kernels/gemm.c): their OpenMP builds, opened at run time.
 *
 * Both come as Debian packages of their own (libopenblas0-openmp,
 * libblis4-openmp; scripts/deps.sh installs them). Only the OpenMP builds
 * are taken: they run on the caller's OpenMP threads, the ones kiln's own
 * kernels use, where OpenBLAS's pthread build would start a pool of its own
 * whose spinning threads fight OpenMP's for the cores. Each library is
 * opened RTLD_LOCAL | RTLD_DEEPBIND, so that its calls inside resolve to
 * itself and never to another BLAS a program may have linked (bench/gemm
 * links OpenBLAS's pthread build); a build with AddressSanitizer cannot
 * open with RTLD_DEEPBIND, so there neither is a candidate. A library that
 * is missing, is not the OpenMP build, or lacks a symbol is not a
 * candidate, and kiln_gemm_backend() says which ones are.
 *
 * Calls are serialised by a mutex (the OpenMP builds are not safe to enter
 * from two threads at once); a call inside a parallel region runs on one
 * thread, as kiln's kernels do there. Neither library splits K between
 * threads, so a product's bits do not depend on the thread count. */
#include <dlfcn.h>
#include <limits.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "kiln/kernels.h"

#include "blas_peers.h"

#if defined(__x86_64__)
#define MULTIARCH "x86_64-linux-gnu"
#elif defined(__aarch64__)
#define MULTIARCH "aarch64-linux-gnu"
#else
#define MULTIARCH ""
#endif

typedef void (*cblas_sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *,
                               int);
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 }; /* CBLAS's enumerations */

typedef struct {
    cblas_sgemm_fn sgemm;
    void (*set_threads)(long); /* BLIS: bli_thread_set_num_threads */
    char version[96];          /* "OpenBLAS 0.3.21", "BLIS 0.9.0 (zen3)"; "" when not a candidate */
    char tag[48];              /* for the choices' machine tag */
    char absent[96];           /* why it is no candidate ("" when it is) */
} peer;

static peer g_peers[KILN_BLAS_PEERS];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_call_lock = PTHREAD_MUTEX_INITIALIZER;

static void *open_lib(peer *p, const char *path, const char *package) {
#ifdef KILN_ASAN
    (void)path, (void)package;
    snprintf(p->absent, sizeof p->absent, "not opened in a sanitizer build");
    return NULL;
#else
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (!h) snprintf(p->absent, sizeof p->absent, "not installed (%s)", package);
    return h;
#endif
}

static void open_openblas(peer *p) {
    void *h = open_lib(p, "/usr/lib/" MULTIARCH "/openblas-openmp/libopenblas.so.0", "libopenblas0-openmp");
    if (!h) return;
    char *(*config)(void) = (char *(*)(void))dlsym(h, "openblas_get_config");
    cblas_sgemm_fn f = (cblas_sgemm_fn)dlsym(h, "cblas_sgemm");
    const char *cfg = config ? config() : NULL;
    if (!f || !cfg || !strstr(cfg, "USE_OPENMP")) { /* not the OpenMP build: its own thread pool */
        snprintf(p->absent, sizeof p->absent, "not its OpenMP build (libopenblas0-openmp)");
        dlclose(h);
        return;
    }
    char ver[32] = "?";
    if (sscanf(cfg, "OpenBLAS %31s", ver) != 1) snprintf(ver, sizeof ver, "?");
    p->sgemm = f;
    snprintf(p->version, sizeof p->version, "OpenBLAS %s", ver);
    snprintf(p->tag, sizeof p->tag, "ob%s", ver);
}

static void open_blis(peer *p) {
    void *h = open_lib(p, "/usr/lib/" MULTIARCH "/blis-openmp/libblis.so.4", "libblis4-openmp");
    if (!h) return;
    cblas_sgemm_fn f = (cblas_sgemm_fn)dlsym(h, "cblas_sgemm");
    void (*threads)(long) = (void (*)(long))dlsym(h, "bli_thread_set_num_threads");
    const char *(*version)(void) = (const char *(*)(void))dlsym(h, "bli_info_get_version_str");
    const char *(*arch)(int) = (const char *(*)(int))dlsym(h, "bli_arch_string");
    int (*arch_id)(void) = (int (*)(void))dlsym(h, "bli_arch_query_id");
    int (*openmp)(void) = (int (*)(void))dlsym(h, "bli_info_get_enable_openmp");
    /* Debian's BLIS 0.9 has no kernels for some CPUs (Zen 4 and 5 among
     * them) and runs its reference C there, several times slower than any
     * other candidate: not worth timing at every new shape */
    if (!f || !threads || !version || !arch || !arch_id || !openmp || !openmp()) {
        snprintf(p->absent, sizeof p->absent, "not its OpenMP build (libblis4-openmp)");
        dlclose(h);
        return;
    }
    if (!strcmp(arch(arch_id()), "generic")) {
        snprintf(p->absent, sizeof p->absent, "BLIS %s has only its generic kernels for this CPU", version());
        dlclose(h);
        return;
    }
    p->sgemm = f, p->set_threads = threads;
    snprintf(p->version, sizeof p->version, "BLIS %s (%s)", version(), arch(arch_id()));
    snprintf(p->tag, sizeof p->tag, "blis%s-%s", version(), arch(arch_id()));
}

static void open_all(void) {
    open_openblas(&g_peers[KILN_BLAS_OPENBLAS]);
    open_blis(&g_peers[KILN_BLAS_BLIS]);
}

const char *kiln_blas_peer_version(int which) {
    pthread_once(&g_once, open_all);
    return which >= 0 && which < KILN_BLAS_PEERS && g_peers[which].sgemm ? g_peers[which].version : NULL;
}

const char *kiln_blas_peer_absent(int which) {
    pthread_once(&g_once, open_all);
    return which >= 0 && which < KILN_BLAS_PEERS && !g_peers[which].sgemm ? g_peers[which].absent : NULL;
}

void kiln_blas_peers_tag(char *out, size_t n) {
    pthread_once(&g_once, open_all);
    snprintf(out, n, "%s+%s", g_peers[0].sgemm ? g_peers[0].tag : "-", g_peers[1].sgemm ? g_peers[1].tag : "-");
    for (char *c = out; *c; c++)
        if (*c == ' ' || *c == '\t' || *c == '/') *c = '_';
}

kiln_status kiln_blas_peer_sgemm(int which, bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                                 const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                                 int64_t ldc) {
    pthread_once(&g_once, open_all);
    const peer *p = which >= 0 && which < KILN_BLAS_PEERS ? &g_peers[which] : NULL;
    if (!p || !p->sgemm) return kiln_error(KILN_ERR_UNSUPPORTED, "gemm: BLAS candidate %d is not available", which);
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX)
        return kiln_error(KILN_ERR_RANGE, "gemm M=%lld N=%lld K=%lld: past the 32-bit sizes of %s's CBLAS", (long long)M,
                          (long long)N, (long long)K, p->version);
    const int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    pthread_mutex_lock(&g_call_lock);
    if (p->set_threads) p->set_threads(nt);
    /* OpenBLAS's OpenMP build takes omp_get_max_threads() itself, and one thread inside a parallel region */
    p->sgemm(ROW_MAJOR, transA ? TRANS : NO_TRANS, transB ? TRANS : NO_TRANS, (int)M, (int)N, (int)K, alpha, A, (int)lda,
             B, (int)ldb, beta, C, (int)ldc);
    pthread_mutex_unlock(&g_call_lock);
    return KILN_OK;
}
