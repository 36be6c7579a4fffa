/* cpu-isolated: a strict second device on the host, to prove the seam.
 *
 * Its buffers are anonymous mappings of their own that kiln_tensor_map
 * refuses; every move in or out goes through its write / read / copy, and
 * everything that computes on them runs inside exec (the CPU kernels, the
 * interpreter, generated code). With -DKILN_STRICT_DEVICE (the sanitizer
 * builds) or KILN_STRICT_DEVICE=1 in the environment, each buffer is
 * PROT_NONE outside those calls, so host code that touches one without the
 * seam faults at the access. Calls nest (a depth count); the protection is
 * process-wide while any call is open. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "kiln/backend.h"

typedef struct region {
    void *p;
    size_t len;
    struct region *next;
} region;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static region *regions;
static int depth;
static int strict = -1; /* -1: not decided yet */

static bool is_strict(void) {
    if (strict < 0) {
#ifdef KILN_STRICT_DEVICE
        strict = 1;
#else
        const char *e = getenv("KILN_STRICT_DEVICE");
        strict = e && !strcmp(e, "1");
#endif
    }
    return strict;
}

static size_t page_round(size_t n) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

static void protect_all(int prot) {
    for (region *r = regions; r; r = r->next) mprotect(r->p, r->len, prot);
}

static void enter(void) {
    pthread_mutex_lock(&mu);
    if (depth++ == 0 && is_strict()) protect_all(PROT_READ | PROT_WRITE);
    pthread_mutex_unlock(&mu);
}

static void leave(void) {
    pthread_mutex_lock(&mu);
    if (--depth == 0 && is_strict()) protect_all(PROT_NONE);
    pthread_mutex_unlock(&mu);
}

static void *iso_alloc(size_t n) {
    region *r = malloc(sizeof *r);
    if (!r) return kiln_error(KILN_ERR_OOM, "cpu-isolated: out of memory"), NULL;
    r->len = page_round(n ? n : 1);
    pthread_mutex_lock(&mu);
    int prot = is_strict() && depth == 0 ? PROT_NONE : PROT_READ | PROT_WRITE;
    r->p = mmap(NULL, r->len, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r->p == MAP_FAILED) {
        pthread_mutex_unlock(&mu);
        free(r);
        kiln_error(KILN_ERR_OOM, "cpu-isolated: cannot map %zu bytes", n);
        return NULL;
    }
    r->next = regions;
    regions = r;
    pthread_mutex_unlock(&mu);
    return r->p;
}

static void iso_free(void *p, size_t n) {
    (void)n;
    pthread_mutex_lock(&mu);
    for (region **q = &regions; *q; q = &(*q)->next) {
        if ((*q)->p != p) continue;
        region *r = *q;
        *q = r->next;
        munmap(r->p, r->len);
        free(r);
        break;
    }
    pthread_mutex_unlock(&mu);
}

static void iso_move(void *dst, const void *src, size_t n) {
    enter();
    if (n) memcpy(dst, src, n);
    leave();
}

static void iso_zero(void *dst, size_t n) {
    enter();
    if (n) memset(dst, 0, n);
    leave();
}

static const kiln_buffer_type isolated_buft = {
    .name = "cpu-isolated", .alignment = 4096, .host_mappable = false, .alloc = iso_alloc, .free = iso_free,
    .write = iso_move, .read = iso_move, .copy = iso_move, .zero = iso_zero,
};

static kiln_status iso_exec(kiln_status (*fn)(void *), void *ctx) {
    enter();
    kiln_status st = fn(ctx);
    leave();
    return st;
}

static void sync_none(void) {}
static bool supports_all(int op, const kiln_meta *in, int n_in) {
    (void)in, (void)n_in;
    return op >= 0 && op < KILN_OP_COUNT && kiln_cpu_kernels[op];
}

const kiln_backend kiln_backend_cpu_isolated = {
    .name = "cpu-isolated",
    .description = "the CPU's kernels on memory the host cannot map (protected outside its calls in strict builds)",
    .caps = KILN_BACKEND_COMPILE | KILN_BACKEND_BF16 | KILN_BACKEND_MPI,
    .buft = &isolated_buft,
    .kernels = kiln_cpu_kernels,
    .supports_op = supports_all,
    .exec = iso_exec,
    .synchronize = sync_none,
    .renderer = &kiln_cpu_renderer, /* the same generated C, run inside exec */
    .compiler = &kiln_cpu_compiler,
};
